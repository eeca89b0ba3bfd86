"""ropelib.qkv_rope_linear and QKVRoPE: RoPE (and QK-RMSNorm) fused into the QKV projection.

* the forward against the unfused pipeline (F.linear, then the norm, then ropelib's RoPE), element
  by element within the bound the docstring derives: rotate-half and interleaved, partial rotary,
  GQA and MHA, norm on and off (Qwen3's and Gemma 3's scale), angle tables and table-free
  angles, position ids, bshd and bhsd, with and without bias, bf16, fp16 and fp32;
* the backward (x, weight, bias, norm weights) against autograd of the unfused pipeline: equal
  to fp32 rounding in fp32, and in bf16 no further from an fp64 run than the unfused pipeline is;
* packed sequences (cu_seqlens, or position ids [T]); every output element written (outputs
  poisoned with NaN); a position outside the table gives NaN rows, or an error where checked;
* torch.library.opcheck of both operators, torch.compile(aot_eager, fullgraph=True) with no graph
  break and the same bits as eager, no recompilation for new lengths under dynamic=True,
  inference_mode, the module and its constructors from nn.Linear layers; bad input raises an
  error that names the argument;
* on a GPU (marked `gpu`, skipped elsewhere): Llama-3-8B's projection within the bound, Inductor
  and a CUDA graph giving the eager bits;
* benchmarks/qkv_rope_bench.py --dry-run.

Shapes are tiny (a GEMM in Triton's interpreter costs milliseconds per program instance).
"""
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import ropelib
from ropelib import eager, qkv_checks, qkv_linear, qkv_plan
from ropelib.kernels import planning, qkv_gemm
from loading import load_file  # noqa: E402
from registration import assert_registered  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPS = torch.ops.ropelib
# the unit roundoff u and the significand bits of each dtype
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


def make(dtype=torch.bfloat16, *, B=1, S=16, K=32, HQ=2, HK=1, D=16, bias=True, norm=False,
         packed=False):
    """x [B, S, K] (packed: [S, K]), weight [N, K], bias [N] and norm weights [D]: leaves."""
    N = (HQ + 2 * HK) * D
    x = torch.randn((S, K) if packed else (B, S, K)).to(dtype).requires_grad_()
    w = (torch.randn(N, K) / K**0.5).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(N)).to(dtype).requires_grad_() if bias else None
    wq = (1 + 0.3 * torch.randn(D)).requires_grad_() if norm else None
    wk = (1 + 0.3 * torch.randn(D)).requires_grad_() if norm else None
    return x, w, b, wq, wk


def _split(y, HQ, HK, D):
    lead = y.shape[:-1]
    return [t.reshape(*lead, h, D) for t, h in zip(y.split([HQ * D, HK * D, HK * D], -1),
                                                     (HQ, HK, HK))]


def unfused(x, w, b, wq=None, wk=None, *, HQ, HK, D, freqs=None, angles=None,
            position_ids=None, cu_seqlens=None, eps=1e-6, weight_offset=0.0, interleaved=False,
            out_layout="bshd"):
    """F.linear, then the QK-norm, then ropelib's RoPE: (q, k, v) and the number of roundings
    before the last one on the way to q and k (see qkv_rope_linear's Exactness)."""
    q, k, v = _split(F.linear(x, w, b), HQ, HK, D)
    layout = "thd" if x.dim() == 2 else "bshd"
    opts = dict(layout=layout, interleaved=interleaved, position_ids=position_ids)
    if wq is not None and freqs is not None and cu_seqlens is None:
        # the norm and the rotation in one rounding
        q, k = ropelib.qk_norm_rope(q, k, wq, wk, freqs, eps=eps, weight_offset=weight_offset,
                                    **opts)
        roundings = 2
    else:
        roundings = 1
        if wq is not None:      # the norm rounded to x's dtype, then rotated
            def norm(t, wt):
                t32 = t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)
                r = torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps)
                return (t32 * r * (wt.to(t32.dtype) + weight_offset)).to(t.dtype)
            q, k = norm(q, wq), norm(k, wk)
            roundings = 3
        q, k = ropelib.apply_rope_qk(q, k, freqs, angles=angles, cu_seqlens=cu_seqlens, **opts)
    if out_layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return (q, k, v), roundings


