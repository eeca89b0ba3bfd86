"""ropelib.course.measured reads the committed H200 results the notebooks explain, and derives
only what follows from their columns."""
import math
import re

import pytest

from ropelib.bench import compare
from ropelib.course import measured


def test_every_file_the_notebooks_read_is_an_h200_measurement():
    for kind in ("mechanism", "ablation", "ladder", "generations", "floor", "two_pass",
                 "flat_pass_probe", "flat_hints_probe"):
        meta, rows = measured.load(kind)
        assert meta["gpu"] == "NVIDIA H200" and rows, kind
    for kind in ("floor", "two_pass"):      # the H100's runs (the floor table's second column)
        meta, _ = measured.load(kind, "nvidia-h100-80gb-hbm3")
        assert "H100" in meta["gpu"], kind


def test_where_names_the_gpu_and_a_date_only_when_there_is_one():
    meta, _ = measured.load("two_pass")
    assert measured.where(meta) == "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-12-02"
    meta, _ = measured.load("flat_pass_probe")          # the probes' headers carry no date
    assert measured.where(meta) == "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0"


@pytest.mark.parametrize("gpu", ["nvidia-h200", "nvidia-h100-80gb-hbm3"])
def test_two_pass_rows_are_ratios_to_a_copy_of_the_same_run(gpu):
    tp = measured.two_pass(gpu)
    assert {p for _, p in tp} == {"forward", "fwd+bwd"}
    cases = {c for c, _ in tp}
    assert "bf16 sbhd 1 GiB s16k b8" in cases and "bf16 sbhd 128 MiB s16k b1" in cases
    for case in cases:
        fwd, both = tp[(case, "forward")], tp[(case, "fwd+bwd")]
        assert "copy" in fwd and "copy" not in both and "pre-pass alone" not in both, case
        copy = fwd["copy"]["ms"]
        for pass_, copies, rows in (("forward", 1, fwd), ("fwd+bwd", 2, both)):
            for provider, r in rows.items():
                if r["ms"] < 0.1:       # ms is written to 5 decimals: too coarse to recompute
                    continue
                assert math.isclose(copies * copy / r["ms"], r["ratio_to_copy"], rel_tol=2e-3), \
                    (case, pass_, provider)


def test_probes_are_keyed_by_case_then_provider():
    fp = measured.probe("flat_pass_probe")
    assert set(fp) == {"bf16 sbhd 1 GiB s16k b8", "bf16 bshd 256 MiB s4k b8", "fp32 sbhd 2 GiB s16k b8"}
    tiles = {p for p in fp["bf16 sbhd 1 GiB s16k b8"] if p.startswith("flat ")}
    assert tiles == {f"flat x{e} w{w} keep={k}" for e in (1024, 2048, 4096) for w in (4, 8)
                     for k in (0, 1)}
    hints = measured.probe("flat_hints_probe")
    for case, rows in hints.items():
        assert {"copy", "torch.compile", "ropelib.apply_rope"} <= set(rows), case
        assert sum(p.startswith("even=") for p in rows) == 8, case
        assert rows["copy"]["ratio_to_copy"] == 1.0


def test_a_missing_file_says_what_measures_it(tmp_path, monkeypatch):
    monkeypatch.setattr(measured, "RESULTS", tmp_path)
    with pytest.raises(FileNotFoundError, match="benchmarks/ladder.py"):
        measured.load("ladder")
    (tmp_path / "ladder-nvidia-h200.csv").write_text("# gpu: none\ncase,ms\na,1\n")
    with pytest.raises(ValueError, match="no GPU"):
        measured.load("ladder")


@pytest.mark.parametrize("grid, batch, steps", [("65536", 8, 1), ("4096x32", 8, 8),
                                                ("4096x32x8", 8, 1), ("16x1x64", 64, 1),
                                                ("16384x1x1", 3, 3), ("10x1x2", 3, 2)])
def test_steps_follow_the_grid(grid, batch, steps):
    assert measured.steps({"grid": grid, "batch": batch}) == steps


