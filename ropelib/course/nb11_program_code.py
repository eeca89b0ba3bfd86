"""What one program of the worked fused kernel (notebook 11, exercise 2) and one of ropelib's
`_rope_kv_cache_kernel` do, read from their sm_90 machine code (notebook 11, section 4).

Both kernels are compiled here for an H100/H200 (sm_90) at the decode benchmark's sizes (q 32
heads, k and v 8 heads of 128, bf16, batch 1), with no GPU (`offline_compile.compiled_code`).
`program_path` walks a kernel's SASS from its first instruction to its first store the way a
thread runs it on the usual path: it leaves out the instructions of libdevice's sin/cos slow
path (Payne-Hanek, taken only for angles of 105,615 rad and more: `counts.slow_path`, which
`counts.loop_fast_paths` skips too), and counts what stands before the first store:
instructions, the angles whose sin and cos are reduced (one multiply by 2/pi each), and the
loads.

`cs_table_kernel` is the worked kernel with one change, for a timing on a GPU: it reads cos and
sin from two tables [P, D/2] in place of evaluating them from an angle table. Notebook 11 defines
its own copy and launcher in a cell and passes them to `compiled_programs` and `cs_table_matches`;
the ones here are their defaults (tests).
"""
import re
from collections import Counter
from typing import Dict

import torch
import triton
import triton.language as tl

from ..kernels import kv_cache as kv_kernels
from . import counts
from .offline_compile import compiled_code

__all__ = ["program_path", "compiled_programs", "cs_table_kernel", "cs_tables", "launch_cs_table",
           "cs_table_matches"]

_LINE = re.compile(
    r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)([.A-Z0-9_]*)[^;]*);")
TWO_OVER_PI = "0.63661974"          # libdevice's sinf/cosf: x * 2/pi, once an angle


def program_path(sass: str) -> Dict:
    """The usual path of a thread through `sass` up to its first store (STG): {"instructions":
    how many, "angles": sin/cos range reductions, "loads": Counter of LDG widths before it
    (libdevice's constant-table loads of the slow path excluded), "loads_after_angles": how many
    of them wait behind the last reduction}."""
    ins = [(int(m[1], 16), m[3], m[4], m[2]) for m in map(_LINE.search, sass.splitlines()) if m]
    skipped = counts.slow_path(sass)
    path = []
    for a, op, mods, text in ins:
        if a in skipped:
            continue
        if op == "STG":
            break
        path.append((op, mods, text))
    reductions = [i for i, (op, _, text) in enumerate(path)
                  if op == "FMUL" and TWO_OVER_PI in text]
    loads = [(i, mods) for i, (op, mods, _) in enumerate(path)
             if op == "LDG" and ".CONSTANT" not in mods]
    return {"instructions": len(path), "angles": len(reductions),
            "loads": Counter("LDG" + (mods.replace(".E", "") or ".32") for _, mods in loads),
            "loads_after_angles": sum(i > reductions[-1] for i, _ in loads) if reductions else 0}


def compiled_programs(worked_kernel, HQ=32, HK=8, D=128, L=4096, sm_count=132,
                      table_kernel=None) -> Dict:
    """{"worked": ..., "cos/sin tables": ..., "ropelib": ...}: each kernel compiled for sm_90 at
    batch 1, as it launches there (the worked kernel and `cs_table_kernel`: one program of 4
    warps; ropelib's: the tile pick_tiles gives on `sm_count` SMs), with {"programs", "warps",
    "registers", "sass_instructions", "triton", **program_path(sass)}. `table_kernel`: the
    tables' kernel (`cs_table_kernel`'s signature), `cs_table_kernel` if None."""
    bf = torch.bfloat16
    q, k = torch.empty(1, HQ, D, dtype=bf), torch.empty(1, HK, D, dtype=bf)
    seqlens, angles = torch.empty(1, dtype=torch.int32), torch.empty(L * D)
    worked = compiled_code(worked_kernel, dict(
        q_ptr=q, k_ptr=k, v_ptr=k, q_out_ptr=q, k_cache_ptr=k, v_cache_ptr=k,
        seqlens_ptr=seqlens, freqs_ptr=angles, L=L, HQ=HQ, HK=HK, D=D), num_warps=4)
    tables = compiled_code(cs_table_kernel if table_kernel is None else table_kernel, dict(
        q_ptr=q, k_ptr=k, v_ptr=k, q_out_ptr=q, k_cache_ptr=k, v_cache_ptr=k,
        seqlens_ptr=seqlens, cos_ptr=angles, sin_ptr=angles, L=L, HQ=HQ, HK=HK, D=D),
        num_warps=4)
    block_s, block_h, chunk, warps = kv_kernels.pick_tiles(1, 1, HQ, HK, D, D, sm_count)
    grid = kv_kernels.launch_grid(1, 1, HQ, HK, block_s, block_h, chunk)
    lib = compiled_code(kv_kernels._rope_kv_cache_kernel, dict(
        q_ptr=q, k_ptr=k, v_ptr=k, q_out_ptr=q, k_cache_ptr=k, v_cache_ptr=k, cos_ptr=angles,
        sin_ptr=None, seqlens_ptr=seqlens, k_scale_ptr=None, v_scale_ptr=None,
        S=1, B=1, HQ=HQ, HK=HK, P=L, L=L, stride_q_t=HQ * D, stride_k_t=HK * D,
        stride_v_t=HK * D, stride_kc_b=L * HK * D, stride_kc_s=HK * D, stride_kc_h=D,
        stride_vc_b=L * HK * D, stride_vc_s=HK * D, stride_vc_h=D, R=D, D=D, DV=D,
        BLOCK_S=block_s, BLOCK_H=block_h, INTERLEAVED=False, ENTRIES=chunk), num_warps=warps)
    out = {}
    for name, code, programs, w in (("worked", worked, 1, 4), ("cos/sin tables", tables, 1, 4),
                                    ("ropelib", lib, grid[0] * grid[1] * grid[2], warps)):
        sass = code["sass"]
        out[name] = dict(programs=programs, warps=w,
                         registers=code["resources"].get("registers"),
                         sass_instructions=len([m for m in map(_LINE.search, sass.splitlines())
                                                if m]),
                         triton=code["triton"], **program_path(sass))
    return out


