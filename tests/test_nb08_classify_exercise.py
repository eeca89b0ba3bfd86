"""Notebook 08, section 6's exercise (exercises.debugging.check_classify): the decision table as
code. A learner's own right answer passes; ropelib's `debug.classify`, called from the answer,
and the worked solution are refused; answers that get a rule or a boundary wrong, or read the
verdict a diagnosis would carry, fail."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from ropelib.course import debug  # noqa: E402
from ropelib.course.exercises import debugging as ex  # noqa: E402
from loading import learner_copy  # noqa: E402


def test_a_learners_own_answer_passes(capsys):
    assert ex.check_classify(learner_copy(ex.solution_classify)) is True
    assert "✅" in capsys.readouterr().out


def test_the_same_rules_written_differently_pass(capsys):
    def mine(diag):
        nw = (diag["te_max_normwise_u"], diag["triton_max_normwise_u"])
        ulps = (diag["te_max_ulp"], diag["triton_max_ulp"])
        return ("equal" if not diag["n_differ"] else "layout" if any(v > 8 for v in nw)
                else "tolerance" if all(v <= 1 for v in ulps) else "precision")
    assert ex.check_classify(mine) is True, capsys.readouterr().out


def test_the_library_and_the_worked_solution_are_refused(capsys):
    assert ex.check_classify(lambda diag: debug.classify(diag)) is False
    out = capsys.readouterr().out
    assert "called ropelib's classify" in out and "write it yourself" in out, out
    assert ex.check_classify(lambda diag: ex.solution_classify(diag)) is False
    assert "solution_classify" in capsys.readouterr().out


def _without(rule):
    def answer(diag):
        if rule != "equal" and diag["n_differ"] == 0:
            return "equal"
        nw = max(diag["te_max_normwise_u"], diag["triton_max_normwise_u"])
        if (nw >= 8) if rule == "boundary" else (rule != "layout" and nw > 8):
            return "layout"
        side = diag["triton_max_ulp"] if rule == "one side" else max(diag["te_max_ulp"],
                                                                      diag["triton_max_ulp"])
        return "tolerance" if side <= 1 else "precision"
    return answer


def test_wrong_answers_fail(capsys):
    for rule in ("equal", "layout", "boundary", "one side"):
        assert ex.check_classify(_without(rule)) is False, rule
        assert "❌" in capsys.readouterr().out
    assert ex.check_classify(lambda diag: diag["verdict"]) is False      # no verdict to read
    assert ex.check_classify(lambda diag: None) is False


def test_the_cases_cover_every_row_and_hide_the_verdict():
    cases = ex._classify_cases()
    assert {expected for _, _, expected in cases} == set(debug.DECISIONS)
    assert all("verdict" not in args[0] for _, args, _ in cases)
    assert any("drawn" in label for label, _, _ in cases)
