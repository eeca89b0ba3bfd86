"""Notebook 02, exercise 5: the chain's broadcast multiply as a Triton kernel that reads the
table once.

Section 6 found PyTorch's `x * cos` slow where the table `[S, 1, 1, D]` is broadcast over batch
and heads: an operand that is not contiguous sends it down the non-vectorized template. A kernel
that knows the layout needs neither a copy of the table nor narrow loads: program s loads table
row s once, D elements, and multiplies each of token s's N = B * H rows of x by it, ROWS rows a
tile, every load and store a contiguous run.

`check_table_mul` launches the learner's kernel (`TABLE_MUL_SIGNATURE`) through Triton's
interpreter on CPU tensors (fp32, so the product has one right answer), ropelib's kernels, the
notebook's and the worked solution barred, into an output that starts as NaN: N a multiple of
ROWS, N not a multiple of it, one row a token, and a shape drawn as it runs. It compares y with
x * c bit for bit and counts the elements loaded: each of x's once, and D of the table's a
program (its row, once), so a kernel that reloads the row for every tile fails. Timing needs a
GPU: the notebook times the kernel there beside PyTorch's broadcast multiply.
"""
import inspect

import torch
import triton
import triton.language as tl

from . import solution
from .grid_kernel import kernel_ready
from .own_code import fresh_seed, launch_barred

__all__ = ["TABLE_MUL_SIGNATURE", "check_table_mul", "show_table_mul_solution", "launch"]

TABLE_MUL_SIGNATURE = '''\
@triton.jit
def my_table_mul_kernel(
    x_ptr,  # *x: [S, N, D] contiguous (N = B * H rows of one token)
    c_ptr,  # *c: [S, D] contiguous, the table: row s multiplies every row of token s
    y_ptr,  # *y: [S, N, D] contiguous, y = x * c
    N,  # rows of a token
    D: tl.constexpr,  # features of a row, a power of two
    ROWS: tl.constexpr,  # rows a tile, a power of two
):
    # launched on grid (S,): program s computes token s's N rows, ROWS at a time
    pass  # your code
'''

# (S, N, D, ROWS): N a multiple of ROWS, N not a multiple of it, one row a token
_CASES = ((3, 8, 16, 4), (2, 7, 32, 4), (4, 1, 8, 2))


def launch(kernel, x: torch.Tensor, c: torch.Tensor, rows: int = 4) -> torch.Tensor:
    """y = x * c by `kernel` on grid (S,): x [S, N, D] and c [S, D], contiguous; y starts as
    NaN, so an element the kernel does not write stays NaN."""
    S, N, D = x.shape
    if not (x.is_contiguous() and c.is_contiguous() and tuple(c.shape) == (S, D)):
        raise ValueError("x [S, N, D] and c [S, D], both contiguous")
    y = torch.full_like(x, float("nan"))
    kernel[(S,)](x, c, y, N, D=D, ROWS=rows)
    return y


def _launch_counted(kernel, x, c, rows):
    from ..work_count import count_work, interpreted
    with count_work(x=x, c=c) as work:
        y = launch(interpreted(kernel), x, c, rows)
    return y, work


def check_table_mul(kernel) -> bool:
    """Exercise 5: y equal to x * c bit for bit on every case, x read once, the table row once a
    program. Prints one ✅ line or the first ❌; returns the verdict; never raises."""
    name = "the broadcast multiply, the table read once"
    if not kernel_ready(name, kernel):
        return False
    gen = torch.Generator().manual_seed(fresh_seed())
    S_drawn, N_drawn = (int(torch.randint(lo, hi, (), generator=gen))
                        for lo, hi in ((2, 6), (5, 40)))
    drawn = (S_drawn, N_drawn, 16, 8)
    for S, N, D, rows in (*_CASES, drawn):
        label = f"x [{S}, {N}, {D}], ROWS={rows}"
        x, c = torch.randn(S, N, D, generator=gen), torch.randn(S, D, generator=gen)
        ok, out = launch_barred(name, label, "your kernel",
                                lambda: _launch_counted(kernel, x, c, rows))
        if not ok:
            return False
        y, work = out
        if torch.isnan(y).any():
            first = tuple(int(i) for i in torch.isnan(y).nonzero()[0])
            print(f"❌ {name} ({label}): {int(torch.isnan(y).sum()):,} elements of y left "
                  f"unwritten, the first at {first}: program s loops over all N rows of token s, "
                  "ROWS at a time, masked at N")
            return False
        if not torch.equal(y, x * c[:, None, :]):
            print(f"❌ {name} ({label}): y differs from x * c: row r of token s starts at "
                  "(s * N + r) * D in x and y, its table row at s * D in c")
            return False
        for got, want, what in ((work.loads["x"], S * N * D, "elements of x read"),
                                (work.loads["c"], S * D, "elements of the table read")):
            if got != want:
                print(f"❌ {name} ({label}): y is right, but {got:,} {what} where {want:,} do: "
                      "each element of x once, and each table row once, by its program, "
                      "before the loop over the rows")
                return False
    print(f"✅ {name}: y equals x * c on {len(_CASES) + 1} launches (one drawn: x "
          f"[{drawn[0]}, {drawn[1]}, 16]), x read once, each table row once")
    return True


@triton.jit
def _table_mul_solution_kernel(
    x_ptr,  # *x: [S, N, D] contiguous (N = B * H rows of one token)
    c_ptr,  # *c: [S, D] contiguous, the table: row s multiplies every row of token s
    y_ptr,  # *y: [S, N, D] contiguous, y = x * c
    N,  # rows of a token
    D: tl.constexpr,  # features of a row, a power of two
    ROWS: tl.constexpr,  # rows a tile, a power of two
):
    s = tl.program_id(0)
    d = tl.arange(0, D)
    c = tl.load(c_ptr + s * D + d)[None, :]               # table row s, loaded once: [1, D]
    for r0 in range(0, N, ROWS):
        rows = r0 + tl.arange(0, ROWS)[:, None]           # [ROWS, 1]
        at = (s * N + rows) * D + d[None, :]              # [ROWS, D], each row a contiguous run
        x = tl.load(x_ptr + at, mask=rows < N)
        tl.store(y_ptr + at, (x * c).to(y_ptr.dtype.element_ty), mask=rows < N)


def show_table_mul_solution() -> None:
    """Show exercise 5's worked kernel folded away."""
    solution(inspect.getsource(_table_mul_solution_kernel.fn),
             title="Solution: the broadcast multiply, the table read once")
