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
Every input is a strided [S, B, H, D] view (sbhd as is, bshd with S and B swapped, thd as
[T, 1, H, D]); nothing is copied. The outputs are fresh contiguous tensors in the call's layout,
whose strides the kernel derives from their shape (common.contiguous_strides; features at
stride 1), and positions are contiguous, so neither passes strides: the kernel takes 32
arguments. The grid is

    axis 0: blocks of BLOCK_S tokens                         cdiv(S, BLOCK_S)
    axis 1: groups of heads (q's heads, then k's, as one list) cdiv(HQ + HK, HEADS)
    axis 2: chunks of batch entries                          cdiv(B, chunk); a program takes
                                                             cdiv(B, programs on this axis)

A program loads the positions of its BLOCK_S tokens on every axis ([BLOCK_S] each), picks for
each pair the position of its axis and forms the angles and their cos/sin once, as a 2-D tile
[BLOCK_S, HALF]. Then it loops: over its batch entries, and inside, over its heads, HPS heads
per step ([BLOCK_S, HPS, HALF] per half), every step with that same cos/sin tile. Angles are
the expensive part here (an accurate sin and cos per pair, no table), so they are formed once
per token and batch entry for every head of q and k, before the head loop; a grid of head
blocks would form them once per block, and once more in every thread that holds another head
of the token. Positions that differ per batch entry ([N_AXES, B, S] with B > 1) are re-read and
the angles re-formed per entry. x is read once and y written once; math is fp32 (fp64 for fp64
inputs) with one rounding at the store. On an H200 one token and 8 heads per step on 2 warps
streamed best (0.96-0.98 of a copy; see STEP_ELEMENTS).

The grid is fitted to the GPU: batch entries go into the grid rather than the loop, then heads
are split into groups, until there are enough programs to fill the machine (short inputs).

Both members of a pair share one angle, so the backward (the transpose of the rotation) is the
rotation by -theta: the same kernel with sin negated (BACKWARD).

