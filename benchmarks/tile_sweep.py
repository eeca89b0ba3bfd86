"""The one-pass kernel's tile, swept: a plain copy and the rotation on the same launches.

Notebook 05 timed a copy kernel on the finished kernel's own grid, tile and batch loop at
s4096 b8 h32 d128 bf16 and found it at 0.910 of `y.copy_(x)`, level with the rotation on that
launch (0.907): what holds the one-pass kernel below a copy there is how the work is cut into
programs, not the rotation. This probe asks which launch lifts that bound. For each shape it
times, against `y.copy_(x)` of the same tensors:

    tile_copy   y = x on a launch (BLOCK_S tokens x BLOCK_H heads x the whole row, a loop over
                B_CHUNK batch entries, num_warps): `ladder.copy_on_plan`, notebook 05's kernel
    rope        the finished kernel's rung of notebook 05 (`ladder.rope_ladder("equal_halves")`)
                on the same launch
    shipped     which of the launches is the one `ladder.plan` picks today

over BLOCK_S in {1, 2, 4, 8}, BLOCK_H in {8, 16, 32}, B_CHUNK in {1, 2, 4, 8} (at most B) and
num_warps in {2, 4, 8}, keeping launches of 2 to 64 elements a thread. `do_bench` medians (L2
flushed), warmup 5 ms, rep 25 ms; the copy timed before every launch's pair and the pair's
ratios taken against the median of the copies of that shape.

    python benchmarks/tile_sweep.py --out DIR        # GPU, about 1 minute on an H200
    TRITON_INTERPRET=1 python benchmarks/tile_sweep.py --check     # small, checks the kernels

Writes DIR/tile_sweep-<gpu>.csv (one row per shape and launch) and prints the best launches.
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course import ladder  # noqa: E402

SHAPES = {"s4096 b8": (4096, 8, 32, 128), "s16384 b1": (16384, 1, 32, 128),
          "s1024 b8": (1024, 8, 32, 128)}
BLOCK_S, BLOCK_H, CHUNKS, WARPS = (1, 2, 4, 8), (8, 16, 32), (1, 2, 4, 8), (2, 4, 8)


def launches(S: int, B: int, H: int, D: int) -> list:
    """Every Plan of the sweep for x [S, B, H, D] (2 to 64 elements a thread)."""
    out = []
    for bs in BLOCK_S:
        for bh in (b for b in BLOCK_H if b <= H):
            for chunk in (c for c in CHUNKS if c <= B):
                for w in WARPS:
                    per_thread = bs * bh * D / (32 * w)
                    if 2 <= per_thread <= 64:
                        grid = (triton.cdiv(S, bs), triton.cdiv(H, bh), triton.cdiv(B, chunk))
                        out.append(ladder.Plan(grid, w, bs, bh, chunk))
    return out


def check() -> None:
    """Both kernels on small shapes and a few launches, against a copy and the reference."""
    x = torch.randn(6, 3, 8, 16)
    freqs = ropelib.rope_freqs(6, 16)
    want = ladder.rope_ladder("equal_halves", x, freqs)
    for p in launches(6, 3, 8, 16)[::7]:
        y = torch.full_like(x, float("nan"))
        ladder.copy_on_plan(x, y, p)
        assert torch.equal(y, x), p
        got = ladder.rope_ladder("equal_halves", x, freqs, tiles=p)
        torch.testing.assert_close(got, want)
    print("check: the tile copy copies and the rotation agrees on every launch tried")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.check or not torch.cuda.is_available():
        check()
        return 0
    from triton.testing import do_bench
    bench = lambda fn: do_bench(fn, warmup=5, rep=25)   # noqa: E731  (median ms)
    rows = []
    for name, (S, B, H, D) in SHAPES.items():
        x = torch.randn(S, B, H, D, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        freqs = ropelib.rope_freqs(S, D, device="cuda")
        shipped = ladder.plan("equal_halves", S, B, H, D, 2, *ladder.device_knobs(x))
        plans = launches(S, B, H, D)
        if shipped not in plans:
            plans.append(shipped)
        copies, timed = [], []
        for p in plans:
            copies.append(bench(lambda: y.copy_(x)))
            ladder.copy_on_plan(x, y, p)
            assert torch.equal(y, x), p
            t_tile = bench(lambda p=p: ladder.copy_on_plan(x, y, p))
            t_rope = bench(lambda p=p: ladder.rope_ladder("equal_halves", x, freqs, out=y,
                                                          tiles=p))
            timed.append((p, t_tile, t_rope))
        copy_ms = statistics.median(copies)
        for p, t_tile, t_rope in timed:
            rows.append({"shape": name, "block_s": p.block_s, "block_h": p.block_h,
                         "chunk": p.chunk, "num_warps": p.num_warps,
                         "programs": p.grid[0] * p.grid[1] * p.grid[2],
                         "copy_us": round(copy_ms * 1e3, 2), "tile_copy_us": round(t_tile * 1e3, 2),
                         "rope_us": round(t_rope * 1e3, 2),
                         "tile_copy_ratio": round(copy_ms / t_tile, 4),
                         "rope_ratio": round(copy_ms / t_rope, 4),
                         "shipped": int(p == shipped)})
        spread = (max(copies) - min(copies)) / copy_ms
        print(f"{name}: y.copy_(x) {copy_ms * 1e3:.1f} us (spread {spread:.1%} over "
              f"{len(copies)} timings), {len(plans)} launches")
        mine = [r for r in rows if r["shape"] == name]
        for r in sorted(mine, key=lambda r: -r["rope_ratio"])[:5] + \
                [r for r in mine if r["shipped"]]:
            print(f"  {'shipped ' if r['shipped'] else 'best    '} BLOCK_S={r['block_s']} "
                  f"BLOCK_H={r['block_h']:2d} B_CHUNK={r['chunk']} warps={r['num_warps']} "
                  f"programs={r['programs']:7d}: copy on it {r['tile_copy_ratio']:.3f}, "
                  f"rotation {r['rope_ratio']:.3f}")
    meta = {**compare.environment_meta(), "gpu": torch.cuda.get_device_name(),
            "timing": "triton.testing.do_bench median, warmup 5 ms, rep 25 ms; ratios against "
                      "the median of the shape's y.copy_(x) timings (one before every launch)",
            "dtype": "bf16", "layout": "sbhd, contiguous"}
    path = compare.write_csv(rows, Path(args.out) / f"tile_sweep-{compare.gpu_slug()}.csv",
                             meta=meta, fields=list(rows[0]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
