"""Notebook 04's timing tables: the three generations' committed times beside a live run, and
do_bench medians of several launches timed in alternating rounds.

The rows are ``benchmarks/generations.py``'s (``case``, ``provider``, ``fwd_ms``, ``fwd_gbps``,
``copy_fwd_ms``, ``available``); nothing here touches a GPU unless ``alternating_medians`` is
called.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple


def forward_times(rows: Iterable[dict], cases: Sequence[str]) -> Dict[Tuple[str, str], float]:
    """{(case, kernel): forward ms} of the rows whose case is in ``cases``, with each case's copy
    as the kernel ``"copy"``."""
    out = {}
    for r in rows:
        if r["case"] in cases and r.get("available") and r.get("fwd_ms") is not None:
            out[(r["case"], r["provider"])] = r["fwd_ms"]
            if r.get("copy_fwd_ms") is not None:
                out[(r["case"], "copy")] = r["copy_fwd_ms"]
    return out


def generations_table(committed_rows: Iterable[dict], cases: Sequence[str],
                      live_rows: Optional[Iterable[dict]] = None, same_gpu: bool = False) -> str:
    """One line per (case, kernel): the committed forward time in µs and its % of the copy's
    time, then, given ``live_rows``, the live time, and where ``same_gpu`` the ratio live /
    committed (``<<`` when over 10 % apart: two runs of one GPU model should agree)."""
    if not cases:
        raise ValueError("cases: name at least one case of the generations table")
    committed_rows = list(committed_rows)
    committed = forward_times(committed_rows, cases)
    live = forward_times(live_rows, cases) if live_rows is not None else {}
    pct = {k: 100 * committed[(k[0], "copy")] / ms for k, ms in committed.items()
           if (k[0], "copy") in committed}
    head = f"{'case':10} {'kernel':20} {'committed us':>12} {'% of copy':>9}"
    if live_rows is not None:
        head += f" {'live us':>8}" + (f" {'live/committed':>14}" if same_gpu else "")
    lines = [head]
    for key in sorted(set(committed) | set(live), key=lambda k: (list(cases).index(k[0]), k[1])):
        c_ms, l_ms = committed.get(key), live.get(key)
        line = (f"{key[0]:10} {key[1]:20} " + (f"{c_ms * 1e3:12.1f}" if c_ms else f"{'-':>12}")
                + (f" {pct[key]:9.1f}" if key in pct else f" {'-':>9}"))
        if live_rows is not None:
            line += f" {l_ms * 1e3:8.1f}" if l_ms else f" {'-':>8}"
            if same_gpu and c_ms and l_ms:
                ratio = l_ms / c_ms
                line += f" {ratio:14.2f}" + (" <<" if abs(ratio - 1) > 0.1 else "")
        lines.append(line)
    return "\n".join(lines)


def alternating_medians(calls: Dict[str, Callable[[], object]], rounds: int = 3,
                        timer: Optional[Callable[[Callable], float]] = None) -> tuple:
    """Time every call once a round, the calls alternating, for ``rounds`` rounds.

    ``timer(call)`` returns µs; by default ``triton.testing.do_bench``'s median (a GPU). Returns
    ({name: median µs over the rounds}, {name: [µs of each round]})."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: time at least one round")
    if timer is None:
        from triton.testing import do_bench

        def timer(call):
            return do_bench(call, return_mode="median") * 1e3
    per_round = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            per_round[name].append(timer(call))
    return {name: statistics.median(v) for name, v in per_round.items()}, per_round
