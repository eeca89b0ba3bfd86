"""Notebook 02, section 6: `x * cos` four ways in Triton, to take PyTorch's non-vectorized
template apart.

PyTorch's `elementwise_kernel<128, 4>` (128 threads a block, 4 elements a thread) differs from
its vectorized template in three ways at once: each lane loads and stores one element at a
time; each operand's offset is formed from sizes and strides (a division and a remainder a
dimension); and a thread runs its 4 elements one after another (load, multiply, store), and
since its compiler cannot prove that a store leaves the next element's operands alone, the next
loads wait. `_mul_kernel` multiplies two contiguous tensors of one shape at that launch shape,
its accesses formed one of four ways (`MODES`):

- wide: `offs`, a run the compiler proves contiguous: a lane's 4 neighbouring elements in one
  8-byte load or store;
- one element a lane: `offs * one`, with `one == 1` passed at run time and not specialised, so
  the compiler cannot prove a run: one 2-byte access an element, the 32 lanes of a warp on 32
  neighbouring elements (2 sectors a request, as Nsight Compute counted in PyTorch's template);
- one element a lane, by / and %: `(offs // row) * row_stride + (offs % row) * one`, `offs`
  again, through an integer division by a run-time `row` (a `div.s32`, which the GPU runs as a
  sequence of instructions; PyTorch's offset calculator divides by a multiply, which is cheaper);
- one element a lane, one in flight: as the second, but a lane's 4 elements (`BLOCK // 4`
  apart, as a thread of PyTorch's template steps) in turn, each address plus `value * zero`
  of the last element's loaded value (`zero == 0` at run time): the next loads cannot issue
  before the last ones return, so a lane has one element's loads in flight at a time.

The four read and write the same bytes and compute the same product: their times differ only
by what the narrow accesses, the address arithmetic and the loads in flight cost. `access_code`
compiles each for sm_90 on this machine (no GPU needed) and reads its accesses, their order and
its divisions from the PTX.

Notebook 02 holds a runnable copy of `_mul_kernel` (tests/test_notebook_kernels_same.py keeps it
equal to this one) and launches it with its own `launch_mul`, as `multiply` does here for the
tests.
"""
import re
from collections import Counter

import torch
import triton
import triton.language as tl

from .offline_compile import compiled_code

__all__ = ["MODES", "BLOCK", "NUM_WARPS", "multiply", "access_code"]

MODES = {"wide": 0, "one element a lane": 1, "one element a lane, by / and %": 2,
         "one element a lane, one in flight": 3}
BLOCK, NUM_WARPS = 512, 4            # elementwise_kernel<128, 4>: 128 threads, 4 elements each


@triton.jit(do_not_specialize=["one", "zero", "row", "row_stride"])
def _mul_kernel(x_ptr, c_ptr, y_ptr, n, one, zero, row, row_stride, BLOCK: tl.constexpr,
                MODE: tl.constexpr):
    if MODE < 3:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if MODE == 0:
            at = offs                               # provably contiguous: vector accesses
        elif MODE == 1:
            at = offs * one                         # one == 1, unknown to the compiler
        else:                                       # offs again (row_stride == row), by a
            at = (offs // row) * row_stride + (offs % row) * one    # division and a remainder
        x = tl.load(x_ptr + at, mask=mask).to(tl.float32)   # in fp32, rounded once, as PyTorch
        y = (x * tl.load(c_ptr + at, mask=mask).to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + at, y, mask=mask)
    else:              # a lane's 4 elements in turn, BLOCK // 4 apart, as PyTorch's thread steps
        lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK // 4)
        wait = tl.zeros([BLOCK // 4], dtype=tl.int32)
        for i in tl.static_range(4):
            offs = lane + i * (BLOCK // 4)
            mask = offs < n
            at = offs * one + wait                  # waits for the last element's values
            x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
            y = (x * tl.load(c_ptr + at, mask=mask, other=0.0).to(tl.float32))
            tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)
            wait = x.to(tl.int32, bitcast=True) * zero      # 0, known only at run time


def multiply(x: torch.Tensor, c: torch.Tensor, out: torch.Tensor, mode: str) -> torch.Tensor:
    """out = x * c (contiguous, one shape) by `_mul_kernel` in `mode` (a key of MODES)."""
    if not (x.is_contiguous() and c.is_contiguous() and out.is_contiguous()
            and x.shape == c.shape == out.shape):
        raise ValueError("x, c and out: contiguous tensors of one shape")
    n = x.numel()
    row = x.shape[-1] if x.dim() else 1
    _mul_kernel[(triton.cdiv(n, BLOCK),)](x, c, out, n, 1, 0, row, row, BLOCK=BLOCK,
                                          MODE=MODES[mode], num_warps=NUM_WARPS)
    return out


def access_code(dtype: torch.dtype = torch.bfloat16, kernel=None, *, modes: dict = MODES,
                block: int = BLOCK, num_warps: int = NUM_WARPS) -> dict:
    """Per mode, `kernel` (by default `_mul_kernel`; notebook 02 passes its own copy, launched
    with its own `modes`, `block` and `num_warps`) compiled for sm_90 as `multiply` launches
    it, read back:
    {"per_thread": elements a thread holds in a run (the layout's sizePerThread), "loads" and
    "stores": Counters of the PTX's global access instructions, "divisions": its div/rem,
    "order": its global loads (L) and stores (S) in the order the PTX lists them}."""
    kernel = _mul_kernel if kernel is None else kernel
    t = torch.empty(1024, dtype=dtype)
    out = {}
    for name, mode in modes.items():
        code = compiled_code(kernel, dict(x_ptr=t, c_ptr=t, y_ptr=t, n=1 << 26, one=1, zero=0,
                                          row=128, row_stride=128, BLOCK=block, MODE=mode),
                             num_warps=num_warps)
        ptx = code["ptx"]
        out[name] = {
            "per_thread": int(re.search(r"sizePerThread = \[(\d+)\]", code["ttgir"]).group(1)),
            "loads": Counter(re.findall(r"\bld\.global(?:\.\w+)+", ptx)),
            "stores": Counter(re.findall(r"\bst\.global(?:\.\w+)+", ptx)),
            "divisions": len(re.findall(r"\b(?:div|rem)\.\w+", ptx)),
            "order": "".join("L" if a == "ld" else "S"
                             for a in re.findall(r"\b(ld|st)\.global\.", ptx))}
    return out
