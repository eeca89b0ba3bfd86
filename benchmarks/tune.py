"""Tile tuning for the finished kernel on a GPU: check, then time tile variants against a copy.

    python benchmarks/tune.py [--quick]

Prints one table: case, tiles (BLOCK_S, BLOCK_H, B_CHUNK, warps), ms, ratio = copy / kernel.
The default heuristic (ropelib.kernels.launch.pick_tiles) is marked with '*'. Used to fill
benchmarks/NOTES.md; the committed performance numbers come from `python -m ropelib.bench`.
"""
import argparse
import itertools
import sys

import torch
import triton
from triton.testing import do_bench

import ropelib
from ropelib.api import _view4, plan
from ropelib.kernels.launch import Segment, launch, pick_tiles
from ropelib.reference import rope_reference


def check_matrix() -> int:
    """Forward and backward against the fp64 reference over the feature matrix; returns failures."""
    fails = 0
    torch.manual_seed(0)
    for layout, inter, dt, (R, D), extra in itertools.product(
            ["sbhd", "bshd", "thd"], [False, True], [torch.bfloat16, torch.float16, torch.float32],
            [(128, 128), (64, 128), (72, 72), (80, 96)], ["none", "start", "cp", "pos"]):
        S, B, H = 130, 3, 5
        if layout == "thd":
            cu = torch.tensor([0, 40, 100, 260], device="cuda", dtype=torch.int32)
            cp = 2 if extra == "cp" else 1
            x = torch.randn(int(cu[-1]) // cp, H, D, device="cuda", dtype=dt)
        else:
            cu, cp = None, 2 if extra == "cp" else 1
            x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D), device="cuda", dtype=dt)
        f = torch.randn(600, 1, 1, R, device="cuda") * 10
        kw = dict(layout=layout, interleaved=inter, cu_seqlens=cu, cp_size=cp, cp_rank=cp - 1)
        if extra == "start":
            n = 3 if layout == "thd" else B
            kw["start_positions"] = torch.tensor([5, 0, 17][:n], device="cuda")
        if extra == "pos":
            kw = dict(layout=layout, interleaved=inter)
            T = x.shape[0] if layout != "bshd" else x.shape[1]
            kw["position_ids"] = torch.randint(0, 600, (T,), device="cuda")
        x.requires_grad_(True)
        y = ropelib.apply_rope(x, f, **kw)
        g = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, x, g)
        xr = x.detach().double().requires_grad_(True)
        yr = rope_reference(xr, f.double(), **kw)
        (gr,) = torch.autograd.grad(yr, xr, g.double())
        eps = torch.finfo(dt).eps
        ok = torch.allclose(y.double(), yr, rtol=eps, atol=4 * eps) and \
            torch.allclose(gx.double(), gr, rtol=eps, atol=4 * eps)
        if not ok:
            fails += 1
            print("FAIL", layout, inter, dt, R, D, extra, (y.double() - yr).abs().max().item(),
                  (gx.double() - gr).abs().max().item())
    return fails


def time_case(name, x, f, layout, interleaved, variants, backward=False, rows=None):
    x4 = _view4(x, layout)
    pl = plan(x, f, layout=layout, interleaved=interleaved)
    y = torch.empty_like(x)
    y4 = _view4(y, layout)
    seg = Segment.of(x4, y4)
    nbytes = 2 * x.numel() * x.element_size()
    copy_ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300)
    default = pick_tiles(pl.S, pl.B, (x4.shape[2], 0, 0), pl.R, pl.D, x.element_size(), True,
                         x.device.index or 0)
    seen = set()
    for tiles in [default] + variants:
        if tiles in seen:
            continue
        seen.add(tiles)
        fn = lambda: launch(seg, pl.table, pl.pos, S=pl.S, B=pl.B, R=pl.R, D=pl.D,
                            interleaved=interleaved, backward=backward, copy_pass=True, tiles=tiles)
        try:
            ms = do_bench(fn, warmup=50, rep=300)
        except Exception as e:  # a variant that does not compile (register pressure) is reported
            print(name, tiles, "failed:", type(e).__name__, str(e)[:80])
            continue
        rows.append((name, tiles, ms, copy_ms, nbytes / ms / 1e6, copy_ms / ms, tiles == default))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="no correctness matrix, fewer variants")
    args = ap.parse_args()
    import ropelib.kernels.launch as L
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    fails = 0 if args.quick else check_matrix()
    if not args.quick:
        print(f"correctness matrix: {fails} failures")
    rows = []
    V = [(1, 16, 8, 4), (1, 32, 8, 8), (1, 32, 8, 4), (2, 16, 8, 4), (1, 16, 4, 4), (1, 8, 8, 2)]
    if args.quick:
        V = V[:2]
    f = ropelib.rope_freqs(16384, 128, device="cuda")
    fp = ropelib.rope_freqs(16384, 128, rotary_percent=0.5, device="cuda")
    for hints in (False, True):
        L.STREAM_HINTS = hints
        tag = " +hints" if hints else ""
        for dt in [torch.bfloat16, torch.float32]:
            x = torch.randn(16384, 8, 32, 128, device="cuda", dtype=dt)
            time_case(f"sbhd {str(dt)[6:]}{tag}", x, f, "sbhd", False, V, rows=rows)
            if not args.quick:
                time_case(f"sbhd {str(dt)[6:]} interleaved{tag}", x, f, "sbhd", True, V[:3], rows=rows)
                time_case(f"sbhd {str(dt)[6:]} bwd{tag}", x, f, "sbhd", False, V[:3], backward=True, rows=rows)
            del x
        if not args.quick:
            x = torch.randn(16384, 8, 32, 128, device="cuda", dtype=torch.bfloat16)
            time_case(f"sbhd bf16 partial 0.5{tag}", x, fp, "sbhd", False, V[:3], rows=rows)
            xb = x.view(8, 16384, 32, 128)
            time_case(f"bshd bf16{tag}", xb, f, "bshd", False, V[:3], rows=rows)
            del x, xb
        x = torch.randn(1024, 8, 32, 128, device="cuda", dtype=torch.bfloat16)
        time_case(f"sbhd bf16 64MiB{tag}", x, f, "sbhd", False, V[:3], rows=rows)
        x = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
        time_case(f"decode 1x64x32x128{tag}", x, f, "sbhd", False, [(1, 16, 1, 4), (1, 32, 1, 4)], rows=rows)
    L.STREAM_HINTS = False
    print(f"{'case':34s} {'tiles':16s} {'ms':>8s} {'copy':>8s} {'GB/s':>7s} {'ratio':>6s}")
    for name, tiles, ms, cms, gbps, ratio, d in rows:
        print(f"{name:34s} {str(tiles):16s} {ms:8.4f} {cms:8.4f} {gbps:7.0f} {ratio:6.3f}{' *' if d else ''}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
