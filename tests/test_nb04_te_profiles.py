"""ropelib.course.measured.te_profiles: notebook 04's two Nsight Compute profiles of TE's fused
RoPE beside the Triton kernels, read per kernel (section 5.4 and the appendix), and the
numbers notebook 04's prose takes from the committed profiles that its cells do not assert."""
from ropelib.course import measured
from ropelib.course.kernels import batch_reuse, naive


def test_te_profiles_reads_both_runs_per_kernel():
    locked, free, metas = measured.te_profiles()
    assert list(locked) == list(free) == list(measured.TE_PROFILED)
    assert "--clock-control none" in metas["free"]["what"]
    assert "clock-control" not in metas["locked"]["what"]
    te, grid, copy = free["te_fused"], free["sh_loop_b"], free["copy"]
    assert (round(te["issue_us"], 1), round(copy["us"], 1)) == (159.6, 125.7)
    assert round(te["issue_share"], 2) == 0.66 and round(grid["issue_share"], 2) == 0.36
    assert (round(locked["te_fused"]["integer"], 1), round(locked["sh_loop_b"]["integer"], 1)) \
        == (17.7, 5.7)
    # both runs execute the same instructions, kernel by kernel
    parts = measured.ncu_device()["num_schedulers_per_multiprocessor"] \
        * measured.ncu_device()["multiprocessor_count"]
    assert all(free[n]["warp_inst"] == locked[n]["issue_floor"] * parts for n in free)


def test_te_block_is_eight_warps_as_section_3_and_a1_count():
    # section 3 and A.1: "one in each of the block's 8 warps", TE's block 32 x 8 threads, grid
    # (s, b); the registers count 8 * B * D = 8,192 (cos, sin) pairs a position
    te = measured.mechanism("s4096-b8", kind="mechanism-te")["te_fused"]
    assert te["num_warps"] == 8 and te["programs"] == 4096 * 8
    assert te["num_warps"] * 8 * 128 == 8192


def test_the_b1_table_is_requested_once_per_head_and_read_8_times():
    # A.5: at s = 32768, b = 1 both grids request the 16 MiB table 32 times (once per head);
    # 16 MiB of x and y lie between two heads' requests in the grid's order; DRAM reads 8 tables
    S, B, H, D = 32768, 1, 32, 128
    table = S * D * 4
    assert table == 16 * 2**20 and S * B * D * 2 * 2 == 16 * 2**20
    assert naive.angle_bytes_requested(S, B, H, D) == batch_reuse.angle_bytes_requested(
        S, B, H, D) == H * table
    grid = measured.mechanism("s32768-b1")["batch_reuse"]
    assert (grid["seq_len"], grid["batch"], grid["heads"], grid["head_dim"]) == (S, B, H, D)
    beyond_x = grid["ncu_dram_read_bytes"] - grid["elements"] * 2
    assert round(beyond_x / table, 1) == 8.0 and round(beyond_x / table) * 4 == H
