"""ropelib.qk_norm_rope: per-head QK-RMSNorm fused with RoPE, forward and backward.

* parity with plain PyTorch in fp64 (RMSNorm, then ropelib.reference's RoPE): the outputs and all
  four gradients (q, k, w_q, w_k), bf16/fp32/fp16, GQA, both layouts, Gemma's offset, partial
  rotary, interleaved pairs, cos/sin tables, position ids, thd;
* torch.autograd.gradcheck in fp64 (the kernel computes in fp64 for fp64 inputs);
* every output element written (outputs poisoned with NaN), deterministic weight gradients;
* torch.library.opcheck of both operators, torch.compile(aot_eager, fullgraph=True) with no
  graph break and the same bits as eager;
* the nn.Module and the Hugging Face drop-in (against transformers' Qwen3 and Gemma 3 modules
  when transformers is installed); bad input raises an error that names the argument;
* benchmarks/qk_norm_bench.py --dry-run.
"""
import itertools
from unittest import mock
from pathlib import Path

import pytest
import torch
import torch._dynamo

import ropelib
from ropelib import eager, qk_norm
from ropelib.kernels import qk_norm_rope as kernel
from ropelib.reference import rope_reference
from loading import load_file  # noqa: E402
from registration import assert_registered  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPS = torch.ops.ropelib
# dtype -> (atol, rtol): about one ulp of the output dtype at values of a few units
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 2**-10), torch.bfloat16: (3e-2, 2**-7),
       torch.float64: (1e-12, 1e-12)}
# the weight gradients: a sum over every row, accumulated in fp32
W_TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 2e-3), torch.bfloat16: (5e-2, 1e-2),
         torch.float64: (1e-12, 1e-12)}


def reference(q, k, w_q, w_k, *, cos, sin, layout="bshd", interleaved=False, position_ids=None,
              eps=1e-6, weight_offset=0.0):
    """rope(rmsnorm(x) * (w + offset)) in fp64 from the same inputs: plain, differentiable
    PyTorch (cos, sin: [P, R] tables)."""
    def one(x, w):
        x = x.double()
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        u = n * (w.double() + weight_offset)
        return rope_reference(u, cos=cos.double(), sin=sin.double(), layout=layout,
                              interleaved=interleaved, position_ids=position_ids)
    return one(q, w_q), one(k, w_k)


def _shape_of(layout, S, B, D):
    """heads -> the shape of q (or k) with that many heads in `layout`."""
    return {"bshd": lambda h: (B, S, h, D), "sbhd": lambda h: (S, B, h, D),
            "thd": lambda h: (S, h, D)}[layout]


def make(layout="bshd", dtype=torch.float32, *, S=5, B=2, HQ=4, HK=2, D=16, R=None,
         w_dtype=None, P=None):
    """Fresh q, k, w_q, w_k (leaves requiring grad) and cos/sin tables [P, R] in fp32."""
    shape = _shape_of(layout, S, B, D)
    q = (2 * torch.randn(shape(HQ))).to(dtype).requires_grad_()
    k = (0.5 * torch.randn(shape(HK))).to(dtype).requires_grad_()
    w_q = (1 + 0.3 * torch.randn(D)).to(w_dtype or torch.float32).requires_grad_()
    w_k = (1 + 0.3 * torch.randn(D)).to(w_dtype or torch.float32).requires_grad_()
    rot = 1.0 if R is None else R / D
    cos, sin = ropelib.rope_cos_sin(P or 2 * S + 3, D, rotary_percent=rot)
    return q, k, w_q, w_k, cos, sin


def _close(got, want, tol):
    atol, rtol = tol
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


def check_against_reference(q, k, w_q, w_k, cos, sin, *, freqs=None, angles=None,
                            table_positions=None, **opts):
    """Outputs and the four gradients of qk_norm_rope against the fp64 reference. With angles,
    qk_norm_rope takes the positions table_positions, the reference the rows of cos and sin
    opts' position_ids name."""
    if angles is not None:
        given = dict(opts, position_ids=table_positions)
        q_out, k_out = ropelib.qk_norm_rope(q, k, w_q, w_k, angles=angles, **given)
    elif freqs is not None:
        q_out, k_out = ropelib.qk_norm_rope(q, k, w_q, w_k, freqs, **opts)
    else:
        q_out, k_out = ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, **opts)
    want_q, want_k = reference(q, k, w_q, w_k, cos=cos, sin=sin, **opts)
    assert q_out.dtype == q.dtype and q_out.shape == q.shape and k_out.shape == k.shape
    _close(q_out, want_q, TOL[q.dtype])
    _close(k_out, want_k, TOL[q.dtype])
    gq_out, gk_out = torch.randn_like(q_out), torch.randn_like(k_out)
    got = torch.autograd.grad((q_out, k_out), (q, k, w_q, w_k), (gq_out, gk_out))
    want = torch.autograd.grad((want_q, want_k), (q, k, w_q, w_k),
                               (gq_out.double(), gk_out.double()))
    for g, w, x in zip(got, want, (q, k, w_q, w_k)):
        assert g.dtype == x.dtype and g.shape == x.shape
    _close(got[0], want[0], TOL[q.dtype])
    _close(got[1], want[1], TOL[q.dtype])
    _close(got[2], want[2], W_TOL[w_q.dtype])
    _close(got[3], want[3], W_TOL[w_k.dtype])


