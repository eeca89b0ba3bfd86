"""A call's device time from ``torch.profiler``, beside ``do_bench`` (notebook 09, appendix A.5).

``triton.testing.do_bench`` zeroes a 256 MiB buffer (flushing the L2 cache), records a CUDA event,
makes the call and records another. The events span the call's kernels alone only where the host
has launched them before the device finishes the flush; where launching takes the host longer,
they also span the device's wait for the launch. :func:`device_ms` runs the same loop (the same
flush, then the call inside a ``record_function`` range) under the profiler and returns the device
time of the kernels and copies the calls launched: their own duration, whatever the host's pace.

Off a GPU the same loop runs under the CPU profiler and returns each call's host time: the
plumbing is tested, the number means nothing.
"""
from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile, record_function

RANGE = "nb09_timed_call"
FLUSH_BYTES = 256 * 2 ** 20          # do_bench's cache-flush buffer


def kernel_us(prof) -> dict:
    """{name: summed duration (µs)} of every device kernel and copy a profile saw."""
    out = {}
    for e in prof.key_averages():
        # (the profiler also lists each record_function range on the device, spanning the
        # kernels inside it: counted, it would count them twice; torch before the
        # is_user_annotation flag: this module's own range, by name)
        if getattr(e, "is_user_annotation", False) or e.key == RANGE:
            continue
        if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total:
            out[e.key] = out.get(e.key, 0.0) + e.self_device_time_total
    return out


def device_ms(fn, device, calls: int = 20) -> float:
    """The device time (ms) of what one call of ``fn()`` launches, each call after an L2 flush as
    in ``do_bench``: on a GPU the mean over ``calls`` calls, the profile's kernels less those of
    a profile of the flushes alone (kernels are counted by the device's own record of them, not
    through the ``record_function`` range, to which Triton's launches are not credited); off a
    GPU, the median host time of a call."""
    on_cuda = torch.device(device).type == "cuda"
    flush = torch.empty(FLUSH_BYTES if on_cuda else 1, dtype=torch.int8, device=device)
    fn()                                                      # compiled and warm
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])

    def profiled(call):
        if on_cuda:
            torch.cuda.synchronize(device)
        # a fresh profile each time; acc_events=True only keeps torch's warning about clearing
        # events between cycles (which a profile of one cycle never does) off the page
        with profile(activities=activities, acc_events=True) as prof:
            for _ in range(calls):
                flush.zero_()
                with record_function(RANGE):
                    call()
            if on_cuda:
                torch.cuda.synchronize(device)
        return prof
    prof = profiled(fn)
    ranges = [e for e in prof.events()
              if e.name == RANGE and e.device_type == torch.autograd.DeviceType.CPU]
    if len(ranges) != calls:
        raise RuntimeError(f"the profiler recorded {len(ranges)} calls of {calls}")
    if not on_cuda:
        return statistics.median(e.cpu_time_total / 1e3 for e in ranges)
    per_call = (sum(kernel_us(prof).values())
                - sum(kernel_us(profiled(lambda: None)).values())) / calls / 1e3
    if per_call <= 0:
        raise RuntimeError("a call launched nothing the profiler saw on the device")
    return per_call


def device_ms_or_none(fn, device, calls: int = 20):
    """:func:`device_ms`, or None where the profiler attributes no time to the calls (it prints
    why, and the caller goes on with ``do_bench``'s time alone)."""
    try:
        return device_ms(fn, device, calls)
    except RuntimeError as e:
        print(f"no device time from the profiler here ({e})")
        return None
