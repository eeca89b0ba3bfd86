"""Why is a batch-reusing Triton RoPE kernel faster than Transformer Engine's? An ablation.

    python benchmarks/ablation.py --out benchmarks/results/ablation-nvidia-h200.csv   # on a GPU (~2 min)
    TRITON_INTERPRET=1 python benchmarks/ablation.py --dry-run            # CPU: tiny shapes, no timing

Notebook 04 retells an earlier project whose (S, H)-grid Triton kernel, which computes cos/sin
once per (position, head) and loops over the batch, beat Transformer Engine's fused RoPE. Reusing
cos/sin cannot be the reason by itself: TE's `fused_rope.cu` launches a grid (s, b) and reuses the
cos/sin of a position across all h heads, so per position it evaluates them b times where the
(S, H) grid evaluates them h times. This script times, at large bf16 sbhd sizes, kernels that
differ in one factor at a time, so each factor's share can be read off:

* the floor: a device copy `y.copy_(x)` of the same tensor, and the references: TE fused (if
  installed), ropelib's naive kernel, its batch-reuse kernel and its finished kernel;
* one ablation kernel with switches (`_rope_ablation_kernel` in
  ropelib/course/kernels/ablation.py, which notebook 04 shows in a cell a learner can edit), each
  row (`variants`) changing one of them:
  - batch per program: all B rows (cos/sin reused over the batch) vs one (grid (S, H, B));
  - cos/sin computed from the angles vs read from precomputed fp32 cos and sin tables;
  - the batch loop at run time (`range`) vs unrolled at compile time (`tl.static_range`);
  - heads per program (the tile's rows): 1 (the (S, H) grid), 2, 4, 8, and all H with one batch
    row per program, which is TE's grid (s, b) written in Triton;
  - warps per program (with the tile, this sets how many contiguous elements each thread moves).

Every variant's output is checked against `ropelib.reference` (fp64) before it is timed. Timings
are `triton.testing.do_bench` medians (20 %/80 % quantiles alongside) in ms; GB/s uses
ropelib.bench.compare's bytes model (x read + y written + the fp32 angle table read once) for every
kernel row, so GB/s ratios between kernels are time ratios; the copy's GB/s counts x and y only.
`pct_of_copy` is 100 * copy ms / kernel ms, against the copy timed in the same run: a ratio of
times, as benchmarks/generations.py's `pct_of_copy` (a ratio of the GB/s would count the angle
table for the kernel and not for the copy). CSVs written before this definition held
100 * gbps / copy_gbps in that column; the committed ones carry the time ratio (their header's
`pct_of_copy` line says so).
The CSV starts with `# key: value` lines (GPU, driver, versions, date) that ropelib.bench.compare
reads back. `--dry-run` runs every variant through Triton's interpreter on tiny shapes and
checks its output; it times nothing.
"""
import argparse
import contextlib
import os
import sys
from pathlib import Path

try:  # Transformer Engine first: it loads its own CUDA libraries before torch and triton do
    import transformer_engine.pytorch  # noqa: F401
    TE_WHY = ""
except Exception as exc:  # noqa: BLE001 -- optional; the reason goes into the CSV
    TE_WHY = f"Transformer Engine not importable ({type(exc).__name__})"

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
# the ablation kernel, its launcher and its rows: ropelib/course/kernels/ablation.py
from ropelib.course.kernels.ablation import rope_ablation, shape_columns, variants  # noqa: E402
from ropelib.course.kernels.batch_reuse import rope_batch_reuse  # noqa: E402
from ropelib.course.kernels.naive import rope_naive  # noqa: E402

PCT_OF_COPY = "100 * copy ms / ms (the copy of the same case, same run)"
CSV_PATH = REPO_ROOT / "benchmarks" / "results" / "ablation.csv"
FIELDS = ["case", "seq_len", "batch", "heads", "head_dim", "dtype", "variant", "factor",
          "description", "available", "reason", "grid", "programs", "heads_per_program",
          "batch_per_program", "batch_loop", "cos_sin", "num_warps", "tile_elems",
          "elems_per_thread", "cos_sin_per_position", "max_head_ulp_err", "ms", "ms_p20", "ms_p80",
          "gbps", "copy_gbps", "pct_of_copy"]


