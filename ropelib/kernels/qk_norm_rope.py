"""Per-head QK-RMSNorm fused with RoPE: one kernel body, forward and backward (a constexpr switch),
started through two entry points of 30 and 35 arguments (20 and 23 of them passed at a launch,
the rest compile-time constants).

Qwen3 and Gemma 3 normalise every head vector of q and of k over the head dim before rotating it:

    r = 1 / sqrt(mean_d(x_d^2) + eps)       one number per (token, head) row, in fp32
    n = x r,   s = w + offset,   u = n s     w [D] learned (w_q, w_k); offset 1 for Gemma
    y = rot(theta) u                        RoPE on the first R features, u[R:] passed through

and the backward, with gy the gradient of y (rot(-theta) is the transpose of the rotation):

    gu = rot(-theta) gy
    gw = sum over rows of gu n              (q's rows for w_q, k's rows for w_k)
    gn = gu s
    gx = r (gn - n mean_d(gn n))

How it is parallelised
----------------------
q and k are seen as strided [S, B, H, D] views (conventions.view4), read where they are; the
outputs are fresh, with q's and k's strides where both are dense, else contiguous in the call's
layout (`outputs`). The backward may instead store the input gradients into column slices of
one token-major buffer (GX_ROW, a constexpr: their token row stride), as the QKV projection's
backward writes them into its gradient dY; it reads the output gradients as before. A program
takes a block of BLOCK_S tokens, a block of BLOCK_H heads (of q,
then of k: HEAD_BLOCKS = (HQ + HK) / BLOCK_H blocks, BLOCK_H divides both) and a chunk of batch
entries. The grid is

    axis 0: token groups x head blocks       cdiv(S, BLOCK_S * TOKEN_BLOCKS) * HEAD_BLOCKS,
                                             heads fastest: program
                                             token group * HEAD_BLOCKS + head block
    axis 1: 1
    axis 2: chunks of batch entries          cdiv(B, chunk); a program takes
                                             cdiv(B, programs on this axis)

Head blocks fastest, programs started one after the other read one token's heads side by side
(in bshd, whole contiguous rows) rather than one head block of consecutive tokens, rows apart:
forward 0.929 -> 0.946 of a copy in one H200 A/B at b8 s4096 with 32/8 heads, forward+backward
0.710 -> 0.716 in another (benchmarks/NOTES.md).

A program finds its tokens' positions (the tokens themselves, position ids, or, for packed
sequences, each token's index in its sequence, searched in cu_seqlens), loads their cos/sin once
([BLOCK_S, 1, HALF]) and loops over its batch entries; per entry it loads a
[BLOCK_S, BLOCK_H, D] tile (two rotary halves and the pass-through part), reduces each row's
sum of squares in fp32, scales, rotates and stores; the forward loads the next entry's tile
before it works on this one, so that a tile's loads are in flight while it computes. A whole
row sits in one program, so the norm needs no second pass and no atomics. In the backward each
program also sums gu n over every row it handled and writes that [D] partial sum to its own row
of a [programs, D] fp32 buffer; the host sums the buffer (q's programs for w_q, k's for w_k).
The reduction order is fixed by the grid, so gw is deterministic. So that few rows do not leave
many partials, a backward program of few rows a token block (batch 1, packed sequences) takes
TOKEN_BLOCKS token blocks in turn (a token group; the forward takes one): on an H200, 8 rows a
partial left 0.49 of two copies at b1 s32768 and 16 blocks a program 0.65 (pick_token_blocks).

Math is fp32 (fp64 for fp64 inputs) with one rounding at the store. Tables follow ropelib's
convention (one angle or cos/sin value per feature; see kernels/fused.py), or are Angles' turns,
every angle computed from its position as the finished kernel computes it (fused.table_cos_sin
reads either), so the transpose swaps which member's sine is used:

    forward   y_a = u_a c_a - u_b s_a       y_b = u_b c_b + u_a s_b
    backward  gu_a = gy_a c_a + gy_b s_b    gu_b = gy_b c_b - gy_a s_a
"""
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..conventions import view4
from ..frequencies import EXACT_POSITIONS
from ..runtime import INTERPRET
from .common import (ROUND_BF16_RTNE, batch_range, contiguous_strides, head_tile,
                     offset_int, pair_features, rotate_pair, round_to, store_pair, tile_width)
from .direct import DirectLauncher
from .fused import SEARCH_PIVOTS, SEARCH_TILE, packed_positions, table_cos_sin
from .planning import (OUT_AS_INPUT, OUT_LAYOUT, Launch, cdiv, needs_int64, pow2_at_least,
                       pow2_at_most, start)
from .tiles import (QK_NORM_ELEMENTS_PER_THREAD, QK_NORM_GROUP_BELOW_ROWS,
                    QK_NORM_PROGRAMS_PER_SM, QK_NORM_ROWS_PER_PARTIAL, QK_NORM_ROWS_PER_STEP,
                    multiprocessors)


# OUT_LAYOUT's value for outputs laid out as the inputs (the layouts are planning.OUT_LAYOUT's),
# as the kernels compare it
_OUT_AS_INPUT = tl.constexpr(OUT_AS_INPUT)

# POSITIONS: what pos_ptr holds, and so where a token's position comes from
SHARED_IDS = tl.constexpr(0)     # nothing (token s is at position s) or position ids [1, S],
                                 # one row for every batch entry
IDS_PER_ENTRY = tl.constexpr(1)  # position ids [B, S]
CU_SEQLENS = tl.constexpr(2)     # cu_seqlens [N_SEQ + 1] of packed sequences (thd, B = 1): a
                                 # token's position is its index in its sequence


@triton.jit
def _rows_of_table(s_idx, b, S, P, pos_ptr, N_SEQ, POSITIONS: tl.constexpr):
    # s_idx [BLOCK_S] token indices, b batch entry -> (table rows [BLOCK_S] int32, valid [BLOCK_S])
    if POSITIONS == CU_SEQLENS:     # (fused.packed_positions: a pivot load, a binary search)
        if s_idx.shape[0] * SEARCH_PIVOTS <= SEARCH_TILE:
            p, valid = packed_positions(s_idx, pos_ptr, None, N_SEQ, 1, 0, SEARCH_PIVOTS)
        else:                   # (the interpreter's long token tiles) the binary search alone
            p, valid = packed_positions(s_idx, pos_ptr, None, N_SEQ, 1, 0, 1)
        valid = valid & (p < P)
    elif pos_ptr is not None:   # position ids [B or 1, S], contiguous
        if POSITIONS == IDS_PER_ENTRY:
            ids = pos_ptr + b * S
        else:
            ids = pos_ptr
        p = tl.load(ids + s_idx, mask=s_idx < S, other=0)
        valid = (p >= 0) & (p < P)       # compared before narrowing, so huge ids cannot wrap
        p = p.to(tl.int32)
    else:
        p = s_idx
        valid = p < P
    # masked tokens (s >= S) count as valid: they must not turn a partial sum into NaN
    return tl.minimum(tl.maximum(p, 0), P - 1), valid | (s_idx >= S)


