"""Kernel generation 2, the batch-reusing grid: one Triton program per (token, head) pair.

How it is parallelised: the grid is two-dimensional, (S, H), one program per (position s,
head h), the grid of the earlier study project this retells. Every row x[s, b, h, :] of the
batch uses the same angles, so the program computes cos/sin of position s once and then loops
over the batch b = 0..B-1, rotating one row per iteration. The angle table is read H times per
position instead of B*H times, and sin/cos are evaluated B times less often than in the naive
kernel; each program does B rows of work. Heads are not tiled (one head per program): reusing
cos/sin across the heads too, and giving each program a tile of rows, is what the finished
kernel (fused.py) adds.

Same inputs and outputs as the naive kernel: x sbhd [S, B, H, D], rotate-half, full rotary,
fp32 angles freqs [P, 1, 1, D] or [P, D] with P >= S.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ...kernels.common import BF16_RTNE, round_to
from .naive import _check_inputs, _launch_params, default_num_warps


@triton.jit
def _rope_batch_reuse_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], same dtype as x, last dim contiguous
    freqs_ptr,  # *fp32: angles [P, D], P >= S (row s holds the D angles of position s)
    B,  # batch size: the length of the loop each program runs
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
    stride_fs, stride_fd,  # freqs strides, in elements
    HALF: tl.constexpr,  # D // 2: features in each half (any size, 72/2 = 36 included)
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile each half is loaded in
    BACKWARD: tl.constexpr,  # False: y = R(theta) x; True: y = R(theta)^T x = R(-theta) x
    COMPUTE_DTYPE: tl.constexpr,  # tl.float32 (tl.float64 for fp64 inputs)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # One program = one (position, head) pair; int64 so offsets cannot overflow on huge tensors.
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)

    offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF] feature index within a half
    mask = offs < HALF

    # cos/sin of position s: computed once here, reused by every row of the batch below.
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    cos1 = tl.cos(theta1)
    cos2 = tl.cos(theta2)
    if BACKWARD:
        # Transpose of [[c1, -s1], [s2, c2]]: swap and negate the sines (= rotation by -theta).
        sin1 = -tl.sin(theta2)
        sin2 = -tl.sin(theta1)
    else:
        sin1 = tl.sin(theta1)
        sin2 = tl.sin(theta2)

    x_base = x_ptr + s * stride_xs + h * stride_xh
    y_base = y_ptr + s * stride_ys + h * stride_yh
    # A runtime loop (not tl.static_range): B is not a constexpr, so one compiled kernel
    # serves every batch size, except that Triton specializes an integer argument equal to 1
    # (compiled as a constant) or divisible by 16: B = 1 and a B that 16 divides get builds of
    # their own.
    for b in range(0, B):
        x_row = x_base + b * stride_xb
        x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
        y_row = y_base + b * stride_yb
        tl.store(y_row + offs, round_to(y1, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
        tl.store(y_row + HALF + offs, round_to(y2, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)


def batch_reuse_grid(S: int, H: int):
    """The launch grid: one program per (token, head) pair; each loops over the batch."""
    return (S, H)


def angle_bytes_requested(S: int, B: int, H: int, D: int) -> int:
    """Bytes of fp32 angles all programs load: one row of D angles per program, not per batch."""
    programs = batch_reuse_grid(S, H)
    return programs[0] * programs[1] * D * 4


def rope_batch_reuse(x: torch.Tensor, freqs: torch.Tensor, *, backward: bool = False,
                     out: Optional[torch.Tensor] = None,
                     num_warps: Optional[int] = None) -> torch.Tensor:
    """Rotate x by the angles in freqs with the (S, H)-grid kernel that reuses cos/sin over B.

    Args:
        x: [S, B, H, D] (sbhd), fp16/bf16/fp32/fp64, any strides; D even, <= 512.
        freqs: fp32 angles [P, 1, 1, D] or [P, D], P >= S (TE's convention, cat(f, f)).
        backward: rotate by -theta (the transpose), i.e. turn grad_y into grad_x.
        out: optional contiguous [S, B, H, D] tensor of x's dtype to write into (`out=x`
            rotates a contiguous x in place); by default a new contiguous tensor.
        num_warps: warps per program (32 threads each); by default from the tile size.
    Returns:
        The rotated tensor (out if given), dtype of x; math in fp32 (fp64 for fp64 x), one rounding.
    """
    f2 = _check_inputs(x, freqs, out, "rope_batch_reuse")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if x.numel() == 0:
        return y
    S, B, H, D = x.shape
    half, block_half, compute = _launch_params(x)
    _rope_batch_reuse_kernel[batch_reuse_grid(S, H)](
        x, y, f2, B,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        y.stride(0), y.stride(1), y.stride(2),
        f2.stride(0), f2.stride(1),
        HALF=half, BLOCK_HALF=block_half, BACKWARD=bool(backward), COMPUTE_DTYPE=compute,
        BF16_RTNE=BF16_RTNE,
        num_warps=num_warps or default_num_warps(block_half),
    )
    return y