def cases(dry_run: bool):
    """[(name, S, B, H, D)]: bf16 sbhd; the second has b = 1 and the same bytes."""
    if dry_run:  # interpreter-sized; D = 24 makes a masked half (12 of 16 lanes)
        return [("tiny", 3, 3, 4, 16), ("tiny-b1", 4, 1, 3, 24)]
    return [("s4096-b8", 4096, 8, 32, 128), ("s32768-b1", 32768, 1, 32, 128)]


# --- the providers: the floor, the references and the ablation rows ---------------------------

def _te_apply():
    """TE's apply_rotary_pos_emb, or (None, why)."""
    if TE_WHY:
        return None, TE_WHY
    for module in ("transformer_engine.pytorch.attention.rope", "transformer_engine.pytorch.attention"):
        try:
            mod = __import__(module, fromlist=["apply_rotary_pos_emb"])
            return mod.apply_rotary_pos_emb, ""
        except (ImportError, AttributeError):
            continue
    return None, "apply_rotary_pos_emb not found in transformer_engine.pytorch.attention"


# providers timed with apply_rope's route forced (ropelib.bench.routes)
ROUTES = {"ropelib_finished": "finished"}


def providers(x, freqs4d, H):
    """[(name, factor, description, fn or None, options, why)] for one case."""
    freqs2d = freqs4d.reshape(freqs4d.shape[0], -1).contiguous()
    cos2d, sin2d = torch.cos(freqs2d), torch.sin(freqs2d)
    te, te_why = _te_apply()
    if te is not None and not runtime.on_gpu():
        te, te_why = None, "Transformer Engine needs a GPU"
    out = [
        ("copy", "floor", "y.copy_(x): the least any kernel must move", None, {}, ""),
        ("te_fused", "reference", "Transformer Engine apply_rotary_pos_emb(fused=True)",
         (lambda: te(x, freqs4d, tensor_format="sbhd", fused=True)) if te else None, {}, te_why),
        ("ropelib_naive", "reference", "ropelib naive kernel: grid (S*B*H,)",
         lambda: rope_naive(x, freqs4d), {}, ""),
        ("ropelib_batch_reuse", "reference", "ropelib batch-reuse kernel: grid (S, H), loop over B",
         lambda: rope_batch_reuse(x, freqs4d), {}, ""),
        ("ropelib_finished", "reference",
         "ropelib.apply_rope through the finished kernel (route forced)",
         lambda: ropelib.apply_rope(x, freqs4d, layout="sbhd"), {}, ""),
    ]
    for name, factor, desc, opts in variants(H):
        out.append((name, factor, desc,
                    (lambda o=opts: rope_ablation(x, freqs2d, cos2d, sin2d, **o)), opts, ""))
    return out


def run(dry_run: bool, progress: bool = True):
    """Check every provider's output on every case; time it unless dry_run. Returns rows."""
    if not dry_run and not runtime.on_gpu():
        raise SystemExit(f"{runtime.mode()}: timings need a GPU; use --dry-run here")
    device = runtime.default_device()
    rows = []
    for case, S, B, H, D in cases(dry_run):
        if progress:
            print(f"{case}: sbhd s={S}, b={B}, h={H}, d={D}, bf16", flush=True)
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(S, B, H, D, device=device, dtype=torch.bfloat16, generator=gen)
        freqs4d = compare.angles(S, D).to(device).view(S, 1, 1, D)
        want = reference.rope_reference(x.double(), freqs4d)  # fp64
        nbytes = compare.bytes_moved(compare.Config(S, B, H, D, dtype="bf16"))
        copy_bytes = 2 * x.numel() * x.element_size()
        y_copy = torch.empty_like(x)
        copy_ms = copy_gbps = None
        if not dry_run:
            copy_ms = triton.testing.do_bench(lambda: y_copy.copy_(x), quantiles=[0.5, 0.2, 0.8])
            copy_gbps = copy_bytes / copy_ms[0] / 1e6
        for name, factor, desc, fn, opts, why in providers(x, freqs4d, H):
            row = dict(case=case, seq_len=S, batch=B, heads=H, head_dim=D, dtype="bf16",
                       variant=name, factor=factor, description=desc, available=True, reason="")
            if opts or name.startswith(("sh_", "heads")):
                row.update(shape_columns(S, B, H, D, opts))
            if name == "copy":
                if copy_ms:
                    row.update(ms=copy_ms[0], ms_p20=copy_ms[1], ms_p80=copy_ms[2],
                               gbps=copy_gbps, copy_gbps=copy_gbps, pct_of_copy=100.0)
                rows.append(row)
                continue
            if fn is None:
                row.update(available=False, reason=why)
                rows.append(row)
                if progress:
                    print(f"  {name:24s} not run: {why}", flush=True)
                continue
            # the route forced for the whole check and timing (forcing it anew on every call
            # would time the planner: routes.forced clears the plans it made)
            with routes.forced(ROUTES[name]) if name in ROUTES else contextlib.nullcontext():
                try:
                    y = fn()
                    err = compare.error_metrics(y, want)["max_head_ulp_err"]
                except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop
                    row.update(available=False, reason=f"{type(exc).__name__}: {exc}"[:200])
                    rows.append(row)
                    if progress:
                        print(f"  {name:24s} failed: {row['reason']}", flush=True)
                    continue
                row["max_head_ulp_err"] = err
                if not err <= 1.0:
                    row.update(available=False, reason=f"output differs from the reference "
                                                        f"({err:.2f} head ulps)")
                elif not dry_run:
                    ms = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
                    gbps = nbytes / ms[0] / 1e6
                    row.update(ms=ms[0], ms_p20=ms[1], ms_p80=ms[2], gbps=gbps,
                               copy_gbps=copy_gbps, pct_of_copy=pct_of_copy(copy_ms[0], ms[0]))
            rows.append(row)
            if progress:
                print("  " + line(row), flush=True)
    return rows


