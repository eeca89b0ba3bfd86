"""Notebook 07's kernel exercise: one kernel that copies a tile of rows or rotates it.

A provider's speed is judged against a copy of the same bytes. The learner writes that yardstick
and the RoPE kernel as one `@triton.jit` function with a switch, `ROTATE: tl.constexpr`:

    ROTATE=False:  y = x                                   (the copy)
    ROTATE=True:   y_d = x_d cos(theta_d) - x_{d+D/2} sin(theta_d)      for d <  D/2
                   y_d = x_d cos(theta_d) + x_{d-D/2} sin(theta_d)      for d >= D/2

with theta_d = freqs[s, d] the angle of feature d at the row's token s (TE's convention: each
element reads its own angle, so with TE's table cat(f, f) both members of a pair turn alike).
Both launches move the same bytes of x and y on the same grid, so on a GPU the difference of
their times is what the rotation costs (its angle loads and its sines and cosines), and the
copy's time beside `y.copy_(x)` says how good a yardstick the learner's tiling is.

The check launches the kernel itself (signature `KERNEL_SIGNATURE`, grid (cdiv(n_rows,
BLOCK_ROWS),)) with both settings of ROTATE on inputs it draws fresh: a row count that is not a
multiple of BLOCK_ROWS (a masked tail), several tokens per program, fp32, bf16 and fp16, TE's table
and one whose pairs' angles differ. The output starts as NaN between NaN guard bands, so an
element the kernel does not write stays NaN and a store before the first row or past the last
lands in a band. The
copy must be the input bit for bit. Only a `@triton.jit` function is accepted, launched with
ropelib's own answers barred (`own_code`): its kernels, the worked solution below, or a kernel
calling one of its @triton.jit helpers, are refused.

`provider(kernel)` wraps a kernel as a `ropelib.bench.compare.Provider`, so `compare.run_case`
measures it beside every other provider. (Notebook 07 times its copy and its rotation beside
`y.copy_(x)` and `ropelib.apply_rope` itself, with the launch written out in its cell.)
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import reference, runtime
from . import _compare, check, kernel_answer, solution
from .own_code import fresh_seed, launch_barred

__all__ = ["KERNEL_SIGNATURE", "CASES", "check_rows_kernel", "solution_rows_kernel",
           "show_solution", "launch", "provider"]

KERNEL_SIGNATURE = '''\
@triton.jit
def my_rows_kernel(
    x_ptr,  # *x: input [S, B, H, D] (sbhd), contiguous: n_rows rows of D elements
    y_ptr,  # *y: output, contiguous like x, same dtype
    freqs_ptr,  # *fp32: angles [S, D], contiguous: feature d of token s turns by freqs[s, d]
    n_rows,  # rows of x: S * B * H; row r belongs to token r // ROWS_PER_TOKEN
    ROWS_PER_TOKEN,  # B * H
    D: tl.constexpr,  # head dim (a power of two): pairs (d, d + D/2)
    BLOCK_ROWS: tl.constexpr,  # rows per program (a power of two)
    ROTATE: tl.constexpr,  # False: y = x, the copy; True: y = RoPE(x)
):
    # launched on grid (cdiv(n_rows, BLOCK_ROWS),)
    pass  # your code
'''

# (S, B, H, D, BLOCK_ROWS, dtype, table)
CASES = (
    (5, 3, 2, 16, 4, torch.float32, "free"),     # 30 rows: a tail of 2, tokens cut by tiles
    (3, 2, 3, 32, 8, torch.bfloat16, "te"),      # 18 rows
    (4, 1, 2, 8, 16, torch.float16, "free"),     # 8 rows, one program with half its rows masked
    (2, 2, 1, 64, 1, torch.float32, "te"),       # one row per program
)
_PAD = 3   # guard bands: rows of NaN before and after the output


def launch(kernel, x: torch.Tensor, y: torch.Tensor, freqs2d: torch.Tensor, block_rows: int,
           rotate: bool) -> None:
    """Launch `kernel` (KERNEL_SIGNATURE's order) on its grid: y = x, or RoPE(x) with rotate.

    x, y: contiguous [S, B, H, D] (y may be a view into a larger buffer); freqs2d: contiguous fp32
    [S, D].
    """
    S, B, H, D = x.shape
    n_rows = S * B * H
    kernel[(triton.cdiv(n_rows, block_rows),)](x, y, freqs2d, n_rows, B * H, D=D,
                                              BLOCK_ROWS=block_rows, ROTATE=rotate)


def _inputs(gen: torch.Generator, S, B, H, D, dtype, table):
    """x, y (a NaN view into the middle of a padded buffer), the padded buffer, angles [S, D]."""
    device = runtime.default_device()
    x = torch.randn(S, B, H, D, generator=gen).to(device=device, dtype=dtype)
    y_buf = torch.full(((S * B * H + 2 * _PAD) * D,), float("nan"), dtype=dtype, device=device)
    y = y_buf[_PAD * D:_PAD * D + x.numel()].view(S, B, H, D)
    if table == "te":   # f0 f1 ... f0 f1 ...: both members of a pair share an angle
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        f = torch.outer(torch.arange(S, dtype=torch.float32), inv).repeat(1, 2)
    else:               # one free angle per feature: the members of a pair differ
        f = torch.rand(S, D, generator=gen) * 6.0 - 3.0
    return x, y, y_buf, f.to(device).contiguous()


def _label(S, B, H, D, block_rows, dtype, table, rotate) -> str:
    return (f"{'ROTATE' if rotate else 'copy'}: x [{S}, {B}, {H}, {D}] "
            f"{str(dtype).replace('torch.', '')}, {S * B * H} rows, BLOCK_ROWS {block_rows}"
            + (", TE's table" if table == "te" else ", pairs with different angles"))


def _verdict(name, label, x, x_before, y, y_buf, f, rotate, seed) -> bool:
    """After one launch: nothing written past the output, x unchanged, no NaN left in y, y equal
    to x (the copy, bit for bit) or to the reference (the rotation, within a rounding)."""
    D = x.shape[-1]
    if not bool(torch.isnan(y_buf[_PAD * D + x.numel():]).all()):
        print(f"❌ {name} ({label}): the kernel wrote past the output (into the guard band after "
              "it): mask the last program's rows, row < n_rows")
        return False
    if not bool(torch.isnan(y_buf[:_PAD * D]).all()):
        print(f"❌ {name} ({label}): the kernel wrote before the output (into the guard band "
              "before it): program p's first row is p * BLOCK_ROWS")
        return False
    if not torch.equal(x, x_before):
        print(f"❌ {name} ({label}): the kernel changed its input x")
        return False
    bad = torch.isnan(y)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        print(f"❌ {name} ({label}): {int(bad.sum())} of {y.numel()} output elements are NaN "
              f"after the launch, first at [s, b, h, d] = {where}. The output starts as NaN: "
              "either they were not written (does every program store all D features of its "
              "BLOCK_ROWS rows?), or they were computed from memory outside the inputs (is the "
              "token row // ROWS_PER_TOKEN?)")
        return False
    if not rotate:
        if torch.equal(y, x):
            return True
        print(f"   (inputs drawn with seed={seed})")
        return check(f"{name} ({label})", y, x, atol=0.0, rtol=0.0,
                     hint="with ROTATE False the kernel stores what it loaded: the same bits, "
                          "no arithmetic, no conversion to fp32 and back needed")
    want = reference.rope_reference(x, f)
    ok, _ = _compare(y, want, None, None)
    if ok:
        return True
    print(f"   (inputs drawn with seed={seed})")
    return check(f"{name} ({label})", y, want,
                 hint="feature d of row r reads its partner at d + D/2 (d < D/2) or d - D/2, and "
                      "the angle freqs[s, d] of its own feature at token s = r // ROWS_PER_TOKEN; "
                      "the partner's sine enters with a minus sign in the first half")


def check_rows_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's kernel, copying and rotating, on fresh inputs; compare.

    Prints one ✅ line, or ❌ with the first case that fails and why; returns the verdict; never
    raises. `seed` fixes the random inputs (default: new ones every call, printed on a failure).
    """
    name = "copy and rotate"
    if not kernel_answer(name, kernel, "what it stores through y_ptr"):
        return False
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    for S, B, H, D, block_rows, dtype, table in CASES:
        x, y, y_buf, f = _inputs(gen, S, B, H, D, dtype, table)
        for rotate in (False, True):
            label = _label(S, B, H, D, block_rows, dtype, table, rotate)
            y_buf.fill_(float("nan"))
            x_before = x.clone()
            ok, _ = launch_barred(name, label, "your copy-and-rotate kernel",
                                  lambda: launch(kernel, x, y, f, block_rows, rotate))
            if not ok or not _verdict(name, label, x, x_before, y, y_buf, f, rotate, seed):
                return False
    print(f"✅ {name}: the copy bit for bit and the rotation right on {len(CASES)} inputs each "
          "(masked tails, one to sixteen rows a program, fp32, bf16 and fp16, pairs whose angles "
          "differ)")
    return True


@triton.jit
def solution_rows_kernel(
    x_ptr,  # *x: input [S, B, H, D] (sbhd), contiguous: n_rows rows of D elements
    y_ptr,  # *y: output, contiguous like x, same dtype
    freqs_ptr,  # *fp32: angles [S, D], contiguous: feature d of token s turns by freqs[s, d]
    n_rows,  # rows of x: S * B * H; row r belongs to token r // ROWS_PER_TOKEN
    ROWS_PER_TOKEN,  # B * H
    D: tl.constexpr,  # head dim (a power of two): pairs (d, d + D/2)
    BLOCK_ROWS: tl.constexpr,  # rows per program (a power of two)
    ROTATE: tl.constexpr,  # False: y = x, the copy; True: y = RoPE(x)
):
    # launched on grid (cdiv(n_rows, BLOCK_ROWS),): program p owns rows p*BLOCK_ROWS ...
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]   # [BLOCK_ROWS, 1]
    d = tl.arange(0, D)[None, :]                                                # [1, D]
    live = (row < n_rows) & (d < D)                                             # [BLOCK_ROWS, D]
    x = tl.load(x_ptr + row * D + d, mask=live)
    if ROTATE:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        xp = tl.load(x_ptr + row * D + partner, mask=live).to(tl.float32)
        theta = tl.load(freqs_ptr + (row // ROWS_PER_TOKEN) * D + d, mask=live)
        sign = tl.where(d < D // 2, -1.0, 1.0)
        y = x.to(tl.float32) * tl.cos(theta) + sign * xp * tl.sin(theta)
        tl.store(y_ptr + row * D + d, y.to(y_ptr.dtype.element_ty), mask=live)
    else:
        tl.store(y_ptr + row * D + d, x, mask=live)


def show_solution() -> None:
    """Show the worked kernel folded away (after the exercise)."""
    solution(solution_rows_kernel.fn, title="Solution: copy and rotate")


# --- the learner's kernel beside the others ---------------------------------------------------

def provider(kernel, block_rows: int = 16, name: str = "yours"):
    """`kernel` (KERNEL_SIGNATURE's) as a `ropelib.bench.compare.Provider`: forward only (time
    it with `run_case(..., backward=False)`), sbhd, rotate-half, full rotary."""
    from ...bench import compare

    def fn(case):
        x = case.x.contiguous()
        S, _, _, D = x.shape
        y = torch.empty_like(x)
        launch(kernel, x, y, case.freqs.reshape(-1, D)[:S].contiguous(), block_rows, True)
        return y

    def supports(config):
        return compare.teaching_kernel_supports(config, power_of_two_head_dim=True)
    return compare.Provider(name, True, "", fn, supports,
                            description=f"your kernel, {block_rows} rows a program")
