"""The QKV projection's kept plans (qkv_plan.planned, its pre-pass plans and the backward's dY
rotation, all in eager.SIGNATURES): an eager call plans its kernels once per sizes, dtypes and
options, and what it keeps changes nothing else.

* a repeated call takes the kept Launch (the same object), equal to a fresh plan's; the outputs
  and gradients are the same bits with the plans kept or dropped;
* a patched planner or tile table is seen once the plans are dropped (eager.SIGNATURES.clear(),
  the one clear path), and not before;
* another dtype, layout, per-entry position ids or cu_seqlens' length plans anew;
* what is checked per call still is: position ids outside the table, a wrong dtype or device,
  after a call of the same shape was planned.
"""
import pytest
import torch

import ropelib
from ropelib import eager, qkv_linear, qkv_plan
from ropelib.kernels import launch as kernel_launch, planning, qkv_gemm, tiles

B, S, K, HQ, HK, D = 2, 5, 32, 2, 2, 16


def inputs(dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, K, generator=g).to(dtype).requires_grad_(grad)
    w = (torch.randn((HQ + 2 * HK) * D, K, generator=g) / K ** 0.5).to(dtype).requires_grad_(grad)
    return x, w


def call(x, w, **over):
    opts = dict(n_heads=HQ, n_kv_heads=HK, head_dim=D, angles=ropelib.rope_angles(D))
    return ropelib.qkv_rope_linear(x, w, **dict(opts, **over))


def plan_opts(**over):
    dtypes = tuple(None if n in qkv_gemm._NORM else torch.float32 for n in qkv_gemm.FWD_POINTERS)
    return dict(dict(S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=D, P=64, ids=None, cu_seqlens=None,
                     layout="bshd", interleaved=False, eps=1e-6, device=torch.device("cpu"),
                     dtypes=dtypes), **over)


def test_a_kept_launch_is_the_plan_of_those_arguments():
    eager.SIGNATURES.clear()
    first = qkv_plan.planned("fwd", **plan_opts())
    assert qkv_plan.planned("fwd", **plan_opts()) is first
    assert first == qkv_gemm.plan("fwd", **plan_opts())
    ids = torch.zeros(B, S, dtype=torch.int64)
    for other in (dict(layout="bhsd"), dict(interleaved=True), dict(S=S + 1), dict(eps=1e-5),
                  dict(ids=ids), dict(cu_seqlens=torch.tensor([0, 2, S])),
                  dict(dtypes=tuple(torch.bfloat16 if d is not None else None
                                    for d in plan_opts()["dtypes"]))):
        got = qkv_plan.planned("fwd", **plan_opts(**other))
        assert got is not first and got == qkv_gemm.plan("fwd", **plan_opts(**other)), other
    # one row of ids for every entry plans as no ids (plan reads only whether there is a row
    # per entry); a row per entry does not
    assert qkv_plan.planned("fwd", **plan_opts(ids=ids[:1])) is first


def test_a_patched_planner_or_tile_table_is_seen_once_the_plans_are_cleared(monkeypatch):
    eager.SIGNATURES.clear()
    kept = qkv_plan.planned("fwd", **plan_opts())
    tile = dict(BLOCK_M=16, BLOCK_K=16, GROUP_M=8, num_warps=2, num_stages=1)
    monkeypatch.setattr(qkv_gemm, "pick_tiles", lambda *a, **k: dict(tile))
    monkeypatch.setattr(qkv_gemm, "TENSOR_DESCRIPTORS", False)     # the pointer-loaded kernel
    assert qkv_plan.planned("fwd", **plan_opts()) is kept        # kept until cleared
    eager.SIGNATURES.clear()
    patched = qkv_plan.planned("fwd", **plan_opts())
    assert patched.num_warps == 2 and patched.launcher is qkv_gemm.FWD
    monkeypatch.undo()
    eager.SIGNATURES.clear()
    again = qkv_plan.planned("fwd", **plan_opts())
    assert again == kept and again.num_warps != 2
    # a tile table's entry replaced (as benchmarks/qkv_stages_ab.py does), then the plans
    # cleared: the next call plans from the new entry
    monkeypatch.setattr(qkv_gemm, "INTERPRET", False)
    monkeypatch.setattr(qkv_gemm, "has_tma", lambda device: False)
    gpu = dict(plan_opts(), K=4096, HQ=32, HK=8, D=128, R=128, device=torch.device("cuda"))
    base = qkv_gemm.GPU_TILES["fwd"]
    assert qkv_plan.planned("fwd", **gpu).num_stages == base["num_stages"]
    monkeypatch.setitem(qkv_gemm.GPU_TILES, "fwd", dict(base, num_stages=base["num_stages"] + 1))
    assert qkv_plan.planned("fwd", **gpu).num_stages == base["num_stages"]     # kept
    eager.SIGNATURES.clear()
    assert qkv_plan.planned("fwd", **gpu).num_stages == base["num_stages"] + 1
    monkeypatch.undo()
    eager.SIGNATURES.clear()
    assert qkv_gemm.GPU_TILES["fwd"] is base


