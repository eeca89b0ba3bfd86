"""The benchmarks behind the course's new measurements run their setup and kernels on the CPU
(Triton's interpreter, small sizes): notebook 03's program cost, notebook 13's puzzle variants
and notebook 10's profiled kernels, read from the notebook's own source."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from loading import load_file  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def benchmark():
    return lambda name: load_file(name, ROOT / "benchmarks" / f"{name}.py")


def test_program_cost_kernels_do_what_they_say(benchmark):
    cost = benchmark("program_cost")
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    y = torch.zeros_like(x)
    cost._empty_kernel[(5,)](x)
    cost._one_row_kernel[(5,)](x, y, D=128)
    assert torch.equal(x, y)                 # each program moved its row


def test_puzzle_variants_change_one_thing(benchmark):
    fr = benchmark("puzzle_fractions")
    five = list(fr.puzzle5_cases("cpu"))
    timed, low, moved = (row for row, _ in five)
    (_, _, args_timed, _), (_, _, args_low, _) = five[0][1], five[1][1]
    # the same kernel on the same tensors; only the positions differ, all below the long path
    assert timed["nbytes"] == low["nbytes"] and args_timed[0] is args_low[0]
    assert int(args_low[2].max()) < fr.SLOW_PATH_FROM <= int(args_timed[2].max())
    assert timed["slow_rows"] == int((args_timed[2] >= fr.SLOW_PATH_FROM).sum()) == 25457
    # the third row times the same launch against a copy of the bytes it moves: no angle table
    table = args_timed[1]
    assert moved["nbytes"] == timed["nbytes"] - table.numel() * table.element_size()
    copy = fr.pz.copy_of(64, "cpu")          # the yardstick: 32 bytes read, 32 written
    copy()
    nine = list(fr.puzzle9_cases("cpu"))
    assert len(nine) == 6 and len({row["nbytes"] for row, _ in nine}) == 1
    for row, (_, grid, args, const) in nine:
        S = args[4]
        assert grid == (-(-S // row["block"]),) and const["BLOCK_S"] == row["block"]
        assert const["num_warps"] == row["num_warps"]


def test_notebook_10_kernels_profiled_as_the_notebook_defines_them(benchmark, capsys):
    probe = benchmark("mrope_angles_ncu")
    kernel = probe.notebook_kernels()
    assert kernel.fn.__name__ == "mrope_per_head_kernel"
    assert probe.main(["--check"]) == 0
    assert "the three launches agree" in capsys.readouterr().out
    assert probe.main(["--metrics"]) == 0          # the cycles notebook 10 reads, and the stalls
    listed = capsys.readouterr().out.strip().split(",")
    assert {"gpc__cycles_elapsed.max", "sm__cycles_active.avg", "smsp__inst_executed.sum"} <= set(listed)


def test_notebook_05_opcode_profile_launches_agree(benchmark, capsys):
    probe = benchmark("ladder_opcodes_ncu")
    assert probe.main(["--check"]) == 0
    assert "the four launches agree" in capsys.readouterr().out
    assert probe.main(["--metrics"]) == 0
    assert "smsp__inst_executed.sum" in capsys.readouterr().out


def test_decode_profile_launches_agree_and_name_their_stall_metrics(benchmark, capsys):
    probe = benchmark("decode_ncu")
    assert probe.main(["--check"]) == 0
    assert "ropelib, angles, ropelib, cos/sin agree" in capsys.readouterr().out
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    assert "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio" in listed
    assert len(listed) == len(set(listed))
    if not torch.cuda.is_available():
        assert probe.main([]) == 2              # profiling needs a GPU, and says so


def test_puzzle9_profile_launches_agree(benchmark, capsys):
    probe = benchmark("puzzle9_ncu")
    assert probe.main(["--check"]) == 0
    assert "the six tiles of puzzle 9's solution give the same output" in capsys.readouterr().out
    assert probe.main(["--metrics"]) == 0
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in \
        capsys.readouterr().out


def test_qkv_backward_with_dy_written_agrees_with_the_unfused_pipeline(benchmark, capsys):
    probe = benchmark("qkv_dy_probe")
    assert probe.main(["--dry-run"]) == 0      # each provider checked against the unfused one
    out = capsys.readouterr().out
    for name in ("fused, prologues", "fused, dY written, cuBLAS", "fused, dY written, Triton",
                 "unfused"):
        assert name in out
    assert probe.main(["--dry-run", "--qk-norm"]) == 0
    out = capsys.readouterr().out
    for name in ("fused, prologues, QK-norm", "fused, dY written, QK-norm", "unfused, QK-norm"):
        assert name in out


def test_qkv_backward_profile_checks_both_providers(benchmark, capsys):
    probe = benchmark("qkv_backward_profile")
    for norm, names in ((False, ("fused, dY written, cuBLAS", "unfused")),
                        (True, ("fused, dY written, QK-norm", "unfused, QK-norm"))):
        assert probe.main(["--dry-run"] + ["--qk-norm"] * norm) == 0
        out = capsys.readouterr().out
        assert all(f"{n}: checked" in out for n in names), out
        assert probe.main(["--dry-run", "--forward"] + ["--qk-norm"] * norm) == 0
        out = capsys.readouterr().out
        assert all(f"{n}: checked" in out for n in probe.FORWARD), out


def test_qkv_host_probe_runs_every_case(benchmark, capsys):
    probe = benchmark("qkv_host_probe")
    assert probe.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for who in ("fused", "unfused"):
        for what in ("forward, no_grad", "forward, with gradients", "forward+backward"):
            assert f"{who} {what}" in out
    assert "cProfile of 2 fused forwards" in out


def test_te_profile_launches_agree_and_list_their_metrics(benchmark, capsys):
    probe = benchmark("te_ncu")
    assert probe.main(["--check"]) == 0          # TE's kernel too where it is installed
    out = capsys.readouterr().out
    assert "sh_loop_b, heads_all_one_b, heads_all_one_b_table, copy agree" in out
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    assert "smsp__sass_inst_executed_op_global_ld.sum" in listed
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in listed
    assert len(listed) == len(set(listed))


def test_naive_warps_profile_launches_agree_and_list_their_metrics(benchmark, capsys):
    probe = benchmark("naive_warps_ncu")
    assert probe.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "naive, 1 warps, naive, 2 warps, naive, 4 warps, naive, 8 warps, one row, 1 warps" in out
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    assert "smsp__inst_executed_pipe_xu.sum" in listed       # the sin/cos count
    assert len(listed) == len(set(listed))


def test_rows_profile_launches_agree_and_list_their_metrics(benchmark, capsys):
    # notebook 03's exercise 5: the worked kernel and notebook 04's at 1-8 rows, then the copy,
    # in the order notebook 03 reads the profile's kernels in
    probe = benchmark("rows_ncu")
    calls, _ = probe.launches("cpu")
    assert [label for label, _ in calls] == (
        [f"worked, {r} rows" for r in (1, 2, 4, 8)]
        + [f"notebook 04, {r} heads" for r in (1, 2, 4, 8)] + ["copy"])
    assert probe.main(["--check"]) == 0
    assert capsys.readouterr().out.startswith("check: worked, 1 rows")
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    for metric in ("smsp__issue_active.avg.per_cycle_active", "smsp__inst_executed.sum",
                   "sm__warps_active.avg.pct_of_peak_sustained_active", "gpu__time_duration.sum"):
        assert metric in listed                      # what notebook 03 reads
    assert len(listed) == len(set(listed))


def test_contiguous_profile_launches_agree_and_list_their_metrics(benchmark, capsys):
    # notebook 06's .contiguous() of a stride-0 gradient, then the fill it is compared with, in
    # the order notebook 06 reads the profile's kernels in
    probe = benchmark("contiguous_ncu")
    calls, (g_sum,) = probe.launches("cpu")
    assert [label for label, _ in calls] == ["expand -> contiguous", "fill"]
    assert g_sum.stride() == (0, 0, 0, 0)
    assert probe.main(["--check"]) == 0
    assert capsys.readouterr().out.startswith("check: expand -> contiguous, fill")
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    for metric in ("dram__bytes_write.sum", "gpu__time_duration.sum", "smsp__inst_executed.sum",
                   "smsp__sass_inst_executed_op_global_st.sum",
                   "sm__warps_active.avg.pct_of_peak_sustained_active"):
        assert metric in listed                      # what notebook 06 reads
    assert len(listed) == len(set(listed))


def test_metrics_nsight_compute_does_not_list_are_kept_only_if_launch_metrics(tmp_path, capsys,
                                                                             benchmark):
    # `ncu --query-metrics` lists counter metrics only; the launch's registers and occupancy
    # limits must survive the filter (they were dropped from the profiles before), an unknown
    # counter must not (it would fail the whole run)
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho 'Device GH100'\necho 'gpu__time_duration  Duration'\n"
                    "echo 'smsp__inst_executed  Warp instructions'\n")
    fake.chmod(0o755)
    kept = compare.known_metrics(("gpu__time_duration.sum", "smsp__no_such_counter.sum",
                                  "launch__registers_per_thread", "launch__no_such_thing",
                                  "sm__maximum_warps_per_active_cycle_pct"), str(fake))
    assert kept == ("gpu__time_duration.sum", "launch__registers_per_thread",
                    "sm__maximum_warps_per_active_cycle_pct")
    probe = benchmark("rows_ncu")
    assert probe.main(["--metrics", "--ncu", str(fake)]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    assert {"launch__registers_per_thread", "launch__occupancy_limit_registers",
            "sm__maximum_warps_per_active_cycle_pct", "smsp__inst_executed.sum"} <= set(listed)


def test_ladder_stalls_profile_every_rung_and_list_their_metrics(benchmark, capsys):
    probe = benchmark("ladder_stalls_ncu")
    calls, _ = probe.launches("cpu")
    from ropelib.course import ladder
    # per size: the copy, the seven rungs in the ladder's order, then the finished kernel
    assert [label.split(" ", 1)[1] for label, _ in calls[:9]] == ["copy", *ladder.NAMES, "finished"]
    assert probe.main(["--check"]) == 0
    assert "check: 18 launches agree" in capsys.readouterr().out
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in listed
    assert "lts__t_sector_op_read_hit_rate.pct" in listed
    assert len(listed) == len(set(listed))


def test_qk_norm_profile_checks_both_shapes_and_lists_its_metrics(benchmark, capsys):
    probe = benchmark("qk_norm_ncu")
    assert probe.main(["--check"]) == 0
    assert "check: b2 s8, b1 s16 agree (cpu)" in capsys.readouterr().out
    assert probe.main(["--metrics"]) == 0
    listed = capsys.readouterr().out.strip().split(",")
    assert "lts__t_sector_op_read_hit_rate.pct" in listed and len(listed) == len(set(listed))


def test_model_host_probe_parts_leave_ropelib_as_it_was(benchmark, capsys, tmp_path):
    """--parts times ropelib with its launches removed and with a trivial backward, patched only
    while each variant runs: afterwards ropelib's eager route is the one it was."""
    from ropelib import eager
    before = (eager.EagerLaunch.__dict__["__call__"], eager.Rotate.__dict__["backward"])
    probe = benchmark("model_host_probe")
    assert probe.main(["--dry-run", "--parts", "--out", str(tmp_path / "p.csv")]) == 0
    out = capsys.readouterr().out
    for name in ("| trivial Function |", "| ropelib, launches removed |",
                 "| ropelib, trivial backward, launches removed |"):
        assert name in out
    steps = {r["step"] for r in compare.read_csv(tmp_path / "p.csv")}
    assert steps == {"training", "training, device thread off"}
    assert (eager.EagerLaunch.__dict__["__call__"], eager.Rotate.__dict__["backward"]) == before
    assert torch.autograd.is_multithreading_enabled()


