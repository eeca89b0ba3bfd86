"""Exercise checks for notebook 07 (measuring kernels against a copy): a least-squares line, by
the normal equations; and a call timed three ways, to say whether the host or the device sets its
pace.

A call's time is modelled as a fixed cost plus the bytes it moves over a bandwidth,
``ms = t0 + bytes / bandwidth``. Fitting that line to a sweep separates what a provider pays per
call (launches, Python, autograd: host time) from how fast it streams memory. The learner solves
the least-squares problem for the line's intercept and slope through its normal equations. The
check tries the learner's fit on made-up sweeps whose answer is known, with ropelib's own
answers, the worked solution below and the libraries' least-squares fits barred
(`LIBRARY_FITS`: `np.polyfit`, `np.linalg.lstsq` and what calls it, such as `np.polynomial`'s
fits, `np.linalg.pinv`, `statistics.linear_regression`, `scipy.stats.linregress` where SciPy is
installed; `LIBRARY_FIT_OPS`: `torch.linalg.lstsq` and `torch.linalg.pinv`), then on the
committed points the notebook will fit (`data`), against the worked fit of the same points. The
notebook then applies the learner's function to the committed GPU results.

The second check hands the learner's timing function calls whose cost it knows (`CountedCall`):
calls that keep the host busy a known time, and on a GPU a large copy. The calls count
themselves and keep when they ran: the times must be at least that busy time, be what a clock
around n calls in a row reads, and a replay must not run the host's part again; a library's timer
(`LIBRARY_TIMERS`: Triton's `do_bench` and `do_bench_cudagraph`, PyTorch's
`torch.utils.benchmark.Timer`, Python's `timeit`; ropelib's benchmark suite is barred with the
rest of ropelib) is refused.
"""
from __future__ import annotations

import statistics
import time
import timeit
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.benchmark as _torch_benchmark
import triton.testing as _testing

from . import check
from .own_code import fresh_generator, run_own_code

__all__ = ["check_fit_time_model", "solution_fit_time_model", "LIBRARY_FITS", "LIBRARY_FIT_OPS",
           "check_host_or_device", "solution_host_or_device", "CountedCall", "LIBRARY_TIMERS"]


def _scipy_linregress() -> tuple:
    """scipy.stats.linregress where SciPy is installed, else nothing to bar."""
    try:
        from scipy import stats
    except ImportError:
        return ()
    return (stats.linregress,)


# least-squares fits a library hands over: refused (numpy's are functions behind a dispatcher)
LIBRARY_FITS = tuple(getattr(f, "__wrapped__", f) for f in (np.polyfit, np.linalg.lstsq,
                                                            np.linalg.pinv,
                                                            statistics.linear_regression,
                                                            *_scipy_linregress()))
LIBRARY_FIT_OPS = (torch.ops.aten.linalg_lstsq.default, torch.ops.aten.linalg_pinv.atol_rtol_tensor)


def _sweep(t0_us: float, gbps: float, noise: float, seed: int):
    """A made-up sweep: bytes from 8 MB to 400 MB, ms = t0 + bytes / bandwidth, times
    (1 + noise)."""
    rng = np.random.default_rng(seed)
    nbytes = np.linspace(8e6, 4e8, 12)
    ms = (t0_us * 1e-3 + nbytes / (gbps * 1e9) * 1e3) * (1 + noise * rng.standard_normal(12))
    return nbytes.tolist(), ms.tolist()


def check_fit_time_model(fn: Callable, data: Optional[dict] = None) -> bool:
    """fn(nbytes, ms) -> (t0_us, gbps): the least-squares line ms = t0 + bytes / bandwidth, with t0
    in microseconds and the bandwidth in GB/s (1e9 bytes per second), solved by the learner's own
    normal equations (a library's least-squares fit is refused). `data`, {label: (nbytes, ms)}:
    the measured points the notebook will fit; after the made-up sweeps, the learner's fit of each
    must match the worked fit of the same points."""
    name = "fit_time_model"
    hint = ("the normal equations: [[n, sum N], [sum N, sum N^2]] [a, b] = [sum t, sum N t] give "
            "the intercept a (ms) and the slope b (ms per byte): t0 = a in us, 1 / b bytes per ms")
    fresh, g = fresh_generator()    # and a sweep drawn now: a table made beforehand fails
    drawn = (float(torch.randint(5, 200, (), generator=g)),
             float(torch.randint(300, 5000, (), generator=g)), 0.03, fresh)
    cases = [((t0_us, gbps, noise, seed), _sweep(t0_us, gbps, noise, seed))
             for t0_us, gbps, noise, seed in ((8.0, 3000.0, 0.0, 0), (60.0, 500.0, 0.0, 1),
                                              (150.0, 2500.0, 0.02, 2), (20.0, 4000.0, 0.05, 3),
                                              drawn)]
    cases += [(label, ([float(v) for v in nbytes], [float(v) for v in ms]))
              for label, (nbytes, ms) in (data or {}).items()]
    for made_up, (nbytes, ms) in cases:
        if isinstance(made_up, str):              # the notebook's own points
            label = f"{name} ({made_up})"
        else:
            t0_us, gbps, noise, seed = made_up
            label = f"{name} (t0 {t0_us:g} us, {gbps:g} GB/s{', noisy' if noise else ''}" + (
                f", drawn with seed {fresh})" if seed is fresh else ")")
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


