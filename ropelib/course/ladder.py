"""From the batch-reusing grid to the finished kernel, one idea at a time (a study module).

Notebook 05 (the finished kernel) climbs this ladder and `benchmarks/ladder.py` times it. The
notebook shows each kernel in a cell the learner edits and launches it there, with the tile
`plan` picks (a test checks that its copies are these); the benchmark launches the kernels
defined here through `rope_ladder`. The notebook's two figures are drawn here too: the time
of every profiled kernel against the bytes it asks for (`plot_in_flight`), and the ladder's
waterfall with the spread of each timing (`plot_waterfall`).
Every rung supports the subset the lesson needs: sbhd x [S, B, H, D] (any strides), rotate-half
pairs (j, j + D/2), full rotary, fp32 angles [P, D] (P >= S) for positions 0..S-1, forward.

    rung 0  batch_reuse   ropelib.course.kernels.batch_reuse: one (token, head) per program, loop over B
    rung 1  heads         a program takes BLOCK_H heads of one token: cos/sin shared by its heads
    rung 2  tile          a 3-D tile, tokens x heads x half, sized for the bytes a GPU needs
                          in flight; Triton's default 4 warps
    rung 3  warps         the same tile on the GPU's own warp count (16 on an H100, 8 on an H200):
                          fewer elements, so one vector, per thread
    rung 4  chunks        a third grid axis over chunks of the batch: enough programs to fill
                          the GPU when S * H is small (ropelib's planner picks tile and chunk)
    rung 5  accurate      libdevice's cosf/sinf, exact for any angle, instead of the fast ones
    rung 6  equal_halves  when both halves of a table row hold the same angles (TE's
                          cat([f, f])), sin/cos once per pair: half the special-function work

The last rung computes what ropelib's finished kernel computes, bit for bit, on this subset.
Offsets are int32: tensors below 2**31 elements.
"""
import json
import re
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from ..kernels import launch as _launch
from ..kernels import tiles as _tiles
from .kernels.batch_reuse import rope_batch_reuse
from ..kernels.common import BF16_RTNE, round_to
from ..kernels.common import cos_sin
from ..runtime import INTERPRET
from .offline_compile import compile_for_cuda, in_compiling_python, resource_usage


# --- rung 1: a tile of heads ------------------------------------------------------------------