def test_a_patched_tile_table_reaches_the_call_once_the_plans_are_cleared(monkeypatch):
    """Through the public call, forward and backward: a patched tile of the interpreter's
    (pick_tiles) is planned after eager.SIGNATURES.clear(), and the result is the same bits."""
    x, w = inputs(grad=True)
    out = call(x, w, backward="prologue")       # (ropelib's dX and dW kernels)
    g = [torch.ones_like(t) for t in out]
    want = list(out) + list(torch.autograd.grad(out, (x, w), g))
    real = qkv_gemm.pick_tiles
    tiles_asked = []

    def pick_tiles(kind, M, K, device, norm=False, row_bytes=0):
        tiles_asked.append(kind)
        return dict(real(kind, M, K, device, norm, row_bytes), BLOCK_K=16)
    monkeypatch.setattr(qkv_gemm, "pick_tiles", pick_tiles)
    call(x, w)
    assert tiles_asked == []                    # the kept plans, until cleared
    eager.SIGNATURES.clear()
    out = call(x, w, backward="prologue")
    got = list(out) + list(torch.autograd.grad(out, (x, w), g))
    assert tiles_asked == ["fwd", "dx", "dw"]
    for kind in ("fwd", "dx", "dw"):
        launch = [v for k, v in eager.SIGNATURES.entries.items() if k[:2] == ("qkv_gemm", kind)]
        assert launch and launch[0].args["BLOCK_K"] == 16, kind
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_calls_plan_through_the_kept_launches(monkeypatch):
    x, w = inputs()
    call(x, w)
    planned = []
    real = qkv_gemm.plan

    def plan(kind, **kw):
        planned.append(kind)
        return real(kind, **kw)
    monkeypatch.setattr(qkv_gemm, "plan", plan)
    eager.SIGNATURES.clear()
    call(x, w)
    call(x, w)
    assert planned == ["fwd"]           # the second call took the first's plan
    kept = dict(eager.SIGNATURES.entries)
    assert any(k[0] == "qkv_cos_sin_rows" for k in kept)
    call(x, w)
    assert eager.SIGNATURES.entries == kept     # and its pre-pass's


def test_the_pre_pass_plans_again_where_early_launch_changes_and_plans_are_cleared(
        monkeypatch):
    rows = (torch.zeros(1, dtype=torch.int64), torch.ones(1), None, None, S, 1, D, False,
            torch.device("cpu"), False)
    kept = qkv_plan.prepass_plan(*rows)
    assert qkv_plan.prepass_plan(*rows) is kept
    monkeypatch.setattr(tiles, "EARLY_LAUNCH", not tiles.EARLY_LAUNCH)
    eager.SIGNATURES.clear()
    assert qkv_plan.prepass_plan(*rows) is not kept
    monkeypatch.setattr(kernel_launch, "launches_early", lambda device: False)
    eager.SIGNATURES.clear()
    assert qkv_plan.prepass_plan(*rows) is not kept


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_kept_plans_give_the_same_bits(layout):
    """Forward and gradients, with the plans dropped before every call and kept."""
    x, w = inputs(grad=True)
    grads = None
    results = []
    for keep in (False, True, True):
        if not keep:
            eager.SIGNATURES.clear()
        out = call(x, w, out_layout=layout)
        grads = grads or [torch.randn_like(t) for t in out]
        results.append(list(out) + list(torch.autograd.grad(out, (x, w), grads)))
        with torch.no_grad():
            results[-1] += list(call(x, w, out_layout=layout))
    for got in results[1:]:
        for a, b in zip(results[0], got):
            assert torch.equal(a, b)