def test_derived_columns_by_hand():
    mech = measured.mechanism("s4096-b8")
    naive, reuse, copy = mech["naive"], mech["batch_reuse"], mech["copy"]
    # the naive kernel: one 128-feature bf16 row of x per one-warp program
    assert naive["steps"] == 1 and naive["x_bytes_per_warp_step"] == 256
    # batch-reuse: the same row, 8 times per program
    assert reuse["steps"] == 8 and reuse["x_bytes_per_program"] == 8 * 256
    assert reuse["x_bytes_per_warp_step"] == 256
    # the copy: 2048 elements per 4-warp program, no loop
    assert copy["x_bytes_per_warp_step"] == 2048 * 2 / 4
    for r in (naive, reuse, copy):
        want = r["ncu_achieved_occupancy_pct"] / 100 * 64 * r["x_bytes_per_warp_step"] / 1024
        assert math.isclose(r["x_kib_per_sm"], want)
        assert math.isclose(r["us"] * 1e3, r["ncu_duration_ns"])


def test_mechanism_and_timings_cover_the_same_variants():
    mech = measured.mechanism("s4096-b8")
    abl = measured.timings("ablation", "s4096-b8")
    lad = measured.timings("ladder", "s4096-b8")
    ablation_rows = {v for v in abl if v not in ("copy", "te_fused") and not v.startswith("ropelib")}
    assert ablation_rows <= set(mech)
    assert {p for p in lad if p not in ("copy",)} <= set(mech)
    with pytest.raises(ValueError):
        measured.mechanism("no-such-case")


def test_table_names_what_it_shows():
    text = measured.table([{"variant": "naive", "us": 634.7}], [("kernel", "variant", ""),
                                                                ("time us", "us", ".0f")])
    assert "naive" in text and "635" in text


def test_an_ncu_table_starts_at_its_header(tmp_path):
    """Both of ncu's pages begin at the header row that starts with "ID"; what ncu and the
    profiled program printed before it is left out, and a file with no table is refused."""
    text = ('==PROF== Connected to process 1\ncheck: ran\n"ID","Kernel Name","Metric Name",'
            '"Metric Value"\n"0","k","gpu__time_duration.sum","1,234"\n')
    assert compare.ncu_table(text)[0].startswith('"ID"') and len(compare.ncu_table(text)) == 2
    assert compare.ncu_table("==PROF== Disconnected\n") == []
    path = tmp_path / "ncu.csv"
    path.write_text(text)
    assert measured.ncu_kernels(path) == [
        {"id": 0, "kernel": "k", "metrics": {"gpu__time_duration.sum": 1234.0}, "instances": {}}]
    path.write_text("==PROF== Disconnected\n")
    with pytest.raises(ValueError, match="no Nsight Compute table"):
        measured.ncu_kernels(path)


def test_ncu_kernels_reads_the_committed_tables_probe():
    # notebook 10's Nsight Compute table: kernels in launch order, values without separators
    path = measured.RESULTS / f"tables_read_ncu-{measured.GPU}-20261129-1425-q-then-k.csv"
    kernels = measured.ncu_kernels(path)
    assert [k["id"] for k in kernels] == [0, 1, 2, 3]
    assert kernels[0]["kernel"] == "_rope_rows_kernel"
    assert kernels[0]["metrics"]["dram__bytes_read.sum"] == 335_491_840
    assert kernels[0]["metrics"]["gpu__time_duration.sum"] == 186_944


def test_ncu_kernels_reads_instanced_metrics(tmp_path):
    """`--print-metric-instances details` prints "total (name: value; ...)": the total stays a
    metric, the instances are kept by name; ncu's "n/a" reads as None."""
    text = ('"ID","Kernel Name","Metric Name","Metric Value"\n'
            '"0","k","sass__inst_executed_per_opcode","3,072 (FFMA: 2,048; SEL: 1,024)"\n'
            '"0","k","sass__thread_inst_executed_per_opcode","n/a"\n')
    path = tmp_path / "ops.csv"
    path.write_text(text)
    (k,) = measured.ncu_kernels(path)
    assert k["metrics"] == {"sass__inst_executed_per_opcode": 3072.0,
                            "sass__thread_inst_executed_per_opcode": None}
    assert k["instances"] == {"sass__inst_executed_per_opcode": {"FFMA": 2048.0, "SEL": 1024.0}}