@triton.jit
def _ladder_heads_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    freqs_ptr,  # *fp32: angles [P, D], row s for position s, features contiguous
    B, H,  # batch (each program loops over it), heads
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    stride_fs,  # freqs row stride
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_H: tl.constexpr,  # heads per program: the rows of the tile
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # grid (S, cdiv(H, BLOCK_H)): program (s, hb) rotates heads hb*BLOCK_H.. of token s, all b
    s = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    m = (h < H)[:, None] & (j < HALF)[None, :]  # [BLOCK_H, BLOCK_HALF]
    # cos/sin of token s, once per program: shared by its BLOCK_H heads and all B rows
    theta_a = tl.load(freqs_ptr + s * stride_fs + j, mask=j < HALF, other=0.0)
    theta_b = tl.load(freqs_ptr + s * stride_fs + HALF + j, mask=j < HALF, other=0.0)
    c_a, s_a = tl.cos(theta_a)[None, :], tl.sin(theta_a)[None, :]  # [1, BLOCK_HALF]
    c_b, s_b = tl.cos(theta_b)[None, :], tl.sin(theta_b)[None, :]
    x_off = s * stride_xs + h[:, None] * stride_xh + j[None, :] * stride_xd
    y_off = s * stride_ys + h[:, None] * stride_yh + j[None, :] * stride_yd
    for b in range(0, B):
        xr = x_ptr + x_off + b * stride_xb
        yr = y_ptr + y_off + b * stride_yb
        x_a = tl.load(xr, mask=m, other=0.0).to(tl.float32)
        x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0).to(tl.float32)
        tl.store(yr, round_to(x_a * c_a - x_b * s_a, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)
        tl.store(yr + HALF * stride_yd,
                 round_to(x_b * c_b + x_a * s_b, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)


# --- rungs 2 and 3: a 3-D tile, tokens x heads x half -------------------------------------------

@triton.jit
def _ladder_tile_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    freqs_ptr,  # *fp32: angles [P, D], row s for position s, features contiguous
    S, B, H,  # tokens, batch (each program loops over it), heads
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    stride_fs,  # freqs row stride
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per program
    BLOCK_H: tl.constexpr,  # heads per program
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H)): a [BLOCK_S, BLOCK_H, BLOCK_HALF] tile per half
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (j < HALF)[None, None, :]  # [BLOCK_S, 1, BLOCK_HALF]
    f = freqs_ptr + s[:, None, None] * stride_fs + j[None, None, :]
    theta_a = tl.load(f, mask=tab_m, other=0.0)
    theta_b = tl.load(f + HALF, mask=tab_m, other=0.0)
    c_a, s_a = tl.cos(theta_a), tl.sin(theta_a)  # [BLOCK_S, 1, BLOCK_HALF]: once per program
    c_b, s_b = tl.cos(theta_b), tl.sin(theta_b)
    x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh + j[None, None, :] * stride_xd
    y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh + j[None, None, :] * stride_yd
    for b in range(0, B):
        xr = x_ptr + x_off + b * stride_xb
        yr = y_ptr + y_off + b * stride_yb
        x_a = tl.load(xr, mask=m, other=0.0).to(tl.float32)
        x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0).to(tl.float32)
        tl.store(yr, round_to(x_a * c_a - x_b * s_a, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)
        tl.store(yr + HALF * stride_yd,
                 round_to(x_b * c_b + x_a * s_b, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)


# --- rungs 4 and 5: chunks of the batch; accurate sin/cos ---------------------------------------

@triton.jit
def _ladder_chunk_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    freqs_ptr,  # *fp32: angles [P, D], row s for position s, features contiguous
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per program (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    stride_fs,  # freqs row stride
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per program
    BLOCK_H: tl.constexpr,  # heads per program
    ACCURATE: tl.constexpr,  # libdevice cos/sin by name (with Triton 3.6 tl.cos is libdevice's too)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H), cdiv(B, B_CHUNK))
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (j < HALF)[None, None, :]
    f = freqs_ptr + s[:, None, None] * stride_fs + j[None, None, :]
    theta_a = tl.load(f, mask=tab_m, other=0.0)
    theta_b = tl.load(f + HALF, mask=tab_m, other=0.0)
    c_a, s_a = cos_sin(theta_a, ACCURATE)  # [BLOCK_S, 1, BLOCK_HALF]
    c_b, s_b = cos_sin(theta_b, ACCURATE)
    x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh + j[None, None, :] * stride_xd
    y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh + j[None, None, :] * stride_yd
    for b in range(b_lo, b_hi):
        xr = x_ptr + x_off + b * stride_xb
        yr = y_ptr + y_off + b * stride_yb
        x_a = tl.load(xr, mask=m, other=0.0).to(tl.float32)
        x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0).to(tl.float32)
        tl.store(yr, round_to(x_a * c_a - x_b * s_a, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)
        tl.store(yr + HALF * stride_yd,
                 round_to(x_b * c_b + x_a * s_b, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)


# --- rung 6: the equal-halves shortcut ----------------------------------------------------------

@triton.jit
def _ladder_final_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    freqs_ptr,  # *fp32: angles [P, D], row s for position s, features contiguous
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per program (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    stride_fs,  # freqs row stride
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per program
    BLOCK_H: tl.constexpr,  # heads per program
    ACCURATE: tl.constexpr,  # libdevice cos/sin by name (with Triton 3.6 tl.cos is libdevice's too)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H), cdiv(B, B_CHUNK))
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (j < HALF)[None, None, :]
    f = freqs_ptr + s[:, None, None] * stride_fs + j[None, None, :]
    theta_a = tl.load(f, mask=tab_m, other=0.0)
    theta_b = tl.load(f + HALF, mask=tab_m, other=0.0)
    c_a, s_a = cos_sin(theta_a, ACCURATE)  # [BLOCK_S, 1, BLOCK_HALF]
    # both halves of every row of the tile bit-equal (TE's cat([f, f])): reuse the first's
    differ = tl.max(tl.where(theta_a.to(tl.int32, bitcast=True) == theta_b.to(tl.int32, bitcast=True),
                             0, 1))
    if differ == 0:
        c_b = c_a
        s_b = s_a
    else:
        c_b, s_b = cos_sin(theta_b, ACCURATE)
    x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh + j[None, None, :] * stride_xd
    y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh + j[None, None, :] * stride_yd
    for b in range(b_lo, b_hi):
        xr = x_ptr + x_off + b * stride_xb
        yr = y_ptr + y_off + b * stride_yb
        x_a = tl.load(xr, mask=m, other=0.0).to(tl.float32)
        x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0).to(tl.float32)
        # one fma per output, in the order ropelib (and Transformer Engine) compute it
        y_a = tl.fma(x_a, c_a, -(x_b * s_a))
        y_b = tl.fma(x_b, c_b, x_a * s_b)
        tl.store(yr, round_to(y_a, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)
        tl.store(yr + HALF * stride_yd, round_to(y_b, y_ptr.dtype.element_ty, BF16_RTNE), mask=m)


# --- the rungs and their launches -----------------------------------------------------------------

class Rung(NamedTuple):
    name: str
    idea: str
    kernel: object   # the @triton.jit kernel (None for rung 0, ropelib's batch_reuse launcher)


RUNGS = (
    Rung("batch_reuse", "grid (S, H): one token and one head per program, loop over B", None),
    Rung("heads", "BLOCK_H heads per program: cos/sin shared by the heads", _ladder_heads_kernel),
    Rung("tile", "3-D tile tokens x heads x half (BLOCK_S tokens, BLOCK_H heads); 4 warps",
         _ladder_tile_kernel),
    Rung("warps", "the same tile on the GPU's tuned warp count (H100 16, H200 8): one 8- or "
         "16-byte vector per thread per load",
         _ladder_tile_kernel),
    Rung("chunks", "grid axis over batch chunks: enough programs to fill the GPU",
         _ladder_chunk_kernel),
    Rung("accurate", "libdevice cos/sin: exact for any angle", _ladder_chunk_kernel),
    Rung("equal_halves", "equal table halves: sin/cos once per pair", _ladder_final_kernel),
)
NAMES = tuple(r.name for r in RUNGS)
KERNELS = {"heads": "_ladder_heads_kernel", "tile": "_ladder_tile_kernel",
           "warps": "_ladder_tile_kernel", "chunks": "_ladder_chunk_kernel",
           "accurate": "_ladder_chunk_kernel", "equal_halves": "_ladder_final_kernel"}
HEADS_PER_PROGRAM = 32     # rung 1's BLOCK_H cap: all heads of a token for H <= 32


class Plan(NamedTuple):
    """One rung's launch: the grid, the warps, and the tile (BLOCK_S, BLOCK_H, B_CHUNK)."""
    grid: tuple
    num_warps: int
    block_s: int
    block_h: int
    chunk: int


def pow2_at_most(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def tile_shape(S: int, H: int, D: int, target: int) -> tuple:
    """(BLOCK_S, BLOCK_H) of a tile of about `target` elements (both halves): heads first, then
    tokens, at most 16 tokens; the same rule as ropelib's planner, without the batch chunks."""
    row = 2 * triton.next_power_of_2(D // 2)
    block_h = min(triton.next_power_of_2(H), pow2_at_most(max(target // row, 1)))
    block_s = min(triton.next_power_of_2(S), 16, pow2_at_most(max(target // (block_h * row), 1)))
    return block_s, block_h


def device_knobs(x: torch.Tensor) -> tuple:
    """(SM count or None, ropelib's tile knobs for this GPU): None and {} in the interpreter."""
    if x.device.type != "cuda" or INTERPRET:
        return None, {}
    return _tiles.device_tiles(_tiles.device_index(x.device))


def plan(rung: str, S: int, B: int, H: int, D: int, elem_size: int,
         sm_count: Optional[int] = None, knobs: Optional[dict] = None) -> Plan:
    """The launch of `rung` for x [S, B, H, D] with `elem_size`-byte elements.

    On a GPU (sm_count given) the tiles come from ropelib's knobs: (elements per thread, warps)
    = (8, 16) for 16-bit inputs on an H100 (knobs: the GPU's own, ropelib.kernels.launch); rung 2
    keeps that tile on 4 warps. In the interpreter (sm_count None) tiles are as large as ropelib
    makes them there, since each program instance costs milliseconds.
    """
    knobs = knobs or {}
    cdiv = triton.cdiv
    if rung == "heads":
        bh = min(triton.next_power_of_2(H), HEADS_PER_PROGRAM)
        return Plan((S, cdiv(H, bh)), 4, 1, bh, B)
    if rung in ("tile", "warps"):
        if sm_count is None:
            bs, bh, _, warps = _launch.pick_tiles(S, B, (H,), D, D, elem_size, None)
        else:
            ept, warps = knobs.get("tile_wide" if elem_size > 2 else "tile_loop",
                                   _tiles.TILE_WIDE if elem_size > 2 else _tiles.TILE_LOOP)
            bs, bh = tile_shape(S, H, D, ept * 32 * warps)
            if rung == "tile":
                warps = 4
        return Plan((cdiv(S, bs), cdiv(H, bh)), warps, bs, bh, B)
    if rung in ("chunks", "accurate", "equal_halves"):
        bs, bh, chunk, warps = _launch.pick_tiles(S, B, (H,), D, D, elem_size, sm_count, **knobs)
        return Plan((cdiv(S, bs), cdiv(H, bh), cdiv(B, chunk)), warps, bs, bh, chunk)
    raise ValueError(f"rung must be one of {NAMES[1:]}, got {rung!r}")


def _table(freqs: torch.Tensor, S: int, D: int) -> torch.Tensor:
    f = freqs.reshape(freqs.shape[0], freqs.shape[-1])
    if f.dtype != torch.float32 or f.shape[-1] != D or f.shape[0] < S:
        raise ValueError(f"freqs must be fp32 angles [P, {D}] or [P, 1, 1, {D}] with P >= {S}, "
                         f"got {tuple(freqs.shape)} {freqs.dtype}")
    return f if f.stride(-1) == 1 else f.contiguous()


def rope_ladder(rung: str, x: torch.Tensor, freqs: torch.Tensor, *,
                out: Optional[torch.Tensor] = None, tiles: Optional[Plan] = None) -> torch.Tensor:
    """Rotate sbhd x [S, B, H, D] (rotate-half, full rotary) with the kernel of `rung`.

    Args:
        rung: one of NAMES ("batch_reuse" runs ropelib.course.kernels.batch_reuse).
        x: [S, B, H, D], fp16/bf16/fp32, any strides, D even.
        freqs: fp32 angles [P, D] or [P, 1, 1, D], P >= S.
        out: a tensor of x's shape and dtype to write (any strides); by default a new one.
        tiles: a Plan to launch with instead of `plan(...)`'s (tests use small chunks).
    Returns:
        y (out if given); math in fp32, one rounding to x's dtype.
    """
    S, B, H, D = x.shape
    if rung == "batch_reuse":
        return rope_batch_reuse(x, freqs, out=out)
    f = _table(freqs, S, D)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if x.numel() == 0:
        return y
    sm, knobs = device_knobs(x)
    p = tiles or plan(rung, S, B, H, D, x.element_size(), sm, knobs)
    common = dict(HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2), BF16_RTNE=BF16_RTNE,
                  num_warps=p.num_warps)
    strides = (*x.stride(), *y.stride(), f.stride(0))
    kernel = globals()[KERNELS[rung]]
    if rung == "heads":
        kernel[p.grid](x, y, f, B, H, *strides, BLOCK_H=p.block_h, **common)
    elif rung in ("tile", "warps"):
        kernel[p.grid](x, y, f, S, B, H, *strides, BLOCK_S=p.block_s, BLOCK_H=p.block_h,
                       **common)
    else:
        kernel[p.grid](x, y, f, S, B, H, p.chunk, *strides, BLOCK_S=p.block_s,
                       BLOCK_H=p.block_h, ACCURATE=(rung != "chunks") and not INTERPRET,
                       **common)
    return y


# --- a copy on a rung's launch ----------------------------------------------------------------
# Notebook 05 shows this kernel in a cell the learner can change (tests/test_tile_sweep.py keeps
# that copy equal to this one); benchmarks/tile_sweep.py times it on many launches.

@triton.jit
def _copy_on_tile_kernel(
    x_ptr, y_ptr,  # x, y [S, B, H, D] (any strides)
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per program (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per program
    BLOCK_H: tl.constexpr,  # heads per program
):
    # rung 6's grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H), cdiv(B, B_CHUNK)), tile and batch
    # loop; y = x, half by half, with nothing in between
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh + j[None, None, :] * stride_xd
    y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh + j[None, None, :] * stride_yd
    for b in range(b_lo, b_hi):
        xr = x_ptr + x_off + b * stride_xb
        yr = y_ptr + y_off + b * stride_yb
        x_a = tl.load(xr, mask=m, other=0.0)
        x_b = tl.load(xr + HALF * stride_xd, mask=m, other=0.0)
        tl.store(yr, x_a, mask=m)
        tl.store(yr + HALF * stride_yd, x_b, mask=m)


def copy_on_plan(x: torch.Tensor, y: torch.Tensor, p: Plan) -> None:
    """y = x for x [S, B, H, D] (y of the same shape and dtype, any strides) on the launch `p`:
    a rung's grid, tile and batch loop with nothing between the loads and the stores."""
    S, B, H, D = x.shape
    _copy_on_tile_kernel[p.grid](x, y, S, B, H, p.chunk, *x.stride(), *y.stride(), HALF=D // 2,
                                 BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_S=p.block_s,
                                 BLOCK_H=p.block_h, num_warps=p.num_warps)


# --- what the compiler makes of a tile (no GPU needed) ------------------------------------------

_BLOCKED = re.compile(r"#ttg\.blocked<\{([^}]*)\}>")
_MEMORY = re.compile(r"\b(ld|st)\.global((?:\.[A-Za-z0-9_:]+)*)\s")   # (cache hints too)


def _ptx_accesses(ptx: str) -> dict:
    """{'ld.v2.b32': n, ...}: the global loads/stores in the PTX (instructions in the code, not
    executions) by vector width and word size. Loads through the read-only path (`.nc`) are
    left out: there, only libdevice's sin/cos read their constant table that way."""
    counts = {}
    for op, suffix in _MEMORY.findall(ptx):
        parts = suffix.strip(".").split(".")
        if "nc" in parts:
            continue
        vec = next((p for p in parts if p in ("v2", "v4", "v8")), "v1")
        bits = next((p for p in parts if p[0] in "bfus" and p[1:].isdigit()), "?")
        key = f"{op}.{vec}.{bits}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _trig(ptx: str) -> str:
    """Which sin/cos the PTX computes: libdevice's (__nv_sinf/__nv_cosf, with its exact argument
    reduction), the hardware approximations (sin.approx/cos.approx), both or none."""
    lib = bool(re.search(r"__nv_(sin|cos)f", ptx))
    fast = bool(re.search(r"\b(sin|cos)\.approx", ptx))
    return {(True, False): "libdevice", (False, True): "approx", (True, True): "both"}.get(
        (lib, fast), "none")


def _resources(cubin: bytes) -> dict:
    """{'registers': per thread, 'shared': bytes} of a cubin (offline_compile.resource_usage);
    {} when there is no cuobjdump."""
    usage = resource_usage(cubin)
    return {k: usage[k] for k in ("registers", "shared")} if usage else {}


def _compile_here(what: str, S: int, B: int, H: int, D: int, dtype: str, sm_count: int,
                  arch: int, knobs: Optional[dict] = None) -> dict:
    """Compile `what` (a rung, or "ropelib" for the finished kernel) for a CUDA target; no GPU."""
    if INTERPRET:
        raise RuntimeError("compile with TRITON_INTERPRET unset (compile_for_gpu does)")
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    knobs = {k: tuple(v) for k, v in (knobs or {}).items()}
    x = torch.empty(S, B, H, D, dtype=dt)   # only shapes, strides, dtypes and alignment matter
    y = torch.empty_like(x)
    f = torch.empty(S, D, dtype=torch.float32)
    if what == "two-pass":
        # the flat pass of the two-pass route, with the GPU's program size, reading the fp32
        # cos and signed-sine rows the pre-pass writes
        route, ptrs = _launch.plan_two_pass(_launch.View.of(x), _launch.View.of(y),
                                            _launch.Table(f, None), _launch.Positions(), R=D,
                                            interleaved=False, backward=False, layout="sbhd")
        lau = route.rotate_pass
        rows, _, flags = route.new_rows(x.device)   # (and the flag per row)
        kernel = lau.launcher.kernel
        args = dict(zip(lau.launcher.pointer_names, ptrs[:4] + (rows, rows, None, flags)),
                    **dict(lau.args, XBLOCK=_tiles.TWO_PASS_ELEMENTS))
        grid, warps = (triton.cdiv(x.numel(), _tiles.TWO_PASS_ELEMENTS),), lau.num_warps
        tile = dict(XBLOCK=_tiles.TWO_PASS_ELEMENTS)
    elif what == "ropelib":
        tiles = _launch.pick_tiles(S, B, (H, 0), D, D, x.element_size(), sm_count, **knobs)
        lau, ptrs = _launch.plan(_launch.View.of(x), _launch.View.of(y), _launch.Table(f, None),
                                 _launch.Positions(), R=D, interleaved=False, backward=False,
                                 layout="sbhd", tiles=tiles)
        kernel = lau.launcher.kernel
        args = dict(zip(lau.launcher.pointer_names, ptrs), **lau.args)
        grid, warps, tile = lau.grid, lau.num_warps, dict(BLOCK_S=tiles[0], BLOCK_H=tiles[1],
                                                          B_CHUNK=tiles[2])
    else:
        p = plan(what, S, B, H, D, x.element_size(), sm_count, knobs)
        kernel = globals()[KERNELS[what]]
        strides = dict(zip(("stride_xs", "stride_xb", "stride_xh", "stride_xd", "stride_ys",
                            "stride_yb", "stride_yh", "stride_yd", "stride_fs"),
                           (*x.stride(), *y.stride(), f.stride(0))))
        args = dict(x_ptr=x, y_ptr=y, freqs_ptr=f, B=B, H=H, HALF=D // 2,
                    BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_H=p.block_h,
                    BF16_RTNE=False, **strides)
        if what != "heads":
            args.update(S=S, BLOCK_S=p.block_s)
        if what in ("chunks", "accurate", "equal_halves"):
            args.update(B_CHUNK=p.chunk, ACCURATE=what != "chunks")
        grid, warps, tile = p.grid, p.num_warps, dict(BLOCK_S=p.block_s, BLOCK_H=p.block_h,
                                                      B_CHUNK=p.chunk)
    # as a launch compiles it: the JIT's own specialization (ints equal to 1 become constants,
    # pointers and multiples of 16 get a divisibility hint, what lets the compiler prove a
    # contiguous run is aligned)
    compiled = compile_for_cuda(kernel, args, num_warps=warps, arch=arch)
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    layouts = []
    for spec_text in _BLOCKED.findall(ttgir):
        fields = dict(re.findall(r"(\w+) = \[([\d, ]*)\]", spec_text))
        layouts.append({k: [int(v) for v in fields[k].split(",")] for k in
                        ("sizePerThread", "threadsPerWarp", "warpsPerCTA", "order") if k in fields})
    return dict(what=what, shape=[S, B, H, D], dtype=dtype, sm_count=sm_count, arch=arch,
                grid=list(grid), num_warps=warps, tile=tile, layouts=layouts,
                accesses=_ptx_accesses(ptx), trig=_trig(ptx),
                **_resources(compiled.asm.get("cubin", b"")),
                ttgir_blocked=[line for line in ttgir.splitlines() if line.startswith("#blocked")])


def compile_for_gpu(whats, S: int = 4096, B: int = 8, H: int = 32, D: int = 128,
                    dtype: str = "bf16", *, sm_count: int = 132, arch: int = 90,
                    knobs: Optional[dict] = None, timeout: float = 300.0) -> list:
    """Compile rungs ("ropelib": the finished kernel; "two-pass": the flat pass of the route
    ropelib takes for large contiguous tensors) as launches on a CUDA GPU would.

    No GPU is needed: Triton compiles for a target (default sm_90, an H100/H200 with 132 SMs)
    with the tiles ropelib would pick there (`knobs`: another GPU's, e.g. the H200's
    {"tile_loop": (16, 8)}). For each of `whats` (a name or a sequence of names) returns a dict:
    the launch, the TTGIR layouts (`#ttg.blocked`: sizePerThread, threadsPerWarp, warpsPerCTA,
    order), the PTX's global loads/stores by vector width, which sin/cos it calls, and the
    registers per thread of the machine code (ptxas's allocation, read with cuobjdump). Under the
    interpreter the compilation runs in a child Python with TRITON_INTERPRET unset (a kernel
    object cannot be both interpreted and compiled).
    """
    whats = [whats] if isinstance(whats, str) else list(whats)
    if not INTERPRET:
        return [_compile_here(w, S, B, H, D, dtype, sm_count, arch, knobs) for w in whats]
    call = json.dumps([whats, S, B, H, D, dtype, sm_count, arch, knobs])
    code = ("import json; from ropelib.course.ladder import _compile_here; "
            f"w, *a = json.loads({call!r}); "
            "print(json.dumps([_compile_here(x, *a) for x in w]))")
    return in_compiling_python(code, what=f"compiling {whats} for sm_{arch}", timeout=timeout,
                               reuse=True)


# --- the figures of notebook 05 -------------------------------------------------------------------

def pct_range(row: dict) -> tuple:
    """(low, high) % of copy of a timed row: its own time's 80 % and 20 % quantiles against the
    copy's median (the spread of the copy's time is left out)."""
    pct = float(row["pct_of_copy"])
    return pct * row["ms"] / row["ms_p80"], pct * row["ms"] / row["ms_p20"]


def _steps_within(rows, case: str, spread) -> list:
    """The rungs of `case` whose step from the rung before (a to b) is smaller than
    `spread(a, b)`, a width in % of copy."""
    rs = [r for r in rows if r["case"] == case and r["provider"] in NAMES
          and r.get("pct_of_copy") is not None]
    return [b["provider"] for a, b in zip(rs, rs[1:])
            if spread(a, b) > abs(b["pct_of_copy"] - a["pct_of_copy"])]


def _width(r) -> float:
    lo, hi = pct_range(r)
    return hi - lo


def within_spread(rows, case: str) -> list:
    """The rungs of `case` whose step from the rung before is smaller than the rung's own 20-80 %
    quantile range (pct_range): steps the run cannot tell from the spread of its calls."""
    return _steps_within(rows, case, lambda a, b: _width(b))


def within_both_spreads(rows, case: str) -> list:
    """The rungs of `case` whose step from the rung before is smaller than the two rungs' 20-80 %
    quantile ranges (pct_range) laid end to end: a step the run cannot tell from the spread of
    the calls at either end of it. Stricter than `within_spread`, which reads the rung's range
    alone."""
    return _steps_within(rows, case, lambda a, b: _width(a) + _width(b))


def plot_waterfall(rows, path=None, title=None, names=None, *, unclear_rule=None):
    """The "% of copy" waterfall with the spread of every timing.

    One panel per case; a rung's bar goes from the rung before to its own median % of copy
    (green up, red down), ropelib's two bars end the panel in grey. A black whisker spans the
    rung's 20 % to 80 % quantiles. A step bar whose whisker is longer than the step itself is
    drawn hatched and pale: the run cannot tell that step from the spread of its calls.
    `names` renames providers on the axis (e.g. {"ropelib": "finished kernel (forced)"}).
    `unclear_rule(rows, case)` picks the hatched steps instead (e.g. `within_both_spreads`).
    Returns the figure (saved to `path` when given)."""
    import matplotlib.pyplot as plt
    unclear_rule = unclear_rule or within_spread
    names = names or {}
    timed = [r for r in rows if r.get("pct_of_copy") is not None and r["provider"] != "copy"]
    if not timed:
        raise ValueError("no timed rows to draw: run benchmarks/ladder.py on a GPU first")
    case_names = list(dict.fromkeys(r["case"] for r in timed))
    fig, axes = plt.subplots(1, len(case_names), figsize=(5.2 * len(case_names), 4.6),
                             squeeze=False)
    for ax, case in zip(axes[0], case_names):
        rs = sorted((r for r in timed if r["case"] == case), key=lambda r: r["step"])
        unclear_steps = unclear_rule(rs, case)
        prev = 0.0
        for i, r in enumerate(rs):
            pct = float(r["pct_of_copy"])
            lo_q, hi_q = pct_range(r)
            if r["provider"] in ("ropelib", "ropelib_planned"):
                ax.bar(i, pct, color="0.6" if r["provider"] == "ropelib" else "0.8")
            else:
                lo, hi = sorted((prev, pct))
                unclear = r["provider"] in unclear_steps     # the spread is wider than the step
                colour = "tab:green" if pct >= prev else "tab:red"
                ax.bar(i, max(hi - lo, 0.4), bottom=lo, color=colour,
                       alpha=0.35 if unclear else 1.0, hatch="//" if unclear else None,
                       edgecolor=colour)
                if i:
                    ax.plot([i - 1.4, i - 0.6], [prev, prev], color="0.3", lw=0.8)
                prev = pct
            ax.plot([i, i], [lo_q, hi_q], color="k", lw=1.2)
            ax.plot([i - 0.15, i + 0.15], [lo_q, lo_q], color="k", lw=1.0)
            ax.plot([i - 0.15, i + 0.15], [hi_q, hi_q], color="k", lw=1.0)
            ax.text(i, max(pct, hi_q) + 1.5, f"{pct:.0f}", ha="center", fontsize=8)
        ax.axhline(100, color="k", ls="--", lw=1)
        ax.set_xticks(range(len(rs)), [names.get(r["provider"], r["provider"]) for r in rs],
                      rotation=40, ha="right", fontsize=8)
        ax.set_ylim(0, 120)
        r0 = rs[0]
        ax.set_title(f"s={r0['seq_len']}, b={r0['batch']}, h={r0['heads']}, d={r0['head_dim']}",
                     fontsize=9)
    axes[0][0].set_ylabel("% of a copy: the copy's time over the kernel's\n"
                          "(whiskers: 20-80 % quantiles of the calls)")
    fig.suptitle((title or "From the batch-reusing grid to the finished kernel, one idea at a "
                  "time") + "\nhatched: " + ("a step smaller than its rung's spread"
                                       if unclear_rule is within_spread else
                                       "a step smaller than the spreads at its two ends"),
                 fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# --- the ladder in several processes (benchmarks/ladder.py --processes) ----------------------------

STEP_NAMES = NAMES[1:] + ("ropelib",)   # a step: from the rung before (ropelib: from rung 6)


def copy_share(rows) -> dict:
    """{(run, case, provider): % of copy}, as the course reads it: the copy's median time over
    the provider's, the copy timed in the same process (rows without a `run` column: run 1)."""
    copy_ms = {(r.get("run", 1), r["case"]): r["ms"] for r in rows if r["provider"] == "copy"}
    return {(r.get("run", 1), r["case"], r["provider"]): 100 * copy_ms[r.get("run", 1),
                                                                       r["case"]] / r["ms"]
            for r in rows if r.get("ms") is not None}


def steps_by_run(rows) -> dict:
    """{(case, step name): [the step in points of a copy, one per process, in run order]}: the
    rung's % of copy less the rung before's, each process against its own copy; the finished
    kernel's step (`ropelib`) from rung 6 (equal_halves)."""
    pct = copy_share(rows)
    runs = sorted({k[0] for k in pct})
    cases = list(dict.fromkeys(r["case"] for r in rows))
    before = dict(zip(NAMES[1:], NAMES)) | {"ropelib": NAMES[-1]}
    return {(c, n): [pct[k, c, n] - pct[k, c, before[n]] for k in runs]
            for c in cases for n in STEP_NAMES}


def settled(values) -> bool:
    """Does every process measure the step with the same sign? (With n processes and no real
    step, a coin per process, that happens by chance once in 2 ** (n - 1): once in 512 for ten.)"""
    return all(v > 0 for v in values) or all(v < 0 for v in values)


def plot_steps_by_run(rows, title: str, names=None):
    """One panel per case: each step in points of a copy, a dot per process and a bar at their
    median; steps every process measures with the same sign in colour (green up, red down),
    the others grey. Returns the figure."""
    import matplotlib.pyplot as plt
    import statistics
    names = names or {}
    steps = steps_by_run(rows)
    cases = list(dict.fromkeys(c for c, _ in steps))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.4 * len(cases), 3.9), squeeze=False,
                             sharey=False)
    for ax, case in zip(axes[0], cases):
        for i, n in enumerate(STEP_NAMES):
            vals = steps[case, n]
            med = statistics.median(vals)
            colour = ("tab:green" if med > 0 else "tab:red") if settled(vals) else "0.6"
            ax.bar(i, med, color=colour, alpha=0.45, width=0.7)
            ax.plot([i] * len(vals), vals, "o", ms=3.2, color=colour, mec="k", mew=0.4)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(STEP_NAMES)), [names.get(n, n) for n in STEP_NAMES],
                      rotation=40, ha="right", fontsize=7.5)
        r0 = next(r for r in rows if r["case"] == case)
        ax.set_title(f"s={r0['seq_len']}, b={r0['batch']}, h={r0['heads']}", fontsize=9)
    axes[0][0].set_ylabel("step, points of a copy\n(a dot per process)")
    fig.suptitle(f"{title}\ncoloured: every process measures the step with the same sign",
                 fontsize=9.5)
    fig.tight_layout()
    return fig


def _place_numbers(ax, points, fontsize=7):
    """Write each point's number beside it where it overprints no other number or point: the
    first of a ring of offsets, tried nearest first, that is free on the axes as drawn."""
    fig = ax.figure
    fig.canvas.draw()
    to_px = ax.transData.transform
    scale = fig.dpi / 72.0
    dots = [to_px((px, py)) for px, py, _ in points]
    taken = []      # (x0, y0, x1, y1) in pixels
    offsets = [(4, 2), (4, -9), (-4, 2), (-4, -9), (4, 9), (-4, 9), (4, -16), (-4, -16),
               (12, -3), (-12, -3), (4, 16), (-4, 16), (12, 9), (-12, 9), (12, -14), (-12, -14),
               (20, -3), (-20, -3), (4, -24), (4, 24)]
    for (px, py, text), (dx0, dy0) in zip(points, dots):
        w, h = 0.62 * fontsize * len(text) * scale, fontsize * scale
        for ox, oy in offsets:
            x0 = dx0 + ox * scale - (w if ox < 0 else 0)
            y0 = dy0 + oy * scale
            box = (x0, y0, x0 + w, y0 + h)
            clash = any(not (box[2] < b[0] or b[2] < box[0] or box[3] < b[1] or b[3] < box[1])
                        for b in taken)
            clash = clash or any(box[0] - 3 < dx < box[2] + 3 and box[1] - 3 < dy < box[3] + 3
                                 for dx, dy in dots)
            if not clash:
                break
        taken.append(box)
        ax.annotate(text, (px, py), xytext=(ox, oy), textcoords="offset points",
                    fontsize=fontsize, ha="right" if ox < 0 else "left", va="bottom")


def plot_in_flight(rows, groups, title=None, path=None, zoom_us=None):
    """Kernel time against the KiB of x one SM's resident warps ask for per step
    (`x_kib_per_sm` of the mechanism CSV), one numbered point per variant.

    rows: {variant: mechanism row}; groups: [(group name, colour, {variant: label})], every
    variant drawn belongs to one group. Each point carries a number, placed where it overprints
    nothing; the key on the right says which label each number stands for. The middle panel
    repeats the points faster than `zoom_us` (by default 1.25 times the fastest) at a larger
    scale. Returns the figure (saved to `path` when given)."""
    import matplotlib.pyplot as plt
    fig, (ax, near, key) = plt.subplots(1, 3, figsize=(13, 4.8),
                                        gridspec_kw=dict(width_ratios=[2, 2, 1.1]))
    lines, points = [], []
    for group, colour, members in groups:
        lines.append((group, colour, True))
        for variant, label in members.items():
            r = rows[variant]
            points.append((r["x_kib_per_sm"], r["us"], str(len(points) + 1), colour))
            lines.append((f"{len(points):2d}  {label}", colour, False))
    zoom_us = zoom_us or 1.25 * min(us for _, us, _, _ in points)
    fast = [pt for pt in points if pt[1] <= zoom_us]
    for panel, pts in ((ax, points), (near, fast)):
        panel.scatter([pt[0] for pt in pts], [pt[1] for pt in pts], s=30,
                      color=[pt[3] for pt in pts], edgecolors="k", linewidths=0.4, zorder=3)
        panel.set_xscale("log")
        lo, hi = min(pt[0] for pt in pts), max(pt[0] for pt in pts)
        ticks = [2 ** k for k in range(0, 8) if lo / 2 <= 2 ** k <= hi * 2]
        panel.set_xticks(ticks, [str(t) for t in ticks])
        panel.minorticks_off()
        panel.set_xlim(lo / 1.25, hi * 1.25)
        panel.grid(alpha=0.3)
        panel.set_xlabel("KiB of x the resident warps of one SM request per step\n"
                         "(an upper bound on bytes in flight)", fontsize=8)
    ax.set_ylabel("kernel time, µs (Nsight Compute)")
    near.set_ylim(min(pt[1] for pt in fast) - 3, zoom_us + 3)
    near.set_title(f"the kernels under {zoom_us:.0f} µs, enlarged", fontsize=9)
    if title:
        ax.set_title(title, fontsize=9)
    key.axis("off")
    step = 1.0 / max(len(lines), 1)
    for k, (text, colour, is_group) in enumerate(lines):
        key.text(0.0, 1.0 - k * step, text, transform=key.transAxes, va="top",
                 fontsize=7.5 if not is_group else 8, color=colour,
                 fontweight="bold" if is_group else "normal", family="monospace")
    fig.tight_layout()
    _place_numbers(ax, [pt[:3] for pt in points if pt[1] > zoom_us])
    _place_numbers(near, [pt[:3] for pt in fast])
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