# --- parity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3), (6, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0], ids=["qwen3", "gemma3"])
def test_matches_rmsnorm_then_rope(dtype, layout, heads, weight_offset, seeded):
    q, k, w_q, w_k, cos, sin = make(layout, dtype, HQ=heads[0], HK=heads[1])
    if weight_offset:
        with torch.no_grad():   # Gemma's weights sit around 0 (the scale is 1 + w)
            w_q -= 1
            w_k -= 1
    check_against_reference(q, k, w_q, w_k, cos, sin, layout=layout, weight_offset=weight_offset)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_weights(dtype, seeded):
    """Weights in the model's dtype (as HF keeps them): their gradients come back in it."""
    q, k, w_q, w_k, cos, sin = make("bshd", dtype, w_dtype=dtype)
    check_against_reference(q, k, w_q, w_k, cos, sin, eps=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary_angles_and_position_ids(interleaved, seeded):
    """R < D: the norm covers the whole head, the rotation the first R features. Angles computed
    in the kernel, explicit per-batch positions, head dim not a power of two."""
    S, B, D, R = 7, 3, 24, 16
    q, k, w_q, w_k, _, _ = make("bshd", torch.float32, S=S, B=B, HQ=6, HK=2, D=D)
    freqs = ropelib.rope_freqs(40, D, rotary_percent=R / D, interleaved=interleaved)
    pos = torch.randint(0, 40, (B, S))
    f = freqs[:, 0, 0].double()
    check_against_reference(q, k, w_q, w_k, f.cos(), f.sin(), freqs=freqs, position_ids=pos,
                            interleaved=interleaved, eps=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd"])
def test_angles_computed_in_the_kernel(interleaved, layout, seeded):
    """angles=ropelib.rope_angles(...): no table; every angle computed from its position, as
    apply_rope(..., angles=) computes it. Against the fp64 reference on a table of the same
    angles (exact in fp64 at these positions), with partial rotary, YaRN's amplitude and
    positions far past any table one would keep."""
    S, B, D, R = 7, 2, 24, 16
    q, k, w_q, w_k, _, _ = make(layout, torch.float32, S=S, B=B, HQ=4, HK=2, D=D)
    angles = ropelib.frequencies.Angles(ropelib.frequencies.inv_freq(R, dtype=torch.float64),
                                        1.25)
    pos = torch.randint(0, 1 << 20, (S,) if layout == "thd" else (B, S))
    rows = torch.unique(pos)
    theta = torch.outer(rows.double(), angles.inv_freq)              # [P', R/2], exact
    theta = torch.stack([theta, theta], -1).flatten(-2) if interleaved else \
        torch.cat([theta, theta], -1)
    cos, sin = 1.25 * theta.cos(), 1.25 * theta.sin()
    check_against_reference(q, k, w_q, w_k, cos, sin, angles=angles,
                            position_ids=torch.searchsorted(rows, pos), layout=layout,
                            interleaved=interleaved, table_positions=pos)
    opts = dict(angles=angles, position_ids=pos, layout=layout, interleaved=interleaved)
    first = ropelib.qk_norm_rope(q, k, w_q, w_k, **opts)        # planned on the first call,
    again = ropelib.qk_norm_rope(q, k, w_q, w_k, **opts)        # then taken from the cache
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("interleaved", [False, True])
def test_per_feature_tables(interleaved, seeded):
    """A table whose two members of a pair hold different angles (ropelib's per-feature
    convention, as Transformer Engine's): forward and backward read each member's own entry."""
    q, k, w_q, w_k, _, _ = make("bshd", torch.float32, S=5, B=2, D=16)
    angles = 3 * torch.randn(5, 16)
    check_against_reference(q, k, w_q, w_k, angles.double().cos(), angles.double().sin(),
                            freqs=angles, interleaved=interleaved)


def test_shared_position_ids_and_sbhd(seeded):
    q, k, w_q, w_k, cos, sin = make("sbhd", torch.float32, S=6, B=2, P=30)
    check_against_reference(q, k, w_q, w_k, cos, sin, layout="sbhd",
                            position_ids=torch.randint(0, 30, (6,)))


def test_thd_packed_tokens(seeded):
    """thd: positions given per token (two packed sequences of 4 and 5 tokens)."""
    q, k, w_q, w_k, cos, sin = make("thd", torch.bfloat16, S=9, HQ=4, HK=1)
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])
    check_against_reference(q, k, w_q, w_k, cos, sin, layout="thd", position_ids=pos)


@pytest.mark.parametrize("D,lengths", [(16, (4, 0, 5)), (128, tuple(i % 3 for i in range(70)))],
                         ids=["binary-search", "pivots-then-search"])
@pytest.mark.parametrize("table", ["cos/sin", "angles"])
def test_thd_cu_seqlens_equal_their_position_ids(D, lengths, table, seeded):
    """thd with cu_seqlens: each token's position, its index in its sequence, found in the
    kernel (a binary search of cu_seqlens; for short token tiles, as on a GPU, a load of 64
    evenly spaced entries first: 70 sequences take both steps) gives the bits of the same call
    with those positions as ids: outputs and all four gradients, on the operator and on the
    eager route (a checked call, then a planned one). Empty sequences included."""
    T = sum(lengths)
    q, k, w_q, w_k, cos, sin = make("thd", torch.bfloat16, S=T, HQ=2, HK=1, D=D,
                                    P=max(lengths) + 1)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    ids = torch.cat([torch.arange(n) for n in lengths])
    tables = dict(cos=cos, sin=sin) if table == "cos/sin" else dict(angles=ropelib.rope_angles(D))
    g = [torch.randn_like(q), torch.randn_like(k)]
    eager.SIGNATURES.clear()
    for route in ("operator", "eager", "eager, planned"):
        results = []
        for where in (dict(position_ids=ids), dict(cu_seqlens=cu)):
            with mock.patch.object(eager, "active", lambda: route != "operator"):
                out = ropelib.qk_norm_rope(q, k, w_q, w_k, layout="thd", **where, **tables)
            results.append(out + torch.autograd.grad(out, (q, k, w_q, w_k), g))
        for a, c in zip(*results):
            assert torch.equal(a, c), route


def test_gradcheck_fp64(seeded):
    """The backward op is the derivative of the forward op (finite differences in fp64)."""
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float64, S=3, B=1, HQ=2, HK=1, D=8, R=6,
                                    w_dtype=torch.float64)
    pos = torch.tensor([[4, 0, 2]])

    def fn(q, k, w_q, w_k):
        return ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, position_ids=pos,
                                    weight_offset=0.5)
    assert torch.autograd.gradcheck(fn, (q, k, w_q, w_k), eps=1e-6, atol=1e-7, rtol=1e-6,
                                    fast_mode=True)


def test_one_output_unused(seeded):
    """Only q_out in the loss: k and w_k get zero gradients."""
    q, k, w_q, w_k, cos, sin = make()
    q_out, _ = ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin)
    g = torch.randn_like(q_out)
    gq, gk, gwq, gwk = torch.autograd.grad(q_out, (q, k, w_q, w_k), g)
    want_q, _ = reference(q, k, w_q, w_k, cos=cos, sin=sin)
    wq, wwq = torch.autograd.grad(want_q, (q, w_q), g.double())
    _close(gq, wq, TOL[torch.float32])
    _close(gwq, wwq, W_TOL[torch.float32])
    assert torch.count_nonzero(gk) == 0 and torch.count_nonzero(gwk) == 0


