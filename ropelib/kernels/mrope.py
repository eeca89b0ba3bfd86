"""Multi-axis RoPE (M-RoPE of Qwen2-VL / Qwen3-VL, 2-D and 3-D axial RoPE): one kernel, forward
and backward, the angles formed in the kernel from per-axis positions.

Each token has a position on every axis ([N_AXES] ints: time, row, column for a video or an
image, or one position repeated for a text token). Pair j of the rotary half turns with the
position of its axis a_j at its inverse frequency w_j:

    theta[s, j] = pos[a_j, b, s] * w_j          (fp32, as transformers computes it)

`axis` [R/2] (ints) and `inv_freq` [R/2] say which pair follows which axis at which speed; they
encode every variant (ropelib.mrope builds them): Qwen2-VL's contiguous sections, Qwen3-VL's
round-robin interleaving, axial RoPE with one frequency set per axis. No [axes, B, S, R] cos/sin
tensor exists anywhere: a program reads N_AXES ints per token and R/2 frequencies.

How it is parallelised
----------------------
As the finished kernel (kernels/fused.py): every input is a strided [S, B, H, D] view (sbhd as
is, bshd with S and B swapped, thd as [T, 1, H, D]); nothing is copied. The grid is

    axis 0: blocks of BLOCK_S tokens                 cdiv(S, BLOCK_S)
    axis 1: blocks of BLOCK_H heads of q, then of k  cdiv(HQ, BLOCK_H) + cdiv(HK, BLOCK_H)
    axis 2: chunks of B_CHUNK batch entries          cdiv(B, B_CHUNK)

A program loads the positions of its BLOCK_S tokens on every axis ([BLOCK_S] each), picks for
each pair the position of its axis, forms the angles and their cos/sin once ([BLOCK_S, 1, HALF],
broadcast over its heads) and reuses them for every batch entry of its chunk, unless the
positions differ per batch entry ([N_AXES, B, S] with B > 1): then inside the batch loop. x is
read once and y written once, tile [BLOCK_S, BLOCK_H, HALF] per half. Math is fp32 (fp64 for
fp64 inputs) with one rounding at the store.

Both members of a pair share one angle, so the backward (the transpose of the rotation) is the
rotation by -theta: the same kernel with sin negated (BACKWARD).

Pairing: rotate-half pairs feature j with j + R/2 (transformers' rotate_half); interleaved pairs
2j with 2j+1. Features R..D-1 are copied through (partial rotary). A pair whose axis index is
outside [0, N_AXES) gets a NaN angle: its features come out NaN, never silently unrotated.
"""
from functools import lru_cache
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import INTERPRET
from .common import BF16_RTNE, round_to
from .direct import DirectLauncher
from .fused import _cos_sin
from .launch import Launch, _cdiv, _pow2_at_least, pick_tiles, start

_I32_LIMIT = 2**31 - 1
MAX_AXES = 4


@triton.jit
def _mrope_cos_sin(pos_ptr, inv_ptr, axis_ptr, s_idx, b, S, stride_pos_a, stride_pos_b,
                   stride_pos_s, HALF: tl.constexpr, BLOCK_S: tl.constexpr,
                   BLOCK_HALF: tl.constexpr, N_AXES: tl.constexpr, ACCURATE: tl.constexpr,
                   CDT: tl.constexpr):
    # s_idx [BLOCK_S] tokens, b batch entry -> cos, sin [BLOCK_S, 1, BLOCK_HALF]
    j = tl.arange(0, BLOCK_HALF)
    inv = tl.load(inv_ptr + j, mask=j < HALF, other=0.0).to(CDT)          # [BLOCK_HALF]
    ax = tl.load(axis_ptr + j, mask=j < HALF, other=0)                    # [BLOCK_HALF]
    # the position of each pair's axis: [BLOCK_S, BLOCK_HALF], NaN where no axis matches
    p = tl.full((BLOCK_S, BLOCK_HALF), float("nan"), CDT)
    for a in tl.static_range(N_AXES):
        p_a = tl.load(pos_ptr + a * stride_pos_a + b * stride_pos_b + s_idx * stride_pos_s,
                      mask=s_idx < S, other=0).to(CDT)                    # [BLOCK_S]
        p = tl.where((ax == a)[None, :], p_a[:, None], p)
    angle = p * inv[None, :]
    c, s = _cos_sin(angle, ACCURATE)
    return c[:, None, :], s[:, None, :]