def test_the_committed_opcode_profile_adds_up():
    # notebook 05's profile by opcode: the instances of each kernel sum to its total
    kernels = measured.ncu_kernels(measured.RESULTS / f"ladder_opcodes_per_opcode-{measured.GPU}.csv")
    assert [k["kernel"] for k in kernels][2:] == ["_ladder_final_kernel", "_rope_kernel"]
    for k in kernels:
        ops = k["instances"]["sass__inst_executed_per_opcode"]
        assert sum(ops.values()) == k["metrics"]["sass__inst_executed_per_opcode"]


FWDBWD_LOG = """\

== 64 MiB bf16 sbhd: copy 33.5 us, copy pair 66.8 us (graphs)
ropelib        fwd graph 36.6 us (36.5-36.6), fwdbwd graph 74.4 us (74.2-74.4)
         31.7 us  _rope_rows_kernel

case                 provider       fwd/copy bwd/copy f+b/pair enqueue us  eager us f+b graph us
64 MiB bf16 sbhd     ropelib           0.914    0.885    0.897      395.6     300.2         74.4
64 MiB bf16 sbhd     te_fused              -        -        -      155.7     135.9            -
"""


def test_fwdbwd_log_reads_the_final_table_and_each_cases_copies(tmp_path):
    log = tmp_path / "mid_fwdbwd.log"
    log.write_text(FWDBWD_LOG)
    rows = measured.fwdbwd_log(log)
    assert list(rows) == [("64 MiB bf16 sbhd", "ropelib"), ("64 MiB bf16 sbhd", "te_fused")]
    assert rows["64 MiB bf16 sbhd", "ropelib"] == dict(
        fwd_ratio=0.914, bwd_ratio=0.885, fwdbwd_ratio=0.897, enqueue_us=395.6, eager_us=300.2,
        fwdbwd_graph_us=74.4, copy_us=33.5, copy_pair_us=66.8)
    te = rows["64 MiB bf16 sbhd", "te_fused"]
    assert te["fwd_ratio"] is None and te["enqueue_us"] == 155.7 and te["copy_pair_us"] == 66.8
    log.write_text(FWDBWD_LOG.split("case ")[0])
    with pytest.raises(ValueError, match="no final table"):
        measured.fwdbwd_log(log)


def test_the_committed_fwdbwd_log_agrees_with_itself():
    rows = measured.fwdbwd_log(measured.RESULTS / "mid_fwdbwd-nvidia-h200-20261201-1433.log")
    assert {c for c, _ in rows} == {"64 MiB bf16 sbhd", "64 MiB bf16 bshd", "64 MiB bf16 thd",
                                    "256 MiB bf16 bshd"}
    for key, r in rows.items():
        # the ratio column is the case's two copies over the replayed forward+backward
        assert math.isclose(r["copy_pair_us"] / r["fwdbwd_graph_us"], r["fwdbwd_ratio"],
                            abs_tol=2e-3), key


VARIANTS_LOG = """\
64 MiB bf16 sbhd     early False, 1024 a program fwd    36.7 us (0.918)  fwd+bwd    74.4 us (0.900)
64 MiB bf16 sbhd     early True, 256 a program fwd    35.5 us (0.948)  fwd+bwd    70.7 us (0.948)

case                 variant                    fwd us fwd/copy   f+b us f+b/pair
64 MiB bf16 sbhd     early False, 1024 a program     36.7    0.918     74.4    0.900
64 MiB bf16 sbhd     early True, 256 a program     35.5    0.948     70.7    0.948
1 GiB bf16 sbhd      early True, 256 a program    519.9    1.522   1039.2    1.523
"""


