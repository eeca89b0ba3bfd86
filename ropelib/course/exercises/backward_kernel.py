"""Notebook 06's kernel exercise: write the backward kernel from a blank `@triton.jit`.

The backward turns dL/dy into dL/dx = R(theta)^T dL/dy: for a rotate-half pair reading the angles
theta1 (feature j) and theta2 (feature j + R/2) it is

    gx1 =  gy1 * cos(theta1) + gy2 * sin(theta2)
    gx2 =  gy2 * cos(theta2) - gy1 * sin(theta1)

which is the rotation by -theta when theta1 == theta2 (TE's cat(f, f) table). The check launches
the learner's kernel itself (the signature of notebook 04's exercise, grid (S, H)) on fresh
gradients: TE's table and a table whose two halves differ (so the swap of the sines matters), a
stride-0 gradient (what `y.sum()` hands the backward), a non-contiguous one, partial rotary and
fp16, and compares with the autograd of the reference.

The launches run with ropelib's own answers barred (`own_code`): ropelib's kernels, the forward
kernel of notebook 04's worked solution and this exercise's worked solution are refused.

`count_launches` counts Triton kernel launches and records which kernels ran; the launcher and
autograd-Function checks of notebook 06 use it to tell a Function that runs the learner's kernel
from one that falls back to PyTorch or to ropelib's.
"""
import contextlib

import torch
import triton
import triton.language as tl

from ... import reference, runtime
from . import solution
from .grid_kernel import _inputs, check_kernel_cases

__all__ = ["BACKWARD_KERNEL_SIGNATURE", "check_backward_kernel", "show_solution",
           "count_launches", "reference_grad"]

BACKWARD_KERNEL_SIGNATURE = '''\
@triton.jit
def my_backward_kernel(
    gy_ptr,  # *dL/dy: input [S, B, H, D], any strides (stride 0 included)
    gx_ptr,  # *dL/dx: output [S, B, H, D], contiguous, same dtype as dL/dy
    freqs_ptr,  # *fp32: angles [S, R], contiguous; R = 2 * ROT_HALF <= D
    B,  # batch size: each program loops over it
    stride_gs, stride_gb, stride_gh, stride_gd,  # dL/dy strides, in elements
    stride_xs, stride_xb, stride_xh,  # dL/dx strides, in elements (last one == 1)
    D,  # head dim: gradients of features R..D-1 pass through unchanged
    ROT_HALF: tl.constexpr,  # R // 2: features in each rotated half
    BLOCK_HALF: tl.constexpr,  # next power of two >= ROT_HALF
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R (1 when R == D)
):
    # launched on grid (S, H), as notebook 04's kernel: dL/dx = R(theta)^T dL/dy
    pass  # your code
'''


