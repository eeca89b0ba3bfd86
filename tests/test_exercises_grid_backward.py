"""Notebooks 04 and 06: the kernel exercises (exercises.grid_kernel, exercises.backward_kernel)
and the launcher / autograd.Function checks of notebook 06 (exercises.kernels).

Each check launches the learner's kernel itself, or runs the learner's function on fresh inputs;
every known way to pass it without doing the exercise must fail (ropelib's kernels, its finished
API and the worked solution itself included), and a learner's own copy of the worked solution
must pass.
"""
import inspect
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import reference, runtime  # noqa: E402
from ropelib.course.exercises import backward_kernel as bk  # noqa: E402
from ropelib.course.exercises import grid_kernel as gk  # noqa: E402
from ropelib.course.exercises import kernels as ex  # noqa: E402
from ropelib.course.kernels import batch_reuse  # noqa: E402
from ropelib.course.kernels.batch_reuse import rope_batch_reuse  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import load_file, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INTERPRETER_ONLY = pytest.mark.skipif(not runtime.INTERPRET,
                                      reason="counting cos/sin needs Triton's interpreter")
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it
OWN_FORWARD = learner_copy(gk._rope_batch_reuse_solution_kernel)     # exercise 4 of notebook 04
OWN_BACKWARD = learner_copy(bk._rope_backward_solution_kernel)       # exercise 2 of notebook 06


# --- known cheats and mistakes, each with the exercise's signature -------------------------------

@triton.jit
def _blank(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
           ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """A docstring and a pass: not answered yet."""
    pass  # your code


@triton.jit
def _writes_nothing(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
                    ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr):
    s = tl.program_id(0)
    offs = tl.arange(0, BLOCK_HALF)
    tl.load(x_ptr + s * sxs + offs * sxd, mask=offs < ROT_HALF)  # reads, stores nothing


@triton.jit
def _copies_input(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
                  ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr):
    # "returning the input": y = x, every element written
    s = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.arange(0, 2 * BLOCK_HALF)
    m = offs < 2 * ROT_HALF
    p = 2 * ROT_HALF + tl.arange(0, BLOCK_PASS)
    for b in range(0, B):
        x_row = x_ptr + s * sxs + b * sxb + h * sxh
        y_row = y_ptr + s * sys_ + b * syb + h * syh
        tl.store(y_row + offs, tl.load(x_row + offs * sxd, mask=m), mask=m)
        tl.store(y_row + p, tl.load(x_row + p * sxd, mask=p < D), mask=p < D)


@triton.jit
def _rotate(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
            ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
            ONE_BATCH: tl.constexpr, TRIG_IN_LOOP: tl.constexpr, PASS: tl.constexpr,
            CONTIGUOUS: tl.constexpr, SIGN: tl.constexpr, SWAP: tl.constexpr,
            ONE_ANGLE: tl.constexpr):
    """A correct forward kernel with switches that each plant one mistake (or the backward)."""
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < ROT_HALF
    theta1 = tl.load(freqs_ptr + s * 2 * ROT_HALF + offs, mask=mask, other=0.0)
    theta2 = tl.load(freqs_ptr + s * 2 * ROT_HALF + ROT_HALF + offs, mask=mask, other=0.0)
    if ONE_ANGLE:  # the first half's angle for both halves: right for TE's cat(f, f) table only
        theta2 = theta1
    c1, c2 = tl.cos(theta1), tl.cos(theta2)
    if SWAP:
        s1, s2 = SIGN * tl.sin(theta2), SIGN * tl.sin(theta1)
    else:
        s1, s2 = SIGN * tl.sin(theta1), SIGN * tl.sin(theta2)
    p = 2 * ROT_HALF + tl.arange(0, BLOCK_PASS)
    n_b = 1 if ONE_BATCH else B
    for b in range(0, n_b):
        if CONTIGUOUS:  # ignores the strides it was given
            x_row = x_ptr + s * sys_ + b * syb + h * syh   # y's (contiguous) strides
            step = 1
        else:
            x_row = x_ptr + s * sxs + b * sxb + h * sxh
            step = sxd
        if TRIG_IN_LOOP:  # right values, but cos/sin once per row instead of once per program
            c1, c2 = tl.cos(theta1), tl.cos(theta2)
            s1, s2 = SIGN * tl.sin(theta1), SIGN * tl.sin(theta2)
        y_row = y_ptr + s * sys_ + b * syb + h * syh
        x1 = tl.load(x_row + offs * step, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (offs + ROT_HALF) * step, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, (x1 * c1 - x2 * s1).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + ROT_HALF + offs, (x2 * c2 + x1 * s2).to(y_ptr.dtype.element_ty),
                 mask=mask)
        if PASS:
            tl.store(y_row + p, tl.load(x_row + p * step, mask=p < D), mask=p < D)


class _Switched:
    """_rotate with some switches fixed: looks like a kernel with the exercise's signature."""

    def __init__(self, **switches):
        opts = dict(ONE_BATCH=False, TRIG_IN_LOOP=False, PASS=True, CONTIGUOUS=False, SIGN=1,
                    SWAP=False, ONE_ANGLE=False)
        opts.update(switches)
        self.opts = opts

    def __getitem__(self, grid):
        return lambda *args, **kw: _rotate[grid](*args, **kw, **self.opts)


class _KernelLike(_Switched, triton.runtime.KernelInterface):
    """Registered as a Triton kernel, so the checks launch it (its source is _rotate's)."""
    src = "def _rotate():\n    return 0\n"


def _mistake(**switches):
    return _KernelLike(**switches)


def _reference_fn(x, freqs):
    return reference.rope_reference(x, freqs)


@triton.jit
def _calls_library_helper(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
                          ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                          BLOCK_PASS: tl.constexpr):
    """The worked forward with its rotation done by ropelib's @triton.jit helper."""
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < ROT_HALF
    theta1 = tl.load(freqs_ptr + s * 2 * ROT_HALF + offs, mask=mask, other=0.0)
    theta2 = tl.load(freqs_ptr + s * 2 * ROT_HALF + ROT_HALF + offs, mask=mask, other=0.0)
    c1, s1, c2, s2 = tl.cos(theta1), tl.sin(theta1), tl.cos(theta2), tl.sin(theta2)
    p = 2 * ROT_HALF + tl.arange(0, BLOCK_PASS)
    for b in range(0, B):
        x_row = x_ptr + s * sxs + b * sxb + h * sxh
        y_row = y_ptr + s * sys_ + b * syb + h * syh
        x1 = tl.load(x_row + offs * sxd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (offs + ROT_HALF) * sxd, mask=mask, other=0.0).to(tl.float32)
        y1, y2 = common.rotate_pair(x1, x2, c1, s1, c2, s2)
        tl.store(y_row + offs, y1.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + ROT_HALF + offs, y2.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + p, tl.load(x_row + p * sxd, mask=p < D), mask=p < D)


def _launcher_of(kernel):
    """A learner's launcher (notebook 06, exercise 3) of `kernel`: grid (S, H), contiguous grad_x."""
    def my_rope_backward(grad_y, freqs):
        S, B, H, D = grad_y.shape
        R = freqs.shape[-1]
        f2 = freqs.reshape(freqs.shape[0], R)[:S].float().contiguous()
        grad_x = torch.empty(grad_y.shape, dtype=grad_y.dtype, device=grad_y.device)
        kernel[(S, H)](grad_y, grad_x, f2, B, *grad_y.stride(), grad_x.stride(0),
                       grad_x.stride(1), grad_x.stride(2), D, ROT_HALF=R // 2,
                       BLOCK_HALF=triton.next_power_of_2(R // 2),
                       BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)))
        return grad_x
    return my_rope_backward


