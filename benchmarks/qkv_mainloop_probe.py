"""The QKV projection's GEMM mainloop alone, three ways, against cuBLAS: which one a fused RoPE
epilogue could sit on (RoPE in the QKV projection, kernels/qkv_gemm.py).

The fused forward cannot beat cuBLAS followed by a RoPE pass until its GEMM is close to
cuBLAS's: ropelib's Triton GEMM without the rotation (`qkv_gemm`, ROTATE=False) takes 0.697 ms
against cuBLAS's 0.615 at 8192 tokens on an H200 (results/qkv_tiles-nvidia-h200.csv). Its
mainloop differs from a plain Triton GEMM in three ways this probe separates:

    product     kernels/qkv_gemm's forward, ROTATE=False: a head's D columns as two
                accumulators [BLOCK_M, D/2] (the rotate-half pairs' rows gathered), masked
                loads along M and K
    pointers    one accumulator [BLOCK_M, BLOCK_N], BLOCK_N a multiple of the head dim,
                unmasked pointer loads (M, N and K divisible by the tile), grouped order
    descriptors the same with TMA loads (triton.tools.tensor_descriptor.TensorDescriptor)
    persistent  the descriptors' GEMM with one program per SM walking the tiles, its tile loop
                and K loop flattened into one (tl.range(flatten=True)), so the pipeline runs
                on into the next tile: the shape of Triton's persistent TMA matmul (tutorial
                09), the way past a grid of short-lived programs that each fill and drain it
    fused       the candidate a RoPE epilogue sits on: the descriptors' mainloop with one
                head per program (one accumulator, or two: the pairs' halves), q and k rotated
                and q, k, v stored by TMA in halves; and the same on the persistent mainloop,
                one head or two a tile (two heads share their rows' cos and sin), its epilogue
                branch-free (loop flattening takes no branch), with TMA or with pointer loads

Every variant computes y = x W^T [M, N] for Llama-3-8B's projection (hidden 4096, 32 + 8 + 8
heads of 128, bf16); the timed rows are ratios to cuBLAS's `torch.nn.functional.linear` in the
same run.

    python benchmarks/qkv_mainloop_probe.py [--tokens 8192 32768] [--out CSV]   # GPU: time
        [--only VARIANT ...] [--rounds N]     # some variants, N interleaved rounds, medians
    python benchmarks/qkv_mainloop_probe.py --sass            # no GPU needed: sm_90 registers,
                                                              # spills, MMA and TMA instructions
    TRITON_INTERPRET=1 python benchmarks/qkv_mainloop_probe.py --check   # small, any machine
"""
import argparse
import itertools
import os
import re
import statistics
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

import ropelib  # noqa: E402  (the unfused pipeline's RoPE)
# the product's tl.dot (bf16 widened in the interpreter) and its grouped program order
from ropelib.kernels.qkv_gemm import _grouped, _mma  # noqa: E402

HIDDEN, HQ, HK, D = 4096, 32, 8, 128
N = (HQ + 2 * HK) * D


