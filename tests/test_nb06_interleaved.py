"""Notebook 06's exercise 5 (`nb06_interleaved.check_interleaved_backward`): the backward kernel
for interleaved pairs, checked in Triton's interpreter.

A learner's own copy of the worked kernel passes; a kernel that negates the sines without
swapping them, the forward, rotate-half pairs, cos/sin in the batch loop, a kernel calling
ropelib's @triton.jit helper, ropelib's teaching kernel, a blank kernel, a Python function and
the worked solution itself fail.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course.exercises import nb06_interleaved as ex  # noqa: E402
from ropelib.course.kernels import batch_reuse  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import learner_copy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def _planted(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr, SIGN: tl.constexpr,
             SWAP: tl.constexpr, NEIGHBOURS: tl.constexpr, TRIG_PER_ROW: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    if NEIGHBOURS:
        a = 2 * tl.arange(0, HALF)
        b_ = a + 1
    else:                                       # rotate-half pairs: j with j + HALF
        a = tl.arange(0, HALF)
        b_ = a + HALF
    theta_a = tl.load(freqs_ptr + s * 2 * HALF + a)
    theta_b = tl.load(freqs_ptr + s * 2 * HALF + b_)
    c_a, c_b = tl.cos(theta_a), tl.cos(theta_b)
    if SWAP:
        s_a, s_b = SIGN * tl.sin(theta_b), SIGN * tl.sin(theta_a)
    else:
        s_a, s_b = SIGN * tl.sin(theta_a), SIGN * tl.sin(theta_b)
    for b in range(0, B):
        if TRIG_PER_ROW:                        # cos evaluated again for every batch row
            c_a, c_b = tl.cos(theta_a), tl.cos(theta_b)
        row = ((s * B + b) * H + h) * 2 * HALF
        g_a = tl.load(gy_ptr + row + a).to(tl.float32)
        g_b = tl.load(gy_ptr + row + b_).to(tl.float32)
        o_a, o_b = g_a * c_a - g_b * s_a, g_b * c_b + g_a * s_b
        tl.store(gx_ptr + row + a, o_a.to(gx_ptr.dtype.element_ty))
        tl.store(gx_ptr + row + b_, o_b.to(gx_ptr.dtype.element_ty))


@triton.jit
def my_negate_only_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    _planted(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF, -1, False, True, False)


@triton.jit
def my_forward_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    _planted(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF, 1, False, True, False)


@triton.jit
def my_rotate_half_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    _planted(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF, -1, True, False, False)


@triton.jit
def my_trig_per_row_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    _planted(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF, -1, True, True, True)


@triton.jit
def my_helper_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    # the right math, through ropelib's @triton.jit helper
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    a = 2 * tl.arange(0, HALF)
    theta_a = tl.load(freqs_ptr + s * 2 * HALF + a)
    theta_b = tl.load(freqs_ptr + s * 2 * HALF + a + 1)
    c_a, c_b = tl.cos(theta_a), tl.cos(theta_b)
    s_a, s_b = -tl.sin(theta_b), -tl.sin(theta_a)
    for b in range(0, B):
        row = ((s * B + b) * H + h) * 2 * HALF
        g_a = tl.load(gy_ptr + row + a).to(tl.float32)
        g_b = tl.load(gy_ptr + row + a + 1).to(tl.float32)
        o_a, o_b = common.rotate_pair(g_a, g_b, c_a, s_a, c_b, s_b)
        tl.store(gx_ptr + row + a, o_a.to(gx_ptr.dtype.element_ty))
        tl.store(gx_ptr + row + a + 1, o_b.to(gx_ptr.dtype.element_ty))


@triton.jit
def my_own_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    _planted(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF, -1, True, True, False)


@triton.jit
def my_blank_kernel(gy_ptr, gx_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    pass  # your code


def test_the_learners_own_kernel_passes(capsys):
    assert ex.check_interleaved_backward(learner_copy(
        ex._rope_interleaved_backward_solution_kernel)) is True
    assert "✅ interleaved backward" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (ex._rope_interleaved_backward_solution_kernel,
     "launched ropelib's _rope_interleaved_backward_solution_kernel"),
    (batch_reuse._rope_batch_reuse_kernel, "launched ropelib's _rope_batch_reuse_kernel"),
], ids=["worked-solution", "teaching-kernel"])
def test_ropelibs_kernels_are_refused(answer, words, capsys):
    assert ex.check_interleaved_backward(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ interleaved backward"), out
    assert words in out, out


def test_a_planted_kernel_without_mistakes_passes(capsys):
    assert ex.check_interleaved_backward(my_own_kernel) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (my_negate_only_kernel, "correct where a pair's two angles are equal"),
    (my_forward_kernel, "entries differ"),
    (my_rotate_half_kernel, "entries differ"),
    (my_trig_per_row_kernel, "sines and cosines where the grid (S, H) needs"),
    (my_helper_kernel, "launched ropelib's rotate_pair (ropelib/kernels/common.py)"),
    (my_blank_kernel, "no answer yet"),
    (ex.interleaved_grad, "expected a @triton.jit kernel"),
], ids=["negate-only", "forward", "rotate-half", "trig-per-row", "library-helper", "blank",
        "reference"])
def test_wrong_answers_fail(answer, words, capsys):
    assert ex.check_interleaved_backward(answer) is False
    out = capsys.readouterr().out
    assert words in out, out


def test_the_notebook_shows_the_checked_signature():
    with open(os.path.join(ROOT, "notebooks", "06-backward-pass.py"), encoding="utf-8") as f:
        assert ex.INTERLEAVED_SIGNATURE in f.read()


def test_the_signature_shown_is_the_solutions():
    import inspect
    shown = ex.INTERLEAVED_SIGNATURE.split("):")[0].replace(
        "my_interleaved_backward_kernel", "_rope_interleaved_backward_solution_kernel")
    assert inspect.getsource(ex._rope_interleaved_backward_solution_kernel.fn).startswith(shown)
