"""ropelib.mrope: multi-axis RoPE (Qwen2-VL / Qwen3-VL M-RoPE, 2-D and 3-D axial), forward and
backward.

* the frequency layouts: contiguous sections, Qwen3-VL's round-robin rule, per-axis ladders;
  grid positions;
* parity with plain PyTorch in fp64 (angles gathered per pair, then rotate-half or interleaved
  pairs): outputs and gradients for every style, layout (sbhd, bshd, thd), dtype, GQA, partial
  rotary, per-batch and shared positions; torch.autograd.gradcheck in fp64;
* parity with transformers' own code: Qwen2-VL's and Qwen3-VL's text rotary modules with
  apply_rotary_pos_emb, Qwen2-VL's 2-D vision rotary, and transformers 4.x's
  apply_multimodal_rotary_pos_emb against ropelib.hf's drop-in;
* every output element written (outputs poisoned with NaN); a bad axis gives NaN, not a silent
  pass-through;
* torch.library.opcheck of both operators, torch.compile(aot_eager, fullgraph=True) with the
  same bits as eager, forward and backward; bad input raises an error naming the argument;
* benchmarks/mrope_bench.py --dry-run.
"""
from pathlib import Path

import pytest
import torch
import torch._dynamo

import ropelib
from ropelib import eager, hf, mrope
from ropelib.kernels import mrope as kernel
from ropelib.reference import rotate_half
from loading import load_file  # noqa: E402
from registration import assert_registered  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPS = torch.ops.ropelib
# dtype -> (atol, rtol): about one ulp of the output dtype at values of a few units
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 2**-10), torch.bfloat16: (3e-2, 2**-7),
       torch.float64: (1e-12, 1e-12)}
SHAPE = {"bshd": lambda B, S, H, D: (B, S, H, D), "sbhd": lambda B, S, H, D: (S, B, H, D),
         "thd": lambda B, S, H, D: (S, H, D)}


def reference(x, positions, freqs, *, layout="bshd", interleaved=False):
    """Plain differentiable PyTorch in fp64: angle[b, s, j] = pos[axis[j], b, s] * inv_freq[j]."""
    inv, axis, n_axes = freqs
    pos = positions if positions.dim() == 3 else positions[:, None]       # [A, B or 1, S]
    half = inv.shape[0]
    R = 2 * half
    ang = pos.double()[..., None] * inv.double()                           # [A, B', S, half]
    idx = axis.long()[None, None, None, :].expand(1, *ang.shape[1:])
    theta = ang.gather(0, idx)[0]                                          # [B', S, half]
    xd = x.double()
    x4 = xd if layout == "bshd" else (xd.transpose(0, 1) if layout == "sbhd" else xd[None])
    c, s = theta.cos()[:, :, None, :], theta.sin()[:, :, None, :]          # [B', S, 1, half]
    rot, rest = x4[..., :R], x4[..., R:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        y = torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
    else:
        cc, ss = torch.cat((c, c), -1), torch.cat((s, s), -1)
        y = rot * cc + rotate_half(rot) * ss
    y = torch.cat((y, rest), -1)
    return y if layout == "bshd" else (y.transpose(0, 1) if layout == "sbhd" else y[0])


def make(layout="bshd", dtype=torch.float32, *, B=2, S=6, HQ=4, HK=2, D=16, grad=True):
    q = (2 * torch.randn(SHAPE[layout](B, S, HQ, D))).to(dtype)
    k = torch.randn(SHAPE[layout](B, S, HK, D)).to(dtype)
    return q.requires_grad_(grad), k.requires_grad_(grad)


def _close(got, want, tol):
    torch.testing.assert_close(got.double(), want.double(), atol=tol[0], rtol=tol[1])


def check_qk(q, k, positions, freqs, **opts):
    q_out, k_out = ropelib.apply_mrope_qk(q, k, positions, freqs, **opts)
    want_q, want_k = reference(q, positions, freqs, **opts), reference(k, positions, freqs, **opts)
    assert q_out.dtype == q.dtype and q_out.shape == q.shape and k_out.shape == k.shape
    _close(q_out, want_q, TOL[q.dtype])
    _close(k_out, want_k, TOL[q.dtype])
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    got = torch.autograd.grad((q_out, k_out), (q, k), (gq, gk))
    want = torch.autograd.grad((want_q, want_k), (q, k), (gq.double(), gk.double()))
    for g, w, x in zip(got, want, (q, k)):
        assert g.dtype == x.dtype and g.shape == x.shape
        _close(g, w, TOL[q.dtype])


# --- frequency layouts and positions --------------------------------------------------------

def test_sections_are_contiguous_runs_over_one_ladder():
    f = mrope.multi_axis_frequencies(128, [16, 24, 24], 1e6)
    assert f.n_axes == 3 and f.axis.dtype == torch.int32
    assert f.axis.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    # transformers' ladder, operation for operation: the same fp32 bits
    assert torch.equal(f.inv_freq,
                       1.0 / (1e6 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)))


