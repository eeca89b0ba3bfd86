"""Exercises that want the learner's own code: run an answer with ropelib's own answers barred.

An exercise that asks for a kernel, or for a formula worked out by hand, is not answered by
calling the finished library (`ropelib.apply_rope`, `torch.ops.ropelib.*`), one of the course's
teaching kernels (`ropelib.course.kernels`), or the library function that computes the very
thing asked for. `run_own_code` calls the learner's function inside `library_barred`, which
watches the answer two ways:

* every Python call it makes (`sys.setprofile`, and `threading.setprofile` for the threads it
  starts): a call whose code lives in a barred file or is a barred function stops the answer
  with `LibraryAnswer`, which says what was called and what to do instead; an answer that
  switches that watch off is refused too;
* with `bar_ops`, every PyTorch operator it runs (a `TorchDispatchMode`, this thread only): an
  operator in `bar_ops` (for example `torch.ops.aten.block_diag.default`) stops the answer
  whichever way it is reached (`torch.block_diag`, `torch.ops.aten.block_diag`,
  `torch._C._VariableFunctions.block_diag`);
* every Triton kernel it launches (`kernel[grid](...)`, compiled or interpreted, and ropelib's
  direct launcher, in any thread: on a GPU autograd runs a backward in a thread of its own): a
  kernel defined in a barred file, or a kernel of the learner's that calls a barred
  `@triton.jit` helper (the compiler inlines those, so no Python call would show), is refused
  the same way. Once a kernel is known to be allowed, its run is not watched call by call (a
  kernel cannot call Python code), which keeps the interpreter at its usual speed.

The checks compute their expected values outside the block, so they may use the library freely.

What is barred, by default: every module of the product (`ropelib/*.py` and `ropelib/kernels/`,
so the finished kernels, the operators, the public API and `ropelib.reference`), its benchmark
suite (`ropelib/bench/`, whose providers include a whole RoPE in PyTorch), the teaching kernels
(`ropelib/course/kernels/`), and every other `@triton.jit` function of the course outside its
exercises (notebook 05's ladder, notebook 08's reproduction kernel and its fma helper): an
answer may not launch them, nor a kernel of its own call them as helpers. `allow` lets an
exercise permit what it hands the learner: a module (for example `ropelib.frequencies` for the
angle table of a kernel exercise, or `ropelib.course.kernels.batch_reuse` for a forward pass
the exercise does not ask for) or a function; whatever an allowed function calls in turn is
allowed too. `bar` adds functions,
classes (their methods) and `@triton.jit` kernels from anywhere, for example an exercise's own
worked solution. Every worked solution of the course (a function or kernel under
`ropelib/course/` named `solution_*` or `_*_solution_kernel`) is barred in every check, the
check's own and any other: another exercise's answer is not the learner's code.
The course's other helpers (recording accesses, the checks themselves) are never barred by
default. Some of them compute a RoPE in plain PyTorch (notebook 13's specs, notebook 08's
reproduction, notebook 05's ladder, the course model's rotary module): `course_rope_helpers()`
lists those functions, for a check to pass as `bar` (by function, not by file: the same files
hold code the checks themselves run).
"""
import sys
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

import torch

from ..work_count import interpreted
from . import _compare, check, exception_line, guarded_call

PACKAGE = Path(__file__).resolve().parents[2]          # .../ropelib
COURSE = PACKAGE / "course"
TEACHING_KERNELS = COURSE / "kernels"
EXERCISES = Path(__file__).resolve().parent

__all__ = ["LibraryAnswer", "library_barred", "run_own_code", "library_kernel", "PACKAGE",
           "COURSE", "TEACHING_KERNELS", "course_rope_helpers"]


class LibraryAnswer(RuntimeError):
    """An exercise's answer called the library's own answer instead of the learner's code."""


def _module_file(module) -> Path:
    return Path(module.__file__).resolve()


def _function(obj):
    """The Python function behind a @triton.jit kernel (also an autotuned one), else obj."""
    seen = 0
    while hasattr(obj, "fn") and not hasattr(obj, "__code__") and seen < 8:
        obj = obj.fn
        seen += 1
    return obj


def _codes(obj) -> Iterator:
    """The code objects of a function, a @triton.jit kernel, or a class's methods."""
    obj = _function(obj)
    if isinstance(obj, type):
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)          # staticmethod, classmethod
            if callable(value) and hasattr(value, "__code__"):
                yield value.__code__
        return
    code = getattr(obj, "__code__", None)
    if code is not None:
        yield code