def test_strided_inputs_are_read_in_place(seeded):
    """q and k as views of one fused projection (no copy), q's heads transposed in memory."""
    B, S, HQ, HK, D = 2, 5, 4, 2, 16
    proj = torch.randn(B, S, (HQ + HK) * D)
    q = proj[..., :HQ * D].view(B, S, HQ, D)
    k = proj[..., HQ * D:].view(B, S, HK, D)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)     # [B, S, H, D] with H-major memory
    _, _, w_q, w_k, cos, sin = make(D=D)
    check_against_reference(q.clone().requires_grad_(), k.clone().requires_grad_(), w_q, w_k,
                            cos, sin)
    a = ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin)
    b = ropelib.qk_norm_rope(q_t, k.contiguous(), w_q, w_k, cos=cos, sin=sin)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_outputs_keep_the_strides_of_dense_inputs(seeded):
    """Outputs (and input gradients) take q's and k's strides where both are dense, in any
    order (here bshd-shaped views of sbhd memory, and Hugging Face's [B, H, S, D] views of
    [B, S, H, D] projections through the drop-in); a slice of a fused QKV gets contiguous
    outputs. Output gradients in another order are read right. Values as the reference's, on the
    operator and on the eager route's planned calls."""
    B, S, HQ, HK, D = 2, 5, 4, 2, 16
    _, _, w_q, w_k, cos, sin = make(D=D)
    q = torch.randn(S, B, HQ, D).transpose(0, 1)             # [B, S, H, D] in sbhd memory
    k = torch.randn(S, B, HK, D).transpose(0, 1)
    eager.SIGNATURES.clear()
    for _ in range(2):      # the checked call, then the planned route
        qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()   # q's strides
        got = ropelib.qk_norm_rope(qg, kg, w_q, w_k, cos=cos, sin=sin)
        assert got[0].stride() == q.stride() and got[1].stride() == k.stride()
        want = reference(q, k, w_q, w_k, cos=cos, sin=sin)
        for a, b in zip(got, want):
            _close(a, b, TOL[torch.float32])
        gq = torch.randn(B, HQ, S, D).transpose(1, 2)        # yet another order
        gk = torch.randn(B, S, HK, D)
        grads = torch.autograd.grad(got, (qg, kg), (gq, gk))
        assert grads[0].stride() == q.stride()
        ql, kl = q.clone().requires_grad_(), k.clone().requires_grad_()
        wants = torch.autograd.grad(reference(ql, kl, w_q, w_k, cos=cos, sin=sin), (ql, kl),
                                    (gq, gk))
        for a, b in zip(grads, wants):
            _close(a, b, W_TOL[torch.float32])
    proj = torch.randn(B, S, (HQ + HK) * D)                   # a fused projection's slices
    q_f, k_f = proj[..., :HQ * D].view(B, S, HQ, D), proj[..., HQ * D:].view(B, S, HK, D)
    out = OPS.qk_norm_rope(q_f, k_f, w_q, w_k, cos, sin, None, None, "bshd", False, 1e-6, 0.0)
    assert all(o.is_contiguous() for o in out)
    h = torch.randn(B, S, (HQ + HK) * D)                      # Hugging Face's views
    q_h = h[..., :HQ * D].contiguous().view(B, S, HQ, D).transpose(1, 2)
    k_h = h[..., HQ * D:].contiguous().view(B, S, HK, D).transpose(1, 2)
    c_h, s_h = cos[None, :S], sin[None, :S]
    out = qk_norm.qk_norm_apply_rotary_pos_emb(q_h, k_h, c_h, s_h, w_q, w_k)
    assert out[0].stride() == q_h.stride() and out[1].stride() == k_h.stride()
    want = reference(q_h.transpose(1, 2), k_h.transpose(1, 2), w_q, w_k, cos=cos, sin=sin)
    for a, b in zip(out, want):
        _close(a.transpose(1, 2), b, TOL[torch.float32])


def test_inputs_the_kernels_read_at_stride_one_are_copied_where_they_are_not(seeded):
    """q, k, weights and a table with features at stride 2 (also on the eager route's later
    calls, which skip the checks), expanded output gradients (the kernels read those contiguous),
    and, through the operator, a batch of tables with per-entry position ids."""
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float32)

    def stride2(t):
        return torch.stack([t.detach(), torch.full_like(t.detach(), float("nan"))],
                           -1).flatten(-2)[..., ::2].requires_grad_(t.requires_grad)
    q2, k2, w_q2, w_k2, cos2, sin2 = (stride2(t) for t in (q, k, w_q, w_k, cos, sin))
    assert q2.stride(-1) == 2 and cos2.stride(-1) == 2
    eager.SIGNATURES.clear()
    for _ in range(2):      # the checked call, then the planned route
        check_against_reference(q2, k2, w_q2, w_k2, cos2, sin2)
        got = ropelib.qk_norm_rope(q2, k2, w_q2, w_k2, cos=cos2, sin=sin2)
        want = reference(q2, k2, w_q2, w_k2, cos=cos, sin=sin)
        leaves = (q2, k2, w_q2, w_k2)
        g = torch.autograd.grad(got[0].sum() + got[1].sum(), leaves)      # expanded gradients
        w = torch.autograd.grad(want[0].sum() + want[1].sum(), leaves)
        for a, b in zip(g, w):
            _close(a, b, W_TOL[torch.float32])
    # a batch of tables [B, P, R] read at per-entry position ids [B, S]
    B, S = q.shape[:2]
    cos3, sin3 = torch.stack([cos, cos.flip(0)]), torch.stack([sin, sin.flip(0)])
    pos = torch.randint(0, cos.shape[0], (B, S))
    args = (q.detach(), k.detach(), w_q.detach(), w_k.detach())
    got = OPS.qk_norm_rope(*args, cos3, sin3, pos, None, "bshd", False, 1e-6, 0.0)
    gq, gk = torch.randn_like(got[0]), torch.randn_like(got[1])
    grads = OPS.qk_norm_rope_backward(gq, gk, *args, cos3, sin3, pos, None, "bshd", False, 1e-6,
                                      0.0)
    leaves = [t.clone().requires_grad_() for t in args]
    wants = [reference(leaves[0][b:b + 1], leaves[1][b:b + 1], *leaves[2:], cos=cos3[b],
                       sin=sin3[b], position_ids=pos[b]) for b in range(B)]
    for i in range(2):
        _close(got[i], torch.cat([w[i] for w in wants]), TOL[torch.float32])
    loss = sum((w[0] * gq[b:b + 1]).sum() + (w[1] * gk[b:b + 1]).sum()
               for b, w in enumerate(wants))
    for a, b in zip(grads, torch.autograd.grad(loss, leaves)):
        _close(a, b, W_TOL[torch.float32])


# --- every element written, deterministic ---------------------------------------------------

@pytest.mark.parametrize("backward", [False, True])
def test_every_output_element_is_written(backward, seeded, monkeypatch):
    """Outputs poisoned with NaN before the launch: none may survive (odd sizes, head counts
    that are not powers of two, a pass-through part)."""
    S, B, HQ, HK, D, R = 5, 3, 6, 2, 20, 12
    q, k = torch.randn(S, B, HQ, D), torch.randn(S, B, HK, D)
    w_q, w_k = torch.randn(D), torch.randn(D)
    freqs = ropelib.rope_freqs(S, D, rotary_percent=R / D)[:, 0, 0]
    real = kernel.outputs
    made = []

    def poisoned(*xs):
        made.extend(t.fill_(float("nan")) for t in real(*xs))
        return made[-2:]
    monkeypatch.setattr(kernel, "outputs", poisoned)
    args = (q, k, w_q, w_k, freqs, None, None)
    route = kernel.Route(*args, layout="sbhd", interleaved=False, eps=1e-6, weight_offset=0.0)
    made.clear()        # (planning made outputs too)
    if backward:
        res = route.backward(torch.randn_like(q), torch.randn_like(k), *args)
        assert all(g.shape == (D,) and not g.isnan().any() for g in res[2:])
    else:
        res = route.forward(*args)
    assert len(made) == 2 and all(t is m for t, m in zip(res[:2], made))
    assert not any(t.isnan().any() for t in made)


