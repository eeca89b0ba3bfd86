"""RoPE fused with the KV-cache write, for decoding: one launch rotates q and k of the new tokens,
returns the rotated q and writes the rotated k (and v, copied) into the cache.

    q_out[b, s]                 = rot(theta_p) q[b, s]          p = cache_seqlens[b] + s
    k_cache[slot(b, p)]         = store(rot(theta_p) k[b, s] / k_scale)
    v_cache[slot(b, p)]         = store(v[b, s] / v_scale)

Sequence b's new tokens take positions cache_seqlens[b] .. cache_seqlens[b] + S - 1 (decode:
S = 1; a prefill chunk: S > 1), both as rows of the RoPE table and as cache slots. The slot is

    contiguous cache [B, L, HK, D]:      (b, p)
    paged cache [NB, BS, HK, D]:         (block_table[b, p // BS], p % BS)

`store` rounds fp32 to the cache's dtype once (round to nearest even); a float8_e4m3fn cache
divides by its fp32 per-tensor scale first and saturates at +-448 (NaN stays NaN).

Two entry kernels share one body (_rope_kv_cache_body), one per kind of cache, so that neither
takes more than 32 arguments (each argument costs host time at every launch, and decode is
host-bound):

    _rope_kv_cache_kernel   contiguous cache [B, L, HK, D]                        32 args
    _rope_kv_paged_kernel   paged cache [NB, BS, HK, D] with a block table          32

What is not an argument follows from the others: paged or not, float8 scaling or not (the
pointers given), the tile widths (from R, D and DV), q_out's strides (a fresh contiguous bshd
tensor), and every stride the kernels require to be what the shapes make it. They read q, k
and v token-major: each token's heads one dense block (heads at stride D, or DV, features at
stride 1) and the tokens evenly spaced (batch stride = S x token stride), so one token stride
each; the caches' features at stride 1, and a paged cache's two pools laid out alike (their
block, slot and head strides are D and DV times one set of units); the table dense [P, R];
cache_seqlens and block_table contiguous. ropelib.kv_cache copies an input that is not so (a
contiguous tensor, views of one projection and every decode step are) and refuses such caches.

How it is parallelised
----------------------
q, k and v are token-major [B, S, H, D] views (bshd). The grid is

    axis 0: blocks of BLOCK_S new tokens                  cdiv(S, BLOCK_S)
    axis 1: blocks of BLOCK_H heads of q, then of k       cdiv(HQ, BLOCK_H) + cdiv(HK, BLOCK_H)
    axis 2: chunks of batch entries                       cdiv(B, chunk); a program takes
                                                          `chunk` entries (fixed when the
                                                          kernel is compiled; 0: from the grid)

A q program rotates its [BLOCK_S, BLOCK_H, D] tile of q into q_out; a k program rotates the same
tile of k and copies the tile of v, both into the cache slots of its tokens. Every batch entry
has its own positions, so a program finds its tokens' table rows and slots (one load of
cache_seqlens, and of the block table when paged) and loads their cos/sin inside its batch loop.
On a GPU a program takes one batch entry (chunks of 1) and the heads are split until the grid
fills the machine (decode is a few KB per sequence); in the interpreter one program takes every
batch entry. Math is fp32 (an angle table's cos/sin evaluated in the kernel), with one rounding
at each store.

Memory stays safe whatever the index values: the table read is clamped, and a token whose slot
lies outside the cache (a position < 0 or beyond the cache's length, a block-table entry outside
[0, NB)) is not written. Such a token's q_out row comes out NaN, as does a token whose position
lies outside the table (its k is written as NaN), so the error cannot pass unnoticed. The host
checks the index values before launching where that is free (ropelib.kv_cache).

Triton's interpreter converts fp32 to fp8 incorrectly (ties, large values, subnormals, NaN);
there (FP8_BY_BITS) the kernel encodes e4m3 with integer operations, which gives the same bits
as torch's conversion of the clamped value. On a GPU it uses the hardware conversion.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import INTERPRET
from .common import (ROUND_BF16_RTNE, batch_range, contiguous_strides, load_table, pair_features,
                     rotate_pair, round_to, store_pair, tile_width)
from .direct import DirectLauncher
from .planning import Launch, cdiv, pointer_dtypes, pow2_at_least, pow2_at_most, start
from .tiles import KV_CACHE_ELEMENTS_PER_STEP, KV_CACHE_PROGRAMS_PER_SM, multiprocessors

FP8_BY_BITS: bool = INTERPRET
ENCODE_FP8_BY_BITS = tl.constexpr(FP8_BY_BITS)
FP8_MAX = 448.0           # the largest finite float8_e4m3fn


@triton.jit
def _fp8_e4m3(y, BY_BITS: tl.constexpr):
    # fp32 y -> float8_e4m3fn, round to nearest even, saturating at +-448, NaN kept
    nan = y != y
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if BY_BITS:
        u = y.to(tl.uint32, bitcast=True)
        sign = (u >> 24) & 0x80
        a = u & 0x7FFFFFFF
        # normal (|y| >= 2^-6): keep 3 mantissa bits (RTNE), rebias the exponent 127 -> 7
        normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
        # subnormal: |y| in units of 2^-9, rounded to the nearest even integer (0..8)
        t = a.to(tl.float32, bitcast=True) * 512.0
        sub = ((t + 8388608.0) - 8388608.0).to(tl.uint32)
        mag = tl.where(a >= 0x3C800000, normal, sub)
        mag = tl.where(nan, 0x7F, mag)
        return (sign | mag).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    else:
        return tl.where(nan, float("nan"), y).to(tl.float8e4nv)


@triton.jit
def _to_cache(y, scale, DTYPE: tl.constexpr, SCALED: tl.constexpr):
    # fp32 values -> the cache's dtype: divided by the scale (IEEE division, as torch's),
    # then rounded once
    if SCALED:
        y = tl.div_rn(y, scale)
    if DTYPE == tl.float8e4nv:
        return _fp8_e4m3(y, ENCODE_FP8_BY_BITS)
    else:
        return round_to(y, DTYPE, ROUND_BF16_RTNE)


@triton.jit
def _slots(p, bb, s_ok, block_table_ptr, stride_bt_b, stride_bt_n, CACHE_LEN, N_BLOCKS,
           MAX_BLOCKS, PAGED: tl.constexpr):
    # positions p [BLOCK_S] (int64) of batch entry bb -> (cache row, slot in the row, valid)
    if PAGED:
        blk = p // CACHE_LEN
        ok = s_ok & (p >= 0) & (blk < MAX_BLOCKS)
        phys = tl.load(block_table_ptr + bb * stride_bt_b + blk * stride_bt_n, mask=ok, other=0)
        phys = phys.to(tl.int64)
        ok = ok & (phys >= 0) & (phys < N_BLOCKS)
        return tl.where(ok, phys, 0), tl.where(ok, p % CACHE_LEN, 0), ok
    else:
        ok = s_ok & (p >= 0) & (p < CACHE_LEN)
        return bb + p * 0, tl.where(ok, p, 0), ok


@triton.jit
def _rope_kv_cache_body(
    q_ptr, k_ptr, v_ptr,                # new tokens [B, S, HQ, D], [B, S, HK, D], [B, S, HK, DV]
    q_out_ptr,                          # rotated q [B, S, HQ, D], fresh and contiguous
    k_cache_ptr, v_cache_ptr,           # contiguous [B, L, HK, D] or paged [NB, BS, HK, D] (v: DV)
    cos_ptr, sin_ptr,                   # table [P, R], dense: angles (sin None) or cos and sin
    seqlens_ptr,                        # [B] ints: the position of each sequence's first new token
    block_table_ptr,                    # [B, MAX_BLOCKS] ints, contiguous (None: contiguous cache)
    k_scale_ptr, v_scale_ptr,           # fp32 [1] scales of float8 caches (None: no scaling)
    S, B, HQ, HK, P,                    # new tokens, batch, heads of q and of k/v, table rows
    CACHE_LEN,                          # contiguous: the cache's length L; paged: block size BS
    N_BLOCKS, MAX_BLOCKS,               # paged: blocks in the pool, block-table columns
    stride_q_t, stride_k_t, stride_v_t,  # token strides: batch stride = S x token stride
    stride_kc_b, stride_kc_s, stride_kc_h,   # _b: batch entry or block (features: stride 1)
    stride_vc_b, stride_vc_s, stride_vc_h,
    R: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,   # rotary dim, head dims of k and v
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ENTRIES: tl.constexpr,              # batch entries a program takes (0: from the grid)
):
    # q, k and v: each token's heads one dense block (heads at stride D or DV, features at
    # stride 1); q_out: contiguous bshd; caches: features at stride 1; the table dense [P, R].
    HALF: tl.constexpr = R // 2
    PAGED: tl.constexpr = block_table_ptr is not None
    K_SCALED: tl.constexpr = k_scale_ptr is not None
    V_SCALED: tl.constexpr = v_scale_ptr is not None
    BLOCK_HALF: tl.constexpr = tile_width(HALF)      # tiles of pairs, and of features R..D-1
    BLOCK_PASS: tl.constexpr = tile_width(D - R)     # (0 when the whole head rotates)
    BLOCK_DV: tl.constexpr = tile_width(DV)          # and of v's features
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    b_lo, b_hi = batch_range(B, ENTRIES)
    q_blocks = tl.cdiv(HQ, BLOCK_H)
    is_q = pid_h < q_blocks
    if is_q:
        h_idx = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        H = HQ
    else:
        h_idx = (pid_h - q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
        H = HK
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)          # [BLOCK_S]
    j = tl.arange(0, BLOCK_HALF)
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    s_ok = s_idx < S
    h_ok = h_idx < H
    row_ok = s_ok[:, None] & h_ok[None, :]                   # [BLOCK_S, BLOCK_H]
    m = row_ok[:, :, None] & (j < HALF)[None, None, :]        # [BLOCK_S, BLOCK_H, BLOCK_HALF]
    tab_mask = s_ok[:, None, None] & (j < HALF)[None, None, :]
    s64 = s_idx.to(tl.int64)
    h64 = h_idx.to(tl.int64)
    if K_SCALED:
        k_scale = tl.load(k_scale_ptr)
    else:
        k_scale = 1.0
    if V_SCALED:
        v_scale = tl.load(v_scale_ptr)
    else:
        v_scale = 1.0
    # batch strides of the inputs (int64: caches and inputs may exceed 2^31 elements), and the
    # output's strides from its shape
    S64 = tl.full([], 0, tl.int64) + S
    stride_q_b = S64 * stride_q_t
    stride_k_b = S64 * stride_k_t
    stride_v_b = S64 * stride_v_t
    stride_qo_s, stride_qo_b, stride_qo_h = contiguous_strides(S, B, HQ, D, 1, True)

    b_lo64 = b_lo.to(tl.int64)
    for b in range(b_lo, b_hi):
        bb = b_lo64 + (b - b_lo)        # int64 offsets: caches may exceed 2^31 elements
        p = tl.load(seqlens_ptr + bb).to(tl.int64) + s64     # [BLOCK_S] positions
        tab_ok = (p >= 0) & (p < P)
        rows = tl.minimum(tl.maximum(p, 0), P - 1)
        c_a, s_a, c_b, s_b = load_table(cos_ptr, sin_ptr, rows, 0, 0, R, 1, d_a, d_b, tab_mask,
                                        tl.float32)
        c_row, c_slot, slot_ok = _slots(p, bb, s_ok, block_table_ptr, MAX_BLOCKS, 1, CACHE_LEN,
                                        N_BLOCKS, MAX_BLOCKS, PAGED)
        if is_q:
            xr = q_ptr + (bb * stride_q_b + s64[:, None] * stride_q_t
                          + h64[None, :] * D)[:, :, None]              # [BLOCK_S, BLOCK_H, 1]
            yr = q_out_ptr + (bb * stride_qo_b + s64[:, None] * stride_qo_s
                              + h64[None, :] * stride_qo_h)[:, :, None]
            x_a = tl.load(xr + d_a[None, None, :], mask=m, other=0.0).to(tl.float32)
            x_b = tl.load(xr + d_b[None, None, :], mask=m, other=0.0).to(tl.float32)
            # a token without a table row or a cache slot: NaN, never a silent wrong answer
            bad = ~(tab_ok & slot_ok)[:, None, None]
            # (the finished kernel's rotation: the same bits as apply_rope, then the write)
            y_a, y_b = rotate_pair(x_a, x_b, c_a, s_a, c_b, s_b)
            store_pair(yr, d_a, d_b, y_a, y_b, bad, m)
            if BLOCK_PASS > 0:     # features R..D-1 pass through
                e = R + tl.arange(0, BLOCK_PASS)
                mp = row_ok[:, :, None] & (e < D)[None, None, :]
                t = tl.load(xr + e[None, None, :], mask=mp, other=0.0).to(tl.float32)
                tl.store(yr + e[None, None, :],
                         round_to(tl.where(bad, float("nan"), t), q_out_ptr.dtype.element_ty,
                                  ROUND_BF16_RTNE), mask=mp)
        else:
            w_ok = row_ok & slot_ok[:, None]                 # [BLOCK_S, BLOCK_H]: slots to write
            wm = w_ok[:, :, None] & (j < HALF)[None, None, :]
            xr = k_ptr + (bb * stride_k_b + s64[:, None] * stride_k_t
                          + h64[None, :] * D)[:, :, None]
            kr = k_cache_ptr + (c_row[:, None] * stride_kc_b + c_slot[:, None] * stride_kc_s
                                + h64[None, :] * stride_kc_h)[:, :, None]
            x_a = tl.load(xr + d_a[None, None, :], mask=m, other=0.0).to(tl.float32)
            x_b = tl.load(xr + d_b[None, None, :], mask=m, other=0.0).to(tl.float32)
            bad = ~tab_ok[:, None, None]
            y_a, y_b = rotate_pair(x_a, x_b, c_a, s_a, c_b, s_b)
            y_a = tl.where(bad, float("nan"), y_a)
            y_b = tl.where(bad, float("nan"), y_b)
            kdt = k_cache_ptr.dtype.element_ty
            tl.store(kr + d_a[None, None, :], _to_cache(y_a, k_scale, kdt, K_SCALED), mask=wm)
            tl.store(kr + d_b[None, None, :], _to_cache(y_b, k_scale, kdt, K_SCALED), mask=wm)
            if BLOCK_PASS > 0:
                e = R + tl.arange(0, BLOCK_PASS)
                mp = row_ok[:, :, None] & (e < D)[None, None, :]
                t = tl.load(xr + e[None, None, :], mask=mp, other=0.0).to(tl.float32)
                t = tl.where(bad, float("nan"), t)
                tl.store(kr + e[None, None, :], _to_cache(t, k_scale, kdt, K_SCALED),
                         mask=mp & w_ok[:, :, None])
            # v: copied (scaled and rounded for its cache) into the same slots
            f = tl.arange(0, BLOCK_DV)
            mv = row_ok[:, :, None] & (f < DV)[None, None, :]
            vr = v_ptr + (bb * stride_v_b + s64[:, None] * stride_v_t
                          + h64[None, :] * DV)[:, :, None]
            vcr = v_cache_ptr + (c_row[:, None] * stride_vc_b + c_slot[:, None] * stride_vc_s
                                 + h64[None, :] * stride_vc_h)[:, :, None]
            val = tl.load(vr + f[None, None, :], mask=mv, other=0.0).to(tl.float32)
            tl.store(vcr + f[None, None, :],
                     _to_cache(val, v_scale, v_cache_ptr.dtype.element_ty, V_SCALED),
                     mask=mv & w_ok[:, :, None])


# --- the entry points: one per kind of cache, each at most 33 arguments ----------------------

@triton.jit
def _rope_kv_cache_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, seqlens_ptr,
    k_scale_ptr, v_scale_ptr,
    S, B, HQ, HK, P,
    L,                                  # the cache's length (positions per sequence)
    stride_q_t, stride_k_t, stride_v_t,
    stride_kc_b, stride_kc_s, stride_kc_h,   # k_cache [B, L, HK, D] (features: stride 1)
    stride_vc_b, stride_vc_s, stride_vc_h,   # v_cache [B, L, HK, DV]
    R: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
    ENTRIES: tl.constexpr,              # batch entries a program takes (0: from the grid)
):
    # A contiguous cache: sequence b's position p is row b, slot p.
    _rope_kv_cache_body(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr,
                        sin_ptr, seqlens_ptr, None, k_scale_ptr, v_scale_ptr,
                        S, B, HQ, HK, P, L, 0, 0, stride_q_t, stride_k_t, stride_v_t,
                        stride_kc_b, stride_kc_s, stride_kc_h,
                        stride_vc_b, stride_vc_s, stride_vc_h,
                        R, D, DV, BLOCK_S, BLOCK_H, INTERLEAVED, ENTRIES)


@triton.jit
def _rope_kv_paged_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, seqlens_ptr,
    block_table_ptr,                    # [B, MAX_BLOCKS] ints, contiguous
    k_scale_ptr, v_scale_ptr,
    S, B, HQ, HK, P,
    BS, N_BLOCKS, MAX_BLOCKS,           # block size, blocks in the pool, block-table columns
    stride_q_t, stride_k_t, stride_v_t,
    stride_c_b, stride_c_s, stride_c_h,  # both caches' (block, slot, head) strides in units of
                                        # their head dim: k_cache's are D x these, v_cache's DV x
    R: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
    ENTRIES: tl.constexpr,
):
    # A paged cache [NB, BS, HK, D]: sequence b's position p is block block_table[b, p // BS],
    # slot p % BS. The two caches are laid out alike (views of one pool, or two pools of one
    # layout), so one set of strides serves both (in int64: a pool may pass 2^31 elements).
    unit = tl.full([], 1, tl.int64)
    _rope_kv_cache_body(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr,
                        sin_ptr, seqlens_ptr, block_table_ptr, k_scale_ptr, v_scale_ptr,
                        S, B, HQ, HK, P, BS, N_BLOCKS, MAX_BLOCKS,
                        stride_q_t, stride_k_t, stride_v_t,
                        unit * stride_c_b * D, unit * stride_c_s * D, unit * stride_c_h * D,
                        unit * stride_c_b * DV, unit * stride_c_s * DV, unit * stride_c_h * DV,
                        R, D, DV, BLOCK_S, BLOCK_H, INTERLEAVED, ENTRIES)


# --- host side: tiles, the plan, the launch -------------------------------------------------

_POINTERS = ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr", "k_cache_ptr", "v_cache_ptr", "cos_ptr",
             "sin_ptr", "seqlens_ptr")
_SCALES = ("k_scale_ptr", "v_scale_ptr")
CONTIGUOUS = DirectLauncher(_rope_kv_cache_kernel, _POINTERS + _SCALES)
PAGED = DirectLauncher(_rope_kv_paged_kernel, _POINTERS + ("block_table_ptr",) + _SCALES)
LAUNCHERS = (CONTIGUOUS, PAGED)
ELEMENTS_PER_STEP = KV_CACHE_ELEMENTS_PER_STEP    # GPU tiles: kernels/tiles.py


def tile_warps(block_s: int, block_h: int, block_d: int) -> int:
    """Warps for a program of BLOCK_S tokens x BLOCK_H heads x block_d features (GPU tiles):
    about 512 elements a warp, 1 to 4 warps."""
    return max(1, min(4, block_s * block_h * block_d // 512))


def launch_grid(S, B, HQ: int, HK: int, block_s, block_h: int, chunk) -> tuple:
    """The launch grid (the kernel header's axes): token blocks, q's then k's head blocks,
    chunks of batch entries."""
    return (cdiv(S, block_s), cdiv(HQ, block_h) + cdiv(HK, block_h), cdiv(B, chunk))


def pick_tiles(S, B, HQ: int, HK: int, D: int, DV: int, sm_count: Optional[int]):
    """(BLOCK_S, BLOCK_H, batch entries per program, num_warps). S and B may be symbolic: only
    compared.

    GPU: one batch entry per program, a tile of about ELEMENTS_PER_STEP elements, heads first
    (at most the smaller head count, so k's blocks are not mostly masked under GQA), halved
    while the grid has fewer than 2 programs per SM (decode at small batch). Interpreter: every
    head and batch entry in one program, since each program instance costs milliseconds.
    """
    block_d = pow2_at_least(max(D, DV), 1 << 30)
    symbolic = isinstance(S, torch.SymInt) or isinstance(B, torch.SymInt)
    if sm_count is None:
        block_h = pow2_at_least(max(HQ, HK), 16)
        cap = max(1, 4096 // (block_h * block_d))
        block_s = cap if isinstance(S, torch.SymInt) else pow2_at_least(S, cap)
        # an empty batch still gets a chunk of 1 (its grid is empty), not a division by zero
        return block_s, block_h, B if isinstance(B, torch.SymInt) else max(B, 1), 4
    rows = max(1, ELEMENTS_PER_STEP // block_d)
    block_h = min(pow2_at_most(min(HQ, HK)), rows)
    cap = max(1, rows // block_h)
    block_s = cap if isinstance(S, torch.SymInt) else pow2_at_least(S, cap)
    if not symbolic:
        while block_h > 1 and cdiv(S, block_s) * (cdiv(HQ, block_h) + cdiv(HK, block_h)) \
                * B < KV_CACHE_PROGRAMS_PER_SM * sm_count:
            block_h //= 2
    chunk = 1
    while not isinstance(B, torch.SymInt) and cdiv(B, chunk) > 65535:
        chunk *= 2
    return block_s, block_h, chunk, tile_warps(block_s, block_h, block_d)


def token_stride(t: torch.Tensor) -> Optional[int]:
    """The token stride the kernels read q, k or v [B, S, H, Dh] with, or None where they could
    not read it as it is: each token's heads must be one dense [H, Dh] block (features at
    stride 1, heads at stride Dh) and the tokens evenly spaced (batch stride = S x token
    stride). A contiguous tensor, a view of one projection split along its last dim, and any
    decode step (S = 1) of such heads are. Size-1 dims may have any stride."""
    B, S, H, Dh = t.shape
    sb, ss, sh, sd = t.stride()
    if (Dh > 1 and sd != 1) or (H > 1 and sh != Dh) or (B > 1 and S > 1 and sb != S * ss):
        return None
    return ss if S > 1 else sb


def cache_feature_stride_ok(cache: torch.Tensor) -> bool:
    """Are a cache's features at stride 1 (as the kernels write them)?"""
    return cache.shape[3] <= 1 or cache.stride(3) == 1


def paged_units(k_cache: torch.Tensor, v_cache: torch.Tensor) -> Optional[tuple]:
    """(block, slot, head) strides of two paged caches [NB, BS, HK, D] and [NB, BS, HK, DV] in
    units of their head dims (k_cache's strides are D x these, v_cache's DV x), or None where
    the caches are not laid out alike. Views of one pool (D = DV) and two pools of one layout
    are; a size-1 dim's stride is taken as 0."""
    D, DV = k_cache.shape[3], v_cache.shape[3]
    units = []
    for n, sk, sv in zip(k_cache.shape[:3], k_cache.stride()[:3], v_cache.stride()[:3]):
        if n <= 1:
            units.append(0)
        elif sk % D == 0 and sv == sk // D * DV:
            units.append(sk // D)
        else:
            return None
    return tuple(units)


def plan(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table, sin, k_scale,
         v_scale, *, interleaved: bool):
    """One launch: (Launch, its pointer arguments in its kernel's order). The kernel follows
    from the cache: contiguous (block_table None) or paged. Shapes, strides and dtypes only;
    arguments are validated, and copied where the kernels could not read them as they are, by
    the caller (ropelib.kv_cache): q, k, v token-major (`token_stride`), q_out fresh and
    contiguous, the caches' features at stride 1 (paged: laid out alike, `paged_units`), the
    table dense [P, R], cache_seqlens and block_table contiguous."""
    B, S, HQ, D = q.shape
    HK, DV = k.shape[2], v.shape[3]
    R = table.shape[-1]
    strides = tuple(token_stride(t) for t in (q, k, v))
    assert None not in strides, "q, k and v must be token-major (kernels.kv_cache.token_stride)"
    assert q_out.is_contiguous(), "q_out must be a fresh contiguous tensor"
    assert cache_feature_stride_ok(k_cache) and cache_feature_stride_ok(v_cache), \
        "the caches' features must be at stride 1"
    for t in (table, sin):
        assert t is None or t.is_contiguous(), "the table must be dense [P, R]"
    for t in (cache_seqlens, block_table):
        assert t is None or t.is_contiguous(), "cache_seqlens and block_table must be contiguous"
    on_gpu = q.device.type == "cuda" and not INTERPRET
    sm = multiprocessors(q.device) if on_gpu else None
    block_s, block_h, chunk, num_warps = pick_tiles(S, B, HQ, HK, D, DV, sm)
    args = dict(S=S, B=B, HQ=HQ, HK=HK, P=table.shape[0])
    if block_table is None:
        launcher = CONTIGUOUS
        args.update(L=k_cache.shape[1])
        args.update(zip(("stride_q_t", "stride_k_t", "stride_v_t"), strides))
        args.update(zip(("stride_kc_b", "stride_kc_s", "stride_kc_h"), k_cache.stride()[:3]))
        args.update(zip(("stride_vc_b", "stride_vc_s", "stride_vc_h"), v_cache.stride()[:3]))
    else:
        units = paged_units(k_cache, v_cache)
        assert units is not None, "paged caches must be laid out alike (kv_cache.paged_units)"
        launcher = PAGED
        args.update(BS=k_cache.shape[1], N_BLOCKS=k_cache.shape[0],
                    MAX_BLOCKS=block_table.shape[1])
        args.update(zip(("stride_q_t", "stride_k_t", "stride_v_t"), strides))
        args.update(zip(("stride_c_b", "stride_c_s", "stride_c_h"), units))
    # on a GPU the chunk is fixed at compile time (one entry a program, but for huge batches), so
    # a program finds its entry without dividing by the grid (common.batch_range); the
    # interpreter's one program takes the whole batch, whatever its size
    args.update(R=R, D=D, DV=DV, BLOCK_S=block_s, BLOCK_H=block_h, INTERLEAVED=interleaved,
                ENTRIES=chunk if on_gpu and not isinstance(chunk, torch.SymInt) else 0)
    pointers = kernel_pointers(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table,
                               table, sin, k_scale, v_scale)
    return (Launch(launch_grid(S, B, HQ, HK, block_s, block_h, chunk), num_warps, args,
                   pointer_dtypes(pointers), q.device, launcher), pointers)


def kernel_pointers(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table, sin,
                    k_scale, v_scale) -> tuple:
    """The pointer arguments in the order of the kernel that `plan` picks for them: the paged
    one (a block table) or the contiguous one."""
    if block_table is None:
        return (q, k, v, q_out, k_cache, v_cache, table, sin, cache_seqlens, k_scale, v_scale)
    return (q, k, v, q_out, k_cache, v_cache, table, sin, cache_seqlens, block_table, k_scale,
            v_scale)


def launch(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table, sin, k_scale,
           v_scale, *, interleaved: bool) -> None:
    """Rotate q into q_out and write the rotated k and v into the caches: one launch.

    q, k, v: [B, S, H, D] token-major views (bshd); q_out fresh [B, S, HQ, D]; caches
    [B, L, HK, D] (block_table None) or [NB, BS, HK, D] with block_table [B, MAX_BLOCKS];
    cache_seqlens [B]; table angles (sin None) or cos [P, R], dense; k_scale, v_scale fp32 [1]
    or None. (`plan` says what the kernels read as it is.)"""
    B, S = q.shape[0], q.shape[1]
    if S == 0 or B == 0:
        return
    lnch, pointers = plan(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table,
                          sin, k_scale, v_scale, interleaved=interleaved)
    start(lnch.launcher, lnch, pointers)