@triton.jit
def _load_x(x_ptr, x_rows, b, b_hi, stride_x_b, d_a, d_b, e, m, mp, BLOCK_S: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr, INT64: tl.constexpr):
    """Batch entry b's tile of x, in x's dtype: the pairs' members x_a, x_b [BLOCK_S, BLOCK_H,
    BLOCK_HALF] and the features past R (x_a again where the whole head rotates). Nothing is
    read where b >= b_hi (the prefetch past a program's last entry)."""
    live = (tl.zeros([BLOCK_S, BLOCK_H, 1], tl.int32) + b) < b_hi  # (a tensor: the interpreter
    xr = x_ptr + (x_rows + offset_int(b, INT64) * stride_x_b)[:, :, None]  # masks with tensors)
    x_a = tl.load(xr + d_a[None, None, :], mask=m & live, other=0.0)
    x_b = tl.load(xr + d_b[None, None, :], mask=m & live, other=0.0)
    x_p = x_a
    if BLOCK_PASS > 0:
        x_p = tl.load(xr + e[None, None, :], mask=mp & live, other=0.0)
    return x_a, x_b, x_p


@triton.jit
def _norm_rope_heads(
    x_ptr,                              # this segment's input (q or k), features at stride 1
    gy_ptr,                             # backward: the gradient of its output (None forward)
    out_ptr,                            # forward: y; backward: gx
    w_ptr,                              # its weight [D], contiguous
    cos_ptr, sin_ptr, pos_ptr,          # table (angles, or cos and sin); positions (POSITIONS)
    part_ptr,                           # backward: this program's [D] row of partial sums of gu n
    pid_t, h0, b_lo, b_hi,              # tile origin: token group, first head, batch range
    S, B, H, P,                         # tokens, batch, heads of this segment, table rows
    N_SEQ,                              # CU_SEQLENS: the packed sequences
    eps, weight_offset,
    stride_x_s, stride_x_b,             # (heads at stride D, features at stride 1)
    R: tl.constexpr, D: tl.constexpr,   # rotary dim (even, <= D), head dim
    OUT_LAYOUT: tl.constexpr,           # y and gx (and gy): contiguous in this layout, or
                                        # OUT_AS_INPUT: laid out as x, with x's strides
    GX_ROW: tl.constexpr,               # backward: 0, or gx's token row stride (a column
                                        # slice of a token-major buffer; gy as OUT_LAYOUT)
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    TABLE_PER_ENTRY: tl.constexpr,
    POSITIONS: tl.constexpr,            # SHARED_IDS, IDS_PER_ENTRY or CU_SEQLENS
    INT64: tl.constexpr,                # offsets in int64 (a tensor passes 2^31 elements)
    TOKEN_BLOCKS: tl.constexpr,         # token blocks of BLOCK_S a program takes, one after the
                                        # other (token group pid_t: blocks pid_t * TOKEN_BLOCKS
                                        # on); > 1 only in the backward, see pick_token_blocks
):
    HALF: tl.constexpr = R // 2
    BLOCK_HALF: tl.constexpr = tile_width(HALF)      # tiles of pairs, and of features R..D-1
    BLOCK_PASS: tl.constexpr = tile_width(D - R)     # (0 when the whole head rotates)
    # math in fp64 for fp64 inputs, else fp32
    CDT: tl.constexpr = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32
    # Fix the float arguments to the compute dtype, so every value (and the loop-carried sums)
    # keeps one type. They arrive as fp64 (the kernel's annotation) or, in the interpreter, as
    # Python floats: tl.full keeps every bit of either, where tl.cast would first round a Python
    # float to fp32 (fp64 inputs would get an fp32 eps).
    eps = tl.full((), eps, CDT)
    weight_offset = tl.full((), weight_offset, CDT)
    j = tl.arange(0, BLOCK_HALF)                              # [BLOCK_HALF] pairs
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    # the scale s = w + offset, broadcast over rows: [1, 1, BLOCK_HALF] (and [1, 1, BLOCK_PASS])
    sw_a = (tl.load(w_ptr + d_a, mask=j < HALF, other=0.0).to(CDT) + weight_offset)[None, None, :]
    sw_b = (tl.load(w_ptr + d_b, mask=j < HALF, other=0.0).to(CDT) + weight_offset)[None, None, :]
    if BLOCK_PASS > 0:
        e = R + tl.arange(0, BLOCK_PASS)
        sw_p = (tl.load(w_ptr + e, mask=e < D, other=0.0).to(CDT) + weight_offset)[None, None, :]
        acc_p = tl.zeros((BLOCK_PASS,), dtype=CDT)
    else:       # (placeholders, never read: the whole head rotates)
        e = d_a
        sw_p = sw_a
        acc_p = tl.zeros((BLOCK_HALF,), dtype=CDT)
    # backward: sums of gu n over the rows the program handles, per feature
    acc_a = tl.zeros((BLOCK_HALF,), dtype=CDT)
    acc_b = tl.zeros((BLOCK_HALF,), dtype=CDT)
    # One token block compiles without a loop around it, so the forward and a batch's backward
    # keep the code they were measured with; the loop is there only where it was measured to
    # pay (tiles.QK_NORM_GROUP_BELOW_ROWS: with it, 197 registers a thread against 168).
    if TOKEN_BLOCKS == 1:
        acc_a, acc_b, acc_p = _norm_rope_block(
            x_ptr, gy_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, pid_t, h0, b_lo, b_hi, S, B, H, P,
            N_SEQ, eps, stride_x_s, stride_x_b, sw_a, sw_b, sw_p, e, acc_a, acc_b, acc_p, R, D,
            OUT_LAYOUT, GX_ROW, BLOCK_S, BLOCK_H, INTERLEAVED, BACKWARD, TABLE_PER_ENTRY,
            POSITIONS, INT64)
    else:
        for t in range(TOKEN_BLOCKS):
            acc_a, acc_b, acc_p = _norm_rope_block(
                x_ptr, gy_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, pid_t * TOKEN_BLOCKS + t, h0,
                b_lo, b_hi, S, B, H, P, N_SEQ, eps, stride_x_s, stride_x_b, sw_a, sw_b, sw_p, e,
                acc_a, acc_b, acc_p, R, D, OUT_LAYOUT, GX_ROW, BLOCK_S, BLOCK_H, INTERLEAVED,
                BACKWARD, TABLE_PER_ENTRY, POSITIONS, INT64)
    if BACKWARD:
        tl.store(part_ptr + d_a, acc_a, mask=j < HALF)
        tl.store(part_ptr + d_b, acc_b, mask=j < HALF)
        if BLOCK_PASS > 0:
            tl.store(part_ptr + e, acc_p, mask=e < D)