def test_model_host_probe_checks_every_provider_against_the_formula(benchmark, capsys, tmp_path):
    probe = benchmark("model_host_probe")
    assert probe.main(["--dry-run", "--out", str(tmp_path / "m.csv")]) == 0
    out = capsys.readouterr().out
    for name in ("| no RoPE |", "| PyTorch |", "| ropelib |", "| ropelib q+k |"):
        assert name in out
    rows = compare.read_csv(tmp_path / "m.csv")
    assert {(r["provider"], r["step"]) for r in rows} >= {("ropelib", "training"),
                                                          ("ropelib q+k", "inference")}
    assert all(r["us_per_layer_over_no_rope"] == 0 for r in rows if r["provider"] == "no RoPE")
    # a provider that rotates wrongly fails the check before anything is timed
    wrong = {"PyTorch": lambda q, k: (q * 1, k), "ropelib": lambda q, k: (-q, k)}
    model = probe.Layers(1, 8, 2, 1, 4, "cpu", torch.float32)
    with pytest.raises(AssertionError, match="ropelib"):
        probe.check(model, torch.randn(1, 2, 8), wrong)


def test_qkv_epilogue_select_dry_run_gives_the_same_outputs(benchmark, capsys, tmp_path):
    # the select candidate is built from the shipped file's text (its branch must still be there
    # to be replaced), gives the shipped outputs in every case, and is priced paired by round
    probe = benchmark("qkv_epilogue_select_ab")
    if torch.cuda.is_available():
        pytest.skip("the dry run is the interpreter's check; a GPU times the real shapes")
    out_csv = tmp_path / "select.csv"
    assert probe.main(["--dry-run", "--rounds", "1", "--out", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert out.count("select over branch, paired by round") == 3    # plain, QK-norm, training
    rows = compare.read_csv(out_csv)
    assert {r["variant"] for r in rows} == {"cublas", "branch (shipped)", "select",
                                            "GEMM, no epilogue"} and len(rows) == 12


def test_qkv_forward_rounds_dry_run_checks_every_variant(benchmark, capsys, tmp_path):
    # the forward's variants built and checked against one another at tiny shapes, one round in
    # a shuffled order, the epilogue priced paired by round, and every round's time kept
    probe = benchmark("qkv_forward_ab")
    if torch.cuda.is_available():
        pytest.skip("the dry run is the interpreter's check; a GPU times the real shapes")
    out_csv = tmp_path / "ab.csv"
    assert probe.main(["--dry-run", "--rounds", "1", "--seed", "3", "--out", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert out.count("the epilogue, paired by round") == 2          # plain and QK-norm
    rows = compare.read_csv(out_csv)
    variants = {r["variant"] for r in rows}
    assert {"cublas", "unfused", "pointer kernel", "TMA, two heads", "table, flag",
            "GEMM, no epilogue"} <= variants and len(rows) == 2 * len(variants)
    assert all(len(str(r["round_ms"]).split()) == 1 for r in rows)
    meta = compare.read_meta(out_csv)
    assert (meta["rounds_order"], meta["rounds_seed"]) == ("shuffled", "3")
    with pytest.raises(SystemExit, match="timing needs a CUDA GPU"):   # no timing on a CPU
        probe.main(["--rounds", "1"])