Pairing: rotate-half pairs feature j with j + R/2 (transformers' rotate_half); interleaved pairs
2j with 2j+1 (one contiguous load of R features, split into even/odd lanes). Features R..D-1
are copied through (partial rotary). A pair whose axis index is outside [0, N_AXES) gets a NaN
angle: its features come out NaN, never silently unrotated.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import INTERPRET
from .common import (ACCURATE, ROUND_BF16_RTNE, batch_range, contiguous_strides, cos_sin,
                     offset_int, rotate_pair, round_to)
from .direct import DirectLauncher
from .planning import (OUT_LAYOUT, Launch, cdiv, needs_int64, pointer_dtypes, pow2_at_least,
                       pow2_at_most, start)
from .tiles import (MROPE_ELEMENTS_PER_THREAD, MROPE_HEADS_PER_STEP, MROPE_PROGRAMS_PER_SM,
                    MROPE_STEP_ELEMENTS, multiprocessors)

MAX_AXES = 4


@triton.jit
def _mrope_cos_sin(pos_ptr, inv, ax, s_idx, b, S, stride_pos_a, stride_pos_b, stride_pos_s,
                   BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr, N_AXES: tl.constexpr,
                   CDT: tl.constexpr):
    # s_idx [BLOCK_S] tokens, b batch entry, inv/ax [BLOCK_HALF] -> cos, sin [BLOCK_S, BLOCK_HALF]
    # the position of each pair's axis, NaN where no axis matches
    p = tl.full((BLOCK_S, BLOCK_HALF), float("nan"), CDT)
    for a in tl.static_range(N_AXES):
        p_a = tl.load(pos_ptr + a * stride_pos_a + b * stride_pos_b + s_idx * stride_pos_s,
                      mask=s_idx < S, other=0).to(CDT)                    # [BLOCK_S]
        p = tl.where((ax == a)[None, :], p_a[:, None], p)
    return cos_sin(p * inv[None, :], ACCURATE)


@triton.jit
def _rotate_heads(x_ptr, y_ptr, x_rows, y_rows, ok, c, s, stride_x_d, stride_y_d,
                  R: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, HPS: tl.constexpr,
                  BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
                  INTERLEAVED: tl.constexpr, CDT: tl.constexpr):
    # HPS heads of BLOCK_S tokens: x_rows, y_rows [BLOCK_S, HPS] offsets of their rows, ok
    # [BLOCK_S, HPS] which exist; c, s [BLOCK_S, 1, BLOCK_HALF] (the same for every head)
    HALF: tl.constexpr = R // 2
    j = tl.arange(0, BLOCK_HALF)
    xr = x_ptr + x_rows[:, :, None]                           # [BLOCK_S, HPS, 1]
    yr = y_ptr + y_rows[:, :, None]
    if INTERLEAVED:
        f = tl.arange(0, 2 * BLOCK_HALF)
        mf = ok[:, :, None] & (f < R)[None, None, :]
        x = tl.load(xr + f[None, None, :] * stride_x_d, mask=mf, other=0.0)
        x_a, x_b = tl.split(tl.reshape(x, (BLOCK_S, HPS, BLOCK_HALF, 2)))
    else:
        m = ok[:, :, None] & (j < HALF)[None, None, :]
        x_a = tl.load(xr + j[None, None, :] * stride_x_d, mask=m, other=0.0)
        x_b = tl.load(xr + (j + HALF)[None, None, :] * stride_x_d, mask=m, other=0.0)
    if BLOCK_PASS > 0:
        e = R + tl.arange(0, BLOCK_PASS)
        mp = ok[:, :, None] & (e < D)[None, None, :]
        t = tl.load(xr + e[None, None, :] * stride_x_d, mask=mp)
    x_a = x_a.to(CDT)
    x_b = x_b.to(CDT)
    y_a, y_b = rotate_pair(x_a, x_b, c, s, c, s)     # both members of a pair share the angle
    y_a = round_to(y_a, y_ptr.dtype.element_ty, ROUND_BF16_RTNE)
    y_b = round_to(y_b, y_ptr.dtype.element_ty, ROUND_BF16_RTNE)
    if INTERLEAVED:
        tl.store(yr + f[None, None, :] * stride_y_d,
                 tl.reshape(tl.join(y_a, y_b), (BLOCK_S, HPS, 2 * BLOCK_HALF)), mask=mf)
    else:
        tl.store(yr + j[None, None, :] * stride_y_d, y_a, mask=m)
        tl.store(yr + (j + HALF)[None, None, :] * stride_y_d, y_b, mask=m)
    if BLOCK_PASS > 0:
        tl.store(yr + e[None, None, :] * stride_y_d, t.to(y_ptr.dtype.element_ty), mask=mp)


@triton.jit
def _rotate_segment(x_ptr, y_ptr, s_off, tok_ok, bb, h_lo, h_hi, c, s,
                    stride_x_s, stride_x_b, stride_x_h, stride_x_d,
                    stride_y_s, stride_y_b, stride_y_h, stride_y_d,
                    R: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, HPS: tl.constexpr,
                    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
                    INTERLEAVED: tl.constexpr, CDT: tl.constexpr, INT64: tl.constexpr):
    # heads h_lo .. h_hi - 1 of one tensor (q or k), batch entry bb, HPS heads per step
    x_tok = s_off * stride_x_s + bb * stride_x_b                         # [BLOCK_S]
    y_tok = s_off * stride_y_s + bb * stride_y_b
    for h0 in range(h_lo, h_hi, HPS):
        h = h0 + tl.arange(0, HPS)                                       # [HPS]
        ok = tok_ok[:, None] & (h < h_hi)[None, :]                       # [BLOCK_S, HPS]
        if INT64:
            h = h.to(tl.int64)
        _rotate_heads(x_ptr, y_ptr, x_tok[:, None] + h[None, :] * stride_x_h,
                      y_tok[:, None] + h[None, :] * stride_y_h, ok, c, s, stride_x_d,
                      stride_y_d, R, D, BLOCK_S, HPS, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, CDT)


@triton.jit
def _mrope_kernel(
    # tensors
    q_ptr, q_out_ptr,                   # q [S, B, HQ, D] (a strided view) and its output
    k_ptr, k_out_ptr,                   # k [S, B, HK, D] and its output (None without k)
    pos_ptr,                            # positions [N_AXES, B or 1, S], ints, contiguous
    inv_ptr,                            # inverse frequencies [R/2], fp32 (or fp64), contiguous
    axis_ptr,                           # axis of each pair [R/2], int32, contiguous
    # sizes
    S, B, HQ, HK,                       # tokens, batch, heads of q and of k
    HEADS,                              # heads per program (of the list q's heads, k's heads)
    # the inputs' strides, in elements (the outputs' follow from their shape and OUT_LAYOUT)
    stride_q_s, stride_q_b, stride_q_h, stride_q_d,
    stride_k_s, stride_k_b, stride_k_h, stride_k_d,
    # what is computed
    R: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
    OUT_LAYOUT: tl.constexpr,           # the outputs' layout (see common.contiguous_strides)
    BLOCK_S: tl.constexpr, HPS: tl.constexpr,  # tokens per program, heads per loop step
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    POS_PER_BATCH: tl.constexpr,        # positions [N_AXES, B, S] (else [N_AXES, 1, S], shared)
    INT64: tl.constexpr,
):
    # The outputs are fresh contiguous tensors in OUT_LAYOUT (features at stride 1); positions
    # are contiguous, so their strides follow from [N_AXES, B or 1, S].
    # fp64 math when an input, an output or the frequencies are fp64, else fp32
    if k_ptr is None:
        CDT: tl.constexpr = tl.float64 if (q_ptr.dtype.element_ty == tl.float64
                                           or q_out_ptr.dtype.element_ty == tl.float64
                                           or inv_ptr.dtype.element_ty == tl.float64) \
            else tl.float32
    else:
        CDT: tl.constexpr = tl.float64 if (q_ptr.dtype.element_ty == tl.float64
                                           or q_out_ptr.dtype.element_ty == tl.float64
                                           or k_ptr.dtype.element_ty == tl.float64
                                           or k_out_ptr.dtype.element_ty == tl.float64
                                           or inv_ptr.dtype.element_ty == tl.float64) \
            else tl.float32
    HALF: tl.constexpr = R // 2
    s_idx = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)            # [BLOCK_S]
    tok_ok = s_idx < S
    h_lo = tl.program_id(1) * HEADS
    h_hi = tl.minimum(h_lo + HEADS, HQ + HK)
    b_lo, b_hi = batch_range(B)
    if INT64:
        s_off = s_idx.to(tl.int64)
        unit = tl.full([], 1, tl.int64)
    else:
        s_off = s_idx
        unit = tl.full([], 1, tl.int32)
    # positions [N_AXES, B or 1, S], contiguous
    stride_pos_b = unit * S if POS_PER_BATCH else 0
    stride_pos_a = unit * S * B if POS_PER_BATCH else unit * S
    qo_s, qo_b, qo_h = contiguous_strides(S, B, HQ, D, OUT_LAYOUT, INT64)
    ko_s, ko_b, ko_h = contiguous_strides(S, B, HK, D, OUT_LAYOUT, INT64)
    j = tl.arange(0, BLOCK_HALF)
    inv = tl.load(inv_ptr + j, mask=j < HALF, other=0.0).to(CDT)          # [BLOCK_HALF]
    ax = tl.load(axis_ptr + j, mask=j < HALF, other=0)                    # [BLOCK_HALF]
    if not POS_PER_BATCH:
        c, s = _mrope_cos_sin(pos_ptr, inv, ax, s_idx, 0, S, stride_pos_a, stride_pos_b, 1,
                              BLOCK_S, BLOCK_HALF, N_AXES, CDT)
        if BACKWARD:
            s = -s
    for b in range(b_lo, b_hi):
        bb = offset_int(b, INT64)       # the batch entry, in int64 when offsets need it
        if POS_PER_BATCH:
            c, s = _mrope_cos_sin(pos_ptr, inv, ax, s_idx, bb, S, stride_pos_a, stride_pos_b, 1,
                                  BLOCK_S, BLOCK_HALF, N_AXES, CDT)
            if BACKWARD:
                s = -s
        c3 = c[:, None, :]                                               # [BLOCK_S, 1, HALF]
        s3 = s[:, None, :]
        _rotate_segment(q_ptr, q_out_ptr, s_off, tok_ok, bb, h_lo, tl.minimum(h_hi, HQ), c3, s3,
                        stride_q_s, stride_q_b, stride_q_h, stride_q_d, qo_s, qo_b, qo_h, 1,
                        R, D, BLOCK_S, HPS, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, CDT, INT64)
        if k_ptr is not None:
            _rotate_segment(k_ptr, k_out_ptr, s_off, tok_ok, bb, tl.maximum(h_lo, HQ) - HQ,
                            h_hi - HQ, c3, s3,
                            stride_k_s, stride_k_b, stride_k_h, stride_k_d, ko_s, ko_b, ko_h, 1,
                            R, D, BLOCK_S, HPS, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, CDT, INT64)


