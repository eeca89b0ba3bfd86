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
"""
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl

from .. import frequencies
from ..bench import cache_write
from . import access

__all__ = ["step_traffic", "TENSORS"]

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
