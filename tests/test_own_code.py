"""ropelib.course.exercises.own_code: an answer runs with ropelib's own answers barred.

A call into the product (the public API, the operators, `ropelib.reference`), into the teaching
kernels, or into a function an exercise bars stops the answer; so does a launch of one of their
kernels, or of a kernel of the learner's that calls a barred @triton.jit helper, in any thread.
What an exercise allows, and everything it calls, runs. The block restores what it changed.

`learner_copy(obj)` is also used by the exercise tests: a worked solution compiled again from its
source in a file of its own, as a learner who typed it in a notebook would have it.
"""
import inspect
import itertools
import os
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import frequencies, reference, runtime  # noqa: E402
from ropelib.course.exercises import own_code  # noqa: E402
from ropelib.course.exercises.own_code import (LibraryAnswer, launch_barred,  # noqa: E402
                                               library_barred, library_kernel, run_own_code)
from ropelib.course import debug  # noqa: E402
from ropelib.course.kernels import batch_reuse, naive  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import scratch_folder, written_module  # noqa: E402

DEVICE = runtime.default_device()
INTERPRETER_ONLY = pytest.mark.skipif(not runtime.INTERPRET, reason="needs Triton's interpreter")

_COPIES = scratch_folder("ropelib-own-code-")
_count = itertools.count()


def learner_copy(obj):
    """`obj` (a function, class or @triton.jit kernel defined at module level) compiled again from
    its source, in a file of its own, with its module's names: the same code as a learner who
    copied it into a notebook would run, with code objects of its own."""
    fn = getattr(obj, "fn", obj)
    module = sys.modules[fn.__module__]
    source = textwrap.dedent(inspect.getsource(fn))
    path = _COPIES / f"learner_{fn.__name__}_{next(_count)}.py"
    names = {k: v for k, v in vars(module).items() if k not in ("__file__", "__cached__")}
    return getattr(written_module(f"learner_{path.stem}", path, source, names), fn.__name__)


def _x():
    return torch.randn(3, 2, 2, 16, device=DEVICE), frequencies.rope_freqs(3, 16, device=DEVICE)


def _own_rope(x, freqs):
    """RoPE in plain PyTorch, written here: the learner's own answer."""
    f = freqs.view(freqs.shape[0], 1, 1, -1)[: x.shape[0]]
    x1, x2 = x.chunk(2, dim=-1)
    return x * f.cos() + torch.cat((-x2, x1), dim=-1) * f.sin()


@triton.jit
def _own_scale_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, 2.0 * tl.cos(tl.load(x_ptr + offs)))


@triton.jit
def _own_kernel_with_library_helper(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, common.round_to(tl.load(x_ptr + offs), tl.float32, False))


@triton.jit
def _own_kernel_with_own_helper(x_ptr, y_ptr, N: tl.constexpr):
    _own_helper_calling_library(x_ptr, y_ptr, N)


@triton.jit
def _own_helper_calling_library(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, common.round_to(tl.load(x_ptr + offs), tl.float32, False))


# --- functions ----------------------------------------------------------------------------------

def test_own_code_runs_and_returns_its_result(capsys):
    x, f = _x()
    ok, y = run_own_code("rope", "your RoPE", _own_rope, x, f)
    assert ok and torch.allclose(y, reference.rope_reference(x, f), atol=1e-5)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("answer, words", [
    (lambda x, f: ropelib.apply_rope(x, f), "ropelib's apply_rope (ropelib/api.py)"),
    (lambda x, f: reference.rope_reference(x, f),
     "ropelib's rope_reference (ropelib/reference.py)"),
    (lambda x, f: x * f.cos() + reference.rotate_half(x) * f.sin(), "ropelib's rotate_half"),
    (lambda x, f: torch.ops.ropelib.rope(x, f.view(3, 16), None, None, None, None, "sbhd",
                                         False, 1, 0, False, None), "(ropelib/ops.py)"),
    (lambda x, f: batch_reuse.rope_batch_reuse(x, f), "ropelib's rope_batch_reuse"),
    (lambda x, f: naive.rope_naive(x, f), "ropelib's rope_naive"),
    (lambda x, f: x * frequencies.rope_cos_sin(3, 16)[0].view(3, 1, 1, 16),
     "ropelib's rope_cos_sin (ropelib/frequencies.py)"),
], ids=["apply_rope", "reference", "rotate_half", "operator", "batch_reuse", "naive",
        "frequencies"])