def test_interleaved_sections_follow_qwen3_vl_rule():
    axis = mrope.axis_of_pairs([24, 20, 20], "mrope_interleaved").tolist()
    # transformers' rule: start all-T, then H at j % 3 == 1 below 3 * 20, W at j % 3 == 2 below 60
    want = [0] * 64
    for j in range(1, 60, 3):
        want[j] = 1
    for j in range(2, 60, 3):
        want[j] = 2
    assert axis == want
    assert [axis.count(a) for a in range(3)] == [24, 20, 20]
    with pytest.raises(ValueError, match="cannot be interleaved"):
        mrope.axis_of_pairs([2, 10, 2], "mrope_interleaved")


def test_axial_ladders_restart_per_axis():
    f = mrope.multi_axis_frequencies(32, [8, 8], 10000.0, style="axial")
    ladder = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    assert torch.equal(f.inv_freq, torch.cat([ladder, ladder]))
    assert f.axis.tolist() == [0] * 8 + [1] * 8


def test_grid_positions_raster_order():
    p = mrope.grid_positions(2, 2, 3, start=5)
    assert p.shape == (3, 12)
    assert p[:, 0].tolist() == [5, 5, 5] and p[:, 4].tolist() == [5, 6, 6]
    assert p[:, 11].tolist() == [6, 6, 7]
    assert mrope.grid_positions(1, 2, 2, axes=2).tolist() == [[0, 0, 1, 1], [0, 1, 0, 1]]
    with pytest.raises(ValueError, match="t must be 1"):
        mrope.grid_positions(2, 2, 2, axes=2)


# --- parity with plain PyTorch (fp64) -------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("style", mrope.STYLES)
def test_matches_reference(dtype, layout, style, seeded):
    section = {"mrope": [2, 3, 3], "mrope_interleaved": [3, 3, 2], "axial": [4, 2, 2]}[style]
    f = mrope.multi_axis_frequencies(16, section, 100.0, style=style)
    q, k = make(layout, dtype)
    pos = torch.randint(0, 50, (3, 2, 6))
    check_qk(q, k, pos, f, layout=layout)


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary_shared_positions_2d(interleaved, seeded):
    """R < D (features R.. pass through), odd head dim, positions shared by the batch, 2 axes."""
    f = mrope.multi_axis_frequencies(12, [3, 3], style="axial")
    q, k = make("bshd", torch.float32, B=3, S=5, HQ=3, HK=1, D=18)
    check_qk(q, k, mrope.grid_positions(1, 1, 5, axes=2), f, interleaved=interleaved)


def test_thd_packed_video_tokens(seeded):
    """thd: two packed sequences, a 2x2x2 video after three text tokens, then a 3x2 image."""
    text = torch.arange(3).expand(3, 3)
    video = mrope.grid_positions(2, 2, 2, start=3)
    image = mrope.grid_positions(1, 3, 2, start=0)
    pos = torch.cat([text, video, image], 1)
    f = mrope.multi_axis_frequencies(16, [4, 2, 2], style="axial")
    q, k = make("thd", torch.bfloat16, S=pos.shape[1], HQ=2, HK=2)
    check_qk(q, k, pos, f, layout="thd")
    x = q.detach().float()
    _close(ropelib.apply_mrope(x, pos, f, layout="thd"), reference(x, pos, f, layout="thd"),
           TOL[torch.float32])


