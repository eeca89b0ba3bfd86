"""Parity of the finished kernel (ropelib.apply_rope) with the fp64 reference, forward and backward.

The Transformer Engine test matrix at CPU-sized shapes (S=8, B=2, H=2, D=16 unless stated):

    dtype {fp32, fp16, bf16} x rotary_percent {0.5, 1} x margin {0, 10} x transpose
    {none, (0,1), (2,3)} x format {sbhd, bshd} x loss {overlapping (stride-0 expanded grad
    from y.sum()), non-overlapping ((y * g).sum())} x cp {1, 2 rank 0, 2 rank 1} x interleaved
    x start_positions {None, random}

The full product is 1728 cases. We run
  * the FULL product of the axes that change the kernel's code path or indexing the most:
    dtype x rotary_percent x format x interleaved x cp (all ranks) x start_positions x loss
    (288 cases), with (margin, transpose) taken from a cycle over their 6 combinations, and
  * an all-PAIRS covering set over all nine axes (greedy, deterministic), so every pair of
    values of any two axes (e.g. transpose (2,3) with bf16, margin 10 with cp rank 1) runs.

Forward is compared with `rope_reference` (fp64 math, one rounding) and backward with autograd
of that reference in fp64, both within a tolerance of about one ulp of the output dtype (the
kernel computes in fp32 with one rounding). Then: thd with uneven cu_seqlens, position_ids,
cos/sin tables, non-power-of-two head dims, fp64 inputs.
"""
import itertools

import pytest
import torch

import ropelib
from ropelib.reference import rope_reference

# dtype -> (atol, rtol): about one ulp of the output dtype (one rounding of an fp32 result).
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 2**-10),
    torch.bfloat16: (1e-2, 2**-7),
    torch.float64: (1e-12, 1e-12),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
S, B, H, D = 8, 2, 2, 16

AXES = {
    "dtype": ["fp32", "fp16", "bf16"],
    "rotary_percent": [0.5, 1.0],
    "margin": [0, 10],
    "transpose": [None, (0, 1), (2, 3)],
    "layout": ["sbhd", "bshd"],
    "loss": ["expand", "random"],
    "cp": [(1, 0), (2, 0), (2, 1)],
    "interleaved": [False, True],
    "start": [False, True],
}
NAMES = list(AXES)


def _pairwise():
    """A greedy all-pairs covering set over AXES (deterministic)."""
    uncovered = set()
    for (i, a), (j, b) in itertools.combinations(enumerate(NAMES), 2):
        for va in range(len(AXES[a])):
            for vb in range(len(AXES[b])):
                uncovered.add((i, va, j, vb))
    full = list(itertools.product(*(range(len(AXES[n])) for n in NAMES)))
    cases = []
    while uncovered:
        best, best_n = None, -1
        for c in full:
            n = sum((i, c[i], j, c[j]) in uncovered
                    for i, j in itertools.combinations(range(len(NAMES)), 2))
            if n > best_n:
                best, best_n = c, n
        cases.append(best)
        for i, j in itertools.combinations(range(len(NAMES)), 2):
            uncovered.discard((i, best[i], j, best[j]))
    return [tuple(AXES[n][v] for n, v in zip(NAMES, c)) for c in cases]


def _core_product():
    cyc = list(itertools.product(AXES["margin"], AXES["transpose"]))
    out = []
    for n, (dt, rp, lay, il, cp, st, loss) in enumerate(itertools.product(
            AXES["dtype"], AXES["rotary_percent"], AXES["layout"], AXES["interleaved"],
            AXES["cp"], AXES["start"], AXES["loss"])):
        mg, tr = cyc[(n * 5) % len(cyc)]   # step 5 (coprime with 6) spreads the cycle
        out.append((dt, rp, mg, tr, lay, loss, cp, il, st))
    return out


def _case_id(c):
    dt, rp, mg, tr, lay, loss, cp, il, st = c
    t = "none" if tr is None else f"t{tr[0]}{tr[1]}"
    return f"{dt}-rp{rp}-m{mg}-{t}-{lay}-{loss}-cp{cp[0]}r{cp[1]}-{'il' if il else 'rh'}-{'sp' if st else 'nosp'}"


PAIRWISE = _pairwise()
CORE = _core_product()


def assert_close(got, want, dtype=None, what=""):
    atol, rtol = TOL[dtype or got.dtype]
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def noncontig(x, t):
    """A view of x's values with non-default strides (TE's transpose trick)."""
    if t is None:
        return x
    return x.transpose(*t).contiguous().transpose(*t)