@triton.jit
def _norm_rope_block(
    x_ptr, gy_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr,
    pid_s, h0, b_lo, b_hi,              # token block, first head, batch range
    S, B, H, P, N_SEQ, eps, stride_x_s, stride_x_b,
    sw_a, sw_b, sw_p, e,                # the scale [1, 1, pairs] (and [1, 1, BLOCK_PASS]); e:
                                        # the features past R
    acc_a, acc_b, acc_p,                # backward: the running sums of gu n (returned updated)
    R: tl.constexpr, D: tl.constexpr, OUT_LAYOUT: tl.constexpr, GX_ROW: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    TABLE_PER_ENTRY: tl.constexpr, POSITIONS: tl.constexpr, INT64: tl.constexpr,
):
    # One token block of _norm_rope_heads: its tokens' table rows, then every batch entry.
    HALF: tl.constexpr = R // 2
    BLOCK_HALF: tl.constexpr = tile_width(HALF)
    BLOCK_PASS: tl.constexpr = tile_width(D - R)
    CDT: tl.constexpr = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32
    # rows differ between entries
    PER_ENTRY: tl.constexpr = TABLE_PER_ENTRY or POSITIONS == IDS_PER_ENTRY
    # Offsets in int32 unless INT64: with int64 row offsets sm_90's compiler issues a
    # program's four 16-byte loads of x two by two instead of together (5-7 % slower on an
    # H200, benchmarks/NOTES.md).
    s_idx, s_off, h_idx, d_a, d_b, row_ok, m, tab_mask = head_tile(
        pid_s, h0, S, H, BLOCK_S, BLOCK_H, BLOCK_HALF, HALF, INTERLEAVED, INT64)
    h_off = offset_int(h_idx, INT64)
    # (strides that are arguments, not computed: computed ones cost the backward 190 registers
    # a thread instead of 168 for sm_90, the forward a later issue of its loads)
    if OUT_LAYOUT == _OUT_AS_INPUT:
        st_y_s, st_y_b, st_y_h = stride_x_s, stride_x_b, D
    else:
        st_y_s, st_y_b, st_y_h = contiguous_strides(S, B, H, D, OUT_LAYOUT, INT64)
    x_rows = s_off[:, None] * stride_x_s + h_off[None, :] * D           # [BLOCK_S, BLOCK_H]
    y_rows = s_off[:, None] * st_y_s + h_off[None, :] * st_y_h          # (gy and gx alike)
    if GX_ROW > 0:      # gx's token rows GX_ROW apart (gy's as OUT_LAYOUT's)
        tl.static_assert(BACKWARD and OUT_LAYOUT != _OUT_AS_INPUT)
        st_g_s, st_g_b, _ = contiguous_strides(S, B, H, D, OUT_LAYOUT, INT64, GX_ROW)
        g_rows = s_off[:, None] * st_g_s + h_off[None, :] * D
    # the table's rows are dense: [P, R], or [B, P, R] with one table per batch entry
    stride_tab_b = (tl.full([], 0, tl.int64) + P) * R if TABLE_PER_ENTRY else 0
    if BLOCK_PASS > 0:
        mp = row_ok[:, :, None] & (e < D)[None, None, :]
    else:       # (placeholder, never read)
        mp = m

    # The forward loads entry b + 1's x before it works on entry b (its first entry's before the
    # table), so a program always has a tile's loads in flight while it reduces, rotates and
    # stores: 0.946 -> 0.966-0.970 of a copy in one H200 A/B, with the program order below
    # (benchmarks/NOTES.md). Held in x's dtype until used: 123 registers a thread instead of 96.
    # (The backward, at 168 registers, keeps one entry at a time.)
    PREFETCH: tl.constexpr = not BACKWARD
    if PREFETCH:
        xn_a, xn_b, xn_p = _load_x(x_ptr, x_rows, b_lo, b_hi, stride_x_b, d_a, d_b, e, m, mp,
                                   BLOCK_S, BLOCK_H, BLOCK_PASS, INT64)

    # (fused.table_cos_sin: an angle or cos/sin table, or Angles' turns with the positions as
    # rows; a row outside the table gets NaN cosines, see common.nan_unless)
    if not PER_ENTRY:
        rows, valid = _rows_of_table(s_idx, 0, S, P, pos_ptr, N_SEQ, POSITIONS)
        c_a, s_a, c_b, s_b = table_cos_sin(cos_ptr, sin_ptr, rows, valid, 0, stride_tab_b, R,
                                           d_a, d_b, tab_mask, CDT, HALF, True)

    for b in range(b_lo, b_hi):
        bb = offset_int(b, INT64)
        if PER_ENTRY:
            rows, valid = _rows_of_table(s_idx, bb, S, P, pos_ptr, N_SEQ, POSITIONS)
            c_a, s_a, c_b, s_b = table_cos_sin(cos_ptr, sin_ptr, rows, valid, bb, stride_tab_b,
                                               R, d_a, d_b, tab_mask, CDT, HALF, True)
        yr = (y_rows + bb * st_y_b)[:, :, None]               # [BLOCK_S, BLOCK_H, 1]
        if GX_ROW > 0:
            orow = out_ptr + (g_rows + bb * st_g_b)[:, :, None]
        else:
            orow = out_ptr + yr
        if PREFETCH:
            x_a = xn_a.to(CDT)
            x_b = xn_b.to(CDT)
            if BLOCK_PASS > 0:
                x_p = xn_p.to(CDT)
            xn_a, xn_b, xn_p = _load_x(x_ptr, x_rows, b + 1, b_hi, stride_x_b, d_a, d_b, e, m,
                                       mp, BLOCK_S, BLOCK_H, BLOCK_PASS, INT64)
        else:
            x_a, x_b, x_p = _load_x(x_ptr, x_rows, b, b_hi, stride_x_b, d_a, d_b, e, m, mp,
                                    BLOCK_S, BLOCK_H, BLOCK_PASS, INT64)
            x_a = x_a.to(CDT)
            x_b = x_b.to(CDT)
            if BLOCK_PASS > 0:
                x_p = x_p.to(CDT)
        ss = tl.sum(x_a * x_a, axis=2) + tl.sum(x_b * x_b, axis=2)          # [BLOCK_S, BLOCK_H]
        if BLOCK_PASS > 0:
            ss += tl.sum(x_p * x_p, axis=2)
        if CDT == tl.float64:
            r = 1.0 / tl.sqrt(ss / D + eps)     # (rsqrt is fp32 only)
        else:
            r = tl.rsqrt(ss / D + eps)
        r = r[:, :, None]
        n_a = x_a * r
        n_b = x_b * r
        if not BACKWARD:
            u_a = n_a * sw_a
            u_b = n_b * sw_b
            y_a, y_b = rotate_pair(u_a, u_b, c_a, s_a, c_b, s_b)
            store_pair(orow, d_a, d_b, y_a, y_b, None, m)
            if BLOCK_PASS > 0:
                tl.store(orow + e[None, None, :],
                         round_to(x_p * r * sw_p, out_ptr.dtype.element_ty, ROUND_BF16_RTNE),
                         mask=mp)
        else:
            gr = gy_ptr + yr
            gy_a = tl.load(gr + d_a[None, None, :], mask=m, other=0.0).to(CDT)
            gy_b = tl.load(gr + d_b[None, None, :], mask=m, other=0.0).to(CDT)
            # gu = R(-theta) gy
            gu_a, gu_b = rotate_pair(gy_a, gy_b, c_a, -s_b, c_b, -s_a)    # (NaN: see c_a)
            acc_a += tl.sum(tl.sum(gu_a * n_a, axis=0), axis=0)
            acc_b += tl.sum(tl.sum(gu_b * n_b, axis=0), axis=0)
            gn_a = gu_a * sw_a
            gn_b = gu_b * sw_b
            dot = tl.sum(gn_a * n_a, axis=2) + tl.sum(gn_b * n_b, axis=2)   # [BLOCK_S, BLOCK_H]
            if BLOCK_PASS > 0:
                gu_p = tl.load(gr + e[None, None, :], mask=mp, other=0.0).to(CDT)
                n_p = x_p * r
                acc_p += tl.sum(tl.sum(gu_p * n_p, axis=0), axis=0)
                gn_p = gu_p * sw_p
                dot += tl.sum(gn_p * n_p, axis=2)
            dot = (dot / D)[:, :, None]
            tl.store(orow + d_a[None, None, :],
                     round_to(r * (gn_a - n_a * dot), out_ptr.dtype.element_ty, ROUND_BF16_RTNE),
                     mask=m)
            tl.store(orow + d_b[None, None, :],
                     round_to(r * (gn_b - n_b * dot), out_ptr.dtype.element_ty, ROUND_BF16_RTNE),
                     mask=m)
            if BLOCK_PASS > 0:
                tl.store(orow + e[None, None, :],
                         round_to(r * (gn_p - n_p * dot), out_ptr.dtype.element_ty,
                                  ROUND_BF16_RTNE),
                         mask=mp)
    return acc_a, acc_b, acc_p


