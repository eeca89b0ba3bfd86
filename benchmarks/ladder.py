"""The ladder from the batch-reusing grid to the finished kernel, timed one rung at a time.

    python benchmarks/ladder.py --out benchmarks/results/ladder-nvidia-h200.csv   # on a GPU (~1 min)
    python benchmarks/ladder.py --processes 5 --out benchmarks/results/ladder_runs-nvidia-h100-80gb-hbm3.csv
    TRITON_INTERPRET=1 python benchmarks/ladder.py --dry-run          # CPU: tiny shapes, no timing

Notebook 05 (the finished kernel) builds ropelib's finished kernel in rungs, each adding one
idea (ropelib/course/ladder.py, where the kernels are defined; the notebook shows and runs the same
code). This script times, at bf16 sbhd sizes, a device copy `y.copy_(x)` (the floor), every
rung, and ropelib.apply_rope (the product, all features):

* s4096-b8   s=4096, b=8, h=32, d=128 (256 MiB): a batch loop of 8 to reuse cos/sin over;
* s16384-b8-h8  8 heads (the k of a GQA model), 256 MiB: one token's heads fill a tile only
             an eighth as much, so the tile must span tokens too;
* s32768-b1  the same bytes with b=1: nothing to reuse over the batch, sin/cos per row;
* s16-b64    16 tokens of a batch of 64 (8 MiB): too few (token, head) tiles to fill the GPU
             unless the batch is split into chunks.

Every output is checked against `ropelib.reference` (fp64) before it is timed, and the last rung
against ropelib's finished kernel bit for bit. Timings are `triton.testing.do_bench` medians
(20 %/80 % quantiles alongside, the L2 cache flushed between runs) in ms, each rung writing into
a preallocated output; GB/s uses ropelib.bench.compare's bytes model (x read + y written + the fp32
angle table read once), `pct_of_copy` compares with the copy timed in the same run. The CSV
starts with `# key: value` lines (GPU, driver, versions, date) that ropelib.bench.compare reads back;
`plot_waterfall` draws the "% of copy" waterfall of notebook 05 from it.

One process times every rung once, in a fixed order: a step of a few points can be that
process's luck (where its tensors landed, the clocks while it ran). `--processes N` runs the
whole ladder in N fresh processes one after another, process k timing each case's rungs in an
order shuffled with seed k, and writes their rows into one CSV with a `run` column (1..N);
`ropelib.course.ladder.steps_by_run` reads a step per process from it.
"""
import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit in ropelib

import triton  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import ropelib  # noqa: E402
from ropelib import reference, runtime  # noqa: E402
from ropelib.bench import compare, routes  # noqa: E402
from ropelib.course import ladder  # noqa: E402

CSV_PATH = REPO_ROOT / "benchmarks" / "results" / "ladder.csv"
FIGURE_PATH = REPO_ROOT / "figures" / "05-ladder-waterfall.png"
# ropelib: the finished kernel (the route forced: at these sizes apply_rope itself plans the
# two-pass route of notebook 05's section 6); ropelib_planned: apply_rope as it plans
PROVIDERS = ("copy",) + ladder.NAMES + ("ropelib", "ropelib_planned")
FIELDS = ["case", "seq_len", "batch", "heads", "head_dim", "dtype", "provider", "step", "idea",
          "available", "reason", "grid", "num_warps", "block_s", "block_h", "chunk",
          "max_head_ulp_err", "bit_equal_ropelib", "ms", "ms_p20", "ms_p80", "gbps", "copy_gbps",
          "pct_of_copy"]


def cases(dry_run: bool):
    """[(name, S, B, H, D)], bf16 sbhd."""
    if dry_run:  # interpreter-sized; D = 24: a half of 12 in a 16-lane tile (masked lanes)
        return [("tiny", 5, 3, 3, 24), ("tiny-b1", 7, 1, 2, 16)]
    return [("s4096-b8", 4096, 8, 32, 128), ("s16384-b8-h8", 16384, 8, 8, 128),
            ("s32768-b1", 32768, 1, 32, 128), ("s16-b64", 16, 64, 32, 128)]


def _launch_columns(rung, x):
    if rung == "batch_reuse":
        S, B, H, _ = x.shape
        return dict(grid=f"{S}x{H}", num_warps="", block_s=1, block_h=1, chunk=B)
    sm, knobs = ladder.device_knobs(x)
    p = ladder.plan(rung, *x.shape, x.element_size(), sm, knobs)
    return dict(grid="x".join(map(str, p.grid)), num_warps=p.num_warps, block_s=p.block_s,
                block_h=p.block_h, chunk=p.chunk)


