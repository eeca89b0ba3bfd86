"""How tensors are read, saved and checked: each test pins one way a call could once give a
silent wrong answer, write before failing, or refuse valid input.

Numbered as in the list of holes that random testing against an independent float64 reference
found; every public entry point that shares a hole is covered.
"""
import pytest
import torch

import ropelib
from ropelib import hf as rhf
from ropelib import te as rte
from ropelib.reference import rope_reference, rotate_half

D = 16


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=tol)


# --- 1. non-contiguous index tensors are read with their strides ------------------------------

def test_1_non_contiguous_start_positions_every_entry_point(seeded):
    x = torch.randn(4, 3, 2, D, dtype=torch.float64)
    f = ropelib.rope_freqs(16, D)
    sp = torch.tensor([0, 9, 1, 9, 2, 9])[::2]            # [0, 1, 2], stride 2
    want = rope_reference(x, f, start_positions=sp.contiguous())
    close(ropelib.apply_rope(x, f, start_positions=sp), want)
    q, k = ropelib.apply_rope_qk(x, x[:, :, :1].clone(), f, start_positions=sp)
    close(q, want)
    close(rte.apply_rotary_pos_emb(x, f, start_positions=sp, fused=True), want)
    m = ropelib.RotaryEmbedding(D, layout="sbhd", max_seq_len=16)
    close(m(x, start_positions=sp), want)
    qkv = torch.randn(4, 3, 2, 3 * D, dtype=torch.float64)
    qo, ko, _ = rte.apply_fused_qkv_rotary_pos_emb(qkv, f, f, [D, D, D], start_positions=sp)
    close(ko, rope_reference(qkv[..., D:2 * D], f, start_positions=sp.contiguous()))
    # stride 2 over values that would be clamped: the range check sees the values used
    x8 = torch.randn(4, 2, 2, D)
    sp2 = torch.tensor([0, 1000, 1, 1000])[::2]
    close(ropelib.apply_rope(x8, ropelib.rope_freqs(8, D), start_positions=sp2),
          rope_reference(x8, ropelib.rope_freqs(8, D), start_positions=sp2.contiguous()))


def test_1_non_contiguous_cu_seqlens_and_position_ids(seeded):
    t = torch.randn(10, 2, D)
    f = ropelib.rope_freqs(32, D)
    cu = torch.tensor([0, 99, 4, 99, 10, 99])[::2]
    close(ropelib.apply_rope(t, f, layout="thd", cu_seqlens=cu),
          rope_reference(t, f, layout="thd", cu_seqlens=cu.contiguous()))
    x = torch.randn(2, 5, 2, D)
    pid = torch.randint(0, 32, (5, 2)).t()                 # [B, S], transposed
    close(ropelib.apply_rope(x, f, layout="bshd", position_ids=pid),
          rope_reference(x, f, layout="bshd", position_ids=pid.contiguous()))


# --- 2. in place in training on views of a projection ----------------------------------------

def test_2_in_place_qk_on_views_in_training(seeded):
    Bn, S, H, Dh = 2, 5, 3, D
    h = torch.randn(Bn, S, 8, requires_grad=True)
    W = torch.randn(8, 2 * H * Dh, requires_grad=True)
    f = ropelib.rope_freqs(S, Dh)

    def run(inplace):
        qk = (h @ W).view(Bn, S, 2 * H, Dh)
        q, k = qk[:, :, :H], qk[:, :, H:]
        qo, ko = ropelib.apply_rope_qk(q, k, f, layout="bshd", inplace=inplace)
        return qo, ko

    qo, ko = run(True)
    g = torch.randn_like(qo)
    (qo * g).sum().backward(retain_graph=True)
    grads = h.grad.clone(), W.grad.clone()
    h.grad = W.grad = None
    qr, kr = run(False)
    close(qo, qr)
    close(ko, kr)
    (qr * g).sum().backward()
    close(grads[0], h.grad)
    close(grads[1], W.grad)


# --- 3. in place on a leaf that requires grad: refused, nothing written ----------------------

@pytest.mark.parametrize("view", [False, True])
def test_3_in_place_on_a_leaf_is_refused_untouched(view, seeded):
    x = torch.randn(4, 2, 2, 8, requires_grad=True)
    before = x.detach().clone()
    target = x[:, :1] if view else x
    with pytest.raises(ValueError, match="leaf"):
        ropelib.apply_rope(target, ropelib.rope_freqs(4, 8), inplace=True)
    assert torch.equal(x.detach(), before)