def test_weight_gradients_are_deterministic(seeded):
    q, k, w_q, w_k, cos, sin = make("bshd", torch.bfloat16, S=9, B=3)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    args = (q.detach(), k.detach(), w_q.detach(), w_k.detach(), cos, sin, None, None, "bshd",
            False, 1e-6, 0.0)
    first = OPS.qk_norm_rope_backward(gq, gk, *args)
    second = OPS.qk_norm_rope_backward(gq, gk, *args)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd"])
def test_backward_programs_take_several_token_blocks(layout, seeded):
    """A backward program takes TOKEN_BLOCKS token blocks in turn and writes one partial sum for
    all of them: 37 tokens in blocks of 8 (the interpreter's tile at 8 heads of 64) make 5
    blocks, taken two at a time, the third group half past the end. Gradients as the
    reference's, with half the partial rows."""
    S, B, HQ, HK, D = 37, 2, 8, 8, 64
    q, k, w_q, w_k, cos, sin = make(layout, torch.float32, S=S, B=B, HQ=HQ, HK=HK, D=D)
    v = [t.detach() for t in (q, k)]
    view = {"bshd": lambda t: t.transpose(0, 1), "sbhd": lambda t: t,
            "thd": lambda t: t.unsqueeze(1)}[layout]
    q4, k4 = (view(t) for t in v)                                         # [S, B, H, D]
    gq4, gk4 = (torch.empty_like(t) for t in (q4, k4))
    planned = kernel.plan(q4, k4, gq4, gk4, w_q.detach(), w_k.detach(), cos, sin, None,
                          layout="sbhd", interleaved=False, eps=1e-6, weight_offset=0.0,
                          gq4=gq4, gk4=gk4)
    a = planned.args
    assert (a["BLOCK_S"], a["TOKEN_BLOCKS"]) == (8, 2) and planned.grid[0] == 3 * a["HEAD_BLOCKS"]
    assert kernel.partials(planned).shape[0] == 3
    # thd: two packed sequences, positions restarting at the second
    ids = dict(position_ids=torch.cat([torch.arange(20), torch.arange(S - 20)])) \
        if layout == "thd" else {}
    check_against_reference(q, k, w_q, w_k, cos, sin, layout=layout, **ids)


def test_token_blocks_for_a_gpu():
    """pick_token_blocks on a 132-SM GPU (pure Python): token blocks of fewer than
    QK_NORM_GROUP_BELOW_ROWS rows are grouped up to QK_NORM_ROWS_PER_PARTIAL rows a program,
    while the grid keeps 4 programs an SM; larger blocks are not grouped."""
    pick = kernel.pick_token_blocks
    rows = kernel.QK_NORM_ROWS_PER_PARTIAL
    assert kernel.QK_NORM_GROUP_BELOW_ROWS == 16
    # batch 1, 8 heads of one token a block (8 rows): 16 blocks a program at 4096 tokens, but
    # at 256 tokens two, where four would leave 64 x 5 = 320 programs, under 4 an SM
    assert pick(4096, 1, 1, 8, 1, 5, 132) == rows // 8
    assert pick(256, 1, 1, 8, 1, 5, 132) == 2
    # 16 rows a block (b2) and 64 (b8): one block a program
    assert pick(16384, 2, 1, 8, 2, 6, 132) == 1
    assert pick(4096, 8, 1, 8, 8, 5, 132) == 1
    # decode (one token): nothing to group
    assert pick(1, 64, 1, 8, 1, 5, 132) == 1


def test_position_outside_the_table_gives_nan_rows(seeded):
    """The operator (unchecked) never reads outside the table: the row comes out NaN."""
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float32, S=4, B=1, P=8)
    pos = torch.tensor([[0, 1, 9, 3]])
    q_out, k_out = OPS.qk_norm_rope(q.detach(), k.detach(), w_q.detach(), w_k.detach(), cos, sin,
                                    pos, None, "bshd", False, 1e-6, 0.0)
    assert q_out[0, 2].isnan().all() and k_out[0, 2].isnan().all()
    assert not q_out[0, [0, 1, 3]].isnan().any()
    # packed: the second sequence (10 tokens) runs past the 8 rows from its ninth token on
    qt, kt = (t.detach() for t in make("thd", torch.float32, S=12)[:2])
    cu = torch.tensor([0, 2, 12], dtype=torch.int32)
    q_out, k_out = OPS.qk_norm_rope(qt, kt, w_q.detach(), w_k.detach(), cos, sin, None, cu,
                                    "thd", False, 1e-6, 0.0)
    assert q_out[10:].isnan().all() and k_out[10:].isnan().all()
    assert not q_out[:10].isnan().any() and not k_out[:10].isnan().any()


# --- operators and torch.compile ------------------------------------------------------------

def test_opcheck_both_operators(seeded):
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float64, S=4, B=2, HQ=2, HK=1, D=8)
    pos = torch.randint(0, cos.shape[0], (2, 4))
    f = ropelib.rope_freqs(cos.shape[0], 8)[:, 0, 0]
    opts = ("bshd", False, 1e-6, 0.0)
    torch.library.opcheck(OPS.qk_norm_rope.default, (q, k, w_q, w_k, cos, sin, None, None, *opts))
    torch.library.opcheck(OPS.qk_norm_rope.default,
                          (q.transpose(0, 1), k.transpose(0, 1), w_q, w_k, f, None, pos, None,
                           "sbhd", True, 1e-5, 1.0))
    torch.library.opcheck(OPS.qk_norm_rope_backward.default,
                          (torch.randn_like(q), torch.randn_like(k), q.detach(), k.detach(),
                           w_q.detach(), w_k.detach(), cos, sin, pos, None, *opts))
    angles = ropelib.rope_angles(8)         # no table: Angles' turns and amplitude
    for op, grads in ((OPS.qk_norm_rope, ()),
                      (OPS.qk_norm_rope_backward, (torch.randn_like(q), torch.randn_like(k)))):
        torch.library.opcheck(op.default, grads + (q.detach(), k.detach(), w_q.detach(),
                                                   w_k.detach(), angles.turns, angles.amplitude,
                                                   pos, None, *opts))
    # packed sequences (thd): cu_seqlens instead of position ids
    qt, kt = q.detach().reshape(8, 2, 8), k.detach().reshape(8, 1, 8)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    for op, grads in ((OPS.qk_norm_rope, ()),
                      (OPS.qk_norm_rope_backward, (torch.randn_like(qt), torch.randn_like(kt)))):
        torch.library.opcheck(op.default, grads + (qt, kt, w_q.detach(), w_k.detach(), cos, sin,
                                                   None, cu, "thd", False, 1e-6, 0.0))


