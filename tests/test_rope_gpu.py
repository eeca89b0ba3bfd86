"""GPU-only tests of the finished kernel (marked `gpu`; skipped without CUDA or with the interpreter).

* large shapes, every feature, forward and backward, against the reference computed in fp32 on
  the GPU (in head chunks, to bound memory);
* tensors with more than 2^31 elements (64-bit offsets) on every route, and through the
  multi-axis and QK-norm kernels: slices at the start, across the boundary and at the end;
* parity with the real Transformer Engine when `transformer_engine` imports;
* the direct launcher (kernels/direct.py) gives the same bits as Triton's own launch path, also
  for misaligned views;
* CUDA-graph capture and replay equals eager; decode sizes.

Run on a GPU: `pytest -q -m gpu tests/test_rope_gpu.py`
"""
import pytest
import torch

import ropelib
from ropelib.reference import rope_reference, te_unfused
from routes import forced  # noqa: E402  (tests/routes.py)

pytestmark = pytest.mark.gpu

BF16 = (1e-2, 2**-7)
DEV = "cuda"


def _ref_chunked(x, freqs=None, *, head_chunk=8, **opts):
    """rope_reference in fp32 on the GPU, a few heads at a time (heads are independent)."""
    hdim = 1 if opts.get("layout") == "thd" else 2
    out = torch.empty_like(x)
    for h0 in range(0, x.shape[hdim], head_chunk):
        sl = [slice(None)] * x.dim()
        sl[hdim] = slice(h0, h0 + head_chunk)
        out[tuple(sl)] = rope_reference(x[tuple(sl)], freqs, compute_dtype=torch.float32, **opts)
    return out


FEATURES = [
    dict(name="plain"),
    dict(name="interleaved-partial", interleaved=True, rotary_percent=0.5),
    dict(name="start-transposed", start=True, transpose=(0, 1)),
    dict(name="cp2r1-interleaved", cp=(2, 1), interleaved=True),
    dict(name="bshd-start-partial", layout="bshd", start=True, rotary_percent=0.5, transpose=(2, 3)),
    dict(name="thd-cp2-start", layout="thd", cp=(2, 0), start=True),
    dict(name="cos-sin-table", table=True, interleaved=True),
]


