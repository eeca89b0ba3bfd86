"""Notebook 07's exercise checks: the fixed-cost + bandwidth line, by the normal equations
(exercise 1), and a call timed three ways, host or device (exercise 3, optional).

The fit's check accepts a learner's own copy of the worked fit and a fit written differently, and
refuses the worked fit itself (ropelib's, not the learner's), the libraries' least-squares fits
(numpy's, PyTorch's, `statistics.linear_regression`, SciPy's `linregress` where installed) and
wrong fits. The timing's check accepts a learner's own copy of the worked timing and one written
differently, and refuses the worked timing, a library's timer (Triton's do_bench, PyTorch's
`torch.utils.benchmark.Timer`, ropelib's benchmark suite), constants, timings of something other
than the call, times not divided by n, calls run too few times, a replay where there is no GPU,
and a wrong bound; on a GPU also a missing replay, a replay that runs the host's part, and a copy
called host-bound."""
import importlib.util
import statistics
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


def _fit_by_tensor_sums(nbytes, ms):
    """The normal equations from tensor sums, made Python numbers by float() and int() (calls
    of types, while PyTorch dispatches _local_scalar_dense)."""
    n = torch.tensor(nbytes, dtype=torch.float64)
    t = torch.tensor(ms, dtype=torch.float64)
    k = int(torch.tensor(len(nbytes)))
    sn, snn, st, snt = (float(v) for v in (n.sum(), (n * n).sum(), t.sum(), (n * t).sum()))
    det = k * snn - sn * sn
    a, b = (snn * st - sn * snt) / det, (k * snt - sn * st) / det
    return a * 1e3, 1 / b * 1e3 / 1e9


def test_own_fits_pass_and_the_worked_fit_recovers_a_known_line(capsys):
    for fn in (_own_code_tests.learner_copy(measuring.solution_fit_time_model), _fit_centred,
               _fit_solved, _fit_by_tensor_sums):
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


def _statistics_regression(nbytes, ms):
    slope, intercept = statistics.linear_regression(nbytes, ms)
    return intercept * 1e3, 1e-6 / slope


def _scipy_linregress(nbytes, ms):
    from scipy import stats
    got = stats.linregress(nbytes, ms)
    return got.intercept * 1e3, 1e-6 / got.slope


def _library_fits():
    fits = {_polyfit: "called polyfit", _numpy_lstsq: "called lstsq",
            _numpy_polynomial: "called lstsq", _numpy_pinv: "called pinv",
            _torch_lstsq: "PyTorch's operator aten::linalg_lstsq",
            _statistics_regression: "called linear_regression"}
    if importlib.util.find_spec("scipy") is not None:
        fits[_scipy_linregress] = "called linregress"
    return fits


def test_a_librarys_least_squares_fit_is_refused(monkeypatch, capsys):
    fits = _library_fits()
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


def _fit_twelve_points(nbytes, ms):
    """Right for the made-up sweeps' twelve points only: n taken as 12, not len(nbytes)."""
    n, t = np.asarray(nbytes, float), np.asarray(ms, float)
    det = 12 * (n * n).sum() - n.sum() ** 2
    a = ((n * n).sum() * t.sum() - n.sum() * (n * t).sum()) / det
    b = (12 * (n * t).sum() - n.sum() * t.sum()) / det
    return a * 1e3, 1 / b * 1e3 / 1e9


def test_the_fit_is_held_to_the_points_it_is_given(capsys):
    # four points, as the notebook hands over (the floor suite's forward sizes, made up here)
    nbytes = [2 * mib * 2**20 for mib in (64, 128, 256, 1024)]
    data = {"four points": (nbytes, [0.006 + b / 3e12 * 1e3 + e
                                     for b, e in zip(nbytes, (1e-4, -2e-4, 1e-4, 0.0))])}
    own = _own_code_tests.learner_copy(measuring.solution_fit_time_model)
    assert measuring.check_fit_time_model(own, data=data)
    assert measuring.check_fit_time_model(_fit_centred, data=data)
    assert measuring.check_fit_time_model(_fit_twelve_points)          # the made-up sweeps alone
    capsys.readouterr()
    assert not measuring.check_fit_time_model(_fit_twelve_points, data=data)
    assert "fit_time_model (four points)" in capsys.readouterr().out
    # the learner's function is handed the points themselves
    seen = []
    def recording(nbytes_, ms_):
        seen.append(list(nbytes_))
        return _fit_centred(nbytes_, ms_)
    assert measuring.check_fit_time_model(recording, data=data) and seen[-1] == nbytes
    # a library's fit stays refused on the given points too
    assert not measuring.check_fit_time_model(_polyfit, data=data)


