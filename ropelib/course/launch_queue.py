"""do_bench's timing loop, taken apart (notebook 07, optional part A.4).

The notebook writes the loop itself out (``dobench_loop``); this module holds the pieces around
it: the host's time to issue a call, ``do_bench`` with its calls counted, a measure run with
autograd's device thread off, and a queue model of the loop.

**The queue model.** Each iteration of ``do_bench``'s loop zeroes a 256 MiB buffer (the memset),
records a start event, calls, records an end event. Per iteration the device spends
``memset + kernel`` and the host ``iter_host``:

- the host is the faster (``iter_host < memset + kernel``): work piles up in the stream, every
  kernel is queued before its start event fires, and the events span the kernel alone;
- otherwise the device idles each iteration. The start event fires when the memset ends; the
  kernel starts when the host *launches* it. The events span
  ``kernel + max(0, launch - memset)``, with ``launch`` the host's time from issuing the memset
  to launching the kernel. The launch falls somewhere inside the call, so the loop's host times
  bound it: at least the time to the call's start, at most the time to its return.
"""
from __future__ import annotations

import time

import torch

from ropelib.bench import compare


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def enqueue_us(step, calls=50):
    """Host µs to issue one call: `calls` calls back to back, no synchronisation until after."""
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    took = time.perf_counter() - start
    _sync()
    return took / calls * 1e6


def dobench_counted(step, device):
    """(do_bench's median µs of step, the number of times do_bench called it)."""
    calls = [0]

    def counted():
        calls[0] += 1
        return step()
    return compare.time_ms(counted, device)[0] * 1e3, calls[0]


def one_thread(measure):
    """`measure` with autograd's device thread off: the backward runs on the calling thread."""
    def run(step):
        torch.autograd.set_multithreading_enabled(False)
        try:
            return measure(step)
        finally:
            torch.autograd.set_multithreading_enabled(True)
    return run


def events_span(memset_us, kernel_us, iter_host_us, launch_us):
    """The queue model: µs between the events around one call. `launch_us`: the host's µs from
    issuing the memset to launching the kernel."""
    if iter_host_us < memset_us + kernel_us:
        return kernel_us                         # the host ahead: the kernel was queued
    return kernel_us + max(0.0, launch_us - memset_us)


def queue_model(loop, memset_us, replayed_us):
    """The model's regime and range for one call's loop (`dobench_loop`'s medians: "iter_host",
    "to_start_host", "to_call_host"), with `replayed_us` as the kernels' time. Returns
    {"regime", "low", "high", "edge"}: the events lie in [low, high] (the launch between the
    call's start and its return); "edge": the host within a tenth of the device's pace."""
    device_iter = memset_us + replayed_us
    if loop["iter_host"] < device_iter:
        regime, low, high = "host ahead, calls queued", replayed_us, replayed_us
    else:
        regime = "device waits each iteration"
        low = events_span(memset_us, replayed_us, loop["iter_host"], loop["to_start_host"])
        high = events_span(memset_us, replayed_us, loop["iter_host"], loop["to_call_host"])
    return {"regime": regime, "low": low, "high": high,
            "edge": abs(loop["iter_host"] / device_iter - 1) <= 0.1}


AGREE_SLACK = 0.2      # two timings of one call "agree" within a fifth of each other


def within(value, low, high, slack=AGREE_SLACK):
    """True when `value` lies in [low, high] widened by `slack` (a fifth) either side."""
    return (1 - slack) * low <= value <= (1 + slack) * high
