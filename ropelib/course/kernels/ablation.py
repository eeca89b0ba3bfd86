"""The ablation kernel: the batch-reusing grid kernel with each of its design choices a switch.

Notebook 04 asks why the batch-reusing (S, H)-grid kernel (batch_reuse.py) beat Transformer
Engine's fused RoPE. This kernel answers it one factor at a time: `variants(H)` lists launches
that differ from the batch-reusing structure (`sh_loop_b`) in one switch each, and
benchmarks/ablation.py times them (benchmarks/mechanism.py profiles them).

How it is parallelised: the grid is three-dimensional, (S, cdiv(H, BLOCK_H), B / batch rows per
program). Program (s, hb, bb) owns position s, a tile of BLOCK_H heads (the rows of a
[BLOCK_H, BLOCK_HALF] tile per half) and a run of batch rows. It gets cos/sin of position s
once, computed from the angles or read from precomputed tables (TABLE), shares them by all its
heads and all its batch rows, and then rotates one [BLOCK_H, D/2] tile of both halves per batch
row, in a runtime loop or unrolled at compile time (UNROLL_B). The switches cover the grids of
the three kernels notebook 04 compares:

* BLOCK_H = 1, all B rows per program: the (S, H) grid of the batch-reusing kernel;
* BLOCK_H = 1, one row per program: grid (S, H, B), as many programs as the naive kernel;
* BLOCK_H >= H, one row per program: Transformer Engine's grid (s, b), written in Triton.

Inputs, as the benchmarks use them: x sbhd [S, B, H, D] with its last dim contiguous,
rotate-half, full rotary, bf16/fp16/fp32; fp32 angles [S, D] and their cos and sin [S, D], all
contiguous. No batch mask: the batch rows per program must divide B.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ...kernels.common import BF16_RTNE, round_to


@triton.jit
def _rotate_tile(x_ptr, y_ptr, x_off, y_off, mask, cos1, sin1, cos2, sin2,
                 HALF: tl.constexpr,  # features in each half
                 BF16_RTNE: tl.constexpr):  # round bf16 to nearest even by hand (interpreter)
    # one [heads, BLOCK_HALF] tile of both halves: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2
    x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_off + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + y_off, round_to(x1 * cos1 - x2 * sin1, y_ptr.dtype.element_ty, BF16_RTNE),
             mask=mask)
    tl.store(y_ptr + y_off + HALF,
             round_to(x2 * cos2 + x1 * sin2, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)


@triton.jit
def _rope_ablation_kernel(
    x_ptr,  # *x: input [S, B, H, D], last dim contiguous
    y_ptr,  # *y: output [S, B, H, D], last dim contiguous
    freqs_ptr,  # *fp32: angles [S, D], contiguous (TABLE=False)
    cos_ptr, sin_ptr,  # *fp32: cos and sin of the angles [S, D], contiguous (TABLE=True)
    B, H,  # batch size, heads
    BATCH_PER_PROGRAM,  # batch rows each program loops over at run time; divides B
    stride_xs, stride_xb, stride_xh,  # x strides, in elements
    stride_ys, stride_yb, stride_yh,  # y strides, in elements
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_H: tl.constexpr,  # heads per program: the rows of the tile
    UNROLL_B: tl.constexpr,  # 0: runtime loop; n > 0 (divides B): n rows unrolled (static_range)
    TABLE: tl.constexpr,  # True: read cos/sin tables; False: compute cos/sin from the angles
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # grid (S, cdiv(H, BLOCK_H), cdiv(B, batch rows per program))
    s = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    d_mask = offs < HALF
    mask = (heads < H)[:, None] & d_mask[None, :]  # [BLOCK_H, BLOCK_HALF]

    # cos/sin of position s, once per program, shared by its heads and its batch rows
    row = s * 2 * HALF
    if TABLE:  # read: two fp32 tables, no sin/cos evaluated
        cos1 = tl.load(cos_ptr + row + offs, mask=d_mask, other=0.0)
        cos2 = tl.load(cos_ptr + row + HALF + offs, mask=d_mask, other=0.0)
        sin1 = tl.load(sin_ptr + row + offs, mask=d_mask, other=0.0)
        sin2 = tl.load(sin_ptr + row + HALF + offs, mask=d_mask, other=0.0)
    else:  # computed: the angles read, sin/cos evaluated by every program
        theta1 = tl.load(freqs_ptr + row + offs, mask=d_mask, other=0.0)
        theta2 = tl.load(freqs_ptr + row + HALF + offs, mask=d_mask, other=0.0)
        cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
        cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    cos1, sin1 = cos1[None, :], sin1[None, :]  # [1, BLOCK_HALF]: broadcast over the heads
    cos2, sin2 = cos2[None, :], sin2[None, :]

    # the tile of batch row 0; row b is b * stride_xb further on
    x_off = s * stride_xs + heads[:, None] * stride_xh + offs[None, :]
    y_off = s * stride_ys + heads[:, None] * stride_yh + offs[None, :]
    if UNROLL_B > 0:  # the batch loop unrolled at compile time: one kernel per UNROLL_B
        b0 = tl.program_id(2) * UNROLL_B
        for i in tl.static_range(UNROLL_B):
            b = b0 + i
            _rotate_tile(x_ptr, y_ptr, x_off + b * stride_xb, y_off + b * stride_yb,
                         mask, cos1, sin1, cos2, sin2, HALF, BF16_RTNE)
    else:  # a runtime loop: one compiled kernel serves every batch size (Triton still builds
        # BATCH_PER_PROGRAM = 1 and multiples of 16 apart: it specializes such integers)
        b0 = tl.program_id(2) * BATCH_PER_PROGRAM
        for i in range(0, BATCH_PER_PROGRAM):
            b = b0 + i
            _rotate_tile(x_ptr, y_ptr, x_off + b * stride_xb, y_off + b * stride_yb,
                         mask, cos1, sin1, cos2, sin2, HALF, BF16_RTNE)


def default_warps(tile_elems: int) -> int:
    """One warp per 128 elements of a half-tile, 1 to 8 (ropelib's teaching kernels' rule)."""
    return max(1, min(8, tile_elems // 128))


def ablation_grid(S: int, B: int, H: int, heads_per_program: int = 1,
                  batch_per_program: Optional[int] = None) -> tuple:
    """The launch grid (S, cdiv(H, heads per program), B / batch rows per program)."""
    bpp = B if batch_per_program is None else batch_per_program
    return (S, triton.cdiv(H, heads_per_program), triton.cdiv(B, bpp))


def rope_ablation(x: torch.Tensor, freqs2d: torch.Tensor, cos2d: torch.Tensor,
                  sin2d: torch.Tensor, *, heads_per_program: int = 1,
                  batch_per_program: Optional[int] = None, unroll: bool = False,
                  table: bool = False, num_warps: Optional[int] = None,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Launch the ablation kernel with one setting of its switches.

    Args:
        x: [S, B, H, D] (sbhd), last dim contiguous; D even.
        freqs2d: fp32 angles [S, D], contiguous (read when table is False).
        cos2d, sin2d: their fp32 cos and sin [S, D], contiguous (read when table is True).
        heads_per_program: the rows of each program's tile (BLOCK_H).
        batch_per_program: batch rows each program loops over; None: all B. Must divide B.
        unroll: unroll the batch loop at compile time (tl.static_range) instead of a runtime loop.
        table: read cos/sin from cos2d, sin2d instead of computing them from freqs2d.
        num_warps: warps per program; by default one per 128 elements of a half-tile, 1 to 8.
        out: optional tensor like x to write into; by default a new one.
    Returns:
        The rotated tensor (out if given), x's dtype.
    """
    S, B, H, D = x.shape
    half, block_half = D // 2, triton.next_power_of_2(D // 2)
    bpp = B if batch_per_program is None else batch_per_program
    if B % bpp:
        raise ValueError(f"batch_per_program={bpp} must divide B={B} (the kernel has no batch mask)")
    y = torch.empty_like(x) if out is None else out
    grid = ablation_grid(S, B, H, heads_per_program, bpp)
    warps = num_warps or default_warps(heads_per_program * block_half)
    _rope_ablation_kernel[grid](
        x, y, freqs2d, cos2d, sin2d, B, H, bpp,
        x.stride(0), x.stride(1), x.stride(2), y.stride(0), y.stride(1), y.stride(2),
        HALF=half, BLOCK_HALF=block_half, BLOCK_H=heads_per_program,
        UNROLL_B=bpp if unroll else 0, TABLE=table, BF16_RTNE=BF16_RTNE, num_warps=warps)
    return y


