"""benchmarks/l2_writeback_ncu.py (writing kernels between read-only sweeps, profiled with L2
left alone between kernels) and its reader, ropelib.course.measured.l2_writeback, which notebooks
04 and 10 use: the launches the probe makes are those the reader expects, and the reader pairs
each writer with the sweeps around it."""
import csv
import io

import pytest
from loading import load_file

from ropelib.course import measured

ROOT = measured.RESULTS.parents[1]


def _ncu_csv(kernels) -> str:
    """An `ncu --csv` details page: one row per kernel and metric, as Nsight Compute writes it."""
    out = io.StringIO()
    out.write("# gpu: TEST GPU\n# what: Nsight Compute (--cache-control none)\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
                "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name",
                "Metric Name", "Metric Unit", "Metric Value"])
    for i, (name, read, write, ns) in enumerate(kernels):
        for metric, unit, value in (("dram__bytes_read.sum", "byte", read),
                                    ("dram__bytes_write.sum", "byte", write),
                                    ("gpu__time_duration.sum", "ns", ns)):
            w.writerow([i, 1, "python3", "h", name, 1, 7, "(128, 1, 1)", "(1, 1, 1)", 0, "9.0",
                        "Command line profiler metrics", metric, unit, f"{value:,}"])
    return out.getvalue()


SWEEP = "void at::native::reduce_kernel<512, 1, ReduceOp<float, ...>>(T3)"


def test_the_probe_launches_what_the_reader_expects(capsys):
    probe = load_file("l2_writeback_ncu", ROOT / "benchmarks" / "l2_writeback_ncu.py")
    calls, extra = probe.launches("cpu")
    labels = [label for label, _ in calls]
    assert labels[0::2] == ["sweep"] * (len(measured.L2_WRITEBACK_WRITERS) + 1)
    assert [label.split()[0] for label in labels[1::2]] == [
        name for name, _ in measured.L2_WRITEBACK_WRITERS]
    assert probe.main(["--check"]) == 0
    assert capsys.readouterr().out.startswith("check: 9 launches (cpu): sweep, copy 16 MiB")
    assert probe.main(["--metrics"]) == 0
    assert capsys.readouterr().out.split() == [
        "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"]


def test_the_reader_pairs_each_writer_with_the_sweep_after_it(tmp_path, monkeypatch):
    mib = 2**20
    kernels = [(SWEEP, 2**30, 5 * mib, 400_000)]           # the sweep before: earlier dirt
    for name, stored in measured.L2_WRITEBACK_WRITERS:
        short = min(stored, 20) * mib
        kernel = "_copy_kernel" if name == "copy" else "_rope_tile_kernel"
        kernels += [(kernel, stored * mib, stored * mib - short, 90_000),
                    (SWEEP, 2**30, short, 400_000)]
    monkeypatch.setattr(measured, "RESULTS", tmp_path)
    (tmp_path / "l2_writeback_ncu-test-gpu.csv").write_text(_ncu_csv(kernels))
    meta, rows = measured.l2_writeback("test-gpu")
    assert meta["gpu"] == "TEST GPU"
    assert [(r["kernel"], r["stored_mib"]) for r in rows] == list(measured.L2_WRITEBACK_WRITERS)
    assert [r["short_mib"] for r in rows] == [16, 20, 20, 20]
    assert [r["after_mib"] for r in rows] == [16, 20, 20, 20]
    assert rows[0]["before_mib"] == 5 and rows[1]["before_mib"] == 16
    assert all(r["total"] == pytest.approx(1.0) for r in rows)
    assert rows[0]["us"] == pytest.approx(90.0)


def test_the_reader_refuses_a_profile_out_of_order(tmp_path, monkeypatch):
    kernels = [(SWEEP, 1, 1, 1)] + [("_copy_kernel", 1, 1, 1), (SWEEP, 1, 1, 1)] * 4
    monkeypatch.setattr(measured, "RESULTS", tmp_path)
    (tmp_path / "l2_writeback_ncu-x.csv").write_text(_ncu_csv(kernels))
    with pytest.raises(ValueError, match="expected ropelib"):
        measured.l2_writeback("x")
    (tmp_path / "l2_writeback_ncu-x.csv").write_text(_ncu_csv(kernels[:-1]))
    with pytest.raises(ValueError, match="8 kernels profiled, expected 9"):
        measured.l2_writeback("x")


def test_the_table_sets_the_sweeps_writes_against_each_writers_shortfall(tmp_path, monkeypatch):
    mib = 2**20
    kernels = [(SWEEP, 2**30, 0, 400_000)]
    for name, stored in measured.L2_WRITEBACK_WRITERS:
        kernel = "_copy_kernel" if name == "copy" else "_rope_tile_kernel"
        kernels += [(kernel, stored * mib, (stored - 8) * mib, 90_000), (SWEEP, 2**30, 6 * mib, 1)]
    monkeypatch.setattr(measured, "RESULTS", tmp_path)
    for gpu in ("nvidia-h100-80gb-hbm3", measured.GPU):
        (tmp_path / f"l2_writeback_ncu-{gpu}.csv").write_text(_ncu_csv(kernels))
    assert measured.l2_writeback_gpus() == [measured.GPU, "nvidia-h100-80gb-hbm3"]
    lines = measured.l2_writeback_table(measured.l2_writeback(measured.GPU)[1]).splitlines()
    assert "after / short" in lines[0] and len(lines) == 1 + len(measured.L2_WRITEBACK_WRITERS)
    assert all(line.split()[:2] == [name, str(mib_)] and "0.75" in line.split()
               for line, (name, mib_) in zip(lines[1:], measured.L2_WRITEBACK_WRITERS))


def test_the_committed_profile_shows_the_shortfall_written_back_by_the_next_kernel():
    # what notebooks 04 (A.5) and 10 (section 5) read from the committed H100 profile
    meta, rows = measured.l2_writeback("nvidia-h100-80gb-hbm3")
    assert meta["gpu"] == "NVIDIA H100 80GB HBM3"
    small, *large = rows
    assert (small["kernel"], small["stored_mib"]) == ("copy", 16)
    # the copy that fits in L2 is hardly counted writing at all; the next sweep writes it
    assert round(small["counted_mib"], 1) == 0.3 and round(small["after_mib"], 1) == 16.6
    assert round(small["after_mib"] / small["short_mib"], 2) == 1.06
    # the writers larger than L2 fall short by about 20 MiB each, written back after them
    assert [round(r["short_mib"], 1) for r in large] == [21.7, 21.8, 19.9]
    assert [round(r["after_mib"] / r["short_mib"], 2) for r in large] == [0.98, 0.99, 0.97]
    assert [round(r["total"], 3) for r in large] == [0.993, 0.999, 0.998]