def test_checks_still_run_once_planned():
    x, w = inputs()
    freqs = ropelib.rope_freqs(S + 2, D)
    opts = dict(freqs=freqs, angles=None)
    ok = torch.arange(S).expand(B, S).contiguous()
    call(x, w, position_ids=ok, **opts)             # planned for this shape
    bad = ok.clone()
    bad[1, 3] = S + 2                               # outside the table (values checked on CPU)
    with pytest.raises(ValueError):
        call(x, w, position_ids=bad, **opts)
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        call(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        call(x, w, eps=float("nan"))
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        call(x, w, eps=0.0)
    with pytest.raises(ValueError, match="weight_offset must be a finite number"):
        call(x, w, weight_offset=float("inf"))
    with pytest.raises(TypeError, match="n_heads must be an int"):
        call(x, w, n_heads=2.0)
    with pytest.raises(TypeError, match="n_heads must be an int"):
        call(x, w, n_heads=True)
    # a strided x of the same shape: the same bits as its contiguous copy
    wide = torch.randn(B, S, 2 * K)
    strided = wide[..., ::2]
    for a, b in zip(call(strided, w), call(strided.contiguous(), w)):
        assert torch.equal(a, b)


def test_a_size_not_a_plain_int_is_planned_every_time(monkeypatch):
    """Under torch.compile's tracing sizes may be SymInts: planned keeps only plans of plain
    ints (here an int subclass stands for one)."""
    class Size(int):
        pass
    eager.SIGNATURES.clear()
    got = qkv_plan.planned("fwd", **plan_opts(S=Size(S)))
    assert got == qkv_gemm.plan("fwd", **plan_opts()) and not eager.SIGNATURES.entries


def test_host_probe_times_every_piece_with_the_launches_removed():
    """benchmarks/qkv_host_probe.py --pieces: each piece runs with the launches removed (each
    called once here), and the launches are back after the block."""
    from pathlib import Path

    from loading import load_file
    probe = load_file("qkv_host_probe",
                      Path(__file__).resolve().parents[1] / "benchmarks" / "qkv_host_probe.py")
    with probe.qkv_launches_removed():
        assert qkv_linear.start is not planning.start and qkv_gemm.start is not planning.start
        steps = probe.pieces("cpu")
        for name, fn in steps.items():
            (fn[0] if isinstance(fn, tuple) else fn)()
    assert qkv_linear.start is planning.start and qkv_gemm.start is planning.start
    assert {"forward, no_grad (whole)", "forward, with gradients (whole)",
            "forward+backward (autograd.backward, whole)"} <= set(steps)


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "packed"])
def test_the_backward_plans_its_dy_rotation_once(packed, monkeypatch):
    """The backward's dY rotation (eager.rotate_into) is planned at the first backward of a
    signature and taken from eager.SIGNATURES at the next, with the bits of ops.rotate_into,
    which plans every call."""
    x, w = inputs(grad=True)
    over = {}
    if packed:
        x = x.detach().reshape(B * S, K).requires_grad_(True)
        over = dict(cu_seqlens=torch.tensor([0, 3, B * S], dtype=torch.int32))
    eager.SIGNATURES.clear()
    rotations = []
    real = eager.PlannedRotation.__init__

    def planning_rotation(self, **kw):
        rotations.append(kw["backward"])
        real(self, **kw)
    monkeypatch.setattr(eager.PlannedRotation, "__init__", planning_rotation)
    g = torch.Generator().manual_seed(1)
    grads = None
    results = []
    for _ in range(2):
        out = call(x, w, **over)
        grads = grads or [torch.randn(t.shape, generator=g) for t in out]
        results.append(torch.autograd.grad(out, (x, w), grads))
    assert rotations == [True]          # the first backward planned it, the second did not
    for a, b in zip(*results):
        assert torch.equal(a, b)
    # the same bits as ops.rotate_into's own plan
    tok = qkv_linear._token_major(grads, "bshd")
    angles = ropelib.rope_angles(D)
    args = (x.detach(), angles.turns, angles.amplitude, None, over.get("cu_seqlens"), False)
    with torch.no_grad():
        kept = qkv_linear._written_dy(*tok, *args)
        monkeypatch.setattr(eager, "active", lambda: False)    # (as under a tracer)
        fresh = qkv_linear._written_dy(*tok, *args)
    assert torch.equal(kept, fresh)