# --- host or device? ---------------------------------------------------------------------------

# timers a library hands over: refused, the answer times the call itself
LIBRARY_TIMERS = tuple(f for f in (getattr(_testing, "do_bench", None),
                                   getattr(_testing, "do_bench_cudagraph", None),
                                   _torch_benchmark.Timer, timeit.timeit, timeit.repeat,
                                   timeit.Timer.timeit, timeit.Timer.repeat,
                                   timeit.Timer.autorange) if f)

HOST_BUSY_US = (100.0, 1000.0)   # the host-bound calls keep the host busy this long a call
COPY_MIB = 512                   # the device-bound call (GPU only): a copy of this many MiB
ATTEMPTS = 3                     # a case is tried up to this many times before it fails


class CountedCall:
    """A call whose cost is known, for the check: each call keeps the host busy `busy_us`
    (a spin on the clock: the time cannot be less), then runs `work()` (a kernel, on a GPU) if
    given. It counts its calls and keeps when each began and returned (`spans`, perf_counter
    seconds), so that a time the learner reports can be set beside the calls it timed."""

    def __init__(self, busy_us: float, work: Optional[Callable] = None):
        self.busy_s, self.work = busy_us * 1e-6, work
        self.calls, self.spans = 0, []

    def __call__(self):
        self.calls += 1
        begin = time.perf_counter()
        until = begin + self.busy_s
        while time.perf_counter() < until:
            pass
        if self.work is not None:
            self.work()
        self.spans.append((begin, time.perf_counter()))


def _times_n_calls(total_s: float, spans: list, n: int, start: float, stop: float) -> bool:
    """Can `total_s` be the clock read around n consecutive calls? At least from the first's
    start to the last's return, at most from the return of the call before to the start of the
    call after (the answer's own start and stop at the ends); 2 % and 20 µs of slack for
    another clock."""
    for i in range(len(spans) - n + 1):
        inner = spans[i + n - 1][1] - spans[i][0]
        outer = (spans[i + n][0] if i + n < len(spans) else stop) - \
            (spans[i - 1][1] if i > 0 else start)
        if 0.98 * inner - 20e-6 <= total_s <= 1.02 * outer + 20e-6:
            return True
    return False


