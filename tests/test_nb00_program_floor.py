"""Notebook 00's exercise 2 (`nb00_program_floor.check_program_floor`): a kernel's program floor.

A learner's own copy of the worked solution passes, and so does the same floor written another
way; an answer that reads the committed results through `ropelib.course.measured`, or calls
notebooks 03 and 04's worked predictions, is refused; wrong models fail; a table of answers for
the committed rows fails at the drawn ones.
"""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from ropelib.course import measured  # noqa: E402
from ropelib.course.exercises import kernels, naive_kernel  # noqa: E402
from ropelib.course.exercises import nb00_program_floor as ex  # noqa: E402
from loading import learner_copy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_the_learners_own_floor_passes(capsys):
    assert ex.check_program_floor(learner_copy(ex.solution_program_floor_us)) is True
    assert ex.check_program_floor(lambda p, sms, e, us: p * us / e) is True   # the SMs cancel
    out = capsys.readouterr().out
    assert "✅" in out
    if ex.committed_rows():                     # the exercise's question, answered
        assert "a floor within 10 % of the time: 03 naive\n" in out, out


def test_the_committed_rows_are_section_4s():
    rows = ex.committed_rows()
    if not rows:
        return
    assert [name for name, _, _ in rows] == list(ex.ROWS.values())
    mech = measured.mechanism()
    for (name, (programs, sms, empty_programs, empty_us), us), variant in zip(rows, ex.ROWS):
        assert programs == mech[variant]["programs"] and us == mech[variant]["us"]
        assert sms == 132 and empty_programs == 4096 * 8 * 32 and 633 < empty_us < 635


def test_a_failing_answer_gets_no_table(capsys):
    assert ex.check_program_floor(lambda *a: 0.0) is False
    assert ex.check_program_floor(lambda *a: None) is False
    assert ex.check_program_floor(...) is False
    assert "a floor within" not in capsys.readouterr().out


def test_reading_the_committed_results_is_refused(capsys):
    own = learner_copy(ex.solution_program_floor_us)

    def answer(*args):
        measured.path("program_cost")            # the course's reader of the results
        return own(*args)
    assert ex.check_program_floor(answer) is False
    out = capsys.readouterr().out
    assert "but the answer called" in out and "measured" in out, out


def test_the_worked_predictions_of_notebooks_03_and_04_are_refused(capsys):
    def by_grid(p, sms, e, us):
        return kernels.solution_grid_us(p, 1, 1, sms, us * 1e3 * sms / e, 0.0)

    def by_rows(p, sms, e, us):
        return naive_kernel.solution_predicted_us(p, 1, sms, us * 1e3 * sms / e, 0.0)
    for answer, words in ((by_grid, "solution_grid_us"), (by_rows, "solution_predicted_us"),
                          (ex.solution_program_floor_us, "solution_program_floor_us")):
        assert ex.check_program_floor(answer) is False
        out = capsys.readouterr().out
        assert "but the answer called" in out and words in out, out


def test_wrong_models_fail(capsys):
    own = learner_copy(ex.solution_program_floor_us)
    wrong = {
        "no SMs": lambda p, sms, e, us: p * us * 1e3 / e,                    # ns, not µs
        "the empty run's time per program, not per SM": lambda p, sms, e, us: p / sms * us / e,
        "rounded up to whole waves": lambda p, sms, e, us: -(-p // sms) * us * sms / e,
        "the empty kernel's time": lambda p, sms, e, us: us,
        "ms": lambda *a: own(*a) / 1e3,
    }
    for label, answer in wrong.items():
        assert ex.check_program_floor(answer) is False, label
    capsys.readouterr()


def test_a_table_of_the_committed_rows_fails_at_the_drawn_ones(capsys):
    rows = ex.committed_rows()
    if not rows:
        return
    own = learner_copy(ex.solution_program_floor_us)
    table = {args: own(*args) for _, args, _ in rows}
    assert ex.check_program_floor(lambda *a: table.get(a, 0.0)) is False
    out = capsys.readouterr().out
    assert "drawn with seed" in out, out


def test_the_notebook_hands_the_check_a_function():
    text = (ROOT / "notebooks" / "00-setup-and-tour.py").read_text(encoding="utf-8")
    assert "nb00_program_floor.check_program_floor(my_program_floor_us);" in text
    assert "def my_program_floor_us(programs, sms, empty_programs, empty_us):\n    ...   #" in text
