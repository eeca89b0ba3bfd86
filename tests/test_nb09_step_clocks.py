"""Notebook 09's step clocks (`ropelib.course.nb09_step_clocks`): the rows a GPU run writes to
figures/09-rope-share.csv carry the committed file's columns, and the figure draws each arm's
four clocks from the rows it is handed."""
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from ropelib.bench import compare  # noqa: E402
from ropelib.course.nb09_step_clocks import (HOST_COLUMNS, plot_step_clocks,  # noqa: E402
                                              profile_rows)

ROOT = Path(__file__).resolve().parents[1]
SHARE_CSV = ROOT / "figures" / "09-rope-share.csv"


def _share(rope_ms, step_ms, kernels):
    return {"rope_ms": rope_ms, "rope_fwd_ms": rope_ms / 2, "rope_bwd_ms": rope_ms / 2,
            "step_ms": step_ms, "share": rope_ms / step_ms, "rope_host_ms": 4 * rope_ms,
            "rope_host_fwd_ms": 3 * rope_ms, "rope_host_bwd_ms": rope_ms,
            "step_host_ms": 2 * step_ms, "host_share": 2 * rope_ms / step_ms,
            "kernel_names": kernels, "backward_nodes": [], "device_events": []}


SHARES = {"ropelib": _share(0.2, 6.5, ["_rope_kernel"]),
          "reference": _share(3.5, 9.8, [f"elementwise_{i}" for i in range(9)])}


def test_the_rows_carry_the_committed_files_columns(tmp_path):
    rows = profile_rows(SHARES, copy_floor_ms=0.15, split_copies_ms=0.18,
                        wall_train={"ropelib": 12.9, "reference": 18.0},
                        wall_rounds={"ropelib": 11.9, "reference": 14.9})
    committed = compare.read_csv(SHARE_CSV)
    assert set(committed[0]) <= set(rows[0])                    # every committed column
    assert set(rows[0]) - set(committed[0]) == {"split_copies_ms", "wall_ms_rounds"}
    assert [(r["rope"], r["kernels"], r["wall_ms_per_step"], r["wall_ms_rounds"]) for r in rows] \
        == [("ropelib", 1, 12.9, 11.9), ("reference", 9, 18.0, 14.9)]
    assert all(r[c] == SHARES[r["rope"]][c] for r in rows for c in HOST_COLUMNS)
    path = tmp_path / "share.csv"
    compare.write_csv(rows, path, {"gpu": "test"}, fields=list(rows[0]))
    assert [r["rope"] for r in compare.read_csv(path)] == ["ropelib", "reference"]


def test_a_cpu_profile_is_not_written():
    cpu = {"ropelib": {**SHARES["ropelib"], "kernel_names": None}}
    with pytest.raises(ValueError, match="CPU profile"):
        profile_rows(cpu, copy_floor_ms=1.0, split_copies_ms=None,
                     wall_train={"ropelib": 1.0}, wall_rounds={"ropelib": 1.0})


def test_the_figure_draws_the_four_clocks_of_each_arm(tmp_path):
    rows = compare.read_csv(SHARE_CSV)
    path = tmp_path / "clocks.png"
    fig = plot_step_clocks(rows, "committed", path)
    ax = fig.axes[0]
    assert path.is_file() and [t.get_text() for t in ax.get_xticklabels()] == ["ropelib",
                                                                              "reference"]
    heights = [[bar.get_height() for bar in c] for c in ax.containers]
    assert heights == [[r[c] for r in rows] for c in ("wall_ms_per_step", "step_ms", "rope_ms",
                                                      "rope_host_ms")]
    # another wall-clock column: the rounds'
    live = [{**r, "wall_ms_rounds": 1.0 + i} for i, r in enumerate(rows)]
    fig = plot_step_clocks(live, "live", wall="wall_ms_rounds")
    assert [b.get_height() for b in fig.axes[0].containers[0]] == [1.0, 2.0]
