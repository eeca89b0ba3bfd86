"""ropelib.course.nb12_live_rounds: notebook 12's live timings in shuffled rounds, read round by
round, on the CPU with a fake timer."""
import statistics

import pytest

from ropelib.course import nb12_live_rounds as live


def fake_timer(base, drift=0.0, noise=None):
    """A do_bench stand-in: variant v's time in round r is base[v] * (1 + drift * r) (a GPU
    that slows from round to round), plus noise[v][r] where given; records the calls."""
    calls, seen = [], {v: 0 for v in base}

    def time_one(v):
        calls.append(v)
        r = seen[v]
        seen[v] += 1
        return base[v] * (1 + drift * r) + (noise[v][r] if noise else 0.0)
    return time_one, calls


def test_every_variant_once_a_round_in_a_new_order():
    base = {v: 1.0 + i for i, v in enumerate("abcdef")}
    time_one, calls = fake_timer(base)
    times = live.time_rounds(base, time_one)
    assert live.ROUNDS == 9 and list(times) == list(base)
    assert all(t == [base[v]] * 9 for v, t in times.items())
    rounds = [calls[i:i + 6] for i in range(0, len(calls), 6)]
    assert len(rounds) == 9 and all(sorted(r) == sorted(base) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1                 # shuffled, not one fixed order
    # the same seed visits the same orders; another seed, others
    again, calls_again = fake_timer(base)
    live.time_rounds(base, again)
    other, calls_other = fake_timer(base)
    live.time_rounds(base, other, seed=1)
    assert calls_again == calls and calls_other != calls


def test_a_variant_missing_a_round_is_refused():
    with pytest.raises(RuntimeError, match="fewer than 9 rounds"):
        live.time_rounds(["a", "b"], lambda v: None if v == "b" else 1.0)


def test_a_steady_gap_resolves_through_drift_that_single_timings_would_misread():
    # the GPU slows 2 % a round: timed once each, rounds apart, a 1 % faster variant could time
    # slower, but in every round it is faster than its partner timed in the same round
    base = {"fast": 0.99, "slow": 1.0}
    time_one, _ = fake_timer(base, drift=0.02)
    times = live.time_rounds(base, time_one)
    c = live.pair(times, "fast", "slow")
    assert (c["rounds"], c["p"]) == (9, pytest.approx(2 / 2**9))
    assert c["resolved"] and c["diff_ms"] < 0
    assert c["a_wins"] + c["b_wins"] == 9
    assert c["p"] < live.LEVEL and live.read_pair(c).endswith(": resolved")
    assert max(times["fast"]) > min(times["slow"])   # the spreads overlap all the same


def test_a_split_comparison_is_not_resolved_and_reads_so():
    noise = {"a": [0.0] * 9, "b": [-0.1, 0.1] * 4 + [0.1]}       # b wins 4 rounds, a 5
    time_one, _ = fake_timer({"a": 1.0, "b": 1.0}, noise=noise)
    c = live.pair(live.time_rounds(["a", "b"], time_one), "a", "b")
    assert (c["a_wins"], c["b_wins"]) == (5, 4) and c["p"] == 1.0 and not c["resolved"]
    assert c["low"] < 1 < c["high"]
    text = live.read_pair(c)
    assert text.startswith(f"{c['ratio']:.2f} (rounds {c['low']:.2f} to {c['high']:.2f}), "
                           "the first faster in 5 of 9 rounds (sign test p 1.0000)")
    assert text.endswith(": not resolved")
    assert live.read_pair(c, digits=3).startswith(f"{c['ratio']:.3f} (rounds {c['low']:.3f} ")


def test_eight_wins_of_nine_resolve_seven_do_not():
    a = [1.0] * 9
    eight = live.pair({"a": a, "b": [2.0] * 8 + [0.5]}, "a", "b")
    seven = live.pair({"a": a, "b": [2.0] * 7 + [0.5] * 2}, "a", "b")
    assert eight["p"] == pytest.approx(20 / 512) and eight["resolved"]
    assert seven["p"] == pytest.approx(2 * (36 + 9 + 1) / 512) and not seven["resolved"]


def test_variant_line():
    t = [1.2, 1.0, 1.5]
    line = live.variant_line("cuBLAS alone", t, width=14)
    assert line == f"cuBLAS alone   {statistics.median(t):.3f} (1.000, 1.500; 0.500)"
