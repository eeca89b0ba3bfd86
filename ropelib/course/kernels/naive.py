"""Kernel generation 1, the teaching baseline: one Triton program per (token, batch, head) row.

How it is parallelised: the grid is one-dimensional with S*B*H programs. Program `row` splits
its index into (s, b, h), loads the angles of position s, computes cos/sin, loads the two
halves of x[s, b, h, :] and stores the rotated row. Nothing is shared between programs, so the
angle table is read B*H times per position (mostly from cache) and each program does very
little work: simple to read, and the baseline generations 2 (batch_reuse.py) and 3 (fused.py)
are measured against.

Convention (Transformer Engine's): x is sbhd [S, B, H, D], rotate-half, full rotary; freqs
holds one fp32 angle per feature, [P, 1, 1, D] or [P, D] with P >= S, usually cat(f, f).
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import check_kernel_device
from ...kernels.common import BF16_RTNE, round_to

# x dtypes the teaching kernels accept; fp64 is computed in fp64 (so gradcheck works).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 512


@triton.jit
def _rope_naive_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], same dtype as x, last dim contiguous
    freqs_ptr,  # *fp32: angles [P, D], P >= S (row s holds the D angles of position s)
    B,  # batch size: splits the program id into (s, b, h)
    H,  # number of heads
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
    stride_fs, stride_fd,  # freqs strides, in elements
    HALF: tl.constexpr,  # D // 2: features in each half (any size, 72/2 = 36 included)
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile each half is loaded in
    BACKWARD: tl.constexpr,  # False: y = R(theta) x; True: y = R(theta)^T x = R(-theta) x
    COMPUTE_DTYPE: tl.constexpr,  # tl.float32 (tl.float64 for fp64 inputs)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # One program = one row x[s, b, h, :]. int64 so row offsets cannot overflow on huge tensors.
    row = tl.program_id(0).to(tl.int64)
    s = row // (B * H)
    b = (row // H) % B
    h = row % H

    # Tiles are powers of two; the mask switches off the lanes past HALF (e.g. 36 of 64).
    offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF] feature index within a half
    mask = offs < HALF

    # Angles of position s for both halves, then cos/sin in COMPUTE_DTYPE (fp32 math).
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    cos1 = tl.cos(theta1)
    cos2 = tl.cos(theta2)
    if BACKWARD:
        # The transpose of [[c1, -s1], [s2, c2]] is [[c1, s2], [-s1, c2]]: swap and negate the
        # sines. With TE's cat(f, f) table s1 == s2, so this is the rotation by -theta.
        sin1 = -tl.sin(theta2)
        sin2 = -tl.sin(theta1)
    else:
        sin1 = tl.sin(theta1)
        sin2 = tl.sin(theta2)

    # A loaded tile cannot be sliced, so the two halves are loaded as two tiles.
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)

    # rotate-half: y = x * cos + [-x2, x1] * sin, in COMPUTE_DTYPE, rounded once on the store.
    y1 = x1 * cos1 - x2 * sin1
    y2 = x2 * cos2 + x1 * sin2
    y_row = y_ptr + s * stride_ys + b * stride_yb + h * stride_yh
    tl.store(y_row + offs, round_to(y1, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
    tl.store(y_row + HALF + offs, round_to(y2, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)


def _check_inputs(x, freqs, out, fn_name):
    """Validate (x, freqs, out) for the teaching kernels; return freqs as a [P, D] view."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn_name}: x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(freqs, torch.Tensor):
        raise TypeError(f"{fn_name}: freqs must be a torch.Tensor, got {type(freqs).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{fn_name}: x must be 4-D [S, B, H, D] (sbhd), got shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{fn_name}: x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    S, B, H, D = x.shape
    if D % 2 or D == 0 or D > MAX_HEAD_DIM:
        raise ValueError(f"{fn_name}: x's head dim D = x.shape[3] must be even and in "
                         f"[2, {MAX_HEAD_DIM}], got {D}")
    if freqs.dtype != torch.float32:
        raise TypeError(f"{fn_name}: freqs must be float32 angles (TE's convention), got "
                        f"{freqs.dtype}")
    if freqs.dim() == 4 and freqs.shape[1] == 1 and freqs.shape[2] == 1:
        f2 = freqs[:, 0, 0, :]
    elif freqs.dim() == 2:
        f2 = freqs
    else:
        raise ValueError(f"{fn_name}: freqs must be [P, 1, 1, D] or [P, D], got shape "
                         f"{tuple(freqs.shape)}")
    if f2.shape[1] != D:
        raise ValueError(f"{fn_name}: freqs' last dim must equal x's head dim {D} (full rotary), "
                         f"got {f2.shape[1]}")
    if f2.shape[0] < S:
        raise ValueError(f"{fn_name}: freqs has {f2.shape[0]} positions but x has S = {S} "
                         "tokens; freqs.shape[0] must be >= S")
    if freqs.device != x.device:
        raise ValueError(f"{fn_name}: freqs is on {freqs.device} but x is on {x.device}; "
                         "they must be on the same device")
    check_kernel_device(x, "x")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{fn_name}: out must be a torch.Tensor or None, got "
                            f"{type(out).__name__}")
        if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"{fn_name}: out must have x's shape {tuple(x.shape)}, dtype "
                             f"{x.dtype} and device {x.device}; got {tuple(out.shape)}, "
                             f"{out.dtype}, {out.device}")
        if not out.is_contiguous():
            # A stride-0 (expanded) out would have several programs write one element.
            raise ValueError(f"{fn_name}: out must be contiguous, got strides {out.stride()}")
        same_storage = (out.numel() and x.numel() and
                        out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
        if same_storage and (out.data_ptr() != x.data_ptr() or out.stride() != x.stride()):
            raise ValueError(f"{fn_name}: out overlaps x; pass out=x (in place) or a separate "
                             "tensor")
    return f2


def half_tile(head_dim: int):
    """(HALF, BLOCK_HALF): features per half, and the power-of-two tile a half is loaded in."""
    half = head_dim // 2
    return half, triton.next_power_of_2(half)


def _launch_params(x):
    """(HALF, BLOCK_HALF, COMPUTE_DTYPE) for x."""
    compute = tl.float64 if x.dtype == torch.float64 else tl.float32
    return (*half_tile(x.shape[3]), compute)


def naive_grid(S: int, B: int, H: int):
    """The launch grid: one program per (token, batch, head) row."""
    return (S * B * H,)


def angle_bytes_requested(S: int, B: int, H: int, D: int) -> int:
    """Bytes of fp32 angles all programs load: every program reads its position's D angles."""
    return naive_grid(S, B, H)[0] * D * 4


def default_num_warps(block_half: int) -> int:
    """Warps per program: one warp (32 threads) per 128 elements of a half, 1 to 8."""
    return max(1, min(8, block_half // 128))


def rope_naive(x: torch.Tensor, freqs: torch.Tensor, *, backward: bool = False,
               out: Optional[torch.Tensor] = None, num_warps: Optional[int] = None) -> torch.Tensor:
    """Rotate x by the angles in freqs with the naive kernel (one program per row).

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
    f2 = _check_inputs(x, freqs, out, "rope_naive")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if x.numel() == 0:
        return y
    S, B, H, D = x.shape
    half, block_half, compute = _launch_params(x)
    _rope_naive_kernel[naive_grid(S, B, H)](
        x, y, f2, B, H,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        y.stride(0), y.stride(1), y.stride(2),
        f2.stride(0), f2.stride(1),
        HALF=half, BLOCK_HALF=block_half, BACKWARD=bool(backward), COMPUTE_DTYPE=compute,
        BF16_RTNE=BF16_RTNE,
        num_warps=num_warps or default_num_warps(block_half),
    )
    return y