# --- exercise 3 (optional): host or device? ----------------------------------------------------

import ast  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import triton.testing  # noqa: E402

from ropelib.bench import compare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.cuda.is_available()


def _timed_written_here(call, n):
    """Right, written differently: time.monotonic_ns, a loop per timing, the graph by events."""
    def per_call_us(loop, wait):
        begin = time.monotonic_ns()
        loop()
        end = time.monotonic_ns()
        wait()
        return (end - begin) / 1e3 / n
    wait = torch.cuda.synchronize if GPU else (lambda: None)
    many = lambda: [call() for _ in range(n)]                          # noqa: E731
    enqueue = per_call_us(many, wait)
    wall = per_call_us(lambda: (many(), wait()), lambda: None)
    replay = None
    if GPU:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            many()
        replay = per_call_us(lambda: (g.replay(), wait()), lambda: None)
    return {"enqueue_us": enqueue, "wall_us": wall, "replay_us": replay,
            "bound": "device" if replay is not None and replay > enqueue else "host"}


def test_own_timings_pass(capsys):
    for fn in (_own_code_tests.learner_copy(measuring.solution_host_or_device),
               _timed_written_here):
        assert measuring.check_host_or_device(fn), fn
    out = capsys.readouterr().out
    assert "✅ host_or_device" in out and "❌" not in out
    assert "the host busy 1000 us a call" in out and "n = 12" in out


def test_the_worked_timing_and_a_librarys_timer_are_refused(capsys):
    assert not measuring.check_host_or_device(measuring.solution_host_or_device)
    assert "the answer called ropelib's solution_host_or_device" in capsys.readouterr().out

    def by_do_bench(call, n):
        ms = triton.testing.do_bench(call)
        return {"enqueue_us": ms * 1e3, "wall_us": ms * 1e3, "replay_us": None, "bound": "host"}

    def by_ropelib(call, n):
        ms = compare.wall_clock(lambda: [call() for _ in range(n)])[0] / n
        return {"enqueue_us": ms * 1e3, "wall_us": ms * 1e3, "replay_us": None, "bound": "host"}

    for fn, words in ((by_do_bench, "called do_bench"), (by_ropelib, "called ropelib's"),
                      (_by_torch_timer, "called __init__")):
        assert not measuring.check_host_or_device(fn)
        out = capsys.readouterr().out
        assert "❌" in out and words in out, out


def _by_torch_timer(call, n):
    """PyTorch's benchmark Timer, run twice (the enqueue and the wall time): a library's timer."""
    import torch.utils.benchmark as benchmark
    us = [benchmark.Timer(stmt="call()", globals={"call": call}).timeit(n).mean * 1e6
          for _ in range(2)]
    return {"enqueue_us": us[0], "wall_us": us[1], "replay_us": None,
            "bound": "host" if not GPU else "device"}


@pytest.mark.skipif(GPU, reason="the answer has no replay: on a GPU it fails for that too")
def test_torch_benchmark_timer_is_refused_for_being_a_library_timer(monkeypatch, capsys):
    # refused while PyTorch's Timer is barred; with nothing barred the same answer passes on the
    # CPU, so the refusal is the barring's
    assert not measuring.check_host_or_device(_by_torch_timer)
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer" in out, out
    monkeypatch.setattr(measuring, "LIBRARY_TIMERS", ())
    assert measuring.check_host_or_device(_by_torch_timer)


def _altered(**change):
    """The worked timing, typed by a learner, with one thing changed."""
    right = _own_code_tests.learner_copy(measuring.solution_host_or_device)

    def answer(call, n):
        got = right(call, n)
        for key, how in change.items():
            got[key] = how(got[key]) if callable(how) else how
        return got
    return answer


def _calls_too_few(call, n):
    begin = time.perf_counter()
    for _ in range(n):
        call()
    us = (time.perf_counter() - begin) / n * 1e6
    return {"enqueue_us": us, "wall_us": us, "replay_us": None, "bound": "host"}


