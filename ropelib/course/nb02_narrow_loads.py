"""Notebook 02, section 6: `x * cos` three ways in Triton, to take PyTorch's non-vectorized
template apart.

PyTorch's `elementwise_kernel<128, 4>` (128 threads a block, 4 elements a thread) differs from
its vectorized template in two ways at once: each lane loads and stores one element at a time,
and each operand's offset is formed from sizes and strides (a division and a remainder a
dimension). `_mul_kernel` multiplies two contiguous tensors of one shape at that launch shape,
its addresses formed one of three ways (`MODES`):

- wide: `offs`, a run the compiler proves contiguous: a lane's 4 neighbouring elements in one
  8-byte load or store;
- one element a lane: `offs * one`, with `one == 1` passed at run time and not specialised, so
  the compiler cannot prove a run: one 2-byte access an element, the 32 lanes of a warp on 32
  neighbouring elements (2 sectors a request, as Nsight Compute counted in PyTorch's template);
- one element a lane, by / and %: `(offs // row) * row_stride + (offs % row) * one`, `offs`
  again, through an integer division by a run-time `row` (a `div.s32`, which the GPU runs as a
  sequence of instructions; PyTorch's offset calculator divides by a multiply, which is cheaper).

The three read and write the same bytes and compute the same product: their times differ only
by what the narrow accesses and the address arithmetic cost. `access_code` compiles each for
sm_90 on this machine (no GPU needed) and reads its accesses and divisions from the PTX.
"""
import re
from collections import Counter

import torch
import triton
import triton.language as tl

from .offline_compile import compiled_code

__all__ = ["MODES", "BLOCK", "NUM_WARPS", "multiply", "access_code"]

MODES = {"wide": 0, "one element a lane": 1, "one element a lane, by / and %": 2}
BLOCK, NUM_WARPS = 512, 4            # elementwise_kernel<128, 4>: 128 threads, 4 elements each


@triton.jit(do_not_specialize=["one", "row", "row_stride"])
def _mul_kernel(x_ptr, c_ptr, y_ptr, n, one, row, row_stride, BLOCK: tl.constexpr,
                MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if MODE == 0:
        at = offs                                   # provably contiguous: vector accesses
    elif MODE == 1:
        at = offs * one                             # one == 1, unknown to the compiler
    else:                                           # offs again (row_stride == row), by a
        at = (offs // row) * row_stride + (offs % row) * one    # division and a remainder
    x = tl.load(x_ptr + at, mask=mask).to(tl.float32)     # in fp32, rounded once, as PyTorch
    y = (x * tl.load(c_ptr + at, mask=mask).to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + at, y, mask=mask)


def multiply(x: torch.Tensor, c: torch.Tensor, out: torch.Tensor, mode: str) -> torch.Tensor:
    """out = x * c (contiguous, one shape) by `_mul_kernel` in `mode` (a key of MODES)."""
    if not (x.is_contiguous() and c.is_contiguous() and out.is_contiguous()
            and x.shape == c.shape == out.shape):
        raise ValueError("x, c and out: contiguous tensors of one shape")
    n = x.numel()
    row = x.shape[-1] if x.dim() else 1
    _mul_kernel[(triton.cdiv(n, BLOCK),)](x, c, out, n, 1, row, row, BLOCK=BLOCK,
                                          MODE=MODES[mode], num_warps=NUM_WARPS)
    return out


def access_code(dtype: torch.dtype = torch.bfloat16) -> dict:
    """Per mode, `_mul_kernel` compiled for sm_90 as `multiply` launches it, read back:
    {"per_thread": elements a thread holds in a run (the layout's sizePerThread), "loads" and
    "stores": Counters of the PTX's global access instructions, "divisions": its div/rem}."""
    t = torch.empty(1024, dtype=dtype)
    out = {}
    for name, mode in MODES.items():
        code = compiled_code(_mul_kernel, dict(x_ptr=t, c_ptr=t, y_ptr=t, n=1 << 26, one=1,
                                               row=128, row_stride=128, BLOCK=BLOCK, MODE=mode),
                             num_warps=NUM_WARPS)
        ptx = code["ptx"]
        out[name] = {
            "per_thread": int(re.search(r"sizePerThread = \[(\d+)\]", code["ttgir"]).group(1)),
            "loads": Counter(re.findall(r"\bld\.global(?:\.\w+)+", ptx)),
            "stores": Counter(re.findall(r"\bst\.global(?:\.\w+)+", ptx)),
            "divisions": len(re.findall(r"\b(?:div|rem)\.\w+", ptx))}
    return out
