"""Count the work a Triton kernel issues, by running it in Triton's interpreter.

On a GPU a kernel's cost is its time. In the interpreter (the CPU runs the kernel's Python one
program after another, with numpy for every tile) time says nothing about a GPU, but the work
the kernel issues can be counted exactly: how many programs run, how many sines and cosines
are evaluated (every lane of a tile, masked or not: a GPU evaluates those lanes too) and how
many elements each load reads from each tensor (the lanes whose mask is on), and how many of
those each program had read before its first store.

    with count_work(positions=pos, inv_freq=inv) as work:
        interpreted(kernel)[grid](q, ..., BLOCK_T=4)
    work.programs, work.sin, work.cos, work.loads["positions"]
    work.loads_before_store["positions"]     # one entry per program, in the order they ran

`interpreted(kernel)` is the kernel as the interpreter runs it: the kernel itself under
TRITON_INTERPRET=1; elsewhere (a GPU machine) its Python function run by the interpreter, on CPU
tensors, with the @triton.jit helpers it calls by a global name interpreted along with it.
"""
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

__all__ = ["WorkCount", "count_work", "interpreted", "interpreter_compat"]


@dataclass
class WorkCount:
    """What the launches inside one `count_work` block issued."""
    programs: int = 0                   # program instances run
    sin: int = 0                        # sine evaluations (elements of every tl.sin)
    cos: int = 0                        # cosine evaluations
    loads: Dict[str, int] = field(default_factory=dict)   # elements loaded, per named tensor
    # per named tensor, program by program: the elements loaded before the program's first store
    loads_before_store: Dict[str, List[int]] = field(default_factory=dict)

    @property
    def sincos(self) -> int:
        return self.sin + self.cos


def _byte_range(t: torch.Tensor):
    """[first byte, one past the last) of a tensor's elements (non-negative strides)."""
    span = (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
    return t.data_ptr(), t.data_ptr() + (span if t.numel() else 0)


@contextmanager
def count_work(**tensors: torch.Tensor):
    """Count programs, sin/cos evaluations and loads of the interpreted launches in the block.

    tensors: name -> a CPU tensor the kernel reads; `loads[name]` counts the elements loaded
    from its memory (lanes whose mask is on), `loads_before_store[name]` the part of them each
    program loaded before its first store. Only launches run by Triton's interpreter are
    counted (see `interpreted`).
    """
    from triton.runtime.interpreter import InterpreterBuilder

    for name, t in tensors.items():
        if t.device.type != "cpu":
            raise ValueError(f"count_work counts interpreted launches, which read CPU tensors: "
                             f"{name} is on {t.device}")
    work = WorkCount(loads={name: 0 for name in tensors},
                     loads_before_store={name: [] for name in tensors})
    ranges = {name: _byte_range(t) for name, t in tensors.items()}
    stored = [True]             # has the program running now stored anything yet?
    saved = {name: getattr(InterpreterBuilder, name)
             for name in ("create_sin", "create_cos", "create_masked_load",
                          "create_masked_store", "set_grid_idx")}

    def sin(self, arg):
        work.sin += int(arg.data.size)
        return saved["create_sin"](self, arg)

    def cos(self, arg):
        work.cos += int(arg.data.size)
        return saved["create_cos"](self, arg)

    def masked_load(self, ptrs, mask, *rest, **kw):
        # (ptrs, mask, then what this Triton's interpreter passes: other, cache and eviction
        # policies, volatility; the list differs between Triton versions)
        addr = np.asarray(ptrs.data)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)
        for name, (lo, hi) in ranges.items():
            n = int(((addr >= lo) & (addr < hi) & on).sum())
            work.loads[name] += n
            if not stored[0]:
                work.loads_before_store[name][-1] += n
        return saved["create_masked_load"](self, ptrs, mask, *rest, **kw)

    def masked_store(self, *args, **kw):
        stored[0] = True
        return saved["create_masked_store"](self, *args, **kw)

    def grid_idx(self, x, y, z):
        work.programs += 1
        stored[0] = False
        for counts in work.loads_before_store.values():
            counts.append(0)
        return saved["set_grid_idx"](self, x, y, z)

    patched = {"create_sin": sin, "create_cos": cos, "create_masked_load": masked_load,
               "create_masked_store": masked_store, "set_grid_idx": grid_idx}
    for name, fn in patched.items():
        setattr(InterpreterBuilder, name, fn)
    try:
        yield work
    finally:
        for name, fn in saved.items():
            setattr(InterpreterBuilder, name, fn)


