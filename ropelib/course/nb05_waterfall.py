"""Notebook 05, section 5: the ladder run (`benchmarks/results/ladder-<gpu>.csv`) read, printed
and drawn, so the section's cell keeps only what the prose reads from it.

`read` loads the run with % of copy as the course reads it (the copy's median time over the
kernel's, the copy timed in the same process); `print_sizes` prints one table a size;
`launch_changes` says what each step changed in the launch, from the CSV's launch columns;
`draw` draws the waterfall (`ladder.plot_waterfall`) with those changes under the bars.
`tests/test_nb05_waterfall.py` runs them on the committed run.
"""
import math

from ropelib.course import ladder, measured

# what a step changed when the launch (tile, warps, B_CHUNK) is the same: the kernel's code
# (with Triton 3.6 the accurate rung compiles to the chunks rung's machine code)
SAME_LAUNCH = {"tile": "same launch, 3-D kernel", "chunks": "same launch, loop bounds",
               "accurate": "same launch, same code", "equal_halves": "same launch, shortcut"}


def read(gpu: str = measured.GPU) -> tuple:
    """(meta, rows) of the ladder run on `gpu`, each timed row's `pct_of_copy` replaced by the
    copy's median time over the row's (the CSV's own column divides GB/s whose bytes count the
    angle table too)."""
    meta, rows = measured.load("ladder", gpu)
    share = ladder.copy_share(rows)
    for r in rows:
        if r.get("pct_of_copy") is not None:
            r["pct_of_copy"] = share[r.get("run", 1), r["case"], r["provider"]]
    return meta, rows


def print_sizes(rows, meta, providers, shown=lambda v: v) -> None:
    """Print each size's providers (grid, warps, median and 20-80 % quantiles in µs and in % of
    copy), asserting every size times `providers` in that order, each median inside its
    quantiles and nothing much faster than the copy. `shown` renames a provider."""
    print(f"measured on {measured.where(meta)} (driver {meta.get('driver')})")
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        assert [r["provider"] for r in rs] == list(providers), case
        r0 = rs[0]
        print(f"\n{case}: bf16 sbhd s={r0['seq_len']}, b={r0['batch']}, h={r0['heads']}, "
              f"d={r0['head_dim']}")
        print(f"  {'provider':24s} {'grid':>12s} {'warps':>5s} {'µs':>7s} {'20-80 % µs':>15s} "
              f"{'% copy':>7s} {'20-80 % of copy':>16s}")
        for r in rs:
            lo, hi = ladder.pct_range(r)
            print(f"  {shown(r['provider']):24s} {str(r.get('grid') or ''):>12s} "
                  f"{str(r.get('num_warps') or ''):>5s} {r['ms'] * 1e3:7.1f} "
                  f"{r['ms_p20'] * 1e3:7.1f}-{r['ms_p80'] * 1e3:<7.1f} {r['pct_of_copy']:7.1f} "
                  f"{lo:8.1f}-{hi:<7.1f}")
            assert r["pct_of_copy"] < 110, f"{case}/{r['provider']}: faster than a copy?"
            assert r["ms_p20"] <= r["ms"] <= r["ms_p80"], (case, r["provider"])


def _launch(r) -> dict:
    return {"programs": math.prod(int(g) for g in str(r["grid"]).split("x")),
            "tile": f"{r['block_s']}x{r['block_h']}", "B_CHUNK": r["chunk"],
            "warps": r["num_warps"]}


def launch_changes(rows) -> dict:
    """{case: {rung: what its step changed}} for the rungs from `tile` on: the tile, warps and
    B_CHUNK that differ from the rung before's, or, where the launch is the same, what differs in
    the kernel (SAME_LAUNCH)."""
    by = {(r["case"], r["provider"]): r for r in rows}
    changes = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        changes[case] = {}
        for rung in ladder.NAMES[2:]:
            prev = ladder.NAMES[ladder.NAMES.index(rung) - 1]
            a, b = _launch(by[case, prev]), _launch(by[case, rung])
            moved = [f"tile {b['tile']}"] * (a["tile"] != b["tile"]) \
                + [f"{b['warps']} warps"] * (a["warps"] != b["warps"]) \
                + [f"B_CHUNK {b['B_CHUNK']}"] * (a["B_CHUNK"] != b["B_CHUNK"])
            changes[case][rung] = ", ".join(moved) or SAME_LAUNCH[rung]
    return changes


def draw(rows, meta, changes, shown=lambda v: v):
    """The waterfall of `rows` (hatched: a step smaller than the spreads at its two ends), its
    title naming the GPU and run, under each rung's name what its step changed (`changes`, from
    `launch_changes`). Returns the figure."""
    fig = ladder.plot_waterfall(rows, None, names={r["provider"]: shown(r["provider"])
                                                   for r in rows},
                                title="From the batch-reusing grid to the finished kernel: "
                                      f"{measured.where(meta)}\nunder each rung: what its step "
                                      "changed in the launch",
                                unclear_rule=ladder.within_both_spreads)
    for ax, case in zip([a for a in fig.axes if a.patches], changes):
        drawn = [r["provider"] for r in sorted((r for r in rows if r["case"] == case
                                                and r["provider"] != "copy"),
                                               key=lambda r: r["step"])]
        ax.set_xticks(range(len(drawn)),
                      [shown(n) + (f"\n{changes[case][n]}" if n in changes[case] else "")
                       for n in drawn], rotation=40, ha="right", fontsize=6.5)
    fig.tight_layout()
    return fig
