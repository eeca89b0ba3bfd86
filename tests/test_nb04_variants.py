"""ropelib.course.nb04_variants: notebook 04's check of every ablation variant (section 5.3) on
a small bf16 shape in the interpreter, with launchers that are right, wrong, or right with other
bits, and the GPU branch's claim on a fake timer."""
import itertools

import pytest
import torch

from ropelib.bench import compare
from ropelib.course import nb04_variants as nv
from ropelib.course.kernels import ablation

S, B, H, D = 3, 2, 4, 16   # H = 4: a heads2 variant too; B = 2: one row and B rows differ


def _inputs():
    torch.manual_seed(0)
    x = torch.randn(S, B, H, D, dtype=torch.bfloat16)
    return x, compare.angles(S, D).view(S, D)


def course_launch(x, freqs2d, cos2d, sin2d, out=None, **opts):
    """The course's kernel, its output poisoned first (as the notebook's launcher does)."""
    y = torch.full_like(x, float("nan")) if out is None else out
    return ablation.rope_ablation(x, freqs2d, cos2d, sin2d, out=y, **opts)


def one_row_short(x, freqs2d, cos2d, sin2d, out=None, **opts):
    """The batch loop stopped one row early: the last batch row is never written."""
    y = course_launch(x, freqs2d, cos2d, sin2d, out=out, **opts)
    y[:, -1] = float("nan")
    return y


def last_bit_flipped(x, freqs2d, cos2d, sin2d, out=None, **opts):
    """The course's output with the last bit of the smallest element of the first head
    flipped: within 1 head ulp of fp64 (an ulp of that element is far smaller than one of the
    head's largest), but not the course kernel's bits."""
    y = course_launch(x, freqs2d, cos2d, sin2d, out=out, **opts)
    d = int(y[0, 0, 0].float().abs().argmin())
    y[0, 0, 0].view(torch.int16)[d] ^= 1
    return y


def fake_timer(us):
    """A timer returning ``us[name]`` for the launches in the order they alternate."""
    times = itertools.cycle([us[n] for n in nv.TIMED])
    return lambda call: next(times)


# what benchmarks/ablation.py's s4096-b8 row says, roughly: the programs, not the sin/cos
PROGRAMS_US = {"sh_loop_b": 100.0, "sh_one_b": 346.0, "sh_loop_b_table": 96.0,
               "sh_one_b_table": 345.0, nv.YOURS: 101.0}
# the ratio gone with the sin/cos: sh_one_b slow only because it evaluates B times the sines
SINES_US = {"sh_loop_b": 100.0, "sh_one_b": 346.0, "sh_loop_b_table": 96.0,
            "sh_one_b_table": 110.0, nv.YOURS: 101.0}


def test_same_launch_merges_warps_only_in_the_interpreter():
    variants = {name: opts for name, _, _, opts in ablation.variants(H)}
    interp = nv.same_launch(variants, warps_matter=False)
    gpu = nv.same_launch(variants, warps_matter=True)
    assert interp["sh_loop_b_w4"] == "sh_loop_b" and interp["sh_one_b"] == "sh_one_b"
    assert interp["heads4_loop_b_w8"] == "heads4_loop_b_w1"
    assert all(gpu[n] == n for n in variants)


def test_the_course_kernel_passes_every_check(capsys):
    x, freqs = _inputs()
    got = nv.assert_variants_match_fp64_and_course(course_launch, x, freqs, gpu=False)
    names = [name for name, _, _, _ in ablation.variants(H)]
    assert list(got["err"]) == names and "heads2_loop_b" in names
    assert all(e <= nv.MAX_HEAD_ULP for e in got["err"].values())
    assert all(got["same"].values()) and "us" not in got
    text = capsys.readouterr().out
    assert f"x [S={S}, B={B}, H={H}, D={D}] bf16 on cpu" in text
    assert "(here the same launch as sh_loop_b)" in text and "The timings need a GPU" in text


def test_a_row_left_unwritten_is_no_longer_rope():
    x, freqs = _inputs()
    with pytest.raises(AssertionError, match="no longer RoPE") as e:
        nv.assert_variants_match_fp64_and_course(one_row_short, x, freqs, gpu=False)
    assert "sh_loop_b" in str(e.value) and "heads_all_one_b_table" in str(e.value)


def test_correct_but_other_bits_fails_the_bit_check():
    x, freqs = _inputs()
    with pytest.raises(AssertionError, match="not the bits of the course's kernel") as e:
        nv.assert_variants_match_fp64_and_course(last_bit_flipped, x, freqs, gpu=False)
    assert "sh_one_b_table" in str(e.value)   # every variant, none above 1 head ulp


def test_gpu_branch_times_then_checks_the_programs_claim(capsys):
    x, freqs = _inputs()
    got = nv.assert_variants_match_fp64_and_course(course_launch, x, freqs, gpu=True,
                                                    timer=fake_timer(PROGRAMS_US))
    r = got["ratios"]
    assert r["one_row"] == pytest.approx(3.46) and r["one_row_table"] == pytest.approx(345 / 96)
    assert r["trig"]["sh_one_b"] == pytest.approx(346 / 345)
    assert r["per_round"] == pytest.approx([3.46] * 3) and got["us"][nv.YOURS] == 101.0
    text = capsys.readouterr().out
    assert "sh_loop_b: yours 101.0 us, the course's 100.0 us" in text
    assert "(here the same launch" not in text   # on a GPU num_warps makes its own launch


def test_gpu_branch_fails_when_the_sines_explain_the_ratio():
    x, freqs = _inputs()
    with pytest.raises(AssertionError, match="not the programs alone"):
        nv.assert_variants_match_fp64_and_course(course_launch, x, freqs, gpu=True,
                                                  timer=fake_timer(SINES_US))


def test_a_wrong_kernel_is_still_timed_before_it_fails(capsys):
    x, freqs = _inputs()
    with pytest.raises(AssertionError, match="no longer RoPE"):
        nv.assert_variants_match_fp64_and_course(one_row_short, x, freqs, gpu=True,
                                                  timer=fake_timer(PROGRAMS_US))
    assert "live: one row a program instead of B: 3.46x" in capsys.readouterr().out


@pytest.mark.parametrize("one_row_table, trig_one, ok", [
    (3.59, 1.00, True), (0.81 * 3.46, 1.09, True),
    (0.79 * 3.46, 1.00, False), (3.59, 1.11, False), (3.59, 0.89, False)])
def test_check_granularity_bounds(one_row_table, trig_one, ok):
    ratios = dict(one_row=3.46, one_row_table=one_row_table,
                  trig={"sh_loop_b": 1.04, "sh_one_b": trig_one}, per_round=[3.46])
    if ok:
        nv.check_granularity(ratios)
    else:
        with pytest.raises(AssertionError):
            nv.check_granularity(ratios)