own_rope_backward = _launcher_of(OWN_BACKWARD)


# --- notebook 04: the batch-reusing kernel -------------------------------------------------------

def test_batch_reuse_check_accepts_an_own_copy_of_the_solution(capsys):
    assert gk.check_batch_reuse_kernel(OWN_FORWARD) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (gk._rope_batch_reuse_solution_kernel, "launched ropelib's _rope_batch_reuse_solution_kernel"),
    (batch_reuse._rope_batch_reuse_kernel, "launched ropelib's _rope_batch_reuse_kernel"),
    (_calls_library_helper, "launched ropelib's rotate_pair (ropelib/kernels/common.py)"),
], ids=["worked-solution", "teaching-kernel", "library-helper"])
def test_batch_reuse_check_refuses_ropelibs_kernels(answer, words, capsys):
    assert gk.check_batch_reuse_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ batch-reusing kernel: this exercise wants your batch-reusing kernel")
    assert words in out, out


_NOTEBOOK_ANSWER = """


@triton.jit
def my_batch_reuse_kernel(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
                          ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                          BLOCK_PASS: tl.constexpr):
    # the "answer": the notebook's own teaching kernel called as a helper
    _rope_batch_reuse_v2(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
                         ROT_HALF, BLOCK_HALF, BLOCK_PASS)
"""


def _notebook_cells() -> str:
    """A notebook's cells as a file: a teaching kernel it defines before its exercises (the
    worked forward under a teaching name), then an answer that calls it."""
    teaching = textwrap.dedent(inspect.getsource(gk._rope_batch_reuse_solution_kernel.fn))
    return ("import triton\nimport triton.language as tl\n\n\n"
            + teaching.replace("_rope_batch_reuse_solution_kernel", "_rope_batch_reuse_v2")
            + _NOTEBOOK_ANSWER)