@triton.jit
def _norm_rope_q_and_k(
    q_ptr, k_ptr, gq_ptr, gk_ptr, q_out_ptr, k_out_ptr, w_q_ptr, w_k_ptr, cos_ptr, sin_ptr,
    pos_ptr, part_ptr, S, B, HQ, P, N_SEQ, eps, weight_offset,
    stride_q_s, stride_q_b, stride_k_s, stride_k_b,
    R: tl.constexpr, D: tl.constexpr, OUT_LAYOUT: tl.constexpr, GX_ROW: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr, TABLE_PER_ENTRY: tl.constexpr, POSITIONS: tl.constexpr,
    INT64: tl.constexpr, HEAD_BLOCKS: tl.constexpr, TOKEN_BLOCKS: tl.constexpr,
):
    # The program's tile: q's heads (head block below HQ / BLOCK_H), else k's. BLOCK_H divides
    # both head counts (pick_tiles). Grid axis 0 is token block * HEAD_BLOCKS + head block:
    # HEAD_BLOCKS is a compile-time constant, so the split is a multiply and a shift (divided
    # by the runtime grid, and HK derived from it, the backward held 186-190 registers a thread
    # instead of 168 for sm_90).
    HK = HEAD_BLOCKS * BLOCK_H - HQ
    pid_t = tl.program_id(0) // HEAD_BLOCKS       # token group: TOKEN_BLOCKS token blocks
    pid_h = tl.program_id(0) % HEAD_BLOCKS
    pid_b = tl.program_id(2)
    b_lo, b_hi = batch_range(B)
    if BACKWARD:    # this program's row of the partial sums
        part = part_ptr + ((pid_t * HEAD_BLOCKS + pid_h) * tl.num_programs(2)
                           + pid_b).to(tl.int64) * D
    else:
        part = part_ptr
    q_blocks = HQ // BLOCK_H
    if pid_h < q_blocks:
        _norm_rope_heads(q_ptr, gq_ptr, q_out_ptr, w_q_ptr, cos_ptr, sin_ptr, pos_ptr, part,
                         pid_t, pid_h * BLOCK_H, b_lo, b_hi, S, B, HQ, P, N_SEQ, eps,
                         weight_offset, stride_q_s, stride_q_b, R, D, OUT_LAYOUT, GX_ROW,
                         BLOCK_S, BLOCK_H, INTERLEAVED, BACKWARD, TABLE_PER_ENTRY, POSITIONS,
                         INT64, TOKEN_BLOCKS)
    else:
        _norm_rope_heads(k_ptr, gk_ptr, k_out_ptr, w_k_ptr, cos_ptr, sin_ptr, pos_ptr, part,
                         pid_t, (pid_h - q_blocks) * BLOCK_H, b_lo, b_hi, S, B, HK, P, N_SEQ,
                         eps, weight_offset, stride_k_s, stride_k_b, R, D, OUT_LAYOUT, GX_ROW,
                         BLOCK_S, BLOCK_H, INTERLEAVED, BACKWARD, TABLE_PER_ENTRY, POSITIONS,
                         INT64, TOKEN_BLOCKS)


# --- the entry points: forward and backward (30 and 35 arguments) ---------------------------
# Common to both: q and k as strided [S, B, H, D] views, heads at stride D and features at
# stride 1; the outputs (forward: y; backward: the input gradients, and the output gradients
# read) fresh, with q's and k's strides (OUT_LAYOUT == OUT_AS_INPUT: q and k are dense) or
# contiguous in OUT_LAYOUT; the weights contiguous; the table's rows dense ([P, R], or
# [B, P, R] with TABLE_PER_ENTRY); position ids [B or 1, S] contiguous, or cu_seqlens
# [N_SEQ + 1] contiguous (CU_SEQLENS: thd, B = 1). The host (`readable`) copies what does not
# come so.

