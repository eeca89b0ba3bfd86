"""Notebook 04, exercise 6: two rows of x loaded before either is stored.

Section 2.3 of notebook 04 finds that the batch-reusing kernel asks for one row of `x`, stores it,
and only then asks for the next: a compiler may not move a load above an earlier store to memory
it cannot prove different. Exercise 6 writes the kernel that loads rows b and b + 1 of its batch
loop before it stores either (same grid, same cos/sin, same bytes), the variant that would tell
whether "one row in flight per warp" limits the grid's time.

`check_two_rows` launches the learner's kernel (`TWO_ROWS_SIGNATURE`, on grid (S, H)) through
Triton's interpreter on CPU tensors, on any machine, with ropelib's answers barred, into an
output that starts as NaN: several shapes, an odd batch (the last pair has one row) and a batch
of one. It compares the output with the reference and counts, program by program, the elements
of `x` loaded before the program's first store: with B >= 2 a program must have loaded two whole
rows (2 * D elements) by then. It also asks for what the grid already gave: cos/sin evaluated
once per program, `x` read once and the angles once a program. Timing needs a GPU: the notebook
prints it only there.
"""
import inspect

import torch
import triton
import triton.language as tl

from . import _compare, check, solution
from .grid_kernel import _forward_expected, _unwritten, kernel_ready
from .own_code import fresh_seed, launch_barred

__all__ = ["TWO_ROWS_SIGNATURE", "check_two_rows", "count_two_rows", "show_two_rows_solution",
           "launch_two_rows"]

TWO_ROWS_SIGNATURE = '''\
@triton.jit
def my_two_rows_kernel(
    x_ptr,  # *x: input [S, B, H, D], contiguous
    y_ptr,  # *y: output [S, B, H, D], contiguous, same dtype as x
    freqs_ptr,  # *fp32: angles [S, D], contiguous (row s: theta1, then theta2)
    B, H,  # batch size (any, odd too), heads
    HALF: tl.constexpr,  # D // 2, a power of two
):
    # launched on grid (S, H): program (s, h) rotates x[s, b, h, :] for every b, loading
    # rows b and b + 1 before it stores either
    pass  # your code
'''

# (S, B, H, D): an even batch, an odd one (the last pair has one row), a batch of one
_CASES = ((3, 4, 2, 16), (2, 5, 3, 32), (2, 1, 2, 16))


