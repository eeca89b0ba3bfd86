"""The ladder in several processes (benchmarks/ladder.py --processes, notebook 05's section 5):
each process times the rungs in its own shuffled order, the rows come back with a `run` column,
and ropelib.course.ladder reads a step per process from them. Checked on the CPU with the
processes stood in for (their timings need a GPU)."""
import os
import subprocess

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from loading import ROOT, load_file  # noqa: E402

from ropelib.bench import compare  # noqa: E402
from ropelib.course import ladder  # noqa: E402


def _rows(copy_ms, ms_by_provider, case="c", run=None):
    rows = [dict(case=case, provider="copy", ms=copy_ms, seq_len=4, batch=2, heads=2)]
    rows += [dict(case=case, provider=p, ms=ms, seq_len=4, batch=2, heads=2)
             for p, ms in ms_by_provider.items()]
    return [dict(r, run=run) for r in rows] if run is not None else rows


def _times(**moved):
    base = {n: 1.0 for n in ladder.NAMES + ("ropelib",)}
    return base | moved


def test_steps_are_read_per_process_against_its_own_copy():
    # process 2's copy is twice as slow: every rung's share doubles there, and the steps with it
    rows = _rows(0.5, _times(heads=0.8, ropelib=1.25), run=1) + \
        _rows(1.0, _times(heads=0.8, ropelib=1.25), run=2)
    steps = ladder.steps_by_run(rows)
    assert steps["c", "heads"] == pytest.approx([62.5 - 50.0, 125.0 - 100.0])
    assert steps["c", "tile"] == pytest.approx([50.0 - 62.5, 100.0 - 125.0])
    # the finished kernel's step is from rung 6 (equal halves), not from rung 0
    assert steps["c", "ropelib"] == pytest.approx([40.0 - 50.0, 80.0 - 100.0])
    assert set(k[1] for k in steps) == set(ladder.STEP_NAMES)


def test_a_step_is_settled_only_where_every_process_agrees_on_its_sign():
    assert ladder.settled([0.5, 2.0, 0.1])
    assert ladder.settled([-3.0, -0.2])
    assert not ladder.settled([2.0, 3.0, -0.1])
    assert not ladder.settled([0.0, 1.0])          # no step in one process: not settled


def test_rows_without_a_run_column_are_one_process():
    steps = ladder.steps_by_run(_rows(1.0, _times(equal_halves=0.5)))
    assert steps["c", "equal_halves"] == pytest.approx([100.0])


def test_the_figure_draws_a_panel_per_case():
    rows = [r for k in (1, 2, 3) for case in ("a", "b")
            for r in _rows(1.0, _times(chunks=0.9 + 0.05 * k), case=case, run=k)]
    fig = ladder.plot_steps_by_run(rows, "test")
    assert len([a for a in fig.axes if a.patches]) == 2


def test_processes_shuffle_their_order_and_merge_with_a_run_column(tmp_path, monkeypatch):
    bench = load_file("ladder_bench", ROOT / "benchmarks" / "ladder.py")
    seeds = []

    def one_process(cmd, check):          # a process: its seed, and a CSV of two rows
        assert check and cmd[1].endswith("ladder.py")
        out, seed = cmd[cmd.index("--out") + 1], int(cmd[cmd.index("--order-seed") + 1])
        seeds.append(seed)
        compare.write_csv([dict(case="c", provider="copy", ms=1.0 * seed),
                           dict(case="c", provider="heads", ms=2.0 * seed)], out,
                          meta={"gpu": "stand-in"}, fields=bench.FIELDS)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bench.subprocess, "run", one_process)
    rows = bench.run_processes(3, tmp_path / "runs.csv")
    assert seeds == [1, 2, 3]
    back = compare.read_csv(tmp_path / "runs.csv")
    assert [(r["run"], r["provider"], r["ms"]) for r in back] == \
        [(k, p, m * k) for k in (1, 2, 3) for p, m in (("copy", 1.0), ("heads", 2.0))]
    meta = compare.read_meta(tmp_path / "runs.csv")
    assert meta["gpu"] == "stand-in" and str(meta["processes"]) == "3"


def test_a_shuffled_run_checks_every_rung_and_keeps_the_ladders_order(capsys):
    bench = load_file("ladder_bench", ROOT / "benchmarks" / "ladder.py")

    def timed_order(seed):
        rows = bench.run(dry_run=True, progress=True, order_seed=seed)
        printed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()
                   if ln.startswith("  ")]             # a line per rung as it runs (not the copy)
        first = [r for r in rows if r["case"] == rows[0]["case"]]
        assert [r["provider"] for r in first] == list(bench.PROVIDERS)   # rows: ladder order
        assert all(r["available"] for r in rows)
        return printed[:len(first) - 1]

    assert timed_order(None) == list(bench.PROVIDERS[1:])
    shuffled = timed_order(2)
    assert shuffled != list(bench.PROVIDERS[1:]) and sorted(shuffled) == sorted(bench.PROVIDERS[1:])
