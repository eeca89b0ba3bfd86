"""The finished RoPE kernel: one pass over the tensor, forward and backward, every layout.

How it is parallelised
----------------------
Every input is seen as a 4-D strided view x[S, B, H, D] (sbhd as is, bshd with S and B swapped,
thd as [T, 1, H, D], HF's [B, H, S, D] permuted): nothing is copied. The grid is

    axis 0: blocks of BLOCK_S tokens                 cdiv(S, BLOCK_S)
    axis 1: blocks of BLOCK_H heads, over up to three segments (q, then k, then v)
    axis 2: chunks of B_CHUNK batch entries          cdiv(B, B_CHUNK)

A program loads the cos/sin of its BLOCK_S positions once ([BLOCK_S, 1, HALF], broadcast over
its heads) and reuses them for every batch entry of its chunk, unless the positions differ per
batch entry (start_positions, per-batch position ids or tables), in which case it reloads them
inside the batch loop. x is read once and y written once; the tile is [BLOCK_S, BLOCK_H, HALF]
per half, so each thread moves contiguous runs of the head dim (16-byte vectors where the
strides allow). Math is fp32 (fp64 for fp64 inputs) with one rounding at the store.

The pairing: rotate-half pairs feature j with j + R/2 (two contiguous half loads); interleaved
pairs 2j with 2j+1 (one contiguous load of R features, split into even/odd lanes, joined back
for one contiguous store). Features R..D-1 are copied through unless the call is in place.

Forward rotates by +theta, backward by -theta (the transpose of a rotation). With per-feature
tables (TE's convention) the transpose also swaps which member's sine is used:

    forward   y_a = x_a c_a - x_b s_a      y_b = x_b c_b + x_a s_b
    backward  g_a = y_a c_a + y_b s_b      g_b = y_b c_b - y_a s_a

so backward is the forward kernel with (s_a, s_b) replaced by (-s_b, -s_a): one kernel, one
constexpr.

When the host has checked that the table's paired columns are equal (SAME_HALVES: TE's angle
tables repeat every frequency), the kernel reads and evaluates one column per pair: half the
sin/cos work, which matters where no batch loop amortises it (thd, batch 1).
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .common import round_to


@triton.jit
def _cos_sin(angle, ACCURATE: tl.constexpr):
    # libdevice's cosf/sinf reduce any angle exactly (as TE's sincosf); the interpreter has no
    # libdevice, and numpy's cos/sin are accurate too.
    if ACCURATE:
        return libdevice.cos(angle), libdevice.sin(angle)
    else:
        return tl.cos(angle), tl.sin(angle)


@triton.jit
def _positions(s_idx, b, S, pos_ptr, stride_pos_b, stride_pos_s, start_ptr, cp_size, cp_rank, P,
               EXPLICIT_POS: tl.constexpr, HAS_START: tl.constexpr, HAS_CP: tl.constexpr):
    # s_idx [BLOCK_S] local token indices -> [BLOCK_S] table rows (int32)
    if EXPLICIT_POS:
        p = tl.load(pos_ptr + b * stride_pos_b + s_idx * stride_pos_s, mask=s_idx < S, other=0)
        p = p.to(tl.int32)
    else:
        if HAS_CP:
            # TE's dual-chunk split: rank r holds global chunks r and 2*cp_size-1-r.
            seg = S // 2
            p = tl.where(s_idx < seg, cp_rank * seg + s_idx,
                         cp_size * S - (cp_rank + 1) * seg + (s_idx - seg))
        else:
            p = s_idx
        if HAS_START:
            p = p + tl.load(start_ptr + b).to(tl.int32)
    # Positions are validated on the host; the clamp only keeps a bad value inside the table.
    return tl.minimum(tl.maximum(p, 0), P - 1)


@triton.jit
def _load_table(c_ptr, s_ptr, rows, b, stride_tp, stride_tb, stride_td, d_a, d_b, mask,
                FROM_ANGLES: tl.constexpr, ACCURATE: tl.constexpr, CDT: tl.constexpr,
                SAME_HALVES: tl.constexpr):
    # rows [BLOCK_S], d_a/d_b [BLOCK_HALF] -> four [BLOCK_S, 1, BLOCK_HALF] factors
    base = rows[:, None, None].to(tl.int64) * stride_tp + b * stride_tb
    off_a = base + d_a[None, None, :] * stride_td
    off_b = base + d_b[None, None, :] * stride_td
    if SAME_HALVES:
        # columns d_a and d_b of the table hold the same values (TE's duplicated freqs,
        # checked on the host): read and evaluate one of them
        if FROM_ANGLES:
            c_a, s_a = _cos_sin(tl.load(c_ptr + off_a, mask=mask, other=0.0).to(CDT), ACCURATE)
        else:
            c_a = tl.load(c_ptr + off_a, mask=mask, other=0.0).to(CDT)
            s_a = tl.load(s_ptr + off_a, mask=mask, other=0.0).to(CDT)
        c_b = c_a
        s_b = s_a
    elif FROM_ANGLES:
        c_a, s_a = _cos_sin(tl.load(c_ptr + off_a, mask=mask, other=0.0).to(CDT), ACCURATE)
        c_b, s_b = _cos_sin(tl.load(c_ptr + off_b, mask=mask, other=0.0).to(CDT), ACCURATE)
    else:
        c_a = tl.load(c_ptr + off_a, mask=mask, other=0.0).to(CDT)
        s_a = tl.load(s_ptr + off_a, mask=mask, other=0.0).to(CDT)
        c_b = tl.load(c_ptr + off_b, mask=mask, other=0.0).to(CDT)
        s_b = tl.load(s_ptr + off_b, mask=mask, other=0.0).to(CDT)
    return c_a, s_a, c_b, s_b


@triton.jit
def _rope_segment(
    x_ptr, y_ptr,                      # input / output of this segment (may be the same: in place)
    c_ptr, s_ptr,                      # cos & sin tables [P, R], or angles [P, R] in c_ptr
    pos_ptr, start_ptr,                # explicit positions [B, S] / per-batch start offsets [B]
    pid_s, h0, b_lo, b_hi,             # tile origin: token block, first head, batch range
    S, H, HPG, P, cp_size, cp_rank,    # sizes; HPG = heads per group (packed QKV), else 1
    stride_xs, stride_xb, stride_xg, stride_xh, stride_xd,   # x head h at (h//HPG)*xg + (h%HPG)*xh
    stride_ys, stride_yb, stride_yg, stride_yh, stride_yd,
    stride_tp, stride_tb, stride_td,   # table strides: position, batch (0 = shared), feature
    stride_pos_b, stride_pos_s,
    R: tl.constexpr, D: tl.constexpr,  # rotary dim (even), head dim
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,          # next_pow2(D - R); 0 when nothing passes through
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, FROM_ANGLES: tl.constexpr,
    SAME_HALVES: tl.constexpr,         # the table's two columns of each pair are equal
    EXPLICIT_POS: tl.constexpr, HAS_START: tl.constexpr, HAS_CP: tl.constexpr,
    TABLE_PER_BATCH: tl.constexpr,     # positions or table rows depend on the batch entry
    COPY_PASS: tl.constexpr,           # write features R..D-1 (False when in place)
    ACCURATE: tl.constexpr, CDT: tl.constexpr, INT64: tl.constexpr, BF16_RTNE: tl.constexpr,
    LOAD_EVICT: tl.constexpr, STORE_CACHE: tl.constexpr,   # cache hints for streamed x / y
):
    HALF: tl.constexpr = R // 2
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)          # [BLOCK_S]
    h_idx = h0 + tl.arange(0, BLOCK_H)                        # [BLOCK_H]
    j = tl.arange(0, BLOCK_HALF)                              # [BLOCK_HALF]
    if INTERLEAVED:
        d_a = 2 * j
        d_b = 2 * j + 1
    else:
        d_a = j
        d_b = j + HALF
    if INT64:
        s_off = s_idx.to(tl.int64)
    else:
        s_off = s_idx
    row_ok = (s_idx < S)[:, None] & (h_idx < H)[None, :]     # [BLOCK_S, BLOCK_H]
    m = row_ok[:, :, None] & (j < HALF)[None, None, :]        # [BLOCK_S, BLOCK_H, BLOCK_HALF]
    tab_mask = (s_idx < S)[:, None, None] & (j < HALF)[None, None, :]
    x_rows = s_off[:, None] * stride_xs + (h_idx // HPG)[None, :] * stride_xg \
        + (h_idx % HPG)[None, :] * stride_xh                  # [BLOCK_S, BLOCK_H]
    y_rows = s_off[:, None] * stride_ys + (h_idx // HPG)[None, :] * stride_yg \
        + (h_idx % HPG)[None, :] * stride_yh

    if not TABLE_PER_BATCH:
        rows = _positions(s_idx, 0, S, pos_ptr, stride_pos_b, stride_pos_s, start_ptr,
                          cp_size, cp_rank, P, EXPLICIT_POS, HAS_START, HAS_CP)
        c_a, s_a, c_b, s_b = _load_table(c_ptr, s_ptr, rows, 0, stride_tp, stride_tb, stride_td,
                                         d_a, d_b, tab_mask, FROM_ANGLES, ACCURATE, CDT,
                                         SAME_HALVES)
        if BACKWARD:
            s_a, s_b = -s_b, -s_a

    for b in range(b_lo, b_hi):
        if INT64:
            bb = b.to(tl.int64)
        else:
            bb = b
        if TABLE_PER_BATCH:
            rows = _positions(s_idx, b, S, pos_ptr, stride_pos_b, stride_pos_s, start_ptr,
                              cp_size, cp_rank, P, EXPLICIT_POS, HAS_START, HAS_CP)
            c_a, s_a, c_b, s_b = _load_table(c_ptr, s_ptr, rows, bb, stride_tp, stride_tb,
                                             stride_td, d_a, d_b, tab_mask, FROM_ANGLES,
                                             ACCURATE, CDT, SAME_HALVES)
            if BACKWARD:
                s_a, s_b = -s_b, -s_a
        xr = x_ptr + (x_rows + bb * stride_xb)[:, :, None]    # [BLOCK_S, BLOCK_H, 1]
        yr = y_ptr + (y_rows + bb * stride_yb)[:, :, None]
        if INTERLEAVED:
            k = tl.arange(0, 2 * BLOCK_HALF)
            mk = row_ok[:, :, None] & (k < R)[None, None, :]
            x = tl.load(xr + k[None, None, :] * stride_xd, mask=mk, other=0.0,
                        eviction_policy=LOAD_EVICT)
            x = tl.reshape(x, (BLOCK_S, BLOCK_H, BLOCK_HALF, 2))
            x_a, x_b = tl.split(x)
        else:
            x_a = tl.load(xr + d_a[None, None, :] * stride_xd, mask=m, other=0.0,
                          eviction_policy=LOAD_EVICT)
            x_b = tl.load(xr + d_b[None, None, :] * stride_xd, mask=m, other=0.0,
                          eviction_policy=LOAD_EVICT)
        if COPY_PASS:
            if BLOCK_PASS > 0:
                e = R + tl.arange(0, BLOCK_PASS)
                mp = row_ok[:, :, None] & (e < D)[None, None, :]
                t = tl.load(xr + e[None, None, :] * stride_xd, mask=mp, eviction_policy=LOAD_EVICT)
        x_a = x_a.to(CDT)
        x_b = x_b.to(CDT)
        y_a = x_a * c_a - x_b * s_a
        y_b = x_b * c_b + x_a * s_b
        y_a = round_to(y_a, y_ptr.dtype.element_ty, BF16_RTNE)
        y_b = round_to(y_b, y_ptr.dtype.element_ty, BF16_RTNE)
        if INTERLEAVED:
            y = tl.reshape(tl.join(y_a, y_b), (BLOCK_S, BLOCK_H, 2 * BLOCK_HALF))
            tl.store(yr + k[None, None, :] * stride_yd, y, mask=mk, cache_modifier=STORE_CACHE)
        else:
            tl.store(yr + d_a[None, None, :] * stride_yd, y_a, mask=m, cache_modifier=STORE_CACHE)
            tl.store(yr + d_b[None, None, :] * stride_yd, y_b, mask=m, cache_modifier=STORE_CACHE)
        if COPY_PASS:
            if BLOCK_PASS > 0:
                tl.store(yr + e[None, None, :] * stride_yd, t, mask=mp, cache_modifier=STORE_CACHE)


@triton.jit
def _copy_segment(x_ptr, y_ptr, pid_s, h0, b_lo, b_hi, S, H,
                  stride_xs, stride_xb, stride_xh, stride_xd,
                  stride_ys, stride_yb, stride_yh, stride_yd,
                  D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_D: tl.constexpr, INT64: tl.constexpr):
    # The v of a packed QKV: copied through in the same launch.
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    h_idx = h0 + tl.arange(0, BLOCK_H)
    e = tl.arange(0, BLOCK_D)
    if INT64:
        s_off = s_idx.to(tl.int64)
    else:
        s_off = s_idx
    mask = ((s_idx < S)[:, None] & (h_idx < H)[None, :])[:, :, None] & (e < D)[None, None, :]
    x_rows = s_off[:, None] * stride_xs + h_idx[None, :] * stride_xh
    y_rows = s_off[:, None] * stride_ys + h_idx[None, :] * stride_yh
    for b in range(b_lo, b_hi):
        if INT64:
            bb = b.to(tl.int64)
        else:
            bb = b
        t = tl.load(x_ptr + (x_rows + bb * stride_xb)[:, :, None] + e[None, None, :] * stride_xd,
                    mask=mask)
        tl.store(y_ptr + (y_rows + bb * stride_yb)[:, :, None] + e[None, None, :] * stride_yd,
                 t, mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, qo_ptr, k_ptr, ko_ptr, v_ptr, vo_ptr,   # segments; k/v unused when NK/NV blocks are 0
    qc_ptr, qs_ptr, kc_ptr, ks_ptr,                # tables for q and for k (may be the same)
    pos_ptr, start_ptr,
    S, B, HQ, HK, HV, HPG, P, cp_size, cp_rank,
    sq_s, sq_b, sq_g, sq_h, sq_d, sqo_s, sqo_b, sqo_g, sqo_h, sqo_d,
    sk_s, sk_b, sk_h, sk_d, sko_s, sko_b, sko_h, sko_d,
    sv_s, sv_b, sv_h, sv_d, svo_s, svo_b, svo_h, svo_d,
    stp, stb, std, skp, skb, skd,                  # q table strides, k table strides
    stride_pos_b, stride_pos_s,
    NQB, NKB,                                      # number of head blocks of q and of k
    B_CHUNK,                                       # batch entries per program
    R: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr, BLOCK_DV: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, FROM_ANGLES: tl.constexpr,
    SAME_HALVES: tl.constexpr,
    EXPLICIT_POS: tl.constexpr, HAS_START: tl.constexpr, HAS_CP: tl.constexpr,
    TABLE_PER_BATCH: tl.constexpr, COPY_PASS: tl.constexpr,
    ACCURATE: tl.constexpr, CDT: tl.constexpr, INT64: tl.constexpr, BF16_RTNE: tl.constexpr,
    LOAD_EVICT: tl.constexpr, STORE_CACHE: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    if pid_h < NQB:
        _rope_segment(q_ptr, qo_ptr, qc_ptr, qs_ptr, pos_ptr, start_ptr,
                      pid_s, pid_h * BLOCK_H, b_lo, b_hi, S, HQ, HPG, P, cp_size, cp_rank,
                      sq_s, sq_b, sq_g, sq_h, sq_d, sqo_s, sqo_b, sqo_g, sqo_h, sqo_d,
                      stp, stb, std, stride_pos_b, stride_pos_s,
                      R, D, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_PASS,
                      INTERLEAVED, BACKWARD, FROM_ANGLES, SAME_HALVES, EXPLICIT_POS, HAS_START, HAS_CP,
                      TABLE_PER_BATCH, COPY_PASS, ACCURATE, CDT, INT64, BF16_RTNE,
                      LOAD_EVICT, STORE_CACHE)
    elif pid_h < NQB + NKB:
        _rope_segment(k_ptr, ko_ptr, kc_ptr, ks_ptr, pos_ptr, start_ptr,
                      pid_s, (pid_h - NQB) * BLOCK_H, b_lo, b_hi, S, HK, 1, P, cp_size, cp_rank,
                      sk_s, sk_b, sk_h, 0, sk_d, sko_s, sko_b, sko_h, 0, sko_d,
                      skp, skb, skd, stride_pos_b, stride_pos_s,
                      R, D, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_PASS,
                      INTERLEAVED, BACKWARD, FROM_ANGLES, SAME_HALVES, EXPLICIT_POS, HAS_START, HAS_CP,
                      TABLE_PER_BATCH, COPY_PASS, ACCURATE, CDT, INT64, BF16_RTNE,
                      LOAD_EVICT, STORE_CACHE)
    else:
        _copy_segment(v_ptr, vo_ptr, pid_s, (pid_h - NQB - NKB) * BLOCK_H, b_lo, b_hi, S, HV,
                      sv_s, sv_b, sv_h, sv_d, svo_s, svo_b, svo_h, svo_d,
                      DV, BLOCK_S, BLOCK_H, BLOCK_DV, INT64)
