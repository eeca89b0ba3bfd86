"""Does the width of the flat pass's cos/sin rows hold it under a copy on large tensors?

The two-pass route (kernels/flat.py) reads fp32 cos and signed-sine rows of R entries per
token; torch.compile's kernel reads the caller's 16-bit [S, D] table, half those bytes, and
flat_hints_probe.py found the flat pass given such a table at 0.98 of a copy at 1 GiB bf16 on
an H200 where the product, with its fp32 rows, ran at 0.935. When both members of every pair
share their angle (a table made as cat(f, f), as TE's and Hugging Face's are), the second
half of each fp32 row repeats the first (the sine with its sign flipped): a program can read
the first half for both and flip the sign, so its loads cover R/2 fp32 entries per token, the
16-bit table's bytes, with the fp32 row's bits. This probe times, on copies of the flat pass's
forward (rotate-half, R = D, sbhd and bshd, the rows kept as an eager call keeps them):

    rows=16-bit   the caller's cos/sin [S, D] in the input's dtype (flat_hints_probe's shape)
    rows=fp32     the pre-pass's fp32 cos and s' rows [S, D], as the product reads them
    rows=paired   the same rows, the first half read for both members of each pair

Every fp32 variant must give apply_rope's bits.

    python benchmarks/paired_rows_probe.py --out DIR      # (a GPU; ~1 min)
"""
import argparse
import os

import torch
import triton
import triton.language as tl

import ropelib
import ropelib.eager
from ropelib.bench import compare


@triton.jit
def _flat_rows(x_ptr, y_ptr, cos_ptr, sin_ptr, N, S, B, H, D: tl.constexpr,
               LAYOUT: tl.constexpr, ROWS: tl.constexpr, XBLOCK: tl.constexpr):
    # the flat pass's forward, rotate-half, R = D; ROWS 0: the caller's [S, D] table (sine
    # unsigned), 1: fp32 cos and s' rows [S, D], 2: the same rows, the first half read for both
    HALF: tl.constexpr = D // 2
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    live = i < N
    d = i % D
    if LAYOUT == 1:
        s = (i // (H * D)) % S
    else:
        s = i // (B * H * D)
    first = d < HALF
    if ROWS == 2:
        col = tl.max_contiguous(tl.multiple_of(tl.where(first, d, d - HALF), 8), 8)
    else:
        col = d
    tab = s * D + col
    partner = tl.max_contiguous(tl.multiple_of(i + tl.where(first, HALF, -HALF), 8), 8)
    x = tl.load(x_ptr + i, mask=live, other=0.0)
    c = tl.load(cos_ptr + tab, mask=live, other=0.0, eviction_policy="evict_last")
    xp = tl.load(x_ptr + partner, mask=live, other=0.0)
    sn = tl.load(sin_ptr + tab, mask=live, other=0.0, eviction_policy="evict_last")
    t = xp.to(tl.float32) * sn.to(tl.float32)
    if ROWS == 0:
        t = tl.where(first, -t, t)
    elif ROWS == 2:             # s' of the first half is -sin: the second half's is +sin
        t = tl.where(first, t, -t)
    y = tl.fma(x.to(tl.float32), c.to(tl.float32), t).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + i, y, mask=live)