def exact(x, w, b, wq=None, wk=None, *, HQ, HK, D, R, eps=1e-6, weight_offset=0.0,
          interleaved=False, out_layout="bshd"):
    """For the bound: rho, the norm of each rotated pair (|value| past R and in v), in fp64
    from the same inputs, and the fp32 GEMMs' summation slack (2 K 2^-24 sum |x w|, scaled as
    the value is). Each [.., H, D] in out_layout."""
    x64, w64 = x.detach().double(), w.detach().double()
    y = F.linear(x64, w64, b.detach().double() if b is not None else None)
    e = F.linear(x64.abs(), w64.abs(), b.detach().double().abs() if b is not None else None)
    slack = 2 * x.shape[-1] * 2.0**-24 * e
    outs = []
    for i, (t, s) in enumerate(zip(_split(y, HQ, HK, D), _split(slack, HQ, HK, D))):
        if i < 2 and wq is not None:
            wt = (wq if i == 0 else wk).detach().double() + weight_offset
            r = torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
            t, s = t * r * wt, s * r * wt.abs()
        t, s = t.abs(), s.abs()
        if i < 2:               # a rotated pair mixes its two members
            j = torch.arange(R // 2)
            a, bb = (2 * j, 2 * j + 1) if interleaved else (j, j + R // 2)
            rho = (t[..., a] ** 2 + t[..., bb] ** 2).sqrt()
            t, s = t.clone(), s.clone()
            pair_slack = s[..., a] + s[..., bb]
            t[..., a], t[..., bb], s[..., a], s[..., bb] = rho, rho, pair_slack, pair_slack
        if out_layout == "bhsd":
            t, s = t.transpose(1, 2), s.transpose(1, 2)
        outs.append((t, s))
    return outs


def ulp(t: torch.Tensor, dtype) -> torch.Tensor:
    """The spacing of `dtype` at |t| (its smallest normal's below that)."""
    _, e = torch.frexp(t.double().abs().clamp_min(torch.finfo(dtype).tiny))
    return torch.ldexp(torch.ones_like(t, dtype=torch.float64), e - BITS[dtype])


def assert_within_bound(got, want, rho, slack, roundings: int, dtype):
    """|fused - unfused| <= roundings u rho + ulp(fused)/2 + ulp(unfused)/2 + GEMM slack, plus
    a few fp32 roundings of the rotation and norm arithmetic, element by element."""
    bound = (roundings * UNIT[dtype] + 4 * 2.0**-24) * rho + 0.5 * (ulp(got, dtype)
                                                                   + ulp(want, dtype)) + slack
    err = (got.detach().double() - want.detach().double()).abs()
    excess = err - bound
    assert not got.isnan().any()
    assert (excess <= 0).all(), (f"{int((excess > 0).sum())} elements past the bound, worst "
                                 f"{float(err.flatten()[excess.argmax()])} vs "
                                 f"{float(bound.flatten()[excess.argmax()])}")


def check_forward(dtype, *, HQ=2, HK=1, D=16, R=None, norm=False, bias=True, table="freqs",
                  interleaved=False, position_ids=False, out_layout="bshd", weight_offset=0.0,
                  B=1, S=16, K=32):
    R = R or D
    x, w, b, wq, wk = make(dtype, B=B, S=S, K=K, HQ=HQ, HK=HK, D=D, bias=bias, norm=norm)
    if weight_offset:
        with torch.no_grad():   # Gemma's weights sit around 0 (the scale is 1 + w)
            wq -= 1
            wk -= 1
    P = 3 * S
    pos = torch.randint(0, P, (B, S)) if position_ids else None
    tables = {"freqs": dict(freqs=ropelib.rope_freqs(P, D, rotary_percent=R / D,
                                                     interleaved=interleaved)),
              "angles": dict(angles=ropelib.rope_angles(D, rotary_percent=R / D))}[table]
    got = ropelib.qkv_rope_linear(x, w, b, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                  position_ids=pos, q_norm_weight=wq, k_norm_weight=wk,
                                  interleaved=interleaved, out_layout=out_layout,
                                  weight_offset=weight_offset, **tables)
    want, roundings = unfused(x, w, b, wq, wk, HQ=HQ, HK=HK, D=D, position_ids=pos,
                              interleaved=interleaved, out_layout=out_layout,
                              weight_offset=weight_offset, **tables)
    bounds = exact(x, w, b, wq, wk, HQ=HQ, HK=HK, D=D, R=R, interleaved=interleaved,
                   out_layout=out_layout, weight_offset=weight_offset)
    for i, (g, t, (rho, slack)) in enumerate(zip(got, want, bounds)):
        assert g.shape == t.shape and g.dtype == dtype and g.is_contiguous()
        assert_within_bound(g, t, rho, slack, roundings if i < 2 else 1, dtype)
    return got, want


# --- forward: exactness against the unfused pipeline ------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
@pytest.mark.parametrize("table", ["freqs", "angles"])
def test_forward_within_the_bound(dtype, norm, table, seeded):
    check_forward(dtype, norm=norm, table=table)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("R", [16, 8], ids=["full", "partial"])
@pytest.mark.parametrize("heads", [(2, 1), (2, 2), (3, 1)], ids=["gqa", "mha", "odd"])
def test_forward_pairings_and_heads(interleaved, R, heads, seeded):
    check_forward(torch.bfloat16, HQ=heads[0], HK=heads[1], R=R, interleaved=interleaved,
                  norm=heads == (2, 1))


@pytest.mark.parametrize("out_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("table", ["freqs", "angles"])
def test_forward_position_ids_and_layouts(out_layout, table, seeded):
    """Per-batch position ids, two sequences, a head dim that is not a power of two."""
    check_forward(torch.bfloat16, B=2, S=8, D=24, R=16, position_ids=True, out_layout=out_layout,
                  table=table, norm=True, bias=False)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
def test_forward_one_accumulator_per_head(interleaved, norm, seeded):
    """Every feature rotated and a power-of-two half (D = 32): the head's rows go into one
    [BLOCK_M, D] accumulator and its pairs are split apart in the epilogue (at D = 16 the half,
    8, is padded to 16 and the pairs are gathered into two accumulators instead)."""
    check_forward(torch.bfloat16, D=32, S=13, K=40, interleaved=interleaved, norm=norm)
    check_forward(torch.float32, D=32, interleaved=interleaved, norm=norm, table="angles",
                  bias=False)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("out_layout", ["bshd", "bhsd"])
def test_forward_two_heads_a_tile(interleaved, out_layout, seeded):
    """Both head counts even: the TMA forward takes two heads a tile, sharing their tokens'
    cos and sin rows; with QK-norm, per-entry position ids, a bias, a ragged last token tile and
    either output layout."""
    if qkv_gemm.INTERPRET:              # (on a GPU: where it has TMA)
        assert qkv_gemm.uses_tma(32, 4, 2, 32, 32, 2, torch.device("cpu"))
    check_forward(torch.bfloat16, HQ=4, HK=2, D=32, B=2, S=13, interleaved=interleaved,
                  norm=True, position_ids=True, out_layout=out_layout)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_forward_reads_one_cos_and_sin_a_pair_from_angles(interleaved, monkeypatch, seeded):
    """With table-free angles both members of a pair share their angle, so the rows hold equal
    values at both members' features (checked here) and the TMA forward reads one cos and one
    sin tile instead of four: the same outputs, bit for bit, as reading all four."""
    x, w, b, wq, wk = make(torch.bfloat16, B=2, S=13, HQ=4, HK=2, D=32, norm=True)
    angles = ropelib.rope_angles(32)
    pos = torch.randint(0, 1000, (2, 13))
    c, s = qkv_linear.cos_sin_rows(x, angles.turns, angles.amplitude, pos, None, interleaved)
    j = torch.arange(16)
    d_a, d_b = (2 * j, 2 * j + 1) if interleaved else (j, j + 16)
    assert torch.equal(c[:, d_a], c[:, d_b]) and torch.equal(-s[:, d_a], s[:, d_b])
    opts = dict(n_heads=4, n_kv_heads=2, head_dim=32, angles=angles, position_ids=pos,
                q_norm_weight=wq, k_norm_weight=wk, interleaved=interleaved)
    shared = ropelib.qkv_rope_linear(x, w, b, **opts)
    plan = qkv_gemm.plan
    seen = []

    def four_tiles(*args, **kwargs):
        seen.append(kwargs.get("shared_angle"))
        return plan(*args, **dict(kwargs, shared_angle=False))
    monkeypatch.setattr(qkv_gemm, "plan", four_tiles)
    eager.SIGNATURES.clear()                # (the kept plans: planned again, patched)
    four = ropelib.qkv_rope_linear(x, w, b, **opts)
    assert seen == [True]
    for a, t in zip(shared, four):
        assert torch.equal(a, t)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("halves", ["equal", "differ"])
def test_forward_reads_two_tiles_where_a_tables_pairs_share(interleaved, halves, monkeypatch,
                                                           seeded):
    """From an angle table the pre-pass says whether any pair's two members differ (a flag the
    forward branches on): rope_freqs repeats each frequency in both members, so the flag stays
    0 and the forward reads two tiles of the rows; a table whose members differ sets it and the
    forward reads four. Either way the outputs are those of reading four tiles (the flag
    withheld), bit for bit, and within the unfused pipeline's bound; a position outside the
    table leaves the flag alone and makes its rows NaN."""
    B, S, HQ, HK, D = 2, 13, 4, 2, 32
    x, w, b, wq, wk = make(torch.bfloat16, B=B, S=S, HQ=HQ, HK=HK, D=D, norm=True)
    freqs = ropelib.rope_freqs(40, D, interleaved=interleaved).view(40, D)
    if halves == "differ":
        freqs = freqs.clone()
        freqs[7, 3] += 0.25             # one member of one pair, in one row the ids read
    pos = torch.randint(0, 40, (B, S))
    pos[1, 5] = 7
    differ = torch.zeros(1, dtype=torch.int32)
    qkv_linear.cos_sin_rows(x, freqs, None, pos, None, interleaved, differ)
    assert int(differ) == (halves == "differ")
    opts = dict(n_heads=HQ, n_kv_heads=HK, head_dim=D, freqs=freqs, position_ids=pos,
                q_norm_weight=wq, k_norm_weight=wk, interleaved=interleaved)
    flagged = ropelib.qkv_rope_linear(x, w, b, **opts)
    run = qkv_linear._run
    withheld = []

    def four_tiles(kind, pointers, *args, **kwargs):
        withheld.append(pointers[-1] is not None)
        return run(kind, pointers[:-1] + (None,), *args, **kwargs)
    monkeypatch.setattr(qkv_linear, "_run", four_tiles)
    four = ropelib.qkv_rope_linear(x, w, b, **opts)
    monkeypatch.undo()
    assert withheld == [True]
    for a, t in zip(flagged, four):
        assert torch.equal(a, t)
    want, roundings = unfused(x, w, b, wq, wk, HQ=HQ, HK=HK, D=D, freqs=freqs.view(40, 1, 1, D),
                              position_ids=pos, interleaved=interleaved)
    bounds = exact(x, w, b, wq, wk, HQ=HQ, HK=HK, D=D, R=D, interleaved=interleaved)
    if halves == "equal":       # (exact() rotates by rope_freqs' angles)
        for i, (g, t, (rho, slack)) in enumerate(zip(flagged, want, bounds)):
            assert_within_bound(g, t, rho, slack, roundings if i < 2 else 1, torch.bfloat16)
    else:
        for g, t in zip(flagged, want):
            torch.testing.assert_close(g.float(), t.float(), rtol=0.02, atol=0.05)
    outside = pos.clone()
    outside[0, 2] = 40              # past the table's 40 rows
    differ.zero_()
    qkv_linear.cos_sin_rows(x, freqs, None, outside, None, interleaved, differ)
    assert int(differ) == (halves == "differ")
    with ropelib.set_index_checks("off"):      # (CPU ids are checked before the launch)
        q, k, v = ropelib.qkv_rope_linear(x, w, b, **dict(opts, position_ids=outside))
    assert q[0, 2].isnan().all() and k[0, 2].isnan().all() and not v.isnan().any()
    assert not q[1].isnan().any()


def test_forward_from_views_that_start_off_16_bytes(seeded):
    """x and the weight as views that start between two 16-byte boundaries (TMA needs them on
    one): the forward copies them first and gives what contiguous copies give."""
    x, w, b, _, _ = make(torch.bfloat16, B=1, S=16, K=32, HQ=2, HK=2, D=32)
    xs = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape).copy_(x)
    ws = torch.empty(w.numel() + 3, dtype=w.dtype)[3:].view(w.shape).copy_(w)
    assert xs.storage_offset() == 1 and ws.storage_offset() == 3
    freqs = ropelib.rope_freqs(16, 32)
    want = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=2, head_dim=32, freqs=freqs)
    got = ropelib.qkv_rope_linear(xs, ws, b, n_heads=2, n_kv_heads=2, head_dim=32, freqs=freqs)
    for g, t in zip(got, want):
        assert torch.equal(g, t)


def test_forward_gemma_scale_and_odd_sizes(seeded):
    """weight_offset=1 (Gemma 3's 1 + w), tokens and hidden size no multiple of the tiles."""
    check_forward(torch.bfloat16, S=13, K=40, norm=True, weight_offset=1.0, table="freqs")


def test_same_angles_as_apply_rope_bit_for_bit(seeded):
    """fp32 with the same accumulator order aside, the rotation itself is apply_rope's: with a
    weight that is the identity, the fused q is apply_rope(x) exactly."""
    S, D = 16, 16
    x = torch.randn(1, S, D)
    w = torch.eye(D).repeat(3, 1)                       # q = x, k = x, v = x (one head each)
    angles = ropelib.rope_angles(D)
    q, k, v = ropelib.qkv_rope_linear(x, w, n_heads=1, n_kv_heads=1, head_dim=D, angles=angles)
    want = ropelib.apply_rope(x.reshape(1, S, 1, D), layout="bshd", angles=angles)
    assert torch.equal(q, want) and torch.equal(k, want)
    assert torch.equal(v, x.reshape(1, S, 1, D))


# --- backward --------------------------------------------------------------------------------

def check_backward(dtype, *, norm, bias=True, table="freqs", interleaved=False, R=16, D=16,
                   out_layout="bshd", position_ids=False, B=1, S=16, HQ=2, HK=1,
                   weight_offset=0.0, backward="prologue"):
    x, w, b, wq, wk = make(dtype, B=B, S=S, HQ=HQ, HK=HK, D=D, bias=bias, norm=norm)
    pos = torch.randint(0, 2 * S, (B, S)) if position_ids else None
    tables = {"freqs": dict(freqs=ropelib.rope_freqs(2 * S, D, rotary_percent=R / D,
                                                     interleaved=interleaved)),
              "angles": dict(angles=ropelib.rope_angles(D, rotary_percent=R / D))}[table]
    opts = dict(position_ids=pos, interleaved=interleaved, out_layout=out_layout,
                weight_offset=weight_offset, **tables)
    got = ropelib.qkv_rope_linear(x, w, b, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                  q_norm_weight=wq, k_norm_weight=wk, backward=backward, **opts)
    want, _ = unfused(x, w, b, wq, wk, HQ=HQ, HK=HK, D=D, **opts)
    leaves = [t for t in (x, w, b, wq, wk) if t is not None]
    grads = [torch.randn_like(t) for t in got]
    g_fused = torch.autograd.grad(got, leaves, grads)
    g_unfused = torch.autograd.grad(want, leaves, grads)
    for g, leaf in zip(g_fused, leaves):
        assert g.shape == leaf.shape and g.dtype == leaf.dtype and not g.isnan().any()
    if dtype == torch.float32:
        for a, c in zip(g_fused, g_unfused):
            scale = float(c.abs().max())
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5 * scale)
        return
    # 16 bits: both pipelines round dY (and their results) once to the model's dtype, at
    # different points; the fused one is to be no further from the exact gradients than the
    # unfused one (an fp64 run of the same pipeline), and close to them
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(leaves64)
    x64, w64 = next(it), next(it)
    b64 = next(it) if b is not None else None
    wq64, wk64 = (next(it), next(it)) if norm else (None, None)
    want64, _ = unfused(x64, w64, b64, wq64, wk64, HQ=HQ, HK=HK, D=D, **opts)
    g_exact = torch.autograd.grad(want64, leaves64, [g.double() for g in grads])
    for name, a, c, e in zip(("x", "weight", "bias", "q_norm", "k_norm"), g_fused, g_unfused,
                             g_exact):
        err_fused = float((a.double() - e).abs().max())
        err_unfused = float((c.double() - e).abs().max())
        scale = float(e.abs().max())
        assert err_fused <= 2 * err_unfused + 4 * UNIT[dtype] * scale, (name, err_fused,
                                                                        err_unfused)
        assert err_fused <= 8 * UNIT[dtype] * scale, (name, err_fused, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
@pytest.mark.parametrize("table", ["freqs", "angles"])
def test_backward_matches_autograd_of_the_unfused_pipeline(dtype, norm, table, seeded):
    check_backward(dtype, norm=norm, table=table)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("table", ["freqs", "angles"])
@pytest.mark.parametrize("out_layout", ["bshd", "bhsd"])
def test_backward_with_dy_written_matches_the_unfused_pipeline(dtype, table, out_layout, seeded):
    # backward="dy": ropelib's RoPE rotates the gradients back, then two matrix products
    check_backward(dtype, norm=False, table=table, out_layout=out_layout, backward="dy")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("table", ["freqs", "angles"])
@pytest.mark.parametrize("out_layout", ["bshd", "bhsd"])
def test_backward_with_dy_written_and_qk_norm(dtype, table, out_layout, seeded):
    # with QK-norm: ropelib.qk_norm_rope's backward from the norm's kept input, then the GEMMs
    check_backward(dtype, norm=True, table=table, out_layout=out_layout, backward="dy")


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_backward_with_dy_written_qk_norm_positions_and_gemma_scale(interleaved, seeded):
    check_backward(torch.float32, norm=True, bias=False, D=24, R=16, B=2, S=8, HQ=3, HK=1,
                   position_ids=True, interleaved=interleaved, weight_offset=1.0,
                   backward="dy")


@pytest.mark.parametrize("table", ["freqs", "angles"])
@pytest.mark.parametrize("positions", ["position_ids", "cu_seqlens"])
def test_packed_sequences_with_dy_written_and_qk_norm(table, positions, seeded):
    """Packed x with position ids [T] or cu_seqlens (the norm's backward searches
    cu_seqlens in the kernel, as the RoPE kernel does), from an angle table or table-free
    angles."""
    T, D = 16, 16
    x, w, b, wq, wk = make(torch.float32, S=T, norm=True, packed=True)
    tables = {"freqs": dict(freqs=ropelib.rope_freqs(8, D)),
              "angles": dict(angles=ropelib.rope_angles(D))}[table]
    cu = torch.tensor([0, 5, 12, 16], dtype=torch.int32)
    where = dict(position_ids=torch.cat([torch.arange(n) for n in (5, 7, 4)])) \
        if positions == "position_ids" else dict(cu_seqlens=cu)
    got = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=D,
                                  q_norm_weight=wq, k_norm_weight=wk, backward="dy",
                                  **where, **tables)
    want, _ = unfused(x, w, b, wq, wk, HQ=2, HK=1, D=D, cu_seqlens=cu, **tables)
    leaves = [x, w, b, wq, wk]
    grads = [torch.randn_like(t) for t in got]
    for a, c in zip(torch.autograd.grad(got, leaves, grads),
                    torch.autograd.grad(want, leaves, grads)):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5 * float(c.abs().max()))


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
@pytest.mark.parametrize("table", ["freqs", "angles"])
def test_default_backward_writes_dy(norm, table, seeded):
    """backward=None runs "dy" (the faster, measured), with or without QK-norm, from a table or
    from angles: the backward writes dY (the eager route's kept dY step runs, the prologue
    GEMMs' implementation does not); the module's default is the same."""
    from unittest import mock
    D = 16
    x, w, b, wq, wk = make(torch.float32, S=8, HQ=2, HK=1, D=D, bias=True, norm=norm)
    tables = {"freqs": dict(freqs=ropelib.rope_freqs(16, D)),
              "angles": dict(angles=ropelib.rope_angles(D))}[table]
    want = "dy"
    assert qkv_checks.resolved_backward(None) == want
    leaves = [t for t in (x, w, b, wq, wk) if t is not None]
    ran = []
    step, prologue = qkv_plan.DyStep.__call__, qkv_linear._backward_impl

    def dy_written(*args):
        ran.append("dy")
        return step(*args)

    def gemm_prologue(*args):
        ran.append("prologue")
        return prologue(*args)
    with mock.patch.object(qkv_plan.DyStep, "__call__", dy_written), \
            mock.patch.object(qkv_linear, "_backward_impl", gemm_prologue):
        got = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=D,
                                      q_norm_weight=wq, k_norm_weight=wk, **tables)
        grads = [torch.randn_like(t) for t in got]
        got_grads = torch.autograd.grad(got, leaves, grads)
        module = ropelib.QKVRoPE(32, 2, 1, D, bias=True, qk_norm=norm)
        torch.autograd.grad(module(x, **tables), list(module.parameters()), grads)
    assert ran == [want, want] and module.backward is None
    chosen = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=D,
                                     q_norm_weight=wq, k_norm_weight=wk, backward=want, **tables)
    for a, c in zip(got_grads, torch.autograd.grad(chosen, leaves, grads)):
        assert torch.equal(a, c)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("R", [16, 8], ids=["full", "partial"])