@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr,                        # q [S, B, HQ, D], k [S, B, HK, D] (strided views)
    q_out_ptr, k_out_ptr,                # the outputs
    w_q_ptr, w_k_ptr,                    # the norms' weights [D]
    cos_ptr, sin_ptr,                    # angles (sin None) or cos and sin
    pos_ptr,                             # position ids (None: token s reads row s), or
                                         # cu_seqlens [N_SEQ + 1] (POSITIONS)
    S, B, HQ, P,                         # tokens, batch, heads of q, table rows
    N_SEQ,                               # CU_SEQLENS: the packed sequences (else 0)
    # RMSNorm epsilon; the scale is w + weight_offset. fp64, so that fp64 inputs get them
    # unrounded: a plain float argument is passed as fp32 (as it still is by Triton before 3.4,
    # which ignores a float annotation)
    eps: tl.float64, weight_offset: tl.float64,
    stride_q_s, stride_q_b, stride_k_s, stride_k_b,
    R: tl.constexpr, D: tl.constexpr, OUT_LAYOUT: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
    TABLE_PER_ENTRY: tl.constexpr, POSITIONS: tl.constexpr, INT64: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,           # (HQ + HK) / BLOCK_H, k's heads HK included
):
    _norm_rope_q_and_k(q_ptr, k_ptr, None, None, q_out_ptr, k_out_ptr, w_q_ptr, w_k_ptr,
                       cos_ptr, sin_ptr, pos_ptr, None, S, B, HQ, P, N_SEQ, eps,
                       weight_offset, stride_q_s, stride_q_b, stride_k_s, stride_k_b, R, D,
                       OUT_LAYOUT, 0, BLOCK_S, BLOCK_H, INTERLEAVED, False, TABLE_PER_ENTRY,
                       POSITIONS, INT64, HEAD_BLOCKS, 1)


@triton.jit
def _qk_norm_rope_backward_kernel(
    q_ptr, k_ptr,                        # the forward's inputs (strided views)
    grad_q_ptr, grad_k_ptr,              # the input gradients, laid out as the outputs
    w_q_ptr, w_k_ptr, cos_ptr, sin_ptr, pos_ptr,
    grad_q_out_ptr, grad_k_out_ptr,      # the output gradients, laid out as the outputs
    part_ptr,                            # [programs, D] partial sums of gu n (CDT)
    S, B, HQ, P, N_SEQ,
    eps: tl.float64, weight_offset: tl.float64,
    stride_q_s, stride_q_b, stride_k_s, stride_k_b,
    R: tl.constexpr, D: tl.constexpr, OUT_LAYOUT: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
    TABLE_PER_ENTRY: tl.constexpr, POSITIONS: tl.constexpr, INT64: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    TOKEN_BLOCKS: tl.constexpr,          # token blocks a program takes (pick_token_blocks)
    GX_ROW: tl.constexpr,                # 0: the input gradients laid out as the outputs; or
                                         # their token row stride (column slices of one
                                         # token-major buffer, the QKV projection's dY)
):
    _norm_rope_q_and_k(q_ptr, k_ptr, grad_q_out_ptr, grad_k_out_ptr, grad_q_ptr, grad_k_ptr,
                       w_q_ptr, w_k_ptr, cos_ptr, sin_ptr, pos_ptr, part_ptr, S, B, HQ, P,
                       N_SEQ, eps, weight_offset, stride_q_s, stride_q_b, stride_k_s,
                       stride_k_b, R, D, OUT_LAYOUT, GX_ROW, BLOCK_S, BLOCK_H, INTERLEAVED,
                       True, TABLE_PER_ENTRY, POSITIONS, INT64, HEAD_BLOCKS, TOKEN_BLOCKS)


# --- host side: tiles, the plan, the launch --------------------------------------------------

# GPU tiles (kernels/tiles.py says where they were measured)
ROWS_PER_STEP = QK_NORM_ROWS_PER_STEP
ELEMENTS_PER_THREAD = QK_NORM_ELEMENTS_PER_THREAD


def _tokens_per_program(S, cap: int) -> int:
    """min(cap, next power of two >= S); cap itself for a symbolic S (torch.compile with dynamic
    shapes), so that a new length is no new guard and no recompilation."""
    return cap if isinstance(S, torch.SymInt) else pow2_at_least(S, cap)


def heads_per_block(HQ: int, HK: int, cap: int) -> int:
    """BLOCK_H: the largest power of two that divides both head counts, at most cap (a power of
    two). Dividing them, it leaves no head block part-masked."""
    common = math.gcd(HQ, HK)
    return min(common & -common, cap)


