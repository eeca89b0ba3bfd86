"""The finished RoPE kernels: one pass over the tensor, forward and backward, every layout.

One body (_rope_heads) behind four narrow entry points, one per source of positions, so that no
kernel takes more than 34 arguments, at most 24 of them bound at a launch (each bound one costs
host time at every launch through Triton's launcher, and a wide kernel costs more in compiled
graphs; the constexprs, X_FIRST and OUT_ROW among them, are not bound by ropelib's own
launches):

    _rope_kernel          the token index (+ start offsets, context parallelism)     34 args
    _rope_ids_kernel      explicit position ids                                     33
    _rope_packed_kernel   packed sequences (thd, cu_seqlens)                        30
    _rope_qkv_kernel      Transformer Engine's packed QKV, forward and backward     33

What is not an argument follows from the others: k, start offsets, in place (an output None),
angles or cos/sin or table-free (the table's pointers and dtype), fp64 math, the tile widths
(from R and D); an output is a tensor whose strides follow from its shape and layout: fresh and
contiguous, or (OUT_ROW, a constexpr) column slices of one token-major buffer whose token rows
are OUT_ROW elements apart, as the QKV projection's backward writes q's and k's gradients into
its gradient dY (qkv_linear.written_dy); outputs and tables read features at stride 1 (the inputs' feature strides are
arguments: a gradient may be expanded).

How it is parallelised
----------------------
Every input is seen as a 4-D strided view x[S, B, H, D] (sbhd as is, bshd with S and B swapped,
thd as [T, 1, H, D], HF's [B, H, S, D] permuted): nothing is copied. The grid is

    axis 0: blocks of BLOCK_S tokens                 cdiv(S, BLOCK_S)
    axis 1: blocks of BLOCK_H heads of q, then of k  cdiv(HQ, BLOCK_H) + cdiv(HK, BLOCK_H)
    axis 2: chunks of batch entries                  the planner's choice; a program takes
                                                     cdiv(B, programs on this axis) entries

A program finds the table rows of its BLOCK_S tokens, loads their cos/sin once ([BLOCK_S, 1,
HALF], broadcast over its heads) and reuses them for every batch entry of its chunk, unless the
positions differ per batch entry (start_positions, per-batch position ids or tables), in which
case it reloads them inside the batch loop. A program that loops over fewer than 4 entries
(decode's, batch 1 to 3) loads an entry's x before that table work, so both are in flight at
once, and is compiled for that number of entries (X_FIRST), so that finding its first entry
takes no division by the grid. x is read once and y written once; the tile is [BLOCK_S,
BLOCK_H, HALF] per half, so each thread moves contiguous runs of the head dim (16-byte vectors
where the strides allow).
Math is fp32 (fp64 for fp64 inputs or outputs) with one rounding at the store; each output is
one fma, y_a = fma(x_a, c_a, -(x_b s_a)) and y_b = fma(x_b, c_b, x_a s_b), the order
Transformer Engine's CUDA kernel computes in.

Positions come from one of three places (whichever pointer is given): the token index (with
TE's context-parallel dual-chunk split and per-batch start offsets), explicit position ids, or,
for packed sequences, a search of the token index in cu_seqlens (64 entries at once, then a
binary search between two of them). A position outside the table makes its row NaN (the table
read is clamped, so memory stays safe and the bad value cannot pass unnoticed): its cosines are
made NaN once in the tile's table (common.nan_unless), and every output is one fma with one.

The pairing: rotate-half pairs feature j with j + R/2 (two contiguous half loads); interleaved
pairs 2j with 2j+1 (one contiguous load of R features, split into even/odd lanes, joined back
for one contiguous store). Features R..D-1 are copied through unless the call is in place.

Forward rotates by +theta, backward by -theta (the transpose of a rotation). With per-feature
tables (TE's convention) the transpose also swaps which member's sine is used:

    forward   y_a = x_a c_a - x_b s_a      y_b = x_b c_b + x_a s_b
    backward  g_a = y_a c_a + y_b s_b      g_b = y_b c_b - y_a s_a

so backward is the forward kernel with (s_a, s_b) replaced by (-s_b, -s_a): one kernel, one
constexpr.

Angle tables usually repeat every frequency in both members of a pair (TE's cat([f, f]) or
repeat_interleave(f, 2)). A program compares the two columns of its rows bit for bit and, when
they are equal, evaluates sin/cos once per pair: half the special-function work, which matters
where no batch loop amortises it (thd, batch 1). The check is in the kernel, on the values it
reads, so no host-side inspection or cache is involved.

Angles without a table (EXACT, ropelib.frequencies.Angles): the table is `turns` [R] int64,
theta_j / (2 pi) in 96-bit fixed point (a 64-bit word at j, a 32-bit word at R/2 + j), and
`sin` the amplitude [1] (YaRN's attention factor). A program computes the angle of each of its
(token, pair) once from the integer position m, exactly (_exact_turn):

    m T_j mod 2^96 = (m hi_j mod 2^64 + (m lo_j >> 32)) * 2^32 + (m lo_j mod 2^32)

with 64-bit integer products that wrap modulo 2^64 (one turn): that is the range reduction,
and the high word read as signed is the angle in [-1/2, 1/2) turn. Its cos and sin come from
that fixed-point turn without any further reduction (_cos_sin_of_turn): the nearest quarter turn
q is its top bits, the rest (within 1/8 turn) becomes fp32 radians r (a two-word product, no
fp64), and short polynomials give cos r and sin r on [-pi/4, pi/4]; q swaps and negates them.
Every multiply-add is one fma, and the two roundings that would otherwise pass into the result
whole, of r itself (half an ulp of r, a whole ulp of sin r where sin r is a binade below r) and
of 1 - r^2/2, are carried into it (8 more fp32 operations per angle: the same time on an
H100, where the kernel waits on memory). That is cheaper than an accurate sin/cos of a radian angle
(no range reduction left to do, no fp64), and as accurate: within COS_SIN_ULPS = 1 fp32 ulp of
the exact values. Measured on an H100 (the interpreter gives the same bits): at most 0.80 ulp,
for cos and for sin, over 3.2e9 (position, frequency) pairs, random positions up to 2^31 - 2
with the 64 frequencies of base 500000 and of base 10000 (1 rad included) and 64 random ones
from 1e-7 to 3 rad. Without the carries the same polynomials are off by up to 1.57 ulps, and
by up to 2.4 with two roundings per multiply-add (sin at position 695,538,199 at 1 rad: 2.27).
fp64 inputs use fp64 angles and fp64 sin/cos instead. Both members of a pair share their angle.
"""
import triton
import triton.language as tl

