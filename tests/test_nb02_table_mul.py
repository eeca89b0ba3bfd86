"""Notebook 02's exercise 5 (`nb02_table_mul.check_table_mul`): the broadcast multiply as a
Triton kernel that reads each table row once, checked in Triton's interpreter.

A learner's own copy of the worked kernel passes; a kernel that reloads the table row for every
tile of rows, one that leaves the last partial tile unwritten, one that writes a hard-coded
answer (x itself), a blank kernel, the worked solution itself and a Python function fail.
"""
import inspect
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course.exercises import nb02_table_mul as ex  # noqa: E402
from loading import learner_copy  # noqa: E402


@triton.jit
def my_reloading_kernel(x_ptr, c_ptr, y_ptr, N, D: tl.constexpr, ROWS: tl.constexpr):
    # right output, but the table row loaded again for every tile of rows
    s = tl.program_id(0)
    d = tl.arange(0, D)
    for r0 in range(0, N, ROWS):
        rows = r0 + tl.arange(0, ROWS)[:, None]
        at = (s * N + rows) * D + d[None, :]
        c = tl.load(c_ptr + s * D + d)[None, :]
        tl.store(y_ptr + at, tl.load(x_ptr + at, mask=rows < N) * c, mask=rows < N)


@triton.jit
def my_whole_tiles_kernel(x_ptr, c_ptr, y_ptr, N, D: tl.constexpr, ROWS: tl.constexpr):
    # the tiles that fit whole only: a partial last tile is never written
    s = tl.program_id(0)
    d = tl.arange(0, D)
    c = tl.load(c_ptr + s * D + d)[None, :]
    for r0 in range(0, N - ROWS + 1, ROWS):
        at = (s * N + r0 + tl.arange(0, ROWS)[:, None]) * D + d[None, :]
        tl.store(y_ptr + at, tl.load(x_ptr + at) * c)


@triton.jit
def my_copy_kernel(x_ptr, c_ptr, y_ptr, N, D: tl.constexpr, ROWS: tl.constexpr):
    # a hard-coded answer: y = x, the table never used
    s = tl.program_id(0)
    d = tl.arange(0, D)
    for r0 in range(0, N, ROWS):
        rows = r0 + tl.arange(0, ROWS)[:, None]
        at = (s * N + rows) * D + d[None, :]
        tl.store(y_ptr + at, tl.load(x_ptr + at, mask=rows < N), mask=rows < N)


@triton.jit
def my_blank_kernel(x_ptr, c_ptr, y_ptr, N, D: tl.constexpr, ROWS: tl.constexpr):
    pass  # your code


def test_the_learners_own_kernel_passes(capsys):
    assert ex.check_table_mul(learner_copy(ex._table_mul_solution_kernel)) is True
    assert "✅ the broadcast multiply" in capsys.readouterr().out


def test_reloading_the_table_fails(capsys):
    assert ex.check_table_mul(my_reloading_kernel) is False
    assert "elements of the table read" in capsys.readouterr().out


def test_a_partial_tile_left_unwritten_fails(capsys):
    assert ex.check_table_mul(my_whole_tiles_kernel) is False
    assert "left unwritten" in capsys.readouterr().out


def test_a_hard_coded_answer_fails(capsys):
    assert ex.check_table_mul(my_copy_kernel) is False
    assert "y differs from x * c" in capsys.readouterr().out


def test_blank_kernel_the_worked_solution_and_a_python_function_fail(capsys):
    assert ex.check_table_mul(my_blank_kernel) is False
    assert "no answer yet" in capsys.readouterr().out
    assert ex.check_table_mul(ex._table_mul_solution_kernel) is False
    assert "write it yourself" in capsys.readouterr().out
    assert ex.check_table_mul(lambda x, c: x * c) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


def test_the_signature_shown_is_the_solutions():
    shown = ex.TABLE_MUL_SIGNATURE.split("):")[0].replace("my_table_mul_kernel", "")
    src = inspect.getsource(ex._table_mul_solution_kernel.fn).split("):")[0]
    assert shown.replace("@triton.jit\ndef (", "") == \
        src.replace("@triton.jit\ndef _table_mul_solution_kernel(", "")


def test_the_notebook_hands_the_check_its_kernel():
    from pathlib import Path
    text = (Path(__file__).parents[1] / "notebooks" / "02-pytorch-reference-and-layouts.py"
            ).read_text()
    assert "nb02_table_mul.check_table_mul(my_table_mul_kernel)" in text
    assert ex.TABLE_MUL_SIGNATURE.split("    pass")[0].replace("@triton.jit\n", "") in text


def test_the_worked_kernel_compiles_for_sm90_with_wide_accesses_to_x():
    import re
    from ropelib.course.offline_compile import compiled_code
    t = torch.empty(1024, dtype=torch.bfloat16)
    ptx = compiled_code(ex._table_mul_solution_kernel,
                        dict(x_ptr=t, c_ptr=t, y_ptr=t, N=128, D=128, ROWS=16), num_warps=4)["ptx"]
    # x and y in 16-byte accesses (8 bf16 a lane); the table row, D elements, loaded once
    assert "ld.global.v4.b32" in ptx and set(re.findall(r"\bst\.global(?:\.\w+)+", ptx)) == \
        {"st.global.v4.b32"}
