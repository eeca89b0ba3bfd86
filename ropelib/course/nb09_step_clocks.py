"""One training step's clocks, as notebook 09's section 5 reads them: the rows of
``figures/09-rope-share.csv`` (a run's profile of each RoPE, written on a GPU) and the figure
that draws a step's four clocks from them.

The four clocks, per step and arm: the *wall-clock step* (timed without the profiler), the GPU's
*busy* time in it (the profiler's summed kernel time, ``step_ms``), RoPE's device time
(``rope_ms``) and RoPE's host time under the profiler (``rope_host_ms``: Python, dispatch,
autograd and the launches, inflated by the profiler's own cost).
"""
from __future__ import annotations

# the host side of the step, per step: columns of figures/09-rope-share.csv
HOST_COLUMNS = ("rope_host_ms", "rope_host_fwd_ms", "rope_host_bwd_ms", "step_host_ms",
                "host_share")
CLOCKS = (("wall-clock step", None), ("GPU busy", "step_ms"), ("RoPE, device", "rope_ms"),
          ("RoPE, host (profiler)", "rope_host_ms"))


def profile_rows(shares: dict, *, copy_floor_ms: float, split_copies_ms, wall_train: dict,
                 wall_rounds: dict) -> list:
    """The rows of figures/09-rope-share.csv for this run: one per arm of ``shares`` ({rope:
    ``model.rope_time_share``'s dict, profiled on a GPU}), with one copy of RoPE's bytes
    (``copy_floor_ms``), the same bytes as one copy per RoPE launch (``split_copies_ms``), the
    wall-clock step of the training run (``wall_train``, {rope: ms}) and of the interleaved
    rounds (``wall_rounds``, {rope: ms})."""
    rows = []
    for rope, v in shares.items():
        if v["kernel_names"] is None:
            raise ValueError(f"{rope}: a CPU profile has no kernels; the file holds GPU runs")
        rows.append({"rope": rope, "rope_ms": v["rope_ms"], "rope_fwd_ms": v["rope_fwd_ms"],
                     "rope_bwd_ms": v["rope_bwd_ms"], "step_ms": v["step_ms"],
                     "share": v["share"], "copy_floor_ms": copy_floor_ms,
                     "split_copies_ms": split_copies_ms, "kernels": len(v["kernel_names"]),
                     "wall_ms_per_step": wall_train[rope], "wall_ms_rounds": wall_rounds[rope],
                     **{k: v[k] for k in HOST_COLUMNS}})
    return rows


def plot_step_clocks(rows, title: str, path=None, wall: str = "wall_ms_per_step"):
    """One training step per arm, in ms: the wall-clock step (column ``wall``), the GPU's busy
    time in it, RoPE's device time and RoPE's host time under the profiler (``rows``:
    figures/09-rope-share.csv's, or :func:`profile_rows`'). Saves to ``path`` when given."""
    import matplotlib.pyplot as plt

    parts = [(label, col or wall) for label, col in CLOCKS]
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    width = 0.8 / len(parts)
    for i, (label, col) in enumerate(parts):
        at = [a + (i - (len(parts) - 1) / 2) * width for a in range(len(rows))]
        ax.bar_label(ax.bar(at, [r[col] for r in rows], width, label=label), fmt="%.2f",
                     fontsize=7)
    ax.set_xticks(range(len(rows)), [r["rope"] for r in rows])
    ax.set(ylabel="ms per step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