def test_batch_reuse_check_refuses_a_kernel_the_notebook_itself_defines(tmp_path, monkeypatch,
                                                                      capsys):
    # notebook 04 defines its versions 1 and 2 in cells: neither file nor name is ropelib's, so
    # only the notebook's namespace says they are the notebook's and not the learner's
    cells = written_module("notebook_cells", tmp_path / "notebook_cells.py", _notebook_cells())
    answer = cells.my_batch_reuse_kernel
    assert gk.check_batch_reuse_kernel(answer) is True       # outside a notebook: a helper
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "__main__", cells)      # the notebook's namespace
    from ropelib.course.exercises import own_code
    assert own_code.notebook_kernels() == (cells._rope_batch_reuse_v2,)   # not my_...
    assert gk.check_batch_reuse_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ batch-reusing kernel: this exercise wants your batch-reusing kernel")
    assert "_rope_batch_reuse_v2" in out, out
    # the learner's own kernel stays theirs under another name (notebook 08 binds its combine
    # to the name the later cells use), and so does a kernel whose function is named my_...
    monkeypatch.setattr(cells, "later_name", cells.my_batch_reuse_kernel, raising=False)
    monkeypatch.setattr(cells, "renamed", cells._rope_batch_reuse_v2, raising=False)
    assert own_code.notebook_kernels() == (cells._rope_batch_reuse_v2,) * 2
    monkeypatch.delattr(cells, "my_batch_reuse_kernel")
    assert own_code.notebook_kernels() == (cells._rope_batch_reuse_v2,) * 2   # by its name


def test_the_planted_mistakes_harness_is_right_when_nothing_is_planted(capsys):
    # the cheats below differ from a correct kernel in one switch each
    assert gk.check_batch_reuse_kernel(_mistake()) is True, capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (..., "no answer yet"),
    (None, "no answer yet"),
    (_blank, "no answer yet"),
    (_reference_fn, "expected a @triton.jit kernel"),       # returning the reference
    (lambda x, freqs: x, "expected a @triton.jit kernel"),  # returning the input
    (_writes_nothing, "nothing was written"),
    (_copies_input, "entries differ"),                       # the input, through a kernel
], ids=["ellipsis", "none", "blank", "reference", "input", "writes-nothing", "copies-input"])
def test_batch_reuse_check_rejects_cheats(answer, words, capsys):
    assert gk.check_batch_reuse_kernel(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and words in out, out


@pytest.mark.parametrize("switches, words", [
    (dict(ONE_BATCH=True), "only batch entry b = 0"),
    (dict(PASS=False), "pass-through features"),
    (dict(CONTIGUOUS=True), "non-contiguous"),
    (dict(SIGN=-1, SWAP=True), "entries differ"),            # the backward, not the forward
], ids=["ignores-batch-loop", "no-partial-rotary", "ignores-strides", "backward"])
def test_batch_reuse_check_rejects_mistakes(switches, words, capsys):
    assert gk.check_batch_reuse_kernel(_mistake(**switches)) is False
    out = capsys.readouterr().out
    assert "❌" in out and words in out, out


def test_batch_reuse_check_rejects_a_kernel_that_reads_only_the_first_halfs_angle(capsys):
    # with TE's table both halves of a pair share one angle, so such a kernel is right there;
    # the cases whose halves hold different angles must refuse it
    te_only = [c for c in gk._forward_cases(torch.Generator().manual_seed(4))
               if "different angles" not in c[0]]
    mistake = _mistake(ONE_ANGLE=True)
    for label, x, f2 in te_only:
        torch.testing.assert_close(gk.launch(mistake, x, f2), reference.rope_reference(x, f2),
                                   msg=label)
    assert gk.check_batch_reuse_kernel(mistake) is False
    out = capsys.readouterr().out
    assert "❌" in out and "halves with different angles" in out and "entries differ" in out, out


@INTERPRETER_ONLY
def test_batch_reuse_check_rejects_cos_sin_in_the_loop(capsys):
    assert gk.check_batch_reuse_kernel(_mistake(TRIG_IN_LOOP=True)) is False
    assert "compute them once per program" in capsys.readouterr().out


def test_blank_detection():
    assert gk.is_blank_kernel(_blank)
    assert not gk.is_blank_kernel(_writes_nothing)
    assert not gk.is_blank_kernel(gk._rope_batch_reuse_solution_kernel)


@INTERPRETER_ONLY
def test_the_reuse_check_counts_cos_and_sin_per_program_not_per_batch_row():
    """The check's counter (count_work) sees the teaching kernel's cos/sin once per (s, h)
    program: the same count for a batch of 1 and of 3."""
    from ropelib.course.work_count import count_work
    counted = []
    for B in (1, 3):
        with count_work() as work:
            rope_batch_reuse(torch.randn(2, B, 2, 16), torch.randn(2, 16))
        counted.append((work.programs, work.sincos))
    assert counted[0] == counted[1]
    assert counted[0][0] == 2 * 2 and counted[0][1] > 0


# --- notebook 06: the backward kernel ------------------------------------------------------------

def test_backward_check_accepts_own_kernels(capsys):
    assert bk.check_backward_kernel(OWN_BACKWARD) is True
    assert "✅" in capsys.readouterr().out
    assert bk.check_backward_kernel(_mistake(SIGN=-1, SWAP=True)) is True


@pytest.mark.parametrize("answer, words", [
    (bk._rope_backward_solution_kernel, "launched ropelib's _rope_backward_solution_kernel"),
    (batch_reuse._rope_batch_reuse_kernel, "launched ropelib's _rope_batch_reuse_kernel"),
], ids=["worked-solution", "teaching-kernel"])
def test_backward_check_refuses_ropelibs_kernels(answer, words, capsys):
    assert bk.check_backward_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ backward kernel: this exercise wants your backward kernel")
    assert words in out, out


@pytest.mark.parametrize("answer, words", [
    (_blank, "no answer yet"),
    (bk.reference_grad, "expected a @triton.jit kernel"),    # returning the reference
    (_copies_input, "entries differ"),                       # returning dL/dy
    (OWN_FORWARD, "entries differ"),                         # the forward kernel
    (_mistake(SIGN=-1), "halves with different angles"),     # negated sines, not swapped
    (_mistake(SIGN=-1, SWAP=True, ONE_BATCH=True), "only batch entry b = 0"),
    (_writes_nothing, "nothing was written"),
], ids=["blank", "reference", "input", "forward", "no-swap", "ignores-batch-loop",
        "writes-nothing"])
def test_backward_check_rejects_cheats(answer, words, capsys):
    assert bk.check_backward_kernel(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and words in out, out


# --- notebook 06: the backward matrix of one pair ------------------------------------------------

def _matrix_from_reference(theta):
    """Right values: the transposed Jacobian of ropelib.reference's RoPE of one pair."""
    freqs = torch.full((1, 1, 1, 2), float(theta))
    return torch.autograd.functional.jacobian(
        lambda v: reference.rope_reference(v.view(1, 1, 1, 2), freqs).view(2),
        torch.zeros(2, dtype=torch.float64)).T


def test_backward_matrix_check_wants_the_learners_matrix(capsys):
    assert ex.check_backward_matrix(learner_copy(ex.solution_backward_matrix)) is True
    torch.testing.assert_close(_matrix_from_reference(0.3), ex.solution_backward_matrix(0.3))
    for library in (_matrix_from_reference, ex.solution_backward_matrix, ex._jacobian_pair):
        assert ex.check_backward_matrix(library) is False
        out = capsys.readouterr().out
        assert "this exercise wants your matrix, but the answer called ropelib's" in out, out


# --- notebook 06: the launcher and the autograd.Function -----------------------------------------

def _pytorch_backward(grad_y, freqs):
    """Right values in plain PyTorch, written out: no kernel."""
    f = freqs.reshape(freqs.shape[0], 1, 1, -1)[: grad_y.shape[0]]
    g1, g2 = grad_y.chunk(2, dim=-1)
    f1, f2 = f.chunk(2, dim=-1)
    return torch.cat((g1 * f1.cos() + g2 * f2.sin(), g2 * f2.cos() - g1 * f1.sin()), dim=-1)


def test_rope_backward_check_accepts_an_own_launcher_of_an_own_kernel(capsys):
    assert ex.check_rope_backward(own_rope_backward) is True
    assert ex.check_rope_backward(own_rope_backward, kernel=OWN_BACKWARD) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (lambda g, f: ropelib.apply_rope(g, -f), "called ropelib's apply_rope (ropelib/api.py)"),
    (lambda g, f: rope_batch_reuse(g, f, backward=True), "called ropelib's rope_batch_reuse"),
    (ex.solution_rope_backward, "called ropelib's solution_rope_backward"),
    (_launcher_of(bk._rope_backward_solution_kernel),
     "launched ropelib's _rope_backward_solution_kernel"),
    (bk.reference_grad, "called ropelib's reference_grad"),
], ids=["apply_rope(g, -f)", "teaching-kernel", "worked-solution", "worked-kernel",
        "autograd-of-reference"])
