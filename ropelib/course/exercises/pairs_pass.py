"""Notebook 05's third exercise: the flat pass with both members of a pair in one thread, for
any head: written from a blank `@triton.jit`.

Section 6's `rotate_rows` holds x_j and x_{j+D/2} of 8 pairs in one thread, but only for a
head dim whose half is a power of two and full rotary. ropelib's pass (`_rotate_pairs` in
ropelib/kernels/flat.py) takes any head: a rotary dim R <= D (even), pairs (j, j + R/2) for
j < R/2, and features R..D-1 copied through. The learner writes that: `ROWS` whole head rows of
a contiguous sbhd `x` per program, no loop, the first pass's fp32 rows of cos and signed sine
[S, R] (as in the second exercise, `flat_pass.tables`):

    y[r, j]       = x[r, j] c[s, j] + x[r, j + R/2] s'[s, j]               j < R/2
    y[r, j + R/2] = x[r, j + R/2] c[s, j + R/2] + x[r, j] s'[s, j + R/2]
    y[r, e]       = x[r, e]                                                 R <= e < D

with s = r // (B H) the token of head row r. Tiles must be powers of two, so the launch passes
HALF_BLOCK (the next power of two at or above R/2) and PASS_BLOCK (at or above D - R, 1 when
R = D). The check launches the kernel on grid (cdiv(S B H, ROWS),) with fresh inputs every
call: a row count that is not a multiple of ROWS, halves R/2 of 2, 8 and 12 (12 not a power of
two), partial rotary, fp32 and fp16, angles that differ between the members of a pair, into an
output full of NaN inside a NaN guard band. ropelib's own kernels, the worked solution and
kernels that call ropelib's @triton.jit helpers are refused (`own_code`).
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from . import kernel_answer, solution
from .flat_pass import _inputs, _verdict, tables
from .own_code import fresh_seed, launch_barred

__all__ = ["KERNEL_SIGNATURE", "check_pairs_kernel", "show_solution", "launch", "CASES"]

KERNEL_SIGNATURE = '''\
@triton.jit
def my_pairs_kernel(
    x_ptr,  # *x: input [S, B, H, D] (sbhd), contiguous: S * B * H head rows of D
    y_ptr,  # *y: output, contiguous like x, same dtype
    cos_ptr,  # *fp32: cos [S, R], contiguous
    sin_ptr,  # *fp32: signed sine [S, R]: -sin for j < R/2, +sin for j >= R/2
    n_rows,  # head rows of x: S * B * H
    BH,  # head rows per token: B * H
    D: tl.constexpr,  # head dim
    R: tl.constexpr,  # rotary dim (even, <= D): pairs (j, j + R/2); features R..D-1 copied
    ROWS: tl.constexpr,  # head rows per program (a power of two)
    HALF_BLOCK: tl.constexpr,  # the next power of two >= R // 2
    PASS_BLOCK: tl.constexpr,  # the next power of two >= D - R (1 when R == D)
):
    # launched on grid (cdiv(n_rows, ROWS),); a thread holds both members of its pairs
    pass  # your code
'''

# (S, B, H, D, R, ROWS, dtype, table)
CASES = (
    (5, 3, 2, 16, 16, 4, torch.float32, "free"),
    (3, 2, 3, 24, 24, 8, torch.float16, "free"),
    (4, 1, 2, 40, 24, 2, torch.float32, "te"),
    (2, 2, 1, 8, 4, 16, torch.float32, "free"),
)


def launch(kernel, x, y, cos, sin, R: int, rows: int) -> None:
    """Launch `kernel` (KERNEL_SIGNATURE's order) on its grid, writing y."""
    S, B, H, D = x.shape
    n_rows = S * B * H
    kernel[(triton.cdiv(n_rows, rows),)](
        x, y, cos, sin, n_rows, B * H, D=D, R=R, ROWS=rows,
        HALF_BLOCK=triton.next_power_of_2(R // 2), PASS_BLOCK=triton.next_power_of_2(max(D - R, 1)))


def _label(S, B, H, D, R, rows, dtype, table) -> str:
    return (f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')}, R {R}, ROWS {rows}, "
            f"{S * B * H} head rows" + (", TE's table" if table == "te" else ""))


def check_pairs_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's pairs kernel on fresh inputs and compare with the reference.

    Prints one ✅ line, or ❌ with the first case that fails and why; returns the verdict; never
    raises. `seed` fixes the random inputs (default: new ones every call, printed on a failure).
    """
    name = "pairs pass"
    if not kernel_answer(name, kernel, "what it stores through y_ptr"):
        return False
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    for S, B, H, D, R, rows, dtype, table in CASES:
        label = _label(S, B, H, D, R, rows, dtype, table)
        x, y, y_buf, f = _inputs(gen, S, B, H, D, dtype, table, R)
        cos, sin = tables(f)
        x_before = x.clone()
        ok, _ = launch_barred(name, label, "your pairs kernel",
                              lambda: launch(kernel, x, y, cos, sin, R, rows))
        if not ok or not _verdict(
                name, label, x, x_before, y, y_buf, f, seed,
                tail="mask the rows of the last program, r < n_rows",
                unwritten="(every pair j < R/2 and both its members, and the features R..D-1 "
                          "copied?), or they were computed from memory outside the inputs (is "
                          "the token r // BH, and are the pairs j >= R/2 of the tile masked?)",
                hint="row r's token is s = r // BH; pair j < R/2 holds x[r, j] and "
                     "x[r, j + R/2] (not D/2), with cos and s' from columns j and j + R/2 of "
                     "the token's rows of R (their row stride is R); features R..D-1 are "
                     "copied"):
            return False
    halves = sorted({R // 2 for _, _, _, _, R, *_ in CASES})      # R/2 of each case: 2, 8, 12
    print(f"✅ {name}: correct on {len(CASES)} launches (a masked tail, halves R/2 of "
          f"{', '.join(map(str, halves[:-1]))} and {halves[-1]}, partial rotary, fp32 and fp16, "
          "pairs whose angles differ)")
    return True


@triton.jit
def _rope_pairs_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D] (sbhd), contiguous: S * B * H head rows of D
    y_ptr,  # *y: output, contiguous like x, same dtype
    cos_ptr,  # *fp32: cos [S, R], contiguous
    sin_ptr,  # *fp32: signed sine [S, R]: -sin for j < R/2, +sin for j >= R/2
    n_rows,  # head rows of x: S * B * H
    BH,  # head rows per token: B * H
    D: tl.constexpr,  # head dim
    R: tl.constexpr,  # rotary dim (even, <= D): pairs (j, j + R/2); features R..D-1 copied
    ROWS: tl.constexpr,  # head rows per program (a power of two)
    HALF_BLOCK: tl.constexpr,  # the next power of two >= R // 2
    PASS_BLOCK: tl.constexpr,  # the next power of two >= D - R (1 when R == D)
):
    HALF: tl.constexpr = R // 2
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)          # head rows [ROWS]
    j = tl.arange(0, HALF_BLOCK)                               # pairs [HALF_BLOCK]
    m = (r < n_rows)[:, None] & (j < HALF)[None, :]            # [ROWS, HALF_BLOCK]
    s = r // BH                                                # each row's token
    at = r[:, None] * D + j[None, :]                           # member a of each pair
    xa = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
    xb = tl.load(x_ptr + at + HALF, mask=m, other=0.0).to(tl.float32)
    cos_a = (cos_ptr + s * R)[:, None] + j[None, :]            # the token's row, then columns
    sin_a = (sin_ptr + s * R)[:, None] + j[None, :]
    ca = tl.load(cos_a, mask=m, other=0.0)
    sa = tl.load(sin_a, mask=m, other=0.0)
    cb = tl.load(cos_a + HALF, mask=m, other=0.0)
    sb = tl.load(sin_a + HALF, mask=m, other=0.0)
    tl.store(y_ptr + at, (xa * ca + xb * sa).to(y_ptr.dtype.element_ty), mask=m)
    tl.store(y_ptr + at + HALF, (xb * cb + xa * sb).to(y_ptr.dtype.element_ty), mask=m)
    if R < D:                                                  # features R..D-1, copied
        e = tl.arange(0, PASS_BLOCK)
        mp = (r < n_rows)[:, None] & (e < D - R)[None, :]
        pt = r[:, None] * D + R + e[None, :]
        tl.store(y_ptr + pt, tl.load(x_ptr + pt, mask=mp), mask=mp)


def show_solution() -> None:
    """Show the worked kernel folded away (after the exercise)."""
    solution(_rope_pairs_solution_kernel.fn, title="Solution: both members of a pair in one thread")
