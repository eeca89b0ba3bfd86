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

How it is parallelised
----------------------
q, k and v are strided [B, S, H, D] views (bshd; nothing is copied). The grid is

    axis 0: blocks of BLOCK_S new tokens                  cdiv(S, BLOCK_S)
    axis 1: blocks of BLOCK_H heads of q, then of k       cdiv(HQ, BLOCK_H) + cdiv(HK, BLOCK_H)
    axis 2: chunks of batch entries                       cdiv(B, chunk); a program takes
                                                          cdiv(B, programs on this axis)

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
from .common import ROUND_BF16_RTNE, batch_range, load_table, pair_features, rotate_pair, round_to
from .direct import DirectLauncher
from .launch import Launch, cdiv, pow2_at_least, pow2_at_most, start
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
def _rope_kv_cache_kernel(
    # tensors (pointers first, in POINTERS order)
    q_ptr, k_ptr, v_ptr,                # new tokens [B, S, HQ, D], [B, S, HK, D], [B, S, HK, DV]
    q_out_ptr,                          # rotated q [B, S, HQ, D]
    k_cache_ptr, v_cache_ptr,           # contiguous [B, L, HK, D] or paged [NB, BS, HK, D] (v: DV)
    cos_ptr, sin_ptr,                   # table [P, R]: angles (sin None) or cos and sin
    seqlens_ptr,                        # [B] ints: the position of each sequence's first new token
    block_table_ptr,                    # [B, MAX_BLOCKS] ints (None: contiguous cache)
    k_scale_ptr, v_scale_ptr,           # fp32 [1] scales of float8 caches (None: no scaling)
    # sizes
    S, B, HQ, HK, P,                    # new tokens, batch, heads of q and of k/v, table rows
    CACHE_LEN,                          # contiguous: the cache's length L; paged: block size BS
    N_BLOCKS, MAX_BLOCKS,               # paged: blocks in the pool, block-table columns
    # strides, in elements
    stride_q_b, stride_q_s, stride_q_h, stride_q_d,
    stride_k_b, stride_k_s, stride_k_h, stride_k_d,
    stride_v_b, stride_v_s, stride_v_h, stride_v_d,
    stride_qo_b, stride_qo_s, stride_qo_h, stride_qo_d,
    stride_kc_b, stride_kc_s, stride_kc_h, stride_kc_d,   # _b: batch entry or block
    stride_vc_b, stride_vc_s, stride_vc_h, stride_vc_d,
    stride_tab_p, stride_tab_d,
    stride_sl,                          # cache_seqlens
    stride_bt_b, stride_bt_n,           # block table
    # what is computed
    R: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,   # rotary dim, head dims of k and v
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,           # next_pow2(D - R); 0 when every feature rotates
    BLOCK_DV: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    HALF: tl.constexpr = R // 2
    PAGED: tl.constexpr = block_table_ptr is not None
    K_SCALED: tl.constexpr = k_scale_ptr is not None
    V_SCALED: tl.constexpr = v_scale_ptr is not None
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    b_lo, b_hi = batch_range(B)
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

    b_lo64 = b_lo.to(tl.int64)
    for b in range(b_lo, b_hi):
        bb = b_lo64 + (b - b_lo)        # int64 offsets: caches may exceed 2^31 elements
        p = tl.load(seqlens_ptr + bb * stride_sl).to(tl.int64) + s64     # [BLOCK_S] positions
        tab_ok = (p >= 0) & (p < P)
        rows = tl.minimum(tl.maximum(p, 0), P - 1)
        c_a, s_a, c_b, s_b = load_table(cos_ptr, sin_ptr, rows, 0, 0, stride_tab_p,
                                        stride_tab_d, d_a, d_b, tab_mask, tl.float32)
        c_row, c_slot, slot_ok = _slots(p, bb, s_ok, block_table_ptr, stride_bt_b, stride_bt_n,
                                        CACHE_LEN, N_BLOCKS, MAX_BLOCKS, PAGED)
        if is_q:
            xr = q_ptr + (bb * stride_q_b + s64[:, None] * stride_q_s
                          + h64[None, :] * stride_q_h)[:, :, None]        # [BLOCK_S, BLOCK_H, 1]
            yr = q_out_ptr + (bb * stride_qo_b + s64[:, None] * stride_qo_s
                              + h64[None, :] * stride_qo_h)[:, :, None]
            x_a = tl.load(xr + d_a[None, None, :] * stride_q_d, mask=m, other=0.0).to(tl.float32)
            x_b = tl.load(xr + d_b[None, None, :] * stride_q_d, mask=m, other=0.0).to(tl.float32)
            # a token without a table row or a cache slot: NaN, never a silent wrong answer
            bad = ~(tab_ok & slot_ok)[:, None, None]
            # (the finished kernel's rotation: the same bits as apply_rope, then the write)
            y_a, y_b = rotate_pair(x_a, x_b, c_a, s_a, c_b, s_b)
            y_a = tl.where(bad, float("nan"), y_a)
            y_b = tl.where(bad, float("nan"), y_b)
            tl.store(yr + d_a[None, None, :] * stride_qo_d,
                     round_to(y_a, q_out_ptr.dtype.element_ty, ROUND_BF16_RTNE), mask=m)
            tl.store(yr + d_b[None, None, :] * stride_qo_d,
                     round_to(y_b, q_out_ptr.dtype.element_ty, ROUND_BF16_RTNE), mask=m)
            if BLOCK_PASS > 0:     # features R..D-1 pass through
                e = R + tl.arange(0, BLOCK_PASS)
                mp = row_ok[:, :, None] & (e < D)[None, None, :]
                t = tl.load(xr + e[None, None, :] * stride_q_d, mask=mp, other=0.0).to(tl.float32)
                tl.store(yr + e[None, None, :] * stride_qo_d,
                         round_to(tl.where(bad, float("nan"), t), q_out_ptr.dtype.element_ty,
                                  ROUND_BF16_RTNE), mask=mp)
        else:
            w_ok = row_ok & slot_ok[:, None]                 # [BLOCK_S, BLOCK_H]: slots to write
            wm = w_ok[:, :, None] & (j < HALF)[None, None, :]
            xr = k_ptr + (bb * stride_k_b + s64[:, None] * stride_k_s
                          + h64[None, :] * stride_k_h)[:, :, None]
            kr = k_cache_ptr + (c_row[:, None] * stride_kc_b + c_slot[:, None] * stride_kc_s
                                + h64[None, :] * stride_kc_h)[:, :, None]
            x_a = tl.load(xr + d_a[None, None, :] * stride_k_d, mask=m, other=0.0).to(tl.float32)
            x_b = tl.load(xr + d_b[None, None, :] * stride_k_d, mask=m, other=0.0).to(tl.float32)
            bad = ~tab_ok[:, None, None]
            y_a, y_b = rotate_pair(x_a, x_b, c_a, s_a, c_b, s_b)
            y_a = tl.where(bad, float("nan"), y_a)
            y_b = tl.where(bad, float("nan"), y_b)
            kdt = k_cache_ptr.dtype.element_ty
            tl.store(kr + d_a[None, None, :] * stride_kc_d,
                     _to_cache(y_a, k_scale, kdt, K_SCALED), mask=wm)
            tl.store(kr + d_b[None, None, :] * stride_kc_d,
                     _to_cache(y_b, k_scale, kdt, K_SCALED), mask=wm)
            if BLOCK_PASS > 0:
                e = R + tl.arange(0, BLOCK_PASS)
                mp = row_ok[:, :, None] & (e < D)[None, None, :]
                t = tl.load(xr + e[None, None, :] * stride_k_d, mask=mp, other=0.0).to(tl.float32)
                t = tl.where(bad, float("nan"), t)
                tl.store(kr + e[None, None, :] * stride_kc_d,
                         _to_cache(t, k_scale, kdt, K_SCALED),
                         mask=mp & w_ok[:, :, None])
            # v: copied (scaled and rounded for its cache) into the same slots
            f = tl.arange(0, BLOCK_DV)
            mv = row_ok[:, :, None] & (f < DV)[None, None, :]
            vr = v_ptr + (bb * stride_v_b + s64[:, None] * stride_v_s
                          + h64[None, :] * stride_v_h)[:, :, None]
            vcr = v_cache_ptr + (c_row[:, None] * stride_vc_b + c_slot[:, None] * stride_vc_s
                                 + h64[None, :] * stride_vc_h)[:, :, None]
            val = tl.load(vr + f[None, None, :] * stride_v_d, mask=mv, other=0.0).to(tl.float32)
            tl.store(vcr + f[None, None, :] * stride_vc_d,
                     _to_cache(val, v_scale, v_cache_ptr.dtype.element_ty, V_SCALED),
                     mask=mv & w_ok[:, :, None])


# --- host side: tiles, the plan, the launch -------------------------------------------------

POINTERS = ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr", "k_cache_ptr", "v_cache_ptr", "cos_ptr",
            "sin_ptr", "seqlens_ptr", "block_table_ptr", "k_scale_ptr", "v_scale_ptr")
