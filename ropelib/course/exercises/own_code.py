"""Exercises that want the learner's own code: run an answer with ropelib's own answers barred.

An exercise that asks for a kernel, or for a formula worked out by hand, is not answered by
calling the finished library (`ropelib.apply_rope`, `torch.ops.ropelib.*`), one of the course's
teaching kernels (`ropelib.course.kernels`), or the library function that computes the very
thing asked for. `run_own_code` calls the learner's function inside `library_barred`, which
watches the answer these ways:

* every Python call it makes (`sys.setprofile`, and `threading.setprofile` for the threads it
  starts): a call whose code lives in a barred file or is a barred function stops the answer
  with `LibraryAnswer`, which says what was called and what to do instead; an answer that
  switches that watch off (`sys.setprofile`, `threading.setprofile`), even to put it back
  before it returns, is refused too;
* with `bar_ops`, every PyTorch operator it runs (a `TorchDispatchMode`, this thread only): an
  operator in `bar_ops`, one overload (`torch.ops.aten.block_diag.default`) or all of them
  (`torch.ops.aten.block_diag`), stops the answer whichever way it is reached
  (`torch.block_diag`, `torch.ops.aten.block_diag.out`,
  `torch._C._VariableFunctions.block_diag`). An answer that switches that watch off (takes the
  check's mode off PyTorch's stack, as `_disable_current_modes` does, or excludes the Python
  dispatch key, as `torch._C._DisableTorchDispatch` does) is refused: at once where it calls
  one of torch._C's switches itself, else when it returns (seen at its next call or return with
  the watch off); PyTorch's own switching is let through (printing a tensor takes the modes
  off for the while, and the dispatcher takes the check's mode off while it hands the mode an
  operator, as `float(t)`, `int(t)`, `complex(t)`, `bool(t)` and `t.item()` run
  `_local_scalar_dense`). Beside the mode, PyTorch's profiler records every operator the
  dispatcher runs, below any dispatch key: a barred operator it recorded that the mode did not
  see (a switch taken before the check began, entered with no Python call, the operator run
  from C through `map`) is refused when the answer returns, and so is an answer that stops
  that profiler;
* every Triton kernel it launches (`kernel[grid](...)`, compiled or interpreted, and ropelib's
  direct launcher, in any thread: on a GPU autograd runs a backward in a thread of its own): a
  kernel defined in a barred file, or a kernel of the learner's that calls a barred
  `@triton.jit` helper (the compiler inlines those, so no Python call would show), is refused
  the same way. Once a kernel is known to be allowed, its run is not watched call by call (a
  kernel cannot call Python code), which keeps the interpreter at its usual speed;
* every process it starts, or hands work to: no process of the answer's is watched, so starting
  one (`multiprocessing`'s `Process.start`, so also its pools and `ProcessPoolExecutor`'s
  workers, `subprocess.Popen` and what runs through it, `os.system`, `os.fork`, `os.forkpty`,
  `os.posix_spawn`, `os.spawn*`) or handing work to a pool that is already running (a
  `ProcessPoolExecutor`'s submit and map, a `multiprocessing` pool's apply and map) stops the
  answer with `LibraryAnswer`, which names the call, in any thread. Only compilers may start
  processes while the answer runs: a call whose nearest caller outside Python's standard library
  is Triton (its compiler runs `ptxas` on a GPU) or PyTorch's Inductor (its compile workers) is
  let through, as are the standard library's fixed look-ups (`ctypes.util`, `platform`), and
  the machinery threads of pools started before the block (only the standard library on their
  stack, in a thread the block does not watch). A function the answer hands to a thread that
  `threading.setprofile` does not reach (`_thread.start_new_thread`, a `ThreadPoolExecutor` or
  `multiprocessing` thread pool, whose threads may have started before the answer) runs under
  the answer's watch too.

The checks compute their expected values outside the block, so they may use the library freely.
What the watch cannot see is an answer computed before the check ran (the library's results for
the check's inputs, in a table): a check whose inputs a learner could know beforehand adds a
case drawn as it runs, from `fresh_seed` (the operating system's randomness, not torch's global
generator, which the notebook seeds), its seed in the case's label.

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
The `@triton.jit` kernels a notebook defines itself (its `__main__` namespace: the kernels it
teaches before its exercises, such as notebook 04's versions 1 and 2) are barred in every kernel
check too (`launch_barred`), except the learner's own: those named `my_...`, as every
exercise's answer and any helper of the learner's must be (`notebook_kernels`).
The course's other helpers (recording accesses, the checks themselves) are never barred by
default. Some of them compute a RoPE in plain PyTorch (notebook 13's specs, notebook 08's
reproduction, notebook 05's ladder, the course model's rotary module): `course_rope_helpers()`
lists those functions, for a check to pass as `bar` (by function, not by file: the same files
hold code the checks themselves run).
"""
import dis
import os
import sys
import sysconfig
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