def _resolved(filename: str) -> Optional[Path]:
    p = Path(filename)
    return p.resolve() if p.is_absolute() else None


def _barred_files(allow: Iterable) -> Tuple[set, set]:
    """(barred files, barred folders) as resolved paths; `allow` lists modules to permit."""
    allowed = {_module_file(m) for m in allow if getattr(m, "__file__", None)}
    files = {p.resolve() for p in PACKAGE.glob("*.py")} - allowed
    files.discard((PACKAGE / "__init__.py").resolve())   # the package's import, not an answer
    folders = {(PACKAGE / "kernels").resolve(), (PACKAGE / "bench").resolve(),
               TEACHING_KERNELS.resolve()}
    return files, folders


class _Rules:
    """Which code an answer may run: `verdict(code)` is "allowed", "barred" or None (neither:
    the learner's code, PyTorch, Triton, the course's helpers)."""

    def __init__(self, allow: Iterable, bar: Iterable):
        allow, bar = list(allow), list(bar)
        modules = [m for m in allow if isinstance(m, ModuleType)]
        self.allowed_files = {_module_file(m) for m in modules if getattr(m, "__file__", None)}
        self.files, self.folders = _barred_files(modules)
        self.allowed_codes = {c for a in allow if not isinstance(a, ModuleType) for c in _codes(a)}
        self.barred_codes = {c for b in bar for c in _codes(b)}
        # the interpreter runs a kernel (and the @triton.jit helpers it calls) from code
        # recompiled from its source: same file and name, another code object
        self.allowed_names = {self._name(c) for a in allow if _is_jit(a) for c in _codes(a)}
        self.barred_names = {self._name(c) for b in bar if _is_jit(b) for c in _codes(b)}
        self._by_file: dict = {}

    @staticmethod
    def _name(code) -> tuple:
        return (str(_resolved(code.co_filename) or code.co_filename), code.co_name)

    def file_verdict(self, filename: str) -> Optional[str]:
        hit = self._by_file.get(filename, 0)
        if hit == 0:
            p = _resolved(filename)
            if p is None:
                hit = None
            elif p in self.allowed_files:
                hit = "allowed"
            elif p in self.files or any(folder in p.parents for folder in self.folders):
                hit = "barred"
            else:
                hit = None
            self._by_file[filename] = hit
        return hit

    def verdict(self, code) -> Optional[str]:
        if code in self.allowed_codes:
            return "allowed"
        if code in self.barred_codes:
            return "barred"
        hit = self.file_verdict(code.co_filename)
        if hit is None and _worked_solution(code.co_name) and self._in_course(code):
            # any exercise's or puzzle's worked solution, the check's own or another's (notebook
            # 02's context-parallel positions answer notebook 11's exercise too)
            return "barred"
        if (self.allowed_names or self.barred_names) and hit != "allowed":
            name = self._name(code)
            if name in self.allowed_names:
                return "allowed"
            if name in self.barred_names:
                return "barred"
        return hit

    @staticmethod
    def _in_course(code) -> bool:
        p = _resolved(code.co_filename)
        return p is not None and COURSE.resolve() in p.parents

    def jit_verdict(self, code) -> Optional[str]:
        """`verdict` for the code of a @triton.jit function: also "barred" for one the course
        defines outside its exercises (the exercises' own kernels are the learner's templates
        and the checks' launchers), unless allowed."""
        hit = self.verdict(code)
        if hit is None and self._in_course(code) \
                and EXERCISES not in _resolved(code.co_filename).parents:
            return "barred"
        return hit

    def kernel_barred(self, kernel, launch_args=()) -> Optional[Any]:
        """The barred code a launch of `kernel` would run, or None: the kernel itself, or, for a
        kernel that is not the library's, a @triton.jit helper it calls (or is given)."""
        fn = _function(kernel)
        code = getattr(fn, "__code__", None)
        if code is None:
            return None
        hit = self.jit_verdict(code)
        if hit == "barred":
            return code
        if hit == "allowed":
            return None
        for helper in _jit_helpers(fn, launch_args):
            if self.jit_verdict(helper.__code__) == "barred":
                return helper.__code__
        return None


