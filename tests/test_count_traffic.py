"""Notebook 02's CountTraffic: the bytes each ATen op reads and writes, views skipped.

The class is the notebook's own code cell, compiled here from notebooks/02-*.py, so what these
tests check is what the learner reads and runs. Views must count nothing; in-place ops (`mul_`)
count their destination as read and written; `out=` arguments and the destinations of `copy_`,
`fill_` and `zero_` as written only.
"""
import ast
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ropelib import reference
from ropelib.frequencies import rope_freqs

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02-pytorch-reference-and-layouts.py"


def notebook_class(name: str = "CountTraffic"):
    """The class `name` as notebook 02 defines it, compiled from its source."""
    source = NOTEBOOK.read_text(encoding="utf-8")
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name]
    namespace = {"torch": torch, "TorchDispatchMode": TorchDispatchMode, "tree_leaves": tree_leaves}
    exec(compile(ast.Module([node], type_ignores=[]), str(NOTEBOOK), "exec"), namespace)
    return namespace[name]


CountTraffic = notebook_class()
N = 1024                        # elements of each test tensor
F32 = N * 4                     # bytes of one fp32 tensor of N elements


def count(fn):
    with CountTraffic() as counted:
        fn()
    return counted.ops


def test_views_move_nothing():
    a = torch.randn(32, 32)
    assert count(lambda: (a.t(), a.view(-1), a[1:], a[:, ::2], a.unsqueeze(0).expand(4, 32, 32),
                          a.chunk(2), a.split(8), a.detach(), a.transpose(0, 1))) == []


def test_an_op_that_makes_a_tensor_reads_its_inputs_and_writes_it():
    a, b = torch.randn(N), torch.randn(N)
    assert count(lambda: a * b) == [("mul", 2 * F32, F32)]
    assert count(lambda: a.to(torch.bfloat16)) == [("_to_copy", F32, N * 2)]
    # two outputs: the values (fp32) and the indices (int64) of a max over 32 rows of 32
    m = torch.randn(32, 32)
    assert count(lambda: torch.max(m, 0)) == [("max", 32 * 32 * 4, 32 * 4 + 32 * 8)]


def test_in_place_ops_read_and_write_their_destination():
    a, b = torch.randn(N), torch.randn(N)
    assert count(lambda: a.mul_(b)) == [("mul_", 2 * F32, F32)]
    assert count(lambda: a.add_(1.0)) == [("add_", F32, F32)]
    # no return value: the schema's written arguments are what is written
    assert count(lambda: torch._foreach_mul_([a, b], 2.0)) == [("_foreach_mul_", 2 * F32, 2 * F32)]
    # an in-place op on a view writes the viewed elements only
    assert count(lambda: a[: N // 2].mul_(2.0)) == [("mul_", F32 // 2, F32 // 2)]


def test_out_arguments_and_overwrites_are_written_not_read():
    a, b, c = torch.randn(N), torch.randn(N), torch.empty(N)
    assert count(lambda: torch.mul(a, b, out=c)) == [("mul", 2 * F32, F32)]
    assert count(lambda: c.copy_(a)) == [("copy_", F32, F32)]
    assert count(lambda: c.zero_()) == [("zero_", 0, F32)]
    assert count(lambda: c.fill_(3.0)) == [("fill_", 0, F32)]


def test_a_copy_then_an_in_place_op_counts_both():
    # y = x * 2 as a new tensor, or as a copy then an in-place multiply: the second moves a copy
    # more, and a count that skipped in-place ops would have it move less
    x = torch.randn(N)
    fresh = count(lambda: x * 2.0)
    copied = count(lambda: x.clone().mul_(2.0))
    assert sum(r + w for _, r, w in fresh) == 2 * F32
    assert sum(r + w for _, r, w in copied) == 4 * F32


def test_te_unfused_forward_and_backward_as_the_notebook_counts_them():
    x = torch.randn(64, 2, 4, 32, dtype=torch.bfloat16)
    f = rope_freqs(64, 32)
    x_bytes = x.numel() * x.element_size()
    fwd = count(lambda: reference.te_unfused(x, f))
    assert [op for op, _, _ in fwd] == ["cos", "_to_copy", "sin", "_to_copy", "mul", "neg", "cat",
                                        "mul", "add", "cat"]
    # the multiplies read x (or its rotated half) and the bf16 table, and write a tensor of x's size
    table_bf16 = f.numel() * 2
    assert fwd[4] == ("mul", x_bytes + table_bf16, x_bytes)
    assert fwd[5] == ("neg", x_bytes // 2, x_bytes // 2)
    assert fwd[8] == ("add", 2 * x_bytes, x_bytes)
    xg = x.clone().requires_grad_()
    y = reference.te_unfused(xg, f)
    dy = torch.randn_like(y)
    with CountTraffic() as bwd:
        y.backward(dy)
    assert [op for op, _, _ in bwd.ops] == ["mul", "neg", "cat", "mul", "add", "slice_backward",
                                            "add"]
    assert bwd.ops[5] == ("slice_backward", 0, x_bytes)   # zeros the size of x, nothing read