def _run_case(dt, rp, margin, tr, layout, loss, cp, interleaved, start):
    dtype = DTYPES[dt]
    cp_size, cp_rank = cp
    R = int(D * rp)
    shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
    base = torch.randn(shape, dtype=torch.float32).to(dtype)
    max_start = 4
    P = S * cp_size + margin + (max_start if start else 0)
    freqs = ropelib.rope_freqs(P, D, rotary_percent=rp, interleaved=interleaved)
    assert freqs.shape == (P, 1, 1, R)
    sp = torch.randint(0, max_start + 1, (B,), dtype=torch.int32) if start else None
    opts = dict(layout=layout, interleaved=interleaved, start_positions=sp,
                cp_size=cp_size, cp_rank=cp_rank)

    x = noncontig(base.clone(), tr).requires_grad_(True)
    if tr is not None:
        assert not x.is_contiguous()
    x_before = x.detach().clone()
    y = ropelib.apply_rope(x, freqs, **opts)
    xr = base.double().requires_grad_(True)
    y_ref = rope_reference(xr, freqs, **opts)
    assert_close(y, rope_reference(base, freqs, **opts), what="forward")
    assert torch.equal(x.detach(), x_before), "input mutated"

    if loss == "expand":
        y.sum().backward()            # grad_output: ones expanded (stride 0)
        y_ref.sum().backward()
    else:
        g = torch.randn(shape, dtype=torch.float32).to(dtype)
        (y * g).sum().backward()
        (y_ref * g.double()).sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    assert_close(x.grad, xr.grad.to(dtype), what="backward")
    # the passthrough features get the gradient unchanged
    if R < D:
        want_tail = torch.ones_like(x.grad[..., R:]) if loss == "expand" else g[..., R:]
        assert torch.equal(x.grad[..., R:], want_tail)


@pytest.mark.parametrize("case", CORE, ids=[_case_id(c) for c in CORE])
def test_te_matrix_core_product(case, seeded):
    _run_case(*case)


@pytest.mark.parametrize("case", PAIRWISE, ids=[_case_id(c) for c in PAIRWISE])
def test_te_matrix_all_pairs(case, seeded):
    _run_case(*case)


def test_pairwise_set_covers_all_pairs():
    seen = set()
    for c in PAIRWISE:
        for i, j in itertools.combinations(range(len(NAMES)), 2):
            seen.add((i, repr(c[i]), j, repr(c[j])))
    want = sum(len(AXES[a]) * len(AXES[b]) for a, b in itertools.combinations(NAMES, 2))
    assert len(seen) == want


# --- thd ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["fp32", "bf16"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("cp", [(1, 0), (2, 0), (2, 1)])
def test_thd_uneven(dt, interleaved, start, cp, seeded):
    dtype = DTYPES[dt]
    cp_size, cp_rank = cp
    # global lengths, multiples of 2*cp_size (=4 covers cp 1 and 2): 4, 8, 12
    cu = torch.tensor([0, 4, 12, 24], dtype=torch.int32) if cp_size > 1 else \
        torch.tensor([0, 3, 8, 16], dtype=torch.int32)
    T = int(cu[-1]) // cp_size
    sp = torch.tensor([2, 0, 5], dtype=torch.int32) if start else None
    P = int((cu[1:] - cu[:-1]).max()) + 8
    freqs = ropelib.rope_freqs(P, D, rotary_percent=0.5, interleaved=interleaved)
    x = torch.randn(T, H, D).to(dtype).requires_grad_(True)
    opts = dict(layout="thd", interleaved=interleaved, start_positions=sp, cu_seqlens=cu,
                cp_size=cp_size, cp_rank=cp_rank)
    y = ropelib.apply_rope(x, freqs, **opts)
    assert_close(y, rope_reference(x.detach(), freqs, **opts), what="thd forward")
    xr = x.detach().double().requires_grad_(True)
    g = torch.randn(T, H, D).to(dtype)
    (y * g).sum().backward()
    (rope_reference(xr, freqs, **opts) * g.double()).sum().backward()
    assert_close(x.grad, xr.grad.to(dtype), what="thd backward")


def test_thd_positions_match_reference_positions():
    """Spot-check the semantics: sequence i, local token t sits at start[i] + cp_map(t)."""
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    pos = ropelib.reference.positions("thd", 0, start_positions=torch.tensor([3, 1]),
                                      cp_size=2, cp_rank=1, cu_seqlens=cu)
    # seq 0: global 4 tokens, local 2: chunks of 1 -> rank 1 holds global 1 and 2
    # seq 1: global 8, local 4, chunk 2: rank 1 holds 2,3 and 4,5
    assert pos.tolist() == [3 + 1, 3 + 2, 1 + 2, 1 + 3, 1 + 4, 1 + 5]


