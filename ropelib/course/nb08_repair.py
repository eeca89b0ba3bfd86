"""Notebook 08's section-5 repair exercise: fix the sbhd-vs-bshd position line in a kernel.

The reproduction kernel takes a row's position as ``row % SEQ_LEN``, right for bshd rows
``b*S + s``. Fed an sbhd tensor, whose rows are ``s*B + b``, that formula is the trap
``sbhd_row_indexing``. The learner repairs the position line of a copy of the kernel (cut to the
fixed path: sin/cos from fp32 angles, fp32 math) so that it is right for sbhd rows.

`check_sbhd_repair(kernel)` launches the learner's kernel through the course's own wrapper with
the trap switched on (`debug.reproduce(..., FIXED + sbhd_row_indexing, kernel=kernel)`, fp32
sbhd), reads the position each output token encodes (`debug.recovered_positions`) and wants the
true position ``s`` back for every batch and head, and the output within fp32 tolerances of the
fp64 RoPE. The cases have two and three batches and one size drawn when the check runs (its
seed in the label), so a position line that hard-codes the batch fails. The unchanged kernel,
the course's own reproduction kernel and the worked solution are refused, and so is a kernel
that calls one of ropelib's kernels or helpers (the worked solution among them) from its body
(`own_code.library_kernel`).
"""
import dataclasses

import torch
import triton
import triton.language as tl

from . import debug
from .exercises.own_code import fresh_generator, library_kernel, notebook_kernels
from ..kernels.common import round_to

__all__ = ["check_sbhd_repair", "solution_sbhd_kernel", "repair_cases"]

_NAME = "the sbhd repair"


def repair_cases() -> list:
    """(label, Scenario): fp32 sbhd, two fixed sizes and one drawn now (the seed in its label)."""
    seed, g = fresh_generator()
    S = int(torch.randint(8, 25, (), generator=g))
    B = int(torch.randint(2, 5, (), generator=g))
    H = int(torch.randint(1, 3, (), generator=g))
    D = (16, 32)[int(torch.randint(0, 2, (), generator=g))]
    fixed = [("S=16 B=2 H=2 D=16", debug.Scenario(seq_len=16, batch=2, heads=2, head_dim=16,
                                                  dtype="fp32", seed=3)),
             ("S=12 B=3 H=1 D=32", debug.Scenario(seq_len=12, batch=3, heads=1, head_dim=32,
                                                  dtype="fp32", seed=4))]
    drawn = (f"S={S} B={B} H={H} D={D}, drawn with seed {seed}",
             debug.Scenario(seq_len=S, batch=B, heads=H, head_dim=D, dtype="fp32",
                            seed=int(torch.randint(0, 2 ** 31 - 1, (), generator=g))))
    return [*fixed, drawn]


def check_sbhd_repair(kernel, device=None) -> bool:
    """Run `kernel` (a copy of the reproduction kernel's arguments, @triton.jit) on sbhd rows
    with the trap ``sbhd_row_indexing`` on; True when every token's output encodes its true
    position and the output is the fp64 RoPE's within fp32 tolerances. Prints one line per
    failure or one ✅ line; never raises."""
    if kernel is None or kernel is Ellipsis:
        print(f"❌ {_NAME}: no answer yet (fix the position line of the kernel)")
        return False
    if kernel is debug._rope_unsloth_repro_kernel:
        print(f"❌ {_NAME}: that is the course's reproduction kernel, trap and all: repair a copy")
        return False
    if kernel is solution_sbhd_kernel:
        print(f"❌ {_NAME}: that is the worked solution: write the position line yourself")
        return False
    # a kernel that launches or inlines ropelib's (the worked solution called from its body,
    # the reproduction kernel, a finished kernel's helpers) is not a repair of the learner's;
    # round_to, which section 1's kernel (the learner's copy) calls, is allowed
    called = library_kernel(kernel, allow=(round_to,),
                            bar=(solution_sbhd_kernel, *notebook_kernels()))
    if called is not None:
        print(f"❌ {_NAME}: your kernel calls {called}: repair the position line of your own "
              f"copy instead (write it yourself)")
        return False
    try:
        debug.check_repro_kernel(kernel)
    except TypeError as exc:
        print(f"❌ {_NAME}: {exc}")
        return False
    causes = dataclasses.replace(debug.FIXED, sbhd_row_indexing=True)
    tol = debug.tolerances("fp32")
    for label, sc in repair_cases():
        try:
            r = debug.reproduce(sc, causes, device=device, kernel=kernel)
        except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
            print(f"❌ {_NAME} ({label}): the kernel raised {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}")
            return False
        pos = debug.recovered_positions(r.x, r.tokens_triton, r.layout).cpu()
        want = torch.arange(sc.seq_len, dtype=pos.dtype).view(-1, 1, 1).expand_as(pos)
        off = (pos - want).abs() > 1e-2
        if bool(off.any()):
            s, b, h = (int(v) for v in off.nonzero()[0])
            print(f"❌ {_NAME} ({label}): {int(off.sum())} of {off.numel()} tokens encode a "
                  f"wrong position; the first, position {s} of batch {b}, head {h}, encodes "
                  f"{float(pos[s, b, h]):.3g}. Hint: sbhd rows are row = s * B + b, and the "
                  f"grid's first axis has S * B programs (tl.num_programs(0)); SEQ_LEN is S")
            return False
        if not torch.allclose(r.tokens_triton.double().cpu(), r.reference.cpu(), **tol):
            err = float((r.tokens_triton.double().cpu() - r.reference.cpu()).abs().max())
            print(f"❌ {_NAME} ({label}): every position is right, but the output is off the "
                  f"fp64 RoPE by up to {err:.3g} (fp32 tolerances {tol}): leave the rest of "
                  f"the kernel as it was")
            return False
    print(f"✅ {_NAME}: every token of every case encodes its own position (two fixed sizes "
          f"and one drawn now), and the output is the fp64 RoPE's within fp32 tolerances")
    return True


@triton.jit
def solution_sbhd_kernel(x_ptr, cos_ptr, sin_ptr, stride_xr, stride_xh, stride_t, SEQ_LEN,
                         HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, FROM_ANGLES: tl.constexpr,
                         COMPUTE_FP32: tl.constexpr, USE_FMA: tl.constexpr,
                         BF16_RTNE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)     # sbhd rows: row = s * B + b
    head = tl.program_id(1).to(tl.int64)
    batch = tl.num_programs(0) // SEQ_LEN   # S * B rows in the grid, SEQ_LEN = S: B
    pos = row // batch                      # s, for every b (bshd's row % SEQ_LEN is not)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    theta = tl.load(cos_ptr + pos * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
    c = tl.cos(theta)
    s = tl.sin(theta)
    x_row = x_ptr + row * stride_xr + head * stride_xh
    x1 = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_row + offs, x1 * c - x2 * s, mask=mask)
    tl.store(x_row + HALF + offs, x2 * c + x1 * s, mask=mask)
