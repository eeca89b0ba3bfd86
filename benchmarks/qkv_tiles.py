"""Tile choices of the fused QKV projection (kernels/qkv_gemm.GPU_TILES), measured on a GPU.

    python benchmarks/qkv_tiles.py --out benchmarks/results/      # GPU: qkv_tiles-<gpu>.csv
    python benchmarks/qkv_tiles.py --out benchmarks/results/ --tile dw=32,256,8,8,3 ...
                                     # only these tiles: qkv_tiles_chosen-<gpu>-<date>.csv
    python benchmarks/qkv_tiles.py --dtype fp32 --heads 16 4 --head-dim 256 --out DIR
                                     # rows over 512 bytes: GPU_TILES_LONG_ROWS' candidates
    TRITON_INTERPRET=1 python benchmarks/qkv_tiles.py --dry-run   # CPU: tiny shapes, one tile

Llama-3-8B's projection (hidden 4096, 32 query and 8 key/value heads of 128, bf16), 8192 tokens, no
QK-norm (`--norm`: with it, dX and dW reading the statistics one forward saved). Each of the three
kernels (forward, dX, dW) is timed alone, launched as kernels/qkv_gemm plans it, once per candidate
tile (BLOCK_M, BLOCK_K, GROUP_M, warps, stages): with the epilogue (rotate=True) and without it
(rotate=False, the bare GEMM), so the column `epilogue_cost` = rotate / bare - 1 says what the
rotation costs at that tile. Registers and spills per thread come from Triton's compiled kernel. It
prints the fastest rotating tile of each kernel, in GPU_TILES' form (it edits nothing). Timings:
triton.testing.do_bench medians.
"""
import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's @triton.jit runs

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import ropelib  # noqa: E402
from ropelib import qkv_linear, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.bench.compare import DTYPES  # noqa: E402
from ropelib.kernels import planning, qkv_gemm  # noqa: E402

FIELDS = ["kernel", "BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "rotate", "ms",
          "tflops", "epilogue_cost", "n_regs", "n_spills", "reason"]
KEYS = ("BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")

CANDIDATES = {
    "fwd": [(128, 64, 8, 8, 3), (128, 64, 8, 8, 4), (128, 32, 8, 8, 4), (128, 64, 8, 4, 3),
            (64, 64, 8, 4, 4), (64, 128, 8, 4, 3), (128, 128, 8, 8, 2), (256, 64, 8, 8, 3),
            (64, 64, 8, 8, 4)],
    "dx": [(64, 128, 8, 8, 3), (128, 128, 8, 8, 3), (128, 64, 8, 4, 3), (64, 128, 8, 4, 4),
           (128, 128, 8, 8, 4), (64, 64, 8, 4, 3), (128, 64, 8, 8, 4)],
    "dw": [(64, 128, 8, 8, 3), (128, 128, 8, 8, 3), (64, 64, 8, 4, 4), (128, 64, 8, 8, 3),
           (64, 128, 8, 4, 4), (32, 128, 8, 4, 4), (128, 128, 8, 8, 4)],
}
# rows of more than qkv_gemm.LONG_ROW_BYTES (fp32 heads of more than 128 features), where the
# tiles above ask for more shared memory than a block may have: GPU_TILES_LONG_ROWS first (the
# fastest of these four on an H200, 2026-11-30), then the tiles that spill least (the choice
# before that run) and others that fit an sm_90 block with and without QK-norm
CANDIDATES_LONG_ROWS = {
    "fwd": [(128, 32, 8, 8, 4), (32, 64, 8, 4, 3), (64, 32, 8, 8, 3), (64, 64, 8, 8, 2)],
    "dx": [(16, 32, 8, 4, 3), (16, 64, 8, 8, 3), (32, 64, 8, 4, 2), (16, 64, 8, 4, 3)],
    "dw": [(16, 128, 8, 8, 2), (16, 64, 8, 8, 2), (16, 256, 8, 8, 2), (32, 64, 8, 8, 2)],
}