def test_text_tokens_get_plain_rope(seeded):
    """t = h = w: M-RoPE is 1-D RoPE (the reason text keeps its behaviour in Qwen2-VL)."""
    f = mrope.multi_axis_frequencies(16, [2, 3, 3], 10000.0)
    x = torch.randn(2, 7, 3, 16)
    pos = torch.arange(7)
    got = ropelib.apply_mrope(x, pos.expand(3, 7), f)
    want = ropelib.apply_rope(x, ropelib.rope_freqs(7, 16), layout="bshd")
    _close(got, want, TOL[torch.float32])


def test_gradcheck_fp64(seeded):
    f = mrope.multi_axis_frequencies(6, [1, 1, 1], 10.0, style="mrope_interleaved")
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[[0, 4, 2]], [[1, 1, 5]], [[3, 0, 2]]])
    assert torch.autograd.gradcheck(lambda q, k: ropelib.apply_mrope_qk(q, k, pos, f), (q, k),
                                    eps=1e-6, atol=1e-7, rtol=1e-6, fast_mode=True)


def test_double_backward_and_one_output_unused(seeded):
    f = mrope.multi_axis_frequencies(16, [2, 3, 3])
    q, k = make("bshd", torch.float64)
    pos = torch.randint(0, 9, (3, 1, 6))
    q_out, _ = ropelib.apply_mrope_qk(q, k, pos, f)
    g = torch.randn_like(q_out, requires_grad=True)
    gq, = torch.autograd.grad(q_out, q, g, create_graph=True)
    _close(gq, torch.autograd.grad(reference(q, pos, f), q, g)[0], TOL[torch.float64])
    # the gradient of a rotation is linear in g: d<gq, v>/dg = R(theta) v
    v = torch.randn_like(gq)
    gg, = torch.autograd.grad(gq, g, v)
    _close(gg, reference(v, pos, f), TOL[torch.float64])


def test_strided_views_of_one_projection(seeded):
    B, S, HQ, HK, D = 2, 5, 4, 2, 16
    proj = torch.randn(B, S, (HQ + 2 * HK) * D)
    q = proj[..., :HQ * D].view(B, S, HQ, D)
    k = proj[..., HQ * D:(HQ + HK) * D].view(B, S, HK, D)
    f = mrope.multi_axis_frequencies(16, [2, 3, 3])
    pos = torch.randint(0, 20, (3, B, S)).transpose(1, 2).contiguous().transpose(1, 2)
    a = ropelib.apply_mrope_qk(q, k, pos, f)
    b = ropelib.apply_mrope_qk(q.contiguous(), k.contiguous(), pos.contiguous(), f)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _close(a[0], reference(q, pos, f), TOL[torch.float32])


def test_positions_of_any_strides_are_read_contiguous(seeded):
    """The kernel reads positions contiguous ([n_axes, B or 1, S]): the checks make them so (a
    copy only for strided ones; positions expanded over the batch become [n_axes, 1, S], read
    once for every batch entry), on the checked call and on the eager route alike; the planner
    refuses others."""
    B, S = 3, 5
    f = mrope.multi_axis_frequencies(16, [2, 3, 3])
    q, k = torch.randn(B, S, 4, 16), torch.randn(B, S, 2, 16)
    pos = torch.randint(0, 20, (3, S))
    want = ropelib.apply_mrope_qk(q, k, pos, f)
    per_batch = torch.stack([pos, pos.flip(1), pos + 1], 1)             # [3, B, S]
    want_per_batch = ropelib.apply_mrope_qk(q, k, per_batch, f)
    assert mrope._positions3(pos[:, None].expand(3, B, S)).shape == (3, 1, S)
    for strided, expect in ((pos[:, None].expand(3, B, S), want), (pos.t().contiguous().t(), want),
                            (per_batch.transpose(1, 2).contiguous().transpose(1, 2),
                             want_per_batch)):
        for _ in range(2):      # the checked call, then the eager route
            got = ropelib.apply_mrope_qk(q, k, strided, f)
            assert all(torch.equal(a, b) for a, b in zip(got, expect))
        got = OPS.mrope_qk(q, k, strided, f.inv_freq, f.axis, "bshd", False, False)
        assert all(torch.equal(a, b) for a, b in zip(got, expect))
    with pytest.raises(AssertionError, match="contiguous"):
        kernel.plan(q.transpose(0, 1), torch.empty_like(q).transpose(0, 1),
                    per_batch.transpose(1, 2).contiguous().transpose(1, 2), f.inv_freq, f.axis,
                    interleaved=False, backward=False, layout="bshd")