def test_library_answers_are_refused(answer, words, capsys):
    x, f = _x()
    assert run_own_code("rope", "your RoPE", answer, x, f) == (False, None)
    out = capsys.readouterr().out
    assert out.startswith("❌ rope: this exercise wants your RoPE, but the answer called ")
    assert words in out, out


def test_a_library_call_caught_by_the_answer_is_still_refused(capsys):
    def sly(x, f):
        try:
            return ropelib.apply_rope(x, f)
        except LibraryAnswer:
            return _own_rope(x, f)
    x, f = _x()
    assert run_own_code("rope", "your RoPE", sly, x, f) == (False, None)
    assert "apply_rope" in capsys.readouterr().out


def test_bar_adds_functions_classes_and_kernels(capsys):
    m = torch.eye(2)
    assert run_own_code("m", "your matrix", lambda: torch.block_diag(m, m))[0]
    assert not run_own_code("m", "your matrix", lambda: torch.block_diag(m, m),
                            bar=(torch.block_diag,))[0]
    assert "block_diag (torch/functional.py)" in capsys.readouterr().out

    class Worked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g
    assert not run_own_code("f", "your Function", Worked.apply, torch.ones(2), bar=(Worked,))[0]
    x, f = _x()
    assert not run_own_code("f", "your RoPE", _own_rope, x, f, bar=(_own_rope,))[0]
    out = capsys.readouterr().out
    assert "called forward (test_own_code.py)" in out and "called _own_rope" in out


def test_allow_permits_a_module_and_all_it_calls(capsys):
    x, f = _x()
    # rope_batch_reuse calls naive's input checks, ropelib.validation and launches a kernel that
    # calls ropelib.kernels.common.round_to: all of it runs
    ok, y = run_own_code("fwd", "your Function", batch_reuse.rope_batch_reuse, x, f,
                         allow=(batch_reuse,))
    assert ok and torch.allclose(y, reference.rope_reference(x, f), atol=1e-5)
    # ...but only what is allowed: the finished API stays barred
    assert not run_own_code("fwd", "your Function", lambda: ropelib.apply_rope(x, f),
                            allow=(batch_reuse,))[0]
    # a function may be allowed on its own
    ok, table = run_own_code("t", "your kernel", lambda: frequencies.rope_freqs(3, 16),
                             allow=(frequencies.rope_freqs,))
    assert ok and table.shape == (3, 1, 1, 16)
    assert not run_own_code("t", "your kernel", lambda: frequencies.rope_cos_sin(3, 16),
                            allow=(frequencies.rope_freqs,))[0]
    assert "rope_cos_sin" in capsys.readouterr().out


def test_bar_matches_a_function_by_its_code_not_its_name(capsys):
    barred = lambda: 1            # noqa: E731 -- two lambdas of one file, one barred
    other = lambda: 2             # noqa: E731
    assert not run_own_code("f", "w", barred, bar=(barred,))[0]
    assert run_own_code("f", "w", other, bar=(barred,)) == (True, 2)


def test_a_barred_function_wins_over_its_allowed_module(capsys):
    assert not run_own_code("t", "your cos/sin", lambda: frequencies.rope_cos_sin(3, 16),
                            allow=(frequencies,), bar=(frequencies.rope_cos_sin,))[0]
    assert run_own_code("t", "your cos/sin", lambda: frequencies.rope_freqs(3, 16),
                        allow=(frequencies,), bar=(frequencies.rope_cos_sin,))[0]


