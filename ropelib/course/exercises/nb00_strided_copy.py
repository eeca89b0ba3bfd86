"""Notebook 00, exercise 4: a copy on a grid of a fixed number of programs.

Section 4 of notebook 00 sets each kernel's time against its program floor: the programs a
launch starts cost their SMs a fixed time each, whatever they do. `copy_kernel` starts one
program per BLOCK elements. Exercise 4 writes the copy whose grid is fixed, one program per SM
say: program p copies blocks p, p + P, p + 2P, ... of BLOCK elements, P the programs launched,
until the n elements are done. Its program floor no longer grows with n.

`check_strided_copy` launches the learner's kernel (`STRIDED_COPY_SIGNATURE`) through Triton's
interpreter on CPU tensors, with ropelib's kernels and the notebook's own barred, into an output
that starts as NaN: grids smaller than the blocks (so a kernel that copies one block a program
leaves most of `y` unwritten), a grid larger than the blocks, an n that is not a multiple of
BLOCK, and an n drawn as it runs. It also counts the programs and the elements of `x` read (each
once). Timing needs a GPU: the notebook times it only there.
"""
import inspect

import torch
import triton
import triton.language as tl

from . import solution
from .grid_kernel import kernel_ready
from .own_code import fresh_seed, launch_barred

__all__ = ["STRIDED_COPY_SIGNATURE", "check_strided_copy", "show_strided_copy_solution"]

STRIDED_COPY_SIGNATURE = '''\
@triton.jit
def my_strided_copy_kernel(
    x_ptr,  # *x: input, n elements, contiguous
    y_ptr,  # *y: output, n elements, contiguous
    n,  # elements to copy
    BLOCK: tl.constexpr,  # elements a program copies at a time, a power of two
):
    # launched on grid (P,), any P >= 1: program p copies blocks p, p + P, p + 2P, ...
    pass  # your code
'''

# (n, BLOCK, programs): far fewer programs than blocks, n not a multiple of BLOCK, one program,
# more programs than blocks
_CASES = ((1000, 64, 3), (5000, 128, 7), (300, 32, 1), (50, 64, 4))


def _launch(kernel, x: torch.Tensor, block: int, programs: int):
    """(output, WorkCount) of one interpreted launch on grid (programs,); y starts as NaN."""
    from ..work_count import count_work, interpreted
    y = torch.full_like(x, float("nan"))
    with count_work(x=x) as work:
        interpreted(kernel)[(programs,)](x, y, x.numel(), BLOCK=block)
    return y, work


def check_strided_copy(kernel) -> bool:
    """Exercise 4: y equal to x on every case, `programs` programs run, x read once. Prints one
    ✅ line or the first ❌; returns the verdict; never raises."""
    name = "a copy on a fixed grid"
    if not kernel_ready(name, kernel):
        return False
    gen = torch.Generator().manual_seed(fresh_seed())
    drawn = (int(torch.randint(2000, 9000, (), generator=gen)), 256,
             int(torch.randint(2, 6, (), generator=gen)))
    for n, block, programs in (*_CASES, drawn):
        label = f"n={n}, BLOCK={block}, {programs} program" + "s" * (programs > 1)
        x = torch.randn(n, generator=gen)
        ok, out = launch_barred(name, label, "your copy kernel",
                                lambda: _launch(kernel, x, block, programs))
        if not ok:
            return False
        y, work = out
        unwritten = int(torch.isnan(y).sum())
        if unwritten:
            first = int(torch.isnan(y).nonzero()[0])
            print(f"❌ {name} ({label}): {unwritten:,} elements of y left unwritten, the first at "
                  f"{first}: with {programs} program(s) of {block} elements, each program loops "
                  f"over its blocks p, p + P, ... while the block starts below n")
            return False
        if not torch.equal(y, x):
            print(f"❌ {name} ({label}): y differs from x: block k covers elements "
                  "k * BLOCK ... k * BLOCK + BLOCK - 1, masked at n")
            return False
        for got, want, what in ((work.programs, programs, "programs ran"),
                                (work.loads["x"], n, "elements of x read")):
            if got != want:
                print(f"❌ {name} ({label}): y is right, but {got:,} {what} where the launch "
                      f"needs {want:,} (each element read once, a masked lane reads nothing)")
                return False
    print(f"✅ {name}: y equals x on {len(_CASES) + 1} launches (one drawn with n={drawn[0]}), "
          "each element read once")
    return True


@triton.jit
def _strided_copy_solution_kernel(
    x_ptr,  # *x: input, n elements, contiguous
    y_ptr,  # *y: output, n elements, contiguous
    n,  # elements to copy
    BLOCK: tl.constexpr,  # elements a program copies at a time, a power of two
):
    p, P = tl.program_id(0), tl.num_programs(0)
    for start in range(p * BLOCK, n, P * BLOCK):   # blocks p, p + P, p + 2P, ...
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def show_strided_copy_solution() -> None:
    """Show exercise 4's worked kernel folded away."""
    solution(inspect.getsource(_strided_copy_solution_kernel.fn),
             title="Solution: a copy on a fixed grid")