def test_the_normed_backward_plans_its_dy_route_once(monkeypatch):
    """With QK-norm the backward's dY (qk_norm.undo_norm_rope into dY's columns) keeps its
    kernel.Route in eager.SIGNATURES: planned at the first backward of a signature, not at the
    next, with the bits of a Route made for the call (as under a tracer)."""
    from ropelib import qk_norm
    from ropelib.kernels import qk_norm_rope as kernel_qk_norm
    x, w = inputs(grad=True)
    g = torch.Generator().manual_seed(2)
    wq, wk = (torch.rand(D, generator=g).add(0.5).requires_grad_(True) for _ in range(2))
    eager.SIGNATURES.clear()
    routes = []
    real = kernel_qk_norm.Route.__init__

    def planning_route(self, *a, **kw):
        routes.append(kw.get("starter"))
        real(self, *a, **kw)
    monkeypatch.setattr(kernel_qk_norm.Route, "__init__", planning_route)
    grads, results = None, []
    for _ in range(2):
        out = call(x, w, q_norm_weight=wq, k_norm_weight=wk)
        grads = grads or [torch.randn(t.shape, generator=g) for t in out]
        results.append(torch.autograd.grad(out, (x, w, wq, wk), grads))
    assert len(routes) == 1             # the first backward planned it, the second did not
    for a, b in zip(*results):
        assert torch.equal(a, b)
    monkeypatch.setattr(qk_norm.eager, "active", lambda: False)     # a Route made per call
    out = call(x, w, q_norm_weight=wq, k_norm_weight=wk)
    for a, b in zip(results[0], torch.autograd.grad(out, (x, w, wq, wk), grads)):
        assert torch.equal(a, b)


def test_the_normed_dy_step_decides_where_it_stores_once(monkeypatch):
    """With QK-norm the dY step (qk_norm.undo_norm_rope into dY's columns) keeps, beside its
    Route, what follows from strides (kernel.BackwardInto): whether the kernel stores into dY's
    columns is decided at the first backward of a signature and not at the next; gradients with
    other strides (out_layout="bhsd") or another eps decide anew; the same bits either way."""
    from ropelib.kernels import qk_norm_rope as kernel_qk_norm
    x, w = inputs(grad=True)
    g = torch.Generator().manual_seed(3)
    wq, wk = (torch.rand(D, generator=g).add(0.5).requires_grad_(True) for _ in range(2))
    eager.SIGNATURES.clear()
    asked = []
    real = kernel_qk_norm.Route._stores_into

    def stores_into(self, *into):
        asked.append(into[0].stride())
        return real(self, *into)
    monkeypatch.setattr(kernel_qk_norm.Route, "_stores_into", stores_into)
    results = {}
    for over in (dict(), dict(), dict(out_layout="bhsd"), dict(out_layout="bhsd"),
                 dict(eps=1e-5)):
        out = call(x, w, q_norm_weight=wq, k_norm_weight=wk, **over)
        grads = [torch.randn(t.shape, generator=torch.Generator().manual_seed(4))
                 for t in out]
        got = torch.autograd.grad(out, (x, w, wq, wk), grads)
        key = tuple(sorted(over.items()))
        if key in results:
            for a, b in zip(results[key], got):
                assert torch.equal(a, b)
        results[key] = got
    assert len(asked) == 3      # once for each signature: bshd, bhsd, another eps
    # the bits of a Route's own backward (as under a tracer), for each signature
    monkeypatch.setattr(eager, "active", lambda: False)
    from ropelib import qk_norm
    monkeypatch.setattr(qk_norm.eager, "active", lambda: False)
    for key, want in results.items():
        out = call(x, w, q_norm_weight=wq, k_norm_weight=wk, **dict(key))
        grads = [torch.randn(t.shape, generator=torch.Generator().manual_seed(4))
                 for t in out]
        for a, b in zip(want, torch.autograd.grad(out, (x, w, wq, wk), grads)):
            assert torch.equal(a, b), key


