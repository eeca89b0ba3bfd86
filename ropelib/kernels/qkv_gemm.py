"""RoPE fused into the QKV projection: one Triton GEMM whose epilogue (QK-RMSNorms and) rotates q
and k while the tile is in registers, and two backward GEMMs whose prologue undoes it.

Every RoPE kernel reads q and k and writes them back: a copy of q and k on top of the
projection. Here the projection's output tile is normed and rotated before it is ever stored,
and in the backward the gradient of the projection (dQKV) is formed tile by tile in registers
from the gradients of the rotated outputs and never written to memory.

    forward   Y = X W^T + b                         X [M, K], W [N, K], N = (HQ + 2 HK) D
              per q or k head and token:  r = 1 / sqrt(mean_d Y_d^2 + eps)   (with norm weights)
                                          u = Y r w        (u = Y without them)
                                          q or k = rot(theta) u on features 0..R-1, u past R
              v = Y                                   (stored unrotated)
    backward  gu = rot(-theta) gy                     gy the gradient of q (or k), gv of v
              dY = r (gu w - n mean_d(gu w n)),  n = Y r   (dY = gu without the norm)
              dX = dY W          dW = dY^T X          db = sum over tokens of dY
              dw = sum over tokens and heads of gu n      (w_q over q's heads, w_k over k's)

M = B S tokens (x [B, S, K] as [M, K]; packed sequences [T, K] are M = T, B = 1), K the hidden
size, HQ and HK the query and key/value heads, D the head dim, R the rotary dim (even, R <= D).
The weight is a fused nn.Linear's [N, K]: q's HQ D rows, then k's HK D, then v's HK D.

How a tile covers a head
------------------------
A program's column tile is one whole head (BLOCK_N = D). When every feature is rotated and the
half D/2 is a power of two (ONE_ACC: Llama's and Qwen's heads of 64 or 128), the head's D weight
rows are one operand and one accumulator [BLOCK_M, D] (one MMA per K step, as a plain GEMM
tile), and the epilogue splits it into the two members of every pair:

    rotate-half   acc [BLOCK_M, D] -> [BLOCK_M, 2, D/2] -> [BLOCK_M, D/2, 2] -> split: a, b
    interleaved   acc [BLOCK_M, D] -> [BLOCK_M, D/2, 2]                      -> split: a, b

so a and b sit at the same row and column of two tiles of the same register layout, and the
rotation is elementwise (common.rotate_pair, the same fma order as every ropelib kernel).
The split may move the accumulator between register layouts; measured on an H200
(benchmarks/qkv_mainloop_probe.py, results/qkv_mainloop-nvidia-h200.csv, 8192 and 32768 tokens,
Llama-3-8B's projection, four tiles), a whole-head accumulator rotated this way from a cos/sin
table costs 0.1-5.5 % over the same GEMM with no epilogue at the 3-stage tiles (128/64 and
128/128, 8 warps; 0.1 % at 128/64, 8192 tokens); at 4 stages the bare GEMM itself ran 19-23 %
slower than at 3, which made the epilogue look up to 17 % faster there. Two accumulators
[BLOCK_M, D/2] (the pairs' weight rows gathered, one MMA each, the x tile read twice) take
4-30 % longer in seven of the eight cases (8 and 10 % at GPU_TILES["fwd"]) and 5 % less in one
(64/64, 4 warps, 32768 tokens).

With partial rotary or a half that is not a power of two the pairs' weight rows are gathered
into two accumulators (three with partial rotary):

    acc_a [BLOCK_M, R/2]  <- weight rows d_a = j        (interleaved: 2j)       j < R/2
    acc_b [BLOCK_M, R/2]  <- weight rows d_b = j + R/2  (interleaved: 2j + 1)
    acc_p [BLOCK_M, D-R]  <- weight rows R..D-1, passed through unrotated

(each padded to 16, the narrowest tl.dot). Permuting the weight's rows once (pairs adjacent)
would make ropelib own a reordered copy of the caller's nn.Linear weight and hand its gradient
back in that order; neither layout needs it. A whole head in one program also gives the RMS norm
its row statistics without a second pass or atomics. The halves are stored apart (two stores
of D/2 contiguous features; interleaved: of every other feature, which the L2 merges).

How it is parallelised
----------------------
forward  _qkv_rope_fwd_kernel   one program per (BLOCK_M tokens, head): cdiv(M, BLOCK_M) x
         (HQ + 2 HK) programs on one axis, GROUP_M token tiles at a time over every head (the
         grouped order of Triton's matmul tutorial, so a few token tiles of x stay in L2 while
         every head's weight streams past). The K loop accumulates in fp32; the epilogue adds
         the bias, and for a q or k head loads its tokens' cos and sin rows (below), norms,
         rotates, rounds once and stores into q, k or v in the output layout (bshd [B, S, H, D]
         or bhsd [B, H, S, D]).
forward, _qkv_rope_fwd_tma_kernel   on a GPU with TMA (Hopper and newer), where both head counts
on TMA   are even and the head is one accumulator (uses_tma): a persistent grid, one program
         per SM, each walking the (BLOCK_M tokens, two heads) tiles in the same grouped order;
         x's and W's tiles arrive by TMA (descriptors made in the kernel from the pointers, so
         it launches like every other ropelib kernel, eagerly, under torch.compile and in CUDA
         graphs); the two heads of a tile share one load of their tokens' cos and sin rows,
         and the epilogue is the same (_store_qk_head, _store_v_head). How many tiles of the
         cos/sin rows the epilogue holds at once decides its speed: the four rows below (each
         member of a pair its own cos and sin) held for two heads took it to 255 registers and
         288 bytes of spill a thread (sm_90, Triton 3.6); one cos and one sin a pair, 253 and
         none. With table-free angles, whose pairs always share an angle, it reads two tiles
         (SHARED_ANGLE). From an angle table it branches on the pre-pass's flag
         (pairs_differ_ptr: 0 where every pair's members share cos and sin, as in Hugging
         Face's and TE's tables), read once per program before its first tile, the tile loop
         compiled once per branch (_tma_tiles): two tiles for both heads, or else each
         member's cos and sin read just before that member is rotated and stored (IN_TURN), so
         that two tiles are live at a time in either branch: 249 registers, no spill (holding
         four at once in that branch, it had spilled 232 bytes; reading the flag in every tile,
         250); with QK-norm 255 registers and 16 bytes of stack (32 with the flag read in every
         tile). Measured on an H200
         (benchmarks/qkv_forward_ab.py, Llama-3-8B's projection, bf16, 7 rounds, 8192 / 32768
         tokens; of cuBLAS's speed): angles 0.91-0.93 / 0.95-0.97 (0.90-0.92 / 0.94-0.95 with
         QK-norm), an angle table 0.92 / 0.97 (0.91 / 0.96), each member's own rows in turn
         0.87 / 0.91-0.93; cuBLAS then ropelib's RoPE 0.92-0.93 / 0.94-0.95 (0.92 /
         0.93), the kernel above 0.70-0.76. Two later runs put angles at 0.92 / 0.92-0.93,
         this kernel with ROTATE=False at 0.87-0.88 / 0.93-0.94, and the angle table behind
         angles (0.85-0.87 / 0.82-0.85) with the flag 0; timed side by side the two calls
         came out within 2 % (benchmarks/qkv_table_flag_probe.py); back to back under
         torch.profiler the table's kernel took 10-15 % longer at 32768 tokens while it read the
         flag in every tile, 1.6 % longer once it read it once per program, yet the rounds
         still put the table 9 % behind angles at 32768 tokens (0.85 against 0.93). That lag
         goes with the rounds' fixed order, where the table always runs right after the
         in-turn variant (a cause not found: the first fixed run had it level): in two runs
         with a new order every round the table was level with angles (0.95 / 0.97-0.98
         against 0.95 / 0.97), in two fixed-order runs beside them behind (0.84 / 0.86
         against 0.93 / 0.89 in the one whose 8192 rows came back).
         One head a tile (128 tokens) spilled 16 bytes and ran slower than the kernel above
         (0.70 against 0.74): odd head counts keep that one.
dX       _qkv_rope_dx_kernel    one program per (BLOCK_M tokens, BLOCK_K hidden columns),
         grouped: it reads its tokens' cos and sin rows once, then loops over every head (q's, k's,
         v's): forms that head's dY tile [BLOCK_M, D] from gq/gk/gv (and the saved norm
         inputs), rounds it to the weight's dtype and multiplies it into W[head rows, columns].
dW, db   _qkv_rope_dw_kernel    one program per (head, BLOCK_K hidden columns), grouped: it
         loops over all M tokens in steps of BLOCK_M, forms the head's dY tile the same way and
         accumulates dY^T X into [D, BLOCK_K]. The programs of the first column block also sum
         dY over the tokens (the bias gradient, fp32) and gu n (the norm weights' gradient, one
         fp32 [D] row per head); the host adds up the q heads' rows and the k heads' rows: the
         norm-weight gradients are done in this kernel, with a [HQ + HK, D] sum on the host.

These two kernels are qkv_rope_linear's backward="prologue" (its default, "dy", writes dY once
through ropelib's RoPE and hands dX and dW to cuBLAS: ropelib/qkv_linear.py; on an H200 the
prologues took 2.7 times as long). dY is never written: each backward program forms the tiles
it needs. The price is that the
prologue (loads of gy, the inverse rotation, the norm's backward) is repeated by every program
along the other GEMM dimension: K / BLOCK_K times (hidden 4096 / 128: 32 times) in each of dX
and dW, against once if dY were written and read back. It is elementwise work beside BLOCK_K
multiply-adds per element on the tensor cores, and it does not hide behind them: on an H100
(results/qkv_tiles-nvidia-h100-80gb-hbm3.csv, 8192 tokens, hidden 4096) dW takes 4.7 ms with the
prologue against 1.3 ms without it, dX 1.3 against 0.70 ms.

A constexpr ROTATE=False turns all three kernels into the same GEMMs without the norm and the
rotation (a plain projection into q, k, v heads, and its backward): the baseline that
benchmarks/qkv_rope_bench.py measures the epilogue and the prologues against.

With norm weights, the backward needs each q and k head's input to the norm (n = Y r). The
forward then also writes Y's q and k columns (before the norm, in x's dtype) and r (fp32, one per
token and head), only when a gradient will be asked for; without norm weights nothing beyond
x, W and the positions is kept.

Positions: the token index s (x [B, S, K]), explicit position ids [B or 1, S], or, for packed
sequences, the token's index in its sequence (a binary search of cu_seqlens). The forward
evaluates no sin or cos: before it, the two-pass route's pre-pass (flat._cos_sin_rows_kernel,
launch.plan_cos_sin_rows) writes every token's fp32 cos and signed sine rows [NB * S, R] (NB = B
with per-entry position ids, else 1) from the table and the positions, with the same functions
the kernels use, so the same bits, and the epilogue reads them (from L2: every head of a token
tile reads the same rows). Evaluating them in the epilogue had held the forward at 254 registers
(sm_90, Triton 3.6; 226 reading rows) and cost it a quarter of its bare GEMM's time on an H200
(benchmarks/NOTES.md). dX reads the same rows, written again by the backward (once per
program, before its loop over heads: 1.73 ms at its tile, 8192 tokens, H200, where the
kernel evaluating them had taken 1.92 in an earlier sweep whose bare GEMM timed the same).
dW evaluates sin and cos itself, in every step of its loop over tokens: rows read there
instead are 4 x BLOCK_M x R/2 fp32 values a step (32 KiB at its tile, four times the gradient
tile's bytes), which the loop pipelines through shared memory, and dW took 7.6-9.1 ms against
4.8 evaluating (H200, the same comparison). A position outside the table makes
its q and k rows NaN, forward and backward (as in every ropelib kernel). Math is
fp32 (tl.dot accumulates fp32; fp32 inputs multiply in full fp32, not TF32) with one rounding
at each store; the backward rounds dY to the weight's dtype once, as the MMA operand, where the
unfused pipeline rounds it once when it writes it.
"""