def reference_grad(grad_y: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """dL/dx for dL/dy = grad_y: the autograd of the fp64 reference, rounded to grad_y's dtype."""
    x = torch.zeros(grad_y.shape, dtype=torch.float64, device=grad_y.device, requires_grad=True)
    (gx,) = torch.autograd.grad(reference.rope_reference(x, freqs), x, grad_y.double())
    return gx.to(grad_y.dtype)


def _backward_cases(gen):
    device = runtime.default_device()
    c = []
    for S, B, H, D, R, dtype, kind, table in (
            (3, 2, 2, 16, 16, torch.float32, "", "te"),
            (3, 2, 2, 16, 16, torch.float32, "", "any"),
            (2, 3, 2, 24, 24, torch.float32, "stride0", "any"),
            (3, 2, 2, 16, 16, torch.float32, "strided", "te"),
            (2, 2, 2, 20, 8, torch.float32, "", "any"),
            (2, 1, 3, 32, 32, torch.float16, "", "te")):
        g, f2 = _inputs(gen, S, B, H, D, R, dtype, strided=(kind == "strided"), table=table)
        if kind == "stride0":  # the gradient of y.sum(): one value broadcast, every stride 0
            g = torch.ones((), dtype=dtype, device=device).expand(S, B, H, D)
        label = (f"dL/dy [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')}"
                 + {"": "", "stride0": ", all strides 0", "strided": ", non-contiguous"}[kind]
                 + (", TE's table" if table == "te" else ", halves with different angles")
                 + (f", rotary dim {R} of {D}" if R < D else ""))
        c.append((label, g, f2))
    return c


def check_backward_kernel(kernel) -> bool:
    """Launch the learner's backward kernel on grid (S, H) and compare with the autograd of the
    reference (TE's and a general table, stride-0 and strided dL/dy, partial rotary, fp16)."""
    return check_kernel_cases(
        "backward kernel", kernel, _backward_cases(torch.Generator().manual_seed(5)),
        reference_grad, what="your backward kernel",
        hint="dL/dx = J^T dL/dy. Write J for one pair (theta1 on feature j, theta2 on j + R/2) "
             "and transpose it: the sines change sign AND change places, which only shows when "
             "the two halves' angles differ")


@triton.jit
def _rope_backward_solution_kernel(
    gy_ptr,  # *dL/dy: input [S, B, H, D], any strides (stride 0 included)
    gx_ptr,  # *dL/dx: output [S, B, H, D], contiguous, same dtype as dL/dy
    freqs_ptr,  # *fp32: angles [S, R], contiguous; R = 2 * ROT_HALF <= D
    B,  # batch size: each program loops over it
    stride_gs, stride_gb, stride_gh, stride_gd,  # dL/dy strides, in elements
    stride_xs, stride_xb, stride_xh,  # dL/dx strides, in elements (last one == 1)
    D,  # head dim: gradients of features R..D-1 pass through unchanged
    ROT_HALF: tl.constexpr,  # R // 2: features in each rotated half
    BLOCK_HALF: tl.constexpr,  # next power of two >= ROT_HALF
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R (1 when R == D)
):
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < ROT_HALF
    f_row = freqs_ptr + s * 2 * ROT_HALF
    theta1 = tl.load(f_row + offs, mask=mask, other=0.0)
    theta2 = tl.load(f_row + ROT_HALF + offs, mask=mask, other=0.0)
    cos1, cos2 = tl.cos(theta1), tl.cos(theta2)
    # J = [[c1, -s1], [s2, c2]], so J^T = [[c1, s2], [-s1, c2]]: the sines swap and change sign
    sin_t1, sin_t2 = -tl.sin(theta2), -tl.sin(theta1)
    p = 2 * ROT_HALF + tl.arange(0, BLOCK_PASS)  # features R..D-1: the identity, both ways
    p_mask = p < D
    for b in range(0, B):
        g_row = gy_ptr + s * stride_gs + b * stride_gb + h * stride_gh
        x_row = gx_ptr + s * stride_xs + b * stride_xb + h * stride_xh
        g1 = tl.load(g_row + offs * stride_gd, mask=mask, other=0.0).to(tl.float32)
        g2 = tl.load(g_row + (offs + ROT_HALF) * stride_gd, mask=mask, other=0.0).to(tl.float32)
        # the forward's formulas with the transposed sines: x1*c1 - x2*s1 -> g1*c1 + g2*s2
        tl.store(x_row + offs, (g1 * cos1 - g2 * sin_t1).to(gx_ptr.dtype.element_ty), mask=mask)
        tl.store(x_row + ROT_HALF + offs, (g2 * cos2 + g1 * sin_t2).to(gx_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(x_row + p, tl.load(g_row + p * stride_gd, mask=p_mask), mask=p_mask)


def show_solution() -> None:
    """Show the worked backward kernel folded away (after the exercise)."""
    solution(_rope_backward_solution_kernel.fn, title="Solution: the backward kernel")


@contextlib.contextmanager
def count_launches(written: bool = False):
    """Count Triton kernel launches inside the block: {'launches': n, 'kernels': [...]}.

    Counts every `kernel[grid](...)` (compiled or interpreted) and ropelib's direct launcher;
    'kernels' lists the kernel of each launch (the @triton.jit object), in order. With
    `written=True` (small exercise tensors only: it copies them) 'written' lists, per launch of
    a @triton.jit kernel, (kernel, tensor) for each tensor argument the launch changed, copied
    as the launch left it: what the kernel itself wrote, whatever the caller does afterwards;
    and 'written_storage' lists (kernel, storage address) of the same tensors as passed, so a
    check can tell whether the tensor an answer returns is one its kernel wrote into.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    from ...kernels.direct import DirectLauncher

    counts = {"launches": 0, "kernels": [], "written": [], "written_storage": []}
    patched = [(JITFunction, "run"), (InterpretedFunction, "run"), (DirectLauncher, "__call__")]
    saved = [(cls, attr, cls.__dict__[attr]) for cls, attr in patched if attr in cls.__dict__]

    def counting(original, is_launcher):
        def wrapper(self, *args, **kwargs):
            if kwargs.get("warmup", False):
                return original(self, *args, **kwargs)
            counts["launches"] += 1
            counts["kernels"].append(getattr(self, "kernel", self) if is_launcher else self)
            tensors = [] if is_launcher or not written else [
                t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            before = [t.detach().clone() for t in tensors]
            result = original(self, *args, **kwargs)
            for t, old in zip(tensors, before):
                if not _same_bits(t, old):
                    counts["written"].append((self, t.detach().clone()))
                    counts["written_storage"].append((self, t.untyped_storage().data_ptr()))
            return result
        return wrapper
    for cls, attr, original in saved:
        setattr(cls, attr, counting(original, attr == "__call__"))
    # A fresh output (torch.empty) can hold, by chance, the very bits a launch then writes (the
    # memory of an equal result freed just before): unchanged, it would not count as written.
    # With deterministic algorithms on, torch fills fresh floating-point memory with NaN.
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    if written:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield counts
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)
        if written:
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN equal to NaN (an output buffer may start as NaN)."""
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)
