"""Notebook 01's prose: the numbers its cells print but do not assert, and the short derivations
its text gives (section 4's complex form of the score, section 5's YaRN temperature, section 7's
permutation, question 6's rounded frequency), checked here in float64 on the CPU."""
import math
from pathlib import Path

import torch
from loading import load_file  # noqa: E402

from ropelib import frequencies, reference
from ropelib.frequencies import Llama3Scaling, YaRNScaling

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01-roformer-math.ipynb"
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")
f64 = torch.float64


def _markdown():
    return " ".join(run_notebooks.notebook_markdown(NOTEBOOK).replace("#", " ").split())


def _R(m, inv, interleaved):
    """R_m read off the reference: column i is the RoPE of e_i."""
    ang = m * inv
    ang = ang.repeat_interleave(2) if interleaved else torch.cat([ang, ang])
    eye = torch.eye(ang.numel(), dtype=f64)
    return reference.apply_rope_ref(eye, ang.cos(), ang.sin(), interleaved=interleaved).T


def test_the_speeds_fall_by_one_factor_per_pair():
    # section 2: "theta_{j+1}/theta_j = b^{-2/d} for every j, here 10000^{-1/4} = 0.1"; section 5:
    # the wavelengths grow by b^{2/d} from pair to pair, the last 2 pi b * b^{-2/d}
    for d, base in ((8, 10000.0), (128, 10000.0), (128, 500000.0)):
        inv = frequencies.inv_freq(d, base, dtype=f64)
        assert torch.allclose(inv[1:] / inv[:-1], torch.full((d // 2 - 1,), base ** (-2 / d),
                                                             dtype=f64), rtol=1e-12, atol=0)
        assert math.isclose(2 * math.pi / inv[-1].item(), 2 * math.pi * base * base ** (-2 / d),
                            rel_tol=1e-12)
    assert math.isclose(10000.0 ** (-1 / 4), 0.1, rel_tol=1e-12)
    text = _markdown()
    assert "here $10000^{-1/4} = 0.1$" in text and "growing by the same factor $b^{2/d}$" in text


def test_llama31_keeps_blends_and_divides():
    # section 5: "Llama 3.1 keeps its 29 fastest pairs (lambda_j < L0/4) as they are, divides
    # the 29 slowest (exactly those that never turn within L0) by 8, and blends the 6 between"
    d, base = 128, 500000.0
    plain = frequencies.inv_freq(d, base, dtype=f64)
    ratio = frequencies.inv_freq(d, base, Llama3Scaling(), dtype=f64) / plain
    wavelength = 2 * math.pi / plain
    kept = int((ratio == 1).sum())
    divided = int(torch.isclose(ratio, torch.tensor(1 / 8, dtype=f64)).sum())
    assert (kept, divided, d // 2 - kept - divided) == (29, 29, 6)
    assert kept == int((wavelength < 8192 / 4).sum()) and divided == int((wavelength > 8192).sum())
    text = _markdown()
    for words in ("keeps its 29 fastest pairs", "divides the 29 slowest", "blends the 6 between"):
        assert words in text, words


def test_the_three_profiles_score_about_the_same_at_distance_0():
    # section 6: "Three profiles h_j, real and positive, of about the same score at distance 0"
    half = 64
    ones = torch.full((half,), 2.0, dtype=f64)                          # q = k = 1
    falling = 4 * (1 - torch.arange(half, dtype=f64) / half)            # the notebook's profile
    slowest = torch.zeros(half, dtype=f64).index_fill(0, torch.tensor([63]), 128)
    at0 = [float(h.sum()) for h in (ones, falling, slowest)]           # Re sum_j h_j e^0
    assert at0 == [128.0, 130.0, 128.0]
    assert max(at0) / min(at0) < 1.02
    assert "of about the same score at distance 0" in _markdown()


def test_the_score_from_complex_pairs_as_section_4_derives_it():
    # a0 b0 + a1 b1 = Re((a0 + i a1) conj(b0 + i b1)), and pair j of R_m q is q_j e^{i m theta_j}
    g = torch.Generator().manual_seed(0)
    for d, base in ((8, 10000.0), (64, 500000.0)):
        inv = frequencies.inv_freq(d, base, dtype=f64)
        q, k = torch.randn(d, generator=g, dtype=f64), torch.randn(d, generator=g, dtype=f64)
        qc, kc = torch.complex(q[0::2], q[1::2]), torch.complex(k[0::2], k[1::2])
        assert torch.allclose((q * k).sum(), (qc * kc.conj()).real.sum())
        for m, n in ((0, 3), (7, 2), (1000, 17)):
            rq, rk = _R(m, inv, True) @ q, _R(n, inv, True) @ k
            assert torch.allclose(torch.complex(rq[0::2], rq[1::2]), qc * torch.exp(1j * m * inv))
            score = (qc * kc.conj() * torch.exp(1j * (m - n) * inv)).sum().real
            assert torch.allclose(rq @ rk, score)
            assert torch.allclose(rq @ rk, q @ _R(n - m, inv, True) @ k)   # q^T R_{n-m} k


def test_yarn_temperature_folded_into_cos_and_sin():
    # section 5: the logits divided by t, sqrt(1/t) = 0.1 ln s + 1; cos and sin times
    # a = sqrt(1/t), so every logit is multiplied by a^2 = 1/t
    s = 8.0
    yarn = YaRNScaling(s, 8192)
    a = yarn.attention_scaling
    t = 1 / a ** 2
    assert math.isclose(math.sqrt(1 / t), 0.1 * math.log(s) + 1) and t < 1
    d, S = 16, 6
    cos, sin = frequencies.rope_cos_sin(S, d, scaling=yarn)
    ang = frequencies.rope_freqs(S, d, scaling=yarn)[:, 0, 0]
    assert torch.allclose(cos, ang.cos() * a) and torch.allclose(sin, ang.sin() * a)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(S, d, generator=g), torch.randn(S, d, generator=g)
    scaled = reference.apply_rope_ref(q, cos, sin) @ reference.apply_rope_ref(k, cos, sin).T
    plain = (reference.apply_rope_ref(q, ang.cos(), ang.sin())
             @ reference.apply_rope_ref(k, ang.cos(), ang.sin()).T)
    assert torch.allclose(scaled, plain / t, rtol=1e-5, atol=1e-5)


def test_section_7_permutation_as_matrices():
    # R_half P = P R_inter, so R_inter = P^T R_half P, and [..., argsort(perm)] is P^T
    for d in (2, 8, 64):
        inv = frequencies.inv_freq(d, dtype=f64)
        perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        P = torch.eye(d, dtype=f64)[perm]                     # P x = x[perm]
        x = torch.randn(d, dtype=f64)
        assert torch.equal(P @ x, x[perm]) and torch.equal(P.T @ x, x[torch.argsort(perm)])
        for m in (1, 5, 1234):
            R_half, R_inter = _R(m, inv, False), _R(m, inv, True)
            assert torch.allclose(R_half @ P, P @ R_inter)
            assert torch.allclose(R_inter, P.T @ R_half @ P)


def test_question_6_rounds_theta_before_the_multiply():
    # "theta_j is itself rounded to float32 before the multiply, and m scales that error up"
    m, d = 500_000, 128
    row = frequencies.rope_freqs(1, d, offset=m)[0, 0, 0, : d // 2]
    theta32 = frequencies.inv_freq(d, dtype=torch.float32)
    assert torch.equal(row, torch.tensor(float(m)) * theta32)   # fp32 m times fp32 theta_j
    theta64 = frequencies.inv_freq(d, dtype=f64)
    scaled = m * (theta32.double() - theta64)                   # theta_j's rounding, times m
    rounded = row.double() - m * theta32.double()               # the product's own rounding
    err = row.double() - m * theta64
    assert torch.allclose(err, scaled + rounded, rtol=0, atol=1e-9)
    assert bool((rounded.abs() <= 2 ** -6).all())               # at most half of 2^-5
    assert err.abs().argmax() == 1 and err[1].abs() > 2 ** -6   # pair 1: more than half of it,
    assert scaled[1].abs() > 2 ** -7                            # theta_1's rounding a good part
