"""Notebook 07's exercise checks: the fixed-cost + bandwidth fit and the prediction.

The fit check accepts a learner's own copy of the worked fit and refuses the worked fit itself
(ropelib's, not the learner's)."""
from pathlib import Path

import numpy as np

from ropelib.course.exercises import measuring
from loading import load_file  # noqa: E402

_own_code_tests = load_file("own_code_tests", Path(__file__).resolve().parent / "test_own_code.py")


def test_an_own_fit_passes_and_the_worked_fit_recovers_a_known_line(capsys):
    assert measuring.check_fit_time_model(_own_code_tests.learner_copy(
        measuring.solution_fit_time_model))
    nbytes = [1e7, 2e7, 4e7]
    ms = [0.005 + b / 2e12 * 1e3 for b in nbytes]            # t0 = 5 us, 2000 GB/s
    t0, gbps = measuring.solution_fit_time_model(nbytes, ms)
    assert abs(t0 - 5.0) < 1e-6 and abs(gbps - 2000.0) < 1e-6
    assert "✅" in capsys.readouterr().out


def test_the_worked_fit_is_not_the_learners(capsys):
    assert not measuring.check_fit_time_model(measuring.solution_fit_time_model)
    assert not measuring.check_fit_time_model(
        lambda nbytes, ms: measuring.solution_fit_time_model(nbytes, ms))
    out = capsys.readouterr().out
    assert "this exercise wants your fit, but the answer called ropelib's solution_fit_time_model" \
        in out


def test_wrong_fits_fail(capsys):
    cheats = {
        "not answered": lambda nbytes, ms: None,
        "units swapped (ms, bytes per ms)": lambda nbytes, ms: tuple(
            np.polyfit(nbytes, ms, 1)[::-1]),
        "t0 in ms": lambda nbytes, ms: (measuring.solution_fit_time_model(nbytes, ms)[0] / 1e3,
                                        measuring.solution_fit_time_model(nbytes, ms)[1]),
        "line through the first and last point": lambda nbytes, ms: (
            (ms[0] - nbytes[0] * (ms[-1] - ms[0]) / (nbytes[-1] - nbytes[0])) * 1e3,
            (nbytes[-1] - nbytes[0]) / (ms[-1] - ms[0]) * 1e3 / 1e9),
        "bandwidth from the largest point alone": lambda nbytes, ms: (
            0.0, nbytes[-1] / ms[-1] * 1e3 / 1e9),
        "one number": lambda nbytes, ms: 3.0,
        "raises": lambda nbytes, ms: 1 / 0,
    }
    for name, fn in cheats.items():
        assert not measuring.check_fit_time_model(fn), name
    assert "❌" in capsys.readouterr().out


def test_prediction_check(capsys):
    own = _own_code_tests.learner_copy(measuring.solution_predict_ms)
    # a line with t0 = 10 us and 1000 GB/s moves 1e8 bytes in 0.01 + 0.1 ms
    assert abs(own(10.0, 1000.0, 1e8) - 0.11) < 1e-12
    assert measuring.check_prediction(own, 10.0, 1000.0, 1e8, 0.1)          # within 20 %
    assert not measuring.check_prediction(own, 10.0, 1000.0, 1e8, 0.05)     # measured far off
    for wrong in (lambda t0, g, n: None, lambda t0, g, n: -1.0, lambda t0, g, n: 0.11,
                  lambda t0, g, n: t0 + n / (g * 1e9) * 1e3,                # t0 left in us
                  lambda t0, g, n: t0 * 1e-3 + n / (g * 1e9),              # seconds, not ms
                  lambda t0, g, n: 1 / 0):
        assert not measuring.check_prediction(wrong, 10.0, 1000.0, 1e8, 0.11)
    out = capsys.readouterr().out
    assert "❌" in out and "✅ prediction within 20% of the measurement" in out