def test_registered_as_triton_ops_on_a_gpu():
    assert_registered('qk_norm_rope', 'qk_norm_rope_backward')


def _compiled_equals_eager(fn, args, n_grad):
    args_e = [a.detach().clone().requires_grad_(i < n_grad) for i, a in enumerate(args)]
    args_c = [a.detach().clone().requires_grad_(i < n_grad) for i, a in enumerate(args)]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args_e)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, \
        [str(b.reason) for b in explained.break_reasons]
    torch._dynamo.reset()
    out_e = fn(*args_e)
    out_c = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args_c)
    grads = [torch.randn_like(o) for o in out_e]
    torch.autograd.backward(out_e, grads)
    torch.autograd.backward(out_c, grads)
    for x, y in zip(out_c, out_e):
        assert torch.equal(x, y)
    for a, c in zip(args_e[:n_grad], args_c[:n_grad]):
        assert torch.equal(c.grad, a.grad)
    torch._dynamo.reset()


@pytest.mark.parametrize("table", ["freqs", "angles"])
def test_compile_fullgraph_function(table, seeded):
    q, k, w_q, w_k, _, _ = make("bshd", torch.bfloat16)
    tables = {"freqs": dict(freqs=ropelib.rope_freqs(16, 16)),
              "angles": dict(angles=ropelib.rope_angles(16))}[table]
    pos = torch.randint(0, 16, (2, 5))

    def fn(q, k, w_q, w_k, pos):
        return ropelib.qk_norm_rope(q * 2, k, w_q, w_k, position_ids=pos, eps=1e-5, **tables)
    _compiled_equals_eager(fn, (q, k, w_q, w_k, pos), 4)


def test_compile_fullgraph_packed_cu_seqlens(seeded):
    """thd with cu_seqlens: one graph, no break, the eager bits forward and backward."""
    q, k, w_q, w_k, _, _ = make("thd", torch.bfloat16, S=12)
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    freqs = ropelib.rope_freqs(16, 16)

    def fn(q, k, w_q, w_k, cu):
        return ropelib.qk_norm_rope(q * 2, k, w_q, w_k, freqs, layout="thd", cu_seqlens=cu)
    _compiled_equals_eager(fn, (q, k, w_q, w_k, cu), 4)


def test_compile_fullgraph_module_and_hf(seeded):
    m = ropelib.QKNormRoPE(16, weight_offset=1.0)
    with torch.no_grad():
        m.w_q.normal_()
    q, k, _, _, cos, sin = make("bshd", torch.float32)
    _compiled_equals_eager(lambda q, k: m(q, k, cos=cos, sin=sin), (q, k), 2)
    c, s = cos[None, :5], sin[None, :5]
    w_q, w_k = torch.randn(16), torch.randn(16)
    _compiled_equals_eager(
        lambda q, k, w_q, w_k: qk_norm.qk_norm_apply_rotary_pos_emb(q, k, c, s, w_q, w_k),
        (q.transpose(1, 2), k.transpose(1, 2), w_q, w_k), 4)


def test_changing_sequence_length_compiles_once(seeded):
    """With dynamic shapes a new sequence length reuses the graph: no new guard on the length.
    (The first compilation may restart once: under dynamic=True Dynamo first traces the float
    defaults eps and weight_offset as symbols, then specialises them.)"""
    import torch._dynamo.testing
    freqs = ropelib.rope_freqs(64, 16)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    w_q, w_k = torch.randn(16), torch.randn(16)

    def fn(q, k):
        return ropelib.qk_norm_rope(q, k, w_q, w_k, freqs, layout="bshd")
    torch._dynamo.reset()
    c = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for s in (5, 9, 17, 40):
        q = torch.randn(2, s, 4, 16, requires_grad=True)
        k = torch.randn(2, s, 2, 16)
        out = c(q, k)
        for x, y in zip(out, fn(q, k)):
            assert torch.equal(x, y)
        out[0].sum().backward()
        frames.append(counter.frame_count)
    assert frames[1:] == frames[:1] * 3, f"compilations after each length: {frames}"
    torch._dynamo.reset()


# --- module and Hugging Face drop-in --------------------------------------------------------

def test_module_starts_as_plain_rmsnorm_and_learns(seeded):
    for offset in (0.0, 1.0):
        m = ropelib.QKNormRoPE(16, eps=1e-5, weight_offset=offset)
        assert torch.equal(m.w_q + offset, torch.ones(16))
        q, k, _, _, cos, sin = make()
        q_out, k_out = m(q, k, cos=cos, sin=sin)
        want_q, _ = reference(q, k, torch.ones(16), torch.ones(16), cos=cos, sin=sin, eps=1e-5)
        _close(q_out, want_q, TOL[torch.float32])
        (q_out.square().sum() + k_out.sum()).backward()
        assert m.w_q.grad is not None and m.w_k.grad.abs().sum() > 0
    assert "weight_offset=1.0" in repr(m)


def _hf_case(dtype):
    B, S, HQ, HK, D = 2, 6, 4, 2, 16
    q = torch.randn(B, S, HQ, D).to(dtype).transpose(1, 2)   # HF's q_proj(h).view(...).transpose
    k = torch.randn(B, S, HK, D).to(dtype).transpose(1, 2)
    cos, sin = ropelib.rope_cos_sin(20, D)
    pos = torch.randint(0, 20, (B, S))
    return q, k, cos[pos].to(dtype), sin[pos].to(dtype)       # [B, S, D], as HF gathers them


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_drop_in_against_transformers(family, dtype, seeded):
    if family == "qwen3":
        mod = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
        norm_cls, offset, init = mod.Qwen3RMSNorm, 0.0, 1.0
    else:
        mod = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
        norm_cls, offset, init = mod.Gemma3RMSNorm, 1.0, 0.0
    q, k, cos, sin = _hf_case(dtype)
    D = q.shape[-1]
    q_norm, k_norm = norm_cls(D, eps=1e-6).to(dtype), norm_cls(D, eps=1e-6).to(dtype)
    with torch.no_grad():
        q_norm.weight.copy_(init + 0.3 * torch.randn(D))
        k_norm.weight.copy_(init + 0.3 * torch.randn(D))
    # HF: norm in [B, S, H, D], transpose, then apply_rotary_pos_emb
    want_q, want_k = mod.apply_rotary_pos_emb(q_norm(q.transpose(1, 2)).transpose(1, 2),
                                              k_norm(k.transpose(1, 2)).transpose(1, 2), cos, sin)
    got_q, got_k = qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos, sin, q_norm.weight,
                                                        k_norm.weight, 1e-6,
                                                        weight_offset=offset)
    # HF rounds after the norm and after each multiply and add: a few ulps in 16 bits
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (6e-2, 4 * 2**-7)
    _close(got_q, want_q, tol)
    _close(got_k, want_k, tol)
    m = ropelib.QKNormRoPE.from_norms(q_norm, k_norm, weight_offset=offset, layout="bshd")
    mq, mk = m(q.transpose(1, 2), k.transpose(1, 2), cos=cos[0], sin=sin[0])  # batch 0's table
    _close(mq[0], got_q[0].transpose(0, 1), (0, 0))
    _close(mk[0], got_k[0].transpose(0, 1), (0, 0))