from .common import (ACCURATE, ROUND_BF16_RTNE, batch_range, contiguous_strides, cos_sin,
                     dual_chunk_position, head_tile, load_table, nan_unless, offset_int,
                     rotate_pair, round_to, tile_width)

# 2 pi = TWO_PI_1 + TWO_PI_2 + TWO_PI_3 (each exact in fp32, the sum within 2^-75 of 2 pi), so
# a product with it is exact to fp64 precision whatever precision the constants are given in.
TWO_PI_1 = tl.constexpr(6.2831854820251465)
TWO_PI_2 = tl.constexpr(-1.7484555314695172e-07)
TWO_PI_3 = tl.constexpr(-6.8604980400235275e-15)


@triton.jit
def _exact_turn(turns_ptr, pos, j, stride_d, HALF: tl.constexpr):
    # pos [BLOCK_S] int32 positions >= 0, j [BLOCK_HALF] pairs -> [BLOCK_S, 1, BLOCK_HALF] each:
    # m theta_j / (2 pi) in units of 2^-64 turn, wrapped to [-2^63, 2^63) (int64), and the
    # 32 bits below it (int64 in [0, 2^32), units of 2^-96 turn)
    ok = j < HALF
    hi = tl.load(turns_ptr + j * stride_d, mask=ok, other=0).to(tl.uint64, bitcast=True)
    lo = tl.load(turns_ptr + (j + HALF) * stride_d, mask=ok, other=0).to(tl.uint64, bitcast=True)
    m = pos.to(tl.uint64)[:, None, None]
    whole = m * hi[None, None, :]          # mod 2^64: whole turns fall off the top
    part = m * lo[None, None, :]           # < 2^63: m < 2^31, lo < 2^32
    top = part >> 32
    turn = (whole + top).to(tl.int64, bitcast=True)         # [-2^63, 2^63): [-1/2, 1/2) turn
    rest = (part - (top << 32)).to(tl.int64, bitcast=True)  # the low 32 bits
    return turn, rest


@triton.jit
def _exact_angle(turns_ptr, pos, j, stride_d, HALF: tl.constexpr, CDT: tl.constexpr):
    # pos [BLOCK_S] int32 positions >= 0, j [BLOCK_HALF] pairs -> angles [BLOCK_S, 1, BLOCK_HALF]
    # m theta_j reduced to [-pi, pi), in CDT (fp32: one rounding of the fp64 value).
    turn, rest = _exact_turn(turns_ptr, pos, j, stride_d, HALF)
    t = turn.to(tl.float64) * 5.421010862427522e-20 \
        + rest.to(tl.float64) * 1.2621774483536189e-29       # 2^-64, 2^-96: turns
    angle = t * TWO_PI_1 + (t * TWO_PI_2 + t * TWO_PI_3)
    return angle.to(CDT)


# 2 pi / 2^64 (radians per unit of a 64-bit turn) = TURN_RAD_HI + TURN_RAD_LO, each fp32
TURN_RAD_HI = tl.constexpr(3.4061216748705226e-19)
TURN_RAD_LO = tl.constexpr(-9.478396428567739e-27)
# The table-free fp32 cos and sin (_cos_sin_of_turn) are within this many fp32 ulps of the exact
# values (the module docstring says how it was measured; tests/test_feature_holes.py checks it)
COS_SIN_ULPS = 1.0
# minimax polynomials of sin and cos on [-pi/4, pi/4] (Cephes' sinf and cosf)
SIN_1 = tl.constexpr(-1.6666654611e-1)
SIN_2 = tl.constexpr(8.3321608736e-3)
SIN_3 = tl.constexpr(-1.9515295891e-4)
COS_1 = tl.constexpr(4.166664568298827e-2)
COS_2 = tl.constexpr(-1.388731625493765e-3)
COS_3 = tl.constexpr(2.443315711809948e-5)


