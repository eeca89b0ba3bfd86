"""The bytes one decoding step moves, fused and in two kernels (notebook 11, exercise 2).

The fused RoPE + KV-cache write kernel of notebook 11 rotates each sequence's new q and k and
stores k and v straight into the cache. The fewest kernels an unfused step can run are two
(`ropelib.bench.kv_cache_decode`'s "two kernels"): a RoPE kernel that writes the rotated k to
memory, then a write kernel that reads it back and stores it, with v, into the slot. Here both
paths run in Triton's interpreter under `ropelib.course.access.record`, which logs the byte
address of every lane each `tl.load` and `tl.store` touches, and the bytes are summed per
tensor: the traffic the kernels ask for, measured, not computed from their source.

    fused:        fused_kernel                       (exercise 2's signature)
    two kernels:  _rope_qk_decode_kernel             (q, k rotated; k_rot written to memory)
                  cache_write._write_kv_cache_kernel (k_rot and v into the slot)

`_rope_qk_decode_kernel` is exercise 2's worked kernel with the cache store taken out: one
program per sequence rotates its token's q and k heads and writes them to `q_out` and `k_rot`.
The write kernel is the one the decode benchmark times. Runs on the CPU (the interpreter), on
any machine.

`decode_steps` builds the same step three ways for timing (fused, fused and then one kernel
that does no work, two kernels); `program_bytes` records the bytes each program of the worked
kernel and of ropelib's `_rope_kv_cache_kernel` moves at the grid ropelib picks on a GPU, and
`ropelib_launch` is that launch (with the heads a program takes as an argument) for a GPU.
"""
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl

from .. import frequencies
from ..bench import cache_write
from ..kernels import common as kernel_common
from ..kernels import kv_cache as kv_kernels
from . import access

__all__ = ["step_traffic", "TENSORS", "decode_steps", "launch_two_kernels", "program_bytes",
           "ropelib_launch"]

# the tensors a step touches, in the order the tables print them
TENSORS = ("q", "k", "v", "seqlens", "freqs", "q_out", "k_rot", "k_cache", "v_cache")


@triton.jit
def _rope_qk_decode_kernel(
    q_ptr, k_ptr,               # the new token of each sequence: q [B, HQ, D], k [B, HK, D]
    q_out_ptr, k_out_ptr,       # the rotated q [B, HQ, D] and k [B, HK, D], contiguous
    seqlens_ptr,                # [B] int32: the new token's position
    freqs_ptr,                  # angles [P, D] fp32, contiguous
    HQ: tl.constexpr,           # heads of q (a power of two)
    HK: tl.constexpr,           # heads of k (a power of two)
    D: tl.constexpr,            # head dim (a power of two), all rotated
):
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)                                 # one program per sequence
    pos = tl.load(seqlens_ptr + b)
    j = tl.arange(0, HALF)[None, :]                      # [1, HALF] pairs
    theta = tl.load(freqs_ptr + pos * D + j)             # one row of the angle table
    c, s = tl.cos(theta), tl.sin(theta)
    hq = tl.arange(0, HQ)[:, None]
    x1 = tl.load(q_ptr + (b * HQ + hq) * D + j).to(tl.float32)
    x2 = tl.load(q_ptr + (b * HQ + hq) * D + HALF + j).to(tl.float32)
    tl.store(q_out_ptr + (b * HQ + hq) * D + j, x1 * c - x2 * s)
    tl.store(q_out_ptr + (b * HQ + hq) * D + HALF + j, x2 * c + x1 * s)
    hk = tl.arange(0, HK)[:, None]
    k1 = tl.load(k_ptr + (b * HK + hk) * D + j).to(tl.float32)
    k2 = tl.load(k_ptr + (b * HK + hk) * D + HALF + j).to(tl.float32)
    tl.store(k_out_ptr + (b * HK + hk) * D + j, k1 * c - k2 * s)     # to memory: the
    tl.store(k_out_ptr + (b * HK + hk) * D + HALF + j, k2 * c + k1 * s)   # round trip


def _bytes(log, tensors) -> Dict[Tuple[str, str], int]:
    """{(tensor, "load" or "store"): bytes} of the recorded accesses."""
    out = {}
    for name, accesses in access.by_tensor(log, tensors).items():
        for a in accesses:
            key = (name, a.kind)
            out[key] = out.get(key, 0) + a.addresses.size * a.itemsize
    return out


