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