ELEMENTS_PER_STEP = KV_CACHE_ELEMENTS_PER_STEP    # GPU tiles: kernels/tiles.py


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
    num_warps = max(1, min(4, block_s * block_h * block_d // 512))
    return block_s, block_h, chunk, num_warps


def _strides4(t: torch.Tensor) -> tuple:
    return tuple(t.stride())


def plan(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table, sin, k_scale,
         v_scale, *, interleaved: bool):
    """One launch: (Launch, its pointer arguments in POINTERS order). Shapes, strides and
    dtypes only; arguments are validated by the caller (ropelib.kv_cache)."""
    B, S, HQ, D = q.shape
    HK, DV = k.shape[2], v.shape[3]
    R = table.shape[-1]
    on_gpu = q.device.type == "cuda" and not INTERPRET
    sm = multiprocessors(q.device) if on_gpu else None
    block_s, block_h, chunk, num_warps = pick_tiles(S, B, HQ, HK, D, DV, sm)
    grid = (cdiv(S, block_s), cdiv(HQ, block_h) + cdiv(HK, block_h), cdiv(B, chunk))
    paged = block_table is not None
    args = dict(
        S=S, B=B, HQ=HQ, HK=HK, P=table.shape[0],
        CACHE_LEN=k_cache.shape[1], N_BLOCKS=k_cache.shape[0] if paged else 0,
        MAX_BLOCKS=block_table.shape[1] if paged else 0,
        **dict(zip(("stride_q_b", "stride_q_s", "stride_q_h", "stride_q_d"), _strides4(q))),
        **dict(zip(("stride_k_b", "stride_k_s", "stride_k_h", "stride_k_d"), _strides4(k))),
        **dict(zip(("stride_v_b", "stride_v_s", "stride_v_h", "stride_v_d"), _strides4(v))),
        **dict(zip(("stride_qo_b", "stride_qo_s", "stride_qo_h", "stride_qo_d"),
                   _strides4(q_out))),
        **dict(zip(("stride_kc_b", "stride_kc_s", "stride_kc_h", "stride_kc_d"),
                   _strides4(k_cache))),
        **dict(zip(("stride_vc_b", "stride_vc_s", "stride_vc_h", "stride_vc_d"),
                   _strides4(v_cache))),
        stride_tab_p=table.stride(0), stride_tab_d=table.stride(1),
        stride_sl=cache_seqlens.stride(0),
        stride_bt_b=block_table.stride(0) if paged else 0,
        stride_bt_n=block_table.stride(1) if paged else 0,
        R=R, D=D, DV=DV, BLOCK_S=block_s, BLOCK_H=block_h,
        BLOCK_HALF=pow2_at_least(R // 2, 1 << 30),
        BLOCK_PASS=pow2_at_least(D - R, 1 << 30) if D > R else 0,
        BLOCK_DV=pow2_at_least(DV, 1 << 30),
        INTERLEAVED=interleaved,
    )
    pointers = (q, k, v, q_out, k_cache, v_cache, table, sin, cache_seqlens, block_table,
                k_scale, v_scale)
    dtypes = tuple(t.dtype if t is not None else None for t in pointers)
    return Launch(grid, num_warps, args, dtypes, q.device), pointers


DIRECT = DirectLauncher(_rope_kv_cache_kernel, POINTERS)


def launch(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table, sin, k_scale,
           v_scale, *, interleaved: bool) -> None:
    """Rotate q into q_out and write the rotated k and v into the caches: one launch.

    q, k, v, q_out: [B, S, H, D] views (bshd); caches [B, L, HK, D] (block_table None) or
    [NB, BS, HK, D] with block_table [B, MAX_BLOCKS]; cache_seqlens [B]; table angles (sin
    None) or cos [P, R]; k_scale, v_scale fp32 [1] or None."""
    B, S = q.shape[0], q.shape[1]
    if S == 0 or B == 0:
        return
    lnch, pointers = plan(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table,
                          sin, k_scale, v_scale, interleaved=interleaved)
    start(DIRECT, lnch, pointers)
