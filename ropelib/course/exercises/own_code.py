"""Exercises that want the learner's own code: run an answer with ropelib's own answers barred.

An exercise that asks for a kernel, or for a formula worked out by hand, is not answered by
calling the finished library (`ropelib.apply_rope`, `torch.ops.ropelib.*`), one of the course's
teaching kernels (`ropelib.course.kernels`), or the library function that computes the very
thing asked for. `run_own_code` calls the learner's function while watching every Python call it
makes (`sys.setprofile`, this thread only): a call whose code lives in a barred file or is a
barred function stops the answer with `LibraryAnswer`, which says what was called and what to
do instead. The checks compute their expected values outside this call, so they may use the
library freely.

What is barred, by default: every module of the product (`ropelib/*.py` and `ropelib/kernels/`,
so the finished kernels, the operators and the public API) and the teaching kernels
(`ropelib/course/kernels/`). `allow` lets an exercise permit what it hands the learner (for
example `ropelib.frequencies` for the angle table of a kernel exercise); `bar` adds functions
elsewhere. The course's helpers (recording accesses, the checks themselves) are never barred.
"""
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Tuple

PACKAGE = Path(__file__).resolve().parents[2]          # .../ropelib
COURSE = PACKAGE / "course"
TEACHING_KERNELS = COURSE / "kernels"


class LibraryAnswer(RuntimeError):
    """An exercise's answer called the library's own answer instead of the learner's code."""


def _module_file(module) -> Path:
    return Path(module.__file__).resolve()


def _barred_files(allow: Iterable) -> Tuple[set, set]:
    """(barred files, barred folders) as resolved paths; `allow` lists modules to permit."""
    allowed = {_module_file(m) for m in allow if getattr(m, "__file__", None)}
    files = {p.resolve() for p in PACKAGE.glob("*.py")} - allowed
    files.discard((PACKAGE / "__init__.py").resolve())   # the package's import, not an answer
    folders = {(PACKAGE / "kernels").resolve(), TEACHING_KERNELS.resolve()}
    return files, folders


def _describe(code) -> str:
    path = Path(code.co_filename)
    try:
        where = path.resolve().relative_to(PACKAGE.parent)
    except ValueError:
        where = path
    return f"{code.co_name} ({where})"


@contextmanager
def library_barred(what: str, *, allow: Iterable = (), bar: Iterable[Callable] = ()):
    """Within the block, a Python call into barred code raises LibraryAnswer (this thread).

    what: the exercise's subject, for the message ("your backward kernel").
    allow: modules of the product the exercise hands the learner.
    bar: further functions the answer must not call (their code objects are matched).
    """
    files, folders = _barred_files(allow)
    barred_codes = {getattr(f, "__code__", None) for f in bar} - {None}
    seen: dict = {}
    caught = []

    def barred(code) -> bool:
        hit = seen.get(code.co_filename)
        if hit is None:
            p = Path(code.co_filename)
            if p.is_absolute():
                p = p.resolve()
                hit = p in files or any(folder in p.parents for folder in folders)
            else:
                hit = False
            seen[code.co_filename] = hit
        return hit or code in barred_codes

    def watch(frame, event, arg):
        if event == "call" and not caught and barred(frame.f_code):
            caught.append(frame.f_code)
            raise LibraryAnswer(
                f"this exercise wants {what}, but the answer called ropelib's "
                f"{_describe(frame.f_code)}: write it yourself (the library computes the "
                "expected value to compare with)")

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)
    if caught:       # raised inside the answer and caught there: still not the learner's code
        raise LibraryAnswer(f"this exercise wants {what}, but the answer called ropelib's "
                            f"{_describe(caught[0])}")


def run_own_code(name: str, what: str, fn: Optional[Callable], *args,
                 allow: Iterable = (), bar: Iterable[Callable] = (), **kwargs
                 ) -> Tuple[bool, Any]:
    """Call the learner's fn(*args, **kwargs) with the library's answers barred.

    Returns (True, its result), or prints ❌ with the reason and returns (False, None) when the
    answer is missing, raises, returns None or calls barred code (see `library_barred`).
    """
    if fn is None or fn is Ellipsis:
        print(f"❌ {name}: no answer yet (define the function)")
        return False, None
    if not callable(fn):
        print(f"❌ {name}: expected a function, got {type(fn).__name__}")
        return False, None
    try:
        with library_barred(what, allow=allow, bar=bar):
            out = fn(*args, **kwargs)
    except LibraryAnswer as exc:
        print(f"❌ {name}: {exc}")
        return False, None
    except Exception as exc:  # noqa: BLE001 -- report, do not stop the notebook
        print(f"❌ {name}: your function raised {type(exc).__name__}: {exc}")
        return False, None
    if out is None:
        print(f"❌ {name}: your function returned None (not answered yet?)")
        return False, None
    return True, out

