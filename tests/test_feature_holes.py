"""Feature entry points at the edges of what they accept: each test pins one way a call could
give a silent wrong answer, fail with a confusing error, or break a documented accuracy.

1. qk_norm_rope in fp64 uses eps and weight_offset unrounded (not rounded to fp32 on the way to
   the kernel), in every route: the function (operator, then eager route), the module, the
   registered operators and the Hugging Face drop-in, forward and backward.
2. MultiAxisRotaryEmbedding keeps its frequencies float32 under .to(dtype) / .half() /
   .double(), as RotaryEmbedding keeps its tables.
3. Empty inputs (batch 0, zero tokens) give empty outputs and gradients: qk_norm_rope and
   multi-axis RoPE, every layout.
4. The table-free fp32 cos/sin (apply_rope(..., angles=...)) stay within the bound the kernel
   module states (ropelib.kernels.fused.COS_SIN_ULPS) of the exact values, at the worst position
   known for the old polynomial evaluation and at random positions up to the largest accepted.
"""
import pytest
import torch

import ropelib
from ropelib import frequencies as F
from ropelib import qk_norm
from ropelib.kernels import fused
from ropelib.reference import rope_reference

OPS = torch.ops.ropelib
FP64 = dict(atol=1e-12, rtol=1e-12)     # what float64 math promises at values of a few units


def _norm_rope64(q, k, w_q, w_k, cos, sin, *, eps, weight_offset, layout="bshd"):
    """rope(rmsnorm(x) * (w + offset)) in plain float64 PyTorch (cos, sin: [P, R] tables)."""
    def one(x, w):
        x = x.double()
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return rope_reference(n * (w.double() + weight_offset), cos=cos.double(),
                              sin=sin.double(), layout=layout)
    return one(q, w_q), one(k, w_k)


def _leaves(*shapes, dtype=torch.float64):
    return [torch.randn(*s, dtype=dtype).requires_grad_() for s in shapes]


# --- 1. fp64 qk_norm_rope: eps and weight_offset in fp64 ------------------------------------

@pytest.mark.parametrize("eps, weight_offset", [(1e-2, 0.7), (0.3, -0.1234567890123)])
def test_1_fp64_qk_norm_rope_keeps_eps_and_offset_in_fp64(eps, weight_offset, seeded):
    B, S, HQ, HK, D = 2, 5, 4, 2, 16
    # small activations, so that eps weighs in the norm
    q = (0.1 * torch.randn(B, S, HQ, D, dtype=torch.float64)).requires_grad_()
    k = (0.1 * torch.randn(B, S, HK, D, dtype=torch.float64)).requires_grad_()
    w_q, w_k = _leaves((D,), (D,))
    cos, sin = ropelib.rope_cos_sin(S, D, dtype=torch.float64)
    opts = dict(eps=eps, weight_offset=weight_offset)
    want = _norm_rope64(q, k, w_q, w_k, cos, sin, **opts)
    gq, gk = torch.randn_like(want[0]), torch.randn_like(want[1])
    want_grads = torch.autograd.grad(want, (q, k, w_q, w_k), (gq, gk))

    def check(out, what):
        for got, ref in zip(out, want):
            assert got.dtype == torch.float64, what
            torch.testing.assert_close(got, ref, **FP64, msg=lambda m: f"{what}: {m}")
        grads = torch.autograd.grad(out, (q, k, w_q, w_k), (gq, gk))
        for got, ref in zip(grads, want_grads):
            torch.testing.assert_close(got, ref, **FP64, msg=lambda m: f"{what} grad: {m}")

    for call in ("operator route", "eager route"):     # the first call of a signature, then
        check(ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, **opts), call)
    module = ropelib.QKNormRoPE(D, eps, weight_offset, dtype=torch.float64)
    with torch.no_grad():
        module.w_q.copy_(w_q)
        module.w_k.copy_(w_k)
    out = module(q, k, cos=cos, sin=sin)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got, ref, **FP64)
    check(OPS.qk_norm_rope(q, k, w_q, w_k, cos, sin, None, None, "bshd", False, eps,
                           weight_offset),
          "torch.ops.ropelib.qk_norm_rope")
    grads = OPS.qk_norm_rope_backward(gq, gk, q.detach(), k.detach(), w_q.detach(),
                                      w_k.detach(), cos, sin, None, None, "bshd", False, eps,
                                      weight_offset)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got, ref, **FP64)
    # Hugging Face's [B, H, S, D] with cos/sin gathered per token
    hq, hk = (x.detach().transpose(1, 2) for x in (q, k))
    out = qk_norm.qk_norm_apply_rotary_pos_emb(hq, hk, cos[None], sin[None], w_q.detach(),
                                               w_k.detach(), eps=eps, unsqueeze_dim=1,
                                               weight_offset=weight_offset)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got.transpose(1, 2), ref, **FP64)


