"""Notebook 00's exercise 1 (`basics.check_call_rates`): a call's TB/s and TFLOP/s.

A learner's own copy of the worked solution passes; an answer that takes the bytes from
ropelib's bytes model, or reads the committed results through `ropelib.course.measured`, is
refused; wrong counts (no table, the wrong unit) fail; a table of answers for the committed
cases fails at the drawn ones.
"""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from ropelib.bench.compare import Config, bytes_moved  # noqa: E402
from ropelib.course import measured  # noqa: E402
from ropelib.course.exercises import basics  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
learner_copy = load_file("own_code_tests_nb00", ROOT / "tests" / "test_own_code.py").learner_copy


def test_the_learners_own_rates_pass(capsys):
    assert basics.check_call_rates(learner_copy(basics.solution_call_rates)) is True
    out = capsys.readouterr().out
    assert "✅" in out
    if measured.path("floor").is_file():          # the exercise's last question, answered
        assert "the committed decoding step moves" in out and "not memory-bound" in out, out


def test_a_failing_answer_gets_no_answer_to_the_last_question(capsys):
    assert basics.check_call_rates(lambda *a: (0.0, 0.0)) is False
    assert "not memory-bound" not in capsys.readouterr().out


def test_the_bytes_model_of_ropelib_bench_is_refused(capsys):
    def answer(S, B, H, D, e, ms):
        n = bytes_moved(Config(S, B, H, D, dtype={2: "bf16", 4: "fp32"}[e]))
        return n / ms / 1e9, 3 * S * B * H * D / ms / 1e9
    assert basics.check_call_rates(answer) is False
    assert "but the answer called" in capsys.readouterr().out


def test_reading_the_committed_results_is_refused(capsys):
    own = learner_copy(basics.solution_call_rates)

    def answer(*args):
        measured.path("floor")                     # the course's reader of the results
        return own(*args)
    assert basics.check_call_rates(answer) is False
    out = capsys.readouterr().out
    assert "but the answer called" in out and "measured" in out, out


def test_wrong_counts_fail(capsys):
    no_table = lambda S, B, H, D, e, ms: (2 * S * B * H * D * e / ms / 1e9,   # noqa: E731
                                          3 * S * B * H * D / ms / 1e9)
    own = learner_copy(basics.solution_call_rates)
    gb_s = lambda *a: tuple(1e3 * v for v in own(*a))                       # noqa: E731
    assert basics.check_call_rates(no_table) is False
    assert basics.check_call_rates(gb_s) is False
    assert basics.check_call_rates(lambda *a: None) is False
    capsys.readouterr()


def test_a_table_of_the_committed_cases_fails_at_the_drawn_ones(capsys):
    if not measured.path("floor").is_file():
        return
    own = learner_copy(basics.solution_call_rates)
    table = {}
    floor = measured.floor()
    for row, shape in (("forward 1 GiB bf16 sbhd", (16384, 8, 32, 128, 2)),
                       ("decode host forward sbhd", (1, 64, 32, 128, 2))):
        args = (*shape, floor[row]["ropelib"]["ms"])
        table[args] = own(*args)
    assert basics.check_call_rates(lambda *a: table.get(a, (0.0, 0.0))) is False
    assert "drawn with seed" in capsys.readouterr().out
