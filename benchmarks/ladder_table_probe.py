"""Why the finished kernel stops short of a copy: its sin/cos, or its loop? One controlled variant.

    python benchmarks/ladder_table_probe.py --out benchmarks/results   # on a GPU (~1 min)
    TRITON_INTERPRET=1 python benchmarks/ladder_table_probe.py --dry-run   # CPU: tiny shapes

Notebook 05's last rung (`ropelib.course.ladder._ladder_final_kernel`, the finished kernel's
computation on the lesson's subset) evaluates cos and sin of each token's angles in every
program, then loops over its chunk of the batch. This probe times it beside a copy of it that
differs in one thing only: it loads cos and sin from fp32 tables [P, D/2] instead of loading the
angles and evaluating them (the same grid, tile, warps, batch loop, fma order and rounding; the
tables hold exactly the bytes of the angle table the rung reads, so the bytes asked for are the
same). If the rung's gap to a copy is its sin/cos, the table variant closes it; if it is the
loop and the tile, both stay where they are.

Beside the times it records what the compiler made of each kernel for sm_90 (no GPU needed):
SASS instructions and registers per thread (cuobjdump), so a difference in time can be set
against a difference in work. Timings: `triton.testing.do_bench` medians in rounds (every
provider once a round, in a new order each round), bf16 sbhd, the ladder's cases. Output:
`ladder_table_probe-<gpu>.csv` (one row per case and provider, the median over rounds and the
range) and the same table printed.
"""
import argparse
import os
import random
import statistics
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit in ropelib

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import ropelib  # noqa: E402
from ropelib import runtime  # noqa: E402
from ropelib.bench import compare, routes  # noqa: E402
from ropelib.course import ladder  # noqa: E402
from ropelib.course.load_schedule import sass_instructions  # noqa: E402
from ropelib.course.offline_compile import compile_for_cuda, resource_usage  # noqa: E402
from ropelib.kernels.common import BF16_RTNE, round_to  # noqa: E402


