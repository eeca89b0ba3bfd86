"""Exercise check for notebook 07 (measuring kernels against a copy): a least-squares line,
by the normal equations.

A call's time is modelled as a fixed cost plus the bytes it moves over a bandwidth,
``ms = t0 + bytes / bandwidth``. Fitting that line to a sweep separates what a provider pays per
call (launches, Python, autograd: host time) from how fast it streams memory. The learner solves
the least-squares problem for the line's intercept and slope through its normal equations. The
check tries the learner's fit on made-up sweeps whose answer is known, with ropelib's own
answers, the worked solution below and the libraries' least-squares fits barred
(`LIBRARY_FITS`: `np.polyfit`, `np.linalg.lstsq` and what calls it, such as `np.polynomial`'s
fits, `np.linalg.pinv`, `torch.linalg.lstsq`). The notebook then applies the learner's function
to the committed GPU results.
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple

import numpy as np
import torch

from . import check
from .own_code import run_own_code

__all__ = ["check_fit_time_model", "solution_fit_time_model", "LIBRARY_FITS", "LIBRARY_FIT_OPS"]

# least-squares fits a library hands over: refused (numpy's are functions behind a dispatcher)
LIBRARY_FITS = tuple(getattr(f, "__wrapped__", f) for f in (np.polyfit, np.linalg.lstsq,
                                                            np.linalg.pinv))
LIBRARY_FIT_OPS = (torch.ops.aten.linalg_lstsq.default, torch.ops.aten.linalg_pinv.atol_rtol_tensor)


def _sweep(t0_us: float, gbps: float, noise: float, seed: int):
    """A made-up sweep: bytes from 8 MB to 400 MB, ms = t0 + bytes / bandwidth, times
    (1 + noise)."""
    rng = np.random.default_rng(seed)
    nbytes = np.linspace(8e6, 4e8, 12)
    ms = (t0_us * 1e-3 + nbytes / (gbps * 1e9) * 1e3) * (1 + noise * rng.standard_normal(12))
    return nbytes.tolist(), ms.tolist()


def check_fit_time_model(fn: Callable) -> bool:
    """fn(nbytes, ms) -> (t0_us, gbps): the least-squares line ms = t0 + bytes / bandwidth, with t0
    in microseconds and the bandwidth in GB/s (1e9 bytes per second), solved by the learner's own
    normal equations (a library's least-squares fit is refused)."""
    name = "fit_time_model"
    hint = ("the normal equations: [[n, sum N], [sum N, sum N^2]] [a, b] = [sum t, sum N t] give "
            "the intercept a (ms) and the slope b (ms per byte): t0 = a in us, 1 / b bytes per ms")
    for t0_us, gbps, noise, seed in ((8.0, 3000.0, 0.0, 0), (60.0, 500.0, 0.0, 1),
                                     (150.0, 2500.0, 0.02, 2), (20.0, 4000.0, 0.05, 3)):
        nbytes, ms = _sweep(t0_us, gbps, noise, seed)
        label = f"{name} (t0 {t0_us:g} us, {gbps:g} GB/s{', noisy' if noise else ''})"
        ok, answer = run_own_code(label, "your fit by the normal equations", fn, list(nbytes),
                                  list(ms), bar=LIBRARY_FITS, bar_ops=LIBRARY_FIT_OPS)
        if not ok:
            return False
        want = solution_fit_time_model(nbytes, ms)
        try:
            got = tuple(float(v) for v in answer)
        except (TypeError, ValueError):
            return check(name, answer, want, hint="return a pair (t0_us, gbps)")
        if len(got) != 2:
            return check(name, answer, want, hint="return a pair (t0_us, gbps)")
        if not check(label, got, want, rtol=1e-3, atol=1e-6, hint=hint):
            return False
    return True


def solution_fit_time_model(nbytes: Sequence[float], ms: Sequence[float]) -> Tuple[float, float]:
    N, t = np.asarray(nbytes, float), np.asarray(ms, float)
    # least squares for t = a + b N: setting the derivatives of sum (a + b N - t)^2 to zero gives
    # n a + (sum N) b = sum t and (sum N) a + (sum N^2) b = sum N t; solved by Cramer's rule
    n, sN, sNN, st, sNt = len(N), N.sum(), (N * N).sum(), t.sum(), (N * t).sum()
    det = n * sNN - sN * sN
    a = (sNN * st - sN * sNt) / det            # intercept: ms at zero bytes
    b = (n * sNt - sN * st) / det              # slope: ms per byte
    return a * 1e3, 1.0 / b * 1e3 / 1e9        # (t0 in us, GB/s)