def test_rope_backward_check_refuses_library_answers(answer, words, capsys):
    if answer is not bk.reference_grad:    # right values: only whose code it is makes it fail
        g = torch.randn(2, 2, 1, 8)
        f = ex.te_angles(2, 8, device=g.device)
        torch.testing.assert_close(answer(g, f), bk.reference_grad(g, f), atol=1e-5, rtol=1e-5)
    assert ex.check_rope_backward(answer, kernel=OWN_BACKWARD) is False
    out = capsys.readouterr().out
    assert "this exercise wants your launcher of your backward kernel" in out and words in out, out
    assert ex.check_rope_backward(answer) is False      # without naming the kernel, too


def test_rope_backward_check_wants_the_named_kernel(capsys):
    other = _launcher_of(_mistake(SIGN=-1, SWAP=True))   # right, but not exercise 2's kernel
    assert ex.check_rope_backward(other) is True
    capsys.readouterr()
    assert ex.check_rope_backward(other, kernel=OWN_BACKWARD) is False
    assert "not your backward kernel" in capsys.readouterr().out
    assert ex.check_rope_backward(own_rope_backward, kernel=_blank) is False
    assert "still blank" in capsys.readouterr().out


def test_rope_backward_check_rejects_pytorch_and_wrong_answers(capsys):
    assert ex.check_rope_backward(_pytorch_backward) is False          # right values, no kernel
    assert "no Triton kernel" in capsys.readouterr().out
    assert ex.check_rope_backward(_launcher_of(OWN_FORWARD)) is False  # the forward
    assert ex.check_rope_backward(lambda g, f: g.clone()) is False
    assert ex.check_rope_backward(...) is False