# --- position_ids ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout,kind", [("sbhd", "S"), ("bshd", "S"), ("sbhd", "BS"),
                                         ("bshd", "BS"), ("thd", "T")])
@pytest.mark.parametrize("interleaved", [False, True])
def test_position_ids(layout, kind, interleaved, seeded):
    P = 20
    freqs = ropelib.rope_freqs(P, D, interleaved=interleaved)
    if layout == "thd":
        x = torch.randn(S, H, D)
        pid = torch.randint(0, P, (S,))
    else:
        x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D))
        pid = torch.randint(0, P, (S,) if kind == "S" else (B, S))
    x = x.to(torch.bfloat16).requires_grad_(True)
    opts = dict(layout=layout, interleaved=interleaved, position_ids=pid)
    y = ropelib.apply_rope(x, freqs, **opts)
    assert_close(y, rope_reference(x.detach(), freqs, **opts), what="position_ids forward")
    xr = x.detach().double().requires_grad_(True)
    g = torch.randn(x.shape).to(x.dtype)
    (y * g).sum().backward()
    (rope_reference(xr, freqs, **opts) * g.double()).sum().backward()
    assert_close(x.grad, xr.grad.to(x.dtype), what="position_ids backward")


def test_position_ids_equal_implicit_positions(seeded):
    freqs = ropelib.rope_freqs(S + 4, D)
    x = torch.randn(S, B, H, D)
    sp = torch.tensor([1, 4])
    a = ropelib.apply_rope(x, freqs, start_positions=sp)
    pid = ropelib.reference.positions("sbhd", S, B, start_positions=sp)
    b = ropelib.apply_rope(x, freqs, position_ids=pid)
    assert torch.equal(a, b)


# --- cos/sin tables -------------------------------------------------------------------------

@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_cos_sin_tables(table_dtype, x_dtype, interleaved, layout, seeded):
    P = S + 6
    cos, sin = ropelib.rope_cos_sin(P, D, rotary_percent=0.5, interleaved=interleaved,
                                    dtype=table_dtype)
    freqs = ropelib.rope_freqs(P, D, rotary_percent=0.5, interleaved=interleaved)
    shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
    x = torch.randn(shape).to(x_dtype).requires_grad_(True)
    sp = torch.tensor([0, 6])
    opts = dict(layout=layout, interleaved=interleaved, start_positions=sp)
    y = ropelib.apply_rope(x, cos=cos, sin=sin, **opts)
    # reference with the same (possibly bf16-rounded) table values
    assert_close(y, rope_reference(x.detach(), cos=cos, sin=sin, **opts), what="table forward")
    if table_dtype == torch.float32:   # an fp32 table equals the angles to fp32 accuracy
        yf = ropelib.apply_rope(x.detach(), freqs, **opts)
        atol, rtol = TOL[x_dtype]
        torch.testing.assert_close(y.detach(), yf, atol=2 * atol, rtol=2 * rtol)
    xr = x.detach().double().requires_grad_(True)
    g = torch.randn(shape).to(x_dtype)
    (y * g).sum().backward()
    (rope_reference(xr, cos=cos, sin=sin, **opts) * g.double()).sum().backward()
    assert_close(x.grad, xr.grad.to(x_dtype), what="table backward")


# --- head dims that are not powers of two ---------------------------------------------------

