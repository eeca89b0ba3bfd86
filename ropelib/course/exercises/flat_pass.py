"""Notebook 05's second exercise: the flat pass of the two-pass route, written from a blank
`@triton.jit`.

The learner writes the second pass of what `ropelib.apply_rope` runs for large contiguous
tensors (ropelib/kernels/flat.py, simplified): a 1-D grid, `XBLOCK` elements of a contiguous
sbhd `x` per program, no loop, and for every element one fma with the entries of a cos table and
a *signed* sine table the first pass wrote:

    y_i = x_i c[s, d] + x_p(i) s'[s, d],    p(i) = i + D/2 (d < D/2) or i - D/2 (d >= D/2)
    s'[s, d] = -sin(theta[s, d]) for d < D/2, +sin(theta[s, d]) for d >= D/2

with d = i mod D the element's feature and s = i // (B H D) its token. The check launches the
kernel itself on grid (cdiv(N, XBLOCK),) with the signature `KERNEL_SIGNATURE`, on inputs it
draws fresh for every call: N not a multiple of XBLOCK (a masked tail), head dims of 24 and 40
(not powers of two), fp32 and fp16, angle tables whose two members of a pair differ (so a
partner read from the wrong half, or a table entry of the wrong feature, shows) and TE's
f0 f1 .. f0 f1 ... The output starts as NaN inside a NaN guard band, so an element the kernel
does not write stays NaN and a store past N lands in the band. Only a `@triton.jit` function is
accepted, launched with ropelib's own answers barred (`own_code`): ropelib's kernels, the worked
solution below, or a kernel calling one of ropelib's @triton.jit helpers, are refused.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import reference, runtime
from . import _compare, check, kernel_answer, solution
from .own_code import fresh_seed, launch_barred

__all__ = ["KERNEL_SIGNATURE", "check_flat_kernel", "show_solution", "launch", "tables", "CASES"]

KERNEL_SIGNATURE = '''\
@triton.jit
def my_flat_rope_kernel(
    x_ptr,  # *x: input [S, B, H, D] (sbhd), contiguous: N = S * B * H * D elements
    y_ptr,  # *y: output, contiguous like x, same dtype
    cos_ptr,  # *fp32: cos [S, D], contiguous
    sin_ptr,  # *fp32: signed sine [S, D]: -sin for d < D/2, +sin for d >= D/2
    N,  # elements of x
    ROW,  # elements per token: B * H * D
    D: tl.constexpr,  # head dim: pairs (d, d + D/2)
    XBLOCK: tl.constexpr,  # elements per program (a power of two)
):
    # launched on grid (cdiv(N, XBLOCK),)
    pass  # your code
'''

# (S, B, H, D, XBLOCK, dtype, table)
CASES = (
    (5, 3, 2, 16, 64, torch.float32, "free"),
    (3, 2, 3, 24, 128, torch.float16, "free"),
    (4, 1, 2, 40, 32, torch.float32, "te"),
    (2, 2, 1, 8, 256, torch.float32, "free"),
)
_PAD = 64   # guard band: NaN elements after the output


def tables(freqs: torch.Tensor):
    """(cos, signed sine) [S, D] fp32 of angles [S, D], as the first pass writes them."""
    D = freqs.shape[-1]
    first = torch.arange(D, device=freqs.device) < D // 2
    return freqs.cos(), torch.where(first, -freqs.sin(), freqs.sin())


def launch(kernel, x, y, cos, sin, xblock: int) -> None:
    """Launch `kernel` (KERNEL_SIGNATURE's order) on its grid, writing y."""
    S, B, H, D = x.shape
    N = x.numel()
    kernel[(triton.cdiv(N, xblock),)](x, y, cos, sin, N, B * H * D, D=D, XBLOCK=xblock)


def _inputs(gen: torch.Generator, S, B, H, D, dtype, table, R: Optional[int] = None):
    """x, y (a NaN view into a padded buffer), the padded buffer, angles [S, R] (R: D unless
    given, the rotary dim of the third exercise)."""
    R = D if R is None else R
    device = runtime.default_device()
    x = torch.randn(S, B, H, D, generator=gen).to(device=device, dtype=dtype)
    y_buf = torch.full((x.numel() + _PAD,), float("nan"), dtype=dtype, device=device)
    y = y_buf[:x.numel()].view(S, B, H, D)
    if table == "te":   # f0 f1 ... f0 f1 ...: both members of a pair share an angle
        inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
        f = torch.outer(torch.arange(S, dtype=torch.float32), inv).repeat(1, 2)
    else:               # one free angle per feature: the members of a pair differ
        f = torch.rand(S, R, generator=gen) * 6.0 - 3.0
    return x, y, y_buf, f.to(device).contiguous()


def _verdict(name, label, x, x_before, y, y_buf, f, seed, *, tail: str, unwritten: str,
             hint: str) -> bool:
    """After a launch of a flat-pass kernel (this exercise's or the third's): nothing written
    past the output (`tail`: which mask), x unchanged, no NaN left in y (`unwritten`: what to
    look at), y equal to the reference. Prints the ❌ line of the first that fails."""
    if not bool(torch.isnan(y_buf[x.numel():]).all()):
        print(f"❌ {name} ({label}): the kernel wrote past the output (into the guard band "
              f"after it): {tail}")
        return False
    if not torch.equal(x, x_before):
        print(f"❌ {name} ({label}): the kernel changed its input x")
        return False
    bad = torch.isnan(y)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        print(f"❌ {name} ({label}): {int(bad.sum())} of {y.numel()} output elements are NaN "
              f"after the launch, first at [s, b, h, d] = {where}. The output starts as NaN: "
              f"either they were not written {unwritten}")
        return False
    want = reference.rope_reference(x, f)
    ok, _ = _compare(y, want, None, None)
    if not ok:
        print(f"   (inputs drawn with seed={seed})")
        return check(f"{name} ({label})", y, want, hint=hint)
    return True


def _label(S, B, H, D, xblock, dtype, table) -> str:
    return (f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')}, XBLOCK {xblock}, "
            f"N = {S * B * H * D}" + (", TE's table" if table == "te" else ""))


def check_flat_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's flat kernel on fresh inputs and compare with the reference.

    Prints one ✅ line, or ❌ with the first case that fails and why; returns the verdict; never
    raises. `seed` fixes the random inputs (default: new ones every call, printed on a failure).
    """
    name = "flat pass"
    if not kernel_answer(name, kernel, "what it stores through y_ptr"):
        return False
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    for S, B, H, D, xblock, dtype, table in CASES:
        label = _label(S, B, H, D, xblock, dtype, table)
        x, y, y_buf, f = _inputs(gen, S, B, H, D, dtype, table)
        cos, sin = tables(f)
        x_before = x.clone()
        ok, _ = launch_barred(name, label, "your flat kernel",
                              lambda: launch(kernel, x, y, cos, sin, xblock))
        if not ok or not _verdict(
                name, label, x, x_before, y, y_buf, f, seed,
                tail="mask the last program's elements, i < N",
                unwritten="(does every program store its elements below N?), or they were "
                          "computed from memory outside the inputs (is the token i // ROW, and "
                          "its table row below S?)",
                hint="element i is feature d = i % D of token s = i // ROW; its partner is "
                     "i + D/2 for d < D/2, else i - D/2; y_i = x_i cos[s, d] + x_partner "
                     "sin[s, d] (the sine is signed already)"):
            return False
    print(f"✅ {name}: correct on {len(CASES)} launches (a masked tail, head dims of 24 and 40, "
          "fp32 and fp16, pairs whose angles differ)")
    return True


@triton.jit
def _rope_flat_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D] (sbhd), contiguous: N = S * B * H * D elements
    y_ptr,  # *y: output, contiguous like x, same dtype
    cos_ptr,  # *fp32: cos [S, D], contiguous
    sin_ptr,  # *fp32: signed sine [S, D]: -sin for d < D/2, +sin for d >= D/2
    N,  # elements of x
    ROW,  # elements per token: B * H * D
    D: tl.constexpr,  # head dim: pairs (d, d + D/2)
    XBLOCK: tl.constexpr,  # elements per program (a power of two)
):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)   # [XBLOCK] element indices
    live = i < N
    d = i % D                                              # the feature
    s = i // ROW                                           # the token
    partner = tl.where(d < D // 2, i + D // 2, i - D // 2)
    x = tl.load(x_ptr + i, mask=live, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + partner, mask=live, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + s * D + d, mask=live, other=0.0)
    sn = tl.load(sin_ptr + s * D + d, mask=live, other=0.0)
    tl.store(y_ptr + i, (x * c + xp * sn).to(y_ptr.dtype.element_ty), mask=live)


def show_solution() -> None:
    """Show the worked kernel folded away (after the exercise)."""
    solution(_rope_flat_solution_kernel.fn, title="Solution: the flat pass")
