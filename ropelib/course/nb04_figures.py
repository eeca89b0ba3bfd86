"""Notebook 04's two bar charts, drawn from the committed numbers its cells compute: the three
floors under each kernel's time (section 5.3) and where each kernel's time goes (section 5.5)."""
import matplotlib.pyplot as plt


def plot_floors(floors: dict, labels: tuple, title: str, path=None):
    """One row per kernel of ``floors`` ({name: {"bytes", "programs", "issue", "us"} in µs}):
    a bar per floor (``labels``: its legend, in that order) and the measured time as a line."""
    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    for i, (name, f) in enumerate(floors.items()):
        for j, (kind, label, colour) in enumerate(zip(("bytes", "programs", "issue"), labels,
                                                      ("tab:gray", "tab:orange", "tab:blue"))):
            ax.barh(i + (j - 1) * 0.26, f[kind], height=0.26, color=colour,
                    label=label if i == 0 else None)
        ax.plot([f["us"]] * 2, [i - 0.45, i + 0.45], color="k", lw=3,
                label="measured time (do_bench)" if i == 0 else None)
    ax.set_yticks(range(len(floors)), list(floors))
    ax.invert_yaxis()
    ax.set_xlabel("µs")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def plot_time_split(split: dict, title: str, path=None):
    """One bar per kernel of ``split`` ({name: {"issue_us", "empty_us", "idle_us", "us",
    "issue_share"}}): issuing, no warp ready and SM idle, end to end; the last kernel's whole
    time (the copy's) as a dashed line."""
    parts = (("issue_us", "issuing warp instructions", "tab:blue"),
             ("empty_us", "no warp ready (waiting)", "tab:gray"),
             ("idle_us", "SM idle (start, tail)", "tab:olive"))
    fig, ax = plt.subplots(figsize=(9, 2.6))
    for i, (name, r) in enumerate(split.items()):
        left = 0.0
        for key, label, colour in parts:
            ax.barh(i, r[key], left=left, color=colour, label=label if i == 0 else None)
            left += r[key]
        ax.text(left + 2, i, f"{r['us']:.1f} µs, issuing {r['issue_share']:.0%}", va="center",
                fontsize=8)
    ax.axvline(list(split.values())[-1]["us"], color="k", ls="--", lw=1)
    ax.set_yticks(range(len(split)), list(split))
    ax.invert_yaxis()
    ax.set_xlim(0, 1.3 * max(r["us"] for r in split.values()))
    ax.set_xlabel("µs (the dashed line: the copy's whole time)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7.5, loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
