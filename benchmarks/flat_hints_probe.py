"""Which of the differences between the flat pass (kernels/flat.py) and the kernel torch.compile
generates from Hugging Face's formula costs the flat pass time on an H200 (bf16, rotate-half,
forward, the caller's cos/sin table in the input's dtype, as torch.compile reads it).

Inductor's kernel (benchmarks/results/inductor-rope-bf16-sbhd.txt, saved by flat_pass_probe.py)
differs from the flat pass in three ways, each a switch here on a copy of the flat pass:

    EVEN          no bounds masks (the grid tiles the tensor exactly; Inductor knows the size)
    PARTNER_LAST  the rotate-half partner loaded with evict_last (Inductor marks it so)
    TABLE_LAST    the table loaded with evict_last (Inductor does; the flat pass dropped it)

    python benchmarks/flat_hints_probe.py --out DIR      # (a GPU; ~1 min)
"""
import argparse
import itertools
import os

import torch
import triton
import triton.language as tl

import ropelib
from ropelib.bench import compare


@triton.jit
def _flat_variant(x_ptr, y_ptr, cos_ptr, sin_ptr, N, S, B, H, D: tl.constexpr,
                  LAYOUT: tl.constexpr, EVEN: tl.constexpr, PARTNER_LAST: tl.constexpr,
                  TABLE_LAST: tl.constexpr, XBLOCK: tl.constexpr):
    # the flat pass's forward, rotate-half, R = D, the caller's [S, D] table (SIGNED False)
    HALF: tl.constexpr = D // 2
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    live = i < N
    d = i % D
    if LAYOUT == 1:
        s = (i // (H * D)) % S
    else:
        s = i // (B * H * D)
    tab = s * D + d
    first = d < HALF
    partner = tl.max_contiguous(tl.multiple_of(i + tl.where(first, HALF, -HALF), 8), 8)
    if EVEN:
        x = tl.load(x_ptr + i)
        c = tl.load(cos_ptr + tab, eviction_policy="evict_last" if TABLE_LAST else "")
        sn = tl.load(sin_ptr + tab, eviction_policy="evict_last" if TABLE_LAST else "")
        xp = tl.load(x_ptr + partner, eviction_policy="evict_last" if PARTNER_LAST else "")
    else:
        x = tl.load(x_ptr + i, mask=live, other=0.0)
        c = tl.load(cos_ptr + tab, mask=live, other=0.0,
                    eviction_policy="evict_last" if TABLE_LAST else "")
        sn = tl.load(sin_ptr + tab, mask=live, other=0.0,
                     eviction_policy="evict_last" if TABLE_LAST else "")
        xp = tl.load(x_ptr + partner, mask=live, other=0.0,
                     eviction_policy="evict_last" if PARTNER_LAST else "")
    t = xp.to(tl.float32) * sn.to(tl.float32)
    t = tl.where(first, -t, t)
    y = tl.fma(x.to(tl.float32), c.to(tl.float32), t).to(y_ptr.dtype.element_ty)
    if EVEN:
        tl.store(y_ptr + i, y)
    else:
        tl.store(y_ptr + i, y, mask=live)


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
                                     ("bf16 bshd 256 MiB s4k b8", "bshd", 4096, 8, 32, 128)]:
        shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
        tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        cos, sin = (t.to(torch.bfloat16) for t in ropelib.rope_cos_sin(S, D, device="cuda"))
        copy = ms(lambda: y.copy_(x))
        res = [("copy", copy)]
        comp = torch.compile(lambda t: compare.hf_rotate(t, cos.view(tshape), sin.view(tshape), False))
        want = comp(x)
        res.append(("torch.compile", ms(lambda: comp(x))))
        res.append(("ropelib.apply_rope", ms(lambda: ropelib.apply_rope(
            x, cos=cos, sin=sin, layout=layout))))
        n = x.numel()
        for even, partner_last, table_last in itertools.product((False, True), repeat=3):
            grid = (triton.cdiv(n, 1024),)
            run = lambda: _flat_variant[grid](  # noqa: E731
                x, y, cos, sin, n, S, B, H, D, LAYOUT=int(layout == "bshd"), EVEN=even,
                PARTNER_LAST=partner_last, TABLE_LAST=table_last, XBLOCK=1024, num_warps=4)
            run()
            torch.testing.assert_close(y.float(), want.float(), atol=0.02, rtol=0.02)
            res.append((f"even={int(even)} partner_last={int(partner_last)} "
                        f"table_last={int(table_last)}", ms(run)))
        torch._dynamo.reset()
        for prov, t in res:
            rows.append((name, prov, t, copy / t))
            print(f"{name:26s} {prov:44s} {t:8.4f} ms {copy / t:6.3f}", flush=True)
        x = y = None
        torch.cuda.empty_cache()
    path = compare.write_csv(
        [dict(case=c, provider=p, ms=f"{t:.5f}", ratio_to_copy=f"{r:.4f}")
         for c, p, t, r in rows], os.path.join(args.out, f"flat_hints_probe-{gpu}.csv"),
        meta=compare.environment_meta(), fields=["case", "provider", "ms", "ratio_to_copy"])
    print("wrote", path)


if __name__ == "__main__":
    main()
