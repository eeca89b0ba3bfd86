"""Notebook 11's exercise 1b: one context-parallel rank's shard rotated by your own kernel.

The learner's @triton.jit kernel gets one rank's dual-chunk shard `[B, S_LOCAL, H, D]` of a
sequence of `S_LOCAL * CP_SIZE` tokens and must rotate each local token at its *global*
position (rank r holds chunks r and 2*CP_SIZE-1-r of 2*CP_SIZE). Its arguments:

    x_ptr,                      # the rank's shard [B, S_LOCAL, H, D], contiguous
    y_ptr,                      # the rotated shard, same shape, contiguous
    freqs_ptr,                  # angles [S, D] fp32 of the whole sequence, contiguous: pair
                                #   (j, j + D/2) at global position p turns by freqs[p, j]
    S_LOCAL,                    # tokens the rank holds (even)
    CP_SIZE, CP_RANK,           # ranks, and this rank
    H: tl.constexpr,            # heads (a power of two)
    D: tl.constexpr,            # head dim (a power of two), all rotated

launched with one program per local token, grid (B * S_LOCAL,).

`check_cp_shard_kernel` draws a whole sequence, rotates it with `ropelib.apply_rope` outside the
watch, and compares each rank's output with that rank's share of the full rotation
(`context_parallel.shard`), the output poisoned with NaN first and set in the middle of a NaN
buffer (`guarded_view`), so a store past either end of the shard is caught. It launches through
`launch_cp_shard`, or the launcher passed as `launch=` (notebook 11 passes its own copy). The
kernel runs in Triton's interpreter with ropelib barred (its kernels and their @triton.jit
helpers, among them `dual_chunk_position`, and every worked solution), on a GPU compiled there
too; one case is drawn as the check runs (`fresh_generator`), so no table made beforehand
passes.
"""
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from ... import context_parallel, frequencies, runtime
from ...api import apply_rope
from . import _compare, check, guard_band_writes, guarded_view, kernel_answer
from .own_code import fresh_seed, launch_on

__all__ = ["check_cp_shard_kernel", "solution_cp_shard_kernel", "launch_cp_shard", "CASES"]

_NAME = "a rank's shard at its global positions"
# (B, S, H, D, cp_size, dtype): the whole sequence, and its ranks
CASES = (
    (2, 16, 2, 8, 2, torch.float32),
    (1, 24, 4, 16, 3, torch.float32),
    (2, 32, 2, 8, 4, torch.bfloat16),
    (1, 8, 1, 8, 1, torch.float32),          # one rank: its two chunks adjoin, the whole sequence
)


def launch_cp_shard(kernel, x, y, freqs, cp_size: int, cp_rank: int) -> None:
    """Launch a kernel of this module's signature on a rank's shard x [B, S_LOCAL, H, D] (y the
    same), freqs [S, D]; one program per local token."""
    B, S_local, H, D = x.shape
    kernel[(B * S_local,)](x, y, freqs, S_local, cp_size, cp_rank, H=H, D=D)


def _drawn_case(gen) -> tuple:
    n = int(torch.randint(1, 5, (), generator=gen))
    S = 2 * n * int(torch.randint(1, 9, (), generator=gen))
    return (int(torch.randint(1, 3, (), generator=gen)), S, 2, 8, n, torch.float32)


