"""Notebook 06, exercise 5: the backward kernel for interleaved pairs.

Section 1 derives the backward of the rotate-half pairing (feature j with j + D/2); the GPT-J /
RoFormer pairing puts the partners side by side, features 2j and 2j + 1, each with an angle of
its own in a per-feature table [S, D]. The exercise writes that backward, which the notebook does
not give: the same transpose (swap and negate the sines), on partners loaded with stride 2.

`check_interleaved_backward` launches the learner's kernel (`INTERLEAVED_SIGNATURE`, grid (S, H))
through Triton's interpreter on CPU tensors, on any machine, with ropelib's answers barred (its
kernels, teaching and finished, its @triton.jit helpers and this module's worked solution), into
an output that starts as NaN. It compares with the autograd of `ropelib.reference.rope_reference(
..., interleaved=True)` in float64, on a table whose two angles of a pair are equal (where
negating the sines alone passes) and on one whose angles differ (where it does not), in fp32 and
fp16, and asks that cos/sin be evaluated once a program, as in notebook 04.
"""
import inspect

import torch
import triton
import triton.language as tl

from . import _compare, check, solution
from .grid_kernel import _unwritten, kernel_ready
from .own_code import fresh_seed, launch_barred

__all__ = ["INTERLEAVED_SIGNATURE", "check_interleaved_backward", "interleaved_grad",
           "launch_interleaved", "show_interleaved_solution"]

INTERLEAVED_SIGNATURE = '''\
@triton.jit
def my_interleaved_backward_kernel(
    gy_ptr,  # *dL/dy: input [S, B, H, D], contiguous
    gx_ptr,  # *dL/dx: output [S, B, H, D], contiguous, same dtype as dL/dy
    freqs_ptr,  # *fp32: angles [S, D], contiguous, one per feature (pair j: features 2j, 2j+1)
    B, H,  # batch size, heads
    HALF: tl.constexpr,  # D // 2: pairs in a head, a power of two
):
    # launched on grid (S, H): program (s, h) writes dL/dx[s, b, h, :] for every b
    pass  # your code
'''

# (S, B, H, D, dtype, pair angles equal?): equal angles first, then angles that differ
_CASES = ((3, 2, 2, 16, torch.float32, True), (2, 3, 3, 32, torch.float32, False),
          (2, 2, 2, 16, torch.float16, False))