def test_backward_with_dy_written_pairings_positions_and_heads(interleaved, R, seeded):
    check_backward(torch.float32, norm=False, interleaved=interleaved, R=R, HQ=3, HK=1, B=2,
                   S=8, position_ids=True, backward="dy")


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("R", [16, 8], ids=["full", "partial"])
def test_backward_pairings_and_partial_rotary(interleaved, R, seeded):
    check_backward(torch.float32, norm=True, interleaved=interleaved, R=R, HQ=3, HK=1)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_backward_after_a_one_accumulator_forward(interleaved, seeded):
    """D = 32: the norm's saved inputs come from the split accumulator."""
    check_backward(torch.float32, norm=True, interleaved=interleaved, D=32, R=32)


@pytest.mark.parametrize("out_layout", ["bshd", "bhsd"])
def test_backward_position_ids_layouts_and_gemma_scale(out_layout, seeded):
    check_backward(torch.float32, norm=True, bias=False, D=24, R=16, B=2, S=8,
                   position_ids=True, out_layout=out_layout, weight_offset=1.0, table="angles")


@pytest.mark.parametrize("backward", ["prologue", "dy"])
def test_backward_with_frozen_parts_and_unused_outputs(backward, seeded):
    """Only x needs a gradient (frozen projection); only q and v enter the loss."""
    x, w, b, _, _ = make(torch.float32)
    w.requires_grad_(False)
    b.requires_grad_(False)
    freqs = ropelib.rope_freqs(16, 16)
    q, k, v = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=16,
                                      freqs=freqs, backward=backward)
    (gx,) = torch.autograd.grad(q.sum() + 2 * v.sum(), (x,))
    (q2, _, v2), _ = unfused(x, w, b, HQ=2, HK=1, D=16, freqs=freqs)
    (want,) = torch.autograd.grad(q2.sum() + 2 * v2.sum(), (x,))
    torch.testing.assert_close(gx, want, rtol=1e-5, atol=1e-5)