def _compiled(kernel):
    """(n_regs, n_spills) of the kernel's most recently compiled variant, or ("", "")."""
    try:
        caches = kernel.device_caches[torch.cuda.current_device()][0]
        ck = list(caches.values())[-1]
        return ck.n_regs, ck.n_spills
    except Exception:  # noqa: BLE001 -- the Triton version keeps it elsewhere: leave blank
        return "", ""


def run(dry_run: bool, tokens=8192, hidden=4096, HQ=32, HK=8, D=128, candidates=None,
        norm=False, dtype="bf16") -> list:
    """Time every candidate tile ({kind: [(BLOCK_M, BLOCK_K, GROUP_M, warps, stages)]};
    CANDIDATES, or CANDIDATES_LONG_ROWS for rows the planner gives GPU_TILES_LONG_ROWS, by
    default), bare and rotating: one row each. norm: the rotating kernels with QK-norm weights
    (the backward's reading the statistics a forward saved)."""
    device = runtime.default_device()
    if dry_run:
        tokens, hidden, HQ, HK, D = 16, 32, 2, 1, 16
    N, M, K = (HQ + 2 * HK) * D, tokens, hidden
    table = qkv_gemm.tile_table(D * DTYPES[dtype].itemsize)    # what plan reads
    default = CANDIDATES_LONG_ROWS if table is qkv_gemm.GPU_TILES_LONG_ROWS else CANDIDATES
    g = torch.Generator(device="cpu").manual_seed(0)
    bf = dict(device=device, dtype=DTYPES[dtype])
    x = torch.randn(1, tokens, hidden, generator=g).to(**bf)
    w = (torch.randn(N, hidden, generator=g) / hidden**0.5).to(**bf)
    outs = [torch.empty(1, tokens, h, D, **bf) for h in (HQ, HK, HK)]
    grads = [torch.randn(1, tokens, h, D, generator=g).to(**bf) for h in (HQ, HK, HK)]
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    angles = ropelib.rope_angles(D, base=500000.0, device=device)
    tables = (angles.turns, angles.amplitude, None, None, None, None, None, None)
    # the forward and dX read every token's cos and s' rows, as qkv_rope_linear's pre-pass
    # writes them
    rows = qkv_linear.cos_sin_rows(x, angles.turns, angles.amplitude, None, None, False)
    dnorm = None
    if norm:   # norm weights, and the statistics the forward saves for the backward
        nw = tuple(1 + 0.3 * torch.randn(D, generator=g).to(device) for _ in "qk")
        saved_stats = (torch.empty(M, HQ + HK, device=device),
                       torch.empty(M, HQ + HK, D, **bf))
        tables = (*tables[:4], *nw, *saved_stats)
        dnorm = torch.zeros(HQ + HK, D, device=device)
    pointers = {"fwd": (x, w, None, *outs, *rows, *tables[4:], None),   # (Angles: no flag)
                "dx": (*grads, w, dx, *rows, *tables[4:]),
                "dw": (*grads, x, dw, None, dnorm, *tables)}
    if norm:   # one forward writes the statistics dX and dW read
        qkv_gemm.run(qkv_gemm.plan(
            "fwd", S=tokens, B=1, K=K, HQ=HQ, HK=HK, D=D, R=D, P=2**31 - 1, ids=None,
            cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6, device=x.device,
            dtypes=planning.pointer_dtypes(pointers["fwd"])), pointers["fwd"])
    saved = {k: dict(v) for k, v in table.items()}
    rows = []
    try:
        for kind, cands in (candidates or default).items():
            for cand in (cands[:1] if dry_run else cands):
                bare = None
                for rotate in (False, True):
                    row = dict(zip(KEYS, cand), kernel=kind, rotate=rotate, reason="")
                    rows.append(row)
                    # (and as the norm's own tile, where the kernel has one)
                    table[kind] = table[f"{kind}_norm"] = dict(zip(KEYS, cand))
                    # the bare GEMM takes no norm pointers
                    ptrs = pointers[kind] if rotate or not norm else tuple(
                        None if n in qkv_gemm._NORM or n == "dnorm_ptr" else p
                        for n, p in zip(qkv_gemm.LAUNCHERS[kind].pointer_names,
                                        pointers[kind]))
                    planned = qkv_gemm.plan(
                        kind, S=tokens, B=1, K=K, HQ=HQ, HK=HK, D=D, R=D, P=2**31 - 1, ids=None,
                        cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                        device=x.device, dtypes=planning.pointer_dtypes(ptrs), rotate=rotate)
                    try:
                        qkv_gemm.run(planned, ptrs)
                        if dry_run:
                            continue
                        import triton.testing
                        ms = triton.testing.do_bench(lambda: qkv_gemm.run(planned, ptrs),
                                                     warmup=10, rep=60)
                    except Exception as exc:  # noqa: BLE001 -- recorded, the sweep goes on
                        row["reason"] = f"{type(exc).__name__}: {exc}"[:160]
                        continue
                    row["n_regs"], row["n_spills"] = _compiled(planned.launcher.kernel)
                    row.update(ms=ms, tflops=2 * M * N * K / ms / 1e9)
                    if rotate and bare:
                        row["epilogue_cost"] = ms / bare - 1
                    bare = ms if not rotate else bare
                    print(f"{kind:3} {cand} rotate={rotate!s:5} {ms:7.3f} ms "
                          f"{row['tflops']:6.1f} TFLOP/s regs {row['n_regs']} "
                          f"spills {row['n_spills']}", flush=True)
    finally:
        table.clear()
        table.update(saved)
    return rows