def _launcher_of_a_whole_head_table(kernel):
    """A launcher that reads freqs as [S, D]: right while the table has S rows and R = D."""
    def my_rope_backward(grad_y, freqs):
        S, B, H, D = grad_y.shape
        f2 = freqs.reshape(S, D)
        grad_x = torch.empty(grad_y.shape, dtype=grad_y.dtype, device=grad_y.device)
        kernel[(S, H)](grad_y, grad_x, f2, B, *grad_y.stride(), grad_x.stride(0),
                       grad_x.stride(1), grad_x.stride(2), D, ROT_HALF=D // 2,
                       BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_PASS=1)
        return grad_x
    return my_rope_backward


def test_rope_backward_check_wants_partial_rotary_and_a_longer_table(capsys):
    answer = _launcher_of_a_whole_head_table(OWN_BACKWARD)
    g = torch.randn(3, 2, 2, 16)
    f = ex.te_angles(3, 16, device=g.device)
    torch.testing.assert_close(answer(g, f), bk.reference_grad(g, f), atol=1e-5, rtol=1e-5)
    assert ex.check_rope_backward(answer, kernel=OWN_BACKWARD) is False
    out = capsys.readouterr().out
    assert "❌" in out and "rotary dim 16 of 24, a table of 5 positions" in out, out


def _launch_beside(kernel, on_zeros=False):
    """A launcher that launches `kernel` (into a buffer of its own, or on zero gradients) and
    returns plain PyTorch's gradient: a launch beside the answer, not the answer."""
    launch = _launcher_of(kernel)

    def my_rope_backward(grad_y, freqs):
        launch(torch.zeros_like(grad_y) if on_zeros else grad_y, freqs)
        return _pytorch_backward(grad_y, freqs)
    return my_rope_backward


@pytest.mark.parametrize("answer", [_launch_beside(_writes_nothing),
                                    _launch_beside(OWN_BACKWARD, on_zeros=True)],
                         ids=["kernel-writes-nothing", "own-kernel-on-zeros"])
def test_rope_backward_check_wants_the_kernels_output_returned(answer, capsys):
    assert ex.check_rope_backward(answer) is False
    assert "no tensor it wrote holds grad_x" in capsys.readouterr().out


def _pytorch_backward_any_rotary(grad_y, freqs):
    """Right values in plain PyTorch for a rotary dim R <= D and a table of P >= S positions."""
    R = freqs.shape[-1]
    rotated = _pytorch_backward(grad_y[..., :R], freqs[:grad_y.shape[0]])
    return torch.cat((rotated, grad_y[..., R:]), dim=-1)


def test_rope_backward_check_wants_the_tensor_its_kernel_wrote(capsys):
    # the learner's kernel launched on grad_y and right, but the answer returns another tensor:
    # a gradient computed beside the launch, or a copy of the kernel's output
    launch = _launcher_of(OWN_BACKWARD)

    def beside(grad_y, freqs):
        launch(grad_y, freqs)
        return _pytorch_backward_any_rotary(grad_y, freqs)

    def copied(grad_y, freqs):
        return launch(grad_y, freqs).clone()

    g = torch.randn(2, 3, 1, 24)
    f = ex.te_angles(5, 16, device=g.device)                       # partial rotary, P > S
    torch.testing.assert_close(beside(g, f), launch(g, f), atol=1e-5, rtol=1e-5)
    for answer in (beside, copied):
        assert ex.check_rope_backward(answer, kernel=OWN_BACKWARD) is False
        assert "returned another tensor" in capsys.readouterr().out
    # a view of the tensor the kernel wrote into is that tensor
    assert ex.check_rope_backward(lambda g, f: launch(g, f).view(g.shape),
                                  kernel=OWN_BACKWARD) is True


@triton.jit
def _store_as(value, dtype: tl.constexpr, rtne: tl.constexpr):
    """round_to's place in notebook 06's kernel cell, with no ropelib helper: a plain cast."""
    return value.to(dtype)


def test_rope_backward_check_refuses_the_notebooks_section_2_kernel(tmp_path, capsys,
                                                                    monkeypatch):
    # as the notebook has it (round_to is ropelib's): refused by that helper's name, as the
    # exercise's text says
    rope_cell = _notebook_rope_cell(tmp_path)
    assert ex.check_rope_backward(lambda g, f: rope_cell(g, f, backward=True),
                                  kernel=OWN_BACKWARD) is False
    out = capsys.readouterr().out
    assert "this exercise wants your launcher of your backward kernel" in out, out
    assert "round_to" in out, out
    # with the cell edited to store without round_to, the kernel the notebook defines (in
    # __main__) is barred itself, also beside a launch of the learner's kernel
    import sys
    (tmp_path / "edited").mkdir()
    edited = _notebook_rope_cell(tmp_path / "edited", round_to=_store_as)
    monkeypatch.setattr(sys.modules["__main__"], "_rope_batch_reuse_kernel",
                        edited.__globals__["_rope_batch_reuse_kernel"], raising=False)
    launch = _launcher_of(OWN_BACKWARD)

    def beside(grad_y, freqs):
        launch(grad_y, freqs)
        return edited(grad_y, freqs, backward=True)

    assert ex.check_rope_backward(beside, kernel=OWN_BACKWARD) is False
    out = capsys.readouterr().out
    assert "this exercise wants your launcher of your backward kernel" in out, out
    assert "_rope_batch_reuse_kernel" in out, out