def run(dry_run: bool, progress: bool = True, order_seed=None):
    """Check every provider's output on every case; time it unless dry_run. Returns rows, each
    case's in the ladder's order. order_seed: time each case's providers after the copy in an
    order shuffled with this seed (None: the ladder's order)."""
    if not dry_run and not runtime.on_gpu():
        raise SystemExit(f"{runtime.mode()}: timings need a GPU; use --dry-run here")
    device = runtime.default_device()
    rows = []
    for case, S, B, H, D in cases(dry_run):
        if progress:
            print(f"{case}: sbhd s={S}, b={B}, h={H}, d={D}, bf16", flush=True)
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(S, B, H, D, device=device, dtype=torch.bfloat16, generator=gen)
        freqs = compare.angles(S, D).to(device).view(S, 1, 1, D)
        want = reference.rope_reference(x.double(), freqs)   # fp64
        finished = routes.through("finished", lambda: ropelib.apply_rope(x, freqs, layout="sbhd"))
        nbytes = compare.bytes_moved(compare.Config(S, B, H, D, dtype="bf16"))
        y = torch.empty_like(x)
        copy_ms = copy_gbps = None
        if not dry_run:
            copy_ms = triton.testing.do_bench(lambda: y.copy_(x), quantiles=[0.5, 0.2, 0.8])
            copy_gbps = 2 * x.numel() * x.element_size() / copy_ms[0] / 1e6
        order = list(enumerate(PROVIDERS))
        if order_seed is not None:     # the copy first (the others' yardstick), the rest shuffled
            rest = order[1:]
            random.Random(f"{order_seed}-{case}").shuffle(rest)
            order = order[:1] + rest
        first = len(rows)
        for step, provider in order:
            row = dict(case=case, seq_len=S, batch=B, heads=H, head_dim=D, dtype="bf16",
                       provider=provider, step=step, available=True, reason="")
            if provider == "copy":
                row.update(idea="y.copy_(x): the least any kernel must move")
                if copy_ms:
                    row.update(ms=copy_ms[0], ms_p20=copy_ms[1], ms_p80=copy_ms[2],
                               gbps=copy_gbps, copy_gbps=copy_gbps, pct_of_copy=100.0)
                rows.append(row)
                continue
            route = contextlib.nullcontext()
            if provider == "ropelib":
                row.update(idea="ropelib.apply_rope through the finished kernel (route forced), "
                                "every feature")
                route = routes.forced("finished")
                fn = lambda: ropelib.apply_rope(x, freqs, layout="sbhd")  # noqa: E731
            elif provider == "ropelib_planned":
                row.update(idea="ropelib.apply_rope as planned (the two-pass route at 64 MiB "
                                "and more)")
                fn = lambda: ropelib.apply_rope(x, freqs, layout="sbhd")  # noqa: E731
            else:
                rung = ladder.RUNGS[ladder.NAMES.index(provider)]
                row.update(idea=rung.idea, **_launch_columns(provider, x))
                fn = lambda r=provider: ladder.rope_ladder(r, x, freqs, out=y)  # noqa: E731
            with route:
                try:
                    y.fill_(float("nan"))   # an element a rung does not write stays NaN
                    out = fn()
                    err = compare.error_metrics(out, want)["max_head_ulp_err"]
                except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop
                    row.update(available=False, reason=f"{type(exc).__name__}: {exc}"[:200])
                    rows.append(row)
                    if progress:
                        print(f"  {provider:14s} failed: {row['reason']}", flush=True)
                    continue
                row["max_head_ulp_err"] = err
                if provider == ladder.NAMES[-1]:
                    row["bit_equal_ropelib"] = bool(torch.equal(out, finished))
                if not err <= 1.0:
                    row.update(available=False,
                               reason=f"output differs from the reference ({err:.2f} head ulps)")
                elif not dry_run:
                    ms = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
                    gbps = nbytes / ms[0] / 1e6
                    row.update(ms=ms[0], ms_p20=ms[1], ms_p80=ms[2], gbps=gbps,
                               copy_gbps=copy_gbps, pct_of_copy=100.0 * gbps / copy_gbps)
            rows.append(row)
            if progress:
                print("  " + line(row), flush=True)
        rows[first:] = sorted(rows[first:], key=lambda r: r["step"])
    return rows


