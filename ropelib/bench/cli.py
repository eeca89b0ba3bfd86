"""`python -m ropelib.bench`: the command line of the benchmark suites (`ropelib.bench.suite`)
and of the floor suite (`ropelib.bench.floor`); `--help` lists the options. Both suites are
libraries; this module only parses the arguments and hands them over, so neither imports the
other's entry point."""
import argparse
import re
import sys
import time
from pathlib import Path

from . import compare, floor, suite
from .compare import environment_meta, write_csv
from .suite import (DTYPES, MiB, SUITES, SUMMARY_PROVIDERS, config_bytes, format_summary,
                    out_path, run_suite, select_providers,
                    suite_cases, summarize, verdict_counts, warm_allocator)
from ..runtime import INTERPRET, on_gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ropelib.bench",
                                 description=suite.__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=SUITES, default="targets",
                    help="targets: every performance bar (~5 min on an H100); quick: tiny "
                         "shapes (runs on a CPU); decode: s=1 b=64 h=32 d=128, host cost and CUDA "
                         "graphs; sweep: fp32 over seq_len and batch; floor: every "
                         "row of the README's performance table, floor-<gpu>.csv (~5 min on an "
                         "H100; tiny shapes on a CPU)")
    ap.add_argument("--dtype", default=None,
                    help=f"comma list from {','.join(DTYPES)}: restricts the suite's dtypes "
                         "(decode/sweep: replaces them)")
    ap.add_argument("--providers", default=None,
                    help=f"comma list from {','.join(compare.PROVIDER_NAMES)} (default: all; "
                         f"sweep: {','.join(compare.SEED_PROVIDERS)}; floor: the plain RoPE "
                         "rows only); the copy floor is always measured")
    ap.add_argument("--out", default=None,
                    help="CSV path, or a folder for <suite>-<gpu-slug>-<date>.csv (default: "
                         "the current folder; a temp dir when not on a GPU)")
    ap.add_argument("--into", default=None, type=Path, metavar="CSV",
                    help="floor: write the rows of the parts --cases selects into this floor CSV "
                         "of the same GPU, in place of its rows of those parts (its header "
                         "names the run they come from)")
    ap.add_argument("--fwd-only", action="store_true", help="skip the forward+backward timings")
    ap.add_argument("--full-matrix", action="store_true",
                    help="targets: the whole dtype x layout x mode product (~7 min on an H100)")
    ap.add_argument("--cases", default=None, metavar="REGEX",
                    help="only the cases whose name matches this regular expression")
    ap.add_argument("--graph-calls", type=int, default=100,
                    help="calls captured per CUDA graph for the decode latency (default 100)")
    ap.add_argument("--summary-all", action="store_true",
                    help="summary table with every provider (default: ropelib, te_fused, "
                         "torch.compile)")
    compare.add_round_order_arguments(ap, prefix="rounds-", default="fixed",
                                      what="forward+backward timings")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--reserve-gib", type=float, default=16.0,
                    help="GPU: fill PyTorch's caching allocator with this many GiB before the "
                         "first case (allocated and freed), so no case pays for cudaMalloc "
                         "while it is timed, as in a training process past its first steps "
                         "(0: off; benchmarks/NOTES.md, version 10)")
    args = ap.parse_args(argv)
    compare.use_round_order(args, prefix="rounds-")

    if args.suite == "floor":
        return _floor_main(ap, args)
    if args.into is not None:
        ap.error("--into applies to --suite floor only")
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()] if args.dtype else None
    try:
        cases = suite_cases(args.suite, dtypes, args.full_matrix)
    except ValueError as e:
        ap.error(str(e))
    if args.cases:
        try:
            rx = re.compile(args.cases)
        except re.error as e:
            ap.error(f"--cases is not a regular expression: {e}")
        cases = [c for c in cases if rx.search(c.name)]
        if not cases:
            ap.error(f"--cases {args.cases!r} matches no case of suite {args.suite!r}")
    if args.graph_calls < 1:
        ap.error("--graph-calls must be >= 1")
    if args.reserve_gib < 0:
        ap.error("--reserve-gib must be >= 0")
    if args.list:
        for c in cases:
            print(f"{c.name:36s} {config_bytes(c.config) / MiB:9.2f} MiB"
                  + ("  + CUDA graph" if c.graph else "")
                  + ("  + fwd+bwd under CUDA graph" if c.graph_fwdbwd else "")
                  + ("  + host cost" if c.host else ""))
        print(f"{len(cases)} cases")
        return 0
    if not on_gpu() and not INTERPRET:
        ap.error("no CUDA GPU: run on the CPU with TRITON_INTERPRET=1 set before Python starts "
                 "(TRITON_INTERPRET=1 python -m ropelib.bench --suite quick)")
    if not on_gpu() and args.suite != "quick":
        ap.error(f"--suite {args.suite} needs a CUDA GPU (full sizes); on a CPU use --suite quick")
    names = [n.strip() for n in args.providers.split(",") if n.strip()] if args.providers else None
    if names is None and args.suite == "sweep":
        names = list(compare.SEED_PROVIDERS)  # 120 cases: keep the comparison lean
    try:
        provs = select_providers(names)
    except ValueError as e:
        ap.error(str(e))

    meta = environment_meta()
    meta["suite"] = args.suite
    if on_gpu() and args.reserve_gib > 0:
        warm_allocator(args.reserve_gib)
        meta["allocator_reserved_gib"] = f"{args.reserve_gib:g}"
    out = out_path(args.out, args.suite, meta)
    if not on_gpu():
        print("CPU, Triton interpreter: timings are wall-clock and MEANINGLESS (plumbing only).",
              file=sys.stderr)
    print(f"{args.suite}: {len(cases)} cases; providers: "
          + ", ".join(p.name + ("" if p.available else " (unavailable)") for p in provs),
          file=sys.stderr)
    t0 = time.time()
    rows = run_suite(cases, provs, backward=not args.fwd_only, graph_calls=args.graph_calls,
                     device="cuda" if on_gpu() else "cpu")
    elapsed = time.time() - t0
    for r in rows:
        r["suite"] = args.suite
    meta["elapsed_s"] = f"{elapsed:.0f}"
    write_csv(rows, out, meta=meta)
    summary = summarize(rows)
    print(format_summary(summary, None if args.summary_all else SUMMARY_PROVIDERS))
    counts = verdict_counts(summary)
    print("\nropelib's bars, cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(rows)} rows, {len(cases)} cases in {elapsed:.0f} s -> {out}")
    return 0


