"""The drop-ins: ropelib.te (Transformer Engine 2.x) and ropelib.hf (Hugging Face).

* te.apply_rotary_pos_emb(fused=False) is TE's plain-PyTorch path: equal, bit for bit, to
  reference.te_unfused (cos/sin rounded to the input dtype, math in the input dtype).
* te.apply_rotary_pos_emb(fused=True) runs the kernel: within about an ulp of the fp64 reference
  and of te_fused_emulation, and within the unfused path's own rounding error of fused=False.
* te.apply_fused_qkv_rotary_pos_emb: q/k/v of a packed GQA tensor, forward and backward, against a
  manual split + te_unfused/reference; v is an exact copy.
* hf.apply_rotary_pos_emb: against HF's formula written out here, and against
  transformers' own function when transformers is installed.
"""
import pytest
import torch

import ropelib
from ropelib import te as rte
from ropelib import hf as rhf
from ropelib.reference import rope_reference, rotate_half, te_fused_emulation, te_unfused

S, B, H, D = 8, 2, 2, 16
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2**-10), torch.bfloat16: (1e-2, 2**-7)}
# TE's unfused path rounds cos/sin and every intermediate to the input dtype: a few ulps.
UNFUSED_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (4e-3, 4 * 2**-10),
               torch.bfloat16: (4e-2, 4 * 2**-7)}


def _te_case(layout, dtype, cp, start, interleaved):
    cp_size, cp_rank = cp
    opts = dict(tensor_format=layout, interleaved=interleaved, cp_size=cp_size, cp_rank=cp_rank)
    if layout == "thd":
        cu = torch.tensor([0, 4, 12, 24], dtype=torch.int32) if cp_size > 1 else \
            torch.tensor([0, 3, 8, 16], dtype=torch.int32)
        T = int(cu[-1]) // cp_size
        t = torch.randn(T, H, D).to(dtype)
        opts["cu_seqlens"] = cu
        if start:
            opts["start_positions"] = torch.tensor([1, 0, 3])
        P = 24 + 3 + 4
    else:
        t = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D)).to(dtype)
        if start:
            opts["start_positions"] = torch.tensor([2, 5])
        P = S * cp_size + 5 + 3    # start + seq_len * cp_size fits
    freqs = ropelib.rope_freqs(P, D, rotary_percent=0.5, interleaved=interleaved)
    return t, freqs, opts


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cp", [(1, 0), (2, 1)])
@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_te_apply_rotary_pos_emb(layout, dtype, cp, start, interleaved, seeded):
    t, freqs, opts = _te_case(layout, dtype, cp, start, interleaved)
    unf = rte.apply_rotary_pos_emb(t, freqs, fused=False, **opts)
    assert torch.equal(unf, te_unfused(t, freqs, **opts))
    tt = t.clone().requires_grad_(True)
    fus = rte.apply_rotary_pos_emb(tt, freqs, fused=True, **opts)
    ref_opts = dict(layout=opts["tensor_format"], interleaved=interleaved,
                    start_positions=opts.get("start_positions"), cu_seqlens=opts.get("cu_seqlens"),
                    cp_size=opts["cp_size"], cp_rank=opts["cp_rank"])
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(fus, rope_reference(t, freqs, **ref_opts), atol=atol, rtol=rtol)
    torch.testing.assert_close(fus, te_fused_emulation(t, freqs, **opts), atol=atol, rtol=rtol)
    atol, rtol = UNFUSED_TOL[dtype]
    torch.testing.assert_close(fus, unf, atol=atol, rtol=rtol)
    # backward of both paths
    g = torch.randn_like(fus)
    (fus * g).sum().backward()
    tu = t.clone().requires_grad_(True)
    (rte.apply_rotary_pos_emb(tu, freqs, fused=False, **opts) * g).sum().backward()
    torch.testing.assert_close(tt.grad, tu.grad, atol=atol, rtol=rtol)
    tr = t.double().requires_grad_(True)
    (rope_reference(tr, freqs, **ref_opts) * g.double()).sum().backward()
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(tt.grad, tr.grad.to(dtype), atol=atol, rtol=rtol)