def _function(forward, backward):
    return type("Candidate", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _bwd_saved_freqs(ctx, g):
    (freqs,) = ctx.saved_tensors[-1:]
    return own_rope_backward(g, freqs), None           # the learner's launcher and kernel


def _bwd_teaching_kernel(ctx, g):
    (freqs,) = ctx.saved_tensors[-1:]
    return rope_batch_reuse(g, freqs, backward=True), None   # ropelib's, not the learner's


def _bwd_finished_api(ctx, g):
    (freqs,) = ctx.saved_tensors[-1:]
    return ropelib.apply_rope(g, -freqs), None


def _fwd_saves_x(ctx, x, freqs):
    ctx.save_for_backward(x, freqs)
    return own_rope_backward(x, -freqs)


def _fwd_ctx_attribute(ctx, x, freqs):
    ctx.x = x                     # not through save_for_backward: invisible to saved_tensors
    ctx.save_for_backward(freqs)
    return own_rope_backward(x, -freqs)


_STASH = []


def _fwd_global(ctx, x, freqs):
    _STASH.append(x)              # parked outside ctx
    ctx.save_for_backward(freqs)
    return own_rope_backward(x, -freqs)


def _fwd_saves_copy(ctx, x, freqs):
    ctx.save_for_backward(x.detach().clone(), freqs)   # a copy: x itself may die
    return own_rope_backward(x, -freqs)


def _fwd_saves_output(ctx, x, freqs):
    y = own_rope_backward(x, -freqs)
    ctx.y = y.detach()
    ctx.save_for_backward(freqs)
    return y


def _fwd_kernel(ctx, x, freqs):
    ctx.save_for_backward(freqs)
    return own_rope_backward(x, -freqs)       # the learner's backward kernel at -theta


def _fwd_teaching_kernel(ctx, x, freqs):
    ctx.save_for_backward(freqs)
    return rope_batch_reuse(x, freqs)          # ropelib's teaching kernel: not the learner's


def _fwd_finished_api(ctx, x, freqs):
    ctx.save_for_backward(freqs)
    return ropelib.apply_rope(x, freqs)                # the finished kernel, with its autograd


def _fwd_reference(ctx, x, freqs):
    ctx.save_for_backward(freqs)
    return reference.rope_reference(x, freqs)          # ropelib's plain PyTorch reference


def _fwd_pytorch(ctx, x, freqs):
    ctx.save_for_backward(freqs)
    f = freqs.view(freqs.shape[0], 1, 1, -1)[: x.shape[0]]
    x1, x2 = x.chunk(2, dim=-1)
    return x * f.cos() + torch.cat((-x2, x1), dim=-1) * f.sin()   # own PyTorch, no kernel


def _bwd_reference(ctx, g):
    (freqs,) = ctx.saved_tensors
    with torch.enable_grad():
        return ex._reference_grad(g, freqs), None      # autograd of the reference, no kernel


def _bwd_pytorch(ctx, g):
    (freqs,) = ctx.saved_tensors
    return _pytorch_backward(g, freqs), None           # own PyTorch, no kernel


def _bwd_recompute(ctx, g):
    x, freqs = ctx.saved_tensors
    with torch.enable_grad():
        x = x.detach().double().requires_grad_()
        (gx,) = torch.autograd.grad(reference.rope_reference(x, freqs), x, g.double())
    return gx.to(g.dtype), None


def _bwd_forward(ctx, g):
    (freqs,) = ctx.saved_tensors
    return _launcher_of(OWN_FORWARD)(g, freqs), None   # rotates the wrong way


def _bwd_launch_beside(ctx, g):
    (freqs,) = ctx.saved_tensors[-1:]
    return _launch_beside(OWN_BACKWARD, on_zeros=True)(g, freqs), None


def test_rope_function_check_wants_the_kernels_gradient(capsys):
    cheat = _function(_fwd_kernel, _bwd_launch_beside)   # launches, returns PyTorch's values
    assert ex.check_rope_function(cheat) is False
    assert "no tensor it wrote holds grad_x" in capsys.readouterr().out
    assert ex.check_rope_function(cheat, kernel=OWN_BACKWARD) is False


def test_rope_function_check_accepts_an_own_function(capsys):
    own = _function(_fwd_kernel, _bwd_saved_freqs)    # forward: the own kernel at -theta
    assert ex.check_rope_function(own) is True
    assert "✅" in capsys.readouterr().out
    assert ex.check_rope_function(own, kernel=OWN_BACKWARD) is True


def _notebook_rope_cell(folder, round_to=common.round_to):
    """Notebook 06's section-2 kernel cell and its launcher `rope_cell`, compiled from the
    notebook's source in a file of their own, as the notebook's kernel runs them (`round_to`:
    the helper the kernel stores through, ropelib's unless a test edits the cell)."""
    import ast
    path = ROOT / "notebooks" / "06-backward-pass.py"
    text = path.read_text(encoding="utf-8")
    wanted = ("_rope_batch_reuse_kernel", "rope_cell")
    parts = [ast.get_source_segment(text, node, padded=False) for node in ast.parse(text).body
             if isinstance(node, ast.FunctionDef) and node.name in wanted]
    assert len(parts) == 2, "notebook 06 no longer defines its kernel cell and rope_cell"
    source = "@triton.jit\n" + "\n\n\n".join(parts)      # the decorator is not in the segment
    return written_module("notebook06_rope_cell", folder / "notebook06_rope_cell.py", source,
                          {"torch": torch, "triton": triton, "tl": tl,
                           "round_to": round_to, "BF16_RTNE": common.BF16_RTNE}).rope_cell


def test_rope_function_check_refuses_a_forward_through_the_notebooks_rope_cell(
        tmp_path, capsys, monkeypatch):
    # exercise 4's forward must launch the learner's own kernel: section 2's kernel, which
    # rope_cell launches, is one the notebook teaches, so it is barred as the notebook defines it
    # (in __main__), in the forward and in the backward
    import sys
    rope_cell = _notebook_rope_cell(tmp_path)
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "_rope_batch_reuse_kernel",
                        rope_cell.__globals__["_rope_batch_reuse_kernel"], raising=False)

    def fwd(ctx, x, freqs):
        ctx.save_for_backward(freqs)
        return rope_cell(x, freqs)

    def bwd_cell(ctx, g):
        (freqs,) = ctx.saved_tensors
        return rope_cell(g, freqs, backward=True), None

    assert ex.check_rope_function(_function(fwd, _bwd_saved_freqs), kernel=OWN_BACKWARD) is False
    out = capsys.readouterr().out
    assert "(forward)" in out and "_rope_batch_reuse_kernel" in out, out
    assert ex.check_rope_function(_function(_fwd_kernel, bwd_cell), kernel=OWN_BACKWARD) is False
    assert "(backward)" in capsys.readouterr().out
    # the learner's own forward beside it still passes
    assert ex.check_rope_function(_function(_fwd_kernel, _bwd_saved_freqs),
                                  kernel=OWN_BACKWARD) is True


