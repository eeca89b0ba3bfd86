"""GB/s of ropelib's three kernel generations against a device copy (notebook 04's figure).

    python benchmarks/generations.py                 # on a GPU: writes the committed CSV + figure
    TRITON_INTERPRET=1 python benchmarks/generations.py --quick --out /tmp/gen.csv   # CPU smoke run
    python benchmarks/generations.py --plot-only     # redraw the figure from the committed CSV

Generations: `ropelib_naive` (one program per row), `ropelib_batch_reuse` (grid (S, H), cos/sin
reused over the batch) and `ropelib` (the finished kernel, `ropelib.apply_rope`), each timed
forward and forward+backward by `ropelib.bench.compare.run_case` (triton.testing.do_bench medians,
with the copy floor `y.copy_(x)` measured in the same run on the same tensors).

GB/s uses compare's bytes model: read x + write y + read the fp32 angle table once
(S * D * 4 bytes) — the least any kernel must move. The copy moves x + y. `pct_of_copy` is
`100 * copy time / kernel time`, as everywhere in the course: how close a generation comes to a
plain copy of the same tensors on the same GPU (a ratio of GB/s would read a little higher,
since it counts the table for the kernel and not for the copy). Timings exist only from a real GPU run: without one this
script refuses to write the committed CSV.
"""
import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib (and its @triton.jit) is imported

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from ropelib import runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"
CSV_PATH = RESULTS / "generations-nvidia-h200.csv"     # what notebook 03 and the figure read
FIGURE_PATH = REPO_ROOT / "figures" / "04-generations-gbps.png"
PROVIDERS = ("ropelib_naive", "ropelib_batch_reuse", "ropelib")
LABELS = {"ropelib_naive": "1 naive (S·B·H programs)",
          "ropelib_batch_reuse": "2 batch-reuse grid (S, H)",
          "ropelib": "3 ropelib.apply_rope, as planned"}
COLORS = {"ropelib_naive": "tab:red", "ropelib_batch_reuse": "tab:orange", "ropelib": "tab:green",
          "copy": "0.3"}
REFERENCE = "reference"  # the case: sbhd s=16384, b=8, h=32, d=128, bf16 (1 GiB)


def cases(quick: bool = False):
    """[(case name, group, Config)]: the issue's reference case, a batch sweep, a D=80 case."""
    C = compare.Config
    if quick:  # interpreter-sized: proves the script runs, the numbers mean nothing
        return [(REFERENCE, "reference", C(8, 2, 2, 64, "bf16")),
                ("batch-1", "batch", C(4, 1, 2, 64, "bf16")),
                ("batch-2", "batch", C(4, 2, 2, 64, "bf16"))]
    out = [(REFERENCE, "reference", C(16384, 8, 32, 128, "bf16"))]
    out += [(f"batch-{b}", "batch", C(4096, b, 32, 128, "bf16")) for b in (1, 2, 4, 8, 16)]
    out.append(("d80", "head_dim", C(4096, 8, 32, 80, "bf16")))
    return out


def measure(case_list, providers=PROVIDERS, *, backward: bool = True, progress: bool = True):
    """Run every case through ropelib.bench.compare.run_case; add case/group, copy GB/s, % of copy."""
    rows = []
    for name, group, cfg in case_list:
        if progress:
            print(f"{name}: {cfg}", flush=True)
        elem = torch.tensor([], dtype=cfg.torch_dtype).element_size()
        copy_bytes = 2 * cfg.seq_len * cfg.batch * cfg.heads * cfg.head_dim * elem
        for row in compare.run_case(cfg, list(providers), backward=backward):
            row.update(case=name, group=group)
            copy_ms = row.get("copy_fwd_ms")
            row["copy_gbps"] = copy_bytes / copy_ms / 1e6 if copy_ms else None
            row["pct_of_copy"] = pct_of_copy(row)
            rows.append(row)
            if progress:
                print("  " + summary_line(row), flush=True)
    return rows


def pct_of_copy(row):
    """100 * the copy's time / the kernel's forward time (None where either is missing)."""
    copy_ms, ms = row.get("copy_fwd_ms"), row.get("fwd_ms")
    return 100.0 * copy_ms / ms if copy_ms and ms else None


def summary_line(row) -> str:
    """One human line per row: provider, ms, GB/s, % of copy (or why it did not run)."""
    if not row.get("available"):
        return f"{row['provider']:22s} not run: {row.get('reason')}"
    fb = row.get("fwdbwd_ms")
    return (f"{row['provider']:22s} fwd {row['fwd_ms']:8.4f} ms {row['fwd_gbps']:8.1f} GB/s "
            f"({row['pct_of_copy']:5.1f}% of copy {row['copy_gbps']:.0f} GB/s)"
            + (f" | fwd+bwd {fb:8.4f} ms {row['fwdbwd_gbps']:8.1f} GB/s" if fb else ""))