def test_unanswered_and_broken_answers_are_reported(capsys):
    assert run_own_code("f", "w", None) == (False, None)
    assert run_own_code("f", "w", ...) == (False, None)
    assert run_own_code("f", "w", 3) == (False, None)
    assert run_own_code("f", "w", lambda: None) == (False, None)
    assert run_own_code("f", "w", lambda: 1 / 0) == (False, None)
    out = capsys.readouterr().out
    for words in ("no answer yet", "expected a function, got int", "returned None",
                  "raised ZeroDivisionError"):
        assert words in out
    assert run_own_code("f", "w", lambda a, b=0: a + b, 1, b=2) == (True, 3)


def test_the_block_restores_the_profile_and_the_launchers():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    runs = (JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"])
    calls = []

    def outer(frame, event, arg):
        calls.append(event)
    sys.setprofile(outer)
    try:
        with library_barred("w"):
            assert sys.getprofile() is not outer
        with pytest.raises(LibraryAnswer):
            with library_barred("w"):
                reference.rope_reference(*_x())
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert (JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"]) == runs


def test_blocks_nest():
    x, f = _x()
    with library_barred("outer", allow=(batch_reuse,)):
        batch_reuse.rope_batch_reuse(x, f)
        with pytest.raises(LibraryAnswer, match="inner"):
            with library_barred("inner"):
                batch_reuse.rope_batch_reuse(x, f)


# --- kernels ------------------------------------------------------------------------------------

def _launch(kernel, n=16):
    x = torch.randn(n, device=DEVICE)
    y = torch.empty_like(x)
    kernel[(1,)](x, y, N=n)
    return x, y


def test_an_own_kernel_launches(capsys):
    ok, (x, y) = run_own_code("k", "your kernel", _launch, _own_scale_kernel)
    assert ok and torch.allclose(y, 2 * x.cos())
    assert library_kernel(_own_scale_kernel) is None


def test_a_library_kernel_launched_directly_is_refused(capsys):
    x, f = _x()
    S, B, H, D = x.shape
    y = torch.empty_like(x)
    f2 = f.view(S, D)

    def launch_teaching_kernel():
        batch_reuse._rope_batch_reuse_kernel[(S, H)](
            x, y, f2, B, *x.stride(), y.stride(0), y.stride(1), y.stride(2), *f2.stride(),
            HALF=D // 2, BLOCK_HALF=D // 2, BACKWARD=False, COMPUTE_DTYPE=tl.float32,
            BF16_RTNE=False)
        return y
    assert run_own_code("k", "your kernel", launch_teaching_kernel) == (False, None)
    out = capsys.readouterr().out
    assert "launched ropelib's _rope_batch_reuse_kernel (ropelib/course/kernels/batch_reuse.py)" \
        in out
    assert run_own_code("k", "your kernel", launch_teaching_kernel, allow=(batch_reuse,))[0]
    assert library_kernel(batch_reuse._rope_batch_reuse_kernel) == \
        "ropelib's _rope_batch_reuse_kernel (ropelib/course/kernels/batch_reuse.py)"


def test_a_barred_kernel_is_refused_and_its_copy_is_not(capsys):
    assert not run_own_code("k", "your kernel", _launch, _own_scale_kernel,
                            bar=(_own_scale_kernel,))[0]
    assert "launched _own_scale_kernel" in capsys.readouterr().out
    copy = learner_copy(_own_scale_kernel)
    assert copy is not _own_scale_kernel and copy.fn.__code__ is not _own_scale_kernel.fn.__code__
    ok, (x, y) = run_own_code("k", "your kernel", _launch, copy, bar=(_own_scale_kernel,))
    assert ok and torch.allclose(y, 2 * x.cos())


def test_launch_barred_returns_the_launch_or_prints_why_not(capsys):
    ok, (a, b) = launch_barred("k", "case 1", "your kernel", lambda: _launch(_own_scale_kernel))
    assert ok and torch.allclose(b, 2 * a.cos()) and capsys.readouterr().out == ""
    x, f = _x()

    def library():
        return reference.rope_reference(x, f), sys.getprofile()
    assert launch_barred("k", "case 1", "your kernel", library) == (False, None)
    assert capsys.readouterr().out.startswith(
        "❌ k: this exercise wants your kernel, but the answer called ropelib's rope_reference")
    # barred=False (a check's compiled launch on a GPU): run as it is, unwatched
    outside = sys.getprofile()
    ok, (y, profile) = launch_barred("k", "case 1", "your kernel", library, barred=False)
    assert ok and torch.equal(y, reference.rope_reference(x, f)) and profile is outside
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("barred", [True, False])
def test_launch_barred_reports_the_first_or_the_last_line_raised(barred, capsys):
    def raising(message):
        def start():
            raise ValueError(message)
        return start
    compiler = "at 3:4:\n    y = x +\n        ^\nthe reason"    # Triton's layout: the reason last
    said = {}
    for last_line in (False, True):
        for message in (compiler, "", "  one line \n\n", "x" * 400):
            ok = launch_barred("k", "case 1", "your kernel", raising(message), barred=barred,
                               last_line=last_line)
            assert ok == (False, None)
            said[last_line, message] = capsys.readouterr().out
    first = "❌ k (case 1): launching your kernel raised"
    last = "❌ k (case 1): the launch raised"
    assert said[False, compiler] == f"{first} ValueError: at 3:4:\n"
    assert said[True, compiler] == f"{last} ValueError: the reason\n"
    assert said[False, ""] == f"{first} ValueError:\n"
    assert said[True, ""] == f"{last} ValueError: \n"
    assert said[False, "  one line \n\n"] == f"{first} ValueError:   one line\n"
    assert said[True, "  one line \n\n"] == f"{last} ValueError: one line\n"
    assert said[False, "x" * 400] == f"{first} {('ValueError: ' + 'x' * 400)[:300]}\n"
    assert said[True, "x" * 400] == f"{last} ValueError: {'x' * 300}\n"


@triton.jit
def _own_kernel_with_course_helper(x_ptr, y_ptr, N: tl.constexpr):
    # notebook 08's fma helper: a rotation of a pair, written by the course
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y1, y2 = debug._fused_pair(x, x, x, x)
    tl.store(y_ptr + offs, y1 + y2)


def test_the_course_kernels_outside_its_exercises_are_barred(capsys):
    """A @triton.jit function the course defines outside its exercises (notebook 08's fma
    helper, notebook 05's ladder) is an answer too: called by the learner's kernel, or
    launched, it is refused; the exercises' own kernels (the learner's templates, the kernels a
    check launches with the learner's function) are not."""
    from ropelib.course import ladder
    from ropelib.course.exercises import debugging
    assert library_kernel(_own_kernel_with_course_helper) == \
        "ropelib's _fused_pair (ropelib/course/debug.py)"
    assert run_own_code("k", "your kernel", _launch, _own_kernel_with_course_helper) == \
        (False, None)
    assert "launched ropelib's _fused_pair" in capsys.readouterr().out
    assert library_kernel(ladder._ladder_final_kernel) == \
        "ropelib's _ladder_final_kernel (ropelib/course/ladder.py)"
    assert library_kernel(debugging._rope_combine_kernel) is None
    assert library_kernel(_own_kernel_with_course_helper, allow=(debug._fused_pair,)) is None


def test_the_benchmark_suite_is_barred(capsys):
    """ropelib.bench's providers include a whole RoPE in PyTorch (Hugging Face's formula)."""
    from ropelib.bench import compare
    x, f = _x()
    S, D = x.shape[0], x.shape[-1]
    ang = f.view(S, 1, 1, D)

    def hf_answer(x, f):
        return compare.hf_rotate(x, ang.cos(), ang.sin(), False)
    assert run_own_code("rope", "your RoPE", hf_answer, x, f) == (False, None)
    assert "ropelib's hf_rotate (ropelib/bench/compare.py)" in capsys.readouterr().out


@pytest.mark.parametrize("kernel", [_own_kernel_with_library_helper, _own_kernel_with_own_helper],
                         ids=["calls-round_to", "calls-a-helper-that-calls-round_to"])
def test_an_own_kernel_calling_a_library_helper_is_refused(kernel, capsys):
    # compiled, the helper is inlined: no Python call would show it; the launch is refused
    assert library_kernel(kernel) == "ropelib's round_to (ropelib/kernels/common.py)"
    assert run_own_code("k", "your kernel", _launch, kernel) == (False, None)
    assert "launched ropelib's round_to" in capsys.readouterr().out
    assert library_kernel(kernel, allow=(common,)) is None


def test_a_launch_in_another_thread_is_refused():
    # on a GPU, autograd runs a backward in a thread of its own, which no Python profile reaches:
    # launches are watched there too
    x, f = _x()
    seen = []

    def backward_thread():
        sys.setprofile(None)     # like autograd's thread: no profile (threads of the answer's
        try:                     # own get one; test_exercises_refuse_library_answers.py)
            batch_reuse.rope_batch_reuse(x, f, backward=True)
        except LibraryAnswer as exc:
            seen.append(str(exc))
    with pytest.raises(LibraryAnswer, match="launched ropelib's _rope_batch_reuse_kernel"):
        with library_barred("your backward"):
            worker = threading.Thread(target=backward_thread)
            worker.start()
            worker.join()
    assert seen and "your backward" in seen[0]


@INTERPRETER_ONLY
def test_an_allowed_kernel_runs_unwatched():
    # the interpreter runs a kernel as Python: watching each of its calls would make it several
    # times slower, and a kernel cannot call Python code, so its run is not watched
    from triton.runtime.interpreter import InterpreterBuilder
    original = InterpreterBuilder.create_cos
    profiles = []

    def cos(self, arg):
        profiles.append(sys.getprofile())
        return original(self, arg)
    InterpreterBuilder.create_cos = cos
    try:
        with library_barred("your kernel"):
            _launch(_own_scale_kernel)
            assert sys.getprofile() is not None
    finally:
        InterpreterBuilder.create_cos = original
    assert profiles == [None]


def test_the_package_import_is_not_an_answer():
    with library_barred("w"):
        import ropelib as again          # noqa: F401 -- ropelib/__init__.py is not barred
        assert again.__version__


def test_barred_files_cover_the_product_and_the_teaching_kernels():
    files, folders = own_code._barred_files(())
    names = {p.name for p in files}
    assert {"api.py", "reference.py", "ops.py", "frequencies.py"} <= names
    assert "__init__.py" not in names
    assert own_code.TEACHING_KERNELS in folders and own_code.PACKAGE / "kernels" in folders
    assert own_code.PACKAGE / "bench" in folders
    files, _ = own_code._barred_files((frequencies,))
    assert "frequencies.py" not in {p.name for p in files}


def test_every_worked_solution_of_the_course_is_barred(capsys):
    """Another exercise's worked solution is not the learner's code, whatever the exercise:
    notebook 02's context-parallel positions answer notebook 11's dual-chunk exercise, and
    notebook 02's bandwidth arithmetic answers notebook 04's time floor. Both are refused."""
    from types import SimpleNamespace

    from ropelib.course import kernel_bandwidth
    from ropelib.course.exercises import at_scale, basics, kernels

    assert not at_scale.check_dual_chunk_positions(
        lambda S, c, r: basics.solution_cp_positions(S // c, c, r))
    assert "solution_cp_positions" in capsys.readouterr().out
    assert not kernels.check_floor_ms(lambda n, g: kernel_bandwidth.us_at_copy_speed(
        [SimpleNamespace(nbytes=n)], g) / 1e3)
    assert "us_at_copy_speed" in capsys.readouterr().out
    # the learner's own arithmetic still passes
    assert kernels.check_floor_ms(lambda n, g: n / (g * 1e9) * 1e3)
