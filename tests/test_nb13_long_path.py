"""ropelib.course.nb13_long_path: which thread, warp and program of puzzle 5's launch holds each
angle, from a #ttg.blocked layout, and how many warps hold one on libdevice's long path
(|angle| >= 105,615). Hand-built layouts and positions where the answer is known, then the
kernel compiled for sm_90 with the positions notebook 13 and the committed CSV time."""
import collections

import pytest
import torch

from ropelib.bench import compare
from ropelib.course import measured
from ropelib.course import nb13_long_path as lp
from ropelib.course import puzzles as pz

# the layout Triton gives puzzle 5's [16, 64] angle tile at 4 warps (sm_90)
CHOSEN = {"sizePerThread": [1, 8], "threadsPerWarp": [4, 8], "warpsPerCTA": [4, 1],
          "order": [1, 0]}


def _inv(half=64):
    return 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))


def test_each_thread_holds_eight_neighbouring_pairs_of_one_row():
    held = lp.holders([16, 64], CHOSEN)
    # every angle of the tile exactly once, 8 a thread, 128 threads
    assert sorted(at for *_, at in held) == [(r, c) for r in range(16) for c in range(64)]
    per_thread = collections.Counter((w, lane) for w, lane, _, _ in held)
    assert len(per_thread) == 128 and set(per_thread.values()) == {8}
    for w, lane, slot, (r, c) in held:     # worked out by hand from the four fields
        assert r == 4 * w + lane // 8 and c == 8 * (lane % 8) + slot


def test_order_says_which_axis_the_lane_index_walks_first():
    fields = dict(CHOSEN, threadsPerWarp=[8, 4], order=[0, 1], sizePerThread=[1, 4],
                  warpsPerCTA=[2, 2])
    held = {(w, lane, s): at for w, lane, s, at in lp.holders([16, 32], fields)}
    assert len(held) == 16 * 32 and len(set(held.values())) == 16 * 32
    assert held[(0, 1, 0)] == (1, 0)              # lane 1: the next row (rows walk first)
    assert held[(0, 8, 0)] == (0, 4)              # lane 8: the next 4 columns
    assert held[(1, 0, 0)] == (8, 0)              # warp 1: the rows after warp 0's 8
    assert held[(2, 0, 3)] == (0, 19)             # warp 2: columns 16.., its 4th element


def test_a_larger_tile_repeats_the_layout_and_a_smaller_one_wraps():
    big = lp.holders([32, 64], CHOSEN)            # 2 repetitions: 16 slots a thread
    assert sorted(at for *_, at in big) == [(r, c) for r in range(32) for c in range(64)]
    assert max(s for _, _, s, _ in big) == 15
    small = collections.Counter(at for *_, at in lp.holders([8, 64], CHOSEN))
    assert len(small) == 8 * 64 and set(small.values()) == {2}   # warps 0 and 2 share rows 0-3


def test_hand_placed_long_angles_are_counted_where_they_sit():
    pos = torch.zeros(32, dtype=torch.int32)      # 2 programs of 16 rows
    pos[5] = 110_000     # pair 0 only (pair 1: 110,000 x 0.866 = 95,256): program 0, warp 1
    pos[31] = 130_000    # pairs 0 and 1 (112,575): program 1, warp 3, two slots of one thread
    got = lp.count(pos, _inv(), block_rows=16, shape=[16, 64], fields=CHOSEN)
    assert got.programs == 2
    assert got.rows == (2, 32) and got.angles == (3, 32 * 64)
    assert got.threads == (2, 256) and got.warps == (2, 8)
    assert got.warp_slots == (3, 64)
    assert got.lanes_in_long_warps == {1: 2}
    pos[4] = 105_615     # the threshold itself is on the long path; row 4 is warp 1 too
    got = lp.count(pos, _inv(), block_rows=16, shape=[16, 64], fields=CHOSEN)
    assert got.rows[0] == 3 and got.warps[0] == 2 and got.lanes_in_long_warps == {1: 1, 2: 1}
    pos[4] = 105_614
    assert lp.count(pos, _inv(), block_rows=16, shape=[16, 64], fields=CHOSEN).rows[0] == 2


