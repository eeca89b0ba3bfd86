"""Notebook 01's kernel exercise (exercises.nb01_angle_kernel): the check accepts a learner's
copy of the worked solution and refuses a blank kernel, a plain function, a library helper,
hard-coded angles or base, a missing mask and an unmasked store; it never raises."""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib.course.exercises import nb01_angle_kernel as ex  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
learner_copy = load_file("own_code_tests_nb01", ROOT / "tests" / "test_own_code.py").learner_copy


@triton.jit
def my_blank(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    ...


@triton.jit
def my_fixed_base(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    """theta_j = 10000^(-2j/D) typed in, not read from inv_ptr."""
    m = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    live = i < D
    x = tl.load(x_ptr + m * D + i, mask=live, other=0.0)
    xp = tl.load(x_ptr + m * D + (i ^ 1), mask=live, other=0.0)
    theta = tl.exp(-(2.0 * (i // 2).to(tl.float32) / D) * 9.210340371976184)
    a = (start + m).to(tl.float32) * theta
    rot = tl.where(i % 2 == 0, -xp, xp)
    tl.store(y_ptr + m * D + i, x * tl.cos(a) + rot * tl.sin(a), mask=live)


@triton.jit
def my_no_start(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    """Position m instead of start + m."""
    m = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    live = i < D
    x = tl.load(x_ptr + m * D + i, mask=live, other=0.0)
    xp = tl.load(x_ptr + m * D + (i ^ 1), mask=live, other=0.0)
    a = m.to(tl.float32) * tl.load(inv_ptr + i // 2, mask=live, other=0.0)
    rot = tl.where(i % 2 == 0, -xp, xp)
    tl.store(y_ptr + m * D + i, x * tl.cos(a) + rot * tl.sin(a), mask=live)


@triton.jit
def my_unmasked_store(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    """The loads masked, the store not: lanes D..BLOCK-1 write past the row."""
    m = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    live = i < D
    x = tl.load(x_ptr + m * D + i, mask=live, other=0.0)
    xp = tl.load(x_ptr + m * D + (i ^ 1), mask=live, other=0.0)
    a = (start + m).to(tl.float32) * tl.load(inv_ptr + i // 2, mask=live, other=0.0)
    rot = tl.where(i % 2 == 0, -xp, xp)
    tl.store(y_ptr + m * D + i, x * tl.cos(a) + rot * tl.sin(a))


@triton.jit
def my_tile_of_d(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    """tl.arange(0, D): right for D = 8, refused for D = 80."""
    m = tl.program_id(0)
    i = tl.arange(0, D)
    x = tl.load(x_ptr + m * D + i)
    xp = tl.load(x_ptr + m * D + (i ^ 1))
    a = (start + m).to(tl.float32) * tl.load(inv_ptr + i // 2)
    rot = tl.where(i % 2 == 0, -xp, xp)
    tl.store(y_ptr + m * D + i, x * tl.cos(a) + rot * tl.sin(a))


@triton.jit
def my_library_helper(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    """Right, but the rotation is ropelib's rotate_pair."""
    m = tl.program_id(0)
    j = tl.arange(0, BLOCK // 2)
    live = j < D // 2
    xa = tl.load(x_ptr + m * D + 2 * j, mask=live, other=0.0)
    xb = tl.load(x_ptr + m * D + 2 * j + 1, mask=live, other=0.0)
    a = (start + m).to(tl.float32) * tl.load(inv_ptr + j, mask=live, other=0.0)
    c, s = tl.cos(a), tl.sin(a)
    ya, yb = common.rotate_pair(xa, xb, c, s, c, s)
    tl.store(y_ptr + m * D + 2 * j, ya, mask=live)
    tl.store(y_ptr + m * D + 2 * j + 1, yb, mask=live)


def test_accepts_a_learners_copy_of_the_solution(capsys):
    for seed in (0, 1, None):
        assert ex.check_angle_kernel(learner_copy(ex.solution_angle_kernel), seed=seed)
    assert "✅" in capsys.readouterr().out


def test_refuses_the_worked_solution_itself(capsys):
    assert not ex.check_angle_kernel(ex.solution_angle_kernel, seed=0)
    assert "❌" in capsys.readouterr().out


def test_refuses_blank_and_plain_functions(capsys):
    assert not ex.check_angle_kernel(my_blank)
    assert not ex.check_angle_kernel(...)
    assert not ex.check_angle_kernel(lambda x, inv, start: ropelib.apply_rope)
    out = capsys.readouterr().out
    assert "no kernel yet" in out and "expected a @triton.jit kernel" in out


def test_refuses_wrong_kernels(capsys):
    for kernel in (my_fixed_base, my_no_start, my_unmasked_store, my_tile_of_d):
        assert not ex.check_angle_kernel(kernel, seed=3), kernel.fn.__name__
    out = capsys.readouterr().out
    assert "outside y" in out and "power of 2" in out


def test_refuses_ropelibs_helper(capsys):
    assert not ex.check_angle_kernel(my_library_helper, seed=0)
    assert "❌" in capsys.readouterr().out