def _not_divided(call, n):
    got = _own_code_tests.learner_copy(measuring.solution_host_or_device)(call, n)
    return dict(got, enqueue_us=got["enqueue_us"] * n, wall_us=got["wall_us"] * n)


def _constants_after_the_calls(us):
    def answer(call, n):
        for _ in range(2 * n):
            call()
        return {"enqueue_us": us, "wall_us": us, "replay_us": None, "bound": "host"}
    return answer


def _times_a_sleep(call, n):
    """Times something else than the call (and calls it only to be counted)."""
    for _ in range(2 * n):
        call()
    begin = time.perf_counter()
    time.sleep(0.001)
    us = (time.perf_counter() - begin) * 1e6
    return {"enqueue_us": us, "wall_us": us, "replay_us": None, "bound": "host"}


@pytest.mark.skipif(GPU, reason="the CPU's answers (no replay, every call host-bound)")
def test_wrong_timings_fail_on_the_cpu(capsys):
    wrong = {
        "not answered": lambda call, n: None,
        "constants": lambda call, n: {"enqueue_us": 500.0, "wall_us": 500.0, "replay_us": None,
                                      "bound": "host"},
        "large constants": lambda call, n: {"enqueue_us": 1e3, "wall_us": 1e3, "replay_us": None,
                                            "bound": "host"},
        "constants, the call run 2n times": _constants_after_the_calls(100.0),
        "larger constants, the call run 2n times": _constants_after_the_calls(1000.0),
        "a tuple": lambda call, n: (1.0, 1.0, None, "host"),
        "says device": _altered(bound="device"),
        "a replay without a GPU": _altered(replay_us=1.0),
        "the call run n times, not 2n": _calls_too_few,
        "not divided by n": _not_divided,
        "a sleep timed instead of the call": _times_a_sleep,
        "wall time made up": _altered(wall_us=lambda us: us * 5),
        "wall time doubled": _altered(wall_us=lambda us: us * 2),
        "enqueue time shrunk": _altered(enqueue_us=lambda us: us * 0.7),
    }
    for label, fn in wrong.items():
        assert not measuring.check_host_or_device(fn), label
        assert "❌ host_or_device" in capsys.readouterr().out, label


@pytest.mark.skipif(not GPU, reason="needs a GPU: a CUDA graph and a device-bound copy")
def test_wrong_timings_fail_on_a_gpu(capsys):
    wrong = {"says host": _altered(bound="host"), "no replay": _altered(replay_us=None),
             "replay as the host's time": _altered(replay_us=lambda us: 1e4)}
    for label, fn in wrong.items():
        assert not measuring.check_host_or_device(fn), label
    assert "❌ host_or_device" in capsys.readouterr().out


def test_a_call_counts_itself_and_keeps_the_host_busy():
    call = measuring.CountedCall(300.0)
    begin = time.perf_counter()
    for _ in range(5):
        call()
    assert call.calls == 5 and time.perf_counter() - begin >= 5 * 300e-6


def test_the_notebook_hands_the_check_its_own_function():
    tree = ast.parse((ROOT / "notebooks" / "07-te-vs-triton-live.py").read_text(encoding="utf-8"))
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)
             and getattr(c.func, "attr", None) == "check_host_or_device"]
    assert len(calls) == 1 and [getattr(a, "id", None) for a in calls[0].args] == ["host_or_device"]
    defined = [f for f in tree.body
               if isinstance(f, ast.FunctionDef) and f.name == "host_or_device"]
    assert len(defined) == 1 and [a.arg for a in defined[0].args.args] == ["call", "n"]


def _by_timeit(call, n):
    """Python's timeit, run twice (the enqueue and the wall time): a library's timer."""
    import timeit
    us = [timeit.timeit(call, number=n) / n * 1e6 for _ in range(2)]
    return {"enqueue_us": us[0], "wall_us": us[1], "replay_us": None,
            "bound": "host" if not GPU else "device"}


@pytest.mark.skipif(GPU, reason="the answer has no replay: on a GPU it fails for that too")
def test_timeit_is_refused_for_being_a_library_timer(monkeypatch, capsys):
    # refused while timeit is barred; with nothing barred the same answer passes on the CPU, so
    # the refusal is the barring's
    assert not measuring.check_host_or_device(_by_timeit)
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer" in out, out
    monkeypatch.setattr(measuring, "LIBRARY_TIMERS", ())
    assert measuring.check_host_or_device(_by_timeit)
