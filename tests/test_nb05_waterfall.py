"""Notebook 05, section 5: nb05_waterfall reads the committed ladder run as the course reads it,
prints every size, says what each step changed in the launch and draws the waterfall."""
import matplotlib
import pytest

from ropelib.course import ladder, measured, nb05_waterfall

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def run():
    return nb05_waterfall.read()


def test_read_gives_the_copys_time_over_the_kernels(run):
    meta, rows = run
    assert meta["gpu"] == "NVIDIA H200"
    copy_ms = {r["case"]: r["ms"] for r in rows if r["provider"] == "copy"}
    for r in rows:
        assert r["pct_of_copy"] == pytest.approx(100 * copy_ms[r["case"]] / r["ms"])


def test_print_sizes_prints_every_size_and_refuses_another_order(run, capsys):
    meta, rows = run
    providers = ("copy",) + ladder.NAMES + ("ropelib", "ropelib_planned")
    nb05_waterfall.print_sizes(rows, meta, providers, lambda v: v.upper())
    out = capsys.readouterr().out
    assert out.startswith(f"measured on {measured.where(meta)}")
    assert out.count("20-80 % of copy") == len({r["case"] for r in rows})
    assert "EQUAL_HALVES" in out
    with pytest.raises(AssertionError):
        nb05_waterfall.print_sizes(rows, meta, providers[::-1])


def test_launch_changes_reads_the_launch_columns(run):
    _, rows = run
    changed = nb05_waterfall.launch_changes(rows)
    assert list(changed) == list(dict.fromkeys(r["case"] for r in rows))
    assert set(changed["s4096-b8"]) == set(ladder.NAMES[2:])
    assert changed["s4096-b8"]["warps"] == "8 warps"
    assert changed["s32768-b1"]["chunks"] == "tile 2x32, 4 warps"
    assert changed["s16384-b8-h8"]["tile"] == "tile 4x8"
    assert {c["accurate"] for c in changed.values()} == {"same launch, same code"}


def test_draw_names_the_gpu_and_each_steps_change(run):
    meta, rows = run
    changed = nb05_waterfall.launch_changes(rows)
    fig = nb05_waterfall.draw(rows, meta, changed, lambda v: {"ropelib": "finished"}.get(v, v))
    assert measured.where(meta) in fig._suptitle.get_text()
    panels = [a for a in fig.axes if a.patches]
    assert len(panels) == len(changed)
    labels = [t.get_text() for t in panels[0].get_xticklabels()]
    assert "warps\n8 warps" in labels and "finished" in labels