def test_undo_norm_rope_into_tensors_it_cannot_store_into_copies_each_call():
    """`into` that are not column slices of one buffer: BackwardInto keeps that the kernel
    cannot store into them, and every call goes through fresh tensors, copied (the bits of
    Route.backward's own)."""
    from ropelib import qk_norm
    from ropelib.kernels import qk_norm_rope as kernel_qk_norm
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(B, S, HQ, D, generator=g), torch.randn(B, S, HK, D, generator=g)
    gq, gk = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)
    wq, wk = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    angles = ropelib.rope_angles(D)
    args = (gq, gk, q, k, wq, wk, angles.turns, angles.amplitude, None, None, "bshd", False,
            1e-6, 0.0)
    eager.SIGNATURES.clear()
    got = []
    for _ in range(2):
        into = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
        got.append(qk_norm.undo_norm_rope(*args, into=into))
        assert got[-1][0] is into[0] and got[-1][1] is into[1]
    kept = [v for v in eager.SIGNATURES.entries.values()
            if isinstance(v, kernel_qk_norm.BackwardInto)]
    assert len(kept) == 1 and not kept[0].stores
    want = qk_norm.undo_norm_rope(*args)        # fresh tensors, no kept plan
    for run in got:
        for a, b in zip(run, want):
            assert torch.equal(a, b)


