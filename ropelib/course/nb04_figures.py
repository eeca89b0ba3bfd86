"""Notebook 04's figures: which program rotates each row in the naive and the (S, H) grid
(section 2), and two bar charts drawn from the committed numbers its cells compute: the three
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


def plot_grids(path=None, S: int = 3, B: int = 2, H: int = 3):
    """Two panels of an [S, B, H] tensor's rows: the program that rotates each row in the naive
    grid (S*B*H,) and in the (S, H) grid whose program (s, h) loops over b. The colour is the
    program's number in launch order: a 2-D grid's program (s, h) is number s + S*h (axis 0
    varies fastest)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    cmap = plt.get_cmap("tab20")
    for ax, title, prog in (
            (axes[0], f"naive: grid (S·B·H,) = ({S * B * H},)",
             lambda s, b, h: ((s * B + b) * H + h, str((s * B + b) * H + h))),
            (axes[1], f"batch-reuse: grid (S, H) = ({S}, {H}), program (s, h) loops over b",
             lambda s, b, h: (s + S * h, f"{s},{h}"))):
        for s in range(S):
            for b in range(B):
                for h in range(H):
                    number, label = prog(s, b, h)
                    ax.add_patch(plt.Rectangle((b * H + h, S - 1 - s), 1, 1,
                                               fc=cmap(number % 20), ec="k"))
                    ax.text(b * H + h + 0.5, S - 0.5 - s, label, ha="center", va="center")
        ax.set_xlim(0, B * H), ax.set_ylim(0, S)
        ax.set_xticks([i + 0.5 for i in range(B * H)], [f"b{i // H}h{i % H}" for i in range(B * H)])
        ax.set_yticks([S - 0.5 - s for s in range(S)], [f"s={s}" for s in range(S)])
        ax.set_title(title, fontsize=10)
    fig.suptitle("which program rotates each row x[s, b, h, :] "
                 "(label = program id; same colour = same program)", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
