"""Notebook 05: what holds rung 6's gap to a copy, measured on this GPU, so the notebook's cells keep
the kernels the learner may edit, their launches and the committed numbers the prose reads.

Section 5: `time_tile_copy` times `y.copy_(x)`, the notebook's copy on rung 6's launch, the
notebook's rung 6 and the same copy with no batch loop, and prints the launch's share of rung 6's
gap to a copy.

Appendix A.6 (is the launch's share residency, or the last wave?): `_copy_resident_kernel` is the
copy on rung 6's tile with a persistent grid (the notebook shows it in a cell the learner can
change); `copy_resident` launches it with a given number of programs; `residency` compiles it,
rung 6 and the copy on rung 6's grid for sm_90 and counts the programs an SM holds, the bytes
they can keep in flight and the waves rung 6's grid makes (no GPU needed); `time_residency` then
times, on a GPU, the copy with more programs an SM and in whole waves, and Exercise 1's two
kernels at their residency.

The timings need a GPU; `tests/test_nb05_gap.py` runs them with a stand-in for `do_bench`.
"""
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ropelib.bench import compare
from ropelib.course import ladder, measured, nb05_interleaved


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


# --- A.6: residency and the last wave ---------------------------------------------------------

@triton.jit
def _copy_resident_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per tile (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per tile
    BLOCK_H: tl.constexpr,  # heads per tile
):
    # grid (P,): program p copies tiles p, p + P, p + 2P, ... of rung 6's grid (axis 0 fastest),
    # each tile as _copy_on_tile_kernel copies it
    n_s = tl.cdiv(S, BLOCK_S)
    n_h = tl.cdiv(H, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    for t in range(tl.program_id(0), n_s * n_h * tl.cdiv(B, B_CHUNK), tl.num_programs(0)):
        s = (t % n_s) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        h = (t // n_s % n_h) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
        b_lo = t // (n_s * n_h) * B_CHUNK
        b_hi = tl.minimum(b_lo + B_CHUNK, B)
        m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
        x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh + j[None, None, :] * stride_xd
        y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh + j[None, None, :] * stride_yd
        for b in range(b_lo, b_hi):
            xr = x_ptr + x_off + b * stride_xb
            yr = y_ptr + y_off + b * stride_yb
            x_a = tl.load(xr, mask=m, other=0.0)
            x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0)
            tl.store(yr, x_a, mask=m)
            tl.store(yr + HALF * stride_yd, x_b, mask=m)


def copy_resident(x, y, programs, kernel=_copy_resident_kernel):
    """y = x by `programs` programs of `kernel` (the persistent copy's signature) walking rung 6's
    tiles: rung 6's plan for x [S, B, H, D] on this device."""
    S, B, H, D = x.shape
    p = ladder.plan("equal_halves", S, B, H, D, x.element_size(), *ladder.device_knobs(x))
    # grid (programs,): program i walks rung 6's tiles i, i + programs, ... (rung 6's tile, batch
    # chunk and warps from its plan; the grid alone is not rung 6's)
    kernel[(programs,)](x, y, S, B, H, p.chunk, *x.stride(), *y.stride(), HALF=D // 2,
                        BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_S=p.block_s,
                        BLOCK_H=p.block_h, num_warps=p.num_warps)


SHAPE = (4096, 8, 32, 128)      # A.6's size: bf16 sbhd, section 5's s4096-b8


class Residency(NamedTuple):
    """What `residency` counted for rung 6's launch at SHAPE on a GPU of `sm_count` SMs."""
    plan: ladder.Plan       # rung 6's plan (grid, tile, B_CHUNK, warps)
    sm_count: int
    registers: dict         # {"rung 6": .., "copy": ..}: registers a thread, compiled for sm_90
    k6: int                 # programs an SM rung 6's registers allow
    k_max: int              # ... the persistent copy's (at least k6)
    k_tile: int             # ... the copy on rung 6's own grid
    waves: float            # rung 6's grid, in waves of sm_count * k_tile programs
    s_whole: int            # tokens whose grid fills whole waves (rung 6's tile, the same batch)


def residency(resident_kernel, tile_kernel, sm_count, knobs, floors, profiled_rung6, h200):
    """Compile for sm_90, with rung 6's plan at SHAPE on a GPU of `sm_count` SMs and tile `knobs`,
    rung 6, the persistent copy (`resident_kernel`) and the copy on rung 6's own grid
    (`tile_kernel`), and count the programs an SM holds by their registers. Prints them, section
    2's bound on the bytes of loads in flight an SM for each number of programs k (beside
    `floors`, section 2's (idle, loaded) floors in KiB), and the waves rung 6's grid makes.

    `h200`: the plan is the H200's (no GPU here), so the counts can be set beside the H200 run's
    profile of rung 6 (`profiled_rung6`, its mechanism row): asserts that its registers give its
    programs an SM, that the copy fits more, and that one program an SM is under the loaded floor
    while rung 6's k is above it. Returns a Residency. Raises what a missing compiler raises."""
    from ropelib.course import load_schedule
    resident_programs = nb05_interleaved.programs_per_sm  # (registers, threads) -> programs an SM
    S, B, H, D = SHAPE
    p = ladder.plan("equal_halves", S, B, H, D, 2, sm_count, knobs)
    threads = 32 * p.num_warps
    xm = torch.empty(SHAPE, dtype=torch.bfloat16, device="meta")        # shapes only
    bf16 = torch.empty(16, dtype=torch.bfloat16)
    args = dict(x_ptr=bf16, y_ptr=bf16, S=S, B=B, H=H, B_CHUNK=p.chunk,
                **dict(zip([f"stride_{t}{k}" for t in "xy" for k in "sbhd"], 2 * xm.stride())),
                HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_S=p.block_s,
                BLOCK_H=p.block_h)
    copy_regs = load_schedule.schedule(resident_kernel, args, num_warps=p.num_warps)["registers"]
    (rung6,) = ladder.compile_for_gpu(["equal_halves"], sm_count=sm_count, knobs=knobs)
    k6 = resident_programs(rung6["registers"], threads)
    k_max = max(resident_programs(copy_regs, threads), k6)
    k_tile = resident_programs(
        load_schedule.schedule(tile_kernel, args, num_warps=p.num_warps)["registers"], threads)
    print(f"sm_90, Triton {triton.__version__}, {p.num_warps} warps a program: rung 6 "
          f"{rung6['registers']} registers a thread, {k6} programs an SM; the copy "
          f"{copy_regs}, {k_max}")
    if h200:   # the H200's plan: the H200 run's rung 6 had as many registers and programs
        assert resident_programs(profiled_rung6["registers"], threads) == \
            profiled_rung6["occ_blocks_per_sm"]
        assert k_max > k6
        if triton.__version__.startswith("3.6"):
            assert k6 == 4
    # section 2's bound for k programs an SM: each thread with its batch step's x loads out
    # (both halves of its part of the [BLOCK_S, BLOCK_H, D/2] tile, 2 bytes an element)
    step_bytes = 2 * 2 * p.block_s * p.block_h * (D // 2) // threads
    bound_k = {k: k * threads * step_bytes / 1024 for k in range(1, k_max + 1)}
    need_idle, need_loaded = floors
    print(f"bytes of loads in flight an SM, at most ({step_bytes} B a thread a step): "
          + ", ".join(f"k = {k}: {v:.0f} KiB" for k, v in bound_k.items())
          + f"; section 2's floors (H200): {need_idle:.1f} KiB idle, {need_loaded:.1f} loaded")
    if h200:   # the H200's plan against the H200's floors: one program an SM below the
        assert bound_k[1] < need_loaded < bound_k[k6]    # loaded floor, rung 6's k above it
    # the tail: the copy on rung 6's grid, k_tile programs an SM, ends on a partial wave
    programs = math.prod(p.grid)
    waves = programs / (sm_count * k_tile)
    per_block = programs // triton.cdiv(S, p.block_s)        # programs a block of BLOCK_S tokens
    s_whole = math.ceil(waves) * sm_count * k_tile // per_block * p.block_s
    print(f"the copy on rung 6's grid: {k_tile} programs an SM, {programs:,} programs "
          f"= {waves:.2f} waves on {sm_count} SMs; s = {s_whole} fills {math.ceil(waves)} whole ones")
    return Residency(p, sm_count, {"rung 6": rung6["registers"], "copy": copy_regs}, k6, k_max,
                     k_tile, waves, s_whole)


def time_residency(x, y, res, copy_resident, copy_on_tile, tile_ratio, exercise_1=None):
    """On a GPU, with do_bench, for x of A.6's SHAPE and y its output: the copy with k = 1 ..
    res.k_max programs an SM (`copy_resident(x, y, programs)`, medians), against `y.copy_(x)`;
    the share of the persistent copy's gap left at rung 6's k that more programs close, beside
    the copy on rung 6's own grid (`copy_on_tile(x, y)`, which returns its plan), timed here
    (`tile_ratio`: section 5's timing of it, printed beside); the same tile copy at res.s_whole
    tokens (whole waves) and at SHAPE, each against its own copy, with the 20 %-80 % quantiles of
    the calls; and, given `exercise_1` ((side_by_side's {name: (schedule, split, warps, programs
    an SM)}, the live ratios of the Exercise 1 timing)), the share of the worked solution's gap
    to the finished kernel that residency alone explains. Prints each reading; returns {k:
    fraction of a copy}."""
    from triton.testing import do_bench

    def timed(call):
        """(median, 20 % quantile, 80 % quantile) of call's times, ms."""
        return tuple(do_bench(call, quantiles=[0.5, 0.2, 0.8]))

    def against_copy(copy, kernel):
        """(median, lowest, highest) fraction of a copy, from two timed()'s quantiles."""
        return copy[0] / kernel[0], copy[1] / kernel[2], copy[2] / kernel[1]

    k6, k_max, p = res.k6, res.k_max, res.plan
    t_copy = timed(lambda: y.copy_(x))
    on_grid = against_copy(t_copy, timed(lambda: copy_on_tile(x, y)))
    assert torch.equal(y, x)
    print(f"y.copy_(x) {t_copy[0] * 1e3:.1f} us; the copy on rung 6's tile with k programs an SM "
          f"(grid k x {res.sm_count}), as a fraction of it (on rung 6's own grid: "
          f"{on_grid[0]:.3f} here, {tile_ratio:.3f} in section 5)")
    by_k = {}
    for k in range(1, k_max + 1):
        by_k[k] = t_copy[0] / timed(lambda: copy_resident(x, y, k * res.sm_count))[0]
        print(f"  k = {k}: {by_k[k]:.3f}" + ("   <- rung 6's k" if k == k6 else ""))
    assert torch.equal(y, x)
    if k6 > 1:    # one program an SM, its bytes in flight under the loaded floor, is slower
        assert by_k[1] < by_k[k6], by_k
    if k_max > k6 and by_k[k6] < 1:
        closed = (max(by_k[k] for k in range(k6, k_max + 1)) - by_k[k6]) / (1 - by_k[k6])
        print(f"more programs than rung 6's {k6} close {closed:.0%} of the persistent copy's gap "
              f"left at {k6} (one median a k): " + ("most of it" if closed > 0.5 else
                                                    "less than half"))
        if by_k[k6] < on_grid[0]:
            print(f"  at k = {k6} the persistent copy ({by_k[k6]:.3f}) is slower than the copy on "
                  f"rung 6's own grid ({on_grid[0]:.3f}): its gap is not the grid copy's, so this "
                  "share does not say how much of that gap residency holds")
    else:
        print(f"no more programs fit than rung 6's {k6}, or no gap is left: nothing to close")
    # the tail: the copy on the tile at s = s_whole (whole waves) against its own y.copy_(x),
    # beside the same at SHAPE (a partial last wave), both with the spread of their calls
    x_w = torch.randn(res.s_whole, *x.shape[1:], device=x.device, dtype=x.dtype)
    y_w = torch.empty_like(x_w)
    p_w = copy_on_tile(x_w, y_w)
    assert torch.equal(y_w, x_w)
    whole_waves = math.ceil(res.waves)
    if (p_w.block_s, p_w.block_h, p_w.chunk, p_w.num_warps) == \
            (p.block_s, p.block_h, p.chunk, p.num_warps) \
            and math.prod(p_w.grid) == whole_waves * res.sm_count * res.k_tile:
        whole = against_copy(timed(lambda: y_w.copy_(x_w)), timed(lambda: copy_on_tile(x_w, y_w)))
        print(f"the tail: the copy on the tile, as a fraction of its own y.copy_(x) (from the "
              f"calls' 20 %-80 % quantiles): s = {res.s_whole} ({whole_waves} whole waves) "
              f"{whole[0]:.3f} ({whole[1]:.3f}-{whole[2]:.3f}), s = {SHAPE[0]} ({res.waves:.2f}) "
              f"{on_grid[0]:.3f} ({on_grid[1]:.3f}-{on_grid[2]:.3f}): " + (
                  "the ranges overlap, so this run does not tell the tail from the spread"
                  if whole[1] <= on_grid[2] and on_grid[1] <= whole[2] else
                  "no faster in whole waves" if whole[0] <= on_grid[0] else "whole waves close "
                  f"{(whole[0] - on_grid[0]) / max(1 - on_grid[0], 1e-9):.0%} of the gap"))
    else:
        print(f"the tail: s = {res.s_whole} is planned on another tile or grid ({p_w}): not timed")
    del x_w, y_w
    # Exercise 1's two kernels, at the programs an SM their registers allow on this tile
    both, ex1_live = exercise_1 or (None, None)
    k_ex1 = {n: k for n, (_, _, w, k) in (both or {}).items() if w == p.num_warps}
    if ex1_live and len(k_ex1) == 2 and max(k_ex1.values()) <= k_max:
        k_sol, k_fin = k_ex1["worked solution"], k_ex1["ropelib's finished kernel"]
        gap = ex1_live["ropelib's finished kernel"] - ex1_live["worked solution"]
        res_gap = by_k[k_fin] - by_k[k_sol]
        print(f"Exercise 1: the worked solution holds {k_sol} programs an SM, the finished "
              f"kernel {k_fin}; the copy at those k: {by_k[k_sol]:.3f} and {by_k[k_fin]:.3f}, "
              f"{res_gap:+.3f} of a copy against the two kernels' {gap:+.3f}: "
              + ("the two kernels are level here" if abs(gap) <= 0.01 else
                 "residency does not explain it" if res_gap * gap <= 0 else
                 f"residency accounts for {min(res_gap / gap, 1):.0%} of it"))
    return by_k
