"""ropelib.course.measured.te_profiles: notebook 04's two Nsight Compute profiles of TE's fused
RoPE beside the Triton kernels, read per kernel (section 5.5 and the appendix)."""
from ropelib.course import measured


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