def test_fwdbwd_variants_log_reads_the_final_table(tmp_path):
    log = tmp_path / "mid_fwdbwd_variants.log"
    log.write_text(VARIANTS_LOG)
    rows = measured.fwdbwd_variants_log(log)
    assert list(rows) == [("64 MiB bf16 sbhd", "early False, 1024 a program"),
                          ("64 MiB bf16 sbhd", "early True, 256 a program"),
                          ("1 GiB bf16 sbhd", "early True, 256 a program")]
    assert rows["64 MiB bf16 sbhd", "early True, 256 a program"] == dict(
        early=True, per_program=256, fwd_us=35.5, fwd_ratio=0.948, fwdbwd_us=70.7,
        fwdbwd_ratio=0.948)
    old = rows["64 MiB bf16 sbhd", "early False, 1024 a program"]
    assert old["early"] is False and old["per_program"] == 1024 and old["fwdbwd_us"] == 74.4
    assert rows["1 GiB bf16 sbhd", "early True, 256 a program"]["fwdbwd_us"] == 1039.2
    log.write_text(VARIANTS_LOG.split("case ")[0])         # the progress lines alone
    with pytest.raises(ValueError, match="no final table"):
        measured.fwdbwd_variants_log(log)
    log.write_text(VARIANTS_LOG.split("64 MiB bf16 sbhd     early False, 1024 a program  ")[0])
    with pytest.raises(ValueError, match="no rows"):
        measured.fwdbwd_variants_log(log)


def test_the_committed_variants_log_agrees_with_its_progress_lines():
    path = measured.RESULTS / "mid_fwdbwd_variants-nvidia-h200-20261201-1444.log"
    rows = measured.fwdbwd_variants_log(path)
    cases = ("64 MiB bf16 sbhd", "64 MiB bf16 bshd", "64 MiB bf16 thd", "256 MiB bf16 bshd",
             "1 GiB bf16 sbhd")
    variants = {f"early {e}, {n} a program" for e in (False, True) for n in (1024, 256)}
    assert set(rows) == {(c, v) for c in cases for v in variants}
    # each row of the final table repeats the progress line the probe printed for it
    progress = re.compile(r"(.+?)\s+(early \w+, \d+ a program) fwd\s+([\d.]+) us \(([\d.]+)\)"
                          r"\s+fwd\+bwd\s+([\d.]+) us \(([\d.]+)\)")
    seen = 0
    for line in path.read_text().splitlines():
        if m := progress.fullmatch(line.strip()):
            r = rows[m[1], m[2]]
            assert (r["fwd_us"], r["fwd_ratio"], r["fwdbwd_us"], r["fwdbwd_ratio"]) == tuple(
                float(v) for v in m.groups()[2:]), line
            seen += 1
    assert seen == len(rows)


def test_floor_run_date_names_the_run_that_measured_a_part():
    from ropelib.bench import floor as floor_suite
    later = floor_suite.LATER_RUN
    meta = {"date": "2026-01-01T00:00:00Z",
            "replaced_rows": floor_suite.REPLACEMENT_SEPARATOR.join((
                f"decode sbhd, decode bshd{later}date 2026-01-02T10:00:00Z, torch 2; its timing: x",
                f"decode bshd{later}date 2026-01-03T11:00:00Z, torch 2; its timing: y"))}
    assert measured.floor_run_date(meta, "decode sbhd") == "2026-01-02T10:00:00Z"
    assert measured.floor_run_date(meta, "decode bshd") == "2026-01-03T11:00:00Z"   # the latest
    assert measured.floor_run_date(meta, "64 MiB bf16 sbhd") == "2026-01-01T00:00:00Z"
    assert measured.floor_run_date({"date": "d"}, "decode sbhd") == "d"
    meta, _ = measured.load("floor")    # the committed run: parts it did not measure again
    replaced = {name for entry in floor_suite.replacements(meta)
                for name in entry.partition(later)[0].split(", ")}
    for part in ("decode sbhd", "64 MiB bf16 sbhd"):
        if part not in replaced:
            assert measured.floor_run_date(meta, part) == meta["date"], part
    for part in replaced:               # and those it did: the later run's date
        assert measured.floor_run_date(meta, part) > meta["date"], part


