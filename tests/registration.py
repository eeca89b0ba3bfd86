"""How ropelib's operators are registered, for the tests (`from registration import ...`: pytest
puts tests/ on the path)."""
import torch
from torch._library.custom_ops import OPDEFS
from torch._subclasses.functional_tensor import FunctionalTensorMode

import ropelib


def assert_registered(*names: str) -> None:
    """Each torch.ops.ropelib.<name> exists. On a GPU it is a triton_op: it decomposes under
    FunctionalTensorMode, so a tracer (torch.compile) runs its body and meets the Triton kernel
    through wrap_triton. In the interpreter it is an opaque custom_op with no decomposition (its
    kernel runs as Python on CPU tensors).

    (torch._library.triton.get_triton_kernels_for_op, which reads an op's source for kernels,
    is best effort and differs between torch versions: it found none of ropelib's kernels,
    which start through one helper, with torch 2.11 on an H200.)"""
    for name in names:
        assert hasattr(torch.ops.ropelib, name), name
        decomposes = FunctionalTensorMode in OPDEFS[f"ropelib::{name}"]._torch_dispatch_fns
        assert decomposes == (not ropelib.INTERPRET), (name, decomposes)