import torch

from ..counts import quietly_running
from ..work_count import interpreted
from . import _compare, check, exception_line, guarded_call

PACKAGE = Path(__file__).resolve().parents[2]          # .../ropelib
COURSE = PACKAGE / "course"
TEACHING_KERNELS = COURSE / "kernels"
EXERCISES = Path(__file__).resolve().parent

__all__ = ["LibraryAnswer", "library_barred", "run_own_code", "library_kernel", "PACKAGE",
           "COURSE", "TEACHING_KERNELS", "course_rope_helpers", "fresh_seed", "fresh_generator",
           "notebook_kernels"]


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


def installed_modules(names: Iterable[str]) -> list:
    """The modules of `names` (dotted) that import here, in order: another library's code an
    exercise's check refuses where it is installed. A module whose package is not installed,
    or that fails to import (another version's layout), is left out."""
    import importlib.util
    from ...bench.compare import try_import     # (quiet about TE's Jax check)
    found = []
    for name in names:
        try:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                continue
        except Exception:  # noqa: BLE001  (a parent package that fails to import)
            continue
        module, _ = try_import(name)     # None: another version's layout, or fails to import
        if module is not None:
            found.append(module)
    return found


class _OpsWatch:
    """The operator watch of one block, as `library_barred`'s call watch asks it whether the
    answer switched it off (this thread only: dispatch modes are per thread)."""

    def __init__(self, mode, owner: int):
        self.mode, self.owner = mode, owner
        self.pending: list = []       # frames whose call of a C function has not returned yet
        # (not PythonTLSSnapshot: PyTorch excludes it itself while it dispatches an operator)
        self.keys = [k for k in (torch._C.DispatchKey.Python,)
                     if not torch._C._dispatch_tls_is_dispatch_key_excluded(k)]
        # PythonTLSSnapshot excluded tells PyTorch's taking the mode off (to hand it an
        # operator) from the answer's; not known where the block began inside a dispatch
        snapshot = torch._C.DispatchKey.PythonTLSSnapshot
        self.snapshot = (None if torch._C._dispatch_tls_is_dispatch_key_excluded(snapshot)
                         else snapshot)

    def excluded(self) -> bool:
        """Is the Python dispatch key excluded in this thread now (it was not when the block
        began)?"""
        return any(torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in self.keys)

    def off(self) -> Optional[str]:
        """How the watch is switched off now in this thread, or None while it is on."""
        if self.excluded():
            return ("excluded PyTorch's Python dispatch key, as torch._C._DisableTorchDispatch "
                    "does")
        if not self.mode_on_stack():
            return ("took the check's dispatch mode off PyTorch's stack, as "
                    "_disable_current_modes does")
        return None

    def mode_on_stack(self) -> bool:
        """Is the check's dispatch mode on this thread's stack of PyTorch's dispatch modes?"""
        return any(torch._C._get_dispatch_stack_at(i) is self.mode
                   for i in range(torch._C._len_torch_dispatch_stack()))

    def dispatching_to_it(self) -> bool:
        """Is PyTorch's dispatcher running an operator in this thread now, between taking the
        check's mode off its stack and calling the mode's `__torch_dispatch__` (or after it,
        before putting the mode back)? It excludes PythonTLSSnapshot while it dispatches."""
        return self.snapshot is not None \
            and torch._C._dispatch_tls_is_dispatch_key_excluded(self.snapshot)

    def by_the_answer(self, frame, event: str) -> Optional[str]:
        """How the watch is off at a profile event of `frame`, where the code that made the call
        (or returns) and all its callers are outside PyTorch: the answer switched it off.
        PyTorch switches it off for its own work (printing a tensor, or dispatching an operator
        to the mode: `float(t)` runs `_local_scalar_dense`, and a call of a type gives the
        answer's frame no `c_call` event), which is let through, as is this guard's own (its
        dispatch, its launches)."""
        if threading.get_ident() != self.owner:
            return None
        pending = self.pending
        if event == "c_call":
            pending.append(frame)
        elif event in ("c_return", "c_exception"):
            while pending and pending.pop() is not frame:
                pass
        if self.mode.dispatching or event == "c_exception" \
                or _frame_kind(frame.f_code.co_filename) == "guard":
            return None
        called = frame
        if event == "call":
            frame = frame.f_back
            if frame is None or _frame_kind(frame.f_code.co_filename) == "guard" \
                    or (pending and pending[-1] is frame) or not _calling(frame):
                return None     # (called back from C, or by an operator's syntax: PyTorch's
                #                 dispatcher calls its Python helpers with the modes taken off)
        how = self.off()
        if how is None:
            return None
        if event == "call" and _in_torch(called.f_code.co_filename) \
                and not self.excluded() and self.dispatching_to_it():
            return None         # PyTorch's helper of the dispatch, called from C under a call
            #                     of a type (float(t), int(t), complex(t), bool(t), range(t))
        while frame is not None:
            if _in_torch(frame.f_code.co_filename):
                return None
            frame = frame.f_back
        return how