def step_traffic(fused_kernel, B=2, L=8, HQ=32, HK=8, D=128, dtype=torch.bfloat16,
                 seed=0) -> dict:
    """Record one decoding step (one new token per sequence, bf16 q, k, v and contiguous caches
    [B, L, HK, D]) fused and in two kernels, in the interpreter.

    Returns {"fused": {(tensor, kind): bytes}, "two kernels": {...}, "B": B,
    "same": whether both paths wrote the same q_out and caches (bf16 tolerances)}.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, D, generator=g).to(dtype)
    k = torch.randn(B, HK, D, generator=g).to(dtype)
    v = torch.randn(B, HK, D, generator=g).to(dtype)
    seqlens = torch.randint(0, L, (B,), generator=g, dtype=torch.int32)
    freqs = frequencies.rope_freqs(L, D, device="cpu").view(L, D)   # fp32 angles [L, D]
    out = {"B": B}
    caches = {}
    for path in ("fused", "two kernels"):
        q_out = torch.empty_like(q)
        k_cache = torch.zeros(B, L, HK, D, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        named = dict(q=q, k=k, v=v, seqlens=seqlens, freqs=freqs, q_out=q_out,
                     k_cache=k_cache, v_cache=v_cache)
        if path == "fused":
            log = access.record(fused_kernel, (B,), q, k, v, q_out, k_cache, v_cache, seqlens,
                                freqs, L, HQ=HQ, HK=HK, D=D)
        else:
            k_rot = torch.empty_like(k)
            named["k_rot"] = k_rot
            log = access.record(_rope_qk_decode_kernel, (B,), q, k, q_out, k_rot, seqlens,
                                freqs, HQ=HQ, HK=HK, D=D)
            k4, v4 = k_rot[:, None], v[:, None]                  # [B, 1, HK, D]: S = 1
            block_h = min(triton.next_power_of_2(HK), max(1, cache_write.MAX_TILE // D))
            log += access.record(
                cache_write._write_kv_cache_kernel, (B, triton.cdiv(HK, block_h)),
                k4, v4, k_cache, v_cache, seqlens, None, None, None,
                1, HK, L, 0, 0,
                k4.stride(0), k4.stride(1), k4.stride(2), v4.stride(0), v4.stride(1),
                v4.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                D=D, DV=D, BLOCK_H=block_h, BLOCK_D=D, BLOCK_DV=D)
        out[path] = _bytes(log, named)
        caches[path] = (q_out, k_cache, v_cache)
    out["same"] = all(torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1.6e-2)
                      for a, b in zip(caches["fused"], caches["two kernels"]))
    return out


def launch_two_kernels(q, k, v, q_out, k_rot, k_cache, v_cache, seqlens, freqs) -> None:
    """The two-kernel step: `_rope_qk_decode_kernel` (q_out and k_rot written, one program per
    sequence), then `cache_write.write_kv_cache` (k_rot and v into their slots). q [B, HQ, D],
    k, v, k_rot [B, HK, D], caches [B, L, HK, D], freqs [P, D]."""
    B, HQ, D = q.shape
    _rope_qk_decode_kernel[(B,)](q, k, q_out, k_rot, seqlens, freqs, HQ=HQ, HK=k.shape[1], D=D)
    cache_write.write_kv_cache(k_rot[:, None], v[:, None], k_cache, v_cache, seqlens)


def decode_steps(fused_kernel, B, HQ=32, HK=8, D=128, L=4096, dtype=torch.bfloat16,
                 device="cpu", seed=0):
    """One decoding step (bf16 q, k, v, each sequence at a random position of a contiguous cache
    of L) three ways, each a callable with its own outputs:

    "fused": `fused_kernel` (exercise 2's signature), one launch;
    "fused + empty": the same, then a kernel that fills one element (one more launch, no work);
    "two kernels": `launch_two_kernels`.

    Returns ({name: step()}, {name: (q_out, k_cache, v_cache)})."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, D, generator=g).to(device=device, dtype=dtype)
               for n in (HQ, HK, HK))
    seqlens = torch.randint(0, L, (B,), generator=g, dtype=torch.int32).to(device)
    freqs = frequencies.rope_freqs(L, D, device=device).view(L, D)
    outs = {name: (torch.empty_like(q), torch.zeros(B, L, HK, D, dtype=dtype, device=device),
                   torch.zeros(B, L, HK, D, dtype=dtype, device=device))
            for name in ("fused", "fused + empty", "two kernels")}
    k_rot, cell = torch.empty_like(k), torch.empty(1, device=device)

    def fused(name="fused"):
        q_out, k_cache, v_cache = outs[name]
        fused_kernel[(B,)](q, k, v, q_out, k_cache, v_cache, seqlens, freqs, L, HQ=HQ, HK=HK,
                           D=D)

    def fused_and_empty():
        fused("fused + empty")
        cell.zero_()                                    # one more kernel, one element

    def two_kernels():
        launch_two_kernels(q, k, v, *outs["two kernels"][:1], k_rot, *outs["two kernels"][1:],
                           seqlens, freqs)

    return {"fused": fused, "fused + empty": fused_and_empty, "two kernels": two_kernels}, outs


