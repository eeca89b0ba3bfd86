"""Notebook 07's exercise check: the fixed-cost + bandwidth line, by the normal equations.

The check accepts a learner's own copy of the worked fit and a fit written differently, and
refuses the worked fit itself (ropelib's, not the learner's), the libraries' least-squares fits
(numpy's and PyTorch's) and wrong fits."""
from pathlib import Path

import numpy as np
import torch

from ropelib.course.exercises import measuring
from loading import load_file  # noqa: E402

_own_code_tests = load_file("own_code_tests", Path(__file__).resolve().parent / "test_own_code.py")


def _line(nbytes, ms):
    """(intercept ms, slope ms per byte) of the least-squares line, centred: no library fit."""
    n, t = np.asarray(nbytes, float), np.asarray(ms, float)
    b = ((n - n.mean()) * (t - t.mean())).sum() / ((n - n.mean()) ** 2).sum()
    return t.mean() - b * n.mean(), b


def _fit_centred(nbytes, ms):
    a, b = _line(nbytes, ms)
    return a * 1e3, 1 / b * 1e3 / 1e9


def _fit_solved(nbytes, ms):
    n, t = np.asarray(nbytes, float), np.asarray(ms, float)
    a, b = np.linalg.solve([[len(n), n.sum()], [n.sum(), (n * n).sum()]],
                           [t.sum(), (n * t).sum()])
    return a * 1e3, 1 / b * 1e3 / 1e9


def test_own_fits_pass_and_the_worked_fit_recovers_a_known_line(capsys):
    for fn in (_own_code_tests.learner_copy(measuring.solution_fit_time_model), _fit_centred,
               _fit_solved):
        assert measuring.check_fit_time_model(fn)
    nbytes = [1e7, 2e7, 4e7]
    ms = [0.005 + b / 2e12 * 1e3 for b in nbytes]            # t0 = 5 us, 2000 GB/s
    t0, gbps = measuring.solution_fit_time_model(nbytes, ms)
    assert abs(t0 - 5.0) < 1e-6 and abs(gbps - 2000.0) < 1e-6
    # the worked fit is numpy's least-squares line
    n, t = measuring._sweep(150.0, 2500.0, 0.02, 2)
    slope, intercept = np.polyfit(n, t, 1)
    assert np.allclose(measuring.solution_fit_time_model(n, t), (intercept * 1e3, 1e-6 / slope))
    out = capsys.readouterr().out
    assert "✅" in out and "❌" not in out


def test_the_worked_fit_is_not_the_learners(capsys):
    assert not measuring.check_fit_time_model(measuring.solution_fit_time_model)
    assert not measuring.check_fit_time_model(
        lambda nbytes, ms: measuring.solution_fit_time_model(nbytes, ms))
    out = capsys.readouterr().out
    assert "this exercise wants your fit by the normal equations, but the answer called " \
        "ropelib's solution_fit_time_model" in out


def _polyfit(nbytes, ms):
    slope, intercept = np.polyfit(nbytes, ms, 1)
    return intercept * 1e3, 1e-6 / slope


def _numpy_lstsq(nbytes, ms):
    a = np.stack([np.ones(len(nbytes)), np.asarray(nbytes, float)], 1)
    (c, s), *_ = np.linalg.lstsq(a, np.asarray(ms, float))
    return c * 1e3, 1e-6 / s


def _numpy_polynomial(nbytes, ms):
    c, s = np.polynomial.polynomial.polyfit(nbytes, ms, 1)
    return c * 1e3, 1e-6 / s


def _numpy_pinv(nbytes, ms):
    a = np.stack([np.ones(len(nbytes)), np.asarray(nbytes, float)], 1)
    c, s = np.linalg.pinv(a) @ np.asarray(ms, float)
    return c * 1e3, 1e-6 / s


def _torch_lstsq(nbytes, ms):
    a = torch.stack([torch.ones(len(nbytes), dtype=torch.float64),
                     torch.tensor(nbytes, dtype=torch.float64)], 1)
    c, s = torch.linalg.lstsq(a, torch.tensor(ms, dtype=torch.float64)[:, None]).solution[:, 0]
    return c.item() * 1e3, 1e-6 / s.item()


def test_a_librarys_least_squares_fit_is_refused(monkeypatch, capsys):
    fits = {_polyfit: "called polyfit", _numpy_lstsq: "called lstsq",
            _numpy_polynomial: "called lstsq", _numpy_pinv: "called pinv",
            _torch_lstsq: "PyTorch's operator aten::linalg_lstsq"}
    for fn, words in fits.items():
        assert not measuring.check_fit_time_model(fn), fn.__name__
        out = capsys.readouterr().out
        assert "❌" in out and "but the answer" in out and words in out, out
    # the refusal is the barring alone: with nothing barred, the same fits pass
    monkeypatch.setattr(measuring, "LIBRARY_FITS", ())
    monkeypatch.setattr(measuring, "LIBRARY_FIT_OPS", ())
    for fn in fits:
        assert measuring.check_fit_time_model(fn), fn.__name__


def test_wrong_fits_fail(capsys):
    cheats = {
        "not answered": lambda nbytes, ms: None,
        "units swapped (ms, bytes per ms)": lambda nbytes, ms: (
            _line(nbytes, ms)[0], 1 / _line(nbytes, ms)[1]),
        "t0 in ms": lambda nbytes, ms: (_fit_centred(nbytes, ms)[0] / 1e3,
                                        _fit_centred(nbytes, ms)[1]),
        "bandwidth in bytes per second": lambda nbytes, ms: (
            _fit_centred(nbytes, ms)[0], _fit_centred(nbytes, ms)[1] * 1e9),
        "line through the first and last point": lambda nbytes, ms: (
            (ms[0] - nbytes[0] * (ms[-1] - ms[0]) / (nbytes[-1] - nbytes[0])) * 1e3,
            (nbytes[-1] - nbytes[0]) / (ms[-1] - ms[0]) * 1e3 / 1e9),
        "bandwidth from the largest point alone": lambda nbytes, ms: (
            0.0, nbytes[-1] / ms[-1] * 1e3 / 1e9),
        "a line through the origin (no fixed cost)": lambda nbytes, ms: (
            0.0, sum(n * n for n in nbytes) / sum(n * t for n, t in zip(nbytes, ms)) * 1e3 / 1e9),
        "one number": lambda nbytes, ms: 3.0,
        "raises": lambda nbytes, ms: 1 / 0,
    }
    for name, fn in cheats.items():
        assert not measuring.check_fit_time_model(fn), name
    assert "❌" in capsys.readouterr().out