_CALLS = {dis.opmap[name] for name in ("CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_KW",
                                         "CALL_FUNCTION_KW", "CALL_FUNCTION_EX")
          if name in dis.opmap}


def _calling(frame) -> bool:
    """Is `frame` at a call instruction (so the Python function just entered is its call),
    rather than at an operator (`a * b`, `x[i]`) whose C code called back into Python?"""
    try:
        return frame.f_code.co_code[frame.f_lasti] in _CALLS
    except IndexError:
        return True


_TORCH_ROOT = Path(torch.__file__).resolve().parent
_in_torch_files: dict = {}


def _in_torch(filename: str) -> bool:
    hit = _in_torch_files.get(filename)
    if hit is None:
        p = _resolved(filename)
        hit = _in_torch_files[filename] = p is not None and _TORCH_ROOT in p.parents
    return hit


def _barred_op(func, barred: frozenset) -> bool:
    """Is `func` (an OpOverload) in `barred`, by itself or by its packet (every overload)?"""
    return func in barred or getattr(func, "overloadpacket", None) in barred


@contextmanager
def _ops_barred(bar_ops: tuple, what: str, caught: list, inside: list, owner: int):
    """Refuse the PyTorch operators in `bar_ops` (this thread; not inside allowed code): an
    overload (`torch.ops.aten.block_diag.default`) or a whole operator, every overload
    (`torch.ops.aten.block_diag`). Yields the block's `_OpsWatch`, or None without bar_ops."""
    if not bar_ops:
        yield None
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    barred = frozenset(bar_ops)

    class _Refuse(TorchDispatchMode):
        dispatching = 0
        let_through = 0              # barred operators run inside allowed code

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if _barred_op(func, barred):
                if not (inside and threading.get_ident() == owner):
                    caught.append(("called", func))
                    raise LibraryAnswer(_refusal(what, "called", func))
                self.let_through += 1
            self.dispatching += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.dispatching -= 1

    mode = _Refuse()

    def switch(name, original):
        """torch._C's `name`, refusing an answer that calls it itself (PyTorch's own calls pass):
        it switches the watch off with no Python call after it that the watch would see."""
        def guarded(*args, **kwargs):
            caller = sys._getframe(1)
            if threading.get_ident() == owner and not (inside or caught) \
                    and _frame_kind(caller.f_code.co_filename) != "guard" \
                    and not _in_torch(caller.f_code.co_filename):
                message = _ops_switched_off(what, f"called torch._C.{name}")
                caught.append(message)
                raise LibraryAnswer(message)
            return original(*args, **kwargs)
        guarded.__wrapped__ = original
        return guarded

    saved: list = []
    with mode, _operators_recorded() as recorded:
        watch = _OpsWatch(mode, owner)
        for name in _DISPATCH_SWITCHES:
            _patched(torch._C, name, lambda original, name=name: switch(name, original), saved)
        try:
            yield watch
        finally:
            _put_back(saved)
            how = watch.off()
            if how is not None:       # left off when the answer returned: refused, and put back
                caught.append(_ops_switched_off(what, how))
                for key in watch.keys:
                    torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
                if not watch.mode_on_stack():
                    torch._C._push_on_torch_dispatch_stack(mode)     # for `with` to take off
    # What the dispatch mode cannot see: an operator run while the Python key was excluded by a
    # switch the answer took before the check patched torch._C, with no Python call while it
    # was off. PyTorch's profiler records every operator the dispatcher runs, below any key.
    if recorded is not None and not caught and not mode.let_through:
        if recorded.stopped_by_the_answer:
            caught.append(_ops_switched_off(what, "switched off the check's profiler"))
        else:
            names = {_profiled_name(op) for op in barred}
            ran = sorted(names.intersection(recorded.names))
            if ran:
                caught.append(_ops_switched_off(
                    what, f"ran PyTorch's operator {ran[0]} where the watch could not see it"))


