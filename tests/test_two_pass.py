"""The two-pass route (kernels/flat.py) gives the finished kernel's bits, forward and backward,
for every layout, pairing, dtype, source of positions and kind of table; and it is taken exactly
when it should be.

Large contiguous inputs take the route; here the size threshold is lowered to 0 so that CPU-sized
shapes take it, and every result is compared bit for bit (NaN rows included) with the same call
through the finished kernel.
"""
import itertools
import zlib

import pytest
import torch

import ropelib
import ropelib.hf
from ropelib import eager
from ropelib.kernels import launch, planning
from ropelib.reference import rotate_half
from ropelib.runtime import on_gpu
from routes import forced, thresholds, through  # noqa: E402  (tests/routes.py)

DEVICE = "cuda" if on_gpu() else "cpu"     # the interpreter on CPU, compiled kernels on a GPU

S, B, HQ, HK, D = 6, 3, 4, 2, 16
SHAPES = {"sbhd": lambda h: (S, B, h, D), "bshd": lambda h: (B, S, h, D),
          "thd": lambda h: (S * B, h, D)}


@pytest.fixture
def starts(monkeypatch):
    """Count the two-pass route's starts, through the operators (TwoPass.start) or eagerly
    (EagerTwoPass), each as "was a pre-pass planned" (and leave the threshold where it was)."""
    calls = []
    real, real_eager = launch.TwoPass.start, eager.EagerTwoPass.__call__

    def counted(self, pointers):
        calls.append(self.table_pass is not None)
        return real(self, pointers)

    def counted_eager(self, pointers):
        calls.append(self.route.table_pass is not None)
        return real_eager(self, pointers)
    monkeypatch.setattr(launch.TwoPass, "start", counted)
    monkeypatch.setattr(eager.EagerTwoPass, "__call__", counted_eager)
    eager.TABLE_ROWS.clear()
    yield calls
    eager.SIGNATURES.clear()
    eager.TABLE_ROWS.clear()


def assert_same_bits(a, b, what):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, what
        same = (x.view(torch.int16 if x.element_size() == 2 else torch.int32)
                == y.view(torch.int16 if y.element_size() == 2 else torch.int32))
        both_nan = torch.isnan(x) & torch.isnan(y)
        assert bool((same | both_nan).all()), \
            f"{what}: {int((~(same | both_nan)).sum())} elements differ"


