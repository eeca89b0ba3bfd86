"""Instant feedback for the notebook exercises.

`check(name, answer, expected)` compares a learner's answer with the expected one and prints
one line: ✅ when it matches, ❌ with what differs (and an optional hint) when it does not. It
never raises, so a notebook keeps running top to bottom with unanswered exercises; it returns
the verdict as a bool for tests. `solution(...)` shows a worked solution folded away in a
collapsible block in Jupyter (plain text elsewhere).

The `check_...` helpers for each notebook live in submodules: `basics` for notebooks 00-02;
`kernels`, `naive_kernel`, `grid_kernel`, `finished_kernel` and `backward_kernel` for 03-06;
`measuring` for 07; `debugging` for 08; `in_a_model` for 09; `multi_axis` and `at_scale` for 10
and 11. They compute the expected answer from ropelib itself (08's from the committed GPU
measurements against TE), never hard-code it, and run the learner's function or
kernel with ropelib's own answers barred (`own_code`): an answer that calls the finished library,
the teaching kernels, the library function that computes the very thing asked, or the worked
solution is refused.
"""
import ast
import contextlib
import html
import inspect
import math
import numbers
import textwrap
from typing import Any, Callable, Optional, Tuple, Union

import torch

__all__ = ["check", "solution", "call_answer", "is_kernel", "is_blank_kernel", "kernel_answer"]

# A placeholder `...` (Ellipsis) or None means "not answered yet".
_UNANSWERED = (None, Ellipsis)

# Default tolerances (rtol, atol) for floating-point tensors, by the less precise dtype of the
# two sides; the same table torch.testing.assert_close uses.
_TENSOR_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
_SCALAR_TOL = (1e-6, 1e-9)  # (rtol, atol) for Python/NumPy floats


def _is_tensorlike(x) -> bool:
    return isinstance(x, torch.Tensor) or type(x).__module__.startswith("numpy")


def _to_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    return torch.as_tensor(x)


def _fmt(x) -> str:
    if isinstance(x, torch.Tensor):
        if x.numel() <= 8:
            return f"tensor({x.tolist()}, dtype={x.dtype})"
        return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype})"
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


def _compare_tensors(answer, expected, atol, rtol) -> Tuple[bool, str]:
    try:
        a = _to_tensor(answer)
    except Exception:  # noqa: BLE001 -- anything not convertible is simply a wrong type
        return False, f"expected a tensor, got {type(answer).__name__}"
    e = _to_tensor(expected)
    if tuple(a.shape) != tuple(e.shape):
        return False, f"shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    if not (e.is_floating_point() or e.is_complex()):
        # Integer/bool expectations are exact (positions, indices, masks).
        if a.is_complex() or (a.is_floating_point() and not torch.equal(a, a.round())):
            return False, f"expected integer values ({e.dtype}), got {a.dtype} with fractions"
        if a.device != e.device:
            a = a.to(e.device)
        bad = a.to(torch.float64) != e.to(torch.float64) if a.dtype != e.dtype else a != e
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
            return False, (f"{int(bad.sum())} of {bad.numel()} entries differ; first at index "
                           f"{idx}: got {a[idx].item()}, expected {e[idx].item()}")
        return True, ""
    if a.dtype == torch.bool:
        return False, "expected numbers, got a bool tensor"
    if rtol is None or atol is None:
        pa = _TENSOR_TOL.get(a.dtype, _TENSOR_TOL[torch.float32])
        pe = _TENSOR_TOL.get(e.dtype, _TENSOR_TOL[torch.float32])
        loose = max(pa, pe)
        rtol = loose[0] if rtol is None else rtol
        atol = loose[1] if atol is None else atol
    wide = torch.complex128 if (a.is_complex() or e.is_complex()) else torch.float64
    a64, e64 = a.to(device="cpu", dtype=wide), e.to(device="cpu", dtype=wide)
    if bool(torch.isnan(a64).any()) and not bool(torch.isnan(e64).any()):
        return False, f"{int(torch.isnan(a64).sum())} entries are NaN"
    close = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        err = (a64 - e64).abs().nan_to_num(0.0)
        return True, f" (max abs err {err.max().item():.2e})" if err.numel() else ""
    err = (a64 - e64).abs().nan_to_num(float("inf"))
    err = torch.where(close, torch.zeros_like(err), err)
    flat = int(err.reshape(-1).argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape)) if e.dim() else ()
    return False, (f"{int((~close).sum())} of {close.numel()} entries differ (atol={atol:g}, "
                   f"rtol={rtol:g}); worst at index {idx}: got {a64[idx].item():.6g}, "
                   f"expected {e64[idx].item():.6g}")


