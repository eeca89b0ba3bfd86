"""Notebook 04's exercise 6 (`nb04_two_rows.check_two_rows`): a batch loop that loads rows b and
b + 1 before it stores either, checked in Triton's interpreter.

A learner's own copy of the worked kernel passes; the unchanged batch-reusing kernel (one row
loaded, then stored), a kernel that loads both rows but stores the first in between, one that
evaluates cos/sin once per row, a blank kernel and the worked solution itself fail.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course.exercises import nb04_two_rows as ex  # noqa: E402
from loading import learner_copy  # noqa: E402


@triton.jit
def my_one_row_kernel(x_ptr, y_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    # the batch-reusing kernel unchanged: one row loaded, then stored, then the next
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    for b in range(0, B):
        row = ((s * B + b) * H + h) * 2 * HALF
        x1 = tl.load(x_ptr + row + offs)
        x2 = tl.load(x_ptr + row + HALF + offs)
        tl.store(y_ptr + row + offs, x1 * cos1 - x2 * sin1)
        tl.store(y_ptr + row + HALF + offs, x2 * cos2 + x1 * sin2)


@triton.jit
def my_store_between_kernel(x_ptr, y_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    # two rows a trip, but row b stored before row b + 1 is loaded
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    step = H * 2 * HALF
    for b in range(0, B, 2):
        row = ((s * B + b) * H + h) * 2 * HALF
        pair = offs * 0 + b + 1 < B
        a1 = tl.load(x_ptr + row + offs)
        a2 = tl.load(x_ptr + row + HALF + offs)
        tl.store(y_ptr + row + offs, a1 * cos1 - a2 * sin1)
        tl.store(y_ptr + row + HALF + offs, a2 * cos2 + a1 * sin2)
        c1 = tl.load(x_ptr + row + step + offs, mask=pair, other=0.0)
        c2 = tl.load(x_ptr + row + step + HALF + offs, mask=pair, other=0.0)
        tl.store(y_ptr + row + step + offs, c1 * cos1 - c2 * sin1, mask=pair)
        tl.store(y_ptr + row + step + HALF + offs, c2 * cos2 + c1 * sin2, mask=pair)


@triton.jit
def my_trig_per_pair_kernel(x_ptr, y_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    # two rows before a store, but cos/sin evaluated again on every trip
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    step = H * 2 * HALF
    for b in range(0, B, 2):
        cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
        cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
        row = ((s * B + b) * H + h) * 2 * HALF
        pair = offs * 0 + b + 1 < B
        a1 = tl.load(x_ptr + row + offs)
        a2 = tl.load(x_ptr + row + HALF + offs)
        c1 = tl.load(x_ptr + row + step + offs, mask=pair, other=0.0)
        c2 = tl.load(x_ptr + row + step + HALF + offs, mask=pair, other=0.0)
        tl.store(y_ptr + row + offs, a1 * cos1 - a2 * sin1)
        tl.store(y_ptr + row + HALF + offs, a2 * cos2 + a1 * sin2)
        tl.store(y_ptr + row + step + offs, c1 * cos1 - c2 * sin1, mask=pair)
        tl.store(y_ptr + row + step + HALF + offs, c2 * cos2 + c1 * sin2, mask=pair)


@triton.jit
def my_blank_kernel(x_ptr, y_ptr, freqs_ptr, B, H, HALF: tl.constexpr):
    pass  # your code


def test_the_learners_own_kernel_passes(capsys):
    assert ex.check_two_rows(learner_copy(ex._rope_two_rows_solution_kernel)) is True
    assert "✅ two rows in flight" in capsys.readouterr().out


def test_the_unchanged_kernel_fails_two_rows_before_a_store(capsys):
    assert ex.check_two_rows(my_one_row_kernel) is False
    out = capsys.readouterr().out
    assert "correct outputs, but a program loaded only 16 elements of x before its first store" \
        in out, out


def test_a_store_between_the_two_rows_fails(capsys):
    assert ex.check_two_rows(my_store_between_kernel) is False
    assert "before its first store" in capsys.readouterr().out


def test_cos_sin_per_trip_fails(capsys):
    assert ex.check_two_rows(my_trig_per_pair_kernel) is False
    assert "sines and cosines where the grid (S, H) needs" in capsys.readouterr().out


def test_blank_kernel_and_the_worked_solution_fail(capsys):
    assert ex.check_two_rows(my_blank_kernel) is False
    assert "no answer yet" in capsys.readouterr().out
    assert ex.check_two_rows(ex._rope_two_rows_solution_kernel) is False
    assert "write it yourself" in capsys.readouterr().out


def test_the_signature_shown_is_the_solutions():
    shown = ex.TWO_ROWS_SIGNATURE.split("):")[0].replace("my_two_rows_kernel", "")
    import inspect
    src = inspect.getsource(ex._rope_two_rows_solution_kernel.fn).split("):")[0]
    assert shown.replace("@triton.jit\ndef (", "") == \
        src.replace("@triton.jit\ndef _rope_two_rows_solution_kernel(", "")
