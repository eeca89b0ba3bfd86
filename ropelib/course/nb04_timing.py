"""Notebook 04's timing tables: the three generations' committed times beside a live run,
one floor-suite case on two GPUs, do_bench medians of several launches timed in alternating
rounds, and exercise 6's reading of those rounds.

The generations' rows are ``benchmarks/generations.py``'s (``case``, ``provider``, ``fwd_ms``,
``fwd_gbps``, ``copy_fwd_ms``, ``available``); the floor suite's are read through
``ropelib.course.measured``. Nothing here touches a GPU unless ``alternating_medians`` is called
without a timer.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import measured

# the floor suite's kernels section 5.2 of notebook 04 sets side by side, and their columns
FLOOR_KERNELS = (("copy", "copy"), ("ropelib_naive", "naive"), ("ropelib_batch_reuse", "grid"),
                 ("te_fused", "TE fused"))


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


def floor_on_gpus(case: str, gpus: Sequence[str]) -> Dict[str, dict]:
    """{GPU name: {"date": day of the run that measured `case`, "te": Transformer Engine's
    version, and µs of each provider}} of one case of the committed floor suite
    (``floor-<gpu>.csv``), for each GPU slug of `gpus` whose run is in this checkout."""
    out = {}
    for slug in gpus:
        if not measured.path("floor", slug).exists():
            continue
        meta, _ = measured.load("floor", slug)
        run = measured.floor_run_date(meta, case.removeprefix("forward "))   # its group's run
        out[meta["gpu"]] = dict(date=run[:10],
                                te=meta.get("transformer_engine"),
                                **{k: r["ms"] * 1e3 for k, r in measured.floor(slug)[case].items()})
    return out


def floor_table(on_gpus: Dict[str, dict]) -> str:
    """`floor_on_gpus`'s result as a table: a GPU a line, µs of the copy, the naive kernel, the
    batch-reusing grid and TE's fused kernel, then grid / copy and TE / grid."""
    head = (f"{'GPU':22} {'run':10} " + " ".join(f"{label:>8}" for _, label in FLOOR_KERNELS)
            + f" {'grid/copy':>9} {'TE/grid':>7}")
    lines = [head]
    for name, r in on_gpus.items():
        lines.append(f"{name:22} {r['date']:10} "
                     + " ".join(f"{r[k]:8.1f}" for k, _ in FLOOR_KERNELS)
                     + f" {r['ropelib_batch_reuse'] / r['copy']:9.2f}"
                     f" {r['te_fused'] / r['ropelib_batch_reuse']:7.2f}")
    return "\n".join(lines)


def share_band(share: float) -> str:
    """Exercise 6's words for a share of a gap closed: "nearly all" above 0.9, "most" above
    0.6, "about half" from 0.4, "under half" from 0.1, else "little"."""
    return ("nearly all" if share > 0.9 else "most" if share > 0.6 else
            "about half" if share >= 0.4 else "under half" if share >= 0.1 else "little")


def gap_closed(one_us: Sequence[float], two_us: Sequence[float],
               copy_us: Sequence[float]) -> Optional[dict]:
    """Exercise 6's reading of alternating rounds (one time of each kernel a round): per round,
    the share of the one-row kernel's gap over the copy that the two-row kernel closes,
    (one - two) / (one - copy). Rounds where the one-row kernel was no slower than the copy
    have no gap and are left out; None when no round is left. Else {"shares": sorted,
    "median", "lo", "hi", "verdict"}: the verdict names the band every round lies in, and says
    there is none when the rounds fall in different bands."""
    shares: List[float] = sorted((o - t) / (o - c) for o, t, c in zip(one_us, two_us, copy_us)
                                 if o > c)
    if not shares:
        return None
    lo, hi = share_band(shares[0]), share_band(shares[-1])
    verdict = (f"{lo} of the gap, in every round" if lo == hi else
               f"from {lo} to {hi} of the gap, round by round: no one verdict from this run")
    return dict(shares=shares, median=statistics.median(shares), lo=shares[0], hi=shares[-1],
                verdict=verdict)