# --- parity with transformers ---------------------------------------------------------------

def _tf(module):
    return pytest.importorskip(f"transformers.models.{module}")


def _apply_multimodal_rotary_pos_emb_4x(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    """transformers 4.x's Qwen2-VL function, verbatim in substance (5.x folded it into the
    rotary module): the specification of ropelib.hf.apply_multimodal_rotary_pos_emb."""
    mrope_section = mrope_section * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(mrope_section, dim=-1))],
                    dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(mrope_section, dim=-1))],
                    dim=-1).unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _qwen_vl_case(dtype, B=2, S=9, HQ=4, HK=2, D=16):
    q = torch.randn(B, HQ, S, D).to(dtype)       # transformers' [B, H, S, D]
    k = torch.randn(B, HK, S, D).to(dtype)
    # three text tokens, a 1x2x2 image, two text tokens (Qwen2-VL's get_rope_index pattern)
    pos = torch.cat([torch.arange(3).expand(3, 3), mrope.grid_positions(1, 2, 2, start=3),
                     (torch.arange(2) + 5).expand(3, 2)], 1)
    return q, k, torch.stack([pos, pos + 1], 1)  # [3, B, S]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_text_rotary_matches_transformers(family, dtype, seeded):
    """transformers' rotary module (cos/sin of [3, B, S] positions, recomposed per section) and
    apply_rotary_pos_emb against ropelib.apply_mrope_qk from the positions alone."""
    q, k, pos = _qwen_vl_case(dtype)
    if family == "qwen2_vl":
        cfg_mod, mod = _tf("qwen2_vl.configuration_qwen2_vl"), _tf("qwen2_vl.modeling_qwen2_vl")
        section, style = [2, 3, 3], "mrope"
        cfg = cfg_mod.Qwen2VLTextConfig(hidden_size=64, num_attention_heads=4, rope_parameters=dict(
            rope_type="default", rope_theta=1e4, mrope_section=section))
        rotary = mod.Qwen2VLRotaryEmbedding(cfg)
    else:
        cfg_mod, mod = _tf("qwen3_vl.configuration_qwen3_vl"), _tf("qwen3_vl.modeling_qwen3_vl")
        section, style = [3, 3, 2], "mrope_interleaved"
        cfg = cfg_mod.Qwen3VLTextConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                                        rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                             mrope_section=section,
                                                             mrope_interleaved=True))
        rotary = mod.Qwen3VLTextRotaryEmbedding(cfg)
    cos, sin = rotary(q, pos)
    want_q, want_k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    f = mrope.multi_axis_frequencies(16, section, 1e4, style=style)
    assert torch.equal(f.inv_freq, rotary.inv_freq)
    got_q, got_k = ropelib.apply_mrope_qk(q.transpose(1, 2), k.transpose(1, 2), pos, f)
    # transformers rounds cos/sin and every product to the model's dtype: a few ulps in 16 bits
    tol = (2e-5, 2e-5) if dtype == torch.float32 else (6e-2, 4 * 2**-7)
    _close(got_q.transpose(1, 2), want_q, tol)
    _close(got_k.transpose(1, 2), want_k, tol)


