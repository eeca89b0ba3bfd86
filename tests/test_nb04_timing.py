"""ropelib.course.nb04_timing: notebook 04's generations table and timing in alternating rounds,
on plain rows and a fake timer (no GPU)."""
import pytest

from ropelib.course import nb04_timing

ROWS = [
    dict(case="batch-1", provider="ropelib_naive", available=True, fwd_ms=0.084,
         copy_fwd_ms=0.021),
    dict(case="batch-1", provider="ropelib_batch_reuse", available=True, fwd_ms=0.085,
         copy_fwd_ms=0.021),
    dict(case="batch-8", provider="ropelib_naive", available=True, fwd_ms=0.64, copy_fwd_ms=0.13),
    dict(case="batch-8", provider="te_fused", available=False, fwd_ms=None, copy_fwd_ms=None),
    dict(case="d80", provider="ropelib_naive", available=True, fwd_ms=1.0, copy_fwd_ms=0.5),
]


def test_forward_times_keeps_the_cases_asked_for_and_each_copy():
    got = nb04_timing.forward_times(ROWS, ("batch-1", "batch-8"))
    assert got == {("batch-1", "ropelib_naive"): 0.084, ("batch-1", "copy"): 0.021,
                   ("batch-1", "ropelib_batch_reuse"): 0.085, ("batch-8", "ropelib_naive"): 0.64,
                   ("batch-8", "copy"): 0.13}


def test_generations_table_committed_only_then_with_a_live_run():
    text = nb04_timing.generations_table(ROWS, ("batch-8", "batch-1"))
    lines = text.splitlines()
    assert "live" not in lines[0] and lines[1].startswith("batch-8")   # the order of `cases`
    naive8 = next(line for line in lines if line.startswith("batch-8") and "naive" in line)
    assert "640.0" in naive8 and "20.3" in naive8                       # us, % of copy
    live = [dict(r, fwd_ms=r["fwd_ms"] * 1.5) if r["fwd_ms"] else r for r in ROWS]
    text = nb04_timing.generations_table(ROWS, ("batch-8",), live, same_gpu=True)
    assert "live/committed" in text and "1.50 <<" in text
    assert "<<" not in nb04_timing.generations_table(ROWS, ("batch-8",), ROWS, same_gpu=True)
    assert "live/committed" not in nb04_timing.generations_table(ROWS, ("batch-8",), live)


def test_generations_table_refuses_no_cases():
    with pytest.raises(ValueError, match="cases"):
        nb04_timing.generations_table(ROWS, ())


def test_alternating_medians_alternates_and_takes_the_median():
    order, times = [], iter([1.0, 10.0, 3.0, 30.0, 2.0, 20.0])
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}

    def timer(call):
        call()
        return next(times)

    medians, rounds = nb04_timing.alternating_medians(calls, rounds=3, timer=timer)
    assert order == ["a", "b"] * 3
    assert rounds == {"a": [1.0, 3.0, 2.0], "b": [10.0, 30.0, 20.0]}
    assert medians == {"a": 2.0, "b": 20.0}
    with pytest.raises(ValueError, match="rounds"):
        nb04_timing.alternating_medians(calls, rounds=0, timer=timer)


def test_floor_on_gpus_reads_one_case_of_each_committed_run():
    from ropelib.course import measured
    h100 = "nvidia-h100-80gb-hbm3"
    got = nb04_timing.floor_on_gpus("forward 256 MiB bf16 sbhd", (measured.GPU, h100, "no-such"))
    assert list(got) == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]     # the missing run left out
    for name, r in got.items():
        assert len(r["date"]) == 10 and r["te"]
        assert 0 < r["copy"] < r["ropelib_batch_reuse"] < r["ropelib_naive"]   # µs
    table = nb04_timing.floor_table(got).splitlines()
    assert "grid/copy" in table[0] and "TE fused" in table[0] and len(table) == 3
    h200 = got["NVIDIA H200"]
    assert f"{h200['ropelib_batch_reuse'] / h200['copy']:.2f}" in table[1]


def test_gap_closed_names_the_band_every_round_lies_in():
    one, copy = [200.0, 200.0, 200.0], [100.0, 100.0, 100.0]
    got = nb04_timing.gap_closed(one, [150.0, 148.0, 152.0], copy)     # 0.48 to 0.52
    assert got["verdict"] == "about half of the gap, in every round"
    assert got["shares"] == sorted(got["shares"]) and abs(got["median"] - 0.5) < 1e-9
    split = nb04_timing.gap_closed(one, [150.0, 130.0, 150.0], copy)   # 0.5 and 0.7
    assert split["verdict"].startswith("from about half to most") and "no one verdict" in split[
        "verdict"]
    # a round where the one-row kernel tied the copy has no gap: left out; none left, None
    assert nb04_timing.gap_closed([200.0, 100.0], [150.0, 90.0], [100.0, 100.0])["shares"] == [
        0.5]
    assert nb04_timing.gap_closed([100.0], [90.0], [100.0]) is None


def test_share_band_edges():
    assert [nb04_timing.share_band(v) for v in (0.95, 0.61, 0.6, 0.4, 0.39, 0.1, 0.05)] == [
        "nearly all", "most", "about half", "about half", "under half", "under half", "little"]
