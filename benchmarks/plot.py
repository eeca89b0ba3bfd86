"""Draw the committed benchmark CSVs into figures/perf-*.png and the README headline table.

    python benchmarks/plot.py                       # benchmarks/results/*.csv -> figures/
    python benchmarks/plot.py --csv a.csv --csv b.csv --figures out/ --headline out/headline.md

Runs without a GPU (matplotlib only). Reads the CSVs `python -m ropelib.bench` wrote: for each
suite (targets, decode, sweep) the newest file is used unless --csv names files. It draws

- figures/perf-ratio.png: ratio to the copy floor per case (forward, forward+backward) for
  ropelib, TE fused and torch.compile, with the 0.97 / 0.95 / 0.85 bar lines;
- figures/perf-seed-gbps.png: GB/s vs sequence length in the fp32 sweep, one panel per
  batch, with the copy's GB/s;
- figures/perf-decode.png: decode latency (s=1, b=64, h=32, d=128), launched and under
  CUDA-graph replay, beside the copy;

and writes benchmarks/results/headline.md (the table the README shows). Interpreter (CPU) runs
have meaningless timings: they are skipped unless --allow-interpreter, and then every figure
says so. With no usable CSV it exits with an error saying what to run.
"""
import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/plot.py` from a checkout, not installed
    sys.path.insert(0, str(REPO_ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from ropelib.bench import suite as bench  # noqa: E402
from ropelib.bench.compare import TIMING_CPU, read_csv, read_meta  # noqa: E402

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
FIGURES_DIR = REPO_ROOT / "figures"
PROVIDER_STYLE = {  # name -> (label, colour)
    bench.ROPELIB: ("ropelib", "#1f77b4"),
    bench.TE_FUSED: ("TE fused", "#d62728"),
    bench.TORCH_COMPILE: ("torch.compile", "#2ca02c"),
    "ropelib_batch_reuse": ("ropelib gen 2 (batch reuse)", "#9467bd"),
    "ropelib_naive": ("ropelib gen 1 (naive)", "#8c564b"),
    "te_unfused": ("TE unfused", "#ff7f0e"),
    "pytorch": ("PyTorch eager", "#7f7f7f"),
    "liger": ("Liger", "#bcbd22"),
    "flash_attn": ("flash-attn", "#17becf"),
}
RATIO_PROVIDERS = (bench.ROPELIB, bench.TE_FUSED, bench.TORCH_COMPILE)


class NoResults(RuntimeError):
    """No CSV to draw from."""


# --- loading ------------------------------------------------------------------------------

def load(path: Path) -> dict:
    """One CSV: {"path", "meta", "rows", "suite", "interpreter"}."""
    meta = read_meta(path)
    rows = read_csv(path)
    if not rows:
        raise NoResults(f"{path} has no rows")
    missing = [f for f in ("provider", "available", "fwd_ms", "copy_fwd_ms", "ratio_fwd", "timing")
               if f not in rows[0]]
    if missing:
        raise NoResults(f"{path} is not a ropelib.bench CSV (no column {', '.join(missing)})")
    suite = meta.get("suite") or rows[0].get("suite") or "unknown"
    interpreter = any(r.get("timing") == TIMING_CPU for r in rows) or "interpreter" in meta.get(
        "mode", "").lower()
    return {"path": Path(path), "meta": meta, "rows": rows, "suite": str(suite),
            "interpreter": interpreter}


def pick(csv_paths, results_dir: Path, allow_interpreter: bool) -> dict:
    """suite -> the loaded CSV to draw: the named files, else the newest per suite in
    results_dir. Raises NoResults (with what to run) when nothing usable is there."""
    if csv_paths:
        paths = [Path(p) for p in csv_paths]
        absent = [str(p) for p in paths if not p.is_file()]
        if absent:
            raise NoResults(f"no such CSV: {', '.join(absent)}")
    else:
        paths = sorted(Path(results_dir).glob("*.csv"))
        if not paths:
            raise NoResults(
                f"no CSV under {results_dir}: run the suite on a GPU first, e.g. "
                "`python -m ropelib.bench --suite targets --out benchmarks/results/` (then "
                "decode and sweep), and commit "
                "the CSVs it writes there")
    loaded, skipped = [], []
    for p in paths:
        d = load(p)
        (loaded if allow_interpreter or not d["interpreter"] else skipped).append(d)
    for d in skipped:
        print(f"skipping {d['path']}: interpreter (CPU) timings are meaningless "
              "(--allow-interpreter draws them anyway, labelled)", file=sys.stderr)
    if not loaded:
        raise NoResults("every CSV found holds interpreter (CPU) timings; run "
                        "`python -m ropelib.bench --suite targets` on a GPU")
    by_suite: dict = {}
    for d in sorted(loaded, key=lambda d: d["meta"].get("date", "")):
        by_suite[d["suite"]] = d  # the newest date wins
    return by_suite


def _provenance(d: dict) -> str:
    m = d["meta"]
    gpu = m.get("gpu", "?")
    line = (f"{gpu if gpu != 'none' else 'CPU'}, driver {m.get('driver', '?')}, torch "
            f"{m.get('torch', '?')}, triton {m.get('triton', '?')}, TE "
            f"{m.get('transformer_engine', '?')}, {m.get('date', '?')}")
    if d["interpreter"]:
        line += "\nCPU INTERPRETER: TIMINGS MEANINGLESS (plumbing test only)"
    return line


def _avail(rows, provider):
    return [r for r in rows if r.get("provider") == provider and bench._truthy(r.get("available"))]


# --- figures ------------------------------------------------------------------------------

def plot_ratio(d: dict, path: Path) -> Path:
    """Horizontal bars: ratio to the copy per case and provider; forward and forward+backward."""
    rows = [r for r in d["rows"] if r.get("group") != "decode" and bench._int(r.get("seq_len")) > 1]
    if not rows:
        rows = d["rows"]
    cases = list(dict.fromkeys(bench.case_key(r) for r in rows))
    provs = [p for p in RATIO_PROVIDERS if _avail(rows, p)]
    if not provs:
        raise NoResults(f"{d['path']}: none of {RATIO_PROVIDERS} ran; nothing to draw")
    val = {(bench.case_key(r), r["provider"]): r for r in rows}
    has_bwd = any(bench._num(r.get("ratio_fwdbwd")) is not None for r in rows)
    panels = [("ratio_fwd", "forward", bench.BAR_LARGE_FWD)]
    if has_bwd:
        panels.append(("ratio_fwdbwd", "forward + backward", bench.BAR_LARGE_FWDBWD))
    height = max(3.0, 0.28 * len(cases) * max(1, len(provs)) / 2 + 1.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), height), sharey=True,
                             squeeze=False)
    bar_h = 0.8 / len(provs)
    for ax, (field, title, large_target) in zip(axes[0], panels):
        for i, p in enumerate(provs):
            ys, xs = [], []
            for j, c in enumerate(cases):
                r = val.get((c, p))
                v = bench._num(r.get(field)) if r is not None and bench._truthy(
                    r.get("available")) else None
                if v is not None:
                    ys.append(j + (i - (len(provs) - 1) / 2) * bar_h)
                    xs.append(v)
            label, colour = PROVIDER_STYLE.get(p, (p, None))
            ax.barh(ys, xs, height=bar_h, label=label, color=colour)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.axvline(large_target, color="#1f77b4", ls="--", lw=1,
                   label=f"bar ≥ {large_target:g} (≥ 256 MiB)")
        ax.axvline(bench.BAR_MID_FWDBWD, color="#555555", ls=":", lw=1,
                   label=f"bar ≥ {bench.BAR_MID_FWDBWD:g} (64 MiB, fwd+bwd)")
        ax.set_title(f"{title}: copy time ÷ provider time", fontsize=10)
        ax.set_xlabel("ratio to a device copy of the same bytes (1.0 = floor)")
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(0, max(1.1, ax.get_xlim()[1]))
    axes[0][0].set_yticks(range(len(cases)))
    axes[0][0].set_yticklabels(cases, fontsize=7)
    axes[0][0].invert_yaxis()
    for ax in axes[0]:  # below each panel: the bars fill the plot area from 0 to ~1
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.045), ncol=3)
    fig.suptitle(f"RoPE vs the copy floor ({d['path'].name})\n{_provenance(d)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_seed(d: dict, path: Path) -> Path:
    """GB/s vs seq_len, one panel per batch; providers as lines, the copy dashed."""
    rows = d["rows"]
    batches = sorted({bench._int(r.get("batch")) for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.8), sharey=True,
                             squeeze=False)
    provs = [p for p in PROVIDER_STYLE if _avail(rows, p)]
    for ax, b in zip(axes[0], batches):
        brows = [r for r in rows if bench._int(r.get("batch")) == b]
        for p in provs:
            pts = sorted((bench._int(r["seq_len"]), bench._num(r.get("fwd_gbps")))
                         for r in _avail(brows, p) if bench._num(r.get("fwd_gbps")) is not None)
            if pts:
                label, colour = PROVIDER_STYLE[p]
                ax.plot(*zip(*pts), marker="o", ms=2.5, lw=1.2, label=label, color=colour)
        # the copy's GB/s with the same bytes model (x read + y written; no table to read)
        copy = {}
        for r in brows:
            c = bench._num(r.get("copy_fwd_ms"))
            if c:
                copy[bench._int(r["seq_len"])] = 2 * bench.row_bytes(r) / c / 1e6
        if copy:
            xs = sorted(copy)
            ax.plot(xs, [copy[x] for x in xs], color="black", ls="--", lw=1, label="copy (floor)")
        ax.set_title(f"batch {b}", fontsize=10)
        ax.set_xlabel("sequence length")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("forward GB/s (read x + write y + table)")
    axes[0][-1].legend(fontsize=7)
    first = rows[0]
    fig.suptitle(f"Sweep: {first.get('dtype')} {first.get('layout')}, heads "
                 f"{first.get('heads')}, head_dim {first.get('head_dim')} ({d['path'].name})\n"
                 f"{_provenance(d)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def decode_rows(d: dict) -> list:
    return [r for r in d["rows"] if bench._int(r.get("seq_len")) == 1]


def plot_decode(d: dict, path: Path) -> Path:
    """Decode latency in µs per layout: launched (do_bench) and under CUDA-graph replay."""
    rows = decode_rows(d)
    cases = list(dict.fromkeys(bench.case_key(r) for r in rows))
    series = [("copy", "copy_fwd_ms", None, "black"), ("copy, graph", "graph_copy_fwd_ms", None,
                                                       "#444444")]
    for p in RATIO_PROVIDERS:
        if _avail(rows, p):
            label, colour = PROVIDER_STYLE[p]
            series.append((label, "fwd_ms", p, colour))
            if any(bench._num(r.get("graph_fwd_ms")) is not None for r in _avail(rows, p)):
                series.append((label + ", graph", "graph_fwd_ms", p, colour))
    drawn = []
    for label, field, prov, colour in series:  # only series with at least one value
        vals = []
        for c in cases:
            crow = [r for r in rows if bench.case_key(r) == c]
            src = crow if prov is None else _avail(crow, prov)
            vals.append(next((bench._num(r.get(field)) for r in src
                              if bench._num(r.get(field)) is not None), None))
        if any(v is not None for v in vals):
            drawn.append((label, colour, vals))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(cases) + 2), 4))
    w = 0.8 / max(1, len(drawn))
    for i, (label, colour, vals) in enumerate(drawn):
        xs = [j + (i - (len(drawn) - 1) / 2) * w for j, v in enumerate(vals) if v is not None]
        ys = [v * 1e3 for v in vals if v is not None]
        graph = "graph" in label
        ax.bar(xs, ys, width=w, label=label, color=colour, alpha=0.5 if graph else 1.0,
               hatch="//" if graph else None, edgecolor=colour)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, fontsize=8)
    ax.set_ylabel("forward latency per call (µs)")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"Decode size (s=1): launched vs CUDA-graph replay ({d['path'].name})\n"
                 f"{_provenance(d)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


# --- headline table -----------------------------------------------------------------------

def _rel(path: Path) -> str:
    """The path relative to the repository when it is inside it (as the README links it)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _ms(v) -> str:
    v = bench._num(v)
    if v is None:
        return "–"
    return f"{v * 1e3:.1f} µs" if v < 0.1 else f"{v:.3f} ms"


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def headline(targets: dict, decode: dict = None) -> str:
    """Markdown: the headline cases (one per group and dtype), then every case's verdict."""
    rows = targets["rows"]
    summary = bench.summarize(rows)
    mine = {s["case"]: s for s in summary if s["provider"] == bench.ROPELIB}
    by = {(bench.case_key(r), r["provider"]): r for r in rows}
    out = [f"Measured with `python -m ropelib.bench --suite {targets['suite']}` — "
           f"{_provenance(targets).replace(chr(10), ' — ')}; CSV: "
           f"`{_rel(targets['path'])}`. Ratio = copy time ÷ ropelib time "
           "(median of do_bench, same run); ×TE and ×compile = their time ÷ ropelib's.", ""]
    out += ["| case | MiB | copy fwd | ropelib fwd | ratio fwd | ratio fwd+bwd | ×TE fused "
            "| ×torch.compile | bars cleared? |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    picked, seen = [], set()
    for s in mine.values():  # first case of each group and dtype: the headline rows
        r = by[(s["case"], bench.ROPELIB)]
        key = (r.get("group"), r.get("dtype"), r.get("layout") if r.get("group") in (
            "64mib", "decode") else None)
        if key not in seen:
            seen.add(key)
            picked.append(s)
    for s in picked:
        r = by[(s["case"], bench.ROPELIB)]
        out.append(f"| {s['case']} | {s['bytes'] / bench.MiB:.1f} | {_ms(r.get('copy_fwd_ms'))} "
                   f"| {_ms(r.get('fwd_ms'))} | {_x(s['ratio_fwd'])} | {_x(s['ratio_fwdbwd'])} "
                   f"| {_x(s['vs_te_fwd'])} | {_x(s['vs_compile_fwd'])} | {s['target']} |")
    counts = bench.verdict_counts(summary)
    out += ["", "All cases: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + "."]
    misses = [s for s in mine.values() if s["target"] != "yes"]
    if misses:
        out += ["", "Not met or not fully measured:", ""]
        out += [f"- `{s['case']}` — {s['target']}: {s['missed']}" for s in misses]
    if decode is not None and decode_rows(decode):
        out += ["", f"Decode size (`{_rel(decode['path'])}`): latency under CUDA-graph replay, "
                "and the host cost of an eager call (calls back to back, same process):", "",
                "| case | copy | ropelib | TE fused | torch.compile | host ropelib fwd / fwd+bwd "
                "| host TE fwd / fwd+bwd |", "|---|---:|---:|---:|---:|---:|---:|"]
        dby = {(bench.case_key(r), r["provider"]): r for r in decode_rows(decode)}

        def host(r):
            if r is None or bench._num(r.get("host_fwd_us")) is None:
                return "–"
            return f"{bench._num(r['host_fwd_us']):.1f} / {bench._num(r['host_fwdbwd_us']):.1f} µs"
        for c in dict.fromkeys(bench.case_key(r) for r in decode_rows(decode)):
            cells = []
            for p in (bench.ROPELIB, bench.TE_FUSED, bench.TORCH_COMPILE):
                r = dby.get((c, p))
                cells.append(_ms(r.get("graph_fwd_ms")) if r is not None else "–")
            anyrow = next(r for (cc, _), r in dby.items() if cc == c)
            out.append(f"| {c} | {_ms(anyrow.get('graph_copy_fwd_ms'))} | " + " | ".join(cells)
                       + f" | {host(dby.get((c, bench.ROPELIB)))} "
                       f"| {host(dby.get((c, bench.TE_FUSED)))} |")
    out += ["", "<details><summary>Every case (ropelib)</summary>", "",
            "| case | ratio fwd | ratio fwd+bwd | graph fwd+bwd | ×TE fused | ×torch.compile "
            "| bars cleared? |",
            "|---|---:|---:|---:|---:|---:|---|"]
    out += [f"| {s['case']} | {_x(s['ratio_fwd'])} | {_x(s['ratio_fwdbwd'])} | "
            f"{_x(s['graph_ratio_fwdbwd'])} | {_x(s['vs_te_fwd'])} | {_x(s['vs_compile_fwd'])} "
            f"| {s['target']} |" for s in mine.values()]
    out += ["", "</details>", ""]
    return "\n".join(out)


# --- main ---------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", action="append", default=None,
                    help="a CSV to draw (repeatable); default: the newest per suite in --results")
    ap.add_argument("--results", default=str(RESULTS_DIR), help="where the CSVs are")
    ap.add_argument("--figures", default=str(FIGURES_DIR), help="where the PNGs go")
    ap.add_argument("--headline", default=None,
                    help="markdown output (default: <results>/headline.md)")
    ap.add_argument("--allow-interpreter", action="store_true",
                    help="also draw CPU-interpreter CSVs (labelled: timings meaningless)")
    args = ap.parse_args(argv)
    try:
        suites = pick(args.csv, Path(args.results), args.allow_interpreter)
    except NoResults as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    figs = Path(args.figures)
    figs.mkdir(parents=True, exist_ok=True)
    written = []
    # ratio bars: the targets suite (else any suite with large cases, e.g. quick)
    main_d = suites.get("targets") or next(
        (d for s, d in suites.items() if s not in ("decode", "seed", "sweep")), None)
    if main_d is not None:
        written.append(plot_ratio(main_d, figs / "perf-ratio.png"))
    sweep = suites.get("sweep") or suites.get("seed")   # (earlier runs named the suite "seed")
    if sweep is not None:
        written.append(plot_seed(sweep, figs / "perf-seed-gbps.png"))
    dec = suites.get("decode") or next((d for d in suites.values() if decode_rows(d)), None)
    if dec is not None and decode_rows(dec):
        written.append(plot_decode(dec, figs / "perf-decode.png"))
    if main_d is not None:
        md = Path(args.headline) if args.headline else Path(args.results) / "headline.md"
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(headline(main_d, dec))
        written.append(md)
    if not written:
        print("plot.py: the CSVs hold no case to draw", file=sys.stderr)
        return 2
    for w in written:
        print(f"wrote {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
