"""Numbers and code notebook 06's prose states that no cell of it asserts: read from the code,
the computation and the committed files they come from."""
import inspect
import math
import re
from pathlib import Path

import torch

from ropelib import reference
from ropelib.course import measured
from ropelib.course.kernels import batch_reuse

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (ROOT / "notebooks" / "06-backward-pass.py").read_text()


def _jacobian(freqs_row):
    # section 1's `jacobian`: J [D, D] of the reference RoPE of one row
    d = freqs_row.numel()
    f = freqs_row.view(1, 1, 1, d).float()
    return torch.autograd.functional.jacobian(
        lambda v: reference.rope_reference(v.view(1, 1, 1, d), f).view(d),
        torch.zeros(d, dtype=torch.float64))


def test_section_1s_norm_range_for_halves_that_differ():
    # "the backward scales a gradient's norm by anything from 0.016 to 1.414": section 1's
    # table drawn as its cell draws it, on the CPU whatever the device
    torch.manual_seed(0)
    theta_any = torch.randn(8) * 3
    sv = torch.linalg.svdvals(_jacobian(theta_any).T)
    assert (f"{sv.min():.3f}", f"{sv.max():.3f}") == ("0.016", "1.414")
    # the squares of a block's two singular values sum to 2: none exceeds sqrt(2)
    assert sv.max() <= math.sqrt(2) + 1e-12
    assert "anything from 0.016 to\n# 1.414" in SOURCE


def test_section_1_quotes_the_backward_branch_of_section_2s_kernel():
    # "the forward's two lines with (s_a, s_b) replaced by (-s_b, -s_a), which is what the
    # `if BACKWARD:` branch of section 2's kernel does (`sin1 = -tl.sin(theta2)`, ...)"
    kernel = inspect.getsource(batch_reuse._rope_batch_reuse_kernel.fn)
    branch = kernel.split("if BACKWARD:")[1].split("else:")[0]
    assert "sin1 = -tl.sin(theta2)" in branch and "sin2 = -tl.sin(theta1)" in branch
    assert "y1 = x1 * cos1 - x2 * sin1" in kernel and "y2 = x2 * cos2 + x1 * sin2" in kernel


def test_section_2_1s_profile_and_timing_are_the_ablation_variants():
    # "That timing is not of this cell's source but of notebook 04's ablation kernel set up as
    # this kernel (`sh_loop_b_w4` and `sh_loop_b_w1` ...)"; "The same profile holds ropelib's
    # copy of section 2's kernel at its one warp (`batch_reuse`): 179.1 µs against the
    # variant's 178.5, 0.51 warp instructions an element against 0.49, 48 % occupancy both, the
    # same loads and stores. At four warps only the variant was profiled."
    prof = measured.mechanism("s4096-b8")
    own, w1, w4 = prof["batch_reuse"], prof["sh_loop_b_w1"], prof["sh_loop_b_w4"]
    assert own["kernel"] == "_rope_batch_reuse_kernel" and own["num_warps"] == 1
    assert w1["kernel"] == w4["kernel"] == "_rope_ablation_kernel"
    assert [f"{r['us']:.1f}" for r in (own, w1)] == ["179.1", "178.5"]
    assert [f"{r['ncu_warp_inst_per_element']:.2f}" for r in (own, w1)] == ["0.51", "0.49"]
    assert [round(r["ncu_achieved_occupancy_pct"]) for r in (own, w1)] == [48, 48]
    assert own["ptx_access_detail"] == w1["ptx_access_detail"]
    _, rows = measured.load("mechanism")
    assert {r["num_warps"] for r in rows if r["kernel"] == "_rope_batch_reuse_kernel"} == {1}
    abl = measured.timings("ablation", "s4096-b8")
    for v in ("sh_loop_b_w1", "sh_loop_b_w4"):
        assert abl[v]["description"].startswith("as sh_loop_b with num_warps=")
        assert (abl[v]["grid"], abl[v]["batch_loop"], abl[v]["cos_sin"]) == (
            "4096x32x1", "runtime", "computed")
    # notebook 05's A.1 sets sh_loop_b_w2's 178.1 beside batch_reuse's 179.1
    assert f"{prof['sh_loop_b_w2']['us']:.1f}" == "178.1"
    nb05 = (ROOT / "notebooks" / "05-finished-kernel.py").read_text()
    assert "takes 178.1 µs against\n# 179.1" in nb05


def test_section_3_1s_small_batch_steps_and_host_runs():
    gen_meta, gen_rows = measured.load("generations")
    assert gen_meta["gpu"] == "NVIDIA H200"
    kernels = ("ropelib_naive", "ropelib_batch_reuse", "ropelib")
    small = [r["fwdbwd_ms"] / r["fwd_ms"] for r in gen_rows
             if r["group"] == "batch" and r["provider"] in kernels and r["batch"] in (1, 2)
             and r.get("fwdbwd_ms")]
    # "at batches 1 and 2 it takes 2.67 to 6.62 forwards"
    assert len(small) == 6 and (f"{min(small):.2f}", f"{max(small):.2f}") == ("2.67", "6.62")
    assert "2.67 to 6.62 forwards" in SOURCE

    def trivial_on(name):
        log = (measured.RESULTS / name).read_text().splitlines()
        row = next(l for l in log if l.startswith("| trivial Function: forward+backward |"))
        return float(row.strip().strip("|").split("|")[1])

    # "Two H200 runs 44 minutes apart ... the trivial Function at 71.8 and 99.1 ... by 1.4 times
    # between the two H200 runs"
    early, late = (trivial_on(f"autograd_host-nvidia-h200-20261130-{t}.log")
                   for t in ("1352", "1436"))
    assert (early, late) == (71.8, 99.1) and round(late / early, 1) == 1.4
    assert (14 * 60 + 36) - (13 * 60 + 52) == 44
    assert re.search(r"Two H200 runs 44 minutes apart", SOURCE)
    assert "trivial Function at 71.8 and 99.1" in SOURCE
    assert "by 1.4 times between the two H200 runs" in " ".join(
        l.lstrip("# ") for l in SOURCE.splitlines())