# --- 4. tensors made under inference_mode --------------------------------------------------

def test_4_inference_mode_tensors_every_argument(seeded):
    with torch.inference_mode():
        x = torch.randn(6, 2, 2, D)
        f = ropelib.rope_freqs(16, D)
        c, s = ropelib.rope_cos_sin(16, D)
        sp = torch.tensor([1, 3])
        pid = torch.tensor([0, 2, 4, 6, 8, 10])
        t = torch.randn(6, 2, D)
        cu = torch.tensor([0, 2, 6])
        m = ropelib.RotaryEmbedding(D, layout="sbhd", max_seq_len=4)
        out = [ropelib.apply_rope(x, f, start_positions=sp),
               ropelib.apply_rope(x, cos=c, sin=s, position_ids=pid),
               ropelib.apply_rope(t, f, layout="thd", cu_seqlens=cu),
               m(x),                                   # grows inside inference_mode
               ropelib.apply_rope(x.clone(), f, inplace=True)]
    close(out[0], rope_reference(x, f, start_positions=sp))
    close(out[1], rope_reference(x, cos=c, sin=s, position_ids=pid))
    close(out[2], rope_reference(t, f, layout="thd", cu_seqlens=cu))
    close(out[3], rope_reference(x, ropelib.rope_freqs(6, D)))
    close(out[4], rope_reference(x, f))
    # the same inference tensors as tables and indices of a training step
    xg = torch.randn(6, 2, 2, D, requires_grad=True)
    y = ropelib.apply_rope(xg, f, start_positions=sp) + m(xg)
    y.sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()


# --- 5. index or table tensors changed between forward and backward --------------------------

@pytest.mark.parametrize("what", ["start", "freqs", "position_ids", "cos"])
def test_5_mutation_before_backward_raises(what, seeded):
    x = torch.randn(4, 2, 2, D, requires_grad=True)
    f = ropelib.rope_freqs(16, D)
    c, s = ropelib.rope_cos_sin(16, D)
    sp = torch.tensor([1, 2])
    pid = torch.tensor([0, 1, 2, 3])
    if what in ("start", "freqs"):
        y = ropelib.apply_rope(x, f, start_positions=sp)
    elif what == "position_ids":
        y = ropelib.apply_rope(x, f, position_ids=pid)
    else:
        y = ropelib.apply_rope(x, cos=c, sin=s)
    {"start": lambda: sp.add_(5), "freqs": lambda: f.mul_(2),
     "position_ids": lambda: pid.add_(5), "cos": lambda: c.mul_(2)}[what]()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# --- 6. no answer depends on a cache or a version counter ------------------------------------