def test_07_route_logs_time_the_route_settings_they_say():
    """Notebook 07 reads the logs of its section 7.5 (the mid_fwdbwd log again in appendix A.5)
    and the floor run's decode rows as ropelib's two-pass route with its pre-pass of 256 entries
    a program and its early launch, and without its half-rows read: every one of those files is
    dated from the variants log, which times those settings, on; the sweeps and host probes
    before it; the half-rows probe after all."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"

    def when(path):
        return measured.committed_when(path)[1]

    settings_on = [results / "floor-nvidia-h200.csv",
                   results / "mid_fwdbwd_variants-nvidia-h200-20261201-1444.log",
                   results / "mid_fwdbwd-nvidia-h200-20261201-2307.log"]
    before = [results / "seed_sweeps.csv", root / "figures" / "02-unfused-kernels.csv",
              results / "host-profile-nvidia-h200-20261201.txt",
              results / "autograd_host-nvidia-h200-20261130-1352.log",
              results / "autograd_host-nvidia-h200-20261130-1436.log"]
    half_rows = results / "half_rows_probe-nvidia-h200-20261202-0822.csv"
    assert [when(p) for p in settings_on[1:]] == ["2026-12-01 14:44", "2026-12-01 23:07"]
    assert all(when(p) >= "2026-12-01 14:44" for p in settings_on)
    assert all(when(p) < "2026-12-01 14:44" for p in before if when(p))
    assert all(when(p) < when(half_rows) for p in settings_on + before if when(p))


def test_committed_when_reads_the_header_else_the_name(tmp_path):
    """A committed result's (GPU, date): a CSV's header wins; a log's name gives the day and,
    where it has one, the minute; a name without a date gives no date."""
    csv = tmp_path / "floor-nvidia-h200-20250101.csv"
    csv.write_text("# gpu: nvidia-h200\n# date: 2026-12-04T09:01:33Z\ncase,ms\nx,1\n")
    assert measured.committed_when(csv) == ("nvidia-h200", "2026-12-04 09:01")
    log = tmp_path / "dobench_gap-nvidia-h200-20261204-0901.log"
    log.write_text("# NVIDIA H200\n")
    assert measured.committed_when(log) == ("h200", "2026-12-04 09:01")
    assert measured.committed_when(tmp_path / "x-nvidia-h100-20261130.log")[1] == "2026-11-30"
    assert measured.committed_when(tmp_path / "te_ncu-nvidia-h200.csv.log")[1] == ""


def test_qkv_clock_log_reads_every_variant_and_the_power_limit():
    logs = sorted(measured.RESULTS.glob("qkv_clock-*.log"))
    assert logs, "benchmarks/results holds no qkv_clock log"
    rows, limit = measured.qkv_clock_log(logs[-1])
    assert limit and limit > 0
    for tokens, by_variant in rows.items():
        assert set(by_variant) == {"cublas", "unfused", "fused, angles", "fused, table",
                                   "bare GEMM"}, tokens
        for r in by_variant.values():
            # ms x MHz is the cycles a call took, as the probe prints it (rounded there)
            assert abs(r["ms"] * r["mhz"] / 1e3 - r["mcycles"]) < 0.02 * r["mcycles"]
            assert 0 <= r["power_capped"] <= 1 and 0 <= r["hw_slowdown"] <= 1


def test_host_by_size_log_reads_the_final_table():
    from ropelib.course import measured
    rows = measured.host_by_size_log(
        measured.RESULTS / "host_by_size-nvidia-h200-20261204-1600.log")
    assert len(rows) == 40
    assert rows["decode s1 b64 sbhd", "ropelib"] == 203.7
    assert rows["decode s1 b64 sbhd", "te_fused, one thread"] == 73.9
    assert rows["decode s1 b64 sbhd", "ropelib: in launches"] == 46.7


def test_loads_in_flight_need_is_notebook_05s():
    """Little's law's need that notebooks 03 and 05 state: W_read x idle latency per SM."""
    need = measured.loads_in_flight_need()
    assert need["sms"] == 132 and round(need["latency_ns"], -1) == 350
    assert round(need["w_read"] / 1e12, 2) == 2.15 and round(need["kib_per_sm"], 1) == 5.6
    assert need["kib_per_sm"] == need["w_read"] / need["sms"] * need["latency_ns"] * 1e-9 / 1024