@pytest.mark.parametrize("feat", FEATURES, ids=[f["name"] for f in FEATURES])
def test_large_all_features(feat):
    torch.manual_seed(0)
    s, b, h, d = 4096, 4, 32, 128
    layout = feat.get("layout", "sbhd")
    interleaved = feat.get("interleaved", False)
    rp = feat.get("rotary_percent", 1.0)
    cp_size, cp_rank = feat.get("cp", (1, 0))
    P = s * cp_size + 4096
    freqs = ropelib.rope_freqs(P, d, rotary_percent=rp, interleaved=interleaved, device=DEV)
    table = dict(freqs=freqs)
    if feat.get("table"):
        c, si = ropelib.rope_cos_sin(P, d, rotary_percent=rp, interleaved=interleaved, device=DEV)
        table = dict(cos=c, sin=si)
    opts = dict(layout=layout, interleaved=interleaved, cp_size=cp_size, cp_rank=cp_rank)
    if layout == "thd":
        lens = torch.tensor([1024, 4096, 8192, 3072, 2048 * cp_size - 0], device=DEV)
        lens = (lens // (2 * cp_size)) * (2 * cp_size)
        cu = torch.cat([torch.zeros(1, device=DEV, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
        T = int(cu[-1]) // cp_size
        x = torch.randn(T, h, d, device=DEV, dtype=torch.bfloat16)
        opts["cu_seqlens"] = cu
        if feat.get("start"):
            opts["start_positions"] = torch.randint(0, 2048, (len(lens),), device=DEV)
    else:
        shape = (s, b, h, d) if layout == "sbhd" else (b, s, h, d)
        x = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
        if feat.get("start"):
            opts["start_positions"] = torch.randint(0, 4096, (b,), device=DEV)
    if feat.get("transpose"):
        t = feat["transpose"]
        x = x.transpose(*t).contiguous().transpose(*t)
    x.requires_grad_(True)
    y = ropelib.apply_rope(x, **table, **opts)
    want = _ref_chunked(x.detach(), **table, **opts)
    torch.testing.assert_close(y, want, atol=BF16[0], rtol=BF16[1])
    g = torch.randn_like(y)
    y.backward(g)
    # backward = rotation by -theta: the adjoint; check <R x, g> == <x, R^T g> and vs autograd
    # of the fp32 reference on a slice of heads
    hdim = 1 if layout == "thd" else 2
    xs = x.detach().narrow(hdim, 0, 4).float().requires_grad_(True)
    gs = g.narrow(hdim, 0, 4).float()
    (rope_reference(xs, **table, compute_dtype=torch.float32, **opts) * gs).sum().backward()
    torch.testing.assert_close(x.grad.narrow(hdim, 0, 4), xs.grad.to(torch.bfloat16),
                               atol=BF16[0], rtol=BF16[1])
    del y, want, g


@pytest.fixture(params=["auto", "finished", "two-pass"])
def route(request):
    """The route a call takes: the planner's choice, or one forced (tests/routes.py)."""
    with forced(request.param):
        yield request.param


def test_more_than_2_31_elements(route):
    h, d = 32, 128
    s = 2**31 // (h * d) + 64          # 2^31 + 64 * 4096 elements, ~4.3 GB in bf16
    free, _ = torch.cuda.mem_get_info()
    if free < 16 * 2**30:
        pytest.skip(f"needs ~16 GB of free GPU memory, {free / 2**30:.1f} GB free")
    freqs = ropelib.rope_freqs(s, d, device=DEV)
    x = torch.empty(s, 1, h, d, device=DEV, dtype=torch.bfloat16)
    x.normal_()
    assert x.numel() > 2**31
    x.requires_grad_(True)
    y = ropelib.apply_rope(x, freqs)
    for lo in (0, 2**31 // (h * d) - 4, s - 8):   # start, across the 2^31 boundary, the end
        sl = slice(lo, lo + 8)
        want = rope_reference(x.detach()[sl], position_ids=torch.arange(lo, lo + 8, device=DEV),
                              freqs=freqs, compute_dtype=torch.float32)
        torch.testing.assert_close(y[sl], want, atol=BF16[0], rtol=BF16[1])
    y.sum().backward()   # grad_output: expanded ones
    del y
    for lo in (2**31 // (h * d) - 4, s - 8):
        sl = slice(lo, lo + 8)
        xs = x.detach()[sl].float().requires_grad_(True)
        rope_reference(xs, position_ids=torch.arange(lo, lo + 8, device=DEV), freqs=freqs,
                       compute_dtype=torch.float32).sum().backward()
        torch.testing.assert_close(x.grad[sl], xs.grad.to(torch.bfloat16), atol=BF16[0], rtol=BF16[1])
    del x
    torch.cuda.empty_cache()


def test_q_and_k_with_q_past_2_31_elements(route):
    """q past 2^31 elements and k beside it: the flat pass's programs for k come after q's, so
    the count of q's programs must not overflow (it once did, and nothing was written)."""
    hq, hk, d = 32, 8, 128
    s = 2**31 // (hq * d) + 64
    free, _ = torch.cuda.mem_get_info()
    if free < 24 * 2**30:
        pytest.skip(f"needs ~24 GB of free GPU memory, {free / 2**30:.1f} GB free")
    freqs = ropelib.rope_freqs(s, d, device=DEV)
    q = torch.empty(s, 1, hq, d, device=DEV, dtype=torch.bfloat16).normal_()
    k = torch.empty(s, 1, hk, d, device=DEV, dtype=torch.bfloat16).normal_()
    qo, ko = ropelib.apply_rope_qk(q, k, freqs)
    for lo in (0, 2**31 // (hq * d) - 4, s - 8):
        sl = slice(lo, lo + 8)
        ids = torch.arange(lo, lo + 8, device=DEV)
        for got, x in ((qo, q), (ko, k)):
            want = rope_reference(x[sl], position_ids=ids, freqs=freqs, compute_dtype=torch.float32)
            torch.testing.assert_close(got[sl], want, atol=BF16[0], rtol=BF16[1])
    del q, k, qo, ko
    torch.cuda.empty_cache()


# --- the real Transformer Engine ------------------------------------------------------------

def _te():
    """TE's RoPE module: transformer_engine.pytorch.attention.rope (TE >= 2.2), else the
    attention module of older releases; skipped when TE is not installed."""
    pytest.importorskip("transformer_engine.pytorch", reason="transformer_engine is not installed")
    import importlib
    for name in ("transformer_engine.pytorch.attention.rope", "transformer_engine.pytorch.attention"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "apply_rotary_pos_emb"):
            return mod
    pytest.skip("this transformer_engine has no apply_rotary_pos_emb where expected")


def _te_call(fn, *args, **kwargs):
    """Call TE; an option this TE version does not support skips (with TE's message)."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, NotImplementedError) as e:
        pytest.skip(f"transformer_engine does not support this case: {e}")
    except AssertionError as e:   # older TE asserts "... is not supported!" for some options
        if "not supported" not in str(e):
            raise
        pytest.skip(f"this transformer_engine refuses this case: {e}")


TE_CASES = [
    dict(layout="sbhd"), dict(layout="bshd"), dict(layout="sbhd", interleaved=True),
    dict(layout="bshd", start=True), dict(layout="sbhd", cp=(2, 1)),
    dict(layout="thd"), dict(layout="thd", start=True), dict(layout="thd", cp=(2, 1)),
    dict(layout="sbhd", rotary_percent=0.5, interleaved=True, start=True),
    # start_positions with context parallelism: the start offsets the whole global sequence
    dict(layout="sbhd", cp=(2, 1), start=True), dict(layout="bshd", cp=(2, 0), start=True),
    dict(layout="thd", cp=(2, 1), start=True, interleaved=True),
]


@pytest.mark.parametrize("case", TE_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_parity_with_transformer_engine(case, dtype):
    te_rope = _te()
    torch.manual_seed(1)
    s, b, h, d = 512, 2, 8, 128
    layout = case["layout"]
    interleaved = case.get("interleaved", False)
    cp_size, cp_rank = case.get("cp", (1, 0))
    freqs = ropelib.rope_freqs(s * cp_size + 256, d, rotary_percent=case.get("rotary_percent", 1.0),
                               interleaved=interleaved, device=DEV)
    opts = dict(tensor_format=layout, interleaved=interleaved, cp_size=cp_size, cp_rank=cp_rank)
    if layout == "thd":
        cu = torch.tensor([0, 64, 320, 512 * cp_size], device=DEV, dtype=torch.int32)
        t = torch.randn(int(cu[-1]) // cp_size, h, d, device=DEV, dtype=dtype)
        opts["cu_seqlens"] = cu
        if case.get("start"):
            opts["start_positions"] = torch.randint(0, 128, (3,), device=DEV, dtype=torch.int32)
    else:
        t = torch.randn((s, b, h, d) if layout == "sbhd" else (b, s, h, d), device=DEV, dtype=dtype)
        if case.get("start"):
            opts["start_positions"] = torch.randint(0, 128, (b,), device=DEV, dtype=torch.int32)
    a = t.clone().requires_grad_(True)
    c = t.clone().requires_grad_(True)
    ya = ropelib.te.apply_rotary_pos_emb(a, freqs, fused=True, **opts)
    yc = _te_call(te_rope.apply_rotary_pos_emb, c, freqs, fused=True, **opts)
    tol = BF16 if dtype == torch.bfloat16 else (1e-5, 1e-5)
    torch.testing.assert_close(ya, yc, atol=tol[0], rtol=tol[1])
    g = torch.randn_like(ya)
    ya.backward(g)
    yc.backward(g)
    torch.testing.assert_close(a.grad, c.grad, atol=tol[0], rtol=tol[1])
    # unfused paths: bit-identical (same PyTorch ops)
    ua = ropelib.te.apply_rotary_pos_emb(t, freqs, fused=False, **opts)
    uc = _te_call(te_rope.apply_rotary_pos_emb, t, freqs, fused=False, **opts)
    torch.testing.assert_close(ua, uc, atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_qkv_parity_with_transformer_engine(layout, interleaved):
    te_rope = _te()
    if not hasattr(te_rope, "apply_fused_qkv_rotary_pos_emb"):
        pytest.skip("this Transformer Engine has no apply_fused_qkv_rotary_pos_emb")
    torch.manual_seed(2)
    s, b, g, dk = 256, 2, 4, 64
    split = [4 * dk, dk, dk]
    qkv = torch.randn((s, b, g, sum(split)) if layout == "sbhd" else (b, s, g, sum(split)),
                      device=DEV, dtype=torch.bfloat16)
    qf = ropelib.rope_freqs(s, dk, interleaved=interleaved, device=DEV)
    kf = ropelib.rope_freqs(s, dk, interleaved=interleaved, base=500.0, device=DEV)
    a, c = qkv.clone().requires_grad_(True), qkv.clone().requires_grad_(True)
    outs_a = ropelib.te.apply_fused_qkv_rotary_pos_emb(a, qf, kf, split, tensor_format=layout,
                                                       interleaved=interleaved)
    outs_c = _te_call(te_rope.apply_fused_qkv_rotary_pos_emb, c, qf, kf, split,
                      tensor_format=layout, interleaved=interleaved)
    for oa, oc in zip(outs_a, outs_c):
        torch.testing.assert_close(oa, oc, atol=BF16[0], rtol=BF16[1])
    gs = [torch.randn_like(o) for o in outs_a]
    sum((o * gg).sum() for o, gg in zip(outs_a, gs)).backward()
    sum((o * gg).sum() for o, gg in zip(outs_c, gs)).backward()
    torch.testing.assert_close(a.grad, c.grad, atol=BF16[0], rtol=BF16[1])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_qkv_equals_separate_launches_bit_for_bit(interleaved, dtype):
    """A packed-QKV launch and plain launches on q and k views round every element the same
    way (each output is one explicit fma), forward and backward: Transformer Engine's own test
    compares the two with fp16's tight default tolerance."""
    torch.manual_seed(4)
    s, b, g, dk = 4096, 2, 64, 256
    split = [4 * dk, dk, dk]
    qkv = torch.rand((s, b, g, sum(split)), device=DEV, dtype=dtype)
    freqs = ropelib.rope_freqs(s, dk, interleaved=interleaved, device=DEV)
    a = qkv.clone().requires_grad_(True)
    q, k, v = ropelib.te.apply_fused_qkv_rotary_pos_emb(a, freqs, freqs, split,
                                                        interleaved=interleaved)
    c = qkv.clone().requires_grad_(True)
    cq, ck, cv = torch.split(c, split, dim=3)
    q2 = ropelib.te.apply_rotary_pos_emb(cq.reshape(s, b, 4 * g, dk), freqs, fused=True,
                                         interleaved=interleaved)
    k2 = ropelib.te.apply_rotary_pos_emb(ck, freqs, fused=True, interleaved=interleaved)
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, cv)
    (q.sum() + k.sum() + v.sum()).backward()
    (q2.sum() + k2.sum() + cv.sum()).backward()
    assert torch.equal(a.grad, c.grad)


# --- direct launcher ------------------------------------------------------------------------

def test_direct_launch_bit_identical_to_triton_launch(monkeypatch):
    from ropelib import eager
    from ropelib.kernels import launch as L
    torch.manual_seed(3)
    s, b, h, d = 64, 2, 8, 128
    freqs = ropelib.rope_freqs(s + 8, d, device=DEV)
    base = torch.randn(s * b * h * d + 8, device=DEV, dtype=torch.bfloat16)
    aligned = base[:s * b * h * d].view(s, b, h, d)
    misaligned = base[1:1 + s * b * h * d].view(s, b, h, d)   # 2-byte offset: not 16-byte aligned
    assert misaligned.data_ptr() % 16 != 0
    sp = torch.tensor([3, 8], device=DEV)

    def results():
        eager.SIGNATURES.clear()
        out = []
        for x in (aligned, misaligned, aligned, misaligned):
            y = ropelib.apply_rope(x, freqs, start_positions=sp)
            out.append(y)
            xg = x.clone().requires_grad_(True)
            (ropelib.apply_rope(xg, freqs, start_positions=sp) * y).sum().backward()
            out.append(xg.grad)
        return out

    monkeypatch.setattr(L.TOKENS, "enabled", False)
    through_triton = results()
    monkeypatch.setattr(L.TOKENS, "enabled", True)
    monkeypatch.setattr(L.TOKENS, "compiled", {})
    first = results()           # asks Triton for each compiled kernel
    assert len(L.TOKENS.compiled) >= 2, "aligned and misaligned pointers are different kernels"
    direct = results()          # straight to the compiled kernels
    assert L.TOKENS.enabled, "the direct launcher fell back to Triton's path"
    for t, f1, f2 in zip(through_triton, first, direct):
        assert torch.equal(t, f1) and torch.equal(t, f2)
    y_mis = ropelib.apply_rope(misaligned, freqs, start_positions=sp)
    y_cpy = ropelib.apply_rope(misaligned.contiguous().clone(), freqs, start_positions=sp)
    assert torch.equal(y_mis, y_cpy)


def test_operator_path_equals_eager_route():
    """torch.ops.ropelib.rope (the dispatcher, then the same planner and kernel) gives the bits
    of the eager route."""
    torch.manual_seed(6)
    x = torch.randn(128, 4, 8, 128, device=DEV, dtype=torch.bfloat16)
    f = ropelib.rope_freqs(256, 128, device=DEV)
    sp = torch.tensor([0, 5, 9, 100], device=DEV)
    y = ropelib.apply_rope(x, f, start_positions=sp)
    z = torch.ops.ropelib.rope(x, f[:, 0, 0], None, None, None, sp, "sbhd", False, 1, 0, False,
                               None)
    assert torch.equal(y, z)


# --- CUDA graphs ----------------------------------------------------------------------------

def test_cuda_graph_capture_and_replay():
    torch.manual_seed(4)
    s, b, h, d = 1, 8, 32, 128   # a decode step
    P = 4096
    freqs = ropelib.rope_freqs(P, d, device=DEV)
    x = torch.randn(s, b, h, d, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(s, b, 8, d, device=DEV, dtype=torch.bfloat16)
    sp = torch.randint(0, P - 1, (b,), device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            ropelib.apply_rope(x, freqs, start_positions=sp)
            ropelib.apply_rope_qk(x, k, freqs, start_positions=sp)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ropelib.apply_rope(x, freqs, start_positions=sp)
        qo, ko = ropelib.apply_rope_qk(x, k, freqs, start_positions=sp)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        k.copy_(torch.randn_like(k))
        sp.copy_(torch.randint(0, P - 1, (b,), device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, ropelib.apply_rope(x, freqs, start_positions=sp))
        eq, ek = ropelib.apply_rope_qk(x, k, freqs, start_positions=sp)
        assert torch.equal(qo, eq) and torch.equal(ko, ek)
        torch.testing.assert_close(y, rope_reference(x, freqs, start_positions=sp,
                                                     compute_dtype=torch.float32),
                                   atol=BF16[0], rtol=BF16[1])


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_decode_sizes(layout, interleaved):
    torch.manual_seed(5)
    b, hq, hk, d = 16, 32, 8, 128
    P = 8192
    freqs = ropelib.rope_freqs(P, d, interleaved=interleaved, device=DEV)
    shp = (lambda hh: (1, b, hh, d)) if layout == "sbhd" else (lambda hh: (b, 1, hh, d))
    q = torch.randn(shp(hq), device=DEV, dtype=torch.bfloat16)
    k = torch.randn(shp(hk), device=DEV, dtype=torch.bfloat16)
    sp = torch.randint(0, P - 1, (b,), device=DEV)
    opts = dict(layout=layout, interleaved=interleaved, start_positions=sp)
    qo, ko = ropelib.apply_rope_qk(q, k, freqs, **opts)
    torch.testing.assert_close(qo, rope_reference(q, freqs, compute_dtype=torch.float32, **opts),
                               atol=BF16[0], rtol=BF16[1])
    torch.testing.assert_close(ko, rope_reference(k, freqs, compute_dtype=torch.float32, **opts),
                               atol=BF16[0], rtol=BF16[1])
    # TE's unfused path on the same decode step agrees within its own rounding
    u = te_unfused(q, freqs, layout, sp, interleaved)
    torch.testing.assert_close(qo, u, atol=4e-2, rtol=4 * 2**-7)


# --- the fused kernels past 2^31 elements --------------------------------------------------------
# q past 2^31 elements: each kernel's output at the start, across the boundary and at the end
# against the same kernel on those few tokens alone (positions given explicitly).

def _past_2_31_tokens(heads: int, d: int, gib: int) -> int:
    free, _ = torch.cuda.mem_get_info()
    if free < gib * 2**30:
        pytest.skip(f"needs ~{gib} GB of free GPU memory, {free / 2**30:.1f} GB free")
    return 2**31 // (heads * d) + 64


def _slices(t: int, heads: int, d: int):
    return [slice(lo, lo + 8) for lo in (0, 2**31 // (heads * d) - 4, t - 8)]


def test_multi_axis_past_2_31_elements():
    hq, hk, d = 32, 8, 128
    t = _past_2_31_tokens(hq, d, 24)
    f = ropelib.multi_axis_frequencies(d, [16, 24, 24], 1e6, device=DEV)
    q = torch.empty(t, hq, d, device=DEV, dtype=torch.bfloat16).normal_()
    k = torch.empty(t, hk, d, device=DEV, dtype=torch.bfloat16).normal_()
    pos = torch.randint(0, 8192, (3, t), device=DEV)
    qo, ko = ropelib.apply_mrope_qk(q, k, pos, f, layout="thd")
    for sl in _slices(t, hq, d):
        want_q, want_k = ropelib.apply_mrope_qk(q[sl], k[sl], pos[:, sl].contiguous(), f,
                                                layout="thd")
        torch.testing.assert_close(qo[sl], want_q, atol=BF16[0], rtol=BF16[1])
        torch.testing.assert_close(ko[sl], want_k, atol=BF16[0], rtol=BF16[1])
    del q, k, qo, ko
    torch.cuda.empty_cache()


def test_qk_norm_rope_past_2_31_elements():
    hq, hk, d = 32, 8, 128
    t = _past_2_31_tokens(hq, d, 24)
    q = torch.empty(1, t, hq, d, device=DEV, dtype=torch.bfloat16).normal_()
    k = torch.empty(1, t, hk, d, device=DEV, dtype=torch.bfloat16).normal_()
    w_q, w_k = 1 + 0.3 * torch.randn(d, device=DEV), 1 + 0.3 * torch.randn(d, device=DEV)
    freqs = ropelib.rope_freqs(t, d, device=DEV)
    qo, ko = ropelib.qk_norm_rope(q, k, w_q, w_k, freqs)
    for sl in _slices(t, hq, d):
        ids = torch.arange(sl.start, sl.stop, device=DEV)[None]
        want_q, want_k = ropelib.qk_norm_rope(q[:, sl], k[:, sl], w_q, w_k, freqs,
                                              position_ids=ids)
        torch.testing.assert_close(qo[:, sl], want_q, atol=BF16[0], rtol=BF16[1])
        torch.testing.assert_close(ko[:, sl], want_k, atol=BF16[0], rtol=BF16[1])
    del q, k, qo, ko
    torch.cuda.empty_cache()