def _call(option: str, layout: str, interleaved: bool, R: int, dtype):
    """Inputs and a call of apply_rope_qk with one source of positions / kind of table:
    returns fn() -> (q', k', dq, dk)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{option} {layout} {interleaved} {R} {dtype}".encode()))
    q = torch.randn(SHAPES[layout](HQ), generator=g).to(DEVICE, dtype)
    k = torch.randn(SHAPES[layout](HK), generator=g).to(DEVICE, dtype)
    P = S * B + 5
    freqs = ropelib.rope_freqs(P, R, interleaved=interleaved, device=DEVICE) * 3.1
    kw = dict(layout=layout, interleaved=interleaved)
    table = dict(freqs=freqs)
    if layout == "thd":     # with context parallelism: global lengths, split over 2 ranks
        kw["cu_seqlens"] = torch.tensor([0, 8, 20, 2 * S * B] if "cp" in option
                                        else [0, 5, 11, S * B], dtype=torch.int32,
                                        device=DEVICE)
    if option == "start":
        n = 3 if layout == "thd" else B
        kw["start_positions"] = torch.tensor([0, 4, 2][:n], dtype=torch.int32,
                                               device=DEVICE)
    elif option == "cp":
        kw.update(cp_size=2, cp_rank=1)
    elif option == "start+cp":
        kw.update(cp_size=2, cp_rank=0, start_positions=torch.tensor([3, 0, 1], dtype=torch.int32,
                                                             device=DEVICE))
    elif option == "ids shared":
        kw["position_ids"] = torch.randint(0, P, (1, S), generator=g).to(DEVICE)
    elif option == "ids per entry":
        kw["position_ids"] = torch.randint(0, P, (B, S), generator=g).to(DEVICE)
    elif option == "ids out of range":
        ids = torch.randint(0, P, (B, S), generator=g)
        ids[1, 2] = P + 3
        kw["position_ids"] = ids.to(DEVICE)
    elif option == "cos/sin fp32":
        cos, sin = ropelib.rope_cos_sin(P, R, interleaved=interleaved, device=DEVICE)
        table = dict(cos=cos, sin=sin)
    elif option == "cos/sin bf16":
        cos, sin = ropelib.rope_cos_sin(P, R, interleaved=interleaved, dtype=torch.bfloat16,
                                        device=DEVICE)
        table = dict(cos=cos, sin=sin)
    elif option == "unequal halves":
        table = dict(freqs=torch.randn(P, R, generator=g).to(DEVICE) * 5)
    elif option == "unequal cos/sin":
        table = dict(cos=torch.randn(P, R, generator=g).to(DEVICE),
                     sin=torch.randn(P, R, generator=g).to(DEVICE))
    elif option == "exact":
        table = dict(angles=ropelib.frequencies.rope_angles(R, device=DEVICE))
    if layout == "thd" and any(key in kw for key in ("position_ids",)):
        kw.pop("position_ids")
    q.requires_grad_(True)
    k.requires_grad_(True)
    dy_q = torch.randn(q.shape, generator=g).to(DEVICE, dtype)
    dy_k = torch.randn(k.shape, generator=g).to(DEVICE, dtype)

    def fn():
        if option == "ids out of range":    # unchecked: the kernel writes NaN rows
            ropelib.set_index_checks("off")
        try:
            q_, k_ = ropelib.apply_rope_qk(q, k, **table, **kw)
        finally:
            ropelib.set_index_checks("auto")
        dq, dk = torch.autograd.grad((q_, k_), (q, k), (dy_q, dy_k))
        return q_.detach(), k_.detach(), dq, dk
    return fn


def _case(option: str, layout: str, interleaved: bool, salt: str):
    """_call with the rotary dim R < D (features R..D-1 copied through) for half the cases and
    bf16 / fp32 alternating, chosen by the case's name (and `salt`)."""
    odd = zlib.crc32(f"{option} {layout} {interleaved}{salt}".encode()) % 2
    R, dtype = (D, torch.bfloat16) if odd else (D // 2, torch.float32)
    return _call(option, layout, interleaved, R, dtype)


OPTIONS = ["token index", "start", "cp", "start+cp", "ids shared", "ids per entry",
           "ids out of range", "cos/sin fp32", "cos/sin bf16", "unequal halves",
           "unequal cos/sin", "exact"]
CASES = [c for c in itertools.product(OPTIONS, ["sbhd", "bshd", "thd"], [False, True])
         if not (c[1] == "thd" and c[0].startswith("ids"))]


@pytest.mark.parametrize("option,layout,interleaved", CASES)
def test_same_bits_as_the_finished_kernel(option, layout, interleaved, starts):
    fn = _case(option, layout, interleaved, "")
    want = through("finished", fn)
    assert not starts
    got = through("two-pass", fn)
    assert len(starts) == 2, "forward and backward should both take the two-pass route"
    plain = option in ("token index", "cos/sin fp32", "cos/sin bf16", "unequal cos/sin") \
        and layout != "thd"
    caller_table = option.startswith(("cos/sin", "unequal cos"))
    # (packed sequences: each token's row index into the caller's table, rows by position)
    assert starts == [not (caller_table and (plain or layout == "thd"))] * 2, \
        "the caller's cos/sin table is read directly only with plain positions or by position"
    assert_same_bits(got, want, f"{option} {layout} interleaved={interleaved}")
    if option == "ids out of range":
        assert torch.isnan(got[0]).any()


@pytest.fixture
def by_position(monkeypatch):
    """Rows by position wherever they are possible (positions other than the token index, one
    table for every batch entry), whatever they cost; records, per start of the two-pass
    route, whether it found each token's row first (the index pass)."""
    indexed = []
    real_bytes, real, real_eager = launch.table_bytes, launch.TwoPass.start, \
        eager.EagerTwoPass.__call__

    def forced(table, positions, S, B, R, rows_kept=False):
        n, _, kept = real_bytes(table, positions, S, B, R, rows_kept)
        # (not where the positions' rows are unbounded: table-free angles with position ids
        # or start offsets would have rows for every position they can express)
        return n, not launch._plain(positions) and table.axes is None \
            and table.strides()[0] == 0 and launch._positions_below(table, positions, S) < 4096, \
            kept

    def counted(self, pointers):
        indexed.append(self.index_pass is not None)
        return real(self, pointers)

    def counted_eager(self, pointers):
        indexed.append(self.route.index_pass is not None)
        return real_eager(self, pointers)
    # (packed sequences would take one sequence per grid row where they can: not here)
    monkeypatch.setattr(launch, "by_sequence", lambda *args: 0)
    monkeypatch.setattr(launch, "table_bytes", forced)
    monkeypatch.setattr(launch.TwoPass, "start", counted)
    monkeypatch.setattr(eager.EagerTwoPass, "__call__", counted_eager)
    yield indexed
    eager.TABLE_ROWS.clear()


BY_POSITION = [c for c in CASES if c[0] not in ("token index", "cos/sin fp32", "cos/sin bf16",
                                                  "unequal halves", "unequal cos/sin", "exact")
               or c[1] == "thd"]


@pytest.mark.parametrize("option,layout,interleaved", BY_POSITION)
def test_rows_by_position_same_bits(option, layout, interleaved, by_position):
    # each token's row index, then the rows of its position (the caller's cos/sin table, or the
    # pre-pass's rows of positions 0..P'-1): the same bits as the finished kernel, NaN rows for
    # positions outside the table included
    fn = _case(option, layout, interleaved, " rows")
    want = through("finished", fn)
    assert not by_position
    got = through("two-pass", fn)
    assert by_position == [True, True], "forward and backward should find rows by position"
    assert_same_bits(got, want, f"{option} {layout} interleaved={interleaved}")
    if option == "ids out of range":
        assert torch.isnan(got[0]).any()


def test_rows_by_position_chosen_by_bytes(monkeypatch):
    # packed sequences, many tokens over few positions: a row index per token and the rows of
    # the positions move fewer bytes than a row per token; one position per token, they do not.
    # An eager call keeps the pre-pass's rows (by position, or with positions the token index)
    # and counts only their reads. (Here packed sequences do not take one sequence per grid
    # row, which needs no row index: test_packed_sequences_one_per_grid_row_when_the_grid_is_small.)
    monkeypatch.setattr(launch, "by_sequence", lambda *args: 0)
    T, R = 4096, 128
    row, index = 2 * R * 4, T * 4 * 2              # fp32 cos and sin; int32 written and read
    freqs = launch.Table(torch.empty(512, R, device="meta"), None)
    cu = launch.Positions(cu_seqlens=torch.empty(9, dtype=torch.int32, device="meta"))
    assert launch.table_bytes(freqs, cu, T, 1, R) == (index + 512 * row * 2, True, False)
    assert launch.table_bytes(freqs, cu, T, 1, R, rows_kept=True) == (index + 512 * row, True,
                                                                      True)
    long = launch.Table(torch.empty(T, R, device="meta"), None)
    assert launch.table_bytes(long, cu, 64, 1, R) == (64 * row * 2, False, False)
    # ... unless the rows of the positions are kept: then they are only read
    assert launch.table_bytes(long, cu, 64, 1, R, rows_kept=True) == (64 * 4 * 2 + 64 * row,
                                                                      True, True)
    assert launch.table_bytes(freqs, launch.Positions(), T, 1, R) == (T * row * 2, False, False)
    assert launch.table_bytes(freqs, launch.Positions(), T, 1, R, rows_kept=True) == \
        (T * row, False, True)
    bf16 = launch.Table(torch.empty(512, R, device="meta", dtype=torch.bfloat16),
                        torch.empty(512, R, device="meta", dtype=torch.bfloat16))
    assert launch.table_bytes(bf16, launch.Positions(), T, 1, R, rows_kept=True) == \
        (T * 2 * R * 2, False, False), "the caller's table: no rows of ropelib's to keep"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_hugging_face_tables_per_batch_entry(dtype, starts):
    # Hugging Face passes cos/sin [B, S, D] in the input's dtype and q, k as [B, H, S, D]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, HQ, S, D, generator=g).to(DEVICE, dtype).requires_grad_(True)
    k = torch.randn(B, HK, S, D, generator=g).to(DEVICE, dtype).requires_grad_(True)
    ids = torch.randint(0, 40, (B, S), generator=g).to(DEVICE)
    cos, sin = ropelib.rope_cos_sin(40, D, dtype=dtype, device=DEVICE)
    cos, sin = cos[ids], sin[ids]

    def fn():
        q_, k_ = ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
        dq, dk = torch.autograd.grad((q_, k_), (q, k), (torch.ones_like(q_), k_.detach()))
        return q_.detach(), k_.detach(), dq, dk
    want = through("finished", fn)
    got = through("two-pass", fn)
    assert starts, "Hugging Face's call should take the two-pass route"
    assert_same_bits(got, want, f"hf {dtype}")


def test_compiled_call_takes_the_same_route(starts):
    q = torch.randn(S, B, HQ, D, device=DEVICE)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    want = through("finished", lambda: ropelib.apply_rope(q, freqs))
    torch._dynamo.reset()
    got = through("two-pass", lambda: torch.compile(
        lambda x: ropelib.apply_rope(x, freqs), backend="aot_eager", fullgraph=True)(q))
    assert starts
    assert_same_bits((got,), (want,), "aot_eager")


def test_when_the_route_is_not_taken(starts):
    q = torch.randn(S, B, HQ, D, device=DEVICE)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    cases = {
        "in place": lambda: ropelib.apply_rope(q.clone(), freqs, inplace=True),
        "strided input": lambda: ropelib.apply_rope(q[:, :, ::2], freqs),
        "fp64": lambda: ropelib.apply_rope(q.double(), freqs.double()),
        "bshd input seen as sbhd": lambda: ropelib.apply_rope(q.transpose(0, 1), freqs,
                                                                layout="bshd"),
    }
    for what, fn in cases.items():
        through("two-pass", fn)
        assert not starts, f"{what} took the two-pass route"
    # below the size threshold it is not taken (q and k count together)
    saved = thresholds(q.numel() * q.element_size() + 1, 0)
    eager.SIGNATURES.clear()
    try:
        ropelib.apply_rope(q, freqs)
        assert not starts
        ropelib.apply_rope_qk(q, q[:, :, :2].contiguous(), freqs)
        assert len(starts) == 1, "q and k together pass the threshold"
        # nor where the table would be large beside the tensor: q [6, 3, 4, 16] fp32 moves
        # 2 x 4.5 KiB; the pre-pass's fp32 cos and sin rows of 6 tokens (6 x 2 x 16 x 4 bytes)
        # are a sixth of that read, a third written and read. An eager call keeps them and
        # counts their reads (TWO_PASS_KEPT_TABLE_SHARE); the operator writes them every call
        moved, rows = 2 * q.numel() * 4, S * 2 * D * 4
        thresholds(0, share=0, kept_share=moved // rows + 1)
        eager.SIGNATURES.clear()
        ropelib.apply_rope(q, freqs)
        assert len(starts) == 1, "the table is too large a share: the finished kernel runs"
        thresholds(kept_share=moved // rows)
        eager.SIGNATURES.clear()
        ropelib.apply_rope(q, freqs)
        assert len(starts) == 2
        thresholds(share=moved // (2 * rows) + 1, kept_share=0)
        op = torch.ops.ropelib.rope
        op(q, freqs.view(S, D), None, None, None, None, "sbhd", False, 1, 0, False, None)
        assert len(starts) == 2, "the operator writes the rows: they count written and read"
        thresholds(share=moved // (2 * rows))
        op(q, freqs.view(S, D), None, None, None, None, "sbhd", False, 1, 0, False, None)
        assert len(starts) == 3
    finally:
        thresholds(*saved)


def test_launches_differ_where_their_kernels_do():
    # A planned Launch is the key of its compiled kernel: two calls that differ only in which
    # index tensors they pass (Triton compiles a None pointer as a constant), or in the dtype
    # of the caller's table, must not share one.
    q = launch.View.of(torch.empty(S, B, HQ, D, device="meta"))
    out = launch.View.of(torch.empty(S, B, HQ, D, device="meta"))
    angles = launch.Table(torch.empty(S + 4, D, device="meta"), None)
    start = torch.empty(B, dtype=torch.int32, device="meta")

    def planned(table, positions):
        route, _ = launch.plan_two_pass(q, out, table, positions, R=D, interleaved=False,
                                        backward=False, layout="sbhd")
        return route
    a = planned(angles, launch.Positions())
    b = planned(angles, launch.Positions(start=start))
    assert a.table_pass != b.table_pass
    tables = [launch.Table(torch.empty(S + 4, D, dtype=dt, device="meta"),
                           torch.empty(S + 4, D, dtype=dt, device="meta"))
              for dt in (torch.float32, torch.bfloat16)]
    f32, b16 = (planned(t, launch.Positions()) for t in tables)
    assert f32.table_pass is None and b16.table_pass is None
    assert f32.rotate_pass != b16.rotate_pass


def test_the_ops_check_out(starts):
    q = torch.randn(S, B, HQ, D, device=DEVICE, requires_grad=True)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    saved = thresholds(0, 0)
    try:
        torch.library.opcheck(torch.ops.ropelib.rope.default,
                              (q, freqs.view(S, D), None, None, None, None, "sbhd", False, 1, 0, False,
                               None))
    finally:
        thresholds(*saved)
    assert starts


@pytest.fixture
def pre_passes(monkeypatch):
    """Count the two-pass route's fresh cos/sin rows (one per pre-pass launched)."""
    made = []
    real = launch.TwoPass.new_rows

    def counted(self, device):
        made.append(self.table_shape)
        return real(self, device)
    monkeypatch.setattr(launch.TwoPass, "new_rows", counted)
    eager.TABLE_ROWS.clear()
    yield made
    eager.TABLE_ROWS.clear()


def test_kept_rows_serve_later_calls_and_only_while_valid(pre_passes):
    # A model calls with one table in every layer: the pre-pass's rows are kept and reused, in
    # the forward and in the backward, and never once the table changed or is another tensor.
    g = torch.Generator().manual_seed(11)
    big = ropelib.rope_freqs(S + 9, D, device=DEVICE)       # a model's cached table ...
    q = torch.randn(S, B, HQ, D, generator=g).to(DEVICE).requires_grad_(True)
    dy = torch.randn(S, B, HQ, D, generator=g).to(DEVICE)

    def call(freqs):
        y = ropelib.apply_rope(q, freqs[:S])                  # ... sliced per call: a view
        (dq,) = torch.autograd.grad(y, q, dy)
        return y.detach(), dq

    want = through("finished", lambda: call(big))
    saved = thresholds(0, 0)
    eager.SIGNATURES.clear()
    try:
        first = call(big)
        assert len(pre_passes) == 2, "forward and backward each write their rows once"
        for _ in range(3):
            assert_same_bits(call(big), want, "kept rows")
        assert len(pre_passes) == 2, "later calls with the same table reuse the kept rows"

        with torch.no_grad():
            big.mul_(1.5)                                   # the table changed in place
        changed = through("finished", lambda: call(big))
        thresholds(0, 0)
        assert_same_bits(call(big), changed, "after an in-place change")
        assert len(pre_passes) == 4, "a changed table is read afresh"

        other = big.clone() * 0.5                            # another tensor, other values
        assert_same_bits(call(other), through("finished", lambda: call(other)),
                         "another table")
        thresholds(0, 0)
        assert len(eager.TABLE_ROWS.entries) <= eager.TABLE_ROWS_KEPT
        eager.SIGNATURES.clear()
        assert_same_bits(first, want, "the first call")     # (rows written, then reused)

        # position ids: each call finds its tokens' rows afresh (rows by position, cheaper
        # here than a row per token and entry), and the rows of the positions, which depend
        # only on the table, are kept
        n = len(pre_passes)
        ids = torch.arange(S, device=DEVICE)[None].expand(B, S).contiguous()
        ids = (ids, ids.flip(-1))
        wants = [through("finished", lambda i=i: ropelib.apply_rope(q.detach(), big[:S],
                                                                    position_ids=i))
                 for i in ids]
        thresholds(0, 0)
        for i, w in zip(ids, wants):
            assert_same_bits((ropelib.apply_rope(q.detach(), big[:S], position_ids=i),), (w,),
                             "position ids, rows by position")
        assert len(pre_passes) == n + 1

        # tables made under inference_mode have no version counter: never kept
        with torch.inference_mode():
            frozen = ropelib.rope_freqs(S, D, device=DEVICE)
            a = ropelib.apply_rope(q.detach(), frozen)
            b = ropelib.apply_rope(q.detach(), frozen)
        assert torch.equal(a, b) and len(pre_passes) == n + 3
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()


@pytest.mark.parametrize("form", ["bhsd view of bshd", "bhsd", "bshd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qwen2_vl_tables_read_per_axis(form, dtype, starts):
    # ropelib.hf.apply_multimodal_rotary_pos_emb on large inputs: the flat pass reads each
    # pair's axis table ([3, B, S, D]) as it is; the same bits as gathering the tables first and
    # rotating with the finished kernel, forward and backward; outputs with q's strides.
    g = torch.Generator().manual_seed(zlib.crc32(f"{form} {dtype}".encode()))
    section, Dm = [2, 3, 3], 16
    bshd = (B, S, HQ, Dm), (B, S, HK, Dm)
    q, k = (torch.randn(shape, generator=g).to(DEVICE, dtype) for shape in bshd)
    if form != "bshd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)          # transformers' [B, H, S, D] views
        if form == "bhsd":
            q, k = q.contiguous(), k.contiguous()
    q.requires_grad_(True)
    k.requires_grad_(True)
    pos = torch.randint(0, 50, (3, B, S), generator=g)
    inv = 1.0 / (1e4 ** (torch.arange(0, Dm, 2, dtype=torch.float32) / Dm))
    emb = pos[..., None].float() * inv
    emb = torch.cat((emb, emb), -1).to(DEVICE)                # [3, B, S, D]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    # gradients laid out as the outputs are (a gradient in another order is gathered for)
    dq, dk = (torch.randn(shape, generator=g).to(DEVICE, dtype) for shape in bshd)
    if form != "bshd":
        dq, dk = dq.transpose(1, 2), dk.transpose(1, 2)
        if form == "bhsd":
            dq, dk = dq.contiguous(), dk.contiguous()
    dim = 2 if form == "bshd" else 1

    def fn():
        qo, ko = ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section, dim)
        gq, gk = torch.autograd.grad((qo, ko), (q, k), (dq, dk))
        return qo.detach(), ko.detach(), gq, gk
    want = through("finished", fn)
    assert not starts
    got = through("two-pass", fn)
    assert len(starts) == 2 and not any(starts), \
        "forward and backward read the tables as they are: no pre-pass"
    assert_same_bits(got, want, form)
    if form == "bhsd view of bshd":     # as transformers' own formula: q's strides
        assert got[0].stride() == q.stride() and got[1].stride() == k.stride()
    saved = thresholds(0, 0)
    try:
        qm = q.detach().transpose(1, 2) if form == "bhsd view of bshd" else q.detach()
        km = k.detach().transpose(1, 2) if form == "bhsd view of bshd" else k.detach()
        layout = "bshd" if form != "bhsd" else "bhsd"
        torch.library.opcheck(torch.ops.ropelib.rope_qk_axes.default,
                              (qm.requires_grad_(True), km.requires_grad_(True), cos, sin,
                               section, layout, False, None))
        compiled = torch.compile(
            lambda a, b: ropelib.hf.apply_multimodal_rotary_pos_emb(a, b, cos, sin, section,
                                                                    dim),
            backend="aot_eager", fullgraph=True)
        torch._dynamo.reset()
        assert_same_bits(compiled(q.detach(), k.detach()), want[:2], form + " compiled")
    finally:
        thresholds(*saved)
        torch._dynamo.reset()


def test_qwen2_vl_tables_eager_route_gradients(starts):
    # The eager route (planned once per signature) with one table per axis: a repeated call
    # takes the planned launch; an output left out of the loss gets a zero gradient, and a
    # gradient in another memory order is read contiguous: the same bits as gathering the
    # tables first and rotating with the finished kernel.
    g = torch.Generator().manual_seed(7)
    section, Dm = [2, 3, 3], 16
    q = torch.randn(B, S, HQ, Dm, generator=g).to(DEVICE).transpose(1, 2).requires_grad_(True)
    k = torch.randn(B, S, HK, Dm, generator=g).to(DEVICE).transpose(1, 2).requires_grad_(True)
    ang = torch.rand(3, B, S, Dm // 2, generator=g) * 50
    ang = torch.cat((ang, ang), -1).to(DEVICE)
    cos, sin = ang.cos(), ang.sin()
    dq = torch.randn(B, HQ, S, Dm, generator=g).to(DEVICE)   # contiguous [B, H, S, D]: not
    dk = torch.randn(B, HK, S, Dm, generator=g).to(DEVICE)   # the outputs' memory order

    def fn():
        got, zero = [], []
        for _ in range(2):      # the second call takes the planned launch
            qo, ko = ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
            got += [qo.detach(), *torch.autograd.grad((qo, ko), (q, k), (dq, dk))]
            qo, ko = ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
            gq, gk = torch.autograd.grad(qo, (q, k), dq)
            got.append(gq)
            zero.append(gk)
        return got, zero
    want, _ = through("finished", fn)
    got, zero = through("two-pass", fn)
    assert len(starts) == 8 and not any(starts)   # 2 x (forward, backward, forward, backward)
    assert_same_bits(got, want, "eager route, per-axis tables")
    # k's output is outside the loss: its gradient is zero (the sign of a zero may differ
    # between the kernels: each rotates zeros in its own order of operations)
    assert all(torch.equal(g, torch.zeros_like(g)) for g in zero)


def _nan_rows(real, flags=None):
    """`TwoPass.new_rows` (the function `real`) made to fill the rows it makes with NaN, so a
    member-b entry read where the pre-pass did not write it shows in the output; each call's
    flags are appended to `flags` (plain tensors only: not while torch.compile traces)."""
    def rows_of(self, device):
        rows = real(self, device)
        if flags is not None and type(rows[0]) is torch.Tensor:
            flags.append(rows[2])
        rows[0].fill_(float("nan"))
        rows[1].fill_(float("nan"))
        return rows
    return rows_of


@pytest.mark.parametrize("halves", ["equal", "one pair differs", "all differ"])
@pytest.mark.parametrize("how", ["kept", "inference table", "compiled"])
def test_rows_read_half_where_their_pairs_are_equal(halves, how, pre_passes):
    # The pre-pass writes a flag per row (does one of its pairs have members whose cos or sin
    # differ?) and member b's cos and s' only where it does; the flat pass reads them only
    # there. Whatever the table, every call gives the finished kernel's bits, forward and
    # backward, rotate-half and interleaved (whose pass by element reads every entry and is
    # given no flags), with the rows kept between eager calls and with rows written every call
    # (a table made under inference_mode; compiled code, through the operators).
    g = torch.Generator().manual_seed(5)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    if halves == "one pair differs":
        freqs = freqs.clone()
        freqs[S // 2, ..., D // 2 + 3] += 0.25        # one token, member b of pair 3
    elif halves == "all differ":
        freqs = torch.rand(freqs.shape, generator=g).to(DEVICE) * 3
    if how == "inference table":
        with torch.inference_mode():
            freqs = freqs.clone()
    q = torch.randn(S, B, HQ, D, generator=g).to(DEVICE).requires_grad_(True)
    dy = torch.randn(S, B, HQ, D, generator=g).to(DEVICE)
    flags = []
    real = launch.TwoPass.new_rows
    recorded = _nan_rows(real, flags)

    want_flags = {"equal": [0] * S, "one pair differs": [int(s == S // 2) for s in range(S)],
                  "all differ": [1] * S}[halves]

    for interleaved in (False, True):
        def rotate(q, freqs):
            return ropelib.apply_rope(q, freqs, interleaved=interleaved)

        def with_grads(y):
            return (y.detach(), *torch.autograd.grad(y, q, dy))

        step = torch.compile(rotate, backend="aot_eager", fullgraph=True) \
            if how == "compiled" else rotate

        def call():
            return with_grads(step(q, freqs))

        want = through("finished", lambda: with_grads(rotate(q, freqs)))
        saved = thresholds(0, 0)
        eager.SIGNATURES.clear()
        eager.TABLE_ROWS.clear()
        flags.clear()
        launch.TwoPass.new_rows = recorded
        try:
            for _ in range(3):          # rows written, then (kept) read as kept
                assert_same_bits(call(), want, f"{halves}, interleaved {interleaved}")
        finally:
            launch.TwoPass.new_rows = real
            thresholds(*saved)
            eager.SIGNATURES.clear()
        # the forward's and the backward's rows, once when kept, every call when not. Compiled
        # code on a GPU makes its rows inside the compiled graph, where no call of new_rows is
        # seen (the bits above are its check); through the interpreter the operators run
        # opaque, and every call makes its rows.
        if how == "compiled":
            if DEVICE == "cpu":
                assert len(flags) == 6
        else:
            assert len(flags) == (2 if how == "kept" else 6)
        if interleaved:
            assert all(f is None for f in flags)
        else:
            assert all(f.tolist() == want_flags for f in flags)


@pytest.mark.parametrize("halves", ["equal", "one pair differs"])
@pytest.mark.parametrize("batch", [1, B])
def test_kept_rows_with_no_differing_pair_read_no_flags(halves, batch, pre_passes):
    # Kept rows whose flags are all 0 (found once their reduction reaches the host) are read by
    # a flat pass that loads neither the flags nor member b's entries (PAIRS_EQUAL), where
    # the rows are read once (batch 1); at batch B they stay in L2 for every entry, and the pass
    # with flags serves. The bits stay the finished kernel's, with the rows NaN where the
    # pre-pass did not write.
    g = torch.Generator().manual_seed(6)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    if halves == "one pair differs":
        freqs = freqs.clone()
        freqs[S // 2, ..., D // 2 + 3] += 0.25
    q = torch.randn(S, batch, HQ, D, generator=g).to(DEVICE).requires_grad_(True)
    dy = torch.randn(S, batch, HQ, D, generator=g).to(DEVICE)
    real_rows, real_start = launch.TwoPass.new_rows, eager.EagerLaunch.__call__
    nan_rows = _nan_rows(real_rows)
    flat_passes = []

    def start(self, pointers):
        if self.launch.launcher is launch.ROWS:
            flat_passes.append(self.launch.args["PAIRS_EQUAL"])
        return real_start(self, pointers)

    def call():
        y = ropelib.apply_rope(q, freqs)
        return (y.detach(), *torch.autograd.grad(y, q, dy))

    want = through("finished", call)
    saved = thresholds(0, 0)
    eager.SIGNATURES.clear()
    eager.TABLE_ROWS.clear()
    launch.TwoPass.new_rows, eager.EagerLaunch.__call__ = nan_rows, start
    try:
        for _ in range(3):
            assert_same_bits(call(), want, f"{halves}, batch {batch}")
            if DEVICE == "cuda":        # (the flags' reduction has reached the host)
                torch.cuda.synchronize()
    finally:
        launch.TwoPass.new_rows, eager.EagerLaunch.__call__ = real_rows, real_start
        thresholds(*saved)
        eager.SIGNATURES.clear()
        eager.TABLE_ROWS.clear()
    # forward and backward: rows written (the pass with flags), then read as kept
    known = halves == "equal" and batch == 1
    assert flat_passes == [False, False] + [known] * 4, flat_passes


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_rows_that_cannot_be_kept_take_the_finished_kernel(mode, pre_passes, starts):
    # Where the route pays only because the eager route keeps the pre-pass's rows (the kept
    # share met, the unkept one not), a call whose rows cannot be kept (here: a table made under
    # inference_mode; on a GPU also a CUDA graph being captured) runs the finished kernel:
    # writing the rows every call would cost more. Same bits either way.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(S, 1, HQ, D, generator=g).to(DEVICE)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    with torch.inference_mode():
        frozen = ropelib.rope_freqs(S, D, device=DEVICE)
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
               "inference_mode": torch.inference_mode}[mode]

    def call(table):
        with context():
            return (ropelib.apply_rope(x, table),)

    want = through("finished", lambda: call(freqs))
    saved = thresholds(0, 1 << 40, 0)        # the route only where rows are kept
    eager.SIGNATURES.clear()
    try:
        for _ in range(2):
            assert_same_bits(call(frozen), want, "an inference table")
        assert not pre_passes and len(starts) == 2, "no rows written: the finished kernel ran"
        for _ in range(2):
            assert_same_bits(call(freqs), want, "a table whose rows are kept")
        assert len(pre_passes) == 1, "an ordinary table takes the two passes, its rows kept"
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()


@pytest.mark.gpu
@pytest.mark.skipif(not on_gpu(), reason="CUDA graphs need a GPU")
def test_a_captured_call_takes_the_finished_kernel_where_rows_would_be_written(pre_passes):
    # Under CUDA-graph capture nothing is kept (a graph must not read memory it does not own):
    # where only kept rows make two passes pay, the captured call is the finished kernel's.
    x = torch.randn(S, 1, HQ, D, device="cuda")
    freqs = ropelib.rope_freqs(S, D, device="cuda")
    want = through("finished", lambda: ropelib.apply_rope(x, freqs))
    saved = thresholds(0, 1 << 40, 0)
    eager.SIGNATURES.clear()
    try:
        ropelib.apply_rope(x, freqs)                    # eagerly: two passes, rows kept
        assert len(pre_passes) == 1
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = ropelib.apply_rope(x, freqs)
        assert len(pre_passes) == 1, "no rows written under capture"
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, want)
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()


def test_kept_rows_are_bounded_in_bytes(pre_passes, monkeypatch):
    # rows larger than the byte budget are not kept; the budget evicts the oldest first
    q = torch.randn(S, B, HQ, D, device=DEVICE)
    freqs = ropelib.rope_freqs(S, D, device=DEVICE)
    row_bytes = 2 * S * D * 4 + S                       # cos and s', fp32, and a flag a row
    saved = thresholds(0, 0)
    eager.SIGNATURES.clear()
    try:
        monkeypatch.setattr(eager, "TABLE_ROWS_BYTES", row_bytes - 1)
        for _ in range(2):
            ropelib.apply_rope(q, freqs)
        assert len(pre_passes) == 2 and not eager.TABLE_ROWS.entries
        monkeypatch.setattr(eager, "TABLE_ROWS_BYTES", row_bytes)
        other = freqs.clone()
        ropelib.apply_rope(q, freqs)
        ropelib.apply_rope(q, other)                     # evicts the rows of freqs
        assert len(eager.TABLE_ROWS.entries) == 1 and eager.TABLE_ROWS.bytes == row_bytes
        ropelib.apply_rope(q, other)
        assert len(pre_passes) == 4, "the rows of the newest table are kept"
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()


def test_kept_rows_under_random_sequences_of_calls(pre_passes, monkeypatch):
    # Random sequences of calls that keep, change, swap, slice, free and remake tables, on the
    # two-pass route with rows kept, each compared bit for bit with the finished kernel run
    # through the operators on the same inputs (the operators keep no rows and share no plan
    # with the eager route): kept rows must never serve a call whose table differs.
    g = torch.Generator().manual_seed(2026)
    q = torch.randn(S, B, HQ, D, generator=g).to(DEVICE)
    k = torch.randn(S, B, HK, D, generator=g).to(DEVICE)
    tables = [ropelib.rope_freqs(S + 7, D, device=DEVICE) * (1 + i) for i in range(3)]
    # ... and one whose pairs' members differ (the flat pass then reads both halves of its
    # kept rows; the others' rows are read half)
    tables.append(torch.rand(tables[0].shape, generator=g).to(DEVICE) * 3)
    opts = ("sbhd", False, 1, 0, False, None)
    monkeypatch.setattr(eager, "TABLE_ROWS_KEPT", 16)     # room for every (plan, table) here

    def op_one(x, t):
        return torch.ops.ropelib.rope(x, t.view(t.shape[0], -1), None, None, None, None, *opts)

    def op_qk(x, y, t):
        return torch.ops.ropelib.rope_qk(x, y, t.view(t.shape[0], -1), None, None, None, None,
                                         *opts)

    saved = thresholds()

    rotations = []      # eager rotations made (a forward and a backward are two)

    def both(eager_call, op_call, n=1):
        rotations.append(n)
        thresholds(1 << 62, 0)
        want = op_call()                             # the finished kernel
        thresholds(0)
        got = eager_call()                           # the two-pass route, rows kept
        thresholds(*saved)
        want, got = (w if isinstance(w, tuple) else (w,) for w in (want, got))
        assert_same_bits(got, want, "random sequence")

    eager.SIGNATURES.clear()
    try:
        kinds = (0, 0, 0, 1, 2, 3, 4, 5, 6, 6, 6)    # plain calls most often
        for step in range(60):
            op = kinds[int(torch.randint(0, len(kinds), (), generator=g))]
            i = int(torch.randint(0, len(tables), (), generator=g))
            t = tables[i]
            if op == 0:                      # a call with the table as it is
                both(lambda: ropelib.apply_rope_qk(q, k, t[:S]), lambda: op_qk(q, k, t[:S]))
            elif op == 1:                    # the table written in place
                with torch.no_grad():
                    t.add_(0.01 * (step + 1))
                both(lambda: ropelib.apply_rope(q, t[:S]), lambda: op_one(q, t[:S]))
            elif op == 2:                    # a fresh tensor in its place (maybe its address)
                del t
                tables[i] = None
                tables[i] = ropelib.rope_freqs(S + 7, D, device=DEVICE) * (2 + step)
                both(lambda: ropelib.apply_rope(q, tables[i][:S]),
                     lambda: op_one(q, tables[i][:S]))
            elif op == 3:                    # a view at another offset of the same table
                both(lambda: ropelib.apply_rope(q, t[1:S + 1]), lambda: op_one(q, t[1:S + 1]))
            elif op == 4:                    # the table's data swapped for another's
                with torch.no_grad():
                    t.copy_(tables[(i + 1) % len(tables)])
                both(lambda: ropelib.apply_rope_qk(q, k, t[:S]), lambda: op_qk(q, k, t[:S]))
            elif op == 5:                    # signatures forgotten: a new plan, a new owner
                eager.SIGNATURES.clear()
                both(lambda: ropelib.apply_rope(q, t[:S]), lambda: op_one(q, t[:S]))
            else:                            # forward and backward
                qg = q.clone().requires_grad_(True)
                dy = torch.randn(q.shape, generator=g).to(DEVICE)

                def forward_backward(rotate):
                    y = rotate()
                    return (y.detach(), *torch.autograd.grad(y, qg, dy))
                both(lambda: forward_backward(lambda: ropelib.apply_rope(qg, t[:S])),
                     lambda: forward_backward(lambda: op_one(qg, t[:S])), n=2)
            assert len(eager.TABLE_ROWS.entries) <= eager.TABLE_ROWS_KEPT
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()
    assert 0 < len(pre_passes) < sum(rotations), "rows were kept and reused along the way"


def test_qwen2_vl_tables_random_cases(starts):
    # random sections (empty ones included), one table for every batch entry or one each,
    # tables in another dtype than q (the output dtype promotes, as transformers' arithmetic
    # does), forward and backward: the per-axis read gives the gathered path's bits
    g = torch.Generator().manual_seed(7)
    for case in range(12):
        half = int(torch.randint(2, 9, (), generator=g))
        cut = sorted(torch.randint(0, half + 1, (2,), generator=g).tolist())
        section = [cut[0], cut[1] - cut[0], half - cut[1]]
        Dm = 2 * half
        Bt = 1 if case % 3 == 0 else B
        q_dtype = (torch.bfloat16, torch.float32)[case % 2]
        t_dtype = (torch.float32, torch.bfloat16, torch.float16)[case % 3]
        q = torch.randn(B, S, HQ, Dm, generator=g).to(DEVICE, q_dtype).transpose(1, 2)
        k = torch.randn(B, S, HK, Dm, generator=g).to(DEVICE, q_dtype).transpose(1, 2)
        q.requires_grad_(True)
        k.requires_grad_(True)
        ang = torch.rand(3, Bt, S, half, generator=g) * 50
        ang = torch.cat((ang, ang), -1).to(DEVICE)
        cos, sin = ang.cos().to(t_dtype), ang.sin().to(t_dtype)
        out_dtype = torch.promote_types(q_dtype, t_dtype)
        dq = torch.randn(B, S, HQ, Dm, generator=g).to(DEVICE, out_dtype).transpose(1, 2)
        dk = torch.randn(B, S, HK, Dm, generator=g).to(DEVICE, out_dtype).transpose(1, 2)

        def fn():
            qo, ko = ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
            return (qo.detach(), ko.detach(), *torch.autograd.grad((qo, ko), (q, k), (dq, dk)))
        starts.clear()
        want = through("finished", fn)
        got = through("two-pass", fn)
        assert starts and not any(starts), f"case {case}: the per-axis read was not taken"
        assert got[0].dtype == out_dtype
        assert_same_bits(got, want, f"case {case} sections {section} tables {t_dtype}")


def _random_case(g, case: int, most_rows: int):
    """A random case of the random-case tests: (head dim, rotary dim (all or part of it),
    interleaved?, dtype, table rows P < most_rows, kind of table, the table's keywords)."""
    Dm = 2 * int(torch.randint(2, 9, (), generator=g))
    R = Dm if case % 3 else 2 * int(torch.randint(1, Dm // 2 + 1, (), generator=g))
    interleaved = bool(case % 2)
    dtype = (torch.float32, torch.bfloat16, torch.float16)[case % 3]
    P = int(torch.randint(4, most_rows, (), generator=g))
    kind = ("angles", "cos/sin", "cos/sin 16-bit", "exact")[case % 4]
    if kind == "angles":
        table = dict(freqs=torch.randn(P, R, generator=g).to(DEVICE) * 4)
    elif kind == "exact":
        table = dict(angles=ropelib.frequencies.rope_angles(R, device=DEVICE))
    else:
        t_dtype = torch.float32 if kind == "cos/sin" else dtype
        table = dict(cos=torch.randn(P, R, generator=g).to(DEVICE, t_dtype),
                     sin=torch.randn(P, R, generator=g).to(DEVICE, t_dtype))
    return Dm, R, interleaved, dtype, P, kind, table


def test_rows_by_position_random_cases(by_position):
    # random packed sequences (empty ones and a long one among them), position ids with
    # positions outside the table, start offsets and context parallelism, every kind of table,
    # rotary dims below the head dim, both pairings, q alone or q and k: forward and backward
    # with rows by position give the finished kernel's bits, NaN rows included
    g = torch.Generator().manual_seed(23)
    for case in range(16):
        Dm, R, interleaved, dtype, P, kind, table = _random_case(g, case, 40)
        source = ("packed", "ids", "start", "cp")[(case // 4) % 4]
        kw = dict(interleaved=interleaved)
        if source == "packed":
            lengths = torch.randint(0, 9, (int(torch.randint(1, 5, (), generator=g)),),
                                    generator=g).tolist() + [int(torch.randint(5, 20, (),
                                                                               generator=g))]
            cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
            Tn = int(cu[-1])
            shape = lambda h: (Tn, h, Dm)                           # noqa: E731
            kw.update(layout="thd", cu_seqlens=cu.to(DEVICE))
        else:
            layout = ("sbhd", "bshd")[case % 2]
            Sn, Bn = int(torch.randint(1, 9, (), generator=g)), int(torch.randint(1, 4, (),
                                                                                  generator=g))
            shape = lambda h: (Sn, Bn, h, Dm) if layout == "sbhd" else (Bn, Sn, h, Dm)  # noqa
            kw["layout"] = layout
            if source == "ids":
                ids = torch.randint(0, P + 3, (Bn if case % 2 else 1, Sn), generator=g)
                kw["position_ids"] = ids.to(DEVICE)
            elif source == "start":
                kw["start_positions"] = torch.randint(0, P, (Bn,), generator=g,
                                                      dtype=torch.int32).to(DEVICE)
            else:
                kw.update(cp_size=2, cp_rank=int(torch.randint(0, 2, (), generator=g)))
        with_k = bool(torch.randint(0, 2, (), generator=g))
        q = torch.randn(shape(4), generator=g).to(DEVICE, dtype).requires_grad_(True)
        k = torch.randn(shape(2), generator=g).to(DEVICE, dtype).requires_grad_(True)
        dq, dk = (torch.randn(t.shape, generator=g).to(DEVICE, dtype) for t in (q, k))

        def fn():
            ropelib.set_index_checks("off")     # positions outside the table: NaN rows
            try:
                if with_k:
                    qo, ko = ropelib.apply_rope_qk(q, k, **table, **kw)
                    grads = torch.autograd.grad((qo, ko), (q, k), (dq, dk))
                    return qo.detach(), ko.detach(), *grads
                qo = ropelib.apply_rope(q, **table, **kw)
                return (qo.detach(), *torch.autograd.grad(qo, q, dq))
            finally:
                ropelib.set_index_checks("auto")
        what = f"case {case}: {kind}, {source}, R={R}/{Dm}, {dtype}, interleaved={interleaved}"
        want = through("finished", fn)
        by_position.clear()
        got = through("two-pass", fn)
        unbounded = kind == "exact" and source in ("ids", "start")
        assert by_position == [not unbounded] * 2, what
        assert_same_bits(got, want, what)


@pytest.mark.parametrize("route", ["by_position", "by_sequence"])
@pytest.mark.parametrize("how", ["operator", "aot_eager"])
def test_packed_sequences_through_the_operator(how, route, request):
    # the registered operator (what torch.compile's graphs call) starts the index pass, or the
    # flat pass with one sequence per grid row, itself (launch.TwoPass.start): the same bits as
    # the finished kernel, forward and backward
    starts = request.getfixturevalue(route)
    g = torch.Generator().manual_seed(31)
    T, P = 14, 6
    x = torch.randn(T, HQ, D, generator=g).to(DEVICE).requires_grad_(True)
    dy = torch.randn(T, HQ, D, generator=g).to(DEVICE)
    freqs = torch.randn(P, D, generator=g).to(DEVICE) * 3
    cu = torch.tensor([0, 5, 5, 11, T], dtype=torch.int32, device=DEVICE)   # positions < 6

    def call(t):
        if how == "operator":
            return torch.ops.ropelib.rope(t, freqs, None, None, cu, None, "thd", False, 1, 0,
                                          False, None)
        return torch.compile(lambda a: ropelib.apply_rope(a, freqs, layout="thd", cu_seqlens=cu),
                             backend="aot_eager", fullgraph=True)(t)

    def fn():
        torch._dynamo.reset()
        y = call(x)
        return (y.detach(), *torch.autograd.grad(y, x, dy))
    want = through("finished", fn)
    starts.clear()
    got = through("two-pass", fn)
    # (tracing runs the operator on fake tensors too: more starts, which launch nothing)
    taken = [True] * len(starts) if route == "by_position" else [(P, False)] * len(starts)
    assert len(starts) >= 2 and starts == taken, f"{route}, forward and backward: {starts}"
    assert_same_bits(got, want, how)
    torch._dynamo.reset()


@pytest.fixture
def by_sequence(monkeypatch):
    """One packed sequence per grid row of the flat pass wherever it is possible (whatever its
    grid); records, per start of the two-pass route, its positions per sequence (0: not taken)
    and whether it found each token's row first (the index pass)."""
    taken = []
    real, real_eager = launch.TwoPass.start, eager.EagerTwoPass.__call__

    def counted(self, pointers):
        taken.append((self.seq_rows, self.index_pass is not None))
        return real(self, pointers)

    def counted_eager(self, pointers):
        taken.append((self.route.seq_rows, self.route.index_pass is not None))
        return real_eager(self, pointers)
    monkeypatch.setattr(launch.TwoPass, "start", counted)
    monkeypatch.setattr(eager.EagerTwoPass, "__call__", counted_eager)
    monkeypatch.setattr(launch._tiles_module, "TWO_PASS_SEQUENCE_GRID", 1 << 30)
    eager.TABLE_ROWS.clear()
    yield taken
    eager.SIGNATURES.clear()
    eager.TABLE_ROWS.clear()


def test_packed_sequences_one_per_grid_row_random_cases(by_sequence):
    # random packed sequences (empty ones, and one longer than the table: its positions past
    # the table are NaN in rotated features, copied in the others), every kind of table, rotary
    # dims below the head dim, both pairings, q alone or q and k, three dtypes: forward and
    # backward give the finished kernel's bits
    g = torch.Generator().manual_seed(41)
    for case in range(12):
        Dm, R, interleaved, dtype, P, kind, table = _random_case(g, case, 30)
        lengths = torch.randint(0, 9, (int(torch.randint(1, 5, (), generator=g)),),
                                generator=g).tolist() + [int(torch.randint(5, 40, (),
                                                                           generator=g))]
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
        Tn = int(cu[-1])
        with_k = bool(case % 4 != 1)
        q = torch.randn(Tn, 4, Dm, generator=g).to(DEVICE, dtype).requires_grad_(True)
        k = torch.randn(Tn, 2, Dm, generator=g).to(DEVICE, dtype).requires_grad_(True)
        dq, dk = (torch.randn(t.shape, generator=g).to(DEVICE, dtype) for t in (q, k))
        kw = dict(layout="thd", cu_seqlens=cu.to(DEVICE), interleaved=interleaved)

        def fn():
            ropelib.set_index_checks("off")     # positions outside the table: NaN
            try:
                if with_k:
                    qo, ko = ropelib.apply_rope_qk(q, k, **table, **kw)
                    grads = torch.autograd.grad((qo, ko), (q, k), (dq, dk))
                    return qo.detach(), ko.detach(), *grads
                qo = ropelib.apply_rope(q, **table, **kw)
                return (qo.detach(), *torch.autograd.grad(qo, q, dq))
            finally:
                ropelib.set_index_checks("auto")
        what = f"case {case}: {kind}, lengths {lengths}, P={P}, R={R}/{Dm}, {dtype}, " \
               f"interleaved={interleaved}, k={with_k}"
        want = through("finished", fn)
        by_sequence.clear()
        got = through("two-pass", fn)
        rows = min(launch.EXACT_POSITIONS if kind == "exact" else P, Tn)
        assert by_sequence == [(rows, False)] * 2, what
        assert_same_bits(got, want, what)
        if kind != "exact" and max(lengths) > P:
            assert torch.isnan(got[0]).any(), what


def test_packed_sequences_one_per_grid_row_when_the_grid_is_small():
    # one sequence per grid row while n_seq x min(P, T) positions stay within
    # tiles.TWO_PASS_SEQUENCE_GRID times the tokens; never with position ids, start offsets,
    # context parallelism, per-axis tables or a table per batch entry
    T, R = 4096, 128
    freqs = launch.Table(torch.empty(512, R, device="meta"), None)
    cu = lambda n: launch.Positions(cu_seqlens=torch.empty(n + 1, dtype=torch.int32,  # noqa
                                                           device="meta"))
    grid = launch._tiles_module.TWO_PASS_SEQUENCE_GRID
    most = grid * T // 512
    assert launch.by_sequence(freqs, cu(most), T, 1) == 512
    assert launch.by_sequence(freqs, cu(most + 1), T, 1) == 0
    long = launch.Table(torch.empty(T * 8, R, device="meta"), None)     # rows past the tokens
    assert launch.by_sequence(long, cu(grid), T, 1) == T
    assert launch.by_sequence(long, cu(grid + 1), T, 1) == 0
    assert launch.by_sequence(freqs, cu(0), T, 1) == 0
    start = torch.empty(4, dtype=torch.int32, device="meta")
    ids = torch.empty(1, T, dtype=torch.int64, device="meta")
    cu4 = cu(4).cu_seqlens
    for pos in (launch.Positions(cu_seqlens=cu4, start=start),
                launch.Positions(cu_seqlens=cu4, cp_size=2, cp_rank=1),
                launch.Positions(position_ids=ids), launch.Positions()):
        assert launch.by_sequence(freqs, pos, T, 1) == 0
    assert launch.by_sequence(freqs, cu(4), T // 2, 2) == 0              # not thd
    per_entry = launch.Table(torch.empty(2, 512, R, device="meta"), None)
    assert launch.by_sequence(per_entry, cu(4), T, 1) == 0
    # its bytes: the rows of positions 0 .. 511 (written and read, or only read when kept)
    assert launch.table_bytes(freqs, cu(4), T, 1, R) == (512 * 2 * R * 4 * 2, True, False)
    assert launch.table_bytes(freqs, cu(4), T, 1, R, rows_kept=True) == \
        (512 * 2 * R * 4, True, True)


def test_flat_pass_counts_q_programs_past_2_31_elements():
    """The flat pass sends programs past q's count to k. For a q of more than 2^31 elements the
    count must be taken in int64: in int32 it wrapped negative, every program went to k's branch,
    and with no k nothing was written (found on an H200). One program of such a call, run on a
    tensor holding just its block, rotates that block."""
    from ropelib.kernels.flat import _rope_rows_kernel
    xblock, D, HQ = 1024, 128, 32
    S = 2**31 // (HQ * D) + 64                   # q would hold 2^31 + 64 * HQ * D elements
    q = torch.randn(xblock, dtype=torch.bfloat16, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    cos, sin = torch.ones(1, D, device=DEVICE), torch.zeros(1, D, device=DEVICE)  # identity row
    _rope_rows_kernel[(1,)](q, out, None, None, cos, sin, None, None, S, 1, HQ, 0, 0, 0, 0, 0,
                            D=D, R=D, LAYOUT=0, INTERLEAVED=False, BACKWARD=False, SIGNED=True,
                            PER_ENTRY=False, KEEP_TABLE=False, AXIS_H_FROM=D // 2,
                            AXIS_W_FROM=D // 2, XBLOCK=xblock, INT64=True)
    assert torch.equal(out, q), f"{int(out.isnan().sum())} of {xblock} elements not written"


@pytest.fixture
def rotate_passes(monkeypatch):
    """The rotating pass (its Launch: grid, warps, arguments) of every two-pass route planned
    while the test runs."""
    passes = []
    real = launch.plan_two_pass

    def recording(*args, **kwargs):
        route, pointers = real(*args, **kwargs)
        passes.append(route.rotate_pass)
        return route, pointers
    monkeypatch.setattr(launch, "plan_two_pass", recording)
    return passes


@pytest.mark.parametrize("D_, R_", [(80, 80), (48, 48), (32, 24), (32, 16)])
@pytest.mark.parametrize("layout", ["sbhd", "thd"])
def test_heads_of_no_power_of_two_take_the_pass_by_element(D_, R_, layout, rotate_passes):
    # rows of pairs pad a head to powers of two (at d = 80 a third of the lanes idle): heads
    # whose D or R/2 is no power of two take the pass by element (4 warps), the others the
    # pairs pass (2 warps); either way the finished kernel's bits, forward and backward
    g = torch.Generator().manual_seed(D_ * 100 + R_)
    shape = (S, B, 3, D_) if layout == "sbhd" else (S * B, 3, D_)
    x = torch.randn(shape, generator=g).to(DEVICE, torch.bfloat16)
    dy = torch.randn(shape, generator=g).to(DEVICE, torch.bfloat16)
    freqs = ropelib.rope_freqs(S * B + 2, R_, device=DEVICE) * 2.3
    kw = dict(layout=layout)
    if layout == "thd":
        kw["cu_seqlens"] = torch.tensor([0, 7, S * B], dtype=torch.int32, device=DEVICE)

    def fn():
        xg = x.clone().requires_grad_(True)
        y = ropelib.apply_rope(xg, freqs, **kw)
        (gx,) = torch.autograd.grad(y, xg, dy)
        return y.detach(), gx
    want = through("finished", fn)
    got = through("two-pass", fn)
    by_element = D_ & (D_ - 1) or (R_ // 2) & (R_ // 2 - 1)
    warps = [p.num_warps for p in rotate_passes]
    assert warps and set(warps) == {4 if by_element else 2}, warps
    assert_same_bits(got, want, f"D={D_} R={R_} {layout}")


@pytest.mark.parametrize("sections", [(8, 8, 16), (16, 8, 8), (0, 16, 16), (8, 12, 12),
                                      (2, 3, 27)])
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_per_axis_tables_same_bits_by_pairs_and_by_element(sections, layout, rotate_passes):
    # Qwen2-VL's tables [3, B, S, D] read as they are: sections that start at multiples of 8
    # pairs take the pairs pass (2 warps), others the pass by element (4 warps); either way
    # the bits of the finished kernel on the gathered table, forward and backward
    D_ = 2 * sum(sections)
    g = torch.Generator().manual_seed(sum(s * 10 ** i for i, s in enumerate(sections)))
    Bq, Sq = 2, 5
    q = torch.randn(Bq, Sq, 3, D_, generator=g).to(DEVICE, torch.bfloat16)
    k = torch.randn(Bq, Sq, 2, D_, generator=g).to(DEVICE, torch.bfloat16)
    if layout == "sbhd":
        q, k = q.transpose(0, 1).contiguous(), k.transpose(0, 1).contiguous()
    pos = torch.randint(0, 40, (3, Bq, Sq), generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, D_, 2).float() / D_))
    angles = torch.cat([pos[..., None].float() * inv] * 2, dim=-1)          # [3, B, S, D]
    cos, sin = angles.cos().to(DEVICE, torch.bfloat16), angles.sin().to(DEVICE, torch.bfloat16)
    dq = torch.randn(q.shape, generator=g).to(DEVICE)
    dk = torch.randn(k.shape, generator=g).to(DEVICE)
    unsqueeze = 2

    def fn():
        qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        qi, ki = (qg, kg) if layout == "bshd" else (qg.transpose(0, 1), kg.transpose(0, 1))
        yq, yk = ropelib.hf.apply_multimodal_rotary_pos_emb(qi, ki, cos, sin, list(sections),
                                                             unsqueeze)
        grads = torch.autograd.grad((yq, yk), (qg, kg), (dq.to(yq.dtype) if layout == "bshd"
                                                         else dq.to(yq.dtype).transpose(0, 1),
                                                         dk.to(yk.dtype) if layout == "bshd"
                                                         else dk.to(yk.dtype).transpose(0, 1)))
        return yq.detach(), yk.detach(), *grads
    want = through("finished", fn)
    got = through("two-pass", fn)
    pairs = all(a % 8 == 0 for a in (sections[0], sections[0] + sections[1], D_ // 2))
    if layout == "bshd":        # (sbhd q and k go through the gathered table: no two passes)
        warps = [p.num_warps for p in rotate_passes]
        assert warps and set(warps) == {2 if pairs else 4}, (sections, warps)
    assert_same_bits(got, want, f"sections {sections} {layout}")


@pytest.mark.parametrize("tables", ["per axis", "per batch entry", "shared",
                                    "per batch entry, bhsd", "shared, bhsd"])
def test_q_and_k_programs_by_chunks_of_tokens(tables, monkeypatch, rotate_passes):
    # Where every token has cos/sin rows of its own (Qwen2-VL's per-axis tables, Hugging
    # Face's [B, S, D] tables), the rows pass orders its grid by chunks of tokens, q's programs
    # then k's, so k finds the chunk's rows in L2; a shared table keeps q's programs before k's.
    # Programs of 2 head rows here (the GPU's 8 at d128): 8 chunks, the last one half full;
    # either order gives the finished kernel's bits, forward and backward. Contiguous
    # [B, H, S, D] (bhsd) keeps q's programs before k's: its tables' rows (one [B, S, D] pair,
    # 17 MB at b4 s8192) stay in L2 either way (285 MB read in both orders, Nsight Compute,
    # H200), so the pass over its head rows is not reordered.
    from ropelib.kernels import flat, tiles
    D_, Bq, Sq, hq, hk = 64, 3, 5, 3, 2
    monkeypatch.setattr(tiles, "TWO_PASS_INTERPRETED_ELEMENTS", 2 * D_)
    monkeypatch.setattr(launch, "TWO_PASS_ELEMENTS", 2 * D_)      # (on a GPU)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(Bq, Sq, hq, D_, generator=g).to(DEVICE, torch.bfloat16)
    k = torch.randn(Bq, Sq, hk, D_, generator=g).to(DEVICE, torch.bfloat16)
    dq, dk = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)
    pos = torch.randint(0, 40, (3, Bq, Sq), generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, D_, 2).float() / D_))
    angles = torch.cat([pos[..., None].float() * inv] * 2, dim=-1)          # [3, B, S, D]
    cos, sin = angles.cos().to(DEVICE, torch.bfloat16), angles.sin().to(DEVICE, torch.bfloat16)
    freqs = ropelib.rope_freqs(Sq, D_, device=DEVICE)

    def fn():
        qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        if tables == "per axis":
            yq, yk = ropelib.hf.apply_multimodal_rotary_pos_emb(qg, kg, cos, sin, [8, 8, 16], 2)
        elif tables == "per batch entry":
            yq, yk = ropelib.hf.apply_rotary_pos_emb(qg, kg, cos[1], sin[1], unsqueeze_dim=2)
        elif tables == "per batch entry, bhsd":
            yq, yk = ropelib.hf.apply_rotary_pos_emb(qg.transpose(1, 2).contiguous(),
                                                     kg.transpose(1, 2).contiguous(),
                                                     cos[1], sin[1])
        elif tables == "shared, bhsd":
            yq, yk = ropelib.hf.apply_rotary_pos_emb(qg.transpose(1, 2).contiguous(),
                                                     kg.transpose(1, 2).contiguous(),
                                                     cos[1, 0], sin[1, 0])     # [S, D]
        else:
            yq, yk = ropelib.apply_rope_qk(qg, kg, freqs, layout="bshd")
        if tables.endswith("bhsd"):
            assert yq.is_contiguous() and yq.shape == (Bq, hq, Sq, D_)
            yq, yk = yq.transpose(1, 2), yk.transpose(1, 2)
        grads = torch.autograd.grad((yq, yk), (qg, kg), (dq.to(DEVICE, yq.dtype),
                                                         dk.to(DEVICE, yk.dtype)))
        return yq.detach(), yk.detach(), *grads
    want = through("finished", fn)
    got = through("two-pass", fn)
    assert_same_bits(got, want, tables)
    assert rotate_passes, f"{tables}: the two-pass route was not taken"
    rows, chunks = Bq * Sq, -(-Bq * Sq // 2)
    for rotate_pass in rotate_passes:
        grid, c = rotate_pass.grid, rotate_pass.args
        assert c["HQ"] == hq and c["HK"] == hk
        assert not flat.by_element(D_, c["R"], c["INTERLEAVED"], c["AXIS_H_FROM"],
                                   c["AXIS_W_FROM"]), "rows of pairs, the pass ordered so"
        by_tokens = bool(flat.qk_by_tokens(c["LAYOUT"], c["PER_ENTRY"], c["AXIS_H_FROM"],
                                           c["R"], False))
        assert by_tokens == (tables in ("per axis", "per batch entry")), (tables, c)
        assert (c["LAYOUT"] == 2) == tables.endswith("bhsd"), (tables, c)
        want_grid = chunks * (hq + hk) if by_tokens else -(-rows * hq // 2) + -(-rows * hk // 2)
        assert grid == (want_grid,), (tables, grid, want_grid)


def test_hugging_face_views_of_bshd_projections(starts):
    # transformers' q and k: [B, H, S, D] views of [B, S, H, D] projections, with [B, S, D]
    # tables. Rotated in that memory order, so the two-pass route takes them whole; the outputs
    # have q's strides (as transformers' formula gives them) and the bits of the same call on
    # contiguous copies, forward and backward
    g = torch.Generator().manual_seed(9)
    q4 = torch.randn(B, S, HQ, D, generator=g).to(DEVICE, torch.bfloat16)
    k4 = torch.randn(B, S, HK, D, generator=g).to(DEVICE, torch.bfloat16)
    ids = torch.randint(0, 40, (B, S), generator=g).to(DEVICE)
    cos, sin = ropelib.rope_cos_sin(40, D, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = cos[ids], sin[ids]

    def fn(q, k):
        qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        q_, k_ = ropelib.hf.apply_rotary_pos_emb(qg, kg, cos, sin)
        dq, dk = torch.autograd.grad((q_, k_), (qg, kg), (q_.detach() * 3, k_.detach() - 1))
        return q_.detach(), k_.detach(), dq, dk
    views = q4.transpose(1, 2), k4.transpose(1, 2)
    got = through("two-pass", lambda: fn(*views))
    assert starts, "views of bshd projections should take the two-pass route"
    assert got[0].stride() == views[0].stride() and got[1].stride() == views[1].stride()
    want = through("finished", lambda: fn(*(v.contiguous() for v in views)))
    assert_same_bits([t.contiguous() for t in got], want, "views of bshd projections")


@pytest.mark.parametrize("route", ["finished", "two-pass"])
def test_hugging_face_views_random_cases(route):
    # transformers' q, k views of bshd projections with random head dims (powers of two or
    # not), one kv head or two, tables [S, D], [1, S, D] or [B, S, D] of any values (halves
    # unequal too), dtypes mixed: outputs with q's strides, values and gradients of
    # transformers' formula in fp64
    g = torch.Generator().manual_seed(13)
    for case in range(8):
        Dm = 2 * int(torch.randint(2, 9, (), generator=g))
        q_dtype = (torch.bfloat16, torch.float32, torch.float16)[case % 3]
        t_dtype = (q_dtype, torch.float32)[case % 2]
        table_shape = ((S, Dm), (1, S, Dm), (B, S, Dm))[case % 3]
        hk = (1, HK)[case % 2]                          # (one kv head: k contiguous both ways)
        q = torch.randn(B, S, HQ, Dm, generator=g).to(DEVICE, q_dtype).transpose(1, 2)
        k = torch.randn(B, S, hk, Dm, generator=g).to(DEVICE, q_dtype).transpose(1, 2)
        cos = torch.randn(table_shape, generator=g).to(DEVICE, t_dtype)
        sin = torch.randn(table_shape, generator=g).to(DEVICE, t_dtype)
        out_dtype = torch.promote_types(q_dtype, t_dtype)
        dq = torch.randn(q.shape, generator=g).to(DEVICE, out_dtype)
        dk = torch.randn(k.shape, generator=g).to(DEVICE, out_dtype)
        qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        with forced(route):
            qo, ko = ropelib.hf.apply_rotary_pos_emb(qg, kg, cos, sin)
            gq, gk = torch.autograd.grad((qo, ko), (qg, kg), (dq, dk))
        assert qo.stride() == q.stride() and ko.stride() == k.stride(), f"case {case}"
        assert qo.dtype == out_dtype and gq.dtype == q_dtype
        q64, k64 = (t.detach().double().requires_grad_(True) for t in (q, k))
        c64 = cos.double().reshape(-1, S, Dm)[:, None]           # [B or 1, 1, S, D]
        s64 = sin.double().reshape(-1, S, Dm)[:, None]
        rq, rk = q64 * c64 + rotate_half(q64) * s64, k64 * c64 + rotate_half(k64) * s64
        rgq, rgk = torch.autograd.grad((rq, rk), (q64, k64), (dq.double(), dk.double()))
        for got, want, what in ((qo, rq, "q"), (ko, rk, "k"), (gq, rgq, "dq"), (gk, rgk, "dk")):
            torch.testing.assert_close(got.double(), want.detach(), atol=4e-2, rtol=2e-2,
                                       msg=lambda m: f"case {case} D={Dm} {what}: {m}")


@pytest.mark.parametrize("views", [True, False])
def test_hugging_face_drop_ins_check_a_signature_once(views, monkeypatch):
    # A repeated eager call of either drop-in with one signature takes the plan of the first
    # without running its checks again (views of bshd projections included: straight to the
    # plan on their transposes), and gives the same bits and strides; a call whose checks
    # would fail still fails, and so does one whose cos/sin the checks had to copy.
    from ropelib import validation
    g = torch.Generator().manual_seed(31)
    section, Dm = [2, 3, 3], 16
    q4 = torch.randn(B, S, HQ, Dm, generator=g).to(DEVICE)
    k4 = torch.randn(B, S, HK, Dm, generator=g).to(DEVICE)
    q, k = (q4.transpose(1, 2), k4.transpose(1, 2)) if views else (q4, k4)
    dim = 1 if views else 2
    ang = torch.rand(3, B, S, Dm // 2, generator=g) * 20
    ang = torch.cat((ang, ang), -1).to(DEVICE)
    cos3, sin3 = ang.cos(), ang.sin()
    cos2, sin2 = cos3[0], sin3[0]
    checks = []
    real = validation.cos_sin_pair

    def counted(*a, **kw):
        checks.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(validation, "cos_sin_pair", counted)
    eager.SIGNATURES.clear()
    calls = {"hf": lambda: ropelib.hf.apply_rotary_pos_emb(q, k, cos2, sin2, unsqueeze_dim=dim),
             "multimodal": lambda: ropelib.hf.apply_multimodal_rotary_pos_emb(
                 q, k, cos3, sin3, section, dim)}
    with forced("two-pass"):        # CPU sizes take the two-pass route, as large ones do
        for name, call in calls.items():
            checks.clear()
            first = call()
            n_first = len(checks)
            again = call()
            assert n_first >= 1 and len(checks) == n_first, (name, "checked again")
            assert_same_bits(again, first, name)
            assert [t.stride() for t in again] == [t.stride() for t in first]
            if views:
                assert again[0].stride() == q.stride()
        with pytest.raises(ValueError, match="mrope_section"):
            ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos3, sin3, [2, 3, 4], dim)
        # cos/sin the checks copy (features not at stride 1) are not remembered: each call
        # checks them
        cos_t = cos3.transpose(-1, -2).contiguous().transpose(-1, -2)
        sin_t = sin3.transpose(-1, -2).contiguous().transpose(-1, -2)
        checks.clear()
        for _ in range(2):
            got = ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos_t, sin_t, section, dim)
            assert_same_bits(got, calls["multimodal"](), "copied tables")
        assert len(checks) >= 2
    eager.SIGNATURES.clear()