# --- 2. MultiAxisRotaryEmbedding under dtype conversion ---------------------------------------

@pytest.mark.parametrize("convert", [lambda m: m.to(torch.bfloat16), lambda m: m.half(),
                                     lambda m: m.to(torch.float64), lambda m: m.double(),
                                     lambda m: m.to("cpu", torch.float16)],
                         ids=["to_bf16", "half", "to_fp64", "double", "to_device_and_fp16"])
def test_2_multi_axis_module_keeps_float32_frequencies(convert, seeded):
    D, section = 32, [4, 6, 6]
    plain = ropelib.MultiAxisRotaryEmbedding(D, section, 1e6)
    converted = convert(ropelib.MultiAxisRotaryEmbedding(D, section, 1e6))
    assert converted.inv_freq.dtype == torch.float32
    assert torch.equal(converted.inv_freq, plain.inv_freq)
    assert converted.axis.dtype == plain.axis.dtype and torch.equal(converted.axis, plain.axis)
    B, S = 2, 7
    pos = torch.randint(0, 100000, (3, B, S))
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        q = torch.randn(B, S, 4, D, dtype=dtype)
        k = torch.randn(B, S, 2, D, dtype=dtype)
        for got, want in zip(converted(q, k, pos), plain(q, k, pos)):
            assert got.dtype == dtype and torch.equal(got, want)
        assert torch.equal(converted(q, None, pos), plain(q, None, pos))


# --- 3. empty inputs ------------------------------------------------------------------------

# (q shape, k shape, layout): batch 0, zero tokens
EMPTY = {
    "bshd-batch0": ((0, 5, 4, 16), (0, 5, 2, 16), "bshd"),
    "bshd-tokens0": ((2, 0, 4, 16), (2, 0, 2, 16), "bshd"),
    "sbhd-batch0": ((5, 0, 4, 16), (5, 0, 2, 16), "sbhd"),
    "sbhd-tokens0": ((0, 2, 4, 16), (0, 2, 2, 16), "sbhd"),
    "thd-tokens0": ((0, 4, 16), (0, 2, 16), "thd"),
}


def _tokens(shape, layout):
    return shape[1] if layout == "bshd" else shape[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(EMPTY))
def test_3_qk_norm_rope_of_empty_inputs(case, dtype, seeded):
    shape_q, shape_k, layout = EMPTY[case]
    D = shape_q[-1]
    q, k = _leaves(shape_q, shape_k, dtype=dtype)
    w_q, w_k = _leaves((D,), (D,), dtype=torch.float32)
    cos, sin = ropelib.rope_cos_sin(8, D)
    S = _tokens(shape_q, layout)
    pos = torch.zeros(S, dtype=torch.long) if layout == "thd" else None
    for _ in range(2):      # the operator route, then the eager route
        q_out, k_out = ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, layout=layout,
                                            position_ids=pos, weight_offset=1.0)
        assert (q_out.shape, q_out.dtype, k_out.shape, k_out.dtype) == \
            (q.shape, dtype, k.shape, dtype)
        grads = torch.autograd.grad((q_out.sum() + k_out.sum()), (q, k, w_q, w_k))
        for g, x in zip(grads, (q, k, w_q, w_k)):
            assert g.shape == x.shape and g.dtype == x.dtype
        assert torch.count_nonzero(grads[2]) == 0 and torch.count_nonzero(grads[3]) == 0
    q_out, k_out = OPS.qk_norm_rope(q, k, w_q, w_k, cos, sin, pos, None, layout, False, 1e-6,
                                    0.0)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    module = ropelib.QKNormRoPE(D, layout=layout)
    assert module(q, k, cos=cos, sin=sin, position_ids=pos)[0].shape == q.shape
    if layout == "bshd":     # Hugging Face's [B, H, S, D]
        out = qk_norm.qk_norm_apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2),
                                                   cos[None, :S], sin[None, :S], w_q, w_k)
        assert out[0].shape == q.transpose(1, 2).shape