@triton.jit
def _mrope_heads(
    x_ptr, y_ptr,                       # this segment's input and output
    pos_ptr, inv_ptr, axis_ptr,         # positions [N_AXES, B or 1, S]; frequencies, axes [R/2]
    pid_s, h0, b_lo, b_hi,              # tile origin: token block, first head, batch range
    S, H,                               # tokens, heads of this segment
    stride_x_s, stride_x_b, stride_x_h, stride_x_d,
    stride_y_s, stride_y_b, stride_y_h, stride_y_d,
    stride_pos_a, stride_pos_b, stride_pos_s,
    R: tl.constexpr, D: tl.constexpr,   # rotary dim (even), head dim
    N_AXES: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,           # next_pow2(D - R); 0 when nothing passes through
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    POS_PER_BATCH: tl.constexpr,        # positions differ per batch entry
    ACCURATE: tl.constexpr, CDT: tl.constexpr, INT64: tl.constexpr, BF16_RTNE: tl.constexpr,
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
        h_off = h_idx.to(tl.int64)
    else:
        s_off = s_idx
        h_off = h_idx
    row_ok = (s_idx < S)[:, None] & (h_idx < H)[None, :]     # [BLOCK_S, BLOCK_H]
    m = row_ok[:, :, None] & (j < HALF)[None, None, :]        # [BLOCK_S, BLOCK_H, BLOCK_HALF]
    x_rows = s_off[:, None] * stride_x_s + h_off[None, :] * stride_x_h   # [BLOCK_S, BLOCK_H]
    y_rows = s_off[:, None] * stride_y_s + h_off[None, :] * stride_y_h
    if BLOCK_PASS > 0:
        e = R + tl.arange(0, BLOCK_PASS)
        mp = row_ok[:, :, None] & (e < D)[None, None, :]

    if not POS_PER_BATCH:
        c, s = _mrope_cos_sin(pos_ptr, inv_ptr, axis_ptr, s_idx, 0, S, stride_pos_a,
                              stride_pos_b, stride_pos_s, HALF, BLOCK_S, BLOCK_HALF, N_AXES,
                              ACCURATE, CDT)
        if BACKWARD:
            s = -s
    for b in range(b_lo, b_hi):
        if INT64:
            bb = b.to(tl.int64)
        else:
            bb = b
        if POS_PER_BATCH:
            c, s = _mrope_cos_sin(pos_ptr, inv_ptr, axis_ptr, s_idx, bb, S, stride_pos_a,
                                  stride_pos_b, stride_pos_s, HALF, BLOCK_S, BLOCK_HALF,
                                  N_AXES, ACCURATE, CDT)
            if BACKWARD:
                s = -s
        xr = x_ptr + (x_rows + bb * stride_x_b)[:, :, None]    # [BLOCK_S, BLOCK_H, 1]
        yr = y_ptr + (y_rows + bb * stride_y_b)[:, :, None]
        x_a = tl.load(xr + d_a[None, None, :] * stride_x_d, mask=m, other=0.0).to(CDT)
        x_b = tl.load(xr + d_b[None, None, :] * stride_x_d, mask=m, other=0.0).to(CDT)
        y_a = round_to(x_a * c - x_b * s, y_ptr.dtype.element_ty, BF16_RTNE)
        y_b = round_to(x_b * c + x_a * s, y_ptr.dtype.element_ty, BF16_RTNE)
        tl.store(yr + d_a[None, None, :] * stride_y_d, y_a, mask=m)
        tl.store(yr + d_b[None, None, :] * stride_y_d, y_b, mask=m)
        if BLOCK_PASS > 0:
            t = tl.load(xr + e[None, None, :] * stride_x_d, mask=mp)
            tl.store(yr + e[None, None, :] * stride_y_d, t.to(y_ptr.dtype.element_ty), mask=mp)


@triton.jit
def _mrope_kernel(
    # tensors
    q_ptr, q_out_ptr,                   # q [S, B, HQ, D] (a strided view) and its output
    k_ptr, k_out_ptr,                   # k [S, B, HK, D] and its output (None without k)
    pos_ptr,                            # positions [N_AXES, B or 1, S], ints, any strides
    inv_ptr,                            # inverse frequencies [R/2], fp32 (or fp64), contiguous
    axis_ptr,                           # axis of each pair [R/2], int32, contiguous
    # sizes
    S, B, HQ, HK,                       # tokens, batch, heads of q and of k
    B_CHUNK,                            # batch entries per program
    # strides, in elements
    stride_q_s, stride_q_b, stride_q_h, stride_q_d,
    stride_qo_s, stride_qo_b, stride_qo_h, stride_qo_d,
    stride_k_s, stride_k_b, stride_k_h, stride_k_d,
    stride_ko_s, stride_ko_b, stride_ko_h, stride_ko_d,
    stride_pos_a, stride_pos_b, stride_pos_s,   # 0 batch stride: positions shared by the batch
    # what is computed
    R: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr, HAS_K: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, POS_PER_BATCH: tl.constexpr,
    ACCURATE: tl.constexpr, CDT: tl.constexpr, INT64: tl.constexpr, BF16_RTNE: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    q_blocks = tl.cdiv(HQ, BLOCK_H)
    if pid_h < q_blocks:
        _mrope_heads(q_ptr, q_out_ptr, pos_ptr, inv_ptr, axis_ptr, pid_s, pid_h * BLOCK_H,
                     b_lo, b_hi, S, HQ,
                     stride_q_s, stride_q_b, stride_q_h, stride_q_d,
                     stride_qo_s, stride_qo_b, stride_qo_h, stride_qo_d,
                     stride_pos_a, stride_pos_b, stride_pos_s,
                     R, D, N_AXES, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_PASS, INTERLEAVED,
                     BACKWARD, POS_PER_BATCH, ACCURATE, CDT, INT64, BF16_RTNE)
    elif HAS_K:     # (without k the grid has q's blocks only)
        _mrope_heads(k_ptr, k_out_ptr, pos_ptr, inv_ptr, axis_ptr, pid_s,
                     (pid_h - q_blocks) * BLOCK_H, b_lo, b_hi, S, HK,
                     stride_k_s, stride_k_b, stride_k_h, stride_k_d,
                     stride_ko_s, stride_ko_b, stride_ko_h, stride_ko_d,
                     stride_pos_a, stride_pos_b, stride_pos_s,
                     R, D, N_AXES, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_PASS, INTERLEAVED,
                     BACKWARD, POS_PER_BATCH, ACCURATE, CDT, INT64, BF16_RTNE)


# --- host side: the plan and the launch -----------------------------------------------------

POINTERS = ("q_ptr", "q_out_ptr", "k_ptr", "k_out_ptr", "pos_ptr", "inv_ptr", "axis_ptr")
DIRECT = DirectLauncher(_mrope_kernel, POINTERS)


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _span(t: torch.Tensor) -> int:
    return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)


def plan(q4: torch.Tensor, q_out4: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
         axis: torch.Tensor, *, interleaved: bool, backward: bool,
         k4: Optional[torch.Tensor] = None, k_out4: Optional[torch.Tensor] = None,
         tiles: Optional[tuple] = None):
    """One launch over q (and k), [S, B, H, D] views: (Launch, pointers in POINTERS order).

    pos [N_AXES, B or 1, S] ints; inv_freq [R/2] fp32/fp64 and axis [R/2] int32, contiguous.
    Arguments are validated by the caller (ropelib.mrope). Sees only shapes, strides and dtypes,
    never values, so it runs eagerly and under torch.compile alike."""
    S, B, HQ, D = q4.shape
    HK = k4.shape[2] if k4 is not None else 0
    R = 2 * inv_freq.shape[0]
    on_gpu = q4.device.type == "cuda" and not INTERPRET
    sm = _sm_count(q4.device.index if q4.device.index is not None
                   else torch.cuda.current_device()) if on_gpu else None
    block_s, block_h, chunk, num_warps = tiles or pick_tiles(
        S, B, (HQ, HK), R, D, q4.element_size(), sm)
    grid = (_cdiv(S, block_s), _cdiv(HQ, block_h) + _cdiv(HK, block_h), _cdiv(B, chunk))
    views = [t for t in (q4, q_out4, k4, k_out4) if t is not None]
    has_k = k4 is not None
    zero4 = (0, 0, 0, 0)
    pos_b = pos.stride(1) if pos.shape[1] > 1 else 0
    cdt = tl.float64 if torch.float64 in {t.dtype for t in views} | {inv_freq.dtype} \
        else tl.float32
    args = dict(
        S=S, B=B, HQ=HQ, HK=HK, B_CHUNK=chunk,
        **dict(zip(("stride_q_s", "stride_q_b", "stride_q_h", "stride_q_d"), q4.stride())),
        **dict(zip(("stride_qo_s", "stride_qo_b", "stride_qo_h", "stride_qo_d"),
                   q_out4.stride())),
        **dict(zip(("stride_k_s", "stride_k_b", "stride_k_h", "stride_k_d"),
                   k4.stride() if has_k else zero4)),
        **dict(zip(("stride_ko_s", "stride_ko_b", "stride_ko_h", "stride_ko_d"),
                   k_out4.stride() if has_k else zero4)),
        stride_pos_a=pos.stride(0), stride_pos_b=pos_b, stride_pos_s=pos.stride(2),
        R=R, D=D, N_AXES=pos.shape[0], HAS_K=has_k,
        BLOCK_S=block_s, BLOCK_H=block_h, BLOCK_HALF=_pow2_at_least(R // 2, 1 << 30),
        BLOCK_PASS=_pow2_at_least(D - R, 1 << 30) if D > R else 0,
        INTERLEAVED=interleaved, BACKWARD=backward, POS_PER_BATCH=pos_b != 0,
        ACCURATE=not INTERPRET, CDT=cdt,
        INT64=any(_span(t) > _I32_LIMIT - 1024 for t in views), BF16_RTNE=BF16_RTNE,
    )
    pointers = (q4, q_out4, k4, k_out4, pos, inv_freq, axis)
    dtypes = tuple(t.dtype if t is not None else None for t in pointers)
    return Launch(grid, num_warps, args, dtypes, q4.device), pointers


def run(launch: Launch, pointers: tuple) -> None:
    """Start the multi-axis kernel (pointers in POINTERS order); see `launch.start`."""
    start(DIRECT, launch, pointers)


def launch(q4, q_out4, pos, inv_freq, axis, *, interleaved: bool, backward: bool, k4=None,
           k_out4=None) -> None:
    """Plan and run one launch (see `plan`); nothing for empty inputs."""
    if q4.shape[0] == 0 or q4.shape[1] == 0:
        return
    run(*plan(q4, q_out4, pos, inv_freq, axis, interleaved=interleaved, backward=backward,
              k4=k4, k_out4=k_out4))