def test_hf_drop_in_bshd_and_gradients(seeded):
    q, k, cos, sin = _hf_case(torch.float32)
    q, k = q.transpose(1, 2).detach().requires_grad_(), k.transpose(1, 2).detach().requires_grad_()
    w_q, w_k = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    got = qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos, sin, w_q, w_k, unsqueeze_dim=2)
    # each batch entry has its own gathered table: rows are tokens, one table per entry
    for b in range(q.shape[0]):
        want = reference(q[b:b + 1], k[b:b + 1], w_q, w_k, cos=cos[b], sin=sin[b])
        _close(got[0][b:b + 1], want[0], TOL[torch.float32])
        _close(got[1][b:b + 1], want[1], TOL[torch.float32])
    g = torch.autograd.grad(got[0].sum() + got[1].square().sum(), (q, k, w_q, w_k))
    wants = [reference(q[b:b + 1], k[b:b + 1], w_q, w_k, cos=cos[b], sin=sin[b])
             for b in range(q.shape[0])]
    loss = sum(a.sum() + c.square().sum() for a, c in wants)
    w = torch.autograd.grad(loss, (q, k, w_q, w_k))
    for a, b in zip(g, w):
        _close(a, b, W_TOL[torch.float32])


# --- bad input ------------------------------------------------------------------------------

def _bad(**over):
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float32, S=4, P=6)
    args = dict(q=q, k=k, w_q=w_q, w_k=w_k, freqs=None, cos=cos, sin=sin)
    args.update(over)
    return args


@pytest.mark.parametrize("over,error,match", [
    (dict(w_q=torch.ones(15)), ValueError, r"w_q must be \[head_dim\] = \[16\]"),
    (dict(w_k=torch.ones(2, 16)), ValueError, "w_k must be 1-D"),
    (dict(w_q=torch.ones(16, dtype=torch.int32)), TypeError, "w_q must have dtype"),
    (dict(k=torch.randn(2, 4, 3, 16)), ValueError, r"k's head count \(3\) must divide q's \(4\)"),
    (dict(k=torch.randn(2, 5, 2, 16)), ValueError, "q and k must agree"),
    (dict(k=torch.randn(2, 4, 2, 16, dtype=torch.float64)), TypeError, "same dtype"),
    (dict(q=torch.randn(2, 4, 16)), ValueError, "q must be 4-D"),
    (dict(cos=torch.ones(6, 16, dtype=torch.float64)), TypeError, "cos and sin must have the "
                                                                  "same dtype"),
    (dict(cos=torch.ones(6, 16, dtype=torch.int32), sin=torch.ones(6, 16, dtype=torch.int32)),
     TypeError, "cos must have dtype"),
    (dict(cos=torch.ones(6, 14)), ValueError, "cos and sin must have the same shape"),
    (dict(cos=torch.ones(6, 18), sin=torch.ones(6, 18)), ValueError, "larger than the head dim"),
    (dict(cos=torch.ones(6, 5), sin=torch.ones(6, 5)), ValueError, "positive even"),
    (dict(cos=torch.ones(3, 16), sin=torch.ones(3, 16)), ValueError, "table has 3 positions"),
    (dict(cos=None, sin=None, freqs=ropelib.rope_freqs(6, 16).bfloat16()), TypeError,
     "freqs must be float32 angles"),
    (dict(freqs=ropelib.rope_freqs(6, 16)), ValueError, "either freqs"),
    (dict(cos=None, sin=None), ValueError,
     r"pass freqs \(angles .*\), or both cos and sin .*, or angles \(ropelib.rope_angles\)"),
    (dict(sin=None), ValueError, "or both cos and sin"),
    (dict(cos=torch.ones(6, 16, requires_grad=True)), ValueError, "cos requires grad"),
    (dict(q=torch.randn(2, 4, 4, 16).to(torch.int64)), TypeError, "q must have dtype"),
    (dict(angles=ropelib.rope_angles(16)), ValueError, "pass either angles"),
    (dict(cos=None, sin=None, angles=ropelib.rope_freqs(6, 16)), TypeError,
     "angles must be a ropelib.frequencies.Angles"),
    (dict(cos=None, sin=None, angles=ropelib.rope_angles(32)), ValueError,
     "larger than the head dim"),
])
def test_bad_input_is_named(over, error, match):
    args = _bad(**over)
    with pytest.raises(error, match=match):
        ropelib.qk_norm_rope(args.pop("q"), args.pop("k"), args.pop("w_q"), args.pop("w_k"),
                             args.pop("freqs"), **args)


@pytest.mark.parametrize("opts,error,match", [
    (dict(eps=0.0), ValueError, "eps must be a finite number > 0"),
    (dict(eps="1e-6"), TypeError, "eps must be a real number"),
    (dict(weight_offset=float("nan")), ValueError, "weight_offset must be a finite"),
    (dict(layout="bhsd"), ValueError, "layout must be one of"),
    (dict(interleaved=1), TypeError, "interleaved must be a bool"),
    (dict(position_ids=torch.tensor([[0, 1, 2, 9]] * 2)), ValueError,
     r"position_ids must lie in \[0, 6\)"),
    (dict(position_ids=torch.zeros(3, 4, dtype=torch.long)), ValueError,
     r"position_ids must be \[4\] or \[2 or 1, 4\]"),
    (dict(position_ids=torch.zeros(2, 4)), TypeError, "position_ids must be an integer tensor"),
])
def test_bad_options_are_named(opts, error, match):
    args = _bad()
    with pytest.raises(error, match=match):
        ropelib.qk_norm_rope(args["q"], args["k"], args["w_q"], args["w_k"], cos=args["cos"],
                             sin=args["sin"], **opts)


def test_thd_needs_cu_seqlens_or_position_ids():
    q, k, w_q, w_k, cos, sin = make("thd", S=6)
    with pytest.raises(ValueError, match="layout='thd' .* needs cu_seqlens .* or position_ids"):
        ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, layout="thd")


