"""Notebook 12, section 8: live timings in shuffled rounds, read round by round.

Each round times every variant once (``time_one(name)``: ``do_bench``'s median on a GPU), in a
new order each round (:func:`ropelib.bench.compare.times_in_rounds`, shuffled). A variant is
summed up by the median of its rounds, their least and most and the spread between; a comparison
of two variants is read round by round (:func:`ropelib.course.rounds.paired_rounds`): the median
of the rounds' ratios, their least and most, and the sign test over who won each round,
**resolved** only where its p is below :data:`LEVEL`.

    times = time_rounds(calls, lambda v: do_bench(calls[v], return_mode="median"))
    print(variant_line("cuBLAS alone", times["cublas"]))
    c = pair(times, "mine", "cublas")
    print(f"mine / cuBLAS: {read_pair(c)}")
"""
from __future__ import annotations

import statistics

from ropelib.bench import compare
from .rounds import paired_rounds

ROUNDS = 9       # the least sign-test p of nine rounds, 2 / 2**9, is under 0.05 (five: 0.0625)
LEVEL = 0.05     # a comparison is resolved where its sign test's p is below this


def time_rounds(names, time_one, rounds: int = ROUNDS, seed: int | None = None) -> dict:
    """{name: [its time in each round]}: ``rounds`` rounds, each timing every name once by
    ``time_one(name)``, the names in a new (shuffled) order each round. Raises where a name was
    not timed in every round (``time_one`` returned None), since the rounds are read as pairs."""
    times = compare.times_in_rounds(list(names), rounds, time_one, order="shuffled", seed=seed)
    short = {name: len(t) for name, t in times.items() if len(t) != rounds}
    if short:
        raise RuntimeError(f"timed in fewer than {rounds} rounds: {short}")
    return times


def variant_line(label: str, times, width: int = 40) -> str:
    """A variant's rounds in one line: the median ms (their least, most; the spread between)."""
    t = [float(v) for v in times]
    return (f"{label:<{width}} {statistics.median(t):.3f} ({min(t):.3f}, {max(t):.3f}; "
            f"{max(t) - min(t):.3f})")


def pair(times: dict, a: str, b: str) -> dict:
    """Variant a against variant b over the same rounds: :func:`paired_rounds` (a's time over
    b's), with ``diff_ms``, the median of the rounds' differences t_a - t_b, and ``resolved``,
    the sign test's p below :data:`LEVEL`."""
    c = paired_rounds(times[a], times[b])
    diff = statistics.median(x - y for x, y in zip(times[a], times[b]))
    return dict(c, diff_ms=diff, resolved=c["p"] < LEVEL)


def read_pair(c: dict, digits: int = 2) -> str:
    """A comparison in words: the median of the rounds' ratios and their range (to ``digits``
    places), the rounds the first won, the sign test's p, resolved or not (``c`` from
    :func:`pair`, or a plain :func:`paired_rounds` result, read against :data:`LEVEL`)."""
    r = lambda v: f"{v:.{digits}f}"                                      # noqa: E731
    return (f"{r(c['ratio'])} (rounds {r(c['low'])} to {r(c['high'])}), the first faster in "
            f"{c['a_wins']} of {c['rounds']} rounds (sign test p {c['p']:.4f}): "
            + ("resolved" if c.get("resolved", c["p"] < LEVEL) else "not resolved"))
