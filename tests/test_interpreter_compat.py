"""Triton's interpreter under NumPy versions that refuse int() of an array of shape [1]:
ropelib.runtime installs Triton 3.9's conversion of a scalar tensor to an index, so kernels
whose loops run between scalar tensors (every batch loop of ropelib's) run under Triton 3.6's
interpreter too (the GPU machines' Triton)."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from ropelib import runtime


def _numpy_refuses_shape_1():
    try:
        int(np.zeros(1, dtype=np.int32))
        return False
    except TypeError:
        return True


@triton.jit
def _sum_between(out_ptr, B, CHUNK: tl.constexpr):
    # a batch loop as ropelib's kernels write it: bounds are scalar tensors, the first peeled
    lo = tl.program_id(0) * CHUNK
    hi = tl.minimum(lo + CHUNK, B)
    acc = lo
    for b in range(lo + 1, hi):
        acc += b
    tl.store(out_ptr + tl.program_id(0), acc)


@pytest.mark.skipif(not runtime.INTERPRET, reason="the interpreter's conversion only")
def test_scalar_tensors_index_a_loop():
    out = torch.zeros(3, dtype=torch.int32)
    _sum_between[(3,)](out, 7, CHUNK=3)
    assert out.tolist() == [0 + 1 + 2, 3 + 4 + 5, 6]
    if _numpy_refuses_shape_1():
        from triton.runtime import interpreter
        assert getattr(interpreter._patch_lang_tensor, "ropelib_index", False)