# --- packed sequences --------------------------------------------------------------------------

@pytest.mark.parametrize("norm, backward", [(False, "prologue"), (True, "prologue"),
                                            (False, "dy")], ids=["plain", "qk-norm", "dy"])
def test_packed_sequences(norm, backward, seeded):
    """x [T, hidden] with cu_seqlens: each token at its index in its sequence; the same with
    position ids [T]; gradients too, through either backward."""
    T, D = 16, 16
    x, w, b, wq, wk = make(torch.float32, S=T, norm=norm, packed=True)
    cu = torch.tensor([0, 5, 12, 16], dtype=torch.int32)
    freqs = ropelib.rope_freqs(8, D)
    opts = dict(n_heads=2, n_kv_heads=1, head_dim=D, freqs=freqs, q_norm_weight=wq,
                k_norm_weight=wk, backward=backward)
    got = ropelib.qkv_rope_linear(x, w, b, cu_seqlens=cu, **opts)
    want, _ = unfused(x, w, b, wq, wk, HQ=2, HK=1, D=D, freqs=freqs, cu_seqlens=cu)
    assert [tuple(t.shape) for t in got] == [(T, 2, D), (T, 1, D), (T, 1, D)]
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, rtol=1e-5, atol=1e-5)
    pos = torch.cat([torch.arange(n) for n in (5, 7, 4)])
    by_ids = ropelib.qkv_rope_linear(x, w, b, position_ids=pos, **opts)
    assert all(torch.equal(a, c) for a, c in zip(got, by_ids))
    leaves = [t for t in (x, w, b, wq, wk) if t is not None]
    grads = [torch.randn_like(t) for t in got]
    want_grads = torch.autograd.grad(want, leaves, grads)
    for out in (got, by_ids):
        for a, c in zip(torch.autograd.grad(out, leaves, grads), want_grads):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5 * float(c.abs().max()))


# --- every element written; positions outside the table -----------------------------------------

def test_every_output_element_is_written(seeded):
    """The kernels' outputs poisoned with NaN before the launch (odd token count, hidden size
    and head count, partial rotary): none survives, forward or backward."""
    S, K, HQ, HK, D, R = 13, 40, 3, 1, 24, 16
    x, w, b, wq, wk = (t.detach() if t is not None else None
                       for t in make(torch.float32, S=S, K=K, HQ=HQ, HK=HK, D=D, norm=True))
    freqs = ropelib.rope_freqs(S, D, rotary_percent=R / D)[:, 0, 0].contiguous()
    M, N = S, (HQ + 2 * HK) * D

    def nan(*shape):
        return torch.full(shape, float("nan"))
    q, k, v = nan(1, S, HQ, D), nan(1, S, HK, D), nan(1, S, HK, D)
    rstd, pre = nan(M, HQ + HK), nan(M, (HQ + HK) * D)
    opts = dict(S=S, B=1, K=K, HQ=HQ, HK=HK, D=D, R=R, P=S, ids=None, cu_seqlens=None,
                layout="bshd", interleaved=False, eps=1e-6, device=x.device)
    shared = (freqs, None, None, None, wq, wk, rstd, pre)
    differ = torch.zeros(1, dtype=torch.int32)
    rows = qkv_linear.cos_sin_rows(x, freqs, None, None, None, False, differ)   # cos, s' [S, R]
    def run(kind, pointers):
        qkv_gemm.run(qkv_gemm.plan(kind, dtypes=planning.pointer_dtypes(pointers), **opts), pointers)
    run("fwd", (x.reshape(M, K), w, b, q, k, v) + rows + (wq, wk, rstd, pre, differ))
    for t in (q, k, v, rstd, pre):
        assert not t.isnan().any()
    g = [torch.randn_like(t) for t in (q, k, v)]
    dx, dw, db, dnorm = nan(M, K), nan(N, K), nan(N), nan(HQ + HK, D)
    run("dx", (*g, w, dx) + rows + shared[4:])
    run("dw", (*g, x.reshape(M, K), dw, db, dnorm) + shared)
    for t in (dx, dw, db, dnorm):
        assert not t.isnan().any()


def test_position_outside_the_table(seeded):
    """Checked where the ids sit in CPU memory (an error); unchecked, the rows come out NaN,
    and only those."""
    x, w, b, _, _ = make(torch.float32, B=1, S=4)
    freqs = ropelib.rope_freqs(6, 16)
    pos = torch.tensor([[0, 1, 9, 2]])
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, 6\)"):
        ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=16, freqs=freqs,
                                position_ids=pos)
    with ropelib.set_index_checks("off"):
        q, k, v = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=16,
                                          freqs=freqs, position_ids=pos)
    assert q[0, 2].isnan().all() and k[0, 2].isnan().all() and not v.isnan().any()
    assert not q[0, [0, 1, 3]].isnan().any() and not k[0, [0, 1, 3]].isnan().any()


@pytest.mark.parametrize("backward", ["prologue", "dy"])
def test_empty_batch(backward, seeded):
    x, w, b, wq, wk = make(torch.float32, B=0, S=4, norm=True)
    out = ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=16,
                                  freqs=ropelib.rope_freqs(4, 16), q_norm_weight=wq,
                                  k_norm_weight=wk, backward=backward)
    assert [tuple(t.shape) for t in out] == [(0, 4, 2, 16), (0, 4, 1, 16), (0, 4, 1, 16)]
    grads = torch.autograd.grad([t.sum() for t in out], (x, w, b, wq, wk))
    assert all(not g.any() for g in grads)


# --- operators, torch.compile, inference_mode ----------------------------------------------------