@triton.jit
def _pairs_rows(x_ptr, y_ptr, cos_ptr, sin_ptr, NROWS, S, B, H, D: tl.constexpr,
                LAYOUT: tl.constexpr, PAIRED: tl.constexpr, ROWS: tl.constexpr):
    # both members of ROWS x D/2 rotate-half pairs per program, a thread holding x_a and x_b
    # of the same pairs (no partner load); the fp32 cos and s' rows, both halves read, or with
    # PAIRED the first half for both (s'_b = -s'_a)
    HALF: tl.constexpr = D // 2
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)            # head rows [ROWS]
    j = tl.arange(0, HALF)
    live = (r < NROWS)[:, None]
    if LAYOUT == 1:
        s = (r // H) % S
    else:
        s = r // (B * H)
    at = r[:, None] * D + j[None, :]                            # [ROWS, HALF]
    tab = s[:, None] * D + j[None, :]
    xa = tl.load(x_ptr + at, mask=live, other=0.0).to(tl.float32)
    xb = tl.load(x_ptr + at + HALF, mask=live, other=0.0).to(tl.float32)
    ca = tl.load(cos_ptr + tab, mask=live, other=0.0, eviction_policy="evict_last")
    sa = tl.load(sin_ptr + tab, mask=live, other=0.0, eviction_policy="evict_last")
    if PAIRED:
        ya = tl.fma(xa, ca, xb * sa)
        yb = tl.fma(xb, ca, -(xa * sa))
    else:
        cb = tl.load(cos_ptr + tab + HALF, mask=live, other=0.0, eviction_policy="evict_last")
        sb = tl.load(sin_ptr + tab + HALF, mask=live, other=0.0, eviction_policy="evict_last")
        ya = tl.fma(xa, ca, xb * sa)
        yb = tl.fma(xb, cb, xa * sb)
    tl.store(y_ptr + at, ya.to(y_ptr.dtype.element_ty), mask=live)
    tl.store(y_ptr + at + HALF, yb.to(y_ptr.dtype.element_ty), mask=live)


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpu = compare.gpu_slug()
    rows = []
    for name, layout, S, B, H, D in [("bf16 sbhd 1 GiB s16k b8", "sbhd", 16384, 8, 32, 128),
                                     ("bf16 bshd 256 MiB s4k b8", "bshd", 4096, 8, 32, 128),
                                     ("bf16 sbhd 256 MiB s4k b8", "sbhd", 4096, 8, 32, 128)]:
        shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
        tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        freqs = compare.angles(S, D, interleaved=False, device="cuda")     # [S, 1, 1, D]
        f = freqs[:, 0, 0, :]
        cos16, sin16 = torch.cos(f).to(torch.bfloat16), torch.sin(f).to(torch.bfloat16)
        copy = ms(lambda: y.copy_(x))
        res = [("copy", copy)]
        comp = torch.compile(lambda t: compare.hf_rotate(t, cos16.view(tshape),
                                                         sin16.view(tshape), False))
        comp(x)
        res.append(("torch.compile (16-bit table)", ms(lambda: comp(x))))
        ropelib.eager.TABLE_ROWS.clear()
        want = ropelib.apply_rope(x, freqs, layout=layout)
        # the fp32 cos and s' rows the call's pre-pass wrote (kept for the next eager call)
        cos32, signed = next(reversed(ropelib.eager.TABLE_ROWS.entries.values()))[1]
        assert cos32.shape == (S, D), "apply_rope did not take the two-pass route"
        res.append(("ropelib.apply_rope (freqs)", ms(lambda: ropelib.apply_rope(
            x, freqs, layout=layout))))
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        for mode, tables in ((0, (cos16, sin16)), (1, (cos32, signed)), (2, (cos32, signed))):
            run = lambda: _flat_rows[grid](  # noqa: E731
                x, y, *tables, n, S, B, H, D, LAYOUT=int(layout == "bshd"), ROWS=mode,
                XBLOCK=1024, num_warps=4)
            run()
            label = f"rows={('16-bit', 'fp32', 'paired')[mode]}"
            if mode and not torch.equal(y, want):
                label += " (NOT apply_rope's bits)"
            res.append((label, ms(run)))
        for paired, rows_per, warps in ((0, 16, 4), (1, 16, 4), (0, 8, 2), (1, 8, 2),
                                        (0, 32, 4), (1, 32, 4)):
            run = lambda: _pairs_rows[(triton.cdiv(S * B * H, rows_per),)](  # noqa: E731
                x, y, cos32, signed, S * B * H, S, B, H, D, LAYOUT=int(layout == "bshd"),
                PAIRED=paired, ROWS=rows_per, num_warps=warps)
            y.zero_()
            run()
            label = f"pairs per thread {('fp32', 'paired')[paired]} {rows_per} rows {warps} warps"
            if not torch.equal(y, want):
                label += " (NOT apply_rope's bits)"
            res.append((label, ms(run)))
        torch._dynamo.reset()
        for prov, t in res:
            rows.append((name, prov, t, copy / t))
            print(f"{name:26s} {prov:32s} {t:8.4f} ms {copy / t:6.3f}", flush=True)
        x = y = None
        torch.cuda.empty_cache()
    path = compare.write_csv(
        [dict(case=c, provider=p, ms=f"{t:.5f}", ratio_to_copy=f"{r:.4f}")
         for c, p, t, r in rows], os.path.join(args.out, f"paired_rows_probe-{gpu}.csv"),
        meta=compare.environment_meta(), fields=["case", "provider", "ms", "ratio_to_copy"])
    print("wrote", path)


if __name__ == "__main__":
    main()