@pytest.mark.parametrize("layout,opts,error,match", [
    ("bshd", dict(cu_seqlens=torch.tensor([0, 4])), ValueError,
     "cu_seqlens is only for layout='thd'"),
    ("thd", dict(cu_seqlens=torch.tensor([0, 6]), position_ids=torch.arange(6)), ValueError,
     "either position_ids or cu_seqlens, not both"),
    ("thd", dict(cu_seqlens=torch.tensor([0.0, 6.0])), TypeError,
     "cu_seqlens must be an integer tensor"),
    ("thd", dict(cu_seqlens=torch.tensor([[0, 6]])), ValueError, "cu_seqlens must be 1-D"),
    ("thd", dict(cu_seqlens=torch.tensor([6])), ValueError, "at least 2 entries"),
    ("thd", dict(cu_seqlens=torch.tensor([0, 2, 5])), ValueError,
     r"cu_seqlens\[-1\] .* must equal the number of tokens in t \(6\)"),
    ("thd", dict(cu_seqlens=torch.tensor([0, 4, 2, 6])), ValueError, "must be non-decreasing"),
    ("thd", dict(cu_seqlens=torch.tensor([1, 6])), ValueError, "must start at 0"),
    ("thd", dict(cu_seqlens=torch.tensor([0, 6]), cos_rows=5), ValueError,
     r"positions of sequence 0 \(0..5.*inside the table of 5 rows"),
])
def test_bad_cu_seqlens_are_named(layout, opts, error, match):
    q, k, w_q, w_k, cos, sin = make(layout, S=6, B=1)
    rows = opts.pop("cos_rows", None)
    if rows is not None:
        cos, sin = cos[:rows], sin[:rows]
    with pytest.raises(error, match=match):
        ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, layout=layout, **opts)


def test_eager_route_still_checks_cu_seqlens_values(seeded):
    q, k, w_q, w_k, cos, sin = (t.detach() for t in make("thd", torch.float32, S=6))
    ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, layout="thd",
                         cu_seqlens=torch.tensor([0, 2, 6]))
    with pytest.raises(ValueError, match="must equal the number of tokens"):
        ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, layout="thd",
                             cu_seqlens=torch.tensor([0, 2, 5]))


def test_hf_drop_in_bad_input():
    q, k, cos, sin = _hf_case(torch.float32)
    w = torch.ones(16)
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos, sin, w, w, unsqueeze_dim=3)
    with pytest.raises(ValueError, match=r"cos/sin last dim \(8\) must equal head_dim"):
        qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos[..., :8], sin[..., :8], w, w)
    with pytest.raises(ValueError, match="cos/sin must be"):
        qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos[:, :3], sin[:, :3], w, w)
    with pytest.raises(ValueError, match=r"k_norm_weight must be \[head_dim\]"):
        qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos, sin, w, torch.ones(8))
    with pytest.raises(ValueError, match="head_dim must be an int"):
        ropelib.QKNormRoPE(1)


# --- benchmark ------------------------------------------------------------------------------

def test_benchmark_dry_run(tmp_path, capsys):
    bench = load_file("qk_norm_bench", ROOT / "benchmarks" / "qk_norm_bench.py")
    out = tmp_path / "qk.csv"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    from ropelib.bench import compare
    rows = compare.read_csv(out)
    meta = compare.read_meta(out)
    assert meta["script"] == "benchmarks/qk_norm_bench.py" and "dry run" in meta["timing"]
    assert {r["provider"] for r in rows} == {"ropelib", "ropelib_angles", "torch_compile", "eager"}
    assert {r["pass"] for r in rows} == {"fwd", "fwd+bwd"}
    for r in rows:
        assert r["available"] is True and r["max_abs_err"] < 5e-2, r
    assert "ropelib" in capsys.readouterr().out


# --- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_model_sized_parity():
    torch.manual_seed(0)
    B, S, HQ, HK, D = 2, 1024, 32, 8, 128
    q = torch.randn(B, S, HQ, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, S, HK, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_q = (1 + 0.3 * torch.randn(D, device="cuda")).requires_grad_()
    w_k = (1 + 0.3 * torch.randn(D, device="cuda")).requires_grad_()
    cos, sin = ropelib.rope_cos_sin(S, D, device="cuda")
    check_against_reference(q, k, w_q, w_k, cos, sin)


@pytest.mark.gpu
def test_gpu_inductor_fullgraph_equals_eager():
    torch.manual_seed(1)
    B, S, HQ, HK, D = 2, 256, 16, 4, 128
    freqs = ropelib.rope_freqs(S, D).cuda()
    w_q, w_k = torch.randn(D, device="cuda"), torch.randn(D, device="cuda")

    def fn(q, k, w_q, w_k):
        return ropelib.qk_norm_rope(q, k, w_q, w_k, freqs)
    args = [torch.randn(B, S, HQ, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(B, S, HK, D, device="cuda", dtype=torch.bfloat16), w_q, w_k]
    args_e = [a.clone().requires_grad_() for a in args]
    args_c = [a.clone().requires_grad_() for a in args]
    out_e = fn(*args_e)
    out_c = torch.compile(fn, fullgraph=True)(*args_c)
    grads = [torch.randn_like(o) for o in out_e]
    torch.autograd.backward(out_e, grads)
    torch.autograd.backward(out_c, grads)
    for x, y in zip(out_c, out_e):
        assert torch.equal(x, y)
    for a, c in zip(args_e[:2], args_c[:2]):      # q and k: the same kernel, the same bits
        assert torch.equal(c.grad, a.grad)
    # w_q, w_k: the kernel's per-program partial sums are the same, but Inductor adds them up
    # with its own reduction, in its own order: sums of 8192 fp32 terms of either sign (the
    # gradients are ~100), which two orders round apart by up to a few 1e-5 (seen on an H200:
    # 2.5e-5); a wrong term would be off by units
    for a, c in zip(args_e[2:], args_c[2:]):
        torch.testing.assert_close(c.grad, a.grad, rtol=1e-5, atol=1e-4)


# --- the eager route ----------------------------------------------------------------------------

def test_eager_route_equals_the_operator(seeded):
    """Repeated eager calls take the planned route (checked once per signature, no dispatcher):
    outputs and all four gradients are the operator's bits, for gradients of any strides."""
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float32)
    eager.SIGNATURES.clear()
    for transposed in (False, True, False):
        got = ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin)
        want = OPS.qk_norm_rope(q, k, w_q, w_k, cos, sin, None, None, "bshd", False, 1e-6, 0.0)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        g = [torch.randn_like(t) for t in got]
        if transposed:
            g[0] = g[0].transpose(1, 2).contiguous().transpose(1, 2)
        leaves = (q, k, w_q, w_k)
        for a, b in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g)):
            assert torch.equal(a, b)
    assert len(eager.SIGNATURES.entries) == 1


def test_eager_route_refuses_double_backward(seeded):
    q, k, w_q, w_k, cos, sin = make("bshd", torch.float64)
    for _ in range(2):      # the second call takes the planned route
        q_out, k_out = ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(q_out.sum() + k_out.sum(), (q,), create_graph=True)


