"""Properties of the finished kernel that hold whatever the reference says: rotations preserve
norms, attention scores depend only on relative positions, backward is the adjoint (gradcheck),
in-place semantics, every output element written (poisoned outputs), apply_rope_qk and the
RotaryEmbedding module. CPU shapes are tiny (the interpreter costs milliseconds per program).
"""
import math

import pytest
import torch

import ropelib
import ropelib.ops as ops
from ropelib import reference
from ropelib.reference import rope_reference

S, B, H, D = 6, 2, 2, 16


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_norm_preserved(interleaved, layout, seeded):
    freqs = ropelib.rope_freqs(S, D, interleaved=interleaved) * 7.3   # large angles
    x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D))
    y = ropelib.apply_rope(x, freqs, layout=layout, interleaved=interleaved)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)
    # and each rotated pair keeps its own length
    if interleaved:
        pa, pb = (x[..., 0::2], x[..., 1::2]), (y[..., 0::2], y[..., 1::2])
    else:
        pa, pb = (x[..., :D // 2], x[..., D // 2:]), (y[..., :D // 2], y[..., D // 2:])
    torch.testing.assert_close(pb[0] ** 2 + pb[1] ** 2, pa[0] ** 2 + pa[1] ** 2,
                               atol=1e-5, rtol=1e-5)
    assert not torch.allclose(y, x)   # it did rotate


@pytest.mark.parametrize("interleaved", [False, True])
def test_scores_depend_only_on_relative_position(interleaved, seeded):
    P = 64
    # angles built in fp64 (rope_freqs' fp32 angles are rounded per position, which would
    # break the identity at the 1e-7 level)
    inv = 1.0 / 10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(P, dtype=torch.float64)[:, None] * inv
    freqs = ang.repeat_interleave(2, dim=-1) if interleaved else torch.cat((ang, ang), dim=-1)
    q = torch.randn(1, 1, 1, D, dtype=torch.float64)
    k = torch.randn(1, 1, 1, D, dtype=torch.float64)

    def score(m, n):
        qm = ropelib.apply_rope(q, freqs, position_ids=torch.tensor([m]),
                                interleaved=interleaved)
        kn = ropelib.apply_rope(k, freqs, position_ids=torch.tensor([n]),
                                interleaved=interleaved)
        return float((qm * kn).sum())

    for delta in (0, 3, -5, 17):
        vals = [score(m, m - delta) for m in (20, 31, 45)]
        for v in vals[1:]:
            assert math.isclose(v, vals[0], rel_tol=1e-10, abs_tol=1e-10)
    assert not math.isclose(score(20, 17), score(20, 10), rel_tol=1e-6)


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_backward_equals_autograd_of_reference(layout, interleaved, seeded):
    freqs = ropelib.rope_freqs(2 * S + 4, D, rotary_percent=0.75, interleaved=interleaved)
    opts = dict(layout=layout, interleaved=interleaved)
    if layout == "thd":
        x = torch.randn(S, H, D)
        opts.update(cu_seqlens=torch.tensor([0, 2, 6]), start_positions=torch.tensor([1, 4]))
    else:
        x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D))
        opts.update(start_positions=torch.tensor([4, 0]))
    g = torch.randn_like(x)
    xk = x.clone().requires_grad_(True)
    (ropelib.apply_rope(xk, freqs, **opts) * g).sum().backward()
    xr = x.double().requires_grad_(True)
    (rope_reference(xr, freqs, **opts) * g.double()).sum().backward()
    torch.testing.assert_close(xk.grad, xr.grad.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("table", ["freqs", "cos_sin"])
def test_gradcheck_fp64(interleaved, table, seeded):
    Dh, Hh = 8, 2
    freqs = ropelib.rope_freqs(5, Dh, rotary_percent=0.5, interleaved=interleaved).double() * 2
    tab = dict(freqs=freqs) if table == "freqs" else \
        dict(cos=freqs[:, 0, 0].cos(), sin=freqs[:, 0, 0].sin())
    x = torch.randn(3, 1, Hh, Dh, dtype=torch.float64, requires_grad=True)
    sp = torch.tensor([2])
    fn = lambda t: ropelib.apply_rope(t, **tab, interleaved=interleaved, start_positions=sp)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), fast_mode=True)