def test_vision_2d_axial_matches_transformers(seeded):
    """Qwen2-VL's vision encoder: (row, column) per patch, block-major over 2x2 merges."""
    cfg_mod, mod = _tf("qwen2_vl.configuration_qwen2_vl"), _tf("qwen2_vl.modeling_qwen2_vl")
    vision_utils = pytest.importorskip("transformers.vision_utils")
    cfg = cfg_mod.Qwen2VLVisionConfig(embed_dim=64, num_heads=4)     # head dim 16
    rotary = mod.Qwen2VLVisionRotaryEmbedding(cfg)
    pos = vision_utils.get_vision_position_ids(torch.tensor([[1, 4, 6]]), 2)   # [N, 2]
    cos, sin = rotary(torch.zeros(1), pos)
    q, k = torch.randn(pos.shape[0], 4, 16), torch.randn(pos.shape[0], 4, 16)
    want_q, want_k = mod.apply_rotary_pos_emb_vision(q, k, cos, sin)
    f = mrope.multi_axis_frequencies(16, [4, 4], 1e4, style="axial")
    assert torch.equal(f.inv_freq[:4], rotary.inv_freq)
    got_q, got_k = ropelib.apply_mrope_qk(q, k, pos.T, f, layout="thd")
    _close(got_q, want_q, TOL[torch.float32])
    _close(got_k, want_k, TOL[torch.float32])


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_multimodal_drop_in(unsqueeze_dim, dtype, seeded):
    """ropelib.hf.apply_multimodal_rotary_pos_emb: the 4.x signature and results (cos/sin
    [3, B, S, D]), gradients included."""
    q, k, pos = _qwen_vl_case(dtype)
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q, k = q.requires_grad_(), k.requires_grad_()
    section = [2, 3, 3]
    inv = 1.0 / (1e4 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    emb = pos[..., None].float() * inv
    emb = torch.cat((emb, emb), -1)                            # [3, B, S, D], as 4.x builds it
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    want = _apply_multimodal_rotary_pos_emb_4x(q, k, cos, sin, section, unsqueeze_dim)
    got = hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section, unsqueeze_dim)
    tol = (2e-5, 2e-5) if dtype == torch.float32 else (6e-2, 4 * 2**-7)
    g = [torch.randn_like(t) for t in want]
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        _close(a, b, tol)
    for a, b in zip(torch.autograd.grad(got, (q, k), g), torch.autograd.grad(want, (q, k), g)):
        _close(a, b, tol)


# --- every element written; bad axes are loud -----------------------------------------------

@pytest.mark.parametrize("backward", [False, True])
def test_every_output_element_is_written(backward, seeded):
    S, B, HQ, HK, D = 5, 3, 6, 2, 20
    f = mrope.multi_axis_frequencies(12, [2, 2, 2])
    q, k = torch.randn(S, B, HQ, D), torch.randn(S, B, HK, D)
    q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    pos = torch.randint(0, 9, (3, B, S))
    kernel.launch(q, q_out, pos, f.inv_freq, f.axis, interleaved=False, backward=backward,
                  layout="sbhd", k4=k, k_out4=k_out)
    assert not q_out.isnan().any() and not k_out.isnan().any()
    assert torch.equal(q_out[..., 12:], q[..., 12:])


def test_axis_outside_the_positions_gives_nan(seeded):
    """The operator (unchecked) with an axis index >= n_axes: the pair comes out NaN."""
    f = mrope.multi_axis_frequencies(8, [2, 2])
    axis = torch.tensor([0, 1, 2, 1], dtype=torch.int32)
    x = torch.randn(1, 3, 2, 8)
    y = OPS.mrope(x, torch.zeros(2, 1, 3, dtype=torch.int64), f.inv_freq, axis, "bshd", False,
                  False)
    assert y[..., [2, 6]].isnan().all() and not y[..., [0, 1, 3, 4, 5, 7]].isnan().any()


# --- operators and torch.compile ------------------------------------------------------------

def test_opcheck_both_operators(seeded):
    f = mrope.multi_axis_frequencies(8, [1, 2, 1], style="mrope")
    q = torch.randn(2, 4, 2, 10, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 1, 10, dtype=torch.float64, requires_grad=True)
    pos = torch.randint(0, 12, (3, 2, 4))
    torch.library.opcheck(OPS.mrope.default, (q, pos, f.inv_freq, f.axis, "bshd", False, False))
    torch.library.opcheck(OPS.mrope_qk.default,
                          (q.transpose(0, 1), k.transpose(0, 1), pos[:, :1], f.inv_freq, f.axis,
                           "sbhd", True, True))


def test_registered_as_triton_ops_on_a_gpu():
    assert_registered('mrope', 'mrope_qk')


def test_compile_fullgraph_equals_eager(seeded):
    m = ropelib.MultiAxisRotaryEmbedding(16, [3, 3, 2], style="mrope_interleaved")
    q, k = make("bshd", torch.bfloat16)
    pos = torch.randint(0, 30, (3, 2, 6))

    def fn(q, k, pos):
        return m(q * 2, k, pos)
    args_e = [q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()]
    args_c = [q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args_e, pos)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, \
        [str(b.reason) for b in explained.break_reasons]
    torch._dynamo.reset()
    out_e = fn(*args_e, pos)
    out_c = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args_c, pos)
    grads = [torch.randn_like(o) for o in out_e]
    torch.autograd.backward(out_e, grads)
    torch.autograd.backward(out_c, grads)
    for x, y in zip(out_c, out_e):
        assert torch.equal(x, y)
    for a, c in zip(args_e, args_c):
        assert torch.equal(c.grad, a.grad)
    torch._dynamo.reset()


