"""Run the sweeps of earlier studies (ropelib.bench.compare.SEED_SWEEPS) and draw them: notebook 07's GPU data.

    python benchmarks/seed_sweeps.py                  # on a GPU: all sweeps, ~6 min on an H100
    python benchmarks/seed_sweeps.py --only fp32 && \
        python benchmarks/seed_sweeps.py --only 'bf16' --append     # the same in two parts
    python benchmarks/seed_sweeps.py --only 'seq_len-b[18]-bf16'   # a regex over sweep names
    python benchmarks/seed_sweeps.py --tiny           # shrunk sizes; the CPU interpreter works
    python benchmarks/seed_sweeps.py --redraw benchmarks/results/seed_sweeps.csv   # figures only

Writes benchmarks/results/seed_sweeps.csv (rows of compare.run_case plus a `sweep` column, the
environment in the header) and figures/07-seed-seq-len-{fp32,bf16}.png (GB/s vs seq_len, one
panel per batch) and figures/07-seed-axes.png (seq/hidden/heads/batch sweeps), each titled with the GPU and
versions from the CSV's header. Interpreter runs
(--tiny or no GPU) go to a temp directory unless --out/--figures say otherwise: their timings
are meaningless and must not replace the committed GPU results.
"""
import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:   # `python benchmarks/seed_sweeps.py` from a checkout
    sys.path.insert(0, str(REPO_ROOT))

import os  # noqa: E402

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib's kernels are imported

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ropelib import runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"
FIGURES = REPO_ROOT / "figures"


def run(sweeps, progress=True) -> list:
    """All rows of ``sweeps``, each tagged with its sweep's name."""
    available = {p.name for p in compare.providers() if p.available}
    rows = []
    for s in sweeps:
        names = [n for n in s.providers if n in available]
        if not names:
            print(f"{s.name}: none of {s.providers} is available here, skipped", file=sys.stderr)
            continue
        for r in compare.sweep(s.base, s.axis, s.values, names,
                               progress="text" if progress else False):
            r["sweep"] = s.name
            rows.append(r)
    return rows


def draw(rows, figures: Path, where: str) -> list:
    """figures/07-seed-seq-len-<dtype>.png and 07-seed-axes.png from ``rows``, each titled with
    ``where`` (the GPU and versions they were measured with); returns paths."""
    figures.mkdir(parents=True, exist_ok=True)
    out = []
    for dtype in ("fp32", "bf16"):
        panels = [(b, [r for r in rows if r.get("sweep") == f"seq_len-b{b}-{dtype}"])
                  for b in (1, 2, 4, 8)]
        panels = [(b, sub) for b, sub in panels if sub]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=True,
                                 squeeze=False)
        for ax, (b, sub) in zip(axes[0], panels):
            compare.plot_sweep(sub, "seq_len", ax=ax, title=f"{dtype}, H={sub[0]['heads']}, "
                                                            f"D={sub[0]['head_dim']}, batch {b}")
        fig.suptitle(where, fontsize=9)
        fig.tight_layout()
        path = figures / f"07-seed-seq-len-{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    axes_sweeps = [("seq-bf16", "seq_len"), ("hidden-bf16", "head_dim"), ("heads-bf16", "heads"),
                   ("batch-bf16", "batch")]
    panels = [(n, a, [r for r in rows if r.get("sweep") == n]) for n, a in axes_sweeps]
    panels = [p for p in panels if p[2]]
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
        for ax, (n, a, sub) in zip(axes[0], panels):
            compare.plot_sweep(sub, a, ax=ax, title=f"{n}: Triton vs TE vs PyTorch")
        fig.suptitle(where, fontsize=9)
        fig.tight_layout()
        path = figures / "07-seed-axes.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out


def measured_where(meta: dict) -> str:
    """Where a CSV's rows were measured, from its header: GPU, torch, Triton, TE, date."""
    return (f"measured on {meta.get('gpu', 'an unnamed device')} (torch {meta.get('torch', '?')}, "
            f"Triton {meta.get('triton', '?')}, TE {meta.get('transformer_engine', '?')}, "
            f"{str(meta.get('date', '?'))[:10]})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, metavar="REGEX", help="sweeps whose name matches")
    ap.add_argument("--tiny", action="store_true", help="shrunk sizes (compare.shrink)")
    ap.add_argument("--out", default=None, help="CSV path (default benchmarks/results/"
                                                "seed_sweeps.csv on a GPU, a temp dir otherwise)")
    ap.add_argument("--figures", default=None, help="figure directory (default figures/ on a "
                                                    "GPU, the CSV's directory otherwise)")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of other sweeps already in the CSV (run in parts)")
    ap.add_argument("--list", action="store_true", help="list the sweeps and exit")
    ap.add_argument("--redraw", default=None, metavar="CSV",
                    help="only draw the figures from a CSV this script wrote (no GPU needed)")
    args = ap.parse_args(argv)
    if args.redraw:
        figures = Path(args.figures) if args.figures else FIGURES
        where = measured_where(compare.read_meta(args.redraw))
        for p in draw(compare.read_csv(args.redraw), figures, where):
            print("wrote", p)
        return 0

    sweeps = list(compare.SEED_SWEEPS)
    if args.only:
        rx = re.compile(args.only)
        sweeps = [s for s in sweeps if rx.search(s.name)]
        if not sweeps:
            ap.error(f"--only {args.only!r} matches none of {[s.name for s in compare.SEED_SWEEPS]}")
    if args.tiny:
        sweeps = [compare.shrink(s) for s in sweeps]
    if args.list:
        for s in sweeps:
            print(f"{s.name:16s} {s.axis:9s} {list(s.values)}  {s.base}")
        return 0
    real = runtime.on_gpu() and not args.tiny
    if args.out:
        out = Path(args.out)
    elif real:
        out = RESULTS / "seed_sweeps.csv"
    else:
        out = Path(tempfile.mkdtemp(prefix="ropelib-seed-")) / "seed_sweeps.csv"
    figures = Path(args.figures) if args.figures else (FIGURES if real else out.parent)
    print(runtime.mode(), "->", out, file=sys.stderr)
    rows = run(sweeps)
    if not rows:
        print("no rows: no provider of these sweeps is available", file=sys.stderr)
        return 1
    if args.append and out.exists():
        done = {s.name for s in sweeps}
        rows = [r for r in compare.read_csv(out) if r.get("sweep") not in done] + rows
    meta = compare.environment_meta()
    compare.write_csv(rows, out, meta=meta)
    for p in draw(rows, figures, measured_where(meta)):
        print("wrote", p)
    print("wrote", out)
    # headline: GB/s of each provider at the longest sequence of each seq_len sweep
    for s in sweeps:
        sub = [r for r in rows if r["sweep"] == s.name and r["available"]
               and r[s.axis] == max(s.values)]
        if sub:
            print(f"{s.name:16s} {s.axis}={max(s.values)}: " + ", ".join(
                f"{r['provider']} {r['fwd_gbps']:.4g} GB/s ({100 * r['ratio_fwd']:.0f}% of copy)"
                for r in sub))
    return 0


if __name__ == "__main__":
    sys.exit(main())
