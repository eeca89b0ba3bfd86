"""Notebook 05's gap to a copy (nb05_gap): section 5's time_tile_copy prints the launch's share of
rung 6's gap; appendix A.6's persistent copy copies, residency counts programs, bytes and waves
for the H200's plan (compiled for sm_90 here), and time_residency reads the timings (here with a
stand-in for do_bench)."""
import pytest
import torch

from ropelib.course import nb05_gap


@pytest.fixture()
def bench_ms(monkeypatch):
    """do_bench stand-in: the n-th call runs the function once and says `times[n]` ms."""
    import triton.testing
    times = []

    def fake(fn, quantiles=None):
        fn()
        ms = times.pop(0)
        return [ms, ms, ms]
    monkeypatch.setattr(triton.testing, "do_bench", fake)
    monkeypatch.setattr(nb05_gap.compare, "gpu_slug", lambda: "another-gpu")   # no GPU here
    return times


def test_the_launchs_share_of_the_gap(bench_ms, capsys):
    x, y = torch.randn(4, 3), torch.empty(4, 3)
    chunks = []

    def copy_on_tile(x, y, chunk=None):
        chunks.append(chunk)
        y.copy_(x)
    bench_ms[:] = [1.0, 1.1, 1.2, 1.1]      # copy, tile copy, rung 6, tile copy with no loop
    ratio = nb05_gap.time_tile_copy(x, y, copy_on_tile, lambda: None, 0.915)
    out = capsys.readouterr().out
    assert ratio == pytest.approx(1 / 1.1)
    assert chunks == [None, 1] and torch.equal(y, x)
    share = (1 - 1 / 1.1) / (1 - 1 / 1.2)
    assert f"holds {share:.0%} of rung 6's gap" in out and "committed: 0.915" in out
    assert "no faster without the loop" in out


def test_a_tile_copy_slower_than_the_rung_fails(bench_ms):
    x, y = torch.randn(2), torch.empty(2)
    bench_ms[:] = [1.0, 1.5, 1.1, 1.5]
    with pytest.raises(AssertionError, match="0.66"):
        nb05_gap.time_tile_copy(x, y, lambda x, y, chunk=None: None, lambda: None, 0.9)


# --- A.6: residency and the last wave ------------------------------------------------------------

def test_the_persistent_copy_copies_with_any_number_of_programs():
    x = torch.randn(6, 3, 5, 48).to(torch.bfloat16)       # tiles the plan does not divide
    for programs in (1, 2, 3, 7, 50):                     # fewer and more programs than tiles
        y = torch.full_like(x, float("nan"))
        nb05_gap.copy_resident(x, y, programs)
        assert torch.equal(y, x), programs


def _h200():
    from ropelib.kernels import tiles
    return 132, dict(tile_loop=tiles.TILES_BY_GPU["NVIDIA H200"]["loop"],
                     tile_noloop=tiles.TILE_NOLOOP, tile_wide=tiles.TILE_WIDE)


@pytest.fixture(scope="module")
def residency_h200():
    """nb05_gap.residency for the H200's plan, as the notebook calls it without a GPU."""
    from ropelib.course import ladder, measured
    sms, knobs = _h200()
    rung6 = measured.mechanism("s4096-b8")["equal_halves"]
    return nb05_gap.residency(nb05_gap._copy_resident_kernel, ladder._copy_on_tile_kernel, sms,
                              knobs, floors=(5.6, 20.1), profiled_rung6=rung6, h200=True)


def test_residency_counts_programs_bytes_and_waves_for_the_h200(residency_h200, capsys):
    import math
    res = residency_h200
    p = res.plan
    assert (p.block_s, p.block_h, p.chunk, p.num_warps) == (1, 32, 8, 8)    # section 2's plan
    assert 1 <= res.k6 < res.k_max and res.k_tile >= 1
    assert res.waves == pytest.approx(math.prod(p.grid) / (132 * res.k_tile))
    # s_whole tokens make whole waves of the copy on rung 6's grid, the fewest at or past 4096
    programs = res.s_whole // p.block_s * (math.prod(p.grid) // 4096)
    assert programs == math.ceil(res.waves) * 132 * res.k_tile and res.s_whole >= 4096


