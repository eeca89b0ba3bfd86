"""Which tile (elements per thread x warps) streams best on this GPU: the finished kernel's
forward timed against a device copy for each candidate, on the cases the tile knobs govern.

    python benchmarks/tiles.py            # ~1 minute; prints a table, the best per knob last

The knobs and their H100 values are ropelib.kernels.tiles.TILE_LOOP / TILE_NOLOOP / TILE_WIDE;
a GPU whose best differs gets its own row in tiles.TILES_BY_GPU.
"""
import torch
import triton.testing

import ropelib
from ropelib.kernels import launch as L

CANDIDATES = [(4, 16), (8, 8), (8, 16), (16, 4), (16, 8), (16, 16), (32, 4), (32, 8)]
# (knob, dtype, layout, shape [S, B, H, D]): 1 GiB 16-bit with a batch loop, 256 MiB thd (no
# batch loop), 2 GiB fp32
CASES = [("loop", torch.bfloat16, "sbhd", (16384, 8, 32, 128)),
         ("noloop", torch.bfloat16, "thd", (32768, 1, 32, 128)),
         ("wide", torch.float32, "sbhd", (16384, 8, 32, 128))]


def ms(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=200)


def main():
    name = torch.cuda.get_device_name()
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{name}, {sm} SMs")
    best = {}
    for knob, dtype, layout, (S, B, H, D) in CASES:
        x = torch.randn(S, B, H, D, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        f = ropelib.rope_freqs(S, D, device="cuda")[:, 0, 0]
        copy = ms(lambda: y.copy_(x))
        q, qo = L.View.of(x), L.View.of(y)
        pos = L.Positions()
        if layout == "thd":   # one packed batch of sequences of 4096 tokens
            cu = torch.arange(0, S + 1, 4096, device="cuda", dtype=torch.int32)
            pos = L.Positions(cu_seqlens=cu)
        rows = []
        for ept, warps in CANDIDATES:
            kw = {"tile_" + {"loop": "loop", "noloop": "noloop", "wide": "wide"}[knob]:
                  (ept, warps)}
            tiles = L.pick_tiles(S, B, (H, 0), D, D, x.element_size(), sm, **kw)
            planned, ptrs = L.plan(q, qo, L.Table(f, None), pos, R=D, interleaved=False,
                                   backward=False, layout="sbhd", tiles=tiles)
            t = ms(lambda: L.run(planned, ptrs))
            rows.append((copy / t, ept, warps, tiles))
        rows.sort(reverse=True)
        for r in rows:
            print(f"{knob:7s} {str(dtype).replace('torch.', ''):9s} {layout}  ept {r[1]:3d} "
                  f"warps {r[2]:3d}  tiles {r[3]}  ratio {r[0]:.3f}")
        best[knob] = rows[0]
    print("\n| knob | best (elements/thread, warps) | ratio to copy |\n|---|---|---:|")
    for knob, r in best.items():
        print(f"| {knob} | ({r[1]}, {r[2]}) | {r[0]:.3f} |")


if __name__ == "__main__":
    main()
