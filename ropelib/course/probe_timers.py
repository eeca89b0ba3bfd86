"""Live timings taken the way two committed probes (mid_fwdbwd, host_by_size) took theirs.

A time measured here sits beside a logged one only when both were taken the same way: the same
calls, counts, rounds and statistic. ``do_bench``'s median of one call at a time (a 256 MiB
buffer zeroed before each) is not the host's time to enqueue 50 calls back to back, nor 50 calls
followed by one synchronisation. This module repeats two probes' timers:

* ``benchmarks/mid_fwdbwd_probe.py`` (:func:`mid_fwdbwd_ways`): in each round two device copies
  of the bytes replayed from a CUDA graph, then every step in turn (the order reversed every
  other round), each three ways: replayed from a CUDA graph of 20 calls (the device), 50 calls
  issued with no synchronisation (the host's enqueue), 50 calls then one synchronisation (the
  eager call); medians of the rounds, µs per call;
* ``benchmarks/host_by_size_probe.py`` (:func:`host_by_size_ways`): every step and every step
  with autograd's device thread off, each called 10 times first; in each round (the order
  reversed every other round) each one's enqueue of 50 calls; the best round, µs per call. The
  probe's other variants (an ATen control, ropelib with its launches removed) are left out.

Off a GPU the same calls run (the interpreter, or the CPU): the plumbing is checked, the numbers
mean nothing.

The probes that time ropelib with its kernel launches taken out (notebook 09's host split,
``benchmarks/``: ``host_probe``, ``autograd_host_probe``, ``host_by_size_probe``,
``model_host_probe``, ``eager_python_pieces``) take them out with
:class:`launches_removed` (a block) or :func:`without_launches` (a call).
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from ropelib import eager
from ropelib.bench import compare, suite
from ropelib.course import launch_queue

CALLS = 50          # calls per enqueue and per eager timing (both probes)
GRAPH_CALLS = 20    # calls captured per CUDA graph (mid_fwdbwd_probe.py)
MID_ROUNDS = 3      # mid_fwdbwd_probe.py's default --rounds
HOST_ROUNDS = 5     # host_by_size_probe.py's ROUNDS
HOST_WARMUP = 10    # host_by_size_probe.py's calls of every variant before its rounds
MID_WAYS = ("fwdbwd_graph_us", "enqueue_us", "eager_us")

# the cases benchmarks/host_by_size_probe.py times (it imports them): label -> Config (bf16,
# 32 heads of 128)
_HOST_BY_SIZE_FIELDS = (("decode s1 b64 sbhd", dict(seq_len=1, batch=64, layout="sbhd")),
                        ("64 MiB sbhd", dict(seq_len=1024, batch=8, layout="sbhd")),
                        ("64 MiB bshd", dict(seq_len=1024, batch=8, layout="bshd")),
                        ("64 MiB thd", dict(seq_len=1024, batch=8, layout="thd")),
                        ("256 MiB bshd", dict(seq_len=4096, batch=8, layout="bshd")))
HOST_BY_SIZE_CASES = {label: compare.Config(**dict(heads=32, head_dim=128, dtype="bf16", **f))
                      for label, f in _HOST_BY_SIZE_FIELDS}


def _no_launch(self, pointers) -> None:
    """eager.EagerLaunch.__call__ with the launch left out."""


class launches_removed:
    """A block in which ropelib's eager kernel launches (``eager.EagerLaunch.__call__``) do
    nothing: what a call costs the host without them. Every other step of the eager route runs.
    On exit, error or not, the launches are back.

    replan: True clears the planned signatures (``eager.SIGNATURES``) on entry and again on exit:
    each signature's first call in the block is planned afresh, with the launches off, and no
    plan made in the block outlives it. False keeps them: calls take the plans made before the
    block (a plan made in it stays after it)."""
    __slots__ = ("replan", "_launch")

    def __init__(self, *, replan: bool):
        self.replan = replan

    def __enter__(self) -> "launches_removed":
        self._launch = eager.EagerLaunch.__dict__["__call__"]
        eager.EagerLaunch.__call__ = _no_launch
        if self.replan:
            eager.SIGNATURES.clear()
        return self

    def __exit__(self, *exc) -> None:
        eager.EagerLaunch.__call__ = self._launch
        if self.replan:
            eager.SIGNATURES.clear()


def without_launches(fn: Callable, *, replan: bool) -> Callable:
    """fn (no arguments) run in a :class:`launches_removed` block of its own at every call."""
    def call():
        with launches_removed(replan=replan):
            return fn()
    return call


def fwdbwd_steps(case: compare.Case, providers, names) -> dict:
    """{name: forward+backward step}, in the order of ``names``, of the providers named that
    run ``case.config`` (``providers``: :class:`compare.Provider` objects), each on leaf copies
    of its own and gradients all 0.5 (``compare.fwdbwd_inputs``, ``compare.fwdbwd_step``): the
    steps both probes time."""
    by_name = {p.name: p for p in providers}
    steps = {}
    for name in names:
        p = by_name.get(name)
        if p is None or p.why_not(case.config) is not None:
            continue
        gcase, leaves, grads = compare.fwdbwd_inputs(case, fill=0.5)
        steps[p.name] = compare.fwdbwd_step(lambda p=p, g=gcase: p.fn(g), leaves, grads)
    return steps


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def _alternating(names: list, r: int) -> list:
    """Both probes' order: as given in even rounds, reversed in odd ones."""
    return list(names) if r % 2 == 0 else list(reversed(names))