def test_te_defaults_match_te_signature():
    import inspect
    sig = inspect.signature(rte.apply_rotary_pos_emb)
    assert list(sig.parameters) == ["t", "freqs", "tensor_format", "start_positions",
                                    "interleaved", "fused", "cu_seqlens", "cp_size", "cp_rank"]
    d = {k: v.default for k, v in sig.parameters.items()}
    assert d["tensor_format"] == "sbhd" and d["fused"] is False and d["interleaved"] is False
    assert d["start_positions"] is None and d["cp_size"] == 1 and d["cp_rank"] == 0
    sig = inspect.signature(rte.apply_fused_qkv_rotary_pos_emb)
    assert list(sig.parameters)[:5] == ["qkv", "q_freqs", "k_freqs", "qkv_split_arg_list",
                                        "tensor_format"]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_te_ignores_cu_seqlens_outside_thd(layout, fused, seeded):
    """TE reads cu_seqlens only for "thd" (its own test passes one with "bshd"): so does the drop-in."""
    x = torch.randn(S, B, H, D) if layout == "sbhd" else torch.randn(B, S, H, D)
    freqs = ropelib.rope_freqs(2 * S, D)
    cu = torch.tensor([0, S, 2 * S], dtype=torch.int32)
    for cp_size, cp_rank in ((1, 0), (2, 1)):
        opts = dict(tensor_format=layout, fused=fused, cp_size=cp_size, cp_rank=cp_rank)
        assert torch.equal(rte.apply_rotary_pos_emb(x, freqs, cu_seqlens=cu, **opts),
                           rte.apply_rotary_pos_emb(x, freqs, **opts))


def test_te_thd_requires_cu_seqlens():
    t = torch.randn(8, H, D)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rte.apply_rotary_pos_emb(t, ropelib.rope_freqs(8, D), tensor_format="thd", fused=True)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rte.apply_rotary_pos_emb(t, ropelib.rope_freqs(8, D), tensor_format="thd", fused=False)


# --- fused QKV ------------------------------------------------------------------------------

def _split_qkv(qkv, split, layout):
    dq, dk, dv = split
    n_q = dq // dk
    q = qkv[..., :dq]
    k = qkv[..., dq:dq + dk]
    v = qkv[..., dq + dk:]
    lead = q.shape[:2]
    G = qkv.shape[2]
    q = q.reshape(*lead, G * n_q, dk)
    return q, k, v


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
@pytest.mark.parametrize("split", [[32, 16, 16], [16, 16, 16], [64, 16, 8]])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("opt", ["plain", "start", "cp", "start_cp"])
def test_fused_qkv(layout, split, interleaved, opt, seeded):
    G = 2
    dtype = torch.bfloat16
    dq, dk, dv = split
    shape = (S, B, G, dq + dk + dv) if layout == "sbhd" else (B, S, G, dq + dk + dv)
    qkv = torch.randn(shape).to(dtype)
    opts = dict(tensor_format=layout, interleaved=interleaved)
    if opt in ("start", "start_cp"):
        opts["start_positions"] = torch.tensor([3, 1])
    if opt in ("cp", "start_cp"):
        opts.update(cp_size=2, cp_rank=1)
    P = 2 * S + 4
    qf = ropelib.rope_freqs(P, dk, rotary_percent=0.5, interleaved=interleaved)
    kf = ropelib.rope_freqs(P, dk, rotary_percent=0.5, interleaved=interleaved, base=100.0)
    x = qkv.clone().requires_grad_(True)
    q, k, v = rte.apply_fused_qkv_rotary_pos_emb(x, qf, kf, split, **opts)
    q_in, k_in, v_in = _split_qkv(qkv, split, layout)
    assert q.shape == q_in.shape and k.shape == k_in.shape and v.shape == v_in.shape
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert torch.equal(v, v_in)
    ref_opts = dict(layout=layout, interleaved=interleaved,
                    start_positions=opts.get("start_positions"),
                    cp_size=opts.get("cp_size", 1), cp_rank=opts.get("cp_rank", 0))
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q, rope_reference(q_in, qf, **ref_opts), atol=atol, rtol=rtol)
    torch.testing.assert_close(k, rope_reference(k_in, kf, **ref_opts), atol=atol, rtol=rtol)
    ua, ur = UNFUSED_TOL[dtype]
    torch.testing.assert_close(q, te_unfused(q_in, qf, **opts), atol=ua, rtol=ur)
    torch.testing.assert_close(k, te_unfused(k_in, kf, **opts), atol=ua, rtol=ur)
    # backward vs autograd of a manual split + reference
    gq, gk, gv = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    ((q * gq).sum() + (k * gk).sum() + (v * gv).sum()).backward()
    xr = qkv.double().requires_grad_(True)
    qr, kr, vr = _split_qkv(xr, split, layout)
    loss = (rope_reference(qr, qf, **ref_opts) * gq.double()).sum() \
        + (rope_reference(kr, kf, **ref_opts) * gk.double()).sum() + (vr * gv.double()).sum()
    loss.backward()
    torch.testing.assert_close(x.grad, xr.grad.to(dtype), atol=atol, rtol=rtol)