def run_processes(n: int, out: Path) -> list:
    """The ladder in n fresh processes, one after another (process k: order seed k); their rows
    with a `run` column, written to `out` under the first process's provenance lines."""
    rows, meta = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, n + 1):
            path = Path(tmp) / f"run-{k}.csv"
            subprocess.run([sys.executable, __file__, "--out", str(path), "--order-seed", str(k)],
                           check=True)
            meta = meta or compare.read_meta(path)
            rows += [dict(r, run=k) for r in compare.read_csv(path)]
    meta.update(processes=n, order="process k times each case's rungs in an order shuffled "
                                    "with seed k, the copy first")
    compare.write_csv(rows, out, meta=meta, fields=["run"] + FIELDS)
    return rows


def line(row) -> str:
    """One printed line per row."""
    if not row.get("available"):
        return f"{row['provider']:14s} not run: {row.get('reason')}"
    if row.get("ms") is None:
        extra = "" if row.get("bit_equal_ropelib") is None else \
            f", bit-equal to ropelib: {row['bit_equal_ropelib']}"
        return (f"{row['provider']:14s} output checked "
                f"({row.get('max_head_ulp_err', 0):.2f} head ulps{extra})")
    return (f"{row['provider']:14s} {row['ms']:8.4f} ms {row['gbps']:7.0f} GB/s "
            f"{row['pct_of_copy']:5.1f}% of copy")


def write(rows, path) -> str:
    """The rows to CSV, after `# key: value` provenance lines (ropelib.bench.compare.read_meta)."""
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/ladder.py"
    meta["bytes_model"] = "x read + y written + fp32 angles [S, D] read once; copy: x + y"
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if runtime.on_gpu() else \
        "none (dry run: outputs checked only)"
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)


def table(rows) -> str:
    """The printed summary: per case, each rung's time, % of copy and gain over the rung before."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        r0 = rs[0]
        out.append(f"\n{case}: sbhd s={r0['seq_len']}, b={r0['batch']}, h={r0['heads']}, "
                   f"d={r0['head_dim']}, bf16")
        out.append(f"{'step':>4s} {'provider':14s} {'grid':>12s} {'warps':>5s} {'ms':>9s} "
                   f"{'GB/s':>7s} {'% copy':>7s} {'vs prev':>8s}")
        prev = None
        for r in rs:
            head = (f"{r['step']:4d} {r['provider']:14s} {str(r.get('grid') or ''):>12s} "
                    f"{str(r.get('num_warps') or ''):>5s}")
            if r.get("ms") is None:
                out.append(head + " " + ("(output checked, not timed)" if r.get("available")
                                         else f"not run: {r.get('reason')}"))
                continue
            gain = f"{prev / r['ms']:.2f}x" if prev and r["provider"] not in ("copy",) else ""
            out.append(head + f" {r['ms']:9.4f} {r['gbps']:7.0f} {r['pct_of_copy']:6.1f}% "
                       f"{gain:>8s}")
            if r["provider"] != "copy":
                prev = r["ms"]
    return "\n".join(out)


# the waterfall with each timing's spread, as notebook 05 draws it (one function for both)
plot_waterfall = ladder.plot_waterfall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help=f"CSV path (the committed results: {CSV_PATH.relative_to(REPO_ROOT)})")
    ap.add_argument("--figure", type=Path, default=None,
                    help=f"also draw the waterfall there (committed: "
                         f"{FIGURE_PATH.relative_to(REPO_ROOT)})")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check every output, time nothing")
    ap.add_argument("--order-seed", type=int, default=None,
                    help="time each case's rungs in an order shuffled with this seed")
    ap.add_argument("--processes", type=int, default=None,
                    help="run the whole ladder in this many fresh processes into one CSV "
                         "(a `run` column; process k shuffles with seed k)")
    args = ap.parse_args(argv)
    if args.processes is not None:
        if args.processes < 1 or args.out is None or args.dry_run:
            ap.error("--processes takes a count of at least 1 and --out, and times (no --dry-run)")
        rows = run_processes(args.processes, args.out)
        print(f"wrote {args.out}: {len(rows)} rows from {args.processes} processes")
        return 0
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    if args.dry_run and args.out is not None and args.out.resolve() == CSV_PATH.resolve():
        ap.error("a dry run must not replace the committed GPU results: pass --out elsewhere")
    print(runtime.mode())
    rows = run(args.dry_run, order_seed=args.order_seed)
    print(table(rows))
    failed = [f"{r['case']}/{r['provider']}" for r in rows if not r.get("available")]
    failed += [f"{r['case']}/{r['provider']} (not bit-equal to ropelib)" for r in rows
               if r.get("bit_equal_ropelib") is False and not runtime.on_gpu()]
    if args.out is not None:
        print("wrote", write(rows, args.out))
    if args.figure is not None and not args.dry_run:
        plot_waterfall(rows, args.figure)
        print("drew", args.figure)
    if failed:
        print("failed or differ:", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
