"""What a profiled kernel's name says it does (notebook 09, appendices A.2 and A.3).

A CUDA kernel of PyTorch's elementwise machinery carries its functor or its op in its name
(``elementwise_kernel<128, 2, ...BinaryFunctor<..., MulFunctor<float> >...>``,
``CatArrayBatchedCopy<...>``), so a step's device events can be read by name: which are RoPE's,
which op of the reference's chain each kernel runs, which of PyTorch's paths launched it. Each
question is answered here once (most by an ordered table of name fragments, the first fragment
found in the name deciding) and the notebook's cells and its tests ask it here.

- :func:`kernel_kind`: what a kernel does (``rope``, ``mul``, ``neg``, ``add``, ``cat``,
  ``cast``, ``fill`` or ``other``).
- :func:`chain_kind`: a kernel's name or an aten op's, by what A.3 counts (``cat``, ``fill`` or
  ``elementwise``).
- :func:`chain_op`: the aten op a kernel of the reference's RoPE chain comes from (``mul``,
  ``neg``, ``upcast``, ``downcast``, ``add``, ``cat``, ``slice_backward``); any other kernel is an
  error.
- :func:`kernel_group`: PyTorch's path that launched it (its generic ``elementwise_kernel<128``,
  the ``CatArrayBatchedCopy<`` kernel, or a vectorised or unrolled one).
"""
from __future__ import annotations

KINDS = (("rope", "rope"), ("BinaryFunctor", "mul"), ("MulFunctor", "mul"),
         ("neg_kernel", "neg"), ("AddFunctor", "add"), ("CUDAFunctor_add", "add"),
         ("CatArray", "cat"), ("copy", "cast"), ("Fill", "fill"))
"""(fragment of a kernel's name, its kind), the first found deciding; none found: ``other``."""

CHAIN_OPS = (("BinaryFunctor", "mul"), ("neg_kernel", "neg"), ("direct_copy", "upcast"),
             ("bfloat16_copy", "downcast"), ("CUDAFunctor_add", "add"), ("CatArray", "cat"),
             ("Fill", "slice_backward"))
"""(fragment of a kernel's name, the aten op of the reference's chain it runs): the upcast to
fp32 is a ``direct_copy``, the downcast a ``bfloat16_copy``; the fills are the backward of the
empty pass-through slice ``x[..., R:]``."""

GROUPS = (("elementwise_kernel<128", "elementwise_kernel<128>"),
          ("CatArrayBatchedCopy<", "CatArrayBatchedCopy<"))
"""(fragment of a kernel's name, PyTorch's path); none found: ``vectorised or unrolled``."""


def _first(name: str, table, default):
    for fragment, label in table:
        if fragment in name:
            return label
    return default


def kernel_kind(name: str) -> str:
    """A CUDA kernel's name by what it does: rope, mul, neg, add, cat, cast, fill or other."""
    return _first(name, KINDS, "other")


def chain_kind(name: str) -> str:
    """An aten op's name (``cat.default``, ``slice_backward.default``, ``mul.Tensor``) or a CUDA
    kernel's by kind: ``cat`` (``cat`` in any case), ``fill`` (``Fill`` or ``slice_backward``,
    whose kernel is a fill) or ``elementwise``."""
    if "cat" in name.lower():
        return "cat"
    return "fill" if ("Fill" in name or "slice_backward" in name) else "elementwise"


def chain_op(name: str) -> str:
    """The aten op a CUDA kernel of the reference's RoPE chain comes from; ValueError for a
    kernel that is not one of the chain's."""
    op = _first(name, CHAIN_OPS, None)
    if op is None:
        raise ValueError(name)
    return op


def kernel_group(name: str) -> str:
    """PyTorch's generic path (``elementwise_kernel<128>``), its ``CatArrayBatchedCopy<``, or its
    vectorised or unrolled kernels (``vectorised or unrolled``)."""
    return _first(name, GROUPS, "vectorised or unrolled")