def test_6_edits_that_keep_the_version(seeded):
    t = torch.randn(10, 2, D)
    f = ropelib.rope_freqs(32, D)
    cu = torch.tensor([0, 4, 10])
    ropelib.apply_rope(t, f, layout="thd", cu_seqlens=cu)
    cu.numpy()[1] = 7                                     # no version bump
    close(ropelib.apply_rope(t, f, layout="thd", cu_seqlens=cu),
          rope_reference(t, f, layout="thd", cu_seqlens=torch.tensor([0, 7, 10])))
    # a table whose two halves were equal, then no longer are
    x = torch.randn(4, 2, 2, D)
    ft = ropelib.rope_freqs(8, D)
    ropelib.apply_rope(x, ft)
    ft.data[:, 0, 0, D // 2:] *= 1.5
    close(ropelib.apply_rope(x, ft), rope_reference(x, ft))
    # start positions moved out of the table behind autograd's back: refused (CPU tensors are
    # checked every call), and unchecked they give NaN rows, never a clamped row
    sp = torch.tensor([0, 1])
    ropelib.apply_rope(x, ft, start_positions=sp)
    sp.numpy()[1] = 6                                     # positions 6..9 of an 8-row table
    with pytest.raises(ValueError, match="start_positions"):
        ropelib.apply_rope(x, ft, start_positions=sp)
    with ropelib.set_index_checks("off"):
        y = ropelib.apply_rope(x, ft, start_positions=sp)
    assert torch.isfinite(y[:, 0]).all() and torch.isfinite(y[:2, 1]).all()
    assert torch.isnan(y[2:, 1]).all()


# --- 7. RotaryEmbedding keeps float32 tables whatever the module's dtype -------------------------

@pytest.mark.parametrize("convert", ["to_bf16", "half", "double"])
def test_7_module_tables_stay_float32(convert, seeded):
    m = ropelib.RotaryEmbedding(64, layout="sbhd", max_seq_len=2048)
    m = {"to_bf16": lambda: m.to(torch.bfloat16), "half": m.half, "double": m.double}[convert]()
    assert m.freqs.dtype == torch.float32
    x = torch.randn(2048, 1, 1, 64).to(torch.bfloat16)
    y = m(x)
    ref = rope_reference(x, ropelib.rope_freqs(2048, 64))
    assert (y.float() - ref.float()).abs().max() <= 0.05   # one bf16 rounding, not radians


# --- 8. double backward ----------------------------------------------------------------------

def test_8_double_backward(seeded):
    # small: each numerical derivative runs the kernel, in the interpreter on a CPU; fast_mode
    # checks the second derivative along random directions (a few launches, not one per element)
    x = torch.randn(2, 2, 1, 4, dtype=torch.float64, requires_grad=True)
    f = ropelib.rope_freqs(6, 4)
    sp = torch.tensor([0, 2])
    torch.autograd.gradgradcheck(lambda x: ropelib.apply_rope(x, f, start_positions=sp), (x,),
                                 fast_mode=True)
    q = torch.randn(2, 1, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 1, 4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradgradcheck(lambda q, k: ropelib.apply_rope_qk(q, k, f), (q, k),
                                 fast_mode=True)
    y = ropelib.apply_rope(x, f)
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    assert g.requires_grad


# --- 9. gradients for the tables: refused, never silently dropped -----------------------------

def test_9_table_gradients_are_refused(seeded):
    x = torch.randn(4, 2, 2, D, requires_grad=True)
    f = ropelib.rope_freqs(4, D).requires_grad_(True)
    with pytest.raises(ValueError, match="freqs requires grad"):
        ropelib.apply_rope(x, f)
    q, k = torch.randn(2, 2, 4, D), torch.randn(2, 1, 4, D)
    c, s = ropelib.rope_cos_sin(4, D)
    with pytest.raises(ValueError, match="cos requires grad"):   # only the tables need grad
        rhf.apply_rotary_pos_emb(q, k, c[None].requires_grad_(True), s[None])
    with torch.no_grad():     # no gradient wanted: fine
        ropelib.apply_rope(x, f)


# --- 10. empty tensors in place -------------------------------------------------------------

def test_10_empty_tensors_in_place(seeded):
    f = ropelib.rope_freqs(4, 8)
    q, k = torch.randn(0, 2, 2, 8), torch.randn(0, 2, 1, 8)
    a, b = ropelib.apply_rope_qk(q, k, f, inplace=True)
    assert a is q and b is k
    odd = torch.empty_strided((4, 0, 2, 8), (1, 1, 1, 1))
    assert ropelib.apply_rope(odd, f, inplace=True) is odd


# --- 11. bad input is named --------------------------------------------------------------------

@pytest.mark.parametrize("call,exc,match", [
    (lambda x, f: ropelib.apply_rope(x, [[0.0] * 8] * 4), TypeError, "freqs"),
    (lambda x, f: ropelib.apply_rope(x, f, start_positions=[0, 1]), TypeError, "start_positions"),
    (lambda x, f: ropelib.apply_rope(x, f, cp_size=True), ValueError, "cp_size"),
    (lambda x, f: ropelib.apply_rope(x, f, inplace="no"), TypeError, "inplace"),
    (lambda x, f: rte.apply_rotary_pos_emb(x, ropelib.rope_freqs(64, 8),   # table long enough
                                           start_positions=torch.tensor([0]), cp_size=2,
                                           fused=True), ValueError, "start_positions must have"),
    (lambda x, f: ropelib.apply_rope(x, f.to(torch.bfloat16)), TypeError, "float32"),
    (lambda x, f: ropelib.apply_rope(x, cos=torch.ones(4, 8), sin=torch.ones(4, 8).half()),
     TypeError, "same dtype"),
])
def test_11_bad_input_names_the_argument(call, exc, match, seeded):
    x = torch.randn(4, 2, 2, 8)
    f = ropelib.rope_freqs(4, 8)
    with pytest.raises(exc, match=match):
        call(x, f)


@pytest.mark.parametrize("dim,pair", [(-2, 2), (-3, 1)])
def test_11_hf_negative_unsqueeze_dim(dim, pair, seeded):
    shape = (2, 5, 3, D) if pair == 2 else (2, 3, 5, D)
    q, k = torch.randn(shape), torch.randn(shape)
    c, s = ropelib.rope_cos_sin(5, D)
    got = rhf.apply_rotary_pos_emb(q, k, c[None], s[None], unsqueeze_dim=dim)
    want = rhf.apply_rotary_pos_emb(q, k, c[None], s[None], unsqueeze_dim=pair)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    cos, sin = c[None].unsqueeze(dim), s[None].unsqueeze(dim)
    close(got[0], q * cos + rotate_half(q) * sin)


# --- 12. HF backward with bf16 q and float64 cos (the interpreter's rounding) -------------------

def test_12_hf_backward_bf16_with_float64_tables(seeded):
    q = torch.randn(2, 2, 5, D).to(torch.bfloat16).requires_grad_(True)
    k = torch.randn(2, 1, 5, D).to(torch.bfloat16).requires_grad_(True)
    c, s = ropelib.rope_cos_sin(5, D, dtype=torch.float64)
    qo, ko = rhf.apply_rotary_pos_emb(q, k, c[None], s[None])
    assert qo.dtype == torch.float64
    (qo.sum() + ko.sum()).backward()
    qr = q.detach().double().requires_grad_(True)
    (qr * c[None, None] + rotate_half(qr) * s[None, None]).sum().backward()
    close(q.grad, qr.grad.to(torch.bfloat16), tol=1e-2)


# --- 13. torch.func and TorchScript ----------------------------------------------------------

def test_13_vmap_works(seeded):
    f = ropelib.rope_freqs(8, 8)
    xs = torch.randn(3, 4, 2, 2, 8)
    sp = torch.tensor([[0, 1], [2, 3], [1, 1]])
    # (through PyTorch's batching fallback, a loop over the mapped dimension)
    got = torch.vmap(lambda x, s: ropelib.apply_rope(x, f, start_positions=s))(xs, sp)
    close(got, torch.stack([rope_reference(xs[i], f, start_positions=sp[i]) for i in range(3)]))


def test_13_func_grad_says_it_is_not_supported(seeded):
    f = ropelib.rope_freqs(4, 8)
    with pytest.raises(NotImplementedError, match="torch.autograd.grad"):
        torch.func.grad(lambda x: ropelib.apply_rope(x, f).sum())(torch.randn(4, 2, 2, 8))


def _kernel_entry_points():
    """{name: fn(x) -> a tensor}, x [B=2, S=3, H=2, D=8]: every public function that runs a
    kernel beside apply_rope, each differentiable in x."""
    S, D = 3, 8
    f = ropelib.rope_freqs(S, D)
    cos, sin = f[:, 0, 0].cos(), f[:, 0, 0].sin()
    axes = ropelib.multi_axis_frequencies(D, [2, 1, 1])
    pos = torch.arange(S).expand(3, S)
    cos3, sin3 = cos.expand(3, 1, S, D), sin.expand(3, 1, S, D)
    w = torch.ones(D)
    return {
        "hf": lambda x: rhf.apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=2)[0],
        "hf-multimodal": lambda x: rhf.apply_multimodal_rotary_pos_emb(
            x, x, cos3, sin3, [2, 1, 1], unsqueeze_dim=2)[0],
        "mrope": lambda x: ropelib.apply_mrope(x, pos, axes),
        "mrope-qk": lambda x: ropelib.apply_mrope_qk(x, x, pos, axes)[0],
        "qk-norm": lambda x: ropelib.qk_norm_rope(x, x, w, w, f, layout="bshd")[0],
        "te": lambda x: rte.apply_rotary_pos_emb(x, f, tensor_format="bshd", fused=True),
    }


@pytest.mark.parametrize("name", list(_kernel_entry_points()))
@pytest.mark.parametrize("transform", ["jvp", "jacfwd", "grad"])
def test_13_func_transforms_are_refused_by_every_kernel_entry_point(name, transform, seeded):
    """Traced through torch.func's jvp, a custom operator's derivative comes out zero without
    an error: every function that runs a kernel refuses grad and jvp transforms by name."""
    fn = _kernel_entry_points()[name]
    x = torch.randn(2, 3, 2, 8)
    with pytest.raises(NotImplementedError, match="torch.autograd.grad"):
        if transform == "jvp":
            torch.func.jvp(fn, (x,), (torch.randn_like(x),))
        elif transform == "jacfwd":
            torch.func.jacfwd(fn)(x)
        else:
            torch.func.grad(lambda t: fn(t).sum())(x)
    assert torch.vmap(fn)(x[None]).shape[1:] == fn(x).shape      # vmap still works


def test_13_jit_trace_records_the_operator(seeded):
    f = ropelib.rope_freqs(4, 8)
    x = torch.randn(4, 2, 2, 8)
    traced = torch.jit.trace(lambda x: ropelib.apply_rope(x, f), (x,))
    assert "ropelib::rope" in str(traced.graph)
    x2 = torch.randn(4, 2, 2, 8)
    assert torch.equal(traced(x2), ropelib.apply_rope(x2, f))


def test_13_jit_script_of_the_module_says_why_not():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = ropelib.RotaryEmbedding(8)

        def forward(self, x):
            return self.rope(x)
    with pytest.raises(NotImplementedError, match="torch.jit.script"):
        torch.jit.script(Model())


# --- 14. in place on a tensor whose features are not at stride 1 --------------------------------

def _strided_features(base_shape, dtype=torch.float32):
    """(base, x): x a view of base whose last dim (the features) is at stride 2."""
    base = torch.randn(*base_shape[:-1], 2 * base_shape[-1], dtype=dtype)
    return base, base[..., ::2]


@pytest.mark.parametrize("layout,shape", [("sbhd", (5, 2, 3, D)), ("bshd", (2, 5, 3, D)),
                                          ("thd", (7, 3, D))])
@pytest.mark.parametrize("interleaved", [False, True])
def test_in_place_with_features_at_a_stride(layout, shape, interleaved, seeded):
    """The kernels store rows with their features at stride 1; in place on a [..., ::2] slice (or
    a transposed buffer) the rotation goes through a fresh tensor and is copied back: the values
    of the out-of-place call, and nothing outside the view written."""
    f = ropelib.rope_freqs(8, D, interleaved=interleaved)
    kw = dict(layout=layout, interleaved=interleaved)
    if layout == "thd":
        kw["cu_seqlens"] = torch.tensor([0, 3, 7], dtype=torch.int32)
    base, x = _strided_features(shape)
    between = base[..., 1::2].clone()
    want = ropelib.apply_rope(x, f, **kw)                      # out of place: reads any strides
    for _ in range(2):                                         # checked, then planned (eager route)
        b2 = base.clone()
        x2 = b2[..., ::2]
        assert ropelib.apply_rope(x2, f, inplace=True, **kw) is x2
        close(x2, want)
        assert torch.equal(b2[..., 1::2], between)            # the features between: untouched
    # q and k in one call, k's features at a stride, q's not
    q = torch.randn(shape)
    kb, k = _strided_features(shape)
    k_between = kb[..., 1::2].clone()
    want_q, want_k = ropelib.apply_rope_qk(q, k, f, **kw)
    ropelib.apply_rope_qk(q, k, f, inplace=True, **kw)
    close(q, want_q)
    close(k, want_k)
    assert torch.equal(kb[..., 1::2], k_between)


def test_in_place_operator_with_features_at_a_stride(seeded):
    """torch.ops.ropelib.rope_ itself (what torch.compile calls) on a transposed buffer."""
    f = ropelib.rope_freqs(8, D)
    x = torch.randn(4, 2, D, 3).transpose(2, 3)                 # sbhd [4, 2, 3, D], feature stride 3
    want = ropelib.apply_rope(x, f)
    torch.ops.ropelib.rope_(x, f.view(8, D), None, None, None, None, "sbhd", False, 1, 0)
    close(x, want)
    # under torch.compile (the eager backend: the operators, no Inductor)
    y = torch.randn(4, 2, D, 3).transpose(2, 3)
    want_y = ropelib.apply_rope(y, f)
    torch.compile(lambda t: ropelib.apply_rope(t, f, inplace=True), backend="eager",
                  fullgraph=True)(y)
    close(y, want_y)