def test_gradcheck_qk_fp64(seeded):
    freqs = ropelib.rope_freqs(4, 8).double()
    q = torch.randn(3, 1, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 1, 1, 8, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b: ropelib.apply_rope_qk(a, b, freqs)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k), fast_mode=True)


# --- in place -------------------------------------------------------------------------------

@pytest.mark.parametrize("rp", [0.5, 1.0])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_inplace_equals_out_of_place(rp, interleaved, transposed, seeded):
    freqs = ropelib.rope_freqs(S, D, rotary_percent=rp, interleaved=interleaved)
    x = torch.randn(S, B, H, D).to(torch.bfloat16)
    if transposed:
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    orig = x.clone()
    y = ropelib.apply_rope(x, freqs, interleaved=interleaved)
    assert torch.equal(x, orig), "out-of-place call mutated its input"
    assert y.data_ptr() != x.data_ptr()
    z = ropelib.apply_rope(x, freqs, interleaved=interleaved, inplace=True)
    assert z is x
    assert torch.equal(x, y)
    R = freqs.shape[-1]
    assert torch.equal(x[..., R:], orig[..., R:])   # tail untouched
    if R < D:
        assert not torch.equal(x[..., :R], orig[..., :R])


def test_inplace_partial_rotary_does_not_write_tail(seeded):
    """In place with R < D must not even rewrite the tail: poison it through a second view
    is impossible, so check with NaNs in the tail that stay NaN (and the rotated part is finite)."""
    freqs = ropelib.rope_freqs(S, D, rotary_percent=0.5)
    x = torch.randn(S, B, H, D)
    x[..., D // 2:] = float("nan")
    ropelib.apply_rope(x, freqs, inplace=True)
    assert torch.isnan(x[..., D // 2:]).all()
    assert torch.isfinite(x[..., :D // 2]).all()


def test_inplace_autograd(seeded):
    freqs = ropelib.rope_freqs(S, D)
    leaf = torch.randn(S, B, H, D, requires_grad=True)
    g = torch.randn(S, B, H, D)
    t = leaf.clone()
    y = ropelib.apply_rope(t, freqs, inplace=True)
    (y * g).sum().backward()
    leaf2 = leaf.detach().clone().requires_grad_(True)
    (ropelib.apply_rope(leaf2, freqs) * g).sum().backward()
    torch.testing.assert_close(leaf.grad, leaf2.grad, atol=0, rtol=0)
    before = leaf.detach().clone()
    with pytest.raises(ValueError, match="leaf"):   # refused before anything is written
        ropelib.apply_rope(leaf, freqs, inplace=True)
    assert torch.equal(leaf.detach(), before)


def test_inplace_qk(seeded):
    freqs = ropelib.rope_freqs(S, D)
    q, k = torch.randn(S, B, 4, D), torch.randn(S, B, 2, D)
    qo, ko = ropelib.apply_rope_qk(q, k, freqs)
    q2, k2 = q.clone(), k.clone()
    a, b = ropelib.apply_rope_qk(q2, k2, freqs, inplace=True)
    assert a is q2 and b is k2
    assert torch.equal(q2, qo) and torch.equal(k2, ko)


# --- poisoned outputs -----------------------------------------------------------------------

@pytest.fixture
def poisoned(monkeypatch):
    """Every output buffer that ropelib's operators allocate starts as NaN."""
    orig = ops._empty_like

    def nan_out(x, dtype=None):
        out = orig(x, dtype)
        out.fill_(float("nan"))
        return out

    monkeypatch.setattr(ops, "_empty_like", nan_out)
    return nan_out


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("rp", [0.5, 1.0])
@pytest.mark.parametrize("interleaved", [False, True])
def test_poisoned_outputs_fully_written(poisoned, layout, rp, interleaved, seeded):
    Dh = 24   # R = 12 or 24: non-power-of-two blocks have masked lanes
    freqs = ropelib.rope_freqs(20, Dh, rotary_percent=rp, interleaved=interleaved)
    if layout == "thd":
        x = torch.randn(7, 3, Dh)
        opts = dict(cu_seqlens=torch.tensor([0, 2, 7]))
    else:
        x = torch.randn((7, 3, 3, Dh) if layout == "sbhd" else (3, 7, 3, Dh))
        opts = dict(start_positions=torch.tensor([0, 5, 2]))
    x = x.to(torch.bfloat16).requires_grad_(True)
    y = ropelib.apply_rope(x, freqs, layout=layout, interleaved=interleaved, **opts)
    assert torch.isfinite(y).all(), "an output element was not written"
    y.sum().backward()
    assert torch.isfinite(x.grad).all(), "a gradient element was not written"
    q, k = ropelib.apply_rope_qk(x.detach(), x.detach()[..., :1, :].clone(), freqs,
                                 layout=layout, interleaved=interleaved, **opts)
    assert torch.isfinite(q).all() and torch.isfinite(k).all()


def test_poison_fixture_is_effective(poisoned):
    out = ops._empty_like(torch.zeros(2, 3))
    assert torch.isnan(out).all()


# --- apply_rope_qk --------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("k_table", [False, True])
def test_apply_rope_qk_equals_two_calls(layout, k_table, seeded):
    Hq, Hk = 4, 1
    freqs = ropelib.rope_freqs(12, D, rotary_percent=0.5)
    kf = ropelib.rope_freqs(12, D, rotary_percent=0.5, base=500.0) if k_table else None
    if layout == "thd":
        q, k = torch.randn(S, Hq, D), torch.randn(S, Hk, D)
        opts = dict(cu_seqlens=torch.tensor([0, 1, 6]), start_positions=torch.tensor([3, 0]))
    else:
        shp = (lambda h: (S, B, h, D)) if layout == "sbhd" else (lambda h: (B, S, h, D))
        q, k = torch.randn(shp(Hq)), torch.randn(shp(Hk))
        opts = dict(start_positions=torch.tensor([3, 0]))
    q, k = q.to(torch.bfloat16).requires_grad_(True), k.to(torch.bfloat16).requires_grad_(True)
    qo, ko = ropelib.apply_rope_qk(q, k, freqs, k_freqs=kf, layout=layout, **opts)
    q2 = q.detach().clone().requires_grad_(True)
    k2 = k.detach().clone().requires_grad_(True)
    qr = ropelib.apply_rope(q2, freqs, layout=layout, **opts)
    kr = ropelib.apply_rope(k2, kf if k_table else freqs, layout=layout, **opts)
    assert torch.equal(qo, qr) and torch.equal(ko, kr)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    ((qo * gq).sum() + (ko * gk).sum()).backward()
    ((qr * gq).sum() + (kr * gk).sum()).backward()
    assert torch.equal(q.grad, q2.grad) and torch.equal(k.grad, k2.grad)


def test_apply_rope_qk_grad_of_one_output_only(seeded):
    freqs = ropelib.rope_freqs(S, D)
    q = torch.randn(S, B, 2, D, requires_grad=True)
    k = torch.randn(S, B, 1, D, requires_grad=True)
    qo, ko = ropelib.apply_rope_qk(q, k, freqs)
    ko.sum().backward()
    kr = k.detach().double().requires_grad_(True)
    rope_reference(kr, freqs).sum().backward()
    torch.testing.assert_close(k.grad, kr.grad.float(), atol=1e-5, rtol=1e-5)
    assert q.grad is None or torch.count_nonzero(q.grad) == 0


def test_a_planned_backward_follows_the_gradients_strides(seeded):
    """One signature's forward, then gradients of other strides in turn (contiguous, expanded
    by a sum, permuted) and back: the eager route plans its backward per gradient strides
    (eager.PlannedRotation.reverse) and gives the operator's bits each time; so does q's and
    k's backward with either output outside the loss."""
    freqs = ropelib.rope_freqs(S, D)
    operator = torch.compile(lambda *t: ropelib.apply_rope(*t, freqs) if len(t) == 1
                             else ropelib.apply_rope_qk(*t, freqs), backend="eager",
                             fullgraph=True)
    x = torch.randn(S, B, H, D, requires_grad=True)
    grads = [torch.randn(S, B, H, D), torch.ones(()).expand(S, B, H, D),
             torch.randn(D, H, B, S).permute(3, 2, 1, 0)]
    for g in grads + grads[::-1]:
        got, = torch.autograd.grad(ropelib.apply_rope(x, freqs), x, g)
        want, = torch.autograd.grad(operator(x), x, g)
        assert torch.equal(got, want)
    q = torch.randn(S, B, H, D, requires_grad=True)
    k = torch.randn(S, B, 1, D, requires_grad=True)
    gq, gk = torch.randn(D, H, B, S).permute(3, 2, 1, 0), torch.randn(S, B, 1, D)
    for which in ((0, 1), (0,), (1,), (0, 1)):
        outs, want_outs = ropelib.apply_rope_qk(q, k, freqs), operator(q, k)
        got = torch.autograd.grad([outs[i] for i in which], (q, k), [(gq, gk)[i] for i in which])
        want = torch.autograd.grad([want_outs[i] for i in which], (q, k),
                                   [(gq, gk)[i] for i in which])
        assert all(torch.equal(a, b) for a, b in zip(got, want))


# --- RotaryEmbedding ------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_module_matches_reference_and_grows(layout, seeded):
    m = ropelib.RotaryEmbedding(D, rotary_percent=0.5, max_seq_len=4, layout=layout)
    assert m.table_length() == 4
    x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D))
    y = m(x)
    assert m.table_length() >= S, "a longer input grows the table (from its shape)"
    freqs = ropelib.rope_freqs(S, D, rotary_percent=0.5)
    torch.testing.assert_close(y, rope_reference(x, freqs, layout=layout), atol=1e-5, rtol=1e-5)
    sp = torch.tensor([9, 2])
    # index tensors are not read to grow the table: positions past it are refused (CPU index
    # tensors are checked) ...
    with pytest.raises(ValueError, match="start_positions"):
        m(x, start_positions=sp)
    # ... or, unchecked, come out NaN, never a silently clamped row
    with ropelib.set_index_checks("off"):
        bad = m(x, start_positions=sp)
    assert torch.isnan(bad).any()
    m = ropelib.RotaryEmbedding(D, rotary_percent=0.5, max_seq_len=S + 9, layout=layout)
    y2 = m(x, start_positions=sp)
    freqs = ropelib.rope_freqs(S + 9, D, rotary_percent=0.5)
    torch.testing.assert_close(y2, rope_reference(x, freqs, layout=layout, start_positions=sp),
                               atol=1e-5, rtol=1e-5)
    k = torch.randn_like(x[..., :1, :])
    qo, ko = m(x, k, start_positions=sp)
    assert torch.equal(qo, y2)
    torch.testing.assert_close(ko, rope_reference(k, freqs, layout=layout, start_positions=sp),
                               atol=1e-5, rtol=1e-5)


def test_module_thd_and_position_ids(seeded):
    m = ropelib.RotaryEmbedding(D, interleaved=True, max_seq_len=34, layout="thd")
    x = torch.randn(7, H, D)
    cu = torch.tensor([0, 3, 7])
    y = m(x, cu_seqlens=cu)
    freqs = ropelib.rope_freqs(8, D, interleaved=True)
    torch.testing.assert_close(y, rope_reference(x, freqs, layout="thd", interleaved=True,
                                                 cu_seqlens=cu), atol=1e-5, rtol=1e-5)
    pid = torch.tensor([0, 1, 2, 30, 31, 32, 33])
    y2 = m(x, position_ids=pid)
    freqs = ropelib.rope_freqs(34, D, interleaved=True)
    torch.testing.assert_close(y2, rope_reference(x, freqs, layout="thd", interleaved=True,
                                                  position_ids=pid), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="position_ids"):
        m(x, position_ids=pid + 1)


def test_module_yarn_uses_scaled_cos_sin(seeded):
    from ropelib.frequencies import YaRNScaling
    sc = YaRNScaling(factor=4.0, original_max_position_embeddings=8)
    m = ropelib.RotaryEmbedding(D, scaling=sc, max_seq_len=S, layout="bshd")
    x = torch.randn(B, S, H, D, requires_grad=True)
    y = m(x)
    cos, sin = ropelib.rope_cos_sin(S, D, scaling=sc)
    want = rope_reference(x.detach(), cos=cos, sin=sin, layout="bshd")
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    # YaRN's attention factor (> 1 for factor 4) scales the norm
    ratio = (y.norm(dim=-1) / x.detach().norm(dim=-1))
    assert (ratio > 1.0 + 1e-3).all()
    torch.testing.assert_close(ratio, ratio.flatten()[0].expand_as(ratio), atol=1e-4, rtol=1e-4)
    y.sum().backward()
    xr = x.detach().double().requires_grad_(True)
    rope_reference(xr, cos=cos, sin=sin, layout="bshd").sum().backward()
    torch.testing.assert_close(x.grad, xr.grad.float(), atol=1e-5, rtol=1e-5)


# --- corner cases ---------------------------------------------------------------------------

def test_thd_with_empty_sequences(seeded):
    cu = torch.tensor([0, 0, 3, 3, 8, 8], dtype=torch.int32)
    sp = torch.tensor([5, 1, 7, 2, 9])
    freqs = ropelib.rope_freqs(20, D)
    x = torch.randn(8, H, D, requires_grad=True)
    opts = dict(layout="thd", cu_seqlens=cu, start_positions=sp)
    y = ropelib.apply_rope(x, freqs, **opts)
    torch.testing.assert_close(y, rope_reference(x.detach(), freqs, **opts), atol=1e-5, rtol=1e-5)
    y.sum().backward()
    xr = x.detach().double().requires_grad_(True)
    rope_reference(xr, freqs, **opts).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_seq", [1, 63, 64, 65, 200])
def test_thd_many_sequences(n_seq, seeded):
    """The sequence search loads 64 evenly spaced cu_seqlens entries, then searches between
    two of them: around 64 sequences, and past it (a binary search after the pivots), with
    empty sequences among them, every token must find its own sequence."""
    lengths = torch.randint(0, 3, (n_seq,))
    lengths[-1] = 2
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    T = int(cu[-1])
    sp = torch.randint(0, 4, (n_seq,), dtype=torch.int32)
    freqs = ropelib.rope_freqs(8, D)
    x = torch.randn(T, 2, D)
    opts = dict(layout="thd", cu_seqlens=cu, start_positions=sp)
    torch.testing.assert_close(ropelib.apply_rope(x, freqs, **opts),
                               rope_reference(x, freqs, **opts), atol=1e-5, rtol=1e-5)


def test_non_contiguous_position_ids(seeded):
    freqs = ropelib.rope_freqs(30, D)
    pid = torch.randint(0, 30, (S, B)).t()          # [B, S] with strides (1, B)
    assert not pid.is_contiguous()
    x = torch.randn(B, S, H, D)
    y = ropelib.apply_rope(x, freqs, layout="bshd", position_ids=pid)
    torch.testing.assert_close(y, rope_reference(x, freqs, layout="bshd", position_ids=pid),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_inplace_other_layouts(layout, seeded):
    freqs = ropelib.rope_freqs(S, D, rotary_percent=0.5, interleaved=True)
    if layout == "thd":
        x = torch.randn(S, H, D)
        opts = dict(cu_seqlens=torch.tensor([0, 5, S]))
    else:
        x = torch.randn(B, S, H, D).transpose(1, 2).contiguous().transpose(1, 2)
        opts = {}
    y = ropelib.apply_rope(x, freqs, layout=layout, interleaved=True, **opts)
    ropelib.apply_rope(x, freqs, layout=layout, interleaved=True, inplace=True, **opts)
    assert torch.equal(x, y)


def test_empty_batch_and_sequence():
    freqs = ropelib.rope_freqs(4, D)
    for shape in [(0, B, H, D), (4, 0, H, D)]:
        x = torch.randn(shape, requires_grad=True)
        y = ropelib.apply_rope(x, freqs)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("route", ["eager", "operator"])
def test_an_empty_sequence_with_tables_or_positions_per_entry(route):
    # an empty tensor has any strides: a batch of empty tables ([B, 0, D], Hugging Face's
    # cos/sin) or of empty position ids ([B, 0]) is not refused as if it were strided
    freqs = ropelib.rope_freqs(4, D)
    compiled = (lambda f: torch.compile(f, backend="eager", fullgraph=True)) if route == "operator" \
        else (lambda f: f)
    x = torch.randn(B, 0, H, D, requires_grad=True)
    ids = torch.zeros(B, 0, dtype=torch.long)
    y = compiled(lambda x: ropelib.apply_rope(x, freqs, layout="bshd", position_ids=ids))(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    q, k = torch.randn(B, 0, H, D), torch.randn(B, 0, 1, D)
    cos, sin = torch.zeros(B, 0, D), torch.zeros(B, 0, D)
    for unsqueeze_dim, (qq, kk) in ((2, (q, k)), (1, (q.transpose(1, 2), k.transpose(1, 2)))):
        qo, ko = compiled(lambda a, b: ropelib.hf.apply_rotary_pos_emb(
            a, b, cos, sin, unsqueeze_dim=unsqueeze_dim))(qq, kk)
        assert qo.shape == qq.shape and ko.shape == kk.shape


def test_inplace_on_a_view_backpropagates_to_the_base(seeded):
    """In place on a strided view (the first D features of a wider tensor): autograd goes
    through the view (CopySlices) and the untouched half gets its gradient unchanged."""
    freqs = ropelib.rope_freqs(S, D)
    leaf = torch.randn(S, B, H, 2 * D, requires_grad=True)
    t = leaf.clone()
    ropelib.apply_rope(t[..., :D], freqs, inplace=True)
    g = torch.randn(S, B, H, 2 * D)
    (t * g).sum().backward()
    lr = leaf.detach().double().requires_grad_(True)
    out = torch.cat([rope_reference(lr[..., :D], freqs), lr[..., D:]], dim=-1)
    (out * g.double()).sum().backward()
    torch.testing.assert_close(leaf.grad, lr.grad.float(), atol=1e-5, rtol=1e-5)
    assert torch.equal(leaf.grad[..., D:], g[..., D:])


@pytest.mark.parametrize("kind", ["expanded", "last_dim_stride_2"])
def test_unusual_input_strides(kind, seeded):
    freqs = ropelib.rope_freqs(S, D, interleaved=True)
    if kind == "expanded":
        x = torch.randn(1, B, H, D).expand(S, B, H, D)      # stride 0 over the sequence
    else:
        x = torch.randn(S, B, H, 2 * D)[..., ::2]            # feature stride 2
    y = ropelib.apply_rope(x, freqs, interleaved=True)
    assert y.is_contiguous()
    torch.testing.assert_close(y, rope_reference(x, freqs, interleaved=True), atol=1e-5, rtol=1e-5)



def test_an_empty_sequence_reads_no_rows_of_the_table():
    # start positions past the table with nothing to rotate: accepted, as Transformer Engine's
    # own check does (ropelib.reference.te_unfused), in every layout and through the drop-in
    x = torch.randn(0, B, H, D)
    freqs = ropelib.rope_freqs(4, D)
    starts = torch.tensor([0, 6] + [1] * (B - 2))
    assert reference.te_unfused(x, freqs, "sbhd", starts).shape == x.shape
    assert ropelib.apply_rope(x, freqs, start_positions=starts).shape == x.shape
    for fused in (True, False):
        assert ropelib.te.apply_rotary_pos_emb(x, freqs, start_positions=starts,
                                               fused=fused).shape == x.shape
    with pytest.raises(ValueError, match="start_positions"):      # one token: rows are read
        ropelib.apply_rope(torch.randn(1, B, H, D), freqs, start_positions=starts)