def test_eager_route_still_checks_position_values(seeded):
    q, k, w_q, w_k, cos, sin = (t.detach() for t in make("bshd", torch.float32))
    pos = torch.arange(q.shape[1])
    ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, position_ids=pos)
    with pytest.raises(ValueError, match="position_ids must lie in"):
        ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, position_ids=pos + 100)


# --- random cases -----------------------------------------------------------------------------

def _arranged(x: torch.Tensor, how: str, layout: str, gen: torch.Generator) -> torch.Tensor:
    """x (in `layout`) as the same values in another memory arrangement: as it is, dense in
    another order of its dims, a slice of a wider buffer (a fused projection's), or with heads
    not at stride D (which the kernels read from a copy)."""
    if how == "contiguous":
        return x.contiguous()
    if how == "permuted":
        order = torch.randperm(x.dim(), generator=gen).tolist()
        inverse = sorted(range(x.dim()), key=order.__getitem__)
        return x.permute(order).contiguous().permute(inverse)
    if how == "slice":
        wide = torch.zeros(*x.shape[:-2], x.shape[-2] * x.shape[-1] + 8, dtype=x.dtype)
        wide[..., 3:3 + x.shape[-2] * x.shape[-1]] = x.reshape(*x.shape[:-2], -1)
        return wide[..., 3:3 + x.shape[-2] * x.shape[-1]].view(x.shape)
    return x.transpose(-2, -3).contiguous().transpose(-2, -3) if layout != "thd" else \
        x.transpose(0, 1).contiguous().transpose(0, 1)          # heads not at stride D


@pytest.mark.parametrize("seed", range(24))
def test_random_cases(seed):
    """Random layouts, head counts (GQA), head and rotary dims, pairings, tables (angles or
    cos/sin), position ids (shared or per entry) or cu_seqlens (thd), weight offsets, dtypes and memory arrangements
    of q, k and the output gradients: outputs, input and weight gradients against the fp64
    reference, on the operator and on the eager route (a checked call, then a planned one)."""
    gen = torch.Generator().manual_seed(1000 + seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]
    layout = pick(["bshd", "sbhd", "thd"])
    S, B = pick([1, 3, 7]), (1 if layout == "thd" else pick([1, 2, 3]))
    HK = pick([1, 2, 3])
    HQ = HK * pick([1, 2, 4])
    D = pick([8, 12, 16, 24])
    R = pick([r for r in (4, 8, 12, 16, 24) if r <= D])
    interleaved, offset = pick([False, True]), pick([0.0, 1.0])
    dtype = pick([torch.float32, torch.bfloat16])
    P = S + pick([0, 4])
    shape = _shape_of(layout, S, B, D)
    q = _arranged(torch.randn(shape(HQ), generator=gen).to(dtype), pick(
        ["contiguous", "permuted", "slice", "heads"]), layout, gen)
    k = _arranged(torch.randn(shape(HK), generator=gen).to(dtype), pick(
        ["contiguous", "permuted", "slice", "heads"]), layout, gen)
    w_q = 1 + 0.3 * torch.randn(D, generator=gen)
    w_k = 1 + 0.3 * torch.randn(D, generator=gen)
    cos, sin = ropelib.rope_cos_sin(P, D, rotary_percent=R / D, interleaved=interleaved)
    freqs = ropelib.rope_freqs(P, D, rotary_percent=R / D, interleaved=interleaved)
    use_ids = layout == "thd" or pick([False, True])
    ids = cu = None
    if layout == "thd" and pick([False, True]):     # packed sequences: cu_seqlens
        cuts = sorted(int(c) for c in torch.randint(S + 1, (pick([0, 1, 2]),), generator=gen))
        cu = torch.tensor([0, *cuts, S], dtype=pick([torch.int32, torch.int64]))
        ids = torch.cat([torch.arange(int(n)) for n in cu.diff()])
    elif use_ids:
        rows = 1 if layout == "thd" else pick([1, B])
        ids = torch.randint(P, (rows, S), generator=gen)
        ids = ids[0] if layout == "thd" else ids
    tables = pick(["angles", "cos/sin"])
    opts = dict(layout=layout, interleaved=interleaved, position_ids=ids, weight_offset=offset)
    want_args = dict(cos=freqs[:, 0, 0].double().cos() if tables == "angles" else cos,
                     sin=freqs[:, 0, 0].double().sin() if tables == "angles" else sin, **opts)
    if cu is not None:
        opts.update(position_ids=None, cu_seqlens=cu)
    go = torch.randn(q.shape, generator=gen).to(dtype)
    go_k = _arranged(torch.randn(k.shape, generator=gen).to(dtype), "permuted", layout, gen)
    ql, kl = q.detach().requires_grad_(), k.detach().requires_grad_()
    wql, wkl = w_q.clone().requires_grad_(), w_k.clone().requires_grad_()
    want = reference(ql, kl, wql, wkl, **want_args)
    want_grads = torch.autograd.grad(want, (ql, kl, wql, wkl), (go, go_k))
    table = dict(freqs=freqs) if tables == "angles" else dict(cos=cos, sin=sin)
    eager.SIGNATURES.clear()
    for route in ("operator", "eager", "eager, planned"):
        qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()
        wq, wk = w_q.clone().requires_grad_(), w_k.clone().requires_grad_()
        with mock.patch.object(eager, "active", lambda: route != "operator"):
            got = ropelib.qk_norm_rope(qg, kg, wq, wk, **table, **opts)
        for a, b in zip(got, want):
            _close(a, b, TOL[dtype])
        grads = torch.autograd.grad(got, (qg, kg, wq, wk), (go, go_k))
        for a, b, tol in zip(grads, want_grads, (TOL[dtype],) * 2 + (W_TOL[dtype],) * 2):
            _close(a, b, (tol[0] * 4, tol[1] * 4) if dtype == torch.bfloat16 else tol)


@pytest.mark.parametrize("case", ["thd-heads-at-a-stride", "sbhd-per-entry-ids"])
def test_zero_tokens_give_empty_outputs(case):
    """No tokens: empty outputs (and gradients), whatever strides the empty inputs carry
    (.contiguous() leaves an empty tensor's strides as they are)."""
    D = 8
    f = ropelib.rope_freqs(4, D)
    w = torch.ones(D, requires_grad=True)
    if case == "thd-heads-at-a-stride":
        q = torch.randn(0, 2, D + 1)[..., :D].requires_grad_()
        k = torch.randn(0, 2, D)
        kw = dict(layout="thd", position_ids=torch.zeros(0, dtype=torch.long))
    else:
        q = torch.randn(3, 0, 2, D, requires_grad=True)
        k = torch.randn(3, 0, 1, D)
        kw = dict(position_ids=torch.zeros(3, 0, dtype=torch.long))
    qo, ko = ropelib.qk_norm_rope(q, k, w, w, f, **kw)
    assert qo.shape == q.shape and ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and torch.equal(w.grad, torch.zeros(D))