def variants(H: int) -> list:
    """[(name, factor, description, options)] of the ablation kernel for H heads, one factor
    changed per row; `options` are rope_ablation's keyword arguments."""
    v = [
        ("sh_loop_b", "baseline", "grid (S, H), loop over all B rows: the batch-reuse structure",
         dict()),
        ("sh_one_b", "batch per program",
         "grid (S, H, B), one batch row per program: no reuse over the batch",
         dict(batch_per_program=1)),
        ("sh_loop_b_table", "cos/sin source", "as sh_loop_b, cos/sin read from fp32 tables",
         dict(table=True)),
        ("sh_one_b_table", "cos/sin source", "as sh_one_b, cos/sin read from fp32 tables",
         dict(batch_per_program=1, table=True)),
        ("sh_loop_b_unrolled", "batch loop", "as sh_loop_b, the loop unrolled (tl.static_range)",
         dict(unroll=True)),
    ]
    for hp in (2, 4, 8):
        if hp < H:
            v.append((f"heads{hp}_loop_b", "heads per program",
                      f"{hp} heads per program (a [{hp}, D/2] tile), loop over all B rows",
                      dict(heads_per_program=hp)))
    v.append(("heads_all_one_b", "heads per program",
              "all H heads per program, one batch row: TE's grid (s, b), in Triton",
              dict(heads_per_program=triton.next_power_of_2(H), batch_per_program=1)))
    v.append(("heads_all_one_b_table", "heads per program",
              "as heads_all_one_b, cos/sin read from fp32 tables",
              dict(heads_per_program=triton.next_power_of_2(H), batch_per_program=1, table=True)))
    for w in (1, 2, 4, 8):
        v.append((f"sh_loop_b_w{w}", "num_warps", f"as sh_loop_b with num_warps={w}",
                  dict(num_warps=w)))
    hp = min(8, triton.next_power_of_2(H))
    for w in (1, 2, 4, 8):
        v.append((f"heads{hp}_loop_b_w{w}", "num_warps",
                  f"{hp} heads per program, loop over all B rows, num_warps={w}",
                  dict(heads_per_program=hp, num_warps=w)))
    return v


def shape_columns(S: int, B: int, H: int, D: int, opts: dict) -> dict:
    """One variant's launch at [S, B, H, D], as the benchmarks' columns: grid, programs, tile,
    warps, elements per thread and cos/sin evaluations per position."""
    hp = opts.get("heads_per_program", 1)
    bpp = opts.get("batch_per_program") or B
    block_half = triton.next_power_of_2(D // 2)
    grid = ablation_grid(S, B, H, hp, bpp)
    warps = opts.get("num_warps") or default_warps(hp * block_half)
    programs_per_position = grid[1] * grid[2]
    return dict(grid="x".join(map(str, grid)), programs=grid[0] * programs_per_position,
                heads_per_program=hp, batch_per_program=bpp,
                batch_loop="unrolled" if opts.get("unroll") else "runtime",
                cos_sin="table" if opts.get("table") else "computed", num_warps=warps,
                tile_elems=hp * block_half, elems_per_thread=hp * block_half / (32 * warps),
                cos_sin_per_position=0 if opts.get("table") else programs_per_position * D)