@triton.jit
def _cos_sin_of_turn(turn):
    # turn (int64, units of 2^-64 turn; wraps like the angle) -> cos, sin in fp32
    q = (turn + (1 << 61)) >> 62           # the nearest quarter turn, in [-2, 1] (wrapping)
    f = turn - (q << 62)                   # [-2^61, 2^61]: within 1/8 turn of it
    f_hi = f.to(tl.float32)
    f_lo = (f - f_hi.to(tl.int64)).to(tl.float32)
    # One rounding per multiply-add: explicit fmas, so the interpreter rounds as the GPU does.
    # r_lo is what rounding r left out (r + r_lo is the angle to about 2^-47 of it), w_err
    # what rounding 1 - z/2 left out (exactly): both go into the results instead of being lost.
    t = tl.fma(f_lo, TURN_RAD_HI, f_hi * TURN_RAD_LO)
    r = tl.fma(f_hi, TURN_RAD_HI, t)                    # radians, |r| <= pi/4
    r_lo = tl.fma(f_hi, TURN_RAD_HI, -r) + t
    z = r * r
    w = tl.fma(z, -0.5, 1.0)
    w_err = tl.fma(z, -0.5, 1.0 - w)                    # (1 - z/2) - w
    sin_p = tl.fma(z, tl.fma(z, SIN_3, SIN_2), SIN_1)
    cos_p = tl.fma(z, tl.fma(z, COS_3, COS_2), COS_1)
    sin_r = r + tl.fma(r * z, sin_p, r_lo * w)         # sin(r + r_lo) ~ sin r + r_lo cos r
    cos_r = w + tl.fma(z * z, cos_p, tl.fma(-r, r_lo, w_err))   # ... cos r - r_lo sin r
    q = q & 3                              # angle = r + q pi/2
    c = tl.where(q == 0, cos_r, tl.where(q == 1, -sin_r, tl.where(q == 2, -cos_r, sin_r)))
    s = tl.where(q == 0, sin_r, tl.where(q == 1, cos_r, tl.where(q == 2, -sin_r, -cos_r)))
    return c, s


@triton.jit
def _exact_cos_sin(turns_ptr, pos, j, stride_d, HALF: tl.constexpr, ACCURATE: tl.constexpr,
                   CDT: tl.constexpr):
    # pos [BLOCK_S] positions, j [BLOCK_HALF] pairs -> cos, sin [BLOCK_S, 1, BLOCK_HALF] in CDT
    if CDT == tl.float64:
        return cos_sin(_exact_angle(turns_ptr, pos, j, stride_d, HALF, CDT), ACCURATE)
    else:
        turn, rest = _exact_turn(turns_ptr, pos, j, stride_d, HALF)
        return _cos_sin_of_turn(turn)


