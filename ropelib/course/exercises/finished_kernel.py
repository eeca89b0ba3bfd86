"""Notebook 05's (the finished kernel) exercise: a 3-D tile kernel written from a blank `@triton.jit`.

The learner writes rung 4 of the ladder (tokens x heads x half tiles, a grid axis over batch
chunks) for the other pairing, **interleaved** (GPT-J, RoFormer: pair j is features (2j, 2j+1),
its angles freqs[s, 2j] and freqs[s, 2j+1]). The check takes the kernel itself and launches it
on grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H), cdiv(B, B_CHUNK)) with the signature
`KERNEL_SIGNATURE`, on inputs it draws fresh for every call:

* shapes whose S, H and B are not multiples of BLOCK_S, BLOCK_H and B_CHUNK (masked tails), and
  a head dim of 24 (12 pairs in a 16-lane tile);
* a non-contiguous x (a bshd tensor seen as sbhd, feature stride 2) and a non-contiguous y;
* fp32 and fp16, angle tables whose two members of a pair differ and TE's f0 f0 f1 f1.

The output starts as NaN inside a NaN guard band, so an element the kernel does not write stays
NaN and a store outside the output (a chunk that runs past B, a token past S) lands in the band.
Only a `@triton.jit` function is accepted: a Python function, or an object that only looks like
a kernel, has no way to hand back a tensor it computed on the host. The launch runs with
ropelib's own answers barred (`own_code`): one of ropelib's kernels (the worked solution below
included), or a kernel that calls one of ropelib's @triton.jit helpers, is refused.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import reference, runtime
from . import _compare, check, is_blank_kernel, is_kernel, solution
from .own_code import fresh_seed, launch_barred

__all__ = ["KERNEL_SIGNATURE", "check_interleaved_tile_kernel", "show_solution", "launch",
           "CASES"]

KERNEL_SIGNATURE = '''\
@triton.jit
def my_interleaved_tile_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], any strides, same dtype as x
    freqs_ptr,  # *fp32: angles [S, D], contiguous; pair j uses freqs[s, 2j] and freqs[s, 2j + 1]
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per program (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    HALF: tl.constexpr,  # D // 2: pairs per head
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per program
    BLOCK_H: tl.constexpr,  # heads per program
):
    # launched on grid (cdiv(S, BLOCK_S), cdiv(H, BLOCK_H), cdiv(B, B_CHUNK))
    pass  # your code
'''

# (S, B, H, D, BLOCK_S, BLOCK_H, B_CHUNK, dtype, x strided, y strided, table)
CASES = (
    (5, 3, 3, 16, 2, 2, 2, torch.float32, False, False, "free"),
    (3, 2, 5, 24, 4, 4, 1, torch.float32, True, False, "te"),
    (4, 5, 2, 32, 2, 2, 3, torch.float16, True, True, "free"),
    (1, 1, 1, 8, 1, 1, 1, torch.float32, False, True, "te"),
)
_PAD = 2  # guard band: tokens (or batch entries) of NaN after the output


def _ready(name: str, kernel) -> bool:
    if kernel is None or kernel is Ellipsis:
        print(f"❌ {name}: no answer yet (define the kernel)")
        return False
    if not is_kernel(kernel):
        print(f"❌ {name}: expected a function decorated with @triton.jit, got "
              f"{type(kernel).__name__}: the check launches your kernel on inputs it draws "
              "itself, so only what the kernel stores through y_ptr counts")
        return False
    if is_blank_kernel(kernel):
        print(f"❌ {name}: no answer yet (write the kernel body in place of `pass`, then rerun "
              "the cell)")
        return False
    return True


def _inputs(gen: torch.Generator, S, B, H, D, dtype, x_strided, y_strided, table):
    """x, y (a NaN view into a padded buffer), the padded buffer, freqs [S, D]."""
    device = runtime.default_device()
    if x_strided:   # bshd seen as sbhd, every other feature: strides (H*2D, S*H*2D, 2D, 2)
        base = torch.randn(B + _PAD, S, H, 2 * D, generator=gen)[:B]
        x = base.to(device=device, dtype=dtype).permute(1, 0, 2, 3)[..., ::2]
    else:
        x = torch.randn(S + _PAD, B, H, D, generator=gen).to(device=device, dtype=dtype)[:S]
    if y_strided:   # bshd buffer seen as sbhd
        y_buf = torch.full((B + _PAD, S, H, D), float("nan"), dtype=dtype, device=device)
        y = y_buf[:B].permute(1, 0, 2, 3)
    else:
        y_buf = torch.full((S + _PAD, B, H, D), float("nan"), dtype=dtype, device=device)
        y = y_buf[:S]
    if table == "te":   # f0 f0 f1 f1 ...: both members of a pair share an angle
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        f = torch.outer(torch.arange(S, dtype=torch.float32), inv).repeat_interleave(2, dim=-1)
    else:               # one free angle per feature: the members of a pair differ
        f = torch.rand(S, D, generator=gen) * 6.0 - 3.0
    return x, y, y_buf, f.to(device).contiguous()


def launch(kernel, x, y, freqs, block_s: int, block_h: int, chunk: int) -> None:
    """Launch `kernel` (KERNEL_SIGNATURE's order) on its grid, writing y."""
    S, B, H, D = x.shape
    grid = (triton.cdiv(S, block_s), triton.cdiv(H, block_h), triton.cdiv(B, chunk))
    kernel[grid](x, y, freqs, S, B, H, chunk, *x.stride(), *y.stride(), HALF=D // 2,
                 BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_S=block_s, BLOCK_H=block_h)


def _label(S, B, H, D, bs, bh, chunk, dtype, xs, ys, table) -> str:
    return (f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')}, tile ({bs}, {bh}), "
            f"chunk {chunk}" + (", x non-contiguous" if xs else "")
            + (", y non-contiguous" if ys else "")
            + (", TE's f0 f0 f1 f1 table" if table == "te" else ""))


def check_interleaved_tile_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's kernel on fresh inputs and compare with the reference (interleaved).

    Prints one ✅ line, or ❌ with the first case that fails and why; returns the verdict; never
    raises. `seed` fixes the random inputs (default: new ones every call, the seed is printed
    on a failure).
    """
    name = "interleaved 3-D tile kernel"
    if not _ready(name, kernel):
        return False
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    for S, B, H, D, bs, bh, chunk, dtype, xs, ys, table in CASES:
        label = _label(S, B, H, D, bs, bh, chunk, dtype, xs, ys, table)
        x, y, y_buf, f = _inputs(gen, S, B, H, D, dtype, xs, ys, table)
        x_before = x.clone()
        ok, _ = launch_barred(name, label, "your interleaved 3-D tile kernel",
                              lambda: launch(kernel, x, y, f, bs, bh, chunk))
        if not ok:
            return False
        band = y_buf[S:] if not ys else y_buf[B:]
        if not bool(torch.isnan(band).all()):
            print(f"❌ {name} ({label}): the kernel wrote outside the output (into the guard band "
                  f"after it): mask the tails — tokens s < S, heads h < H, and a chunk's batch "
                  f"entries must stop at B (tl.minimum(b_lo + B_CHUNK, B))")
            return False
        if not torch.equal(x, x_before):
            print(f"❌ {name} ({label}): the kernel changed its input x")
            return False
        bad = torch.isnan(y)
        if bool(bad.any()):
            where = [int(i) for i in bad.nonzero()[0]]
            print(f"❌ {name} ({label}): {int(bad.sum())} of {y.numel()} output elements were not "
                  f"written (the output starts as NaN), first at [s, b, h, d] = {where}: "
                  "does every program store its whole tile, the last (partial) blocks included?")
            return False
        want = reference.rope_reference(x, f, interleaved=True)
        ok, _ = _compare(y, want, None, None)
        if not ok:
            print(f"   (inputs drawn with seed={seed})")
            return check(f"{name} ({label})", y, want,
                         hint="pair j is (x[2j], x[2j+1]) with angles freqs[s, 2j] and "
                              "freqs[s, 2j+1]: y[2j] = x[2j] cos_a - x[2j+1] sin_a, "
                              "y[2j+1] = x[2j+1] cos_b + x[2j] sin_b; address x and y through "
                              "their own strides")
    print(f"✅ {name}: correct on {len(CASES)} launches (tails in S, H and B, non-contiguous "
          "x and y, fp32 and fp16)")
    return True


@triton.jit
def _rope_interleaved_tile_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], any strides, same dtype as x
    freqs_ptr,  # *fp32: angles [S, D], contiguous; pair j uses freqs[s, 2j] and freqs[s, 2j + 1]
    S, B, H,  # tokens, batch, heads
    B_CHUNK,  # batch entries per program (the last chunk may be shorter)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh, stride_yd,  # y strides, in elements
    HALF: tl.constexpr,  # D // 2: pairs per head
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    BLOCK_S: tl.constexpr,  # tokens per program
    BLOCK_H: tl.constexpr,  # heads per program
):
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)  # the last chunk stops at B
    k = tl.arange(0, 2 * BLOCK_HALF)  # feature index: a head's whole row, pairs side by side
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (k < 2 * HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (k < 2 * HALF)[None, None, :]
    # the angle of every feature of the token's row (pair j: 2j and 2j + 1), once per program
    theta = tl.load(freqs_ptr + s[:, None, None] * (2 * HALF) + k[None, None, :], mask=tab_m,
                    other=0.0)  # [BLOCK_S, 1, 2 * BLOCK_HALF]
    c, sn = tl.cos(theta), tl.sin(theta)
    x_off = s[:, None, None] * stride_xs + h[None, :, None] * stride_xh \
        + k[None, None, :] * stride_xd
    y_off = s[:, None, None] * stride_ys + h[None, :, None] * stride_yh \
        + k[None, None, :] * stride_yd
    for b in range(b_lo, b_hi):
        # whole rows in (contiguous features: 16-byte vectors where x's last stride is 1) ...
        x = tl.load(x_ptr + x_off + b * stride_xb, mask=m, other=0.0).to(tl.float32)
        # ... each feature's partner found in registers: [.., 2j] pairs with [.., 2j + 1]
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_S, BLOCK_H, BLOCK_HALF, 2)))
        partner = tl.reshape(tl.join(-x_odd, x_even), (BLOCK_S, BLOCK_H, 2 * BLOCK_HALF))
        # y[2j] = x[2j] cos - x[2j+1] sin, y[2j+1] = x[2j+1] cos + x[2j] sin: whole rows out
        tl.store(y_ptr + y_off + b * stride_yb, (x * c + partner * sn).to(y_ptr.dtype.element_ty),
                 mask=m)


def show_solution() -> None:
    """Show the worked kernel folded away (after the exercise)."""
    solution(_rope_interleaved_tile_solution_kernel.fn,
             title="Solution: the interleaved 3-D tile kernel")
