"""Notebook 05, section 5: nb05_gap.time_tile_copy times the copy on rung 6's tile and prints
the launch's share of rung 6's gap (here with a stand-in for do_bench)."""
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