def _worked_solution(name: str) -> bool:
    """Is this the name of one of the course's worked solutions (`solution_*`, or a kernel
    `_*_solution_kernel`)?"""
    return name.startswith("solution_") or name.endswith("_solution_kernel")


def _is_jit(obj) -> bool:
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:  # pragma: no cover -- triton is a dependency
        return False
    return isinstance(obj, KernelInterface) or type(obj).__name__ in ("JITFunction",
                                                                       "InterpretedFunction")


def _jit_helpers(fn, extra=(), seen=None) -> Iterator:
    """The functions of the @triton.jit helpers `fn` refers to by a global (or closure) name, a
    parameter's default, or an attribute of a module or class it names, and theirs; `extra`:
    objects it is launched with."""
    seen = set() if seen is None else seen
    code = fn.__code__
    names = set(code.co_names)
    scope = dict(getattr(fn, "__globals__", {}))
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            scope[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    found = [scope[n] for n in names | set(code.co_freevars) if n in scope]
    found += list(getattr(fn, "__defaults__", None) or ())          # ROTATE=common.rotate_pair
    found += list((getattr(fn, "__kwdefaults__", None) or {}).values())
    holders = [m for m in found if isinstance(m, (ModuleType, type))]
    for m in holders:              # attribute chains: ropelib.kernels.common.rotate_pair, and
        for n in names:            # a class's attributes: Helpers.rotate
            obj = getattr(m, n, None)
            if isinstance(obj, (ModuleType, type)):
                if obj not in holders and len(holders) < 64:
                    holders.append(obj)
            elif obj is not None:
                found.append(obj)
    found += list(extra)
    for obj in found:
        if not _is_jit(obj):
            continue
        helper = _function(obj)
        if not hasattr(helper, "__code__") or helper.__code__ in seen:
            continue
        seen.add(helper.__code__)
        yield helper
        yield from _jit_helpers(helper, (), seen)


def _describe(code) -> str:
    """"ropelib's apply_rope (ropelib/api.py)", or "block_diag (torch/functional.py)"."""
    path = _resolved(code.co_filename) or Path(code.co_filename)
    if PACKAGE in path.parents:
        return f"ropelib's {code.co_name} ({path.relative_to(PACKAGE.parent).as_posix()})"
    parts = path.parts
    if "site-packages" in parts:
        path = Path(*parts[parts.index("site-packages") + 1:])
    else:
        path = Path(path.name)
    return f"{code.co_name} ({path.as_posix()})"


def _refusal(what: str, verb: str, code) -> str:
    thing = (_describe(code) if hasattr(code, "co_filename")
             else f"PyTorch's operator {_op_name(code)}")
    return (f"this exercise wants {what}, but the answer {verb} {thing}: write it "
            "yourself (the library computes the expected value to compare with)")


def _op_name(op) -> str:
    """"aten::block_diag" for torch.ops.aten.block_diag.default."""
    try:
        return op.name()
    except Exception:  # noqa: BLE001 -- anything else that names an operator
        return str(op)


def course_rope_helpers() -> list:
    """The course's own RoPE code outside the files `library_barred` bars: every `spec_*` of
    notebook 13's puzzles (and its eager bf16 RoPE), notebook 08's reproduction
    (`rope_unsloth_repro`, `apply_rotary_pos_emb_triton`, `te_fused`), notebook 05's
    `rope_ladder` and the course model's rotary module. Pass them as `bar` to refuse them by
    function: their modules also hold code that the checks run, so they are not barred by file.
    """
    from .. import debug, ladder, model, puzzles   # imported late: heavier modules

    found = [getattr(puzzles, n) for n in sorted(vars(puzzles))
             if n.startswith("spec_") and callable(getattr(puzzles, n))]
    found += [getattr(m, n) for m, n in ((puzzles, "_eager_bf16"), (debug, "rope_unsloth_repro"),
                                         (debug, "apply_rotary_pos_emb_triton"),
                                         (debug, "te_fused"), (ladder, "rope_ladder"),
                                         (model, "_Rotary")) if hasattr(m, n)]
    return found


@contextmanager
def _ops_barred(bar_ops: tuple, what: str, caught: list, inside: list, owner: int):
    """Refuse the PyTorch operators in `bar_ops` (this thread; not inside allowed code)."""
    if not bar_ops:
        yield
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    barred = frozenset(bar_ops)

    class _Refuse(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in barred and not (inside and threading.get_ident() == owner):
                caught.append(("called", func))
                raise LibraryAnswer(_refusal(what, "called", func))
            return func(*args, **(kwargs or {}))

    with _Refuse():
        yield


def library_kernel(kernel, *, allow: Iterable = (), bar: Iterable = ()) -> Optional[str]:
    """Which of ropelib's kernels (or @triton.jit helpers) `kernel` is or calls, e.g. "ropelib's
    round_to (ropelib/kernels/common.py)"; None for a kernel of the learner's own that calls none
    of them. The rules of `library_barred`, without launching anything."""
    code = _Rules(allow, bar).kernel_barred(kernel)
    return None if code is None else _describe(code)


@contextmanager
def _launches_watched(rules: _Rules, what: str, caught: list, inside: list, owner: int):
    """Refuse launches of barred kernels (any thread); run allowed ones unwatched."""
    patched = []
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
        patched += [(JITFunction, "run"), (InterpretedFunction, "run")]
    except ImportError:  # pragma: no cover -- triton is a dependency
        pass
    try:
        from ...kernels.direct import DirectLauncher
        patched.append((DirectLauncher, "__call__"))
    except ImportError:  # pragma: no cover -- the finished kernels' launcher
        pass
    saved = [(cls, attr, cls.__dict__[attr]) for cls, attr in patched if attr in cls.__dict__]

    def guarded(original, is_launcher):
        def launch(self, *args, **kwargs):
            kernel = getattr(self, "kernel", None) if is_launcher else self
            if not (inside and threading.get_ident() == owner):   # not inside allowed code
                extra = [a for a in (*args, *kwargs.values()) if _is_jit(a)]
                code = rules.kernel_barred(kernel, extra)
                if code is not None:
                    caught.append(("launched", code))
                    raise LibraryAnswer(_refusal(what, "launched", code))
            previous = sys.getprofile()
            sys.setprofile(None)       # an allowed kernel: nothing inside it calls Python code
            try:
                return original(self, *args, **kwargs)
            finally:
                sys.setprofile(previous)
        return launch

    for cls, attr, original in saved:
        setattr(cls, attr, guarded(original, attr == "__call__"))
    try:
        yield
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)


@contextmanager
def library_barred(what: str, *, allow: Iterable = (), bar: Iterable = (), bar_ops: Iterable = ()):
    """Within the block, a call into barred code raises LibraryAnswer (see the module docstring).

    what: the exercise's subject, for the message ("your backward kernel").
    allow: modules or functions of the product the exercise hands the learner; what they call
        in turn is allowed too.
    bar: further functions, classes or @triton.jit kernels the answer must not call (their
        code objects are matched; a kernel also by its file and name).
    bar_ops: PyTorch operators (`torch.ops.aten.block_diag.default`) the answer must not run,
        however it reaches them.

    A barred call that the answer catches and survives is still reported: the block raises
    LibraryAnswer when it ends.
    """
    rules = _Rules(allow, bar)
    caught = []
    inside = []                     # frames of allowed code running now (this thread)
    owner = threading.get_ident()

    def watch(frame, event, arg):
        if event == "call":
            mine = threading.get_ident() == owner
            if caught or (mine and inside):
                return
            hit = rules.verdict(frame.f_code)
            if hit == "allowed" and mine:      # a thread the answer starts is watched throughout
                inside.append(frame)
            elif hit == "barred":
                caught.append(("called", frame.f_code))
                raise LibraryAnswer(_refusal(what, "called", frame.f_code))
        elif event == "return" and inside and inside[-1] is frame:
            inside.pop()

    previous = sys.getprofile()
    previous_threads = threading.getprofile()
    with _launches_watched(rules, what, caught, inside, owner), \
            _ops_barred(tuple(bar_ops), what, caught, inside, owner):
        sys.setprofile(watch)
        threading.setprofile(watch)             # threads the answer starts are watched too
        try:
            yield
        finally:
            still_watched = sys.getprofile() is watch and threading.getprofile() is watch
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
    if caught:       # raised inside the answer and caught there: still not the learner's code
        raise LibraryAnswer(_refusal(what, *caught[0]))
    if not still_watched:
        raise LibraryAnswer(f"this exercise wants {what}, but the answer switched off the "
                            "check's watch of the calls it makes (sys.setprofile or "
                            "threading.setprofile): write it yourself, without touching the "
                            "profiler")


def run_own_code(name: str, what: str, fn: Optional[Callable], *args,
                 allow: Iterable = (), bar: Iterable = (), bar_ops: Iterable = (), **kwargs
                 ) -> Tuple[bool, Any]:
    """Call the learner's fn(*args, **kwargs) with the library's answers barred.

    Returns (True, its result), or prints ❌ with the reason and returns (False, None) when the
    answer is missing, raises, returns None or calls barred code (see `library_barred`).
    """
    return guarded_call(name, fn, args, kwargs,
                        guard=lambda: library_barred(what, allow=allow, bar=bar,
                                                     bar_ops=bar_ops),
                        refusals=(LibraryAnswer,))


def check_cases(name: str, what: str, fn: Callable, cases: Iterable, *,
                hint: Optional[str] = None, atol: Optional[float] = None,
                rtol: Optional[float] = None, post: Optional[Callable] = None,
                bar: Iterable = (), bar_ops: Iterable = ()) -> bool:
    """Run fn(*args) for each (label, args, expected) with ropelib's answers (and `bar`, and the
    PyTorch operators of `bar_ops`) barred; one ✅ line, or ❌ for the first failure. Never raises.

    `what` names the exercise in a refusal ("your rotation matrix"). `post(answer, expected)`
    may reshape the learner's answer before comparing (e.g. angles reduced modulo 2 pi).
    """
    answer = expected = None
    for label, args, expected in cases:
        ok, answer = run_own_code(f"{name} ({label})", what, fn, *args, bar=bar,
                                  bar_ops=bar_ops)
        if not ok:
            return False
        if post is not None:
            try:
                answer = post(answer, expected)
            except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
                return check(f"{name} ({label})", answer, expected, hint=f"{exc}")
        same, _ = _compare(answer, expected, atol, rtol)
        if not same:
            return check(f"{name} ({label})", answer, expected, atol=atol, rtol=rtol, hint=hint)
    return check(name, answer, expected, atol=atol, rtol=rtol, hint=hint)


def listed_as_tensor(answer, expected):
    """A `post` for check_cases: a list or tuple of numbers compared as a tensor (anything else
    as it is, for check() to say what is wrong with it)."""
    if isinstance(answer, (list, tuple)):
        try:
            return torch.as_tensor(answer)
        except (TypeError, ValueError, RuntimeError):
            pass
    return answer


def launch_barred(name: str, label: str, what: str, start: Callable[[], Any], *,
                  bar: Iterable = (), barred: bool = True, last_line: bool = False
                  ) -> Tuple[bool, Any]:
    """(True, start()) when the learner's kernel launches with ropelib's answers (and `bar`)
    barred; else print the ❌ line (a refusal, or what the launch raised, for case `label`) and
    return (False, None). The kernel exercises' checks all launch through here.

    barred: False runs start() as it is, nothing barred (a check's compiled launch on a GPU,
        after its interpreted launch was barred); a failure is reported the same way.
    last_line: report what the launch raised by the last line of its message ("the launch
        raised ValueError: ...", where Triton's compiler puts the reason after the source it
        quotes), not by its first.
    """
    try:
        with library_barred(what, bar=bar) if barred else nullcontext():
            return True, start()
    except LibraryAnswer as exc:
        print(f"❌ {name}: {exc}")
    except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
        if last_line:
            said = (str(exc).strip().splitlines() or [""])[-1]
            print(f"❌ {name} ({label}): the launch raised {type(exc).__name__}: {said[:300]}")
        else:
            print(f"❌ {name} ({label}): launching your kernel raised {exception_line(exc)}")
    return False, None


def launch_on(device: str, name: str, label: str, launch: Callable, kernel, *args) -> bool:
    """launch(kernel, *args) as a check runs the learner's kernel on `device`: on the CPU
    interpreted, with ropelib's answers barred; on a GPU compiled, as it is. Prints the ❌ line
    (what the launch raised by its last line, launch_barred) and returns False where it fails;
    never raises."""
    cpu = device == "cpu"
    ok, _ = launch_barred(name, label, f"your {name}",
                          lambda: launch(interpreted(kernel) if cpu else kernel, *args),
                          barred=cpu, last_line=True)
    return ok