def _cases(gpu: bool):
    """(label, call, n, expected bound) for the check, made one at a time (the large copy only
    when it is reached)."""
    tiny = torch.zeros(4, device="cuda") if gpu else None
    for busy_us, n in zip(HOST_BUSY_US, (30, 12)):
        work = (lambda: tiny.add_(1.0)) if gpu else None
        label = f"the host busy {busy_us:g} us a call" + (", then a 4-element add" if gpu else "")
        yield label, CountedCall(busy_us, work), n, "host"
    if gpu:
        src = torch.ones(COPY_MIB * 2**20 // 4, device="cuda")
        dst = torch.empty_like(src)
        yield (f"a copy of {COPY_MIB} MiB on the GPU", CountedCall(0.0, lambda: dst.copy_(src)),
               20, "device")


def check_host_or_device(fn: Callable) -> bool:
    """fn(call, n) -> {"enqueue_us", "wall_us", "replay_us", "bound"}: the host's time per call
    to issue n calls (no synchronisation before the clock stops), the wall time per call of n
    calls and a synchronisation, the time per call of n calls replayed from a CUDA graph (None
    without a GPU), and "host" or "device": which one sets the call's pace.

    The check runs fn on calls whose cost it knows (`CountedCall`): calls that keep the host
    busy 100 and 1000 µs, and on a GPU a 512 MiB copy. Every time must be at least the host's
    busy time and fit, n calls at a time, inside the time fn took; fn must call the call n
    times for each eager timing; the replay must not run the host's part again; the bound must
    be the known one. The calls keep when they ran, so each eager time (on a GPU the enqueue
    time alone: the wall time also waits for the device) must be what a clock read around n
    calls in a row shows. A case that fails is run again (up to `ATTEMPTS` times in all): on a
    GPU another process taking the CPU for a few ms can stretch the enqueue time of a copy
    towards its wall time."""
    name = "host_or_device"
    gpu = torch.cuda.is_available()
    for label, call, n, bound in _cases(gpu):
        for _ in range(ATTEMPTS):        # another process may take the CPU in the middle
            call.calls, call.spans = 0, []
            ran = []     # when the function was entered and left: the guard's own set-up and
            #              teardown (slow on a loaded machine) must not widen the bounds

            def entered_and_left(*args, fn=fn, ran=ran):
                ran.append(time.perf_counter())
                try:
                    return fn(*args)
                finally:
                    ran.append(time.perf_counter())
            ok, answer = run_own_code(f"{name} ({label})", "your own timing of the call",
                                      entered_and_left if callable(fn) else fn, call, n,
                                      bar=LIBRARY_TIMERS)
            if not ok:
                return False
            why = _host_or_device_wrong(answer, call, n, bound, tuple(ran), gpu)
            if not why:
                break
        if why:
            print(f"❌ {name} ({label}): {why}")
            return False
        print(f"   {label}, n = {n}: enqueue {answer['enqueue_us']:.1f} us, wall "
              f"{answer['wall_us']:.1f} us, replayed "
              + ("-" if answer["replay_us"] is None else f"{answer['replay_us']:.1f} us")
              + f": {answer['bound']}-bound")
    print(f"✅ {name}: correct (timed from the calls themselves)")
    return True


def _host_or_device_wrong(answer, call: CountedCall, n: int, bound: str, ran: tuple,
                          gpu: bool) -> str:
    """Why `answer` cannot be the timing of `call`, or "" when it can; `ran`: (start, stop) of
    the answer, perf_counter seconds."""
    took_us = (ran[1] - ran[0]) * 1e6
    keys = {"enqueue_us", "wall_us", "replay_us", "bound"}
    if not isinstance(answer, dict) or set(answer) != keys:
        return f"return a dict with the keys {sorted(keys)}, got {answer!r:.120}"
    try:
        enqueue, wall = float(answer["enqueue_us"]), float(answer["wall_us"])
        replay = None if answer["replay_us"] is None else float(answer["replay_us"])
    except (TypeError, ValueError):
        return "enqueue_us and wall_us must be numbers, replay_us a number or None"
    if call.calls < 2 * n:
        return (f"the call ran {call.calls} times; timing n = {n} calls eagerly twice (enqueue, "
                f"then wall) runs it at least {2 * n} times")
    busy_us = call.busy_s * 1e6
    if min(enqueue, wall) < 0.9 * busy_us:
        return (f"each call keeps the host busy {busy_us:g} us, so no time per call can be "
                f"shorter; got enqueue {enqueue:.1f} us, wall {wall:.1f} us (divided by n?)")
    if n * (enqueue + wall) > took_us:
        return (f"n = {n} calls at enqueue {enqueue:.1f} us plus n at wall {wall:.1f} us come to "
                f"{n * (enqueue + wall):.0f} us, more than the {took_us:.0f} us your function took "
                "in all: time the calls, and divide by n")
    # the host's clock around n calls, set beside when the calls ran; on a GPU the wall time
    # also waits for the device after the last call returns
    for what, us in (("enqueue", enqueue), ("wall", wall))[:1 if gpu else 2]:
        if not _times_n_calls(n * us * 1e-6, call.spans, n, *ran):
            return (f"{what}_us x n = {n * us:.0f} us is not the time of {n} calls in a row: "
                    f"time n calls of the call itself, from just before the first to just "
                    f"after the last" + ("" if gpu else " (without a GPU, the enqueue and wall "
                                         "times are both that: no device to wait for)"))
    if not gpu:
        if replay is not None:
            return "without a GPU there is no CUDA graph to replay: replay_us must be None"
    else:
        if replay is None or not 0 < replay <= took_us:
            return f"on a GPU replay_us must be the time of the replayed calls, got {replay!r}"
        if bound == "host" and replay >= 0.5 * busy_us:
            return (f"replayed {replay:.1f} us a call: a CUDA graph replays the kernels only, not "
                    f"the host's {busy_us:g} us of Python (capture the calls, replay the graph)")
        if bound == "device" and not (enqueue < 0.5 * wall and wall > 0.5 * replay):
            return (f"a large copy takes the GPU far longer than the host takes to issue it, so "
                    f"the enqueue time ({enqueue:.1f} us) should be well under the wall time "
                    f"({wall:.1f} us): stop the enqueue clock before synchronising")
    if answer["bound"] not in ("host", "device"):
        return f'bound must be "host" or "device", got {answer["bound"]!r}'
    if answer["bound"] != bound:
        return (f'this call is {bound}-bound, the answer says {answer["bound"]!r}: "host" when '
                "the host takes at least as long to issue a call as the device to run it "
                "(enqueue_us >= replay_us, or no device at all), else \"device\"")
    return ""


def solution_host_or_device(call: Callable, n: int) -> dict:
    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)   # without a GPU nothing waits
    call()                                    # once first: a first call's costs are not a call's
    sync()
    start = time.perf_counter()
    for _ in range(n):                        # the host issues n calls ...
        call()
    enqueue_us = (time.perf_counter() - start) / n * 1e6      # ... the clock stops, no waiting
    sync()
    start = time.perf_counter()
    for _ in range(n):
        call()
    sync()                                    # the wall time waits for the device to finish
    wall_us = (time.perf_counter() - start) / n * 1e6
    replay_us = None
    if gpu:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):         # the host runs the calls once, the graph keeps
            for _ in range(n):                # their kernels
                call()
        graph.replay()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()                        # the kernels alone, no Python between them
        end.record()
        end.synchronize()
        replay_us = begin.elapsed_time(end) * 1e3 / n
    bound = "host" if replay_us is None or enqueue_us >= replay_us else "device"
    return {"enqueue_us": enqueue_us, "wall_us": wall_us, "replay_us": replay_us, "bound": bound}