def _compare(answer, expected, atol, rtol) -> Tuple[bool, str]:
    if _is_tensorlike(expected):
        return _compare_tensors(answer, expected, atol, rtol)
    if isinstance(expected, bool):
        a = answer.item() if _is_tensorlike(answer) and _to_tensor(answer).numel() == 1 else answer
        if not isinstance(a, bool) and type(a).__name__ != "bool_":
            return False, f"expected True or False, got {_fmt(answer)}"
        return (bool(a) == expected), ("" if bool(a) == expected else f"got {a}, expected {expected}")
    if isinstance(expected, numbers.Number):
        a = answer
        if _is_tensorlike(a):
            t = _to_tensor(a)
            if t.numel() != 1:
                return False, f"expected a single number, got a tensor of shape {tuple(t.shape)}"
            a = t.item()
        if isinstance(a, bool) or not isinstance(a, numbers.Number):
            return False, f"expected a number, got {_fmt(answer)}"
        if isinstance(expected, numbers.Integral):
            ok = float(a) == float(expected)
            return ok, ("" if ok else f"got {a}, expected {expected}")
        r = _SCALAR_TOL[0] if rtol is None else rtol
        t = _SCALAR_TOL[1] if atol is None else atol
        if isinstance(a, complex) or isinstance(expected, complex):
            ok = abs(a - expected) <= t + r * abs(expected)
        else:
            ok = math.isclose(float(a), float(expected), rel_tol=r, abs_tol=t)
        return ok, ("" if ok else f"got {a!r}, expected {expected!r} (atol={t:g}, rtol={r:g})")
    if isinstance(expected, str):
        if not isinstance(answer, str):
            return False, f"expected a string, got {_fmt(answer)}"
        ok = answer.strip().lower() == expected.strip().lower()
        return ok, ("" if ok else f"got {answer!r}, expected {expected!r}")
    if isinstance(expected, (list, tuple)):
        if _is_tensorlike(answer):
            return _compare_tensors(answer, expected, atol, rtol)
        if not isinstance(answer, (list, tuple)):
            return False, f"expected a {type(expected).__name__} of {len(expected)} items, got {_fmt(answer)}"
        if len(answer) != len(expected):
            return False, f"{len(answer)} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(answer, expected)):
            ok, why = _compare(a, e, atol, rtol)
            if not ok:
                return False, f"item [{i}]: {why}"
        return True, ""
    if isinstance(expected, dict):
        if not isinstance(answer, dict):
            return False, f"expected a dict, got {_fmt(answer)}"
        if set(answer) != set(expected):
            return False, f"keys {sorted(map(str, answer))}, expected {sorted(map(str, expected))}"
        for k in expected:
            ok, why = _compare(answer[k], expected[k], atol, rtol)
            if not ok:
                return False, f"[{k!r}]: {why}"
        return True, ""
    ok = answer == expected
    return bool(ok), ("" if ok else f"got {_fmt(answer)}, expected {_fmt(expected)}")


def check(name: str, answer: Any, expected: Any, *, atol: Optional[float] = None,
          rtol: Optional[float] = None, hint: Optional[str] = None) -> bool:
    """Print whether `answer` matches `expected`; return True/False. Never raises.

    Args:
        name: what is being checked, shown in the message.
        answer: the learner's answer: a tensor/array, number, bool, string, or a list, tuple or
            dict of those. `...` or None counts as "not answered yet".
        expected: the right answer, computed by the caller (from ropelib, never hard-coded).
        atol, rtol: tolerances for floating-point values. Default: torch.testing's per-dtype
            values for tensors (by the less precise side), rtol=1e-6/atol=1e-9 for floats.
            Integers, bools and strings compare exactly (strings ignore case and outer spaces).
        hint: shown under a wrong answer.

    Returns:
        True when the answer matches.
    """
    if any(answer is u for u in _UNANSWERED):
        print(f"❌ {name}: no answer yet (replace the `...`)")
        return False
    try:
        ok, detail = _compare(answer, expected, atol, rtol)
    except Exception as exc:  # noqa: BLE001 -- a checker must not stop the notebook
        ok, detail = False, f"could not compare the answer ({type(exc).__name__}: {exc})"
    if ok:
        print(f"✅ {name}: correct{detail}")
    else:
        print(f"❌ {name}: {detail}" + (f"\n   hint: {hint}" if hint else ""))
    return ok


def guarded_view(shape, pad: int, *, dtype, device, fill=float("nan")) -> Tuple[torch.Tensor,
                                                                             torch.Tensor]:
    """(buffer, view): a contiguous `shape` view of `fill` in the middle of a buffer with `pad`
    elements of `fill` on each side (guard bands). A kernel's output there shows an unwritten
    element as NaN, and a store or load past either end lands in memory the check owns."""
    n = torch.Size(shape).numel()
    buf = torch.full((pad + n + pad,), fill, dtype=dtype, device=device)
    return buf, buf[pad:pad + n].view(shape)


