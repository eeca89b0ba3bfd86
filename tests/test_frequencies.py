"""ropelib.frequencies: TE/HF parity, the scaling formulas, hand-derived values, bad input.

The expected values are recomputed here from the formulas (float64, element by element) or
from line-by-line copies of TE's and HF's code, never by calling the function under test.
"""
import dataclasses
import math

import pytest
import torch

from ropelib.frequencies import (DynamicNTKScaling, LinearScaling, Llama3Scaling, NTKScaling,
                                 YaRNScaling, inv_freq, rope_cos_sin, rope_freqs, rotary_dim)


# --- independent oracles ---------------------------------------------------------------------

def te_rotary_position_embedding(dim, rotary_percent, rotary_base, interleaved, max_seq_len,
                                 offset=0, seq_len_interpolation_factor=None):
    """Transformer Engine 2.x `RotaryPositionEmbedding(...)(max_seq_len, offset)`, copied op by op
    (CPU instead of the current CUDA device)."""
    if rotary_percent < 1.0:
        dim = int(dim * rotary_percent)
    inv = 1.0 / (rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    seq = torch.arange(max_seq_len, dtype=inv.dtype) + offset
    if seq_len_interpolation_factor is not None:
        seq *= 1 / seq_len_interpolation_factor
    freqs = torch.einsum("i , j -> i j", seq, inv)
    if not interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb.reshape(emb.size(0), 1, 1, emb.size(1))


def hf_cos_sin(inv, attention_scaling, position_ids, dtype):
    """HF `LlamaRotaryEmbedding.forward` for one batch row of position ids."""
    inv_freq_expanded = inv[None, :, None].float().expand(1, -1, 1)
    position_ids_expanded = position_ids[None, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype)[0], sin.to(dtype)[0]


def theta64(rot_dim, base):
    """theta_j = base^(-2j/R) in float64, one Python float per pair."""
    return [base ** (-2 * j / rot_dim) for j in range(rot_dim // 2)]


def llama3_formula(rot_dim, base, s, alpha, beta, l0):
    out = []
    for t in theta64(rot_dim, base):
        lam = 2 * math.pi / t
        if lam < l0 / beta:
            out.append(t)
        elif lam > l0 / alpha:
            out.append(t / s)
        else:
            g = (l0 / lam - alpha) / (beta - alpha)
            out.append((1 - g) * t / s + g * t)
    return torch.tensor(out, dtype=torch.float64)


def yarn_formula(rot_dim, base, s, l0, beta_fast=32.0, beta_slow=1.0, truncate=True):
    d = lambda r: rot_dim * math.log(l0 / (2 * math.pi * r)) / (2 * math.log(base))  # noqa: E731
    lo, hi = d(beta_fast), d(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rot_dim - 1)
    if lo == hi:
        hi += 0.001
    out = []
    for j, t in enumerate(theta64(rot_dim, base)):
        rho = min(max((j - lo) / (hi - lo), 0.0), 1.0)
        out.append((1 - rho) * t + rho * t / s)
    return torch.tensor(out, dtype=torch.float64)


def assert_rel(actual, expected, rtol=2e-6):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=0)


# --- hard numbers, derived by hand -----------------------------------------------------------

def test_inv_freq_default_hand_values():
    # R=8, base=10^4: theta_j = 10^(-4*2j/8) = 10^-j.
    assert_rel(inv_freq(8), torch.tensor([1.0, 0.1, 0.01, 0.001]))
    assert inv_freq(8).dtype == torch.float32 and inv_freq(8).shape == (4,)
    # R=4, base=100: [1, 100^(-1/2)] = [1, 0.1].
    assert_rel(inv_freq(4, 100.0), torch.tensor([1.0, 0.1]))


def test_linear_hand_values():
    assert_rel(inv_freq(8, scaling=LinearScaling(4.0)), torch.tensor([0.25, 0.025, 0.0025, 0.00025]))


def test_ntk_hand_values():
    # base' = 10^4 * 8^(8/6) = 10^4 * 16 = 160000 and 160000^(1/4) = 20, so theta'_j = 20^-j.
    assert_rel(inv_freq(8, scaling=NTKScaling(8.0)), torch.tensor([1.0, 0.05, 0.0025, 0.000125]))


def test_ntk_interpolates_lowest_by_factor_keeps_highest():
    for rot, base, s in [(64, 10000.0, 4.0), (128, 500000.0, 2.5), (6, 1e4, 3.0)]:
        plain, ntk = inv_freq(rot, base), inv_freq(rot, base, NTKScaling(s))
        assert ntk[0].item() == 1.0
        assert_rel(ntk[-1:], plain[-1:] / s, rtol=1e-5)


def test_dynamic_ntk_hand_values():
    sc = DynamicNTKScaling(2.0, 1024)
    # Up to L0 nothing changes (bit for bit).
    assert torch.equal(sc.inv_freq(8, 1e4, seq_len=1024), inv_freq(8))
    assert torch.equal(inv_freq(8, scaling=sc), inv_freq(8))
    # L = 3072 = 3 L0: base' = 10^4 * (2*3 - 1)^(4/3), so theta'_j = 10^-j * 5^(-j/3).
    want = torch.tensor([10.0 ** -j * 5.0 ** (-j / 3) for j in range(4)])
    assert_rel(inv_freq(8, scaling=sc, seq_len=3072), want)
    # rope_freqs uses L = offset + seq_len.
    f = rope_freqs(3000, 8, scaling=sc, offset=72)   # row 1 is position 73
    assert_rel(f[1, 0, 0, :4] / 73, want)


def test_llama3_hand_values():
    # R=8, base=10^6: theta = [1, 10^-1.5, 10^-3, 10^-4.5]; lambda = 2 pi / theta.
    # L0=8192, alpha=1, beta=4: thresholds 2048 and 8192. lambda_2 = 6283.19 is in the blend,
    # lambda_3 = 198692 is a low frequency (divided by 8), the first two are untouched.
    g = (8192 / (2000 * math.pi) - 1) / 3          # lambda_2 = 2 pi * 1000
    want = torch.tensor([1.0, 10 ** -1.5, 1e-3 * ((1 - g) / 8 + g), 10 ** -4.5 / 8])
    assert_rel(inv_freq(8, 1e6, Llama3Scaling()), want)
    assert Llama3Scaling().attention_scaling == 1.0


def test_yarn_hand_values():
    # R=8, base=10^4, s=4, L0=2048: d(32) = 8 ln(2048/(64 pi)) / (2 ln 10^4) = 1.008 -> lo=1,
    # d(1) = 8 ln(2048/(2 pi)) / (2 ln 10^4) = 2.513 -> hi=3; ramp over j=0..3: [0, 0, 0.5, 1].
    d = lambda r: 8 * math.log(2048 / (2 * math.pi * r)) / (2 * math.log(1e4))  # noqa: E731
    assert 1 < d(32) < 1.01 and 2.5 < d(1) < 2.52
    want = torch.tensor([1.0, 0.1, 0.5 * 0.01 + 0.5 * 0.01 / 4, 0.001 / 4])
    sc = YaRNScaling(4.0, 2048)
    assert_rel(inv_freq(8, scaling=sc), want)
    assert sc.attention_scaling == pytest.approx(1 + 0.1 * math.log(4))  # 1.1386...
    assert YaRNScaling(4.0, 2048, attention_factor=0.5).attention_scaling == 0.5
    assert YaRNScaling(0.5, 2048).attention_scaling == 1.0               # s <= 1: no temperature
    # DeepSeek-V3: mscale == mscale_all_dim -> ratio 1.
    assert YaRNScaling(40.0, 4096, mscale=1.0, mscale_all_dim=1.0).attention_scaling == 1.0
    ds = YaRNScaling(40.0, 4096, mscale=0.707, mscale_all_dim=1.0)
    assert ds.attention_scaling == pytest.approx((0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))


# --- independent formulas at real model sizes ------------------------------------------------

@pytest.mark.parametrize("rot,base,scaling", [
    (128, 500000.0, Llama3Scaling()),                                            # Llama 3.1
    (128, 500000.0, Llama3Scaling(32.0, 1.0, 4.0, 8192)),                        # Llama 3.2
    (64, 10000.0, Llama3Scaling(4.0, 1.0, 2.0, 2048)),
])
def test_llama3_matches_formula(rot, base, scaling):
    got = inv_freq(rot, base, scaling)
    want = llama3_formula(rot, base, scaling.factor, scaling.low_freq_factor,
                          scaling.high_freq_factor, scaling.original_max_position_embeddings)
    assert_rel(got, want, rtol=1e-5)
    # All three regimes occur at these sizes.
    plain = inv_freq(rot, base).double()
    ratio = got.double() / plain
    assert (ratio == 1).any() and (ratio - 1 / scaling.factor).abs().min() < 1e-6
    assert ((ratio < 1 - 1e-3) & (ratio > 1 / scaling.factor + 1e-3)).any()


@pytest.mark.parametrize("rot,base,s,l0,truncate", [
    (128, 10000.0, 4.0, 4096, True),          # a Llama-2-style YaRN
    (64, 150000.0, 32.0, 4096, False),        # gpt-oss style (truncate False)
    (128, 1000000.0, 4.0, 32768, True),       # Qwen-style
    (16, 10000.0, 8.0, 64, True),
])
def test_yarn_matches_formula(rot, base, s, l0, truncate):
    got = inv_freq(rot, base, YaRNScaling(s, l0, truncate=truncate))
    assert_rel(got, yarn_formula(rot, base, s, l0, truncate=truncate), rtol=1e-5)


def test_linear_equals_te_position_interpolation():
    te = te_rotary_position_embedding(64, 1.0, 10000.0, False, 300, seq_len_interpolation_factor=4)
    torch.testing.assert_close(rope_freqs(300, 64, scaling=LinearScaling(4.0)), te,
                               rtol=2e-6, atol=1e-7)


# --- TE and HF parity, bit for bit -----------------------------------------------------------

@pytest.mark.parametrize("dim,percent", [(64, 1.0), (128, 0.5), (80, 0.5), (96, 0.25), (72, 1.0)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offset", [0, 37])
def test_rope_freqs_equals_te(dim, percent, interleaved, offset):
    for base in (10000.0, 500000.0):
        got = rope_freqs(257, dim, base=base, rotary_percent=percent, interleaved=interleaved,
                         offset=offset)
        want = te_rotary_position_embedding(dim, percent, base, interleaved, 257, offset)
        assert got.shape == want.shape == (257, 1, 1, rotary_dim(dim, percent))
        assert got.dtype == torch.float32
        assert torch.equal(got, want)


@pytest.mark.parametrize("scaling", [None, LinearScaling(2.0), NTKScaling(4.0), Llama3Scaling(),
                                     YaRNScaling(4.0, 4096),
                                     YaRNScaling(8.0, 2048, attention_factor=1.3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_cos_sin_equals_hf(scaling, dtype):
    rot, base, S, off = 128, 500000.0, 300, 5
    cos, sin = rope_cos_sin(S, rot, base=base, scaling=scaling, offset=off, dtype=dtype)
    inv = inv_freq(rot, base, scaling)          # inv_freq itself is checked against formulas above
    a = 1.0 if scaling is None else scaling.attention_scaling
    want_cos, want_sin = hf_cos_sin(inv, a, torch.arange(off, off + S), dtype)
    assert cos.shape == sin.shape == (S, rot) and cos.dtype == sin.dtype == dtype
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


def test_cos_sin_are_cos_sin_of_freqs_and_yarn_amplitude():
    for interleaved in (False, True):
        f = rope_freqs(50, 64, rotary_percent=0.5, interleaved=interleaved, offset=3)[:, 0, 0]
        cos, sin = rope_cos_sin(50, 64, rotary_percent=0.5, interleaved=interleaved, offset=3)
        assert torch.equal(cos, f.cos()) and torch.equal(sin, f.sin())
    sc = YaRNScaling(16.0, 1024)
    cos, sin = rope_cos_sin(40, 32, scaling=sc, dtype=torch.float64)
    amp = (cos.double() ** 2 + sin.double() ** 2).sqrt()
    torch.testing.assert_close(amp, torch.full_like(amp, sc.attention_scaling), rtol=1e-6, atol=0)


def test_interleaved_is_a_permutation_of_rotate_half():
    half = rope_freqs(20, 16)[:, 0, 0]                     # f0..f7 f0..f7
    inter = rope_freqs(20, 16, interleaved=True)[:, 0, 0]  # f0 f0 f1 f1 ...
    j = torch.arange(16)
    assert torch.equal(inter, half[:, j // 2])
    assert torch.equal(half[:, :8], half[:, 8:])


def test_offset_is_a_shifted_table():
    full = rope_freqs(100, 32)
    assert torch.equal(rope_freqs(60, 32, offset=40), full[40:])
    c_full, s_full = rope_cos_sin(100, 32)
    c, s = rope_cos_sin(60, 32, offset=40)
    assert torch.equal(c, c_full[40:]) and torch.equal(s, s_full[40:])


def test_rotary_dim_values():
    assert rotary_dim(128) == 128
    assert rotary_dim(128, 0.5) == 64
    assert rotary_dim(80, 0.5) == 40
    assert rotary_dim(96, 0.25) == 24
    assert rotary_dim(128, 0.99) == 126   # int(126.72) truncates, as TE and HF do


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rope_freqs_on_cuda_close_to_cpu():
    got = rope_freqs(1000, 128, device="cuda")
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), rope_freqs(1000, 128), rtol=1e-6, atol=1e-6)


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("call,exc,words", [
    (lambda: rotary_dim(80, 0.3125), ValueError, "even"),        # int(80 * 0.3125) = 25
    (lambda: rotary_dim(7), ValueError, "even"),
    (lambda: rotary_dim(64, 0.0), ValueError, "rotary_percent"),
    (lambda: rotary_dim(64, 1.5), ValueError, "rotary_percent"),
    (lambda: rotary_dim(64, -0.5), ValueError, "rotary_percent"),
    (lambda: rotary_dim(64, "half"), TypeError, "rotary_percent"),
    (lambda: rotary_dim(64.0), TypeError, "head_dim"),
    (lambda: rotary_dim(0), ValueError, "head_dim"),
    (lambda: inv_freq(7), ValueError, "rot_dim"),
    (lambda: inv_freq(8, base=1.0), ValueError, "base"),
    (lambda: inv_freq(8, base=-5.0), ValueError, "base"),
    (lambda: inv_freq(8, scaling={"factor": 2}), TypeError, "scaling"),
    (lambda: inv_freq(2, scaling=NTKScaling(2.0)), ValueError, "rotary dim"),
    (lambda: rope_freqs(-1, 64), ValueError, "seq_len"),
    (lambda: rope_freqs(4.5, 64), TypeError, "seq_len"),
    (lambda: rope_freqs(4, 64, offset=-1), ValueError, "offset"),
    (lambda: rope_freqs(4, 64, interleaved="yes"), TypeError, "interleaved"),
    (lambda: rope_freqs(4, 62, rotary_percent=0.5), ValueError, "even"),
    (lambda: rope_cos_sin(4, 64, dtype=torch.int32), TypeError, "dtype"),
    (lambda: LinearScaling(0.0), ValueError, "factor"),
    (lambda: LinearScaling(-2.0), ValueError, "factor"),
    (lambda: NTKScaling(float("nan")), ValueError, "factor"),
    (lambda: DynamicNTKScaling(2.0, 0), ValueError, "original_max_position_embeddings"),
    (lambda: Llama3Scaling(factor=0.0), ValueError, "factor"),
    (lambda: Llama3Scaling(low_freq_factor=4.0, high_freq_factor=1.0), ValueError, "high_freq_factor"),
    (lambda: Llama3Scaling(original_max_position_embeddings=8192.5), TypeError,
     "original_max_position_embeddings"),
    (lambda: YaRNScaling(4.0, 4096, beta_fast=1.0, beta_slow=32.0), ValueError, "beta_fast"),
    (lambda: YaRNScaling(-4.0, 4096), ValueError, "factor"),
    (lambda: YaRNScaling(4.0, 4096, attention_factor=0.0), ValueError, "attention_factor"),
    (lambda: YaRNScaling(4.0, 4096, mscale=0.0), ValueError, "mscale"),
])
def test_bad_input_names_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_scalings_are_frozen():
    sc = YaRNScaling(4.0, 4096)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.factor = 8.0
    assert hash(Llama3Scaling()) == hash(Llama3Scaling())   # usable as cache keys


# --- the real thing, when Hugging Face transformers is installed (the `hf` extra) ------------

def test_bit_exact_with_installed_transformers():
    """inv_freq, attention factor and the cos/sin cache equal transformers' own code."""
    pytest.importorskip("transformers")
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    except (ImportError, TypeError) as exc:  # transformers < 5 spells the config differently
        pytest.skip(f"needs transformers >= 5 (rope_parameters): {exc}")

    def config(params, head_dim=128, max_pos=131072):
        return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                           max_position_embeddings=max_pos, rope_parameters=params)

    cases = [
        ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, {},
         LinearScaling(4.0), 10000.0),
        ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, {"max_pos": 2048, "seq_len": 5000},
         DynamicNTKScaling(2.0, 2048), 10000.0),
        ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, {},
         Llama3Scaling(), 500000.0),
        ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
          "original_max_position_embeddings": 4096}, {"max_pos": 16384},
         YaRNScaling(4.0, 4096), 10000.0),
        ({"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
          "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
         {"head_dim": 64, "max_pos": 131072},
         YaRNScaling(32.0, 4096, truncate=False), 150000.0),
        ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707,
          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}, {"head_dim": 64, "max_pos": 163840},
         YaRNScaling(40.0, 4096, mscale=0.707, mscale_all_dim=1.0), 10000.0),
    ]
    for params, kw, scaling, base in cases:
        head_dim = kw.get("head_dim", 128)
        cfg = config(params, head_dim, kw.get("max_pos", 131072))
        inv, attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu", seq_len=kw.get("seq_len"))
        ours = inv_freq(head_dim, base, scaling, seq_len=kw.get("seq_len"))
        assert torch.equal(ours, inv.float()), params
        assert scaling.attention_scaling == pytest.approx(attention, rel=1e-12), params

    rotary = LlamaRotaryEmbedding(config({"rope_type": "default", "rope_theta": 10000.0}))
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = rotary(torch.zeros(1, dtype=dtype), torch.arange(3, 303)[None])
        ours = rope_cos_sin(300, 128, offset=3, dtype=dtype)
        assert torch.equal(ours[0], cos[0]) and torch.equal(ours[1], sin[0])