def pct_of_copy(copy_ms: float, ms: float) -> float:
    """% of a copy: the copy's time over the kernel's, 100 at the copy's speed."""
    return 100.0 * copy_ms / ms


def line(row) -> str:
    """One printed line per row."""
    if not row.get("available"):
        return f"{row['variant']:24s} not run: {row.get('reason')}"
    if row.get("ms") is None:
        return f"{row['variant']:24s} output checked ({row.get('max_head_ulp_err', 0):.2f} head ulps)"
    return (f"{row['variant']:24s} {row['ms']:8.4f} ms {row['gbps']:7.0f} GB/s "
            f"{row['pct_of_copy']:5.1f}% of copy")


def write(rows, path) -> str:
    """The rows to CSV, after `# key: value` provenance lines (ropelib.bench.compare.read_meta)."""
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/ablation.py"
    meta["bytes_model"] = "x read + y written + fp32 angles [S, D] read once; copy: x + y"
    meta["pct_of_copy"] = PCT_OF_COPY
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if runtime.on_gpu() else \
        "none (dry run: outputs checked only)"
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)


def table(rows) -> str:
    """The printed summary: per case, every row's time and its ratio to the baseline variant."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        base = next((r for r in rs if r["variant"] == "sh_loop_b" and r.get("ms")), None)
        r0 = rs[0]
        out.append(f"\n{case}: sbhd s={r0['seq_len']}, b={r0['batch']}, h={r0['heads']}, "
                   f"d={r0['head_dim']}, bf16")
        out.append(f"{'variant':24s} {'factor':18s} {'ms':>9s} {'GB/s':>7s} {'% copy':>7s} "
                   f"{'vs sh_loop_b':>12s}")
        for r in rs:
            if r.get("ms") is None:
                out.append(f"{r['variant']:24s} {r['factor']:18s} "
                           + (("(output checked, not timed)" if r.get("max_head_ulp_err") is not None
                               else "(not timed)") if r.get("available") else
                              f"not run: {r.get('reason')}"))
                continue
            rel = f"{base['ms'] / r['ms']:.2f}x" if base else ""
            out.append(f"{r['variant']:24s} {r['factor']:18s} {r['ms']:9.4f} {r['gbps']:7.0f} "
                       f"{r['pct_of_copy']:6.1f}% {rel:>12s}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help=f"CSV path (the committed results: {CSV_PATH.relative_to(REPO_ROOT)})")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check every output, time nothing")
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    if args.dry_run and args.out is not None and args.out.resolve() == CSV_PATH.resolve():
        ap.error("a dry run must not replace the committed GPU results: pass --out elsewhere")
    print(runtime.mode())
    rows = run(args.dry_run)
    print(table(rows))
    # TE is optional; every other provider must run and match the reference
    failed = [f"{r['case']}/{r['variant']}" for r in rows
              if not r.get("available") and r["variant"] != "te_fused"]
    if args.out is not None:
        print("wrote", write(rows, args.out))
    if failed:
        print("failed or differ from the reference:", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