def _profiled_name(op) -> str:
    """"aten::block_diag" for an operator or any of its overloads (the name PyTorch's profiler
    gives the operator's runs)."""
    packet = getattr(op, "overloadpacket", op)
    return packet._qualified_op_name


class _Recorded:
    """The operators PyTorch's profiler recorded while a block ran (`_operators_recorded`)."""
    names: frozenset = frozenset()
    stopped_by_the_answer = False


@contextmanager
def _operators_recorded():
    """Record the names of the operators the dispatcher runs while the block runs (PyTorch's
    profiler, CPU only). Yields a `_Recorded`, filled when the block ends, or None where a
    profiler is already running (they do not nest)."""
    from torch.autograd import profiler
    if torch._C._autograd._profiler_enabled():
        yield None
        return
    recorded = _Recorded()
    with quietly_running(profiler.profile()) as prof:
        try:
            yield recorded
        finally:        # (switched off by the answer: quietly_running leaves it so)
            recorded.stopped_by_the_answer = not torch._C._autograd._profiler_enabled()
    if not recorded.stopped_by_the_answer:
        recorded.names = frozenset(e.name for e in prof.function_events)


# torch._C's ways to take the dispatch modes off, or to exclude the Python dispatch key
_DISPATCH_SWITCHES = ("_DisableTorchDispatch", "_ExcludeDispatchKeyGuard",
                      "ExcludeDispatchKeyGuard", "_SetExcludeDispatchKeyGuard",
                      "_dispatch_tls_set_dispatch_key_excluded", "_pop_torch_dispatch_stack",
                      "_unset_dispatch_mode", "_set_dispatch_mode")


def _ops_switched_off(what: str, how: str) -> str:
    return (f"this exercise wants {what}, but the answer switched off the check's watch of "
            f"PyTorch's operators (it {how}): write it yourself, without switching PyTorch's "
            "dispatch off")


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


# --- processes: an answer's other process is not watched ----------------------------------------

class _Block:
    """One running `library_barred` block, as the process guard needs it."""

    def __init__(self, watch, what, caught, inside, owner):
        self.watch, self.what, self.caught, self.inside, self.owner = \
            watch, what, caught, inside, owner


_BLOCKS: list = []                  # the blocks running now, the newest last
_BLOCKS_LOCK = threading.Lock()
_PROCESS_SAVED: list = []           # (holder, attribute, original) while the guard is installed