def launch_interleaved(kernel, gy: torch.Tensor, freqs2d: torch.Tensor) -> torch.Tensor:
    """Launch `kernel` (INTERLEAVED_SIGNATURE's argument order) on grid (S, H) through Triton's
    interpreter, on CPU tensors; return its output (it starts as NaN)."""
    from ..work_count import interpreted
    S, B, H, D = gy.shape
    gx = torch.full(gy.shape, float("nan"), dtype=gy.dtype)
    interpreted(kernel)[(S, H)](gy, gx, freqs2d, B, H, HALF=D // 2)
    return gx


def interleaved_grad(gy: torch.Tensor, freqs2d: torch.Tensor) -> torch.Tensor:
    """dL/dx of interleaved RoPE for dL/dy = gy [S, B, H, D] and per-feature angles [S, D]: the
    autograd of the plain-PyTorch reference, in float64, cast to gy's dtype."""
    from ... import reference
    S, B, H, D = gy.shape
    x = torch.zeros(gy.shape, dtype=torch.float64, requires_grad=True)
    y = reference.rope_reference(x, freqs2d.view(S, 1, 1, D), interleaved=True)
    (gx,) = torch.autograd.grad(y, x, gy.double())
    return gx.to(gy.dtype)


def check_interleaved_backward(kernel) -> bool:
    """Exercise 5: dL/dx of interleaved pairs, on equal and unequal angles of a pair, fp32 and
    fp16; cos/sin once a program. Prints one ✅ line or the first ❌; returns the verdict; never
    raises."""
    from ..work_count import count_work
    name = "interleaved backward"
    if not kernel_ready(name, kernel):
        return False
    gen = torch.Generator().manual_seed(fresh_seed())
    for S, B, H, D, dtype, equal in _CASES:
        label = f"S={S}, B={B}, H={H}, D={D}, {str(dtype)[6:]}, " + (
            "both angles of a pair equal" if equal else "the two angles of a pair differ")
        gy = torch.randn(S, B, H, D, generator=gen).to(dtype)
        pair = torch.rand(S, D // 2, generator=gen) * 6.0 - 3.0
        f2 = (pair.repeat_interleave(2, dim=1) if equal
              else torch.rand(S, D, generator=gen) * 6.0 - 3.0).contiguous()

        def launch():
            with count_work(gy=gy, freqs=f2) as work:
                out = launch_interleaved(kernel, gy, f2)
            return out, work
        ok, out = launch_barred(name, label, "your interleaved backward kernel", launch)
        if not ok:
            return False
        gx, work = out
        missing = _unwritten(gx, D)
        if missing:
            print(f"❌ {name} ({label}): {missing}")
            return False
        want = interleaved_grad(gy, f2)
        if not _compare(gx, want, None, None)[0]:
            hint = ("gx[2j] = gy[2j]*cos(t[2j]) + gy[2j+1]*sin(t[2j+1]), gx[2j+1] = "
                    "gy[2j+1]*cos(t[2j+1]) - gy[2j]*sin(t[2j]): load the even features at "
                    "2*offs and the odd ones at 2*offs + 1")
            if not equal:
                hint = ("correct where a pair's two angles are equal, so look at which sine "
                        "each output takes: the transpose swaps them as well as negating; " + hint)
            return check(f"{name} ({label})", gx, want, hint=hint)
        programs = S * H
        if work.sincos != programs * 2 * D:
            print(f"❌ {name} ({label}): correct gradients, but {work.sincos:,} sines and "
                  f"cosines where the grid (S, H) needs {programs * 2 * D:,}: evaluate them "
                  "once a program, before its batch loop")
            return False
    print(f"✅ {name}: correct on {len(_CASES)} launches (a pair's two angles equal and "
          "different, fp32 and fp16), cos/sin once a program")
    return True


@triton.jit
def _rope_interleaved_backward_solution_kernel(
    gy_ptr,  # *dL/dy: input [S, B, H, D], contiguous
    gx_ptr,  # *dL/dx: output [S, B, H, D], contiguous, same dtype as dL/dy
    freqs_ptr,  # *fp32: angles [S, D], contiguous, one per feature (pair j: features 2j, 2j+1)
    B, H,  # batch size, heads
    HALF: tl.constexpr,  # D // 2: pairs in a head, a power of two
):
    s = tl.program_id(0).to(tl.int64)  # grid (S, H)
    h = tl.program_id(1).to(tl.int64)
    even = 2 * tl.arange(0, HALF)  # feature 2j of pair j; its partner is 2j + 1
    theta_a = tl.load(freqs_ptr + s * 2 * HALF + even)
    theta_b = tl.load(freqs_ptr + s * 2 * HALF + even + 1)
    cos_a, cos_b = tl.cos(theta_a), tl.cos(theta_b)
    # forward [[c_a, -s_a], [s_b, c_b]]; its transpose swaps and negates the sines
    sin_a, sin_b = -tl.sin(theta_b), -tl.sin(theta_a)
    for b in range(0, B):
        row = ((s * B + b) * H + h) * 2 * HALF
        g_a = tl.load(gy_ptr + row + even).to(tl.float32)
        g_b = tl.load(gy_ptr + row + even + 1).to(tl.float32)
        tl.store(gx_ptr + row + even, (g_a * cos_a - g_b * sin_a).to(gx_ptr.dtype.element_ty))
        tl.store(gx_ptr + row + even + 1,
                 (g_b * cos_b + g_a * sin_b).to(gx_ptr.dtype.element_ty))


def show_interleaved_solution() -> None:
    """Show exercise 5's worked kernel folded away."""
    solution(inspect.getsource(_rope_interleaved_backward_solution_kernel.fn),
             title="Solution: the backward for interleaved pairs")