def pick_tiles(S, B, HQ: int, HK: int, D: int, sm_count: Optional[int]):
    """(BLOCK_S, BLOCK_H, batch entries per program, num_warps). S and B may be symbolic: only
    compared.

    GPU: about ROWS_PER_STEP elements per batch step, heads first (BLOCK_H divides both head
    counts: heads_per_block), looping over the whole batch unless that leaves fewer than
    QK_NORM_PROGRAMS_PER_SM programs per SM (decode). Interpreter: big tiles, since each program
    instance costs milliseconds.
    """
    block_d = pow2_at_least(D, 1 << 30)
    if sm_count is None:
        block_h = heads_per_block(HQ, HK, 16)
        block_s = _tokens_per_program(S, max(1, 4096 // (block_h * block_d)))
        return block_s, block_h, max(B, 1), 4     # (B may be 0: the grid is then empty)
    rows = pow2_at_most(max(1, ROWS_PER_STEP // block_d))
    block_h = heads_per_block(HQ, HK, rows)
    block_s = _tokens_per_program(S, max(1, rows // block_h))
    fit = not isinstance(S, torch.SymInt) and not isinstance(B, torch.SymInt)
    chunk = B
    if fit:
        tiles = cdiv(S, block_s) * ((HQ + HK) // block_h)
        while chunk > 1 and tiles * cdiv(B, chunk) < QK_NORM_PROGRAMS_PER_SM * sm_count:
            chunk = cdiv(chunk, 2)
        chunk = max(chunk, 1)
    num_warps = max(1, min(4, block_s * block_h * block_d // (32 * ELEMENTS_PER_THREAD)))
    return block_s, block_h, chunk, num_warps


def pick_token_blocks(S, B, block_s: int, block_h: int, chunk, head_blocks: int,
                      sm_count: Optional[int]) -> int:
    """TOKEN_BLOCKS, the backward's token blocks per program (a power of two): each program
    writes one [D] row of partial sums of the weights' gradient, which the host then sums, so a
    program that handles few rows (one batch entry: 8 heads of one token) leaves a partial for
    every 8 rows to read back. Where a token block holds fewer than QK_NORM_GROUP_BELOW_ROWS
    rows, a program takes token blocks in turn until it handles QK_NORM_ROWS_PER_PARTIAL rows,
    while the grid keeps QK_NORM_PROGRAMS_PER_SM programs an SM; elsewhere one (the loop holds
    more registers a thread: see tiles.py). Interpreter: 2 where there are two token blocks or
    more (half the program instances, and the loop runs where the tests can see it). 1 for a
    symbolic S or B."""
    if isinstance(S, torch.SymInt) or isinstance(B, torch.SymInt):
        return 1
    token_blocks = cdiv(S, block_s)
    if sm_count is None:
        return 2 if token_blocks >= 2 else 1
    rows = block_s * block_h * min(max(B, 1), chunk)
    if rows >= QK_NORM_GROUP_BELOW_ROWS:
        return 1
    programs = head_blocks * cdiv(B, chunk) if B else 0
    n = 1
    while (rows * n < QK_NORM_ROWS_PER_PARTIAL and 2 * n <= token_blocks
           and cdiv(token_blocks, 2 * n) * programs >= QK_NORM_PROGRAMS_PER_SM * sm_count):
        n *= 2
    return n


def _per_entry(t: Optional[torch.Tensor], dims: int) -> bool:
    """Does a table ([B, P, R]: dims 3) or position ids ([B, S]: dims 2) differ between batch
    entries? (Not with one entry, nor with a batch stride of 0: one serves all.)"""
    return t is not None and t.dim() == dims and t.shape[0] > 1 and t.stride(0) != 0


def _dense(t: torch.Tensor, dims: int) -> bool:
    """Is a table (dims 3) or are position ids (dims 2) laid out as the kernel reads them: the
    last dim at stride 1, a table's rows one after the other, and entries that differ dense?
    (Empty: nothing is read; its strides, which .contiguous() leaves as they are, do not count.)"""
    if t.numel() == 0:
        return True
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return False
    if dims == 3 and t.dim() > 1 and t.stride(-2) != t.shape[-1] and t.shape[-2] > 1:
        return False
    return not _per_entry(t, dims) or t.stride(0) == t[0].numel()


def readable(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
             table: torch.Tensor, sin: Optional[torch.Tensor], pos: Optional[torch.Tensor],
             layout: str) -> tuple:
    """The arguments as the kernels read them, each itself or, where it does not come so, a
    contiguous copy: q and k (in `layout`) with heads at stride D and features at stride 1 (any
    token and batch strides: projections' views, slices of a fused QKV), weights contiguous, a
    table with dense rows ([P, R], or [B or 1, P, R]: one per entry, or a batch stride of 0 for
    one shared), position ids [B or 1, S] with dense rows likewise."""
    q, k = (x if _heads_readable(view4(x, layout)) else x.contiguous() for x in (q, k))
    w_q, w_k = (w if w.stride(0) == 1 else w.contiguous() for w in (w_q, w_k))
    if not _dense(table, 3):
        table = table.contiguous()
        sin = sin.contiguous() if sin is not None else None
    if pos is not None and not _dense(pos, 2):
        pos = pos.contiguous()
    return q, k, w_q, w_k, table, sin, pos


def _heads_readable(x4: torch.Tensor) -> bool:
    """An [S, B, H, D] view with heads at stride D and features at stride 1 (sizes 1 aside;
    an empty view reads nothing)."""
    if x4.numel() == 0:
        return True
    D = x4.shape[3]
    return (x4.stride(3) == 1 or D == 1) and (x4.stride(2) == D or x4.shape[2] == 1)


def keeps_strides(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Do the outputs for q and k (as `readable` leaves them) take their strides? Where both are
    dense, in any order of their dims: the kernels then address input and output alike, with
    the strides they are given, and a [B, H, S, D] view of a [B, S, H, D] projection, as Hugging
    Face hands q over, gets its output in that order, as HF's own code returns it. Otherwise
    (a slice of a fused QKV) the outputs are contiguous in the call's layout. (A storage-less
    empty_like says whether a tensor is dense: it keeps the strides of exactly those.)"""
    return all(torch.empty_like(x, device="meta").stride() == x.stride() for x in (q, k))


def outputs(q: torch.Tensor, k: torch.Tensor, keep_strides: bool,
            device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fresh outputs (forward) or input gradients (backward) for q and k: with their strides
    (`keeps_strides`) or contiguous in the call's layout; on q's device unless one is given."""
    if keep_strides:
        return torch.empty_like(q, device=device), torch.empty_like(k, device=device)
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=device or x.device) for x in (q, k))


def readable_grad(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of an output as the backward reads it: laid out as the output (`like`, an
    input gradient from `outputs`), copied so where it comes otherwise."""
    if g.stride() == like.stride() or g.numel() == 0:
        return g
    return torch.empty_like(like, device=g.device).copy_(g)


# The kernels' pointer arguments, in their order: the forward's, then the backward's three more
FORWARD_POINTERS = ("q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr", "w_q_ptr", "w_k_ptr",
                    "cos_ptr", "sin_ptr", "pos_ptr")
BACKWARD_POINTERS = ("q_ptr", "k_ptr", "grad_q_ptr", "grad_k_ptr", "w_q_ptr", "w_k_ptr",
                     "cos_ptr", "sin_ptr", "pos_ptr", "grad_q_out_ptr", "grad_k_out_ptr",
                     "part_ptr")
FORWARD = DirectLauncher(_qk_norm_rope_kernel, FORWARD_POINTERS)
BACKWARD = DirectLauncher(_qk_norm_rope_backward_kernel, BACKWARD_POINTERS)


def plan(q4: torch.Tensor, k4: torch.Tensor, q_out4: torch.Tensor, k_out4: torch.Tensor,
         w_q: torch.Tensor, w_k: torch.Tensor, table: torch.Tensor, sin: Optional[torch.Tensor],
         pos: Optional[torch.Tensor], *, layout: str, interleaved: bool, eps: float,
         weight_offset: float, packed: bool = False, gq4: Optional[torch.Tensor] = None,
         gk4: Optional[torch.Tensor] = None) -> Launch:
    """The launch over q and k ([S, B, H, D] views, as `readable` leaves them, or storage-less
    stand-ins of them; outputs from `outputs`): forward (gq4 None) or backward (the output
    gradients gq4, gk4, laid out as the outputs; q_out4 and k_out4 take the input gradients).
    Sees only shapes, strides, dtypes and the options, never values (stand-in tensors do), so
    one Launch serves every call alike; its launcher is the direction's kernel. Pointers are
    bound by `run`, in `pointers` order. packed: `pos` is cu_seqlens [N + 1] (thd), not
    position ids."""
    backward = gq4 is not None
    S, B, HQ, D = q4.shape
    HK = k4.shape[2]
    exact = table.dtype == torch.int64      # Angles' turns [R]: every position up to 2^31 - 2
    R = table.shape[0] if exact else table.shape[-1]
    # where the call runs: q's device, or the outputs' where q is a storage-less stand-in
    device = q_out4.device if q4.device.type == "meta" else q4.device
    on_gpu = device.type == "cuda" and not INTERPRET
    sm = multiprocessors(device) if on_gpu else None
    block_s, block_h, chunk, num_warps = pick_tiles(S, B, HQ, HK, D, sm)
    head_blocks = (HQ + HK) // block_h
    token_blocks = pick_token_blocks(S, B, block_s, block_h, chunk, head_blocks, sm) \
        if backward else 1
    # (one axis of token groups and head blocks, heads fastest: the header says why)
    grid = (cdiv(S, block_s * token_blocks) * head_blocks, 1, cdiv(B, chunk))
    assert _heads_readable(q4) and _heads_readable(k4), "heads at stride D (readable)"
    assert _dense(table, 3) and (pos is None or _dense(pos, 2)), "dense table rows and ids"
    out_as_in = q_out4.stride() == q4.stride() and k_out4.stride() == k4.stride()
    from .launch import View, contiguous_in, output_row     # (launch imports nothing of ours)
    gx_row = 0
    if not out_as_in and not all(contiguous_in(View.of(y), layout) or not y.numel()
                                 for y in (q_out4, k_out4)):
        # (backward) the input gradients into column slices of one token-major buffer
        gx_row = output_row(View.of(q_out4), View.of(k_out4), layout) if backward else None
        assert gx_row, "outputs from `outputs`, or column slices of one token-major buffer"
    if gq4 is not None and gq4.numel() and gk4.numel():     # laid out as the outputs, or
        assert (all(contiguous_in(View.of(g), layout) for g in (gq4, gk4)) if gx_row  # (gx_row)
                else gq4.stride() == q_out4.stride() and gk4.stride() == k_out4.stride()), \
            "readable_grad"
    args = dict(
        S=S, B=B, HQ=HQ, P=EXACT_POSITIONS if exact else table.shape[-2], eps=eps,
        weight_offset=weight_offset,
        stride_q_s=q4.stride(0), stride_q_b=q4.stride(1),
        stride_k_s=k4.stride(0), stride_k_b=k4.stride(1),
        R=R, D=D, OUT_LAYOUT=OUT_AS_INPUT if out_as_in else OUT_LAYOUT[layout],
        BLOCK_S=block_s, BLOCK_H=block_h,
        INTERLEAVED=interleaved,
        N_SEQ=pos.shape[0] - 1 if packed else 0,
        TABLE_PER_ENTRY=_per_entry(table, 3),
        POSITIONS=(CU_SEQLENS if packed else
                   IDS_PER_ENTRY if _per_entry(pos, 2) else SHARED_IDS).value,
        INT64=needs_int64([t for t in (q4, k4, q_out4, k_out4, gq4, gk4) if t is not None]),
        HEAD_BLOCKS=head_blocks,
    )
    if backward:
        args["TOKEN_BLOCKS"] = token_blocks
        args["GX_ROW"] = gx_row
    cdt = torch.float64 if q4.dtype == torch.float64 else torch.float32
    dtypes = (q4.dtype, k4.dtype, q_out4.dtype, k_out4.dtype, w_q.dtype, w_k.dtype, table.dtype,
              sin.dtype if sin is not None else None, pos.dtype if pos is not None else None)
    if backward:
        dtypes += (gq4.dtype, gk4.dtype, cdt)
    return Launch(grid, num_warps, args, dtypes, device, BACKWARD if backward else FORWARD)


def pointers(planned: Launch, q4, k4, q_out4, k_out4, w_q, w_k, table, sin, pos, gq4=None,
             gk4=None, part=None) -> tuple:
    """A plan's pointers in its kernel's order (FORWARD_POINTERS or BACKWARD_POINTERS)."""
    first = (q4, k4, q_out4, k_out4, w_q, w_k, table, sin, pos)
    return first + (gq4, gk4, part) if planned.launcher is BACKWARD else first


def partials(planned: Launch) -> Optional[torch.Tensor]:
    """A backward launch's buffer of per-program partial sums [programs, D] (None forward)."""
    if planned.launcher is not BACKWARD:
        return None
    return torch.empty(partials_shape(planned), dtype=planned.dtypes[-1],
                       device=planned.device)


def partials_shape(planned: Launch) -> tuple:
    """The shape of a backward launch's partial sums: [token groups, head blocks, batch chunks,
    D], the grid's programs."""
    a = planned.args
    return (cdiv(a["S"], a["BLOCK_S"] * a["TOKEN_BLOCKS"]), a["HEAD_BLOCKS"], planned.grid[2],
            a["D"])


def weight_grads(planned: Launch, part: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gradients of w_q and w_k from a backward launch's partial sums, in a fixed order of
    summation (the same bits on every run)."""
    if planned.args["S"] == 0 or planned.args["B"] == 0:
        return part.new_zeros(planned.args["D"]), part.new_zeros(planned.args["D"])
    return summed_weight_grads(part, planned.args["HQ"] // planned.args["BLOCK_H"])


def summed_weight_grads(part: torch.Tensor, q_blocks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """weight_grads' sums of the partial sums [token groups, head blocks, batch chunks, D]: the
    first q_blocks head blocks are q's, the rest k's."""
    return part[:, :q_blocks].sum((0, 1, 2)), part[:, q_blocks:].sum((0, 1, 2))


def run(planned: Launch, pointers: tuple) -> None:
    """Start the kernel (pointers in its order); see `planning.start`."""
    start(planned.launcher, planned, pointers)


def start_now(planned: Launch):
    """The operator's starter: each start goes through `run` (planning.start)."""
    return lambda pointers: run(planned, pointers)


class Route:
    """One qk_norm_rope call, checked by the caller and planned: the forward launch, and the
    backward launch for output gradients of each dtype (planned at its first backward, from
    stand-ins of the forward's tensors). Both routes take it: the operator makes one per call
    and starts its launches through `run` (`start_now`); ropelib.qk_norm's eager route keeps
    one per signature and starts them through the direct launcher. `starter(planned)` gives the
    callable that starts a planned launch with its pointers. packed: `pos` is cu_seqlens."""
    __slots__ = ("layout", "options", "starter", "copies", "keep_strides", "empty", "fwd",
                 "fwd_launch", "_stand_ins", "_backwards")

    def __init__(self, q, k, w_q, w_k, table, sin, pos, *, layout: str, interleaved: bool,
                 eps: float, weight_offset: float, packed: bool = False, starter=start_now):
        self.layout, self.starter = layout, starter
        self.options = dict(interleaved=interleaved, eps=eps, weight_offset=weight_offset,
                            packed=packed)
        given = (q, k, w_q, w_k, table, sin, pos)
        read = readable(*given, layout)
        # do this call's tensors need copies before the kernels can read them? (then every
        # call of the signature does)
        self.copies = any(a is not b for a, b in zip(read, given))
        q, k, w_q, w_k, table, sin, pos = read
        self.keep_strides = keeps_strides(q, k)
        planned = plan(*self._views(q, k, *outputs(q, k, self.keep_strides, "meta")), w_q, w_k,
                       table, sin, pos, layout=layout, **self.options)
        self.fwd, self.fwd_launch = starter(planned), planned
        self.empty = not (planned.args["S"] and planned.args["B"])
        self._stand_ins = tuple(None if t is None else torch.empty_strided(
            t.shape, t.stride(), dtype=t.dtype, device="meta") for t in read)
        self._backwards = {}

    def _stores_into(self, gx_q, gx_k) -> bool:
        """Can the backward kernel store the gradients of q and k into these tensors (GX_ROW)?
        Where the outputs are contiguous in the layout (not laid out as q and k) and the two
        are column slices of one token-major buffer, with sizes known now."""
        from .launch import View, output_row
        return not self.keep_strides and bool(output_row(
            View.of(view4(gx_q, self.layout)), View.of(view4(gx_k, self.layout)), self.layout))

    def _views(self, *tensors) -> tuple:
        return tuple(view4(t, self.layout) for t in tensors)

    def _readable(self, q, k, w_q, w_k, table, sin, pos) -> tuple:
        if not self.copies:
            return q, k, w_q, w_k, table, sin, pos
        return readable(q, k, w_q, w_k, table, sin, pos, self.layout)

    def forward(self, q, k, w_q, w_k, table, sin, pos) -> Tuple[torch.Tensor, torch.Tensor]:
        """q and k (in the layout) normed and rotated: (q_out, k_out) from `outputs`."""
        q, k, w_q, w_k, table, sin, pos = self._readable(q, k, w_q, w_k, table, sin, pos)
        q_out, k_out = outputs(q, k, self.keep_strides)
        if not self.empty:
            self.fwd(pointers(self.fwd_launch, q, k, q_out, k_out, w_q, w_k, table, sin, pos))
        return q_out, k_out

    def backward(self, grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, pos,
                 into: Optional[tuple] = None) -> tuple:
        """From the gradients of (q_out, k_out): the gradients of q and k (laid out as the
        outputs were) and of w_q and w_k, in fp32 (fp64 for fp64 inputs). `into`: tensors of
        the caller's for the gradients of q and k, column slices of one token-major buffer
        (`launch.output_row`), stored into directly where the outputs are contiguous in the
        layout (else written through fresh tensors); they are returned."""
        if into is not None and not self._stores_into(*into):
            *grads, gw_q, gw_k = self.backward(grad_q_out, grad_k_out, q, k, w_q, w_k, table,
                                               sin, pos)
            for given, fresh in zip(into, grads):
                given.copy_(fresh)
            return (*into, gw_q, gw_k)
        q, k, w_q, w_k, table, sin, pos = self._readable(q, k, w_q, w_k, table, sin, pos)
        # the output gradients are read laid out as fresh input gradients are (`outputs`; only
        # their strides where the caller's tensors take the input gradients)
        laid_out = outputs(q, k, self.keep_strides, None if into is None else "meta")
        grad_q, grad_k = laid_out if into is None else into
        gq, gk = readable_grad(grad_q_out, laid_out[0]), readable_grad(grad_k_out, laid_out[1])
        start_backward, planned = self._planned_backward(gq, gk, grad_q, grad_k,
                                                         into is not None)
        part = partials(planned)
        if part.numel():
            start_backward(pointers(planned, q, k, grad_q, grad_k, w_q, w_k, table, sin, pos,
                                    gq, gk, part))
        gw_q, gw_k = weight_grads(planned, part)
        return grad_q, grad_k, gw_q, gw_k

    def _planned_backward(self, gq, gk, grad_q, grad_k, into: bool) -> tuple:
        """(start, planned launch) of the backward for output gradients gq, gk (as
        `readable_grad` leaves them) and input gradients grad_q, grad_k (fresh, or the caller's
        `into`): planned once per dtypes (and, into the caller's tensors, their strides)."""
        key = (gq.dtype, gk.dtype, into and grad_q.stride())
        planned_backward = self._backwards.get(key)
        if planned_backward is None:
            q_, k_, w_q_, w_k_, table_, sin_, pos_ = self._stand_ins
            gq4, gk4, gx_q, gx_k = self._views(gq, gk, grad_q, grad_k)
            planned = plan(*self._views(q_, k_), gx_q, gx_k, w_q_, w_k_, table_, sin_, pos_,
                           layout=self.layout, gq4=gq4, gk4=gk4, **self.options)
            planned_backward = self._backwards[key] = (self.starter(planned), planned)
        return planned_backward


class BackwardInto:
    """Route.backward(..., into=...) for one signature (every tensor's shape, strides and
    dtype: ropelib.qk_norm.undo_norm_rope's eager key), with what follows from strides alone
    decided once, at the first call: whether the kernel stores into the caller's tensors
    (`Route._stores_into`; else the gradients go through fresh tensors and are copied), whether
    each output gradient must be copied to be read (`readable_grad`), the backward's launch and
    its partial sums' shape. The same steps and plans as Route.backward, so the same bits."""
    __slots__ = ("route", "stores", "laid_out", "copy_q", "copy_k", "start", "planned",
                 "part", "q_blocks")

    def __init__(self, route: Route, grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, pos,
                 into: tuple):
        self.route = route
        self.stores = route._stores_into(*into)
        if not self.stores:
            return
        q, k = route._readable(q, k, w_q, w_k, table, sin, pos)[:2]
        self.laid_out = outputs(q, k, route.keep_strides, "meta")
        gq, gk = (readable_grad(g, like) for g, like in zip((grad_q_out, grad_k_out),
                                                            self.laid_out))
        self.copy_q, self.copy_k = gq is not grad_q_out, gk is not grad_k_out
        self.start, self.planned = route._planned_backward(gq, gk, *into, True)
        # torch.empty's arguments for the partial sums (`partials`)
        self.part = (partials_shape(self.planned),
                     dict(dtype=self.planned.dtypes[-1], device=self.planned.device))
        a = self.planned.args
        self.q_blocks = None if a["S"] == 0 or a["B"] == 0 else a["HQ"] // a["BLOCK_H"]

    def __call__(self, grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, pos,
                 into: tuple) -> tuple:
        route = self.route
        if not self.stores:
            return route.backward(grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, pos,
                                  into=into)
        q, k, w_q, w_k, table, sin, pos = route._readable(q, k, w_q, w_k, table, sin, pos)
        gq = readable_grad(grad_q_out, self.laid_out[0]) if self.copy_q else grad_q_out
        gk = readable_grad(grad_k_out, self.laid_out[1]) if self.copy_k else grad_k_out
        part = torch.empty(self.part[0], **self.part[1])
        grad_q, grad_k = into
        if self.q_blocks is None:       # (nothing to launch: weight_grads' zeros)
            gw_q, gw_k = weight_grads(self.planned, part)
        else:
            if part.numel():
                self.start(pointers(self.planned, q, k, grad_q, grad_k, w_q, w_k, table, sin,
                                    pos, gq, gk, part))
            gw_q, gw_k = summed_weight_grads(part, self.q_blocks)
        return grad_q, grad_k, gw_q, gw_k
