"""Notebook 09's exercise checks: the parity of two training runs and RoPE's share of a step.

For each check: the worked solution, typed in by a learner, passes; the worked solution itself
(ropelib's, not the learner's) is refused; the slips a learner is likely to make fail on at least
one of the made-up cases; and the cases' answers are the ones the notebook's own rule gives.
(`test_exercises_answers_are_code.py` also tries answers that call ropelib.)
"""
import ast
import os
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

from ropelib.course.exercises import in_a_model  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy


def _d(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


# --- exercise 1: same_training ------------------------------------------------------------------

def test_the_worked_parity_test_typed_in_passes(capsys):
    assert in_a_model.check_same_training(learner_copy(in_a_model.solution_same_training))
    out = capsys.readouterr().out
    assert "✅ same_training: correct" in out and "❌" not in out, out


def test_the_parity_cases_follow_the_notebooks_rule():
    cases = in_a_model._parity_cases()
    assert len(cases) >= 8
    for label, (curve, reference, other), expected in cases:
        assert len(curve) == len(reference) == len(other), label
        assert expected == (_d(curve, reference) <= 1.5 * _d(other, reference)), label
    answers = {label: expected for label, _, expected in cases}
    assert answers["the same curve"] is True
    assert answers["0.08 above the reference all along"] is False
    assert answers["equal at first, then drifting away"] is False
    assert answers["exactly 1.5 times the seed gap, 4 evaluations"] is True
    assert {True, False} == set(answers.values())


def _mean(xs):
    return sum(xs) / len(xs)


WRONG_PARITY = {
    "a signed mean": lambda c, r, o: abs(_mean([x - y for x, y in zip(c, r)]))
    <= 1.5 * abs(_mean([x - y for x, y in zip(o, r)])),
    "only not worse than the reference": lambda c, r, o: _mean([x - y for x, y in zip(c, r)])
    <= 1.5 * _d(o, r),
    "the largest difference": lambda c, r, o: max(abs(x - y) for x, y in zip(c, r))
    <= 1.5 * max(abs(x - y) for x, y in zip(o, r)),
    "root mean square": lambda c, r, o: _mean([(x - y) ** 2 for x, y in zip(c, r)]) ** 0.5
    <= 1.5 * _mean([(x - y) ** 2 for x, y in zip(o, r)]) ** 0.5,
    "the last evaluation alone": lambda c, r, o: abs(c[-1] - r[-1]) <= 1.5 * abs(o[-1] - r[-1]),
    "the first half alone": lambda c, r, o: _d(c[:len(c) // 2], r[:len(r) // 2])
    <= 1.5 * _d(o[:len(o) // 2], r[:len(r) // 2]),
    "a strict inequality": lambda c, r, o: _d(c, r) < 1.5 * _d(o, r),
    "within 1 times": lambda c, r, o: _d(c, r) <= _d(o, r),
    "within 2 times": lambda c, r, o: _d(c, r) <= 2 * _d(o, r),
    "measured from the other seed": lambda c, r, o: _d(c, o) <= 1.5 * _d(o, r),
    "the final losses": lambda c, r, o: abs(c[-1] - r[-1]) <= 1.5 * abs(c[-1] - o[-1]),
    "the ratio, not a verdict": lambda c, r, o: _d(c, r) / _d(o, r),
    "not answered": lambda c, r, o: None,
    "raises": lambda c, r, o: 1 / 0,
}


@pytest.mark.parametrize("label", list(WRONG_PARITY))
def test_a_wrong_parity_test_fails(label, capsys):
    assert in_a_model.check_same_training(WRONG_PARITY[label]) is False
    assert "❌" in capsys.readouterr().out


def test_a_parity_test_that_changes_its_lists_does_not_change_the_next_case(capsys):
    def sorts_in_place(c, r, o):
        c.sort(), r.sort(), o.sort()
        return learner_copy(in_a_model.solution_same_training)(c, r, o)
    # sorting a falling curve reverses it, and all three alike: distances unchanged
    assert in_a_model.check_same_training(sorts_in_place)
    assert in_a_model.check_same_training(learner_copy(in_a_model.solution_same_training))
    capsys.readouterr()


def test_a_numpy_verdict_is_an_answer(capsys):
    def with_numpy(c, r, o):
        c, r, o = (np.asarray(v, float) for v in (c, r, o))
        return np.abs(c - r).mean() <= 1.5 * np.abs(o - r).mean()       # a numpy bool
    assert in_a_model.check_same_training(with_numpy)
    capsys.readouterr()


# --- exercise 2: rope_share ---------------------------------------------------------------------

def test_the_worked_share_typed_in_passes(capsys):
    assert in_a_model.check_rope_share(learner_copy(in_a_model.solution_rope_share))
    out = capsys.readouterr().out
    assert "✅ rope_share: correct" in out and "❌" not in out, out


def test_the_share_cases_have_the_answers_they_are_built_for():
    cases = {label: (args, expected) for label, args, expected in in_a_model._share_cases()}
    (events, names), (rope, step, share) = cases["one RoPE kernel, launched 4 times"]
    assert rope == 3.25 + 3.5 + 3.75 + 4.0 and step == sum(us for _, us in events)
    assert share == rope / step
    (events, names), (rope, _, _) = cases["RoPE split over 3 kernels, named inside longer names"]
    assert rope == 5.5 + 2.75 + 6.25 and not any(name in names for name, _ in events)
    assert cases["a kernel that two of the substrings name"][1] == \
        cases["one RoPE kernel, launched 4 times"][1]
    (events, _), (rope, step, share) = cases["no kernel named after RoPE"]
    assert rope == 0.0 and share == 0.0 and step == sum(us for _, us in events)


def _share_of(rope, step):
    return rope, step, rope / step


def _step(events):
    return sum(us for _, us in events)


def _rope(events, names, match=lambda part, name: part in name):
    return sum(us for name, us in events if any(match(p, name) for p in names))


WRONG_SHARE = {
    "exact names": lambda ev, names: _share_of(_rope(ev, names, lambda p, n: p == n), _step(ev)),
    "one launch per name (a dict)": lambda ev, names: _share_of(
        _rope(dict(ev).items(), names), _step(dict(ev).items())),
    "once per substring": lambda ev, names: _share_of(
        sum(us for name, us in ev for p in names if p in name), _step(ev)),
    "a percentage": lambda ev, names: (_rope(ev, names), _step(ev),
                                       100 * _rope(ev, names) / _step(ev)),
    "RoPE over the rest of the step": lambda ev, names: (
        _rope(ev, names), _step(ev), _rope(ev, names) / (_step(ev) - _rope(ev, names))),
    "the step without RoPE": lambda ev, names: _share_of(
        _rope(ev, names), _step(ev) - _rope(ev, names)),
    "milliseconds": lambda ev, names: (_rope(ev, names) / 1e3, _step(ev) / 1e3,
                                       _rope(ev, names) / _step(ev)),
    "the share alone": lambda ev, names: _rope(ev, names) / _step(ev),
    "'rope' only, whatever rope_names says": lambda ev, names: _share_of(_rope(ev, ["rope"]),
                                                                      _step(ev)),
    "not answered": lambda ev, names: None,
    "raises": lambda ev, names: 1 / 0,
}


@pytest.mark.parametrize("label", list(WRONG_SHARE))
def test_a_wrong_share_fails(label, capsys):
    assert in_a_model.check_rope_share(WRONG_SHARE[label]) is False
    assert "❌" in capsys.readouterr().out


def test_a_case_blind_match_and_a_numpy_sum_are_answers(capsys):
    def case_blind(events, rope_names):
        us = np.array([t for _, t in events])
        mine = np.array([any(p.lower() in n.lower() for p in rope_names) for n, _ in events])
        return float(us[mine].sum()), float(us.sum()), float(us[mine].sum() / us.sum())
    assert in_a_model.check_rope_share(case_blind)
    capsys.readouterr()


# --- both: the worked solutions are ropelib's, not the learner's -------------------------------

@pytest.mark.parametrize("check, answer, words", [
    (in_a_model.check_same_training, in_a_model.solution_same_training,
     "your parity test, but the answer called ropelib's solution_same_training"),
    (in_a_model.check_same_training, lambda c, r, o: in_a_model.solution_same_training(c, r, o),
     "your parity test, but the answer called ropelib's solution_same_training"),
    (in_a_model.check_rope_share, in_a_model.solution_rope_share,
     "your share of the step, but the answer called ropelib's solution_rope_share"),
    (in_a_model.check_rope_share, lambda e, n: in_a_model.solution_rope_share(e, n),
     "your share of the step, but the answer called ropelib's solution_rope_share"),
], ids=["parity", "parity, wrapped", "share", "share, wrapped"])
def test_the_worked_solution_is_refused(check, answer, words, capsys):
    assert check(answer) is False
    out = capsys.readouterr().out
    assert words in out and "write it yourself" in out, out


# --- the notebook -------------------------------------------------------------------------------

def test_the_notebook_applies_the_parity_test_to_its_own_curves():
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert "in_a_model.check_same_training(same_training)" in text
    assert "in_a_model.check_rope_share(rope_share)" in text
    # the check's verdict picks the function the notebook goes on with
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert {"same_training", "rope_share", "judge_parity"} <= names
    assert text.index("check_same_training") < text.index("## 4. Speed")
    assert text.index("## 5. How much") < text.index("check_rope_share") \
        < text.index("## 6. What did it learn")