def _fwd_saves_negated_freqs(ctx, x, freqs):
    ctx.save_for_backward(-freqs, freqs)       # small, but not only freqs
    return own_rope_backward(x, -freqs)


def _fwd_saves_cos_sin(ctx, x, freqs):
    ctx.cos, ctx.sin = freqs.cos(), freqs.sin()   # tables as attributes, beside freqs
    ctx.save_for_backward(freqs)
    return own_rope_backward(x, -freqs)


def _fwd_freqs_attribute(ctx, x, freqs):
    ctx.freqs = freqs                          # freqs itself, as an attribute: allowed
    return own_rope_backward(x, -freqs)


def _bwd_freqs_attribute(ctx, g):
    return own_rope_backward(g, ctx.freqs), None


def test_rope_function_check_accepts_freqs_kept_as_an_attribute(capsys):
    assert ex.check_rope_function(_function(_fwd_freqs_attribute, _bwd_freqs_attribute),
                                  kernel=OWN_BACKWARD) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (ex.SolutionRopeFunction, "called ropelib's forward (ropelib/course/exercises/kernels.py)"),
    (_function(_fwd_kernel, _bwd_teaching_kernel), "backward): this exercise wants your "
     "autograd.Function's backward, with your own kernel, but the answer called ropelib's "
     "rope_batch_reuse"),
    (_function(_fwd_kernel, _bwd_finished_api), "called ropelib's apply_rope"),
    (_function(_fwd_finished_api, _bwd_saved_freqs), "(forward): this exercise wants your "
     "autograd.Function, its forward with a kernel of yours, but the "
     "answer called ropelib's apply_rope"),
    (_function(_fwd_teaching_kernel, _bwd_saved_freqs), "(forward): this exercise wants your "
     "autograd.Function, its forward with a kernel of yours, but the "
     "answer called ropelib's rope_batch_reuse"),
    (_function(_fwd_reference, _bwd_saved_freqs), "called ropelib's rope_reference"),
    (_function(_fwd_kernel, _bwd_reference), "called ropelib's _reference_grad"),
], ids=["worked-solution", "teaching-kernel-backward", "finished-api-backward",
        "finished-api-forward", "teaching-kernel-forward", "reference-forward",
        "reference-backward"])
def test_rope_function_check_refuses_library_answers(answer, words, capsys):
    assert ex.check_rope_function(answer, kernel=OWN_BACKWARD) is False
    out = capsys.readouterr().out
    assert words in out, out
    assert ex.check_rope_function(answer) is False