import torch
import triton
import triton.language as tl

from ..conventions import QKV_LINEAR_MAX_HEAD_DIM
from ..runtime import INTERPRET
from .common import (ROUND_BF16_RTNE, contiguous_strides, pair_features, rotate_pair, rotated_a,
                     rotated_b, round_to, tile_width)
from .fused import table_cos_sin, packed_positions
from .direct import DirectLauncher
from .planning import Launch, cdiv, start
from .tiles import hopper_or_newer, multiprocessors

# --- tiles ---------------------------------------------------------------------------------
# Launches planned from these tables (and from every other setting here) are kept between eager
# calls in ropelib.eager.SIGNATURES (qkv_plan.planned): code that changes one, a probe's
# variant or a test's patch, calls eager.SIGNATURES.clear() for the next call to plan again.

# The fastest rotating tile of each kernel in benchmarks/qkv_tiles.py's sweep (8192 tokens,
# hidden 4096, 32/8 heads of 128, bf16), the same on an H100 and an H200
# (results/qkv_tiles-<gpu>.csv): forward 0.830 ms (H100); dX the fastest of the tiles that also
# fit QK-norm's shared memory (128 x 128 x 3 stages is faster without the norm but needs 247 KB
# with it). All three ran with and without QK-norm on the H200.
# The backward's tiles were chosen again on the H200 only (the H100 has not run them):
# - dW takes wider column blocks than the sweep had: 256 columns of x a program on 8 warps, so
#   half as many programs re-form each head's dY; 2.74 ms against 4.78 at the sweep's 32/128
#   on 4 warps (results/qkv_tiles_chosen-nvidia-h200-20261129-1914.csv; 255 registers, no
#   spill, 96 KiB of shared memory, one program an SM, compiled for sm_90). With QK-norm it
#   spills 256 bytes a thread, and is still the fastest of the six tiles timed (5.06 ms;
#   -1930-qk-norm.csv, -1947-qk-norm.csv).
# - dX with QK-norm takes its own tile ("dx_norm"): at 64/64 on 4 warps the norm's backward
#   spills 60 registers a thread and took 8.01 ms; 32 rows by 128 columns on 4 warps does not
#   spill and took 2.49 (-1930-qk-norm.csv, -1942-qk-norm.csv). Without the norm that tile is
#   a slower GEMM (1.54 ms bare against 1.19), so dX keeps 64/64.
# End to end at 8192 tokens the fused forward+backward went from 7.3 to 5.2 ms without the
# norm and from 16.5 to 8.3 ms with it (results/qkv_rope-nvidia-h200-20261129-1942-*.csv).
# When dW took the NaN cosine of fused.table_cos_sin for its out-of-table guard it grew to 255
# registers and spilled at its tile (3.24 ms alone, 5.72 end to end; 2026-11-30 13:56); with
# its own select again (_grad_tile's valid) it is back to 2.74 ms alone, no spill, and 5.19 ms
# end to end (8.22 with the norm; qkv-backward-nvidia-h200-20261130-1414.log,
# results/qkv_rope-nvidia-h200.csv).
GPU_TILES = {
    "fwd": dict(BLOCK_M=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4),
    "dx": dict(BLOCK_M=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3),
    "dw": dict(BLOCK_M=64, BLOCK_K=256, GROUP_M=8, num_warps=8, num_stages=2),
    "dx_norm": dict(BLOCK_M=32, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3),
}
# Heads whose rows pass LONG_ROW_BYTES (fp32 heads of more than 128 features): at the tiles
# above a program asks for more shared memory than a block may have on an H100 or H200 (227
# KiB), so it could not launch (compiled for sm_90 with Triton 3.6 at fp32, d = 256: forward
# 294,912 bytes, dX 327,680 and with the norm 426,240, dW 262,144). Timed on an H200
# (benchmarks/qkv_tiles.py --dtype fp32 --heads 16 4 --head-dim 256 [--norm], 8192 tokens,
# four candidates a kernel; results/qkv_tiles-nvidia-h200-fp32-16x4x256[-qk-norm].csv), the
# rotating kernels without / with QK-norm:
#   forward 128/32 on 8 warps, 4 stages: 15.7 / 15.5 ms, though it spills (1,240 / 2,368 bytes
#     of stack a thread, Triton 3.6); the candidates that spill least took 18.6-23.2 ms;
#   dX 16/32 on 4 warps, 3 stages: 22.5 ms without the norm; with it 16/64 on 8 warps, 24.6 ms
#     (16/32 took 28.2 there);
#   dW 16/128 on 8 warps, 2 stages: 13.1 / 23.5 ms (16/64: 18.0 / 32.8; 16/256 spilled 5 KiB
#     and took 476 / 491).
# End to end the forward+backward went from 528 ms (the first tiles) to 63.8 ms with the tiles
# that spill least and to 51.5 ms with these (63.6 with the norm; the same GEMMs without the
# rotation 46.9), against 24.4 for cuBLAS then RoPE: fp32 tl.dot (IEEE) runs at 26 TFLOP/s
# here where cuBLAS reaches 50 (benchmarks/NOTES.md).
LONG_ROW_BYTES = 512
GPU_TILES_LONG_ROWS = {
    "fwd": dict(BLOCK_M=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=4),
    "dx": dict(BLOCK_M=16, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3),
    "dw": dict(BLOCK_M=16, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=2),
    "dx_norm": dict(BLOCK_M=16, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
}
MAX_HEAD_DIM = QKV_LINEAR_MAX_HEAD_DIM   # a head's D columns live in one program's registers

# Triton's interpreter (3.9) multiplies the bf16 operands of tl.dot as their raw 16-bit
# patterns (numpy has no bf16): there they are widened to fp32 first, which computes what the
# MMA does (a product of two bf16 values is exact in fp32; the sum is fp32).
WIDEN_BF16_DOT = tl.constexpr(INTERPRET)


@triton.jit
def _mma(a, b, acc, PRECISION: tl.constexpr):
    # acc + a @ b, accumulated in fp32
    if WIDEN_BF16_DOT and a.dtype == tl.bfloat16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _grouped(pid, n_rows, n_cols, GROUP: tl.constexpr):
    # a program id -> (row tile, column tile), GROUP row tiles at a time (Triton's tutorial 03)
    width = GROUP * n_cols
    first = (pid // width) * GROUP
    size = tl.minimum(n_rows - first, GROUP)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def _token_rows(m, M, S, P, pos_ptr, cu_seqlens_ptr, N_SEQ, IDS_PER_ENTRY: tl.constexpr):
    # m [BLOCK_M] token rows of x (b S + s; packed: t) -> (table rows [BLOCK_M] int32, clamped,
    # and valid [BLOCK_M]); rows past M count as valid (they are masked, and must stay finite)
    ok = m < M
    if pos_ptr is not None:         # position ids [B, S] (entry m) or [1, S] (entry m % S)
        if IDS_PER_ENTRY:
            p = tl.load(pos_ptr + m, mask=ok, other=0)
        else:
            p = tl.load(pos_ptr + m % S, mask=ok, other=0)
        valid = (p >= 0) & (p < P)  # compared before narrowing, so huge ids cannot wrap
        p = p.to(tl.int32)
    elif cu_seqlens_ptr is not None:
        p, valid = packed_positions(m, cu_seqlens_ptr, None, N_SEQ, 1, 0, 1)
        valid = valid & (p < P)
    else:
        p = m % S
        valid = p < P
    return tl.minimum(tl.maximum(p, 0), P - 1), valid | ~ok


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, m, M, S, P, pos_ptr, cu_seqlens_ptr, N_SEQ, d_a, d_b,
             IDS_PER_ENTRY: tl.constexpr, R: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_HALF: tl.constexpr):
    # the angles of tokens m [BLOCK_M]: c_a, s_a, c_b, s_b [BLOCK_M, BLOCK_HALF] fp32 and
    # valid [BLOCK_M], False where a position is outside the table (the caller makes dY NaN
    # there). cos_ptr/sin_ptr: an angle table [P, R] (sin_ptr None), or no table: Angles.turns
    # [R] int64 and its amplitude [1] (fused.table_cos_sin reads either).
    HALF: tl.constexpr = R // 2
    rows, valid = _token_rows(m, M, S, P, pos_ptr, cu_seqlens_ptr, N_SEQ, IDS_PER_ENTRY)
    j = tl.arange(0, BLOCK_HALF)
    mask = (m < M)[:, None, None] & (j < HALF)[None, None, :]
    c_a, s_a, c_b, s_b = table_cos_sin(cos_ptr, sin_ptr, rows, valid, 0, 0, R, d_a, d_b, mask,
                                       tl.float32, HALF, False)   # each [BLOCK_M, 1, BLOCK_HALF]
    shape: tl.constexpr = (BLOCK_M, BLOCK_HALF)
    return (tl.reshape(c_a, shape), tl.reshape(s_a, shape), tl.reshape(c_b, shape),
            tl.reshape(s_b, shape), valid)


@triton.jit
def _row_offsets(m, M, S, ROWS_PER_ENTRY: tl.constexpr, R: tl.constexpr,
                 BLOCK_HALF: tl.constexpr):
    # tokens m [BLOCK_M] -> the offsets of their cos/sin rows [BLOCK_M, 1] (row b S + s with
    # ROWS_PER_ENTRY, else row s; R values a row) and the mask [BLOCK_M, BLOCK_HALF] of a
    # half row's pairs
    j = tl.arange(0, BLOCK_HALF)
    if ROWS_PER_ENTRY:
        r = m
    else:
        r = m % S
    return r.to(tl.int64)[:, None] * R, (m < M)[:, None] & (j < R // 2)[None, :]


@triton.jit
def _cos_sin_rows(cos_ptr, sin_ptr, m, M, S, d_a, d_b, ROWS_PER_ENTRY: tl.constexpr,
                  R: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # the cos and sin of tokens m [BLOCK_M] (the forward's and dX's): c_a, s_a, c_b, s_b
    # [BLOCK_M, BLOCK_HALF] fp32, read from every token's cos and s' rows [NB * S, R] that the
    # pre-pass wrote (launch.plan_cos_sin_rows: row b S + s with ROWS_PER_ENTRY, else row s;
    # s'_a = -s_a, s'_b = s_b; a NaN row where a position is outside the table, so the
    # rotation, forward or backward, makes NaN). Rows past M read zeros (masked, finite).
    row, mask = _row_offsets(m, M, S, ROWS_PER_ENTRY, R, BLOCK_HALF)
    c_a = tl.load(cos_ptr + row + d_a[None, :], mask=mask, other=0.0)
    c_b = tl.load(cos_ptr + row + d_b[None, :], mask=mask, other=0.0)
    s_a = -tl.load(sin_ptr + row + d_a[None, :], mask=mask, other=0.0)
    s_b = tl.load(sin_ptr + row + d_b[None, :], mask=mask, other=0.0)
    return c_a, s_a, c_b, s_b


@triton.jit
def _pair_cos_sin_rows(cos_ptr, sin_ptr, m, M, S, d_a, d_b, ROWS_PER_ENTRY: tl.constexpr,
                       R: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # _cos_sin_rows where both members of every pair share their angle (the rows of Angles:
    # one angle a pair, so the rows hold equal values at d_a and d_b): one cos and one sin
    # tile [BLOCK_M, BLOCK_HALF] fp32, read at d_a and d_b, in place of four
    row, mask = _row_offsets(m, M, S, ROWS_PER_ENTRY, R, BLOCK_HALF)
    c = tl.load(cos_ptr + row + d_a[None, :], mask=mask, other=0.0)
    s = tl.load(sin_ptr + row + d_b[None, :], mask=mask, other=0.0)    # s'_b = s_b
    return c, s, c, s


@triton.jit
def _token_cos_sin(cos_ptr, sin_ptr, pairs_differ_ptr, m, M, S, d_a, d_b,
                   ROWS_PER_ENTRY: tl.constexpr, R: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # the pointer-loaded forward's cos and sin of tokens m: one cos and one sin tile where the
    # pre-pass found no pair whose members differ (pairs_differ_ptr holding 0, as for Hugging
    # Face's and TE's tables, which repeat each frequency); four where it found one, or where
    # no flag is given (table-free angles: that kernel, one head a program, holds four
    # without spilling)
    shared = False
    if pairs_differ_ptr is not None:
        shared = tl.load(pairs_differ_ptr) == 0
    if shared:
        c_a, s_a, c_b, s_b = _pair_cos_sin_rows(cos_ptr, sin_ptr, m, M, S, d_a, d_b,
                                                ROWS_PER_ENTRY, R, BLOCK_HALF)
    else:
        c_a, s_a, c_b, s_b = _cos_sin_rows(cos_ptr, sin_ptr, m, M, S, d_a, d_b, ROWS_PER_ENTRY,
                                           R, BLOCK_HALF)
    return c_a, s_a, c_b, s_b


@triton.jit
def _head_rows(m, hh, H, S, B, D: tl.constexpr, LAYOUT: tl.constexpr, INT64: tl.constexpr):
    # tokens m [BLOCK_M] of head hh -> their rows' offsets in a fresh q, k or v (or in its
    # gradient) of H heads laid out as LAYOUT (1 bshd, 2 bhsd; common.contiguous_strides)
    st_s, st_b, st_h = contiguous_strides(S, B, H, D, LAYOUT, INT64)
    if INT64:
        m = m.to(tl.int64)
    return (m % S) * st_s + (m // S) * st_b + hh * st_h


@triton.jit
def _norm_rotate_store(y_a, y_b, y_p, out_ptr, nw_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b, s_b,
                       m, m_ok, hh, H, g, NQK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                       D: tl.constexpr, LAYOUT: tl.constexpr, INT64: tl.constexpr,
                       ROTATE: tl.constexpr, HAS_PASS: tl.constexpr,
                       cos_ptr=None, sin_ptr=None, row_t=0, mask_t=0,
                       IN_TURN: tl.constexpr = False):
    # The epilogue of head hh of q, k (ROTATE) or v: y_* [BLOCK_M, *] fp32 the projection with
    # its bias. q and k: RMS-normed (nw_ptr given; the norm's input Y and r saved where
    # rstd_ptr is given, at the head's index g of NQK = HQ + HK), rotated, NaN where the
    # position is outside the table. Stored once rounded, in the output's dtype.
    # IN_TURN (every feature rotated): c_a, s_a, c_b, s_b are not given; each member's cos and
    # sin are read from the rows (cos_ptr, sin_ptr at row_t, mask_t: _row_offsets) just before
    # that member is rotated and stored, so two tiles of the rows are live at a time, not four.
    if ROTATE:
        if nw_ptr is not None:
            ss = tl.sum(y_a * y_a, axis=1) + tl.sum(y_b * y_b, axis=1)
            if HAS_PASS:
                ss += tl.sum(y_p * y_p, axis=1)
            r = tl.rsqrt(ss / D + eps)                                    # [BLOCK_M]
            if rstd_ptr is not None:
                if INT64:
                    mg = m.to(tl.int64) * NQK + g
                else:
                    mg = m * NQK + g
                tl.store(rstd_ptr + mg, r, mask=m_ok)
                pre = pre_ptr + (mg * D)[:, None]
                dt = pre_ptr.dtype.element_ty
                tl.store(pre + d_a[None, :], round_to(y_a, dt, ROUND_BF16_RTNE),
                         mask=m_ok[:, None] & j_ok[None, :])
                tl.store(pre + d_b[None, :], round_to(y_b, dt, ROUND_BF16_RTNE),
                         mask=m_ok[:, None] & j_ok[None, :])
                if HAS_PASS:
                    tl.store(pre + e[None, :], round_to(y_p, dt, ROUND_BF16_RTNE),
                             mask=m_ok[:, None] & e_ok[None, :])
            r = r[:, None]
            # u = n w, n = y r: the order kernels/qk_norm_rope.py computes in
            y_a = y_a * r * tl.load(nw_ptr + d_a, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            y_b = y_b * r * tl.load(nw_ptr + d_b, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            if HAS_PASS:
                y_p = y_p * r * tl.load(nw_ptr + e, mask=e_ok, other=0.0).to(tl.float32)[None, :]
        # (a position outside the table has NaN cos/sin rows: its q or k row comes out NaN)
        if not IN_TURN:
            y_a, y_b = rotate_pair(y_a, y_b, c_a, s_a, c_b, s_b)
    dt = out_ptr.dtype.element_ty
    row = out_ptr + _head_rows(m, hh, H, S, B, D, LAYOUT, INT64)[:, None]
    mask = m_ok[:, None] & j_ok[None, :]
    if IN_TURN:     # rotate_pair, a member at a time
        c = tl.load(cos_ptr + row_t + d_a[None, :], mask=mask_t, other=0.0)
        s = -tl.load(sin_ptr + row_t + d_a[None, :], mask=mask_t, other=0.0)
        tl.store(row + d_a[None, :], round_to(rotated_a(y_a, y_b, c, s), dt, ROUND_BF16_RTNE),
                 mask=mask)
        c = tl.load(cos_ptr + row_t + d_b[None, :], mask=mask_t, other=0.0)
        s = tl.load(sin_ptr + row_t + d_b[None, :], mask=mask_t, other=0.0)
        tl.store(row + d_b[None, :], round_to(rotated_b(y_a, y_b, c, s), dt, ROUND_BF16_RTNE),
                 mask=mask)
    else:
        tl.store(row + d_a[None, :], round_to(y_a, dt, ROUND_BF16_RTNE), mask=mask)
        tl.store(row + d_b[None, :], round_to(y_b, dt, ROUND_BF16_RTNE), mask=mask)
    if HAS_PASS:
        tl.store(row + e[None, :], round_to(y_p, dt, ROUND_BF16_RTNE),
                 mask=m_ok[:, None] & e_ok[None, :])


@triton.jit
def _grad_tile(g_ptr, hh, H, g, NQK, nw_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b, s_b, valid,
               m, m_ok, S, B, d_a, d_b, e, j_ok, e_ok,
               D: tl.constexpr, LAYOUT: tl.constexpr, INT64: tl.constexpr,
               ROTATE: tl.constexpr, HAS_PASS: tl.constexpr):
    # The backward's prologue: dY of head hh of q, k (ROTATE) or v for tokens m, from the
    # gradient g_ptr of that output (laid out like it) -> (dY_a, dY_b, dY_p, gun_a, gun_b,
    # gun_p), fp32 [BLOCK_M, *]: dY in the accumulators' pairing, and gu n (the norm weight's
    # gradient terms; zeros without the norm). Rows past M come out zero. A position outside
    # the table makes dY NaN: in dX its pre-pass's cos rows are NaN there (valid None: each
    # member of the rotation is one fma with a cosine); dW evaluates its own cos/sin and
    # selects on valid [BLOCK_M]. Compiled for sm_90 (Triton 3.6, bf16, d 128), the NaN cosine
    # in dW's tile instead of the select cost it registers: 236 against 215 a thread at 32/256
    # on 8 warps, and 32 bytes of spill at its 64/256 tile, 18 % of its time on an H200
    # (3.24 against 2.74 ms, qkv-backward-nvidia-h200-20261130-1356.log).
    row = g_ptr + _head_rows(m, hh, H, S, B, D, LAYOUT, INT64)[:, None]
    mask = m_ok[:, None] & j_ok[None, :]
    mask_p = m_ok[:, None] & e_ok[None, :]
    ga = tl.load(row + d_a[None, :], mask=mask, other=0.0).to(tl.float32)
    gb = tl.load(row + d_b[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_PASS:
        gp = tl.load(row + e[None, :], mask=mask_p, other=0.0).to(tl.float32)
    else:
        gp = ga
    gun_a = tl.zeros_like(ga)
    gun_b = tl.zeros_like(ga)
    gun_p = tl.zeros_like(gp)
    if ROTATE:
        # gu = rot(-theta) gy: the transpose swaps which member's sine is used
        ga, gb = rotate_pair(ga, gb, c_a, -s_b, c_b, -s_a)
        if valid is not None:
            ga = tl.where(valid[:, None], ga, float("nan"))
            gb = tl.where(valid[:, None], gb, float("nan"))
        if nw_ptr is not None:
            if INT64:
                mg = m.to(tl.int64) * NQK + g
            else:
                mg = m * NQK + g
            r = tl.load(rstd_ptr + mg, mask=m_ok, other=0.0)[:, None]
            pre = pre_ptr + (mg * D)[:, None]
            n_a = tl.load(pre + d_a[None, :], mask=mask, other=0.0).to(tl.float32) * r
            n_b = tl.load(pre + d_b[None, :], mask=mask, other=0.0).to(tl.float32) * r
            gun_a = ga * n_a
            gun_b = gb * n_b
            gn_a = ga * tl.load(nw_ptr + d_a, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            gn_b = gb * tl.load(nw_ptr + d_b, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            dot = tl.sum(gn_a * n_a, axis=1) + tl.sum(gn_b * n_b, axis=1)
            if HAS_PASS:
                n_p = tl.load(pre + e[None, :], mask=mask_p, other=0.0).to(tl.float32) * r
                gun_p = gp * n_p
                gn_p = gp * tl.load(nw_ptr + e, mask=e_ok, other=0.0).to(tl.float32)[None, :]
                dot += tl.sum(gn_p * n_p, axis=1)
            dot = (dot / D)[:, None]
            # dY = r (gn - n mean(gn n)), the RMS norm's backward
            ga = r * (gn_a - n_a * dot)
            gb = r * (gn_b - n_b * dot)
            if HAS_PASS:
                gp = r * (gn_p - n_p * dot)
    return ga, gb, gp, gun_a, gun_b, gun_p


# --- the kernels --------------------------------------------------------------------------------
# Shared arguments (the forward reads cos_ptr/sin_ptr as every token's cos and s' rows instead,
# and takes no positions): positions from pos_ptr (position ids [B or 1, S], contiguous), else
# cu_seqlens_ptr ([N_SEQ + 1], packed sequences), else the token index; cos_ptr/sin_ptr an angle
# table [P, R] contiguous (sin_ptr None) or Angles' turns [R] and amplitude [1]; norm_q_ptr and
# norm_k_ptr the norm weights [D] (None: no norm); rstd_ptr [M, HQ + HK] fp32 and pre_ptr
# [M, HQ + HK, D] the norm's saved statistics and inputs. q, k, v and their gradients are
# contiguous in LAYOUT (1 bshd, 2 bhsd), x [M, K] and the weight [N, K] contiguous: their
# strides follow from the shapes.

@triton.jit
def _qkv_rope_fwd_kernel(
    x_ptr, w_ptr, bias_ptr,             # x [M, K], weight [N, K], bias [N] or None
    q_ptr, k_ptr, v_ptr,                # outputs [B, S, H, D] (bshd) or [B, H, S, D] (bhsd)
    cos_ptr, sin_ptr,                   # every token's cos and s' rows [NB * S, R] fp32
    norm_q_ptr, norm_k_ptr,             # norm weights [D], or None
    rstd_ptr, pre_ptr,                  # saved for the norm's backward, or None
    pairs_differ_ptr,                   # int32 [1], 0: every pair's members share cos and sin
    S, B, K, HQ, HK,                    # tokens per sequence, sequences, hidden, heads
    eps,                                # the norm's epsilon
    D: tl.constexpr, R: tl.constexpr,   # head dim, rotary dim
    LAYOUT: tl.constexpr,               # of q, k, v: 1 bshd, 2 bhsd
    INTERLEAVED: tl.constexpr,          # pairs (2j, 2j+1) instead of (j, j + R/2)
    ROWS_PER_ENTRY: tl.constexpr,       # cos/sin rows per batch entry (else one per token s)
    ROTATE: tl.constexpr,               # False: the same GEMM without the epilogue (a plain
                                        # projection into q, k, v heads: the baseline)
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INT64: tl.constexpr,                # offsets past 2^31 elements
):
    HALF: tl.constexpr = R // 2
    HAS_PASS: tl.constexpr = D > R
    BLOCK_HALF: tl.constexpr = tile_width(HALF, 16)   # (tl.dot's operands: 16 at least)
    BLOCK_PASS: tl.constexpr = tile_width(D - R, 16)
    # every feature rotated and a power-of-two half: one accumulator for the whole head
    ONE_ACC: tl.constexpr = (R == D) and (BLOCK_HALF == HALF)
    # fp32 inputs multiply in fp32 (F.linear's default), not TF32
    PRECISION: tl.constexpr = "ieee" if x_ptr.dtype.element_ty == tl.float32 else "tf32"
    M = S * B
    NQK = HQ + HK
    pid_m, h = _grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), NQK + HK, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    if INT64:
        m_off = m.to(tl.int64)
        n0 = h.to(tl.int64) * D
    else:
        m_off = m
        n0 = h * D
    j = tl.arange(0, BLOCK_HALF)
    j_ok = j < HALF
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    e = R + tl.arange(0, BLOCK_PASS)
    e_ok = e < D
    kk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + m_off[:, None] * K                         # [BLOCK_M, 1]
    acc_p = tl.zeros((BLOCK_M, BLOCK_PASS), dtype=tl.float32)
    if ONE_ACC:
        # the head's D weight rows as one operand: one [BLOCK_M, D] accumulator, one MMA per
        # step; the pairs are split apart in the epilogue (see "How a tile covers a head")
        w_rows = w_ptr + (n0 + tl.arange(0, D))[None, :] * K    # [1, D]
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + kk) < K
            x = tl.load(x_rows + (k0 + kk)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0)
            wt = tl.load(w_rows + (k0 + kk)[:, None], mask=k_ok[:, None], other=0.0)
            acc = _mma(x, wt, acc, PRECISION)                  # [BLOCK_M, D]
        if bias_ptr is not None:
            acc += tl.load(bias_ptr + n0 + tl.arange(0, D)).to(tl.float32)[None, :]
        acc_a, acc_b = _pair_halves(acc, INTERLEAVED)
    else:
        w_a = w_ptr + (n0 + d_a)[None, :] * K                  # [1, BLOCK_HALF]: rows d_a
        w_b = w_ptr + (n0 + d_b)[None, :] * K
        w_p = w_ptr + (n0 + e)[None, :] * K
        acc_a = tl.zeros((BLOCK_M, BLOCK_HALF), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_M, BLOCK_HALF), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + kk) < K
            x = tl.load(x_rows + (k0 + kk)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0)
            wt = tl.load(w_a + (k0 + kk)[:, None], mask=k_ok[:, None] & j_ok[None, :],
                         other=0.0)
            acc_a = _mma(x, wt, acc_a, PRECISION)     # [BLOCK_M, BLOCK_HALF]
            wt = tl.load(w_b + (k0 + kk)[:, None], mask=k_ok[:, None] & j_ok[None, :],
                         other=0.0)
            acc_b = _mma(x, wt, acc_b, PRECISION)
            if HAS_PASS:
                wt = tl.load(w_p + (k0 + kk)[:, None], mask=k_ok[:, None] & e_ok[None, :],
                             other=0.0)
                acc_p = _mma(x, wt, acc_p, PRECISION)
        if bias_ptr is not None:
            acc_a += tl.load(bias_ptr + n0 + d_a, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            acc_b += tl.load(bias_ptr + n0 + d_b, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            if HAS_PASS:
                acc_p += tl.load(bias_ptr + n0 + e, mask=e_ok, other=0.0).to(tl.float32)[None, :]

    if h < NQK:
        if ROTATE:
            c_a, s_a, c_b, s_b = _token_cos_sin(cos_ptr, sin_ptr, pairs_differ_ptr, m, M, S,
                                                d_a, d_b, ROWS_PER_ENTRY, R, BLOCK_HALF)
        else:
            c_a, s_a, c_b, s_b = 0.0, 0.0, 0.0, 0.0
        _store_qk_head(acc_a, acc_b, acc_p, h, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr,
                       pre_ptr, c_a, s_a, c_b, s_b, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e,
                       j_ok, e_ok, D, LAYOUT, INT64, ROTATE, HAS_PASS)
    else:
        _store_v_head(acc_a, acc_b, acc_p, h, v_ptr, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e,
                      j_ok, e_ok, D, LAYOUT, INT64, HAS_PASS)


@triton.jit
def _pair_halves(acc, INTERLEAVED: tl.constexpr):
    # one head's accumulator [BLOCK_M, D] -> the members of its pairs, [BLOCK_M, D/2] each
    HALF: tl.constexpr = acc.shape[1] // 2
    if INTERLEAVED:    # pair j = features (2j, 2j + 1): adjacent columns
        return tl.split(tl.reshape(acc, (acc.shape[0], HALF, 2)))
    else:              # pair j = features (j, j + D/2): the two halves
        return tl.split(tl.permute(tl.reshape(acc, (acc.shape[0], 2, HALF)), (0, 2, 1)))


@triton.jit
def _store_qk_head(y_a, y_b, y_p, h, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
                   c_a, s_a, c_b, s_b, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                   D: tl.constexpr, LAYOUT: tl.constexpr, INT64: tl.constexpr,
                   ROTATE: tl.constexpr, HAS_PASS: tl.constexpr,
                   cos_ptr=None, sin_ptr=None, row_t=0, mask_t=0,
                   IN_TURN: tl.constexpr = False):
    # the forward's epilogue for head h < HQ + HK: q's head h or k's head h - HQ, normed and
    # rotated (_norm_rotate_store)
    if h < HQ:
        _norm_rotate_store(y_a, y_b, y_p, q_ptr, norm_q_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b,
                           s_b, m, m_ok, h, HQ, h, HQ + HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                           D, LAYOUT, INT64, ROTATE, HAS_PASS, cos_ptr, sin_ptr, row_t, mask_t,
                           IN_TURN)
    else:
        _norm_rotate_store(y_a, y_b, y_p, k_ptr, norm_k_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b,
                           s_b, m, m_ok, h - HQ, HK, h, HQ + HK, S, B, eps, d_a, d_b, e, j_ok,
                           e_ok, D, LAYOUT, INT64, ROTATE, HAS_PASS, cos_ptr, sin_ptr, row_t,
                           mask_t, IN_TURN)


@triton.jit
def _store_v_head(y_a, y_b, y_p, h, v_ptr, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                  D: tl.constexpr, LAYOUT: tl.constexpr, INT64: tl.constexpr,
                  HAS_PASS: tl.constexpr):
    # the forward's epilogue for head h >= HQ + HK: v's head, stored as it is
    _norm_rotate_store(y_a, y_b, y_p, v_ptr, None, None, None, 0.0, 0.0, 0.0, 0.0, m, m_ok,
                       h - HQ - HK, HK, h, HQ + HK, S, B, eps, d_a, d_b, e, j_ok, e_ok, D,
                       LAYOUT, INT64, False, HAS_PASS)


@triton.jit
def _qkv_rope_fwd_tma_kernel(
    x_ptr, w_ptr, bias_ptr,             # x [M, K], weight [N, K] (16-byte aligned), bias [N]
    q_ptr, k_ptr, v_ptr,                # outputs [B, S, H, D] (bshd) or [B, H, S, D] (bhsd)
    cos_ptr, sin_ptr,                   # every token's cos and s' rows [NB * S, D] fp32
    norm_q_ptr, norm_k_ptr,             # norm weights [D], or None
    rstd_ptr, pre_ptr,                  # saved for the norm's backward, or None
    pairs_differ_ptr,                   # int32 [1], 0: every pair's members share cos and sin
    S, B, K, HQ, HK,                    # tokens per sequence, sequences, hidden, heads
    eps,                                # the norm's epsilon
    D: tl.constexpr,                    # head dim (every feature rotated, D/2 a power of two)
    LAYOUT: tl.constexpr, INTERLEAVED: tl.constexpr, ROWS_PER_ENTRY: tl.constexpr,
    ROTATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INT64: tl.constexpr,
    PROGRAMS: tl.constexpr,             # programs launched (one per SM on a GPU)
    SHARED_ANGLE: tl.constexpr,         # both members of every pair at one angle (Angles)
):
    # The forward of _qkv_rope_fwd_kernel's one-accumulator case on a persistent TMA main loop:
    # PROGRAMS programs walk the (BLOCK_M tokens, two heads) tiles in grouped order, tile t
    # going to program t % PROGRAMS; x's and W's tiles arrive by TMA (descriptors made here,
    # from the pointers: the kernel takes pointers like every ropelib kernel); a tile's two
    # heads (HQ and HK even: both q's, k's or v's) share one load of their tokens' cos and sin
    # rows where every pair's members share them (else each member's rows are read in turn, per
    # head). The epilogue is _qkv_rope_fwd_kernel's (_store_qk_head, _store_v_head): stores by
    # pointer into either output layout.
    HEADS: tl.constexpr = 2
    HALF: tl.constexpr = D // 2
    PRECISION: tl.constexpr = "ieee" if x_ptr.dtype.element_ty == tl.float32 else "tf32"
    M = S * B
    N = (HQ + 2 * HK) * D
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1],
                                       block_shape=[HEADS * D, BLOCK_K])
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = (HQ + 2 * HK) // HEADS
    j = tl.arange(0, HALF)
    j_ok = j < HALF
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    e = D + tl.arange(0, 16)            # no pass-through features (placeholders)
    e_ok = e < D
    # which epilogue every q and k tile takes is known before the first tile: the loop is
    # compiled once per epilogue, so the one that runs holds no branch per tile (a table's
    # flag is read once, here). 0: none (ROTATE=False); 1: one cos and one sin tile for both
    # heads; 2: each member's own, in turn. Only a table's flag is a branch at run time; both
    # its sides are compiled, so it is taken only where both epilogues have their rows. (Every
    # other choice is a constexpr: a Python value assigned to a plain variable would become a
    # runtime value, and both sides of its branch would be compiled, with pointers missing.)
    FIXED: tl.constexpr = 0 if not ROTATE else (1 if SHARED_ANGLE else 2)
    READ_FLAG: tl.constexpr = (FIXED == 2) if pairs_differ_ptr is not None else False
    if READ_FLAG:
        if tl.load(pairs_differ_ptr) == 0:          # no pair's members differ: two tiles
            _tma_tiles(x_desc, w_desc, bias_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr,
                       norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr, S, B, K, HQ, HK, eps, tiles_m,
                       tiles_n, j_ok, d_a, d_b, e, e_ok, D, LAYOUT, INTERLEAVED, ROWS_PER_ENTRY,
                       BLOCK_M, BLOCK_K, GROUP_M, INT64, PROGRAMS, PRECISION, HEADS, 1)
        else:
            _tma_tiles(x_desc, w_desc, bias_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr,
                       norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr, S, B, K, HQ, HK, eps, tiles_m,
                       tiles_n, j_ok, d_a, d_b, e, e_ok, D, LAYOUT, INTERLEAVED, ROWS_PER_ENTRY,
                       BLOCK_M, BLOCK_K, GROUP_M, INT64, PROGRAMS, PRECISION, HEADS, 2)
    else:
        _tma_tiles(x_desc, w_desc, bias_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, norm_q_ptr,
                   norm_k_ptr, rstd_ptr, pre_ptr, S, B, K, HQ, HK, eps, tiles_m, tiles_n, j_ok,
                   d_a, d_b, e, e_ok, D, LAYOUT, INTERLEAVED, ROWS_PER_ENTRY, BLOCK_M, BLOCK_K,
                   GROUP_M, INT64, PROGRAMS, PRECISION, HEADS, FIXED)


@triton.jit
def _tma_tiles(x_desc, w_desc, bias_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, norm_q_ptr,
               norm_k_ptr, rstd_ptr, pre_ptr, S, B, K, HQ, HK, eps, tiles_m, tiles_n, j_ok, d_a,
               d_b, e, e_ok, D: tl.constexpr, LAYOUT: tl.constexpr, INTERLEAVED: tl.constexpr,
               ROWS_PER_ENTRY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, INT64: tl.constexpr, PROGRAMS: tl.constexpr,
               PRECISION: tl.constexpr, HEADS: tl.constexpr, EPILOGUE: tl.constexpr):
    # the TMA forward's persistent loop over its (BLOCK_M tokens, HEADS heads) tiles, with one
    # epilogue for every q and k tile: 0 none (ROTATE=False), 1 one cos and one sin tile for
    # both heads (pairs whose members share them), 2 each member's cos and sin read in turn
    HALF: tl.constexpr = D // 2
    M = S * B
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS):
        pid_m, pid_n = _grouped(tile, tiles_m, tiles_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        h = pid_n * HEADS
        acc = tl.zeros((BLOCK_M, HEADS * D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):      # a ragged last tile of M or K: TMA reads zeros
            acc = _mma(x_desc.load([m0, k0]), w_desc.load([h * D, k0]).T, acc, PRECISION)
        if bias_ptr is not None:
            acc += tl.load(bias_ptr + h * D + tl.arange(0, HEADS * D)).to(tl.float32)[None, :]
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < M
        if h < HQ + HK:                      # both heads q's or both k's (HQ, HK even)
            if EPILOGUE == 0:
                _store_qk_heads(acc, h, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
                                0.0, 0.0, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                                D, LAYOUT, INT64, INTERLEAVED, False, HEADS)
            elif EPILOGUE == 1:
                c, s, _, _ = _pair_cos_sin_rows(cos_ptr, sin_ptr, m, M, S, d_a, d_b,
                                                ROWS_PER_ENTRY, D, HALF)
                _store_qk_heads(acc, h, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
                                c, s, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok, D,
                                LAYOUT, INT64, INTERLEAVED, True, HEADS)
            else:
                row_t, mask_t = _row_offsets(m, M, S, ROWS_PER_ENTRY, D, HALF)
                _store_qk_heads(acc, h, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
                                0.0, 0.0, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                                D, LAYOUT, INT64, INTERLEAVED, True, HEADS, cos_ptr, sin_ptr,
                                row_t, mask_t, True)
        else:
            for i in tl.static_range(HEADS):
                a, b = _pair_halves(_tile_head(acc, i, D), INTERLEAVED)
                _store_v_head(a, b, a, h + i, v_ptr, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e,
                              j_ok, e_ok, D, LAYOUT, INT64, False)


@triton.jit
def _store_qk_heads(acc, h, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr, c, s, m,
                    m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok, D: tl.constexpr,
                    LAYOUT: tl.constexpr, INT64: tl.constexpr, INTERLEAVED: tl.constexpr,
                    ROTATE: tl.constexpr, HEADS: tl.constexpr, cos_ptr=None, sin_ptr=None,
                    row_t=0, mask_t=0, IN_TURN: tl.constexpr = False):
    # the TMA forward's epilogue for its tile's HEADS q or k heads h.. (acc [BLOCK_M, HEADS D]):
    # rotated by one cos c and one sin s a pair (both members'), or with IN_TURN each member's
    # own, read in turn (_norm_rotate_store)
    for i in tl.static_range(HEADS):
        a, b = _pair_halves(_tile_head(acc, i, D), INTERLEAVED)
        _store_qk_head(a, b, a, h + i, q_ptr, k_ptr, norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
                       c, s, c, s, m, m_ok, HQ, HK, S, B, eps, d_a, d_b, e, j_ok, e_ok, D, LAYOUT,
                       INT64, ROTATE, False, cos_ptr, sin_ptr, row_t, mask_t, IN_TURN)


@triton.jit
def _tile_head(acc, i: tl.constexpr, D: tl.constexpr):
    # a two-head tile's accumulator [BLOCK_M, 2 D] -> head i's columns [BLOCK_M, D]
    first, second = tl.split(tl.permute(tl.reshape(acc, (acc.shape[0], 2, D)), (0, 2, 1)))
    if i == 0:
        return first
    else:
        return second


@triton.jit
def _dx_head(acc, dy_a, dy_b, dy_p, w_ptr, n0, kk, k_ok, d_a, d_b, e, j_ok, e_ok, K,
             HAS_PASS: tl.constexpr, PRECISION: tl.constexpr):
    # acc [BLOCK_M, BLOCK_K] += dY (this head, rounded to the weight's dtype) @ W[head rows, kk]
    dt = w_ptr.dtype.element_ty
    w = tl.load(w_ptr + (n0 + d_a)[:, None] * K + kk[None, :], mask=j_ok[:, None] & k_ok[None, :],
                other=0.0)
    acc = _mma(round_to(dy_a, dt, ROUND_BF16_RTNE), w, acc, PRECISION)
    w = tl.load(w_ptr + (n0 + d_b)[:, None] * K + kk[None, :], mask=j_ok[:, None] & k_ok[None, :],
                other=0.0)
    acc = _mma(round_to(dy_b, dt, ROUND_BF16_RTNE), w, acc, PRECISION)
    if HAS_PASS:
        w = tl.load(w_ptr + (n0 + e)[:, None] * K + kk[None, :],
                    mask=e_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _mma(round_to(dy_p, dt, ROUND_BF16_RTNE), w, acc, PRECISION)
    return acc


@triton.jit
def _qkv_rope_dx_kernel(
    gq_ptr, gk_ptr, gv_ptr,             # gradients of q, k, v (laid out like them)
    w_ptr,                              # weight [N, K]
    dx_ptr,                             # out: the gradient of x [M, K]
    cos_ptr, sin_ptr,                   # every token's cos and s' rows [NB * S, R] fp32
    norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
    S, B, K, HQ, HK,
    D: tl.constexpr, R: tl.constexpr, LAYOUT: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROWS_PER_ENTRY: tl.constexpr, ROTATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, INT64: tl.constexpr,
):
    HALF: tl.constexpr = R // 2
    HAS_PASS: tl.constexpr = D > R
    BLOCK_HALF: tl.constexpr = tile_width(HALF, 16)   # (tl.dot's operands: 16 at least)
    BLOCK_PASS: tl.constexpr = tile_width(D - R, 16)
    PRECISION: tl.constexpr = "ieee" if w_ptr.dtype.element_ty == tl.float32 else "tf32"
    M = S * B
    NQK = HQ + HK
    pid_m, pid_k = _grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_K), GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    kk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = kk < K
    j = tl.arange(0, BLOCK_HALF)
    j_ok = j < HALF
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    e = R + tl.arange(0, BLOCK_PASS)
    e_ok = e < D
    if ROTATE:      # the tokens' cos and sin rows, once for every q and k head
        c_a, s_a, c_b, s_b = _cos_sin_rows(cos_ptr, sin_ptr, m, M, S, d_a, d_b, ROWS_PER_ENTRY,
                                           R, BLOCK_HALF)
    else:
        c_a, s_a, c_b, s_b = 0.0, 0.0, 0.0, 0.0
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for h in range(0, HQ):
        if INT64:
            n0 = h.to(tl.int64) * D
        else:
            n0 = h * D
        dy_a, dy_b, dy_p, _, _, _ = _grad_tile(
            gq_ptr, h, HQ, h, NQK, norm_q_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b, s_b, None,
            m, m_ok, S, B, d_a, d_b, e, j_ok, e_ok, D, LAYOUT, INT64, ROTATE, HAS_PASS)
        acc = _dx_head(acc, dy_a, dy_b, dy_p, w_ptr, n0, kk, k_ok, d_a, d_b, e, j_ok, e_ok, K,
                       HAS_PASS, PRECISION)
    for h in range(0, HK):
        if INT64:
            n0 = (HQ + h).to(tl.int64) * D
        else:
            n0 = (HQ + h) * D
        dy_a, dy_b, dy_p, _, _, _ = _grad_tile(
            gk_ptr, h, HK, HQ + h, NQK, norm_k_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b, s_b,
            None, m, m_ok, S, B, d_a, d_b, e, j_ok, e_ok, D, LAYOUT, INT64, ROTATE, HAS_PASS)
        acc = _dx_head(acc, dy_a, dy_b, dy_p, w_ptr, n0, kk, k_ok, d_a, d_b, e, j_ok, e_ok, K,
                       HAS_PASS, PRECISION)
    for h in range(0, HK):
        if INT64:
            n0 = (NQK + h).to(tl.int64) * D
        else:
            n0 = (NQK + h) * D
        dy_a, dy_b, dy_p, _, _, _ = _grad_tile(
            gv_ptr, h, HK, 0, NQK, None, None, None, c_a, s_a, c_b, s_b, None,
            m, m_ok, S, B, d_a, d_b, e, j_ok, e_ok, D, LAYOUT, INT64, False, HAS_PASS)
        acc = _dx_head(acc, dy_a, dy_b, dy_p, w_ptr, n0, kk, k_ok, d_a, d_b, e, j_ok, e_ok, K,
                       HAS_PASS, PRECISION)
    if INT64:
        m_off = m.to(tl.int64)
    else:
        m_off = m
    tl.store(dx_ptr + m_off[:, None] * K + kk[None, :],
             round_to(acc, dx_ptr.dtype.element_ty, ROUND_BF16_RTNE),
             mask=m_ok[:, None] & k_ok[None, :])


@triton.jit
def _dw_head(g_ptr, hh, H, g, NQK, nw_ptr, rstd_ptr, pre_ptr, x_ptr, cos_ptr, sin_ptr, pos_ptr,
             cu_seqlens_ptr, S, B, K, P, N_SEQ, kk, k_ok, d_a, d_b, e, j_ok, e_ok,
             D: tl.constexpr, R: tl.constexpr, LAYOUT: tl.constexpr,
             IDS_PER_ENTRY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
             BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INT64: tl.constexpr,
             ROTATE: tl.constexpr, HAS_PASS: tl.constexpr, PRECISION: tl.constexpr):
    # One head's rows of dW over columns kk: sum over every token block of dY^T X, with the
    # column sums of dY (the bias gradient) and of gu n (the norm weight's) along the way.
    M = S * B
    dt = x_ptr.dtype.element_ty
    acc_a = tl.zeros((BLOCK_HALF, BLOCK_K), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_HALF, BLOCK_K), dtype=tl.float32)
    acc_p = tl.zeros((BLOCK_PASS, BLOCK_K), dtype=tl.float32)
    db_a = tl.zeros((BLOCK_HALF,), dtype=tl.float32)
    db_b = tl.zeros((BLOCK_HALF,), dtype=tl.float32)
    db_p = tl.zeros((BLOCK_PASS,), dtype=tl.float32)
    gw_a = tl.zeros((BLOCK_HALF,), dtype=tl.float32)
    gw_b = tl.zeros((BLOCK_HALF,), dtype=tl.float32)
    gw_p = tl.zeros((BLOCK_PASS,), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < M
        if ROTATE:
            c_a, s_a, c_b, s_b, valid = _cos_sin(cos_ptr, sin_ptr, m, M, S, P, pos_ptr,
                                                 cu_seqlens_ptr, N_SEQ, d_a, d_b, IDS_PER_ENTRY,
                                                 R, BLOCK_M, BLOCK_HALF)
        else:
            c_a, s_a, c_b, s_b, valid = 0.0, 0.0, 0.0, 0.0, None
        dy_a, dy_b, dy_p, gun_a, gun_b, gun_p = _grad_tile(
            g_ptr, hh, H, g, NQK, nw_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b, s_b, valid,
            m, m_ok, S, B, d_a, d_b, e, j_ok, e_ok, D, LAYOUT, INT64, ROTATE, HAS_PASS)
        if INT64:
            m_off = m.to(tl.int64)
        else:
            m_off = m
        x = tl.load(x_ptr + m_off[:, None] * K + kk[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)                                          # [BLOCK_M, BLOCK_K]
        acc_a = _mma(tl.trans(round_to(dy_a, dt, ROUND_BF16_RTNE)), x, acc_a, PRECISION)
        acc_b = _mma(tl.trans(round_to(dy_b, dt, ROUND_BF16_RTNE)), x, acc_b, PRECISION)
        db_a += tl.sum(dy_a, axis=0)
        db_b += tl.sum(dy_b, axis=0)
        gw_a += tl.sum(gun_a, axis=0)
        gw_b += tl.sum(gun_b, axis=0)
        if HAS_PASS:
            acc_p = _mma(tl.trans(round_to(dy_p, dt, ROUND_BF16_RTNE)), x, acc_p, PRECISION)
            db_p += tl.sum(dy_p, axis=0)
            gw_p += tl.sum(gun_p, axis=0)
    return acc_a, acc_b, acc_p, db_a, db_b, db_p, gw_a, gw_b, gw_p


@triton.jit
def _qkv_rope_dw_kernel(
    gq_ptr, gk_ptr, gv_ptr,             # gradients of q, k, v (laid out like them)
    x_ptr,                              # x [M, K]
    dw_ptr,                             # out: the weight's gradient [N, K]
    db_ptr,                             # out: the bias's gradient [N] fp32, or None
    dnorm_ptr,                          # out: [HQ + HK, D] fp32 per-head sums of gu n, or None
    cos_ptr, sin_ptr, pos_ptr, cu_seqlens_ptr,
    norm_q_ptr, norm_k_ptr, rstd_ptr, pre_ptr,
    S, B, K, HQ, HK, P, N_SEQ,
    D: tl.constexpr, R: tl.constexpr, LAYOUT: tl.constexpr, INTERLEAVED: tl.constexpr,
    IDS_PER_ENTRY: tl.constexpr, ROTATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, INT64: tl.constexpr,
):
    HALF: tl.constexpr = R // 2
    HAS_PASS: tl.constexpr = D > R
    BLOCK_HALF: tl.constexpr = tile_width(HALF, 16)   # (tl.dot's operands: 16 at least)
    BLOCK_PASS: tl.constexpr = tile_width(D - R, 16)
    PRECISION: tl.constexpr = "ieee" if x_ptr.dtype.element_ty == tl.float32 else "tf32"
    NQK = HQ + HK
    h, pid_k = _grouped(tl.program_id(0), NQK + HK, tl.cdiv(K, BLOCK_K), GROUP_M)
    kk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = kk < K
    j = tl.arange(0, BLOCK_HALF)
    j_ok = j < HALF
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    e = R + tl.arange(0, BLOCK_PASS)
    e_ok = e < D
    if h < HQ:
        acc_a, acc_b, acc_p, db_a, db_b, db_p, gw_a, gw_b, gw_p = _dw_head(
            gq_ptr, h, HQ, h, NQK, norm_q_ptr, rstd_ptr, pre_ptr, x_ptr, cos_ptr, sin_ptr,
            pos_ptr, cu_seqlens_ptr, S, B, K, P, N_SEQ, kk, k_ok, d_a, d_b, e, j_ok, e_ok,
            D, R, LAYOUT, IDS_PER_ENTRY, BLOCK_M, BLOCK_K, BLOCK_HALF, BLOCK_PASS, INT64,
            ROTATE, HAS_PASS, PRECISION)
    elif h < NQK:
        acc_a, acc_b, acc_p, db_a, db_b, db_p, gw_a, gw_b, gw_p = _dw_head(
            gk_ptr, h - HQ, HK, h, NQK, norm_k_ptr, rstd_ptr, pre_ptr, x_ptr, cos_ptr, sin_ptr,
            pos_ptr, cu_seqlens_ptr, S, B, K, P, N_SEQ, kk, k_ok, d_a, d_b, e, j_ok, e_ok,
            D, R, LAYOUT, IDS_PER_ENTRY, BLOCK_M, BLOCK_K, BLOCK_HALF, BLOCK_PASS, INT64,
            ROTATE, HAS_PASS, PRECISION)
    else:
        acc_a, acc_b, acc_p, db_a, db_b, db_p, gw_a, gw_b, gw_p = _dw_head(
            gv_ptr, h - NQK, HK, h, NQK, None, None, None, x_ptr, cos_ptr, sin_ptr,
            pos_ptr, cu_seqlens_ptr, S, B, K, P, N_SEQ, kk, k_ok, d_a, d_b, e, j_ok, e_ok,
            D, R, LAYOUT, IDS_PER_ENTRY, BLOCK_M, BLOCK_K, BLOCK_HALF, BLOCK_PASS, INT64,
            False, HAS_PASS, PRECISION)
    if INT64:
        n0 = h.to(tl.int64) * D
    else:
        n0 = h * D
    dt = dw_ptr.dtype.element_ty
    k_mask = k_ok[None, :]
    tl.store(dw_ptr + (n0 + d_a)[:, None] * K + kk[None, :], round_to(acc_a, dt, ROUND_BF16_RTNE),
             mask=j_ok[:, None] & k_mask)
    tl.store(dw_ptr + (n0 + d_b)[:, None] * K + kk[None, :], round_to(acc_b, dt, ROUND_BF16_RTNE),
             mask=j_ok[:, None] & k_mask)
    if HAS_PASS:
        tl.store(dw_ptr + (n0 + e)[:, None] * K + kk[None, :],
                 round_to(acc_p, dt, ROUND_BF16_RTNE), mask=e_ok[:, None] & k_mask)
    if pid_k == 0:              # the column sums, once per head
        if db_ptr is not None:
            tl.store(db_ptr + n0 + d_a, db_a, mask=j_ok)
            tl.store(db_ptr + n0 + d_b, db_b, mask=j_ok)
            if HAS_PASS:
                tl.store(db_ptr + n0 + e, db_p, mask=e_ok)
        if dnorm_ptr is not None:
            if h < NQK:
                tl.store(dnorm_ptr + n0 + d_a, gw_a, mask=j_ok)
                tl.store(dnorm_ptr + n0 + d_b, gw_b, mask=j_ok)
                if HAS_PASS:
                    tl.store(dnorm_ptr + n0 + e, gw_p, mask=e_ok)

# --- host side: tiles, plans, launches -------------------------------------------------------

# each kernel's pointer arguments, in its order (an unused one is None)
# The forward and dX read every token's cos and s' rows (qkv_linear.cos_sin_rows) as cos_ptr and
# sin_ptr; dW reads the table and the positions and evaluates sin and cos itself (the header)
_NORM = ("norm_q_ptr", "norm_k_ptr", "rstd_ptr", "pre_ptr")
_ROWS = ("cos_ptr", "sin_ptr") + _NORM
_TABLES = ("cos_ptr", "sin_ptr", "pos_ptr", "cu_seqlens_ptr") + _NORM
FWD_POINTERS = ("x_ptr", "w_ptr", "bias_ptr", "q_ptr", "k_ptr", "v_ptr") + _ROWS + (
    "pairs_differ_ptr",)
DX_POINTERS = ("gq_ptr", "gk_ptr", "gv_ptr", "w_ptr", "dx_ptr") + _ROWS
DW_POINTERS = ("gq_ptr", "gk_ptr", "gv_ptr", "x_ptr", "dw_ptr", "db_ptr", "dnorm_ptr") + _TABLES
LAYOUT = {"bshd": 1, "bhsd": 2}     # as kernels/common.contiguous_strides numbers them
FWD = DirectLauncher(_qkv_rope_fwd_kernel, FWD_POINTERS)
FWD_TMA = DirectLauncher(_qkv_rope_fwd_tma_kernel, FWD_POINTERS)
DX = DirectLauncher(_qkv_rope_dx_kernel, DX_POINTERS)
DW = DirectLauncher(_qkv_rope_dw_kernel, DW_POINTERS)
LAUNCHERS = {"fwd": FWD, "dx": DX, "dw": DW}    # each kind's launcher (its pointer_names)


def _pow2_between(n, lo: int, hi: int) -> int:
    """The power of two >= n, clamped to [lo, hi]; hi for a symbolic n (torch.compile with
    dynamic shapes), so that a new length is no new guard and no recompilation."""
    if isinstance(n, torch.SymInt):
        return hi
    p = lo
    while p < hi and p < n:
        p *= 2
    return p


def pick_tiles(kind: str, M, K, device: torch.device, norm: bool = False,
               row_bytes: int = 0) -> dict:
    """BLOCK_M, BLOCK_K, GROUP_M, num_warps, num_stages of one of the three kernels ("fwd",
    "dx", "dw"; `norm`: with QK-norm weights; `row_bytes`: one head's row, D x the element
    size). GPU: GPU_TILES, "<kind>_norm" where the norm has a tile of its own, and
    GPU_TILES_LONG_ROWS for rows of more than LONG_ROW_BYTES. Interpreter: tiles that fit the
    (small) problem, since every program instance costs milliseconds there."""
    if device.type == "cuda" and not INTERPRET:
        table = tile_table(row_bytes)
        return dict(table.get(f"{kind}_norm" if norm else kind, table[kind]))
    return dict(BLOCK_M=_pow2_between(M, 16, 64), BLOCK_K=_pow2_between(K, 16, 64), GROUP_M=8,
                num_warps=4, num_stages=1)


def tile_table(row_bytes: int) -> dict:
    """The GPU tiles for heads whose row (D x the element size) is `row_bytes` long:
    GPU_TILES_LONG_ROWS past LONG_ROW_BYTES, else GPU_TILES (what pick_tiles reads)."""
    return GPU_TILES_LONG_ROWS if row_bytes > LONG_ROW_BYTES else GPU_TILES


def _needs_int64(*sizes) -> bool:
    return any(n > 2**31 - 1 - 1024 for n in sizes)


# The persistent TMA forward's tiles (BLOCK_M, BLOCK_K, GROUP_M, warps, stages) on a GPU: two
# heads a tile at 128 tokens, 8 warps, 3 stages (the fused candidate of
# benchmarks/qkv_mainloop_probe.py, H200); fp32 at half the K step, so three stages fit
# in shared memory
TMA_TILES = {2: dict(BLOCK_M=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
             4: dict(BLOCK_M=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)}
TMA_PROGRAMS_INTERPRETED = 4        # the interpreter's programs (each walks several tiles)


def uses_tma(K, HQ: int, HK: int, D: int, R: int, itemsize: int,
             device: torch.device) -> bool:
    """Does the forward run on the persistent TMA main loop (_qkv_rope_fwd_tma_kernel)? Where
    both head counts are even (a tile takes two heads), every feature is rotated, D/2 is a
    power of two, 16 <= D <= 128 (two heads are one tl.dot operand of at most 256 columns) and
    x's rows are a multiple of 16 bytes (TMA's rule for strides), on a GPU with TMA (compute
    capability 9 or newer) or in the interpreter, with a Triton that makes TMA descriptors in
    a kernel (TENSOR_DESCRIPTORS). The caller hands it x and the weight 16-byte aligned
    (qkv_linear). Measured on an H200 (benchmarks/qkv_forward_ab.py), one head a tile
    ran slower than the pointer-loaded kernel, so odd head counts keep that kernel."""
    half = D // 2
    if HQ % 2 or HK % 2 or R != D or half & (half - 1) or not 16 <= D <= 128 \
            or (K * itemsize) % 16 or not TENSOR_DESCRIPTORS:
        return False
    return INTERPRET or has_tma(device)


# TMA descriptors made in a kernel (tl.make_tensor_descriptor); a Triton without them keeps the
# pointer-loaded forward
TENSOR_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor")


def has_tma(device: torch.device) -> bool:
    """A GPU with TMA (tiles.hopper_or_newer)."""
    return hopper_or_newer(device)


def _programs(device: torch.device) -> int:
    """The TMA forward's programs: one per SM (tiles.multiprocessors), 4 in the interpreter."""
    return TMA_PROGRAMS_INTERPRETED if INTERPRET else multiprocessors(device)


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


try:        # (imported once: ensure_allocator runs at every TMA forward)
    from triton.runtime import _allocation
except ImportError:
    _allocation = None


def ensure_allocator() -> None:
    """Device-side TMA descriptors need a scratch buffer per launch, which Triton's launcher
    asks of the allocator set with triton.set_allocator: set one (torch's caching allocator)
    where this thread has none, and leave a caller's own alone. (A Triton without this module
    is left as it is: its launcher then says that no allocator was set.)"""
    try:
        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except AttributeError:      # (no _allocation, or one without these names)
        return
    if unset:
        triton.set_allocator(_scratch)


def per_entry(ids) -> bool:
    """Do positions (and so the forward's cos/sin rows) differ between batch entries? Position
    ids of one row per entry ([B, S], B > 1) do; [1, S] ids, packed sequences and the token
    index serve every entry alike."""
    return ids is not None and ids.shape[0] > 1


def plan(kind: str, *, S, B, K, HQ, HK, D, R, P, ids, cu_seqlens, layout: str,
         interleaved: bool, eps: float, device: torch.device, dtypes: tuple,
         rotate: bool = True, shared_angle: bool = False) -> Launch:
    """The launch of one kernel ("fwd", "dx" or "dw") for x [M = B S, K] and HQ, HK heads of D
    features (R rotated), positions from `ids` ([B or 1, S]) or `cu_seqlens` or the token
    index and a table of P rows; the forward reads the cos and s' rows of launch.
    plan_cos_sin_rows for those (per batch entry when `ids` has one row per entry). `dtypes`:
    its pointers' dtypes (None for None) in *_POINTERS order.
    Sees only sizes, dtypes and options, never values. rotate=False: the same GEMM without the
    norm and the rotation (benchmarks/qkv_rope_bench.py's baseline). shared_angle: both members
    of every pair have one angle (table-free Angles), so the TMA forward reads one cos and one
    sin tile of the rows where it would read four."""
    M, N = S * B, (HQ + 2 * HK) * D
    launcher = LAUNCHERS[kind]
    norm = rotate and dtypes[launcher.pointer_names.index("norm_q_ptr")] is not None
    t = pick_tiles(kind, M, K, device, norm=norm, row_bytes=D * dtypes[0].itemsize)
    args = dict(S=S, B=B, K=K, HQ=HQ, HK=HK, P=P,
                N_SEQ=cu_seqlens.shape[0] - 1 if cu_seqlens is not None else 0,
                D=D, R=R, LAYOUT=LAYOUT[layout], INTERLEAVED=interleaved,
                IDS_PER_ENTRY=per_entry(ids), ROWS_PER_ENTRY=per_entry(ids), ROTATE=rotate,
                BLOCK_M=t["BLOCK_M"], BLOCK_K=t["BLOCK_K"], GROUP_M=t["GROUP_M"],
                INT64=_needs_int64(M * K, M * N, N * K))
    if kind == "fwd" and uses_tma(K, HQ, HK, D, R, dtypes[0].itemsize, device):
        launcher = FWD_TMA
        if not INTERPRET:
            t = dict(TMA_TILES[min(dtypes[0].itemsize, 4)])
            args.update(BLOCK_M=t["BLOCK_M"], BLOCK_K=t["BLOCK_K"], GROUP_M=t["GROUP_M"])
            ensure_allocator()
        programs = _programs(device)
        grid = (programs,)
        args = dict(args, eps=eps, PROGRAMS=programs, SHARED_ANGLE=shared_angle)
    elif kind == "fwd":
        grid = (cdiv(M, t["BLOCK_M"]) * (HQ + 2 * HK),)
        args = dict(args, eps=eps)
    elif kind == "dx":
        grid = (cdiv(M, t["BLOCK_M"]) * cdiv(K, t["BLOCK_K"]),)
    else:
        grid = ((HQ + 2 * HK) * cdiv(K, t["BLOCK_K"]),)
    return Launch(grid, t["num_warps"], {n: args[n] for n in _scalar_args(launcher)},
                  tuple(dtypes), device, launcher, num_stages=t["num_stages"])


def _scalar_args(launcher: DirectLauncher) -> list:
    """Every argument of the launcher's kernel but the pointers, in the kernel's order."""
    names = _SCALAR_ARGS.get(launcher)
    if names is None:
        names = _SCALAR_ARGS[launcher] = [n for n in launcher.kernel.arg_names
                                          if n not in launcher.pointer_names]
    return names


_SCALAR_ARGS = {}


def pointers(kind: str, **given) -> tuple:
    """A kernel's pointer tuple in its launcher's order from the named ones (`x_ptr=x`, ...);
    the others None. An unknown name raises, naming the kind's pointers."""
    names = LAUNCHERS[kind].pointer_names
    unknown = set(given) - set(names)
    if unknown:
        raise TypeError(f"{kind} kernel has no pointer {sorted(unknown)}; it takes {names}")
    return tuple(given.get(n) for n in names)


def run(launch: Launch, pointers: tuple) -> None:
    """Start a planned launch (pointers in its kernel's *_POINTERS order) the way every kernel
    family starts: eagerly through the direct launcher, while torch.compile or another tracer is
    at work through torch.library.wrap_triton, in the interpreter as Python (planning.start)."""
    start(launch.launcher, launch, pointers)