def write(rows, path=CSV_PATH):
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/generations.py"
    meta["bytes_model"] = "x read + y written + fp32 angles [S, D] read once; copy: x + y"
    for r in rows:  # also in every row, so a row copied elsewhere still says where it is from
        r.update(gpu=meta["gpu"], date=meta["date"], torch=meta["torch"], triton=meta["triton"])
    return compare.write_csv(rows, path, meta=meta)


def plot_generations(csv_path=CSV_PATH, png_path=FIGURE_PATH):
    """Draw figures/04-generations-gbps.png from the CSV: GB/s vs batch, and the reference case."""
    import matplotlib.pyplot as plt

    rows = compare.read_csv(csv_path)
    meta = compare.read_meta(csv_path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.1, 1]})

    sweep = [r for r in rows if r.get("group") == "batch"]
    copy_pts = sorted({(r["batch"], r["copy_gbps"]) for r in sweep if r.get("copy_gbps")})
    for p in PROVIDERS:
        pts = sorted((r["batch"], r["fwd_gbps"]) for r in sweep
                     if r["provider"] == p and r.get("available") and r.get("fwd_gbps"))
        if pts:
            ax1.plot(*zip(*pts), marker="o", color=COLORS[p], label=LABELS[p])
    if copy_pts:
        ax1.plot(*zip(*copy_pts), ls="--", color=COLORS["copy"], label="device copy (x -> y)")
    if sweep:
        c = sweep[0]
        ax1.set_title(f"forward, sbhd s={c['seq_len']}, h={c['heads']}, d={c['head_dim']}, "
                      f"{c['dtype']}")
        ax1.set_xscale("log", base=2)
        ax1.set_xticks(sorted({r["batch"] for r in sweep}), [str(b) for b in sorted({r["batch"] for r in sweep})])
    ax1.set_xlabel("batch size b")
    ax1.set_ylabel("GB/s (x + y + angle table)")
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="lower right")

    ref = [r for r in rows if r.get("case") == REFERENCE]
    names, values, colors, notes = [], [], [], []
    for p in PROVIDERS:
        r = next((r for r in ref if r["provider"] == p and r.get("available")), None)
        if r is not None:
            names.append(LABELS[p])
            values.append(r["fwd_gbps"])
            colors.append(COLORS[p])
            notes.append(f"{r['fwd_gbps']:.0f} GB/s, {pct_of_copy(r):.0f}% of a copy")
    copy = next((r["copy_gbps"] for r in ref if r.get("copy_gbps")), None)
    if copy:
        names.append("device copy")
        values.append(copy)
        colors.append(COLORS["copy"])
        notes.append(f"{copy:.0f} GB/s")
    if ref:
        ax2.barh(range(len(values)), values, color=colors)
        ax2.set_yticks(range(len(values)), names, fontsize=8)
        ax2.invert_yaxis()
        for i, (v, n) in enumerate(zip(values, notes)):
            ax2.text(v, i, "  " + n, va="center", fontsize=8)
        ax2.set_xlim(0, 1.45 * max(values))  # room for the labels right of the bars
        c = ref[0]
        ax2.set_title(f"forward, sbhd s={c['seq_len']}, b={c['batch']}, h={c['heads']}, "
                      f"d={c['head_dim']}, {c['dtype']}")
    ax2.set_xlabel("GB/s")
    fig.suptitle(f"RoPE kernel generations on {meta.get('gpu', '?')} "
                 f"(torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}, "
                 f"{meta.get('date', '?')[:10]})", fontsize=10)
    fig.tight_layout()
    if png_path is not None:
        Path(png_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png_path, dpi=120)
        plt.close(fig)
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU interpreter smoke run)")
    ap.add_argument("--out", type=Path, default=None,
                    help="CSV path (default benchmarks/results/generations-<gpu>.csv)")
    ap.add_argument("--figure", type=Path, default=None, help=f"PNG path (default {FIGURE_PATH})")
    ap.add_argument("--no-backward", action="store_true", help="forward only")
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the CSV")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")  # a script draws to files only
    gpu = compare.gpu_slug() if runtime.on_gpu() else None
    out = args.out or (RESULTS / f"generations-{gpu}.csv" if gpu else CSV_PATH)
    if args.plot_only:
        print("wrote", plot_generations(out, args.figure or FIGURE_PATH) and (args.figure or FIGURE_PATH))
        return 0
    if not runtime.on_gpu() and Path(out).resolve() == CSV_PATH.resolve():
        ap.error(f"{runtime.mode()}: timings mean nothing here, and {CSV_PATH.name} holds GPU "
                 "results only; run on a GPU, or pass --quick --out elsewhere for a smoke run")
    if args.quick and Path(out).resolve() == CSV_PATH.resolve():
        ap.error("--quick results must not replace the committed CSV: pass --out elsewhere")
    print(runtime.mode())
    rows = measure(cases(args.quick), backward=not args.no_backward)
    print("wrote", write(rows, out))
    figure = args.figure or (FIGURE_PATH if Path(out).resolve() == CSV_PATH.resolve() else
                             Path(out).with_suffix(".png"))
    plot_generations(out, figure)
    print("wrote", figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