def _op_args(norm: bool, save: bool):
    x, w, b, wq, wk = make(torch.float32, S=8, norm=norm)
    angles = ropelib.rope_angles(16)
    return (x, w, b, angles.turns, angles.amplitude, None, None, wq, wk, 2, 1, 16, 1e-6, False,
            "bhsd", save, "prologue" if norm else "dy")


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
def test_opcheck(norm, seeded):
    """Both operators; the backward asked for every gradient (qk-norm) or only x's (plain: the
    ones not computed come back as empty tensors of their own)."""
    args = _op_args(norm, norm)
    torch.library.opcheck(OPS.qkv_rope_linear.default, args)
    x, w, b, table, sin, pos, cu, wq, wk = args[:9]
    q, k, v, rstd, pre = OPS.qkv_rope_linear(*args)
    grads = tuple(torch.randn_like(t) for t in (q, k, v))
    torch.library.opcheck(OPS.qkv_rope_linear_backward.default,
                          grads + (x.detach(), w.detach(), table, sin, pos, cu,
                                   wq.detach() if norm else None, wk.detach() if norm else None,
                                   rstd, pre, 2, 1, 16, False, "bhsd", True, norm, norm))


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "thd"])
def test_opcheck_rotated_dy(packed, seeded):
    """The dY operator of backward="dy" (the gradients of q, k and v in, dY out)."""
    lead = (8,) if packed else (2, 4)
    x = torch.randn(*lead, 32)
    grads = [torch.randn(*lead, h, 16) for h in (2, 1, 1)]
    angles = ropelib.rope_angles(16)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32) if packed else None
    torch.library.opcheck(OPS.qkv_rotated_dy.default,
                          (*grads, x, angles.turns, angles.amplitude, None, cu, False))


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "thd"])
def test_opcheck_rotated_dy_normed(packed, seeded):
    """The dY operator of backward="dy" with QK-norm (dY and the norm weights' gradients)."""
    lead = (8,) if packed else (2, 4)
    x = torch.randn(*lead, 32)
    grads = [torch.randn(*lead, h, 16) for h in (2, 1, 1)]
    norm_input = torch.randn(8, 3 * 16)
    wq, wk = torch.randn(16), torch.randn(16)
    angles = ropelib.rope_angles(16)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32) if packed else None
    torch.library.opcheck(OPS.qkv_rotated_dy_normed.default,
                          (*grads, x, norm_input, wq, wk, angles.turns, angles.amplitude, None,
                           cu, 2, 1, 16, 1e-6, False))


def test_registered_as_triton_ops_on_a_gpu():
    assert_registered('qkv_rope_linear', 'qkv_rope_linear_backward', 'qkv_rotated_dy',
                      'qkv_rotated_dy_normed')


@pytest.mark.parametrize("table", ["freqs", "angles"])
@pytest.mark.parametrize("backward,norm", [("prologue", True), ("dy", False), ("dy", True)])
def test_compile_fullgraph_equals_eager(table, backward, norm, seeded):
    x, w, b, wq, wk = make(torch.bfloat16, B=2, S=8, norm=norm)
    tables = dict(freqs=ropelib.rope_freqs(8, 16)) if table == "freqs" else \
        dict(angles=ropelib.rope_angles(16))
    pos = torch.randint(0, 8, (2, 8))

    def fn(x, w, b, wq, wk, pos):
        return ropelib.qkv_rope_linear(x * 2, w, b, n_heads=2, n_kv_heads=1, head_dim=16,
                                       position_ids=pos, q_norm_weight=wq, k_norm_weight=wk,
                                       out_layout="bhsd", backward=backward, **tables)
    args = (x, w, b, wq, wk, pos)
    args_e = [a.detach().clone().requires_grad_(i < 5) if a is not None else None
              for i, a in enumerate(args)]
    args_c = [a.detach().clone().requires_grad_(i < 5) if a is not None else None
              for i, a in enumerate(args)]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args_e)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, \
        [str(r.reason) for r in explained.break_reasons]
    torch._dynamo.reset()
    out_e = fn(*args_e)
    out_c = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args_c)
    grads = [torch.randn_like(o) for o in out_e]
    torch.autograd.backward(out_e, grads)
    torch.autograd.backward(out_c, grads)
    assert all(torch.equal(c, e) for c, e in zip(out_c, out_e))
    for a, c in zip(args_e[:5], args_c[:5]):
        if a is not None:
            assert torch.equal(c.grad, a.grad)
    torch._dynamo.reset()


def test_compile_dynamic_lengths_need_no_recompilation(seeded):
    """torch.compile(dynamic=True): new sequence lengths reuse the graph (the planner only
    compares symbolic sizes where a tile depends on them)."""
    import torch._dynamo.testing
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    w, wq, wk = torch.randn(64, 32), torch.ones(16), torch.ones(16)
    angles = ropelib.rope_angles(16)

    def fn(x):
        return ropelib.qkv_rope_linear(x, w, n_heads=2, n_kv_heads=1, head_dim=16,
                                       angles=angles, q_norm_weight=wq, k_norm_weight=wk)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    frames = None
    for S in (10, 12, 20, 40):
        x = torch.randn(1, S, 32, requires_grad=True)
        out = compiled(x)
        assert all(torch.equal(a, c) for a, c in zip(out, fn(x)))
        sum(t.sum() for t in out).backward()
        frames = counter.frame_count if frames is None else frames
        assert counter.frame_count == frames, S
    torch._dynamo.reset()


def test_inference_mode(seeded):
    x, w, b, wq, wk = (t.detach() for t in make(torch.bfloat16, norm=True))
    freqs = ropelib.rope_freqs(16, 16)
    opts = dict(n_heads=2, n_kv_heads=1, head_dim=16, freqs=freqs, q_norm_weight=wq,
                k_norm_weight=wk)
    with torch.no_grad():
        want = ropelib.qkv_rope_linear(x, w, b, **opts)
    with torch.inference_mode():
        got = ropelib.qkv_rope_linear(x, w, b, **opts)
        made_inside = ropelib.rope_freqs(16, 16)
    assert all(torch.equal(a, c) for a, c in zip(got, want))
    # a table made under inference_mode serves a later call that needs gradients
    xg = x.clone().requires_grad_()
    q, _, _ = ropelib.qkv_rope_linear(xg, w, b, **dict(opts, freqs=made_inside))
    q.sum().backward()
    assert xg.grad is not None and not xg.grad.isnan().any()


# --- GPU (skipped without one: written here, not yet run) ----------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
def test_gpu_model_sized_within_the_bound(norm):
    """Llama-3-8B's projection at 1024 tokens, GPU tiles: the forward within the bound, the
    backward no further from fp64 than the unfused pipeline."""
    torch.manual_seed(0)
    HQ, HK, D, K, S = 32, 8, 128, 4096, 1024
    x = torch.randn(1, S, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn((HQ + 2 * HK) * D, K, device="cuda") / K**0.5).to(torch.bfloat16)
    wq = (1 + 0.3 * torch.randn(D, device="cuda")) if norm else None
    wk = (1 + 0.3 * torch.randn(D, device="cuda")) if norm else None
    freqs = ropelib.rope_freqs(S, D, base=500000.0, device="cuda")
    got = ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK, head_dim=D, freqs=freqs,
                                  q_norm_weight=wq, k_norm_weight=wk)
    want, roundings = unfused(x, w, None, wq, wk, HQ=HQ, HK=HK, D=D, freqs=freqs)
    bounds = exact(x, w, None, wq, wk, HQ=HQ, HK=HK, D=D, R=D)
    for i, (g, t, (rho, slack)) in enumerate(zip(got, want, bounds)):
        assert_within_bound(g, t, rho, slack, roundings if i < 2 else 1, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_backward_and_inductor_and_cuda_graph():
    torch.manual_seed(1)
    HQ, HK, D, K, S = 8, 2, 128, 512, 256
    x = torch.randn(2, S, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn((HQ + 2 * HK) * D, K, device="cuda") / K**0.5).to(torch.bfloat16)
    w.requires_grad_()
    wq = (1 + 0.3 * torch.randn(D, device="cuda")).requires_grad_()
    wk = (1 + 0.3 * torch.randn(D, device="cuda")).requires_grad_()
    angles = ropelib.rope_angles(D, device="cuda")

    def fn(x, w, wq, wk):
        return ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                       angles=angles, q_norm_weight=wq, k_norm_weight=wk,
                                       out_layout="bhsd")
    leaves = (x, w, wq, wk)
    out_e = fn(*leaves)
    grads = [torch.randn_like(o) for o in out_e]
    g_e = torch.autograd.grad(out_e, leaves, grads)
    out_c = torch.compile(fn, fullgraph=True)(*leaves)
    g_c = torch.autograd.grad(out_c, leaves, grads)
    # the same kernels, launched by Inductor, which compiles them with its own options: on an
    # H100 and an H200 not the eager bits (dx up to 0.0156 at values of a few units), so within
    # two bf16 roundings at each output's scale
    for name, a, c in zip(("q", "k", "v", "dx", "dw"), out_c + g_c[:2], out_e + g_e[:2]):
        diff = (a.float() - c.float()).abs().max().item()
        scale = c.float().abs().max().item()
        assert diff <= 2.0**-6 * scale, \
            f"{name}: compiled differs from eager by up to {diff:.3g} at scale {scale:.3g}"
    # a CUDA graph of the forward replays to the eager bits
    static_x = x.detach().clone()
    with torch.no_grad():
        fn(static_x, w, wq, wk)             # warm-up (compiles the kernel) before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fn(static_x, w, wq, wk)
        static_x.copy_(x.detach())
        graph.replay()
    assert all(torch.equal(a, c.detach()) for a, c in zip(static_out, out_e))


