"""ropelib.course.nb04_figures: notebook 04's floors and time-split charts draw from plain dicts."""
import matplotlib

matplotlib.use("Agg")

from ropelib.course import nb04_figures  # noqa: E402


def test_floors_and_time_split_draw_one_row_per_kernel(tmp_path):
    floors = {"a": dict(bytes=1.0, programs=2.0, issue=0.5, us=2.5),
              "b": dict(bytes=1.0, programs=0.5, issue=3.0, us=4.0)}
    fig = nb04_figures.plot_floors(floors, ("bytes", "programs", "issue"), "t", tmp_path / "f.png")
    assert (tmp_path / "f.png").exists() and len(fig.axes[0].get_yticks()) == 2
    split = {k: dict(issue_us=1.0, empty_us=2.0, idle_us=0.1, us=3.1, issue_share=0.32)
             for k in ("te_fused", "copy")}
    fig = nb04_figures.plot_time_split(split, "t", tmp_path / "s.png")
    assert (tmp_path / "s.png").exists() and len(fig.axes[0].patches) == 6


def test_grids_label_each_row_with_its_program():
    fig = nb04_figures.plot_grids(S=3, B=2, H=3)
    naive, grid = ([t.get_text() for t in ax.texts] for ax in fig.axes)
    assert len(naive) == len(grid) == 3 * 2 * 3
    assert sorted(naive, key=int) == [str(i) for i in range(18)]    # one program a row
    assert set(grid) == {f"{s},{h}" for s in range(3) for h in range(3)}   # (s, h) for every b
