"""The KV-cache write as one Triton kernel: the second half of a two-kernel decode step.

A serving stack that does not fuse RoPE with the cache write still writes k and v into its
cache with one kernel: vLLM's `reshape_and_cache` takes each new token's k and v and stores
them at the token's slot. `write_kv_cache` here is that kernel for ropelib's caches, so that
`ropelib.bench.kv_cache_decode` can time a decode step of two kernels (ropelib's RoPE on q and
k, then this write) beside the fused step (one kernel) and the unfused step in PyTorch (one
RoPE kernel, then 6 to 17 operators):

    k_cache[slot(b, p)] = store(k[b, s] / k_scale)          p = cache_seqlens[b] + s
    v_cache[slot(b, p)] = store(v[b, s] / v_scale)

with the slots, caches and scales of `ropelib.rope_kv_cache` (ropelib.kernels.kv_cache):

    contiguous cache [B, L, HK, D]:      slot(b, p) = (b, p)
    paged cache [NB, BS, HK, D]:         slot(b, p) = (block_table[b, p // BS], p % BS)

`store` is the fused kernel's own rounding (`_to_cache`): fp32 to the cache's dtype, round to
nearest even; a float8_e4m3fn cache divides by its fp32 per-tensor scale first (IEEE division)
and saturates at +-448. It reads k as given (already rotated, in its own dtype), so its result
is bit for bit that of `ropelib.kv_cache.write_kv_cache`, the same write in PyTorch: the same
value, divided once and rounded once.

How it is parallelised
----------------------
One program per (new token, group of heads), as `reshape_and_cache` takes one thread block per
token:

    axis 0: the B*S new tokens, t = b*S + s               B*S
    axis 1: groups of BLOCK_H kv heads                     cdiv(HK, BLOCK_H)

A program loads its token's position (one int of cache_seqlens, and one block-table entry when
paged), then copies the [BLOCK_H, D] tile of k and the [BLOCK_H, DV] tile of v into that slot.
BLOCK_H takes every head up to 1024 elements of k per program: at HK = 8, D = 128 one program
writes a whole token. Programs share nothing. A token whose slot lies outside the cache (a
position < 0 or past the cache, a block-table entry outside [0, NB)) is not written, so no
index value can make the kernel write outside the caches. Positions are not checked on the
host: the benchmark's are valid by construction.

On a GPU it is launched through Triton's Python launcher (`kernel[grid](...)`), which costs the
host more per call than a C++ operator like vLLM's: an eager timing of the two-kernel step holds
that cost; a CUDA-graph replay leaves it out.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ..kernels.kv_cache import _to_cache, cache_feature_stride_ok
from ..kv_cache import _check_scale

MAX_TILE = 1024     # elements of k per program: the head groups' size at D = 128 is 8 heads


@triton.jit
def _write_kv_cache_kernel(
    k_ptr, v_ptr,                           # new tokens' k [B, S, HK, D], v [B, S, HK, DV]
    k_cache_ptr, v_cache_ptr,               # contiguous [B, L, HK, D] or paged [NB, BS, HK, D]
    seqlens_ptr,                            # [B] ints: position of each sequence's first token
    block_table_ptr,                        # [B, MAX_BLOCKS] ints, contiguous (None: contiguous)
    k_scale_ptr, v_scale_ptr,               # fp32 [1] scales of float8 caches (None: no scaling)
    S,                                      # new tokens per sequence
    HK,                                     # kv heads
    CACHE_LEN,                              # contiguous: positions L; paged: block size BS
    N_BLOCKS, MAX_BLOCKS,                   # paged: blocks in the pool, block-table columns
    stride_k_b, stride_k_s, stride_k_h,     # k's strides (features: stride 1)
    stride_v_b, stride_v_s, stride_v_h,     # v's strides (features: stride 1)
    stride_kc_r, stride_kc_s, stride_kc_h,  # k_cache's (row: sequence or block, slot, head)
    stride_vc_r, stride_vc_s, stride_vc_h,  # v_cache's, the same (features: stride 1)
    D: tl.constexpr, DV: tl.constexpr,      # head dims of k and v
    BLOCK_H: tl.constexpr,                  # kv heads a program writes (a power of two)
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,   # powers of two >= D and >= DV
):
    PAGED: tl.constexpr = block_table_ptr is not None
    K_SCALED: tl.constexpr = k_scale_ptr is not None
    V_SCALED: tl.constexpr = v_scale_ptr is not None
    t = tl.program_id(0).to(tl.int64)       # new token t = b*S + s (int64: caches may pass 2^31)
    b = t // S
    s = t % S
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)   # [BLOCK_H]
    p = tl.load(seqlens_ptr + b).to(tl.int64) + s           # the token's position
    # the token's slot: (row, slot) of the cache, and whether it lies inside the cache
    if PAGED:
        blk = p // CACHE_LEN
        ok = (p >= 0) & (blk < MAX_BLOCKS)
        phys = tl.load(block_table_ptr + b * MAX_BLOCKS + blk, mask=ok, other=0).to(tl.int64)
        ok = ok & (phys >= 0) & (phys < N_BLOCKS)
        row = tl.where(ok, phys, 0)
        slot = tl.where(ok, p % CACHE_LEN, 0)
    else:
        ok = (p >= 0) & (p < CACHE_LEN)
        row = b
        slot = tl.where(ok, p, 0)
    if K_SCALED:
        k_scale = tl.load(k_scale_ptr)
    else:
        k_scale = 1.0
    if V_SCALED:
        v_scale = tl.load(v_scale_ptr)
    else:
        v_scale = 1.0
    # the heads to write: this group's, none for a token without a slot
    h_ok = h < tl.where(ok, HK, 0)                          # [BLOCK_H]

    # k: the [BLOCK_H, BLOCK_D] tile of this token's heads, into the slot
    d = tl.arange(0, BLOCK_D)
    mk = h_ok[:, None] & (d < D)[None, :]                   # [BLOCK_H, BLOCK_D]
    x = tl.load(k_ptr + b * stride_k_b + s * stride_k_s + h[:, None] * stride_k_h + d[None, :],
                mask=mk, other=0.0).to(tl.float32)
    tl.store(k_cache_ptr + row * stride_kc_r + slot * stride_kc_s + h[:, None] * stride_kc_h
             + d[None, :],
             _to_cache(x, k_scale, k_cache_ptr.dtype.element_ty, K_SCALED), mask=mk)
    # v: the [BLOCK_H, BLOCK_DV] tile, into the same slot of v_cache
    f = tl.arange(0, BLOCK_DV)
    mv = h_ok[:, None] & (f < DV)[None, :]                  # [BLOCK_H, BLOCK_DV]
    y = tl.load(v_ptr + b * stride_v_b + s * stride_v_s + h[:, None] * stride_v_h + f[None, :],
                mask=mv, other=0.0).to(tl.float32)
    tl.store(v_cache_ptr + row * stride_vc_r + slot * stride_vc_s + h[:, None] * stride_vc_h
             + f[None, :],
             _to_cache(y, v_scale, v_cache_ptr.dtype.element_ty, V_SCALED), mask=mv)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, cache_seqlens: torch.Tensor, *,
                   block_table: Optional[torch.Tensor] = None,
                   k_scale: Optional[torch.Tensor] = None,
                   v_scale: Optional[torch.Tensor] = None) -> None:
    """Write k [B, S, HK, D] and v [B, S, HK, DV] (k already rotated) into the caches at each
    sequence's positions, in one launch. The arguments of `ropelib.kv_cache.write_kv_cache`
    (the same write in PyTorch), whose result this is bit for bit. Features of k, v and the
    caches at stride 1; cache_seqlens [B] and block_table [B, MAX_BLOCKS] contiguous; the
    positions are not checked (one outside the cache is not written)."""
    B, S, HK, D = k.shape
    DV = v.shape[3]
    if tuple(v.shape[:3]) != (B, S, HK):
        raise ValueError(f"k [B, S, HK, D] and v [B, S, HK, DV] must agree, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    for t, name in ((k, "k"), (v, "v"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        if not cache_feature_stride_ok(t):
            raise ValueError(f"{name}'s features (its last dim) must be at stride 1, got "
                             f"strides {tuple(t.stride())}")
    for t, name in ((cache_seqlens, "cache_seqlens"), (block_table, "block_table")):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    # the scales as ropelib.rope_kv_cache checks them: one fp32 value for an fp8 cache, else None
    k_scale = _check_scale(k_scale, k_cache, "k_scale", "k_cache")
    v_scale = _check_scale(v_scale, v_cache, "v_scale", "v_cache")
    if B * S == 0:
        return
    block_d, block_dv = triton.next_power_of_2(D), triton.next_power_of_2(DV)
    block_h = min(triton.next_power_of_2(HK), max(1, MAX_TILE // block_d))
    paged = block_table is not None
    grid = (B * S, triton.cdiv(HK, block_h))
    _write_kv_cache_kernel[grid](
        k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
        S, HK, k_cache.shape[1],
        k_cache.shape[0] if paged else 0, block_table.shape[1] if paged else 0,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        D=D, DV=DV, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_DV=block_dv)