@triton.jit
def cs_table_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
    cos_ptr, sin_ptr,           # cos and sin of the angles, [P, D/2] fp32 each, contiguous
    L, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
):
    # exercise 2's worked kernel, with cos and sin read from tables instead of evaluated
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    j = tl.arange(0, HALF)[None, :]
    c = tl.load(cos_ptr + pos * HALF + j)       # the one change: two loads, no sin/cos
    s = tl.load(sin_ptr + pos * HALF + j)
    hq = tl.arange(0, HQ)[:, None]
    q_row = q_ptr + (b * HQ + hq) * D
    x1 = tl.load(q_row + j).to(tl.float32)
    x2 = tl.load(q_row + HALF + j).to(tl.float32)
    out_row = q_out_ptr + (b * HQ + hq) * D
    tl.store(out_row + j, x1 * c - x2 * s)
    tl.store(out_row + HALF + j, x2 * c + x1 * s)
    hk = tl.arange(0, HK)[:, None]
    k_row = k_ptr + (b * HK + hk) * D
    k1 = tl.load(k_row + j).to(tl.float32)
    k2 = tl.load(k_row + HALF + j).to(tl.float32)
    slot = ((b * L + pos) * HK + hk) * D
    tl.store(k_cache_ptr + slot + j, k1 * c - k2 * s)
    tl.store(k_cache_ptr + slot + HALF + j, k2 * c + k1 * s)
    f = tl.arange(0, D)[None, :]
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


def cs_tables(freqs: torch.Tensor):
    """Angles [P, D] (pair j turns by column j) -> (cos, sin), each [P, D/2] fp32, contiguous."""
    half = freqs[:, :freqs.shape[1] // 2].float()
    return torch.cos(half).contiguous(), torch.sin(half).contiguous()


def launch_cs_table(kernel, q, k, v, q_out, k_cache, v_cache, seqlens, cos, sin) -> None:
    """`kernel` (`cs_table_kernel`'s signature) for one decoding step: q [B, HQ, D], k, v
    [B, HK, D], caches [B, L, HK, D], cos and sin [P, D/2] (`cs_tables`); one program per
    sequence."""
    B, HQ, D = q.shape
    # grid: one program per sequence b, all heads of its token in one tile (Triton's default
    # 4 warps), as launch_kv_cache
    kernel[(B,)](q, k, v, q_out, k_cache, v_cache, seqlens, cos, sin,
                 k_cache.shape[1], HQ=HQ, HK=k.shape[1], D=D)


def cs_table_matches(worked_kernel, launch_worked, B=2, HQ=4, HK=2, D=16, L=8,
                     device="cpu", seed=0, table_kernel=None, launch_tables=None) -> bool:
    """Do `table_kernel` (launched by `launch_tables`, `launch_cs_table`'s signature; by default
    `cs_table_kernel` and `launch_cs_table`) and `worked_kernel` (launched by `launch_worked`,
    exercise 2's `launch_kv_cache`) write the same q_out and caches (bf16 tolerances) for one
    decoding step?"""
    table_kernel = cs_table_kernel if table_kernel is None else table_kernel
    launch_tables = launch_cs_table if launch_tables is None else launch_tables
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, D, generator=g).to(device=device, dtype=torch.bfloat16)
               for n in (HQ, HK, HK))
    seqlens = torch.randint(0, L, (B,), generator=g, dtype=torch.int32).to(device)
    freqs = (torch.arange(L, dtype=torch.float32)[:, None]
             * 10000.0 ** (-torch.arange(D // 2) / (D // 2))).repeat(1, 2).to(device)
    outs = []
    for run in ("worked", "tables"):
        out = (torch.empty_like(q), torch.zeros(B, L, HK, D, dtype=q.dtype, device=device),
               torch.zeros(B, L, HK, D, dtype=q.dtype, device=device))
        if run == "worked":
            launch_worked(worked_kernel, q, k, v, *out, seqlens, freqs)
        else:
            launch_tables(table_kernel, q, k, v, *out, seqlens, *cs_tables(freqs))
        outs.append(out)
    return all(torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1.6e-2)
               for a, b in zip(*outs))
