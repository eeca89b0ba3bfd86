"""Exercise checks for notebook 07 (measuring kernels against a copy).

A call's time is modelled as a fixed cost plus the bytes it moves over a bandwidth,
``ms = t0 + bytes / bandwidth``. Fitting that line to a sweep separates what a provider pays per
call (launches, Python, autograd: host time) from how fast it streams memory. The checks try the
learner's fit on made-up sweeps whose answer is known, then on nothing else: the notebook applies
the learner's function to the committed GPU results. The fit runs with ropelib's own answers and
the worked solution below barred (`own_code`); `np.polyfit` is the learner's to use.

The prediction is a function too, `predict_ms(t0_us, gbps, nbytes)`: the check tries it on
made-up lines whose answer is known, with ropelib and the worked solutions barred, and then
compares what it predicts from the fitted line with the committed measurement.
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple

import numpy as np

from . import check
from .own_code import check_cases, run_own_code

__all__ = ["check_fit_time_model", "check_prediction", "solution_fit_time_model",
           "solution_predict_ms"]


def _sweep(t0_us: float, gbps: float, noise: float, seed: int):
    """A made-up sweep: bytes from 8 MB to 400 MB, ms = t0 + bytes / bandwidth, times (1 + noise)."""
    rng = np.random.default_rng(seed)
    nbytes = np.linspace(8e6, 4e8, 12)
    ms = (t0_us * 1e-3 + nbytes / (gbps * 1e9) * 1e3) * (1 + noise * rng.standard_normal(12))
    return nbytes.tolist(), ms.tolist()


def check_fit_time_model(fn: Callable) -> bool:
    """fn(nbytes, ms) -> (t0_us, gbps): the least-squares line ms = t0 + bytes / bandwidth, with t0
    in microseconds and the bandwidth in GB/s (1e9 bytes per second)."""
    name = "fit_time_model"
    for t0_us, gbps, noise, seed in ((8.0, 3000.0, 0.0, 0), (60.0, 500.0, 0.0, 1),
                                     (150.0, 2500.0, 0.02, 2)):
        nbytes, ms = _sweep(t0_us, gbps, noise, seed)
        ok, answer = run_own_code(f"{name} (t0 {t0_us:g} us, {gbps:g} GB/s)", "your fit", fn,
                                  list(nbytes), list(ms))
        if not ok:
            return False
        want = solution_fit_time_model(nbytes, ms)
        try:
            got = tuple(float(v) for v in answer)
        except (TypeError, ValueError):
            return check(name, answer, want, hint="return a pair (t0_us, gbps)")
        if len(got) != 2:
            return check(name, answer, want, hint="return a pair (t0_us, gbps)")
        if not check(f"{name} (t0 {t0_us:g} us, {gbps:g} GB/s{', noisy' if noise else ''})",
                     got, want, rtol=1e-3, atol=1e-6,
                     hint="np.polyfit(nbytes, ms, 1) gives (slope, intercept): the intercept is t0 "
                          "in ms, 1 / slope is bytes per ms"):
            return False
    return True


def check_prediction(fn: Callable, t0_us: float, gbps: float, nbytes: float,
                     measured_ms: float, *, within: float = 0.2) -> bool:
    """fn(t0_us, gbps, nbytes) -> the time in ms the line ms = t0 + bytes / bandwidth predicts
    (t0 in microseconds, the bandwidth in GB/s, 1e9 bytes per second).

    First tried on made-up lines whose answer is known, with ropelib and the worked solutions
    barred (`own_code`); then its prediction from the fitted (t0_us, gbps) for nbytes is
    compared with the measured time: right when within ``within`` (relative) of it.
    """
    from .kernels import solution_floor_ms   # notebook 04's worked time floor: bytes / bandwidth

    hint = "ms = t0_us * 1e-3 + bytes / (gbps * 1e9) * 1e3"
    bar = (solution_predict_ms, solution_fit_time_model, solution_floor_ms)
    cases = [(f"t0 {t:g} us, {g:g} GB/s, {n:g} bytes", (t, g, n), solution_predict_ms(t, g, n))
             for t, g, n in ((8.0, 3000.0, 1.2e8), (60.0, 500.0, 4e6), (0.0, 2000.0, 2e9),
                             (150.0, 2500.0, 0.0))]
    if not check_cases("predict_ms", "your prediction", fn, cases, rtol=1e-9, atol=1e-12,
                       hint=hint, bar=bar):
        return False
    ok, predicted = run_own_code("prediction", "your prediction", fn, float(t0_us), float(gbps),
                                 float(nbytes), bar=bar)
    if not ok:
        return False
    try:
        predicted = float(predicted)
    except (TypeError, ValueError):
        return check("prediction", predicted, float(measured_ms), hint=hint)
    close = check(f"prediction within {within:.0%} of the measurement", predicted,
                  float(measured_ms), rtol=within, atol=0.0,
                  hint="the line was fitted to this sweep: is the prediction in ms?")
    print(f"   predicted {predicted * 1e3:.1f} us, measured {float(measured_ms) * 1e3:.1f} us")
    return close


def solution_fit_time_model(nbytes: Sequence[float], ms: Sequence[float]) -> Tuple[float, float]:
    slope, intercept = np.polyfit(np.asarray(nbytes, float), np.asarray(ms, float), 1)
    return intercept * 1e3, 1.0 / slope * 1e3 / 1e9   # (t0 in us, GB/s)


def solution_predict_ms(t0_us: float, gbps: float, nbytes: float) -> float:
    fixed_ms = t0_us * 1e-3                      # microseconds -> ms
    streaming_ms = nbytes / (gbps * 1e9) * 1e3   # seconds at gbps * 1e9 bytes per second -> ms
    return fixed_ms + streaming_ms