def guard_band_writes(buf: torch.Tensor, pad: int) -> int:
    """How many elements of a NaN `guarded_view` buffer's two guard bands a kernel overwrote
    (stores outside the view: a missing mask or a wrong offset)."""
    return int((~buf[:pad].isnan()).sum() + (~buf[-pad:].isnan()).sum())


def call_answer(name: str, fn: Callable, *args, **kwargs) -> Tuple[bool, Any]:
    """Call a learner's function; on an exception print ❌ with it and return (False, None).

    An unfinished exercise (a body of `...`, which returns None) or a crash is reported instead
    of stopping the notebook. The exercise checks call `own_code.run_own_code`, which does the
    same with ropelib's own answers barred.
    """
    return guarded_call(name, fn, args, kwargs)


def guarded_call(name: str, fn: Callable, args: tuple, kwargs: dict,
                 guard: Callable = contextlib.nullcontext, refusals: tuple = (),
                 returns: Optional[str] = None) -> Tuple[bool, Any]:
    """call_answer's work: fn(*args, **kwargs) inside `with guard():`. An exception of a type in
    `refusals` (the guard's verdict) is printed as it is, any other as the function's error.
    `returns` says what the function should return; the ❌ line of a function that returns None
    (a body still `...`) then tells the learner what to write."""
    if fn is None or fn is Ellipsis:
        print(f"❌ {name}: no answer yet (define the function)")
        return False, None
    if not callable(fn):
        print(f"❌ {name}: expected a function, got {type(fn).__name__}")
        return False, None
    try:
        with guard():
            out = fn(*args, **kwargs)
    except refusals as exc:
        print(f"❌ {name}: {exc}")
        return False, None
    except Exception as exc:  # noqa: BLE001 -- report, do not stop the notebook
        print(f"❌ {name}: your function raised {type(exc).__name__}: {exc}")
        return False, None
    if out is None:
        what = f": replace the `...` with code that returns {returns}" if returns else ""
        print(f"❌ {name}: your function returned None (not answered yet?){what}")
        return False, None
    return True, out


def is_kernel(obj) -> bool:
    """True for a @triton.jit function (compiled, or run by the interpreter)."""
    import triton
    return isinstance(obj, triton.runtime.KernelInterface)


def is_blank_kernel(kernel) -> bool:
    """True when the kernel's body holds nothing but a docstring, `pass`, `...` and comments."""
    fn = getattr(kernel, "fn", kernel)
    try:
        src = getattr(kernel, "src", None) or inspect.getsource(fn)
        tree = ast.parse(textwrap.dedent(src))
    except (OSError, TypeError, SyntaxError):
        return False  # no source to read: let the launch decide
    body = tree.body[0].body if tree.body and hasattr(tree.body[0], "body") else []
    for stmt in body:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and (stmt.value.value is Ellipsis or isinstance(stmt.value.value, str)):
            continue
        return False
    return True


def exception_line(exc: Exception) -> str:
    """The first line of `exc` with its type (at most 300 characters), for a ❌ message."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def kernel_answer(name: str, kernel, reads: str) -> bool:
    """Print ❌ and return False when a kernel exercise's answer is missing or still blank, or
    is not a @triton.jit kernel (the check launches it itself and reads `reads`)."""
    if kernel is None or kernel is Ellipsis or (is_kernel(kernel) and is_blank_kernel(kernel)):
        print(f"❌ {name}: no kernel yet (write the body of the @triton.jit function, then rerun)")
        return False
    if not is_kernel(kernel):
        called = f"{type(kernel).__name__} {getattr(kernel, '__name__', '')!s}".rstrip()
        print(f"❌ {name}: expected a @triton.jit kernel, got {called}; the check launches the "
              f"kernel itself and reads {reads}")
        return False
    return True


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def solution(text_or_code: Union[str, Callable], *, title: str = "Solution") -> None:
    """Show a worked solution folded away: a collapsible <details> block in Jupyter.

    Args:
        text_or_code: the solution as text (dedented), or a function/class whose source is shown.
        title: the label of the collapsed block.

    Outside Jupyter (a script, a terminal) the text is printed under a header.
    """
    if isinstance(text_or_code, str):
        text = textwrap.dedent(text_or_code).strip("\n")
    else:
        try:
            text = textwrap.dedent(inspect.getsource(text_or_code)).strip("\n")
        except (TypeError, OSError) as exc:
            raise TypeError(f"text_or_code must be a string or a function with source, "
                            f"got {type(text_or_code).__name__}") from exc
    if _in_jupyter():
        from IPython.display import HTML, display
        display(HTML(f"<details><summary><b>{html.escape(title)}</b> (click to expand)</summary>"
                     f"<pre><code>{html.escape(text)}</code></pre></details>"))
    else:
        bar = "-" * max(8, len(title) + 8)
        print(f"{bar}\n{title}\n{bar}\n{text}\n{bar}")