_STDLIB = tuple({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")})
# standard-library modules that start a fixed program (ldconfig, gcc -l..., file), never code of
# their caller's choosing: torch and Triton look libraries up through them
_FIXED_LOOKUPS = ("ctypes/util.py", "platform.py")
_frame_kinds: dict = {}


def _compiler_folders() -> tuple:
    """The code whose own calls may start processes while an answer runs: Triton's compiler and
    backends (ptxas, the C compiler for its launchers, `ldconfig`), and PyTorch's Inductor (its
    compile workers). Folders and files; not Triton's testing or autotuning helpers, which call
    functions they are given."""
    found = [Path(torch.__file__).resolve().parent / "_inductor"]
    try:
        import triton
        root = Path(triton.__file__).resolve().parent
        found += [root / "compiler", root / "backends", root / "runtime" / "build.py",
                  root / "knobs.py"]
    except ImportError:  # pragma: no cover -- triton is a dependency
        pass
    return tuple(found)


_COMPILERS: tuple = ()


def _frame_kind(filename: str) -> str:
    """"guard" (this file), "stdlib", "lookup" (a fixed look-up of the standard library),
    "compiler" (Triton, Inductor) or "other" (the answer, or any other library)."""
    kind = _frame_kinds.get(filename)
    if kind is None:
        p = _resolved(filename)
        if filename.startswith("<frozen "):
            kind = "stdlib"
        elif p is None:
            kind = "other"                     # a notebook cell, exec'd source
        elif p == Path(__file__).resolve():
            kind = "guard"
        elif "site-packages" in p.parts or "dist-packages" in p.parts:
            kind = "compiler" if any(f == p or f in p.parents for f in _COMPILERS) else "other"
        elif any(s in p.parents for s in _STDLIB):
            posix = p.as_posix()
            kind = "lookup" if any(posix.endswith("/" + m) for m in _FIXED_LOOKUPS) else "stdlib"
        else:
            kind = "compiler" if any(f == p or f in p.parents for f in _COMPILERS) else "other"
        _frame_kinds[filename] = kind
    return kind


def _started_by_a_compiler(frame) -> Optional[bool]:
    """Is the nearest caller of this process start outside the standard library (and this
    guard) Triton or Inductor, or one of the standard library's fixed look-ups? None when only
    the standard library is on the stack (a pool's machinery thread, or a thread started on a
    function of the standard library)."""
    while frame is not None:
        kind = _frame_kind(frame.f_code.co_filename)
        if kind in ("compiler", "lookup"):
            return True
        if kind == "other":
            return False
        frame = frame.f_back
    return None


def _process_refused(label: str, verb: str) -> None:
    """Raise LibraryAnswer for a process started (or work handed to one) while an answer runs,
    unless Triton's or Inductor's own code does it, or the thread is in allowed code."""
    with _BLOCKS_LOCK:
        if not _BLOCKS:
            return
        mine = sys.getprofile()
        block = next((b for b in reversed(_BLOCKS) if b.watch is mine), _BLOCKS[-1])
    if block.inside and threading.get_ident() == block.owner:
        return                   # allowed code (what the exercise hands the learner) runs now
    by_compiler = _started_by_a_compiler(sys._getframe(2))
    if by_compiler or (by_compiler is None and block.watch is not mine):
        return                   # a compiler, or a thread the block does not watch (a pool's
        #                          machinery, started before the answer ran)
    message = (f"this exercise wants {block.what}, but the answer {verb} ({label}), where the "
               "check cannot see what runs: write it yourself, in this process")
    block.caught.append(message)
    raise LibraryAnswer(message)


def _process_entry_points() -> list:
    """(holder, attribute, label, verb) for each way to start a process or hand one work."""
    import concurrent.futures.process
    import multiprocessing.pool
    import multiprocessing.process
    import subprocess

    started, handed = "started another process", "handed work to another process"
    points = [(multiprocessing.process.BaseProcess, "start", "multiprocessing's Process.start",
               started),
              (subprocess.Popen, "_execute_child", "subprocess.Popen", started),
              (subprocess, "_fork_exec", "subprocess's fork_exec", started)]
    try:
        import _posixsubprocess
        points.append((_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec", started))
    except ImportError:  # pragma: no cover -- not a POSIX system
        pass
    points += [(os, name, f"os.{name}", started)
               for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp")]
    points += [(concurrent.futures.process.ProcessPoolExecutor, "submit",
                "ProcessPoolExecutor.submit", handed)]
    points += [(multiprocessing.pool.Pool, name, f"multiprocessing's Pool.{name}", handed)
               for name in ("apply_async", "_map_async", "imap", "imap_unordered")]
    return points


def _refusing(original, label: str, verb: str, holder):
    """`original`, refusing (see `_process_refused`) while an answer runs."""
    import multiprocessing.pool

    thread_pool = getattr(multiprocessing.pool, "ThreadPool", None)

    def guarded(*args, **kwargs):
        if holder is multiprocessing.pool.Pool and args and thread_pool is not None \
                and isinstance(args[0], thread_pool):     # threads, not processes: watched
            args, kwargs = _work_watched(args, kwargs, 1, "func")
        else:
            _process_refused(label, verb)
        return original(*args, **kwargs)
    guarded.__wrapped__ = original
    return guarded


def _watched(fn, watch):
    """fn, run with the answer's watch on in whatever thread runs it."""
    def run(*args, **kwargs):
        previous = sys.getprofile()
        sys.setprofile(watch)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(previous)
    return run


def _work_watched(args: tuple, kwargs: dict, index: int, name: str) -> Tuple[tuple, dict]:
    """(args, kwargs) with the function handed to a thread (positional `index`, or keyword
    `name`) run under the watch of the calling thread, when that thread is an answer's."""
    with _BLOCKS_LOCK:
        mine = sys.getprofile()
        watched = any(b.watch is mine for b in _BLOCKS)
    if not watched:
        return args, kwargs
    if len(args) > index:
        args = (*args[:index], _watched(args[index], mine), *args[index + 1:])
    elif name in kwargs:
        kwargs = {**kwargs, name: _watched(kwargs[name], mine)}
    return args, kwargs


def _handing_to_a_thread(original, index: int, name: str):
    """`original` (a way to run a function in a thread that may have started before the answer
    ran), running that function under the answer's watch when an answer hands it over."""
    def handed(*args, **kwargs):
        args, kwargs = _work_watched(args, kwargs, index, name)
        return original(*args, **kwargs)
    handed.__wrapped__ = original
    return handed


def _thread_entry_points() -> list:
    """(holder, attribute, index, name) for the ways to run a function in a thread that
    `threading.setprofile` does not reach: `_thread`'s own start (threading's is bound at its
    import, and set up by `threading.setprofile` anyway) and the thread pools, whose threads
    may have started before the answer ran."""
    import _thread
    import concurrent.futures.thread

    points = [(_thread, n, 0, "function") for n in ("start_new_thread", "start_new",
                                                      "start_joinable_thread")]
    points.append((concurrent.futures.thread.ThreadPoolExecutor, "submit", 1, "fn"))
    return points


def _patched(holder, attr: str, wrap: Callable, saved: list) -> None:
    """Replace holder.attr (a class's own attribute, or a module's) by wrap(it), saved in
    `saved` to be put back (`_put_back`); nothing where it has none."""
    original = (holder.__dict__.get(attr) if isinstance(holder, type)
                else getattr(holder, attr, None))
    if original is not None:
        saved.append((holder, attr, original))
        setattr(holder, attr, wrap(original))


def _put_back(saved: list) -> None:
    """Undo `_patched`'s replacements recorded in `saved`, the newest first."""
    while saved:
        holder, attr, original = saved.pop()
        setattr(holder, attr, original)


@contextmanager
def _processes_refused(block: _Block):
    """While the block runs, starting a process (or handing one work) is refused, in any thread,
    except by Triton's and Inductor's own code (see the module docstring). The entry points are
    patched while any block runs and put back when the last one ends, on every path."""
    global _COMPILERS
    with _BLOCKS_LOCK:
        if not _BLOCKS:
            if not _COMPILERS:
                _COMPILERS = _compiler_folders()
            for holder, attr, label, verb in _process_entry_points():
                _patched(holder, attr, lambda f: _refusing(f, label, verb, holder),
                         _PROCESS_SAVED)
            for holder, attr, index, name in _thread_entry_points():
                _patched(holder, attr, lambda f: _handing_to_a_thread(f, index, name),
                         _PROCESS_SAVED)
        _BLOCKS.append(block)
    try:
        yield
    finally:
        with _BLOCKS_LOCK:
            _BLOCKS.remove(block)
            if not _BLOCKS:
                _put_back(_PROCESS_SAVED)


_THREADING_SETPROFILE = threading.setprofile.__code__


def _by_the_guard(frame) -> bool:
    """Is `frame` this module's own (the guard switching the watch for a kernel it allowed, or
    putting it back)?"""
    return frame is not None and _frame_kind(frame.f_code.co_filename) == "guard"


def _caught_message(what: str, entry) -> str:
    """The refusal's message for an entry of library_barred's `caught`: a message as it is, or
    (how, what was reached) put into words by `_refusal`."""
    return entry if isinstance(entry, str) else _refusal(what, *entry)


@contextmanager
def library_barred(what: str, *, allow: Iterable = (), bar: Iterable = (), bar_ops: Iterable = ()):
    """Within the block, a call into barred code raises LibraryAnswer (see the module docstring).

    what: the exercise's subject, for the message ("your backward kernel").
    allow: modules or functions of the product the exercise hands the learner; what they call
        in turn is allowed too.
    bar: further functions, classes or @triton.jit kernels the answer must not call (their
        code objects are matched; a kernel also by its file and name).
    bar_ops: PyTorch operators the answer must not run, however it reaches them: an overload
        (`torch.ops.aten.block_diag.default`) or every overload (`torch.ops.aten.block_diag`).
        An answer that switches this watch off is refused too.

    A barred call that the answer catches and survives is still reported: the block raises
    LibraryAnswer when it ends.
    """
    rules = _Rules(allow, bar)
    caught = []
    inside = []                     # frames of allowed code running now (this thread)
    owner = threading.get_ident()

    switched_off = (f"this exercise wants {what}, but the answer switched off the check's watch "
                    "of the calls it makes (sys.setprofile or threading.setprofile): write it "
                    "yourself, without touching the profiler")

    switched = []
    ops = None                      # the operator watch (`_OpsWatch`), with bar_ops

    def switched_by(mine: bool):
        """The answer switches the watch off: refused now in its own thread; in another (a thread
        of its own, which may also stand for autograd's, whose launches are refused there) when
        the block ends, unless something else is refused first."""
        if mine:
            caught.append(switched_off)
            raise LibraryAnswer(switched_off)
        switched.append(switched_off)

    def watch(frame, event, arg):
        if ops is not None and not caught and not (inside and threading.get_ident() == owner):
            how = ops.by_the_answer(frame, event)
            if how is not None:       # the operator watch switched off: refused when the block
                caught.append(_ops_switched_off(what, how))  # ends, not raised here, where it
                return                # could stop the answer's `with` from switching it back
        if event == "call":
            mine = threading.get_ident() == owner
            if caught or (mine and inside):
                return
            if frame.f_code is _THREADING_SETPROFILE and not _by_the_guard(frame.f_back):
                switched_by(mine)       # (even to put it back later: in between, the answer's
                #                         calls went unwatched)
            hit = rules.verdict(frame.f_code)
            if hit == "allowed" and mine:      # a thread the answer starts is watched throughout
                inside.append(frame)
            elif hit == "barred":
                caught.append(("called", frame.f_code))
                raise LibraryAnswer(_refusal(what, "called", frame.f_code))
        elif event == "c_call":
            if arg is sys.setprofile and not caught and not _by_the_guard(frame) \
                    and not (inside and threading.get_ident() == owner):
                switched_by(threading.get_ident() == owner)
        elif event == "return" and inside and inside[-1] is frame:
            inside.pop()

    previous = sys.getprofile()
    previous_threads = threading.getprofile()
    with _launches_watched(rules, what, caught, inside, owner), \
            _ops_barred(tuple(bar_ops), what, caught, inside, owner) as ops, \
            _processes_refused(_Block(watch, what, caught, inside, owner)):
        sys.setprofile(watch)
        threading.setprofile(watch)             # threads the answer starts are watched too
        try:
            yield
        except Exception as exc:
            # A refusal raised where the answer cannot see it whole (TorchScript's interpreter
            # re-raises it as a RuntimeError with an empty message, say): the refusal, not the
            # wrapper, is what the learner is told, a barred call first (entering the dispatch
            # mode from C++ also reads as the watch switched off).
            if caught and not isinstance(exc, LibraryAnswer):
                first = next((c for c in caught if not isinstance(c, str)), caught[0])
                raise LibraryAnswer(_caught_message(what, first)) from exc
            raise
        finally:
            still_watched = sys.getprofile() is watch and threading.getprofile() is watch
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
    if caught:       # raised inside the answer and caught there: still not the learner's code
        raise LibraryAnswer(_caught_message(what, caught[0]))
    if switched or not still_watched:
        raise LibraryAnswer(switched_off)


def fresh_seed() -> int:
    """A seed drawn when the check runs, from the operating system (`os.urandom`), not from
    torch's global generator, which the learner's notebook seeds: inputs made from it cannot be
    known before the check runs, so no answer computed beforehand (with the library, outside
    the check's watch) matches them. Checks label such a case with its seed, so a failure can
    be reproduced."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def fresh_generator() -> Tuple[int, torch.Generator]:
    """(seed, a CPU torch.Generator seeded with it) for a check's case drawn when it runs (see
    `fresh_seed`)."""
    seed = fresh_seed()
    return seed, torch.Generator().manual_seed(seed)


def run_own_code(name: str, what: str, fn: Optional[Callable], *args,
                 allow: Iterable = (), bar: Iterable = (), bar_ops: Iterable = (),
                 returns: Optional[str] = None, **kwargs) -> Tuple[bool, Any]:
    """Call the learner's fn(*args, **kwargs) with the library's answers barred.

    Returns (True, its result), or prints ❌ with the reason and returns (False, None) when the
    answer is missing, raises, returns None or calls barred code (see `library_barred`).
    `returns` says what fn should return, for the ❌ line of a blank answer (`guarded_call`).
    """
    return guarded_call(name, fn, args, kwargs,
                        guard=lambda: library_barred(what, allow=allow, bar=bar,
                                                     bar_ops=bar_ops),
                        refusals=(LibraryAnswer,), returns=returns)


def check_cases(name: str, what: str, fn: Callable, cases: Iterable, *,
                hint: Optional[str] = None, atol: Optional[float] = None,
                rtol: Optional[float] = None, post: Optional[Callable] = None,
                bar: Iterable = (), bar_ops: Iterable = (),
                returns: Optional[str] = None) -> bool:
    """Run fn(*args) for each (label, args, expected) with ropelib's answers (and `bar`, and the
    PyTorch operators of `bar_ops`) barred; one ✅ line, or ❌ for the first failure. Never raises.

    `what` names the exercise in a refusal ("your rotation matrix"). `post(answer, expected)`
    may reshape the learner's answer before comparing (e.g. angles reduced modulo 2 pi).
    `returns` says what fn should return: a blank answer's ❌ line tells the learner to write it.
    """
    answer = expected = None
    for label, args, expected in cases:
        ok, answer = run_own_code(f"{name} ({label})", what, fn, *args, bar=bar,
                                  bar_ops=bar_ops, returns=returns)
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


def notebook_kernels() -> tuple:
    """The `@triton.jit` kernels the running notebook defines (its `__main__` namespace), less
    the learner's own (named `my_...`, or bound to such a name too): the kernels a notebook
    teaches before its exercises. A kernel check bars them, as it bars ropelib's, so an answer
    that launches one or calls it as a helper is refused. Outside a notebook, whatever
    `__main__` holds."""
    main = sys.modules.get("__main__")
    names = dict(vars(main)) if main is not None else {}
    kernels = [(key, obj) for key, obj in names.items() if _is_jit(obj)]
    # the learner's: bound to a my_ name (also under another: `te_combine = my_combine`), or
    # a function named my_ (a cell run again defines it anew, in the same file)
    learners = {id(obj) for key, obj in kernels if key.startswith("my_")}
    return tuple(obj for key, obj in kernels
                 if id(obj) not in learners and not key.startswith("my_")
                 and not getattr(getattr(obj, "fn", obj), "__name__", "").startswith("my_"))


def launch_barred(name: str, label: str, what: str, start: Callable[[], Any], *,
                  bar: Iterable = (), barred: bool = True, last_line: bool = False
                  ) -> Tuple[bool, Any]:
    """(True, start()) when the learner's kernel launches with ropelib's answers, the
    notebook's own teaching kernels (`notebook_kernels`) and `bar` barred; else print the ❌
    line (a refusal, or what the launch raised, for case `label`) and return (False, None). The
    kernel exercises' checks all launch through here.

    barred: False runs start() as it is, nothing barred (a check's compiled launch on a GPU,
        after its interpreted launch was barred); a failure is reported the same way.
    last_line: report what the launch raised by the last line of its message ("the launch
        raised ValueError: ...", where Triton's compiler puts the reason after the source it
        quotes), not by its first.
    """
    try:
        with library_barred(what, bar=(*bar, *notebook_kernels())) if barred else nullcontext():
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