def test_the_forward_looks_its_whole_plan_up_once(monkeypatch):
    """The forward's ForwardPlan (eager.SIGNATURES, "qkv_forward"): made at the first call of a
    key and taken at the next, no_grad or not; another layout, eps, interleaving, norm or
    table strides plans anew; the same bits as a forward planned afresh."""
    x, w = inputs()
    eager.SIGNATURES.clear()
    made = []
    real = qkv_plan.ForwardPlan.__init__

    def planning(self, *a):
        made.append(a[13:15])       # (interleaved, out_layout)
        real(self, *a)
    monkeypatch.setattr(qkv_plan.ForwardPlan, "__init__", planning)
    first = call(x, w)
    with torch.no_grad():
        again = call(x, w)
    assert len(made) == 1
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    wq = torch.rand(D, generator=torch.Generator().manual_seed(6)) + 0.5
    for over in (dict(out_layout="bhsd"), dict(eps=1e-5), dict(interleaved=True),
                 dict(q_norm_weight=wq, k_norm_weight=wq)):
        n = len(made)
        call(x, w, **over)
        call(x, w, **over)
        assert len(made) == n + 1, over
    # a table with other strides (a column slice of a wider one), through the operator's
    # implementation: planned anew, the bits of its contiguous copy
    wide = ropelib.rope_freqs(S, 2 * D).view(S, 2 * D)[:, :D // 2]
    narrow = wide.contiguous()
    args = lambda t: (x, w, None, t, None, None, None, None, None, HQ, HK, D, 1e-6, False,
                      "bshd", False, "dy")
    with torch.no_grad():
        n = len(made)
        got = qkv_linear._forward(*args(wide))
        assert len(made) == n + 1
        want = qkv_linear._forward(*args(narrow))
        assert len(made) == n + 2
        qkv_linear._forward(*args(wide))
        assert len(made) == n + 2
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    # kept or made afresh, the same bits
    kept = call(x, w, out_layout="bhsd")
    eager.SIGNATURES.clear()
    for a, b in zip(kept, call(x, w, out_layout="bhsd")):
        assert torch.equal(a, b)



@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk-norm"])
def test_the_backward_takes_its_dy_step_from_the_forwards_plan(norm, monkeypatch):
    """The eager forward keeps its ForwardPlan on the autograd context and the backward keeps
    its dY step there (qkv_plan.DyStep, by the gradients' strides): planned at the first
    backward, taken at the next with no signature built; gradients with other strides, another
    layout or eps plan anew; after eager.SIGNATURES.clear() a context's older plan is not used;
    the bits of the operator route's backward (which plans through its signature)."""
    x, w = inputs(grad=True)
    g = torch.Generator().manual_seed(7)
    wq, wk = (torch.rand(D, generator=g).add(0.5).requires_grad_(True) for _ in range(2))
    over = dict(q_norm_weight=wq, k_norm_weight=wk) if norm else {}
    leaves = (x, w, wq, wk) if norm else (x, w)
    eager.SIGNATURES.clear()
    steps, signatures = [], []
    real_step, real_signature = qkv_plan.DyStep.__init__, eager.signature

    def planning(self, *a):
        steps.append(a[1][0].stride())
        real_step(self, *a)

    def signature(head, tensors):
        signatures.append(head[0])
        return real_signature(head, tensors)
    monkeypatch.setattr(qkv_plan.DyStep, "__init__", planning)
    monkeypatch.setattr(eager, "signature", signature)     # (qk_norm's too: eager.signature)

    def grads_of(out, strided=False):
        gen = torch.Generator().manual_seed(8)
        gs = [torch.randn(t.shape, generator=gen) for t in out]
        if strided:     # the same values, each head's row twice as far from the next
            gs = [torch.stack((t, torch.full_like(t, float("nan"))), -2).select(-2, 0)
                  for t in gs]
        return gs

    def backward(out, strided=False):
        return torch.autograd.grad(out, leaves, grads_of(out, strided))
    first = backward(call(x, w, **over))
    signatures.clear()
    again = backward(call(x, w, **over))
    assert len(steps) == 1 and signatures == []     # taken from the forward's plan
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    strided = backward(call(x, w, **over), strided=True)
    assert len(steps) == 2 and steps[1] != steps[0]
    for a, b in zip(first, strided):
        assert torch.equal(a, b)
    backward(call(x, w, out_layout="bhsd", **over))
    backward(call(x, w, eps=1e-5, **over))
    assert len(steps) == 4
    backward(call(x, w, eps=1e-5, **over))
    assert len(steps) == 4
    # a forward before the plans are cleared, its backward after: planned through
    # eager.SIGNATURES, not from the context's older plan
    out = call(x, w, **over)
    eager.SIGNATURES.clear()
    signatures.clear()
    cleared = backward(out)
    assert len(steps) == 4 and signatures == ["undo_norm_rope" if norm else "rotate_into"]
    for a, b in zip(first, cleared):
        assert torch.equal(a, b)
    # the operator route's backward (a tracer's: qkv_rotated_dy through the dispatcher)
    monkeypatch.setattr(qkv_linear.eager, "active", lambda: False)
    for a, b in zip(first, backward(call(x, w, **over))):
        assert torch.equal(a, b)


def test_the_eager_forward_keeps_norm_statistics_only_where_the_backward_reads_them():
    """With gradients the eager forward keeps no rstd and norm_input without QK-norm (None,
    where the operator returns empty tensors) and both with it; either backward gives the
    operator route's bits."""
    x, w = inputs(grad=True)
    g = torch.Generator().manual_seed(9)
    wq, wk = (torch.rand(D, generator=g).add(0.5).requires_grad_(True) for _ in range(2))
    for over in (dict(), dict(q_norm_weight=wq, k_norm_weight=wk)):
        leaves = (x, w) + ((wq, wk) if over else ())
        for backward in ("dy", "prologue"):
            out = call(x, w, backward=backward, **over)
            saved = out[0].grad_fn.saved_tensors
            rstd, norm_input = saved[-2:]
            if over:
                assert rstd.shape == (B * S, HQ + HK) and norm_input.shape == (
                    B * S, (HQ + HK) * D)
            else:
                assert rstd is None and norm_input is None
            grads = [torch.randn(t.shape, generator=torch.Generator().manual_seed(10))
                     for t in out]
            got = torch.autograd.grad(out, leaves, grads)
            real = qkv_linear.eager.active
            qkv_linear.eager.active = lambda: False
            try:
                op = call(x, w, backward=backward, **over)
            finally:
                qkv_linear.eager.active = real
            for a, b in zip(got, torch.autograd.grad(op, leaves, grads)):
                assert torch.equal(a, b), (over.keys(), backward)


def test_the_forward_keeps_its_cos_sin_rows_where_positions_are_the_token_index(monkeypatch):
    """Positions the token index: the pre-pass's rows (and pairs flag) follow from the plan and
    the table alone, and eager.TABLE_ROWS keeps them: a second forward of the same plan and
    table, no_grad or not, launches no pre-pass, with the same bits as rows written afresh; a
    table written in place, another plan, position ids or a table made under inference_mode
    write them again."""
    x, w = inputs(grad=True)
    freqs = ropelib.rope_freqs(S + 3, D).view(S + 3, D).clone()
    freqs[2, 1] += 0.5          # one pair's members differ: the pre-pass sets the flag
    pre_passes = []
    real = qkv_linear.start

    def start(direct, launch, pointers):
        if direct is kernel_launch.COS_SIN_ROWS:
            pre_passes.append(launch)
        real(direct, launch, pointers)
    monkeypatch.setattr(qkv_linear, "start", start)
    eager.SIGNATURES.clear()
    eager.TABLE_ROWS.clear()
    g = [torch.randn(B, S, h, D, generator=torch.Generator().manual_seed(11))
         for h in (HQ, HK, HK)]
    angles = ropelib.rope_angles(D)                     # (one Angles: one table tensor)
    for table in ("angles", "freqs"):
        opts = dict(freqs=freqs, angles=None) if table == "freqs" else dict(angles=angles)
        n = len(pre_passes)
        out = call(x, w, **opts)
        with torch.no_grad():
            again = call(x, w, **opts)
        assert len(pre_passes) == n + 1, table          # the second took the kept rows
        eager.TABLE_ROWS.clear()
        fresh = call(x, w, **opts)
        assert len(pre_passes) == n + 2
        for a, b, c in zip(out, again, fresh):
            assert torch.equal(a, b) and torch.equal(a, c), table
        torch.autograd.grad(out, (x, w), g)             # (a backward after kept rows)
    call(x, w, angles=angles, out_layout="bhsd")        # another plan
    assert len(pre_passes) == 5
    ids = torch.arange(S).expand(B, S).contiguous()
    call(x, w, angles=angles, position_ids=ids)
    call(x, w, angles=angles, position_ids=ids)         # rows by position ids: every call
    assert len(pre_passes) == 7
    kept = call(x, w, freqs=freqs, angles=None)
    assert len(pre_passes) == 7
    with torch.no_grad():
        freqs[3, 0] += 0.25                             # written in place: written again
    moved = call(x, w, freqs=freqs, angles=None)
    assert len(pre_passes) == 8 and not torch.equal(moved[0], kept[0])
    eager.TABLE_ROWS.clear()
    for a, b in zip(moved, call(x, w, freqs=freqs, angles=None)):
        assert torch.equal(a, b)
    with torch.inference_mode():
        made = freqs.clone()
    xd, wd = x.detach(), w.detach()
    n = len(pre_passes)
    for _ in range(2):
        call(xd, wd, freqs=made, angles=None)
    assert len(pre_passes) == n + 2                     # never kept from an inference tensor


def test_a_call_is_checked_once_per_signature(monkeypatch):
    """A plain eager call keeps its checks' outcome and its ForwardPlan in
    eager.SIGNATURES (qkv_plan.PlannedCall): checked in full at the first call of a
    signature, not at the next (no_grad or with gradients); other strides, dtype, options, an
    option's type, grad mode or a clear() check anew; position values are still checked every
    call; the bits of the fully checked call, forward and backward, with QK-norm's weight
    offset added every call."""
    x, w = inputs(grad=True)
    angles = ropelib.rope_angles(D)
    g = torch.Generator().manual_seed(12)
    wq, wk = (torch.rand(D, generator=g).add(0.5).requires_grad_(True) for _ in range(2))
    checked = []
    real = qkv_linear.check_projection

    def check_projection(*a):
        checked.append(a[0].shape)
        real(*a)
    monkeypatch.setattr(qkv_linear, "check_projection", check_projection)
    eager.SIGNATURES.clear()
    grads = [torch.randn(B, S, h, D, generator=g) for h in (HQ, HK, HK)]
    norm = dict(q_norm_weight=wq, k_norm_weight=wk, weight_offset=1.0)
    leaves = (x, w, wq, wk)
    runs = []
    for _ in range(2):
        out = call(x, w, angles=angles, **norm)
        runs.append(list(out) + list(torch.autograd.grad(out, leaves, grads)))
        with torch.no_grad():
            runs[-1] += list(call(x, w, angles=angles, **norm))
    assert len(checked) == 2                    # with gradients and without: one each
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    n = len(checked)
    for over in (dict(eps=1e-5), dict(interleaved=True), dict(out_layout="bhsd"),
                 dict(weight_offset=0.0), dict(eps=1.0), dict(eps=1)):     # (1 == 1.0: types)
        call(x, w, angles=angles, **dict(norm, **over))
        call(x, w, angles=angles, **dict(norm, **over))
        assert len(checked) == n + 1, over
        n += 1
    wide = torch.randn(B, S, 2 * K, generator=g)[..., ::2]          # other strides
    for a, b in zip(call(wide, w, angles=angles), call(wide.contiguous(), w, angles=angles)):
        assert torch.equal(a, b)
    assert len(checked) == n + 2
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        call(x, w.to(torch.bfloat16), angles=angles)
    eager.SIGNATURES.clear()
    out = call(x, w, angles=angles, **norm)
    assert len(checked) == n + 4
    for a, b in zip(runs[0], list(out) + list(torch.autograd.grad(out, leaves, grads))):
        assert torch.equal(a, b)
    # position values: checked every call, after a call of the same signature was planned
    ids = torch.arange(S).expand(B, S).contiguous()
    call(x, w, angles=angles, position_ids=ids)
    bad = ids.clone()
    bad[1, 2] = -1
    with pytest.raises(ValueError, match="position_ids must lie in"):
        call(x, w, angles=angles, position_ids=bad)
    xp = x.detach().reshape(B * S, K)
    cu = torch.tensor([0, 4, B * S], dtype=torch.int32)
    call(xp, w, angles=angles, cu_seqlens=cu)
    with pytest.raises(ValueError):
        call(xp, w, angles=angles, cu_seqlens=torch.tensor([0, 6, 4], dtype=torch.int32))
    # a freqs table, [P, R] and TE's [P, 1, 1, R]: checked once each, the bits of a call
    # checked in full; its positions checked against its P rows every call
    for freqs in (ropelib.rope_freqs(S + 2, D).view(S + 2, D), ropelib.rope_freqs(S + 2, D)):
        n = len(checked)
        eager.SIGNATURES.clear()
        want = call(x, w, freqs=freqs, angles=None)
        eager.SIGNATURES.clear()
        call(x, w, freqs=freqs, angles=None)
        got = call(x, w, freqs=freqs, angles=None)
        assert len(checked) == n + 2
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        call(x, w, freqs=freqs, angles=None, position_ids=ids)
        past = ids.clone()
        past[0, 1] = S + 2
        with pytest.raises(ValueError, match="position_ids must lie in"):
            call(x, w, freqs=freqs, angles=None, position_ids=past)