@pytest.mark.parametrize("Dh,R", [(24, 12), (20, 20), (12, 8), (40, 24), (6, 2)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_non_power_of_two_head_dims(Dh, R, interleaved, dt, seeded):
    dtype = DTYPES[dt]
    P = S + 3
    freqs = ropelib.rope_freqs(P, Dh, rotary_percent=R / Dh, interleaved=interleaved)
    assert freqs.shape[-1] == R
    x = noncontig(torch.randn(S, B, 3, Dh).to(dtype), (2, 3)).requires_grad_(True)
    sp = torch.tensor([3, 1])
    opts = dict(interleaved=interleaved, start_positions=sp)
    y = ropelib.apply_rope(x, freqs, **opts)
    assert_close(y, rope_reference(x.detach(), freqs, **opts), what="forward")
    xr = x.detach().double().requires_grad_(True)
    g = torch.randn(x.shape).to(dtype)
    (y * g).sum().backward()
    (rope_reference(xr, freqs, **opts) * g.double()).sum().backward()
    assert_close(x.grad, xr.grad.to(dtype), what="backward")


# --- fp64 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fp64_computed_in_fp64(layout, interleaved, seeded):
    P = 2 * S + 8
    freqs = ropelib.rope_freqs(P, D, rotary_percent=0.5, interleaved=interleaved).double() * 1.37
    opts = dict(layout=layout, interleaved=interleaved, cp_size=2, cp_rank=1)
    if layout == "thd":
        x = torch.randn(S, H, D, dtype=torch.float64)
        opts["cu_seqlens"] = torch.tensor([0, 4, 16], dtype=torch.int32)
    else:
        x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D), dtype=torch.float64)
    x.requires_grad_(True)
    y = ropelib.apply_rope(x, freqs, **opts)
    want = rope_reference(x.detach(), freqs, **opts)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, want, atol=1e-12, rtol=1e-12)
    g = torch.randn_like(want)
    (y * g).sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    (rope_reference(xr, freqs, **opts) * g).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-12, rtol=1e-12)


def test_fp64_is_more_accurate_than_fp32(seeded):
    """The fp64 path must not go through fp32: compare against an fp32 computation."""
    freqs = (ropelib.rope_freqs(S, D).double() * 3.1)
    x = torch.randn(S, B, H, D, dtype=torch.float64)
    y = ropelib.apply_rope(x, freqs)
    exact = rope_reference(x, freqs)
    f32 = rope_reference(x, freqs, compute_dtype=torch.float32)
    assert (y - exact).abs().max() < 1e-13
    assert (f32 - exact).abs().max() > 1e-9


# --- several programs per launch (tile edges) -----------------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
def test_many_tiles_masked_edges(interleaved, seeded):
    """S and H larger than one tile and not multiples of it: every grid edge is masked."""
    s, b, hq, hk, dh = 37, 3, 19, 17, 8
    freqs = ropelib.rope_freqs(s + 9, dh, rotary_percent=0.5, interleaved=interleaved)
    q = torch.randn(s, b, hq, dh).to(torch.bfloat16).requires_grad_(True)
    k = torch.randn(s, b, hk, dh).to(torch.bfloat16).requires_grad_(True)
    sp = torch.tensor([9, 0, 4])
    opts = dict(interleaved=interleaved, start_positions=sp)
    qo, ko = ropelib.apply_rope_qk(q, k, freqs, **opts)
    assert_close(qo, rope_reference(q.detach(), freqs, **opts), what="q")
    assert_close(ko, rope_reference(k.detach(), freqs, **opts), what="k")
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    ((qo * gq).sum() + (ko * gk).sum()).backward()
    qr = q.detach().double().requires_grad_(True)
    kr = k.detach().double().requires_grad_(True)
    ((rope_reference(qr, freqs, **opts) * gq.double()).sum()
     + (rope_reference(kr, freqs, **opts) * gk.double()).sum()).backward()
    assert_close(q.grad, qr.grad.to(q.dtype), what="q grad")
    assert_close(k.grad, kr.grad.to(k.dtype), what="k grad")


def test_many_tiles_fused_qkv(seeded):
    s, b, g, dk, n_q = 35, 2, 5, 8, 4          # 20 query heads, 5 kv heads
    split = [n_q * dk, dk, 6]
    qkv = torch.randn(s, b, g, sum(split)).to(torch.bfloat16).requires_grad_(True)
    f = ropelib.rope_freqs(s, dk)
    q, k, v = ropelib.te.apply_fused_qkv_rotary_pos_emb(qkv, f, f, split)
    qin = qkv.detach()[..., :n_q * dk].reshape(s, b, g * n_q, dk)
    kin = qkv.detach()[..., n_q * dk:(n_q + 1) * dk]
    assert_close(q, rope_reference(qin, f), what="q")
    assert_close(k, rope_reference(kin, f), what="k")
    assert torch.equal(v, qkv.detach()[..., (n_q + 1) * dk:])
    (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    xr = qkv.detach().double().requires_grad_(True)
    qr = xr[..., :n_q * dk].reshape(s, b, g * n_q, dk)
    kr = xr[..., n_q * dk:(n_q + 1) * dk]
    (rope_reference(qr, f).sum() + 2 * rope_reference(kr, f).sum()
     + 3 * xr[..., (n_q + 1) * dk:].sum()).backward()
    assert_close(qkv.grad, xr.grad.to(qkv.dtype), what="qkv grad")