@pytest.mark.parametrize("case, per_batch",
                         [(c, p) for c in EMPTY for p in (False, True)
                          if not (p and EMPTY[c][2] == "thd")],   # thd: positions per token
                         ids=lambda v: v if isinstance(v, str) else
                         ("per_batch_positions" if v else "shared_positions"))
def test_3_multi_axis_rope_of_empty_inputs(case, per_batch, seeded):
    shape_q, shape_k, layout = EMPTY[case]
    D = shape_q[-1]
    q, k = _leaves(shape_q, shape_k, dtype=torch.bfloat16)
    S = _tokens(shape_q, layout)
    B = {"bshd": shape_q[0], "sbhd": shape_q[1], "thd": 1}[layout]
    pos = torch.zeros((3, B, S) if per_batch else (3, S), dtype=torch.long)
    freqs = ropelib.multi_axis_frequencies(D, [2, 3, 3])
    for _ in range(2):      # the operator route, then the eager route
        y = ropelib.apply_mrope(q, pos, freqs, layout=layout)
        assert y.shape == q.shape and y.dtype == q.dtype
        g, = torch.autograd.grad(y.sum(), q)
        assert g.shape == q.shape and g.dtype == q.dtype
        q_out, k_out = ropelib.apply_mrope_qk(q, k, pos, freqs, layout=layout)
        assert (q_out.shape, k_out.shape) == (q.shape, k.shape)
        gq, gk = torch.autograd.grad(q_out.sum() + k_out.sum(), (q, k))
        assert (gq.shape, gk.shape) == (q.shape, k.shape)
    module = ropelib.MultiAxisRotaryEmbedding(D, [2, 3, 3], layout=layout)
    assert [t.shape for t in module(q, k, pos)] == [q.shape, k.shape]


# --- 4. table-free fp32 cos/sin: the stated bound -----------------------------------------------

def _ulp32(x: torch.Tensor) -> torch.Tensor:
    """The fp32 ulp at |x| (float64)."""
    _, e = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), (e - 24).to(torch.int64)) \
        .clamp_min(2.0 ** -149)


def _kernel_cos_sin(angles: F.Angles, positions: torch.Tensor):
    """The fp32 cos and sin the finished kernel computes without a table, [N, R/2] each: the
    rotation of x = (1, 0) in every pair (y_a = 1 cos - 0 sin, y_b = 0 cos + 1 sin, exact)."""
    half = angles.rot_dim // 2
    x = torch.cat([torch.ones(positions.shape[0], 1, 1, half),
                   torch.zeros(positions.shape[0], 1, 1, half)], -1)          # sbhd, fp32
    y = ropelib.apply_rope(x, angles=angles, layout="sbhd", position_ids=positions[None, :])
    return y[:, 0, 0, :half].double(), y[:, 0, 0, half:].double()


@pytest.mark.parametrize("frequencies", ["one_radian", "llama3_head"])
def test_4_table_free_cos_sin_within_the_stated_bound(frequencies, seeded):
    # At 1 rad per position, with two roundings per multiply-add and the rounding of the
    # reduced angle passed through, sin was 2.27 fp32 ulps off at 695,538,199 and cos 2.39 at
    # 790,269,701 (sin 2.30 at 579,601,084); the rest are random, up to the largest position.
    worst = torch.tensor([695538199, 790269701, 579601084, 0, 1, F.EXACT_POSITIONS - 1])
    positions = torch.cat([worst, torch.randint(0, F.EXACT_POSITIONS, (250,))])
    if frequencies == "one_radian":
        angles = F.Angles(torch.tensor([1.0], dtype=torch.float64))
    else:
        angles = F.rope_angles(128, base=500000.0)   # 64 frequencies, the first 1 rad
    c, s = _kernel_cos_sin(angles, positions)
    exact = F.reduced_angles(positions, angles.inv_freq)   # exact reduction, one rounding
    for name, got, want in (("cos", c, exact.cos()), ("sin", s, exact.sin())):
        ulps = (got - want).abs() / _ulp32(want)
        worst_at = int(ulps.argmax())
        assert float(ulps.max()) <= fused.COS_SIN_ULPS, \
            (f"{name} is {float(ulps.max()):.3f} fp32 ulps off at position "
             f"{int(positions[worst_at // ulps.shape[1]])}")