@triton.jit
def _gemm_pointers(x_ptr, w_ptr, y_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):
    # y [M, N] = x [M, K] @ w [N, K]^T; one program per (BLOCK_M, BLOCK_N) tile, grouped order;
    # M, N, K divisible by the tile (no masks)
    pid_m, pid_n = _grouped(tl.program_id(0), M // BLOCK_M, N // BLOCK_N, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + m[:, None] * K + kk[None, :]         # [BLOCK_M, BLOCK_K]
    w_cols = w_ptr + n[None, :] * K + kk[:, None]         # [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = _mma(tl.load(x_rows + k0), tl.load(w_cols + k0), acc, "tf32")
    tl.store(y_ptr + m[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty))


@triton.jit
def _gemm_descriptors(x_desc, w_desc, y_desc, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
    # the same, with the tiles moved by TMA: x_desc blocks [BLOCK_M, BLOCK_K], w_desc
    # [BLOCK_N, BLOCK_K], y_desc [BLOCK_M, BLOCK_N]
    pid_m, pid_n = _grouped(tl.program_id(0), M // BLOCK_M, N // BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = _mma(x_desc.load([m0, k0]), w_desc.load([n0, k0]).T, acc, "tf32")
    y_desc.store([m0, n0], acc.to(y_desc.dtype))


@triton.jit
def _gemm_persistent(x_desc, w_desc, y_desc, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr):
    # The descriptors' GEMM, persistent: PROGRAMS programs (one per SM) take the tiles in
    # grouped order, tile t going to program t % PROGRAMS. The tile loop and the K loop are one
    # flattened loop, so the pipeliner keeps loading across a tile's end: the next tile's first
    # K blocks arrive while this one's last MMAs and its store run.
    tiles_m = M // BLOCK_M
    tiles_n = N // BLOCK_N
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped(tile, tiles_m, tiles_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = _mma(x_desc.load([m0, k0]), w_desc.load([n0, k0]).T, acc, "tf32")
        y_desc.store([m0, n0], acc.to(y_desc.dtype))


@triton.jit
def _qkv_rope_descriptors(x_desc, w_desc, q_desc, k_desc, v_desc, theta_ptr, M, S, K, HQ, HK,
                          BLOCK_M: tl.constexpr, D: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, TWO_ACC: tl.constexpr,
                          COS_SIN_TABLE: tl.constexpr):
    # The fused candidate: the descriptors' mainloop with a whole head per program, then for
    # q and k heads the rotate-half epilogue, one angle per pair (both members share cos and
    # sin), row m % S: theta_ptr holds the angles [S, D/2] fp32 (cos and sin evaluated here,
    # libdevice's), or with COS_SIN_TABLE cos [S, D/2] then sin [S, D/2], fp32, loaded.
    # q, k, v are [M, heads * D] (bshd with B S = M), written
    # by TMA as two [BLOCK_M, D/2] halves, so the rotated halves are never joined.
    #   TWO_ACC False: one [BLOCK_M, D] accumulator (w_desc blocks [D, BLOCK_K]: one
    #     m64nDk16 MMA per step); the pairs (j, j + D/2) sit D/2 columns apart in it, so it is
    #     reshaped to [BLOCK_M, 2, D/2], the halves moved last and split (Triton chooses how
    #     the registers move).
    #   TWO_ACC True: two [BLOCK_M, D/2] accumulators, one per half of the head's weight rows
    #     (w_desc blocks [D/2, BLOCK_K]: two m64n(D/2)k16 MMAs per step), nothing to split.
    HALF: tl.constexpr = D // 2
    pid_m, h = _grouped(tl.program_id(0), M // BLOCK_M, HQ + 2 * HK, GROUP_M)
    m0 = pid_m * BLOCK_M
    if TWO_ACC:
        a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
        b = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xt = x_desc.load([m0, k0])
            a = _mma(xt, w_desc.load([h * D, k0]).T, a, "tf32")
            b = _mma(xt, w_desc.load([h * D + HALF, k0]).T, b, "tf32")
    else:
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = _mma(x_desc.load([m0, k0]), w_desc.load([h * D, k0]).T, acc, "tf32")
        a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
    _rope_epilogue(a, b, m0, h, q_desc, k_desc, v_desc, theta_ptr, S, HQ, HK, BLOCK_M, D,
                   COS_SIN_TABLE)


@triton.jit
def _rope_epilogue(a, b, m0, h, q_desc, k_desc, v_desc, theta_ptr, S, HQ, HK,
                   BLOCK_M: tl.constexpr, D: tl.constexpr, COS_SIN_TABLE: tl.constexpr):
    # a, b [BLOCK_M, D/2] fp32: head h's two halves for rows m0..m0+BLOCK_M; q and k heads
    # rotated (one angle per pair, row m % S), v stored as is; each written by TMA in halves
    HALF: tl.constexpr = D // 2
    if h < HQ + HK:
        pos = (m0 + tl.arange(0, BLOCK_M)) % S                          # [BLOCK_M]
        row = theta_ptr + pos[:, None] * HALF + tl.arange(0, HALF)[None, :]
        if COS_SIN_TABLE:
            c, s = tl.load(row), tl.load(row + S * HALF)                 # [BLOCK_M, HALF]
        else:
            theta = tl.load(row)
            c, s = tl.cos(theta), tl.sin(theta)
        ya = (a * c - b * s).to(q_desc.dtype)
        yb = (b * c + a * s).to(q_desc.dtype)
        if h < HQ:
            q_desc.store([m0, h * D], ya)
            q_desc.store([m0, h * D + HALF], yb)
        else:
            k_desc.store([m0, (h - HQ) * D], ya)
            k_desc.store([m0, (h - HQ) * D + HALF], yb)
    else:
        v_desc.store([m0, (h - HQ - HK) * D], a.to(v_desc.dtype))
        v_desc.store([m0, (h - HQ - HK) * D + HALF], b.to(v_desc.dtype))


@triton.jit
def _qkv_rope_persistent(x_desc, w_desc, y_desc, theta_ptr, M, S, K, HQ, HK,
                         BLOCK_M: tl.constexpr, D: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr,
                         COS_SIN_TABLE: tl.constexpr, FLATTEN: tl.constexpr,
                         HEADS: tl.constexpr):
    # The fused candidate on the persistent mainloop: PROGRAMS programs (one per SM) walk the
    # (BLOCK_M rows, HEADS heads) tiles in grouped order, tile t going to program t % PROGRAMS.
    # With FLATTEN the tile loop and the K loop are one loop, so the next tile's first K blocks
    # load while this one's epilogue rotates and stores. One [BLOCK_M, HEADS D] accumulator
    # (w_desc blocks [HEADS D, BLOCK_K]), split into its heads' halves after the K loop; with
    # HEADS 2 the tile's two heads share the rows' cos and sin, loaded once (HQ and HK even).
    # The epilogue has no branch (Triton's loop flattening takes none): q, k and v are column
    # ranges of one y [M, (HQ + 2 HK) D] (y_desc blocks [BLOCK_M, D/2]), and a v head is
    # "rotated" by cos 1, sin 0 (its table loads masked off, so they move no bytes).
    HALF: tl.constexpr = D // 2
    tiles_m = M // BLOCK_M
    tiles_n = (HQ + 2 * HK) // HEADS
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped(tile, tiles_m, tiles_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        h = pid_n * HEADS                                               # the tile's first head
        acc = tl.zeros((BLOCK_M, HEADS * D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = _mma(x_desc.load([m0, k0]), w_desc.load([h * D, k0]).T, acc, "tf32")
        j = tl.arange(0, HALF)
        rotate = (j + tl.where(h < HQ + HK, 0, HALF) < HALF)[None, :]  # [1, HALF]: q or k
        pos = (m0 + tl.arange(0, BLOCK_M)) % S                          # [BLOCK_M]
        row = theta_ptr + pos[:, None] * HALF + j[None, :]
        if COS_SIN_TABLE:
            c = tl.load(row, mask=rotate, other=1.0)                     # [BLOCK_M, HALF]
            s = tl.load(row + S * HALF, mask=rotate, other=0.0)
        else:
            theta = tl.load(row, mask=rotate, other=0.0)
            c, s = tl.cos(theta), tl.sin(theta)
        if HEADS == 1:
            a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
            y_desc.store([m0, h * D], (a * c - b * s).to(y_desc.dtype))
            y_desc.store([m0, h * D + HALF], (b * c + a * s).to(y_desc.dtype))
        else:
            # [BLOCK_M, head, half, HALF] -> [BLOCK_M, HALF, head, half], split twice
            a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, 2, HALF)), (0, 3, 1, 2)))
            a0, a1 = tl.split(a)
            b0, b1 = tl.split(b)
            y_desc.store([m0, h * D], (a0 * c - b0 * s).to(y_desc.dtype))
            y_desc.store([m0, h * D + HALF], (b0 * c + a0 * s).to(y_desc.dtype))
            y_desc.store([m0, h * D + D], (a1 * c - b1 * s).to(y_desc.dtype))
            y_desc.store([m0, h * D + D + HALF], (b1 * c + a1 * s).to(y_desc.dtype))


@triton.jit
def _member_rotate(a, b, r, wa, wb, c_a, s_a, c_b, s_b):
    # one head's halves a, b [BLOCK_M, HALF]: RMS-normed (r [BLOCK_M, 1], weights wa, wb
    # [1, HALF]) and rotated with each member's own cos and sin, as the product's rows give them
    a = a * r * wa
    b = b * r * wb
    return tl.fma(a, c_a, -(b * s_a)), tl.fma(b, c_b, a * s_b)


@triton.jit
def _qkv_rope_persistent_rows(x_desc, w_desc, y_desc, cos_ptr, sin_ptr, nw_ptr, M, S, K, HQ, HK,
                              eps, BLOCK_M: tl.constexpr, D: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                              PROGRAMS: tl.constexpr, NORM: tl.constexpr,
                              SHARED: tl.constexpr):
    # The two-head persistent candidate with the product's epilogue inputs: every token's cos
    # rows and signed sine rows [S, D] fp32 (kernels/qkv_gemm's pre-pass: each member of a pair
    # its own cos and sin, c_a at feature j, c_b at j + D/2, s'_a = -s_a), and with NORM the
    # RMS norm of each q and k head before the rotation (nw_ptr [2, D]: q's weight, then k's).
    # Four [BLOCK_M, D/2] fp32 tiles of cos/sin where the table candidate holds two: what the
    # product's forward would carry onto this mainloop. v heads: cos 1, sin 0, no norm.
    # SHARED: both members of a pair at one angle (an angle table that repeats every frequency,
    # or Angles), so one cos and one sin tile are read, c_b = c_a and s_a = s_b, as in the
    # table candidate.
    HALF: tl.constexpr = D // 2
    tiles_m = M // BLOCK_M
    tiles_n = (HQ + 2 * HK) // 2
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS):
        pid_m, pid_n = _grouped(tile, tiles_m, tiles_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        h = pid_n * 2
        acc = tl.zeros((BLOCK_M, 2 * D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = _mma(x_desc.load([m0, k0]), w_desc.load([h * D, k0]).T, acc, "tf32")
        j = tl.arange(0, HALF)
        qk = h < HQ + HK
        on = j + tl.where(qk, 0, HALF) < HALF                           # [HALF]: q or k
        rotate = on[None, :]
        row = ((m0 + tl.arange(0, BLOCK_M)) % S)[:, None] * D + j[None, :]
        c_a = tl.load(cos_ptr + row, mask=rotate, other=1.0)            # [BLOCK_M, HALF]
        s_b = tl.load(sin_ptr + row + HALF, mask=rotate, other=0.0)
        if SHARED:
            c_b = c_a
            s_a = s_b
        else:
            c_b = tl.load(cos_ptr + row + HALF, mask=rotate, other=1.0)
            s_a = -tl.load(sin_ptr + row, mask=rotate, other=0.0)
        a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, 2, HALF)), (0, 3, 1, 2)))
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        if NORM:
            w_row = nw_ptr + tl.where(h < HQ, 0, D) + j                 # q's or k's weight
            wa = tl.load(w_row, mask=on, other=1.0).to(tl.float32)[None, :]
            wb = tl.load(w_row + HALF, mask=on, other=1.0).to(tl.float32)[None, :]
            r0 = tl.rsqrt((tl.sum(a0 * a0, 1) + tl.sum(b0 * b0, 1)) / D + eps)[:, None]
            r1 = tl.rsqrt((tl.sum(a1 * a1, 1) + tl.sum(b1 * b1, 1)) / D + eps)[:, None]
            r0 = tl.where(qk, r0, 1.0)
            r1 = tl.where(qk, r1, 1.0)
        else:
            wa = 1.0
            wb = 1.0
            r0 = 1.0
            r1 = 1.0
        ya, yb = _member_rotate(a0, b0, r0, wa, wb, c_a, s_a, c_b, s_b)
        y_desc.store([m0, h * D], ya.to(y_desc.dtype))
        y_desc.store([m0, h * D + HALF], yb.to(y_desc.dtype))
        ya, yb = _member_rotate(a1, b1, r1, wa, wb, c_a, s_a, c_b, s_b)
        y_desc.store([m0, h * D + D], ya.to(y_desc.dtype))
        y_desc.store([m0, h * D + D + HALF], yb.to(y_desc.dtype))


def _persistent_launch(x, w, heads, bm, heads_per_tile, programs):
    """What a persistent candidate's launch needs: (M, K, d, y [M, (hq + 2 hk) d], programs),
    programs defaulting to one per SM of x's GPU and capped at the number of tiles."""
    hq, hk = heads
    assert hq % heads_per_tile == 0 and hk % heads_per_tile == 0, (heads, heads_per_tile)
    M, K = x.shape
    d = w.shape[0] // (hq + 2 * hk)
    y = torch.empty(M, w.shape[0], dtype=x.dtype, device=x.device)
    if programs is None:
        programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    return M, K, d, y, min(programs, (M // bm) * (hq + 2 * hk) // heads_per_tile)


def _qkv_views(y, heads, d):
    """q, k, v as the column ranges of the joined output y."""
    hq, hk = heads
    return y[:, : hq * d], y[:, hq * d:(hq + hk) * d], y[:, (hq + hk) * d:]


def run_fused_rows(x, w, rows, S, heads, tile, norm_weights=None, eps=1e-6, programs=None,
                   shared=False):
    """The two-head persistent candidate on the product's rows: rows = (cos [S, D], signed
    sine [S, D]) fp32 (product_rows); norm_weights [2, D] (q's, k's) or None; shared: read one
    cos and one sin per pair (the rows' halves are equal)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bk, group, warps, stages = tile
    hq, hk = heads
    M, K, d, y, programs = _persistent_launch(x, w, heads, bm, 2, programs)
    _qkv_rope_persistent_rows[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [2 * d, bk]),
        TensorDescriptor.from_tensor(y, [bm, d // 2]), rows[0], rows[1], norm_weights, M, S, K,
        hq, hk, eps, BLOCK_M=bm, D=d, BLOCK_K=bk, GROUP_M=group, PROGRAMS=programs,
        NORM=norm_weights is not None, SHARED=shared, num_warps=warps, num_stages=stages)
    return _qkv_views(y, heads, d)


def product_rows(theta):
    """The product's pre-pass rows for angles theta [S, D/2] (both members of a pair at one
    angle): cos [S, D] and the signed sine [S, D] (-sin for the first member, sin for the
    second), fp32."""
    c, s = theta.cos(), theta.sin()
    return torch.cat((c, c), 1).contiguous(), torch.cat((-s, s), 1).contiguous()


def norm_reference(y, weight, eps):
    """y [M, heads * D] fp32, each head RMS-normed with weight [D]."""
    M, d = y.shape[0], weight.shape[0]
    h = y.reshape(M, -1, d)
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight).reshape(M, -1)


@triton.jit
def _qkv_rope_persistent_pointers(x_ptr, w_ptr, y_ptr, theta_ptr, M, S, K, HQ, HK,
                                  BLOCK_M: tl.constexpr, D: tl.constexpr, BLOCK_K: tl.constexpr,
                                  GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr,
                                  HEADS: tl.constexpr):
    # _qkv_rope_persistent (cos/sin table, not flattened) with pointer loads and stores instead
    # of TMA: what the persistent grid and the tile of two heads give without descriptors.
    # M, K divisible by the tile (no masks); y [M, (HQ + 2 HK) D].
    HALF: tl.constexpr = D // 2
    N = (HQ + 2 * HK) * D
    tiles_m = M // BLOCK_M
    tiles_n = (HQ + 2 * HK) // HEADS
    kk = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS):
        pid_m, pid_n = _grouped(tile, tiles_m, tiles_n, GROUP_M)
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        h = pid_n * HEADS
        n = h * D + tl.arange(0, HEADS * D)
        x_rows = x_ptr + m[:, None] * K + kk[None, :]                  # [BLOCK_M, BLOCK_K]
        w_cols = w_ptr + n[None, :] * K + kk[:, None]                  # [BLOCK_K, HEADS D]
        acc = tl.zeros((BLOCK_M, HEADS * D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = _mma(tl.load(x_rows + k0), tl.load(w_cols + k0), acc, "tf32")
        j = tl.arange(0, HALF)
        rotate = (j + tl.where(h < HQ + HK, 0, HALF) < HALF)[None, :]
        row = theta_ptr + (m % S)[:, None] * HALF + j[None, :]
        c = tl.load(row, mask=rotate, other=1.0)
        s = tl.load(row + S * HALF, mask=rotate, other=0.0)
        out = y_ptr + m[:, None] * N + h * D + j[None, :]               # [BLOCK_M, HALF]
        dt = y_ptr.dtype.element_ty
        if HEADS == 1:
            a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
            tl.store(out, (a * c - b * s).to(dt))
            tl.store(out + HALF, (b * c + a * s).to(dt))
        else:
            a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, 2, HALF)), (0, 3, 1, 2)))
            a0, a1 = tl.split(a)
            b0, b1 = tl.split(b)
            tl.store(out, (a0 * c - b0 * s).to(dt))
            tl.store(out + HALF, (b0 * c + a0 * s).to(dt))
            tl.store(out + D, (a1 * c - b1 * s).to(dt))
            tl.store(out + D + HALF, (b1 * c + a1 * s).to(dt))


def run_fused_persistent_pointers(x, w, table, S, heads, tile, programs=None,
                                  heads_per_tile=2):
    """run_fused_persistent (cos/sin table, not flattened) with pointer loads and stores."""
    bm, bk, group, warps, stages = tile
    hq, hk = heads
    M, K, d, y, programs = _persistent_launch(x, w, heads, bm, heads_per_tile, programs)
    _qkv_rope_persistent_pointers[(programs,)](
        x, w, y, table, M, S, K, hq, hk, BLOCK_M=bm, D=d, BLOCK_K=bk, GROUP_M=group,
        PROGRAMS=programs, HEADS=heads_per_tile, num_warps=warps, num_stages=stages)
    return _qkv_views(y, heads, d)


def run_fused(x, w, theta, S, heads, tile, two_acc=False, table=False):
    """q, k, v [M, heads * D] rotated (q, k) by the descriptors' fused candidate; theta the
    angles [S, D/2], or with table=True their cos then sin, [2 S, D/2] (cos_sin_table)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bk, group, warps, stages = tile
    hq, hk = heads
    M, K = x.shape
    d = w.shape[0] // (hq + 2 * hk)
    outs = [torch.empty(M, h * d, dtype=x.dtype, device=x.device) for h in (hq, hk, hk)]
    grid = ((M // bm) * (hq + 2 * hk),)
    _qkv_rope_descriptors[grid](TensorDescriptor.from_tensor(x, [bm, bk]),
                                TensorDescriptor.from_tensor(w, [d // 2 if two_acc else d, bk]),
                                *(TensorDescriptor.from_tensor(o, [bm, d // 2]) for o in outs),
                                theta, M, S, K, hq, hk, BLOCK_M=bm, D=d, BLOCK_K=bk, GROUP_M=group,
                                TWO_ACC=two_acc, COS_SIN_TABLE=table, num_warps=warps,
                                num_stages=stages)
    return outs


def run_fused_persistent(x, w, theta, S, heads, tile, table=False, programs=None,
                         flatten=True, heads_per_tile=1):
    """run_fused on the persistent mainloop (one accumulator of heads_per_tile heads): q, k, v
    as column ranges of one [M, (hq + 2 hk) d] tensor; programs as run_persistent."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bk, group, warps, stages = tile
    hq, hk = heads
    M, K, d, y, programs = _persistent_launch(x, w, heads, bm, heads_per_tile, programs)
    _qkv_rope_persistent[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(w, [heads_per_tile * d, bk]),
        TensorDescriptor.from_tensor(y, [bm, d // 2]), theta, M, S, K, hq, hk,
        BLOCK_M=bm, D=d, BLOCK_K=bk, GROUP_M=group, PROGRAMS=programs, COS_SIN_TABLE=table,
        FLATTEN=flatten, HEADS=heads_per_tile, num_warps=warps, num_stages=stages)
    return _qkv_views(y, heads, d)


def cos_sin_table(theta):
    """The fused candidate's table: cos [S, D/2] then sin [S, D/2], fp32."""
    return torch.cat((theta.cos(), theta.sin())).contiguous()


def rope_reference(y, theta, S):
    """y [M, heads * D] rotated with rotate-half pairs, angle row m % S: fp32."""
    M = y.shape[0]
    d = 2 * theta.shape[1]
    y = y.float().reshape(M, -1, d)
    t = theta[torch.arange(M, device=y.device) % S][:, None, :]
    a, b = y[..., : d // 2], y[..., d // 2:]
    return torch.cat((a * t.cos() - b * t.sin(), b * t.cos() + a * t.sin()), -1).reshape(M, -1)


def run_pointers(x, w, tile):
    bm, bn, bk, group, warps, stages = tile
    M, K = x.shape
    y = torch.empty(M, w.shape[0], dtype=x.dtype, device=x.device)
    grid = ((M // bm) * (w.shape[0] // bn),)
    _gemm_pointers[grid](x, w, y, M, w.shape[0], K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                         GROUP_M=group, num_warps=warps, num_stages=stages)
    return y


def run_descriptors(x, w, tile):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, group, warps, stages = tile
    M, K = x.shape
    y = torch.empty(M, w.shape[0], dtype=x.dtype, device=x.device)
    grid = ((M // bm) * (w.shape[0] // bn),)
    _gemm_descriptors[grid](TensorDescriptor.from_tensor(x, [bm, bk]),
                            TensorDescriptor.from_tensor(w, [bn, bk]),
                            TensorDescriptor.from_tensor(y, [bm, bn]), M, w.shape[0], K,
                            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group,
                            num_warps=warps, num_stages=stages)
    return y


def run_persistent(x, w, tile, programs=None):
    """The persistent GEMM; programs: how many (default one per SM of x's GPU, at most the
    number of tiles)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, group, warps, stages = tile
    M, K = x.shape
    y = torch.empty(M, w.shape[0], dtype=x.dtype, device=x.device)
    tiles = (M // bm) * (w.shape[0] // bn)
    if programs is None:
        programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    programs = min(programs, tiles)
    _gemm_persistent[(programs,)](TensorDescriptor.from_tensor(x, [bm, bk]),
                                  TensorDescriptor.from_tensor(w, [bn, bk]),
                                  TensorDescriptor.from_tensor(y, [bm, bn]), M, w.shape[0], K,
                                  BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group,
                                  PROGRAMS=programs, num_warps=warps, num_stages=stages)
    return y


def run_product(x, w, tokens, joined: bool = True):
    """kernels/qkv_gemm's forward without the rotation, at its GPU tiles: q, k, v heads, joined
    into one [M, N] tensor (a copy kernel after the GEMM) unless joined=False."""
    from ropelib.kernels import qkv_gemm as QG
    from ropelib.kernels.planning import pointer_dtypes, start
    M = x.shape[0]
    outs = [torch.empty(1, M, h, D, dtype=x.dtype, device=x.device) for h in (HQ, HK, HK)]
    q, k, v = outs
    ptrs = QG.pointers("fwd", x_ptr=x, w_ptr=w, q_ptr=q, k_ptr=k, v_ptr=v)
    planned = QG.plan("fwd", S=M, B=1, K=x.shape[1], HQ=HQ, HK=HK, D=D, R=D, P=1, ids=None,
                      cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                      device=x.device, dtypes=pointer_dtypes(ptrs), rotate=False)
    start(planned.launcher, planned, ptrs)
    return torch.cat([o.reshape(M, -1) for o in outs], dim=1) if joined else outs


# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages): the plain GEMM's usual Hopper
# tiles, each BLOCK_N a multiple of the head dim (a fused epilogue needs whole heads)
TILES = [(128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 3),
         (256, 128, 64, 8, 8, 3), (128, 128, 128, 8, 8, 3), (256, 128, 64, 8, 8, 2),
         (256, 128, 32, 8, 8, 4)]
# the persistent fused candidate with two heads a tile (a [BLOCK_M, 2 D] accumulator, the
# rows' cos and sin loaded once for both): (BLOCK_M, BLOCK_K, GROUP_M, num_warps, num_stages)
TWO_HEAD_TILES = [(128, 64, 8, 8, 3), (128, 64, 8, 8, 4), (128, 32, 8, 8, 4)]
H200_SMS = 132      # the persistent GEMM's programs as compiled here (--sass): one per SM
# the fused candidate's (BLOCK_M, BLOCK_K, GROUP_M, num_warps, num_stages); BLOCK_N = D
FUSED_TILES = [(128, 64, 8, 8, 3), (128, 64, 8, 8, 4), (64, 64, 8, 4, 4), (128, 128, 8, 8, 3),
               (256, 64, 8, 8, 3), (256, 64, 8, 8, 2), (256, 32, 8, 8, 4)]


def check() -> None:
    """Small shapes (interpreter or GPU): every variant equals the fp32 product."""
    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" \
        else "cpu"
    torch.manual_seed(0)
    x = torch.randn(256, 128, device=dev).to(torch.bfloat16)
    w = torch.randn(256, 128, device=dev).to(torch.bfloat16)
    want = (x.float() @ w.float().T)
    for name, fn in (("pointers", run_pointers), ("descriptors", run_descriptors),
                     ("persistent, 3 programs for 8 tiles",
                      lambda x, w, t: run_persistent(x, w, t, programs=3))):
        got = fn(x, w, (64, 128, 64, 2, 4, 2)).float()
        err = (got - want).abs().max().item() / want.abs().max().item()
        assert err < 2**-7, (name, err)
        print(f"{name}: max error {err:.1e} of the largest output")
    hq, hk, d, S = 2, 1, 64, 96
    w = torch.randn((hq + 2 * hk) * d, 128, device=dev).to(torch.bfloat16)
    theta = (torch.rand(S, d // 2, device=dev) * 100).float()
    y = x.float() @ w.float().T
    want = [rope_reference(y[:, : hq * d], theta, S), rope_reference(y[:, hq * d:(hq + hk) * d],
                                                                      theta, S),
            y[:, (hq + hk) * d:]]
    for two_acc, table in itertools.product((False, True), (False, True)):
        got = run_fused(x, w, cos_sin_table(theta) if table else theta, S, (hq, hk),
                        (64, 64, 2, 4, 2), two_acc, table)
        errs = [(g.float() - t).abs().max().item() / t.abs().max().item()
                for g, t in zip(got, want)]
        assert max(errs) < 2**-7, (two_acc, table, errs)
        print(f"fused candidate, {'two accumulators' if two_acc else 'one accumulator'}, "
              f"{'cos/sin table' if table else 'angles'} (q, k rotated, v): max error "
              f"{max(errs):.1e} of the largest output")
    for table, flatten in itertools.product((False, True), (True, False)):
        got = run_fused_persistent(x, w, cos_sin_table(theta) if table else theta, S, (hq, hk),
                                   (64, 64, 2, 4, 2), table, programs=5, flatten=flatten)
        errs = [(g.float() - t).abs().max().item() / t.abs().max().item()
                for g, t in zip(got, want)]
        assert max(errs) < 2**-7, ("persistent", table, errs)
        print(f"fused candidate, persistent{', flattened' if flatten else ''}, 5 programs for "
              f"16 tiles, {'cos/sin table' if table else 'angles'}: max error {max(errs):.1e} "
              f"of the largest output")
    hq, hk = 2, 2                       # two heads a tile: q's and k's head counts even
    w = torch.randn((hq + 2 * hk) * d, 128, device=dev).to(torch.bfloat16)
    y = x.float() @ w.float().T
    want = [rope_reference(y[:, : hq * d], theta, S), rope_reference(y[:, hq * d:(hq + hk) * d],
                                                                      theta, S),
            y[:, (hq + hk) * d:]]
    for table in (False, True):
        got = run_fused_persistent(x, w, cos_sin_table(theta) if table else theta, S, (hq, hk),
                                   (64, 64, 2, 4, 2), table, programs=5, heads_per_tile=2)
        errs = [(g.float() - t).abs().max().item() / t.abs().max().item()
                for g, t in zip(got, want)]
        assert max(errs) < 2**-7, ("persistent, two heads", table, errs)
        print(f"fused candidate, persistent, two heads a tile, 5 programs for 12 tiles, "
              f"{'cos/sin table' if table else 'angles'}: max error {max(errs):.1e} of the "
              f"largest output")
    nw = (1 + 0.1 * torch.randn(2, d, device=dev)).to(torch.bfloat16)
    for weights in (None, nw):
        want_qk = y[:, :(hq + hk) * d]
        if weights is not None:
            want_qk = torch.cat((norm_reference(y[:, : hq * d], weights[0].float(), 1e-6),
                                 norm_reference(y[:, hq * d:(hq + hk) * d], weights[1].float(),
                                                1e-6)), 1)
        want_rows = [rope_reference(want_qk[:, : hq * d], theta, S),
                     rope_reference(want_qk[:, hq * d:], theta, S), y[:, (hq + hk) * d:]]
        for shared in (False, True):
            got = run_fused_rows(x, w, product_rows(theta), S, (hq, hk), (64, 64, 2, 4, 2),
                                 weights, programs=5, shared=shared)
            errs = [(g.float() - t).abs().max().item() / t.abs().max().item()
                    for g, t in zip(got, want_rows)]
            assert max(errs) < 2**-7, ("persistent rows", weights is not None, shared, errs)
            print(f"fused candidate, persistent, two heads, the product's cos/sin rows"
                  f"{', one per pair' if shared else ''}"
                  f"{', QK-norm' if weights is not None else ''}: max error {max(errs):.1e} "
                  f"of the largest output")
    for heads in (1, 2):
        got = run_fused_persistent_pointers(x, w, cos_sin_table(theta), S, (hq, hk),
                                            (64, 64, 2, 4, 2), programs=5, heads_per_tile=heads)
        errs = [(g.float() - t).abs().max().item() / t.abs().max().item()
                for g, t in zip(got, want)]
        assert max(errs) < 2**-7, ("persistent pointers", heads, errs)
        print(f"fused candidate, persistent, pointer loads, {heads} head(s) a tile, cos/sin "
              f"table: max error {max(errs):.1e} of the largest output")


def _signature(name: str, bm: int, bn: int, bk: int) -> dict:
    """The kernel's argument types as a launch with contiguous bf16 tensors gives them."""
    if name == "pointers":
        tensors = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16"}
    else:
        tensors = {"x_desc": f"tensordesc<bf16[{bm},{bk}]>",
                   "w_desc": f"tensordesc<bf16[{bn},{bk}]>",
                   "y_desc": f"tensordesc<bf16[{bm},{bn}]>"}
    extra = {"PROGRAMS": "constexpr"} if name == "persistent" else {}
    return dict(tensors, M="i32", N="i32", K="i32", BLOCK_M="constexpr", BLOCK_N="constexpr",
                BLOCK_K="constexpr", GROUP_M="constexpr", **extra)


def _compile_sm90(kernel, signature: dict, constexprs: dict, warps: int, stages: int):
    """(registers, stack bytes, shared bytes, the SASS) of a kernel compiled for sm_90 here."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    n_args = sum(1 for v in signature.values() if v != "constexpr")
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_args)}   # as a launch sees them
    from gpu_compile_check import machine_code     # tests/: the cubin read as SASS and usage
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    code, regs, stack = machine_code(compiled)
    return regs, stack, compiled.metadata.shared, code


def _report(label: str, compiled) -> None:
    regs, stack, shared, code = compiled
    mma = sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", code)))
    print(f"{label}: {regs} registers, stack {stack} B, shared {shared} B, HGMMA {mma} "
          f"x{code.count('HGMMA.')}, TMA loads {code.count('UTMALDG')}, TMA stores "
          f"{code.count('UTMASTG')}, cp.async {code.count('LDGSTS')}")


def _compile_and_report(label: str, kernel, signature: dict, constexprs: dict, warps: int,
                        stages: int) -> None:
    """Compile for sm_90 here and print _report's line, or why it does not compile."""
    try:
        compiled = _compile_sm90(kernel, signature, constexprs, warps, stages)
    except Exception as e:  # noqa: BLE001 -- report and go on
        print(f"{label}: does not compile ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:120]})")
        return
    _report(label, compiled)


def sass() -> None:
    """Compile each variant for sm_90 here (no GPU) and count what the SASS holds."""
    for name, kernel in (("pointers", _gemm_pointers), ("descriptors", _gemm_descriptors),
                         ("persistent", _gemm_persistent)):
        for bm, bn, bk, group, warps, stages in TILES:
            label = f"{name:12s} {bm}x{bn}x{bk} w{warps} s{stages}"
            extra = {"PROGRAMS": H200_SMS} if name == "persistent" else {}
            _compile_and_report(label, kernel, _signature(name, bm, bn, bk),
                                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                 "GROUP_M": group, **extra}, warps, stages)
    for (bm, bk, group, warps, stages), two_acc, table in itertools.product(
            FUSED_TILES, (False, True), (False, True)):
        label = (f"fused {'2 acc' if two_acc else '1 acc'} {'table ' if table else 'angles'} "
                 f"{bm}x{D}x{bk} w{warps} s{stages}")
        signature = {"x_desc": f"tensordesc<bf16[{bm},{bk}]>",
                     "w_desc": f"tensordesc<bf16[{D // 2 if two_acc else D},{bk}]>",
                     **{n: f"tensordesc<bf16[{bm},{D // 2}]>" for n in ("q_desc", "k_desc",
                                                                        "v_desc")},
                     "theta_ptr": "*fp32", "M": "i32", "S": "i32", "K": "i32", "HQ": "i32",
                     "HK": "i32", "BLOCK_M": "constexpr", "D": "constexpr",
                     "BLOCK_K": "constexpr", "GROUP_M": "constexpr", "TWO_ACC": "constexpr",
                     "COS_SIN_TABLE": "constexpr"}
        _compile_and_report(label, _qkv_rope_descriptors, signature,
                            {"BLOCK_M": bm, "D": D, "BLOCK_K": bk, "GROUP_M": group,
                             "TWO_ACC": two_acc, "COS_SIN_TABLE": table}, warps, stages)
    for ((bm, bk, group, warps, stages), heads), table, flatten in itertools.product(
            [(t, 1) for t in FUSED_TILES] + [(t, 2) for t in TWO_HEAD_TILES], (False, True),
            (True, False)):
        label = (f"fused persistent{' 2 heads' if heads == 2 else ''}{' flat' if flatten else ''}"
                 f" {'table ' if table else 'angles'} {bm}x{heads * D}x{bk} w{warps} s{stages}")
        signature = {"x_desc": f"tensordesc<bf16[{bm},{bk}]>",
                     "w_desc": f"tensordesc<bf16[{heads * D},{bk}]>",
                     "y_desc": f"tensordesc<bf16[{bm},{D // 2}]>",
                     "theta_ptr": "*fp32", "M": "i32", "S": "i32", "K": "i32", "HQ": "i32",
                     "HK": "i32", "BLOCK_M": "constexpr", "D": "constexpr",
                     "BLOCK_K": "constexpr", "GROUP_M": "constexpr", "PROGRAMS": "constexpr",
                     "COS_SIN_TABLE": "constexpr", "FLATTEN": "constexpr",
                     "HEADS": "constexpr"}
        _compile_and_report(label, _qkv_rope_persistent, signature,
                            {"BLOCK_M": bm, "D": D, "BLOCK_K": bk, "GROUP_M": group,
                             "PROGRAMS": H200_SMS, "COS_SIN_TABLE": table,
                             "FLATTEN": flatten, "HEADS": heads}, warps, stages)
    for (bm, bk, group, warps, stages), norm, shared in itertools.product(
            TWO_HEAD_TILES, (False, True), (False, True)):
        label = (f"fused persistent 2 heads product rows{' one per pair' if shared else ''}"
                 f"{' QK-norm' if norm else ''} {bm}x{2 * D}x{bk} w{warps} s{stages}")
        signature = {"x_desc": f"tensordesc<bf16[{bm},{bk}]>",
                     "w_desc": f"tensordesc<bf16[{2 * D},{bk}]>",
                     "y_desc": f"tensordesc<bf16[{bm},{D // 2}]>", "cos_ptr": "*fp32",
                     "sin_ptr": "*fp32", "nw_ptr": "*bf16", "M": "i32", "S": "i32", "K": "i32",
                     "HQ": "i32", "HK": "i32", "eps": "fp32", "BLOCK_M": "constexpr",
                     "D": "constexpr", "BLOCK_K": "constexpr", "GROUP_M": "constexpr",
                     "PROGRAMS": "constexpr", "NORM": "constexpr", "SHARED": "constexpr"}
        _compile_and_report(label, _qkv_rope_persistent_rows, signature,
                            {"BLOCK_M": bm, "D": D, "BLOCK_K": bk, "GROUP_M": group,
                             "PROGRAMS": H200_SMS, "NORM": norm, "SHARED": shared}, warps,
                            stages)
    for (bm, bk, group, warps, stages), heads in [(t, 2) for t in TWO_HEAD_TILES] + \
            [(FUSED_TILES[0], 1)]:
        label = (f"fused persistent pointers {heads} head(s) table {bm}x{heads * D}x{bk} "
                 f"w{warps} s{stages}")
        signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "theta_ptr": "*fp32",
                     "M": "i32", "S": "i32", "K": "i32", "HQ": "i32", "HK": "i32",
                     "BLOCK_M": "constexpr", "D": "constexpr", "BLOCK_K": "constexpr",
                     "GROUP_M": "constexpr", "PROGRAMS": "constexpr", "HEADS": "constexpr"}
        _compile_and_report(label, _qkv_rope_persistent_pointers, signature,
                            {"BLOCK_M": bm, "D": D, "BLOCK_K": bk, "GROUP_M": group,
                             "PROGRAMS": H200_SMS, "HEADS": heads}, warps, stages)


def time_all(token_counts, out, only=(), rounds=1) -> None:
    from ropelib.bench import compare
    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
        want = torch.nn.functional.linear(x, w)
        flop = 2 * tokens * N * HIDDEN
        theta = torch.arange(tokens, device="cuda", dtype=torch.float32)[:, None] * \
            (1e4 ** (-torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))[None, :]
        table = cos_sin_table(theta)
        table_bf16 = table.to(torch.bfloat16)
        prepass_rows = product_rows(theta)
        norm_weights = (1 + 0.1 * torch.randn(2, D, device="cuda")).to(torch.bfloat16)
        freqs = torch.cat((theta, theta), -1)[:, None, None, :]      # ropelib's [S, 1, 1, D]

        def unfused():      # what a user has: cuBLAS, then ropelib's RoPE on q and k
            y = torch.nn.functional.linear(x, w)
            q = y[:, : HQ * D].view(1, tokens, HQ, D)
            k = y[:, HQ * D:(HQ + HK) * D].view(1, tokens, HK, D)
            return ropelib.apply_rope_qk(q, k, freqs, layout="bshd")
        cos_bf16 = freqs.cos().to(torch.bfloat16)           # [S, 1, 1, D], as Hugging Face's
        sin_bf16 = freqs.sin().to(torch.bfloat16)           # tables are (the model's dtype)

        def unfused_table():  # the same from a cos/sin table made once, not from angles
            y = torch.nn.functional.linear(x, w)
            q = y[:, : HQ * D].view(1, tokens, HQ, D)
            k = y[:, HQ * D:(HQ + HK) * D].view(1, tokens, HK, D)
            return ropelib.apply_rope_qk(q, k, cos=cos_bf16, sin=sin_bf16, layout="bshd")
        runs = {"cublas": lambda: torch.nn.functional.linear(x, w),
                "unfused (cuBLAS + ropelib RoPE)": unfused,
                "unfused, bf16 cos/sin table": unfused_table,
                "product": lambda: run_product(x, w, tokens)}
        for ft in FUSED_TILES:
            for two_acc, use_table in itertools.product((False, True), (True, False)):
                name = (f"fused {'2 acc' if two_acc else '1 acc'} "
                        f"{'table' if use_table else 'angles'} {ft}")
                runs[name] = (lambda ft, a, t: lambda: run_fused(
                    x, w, table if t else theta, tokens, (HQ, HK), ft, a, t))(ft, two_acc,
                                                                             use_table)
            for use_table, flatten in itertools.product((True, False), (True, False)):
                name = (f"fused persistent{' flat' if flatten else ''} "
                        f"{'table' if use_table else 'angles'} {ft}")
                runs[name] = (lambda ft, t, f: lambda: run_fused_persistent(
                    x, w, table if t else theta, tokens, (HQ, HK), ft, t, flatten=f))(
                        ft, use_table, flatten)
            # the table in bf16 (half the bytes the epilogue reads; Hugging Face's tables are
            # in the model's dtype)
            runs[f"fused persistent table bf16 {ft}"] = (
                lambda ft: lambda: run_fused_persistent(x, w, table_bf16, tokens, (HQ, HK), ft,
                                                        True, flatten=False))(ft)
            # the cos/sin table made from the angles inside the call, as a caller without one
            # would have to
            runs[f"fused persistent table made in the call {ft}"] = (
                lambda ft: lambda: run_fused_persistent(x, w, cos_sin_table(theta), tokens,
                                                        (HQ, HK), ft, True, flatten=False))(ft)
        for ft in TWO_HEAD_TILES:
            runs[f"fused persistent 2 heads table made in the call {ft}"] = (
                lambda ft: lambda: run_fused_persistent(
                    x, w, cos_sin_table(theta), tokens, (HQ, HK), ft, True, flatten=False,
                    heads_per_tile=2))(ft)
            for flatten in (False, True):
                runs[f"fused persistent 2 heads{' flat' if flatten else ''} table {ft}"] = (
                    lambda ft, f: lambda: run_fused_persistent(
                        x, w, table, tokens, (HQ, HK), ft, True, flatten=f, heads_per_tile=2))(
                            ft, flatten)
        for ft, norm, shared in itertools.product(TWO_HEAD_TILES, (False, True),
                                                  (False, True)):
            name = (f"fused persistent 2 heads product rows{' one per pair' if shared else ''}"
                    f"{' QK-norm' if norm else ''} {ft}")
            runs[name] = (lambda ft, nw, sh: lambda: run_fused_rows(
                x, w, prepass_rows, tokens, (HQ, HK), ft, nw, shared=sh))(
                    ft, norm_weights if norm else None, shared)
        for ft in TWO_HEAD_TILES:
            for heads in (2, 1):
                runs[f"fused persistent pointers {heads} head(s) table {ft}"] = (
                    lambda ft, hd: lambda: run_fused_persistent_pointers(
                        x, w, table, tokens, (HQ, HK), ft, heads_per_tile=hd))(ft, heads)
        for tile in TILES:
            runs[f"pointers {tile}"] = (lambda t: lambda: run_pointers(x, w, t))(tile)
            runs[f"descriptors {tile}"] = (lambda t: lambda: run_descriptors(x, w, t))(tile)
            runs[f"persistent {tile}"] = (lambda t: lambda: run_persistent(x, w, t))(tile)
        if only:
            runs = {name: fn for name, fn in runs.items() if name in only or name == "cublas"}
        ready = {}
        for name, fn in runs.items():       # compile, check, and drop what does not fit
            try:
                got = fn()
                if name.startswith(("fused", "unfused")):   # rotated q, k: timed, not compared
                    err = None
                else:
                    err = ((got.float() - want.float()).abs().max()
                           / want.float().abs().max()).item()
            except Exception as e:  # noqa: BLE001 -- a tile that does not fit: say so
                rows.append(dict(tokens=tokens, variant=name, reason=f"{type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200]}"))
                print(f"{tokens:6d} {name:40s} failed: {rows[-1]['reason']}", flush=True)
                continue
            ready[name] = (fn, err)
        # rounds: every variant once a round, in the same order, so a slow spell of the GPU
        # falls on all of them; a variant's ratio to cuBLAS is the median of its rounds' ratios
        times = {name: [] for name in ready}
        for _ in range(rounds):
            for name, (fn, _err) in ready.items():
                times[name].append(triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8]))
        for name, (fn, err) in ready.items():
            med = statistics.median(t[0] for t in times[name])
            ratios = [c[0] / t[0] for c, t in zip(times["cublas"], times[name])]
            ratio = statistics.median(ratios)
            rows.append(dict(tokens=tokens, variant=name, ms=med,
                             ms_p20=statistics.median(t[1] for t in times[name]),
                             ms_p80=statistics.median(t[2] for t in times[name]),
                             tflops=flop / med / 1e9, cublas_ms_over_ms=ratio,
                             low=min(ratios), high=max(ratios), rounds=rounds, max_rel_err=err))
            spread = f" (rounds {min(ratios):.3f}-{max(ratios):.3f})" if rounds > 1 else ""
            print(f"{tokens:6d} {name:40s} {med:.4f} ms {flop / med / 1e9:6.0f} TFLOP/s  "
                  f"{ratio:.3f} of cuBLAS's speed{spread}", flush=True)
    if out:
        compare.write_csv(rows, out, compare.environment_meta(),
                          fields=["tokens", "variant", "ms", "ms_p20", "ms_p80", "tflops",
                                  "cublas_ms_over_ms", "low", "high", "rounds", "max_rel_err",
                                  "reason"])
        print(f"wrote {out}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", nargs="+", default=(),
                    help="time only these variants (names as printed), cuBLAS beside them")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every variant this many times, interleaved; medians")
    ap.add_argument("--sass", action="store_true", help="compile for sm_90 here, no GPU")
    ap.add_argument("--check", action="store_true", help="small shapes, every variant")
    args = ap.parse_args(argv)
    if args.check:
        check()
    elif args.sass:
        sys.path.insert(0, os.path.join(HERE, "tests"))     # gpu_compile_check.machine_code
        sass()
    else:
        time_all(args.tokens, args.out, args.only, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