def _floor_main(ap, args) -> int:
    """--suite floor: check the options that apply, list or run ropelib.bench.floor."""
    for given, option in ((args.dtype, "--dtype"), (args.fwd_only, "--fwd-only"),
                          (args.full_matrix, "--full-matrix")):
        if given:
            ap.error(f"{option} does not apply to --suite floor (its rows are fixed)")
    if args.graph_calls < 1:
        ap.error("--graph-calls must be >= 1")
    if args.into is not None and (not args.cases or args.out):
        ap.error("--into needs --cases (the parts to measure again) and no --out")
    if args.into is not None:
        try:
            base_gpu = floor.read(args.into).meta.get("gpu")
        except (OSError, ValueError) as e:
            ap.error(f"--into {args.into}: not a floor CSV ({e})")
        if base_gpu != environment_meta()["gpu"]:
            ap.error(f"--into {args.into}: measured on {base_gpu!r}, this machine has "
                     f"{environment_meta()['gpu']!r}: a floor CSV holds one GPU's rows")
    if args.reserve_gib < 0:
        ap.error("--reserve-gib must be >= 0")
    try:
        selected = floor.select_parts(floor.parts(tiny=not on_gpu()), args.cases)
    except re.error as e:
        ap.error(f"--cases is not a regular expression: {e}")
    if not selected:
        ap.error(f"--cases {args.cases!r} matches no row of suite 'floor'")
    if args.list:
        for part in selected:
            print(part.name)
            for name in part.case_names:
                print(f"    {name}")
        print(f"{len(selected)} parts, {sum(len(p.case_names) for p in selected)} row names")
        return 0
    if not on_gpu() and not INTERPRET:
        ap.error("no CUDA GPU: run on the CPU with TRITON_INTERPRET=1 set before Python starts "
                 "(TRITON_INTERPRET=1 python -m ropelib.bench --suite floor --out floor.csv)")
    names = [n.strip() for n in args.providers.split(",") if n.strip()] if args.providers else None
    try:
        provs = select_providers(names)
    except ValueError as e:
        ap.error(str(e))
    reserved = 0.0
    if on_gpu() and args.reserve_gib > 0:
        warm_allocator(args.reserve_gib)
        reserved = args.reserve_gib
    out = out_path(args.out, "floor", environment_meta())
    if not on_gpu():
        print("CPU, Triton interpreter: tiny shapes, timings MEANINGLESS (plumbing only).",
              file=sys.stderr)
    print("floor: providers " + ", ".join(p.name + ("" if p.available else " (unavailable)")
                                          for p in provs), file=sys.stderr)
    return floor.main(provs, out, selected, args.graph_calls, reserved, into=args.into)


if __name__ == "__main__":
    sys.exit(main())