def check_cp_shard_kernel(kernel, *, seed: Optional[int] = None,
                          launch: Optional[Callable] = None) -> bool:
    """Launch the learner's kernel (this module's signature) on every rank's shard of fresh
    sequences; compare with each rank's share of ropelib.apply_rope over the whole sequence.
    `launch` (the notebook's launcher, `launch_cp_shard`'s signature) launches it; by default
    `launch_cp_shard`. Prints ✅ or ❌ (with why); never raises."""
    if not kernel_answer(_NAME, kernel, "the rotated shard it wrote"):
        return False
    launch = launch_cp_shard if launch is None else launch
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    on_gpu = runtime.on_gpu()
    cases = CASES + (_drawn_case(gen),)
    for c, (B, S, H, D, n, dtype) in enumerate(cases):
        x = torch.randn(B, S, H, D, generator=gen).to(dtype)
        base = float(torch.randint(100, 20000, (), generator=gen))
        freqs = frequencies.rope_freqs(S, D, base=base)
        ref_device = "cuda" if on_gpu else "cpu"                  # where ropelib's kernel runs
        full = apply_rope(x.to(ref_device), freqs.to(ref_device), layout="bshd").cpu()
        tol = (3e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.6e-2)
        for r in range(n):
            want = context_parallel.shard(full, n, r)
            label = (f"S={S} over {n} rank(s), rank {r}, B={B}, H={H}, D={D}, "
                     f"{str(dtype).replace('torch.', '')}"
                     + (f" (drawn with seed {seed})" if c == len(CASES) else ""))
            for device in ("cpu", "cuda") if on_gpu else ("cpu",):
                where = "interpreter" if device == "cpu" else "compiled on the GPU"
                shard = context_parallel.shard(x, n, r).to(device).contiguous()
                # the output: NaN, in the middle of a NaN buffer (wider than a token's heads)
                pad = 2 * H * D + 64
                y_buf, y = guarded_view(shard.shape, pad, dtype=shard.dtype, device=device)
                if not launch_on(device, _NAME, f"{label}, {where}", launch, kernel,
                                 shard, y, freqs.view(S, D).to(device), n, r):
                    return False
                outside = guard_band_writes(y_buf, pad)
                if outside:
                    print(f"❌ {_NAME} ({label}, {where}): the kernel stored {outside} elements "
                          "outside the shard's output y (a wrong row offset, or a program "
                          "past the last token)")
                    return False
                same, _ = _compare(y.cpu(), want, *tol)
                if not same:
                    return check(f"{_NAME} ({label}, {where})", y.cpu(), want, atol=tol[0],
                                 rtol=tol[1],
                                 hint="local index i < S_LOCAL/2 sits at global position "
                                      "CP_RANK*S_LOCAL/2 + i, the rest in chunk "
                                      "2*CP_SIZE-1-CP_RANK; rotate by that row of freqs")
    gpu = " and compiled on the GPU" if on_gpu else ""
    print(f"✅ {_NAME}: every rank's output is its share of the whole sequence's rotation, "
          f"{len(cases)} sequences (1 to 4 ranks, fp32 and bf16) in the interpreter{gpu}")
    return True


@triton.jit
def solution_cp_shard_kernel(
    x_ptr,  # the rank's shard [B, S_LOCAL, H, D], contiguous
    y_ptr,  # the rotated shard, same shape
    freqs_ptr,  # angles [S, D] fp32 of the whole sequence
    S_LOCAL,  # tokens the rank holds (even)
    CP_SIZE, CP_RANK,  # ranks, and this rank
    H: tl.constexpr,  # heads (a power of two)
    D: tl.constexpr,  # head dim (a power of two)
):
    HALF: tl.constexpr = D // 2
    row = tl.program_id(0)  # one local token: b * S_LOCAL + i
    i = row % S_LOCAL
    seg = S_LOCAL // 2  # tokens per chunk
    # chunk CP_RANK first, then chunk 2*CP_SIZE-1-CP_RANK
    pos = tl.where(i < seg, CP_RANK * seg + i, (2 * CP_SIZE - 1 - CP_RANK) * seg + i - seg)
    j = tl.arange(0, HALF)[None, :]  # [1, HALF] pairs
    theta = tl.load(freqs_ptr + pos * D + j)
    c, s = tl.cos(theta), tl.sin(theta)
    h = tl.arange(0, H)[:, None]  # [H, 1]: all heads of the token
    base = (row * H + h) * D
    x1 = tl.load(x_ptr + base + j).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + j).to(tl.float32)
    tl.store(y_ptr + base + j, x1 * c - x2 * s)
    tl.store(y_ptr + base + HALF + j, x2 * c + x1 * s)