@triton.jit
def _exact_angles_kernel(turns_ptr, pos_ptr, out_ptr, N, stride_out,
                         HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # positions [N] -> the angles the finished kernel rotates by, out [N, HALF] fp32 (one
    # program per BLOCK_N positions; for checking _exact_angle against a host reference)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_HALF)
    pos = tl.load(pos_ptr + n, mask=n < N, other=0).to(tl.int32)
    angle = _exact_angle(turns_ptr, pos, j, 1, HALF, tl.float32)      # [BLOCK_N, 1, BLOCK_HALF]
    offs = n[:, None, None] * stride_out + j[None, None, :]
    tl.store(out_ptr + offs, angle, mask=(n < N)[:, None, None] & (j < HALF)[None, None, :])


SEARCH_PIVOTS = tl.constexpr(64)    # cu_seqlens entries the first step of the search loads
# ... where the [tokens, SEARCH_PIVOTS] comparison has at most this many entries. The two-pass
# route's index pass finds 1024 tokens' rows per program: a [1024, 64] tile took it from
# 0.0482 to 0.1076 ms (8192 tokens, H200), where the finished kernel's tiles (at most 16
# tokens; one at decode) gained.
SEARCH_TILE = tl.constexpr(2048)


@triton.jit
def packed_positions(t, cu_ptr, start_ptr, N_SEQ, cp_size, cp_rank, PIVOTS: tl.constexpr):
    # t [BLOCK_S] token indices of a packed batch -> (positions, valid) [BLOCK_S] each.
    # The sequence of token t is the last i with cu_seqlens[i] // cp_size <= t (cu_seqlens are
    # the global lengths, a rank holds 1/cp_size of every sequence). Found in two steps, each
    # a dependent trip to memory: one load of PIVOTS evenly spaced entries narrows it to a run
    # of `stride` sequences (all of them up to PIVOTS sequences: a decode batch), then a binary
    # search of that run; a search of all of them from the start took log2(N_SEQ) + 1 trips.
    # (PIVOTS = 1: the binary search alone, where a [tokens, PIVOTS] tile costs too many
    # registers.)
    span = N_SEQ * 0 + 1
    while span < N_SEQ:
        span *= 2
    if PIVOTS == 1:
        seq = t * 0
        step = span
    else:
        stride = tl.maximum(span // PIVOTS, 1)
        pivot = tl.arange(0, PIVOTS) * stride                       # [PIVOTS]
        in_range = pivot < N_SEQ
        starts = tl.load(cu_ptr + pivot, mask=in_range, other=0).to(tl.int32) // cp_size
        hit = in_range[None, :] & (starts[None, :] <= t[:, None])   # [BLOCK_S, PIVOTS]
        seq = tl.max(tl.where(hit, pivot[None, :], 0), axis=1)     # the last pivot at or below
        step = stride // 2
    while step > 0:
        cand = seq + step
        ok = cand < N_SEQ
        first = tl.load(cu_ptr + cand, mask=ok, other=0).to(tl.int32) // cp_size
        seq = tl.where(ok & (first <= t), cand, seq)
        step = step // 2
    first = tl.load(cu_ptr + seq).to(tl.int32) // cp_size
    length = tl.load(cu_ptr + seq + 1).to(tl.int32) // cp_size - first
    idx = t - first
    valid = (idx >= 0) & (idx < length)
    if cp_size > 1:      # each packed sequence is split over the ranks on its own
        idx = dual_chunk_position(idx, length, cp_size, cp_rank)
    if start_ptr is not None:
        idx, fits = plus_start(idx, tl.load(start_ptr + seq))
        valid = valid & fits
    return idx, valid


@triton.jit
def plus_start(p, start):
    # int32 positions p + start offsets of any integer dtype -> (int32 positions, whether each
    # lies in [0, 2^31 - 1)): added and compared before narrowing, so huge starts cannot wrap
    # back into the table
    q = p.to(tl.int64) + start.to(tl.int64)
    return q.to(tl.int32), (q >= 0) & (q < 2147483647)


@triton.jit
def table_rows(s_idx, b, S, P, position_ids_ptr, stride_ids_b, cu_seqlens_ptr, start_ptr, N_SEQ,
                cp_size, cp_rank):
    # s_idx [BLOCK_S] token indices, b batch entry -> (table rows [BLOCK_S] int32, valid [BLOCK_S]).
    # Positions come from position ids, else from cu_seqlens (packed sequences), else from the
    # token index (with TE's context-parallel split); start offsets add to the last two.
    if position_ids_ptr is not None:
        p = tl.load(position_ids_ptr + b * stride_ids_b + s_idx, mask=s_idx < S, other=0)
        valid = (p >= 0) & (p < P)   # compared before narrowing, so huge ids cannot wrap
        p = p.to(tl.int32)
    elif cu_seqlens_ptr is not None:
        if s_idx.shape[0] * SEARCH_PIVOTS <= SEARCH_TILE:
            p, valid = packed_positions(s_idx, cu_seqlens_ptr, start_ptr, N_SEQ, cp_size,
                                        cp_rank, SEARCH_PIVOTS)
        else:               # (many tokens: the index pass's 1024) the binary search alone
            p, valid = packed_positions(s_idx, cu_seqlens_ptr, start_ptr, N_SEQ, cp_size,
                                        cp_rank, 1)
        valid = valid & (p >= 0) & (p < P)
    else:
        p = s_idx
        if cp_size > 1:
            p = dual_chunk_position(s_idx, S, cp_size, cp_rank)
        if start_ptr is not None:
            p, valid = plus_start(p, tl.load(start_ptr + b))
            valid = valid & (p < P)
        else:
            valid = (p >= 0) & (p < P)
    return tl.minimum(tl.maximum(p, 0), P - 1), valid


@triton.jit
def table_cos_sin(cos_ptr, sin_ptr, rows, valid, b, stride_tab_b, stride_tab_p, d_a, d_b, mask,
                  CDT: tl.constexpr, HALF: tl.constexpr, GUARD: tl.constexpr):
    # rows, valid [BLOCK_S], d_a/d_b [BLOCK_HALF] -> c_a, s_a, c_b, s_b, each
    # [BLOCK_S, 1, BLOCK_HALF]. A table (common.load_table), or no table at all: int64 turns [R]
    # in cos_ptr and the amplitude [1] in sin_ptr, and rows are then the positions themselves.
    # A row whose position is outside the table (not valid) gets cos = NaN, so every output of
    # it is NaN (each is one fma with a cosine), never a silently clamped row. The select is
    # made here, once per (token, pair) of the tile and reused by its heads and batch entries:
    # made on the outputs instead, it cost a select per element and, on 16-bit outputs, byte
    # permutes around it (the compiler selected the rounded halves: unpack, select, repack).
    # GUARD False leaves the cosines as they are: the caller selects on `valid` itself (the
    # QKV projection's dW, whose GEMM prologue holds fewer registers so).
    if cos_ptr.dtype.element_ty == tl.int64:
        j = tl.arange(0, d_a.shape[0])
        c, s = _exact_cos_sin(cos_ptr, rows, j, 1, HALF, ACCURATE, CDT)
        amp = tl.load(sin_ptr).to(CDT)
        c_a = c * amp
        s_a = s * amp
        c_b = c_a
        s_b = s_a
    else:
        c_a, s_a, c_b, s_b = load_table(cos_ptr, sin_ptr, rows, b, stride_tab_b, stride_tab_p, 1,
                                        d_a, d_b, mask, CDT)
    if GUARD:
        c_a = nan_unless(valid[:, None, None], c_a)
        c_b = nan_unless(valid[:, None, None], c_b)
    return c_a, s_a, c_b, s_b


@triton.jit
def _rope_heads(
    x_ptr, y_ptr,                       # this segment's input and output (the same when in place)
    cos_ptr, sin_ptr,                   # its table (see table_cos_sin)
    position_ids_ptr, cu_seqlens_ptr, start_ptr,   # where positions come from (table_rows)
    pid_s, h0, b_lo, b_hi,              # tile origin: token block, first head, batch range
    S, H, P, N_SEQ, cp_size, cp_rank,   # tokens, heads of this segment, table rows, sequences
    stride_x_s, stride_x_b, stride_x_g, stride_x_h, stride_x_d,  # head h at (h//HPG)*g + (h%HPG)*h
    stride_y_s, stride_y_b, stride_y_g, stride_y_h,              # (the output's features: stride 1)
    stride_tab_b, stride_tab_p,         # (the table's features: stride 1)
    stride_ids_b,                       # (position ids: [B or 1, S], contiguous)
    R: tl.constexpr, D: tl.constexpr,   # rotary dim (even), head dim
    HPG: tl.constexpr,                  # heads per group: > 1 for the q of a packed QKV
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    PER_ENTRY: tl.constexpr,            # positions or table rows depend on the batch entry
    X_FIRST: tl.constexpr,              # 0, or the batch entries a program takes (fewer than
                                        # BATCH_LOOP_MIN): x loaded before the table work
    COPY_PASS: tl.constexpr,            # write features R..D-1 (False when in place)
    CDT: tl.constexpr, INT64: tl.constexpr,
):
    HALF: tl.constexpr = R // 2
    BLOCK_HALF: tl.constexpr = tile_width(HALF)      # tiles of pairs, and of features R..D-1
    BLOCK_PASS: tl.constexpr = tile_width(D - R)     # (0 when the whole head rotates)
    s_idx, s_off, h_idx, d_a, d_b, row_ok, m, tab_mask = head_tile(
        pid_s, h0, S, H, BLOCK_S, BLOCK_H, BLOCK_HALF, HALF, INTERLEAVED, INT64)
    x_rows = s_off[:, None] * stride_x_s + (h_idx // HPG)[None, :] * stride_x_g \
        + (h_idx % HPG)[None, :] * stride_x_h                 # [BLOCK_S, BLOCK_H]
    y_rows = s_off[:, None] * stride_y_s + (h_idx // HPG)[None, :] * stride_y_g \
        + (h_idx % HPG)[None, :] * stride_y_h

    # X_FIRST (the planner's choice: programs that loop over fewer than BATCH_LOOP_MIN batch
    # entries, decode's among them): each entry's x is loaded before the table work it waits
    # for (the rows' positions, their cos/sin, sin/cos from angles), so the two are in flight
    # together, one trip to memory where x after the table was two. Measured on an H200 (bf16,
    # forward, ratio to a copy, the finished kernel forced, medians of three;
    # benchmarks/results/finished_kernel_knobs-*.csv): with x first on every tile, thd
    # 8 x 1024 0.822 -> 0.946, bshd s2048 b2 0.868 -> 0.910, sbhd s4096 b1 0.892 -> 0.931,
    # s8192 b2 0.899 -> 0.917, decode 0.65 -> 0.72; but programs looping over 8 entries lost
    # (sbhd s1024 b8 0.835 -> 0.804), where the peeled first entry's x is held through the
    # table work (s4096 b8 forced: 89.6 -> 87.0 % of a copy in the ladder,
    # ladder-nvidia-h200-20261129-1221-x-first-every-tile.csv against f377518's run).
    if PER_ENTRY:                       # positions or tables differ per batch entry
        for b in range(b_lo, b_hi):
            bb = offset_int(b, INT64)   # the batch entry, in int64 when offsets need it
            if X_FIRST:
                x_a, x_b, t = _load_entry(x_ptr, x_rows, bb, stride_x_b, stride_x_d, d_a, d_b,
                                          row_ok, m, R, D, BLOCK_HALF, BLOCK_PASS, INTERLEAVED,
                                          COPY_PASS)
            rows, valid = table_rows(s_idx, bb, S, P, position_ids_ptr, stride_ids_b,
                                      cu_seqlens_ptr, start_ptr, N_SEQ, cp_size, cp_rank)
            c_a, s_a, c_b, s_b = table_cos_sin(cos_ptr, sin_ptr, rows, valid, bb, stride_tab_b,
                                               stride_tab_p, d_a, d_b, tab_mask, CDT, HALF, True)
            if BACKWARD:
                s_a, s_b = -s_b, -s_a
            if not X_FIRST:
                x_a, x_b, t = _load_entry(x_ptr, x_rows, bb, stride_x_b, stride_x_d, d_a, d_b,
                                          row_ok, m, R, D, BLOCK_HALF, BLOCK_PASS, INTERLEAVED,
                                          COPY_PASS)
            _rotate_entry(y_ptr, y_rows, bb, stride_y_b, x_a, x_b, t, c_a, s_a, c_b, s_b,
                          d_a, d_b, row_ok, m, R, D, BLOCK_HALF, BLOCK_PASS,
                          INTERLEAVED, COPY_PASS, CDT)
    else:                               # one table for the chunk, reused by every entry
        b_first = b_lo
        if X_FIRST:                     # the first entry is peeled: its x before the table
            b_first = b_lo + 1
            x_a, x_b, t = _load_entry(x_ptr, x_rows, offset_int(b_lo, INT64), stride_x_b,
                                      stride_x_d, d_a, d_b, row_ok, m, R, D, BLOCK_HALF,
                                      BLOCK_PASS, INTERLEAVED, COPY_PASS)
        rows, valid = table_rows(s_idx, 0, S, P, position_ids_ptr, stride_ids_b,
                                  cu_seqlens_ptr, start_ptr, N_SEQ, cp_size, cp_rank)
        c_a, s_a, c_b, s_b = table_cos_sin(cos_ptr, sin_ptr, rows, valid, 0, stride_tab_b,
                                           stride_tab_p, d_a, d_b, tab_mask, CDT, HALF, True)
        if BACKWARD:
            s_a, s_b = -s_b, -s_a
        if X_FIRST:
            _rotate_entry(y_ptr, y_rows, offset_int(b_lo, INT64), stride_y_b, x_a, x_b, t,
                          c_a, s_a, c_b, s_b, d_a, d_b, row_ok, m, R, D, BLOCK_HALF,
                          BLOCK_PASS, INTERLEAVED, COPY_PASS, CDT)
        for b in range(b_first, b_hi):
            bb = offset_int(b, INT64)
            x_a, x_b, t = _load_entry(x_ptr, x_rows, bb, stride_x_b, stride_x_d, d_a, d_b,
                                      row_ok, m, R, D, BLOCK_HALF, BLOCK_PASS, INTERLEAVED,
                                      COPY_PASS)
            _rotate_entry(y_ptr, y_rows, bb, stride_y_b, x_a, x_b, t, c_a, s_a, c_b, s_b,
                          d_a, d_b, row_ok, m, R, D, BLOCK_HALF, BLOCK_PASS,
                          INTERLEAVED, COPY_PASS, CDT)


@triton.jit
def _load_entry(x_ptr, x_rows, bb, stride_x_b, stride_x_d, d_a, d_b, row_ok, m,
                R: tl.constexpr, D: tl.constexpr, BLOCK_HALF: tl.constexpr,
                BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_PASS: tl.constexpr):
    # Batch entry bb of the tile's rows x_rows [BLOCK_S, BLOCK_H] -> its pairs' members x_a,
    # x_b [BLOCK_S, BLOCK_H, BLOCK_HALF] as stored, and t, its features R..D-1 (the copy pass;
    # x_a where there are none to copy).
    xr = x_ptr + (x_rows + bb * stride_x_b)[:, :, None]    # [BLOCK_S, BLOCK_H, 1]
    if INTERLEAVED:
        k = tl.arange(0, 2 * BLOCK_HALF)
        mk = row_ok[:, :, None] & (k < R)[None, None, :]
        x = tl.load(xr + k[None, None, :] * stride_x_d, mask=mk, other=0.0)
        x = tl.reshape(x, (x.shape[0], x.shape[1], BLOCK_HALF, 2))
        x_a, x_b = tl.split(x)
    else:
        x_a = tl.load(xr + d_a[None, None, :] * stride_x_d, mask=m, other=0.0)
        x_b = tl.load(xr + d_b[None, None, :] * stride_x_d, mask=m, other=0.0)
    t = x_a
    if COPY_PASS:
        if BLOCK_PASS > 0:
            e = R + tl.arange(0, BLOCK_PASS)
            mp = row_ok[:, :, None] & (e < D)[None, None, :]
            t = tl.load(xr + e[None, None, :] * stride_x_d, mask=mp)
    return x_a, x_b, t


@triton.jit
def _rotate_entry(y_ptr, y_rows, bb, stride_y_b, x_a, x_b, t, c_a, s_a, c_b, s_b,
                  d_a, d_b, row_ok, m, R: tl.constexpr, D: tl.constexpr,
                  BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
                  COPY_PASS: tl.constexpr, CDT: tl.constexpr):
    # Rotate one batch entry's pairs (loaded by _load_entry) by the tile's cos/sin and store
    # them, and its features R..D-1 (t), at the output rows y_rows + bb * stride_y_b.
    yr = y_ptr + (y_rows + bb * stride_y_b)[:, :, None]
    y_a, y_b = rotate_pair(x_a.to(CDT), x_b.to(CDT), c_a, s_a, c_b, s_b)
    y_a = round_to(y_a, y_ptr.dtype.element_ty, ROUND_BF16_RTNE)
    y_b = round_to(y_b, y_ptr.dtype.element_ty, ROUND_BF16_RTNE)
    if INTERLEAVED:
        k = tl.arange(0, 2 * BLOCK_HALF)
        mk = row_ok[:, :, None] & (k < R)[None, None, :]
        y = tl.reshape(tl.join(y_a, y_b), (y_a.shape[0], y_a.shape[1], 2 * BLOCK_HALF))
        tl.store(yr + k[None, None, :], y, mask=mk)
    else:
        tl.store(yr + d_a[None, None, :], y_a, mask=m)
        tl.store(yr + d_b[None, None, :], y_b, mask=m)
    if COPY_PASS:
        if BLOCK_PASS > 0:
            e = R + tl.arange(0, BLOCK_PASS)
            mp = row_ok[:, :, None] & (e < D)[None, None, :]
            tl.store(yr + e[None, None, :], t, mask=mp)


@triton.jit
def _rope_q_or_k(
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, cos_ptr, sin_ptr,
    position_ids_ptr, cu_seqlens_ptr, start_ptr,
    S, B, HQ, HK, P, N_SEQ, cp_size, cp_rank,
    stride_q_s, stride_q_b, stride_q_h, stride_q_d,
    stride_k_s, stride_k_b, stride_k_h, stride_k_d,
    stride_tab_b, stride_tab_p, stride_ids_b,
    R: tl.constexpr, D: tl.constexpr, OUT_LAYOUT: tl.constexpr, OUT_ROW: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, PER_ENTRY: tl.constexpr,
    X_FIRST: tl.constexpr, INT64: tl.constexpr,
):
    # The program's tile of q's heads or of k's (grid axis 1: q's head blocks, then k's). In
    # place (q_out_ptr None) the output is the input; otherwise a tensor in OUT_LAYOUT whose
    # strides follow from its shape: contiguous (OUT_ROW 0), or token rows OUT_ROW elements
    # apart (column slices of one token-major buffer, common.contiguous_strides).
    # fp64 math when q or its output (Hugging Face promotes with cos) is fp64, else fp32
    if q_out_ptr is None:
        CDT: tl.constexpr = tl.float64 if q_ptr.dtype.element_ty == tl.float64 else tl.float32
    else:
        CDT: tl.constexpr = tl.float64 if (q_ptr.dtype.element_ty == tl.float64
                                           or q_out_ptr.dtype.element_ty == tl.float64) \
            else tl.float32
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    b_lo, b_hi = batch_range(B, X_FIRST)
    q_blocks = tl.cdiv(HQ, BLOCK_H)
    if pid_h < q_blocks:
        if q_out_ptr is None:       # in place: the output is the input
            q_y = q_ptr
            qy_s, qy_b, qy_h = stride_q_s, stride_q_b, stride_q_h
        else:
            q_y = q_out_ptr
            qy_s, qy_b, qy_h = contiguous_strides(S, B, HQ, D, OUT_LAYOUT, INT64, OUT_ROW)
        _rope_heads(q_ptr, q_y, cos_ptr, sin_ptr, position_ids_ptr, cu_seqlens_ptr, start_ptr,
                    pid_s, pid_h * BLOCK_H, b_lo, b_hi, S, HQ, P, N_SEQ, cp_size, cp_rank,
                    stride_q_s, stride_q_b, stride_q_h, 0, stride_q_d, qy_s, qy_b, qy_h, 0,
                    stride_tab_b, stride_tab_p, stride_ids_b, R, D, 1, BLOCK_S, BLOCK_H,
                    INTERLEAVED, BACKWARD, PER_ENTRY, X_FIRST, q_out_ptr is not None, CDT,
                    INT64)
    elif k_ptr is not None:     # (without k the grid has q's blocks only)
        if k_out_ptr is None:
            k_y = k_ptr
            ky_s, ky_b, ky_h = stride_k_s, stride_k_b, stride_k_h
        else:
            k_y = k_out_ptr
            ky_s, ky_b, ky_h = contiguous_strides(S, B, HK, D, OUT_LAYOUT, INT64, OUT_ROW)
        _rope_heads(k_ptr, k_y, cos_ptr, sin_ptr, position_ids_ptr, cu_seqlens_ptr, start_ptr,
                    pid_s, (pid_h - q_blocks) * BLOCK_H, b_lo, b_hi, S, HK, P, N_SEQ, cp_size,
                    cp_rank, stride_k_s, stride_k_b, stride_k_h, 0, stride_k_d, ky_s, ky_b, ky_h,
                    0, stride_tab_b, stride_tab_p, stride_ids_b, R, D, 1, BLOCK_S, BLOCK_H,
                    INTERLEAVED, BACKWARD, PER_ENTRY, X_FIRST, k_out_ptr is not None, CDT,
                    INT64)


# --- the entry points: one per source of positions, each at most 34 arguments ----------------
# Common to all: q (and k, None without it) with their outputs (None in place: written where
# they are read); a table cos_ptr/sin_ptr as table_cos_sin reads it; features are contiguous in
# every output and table (stride 1), and q's and k's feature strides are arguments.

@triton.jit
def _rope_kernel(
    q_ptr, q_out_ptr, k_ptr, k_out_ptr,  # q [S, B, HQ, D] and k [S, B, HK, D] as strided views
    cos_ptr, sin_ptr,                    # the table [P, R] (or [B, P, R] with TABLE_PER_ENTRY)
    start_ptr,                           # [B] start offsets, or None
    S, B, HQ, HK, P,                     # tokens, batch, heads of q and of k, table rows
    cp_size, cp_rank,                    # context parallelism (TE's dual-chunk split)
    stride_q_s, stride_q_b, stride_q_h, stride_q_d,
    stride_k_s, stride_k_b, stride_k_h, stride_k_d,
    stride_tab_p,                        # the table's row stride (a batch of tables is dense)
    R: tl.constexpr, D: tl.constexpr,    # rotary dim, head dim
    OUT_LAYOUT: tl.constexpr,            # the outputs' layout (see common.contiguous_strides)
    OUT_ROW: tl.constexpr,               # 0, or the outputs' token row stride (a column slice)
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    TABLE_PER_ENTRY: tl.constexpr,       # one table per batch entry (Hugging Face's [B, S, R])
    X_FIRST: tl.constexpr,               # 0, or a short chunk's entries: x first (launch.plan)
    INT64: tl.constexpr,
):
    # Positions: the token index (with TE's dual-chunk map when cp_size > 1), plus start offsets.
    PER_ENTRY: tl.constexpr = TABLE_PER_ENTRY or start_ptr is not None
    stride_tab_b = (tl.full([], 0, tl.int64) + P) * stride_tab_p if TABLE_PER_ENTRY else 0
    _rope_q_or_k(q_ptr, q_out_ptr, k_ptr, k_out_ptr, cos_ptr, sin_ptr, None, None, start_ptr,
                 S, B, HQ, HK, P, 0, cp_size, cp_rank,
                 stride_q_s, stride_q_b, stride_q_h, stride_q_d,
                 stride_k_s, stride_k_b, stride_k_h, stride_k_d,
                 stride_tab_b, stride_tab_p, 0, R, D, OUT_LAYOUT, OUT_ROW, BLOCK_S, BLOCK_H,
                 INTERLEAVED, BACKWARD, PER_ENTRY, X_FIRST, INT64)


@triton.jit
def _rope_ids_kernel(
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, cos_ptr, sin_ptr,
    position_ids_ptr,                    # [B or 1, S] position ids, contiguous
    S, B, HQ, HK, P,
    stride_q_s, stride_q_b, stride_q_h, stride_q_d,
    stride_k_s, stride_k_b, stride_k_h, stride_k_d,
    stride_tab_p,
    R: tl.constexpr, D: tl.constexpr, OUT_LAYOUT: tl.constexpr, OUT_ROW: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    TABLE_PER_ENTRY: tl.constexpr,
    IDS_PER_ENTRY: tl.constexpr,         # position ids [B, S] (else [1, S], shared)
    X_FIRST: tl.constexpr, INT64: tl.constexpr,
):
    # Positions: explicit position ids.
    PER_ENTRY: tl.constexpr = TABLE_PER_ENTRY or IDS_PER_ENTRY
    stride_tab_b = (tl.full([], 0, tl.int64) + P) * stride_tab_p if TABLE_PER_ENTRY else 0
    stride_ids_b = S if IDS_PER_ENTRY else 0
    _rope_q_or_k(q_ptr, q_out_ptr, k_ptr, k_out_ptr, cos_ptr, sin_ptr, position_ids_ptr, None,
                 None, S, B, HQ, HK, P, 0, 1, 0,
                 stride_q_s, stride_q_b, stride_q_h, stride_q_d,
                 stride_k_s, stride_k_b, stride_k_h, stride_k_d,
                 stride_tab_b, stride_tab_p, stride_ids_b, R, D, OUT_LAYOUT, OUT_ROW, BLOCK_S,
                 BLOCK_H, INTERLEAVED, BACKWARD, PER_ENTRY, X_FIRST, INT64)


@triton.jit
def _rope_packed_kernel(
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, cos_ptr, sin_ptr,
    cu_seqlens_ptr,                      # [N_SEQ + 1] the packed sequences' global offsets
    start_ptr,                           # [N_SEQ] start offsets, or None
    T, HQ, HK, P, N_SEQ,                 # tokens (all sequences), heads, table rows, sequences
    cp_size, cp_rank,
    stride_q_t, stride_q_h, stride_q_d,  # q [T, HQ, D], k [T, HK, D]
    stride_k_t, stride_k_h, stride_k_d,
    stride_tab_p,
    R: tl.constexpr, D: tl.constexpr,
    OUT_ROW: tl.constexpr,               # 0, or the outputs' token row stride (a column slice)
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, INT64: tl.constexpr,
):
    # Positions: packed sequences (thd), found by a search of the token in cu_seqlens. One batch
    # entry (X_FIRST = 1): x is loaded before the table work.
    _rope_q_or_k(q_ptr, q_out_ptr, k_ptr, k_out_ptr, cos_ptr, sin_ptr, None, cu_seqlens_ptr,
                 start_ptr, T, 1, HQ, HK, P, N_SEQ, cp_size, cp_rank,
                 stride_q_t, 0, stride_q_h, stride_q_d, stride_k_t, 0, stride_k_h, stride_k_d,
                 0, stride_tab_p, 0, R, D, 0, OUT_ROW, BLOCK_S, BLOCK_H, INTERLEAVED, BACKWARD,
                 False, 1, INT64)


@triton.jit
def _rope_qkv_kernel(
    qkv_ptr,                             # packed [S, B, G, (HPG + 2) * D]: q, k, v of each group
    q_ptr, k_ptr,                        # q [S, B, G * HPG, D], k [S, B, G, D]
    q_cos_ptr, k_cos_ptr,                # angles [P, R] of q and of k
    start_ptr,                           # [B] start offsets, or None
    S, B, G, P, cp_size, cp_rank,
    stride_qkv_s, stride_qkv_b, stride_qkv_g,
    stride_q_s, stride_q_b, stride_q_h, stride_q_d,
    stride_k_s, stride_k_b, stride_k_h, stride_k_d,
    stride_tab_p,
    R: tl.constexpr, D: tl.constexpr,
    HPG: tl.constexpr,                   # query heads per group
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr,              # False: packed -> q, k; True: gradients q, k -> packed
    X_FIRST: tl.constexpr, INT64: tl.constexpr,
):
    # Transformer Engine's packed QKV. Forward reads q and k out of the packed tensor and writes
    # them rotated into their own tensors; backward reads the gradients of q and k and writes
    # them rotated back into the packed gradient (v is copied outside the kernel). In the packed
    # tensor, q head h of a group lies at (h // HPG) * stride_g + (h % HPG) * D, and k at HPG * D.
    CDT: tl.constexpr = tl.float64 if qkv_ptr.dtype.element_ty == tl.float64 else tl.float32
    PER_ENTRY: tl.constexpr = start_ptr is not None
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    b_lo, b_hi = batch_range(B, X_FIRST)
    q_blocks = tl.cdiv(G * HPG, BLOCK_H)
    if pid_h < q_blocks:
        if BACKWARD:
            _rope_heads(q_ptr, qkv_ptr, q_cos_ptr, None, None, None, start_ptr, pid_s,
                        pid_h * BLOCK_H, b_lo, b_hi, S, G * HPG, P, 0, cp_size, cp_rank,
                        stride_q_s, stride_q_b, HPG * stride_q_h, stride_q_h, stride_q_d,
                        stride_qkv_s, stride_qkv_b, stride_qkv_g, D,
                        0, stride_tab_p, 0, R, D, HPG, BLOCK_S, BLOCK_H, INTERLEAVED, True,
                        PER_ENTRY, X_FIRST, True, CDT, INT64)
        else:
            _rope_heads(qkv_ptr, q_ptr, q_cos_ptr, None, None, None, start_ptr, pid_s,
                        pid_h * BLOCK_H, b_lo, b_hi, S, G * HPG, P, 0, cp_size, cp_rank,
                        stride_qkv_s, stride_qkv_b, stride_qkv_g, D, 1,
                        stride_q_s, stride_q_b, HPG * stride_q_h, stride_q_h,
                        0, stride_tab_p, 0, R, D, HPG, BLOCK_S, BLOCK_H, INTERLEAVED, False,
                        PER_ENTRY, X_FIRST, True, CDT, INT64)
    else:
        h0 = (pid_h - q_blocks) * BLOCK_H
        if BACKWARD:
            _rope_heads(k_ptr, qkv_ptr + HPG * D, k_cos_ptr, None, None, None, start_ptr, pid_s,
                        h0, b_lo, b_hi, S, G, P, 0, cp_size, cp_rank,
                        stride_k_s, stride_k_b, stride_k_h, 0, stride_k_d,
                        stride_qkv_s, stride_qkv_b, stride_qkv_g, 0,
                        0, stride_tab_p, 0, R, D, 1, BLOCK_S, BLOCK_H, INTERLEAVED, True,
                        PER_ENTRY, X_FIRST, True, CDT, INT64)
        else:
            _rope_heads(qkv_ptr + HPG * D, k_ptr, k_cos_ptr, None, None, None, start_ptr, pid_s,
                        h0, b_lo, b_hi, S, G, P, 0, cp_size, cp_rank,
                        stride_qkv_s, stride_qkv_b, stride_qkv_g, 0, 1,
                        stride_k_s, stride_k_b, stride_k_h, 0,
                        0, stride_tab_p, 0, R, D, 1, BLOCK_S, BLOCK_H, INTERLEAVED, False,
                        PER_ENTRY, X_FIRST, True, CDT, INT64)
