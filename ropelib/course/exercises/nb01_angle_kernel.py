"""Notebook 01's kernel exercise: compute the angle inside the kernel, for any even head dim.

`check_angle_kernel(kernel)` takes the learner's @triton.jit *kernel*: it draws x, a base, the
frequencies and a first position when it runs, allocates the output itself (NaN, inside NaN
guard bands, so an element never written or a store past the end of a row is caught), launches
one program per position and compares what the kernel stored with $R_m x$ computed here in
float64, pair by pair. Only what the kernel stores through `y_ptr` counts; the launch runs with
ropelib's answers and the notebook's own kernels barred (`own_code.launch_barred`).

The kernel's arguments, in order (grid `(S,)`, one program per position):

    x_ptr,               # *fp32: x [S, D], contiguous
    inv_ptr,             # *fp32: theta_j [D/2] (the check draws the base)
    y_ptr,               # *fp32: y [S, D], contiguous
    start,               # int: program m rotates by position start + m
    D: tl.constexpr,     # head dim: even, not always a power of two
    BLOCK: tl.constexpr, # triton.next_power_of_2(D)

and y[m] = R_{start+m} x[m] with interleaved pairs (2j, 2j+1) and angle (start + m) * theta_j.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import runtime
from . import _compare, check, guard_band_writes, guarded_view, kernel_answer
from .own_code import fresh_seed, launch_barred

__all__ = ["check_angle_kernel", "solution_angle_kernel", "launch_angle_kernel", "CASES"]

# (S, D): a power of two, D = 80 (a masked tile of 128) and D = 6 (a masked tile of 8)
CASES = ((5, 8), (4, 80), (3, 6))
_PAD = 256   # guard band, wider than any tile of one row


def launch_angle_kernel(kernel, x: torch.Tensor, inv: torch.Tensor, y: torch.Tensor,
                        start: int) -> None:
    """Launch a kernel of the signature above on x [S, D], inv [D/2], y [S, D]."""
    S, D = x.shape
    kernel[(S,)](x, inv, y, start, D=D, BLOCK=triton.next_power_of_2(D))


def _expected(x: torch.Tensor, inv: torch.Tensor, start: int) -> torch.Tensor:
    """R_m x[m] in float64, pair by pair: (a, b) -> (a cos - b sin, b cos + a sin)."""
    pos = torch.arange(x.shape[0], dtype=torch.float64)[:, None] + start
    ang = pos * inv.double().cpu()[None, :]                            # [S, D/2]
    x64 = x.double().cpu()
    a, b = x64[:, 0::2], x64[:, 1::2]
    y = torch.empty_like(x64)
    y[:, 0::2] = a * ang.cos() - b * ang.sin()
    y[:, 1::2] = b * ang.cos() + a * ang.sin()
    return y


def check_angle_kernel(kernel, *, seed: Optional[int] = None) -> bool:
    """Launch the learner's kernel on fresh inputs and compare with R_m x (float64).

    Args:
        kernel: a @triton.jit function with the signature in this module's docstring.
        seed: for the random inputs (fresh ones each call by default).
    Returns:
        True when every case matches, every element is written and nothing is stored outside y.
    """
    name = "angle-in-the-kernel RoPE"
    if not kernel_answer(name, kernel, "the output buffer it allocated"):
        return False
    device = runtime.default_device()
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    for S, D in CASES:
        base = float(10 ** (2 + 3 * torch.rand((), generator=gen)))          # 100 .. 100000
        start = int(torch.randint(1, 200, (), generator=gen))
        inv = (1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).float()
        label = f"x [{S}, {D}], base {base:.0f}, start {start}, seed {seed}"
        x = torch.randn(S, D, generator=gen).to(device)
        inv_d = inv.to(device)
        x_before = x.clone()
        y_buf, y = guarded_view((S, D), _PAD, dtype=torch.float32, device=device)
        ok, _ = launch_barred(name, label, "your RoPE kernel",
                              lambda: launch_angle_kernel(kernel, x, inv_d, y, start),
                              last_line=True)
        if not ok:
            return False
        if not torch.equal(x, x_before):
            print(f"❌ {name} ({label}): the kernel changed its input x")
            return False
        outside = guard_band_writes(y_buf, _PAD)
        if outside:
            print(f"❌ {name} ({label}): the kernel stored {outside} elements outside y "
                  "(a store without its mask, or a wrong row offset)")
            return False
        unwritten = int(y.isnan().sum())
        if unwritten:
            print(f"❌ {name} ({label}): {unwritten} of {y.numel()} output elements were never "
                  "written (or are NaN)")
            return False
        want = _expected(x, inv, start)
        same, _ = _compare(y, want, 2e-4, 2e-4)      # float32 angles up to ~200 radians
        if not same:
            return check(f"{name} ({label})", y, want, atol=2e-4, rtol=2e-4,
                         hint="program m is position start + m; pair j is features (2j, 2j+1) "
                              "and turns by a = (start + m) * inv[j]: y[2j] = x[2j] cos a - "
                              "x[2j+1] sin a, y[2j+1] = x[2j+1] cos a + x[2j] sin a")
    print(f"✅ {name}: correct on {len(CASES)} launches (D = 8, and D = 80 and 6 with a masked "
          "tile; bases and first positions drawn anew)")
    return True


@triton.jit
def solution_angle_kernel(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    i = tl.arange(0, BLOCK)                    # a power-of-two tile over the D features
    live = i < D                               # the lanes past the end of the row stay off
    partner, first = i ^ 1, i % 2 == 0         # interleaved pairs (2j, 2j + 1); D is even,
    x = tl.load(x_ptr + m * D + i, mask=live, other=0.0)     # so a live lane's partner is live
    x_partner = tl.load(x_ptr + m * D + partner, mask=live, other=0.0)
    theta = tl.load(inv_ptr + i // 2, mask=live, other=0.0)  # theta_j of feature i's pair j
    a = (start + m).to(tl.float32) * theta     # the angle, formed here: position x theta_j
    rotated = tl.where(first, -x_partner, x_partner)
    tl.store(y_ptr + m * D + i, x * tl.cos(a) + rotated * tl.sin(a), mask=live)