def test_rope_function_check_wants_the_named_kernel(capsys):
    other = _function(_fwd_kernel, lambda ctx, g: (_launcher_of(_mistake(SIGN=-1, SWAP=True))(
        g, ctx.saved_tensors[0]), None))
    assert ex.check_rope_function(other) is True
    assert ex.check_rope_function(other, kernel=OWN_BACKWARD) is False
    assert "not your backward kernel" in capsys.readouterr().out


@pytest.mark.parametrize("forward, backward, words", [
    (_fwd_saves_x, _bwd_saved_freqs, "x is still alive"),
    (_fwd_ctx_attribute, _bwd_saved_freqs, "x is still alive"),
    (_fwd_global, _bwd_saved_freqs, "x is still alive"),
    (_fwd_saves_copy, _bwd_recompute, "as large as x"),
    (_fwd_saves_output, _bwd_saved_freqs, "as large as x"),
    (_fwd_pytorch, _bwd_saved_freqs, "forward launched no Triton kernel"),
    (_fwd_kernel, _bwd_pytorch, "backward launched no Triton kernel"),
    (_fwd_kernel, _bwd_forward, "entries differ"),
    (_fwd_saves_negated_freqs, _bwd_saved_freqs, "Keep only freqs"),
    (_fwd_saves_cos_sin, _bwd_saved_freqs, "Keep only freqs"),
], ids=["save_for_backward-x", "ctx.x", "global", "saved-copy-recompute", "saved-output",
        "pytorch-forward", "pytorch-backward", "wrong-direction", "saves-negated-freqs",
        "keeps-cos-sin"])
def test_rope_function_check_rejects_shortcuts(forward, backward, words, capsys):
    _STASH.clear()
    assert ex.check_rope_function(_function(forward, backward)) is False
    out = capsys.readouterr().out
    assert "❌" in out and words in out, out
    _STASH.clear()


def test_rope_function_check_unanswered(capsys):
    assert ex.check_rope_function(...) is False
    assert ex.check_rope_function(_function(lambda ctx, x, f: None, lambda ctx, g: None)) is False
    assert "❌" in capsys.readouterr().out


# --- the notebooks show the signatures the checks launch -----------------------------------------

@pytest.mark.parametrize("notebook, signature", [
    ("04-batch-reuse-grid-kernel.py", gk.KERNEL_SIGNATURE),
    ("06-backward-pass.py", bk.BACKWARD_KERNEL_SIGNATURE),
])
def test_notebook_exercise_cell_has_the_launched_signature(notebook, signature):
    text = (ROOT / "notebooks" / notebook).read_text(encoding="utf-8")
    assert signature in text


def test_no_solution_is_used_before_its_exercise():
    # notebook 04 used solution_floor_ms before exercise 2: no worked solution (and no check)
    # may be called before the exercises start
    import re
    for notebook in ("04-batch-reuse-grid-kernel.py", "06-backward-pass.py"):
        text = (ROOT / "notebooks" / notebook).read_text(encoding="utf-8")
        before = text[:text.index("## Exercises")]
        used = re.findall(r"\bsolution\(|solution_\w+|Solution\w+|show_solution|check_\w+", before)
        assert not used, (notebook, used)


@triton.jit
def _trig_in_the_loop(x_ptr, y_ptr, freqs_ptr, B, sxs, sxb, sxh, sxd, sys_, syb, syh, D,
                      ROT_HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                      BLOCK_PASS: tl.constexpr):
    """Right outputs, cos/sin evaluated again for every batch entry (a @triton.jit kernel, so
    the interpreter can count it on a GPU machine too)."""
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < ROT_HALF
    p = 2 * ROT_HALF + tl.arange(0, BLOCK_PASS)
    for b in range(0, B):
        theta1 = tl.load(freqs_ptr + s * 2 * ROT_HALF + offs, mask=mask, other=0.0)
        theta2 = tl.load(freqs_ptr + s * 2 * ROT_HALF + ROT_HALF + offs, mask=mask, other=0.0)
        x_row = x_ptr + s * sxs + b * sxb + h * sxh
        y_row = y_ptr + s * sys_ + b * syb + h * syh
        x1 = tl.load(x_row + offs * sxd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (offs + ROT_HALF) * sxd, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * tl.cos(theta1) - x2 * tl.sin(theta1)
        y2 = x2 * tl.cos(theta2) + x1 * tl.sin(theta2)
        tl.store(y_row + offs, y1.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + ROT_HALF + offs, y2.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + p, tl.load(x_row + p * sxd, mask=p < D), mask=p < D)


@INTERPRETER_ONLY
def test_the_reuse_count_runs_where_kernels_are_compiled_too(monkeypatch, capsys):
    # On a GPU machine the check counts cos/sin in the interpreter, on CPU tensors
    # (work_count.interpreted): simulated here with runtime.INTERPRET switched off
    monkeypatch.setattr(gk.runtime, "INTERPRET", False)
    assert gk.check_batch_reuse_kernel(OWN_FORWARD) is True
    assert "cos/sin computed once per program" in capsys.readouterr().out
    assert gk.check_batch_reuse_kernel(_trig_in_the_loop) is False
    assert "compute them once per program" in capsys.readouterr().out