def test_a_layout_that_puts_a_row_in_every_warp_spreads_one_long_row_over_them():
    pos = torch.zeros(16, dtype=torch.int32)
    pos[0] = 120_000
    flat = dict(CHOSEN, threadsPerWarp=[16, 2], sizePerThread=[1, 8], warpsPerCTA=[1, 4])
    got = lp.count(pos, _inv(), block_rows=16, shape=[16, 64], fields=flat)
    assert got.warps == (1, 4)                    # pairs 0-15: warp 0 only
    split = dict(CHOSEN, threadsPerWarp=[32, 1], sizePerThread=[1, 1], warpsPerCTA=[1, 4],
                 order=[0, 1])
    ones = torch.ones(64)                         # every pair at 120,000: every warp
    got = lp.count(pos, ones, block_rows=16, shape=[16, 64], fields=split)
    assert got.warps == (4, 4) and got.angles == (64, 1024)


def test_rows_past_the_end_hold_position_zero():
    pos = torch.full((20,), 120_000, dtype=torch.int32)       # 2 programs, 12 rows masked
    got = lp.count(pos, _inv(), block_rows=16, shape=[16, 64], fields=CHOSEN)
    assert got.rows == (20, 20) and got.warps == (5, 8)       # 4 + rows 16-19's warp


def test_angle_layout_reads_the_tile_sin_and_cos_take():
    ttgir = ("#blocked = #ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [8, 4], "
             "warpsPerCTA = [2, 1], order = [1, 0]}>\n"
             "#blocked1 = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [4, 8], "
             "warpsPerCTA = [4, 1], order = [1, 0]}>\n"
             "    %0 = math.cos %theta_19 : tensor<16x64xf32, #blocked1> loc(#loc13)\n")
    shape, fields, _ = lp.angle_layout(ttgir)
    assert shape == [16, 64] and fields == CHOSEN
    with pytest.raises(ValueError):
        lp.angle_layout("#blocked = #ttg.blocked<{sizePerThread = [1]}>\n")


def test_puzzle_5s_timed_launch_compiled_for_sm_90():
    from ropelib.course import load_schedule
    bf16_, i32_, f32_ = (torch.empty(16, dtype=t)
                         for t in (torch.bfloat16, torch.int32, torch.float32))
    code = load_schedule.schedule(
        pz.solution_long_context_kernel, dict(x_ptr=bf16_, freqs_ptr=bf16_, pos_ptr=i32_,
                                              inv_freq_ptr=f32_, y_ptr=bf16_, N_ROWS=1 << 17,
                                              HALF=64, BLOCK_ROWS=16), num_warps=4)
    shape, fields, _ = lp.angle_layout(code["ttgir"])
    assert shape == [16, 64] and fields == CHOSEN
    big = pz.PUZZLES["long_context"].big("cpu")
    _, _, pos, inv, _, n = big.args
    got = lp.count(pos, inv, block_rows=big.constexprs["BLOCK_ROWS"], shape=shape, fields=fields)
    timed = next(r for r in compare.read_csv(measured.RESULTS / "puzzle_fractions-nvidia-h200.csv")
                 if r["puzzle"] == 5 and "the timed case" in r["variant"])
    assert got.rows == (timed["slow_rows"], timed["rows"]) == (25457, 131072)
    assert got.warps == (6365, 32768) and got.threads == (25457, 32768 * 32)
    assert got.lanes_in_long_warps == {1: 1, 4: 6364}
    low = lp.count((pos % 105000).to(torch.int32), inv, block_rows=16, shape=shape,
                   fields=fields)
    assert low.warps == (0, 32768) and low.angles[0] == 0
