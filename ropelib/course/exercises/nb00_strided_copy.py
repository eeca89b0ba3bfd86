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

Before timing, the learner predicts the most a fixed grid can save: `my_max_saving_us(n, BLOCK,
programs, sms, empty_programs, empty_us)`, copy_kernel's program floor (one program a block)
less the fixed grid's (`programs` programs), each from exercise 2's model. `check_max_saving`
tries it on the tour's two copies and on cases drawn as it runs, with the worked answers barred;
the notebook then sets the prediction beside the measured saving.
"""
import inspect
import math

import torch
import triton
import triton.language as tl

from . import solution
from .grid_kernel import kernel_ready
from .own_code import check_cases, fresh_generator, fresh_seed, launch_barred

__all__ = ["STRIDED_COPY_SIGNATURE", "check_strided_copy", "solution_strided_copy_kernel",
           "show_strided_copy_solution", "check_max_saving", "solution_max_saving_us"]

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
def solution_strided_copy_kernel(
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
    solution(inspect.getsource(solution_strided_copy_kernel.fn),
             title="Solution: a copy on a fixed grid")


# --- the prediction: the most a fixed grid can save ---------------------------------------------

def _max_saving_us(n, block, programs, sms, empty_programs, empty_us):
    """copy_kernel's program floor (ceil(n / block) programs) less the fixed grid's, each
    exercise 2's expected answer."""
    from .nb00_program_floor import _floor_us
    return (_floor_us(math.ceil(n / block), sms, empty_programs, empty_us)
            - _floor_us(programs, sms, empty_programs, empty_us))


def solution_max_saving_us(n, BLOCK, programs, sms, empty_programs, empty_us):
    def floor_us(p):                  # exercise 2: p / sms programs in turn on each SM
        return p / sms * (empty_us * sms / empty_programs)
    return floor_us(-(-n // BLOCK)) - floor_us(programs)    # copy_kernel's grid, less the fixed


def check_max_saving(fn) -> bool:
    """fn(n, BLOCK, programs, sms, empty_programs, empty_us) -> the µs a copy on a fixed grid
    of `programs` programs can save at most against copy_kernel (one program per BLOCK
    elements): the difference of their program floors. Prints ✅ or ❌; never raises."""
    from . import nb00_program_floor
    cases = []
    for n, programs in ((2048 * 4 * 16 * 128, 132), (2048 * 4 * 16 * 128, 16 * 132)):
        args = (n, 1024, programs, 132, 1_048_576, 633.0)
        cases.append((f"the tour's x on a GPU ({n:,} elements), {programs:,} programs, an "
                      "H200-like empty run", args, _max_saving_us(*args)))
    seed, g = fresh_generator()

    def drawn(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    for _ in range(2):
        sms, block = drawn(8, 200), 2 ** drawn(6, 12)
        empty_programs = drawn(10_000, 4_000_000)
        args = (drawn(block + 1, 50_000_000), block, sms * drawn(1, 8), sms, empty_programs,
                round(empty_programs / sms * drawn(200, 2_000) / 10 / 1e3, 2))
        cases.append((f"n={args[0]:,}, BLOCK={block}, {args[2]:,} programs, {sms} SMs (drawn "
                      f"with seed {seed})", args, _max_saving_us(*args)))
    return check_cases("the most a fixed grid saves", "your own prediction", fn, cases,
                       rtol=1e-6, atol=1e-9,
                       hint="copy_kernel starts ceil(n / BLOCK) programs, the fixed grid "
                            "`programs`; each costs what exercise 2's floor gives a program",
                       bar=(solution_max_saving_us, nb00_program_floor.solution_program_floor_us,
                            nb00_program_floor.committed_rows))
