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
    assert ex.check_strided_copy(learner_copy(ex.solution_strided_copy_kernel)) is True
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
    assert ex.check_strided_copy(ex.solution_strided_copy_kernel) is False
    assert "write it yourself" in capsys.readouterr().out


def test_a_python_function_fails(capsys):
    assert ex.check_strided_copy(lambda x: x.clone()) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


def test_the_signature_shown_is_the_solutions():
    shown = ex.STRIDED_COPY_SIGNATURE.split("):")[0].replace("my_strided_copy_kernel", "")
    src = inspect.getsource(ex.solution_strided_copy_kernel.fn).split("):")[0]
    assert shown.replace("@triton.jit\ndef (", "") == \
        src.replace("@triton.jit\ndef solution_strided_copy_kernel(", "")


# --- the prediction: the most a fixed grid saves ----------------------------------------------

def my_max_saving_us(n, BLOCK, programs, sms, empty_programs, empty_us):
    # a learner's own: exercise 2's floor of each grid, one less the other
    def floor_us(p):
        return p / sms * (empty_us * 1e3 * sms / empty_programs) / 1e3
    return floor_us(-(-n // BLOCK)) - floor_us(programs)


def test_the_learners_own_prediction_passes(capsys):
    assert ex.check_max_saving(my_max_saving_us) is True
    assert "✅ the most a fixed grid saves" in capsys.readouterr().out


def test_the_worked_prediction_and_exercise_2s_solution_fail(capsys):
    from ropelib.course.exercises import nb00_program_floor as floor_ex
    assert ex.check_max_saving(ex.solution_max_saving_us) is False
    assert "write it yourself" in capsys.readouterr().out

    def via_the_worked_floor(n, BLOCK, programs, sms, empty_programs, empty_us):
        return (floor_ex.solution_program_floor_us(-(-n // BLOCK), sms, empty_programs, empty_us)
                - floor_ex.solution_program_floor_us(programs, sms, empty_programs, empty_us))
    assert ex.check_max_saving(via_the_worked_floor) is False
    assert "write it yourself" in capsys.readouterr().out


def test_a_hard_coded_prediction_and_a_floor_without_the_fixed_grid_fail(capsys):
    tour = my_max_saving_us(2048 * 4 * 16 * 128, 1024, 132, 132, 1_048_576, 633.0)
    assert ex.check_max_saving(lambda *args: tour) is False
    assert "❌ the most a fixed grid saves" in capsys.readouterr().out
    # right on the tour's two grids, a table made beforehand: the drawn cases refuse it
    table = {(2048 * 4 * 16 * 128, 1024, p, 132, 1_048_576, 633.0):
             my_max_saving_us(2048 * 4 * 16 * 128, 1024, p, 132, 1_048_576, 633.0)
             for p in (132, 16 * 132)}
    assert ex.check_max_saving(lambda *args: table.get(args, 0.0)) is False
    assert "drawn with seed" in capsys.readouterr().out

    def copy_kernels_floor_only(n, BLOCK, programs, sms, empty_programs, empty_us):
        return -(-n // BLOCK) * empty_us / empty_programs
    assert ex.check_max_saving(copy_kernels_floor_only) is False
    assert "❌" in capsys.readouterr().out


def test_the_notebook_hands_the_checks_its_functions():
    from loading import ROOT
    text = (ROOT / "notebooks" / "00-setup-and-tour.py").read_text(encoding="utf-8")
    assert "nb00_strided_copy.check_max_saving(my_max_saving_us)" in text
    assert "def my_max_saving_us(n, BLOCK, programs, sms, empty_programs, empty_us):\n    ...   #" \
        in text


# --- the notebook: ropelib's public names only -------------------------------------------------

def test_notebook_00_uses_only_public_ropelib_names():
    # the timing cell after exercise 4 launches the worked kernel by its public name
    import ast
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "notebooks" / "00-setup-and-tour.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots, private = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] == "ropelib"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ropelib"):
            roots |= {a.asname or a.name for a in node.names}
            private += [f"from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_")]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in roots:
                private.append(ast.unparse(node))
    assert "nb00_strided_copy" in roots and not private, private
    assert "nb00_strided_copy.solution_strided_copy_kernel" in path.read_text(encoding="utf-8")
    assert "solution_strided_copy_kernel" in ex.__all__