def parse_tiles(specs) -> dict:
    """["dw=32,256,8,8,3", ...] -> {"dw": [(32, 256, 8, 8, 3)], ...}; {} for none."""
    out = {}
    for spec in specs:
        kind, _, numbers = spec.partition("=")
        try:
            tile = tuple(int(n) for n in numbers.split(","))
        except ValueError:
            tile = ()
        if kind not in ("fwd", "dx", "dw") or len(tile) != len(KEYS):
            raise SystemExit(f"--tile {spec!r}: expected KIND=BLOCK_M,BLOCK_K,GROUP_M,warps,"
                             f"stages with KIND fwd, dx or dw")
        out.setdefault(kind, []).append(tile)
    return out


def best(rows) -> dict:
    out = {}
    for kind in ("fwd", "dx", "dw"):
        timed = [r for r in rows if r["kernel"] == kind and r["rotate"] and r.get("ms")]
        if timed:
            r = min(timed, key=lambda r: r["ms"])
            out[kind] = {k: r[k] for k in KEYS}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="a folder for qkv_tiles-<gpu>.csv")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, one tile, no timing")
    ap.add_argument("--tile", action="append", default=[], metavar="KIND=BM,BK,G,W,S",
                    help="time only these tiles (repeat it): kind fwd, dx or dw, then BLOCK_M, "
                         "BLOCK_K, GROUP_M, warps, stages")
    ap.add_argument("--norm", action="store_true",
                    help="with QK-norm weights (file name ...-qk-norm)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("HQ", "HK"))
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args(argv)
    chosen = parse_tiles(args.tile)
    print(runtime.mode())
    HQ, HK, D = args.heads[0], args.heads[1], args.head_dim
    rows = run(args.dry_run, candidates=chosen, norm=args.norm, HQ=HQ, HK=HK, D=D,
               dtype=args.dtype)
    print("fastest rotating tiles:", best(rows))
    if args.out is not None and not args.dry_run:
        gpu = compare.gpu_slug()
        meta = compare.environment_meta()
        meta.update(script="benchmarks/qkv_tiles.py", case=f"t8192 hidden 4096 {HQ}/{HK} heads "
                    f"x {D} {args.dtype}, {'with' if args.norm else 'no'} QK-norm",
                    timing="triton.testing.do_bench median ms")
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = meta["date"][:16].replace("-", "").replace("T", "-").replace(":", "")
        shape = "" if (HQ, HK, D, args.dtype) == (32, 8, 128, "bf16") else \
            f"-{args.dtype}-{HQ}x{HK}x{D}"
        name = (f"qkv_tiles_chosen-{gpu}-{stamp}" if chosen else f"qkv_tiles-{gpu}") \
            + shape + ("-qk-norm" if args.norm else "")
        print("wrote", compare.write_csv(rows, args.out / f"{name}.csv", meta=meta,
                                         fields=FIELDS))
    return 0 if all(not r["reason"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
