"""Notebook 05, section 5: timing the copy on rung 6's tile on this GPU, so the section's cell
keeps the kernel, its launch and the committed numbers the prose reads.

`time_tile_copy` times `y.copy_(x)`, the notebook's copy on rung 6's launch, the notebook's
rung 6 and the same copy with no batch loop, and prints the launch's share of rung 6's gap to a
copy. It needs a GPU; `tests/test_nb05_gap.py` runs it with a stand-in for `do_bench`.
"""
from ropelib.bench import compare
from ropelib.course import measured


def time_tile_copy(x, y, copy_on_tile, rung6, committed_rung):
    """Time on this GPU, with do_bench (medians): `y.copy_(x)`, `copy_on_tile(x, y)` (rung 6's
    launch, storing x unchanged), `rung6()` (the notebook's rung 6 on x) and
    `copy_on_tile(x, y, chunk=1)` (the same tile and warps, a grid axis over the batch instead of
    the loop). Print each as a fraction of the copy's speed beside `committed_rung` (rung 6's, in
    the committed run), the launch's share of rung 6's gap, (1 - tile copy) / (1 - rung 6), and
    what removing the loop closes. Returns the tile copy's fraction of a copy."""
    from triton.testing import do_bench

    def median(call):
        return do_bench(call, quantiles=[0.5, 0.2, 0.8])[0]

    t_copy = median(lambda: y.copy_(x))
    t_tile = median(lambda: copy_on_tile(x, y))
    t_rung = median(rung6)
    t_noloop = median(lambda: copy_on_tile(x, y, chunk=1))
    tile_ratio, rung_ratio, noloop_ratio = t_copy / t_tile, t_copy / t_rung, t_copy / t_noloop
    print(f"y.copy_(x) {t_copy * 1e3:.1f} us; the copy on rung 6's tile {t_tile * 1e3:.1f} us: "
          f"{tile_ratio:.3f} of a copy; rung 6 {t_rung * 1e3:.1f} us: {rung_ratio:.3f} "
          f"(committed: {committed_rung:.3f})")
    if rung_ratio < 1:
        share = (1 - tile_ratio) / (1 - rung_ratio)
        print(f"the launch (tile, batch loop, grid) holds {share:.0%} of rung 6's gap to a copy, "
              f"(1 - tile copy) / (1 - rung 6); the rotation {1 - share:.0%}")
    else:
        print("rung 6 is as fast as a copy here: no gap to share")
    print(f"the copy on the same tile with B_CHUNK=1 (a grid axis over the batch, no loop): "
          f"{noloop_ratio:.3f} of a copy: " + (
              "no faster without the loop, so the loop is not what holds the gap"
              if noloop_ratio <= tile_ratio else "removing the loop closes "
              f"{(noloop_ratio - tile_ratio) / max(1 - tile_ratio, 1e-9):.0%} of the tile "
              "copy's gap"))
    # the copy with no rotation is not slower than the rung (beyond 0.02 of a copy's speed)
    assert tile_ratio > rung_ratio - 0.02, f"tile copy {tile_ratio:.3f}, rung 6 {rung_ratio:.3f}"
    if compare.gpu_slug() == measured.GPU:    # on the committed sweep's GPU: short of a copy too
        assert tile_ratio < 0.95, tile_ratio
    return tile_ratio
