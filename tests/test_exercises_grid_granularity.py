"""Notebook 04's exercise 5 (exercises.grid_kernel.check_granularity): a kernel with a ROWS knob
(batch rows per program, grid (S, H, B // ROWS)) and the learner's prediction of the work one
launch issues, both checked in Triton's interpreter.

A learner's own copy of the worked kernel and prediction must pass; a blank kernel, a kernel
that evaluates cos/sin once per row instead of once per program, a kernel that skips rows, the
worked solution itself, a kernel that launches a teaching kernel of ropelib's, and a prediction
that calls ropelib (or is wrong) must fail.
"""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course.exercises import grid_kernel as gk  # noqa: E402
from ropelib.course.kernels import ablation  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it
OWN_KERNEL = learner_copy(gk._rope_granular_solution_kernel)
OWN_WORK = learner_copy(gk.solution_granular_work)


def _own_work_written_differently(S, B, H, D, rows):
    per_program = {"sincos": 2 * D, "angle_loads": D}
    programs = (S * B * H) // rows
    out = {k: v * programs for k, v in per_program.items()}
    out.update(programs=programs, x_loads=S * B * H * D)
    return out


@triton.jit
def _blank(x_ptr, y_ptr, freqs_ptr, B, H, ROWS, HALF: tl.constexpr):
    pass  # your code


@triton.jit
def _trig_per_row(x_ptr, y_ptr, freqs_ptr, B, H, ROWS, HALF: tl.constexpr):
    # right outputs, but cos/sin inside the loop: once per row, not once per program
    s, h, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs = tl.arange(0, HALF)
    for i in range(0, ROWS):
        theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
        theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
        row = ((s * B + g * ROWS + i) * H + h) * 2 * HALF
        x1 = tl.load(x_ptr + row + offs)
        x2 = tl.load(x_ptr + row + HALF + offs)
        tl.store(y_ptr + row + offs, x1 * tl.cos(theta1) - x2 * tl.sin(theta1))
        tl.store(y_ptr + row + HALF + offs, x2 * tl.cos(theta2) + x1 * tl.sin(theta2))


@triton.jit
def _first_row_only(x_ptr, y_ptr, freqs_ptr, B, H, ROWS, HALF: tl.constexpr):
    # one row per program whatever ROWS: right at ROWS = 1, rows left NaN above it
    s, h, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    row = ((s * B + g * ROWS) * H + h) * 2 * HALF
    x1 = tl.load(x_ptr + row + offs)
    x2 = tl.load(x_ptr + row + HALF + offs)
    tl.store(y_ptr + row + offs, x1 * tl.cos(theta1) - x2 * tl.sin(theta1))
    tl.store(y_ptr + row + HALF + offs, x2 * tl.cos(theta2) + x1 * tl.sin(theta2))


@triton.jit
def _calls_teaching_helper(x_ptr, y_ptr, freqs_ptr, B, H, ROWS, HALF: tl.constexpr):
    # the worked kernel's structure, with the tile rotated by the ablation kernel's helper
    s, h, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    for i in range(0, ROWS):
        row = ((s * B + g * ROWS + i) * H + h) * 2 * HALF
        ablation._rotate_tile(x_ptr, y_ptr, row + offs, row + offs, offs < HALF,
                              cos1, sin1, cos2, sin2, HALF, False)


@triton.jit
def _reads_x_twice(x_ptr, y_ptr, freqs_ptr, B, H, ROWS, HALF: tl.constexpr):
    # right outputs, cos/sin once per program, but each half of a row loaded twice (the first
    # load's value thrown away): a prediction that counts the same passes the comparison
    s, h, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    for i in range(0, ROWS):
        row = ((s * B + g * ROWS + i) * H + h) * 2 * HALF
        x1 = tl.load(x_ptr + row + offs) * 0.0 + tl.load(x_ptr + row + offs)
        x2 = tl.load(x_ptr + row + HALF + offs) * 0.0 + tl.load(x_ptr + row + HALF + offs)
        tl.store(y_ptr + row + offs, x1 * cos1 - x2 * sin1)
        tl.store(y_ptr + row + HALF + offs, x2 * cos2 + x1 * sin2)


def test_a_kernel_that_reads_x_more_than_once_fails_even_when_predicted(capsys):
    def predicts_it(S, B, H, D, rows):
        programs = S * H * (B // rows)
        return dict(programs=programs, sincos=programs * 2 * D, angle_loads=programs * D,
                    x_loads=2 * S * B * H * D)
    assert not gk.check_granularity(_reads_x_twice, predicts_it)
    out = capsys.readouterr().out
    assert "❌" in out and "each element of x once, whatever the grid" in out, out


def test_own_kernel_and_prediction_pass(capsys):
    assert gk.check_granularity(OWN_KERNEL, OWN_WORK)
    assert gk.check_granularity(OWN_KERNEL, _own_work_written_differently)
    assert "✅" in capsys.readouterr().out


def test_blank_kernel_fails(capsys):
    assert not gk.check_granularity(_blank, OWN_WORK)
    assert "no answer yet" in capsys.readouterr().out


def test_trig_once_per_row_fails(capsys):
    assert not gk.check_granularity(_trig_per_row, OWN_WORK)
    assert "once per program" in capsys.readouterr().out


def test_skipped_rows_fail(capsys):
    assert not gk.check_granularity(_first_row_only, OWN_WORK)
    assert "not written" in capsys.readouterr().out


def test_worked_solution_and_teaching_kernels_refused(capsys):
    assert not gk.check_granularity(gk._rope_granular_solution_kernel, OWN_WORK)
    assert "write it yourself" in capsys.readouterr().out
    assert not gk.check_granularity(_calls_teaching_helper, OWN_WORK)
    assert "_rotate_tile" in capsys.readouterr().out


def test_prediction_that_calls_ropelib_is_refused(capsys):
    def from_the_library(S, B, H, D, rows):
        cols = ablation.shape_columns(S, B, H, D, dict(batch_per_program=rows))
        return gk.solution_granular_work(S, B, H, D, rows) if cols else None

    assert not gk.check_granularity(OWN_KERNEL, from_the_library)
    assert "your prediction" in capsys.readouterr().out
    assert not gk.check_granularity(OWN_KERNEL, gk.solution_granular_work)


def test_wrong_prediction_fails(capsys):
    def per_row(S, B, H, D, rows):   # cos/sin counted once per row: the naive kernel's count
        out = OWN_WORK(S, B, H, D, rows)
        out["sincos"] = S * B * H * 2 * D
        return out

    assert not gk.check_granularity(OWN_KERNEL, per_row)
    out = capsys.readouterr().out
    assert "sincos predicted" in out
    assert not gk.check_granularity(OWN_KERNEL, lambda *a: [1, 2, 3, 4])
    assert "dict" in capsys.readouterr().out


def test_counts_follow_the_grid():
    # the interpreter's counts of the worked kernel: programs and cos/sin divided by ROWS,
    # x read once whatever the grid
    x, f2 = torch.randn(2, 4, 3, 16), torch.rand(2, 16)
    counts = {rows: gk.count_granular(OWN_KERNEL, x, f2, rows)[1] for rows in (1, 4)}
    assert counts[1]["programs"] == 4 * counts[4]["programs"] == 2 * 4 * 3
    assert counts[1]["sincos"] == 4 * counts[4]["sincos"] == 24 * 2 * 16
    assert counts[1]["x_loads"] == counts[4]["x_loads"] == x.numel()
