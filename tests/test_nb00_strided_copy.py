"""Notebook 00's exercise 4 (`nb00_strided_copy.check_strided_copy`): a copy on a grid of a
fixed number of programs, checked in Triton's interpreter.

A learner's own copy of the worked kernel passes; the notebook's `copy_kernel` (one block a
program), a kernel that reads its blocks twice, a blank kernel and the worked solution itself
fail.
"""
import inspect
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course.exercises import nb00_strided_copy as ex  # noqa: E402
from loading import learner_copy  # noqa: E402


@triton.jit
def my_one_block_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # notebook 00's copy_kernel: one block a program, as if the grid covered n
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def my_reads_twice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # right output, but every block loaded twice
    p, P = tl.program_id(0), tl.num_programs(0)
    for start in range(p * BLOCK, n, P * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(x_ptr + offs, mask=mask)
        b = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, a + (b - b), mask=mask)


@triton.jit
def my_blank_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass  # your code


def test_the_learners_own_kernel_passes(capsys):
    assert ex.check_strided_copy(learner_copy(ex._strided_copy_solution_kernel)) is True
    assert "✅ a copy on a fixed grid" in capsys.readouterr().out


def test_one_block_a_program_fails(capsys):
    assert ex.check_strided_copy(my_one_block_kernel) is False
    assert "elements of y left unwritten" in capsys.readouterr().out


def test_reading_x_twice_fails(capsys):
    assert ex.check_strided_copy(my_reads_twice_kernel) is False
    assert "elements of x read" in capsys.readouterr().out


def test_blank_kernel_and_the_worked_solution_fail(capsys):
    assert ex.check_strided_copy(my_blank_kernel) is False
    assert "no answer yet" in capsys.readouterr().out
    assert ex.check_strided_copy(ex._strided_copy_solution_kernel) is False
    assert "write it yourself" in capsys.readouterr().out


def test_a_python_function_fails(capsys):
    assert ex.check_strided_copy(lambda x: x.clone()) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


def test_the_signature_shown_is_the_solutions():
    shown = ex.STRIDED_COPY_SIGNATURE.split("):")[0].replace("my_strided_copy_kernel", "")
    src = inspect.getsource(ex._strided_copy_solution_kernel.fn).split("):")[0]
    assert shown.replace("@triton.jit\ndef (", "") == \
        src.replace("@triton.jit\ndef _strided_copy_solution_kernel(", "")