def _is_jit(obj) -> bool:
    from triton.runtime.jit import JITFunction
    return isinstance(obj, JITFunction)


def _jit_globals(fn, found: dict) -> dict:
    """{(id of a namespace, name): (namespace, name, JITFunction)} of the @triton.jit helpers
    fn calls by a global name, and theirs."""
    g = fn.__globals__
    for name in fn.__code__.co_names:
        obj = g.get(name)
        key = (id(g), name)
        if _is_jit(obj) and key not in found:
            found[key] = (g, name, obj)
            _jit_globals(obj.fn, found)
    return found


def _language_jit(found: dict) -> dict:
    """The same for triton.language's own @triton.jit functions (tl.zeros, tl.cdiv, tl.sum's
    combine functions...): made by `jit` when triton was imported, so compiled-mode ones
    where the interpreter was not switched on then."""
    import sys
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "triton.language"
                               or mod_name.startswith("triton.language.")):
            continue
        space = vars(mod)
        for name, obj in list(space.items()):
            if _is_jit(obj):
                found.setdefault((id(space), name), (space, name, obj))
    return found


class _Interpreted:
    """A compiled-mode @triton.jit kernel launched through Triton's interpreter: for the
    launch, the @triton.jit functions it may call (its helpers by global name, triton.language's
    own) are swapped for interpreted ones, then put back."""

    def __init__(self, kernel):
        from triton.runtime.interpreter import InterpretedFunction
        self.kernel = kernel
        self.run = InterpretedFunction(kernel.fn)

    def __getitem__(self, grid):
        from triton.runtime.interpreter import InterpretedFunction

        def launch(*args, **kwargs):
            try:    # imported on a launch's first use, it wants triton.language as it was
                import triton.experimental.gluon  # noqa: F401
            except Exception:  # noqa: BLE001 -- not in every release
                pass
            swapped = _language_jit(_jit_globals(self.kernel.fn, {}))
            for space, name, obj in swapped.values():
                space[name] = InterpretedFunction(obj.fn)
            try:
                with interpreter_compat():
                    return self.run[grid](*args, **kwargs)
            finally:
                for space, name, obj in swapped.values():
                    space[name] = obj
        return launch


@contextmanager
def interpreter_compat():
    """Around a launch through Triton's interpreter from a process whose kernels are compiled
    (a GPU machine), two repairs of older Tritons' interpreter:
    - an interpreted helper's call leaves the interpreter's builtins in `triton.language`
      (Triton 3.6 and 3.9); the next compile would build its IR with them. The namespaces are
      put back as they were.
    - a scalar argument is a 1-element array there, and `range(B)` of it converts it with
      int(array), which NumPy 2 refuses for arrays of one dimension (Triton 3.6; 3.9 squeezes
      it first, as is done here)."""
    from triton.runtime import interpreter
    language = _language_state()
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is not None:
        def patch_lang_tensor(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
        interpreter._patch_lang_tensor = patch_lang_tensor
    try:
        yield
    finally:
        if original is not None:
            interpreter._patch_lang_tensor = original
        _restore_language(language)


def _language_namespaces() -> tuple:
    import triton.language as tl
    return (tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base)


def _language_state() -> list:
    """What triton.language's namespaces hold now. The interpreter swaps their builtins for
    interpreted ones while it runs a kernel, and an interpreted helper's call swaps them without
    putting them back (Triton 3.6 and 3.9): on a GPU, the next compile would then build its IR
    with interpreter functions and fail."""
    return [(space, dict(vars(space))) for space in _language_namespaces()]


def _restore_language(state: list) -> None:
    for space, saved in state:
        for name in set(vars(space)) - set(saved):
            if not inspect.ismodule(vars(space)[name]):    # (a submodule imported meanwhile stays)
                delattr(space, name)
        for name, value in saved.items():
            if vars(space).get(name, _MISSING) is not value:
                setattr(space, name, value)


_MISSING = object()


def interpreted(kernel):
    """The kernel as Triton's interpreter runs it (launch it on CPU tensors): the kernel itself
    under TRITON_INTERPRET=1, else a wrapper that interprets its Python function (a @triton.jit
    kernel's, or any kernel object's `fn`), with the repairs of `interpreter_compat`. Every
    interpreted launch of the course (work counts, recorded accesses, the puzzles) goes here."""
    from triton.runtime.interpreter import InterpretedFunction
    if isinstance(kernel, InterpretedFunction):
        return kernel
    if _is_jit(kernel) or inspect.isfunction(getattr(kernel, "fn", None)):
        return _Interpreted(kernel)
    raise TypeError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