# --- host side: the plan and the launch -----------------------------------------------------

POINTERS = ("q_ptr", "q_out_ptr", "k_ptr", "k_out_ptr", "pos_ptr", "inv_ptr", "axis_ptr")
DIRECT = DirectLauncher(_mrope_kernel, POINTERS)

# GPU tiles (kernels/tiles.py says where they were measured)
STEP_ELEMENTS = MROPE_STEP_ELEMENTS
HEADS_PER_STEP = MROPE_HEADS_PER_STEP
ELEMENTS_PER_THREAD = MROPE_ELEMENTS_PER_THREAD
PROGRAMS_PER_SM = MROPE_PROGRAMS_PER_SM


def _row(R: int, D: int) -> int:
    """Elements of one head row as the kernel's tiles hold it (each part padded)."""
    return 2 * pow2_at_least(R // 2, 1 << 30) + (pow2_at_least(D - R, 1 << 30) if D > R else 0)


def fit_grid(S, B, heads: int, block_s: int, per_batch: bool, sm_count: int) -> tuple:
    """(HEADS, B_CHUNK): every head and the whole batch in one program, unless that leaves
    fewer than PROGRAMS_PER_SM programs per SM: then the batch goes into the grid, then the heads
    are split into groups. With per-batch positions every entry is its own program (its angles
    are its own anyway). S and B may be symbolic (torch.compile with dynamic shapes): then
    nothing is fitted to the machine, since a comparison would become a guard."""
    chunk = 1 if per_batch else B
    if isinstance(S, torch.SymInt) or isinstance(B, torch.SymInt):
        return heads, chunk
    want = PROGRAMS_PER_SM * sm_count
    blocks = cdiv(S, block_s)
    chunk = max(chunk, 1)
    while chunk > 1 and blocks * cdiv(B, chunk) < want:
        chunk = cdiv(chunk, 2)
    group = heads
    while group > 1 and blocks * cdiv(B, chunk) * cdiv(heads, group) < want:
        group = cdiv(group, 2)
    while cdiv(B, chunk) > 65535:
        chunk *= 2
    return group, chunk


def pick_tiles(S, B, heads: int, R: int, D: int, per_batch: bool, sm_count: Optional[int]):
    """(BLOCK_S, HPS, HEADS, B_CHUNK, num_warps) for `heads` heads (q's and k's) of [S, B, ., D].

    GPU: a loop step of HPS heads x BLOCK_S tokens moves about STEP_ELEMENTS elements; the grid
    as fit_grid says. Interpreter (sm_count None): big tiles, since every program instance and
    every loop step costs milliseconds. S and B may be symbolic: they are only compared."""
    row = _row(R, D)
    if sm_count is None:
        return pow2_at_least(S, 32), pow2_at_least(heads, 16), heads, max(B, 1), 4
    hps = min(pow2_at_most(max(heads, 1)), HEADS_PER_STEP,
              pow2_at_most(max(STEP_ELEMENTS // row, 1)))
    block_s = pow2_at_least(S, pow2_at_most(max(STEP_ELEMENTS // (row * hps), 1)))
    # (a power of two, as Triton requires; with partial rotary row is not one)
    num_warps = pow2_at_most(max(1, min(16, block_s * hps * row // (32 * ELEMENTS_PER_THREAD))))
    return (block_s, hps, *fit_grid(S, B, heads, block_s, per_batch, sm_count), num_warps)


def plan(q4: torch.Tensor, q_out4: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
         axis: torch.Tensor, *, interleaved: bool, backward: bool, layout: str,
         k4: Optional[torch.Tensor] = None, k_out4: Optional[torch.Tensor] = None,
         tiles: Optional[tuple] = None):
    """One launch over q (and k), [S, B, H, D] views: (Launch, pointers in POINTERS order).

    q_out4 and k_out4 are views of fresh contiguous outputs in `layout` (the kernel derives
    their strides from their shape); pos [N_AXES, B or 1, S] ints, contiguous; inv_freq [R/2]
    fp32/fp64 and axis [R/2] int32, contiguous. `tiles` (BLOCK_S, HPS, HEADS, B_CHUNK,
    num_warps) overrides pick_tiles. Arguments are validated by the caller (ropelib.mrope).
    Sees only shapes, strides and dtypes, never values, so it runs eagerly and under
    torch.compile alike."""
    S, B, HQ, D = q4.shape
    HK = k4.shape[2] if k4 is not None else 0
    R = 2 * inv_freq.shape[0]
    assert pos.is_contiguous(), "positions must be contiguous"
    per_batch = pos.shape[1] > 1
    on_gpu = q4.device.type == "cuda" and not INTERPRET
    sm = multiprocessors(q4.device) if on_gpu else None
    block_s, hps, heads, chunk, num_warps = tiles or pick_tiles(S, B, HQ + HK, R, D, per_batch,
                                                                sm)
    grid = (cdiv(S, block_s), cdiv(HQ + HK, heads), cdiv(B, chunk))
    views = [t for t in (q4, q_out4, k4, k_out4) if t is not None]
    has_k = k4 is not None
    zero4 = (0, 0, 0, 0)
    args = dict(
        S=S, B=B, HQ=HQ, HK=HK, HEADS=heads,
        **dict(zip(("stride_q_s", "stride_q_b", "stride_q_h", "stride_q_d"), q4.stride())),
        **dict(zip(("stride_k_s", "stride_k_b", "stride_k_h", "stride_k_d"),
                   k4.stride() if has_k else zero4)),
        R=R, D=D, N_AXES=pos.shape[0], OUT_LAYOUT=OUT_LAYOUT[layout],
        BLOCK_S=block_s, HPS=hps, BLOCK_HALF=pow2_at_least(R // 2, 1 << 30),
        BLOCK_PASS=pow2_at_least(D - R, 1 << 30) if D > R else 0,
        INTERLEAVED=interleaved, BACKWARD=backward, POS_PER_BATCH=per_batch,
        INT64=needs_int64(views + [pos]),
    )
    pointers = kernel_pointers(q4, q_out4, k4, k_out4, pos, inv_freq, axis)
    return Launch(grid, num_warps, args, pointer_dtypes(pointers), q4.device), pointers


def kernel_pointers(q, q_out, k, k_out, pos, inv_freq, axis) -> tuple:
    """The pointer arguments in the kernel's order (POINTERS); k and k_out may be None."""
    return q, q_out, k, k_out, pos, inv_freq, axis


def run(launch: Launch, pointers: tuple) -> None:
    """Start the multi-axis kernel (pointers in POINTERS order); see `planning.start`."""
    start(DIRECT, launch, pointers)


def launch(q4, q_out4, pos, inv_freq, axis, *, interleaved: bool, backward: bool, layout: str,
           k4=None, k_out4=None) -> None:
    """Plan and run one launch (see `plan`); nothing for empty inputs."""
    if q4.shape[0] == 0 or q4.shape[1] == 0:
        return
    run(*plan(q4, q_out4, pos, inv_freq, axis, interleaved=interleaved, backward=backward,
              layout=layout, k4=k4, k_out4=k_out4))
