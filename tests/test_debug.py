"""ropelib.course.debug: the allclose failure reproduced, every cause switchable, the tools to find it."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from ropelib.course import debug as D
from ropelib import reference
from ropelib.bench.compare import angles

SMALL = D.Scenario(seq_len=16, batch=2, heads=2, head_dim=16)


@triton.jit
def _rope_zero_kernel(x_ptr, cos_ptr, sin_ptr, stride_xr, stride_xh, stride_t, SEQ_LEN,
                      HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, FROM_ANGLES: tl.constexpr,
                      COMPUTE_FP32: tl.constexpr, USE_FMA: tl.constexpr,
                      BF16_RTNE: tl.constexpr):
    # the reproduction kernel's arguments, but it writes zeros over the rotated features
    x_row = x_ptr + tl.program_id(0).to(tl.int64) * stride_xr + tl.program_id(1) * stride_xh
    offs = tl.arange(0, BLOCK_HALF)
    zero = tl.zeros([BLOCK_HALF], dtype=x_ptr.dtype.element_ty)
    tl.store(x_row + offs, zero, mask=offs < HALF)
    tl.store(x_row + HALF + offs, zero, mask=offs < HALF)


@triton.jit
def _rope_other_arguments_kernel(x_ptr, HALF: tl.constexpr):
    pass


def test_reproduction_first_ten_equal_but_allclose_fails(device):
    r = D.reproduce(SMALL, D.REPRO, device=device)
    d = D.diagnose(r)
    assert d["first_ten_equal"], d          # position 0: cos = 1, sin = 0, nothing to see
    assert not d["allclose"], d             # ... and yet the assert fails
    assert d["argmax"]["position"] > 0
    assert d["te"] in ("TE fused", "TE emulation")
    # TE agrees with the fp64 truth; the reproduction does not
    assert d["te_matches_fp64"] and not d["triton_matches_fp64"]


def test_fixed_comparison_passes_with_dtype_tolerances(device):
    r = D.reproduce(SMALL, D.FIXED, device=device)
    d = D.diagnose(r, tolerance="dtype")
    assert d["allclose"] and d["triton_matches_fp64"] and d["te_matches_fp64"], d
    assert d["triton_max_ulp"] <= 1.0 and d["te_max_ulp"] <= 1.0


LAYOUT_TRAPS = ["sbhd_row_indexing", "te_freqs_reshaped", "interleaved_mismatch",
                "partial_rotary_ignored", "table_margin", "inplace_double_rotation"]


@pytest.mark.parametrize("cause", LAYOUT_TRAPS)
def test_each_layout_trap_breaks_the_fixed_kernel(cause, device):
    causes = dataclasses.replace(D.FIXED, **{cause: True})
    layout = "bshd" if cause == "table_margin" else "sbhd"   # margin shows up from batch 1 on
    r = D.reproduce(dataclasses.replace(SMALL, layout=layout), causes, device=device)
    d = D.diagnose(r, tolerance="dtype")
    assert not d["allclose"], cause
    assert d["first_ten_equal"], cause       # every trap leaves position 0 untouched
    assert d["max_abs_diff"] > 0.1
    if cause == "inplace_double_rotation":   # the kernel is right; TE rotated its output again
        assert d["triton_matches_fp64"] and not d["te_matches_fp64"]
    else:
        assert d["te_matches_fp64"] and not d["triton_matches_fp64"]


def test_precision_causes_cost_ulps(device):
    # fixed: one rounding of an fp32 result (<= 1 ulp even where the interpreter truncates);
    # a bf16 table or bf16 products add errors that near-zero outputs show as many ulps
    fixed = D.diagnose(D.reproduce(SMALL, D.FIXED, device=device), tolerance="dtype")
    assert fixed["triton_max_ulp"] <= 1.0
    for cause in ("table_in_input_dtype", "math_in_input_dtype"):
        causes = dataclasses.replace(D.FIXED, sincos_in_kernel=False, **{cause: True})
        d = D.diagnose(D.reproduce(SMALL, causes, device=device), tolerance="dtype")
        assert d["triton_max_ulp"] > 2, cause
        assert d["first_ten_equal"], cause


def test_reproduction_kernel_matches_reference_when_fixed(device):
    x = torch.randn(3, 5, 2, 12, device=device)         # bshd, fp32
    f = angles(5, 8, device=device)                      # partial rotary: R = 8 of 12
    half = f[:, 0, 0, :4].contiguous()
    y = D.rope_unsloth_repro(x.clone().view(15, 2, 12), half, seq_len=5, from_angles=True,
                             compute_fp32=True).view(3, 5, 2, 12)
    ref = reference.rope_reference(x, f, layout="bshd")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(y[..., 8:], x[..., 8:])          # the pass-through part is untouched
    with pytest.raises(ValueError, match="seq_len"):
        D.rope_unsloth_repro(x.view(15, 2, 12), half, seq_len=0, from_angles=True)
    with pytest.raises(ValueError, match="sin"):
        D.rope_unsloth_repro(x.view(15, 2, 12), half, seq_len=5)


def test_tolerances_ulps_and_maps():
    assert D.tolerances(torch.bfloat16) == {"rtol": 1.6e-2, "atol": 1e-5}
    assert D.tolerances("fp32")["rtol"] == 1.3e-6
    with pytest.raises(ValueError, match="dtype"):
        D.tolerances("fp8")
    with pytest.raises(TypeError, match="dtype"):
        D.tolerances(torch.int32)
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64)
    got = torch.tensor([1.0 + 2 ** -7, 2.0], dtype=torch.bfloat16)
    assert D.ulp_error(got, ref).tolist() == [1.0, 0.0]
    a = torch.zeros(4, 2, 3, 6)
    b = a.clone()
    b[2, 1, 0, 5] = 0.25
    m = D.error_map(a, b, "sbhd")
    assert m.shape == (4, 6) and m[2, 5] == 0.25 and m.sum() == 0.25
    loc = D.argmax_location(a, b, "sbhd")
    assert (loc["position"], loc["batch"], loc["head"], loc["dim"]) == (2, 1, 0, 5)
    bl = D.argmax_location(a.transpose(0, 1), b.transpose(0, 1), "bshd")
    assert (bl["position"], bl["batch"]) == (2, 1)


def test_heatmap_draws(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    ax = D.plot_heatmap(torch.rand(8, 6))
    ax.figure.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_bad_arguments():
    with pytest.raises(ValueError, match="layout"):
        D.Scenario(layout="thd")
    with pytest.raises(TypeError, match="causes"):
        D.reproduce(SMALL, causes={"fma": True})
    with pytest.raises(ValueError, match="tolerance"):
        D.diagnose(D.reproduce(D.Scenario(seq_len=2, batch=1, heads=1, head_dim=8)), "loose")


def test_reproduce_runs_the_kernel_it_is_given(device):
    # the course's kernel passed explicitly (as notebook 08 passes its copy) gives the default's
    # bits, for the reported failure and the fixed kernel
    for causes in (D.REPRO, D.FIXED):
        default = D.reproduce(SMALL, causes, device=device)
        given = D.reproduce(SMALL, causes, device=device, kernel=D._rope_unsloth_repro_kernel)
        assert torch.equal(given.tokens_triton, default.tokens_triton), causes
        assert torch.equal(given.tokens_te, default.tokens_te)
    # ... and another kernel is the one that runs
    zeroed = D.reproduce(SMALL, D.FIXED, device=device, kernel=_rope_zero_kernel)
    assert not zeroed.tokens_triton.any() and zeroed.tokens_te.any()


def test_reproduce_refuses_a_kernel_that_is_no_triton_kernel():
    plain = D._rope_unsloth_repro_kernel.fn          # the kernel's function without @triton.jit
    for not_a_kernel in (plain, "_rope_unsloth_repro_kernel", 0):
        with pytest.raises(TypeError, match=r"kernel must be a Triton kernel .*@triton\.jit"):
            D.reproduce(SMALL, D.FIXED, kernel=not_a_kernel)
    with pytest.raises(TypeError, match="kernel must take the arguments of .*x_ptr, cos_ptr"):
        D.reproduce(SMALL, D.FIXED, kernel=_rope_other_arguments_kernel)
    x = torch.zeros(4, 1, 8)
    with pytest.raises(TypeError, match="kernel must be a Triton kernel"):
        D.rope_unsloth_repro(x, torch.zeros(4, 4), torch.zeros(4, 4), seq_len=4, kernel=plain)


def test_unit_roundoff_is_half_of_eps():
    assert D.unit_roundoff("bf16") == 2 ** -8          # 8 significant bits: 7 stored + 1
    assert D.unit_roundoff(torch.float16) == 2 ** -11
    assert D.unit_roundoff("fp32") == 2 ** -24
    with pytest.raises(ValueError, match="dtype"):
        D.unit_roundoff("fp8")
    # one rounding to nearest of 1 + 3u/2 (between 1 and 1 + 2u) is off by u/2 relative
    x = torch.tensor(1 + 3 * 2 ** -9, dtype=torch.float64)
    assert abs(float(x.to(torch.bfloat16)) - float(x)) <= D.unit_roundoff("bf16") * float(x)


def test_one_ulp_up_and_steps_apart():
    t = torch.tensor([[1.0, 0.0], [0.5, -0.25], [1.0, 0.0]])
    up = D.one_ulp_up(t)
    assert torch.equal(up[0], t[0])                    # position 0: cos 1, sin 0 stay exact
    assert up[1, 0] == 0.5 + 2 ** -24 and up[1, 1] == -0.25 + 2 ** -26   # spacing 2^-23 x 2^e
    assert up[2, 0] == 1.0 + 2 ** -23 and up[2, 1] == torch.finfo(torch.float32).tiny * 2 ** -23
    assert torch.equal(t[1], torch.tensor([0.5, -0.25]))   # the input is not changed
    assert D.steps_apart(up, t).tolist() == [[0, 0], [1, 1], [1, 1]]
    b = torch.tensor([1.0, -1.0, 0.0, -0.0, 2.0], dtype=torch.bfloat16)
    c = torch.tensor([1.0 + 2 ** -7, -1.0 - 2 ** -7, 0.0, 0.0, 1.0], dtype=torch.bfloat16)
    # neighbours, neighbours, +0 vs +0, -0 vs +0 (one value), 2 vs 1: the 128 values of [1, 2)
    assert D.steps_apart(b, c).tolist() == [1, 1, 0, 0, 128]
    tiny = torch.tensor([-2 ** -133], dtype=torch.bfloat16)     # smallest bf16 subnormal
    assert D.steps_apart(tiny, -tiny).tolist() == [2]           # -tiny, 0, +tiny
    with pytest.raises(ValueError, match="dtype"):
        D.steps_apart(b, c.float())
    with pytest.raises(TypeError, match="floating"):
        D.one_ulp_up(torch.arange(3))


def test_normwise_error_on_known_pairs():
    x = torch.tensor([[3.0, 0.0, 4.0, 1.0]], dtype=torch.float64)     # rotate-half: (0,2), (1,3)
    ref = torch.tensor([[1.0, 2.0, 5.0, -1.0]], dtype=torch.float64)
    got = torch.tensor([[1.5, 2.0, 4.0, -1.25]], dtype=torch.float64)
    e = D.normwise_error(got, ref, x)
    # |1.5-1|/(3+4), 0/(0+1), |4-5|/(4+3), 0.25/(1+0)
    assert torch.allclose(e, torch.tensor([[0.5 / 7, 0.0, 1 / 7, 0.25]], dtype=torch.float64))
    ei = D.normwise_error(got, ref, x, interleaved=True)           # pairs (0,1), (2,3)
    assert torch.allclose(ei, torch.tensor([[0.5 / 3, 0.0, 1 / 5, 0.25 / 5]],
                                           dtype=torch.float64))
    ep = D.normwise_error(got, ref, x, rot_dim=2)                  # pair (0,1); 2, 3 pass through
    assert torch.allclose(ep, torch.tensor([[0.5 / 3, 0.0, 1 / 4, 0.25 / 1]],
                                           dtype=torch.float64))
    z = torch.zeros(1, 2, dtype=torch.float64)                     # a zero pair
    assert D.normwise_error(z, z, z).tolist() == [[0.0, 0.0]]
    assert D.normwise_error(torch.tensor([[1e-3, 0.0]]), z, z)[0, 0] == float("inf")
    with pytest.raises(ValueError, match="rot_dim"):
        D.normwise_error(got, ref, x, rot_dim=3)
    with pytest.raises(ValueError, match="shape"):
        D.normwise_error(got[:, :2], ref, x)


def test_normwise_error_is_fair_to_a_bf16_table_and_harsh_to_a_wrong_angle():
    # one rounding of an exact rotation: <= u norm-wise, whatever the ulps near zero say
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 2, 16, generator=g, dtype=torch.float64).to(torch.bfloat16)
    f = angles(64, 16).double()
    exact = reference.rope_reference(x.double(), f)
    u = D.unit_roundoff("bf16")
    once = exact.to(torch.bfloat16)
    assert float(D.normwise_error(once, exact, x).max()) <= u
    c16, s16 = torch.cos(f[:, 0, 0]).to(torch.bfloat16), torch.sin(f[:, 0, 0]).to(torch.bfloat16)
    table16 = reference.rope_reference(x, cos=c16, sin=s16, compute_dtype=torch.float32)
    nw = float(D.normwise_error(table16, exact, x).max()) / u
    assert 1.0 < nw <= 2.5                                         # the table adds about u
    assert float(D.ulp_error(table16, exact).max()) > 4            # ... many ulps near zero
    shifted = reference.rope_reference(x.double(), angles(65, 16).double()[1:])  # s + 1
    assert float(D.normwise_error(shifted, exact, x).max()) / u > D.LAYOUT_NORMWISE_U


def test_recovered_positions_read_back_the_position(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 40, 3, 16, generator=g, dtype=torch.float64).to(device)   # bshd
    s = torch.arange(40, dtype=torch.float64).view(-1, 1, 1)
    for interleaved in (False, True):
        f = angles(80, 16, interleaved=interleaved, device=device).double()
        y = reference.rope_reference(x, f[:40], layout="bshd", interleaved=interleaved)
        got = D.recovered_positions(x, y, "bshd", interleaved=interleaved).cpu()
        assert got.shape == (40, 2, 3) and torch.allclose(got, s.expand(40, 2, 3), atol=1e-6)
        y2 = reference.rope_reference(x, f[::2][:40], layout="bshd", interleaved=interleaved)
        assert torch.allclose(D.recovered_positions(x, y2, "bshd", interleaved=interleaved).cpu(),
                              2 * s.expand(40, 2, 3), atol=1e-6)   # every other angle: 2s
    # partial rotary: only the first R features are read
    f8 = angles(40, 8, device=device).double()
    y8 = reference.rope_reference(x, f8, layout="bshd")
    assert torch.allclose(D.recovered_positions(x, y8, "bshd", rot_dim=8).cpu(),
                          s.expand(40, 2, 3), atol=1e-6)
    with pytest.raises(ValueError, match="layout"):
        D.recovered_positions(x, y8, "thd")
    with pytest.raises(ValueError, match="rot_dim"):
        D.recovered_positions(x, y8, "bshd", rot_dim=18)


def test_one_ulp_sincos_fails_default_allclose_and_passes_dtype_tolerances(device):
    # 65 536 elements: a one-ulp change of sin/cos flips a bf16 rounding about once in 30 000
    sc = D.Scenario(seq_len=128, batch=2, heads=4, head_dim=64)
    r = D.reproduce(sc, dataclasses.replace(D.FIXED, sincos_one_ulp=True), device=device)
    d, dt = D.diagnose(r), D.diagnose(r, "dtype")
    assert d["first_ten_equal"] and not d["allclose"] and dt["allclose"], d
    assert 0 < d["n_mismatched"] <= 1e-3 * d["numel"]
    assert d["verdict"] == "tolerance" and d["triton_max_ulp"] <= 1.0
    if r.te_label == "TE emulation":     # the same table unmoved agrees bit for bit
        assert d["max_steps_apart"] == 1
        ctl = D.reproduce(sc, dataclasses.replace(D.FIXED, sincos_in_kernel=False), device=device)
        assert D.diagnose(ctl)["n_differ"] == 0


def test_classify_follows_the_decision_table(device):
    cases = {"precision": D.REPRO,
             "layout": dataclasses.replace(D.FIXED, te_freqs_reshaped=True)}
    for want, causes in cases.items():
        d = D.diagnose(D.reproduce(SMALL, causes, device=device))
        assert D.classify(d) == d["verdict"] == want, (want, d)
    d = D.diagnose(D.reproduce(SMALL, D.REPRO, device=device))
    assert d["triton_max_ulp"] > 4 and d["triton_max_normwise_u"] <= 3   # bf16, not wrong
    base = {"n_differ": 3, "te_max_ulp": 0.5, "triton_max_ulp": 1.0, "te_max_normwise_u": 0.9,
            "triton_max_normwise_u": 1.1}
    assert D.classify(base) == "tolerance"
    assert D.classify({**base, "n_differ": 0}) == "equal"
    assert D.classify({**base, "triton_max_ulp": 30.0}) == "precision"
    assert D.classify({**base, "te_max_normwise_u": 500.0}) == "layout"
    assert set(D.DECISIONS) == {"equal", "tolerance", "precision", "layout"}
    toggles = {t for row in D.DECISIONS.values() for t in row["toggles"]}
    assert toggles <= {f.name for f in dataclasses.fields(D.Causes)}


def test_flush_device_prints_puts_c_stdout_before_the_hosts_next_print():
    # the device's lines reach C's stdout (block-buffered into a pipe, as under Jupyter): without
    # the flush they would come out at exit, after the host's print (written at once)
    code = ("import ctypes; from ropelib.course import debug\n"
            "ctypes.CDLL(None).printf(b'device line\\n')\n"
            "debug.flush_device_prints(pause=0)\n"
            "print('host line', flush=True)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # C's buffer kept
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["device line", "host line"]
