"""Notebook 08, section 4b's exercise as a learner meets it: `my_combine` edited in its own cell.

The answer is the `@triton.jit` function the section's kernel calls as COMBINE, so the check
needs the learner's code there. Each case below takes the notebook's own exercise cell, puts a
body into `my_combine`, and runs the cell in a namespace like the notebook's, where `te_combine`
already holds the worked solution (the fallback the cell after the exercise binds when an answer
fails). The check must fail for an answer that calls `te_combine` by that name (the worked
solution), or ropelib's own combine, and for a blank answer; it must pass for a correct line the
learner wrote, and the refusal must be the barring alone (with nothing barred, the answer that
calls `te_combine` gives TE's bits).
"""
import ast
import contextlib
import itertools
import os
import re
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course import debug  # noqa: E402
from ropelib.course.exercises import debugging as ex  # noqa: E402
from ropelib.course.exercises import own_code  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import scratch_folder, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "08-debugging-allclose.py"
_CELLS = scratch_folder("nb08_cells_")
_count = itertools.count()

pytestmark = pytest.mark.skipif(debug.te_bits_file() is None,
                                reason="no benchmarks/results/te-bits-*.pt here")


def _exercise_cell() -> ast.FunctionDef:
    """The notebook's `my_combine`, as the learner finds it."""
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "my_combine"]
    assert len(found) == 1, "notebook 08 defines my_combine once"
    return found[0]


def _learner_cell(body: str):
    """The exercise cell with `body` (lines of Python, indented by the caller's nothing) in place
    of my_combine's, run from a file of its own in the notebook's names; returns my_combine."""
    cell = _exercise_cell()
    lines = [f"    {ln}" for ln in body.strip("\n").splitlines()]
    source = "\n".join(["@triton.jit", f"def my_combine({ast.unparse(cell.args)}):", *lines]) + "\n"
    names = {"triton": triton, "tl": tl, "ex": ex, "common": common, "debug": debug,
             "te_combine": ex.solution_te_combine}   # as the cell after the exercise binds it
    path = _CELLS / f"nb08_cell_{next(_count)}.py"
    return written_module(f"nb08_cell_{path.stem}", path, source, names).my_combine


def test_the_cell_starts_from_the_line_as_written_which_fails(capsys):
    # the template itself: the learner's starting point is no answer
    body = "\n".join(ast.unparse(stmt) for stmt in _exercise_cell().body)
    assert ex.check_te_combine(_learner_cell(body)) is False
    assert "their roundings are not TE's" in capsys.readouterr().out


@pytest.mark.parametrize("body", ["pass", "...", '"""the combine"""\n# your two lines'],
                         ids=["pass", "ellipsis", "a docstring and a comment"])
def test_a_blank_answer_fails(body, capsys):
    assert ex.check_te_combine(_learner_cell(body)) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ combine with TE's bits: no answer yet"), out
    assert "✅" not in out


CALLS = {
    "te_combine, the worked solution, by its notebook name": (
        "return te_combine(x1, x2, c, s)", "ropelib's solution_te_combine"),
    "the worked solution through its module": (
        "y1, y2 = ex.solution_te_combine(x1, x2, c, s)\nreturn y1, y2",
        "ropelib's solution_te_combine"),
    "ropelib's rotate_pair": (
        "return common.rotate_pair(x1, x2, c, s, c, s)", "ropelib's rotate_pair"),
    "the reproduction kernel's fma line": (
        "return debug._fused_pair(x1, x2, c, s)", "ropelib's _fused_pair"),
}


@pytest.mark.parametrize("label", list(CALLS))
def test_an_answer_that_calls_ropelib_is_refused(label, capsys):
    body, words = CALLS[label]
    assert ex.check_te_combine(_learner_cell(body)) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ combine with TE's bits: this exercise wants your combine"), out
    assert words in out and "write it yourself" in out and "✅" not in out, out


@contextlib.contextmanager
def _nothing_barred(what, *, allow=(), bar=(), bar_ops=()):
    yield


def test_the_refusal_is_the_barring_alone(monkeypatch, capsys):
    # with nothing barred, te_combine's line is TE's: only the barring fails the answer above
    monkeypatch.setattr(own_code, "library_barred", _nothing_barred)
    fn = _learner_cell(CALLS["te_combine, the worked solution, by its notebook name"][0])
    assert ex.check_te_combine(fn) is True, capsys.readouterr().out


@pytest.mark.parametrize("body", [
    "y1 = tl.fma(x1, c, -(x2 * s))\ny2 = tl.fma(x2, c, x1 * s)\nreturn y1, y2",
    "rs1 = -x2 * s             # rot*s rounded once, x*c exact in the sum\n"
    "rs2 = x1 * s\nreturn tl.fma(c, x1, rs1), tl.fma(c, x2, rs2)",
], ids=["TE's order", "TE's order, spelled otherwise"])
def test_a_correct_own_answer_passes(body, capsys):
    assert ex.check_te_combine(_learner_cell(body)) is True
    out = capsys.readouterr().out
    assert "✅ combine with TE's bits: bit for bit" in out and "❌" not in out, out
    assert len(re.findall(r": 0 of [\d,]+ elements differ", out)) == 2, out   # both stored cases