def mid_fwdbwd_ways(steps: dict, copy_pair: Callable, device, rounds: int = MID_ROUNDS,
                    calls: int = CALLS, graph_calls: int = GRAPH_CALLS) -> tuple:
    """(two copies' µs replayed, {name: row}) for ``steps`` ({name: a forward+backward step of
    no arguments}), timed as ``benchmarks/mid_fwdbwd_probe.py`` timed its rows. A row holds
    ``fwdbwd_graph_us``, ``enqueue_us`` and ``eager_us`` (medians of the rounds; None where a
    way failed) and ``failed`` ({way: why}). A way that raises is left out of later rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")

    def eager_us(step):
        us = suite.host_us(step, calls, reps=1, warmup=0, device=device)
        if isinstance(us, Exception):       # host_us hands a failure back as its value
            raise us
        return us
    ways = {"fwdbwd_graph_us": lambda st: suite.graph_replay_ms(st, graph_calls, device)[0] * 1e3,
            "enqueue_us": lambda st: launch_queue.enqueue_us(st, calls),
            "eager_us": eager_us}
    got = {(n, w): [] for n in steps for w in ways}
    failed = {n: {} for n in steps}
    pair = []
    for r in range(rounds):
        pair.append(suite.graph_replay_ms(copy_pair, graph_calls, device)[0] * 1e3)
        for name in _alternating(list(steps), r):
            for way, timer in ways.items():
                if way in failed[name]:
                    continue
                try:
                    got[name, way].append(timer(steps[name]))
                except Exception as e:  # noqa: BLE001 -- the row says why
                    failed[name][way] = _why(e)
                    compare.sync(device)
    rows = {n: {w: (statistics.median(got[n, w]) if got[n, w] and w not in failed[n] else None)
                for w in ways} for n in steps}
    for n in steps:
        rows[n]["failed"] = failed[n]
    return statistics.median(pair), rows


def host_by_size_ways(steps: dict, device, rounds: int = HOST_ROUNDS, calls: int = CALLS,
                      warmup: int = HOST_WARMUP) -> dict:
    """{variant: host µs per call, or the exception it raised} for ``steps`` ({name: a
    forward+backward step}) and each step with autograd's device thread off (variant
    "<name>, one thread"), timed as ``benchmarks/host_by_size_probe.py`` timed its rows: the
    best of ``rounds`` rounds of ``calls`` calls issued back to back (no synchronisation
    inside the clock). A variant that raises is left out of later rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")

    def one_thread(step):
        def call():
            with torch.autograd.set_multithreading_enabled(False):
                return step()
        return call
    variants = dict(steps)
    variants.update({f"{name}, one thread": one_thread(step) for name, step in steps.items()})
    out = {}
    for name, fn in variants.items():
        try:
            for _ in range(warmup):
                fn()
        except Exception as e:  # noqa: BLE001 -- its value says why
            out[name] = e
    compare.sync(device)
    best = {name: float("inf") for name in variants if name not in out}
    for r in range(rounds):
        for name in _alternating(list(variants), r):
            if name in out:
                continue
            try:
                best[name] = min(best[name], launch_queue.enqueue_us(variants[name], calls))
            except Exception as e:  # noqa: BLE001
                out[name] = e
                compare.sync(device)
    out.update((name, us) for name, us in best.items() if name not in out)
    return {name: out[name] for name in variants}