def test_module_single_tensor_and_repr(seeded):
    m = ropelib.MultiAxisRotaryEmbedding(20, [2, 2], 100.0, style="axial", rotary_dim=8,
                                         layout="sbhd", interleaved=True)
    x = torch.randn(5, 2, 3, 20)
    pos = mrope.grid_positions(1, 1, 5, axes=2)
    _close(m(x, None, pos), reference(x, pos, m.freqs, layout="sbhd", interleaved=True),
           TOL[torch.float32])
    assert "style='axial'" in repr(m) and "rotary_dim=8" in repr(m)


# --- bad input ------------------------------------------------------------------------------

def _bad_call(**over):
    q, k = make("bshd", torch.float32, grad=False)
    args = dict(q=q, k=k, positions=torch.randint(0, 9, (3, 2, 6)),
                freqs=mrope.multi_axis_frequencies(16, [2, 3, 3]), layout="bshd")
    args.update(over)
    return ropelib.apply_mrope_qk(args.pop("q"), args.pop("k"), args.pop("positions"),
                                  args.pop("freqs"), **args)


@pytest.mark.parametrize("over, error, match", [
    (dict(positions=torch.zeros(2, 2, 6, dtype=torch.int64)), ValueError, "positions must be"),
    (dict(positions=torch.zeros(3, 3, 6, dtype=torch.int64)), ValueError, "positions must be"),
    (dict(positions=torch.zeros(3, 2, 6)), TypeError, "positions must be an integer"),
    (dict(freqs=(torch.ones(8), torch.zeros(8, dtype=torch.int32), 3)), TypeError,
     "AxisFrequencies"),
    (dict(freqs=mrope.AxisFrequencies(torch.ones(8), torch.full((8,), 3, dtype=torch.int32), 3)),
     ValueError, r"freqs.axis must lie in \[0, 3\)"),
    (dict(freqs=mrope.AxisFrequencies(torch.ones(8, dtype=torch.bfloat16),
                                      torch.zeros(8, dtype=torch.int32), 3)),
     TypeError, "freqs.inv_freq must have dtype"),
    (dict(freqs=mrope.multi_axis_frequencies(20, [4, 3, 3])), ValueError, "rotary dim"),
    (dict(k=torch.randn(2, 5, 2, 16)), ValueError, "q and k must agree"),
    (dict(k=torch.randn(2, 6, 2, 16, dtype=torch.float64)), TypeError, "same dtype"),
    (dict(layout="bhsd"), ValueError, "layout must be one of"),
    (dict(q=torch.randn(2, 6, 16)), ValueError, "q must be 4-D"),
])
def test_bad_input_names_the_argument(over, error, match):
    with pytest.raises(error, match=match):
        _bad_call(**over)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rotary_dim=16, section=[2, 3, 2]), "sums to 7 pairs"),
    (dict(rotary_dim=15, section=[2, 3, 3]), "rotary_dim must be an even int"),
    (dict(rotary_dim=16, section=[2, 3, 3], style="spiral"), "style must be one of"),
    (dict(rotary_dim=16, section=[1, 1, 1, 1, 4]), "at most 4 axes"),
    (dict(rotary_dim=16, section=[4, 4], style="axial", inv_freq=torch.ones(8)),
     "inv_freq is for"),
    (dict(rotary_dim=16, section=[2, 3, 3], inv_freq=torch.ones(4)), r"inv_freq must be \[8\]"),
    (dict(rotary_dim=16, section=[2, 3, 3], base=1.0), "base must be"),
])
def test_bad_frequencies(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mrope.multi_axis_frequencies(**kwargs)


def test_bad_hf_arguments():
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)
    cos = torch.randn(3, 1, 4, 16)
    with pytest.raises(ValueError, match="mrope_section"):
        hf.apply_multimodal_rotary_pos_emb(q, k, cos, cos, [2, 3, 2])
    with pytest.raises(ValueError, match=r"\[3, batch, seq, head_dim\]"):
        hf.apply_multimodal_rotary_pos_emb(q, k, cos[:2], cos[:2], [2, 3, 3])
    with pytest.raises(ValueError, match="cos must be 4-D"):
        hf.apply_multimodal_rotary_pos_emb(q, k, cos[0], cos[0], [2, 3, 3])