def test_residency_refuses_floors_it_does_not_straddle():
    from ropelib.course import ladder, measured
    sms, knobs = _h200()
    rung6 = measured.mechanism("s4096-b8")["equal_halves"]
    with pytest.raises(AssertionError):          # a loaded floor above rung 6's bytes in flight
        nb05_gap.residency(nb05_gap._copy_resident_kernel, ladder._copy_on_tile_kernel, sms,
                           knobs, floors=(5.6, 500.0), profiled_rung6=rung6, h200=True)


def test_time_residency_reads_residency_the_tail_and_exercise_1(bench_ms, residency_h200,
                                                                  capsys):
    res = residency_h200._replace(k6=2, k_max=3, s_whole=8)
    x = torch.randn(4, 2, 3, 8)
    y = torch.empty_like(x)
    launched = []

    def copy_resident(x, y, programs):
        launched.append(programs)
        y.copy_(x)

    def copy_on_tile(x, y):                     # the same tile, and whole waves at s_whole
        y.copy_(x)
        return res.plan._replace(grid=(8 * 132 * res.k_tile, 1, 1))
    # copy; the tile copy on rung 6's grid; k = 1, 2, 3; the tail: y.copy_(x) then the tile
    # copy, at s_whole
    bench_ms[:] = [1.0, 1.06, 1.4, 1.12, 1.05, 1.0, 1.05]
    both = {"worked solution": (None, None, res.plan.num_warps, 2),
            "ropelib's finished kernel": (None, None, res.plan.num_warps, 3)}
    live = {"worked solution": 0.87, "ropelib's finished kernel": 0.94}
    by_k = nb05_gap.time_residency(x, y, res._replace(waves=7.5), copy_resident, copy_on_tile,
                                   0.913, exercise_1=(both, live))
    out = capsys.readouterr().out
    assert launched == [132, 264, 396] and torch.equal(y, x)
    assert by_k == pytest.approx({1: 1 / 1.4, 2: 1 / 1.12, 3: 1 / 1.05})
    closed = (1 / 1.05 - 1 / 1.12) / (1 - 1 / 1.12)
    assert f"close {closed:.0%} of the persistent copy's gap left at 2 (one median a k): most" \
        in out
    # the persistent copy at k = 2 (1/1.12) is slower than the copy on rung 6's grid (1/1.06)
    assert "at k = 2 the persistent copy (0.893) is slower than the copy on rung 6's own grid " \
        "(0.943)" in out
    assert "rung 6's own grid: 0.943 here, 0.913 in section 5" in out
    # the stand-in's calls have no spread: whole waves (1/1.05) against 1/1.06
    assert "(8 whole waves) 0.952 (0.952-0.952)" in out
    closed_tail = (1 / 1.05 - 1 / 1.06) / (1 - 1 / 1.06)
    assert f"whole waves close {closed_tail:.0%} of the gap" in out
    assert "Exercise 1: the worked solution holds 2 programs an SM, the finished kernel 3" in out


def test_time_residency_needs_more_speed_from_more_programs(bench_ms, residency_h200):
    res = residency_h200._replace(k6=2, k_max=2)
    x = torch.randn(4)
    # copy, the tile copy on rung 6's grid, k = 1, 2: one program an SM faster than two, not
    # what A.6 expects
    bench_ms[:] = [1.0, 1.0, 1.0, 1.2]
    with pytest.raises(AssertionError, match=r"^\{1: 1\.0, 2: 0\.83"):
        nb05_gap.time_residency(x, torch.empty_like(x), res, lambda x, y, n: y.copy_(x),
                                lambda x, y: (y.copy_(x), res.plan)[1], 0.9)
