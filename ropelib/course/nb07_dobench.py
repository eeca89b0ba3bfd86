"""Notebook 07, optional part A.4: ``do_bench``'s loop written out, timing the host's side too,
and one line saying which case of the section's picture (host ahead of the device, or the device
waiting for it) a provider's loop falls in."""
from __future__ import annotations

import statistics
import time

import torch

from . import launch_queue


def dobench_loop(step, flush, warmup_ms=25, rep_ms=100):
    """do_bench's loop written out with its own counts. Returns the calls made, the repeats,
    and medians over the repeats: host µs per iteration, host µs from zeroing the buffer to the
    call's start and to its end, host µs inside the call, device µs between the two events."""
    step()
    torch.cuda.synchronize()
    begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    begin.record()
    for _ in range(5):                                   # do_bench's estimate of one call
        flush.zero_()
        step()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = begin.elapsed_time(end) / 5
    n_warmup, n_repeat = max(1, int(warmup_ms / estimate_ms)), max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):                            # back to back, no buffer zeroed
        step()
    iteration, to_start, to_call, call = [], [], [], []
    for i in range(n_repeat):
        t_iter = time.perf_counter()
        flush.zero_()
        starts[i].record()
        t_call = time.perf_counter()
        step()
        t_done = time.perf_counter()
        ends[i].record()
        iteration.append((time.perf_counter() - t_iter) * 1e6)
        to_start.append((t_call - t_iter) * 1e6)
        to_call.append((t_done - t_iter) * 1e6)
        call.append((t_done - t_call) * 1e6)
    torch.cuda.synchronize()
    return {"calls": 6 + n_warmup + n_repeat, "n_repeat": n_repeat,
            "iter_host": statistics.median(iteration),
            "to_start_host": statistics.median(to_start),
            "to_call_host": statistics.median(to_call), "call_host": statistics.median(call),
            "events": statistics.median(s_.elapsed_time(e) * 1e3 for s_, e in zip(starts, ends))}


def regime_line(name, loop, memset_us, replayed_us, dobench_us):
    """One provider's case of the picture (the host's µs an iteration against the device's) and
    whether the loop's events reproduce do_bench's median: how far apart the two are, and
    "agree" within launch_queue's tolerance (a fifth), else "differ"."""
    q = launch_queue.queue_model(loop, memset_us, replayed_us)
    agree = launch_queue.within(loop["events"], dobench_us, dobench_us)
    slack = f"{launch_queue.AGREE_SLACK:.0%}"
    return (f"  {name:13s} host {loop['iter_host']:6.1f} us an iteration, device "
            f"{memset_us + replayed_us:6.1f} us: {q['regime']}"
            + (" (within a tenth of the boundary)" if q["edge"] else "")
            + f"; events {loop['events']:.1f} us, do_bench {dobench_us:.1f} us "
            f"({loop['events'] / dobench_us - 1:+.0%}): "
            + (f"agree (within {slack})" if agree else f"differ (by more than {slack})"))


def back_to_back_us(t):
    """A call's µs back to back from host_or_device's dict: the slower of the host's issue and
    the device's replay (without a GPU, the wall clock's: the interpreter's)."""
    return t["wall_us"] if t["replay_us"] is None else max(t["enqueue_us"], t["replay_us"])


def issue_line(name, t, dobench_us):
    """One call's line from host_or_device's dict ``t``: its enqueue against its replay (or the
    wall clock), back to back, and do_bench's median ``dobench_us``."""
    if t["replay_us"] is None:
        verdict = f"enqueue {t['enqueue_us']:6.1f} us, wall {t['wall_us']:6.1f} us"
    else:
        level = abs(t["enqueue_us"] / t["replay_us"] - 1) <= 0.05
        verdict = (f"enqueue {t['enqueue_us']:6.1f} us, replayed {t['replay_us']:5.1f} us: "
                   + ("level (within 5 %)" if level else "host-bound"
                      if t["enqueue_us"] > t["replay_us"] else "device-bound"))
    return (f"  {name:13s} {verdict}; back to back {back_to_back_us(t):6.1f} us, do_bench "
            f"{dobench_us:6.1f} us")