# --- the module ---------------------------------------------------------------------------------

class _RMSNorm(nn.Module):
    """The shape of transformers' Qwen3RMSNorm: `weight` and `variance_epsilon`."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(dim))
        self.variance_epsilon = eps


def test_module_from_linear_shares_the_parameters(seeded):
    hidden, HQ, HK, D = 32, 2, 1, 16
    lin = nn.Linear(hidden, (HQ + 2 * HK) * D, bias=True)
    q_norm, k_norm = _RMSNorm(D, 1e-5), _RMSNorm(D, 1e-5)
    m = ropelib.QKVRoPE.from_linear(lin, n_heads=HQ, n_kv_heads=HK, head_dim=D, q_norm=q_norm,
                                    k_norm=k_norm, out_layout="bhsd")
    assert m.weight is lin.weight and m.bias is lin.bias
    assert m.q_norm_weight is q_norm.weight and m.eps == 1e-5
    x = torch.randn(1, 16, hidden)
    freqs = ropelib.rope_freqs(16, D)
    got = m(x, freqs)
    want = ropelib.qkv_rope_linear(x, lin.weight, lin.bias, n_heads=HQ, n_kv_heads=HK,
                                   head_dim=D, freqs=freqs, q_norm_weight=q_norm.weight,
                                   k_norm_weight=k_norm.weight, eps=1e-5, out_layout="bhsd")
    assert all(torch.equal(a, c) for a, c in zip(got, want))
    sum(t.sum() for t in got).backward()
    assert lin.weight.grad is not None and q_norm.weight.grad is not None
    assert "n_heads=2" in repr(m)


def test_module_from_linears(seeded):
    """Separate q, k, v projections (transformers' Llama): one fused projection, same result."""
    hidden, HQ, HK, D = 32, 2, 1, 16
    q_proj = nn.Linear(hidden, HQ * D, bias=False)
    k_proj = nn.Linear(hidden, HK * D, bias=False)
    v_proj = nn.Linear(hidden, HK * D, bias=False)
    m = ropelib.QKVRoPE.from_linears(q_proj, k_proj, v_proj, head_dim=D)
    assert (m.n_heads, m.n_kv_heads, m.bias) == (HQ, HK, None)
    x = torch.randn(1, 16, hidden)
    angles = ropelib.rope_angles(D)
    q, k, v = m(x, angles=angles)
    shape = (1, 16, -1, D)
    want_q = ropelib.apply_rope(q_proj(x).reshape(shape), layout="bshd", angles=angles)
    want_k = ropelib.apply_rope(k_proj(x).reshape(shape), layout="bshd", angles=angles)
    for got, want in ((q, want_q), (k, want_k), (v, v_proj(x).reshape(shape))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_module_own_parameters():
    m = ropelib.QKVRoPE(32, 4, 2, 8, bias=True, qk_norm=True, weight_offset=1.0)
    assert m.weight.shape == (64, 32) and m.bias.shape == (64,)
    assert torch.equal(m.q_norm_weight, torch.zeros(8))     # the scale w + 1 starts at 1
    assert float(m.weight.detach().abs().max()) <= 32 ** -0.5
    with pytest.raises(ValueError, match="out_layout must be one of"):
        ropelib.QKVRoPE(32, 4, 2, 8, out_layout="sbhd")
    with pytest.raises(ValueError, match="need .n_heads . 2 n_kv_heads. . head_dim = 64"):
        ropelib.QKVRoPE.from_linear(nn.Linear(32, 60), n_heads=4, n_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="pass both q_norm and k_norm"):
        ropelib.QKVRoPE.from_linear(nn.Linear(32, 64), n_heads=4, n_kv_heads=2, head_dim=8,
                                    q_norm=_RMSNorm(8))
    with pytest.raises(ValueError, match="q_proj has 30 output features, not a multiple"):
        ropelib.QKVRoPE.from_linears(nn.Linear(32, 30), nn.Linear(32, 16), nn.Linear(32, 16),
                                     head_dim=8)


# --- errors ------------------------------------------------------------------------------------

def _bad():
    x, w, b, wq, wk = (t.detach() for t in make(torch.float32, S=4, norm=True))
    return dict(x=x, weight=w, bias=b, n_heads=2, n_kv_heads=1, head_dim=16,
                freqs=ropelib.rope_freqs(6, 16), q_norm_weight=wq, k_norm_weight=wk)


@pytest.mark.parametrize("change, error, match", [
    (dict(x=torch.randn(4, 32, dtype=torch.float64)), TypeError, "x must have dtype in"),
    (dict(x=torch.randn(32)), ValueError, "x must be 2 or 3-D"),
    (dict(weight=torch.randn(48, 32)), ValueError,
     r"weight must be \[\(n_heads \+ 2 n_kv_heads\) \* head_dim, hidden\] .* = \[64, 32\]"),
    (dict(weight=torch.randn(64, 32, dtype=torch.bfloat16)), TypeError,
     "weight must have x's dtype"),
    (dict(bias=torch.randn(7)), ValueError, r"bias must be \[64\]"),
    (dict(n_heads=0), ValueError, "n_heads must be >= 1"),
    (dict(head_dim=16.0), TypeError, "head_dim must be an int"),
    (dict(head_dim=512), ValueError, "head_dim must be <= 256"),
    (dict(freqs=None), ValueError, "pass freqs .* or angles .*exactly one"),
    (dict(angles=ropelib.rope_angles(16)), ValueError, "exactly one of them"),
    (dict(freqs=ropelib.rope_freqs(6, 32)), ValueError, "larger than the head dim"),
    (dict(freqs=ropelib.rope_freqs(6, 16).bfloat16()), TypeError, "freqs must be float32"),
    (dict(freqs=ropelib.rope_freqs(3, 16)), ValueError, "the table .* has 3 positions"),
    (dict(rotary_dim=8), ValueError, "rotary_dim=8 but freqs rotates 16 features"),
    (dict(k_norm_weight=None), ValueError, "pass both q_norm_weight and k_norm_weight"),
    (dict(q_norm_weight=torch.ones(8)), ValueError, r"q_norm_weight must be \[head_dim\]"),
    (dict(eps=0.0), ValueError, "eps must be a finite number > 0"),
    (dict(interleaved=1), TypeError, "interleaved must be a bool"),
    (dict(out_layout="sbhd"), ValueError, "out_layout must be one of"),
    (dict(position_ids=torch.zeros(2, 4, dtype=torch.long)), ValueError,
     r"position_ids must be \[S=4\] or \[B=1 or 1, S=4\]"),
    (dict(position_ids=torch.zeros(1, 4)), TypeError, "position_ids must be an integer tensor"),
    (dict(cu_seqlens=torch.tensor([0, 4])), ValueError, "cu_seqlens is for packed sequences"),
    (dict(backward="gemm"), ValueError, r"backward must be None or one of \('prologue', 'dy'\)"),
])
def test_bad_arguments_are_named(change, error, match):
    args = dict(_bad(), **change)
    x, w, b = args.pop("x"), args.pop("weight"), args.pop("bias")
    with pytest.raises(error, match=match):
        ropelib.qkv_rope_linear(x, w, b, **args)


def test_packed_input_errors():
    args = _bad()
    x = args.pop("x")[0]                 # [T, hidden]
    w, b = args.pop("weight"), args.pop("bias")
    with pytest.raises(ValueError, match=r"x \[T, hidden\] = \(4, 32\) holds packed sequences"):
        ropelib.qkv_rope_linear(x, w, b, **args)
    with pytest.raises(ValueError, match="out_layout='bhsd' needs x"):
        ropelib.qkv_rope_linear(x, w, b, cu_seqlens=torch.tensor([0, 4]), out_layout="bhsd",
                                **args)
    with pytest.raises(ValueError, match="cu_seqlens.* must equal the number of tokens"):
        ropelib.qkv_rope_linear(x, w, b, cu_seqlens=torch.tensor([0, 3]), **args)


# --- benchmark ---------------------------------------------------------------------------------

def test_benchmark_dry_run(tmp_path, capsys):
    bench = load_file("qkv_rope_bench", ROOT / "benchmarks" / "qkv_rope_bench.py")
    out = tmp_path / "qkv.csv"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    from ropelib.bench import compare
    rows = compare.read_csv(out)
    meta = compare.read_meta(out)
    assert meta["script"] == "benchmarks/qkv_rope_bench.py" and "dry run" in meta["timing"]
    assert {r["provider"] for r in rows} == {"triton_gemm", "fused", "fused_prologue", "unfused",
                                             "cublas"}
    assert {r["pass"] for r in rows} == {"fwd", "fwd+bwd"}
    assert {r["qk_norm"] for r in rows} == {True, False}
    for r in rows:
        assert r["available"] is True, r
    assert "fused" in capsys.readouterr().out


def test_tma_forward_without_its_epilogue_is_the_projection(seeded):
    """rotate=False (the benchmarks' bare GEMM): the TMA forward stores q, k and v as projected,
    x @ W^T split into heads, with nothing rotated or normed."""
    B, S, K, HQ, HK, D = 2, 13, 40, 4, 2, 16
    x = torch.randn(B, S, K)
    w = torch.randn((HQ + 2 * HK) * D, K) / K ** 0.5
    outs = [torch.full((B, S, h, D), float("nan")) for h in (HQ, HK, HK)]
    pointers = qkv_gemm.pointers("fwd", x_ptr=x, w_ptr=w, q_ptr=outs[0], k_ptr=outs[1],
                                 v_ptr=outs[2])
    launch = qkv_gemm.plan("fwd", S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=D, P=S, ids=None,
                           cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                           device=x.device, dtypes=planning.pointer_dtypes(pointers),
                           rotate=False)
    if qkv_gemm.INTERPRET:
        assert launch.launcher is qkv_gemm.FWD_TMA
    qkv_gemm.run(launch, pointers)
    want = (x @ w.T).view(B, S, HQ + 2 * HK, D).split((HQ, HK, HK), dim=2)
    for got, expected in zip(outs, want):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_a_triton_without_tensor_descriptors_keeps_the_pointer_forward(seeded, monkeypatch):
    """Where Triton cannot make TMA descriptors in a kernel (tl.make_tensor_descriptor, which
    Triton 3.3 has only under an experimental name), the forward plans the pointer-loaded kernel
    instead of one that would not compile, and the projection is the same."""
    B, S, K, HQ, HK, D = 1, 11, 32, 2, 2, 16
    x = torch.randn(B, S, K)
    w = torch.randn((HQ + 2 * HK) * D, K) / K ** 0.5
    freqs = ropelib.rope_freqs(S, D)
    opts = dict(n_heads=HQ, n_kv_heads=HK, head_dim=D, freqs=freqs)
    assert qkv_gemm.uses_tma(K, HQ, HK, D, D, 4, torch.device("cpu")) == qkv_gemm.INTERPRET
    with_descriptors = ropelib.qkv_rope_linear(x, w, **opts)
    monkeypatch.setattr(qkv_gemm, "TENSOR_DESCRIPTORS", False)
    eager.SIGNATURES.clear()                # (the kept plans: planned again, patched)
    assert not qkv_gemm.uses_tma(K, HQ, HK, D, D, 4, torch.device("cpu"))
    rows = torch.empty(S, D)
    pointers = qkv_gemm.pointers("fwd", x_ptr=x, w_ptr=w, q_ptr=x, k_ptr=x, v_ptr=x,
                                 cos_ptr=rows, sin_ptr=rows,
                                 pairs_differ_ptr=torch.zeros(1, dtype=torch.int32))
    launch = qkv_gemm.plan("fwd", S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=D, P=S, ids=None,
                           cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                           device=x.device, dtypes=planning.pointer_dtypes(pointers))
    assert launch.launcher is qkv_gemm.FWD
    started, run = [], qkv_gemm.run
    monkeypatch.setattr(qkv_gemm, "run", lambda launch, pointers: (
        started.append(launch.launcher), run(launch, pointers)))
    without = ropelib.qkv_rope_linear(x, w, **opts)
    assert started == [qkv_gemm.FWD]           # the call's forward: the pointer-loaded kernel
    for a, b in zip(without, with_descriptors):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_planned_launches_name_every_argument_and_their_dtypes():
    """The direct launcher starts a compiled GEMM with the Launch's arguments alone (no defaults
    filled in by Triton) and finds it by the Launch: so each plan names every non-pointer
    argument of its kernel, and plans for other dtypes or another pipelining depth differ."""
    opts = dict(S=8, B=2, K=32, HQ=2, HK=1, D=16, R=16, P=8, ids=None, cu_seqlens=None,
                layout="bshd", interleaved=False, eps=1e-6, device=torch.device("cpu"))
    # every feature rotated and even head counts: the forward on the persistent TMA main loop;
    # partial rotary or an odd head count: the pointer-loaded kernel
    for kind, launcher, rotary, kv_heads in (
            ("fwd", qkv_gemm.FWD_TMA, 16, 2), ("fwd", qkv_gemm.FWD, 8, 2),
            ("fwd", qkv_gemm.FWD, 16, 1), ("dx", qkv_gemm.DX, 16, 1), ("dw", qkv_gemm.DW, 16, 1)):
        opts.update(R=rotary, HK=kv_heads)
        bf = qkv_gemm.plan(kind, dtypes=(torch.bfloat16,) * len(launcher.pointer_names), **opts)
        assert bf.launcher is launcher
        rest = [n for n in launcher.kernel.arg_names if n not in launcher.pointer_names]
        assert list(bf.args) == rest
        fp16 = qkv_gemm.plan(kind, dtypes=(torch.float16,) * len(launcher.pointer_names), **opts)
        assert bf != fp16 and bf == qkv_gemm.plan(
            kind, dtypes=(torch.bfloat16,) * len(launcher.pointer_names), **opts)
        deeper = planning.Launch(bf.grid, bf.num_warps, bf.args, bf.dtypes, bf.device,
                                 bf.launcher, num_stages=(bf.num_stages or 1) + 1)
        assert deeper != bf and deeper.options()["num_stages"] == (bf.num_stages or 1) + 1


def test_gpu_tiles_with_and_without_the_norm(monkeypatch):
    """On a GPU each kernel takes GPU_TILES[kind], and the rotating dX with QK-norm weights its
    own tile (GPU_TILES["dx_norm"]: the norm's backward spills far less there); the bare GEMM
    and dW keep theirs. Planned as on a GPU (no GPU needed: plan sees only sizes and dtypes)."""
    monkeypatch.setattr(qkv_gemm, "INTERPRET", False)
    monkeypatch.setattr(qkv_gemm, "has_tma", lambda device: False)   # an A100, say
    opts = dict(S=8, B=1, K=4096, HQ=32, HK=8, D=128, R=128, P=8, ids=None, cu_seqlens=None,
                layout="bshd", interleaved=False, eps=1e-6, device=torch.device("cuda"))
    keys = ("BLOCK_M", "BLOCK_K", "GROUP_M")

    def tile(kind, norm, rotate=True, dtype=torch.bfloat16, D=128):
        dtypes = tuple(None if n in qkv_gemm._NORM and not norm else dtype
                       for n in qkv_gemm.LAUNCHERS[kind].pointer_names)
        launch = qkv_gemm.plan(kind, dtypes=dtypes, rotate=rotate, **dict(opts, D=D, R=D))
        return (*(launch.args[k] for k in keys), launch.num_warps, launch.num_stages)

    def wanted(key, tiles=qkv_gemm.GPU_TILES):
        return tuple(tiles[key][k] for k in (*keys, "num_warps", "num_stages"))

    for kind in ("fwd", "dx", "dw"):
        assert tile(kind, False) == tile(kind, True, rotate=False) == wanted(kind)
    assert tile("dx", True) == wanted("dx_norm") != wanted("dx")
    assert tile("fwd", True) == wanted("fwd") and tile("dw", True) == wanted("dw")
    # rows of 1 KiB (fp32 heads of 256) take tiles that fit an SM's shared memory, norm or not
    # (dX with the norm a tile of its own); bf16 heads of 256 (512 bytes) keep the usual ones
    long_tiles = qkv_gemm.GPU_TILES_LONG_ROWS
    for kind in ("fwd", "dx", "dw"):
        for norm, dtype, long_rows in ((False, torch.float32, True), (True, torch.float32, True),
                                       (True, torch.bfloat16, False)):
            key = f"{kind}_norm" if norm else kind
            want = wanted(key if key in long_tiles else kind, long_tiles) if long_rows else \
                wanted("dx_norm" if kind == "dx" and norm else kind)
            assert tile(kind, norm, dtype=dtype, D=256) == want, (kind, norm, dtype)


def test_forward_on_tma_where_a_gpu_has_it(monkeypatch):
    """On a GPU with TMA (planned as on an H200: no GPU needed) the forward runs on the
    persistent TMA main loop: one program per SM, two heads a tile, TMA_TILES by dtype; not
    with an odd head count or heads of 256, nor where the hidden size makes x's rows other than
    a multiple of 16 bytes, nor with partial rotary, nor without TMA."""
    monkeypatch.setattr(qkv_gemm, "INTERPRET", False)
    monkeypatch.setattr(qkv_gemm, "has_tma", lambda device: True)
    monkeypatch.setattr(qkv_gemm, "ensure_allocator", lambda: None)
    monkeypatch.setattr(qkv_gemm, "multiprocessors", lambda device: 132)
    opts = dict(S=8, B=1, K=4096, HQ=32, HK=8, D=128, R=128, P=8, ids=None, cu_seqlens=None,
                layout="bshd", interleaved=False, eps=1e-6, device=torch.device("cuda", 0))

    def plan(dtype=torch.bfloat16, **over):
        dtypes = tuple(None if n in qkv_gemm._NORM else dtype for n in qkv_gemm.FWD_POINTERS)
        return qkv_gemm.plan("fwd", dtypes=dtypes, **dict(opts, **over))
    bf = plan()
    assert bf.launcher is qkv_gemm.FWD_TMA and bf.grid == (132,) and bf.args["PROGRAMS"] == 132
    tile = qkv_gemm.TMA_TILES[2]
    assert (bf.args["BLOCK_M"], bf.args["BLOCK_K"], bf.num_warps, bf.num_stages) == (
        tile["BLOCK_M"], tile["BLOCK_K"], tile["num_warps"], tile["num_stages"])
    assert plan(torch.float32).args["BLOCK_K"] == qkv_gemm.TMA_TILES[4]["BLOCK_K"]
    for other in (dict(HK=1), dict(HQ=3), dict(D=256, R=256),   # odd heads, heads of 256
                  dict(K=4092),                                  # 8184-byte rows: not TMA's
                  dict(R=64)):                                   # partial rotary
        assert plan(**other).launcher is qkv_gemm.FWD, other
    monkeypatch.setattr(qkv_gemm, "has_tma", lambda device: False)
    assert plan().launcher is qkv_gemm.FWD


def test_tma_allocator_set_only_where_none_is():
    """The TMA forward's descriptors need Triton's allocator: ensure_allocator sets torch's
    where the thread has none (Triton's NullAllocator) and leaves a caller's own alone. Each
    case runs in a fresh context, so the test leaves this thread's allocator as it was."""
    import contextvars

    from triton.runtime import _allocation

    def fresh(allocator):
        def run():
            _allocation._allocator.set(allocator)
            qkv_gemm.ensure_allocator()
            return _allocation._allocator.get()
        return contextvars.copy_context().run(run)
    assert fresh(_allocation.NullAllocator()) is qkv_gemm._scratch

    def mine(size, alignment, stream):
        raise AssertionError("not called here")
    assert fresh(mine) is mine


def test_forward_profile_probe_launches_every_call(capsys):
    """benchmarks/qkv_forward_ncu_probe.py --check: the launches it profiles on a GPU (cuBLAS's,
    ropelib's bare and fused forward, the mainloop probe's bare and rotating TMA kernels) run
    at small sizes."""
    probe = load_file("qkv_forward_ncu_probe", ROOT / "benchmarks" / "qkv_forward_ncu_probe.py")
    assert probe.main(["--check"]) == 0
    ran = capsys.readouterr().out
    assert all(f"check: {name} ran" in ran for name in probe.CALLS)


def test_long_row_tiles_compute_the_projection(monkeypatch, seeded):
    """The tiles of fp32 heads of more than 128 features (GPU_TILES_LONG_ROWS: programs that fit
    an SM's shared memory, the fastest of four candidates on an H200) give the unfused pipeline's forward and
    gradients, with and without QK-norm: run here, in the interpreter, at those very tiles."""
    monkeypatch.setattr(qkv_gemm, "pick_tiles", lambda kind, M, K, device, norm=False,
                        row_bytes=0: dict(qkv_gemm.GPU_TILES_LONG_ROWS[kind]))
    eager.SIGNATURES.clear()                # (the kept plans: planned again, patched)
    for norm in (False, True):
        check_backward(torch.float32, norm=norm, D=32, R=32, S=20)


def test_mainloop_probe_variants_compute_the_projection(capsys):
    """benchmarks/qkv_mainloop_probe.py's GEMM variants (pointer loads, TMA descriptors, the
    persistent GEMM with fewer programs than tiles) compute x W^T at a small size, here (the
    interpreter) as on a GPU; its fused candidates, grid and persistent (flattened or not, one
    head or two a tile, TMA or pointer loads), rotate q and k and pass v through."""
    probe = load_file("qkv_mainloop_probe", ROOT / "benchmarks" / "qkv_mainloop_probe.py")
    probe.check()
    out = capsys.readouterr().out
    assert "pointers: max error" in out and "descriptors: max error" in out
    assert "persistent, 3 programs for 8 tiles: max error" in out
    for flat in ("persistent, flattened,", "persistent,"):
        for source in ("angles", "cos/sin table"):
            assert f"fused candidate, {flat} 5 programs for 16 tiles, {source}: max" in out
    for source in ("angles", "cos/sin table"):
        assert f"two heads a tile, 5 programs for 12 tiles, {source}: max" in out
    for heads in (1, 2):
        assert f"pointer loads, {heads} head(s) a tile, cos/sin table: max" in out
    for kind in ("rows", "rows, one per pair", "rows, QK-norm", "rows, one per pair, QK-norm"):
        assert f"two heads, the product's cos/sin {kind}: max" in out


def test_tile_sweep_takes_chosen_tiles():
    """benchmarks/qkv_tiles.py --tile: only the tiles named (bare and rotating, each kernel as
    qkv_gemm plans it), here through the interpreter's dry run; a malformed tile is refused
    with what was expected."""
    sweep = load_file("qkv_tiles", ROOT / "benchmarks" / "qkv_tiles.py")
    chosen = sweep.parse_tiles(["dw=16,16,8,4,1", "dx=16,16,8,4,1"])
    assert chosen == {"dw": [(16, 16, 8, 4, 1)], "dx": [(16, 16, 8, 4, 1)]}
    rows = sweep.run(True, candidates=chosen)
    assert [(r["kernel"], r["rotate"]) for r in rows] == [("dw", False), ("dw", True),
                                                          ("dx", False), ("dx", True)]
    assert all(not r["reason"] for r in rows)
    # --norm: the rotating dX and dW with QK-norm weights and a forward's saved statistics
    before = {k: dict(v) for k, v in qkv_gemm.GPU_TILES.items()}
    rows = sweep.run(True, candidates=chosen, norm=True)
    assert len(rows) == 4 and all(not r["reason"] for r in rows)
    assert qkv_gemm.GPU_TILES == before          # the sweep leaves ropelib's tiles as they were
    for bad in ("dz=16,16,8,4,1", "dw=16,16,8", "dw=a,b,c,d,e"):
        with pytest.raises(SystemExit, match="KIND=BLOCK_M,BLOCK_K"):
            sweep.parse_tiles([bad])


@pytest.mark.parametrize("route", ["eager", "operator"])
def test_a_second_backward_raises_on_either_route(route, monkeypatch, seeded):
    """A plain eager call runs the operator's implementation without the dispatcher; with
    create_graph its backward calls the operators, so a second backward raises as through the
    operator (no autograd formula), never a silent zero."""
    if route == "operator":
        monkeypatch.setattr(qkv_linear, "eager", type("NotEager", (), {
            "active": staticmethod(lambda: False)}))
    x = torch.randn(1, 4, 32, requires_grad=True)
    w = torch.randn(64, 32, requires_grad=True)
    q, _, _ = ropelib.qkv_rope_linear(x, w, n_heads=2, n_kv_heads=1, head_dim=16,
                                      angles=ropelib.rope_angles(16))
    g = torch.autograd.grad(q.sum(), x, create_graph=True)[0]
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula"):
        g.sum().backward()