def test_fused_qkv_grad_of_q_only(seeded):
    split = [32, 16, 16]
    qkv = torch.randn(S, B, 2, 64, requires_grad=True)
    f = ropelib.rope_freqs(S, 16)
    q, k, v = rte.apply_fused_qkv_rotary_pos_emb(qkv, f, f, split)
    q.sum().backward()
    xr = qkv.detach().double().requires_grad_(True)
    qr, _, _ = _split_qkv(xr, split, "sbhd")
    rope_reference(qr, f).sum().backward()
    torch.testing.assert_close(qkv.grad, xr.grad.float(), atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(qkv.grad[..., 32:]) == 0


# --- Hugging Face ---------------------------------------------------------------------------

def hf_formula(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb, written out."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _hf_inputs(unsqueeze_dim, cos_kind, dtype, cos_dtype):
    Hq, Hk = 4, 2
    shp = (lambda h: (B, h, S, D)) if unsqueeze_dim == 1 else (lambda h: (B, S, h, D))
    q, k = torch.randn(shp(Hq)).to(dtype), torch.randn(shp(Hk)).to(dtype)
    cos, sin = ropelib.rope_cos_sin(3 * S, D, dtype=torch.float64)
    pos = torch.randint(0, 3 * S, (B, S))
    if cos_kind == "bsd":
        c, s = cos[pos], sin[pos]          # [B, S, D], gathered as HF's rotary module does
    else:
        c, s = cos[5:5 + S], sin[5:5 + S]  # [S, D]
    return q, k, c.to(cos_dtype), s.to(cos_dtype)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("cos_kind", ["bsd", "sd"])
@pytest.mark.parametrize("dtype,cos_dtype", [(torch.float32, torch.float32),
                                             (torch.bfloat16, torch.bfloat16),
                                             (torch.bfloat16, torch.float32)])
def test_hf_against_formula(unsqueeze_dim, cos_kind, dtype, cos_dtype, seeded):
    q, k, c, s = _hf_inputs(unsqueeze_dim, cos_kind, dtype, cos_dtype)
    qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    qo, ko = rhf.apply_rotary_pos_emb(qq, kk, c, s, unsqueeze_dim=unsqueeze_dim)
    out_dtype = torch.promote_types(dtype, cos_dtype)
    assert qo.dtype == out_dtype and ko.dtype == out_dtype
    assert qo.shape == q.shape and ko.shape == k.shape
    # HF's formula on [B or 1, S, D] tables, computed in fp64 and rounded once
    c3, s3 = (c, s) if c.dim() == 3 else (c[None], s[None])
    qr, kr = q.double().requires_grad_(True), k.double().requires_grad_(True)
    qw, kw = hf_formula(qr, kr, c3.double(), s3.double(), unsqueeze_dim)
    atol, rtol = TOL[out_dtype]
    torch.testing.assert_close(qo, qw.to(out_dtype), atol=atol, rtol=rtol)
    torch.testing.assert_close(ko, kw.to(out_dtype), atol=atol, rtol=rtol)
    # HF's own arithmetic in the input dtype is within a few ulps
    qh, kh = hf_formula(q, k, c3, s3, unsqueeze_dim)
    ua, ur = UNFUSED_TOL[out_dtype]
    torch.testing.assert_close(qo, qh, atol=ua, rtol=ur)
    torch.testing.assert_close(ko, kh, atol=ua, rtol=ur)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    ((qo * gq).sum() + (ko * gk).sum()).backward()
    ((qw * gq.double()).sum() + (kw * gk.double()).sum()).backward()
    atol, rtol = TOL[dtype]
    assert qq.grad.dtype == dtype
    torch.testing.assert_close(qq.grad, qr.grad.to(dtype), atol=atol, rtol=rtol)
    torch.testing.assert_close(kk.grad, kr.grad.to(dtype), atol=atol, rtol=rtol)


def test_hf_position_ids_is_ignored(seeded):
    q, k, c, s = _hf_inputs(1, "bsd", torch.float32, torch.float32)
    a = rhf.apply_rotary_pos_emb(q, k, c, s)
    b = rhf.apply_rotary_pos_emb(q, k, c, s, position_ids=torch.arange(S)[None])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_against_transformers(unsqueeze_dim, dtype, seeded):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k, c, s = _hf_inputs(unsqueeze_dim, "bsd", dtype, dtype)
    qo, ko = rhf.apply_rotary_pos_emb(q, k, c, s, unsqueeze_dim=unsqueeze_dim)
    qh, kh = llama.apply_rotary_pos_emb(q, k, c, s, unsqueeze_dim=unsqueeze_dim)
    if dtype == torch.float32:
        torch.testing.assert_close(qo, qh, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ko, kh, atol=1e-5, rtol=1e-5)
    else:
        ua, ur = UNFUSED_TOL[dtype]
        torch.testing.assert_close(qo, qh, atol=ua, rtol=ur)
        torch.testing.assert_close(ko, kh, atol=ua, rtol=ur)


def test_hf_non_contiguous_q_from_projection(seeded):
    """Llama's q: proj(x).view(B, S, H, D).transpose(1, 2) -- a strided [B, H, S, D] view."""
    hq, hk = 4, 2
    q = torch.randn(B, S, hq * D).view(B, S, hq, D).transpose(1, 2)
    k = torch.randn(B, S, hk * D).view(B, S, hk, D).transpose(1, 2)
    assert not q.is_contiguous()
    cos, sin = ropelib.rope_cos_sin(S, D)
    c, s = cos[None].expand(B, S, D), sin[None].expand(B, S, D)
    qo, ko = rhf.apply_rotary_pos_emb(q, k, c, s)
    qw, kw = hf_formula(q.double(), k.double(), c.double(), s.double())
    torch.testing.assert_close(qo, qw.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ko, kw.float(), atol=1e-5, rtol=1e-5)


def test_fused_qkv_grad_of_v_only(seeded):
    split = [32, 16, 8]
    qkv = torch.randn(B, S, 2, 56, requires_grad=True)
    f = ropelib.rope_freqs(S, 16)
    q, k, v = rte.apply_fused_qkv_rotary_pos_emb(qkv, f, f, split, tensor_format="bshd")
    g = torch.randn_like(v)
    (v * g).sum().backward()
    assert torch.count_nonzero(qkv.grad[..., :48]) == 0
    assert torch.equal(qkv.grad[..., 48:], g)


def test_hf_promoted_fp64_output_is_computed_in_fp64():
    # HF's q * cos with fp32 q and fp64 cos is fp64 arithmetic; the drop-in must not round to fp32.
    from ropelib.hf import apply_rotary_pos_emb
    from ropelib.reference import rotate_half
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k = torch.randn(1, 1, 5, 8, generator=g)
    ang = torch.randn(1, 5, 8, generator=g, dtype=torch.float64) * 100
    c, s = ang.cos(), ang.sin()
    qe, ke = apply_rotary_pos_emb(q, k, c, s)
    assert qe.dtype == torch.float64
    want = q * c.unsqueeze(1) + rotate_half(q) * s.unsqueeze(1)
    assert (qe - want).abs().max().item() < 1e-12