@triton.jit
def _final_from_table_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    cos_ptr, sin_ptr,  # *fp32: cos and sin of the angles [P, D/2], row s for position s
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per program (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,
    stride_ys, stride_yb, stride_yh, stride_yd,
    stride_ts,  # the tables' row stride
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr, BF16_RTNE: tl.constexpr,
):
    # grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H), cdiv(B, B_CHUNK)): the last rung's, line for
    # line, but cos and sin are loaded (equal halves: one pair of values per feature pair)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (j < HALF)[None, None, :]
    t = s[:, None, None] * stride_ts + j[None, None, :]
    c_a = tl.load(cos_ptr + t, mask=tab_m, other=0.0)  # [BLOCK_S, 1, BLOCK_HALF]
    s_a = tl.load(sin_ptr + t, mask=tab_m, other=0.0)
    x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh + j[None, None, :] * stride_xd
    y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh + j[None, None, :] * stride_yd
    for b in range(b_lo, b_hi):
        xr = x_ptr + x_off + b * stride_xb
        yr = y_ptr + y_off + b * stride_yb
        x_a = tl.load(xr, mask=m, other=0.0).to(tl.float32)
        x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0).to(tl.float32)
        y_a = tl.fma(x_a, c_a, -(x_b * s_a))
        y_b = tl.fma(x_b, c_a, x_a * s_a)
        tl.store(yr, round_to(y_a, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)
        tl.store(yr + HALF * stride_yd, round_to(y_b, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)


def from_table(x, cos_half, sin_half, out, p):
    """The table variant at the last rung's plan `p` (ladder.plan("equal_halves", ...))."""
    S, B, H, D = x.shape
    _final_from_table_kernel[p.grid](
        x, out, cos_half, sin_half, S, B, H, p.chunk, *x.stride(), *out.stride(),
        cos_half.stride(0), HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2),
        BLOCK_S=p.block_s, BLOCK_H=p.block_h, BF16_RTNE=BF16_RTNE, num_warps=p.num_warps)
    return out


def sass_counts(S, B, H, D, p) -> dict:
    """{kernel: (SASS instructions, registers per thread)} compiled for sm_90 at plan p; {} where
    this machine cannot compile (the interpreter, or no cuobjdump)."""
    if runtime.INTERPRET:
        return {}
    x = torch.empty(S, B, H, D, dtype=torch.bfloat16)
    y, f = torch.empty_like(x), torch.empty(S, D, dtype=torch.float32)
    ch = torch.empty(S, D // 2, dtype=torch.float32)
    common = dict(x_ptr=x, y_ptr=y, S=S, B=B, H=H, B_CHUNK=p.chunk,
                  **dict(zip(("stride_xs", "stride_xb", "stride_xh", "stride_xd"), x.stride())),
                  **dict(zip(("stride_ys", "stride_yb", "stride_yh", "stride_yd"), y.stride())),
                  HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_S=p.block_s,
                  BLOCK_H=p.block_h, BF16_RTNE=False)
    kernels = {
        "equal_halves": (ladder._ladder_final_kernel,
                         dict(common, freqs_ptr=f, stride_fs=f.stride(0), ACCURATE=True)),
        "from_table": (_final_from_table_kernel,
                       dict(common, cos_ptr=ch, sin_ptr=ch, stride_ts=ch.stride(0))),
    }
    out = {}
    for name, (kernel, args) in kernels.items():
        compiled = compile_for_cuda(kernel, args, num_warps=p.num_warps)
        cubin = compiled.asm.get("cubin", b"")
        try:
            n = len(sass_instructions(cubin))
        except RuntimeError:            # no cuobjdump here
            n = None
        regs = (resource_usage(cubin) or {}).get("registers")
        out[name] = (n or None, regs)
    return out


def cases(dry_run: bool):
    if dry_run:
        return [("tiny", 5, 3, 3, 24)]
    return [("s4096-b8", 4096, 8, 32, 128), ("s16384-b8-h8", 16384, 8, 8, 128),
            ("s32768-b1", 32768, 1, 32, 128), ("s16-b64", 16, 64, 32, 128)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="a folder for the CSV")
    ap.add_argument("--dry-run", action="store_true", help="check on tiny shapes, no timing")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if not args.dry_run and not runtime.on_gpu():
        raise SystemExit(f"{runtime.mode()}: timings need a GPU; use --dry-run here")
    device = "cuda" if runtime.on_gpu() else "cpu"
    rows = []
    rng = random.Random(0)
    for name, S, B, H, D in cases(args.dry_run):
        torch.manual_seed(0)
        x = torch.randn(S, B, H, D, device=device, dtype=torch.bfloat16)
        freqs = ropelib.rope_freqs(S, D, device=device)     # TE's cat([f, f]) angles, fp32
        f2 = freqs.reshape(S, D)
        cos_half = torch.cos(f2[:, :D // 2]).contiguous()
        sin_half = torch.sin(f2[:, :D // 2]).contiguous()
        sm, knobs = ladder.device_knobs(x)
        p = ladder.plan("equal_halves", S, B, H, D, x.element_size(), sm, knobs)
        outs = {k: torch.full_like(x, float("nan")) for k in ("copy", "equal_halves",
                                                             "from_table", "ropelib")}
        steps = {
            "copy": lambda: outs["copy"].copy_(x),
            "equal_halves": lambda: ladder.rope_ladder("equal_halves", x, freqs,
                                                        out=outs["equal_halves"]),
            "from_table": lambda: from_table(x, cos_half, sin_half, outs["from_table"], p),
            "ropelib": lambda: ropelib.apply_rope(x, freqs),
        }
        with routes.forced("finished"):
            for k, fn in steps.items():
                r = fn()
                if k == "ropelib":
                    outs[k] = r
        # the table variant against the rung: cos/sin from PyTorch's fp32 cos/sin against the
        # kernel's libdevice ones, so equal to the rung's bits nearly everywhere, and within a
        # bf16 step of it everywhere
        same = (outs["from_table"] == outs["equal_halves"]).float().mean().item()
        diff = (outs["from_table"].float() - outs["equal_halves"].float()).abs().max().item()
        assert not torch.isnan(outs["from_table"]).any()
        assert diff <= 2 ** -6 * outs["equal_halves"].float().abs().max().item(), diff
        rung_is_ropelib = torch.equal(outs["equal_halves"], outs["ropelib"])
        counts = sass_counts(S, B, H, D, p) if not args.dry_run else {}
        timed = {k: [] for k in steps}
        if not args.dry_run:
            from triton.testing import do_bench
            with routes.forced("finished"):
                for _ in range(args.rounds):
                    order = list(steps)
                    rng.shuffle(order)
                    for k in order:
                        timed[k].append(do_bench(steps[k], quantiles=[0.5, 0.2, 0.8])[0])
        copy_ms = statistics.median(timed["copy"]) if timed["copy"] else None
        for k in steps:
            ms = statistics.median(timed[k]) if timed[k] else None
            sass, regs = counts.get(k, (None, None))
            rows.append(dict(case=name, seq_len=S, batch=B, heads=H, head_dim=D, dtype="bf16",
                             provider=k, grid="x".join(map(str, p.grid)), num_warps=p.num_warps,
                             block_s=p.block_s, block_h=p.block_h, chunk=p.chunk,
                             rounds=len(timed[k]), ms=ms,
                             ms_min=min(timed[k]) if timed[k] else None,
                             ms_max=max(timed[k]) if timed[k] else None,
                             ratio_to_copy=(copy_ms / ms) if ms else None,
                             sass_instructions=sass, registers=regs,
                             bit_equal_to_rung=(same if k == "from_table" else
                                                rung_is_ropelib if k == "ropelib" else None)))
    fields = list(rows[0])
    print(f"{'case':14} {'provider':13} {'ms':>9} {'ratio':>7} {'SASS':>6} {'regs':>5}  plan")
    for r in rows:
        ms = f"{r['ms']:.4f}" if r["ms"] else "-"
        ratio = f"{r['ratio_to_copy']:.3f}" if r["ratio_to_copy"] else "-"
        print(f"{r['case']:14} {r['provider']:13} {ms:>9} {ratio:>7} "
              f"{r['sass_instructions'] or '-':>6} {r['registers'] or '-':>5}  "
              f"grid {r['grid']} warps {r['num_warps']} tile {r['block_s']}x{r['block_h']} "
              f"chunk {r['chunk']}")
    if args.out:
        where = compare.gpu_slug() if runtime.on_gpu() else "interpreter"
        path = args.out / f"ladder_table_probe-{where}.csv"
        meta = compare.environment_meta()
        # this probe shuffles its own rounds (random.Random(0)), whatever the suite's default
        meta.update(rounds_order="shuffled", rounds_seed="0", rounds=str(args.rounds),
                    script="benchmarks/ladder_table_probe.py")
        compare.write_csv(rows, path, meta=meta, fields=fields)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
