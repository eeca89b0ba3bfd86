"""ropelib.debug: the allclose failure reproduced, every cause switchable, the tools to find it."""
import dataclasses

import pytest
import torch

from ropelib import debug as D
from ropelib import reference
from ropelib.compare import angles

SMALL = D.Scenario(seq_len=16, batch=2, heads=2, head_dim=16)


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