def launch_two_rows(kernel, x: torch.Tensor, freqs2d: torch.Tensor) -> torch.Tensor:
    """Launch `kernel` (TWO_ROWS_SIGNATURE's argument order) on grid (S, H) through Triton's
    interpreter, on CPU tensors; return its output (it starts as NaN)."""
    from ..work_count import interpreted
    S, B, H, D = x.shape
    y = torch.full(x.shape, float("nan"), dtype=x.dtype)
    interpreted(kernel)[(S, H)](x, y, freqs2d, B, H, HALF=D // 2)
    return y


def count_two_rows(kernel, x: torch.Tensor, freqs2d: torch.Tensor):
    """(output, WorkCount) of one interpreted launch, x's and the angles' loads counted as "x"
    and "freqs"; work.loads_before_store["x"] lists, program by program, the elements of x
    loaded before the program's first store."""
    from ..work_count import count_work
    with count_work(x=x, freqs=freqs2d) as work:
        y = launch_two_rows(kernel, x, freqs2d)
    return y, work


def check_two_rows(kernel) -> bool:
    """Exercise 6: correct outputs, and with B >= 2 two whole rows of x loaded before a program's
    first store; cos/sin once a program, x once, the angles once a program. Prints one ✅ line or
    the first ❌; returns the verdict; never raises."""
    name = "two rows in flight"
    if not kernel_ready(name, kernel):
        return False
    gen = torch.Generator().manual_seed(fresh_seed())
    for S, B, H, D in _CASES:
        label = f"S={S}, B={B}, H={H}, D={D}"
        x = torch.randn(S, B, H, D, generator=gen)
        f2 = (torch.rand(S, D, generator=gen) * 6.0 - 3.0).contiguous()
        ok, out = launch_barred(name, label, "your two-rows kernel",
                                lambda: count_two_rows(kernel, x, f2))
        if not ok:
            return False
        y, work = out
        missing = _unwritten(y, D)
        if missing:
            print(f"❌ {name} ({label}): {missing}" + ("; with an odd B the last pair has one "
                                                       "row: mask row b + 1 when b + 1 == B"
                                                       if B % 2 else ""))
            return False
        want = _forward_expected(x, f2)
        if not _compare(y, want, None, None)[0]:
            return check(f"{name} ({label})", y, want,
                         hint="y1 = x1*cos1 - x2*sin1, y2 = x2*cos2 + x1*sin2; row (s, b + 1, h) "
                              "is H * D elements after row (s, b, h)")
        programs = S * H
        for got, want, what in ((work.programs, programs, "programs"),
                                (work.sincos, programs * 2 * D, "sines and cosines"),
                                (work.loads["x"], x.numel(), "elements of x read"),
                                (work.loads["freqs"], programs * D, "angles read")):
            if got != want:
                print(f"❌ {name} ({label}): correct outputs, but {got:,} {what} where the "
                      f"grid (S, H) needs {want:,}: cos/sin once a program before its "
                      "loop, each element of x read once (a masked-off lane reads nothing)")
                return False
        first_loads = min(work.loads_before_store["x"])
        if B >= 2 and first_loads < 2 * D:
            print(f"❌ {name} ({label}): correct outputs, but a program loaded only "
                  f"{first_loads} elements of x before its first store, where two "
                  f"rows are {2 * D}: load rows b and b + 1 (all four half-rows), then store both")
            return False
    print(f"✅ {name}: correct on {len(_CASES)} launches (an odd batch included), two rows of x "
          "loaded before each program's first store, cos/sin once a program")
    return True


@triton.jit
def _rope_two_rows_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D], contiguous
    y_ptr,  # *y: output [S, B, H, D], contiguous, same dtype as x
    freqs_ptr,  # *fp32: angles [S, D], contiguous (row s: theta1, then theta2)
    B, H,  # batch size (any, odd too), heads
    HALF: tl.constexpr,  # D // 2, a power of two
):
    s = tl.program_id(0).to(tl.int64)  # grid (S, H)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)  # once per program
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    step = H * 2 * HALF  # from row (s, b, h) to row (s, b + 1, h)
    for b in range(0, B, 2):  # two rows a trip
        row = ((s * B + b) * H + h) * 2 * HALF
        pair = offs * 0 + b + 1 < B  # row b + 1 exists (B may be odd), a lane mask
        a1 = tl.load(x_ptr + row + offs).to(tl.float32)  # row b ...
        a2 = tl.load(x_ptr + row + HALF + offs).to(tl.float32)
        c1 = tl.load(x_ptr + row + step + offs, mask=pair, other=0.0).to(tl.float32)  # ... b + 1
        c2 = tl.load(x_ptr + row + step + HALF + offs, mask=pair, other=0.0).to(tl.float32)
        tl.store(y_ptr + row + offs, (a1 * cos1 - a2 * sin1).to(y_ptr.dtype.element_ty))
        tl.store(y_ptr + row + HALF + offs, (a2 * cos2 + a1 * sin2).to(y_ptr.dtype.element_ty))
        tl.store(y_ptr + row + step + offs, (c1 * cos1 - c2 * sin1).to(y_ptr.dtype.element_ty),
                 mask=pair)
        tl.store(y_ptr + row + step + HALF + offs,
                 (c2 * cos2 + c1 * sin2).to(y_ptr.dtype.element_ty), mask=pair)


def show_two_rows_solution() -> None:
    """Show exercise 6's worked kernel folded away."""
    solution(inspect.getsource(_rope_two_rows_solution_kernel.fn),
             title="Solution: two rows loaded before either is stored")