def test_tables_that_require_grad_are_refused():
    f = mrope.multi_axis_frequencies(16, [2, 3, 3])
    f = mrope.AxisFrequencies(f.inv_freq.clone().requires_grad_(), f.axis, 3)
    with pytest.raises(ValueError, match="requires grad"):
        _bad_call(freqs=f)


# --- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("style", mrope.STYLES)
def test_gpu_bf16_long_sequence(style, seeded):
    """Compiled kernel: bf16, Qwen2-VL-sized head, 4k tokens, per-batch positions."""
    section = [16, 24, 24] if style == "mrope" else ([24, 20, 20] if style != "axial"
                                                     else [32, 16, 16])
    f = mrope.multi_axis_frequencies(128, section, 1e6, style=style, device="cuda")
    q = torch.randn(2, 4096, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 4096, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.randint(0, 4096, (3, 2, 4096), device="cuda")
    check_qk(q, k, pos, f)


# --- the benchmark script -------------------------------------------------------------------

def test_benchmark_dry_run(tmp_path):
    bench = load_file("mrope_bench", ROOT / "benchmarks" / "mrope_bench.py")
    out = tmp_path / "mrope.csv"
    rows = bench.main(["--dry-run", "--out", str(out)])
    assert rows and all(r["available"] for r in rows), [r["reason"] for r in rows]
    assert {r["case"].split("-")[0] for r in rows} == {"mrope", "axial2d", "axial3d"}
    assert out.read_text().startswith("# ")


# --- notebook 10's exercises ----------------------------------------------------------------

def test_exercise_solutions_pass_and_wrong_answers_fail(capsys):
    from loading import learner_copy     # a solution as a learner who typed it has it
    from ropelib.course.exercises import multi_axis as ex
    axes, positions = (learner_copy(f) for f in (ex.solution_axis_of_pairs,
                                                  ex.solution_text_then_image))
    assert ex.check_axis_of_pairs(axes)
    assert ex.check_text_then_image(positions)
    # contiguous runs where Qwen3-VL interleaves; an image that advances by h*w
    assert not ex.check_axis_of_pairs(lambda s, i: axes(s, False))
    assert not ex.check_text_then_image(
        lambda n, h, w: torch.cat([positions(n, h, w)[:, :-1],
                                   torch.full((3, 1), n + h * w)], 1))
    assert not ex.check_axis_of_pairs(lambda s, i: None)
    out = capsys.readouterr().out
    assert out.count("✅") == 2 and out.count("❌") == 3


# --- the GPU's tile choices, run in the interpreter --------------------------------------------

@pytest.mark.parametrize("tiles", [(2, 2, 3, 1, 4), (4, 1, 1, 2, 2), (1, 4, 5, 3, 1),
                                   (8, 2, 2, 1, 4)])
@pytest.mark.parametrize("per_batch", [False, True])
def test_any_tiling_gives_the_same_bits(tiles, per_batch, seeded):
    """Token blocks, head groups that straddle q's and k's heads, batch chunks: the GPU picks
    these for short inputs; every split must give the bits of the one-program-per-block launch."""
    S, B, HQ, HK, D = 7, 3, 4, 2, 20
    f = mrope.multi_axis_frequencies(12, [2, 2, 2])
    q, k = torch.randn(S, B, HQ, D), torch.randn(S, B, HK, D)
    pos = torch.randint(0, 50, (3, B if per_batch else 1, S))
    want_q, want_k = torch.empty_like(q), torch.empty_like(k)
    kernel.launch(q, want_q, pos, f.inv_freq, f.axis, interleaved=False, backward=False,
                  layout="sbhd", k4=k, k_out4=want_k)
    got_q, got_k = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    kernel.run(*kernel.plan(q, got_q, pos, f.inv_freq, f.axis, interleaved=False,
                            backward=False, layout="sbhd", k4=k, k_out4=got_k, tiles=tiles))
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_gpu_tile_picker_fills_the_machine():
    """pick_tiles for a GPU (pure Python): whole batch and every head in one program when there
    are enough token blocks; batch, then heads, into the grid when there are not."""
    # long prefill, shared positions: the batch loop and all heads stay in the program
    bs, hps, heads, chunk, warps = kernel.pick_tiles(65536, 4, 32, 128, 128, False, 132)
    assert (heads, chunk) == (32, 4) and bs * hps * 128 <= kernel.STEP_ELEMENTS
    # per-batch positions: one batch entry per program (angles differ per entry anyway)
    assert kernel.pick_tiles(8192, 4, 32, 128, 128, True, 132)[3] == 1
    # decode: one token, 64 sequences: batch in the grid, heads split
    bs, hps, heads, chunk, warps = kernel.pick_tiles(1, 64, 40, 128, 128, False, 132)
    assert bs == 1 and chunk == 1 and heads < 40
    assert 64 * -(-40 // heads) >= kernel.PROGRAMS_PER_SM * 132 or heads == 1


# --- the eager route ----------------------------------------------------------------------------

def test_eager_route_equals_the_operator_forward_and_backward(seeded):
    """A repeated eager call takes the planned route (no checks, no dispatcher); its outputs and
    gradients are the operator's bits, and a route's second signature (other strides) plans
    its own launch."""
    f = mrope.multi_axis_frequencies(16, [2, 3, 3])
    pos = torch.randint(0, 30, (3, 2, 6))
    eager.SIGNATURES.clear()
    for _ in range(2):
        q, k = make("bshd", torch.float32)
        got = ropelib.apply_mrope_qk(q, k, pos, f)
        want = OPS.mrope_qk(q, k, pos, f.inv_freq, f.axis, "bshd", False, False)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        g = [torch.randn_like(t) for t in got]
        gg = torch.autograd.grad(got, (q, k), [g[0].transpose(1, 2).contiguous().transpose(1, 2),
                                               g[1]])
        gw = torch.autograd.grad(want, (q, k), g)
        assert all(torch.equal(a, b) for a, b in zip(gg, gw))
    assert len(eager.SIGNATURES.entries) == 1


def test_eager_route_still_checks_values_it_can_read(seeded):
    """A cached signature skips the shape checks, not the value checks of CPU index tensors."""
    q, k = make("bshd", torch.float32, grad=False)
    pos = torch.randint(0, 9, (3, 2, 6))
    f = mrope.multi_axis_frequencies(16, [2, 3, 3])
    ropelib.apply_mrope_qk(q, k, pos, f)
    bad = mrope.AxisFrequencies(f.inv_freq, torch.full_like(f.axis, 3), 3)
    with pytest.raises(ValueError, match=r"freqs.axis must lie in \[0, 3\)"):
        ropelib.apply_mrope_qk(q, k, pos, bad)


@pytest.mark.parametrize("section", [[2, 3, 3], [0, 4, 4], [8, 0, 0], [3, 3, 2]])
def test_hf_multimodal_feature_axes(section, device):
    """The axis each feature's table comes from, as transformers 4.x builds it (split the head
    into the sections, doubled, and take table i % 3 for section i), made on the tables' device
    and kept for later eager calls."""
    D = 2 * sum(section)
    want = torch.repeat_interleave(torch.arange(6) % 3, torch.tensor(section * 2))
    hf._FEATURE_AXES.clear()
    got = hf._feature_axes(tuple(section), D, torch.device(device))
    assert got.device.type == torch.device(device).type
    assert torch.equal(got.cpu(), want)
    assert hf._feature_axes(tuple(section), D, torch.device(device)) is got   # kept


@pytest.mark.gpu
def test_hf_multimodal_captures_in_a_cuda_graph(seeded):
    """No copy from host memory on the way: the drop-in captures in a CUDA graph and replays
    the eager result."""
    q, k, pos = _qwen_vl_case(torch.bfloat16)
    q, k = q.cuda(), k.cuda()
    section = [2, 3, 3]
    inv = 1.0 / (1e4 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    emb = pos[..., None].float() * inv
    emb = torch.cat((emb, emb), -1).cuda()
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    hf._FEATURE_AXES.clear()           # the first call happens under capture
    want = hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    hf._FEATURE_AXES.clear()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        got = hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