def ropelib_launch(B, HQ=32, HK=8, D=128, L=4096, block_h=None, sm_count=132,
                   dtype=torch.bfloat16, device="cpu", seed=0):
    """ropelib's contiguous-cache kernel for one decoding step as a GPU with `sm_count` SMs
    launches it (`kernels.kv_cache.pick_tiles`: one batch entry a program), or with `block_h`
    heads a program where given. Returns (grid, pointers, args, num_warps, outputs): launch it as
    `_rope_kv_cache_kernel[grid](*pointers, **args, num_warps=num_warps)`; outputs are
    (q_out [B, 1, HQ, D], k_cache, v_cache). Inputs drawn as `decode_steps` draws them."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, 1, n, D, generator=g).to(device=device, dtype=dtype)
               for n in (HQ, HK, HK))
    seqlens = torch.randint(0, L, (B,), generator=g, dtype=torch.int32).to(device)
    table = frequencies.rope_freqs(L, D, device=device).view(L, D)
    q_out = torch.empty_like(q)
    k_cache, v_cache = (torch.zeros(B, L, HK, D, dtype=dtype, device=device) for _ in range(2))
    planned, pointers = kv_kernels.plan(q, k, v, q_out, k_cache, v_cache, seqlens, None, table,
                                        None, None, None, interleaved=False)
    block_s, picked_h, chunk, num_warps = kv_kernels.pick_tiles(1, B, HQ, HK, D, D, sm_count)
    if block_h is not None:
        num_warps = kv_kernels.tile_warps(block_s, block_h, D)
    block_h = picked_h if block_h is None else block_h
    grid = kv_kernels.launch_grid(1, B, HQ, HK, block_s, block_h, chunk)
    args = dict(planned.args, BLOCK_S=block_s, BLOCK_H=block_h, ENTRIES=chunk)
    return grid, pointers, args, num_warps, (q_out, k_cache, v_cache)


def program_bytes(fused_kernel, B=1, HQ=32, HK=8, D=128, L=8, sm_count=132) -> dict:
    """Bytes each program moves (loads and stores), recorded in the interpreter for one
    decoding step at these head sizes (bf16): {"yours": [...], "ropelib": [...]}, one entry a
    program, in grid order. "yours": `fused_kernel` at its grid (B,); "ropelib": ropelib's
    kernel at the grid `ropelib_launch` picks for `sm_count` SMs. Raises unless both write the
    same q_out and caches (bf16 tolerances)."""
    grid, pointers, args, _, (q_out, k_cache, v_cache) = ropelib_launch(
        B, HQ, HK, D, L, sm_count=sm_count)
    q, k, v, seqlens, table = pointers[0], pointers[1], pointers[2], pointers[8], pointers[6]
    # off the interpreter, the kernel's sin/cos are libdevice's, which the interpreter cannot
    # run: the tl.sin/tl.cos route it takes under the interpreter (the same loads and stores)
    accurate, kernel_common.ACCURATE = kernel_common.ACCURATE, tl.constexpr(False)
    try:
        logs = {"ropelib": access.record(kv_kernels._rope_kv_cache_kernel, grid, *pointers,
                                         **args)}
    finally:
        kernel_common.ACCURATE = accurate
    mine = (torch.empty(B, HQ, D, dtype=q.dtype), torch.zeros_like(k_cache),
            torch.zeros_like(v_cache))
    logs["yours"] = access.record(fused_kernel, (B,), q[:, 0], k[:, 0], v[:, 0], mine[0],
                                  mine[1], mine[2], seqlens, table, L, HQ=HQ, HK=HK, D=D)
    if not all(torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1.6e-2)
               for a, b in zip(mine, (q_out[:, 0], k_cache, v_cache))):
        raise AssertionError("the kernel and ropelib's wrote different q_out or caches")
    out = {}
    for name, log in logs.items():
        per = {}
        for a in log:
            per[a.program] = per.get(a.program, 0) + a.addresses.size * a.itemsize
        out[name] = [per[p] for p in sorted(per, key=lambda p: p[::-1])]
    return out
