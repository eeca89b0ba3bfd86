"""ropelib/course/nb09_kernel_names.py: notebook 09's kernel-name classifiers, one module.

The four classifiers the notebook's appendix cells defined (A.2's kernel_kind, A.3's kind, op_of
and group_of) are kept below as they were; every kernel name of the committed profile
(figures/09-step-kernels.csv), of the committed Nsight Compute run the notebook reads, of exercise
1's made-up steps and every aten op one layer of the reference's RoPE runs must be classified by
the module exactly as they classified it."""
import ast
import csv
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ropelib import reference
from ropelib.course import nb09_kernel_names as kn
from ropelib.course.exercises import in_a_model
from ropelib.frequencies import rope_cos_sin

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"
NCU_CSV = ROOT / "benchmarks" / "results" / "contiguous_ncu-nvidia-h200.csv"


# --- the notebook's classifiers as they were, before they moved into the module ----------------
def _old_kernel_kind(name):
    """A CUDA kernel's name by what it does: rope, mul, neg, add, cat, cast, fill or other."""
    for part, k in (("rope", "rope"), ("BinaryFunctor", "mul"), ("MulFunctor", "mul"),
                    ("neg_kernel", "neg"), ("AddFunctor", "add"), ("CUDAFunctor_add", "add"),
                    ("CatArray", "cat"), ("copy", "cast"), ("Fill", "fill")):
        if part in name:
            return k
    return "other"


def _old_kind(name):                     # an aten op's name or a CUDA kernel's, by kind
    return ("cat" if "cat" in name.lower() else "fill" if ("Fill" in name or "slice_backward"
            in name) else "elementwise")


def _old_op_of(name):                    # the aten op a CUDA kernel of RoPE's chain comes from
    for part, op in (("BinaryFunctor", "mul"), ("neg_kernel", "neg"), ("direct_copy", "upcast"),
                     ("bfloat16_copy", "downcast"), ("CUDAFunctor_add", "add"),
                     ("CatArray", "cat"), ("Fill", "slice_backward")):
        if part in name:
            return op
    raise ValueError(name)


def _old_group_of(name):                # PyTorch's generic path, or its vectorised ones
    return ("elementwise_kernel<128>" if "elementwise_kernel<128" in name
            else "CatArrayBatchedCopy<" if "CatArrayBatchedCopy<" in name
            else "vectorised or unrolled")


# --- the names -----------------------------------------------------------------------------------
def _committed_steps():
    meta, steps = in_a_model.step_kernels()
    assert steps, "figures/09-step-kernels.csv is missing"
    return meta, steps


def _aten_ops_of_one_layer():
    """The aten ops (name, not views) one layer's reference RoPE runs forward and backward, on meta
    tensors as appendix A.3 counts them."""
    names = []

    class _Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    q, k = (torch.empty(2, 8, 2, 16, dtype=torch.bfloat16, device="meta", requires_grad=True)
            for _ in range(2))
    cos, sin = (t.to("meta")[:, None, :] for t in rope_cos_sin(8, 16))
    grads = [torch.empty_like(q), torch.empty_like(k)]          # made outside: not RoPE's ops
    with _Names():
        out = [reference.apply_rope_ref(t.float(), cos, sin).to(t.dtype) for t in (q, k)]
        torch.autograd.backward(out, grads)
    return names


def _ncu_names():
    with open(NCU_CSV, encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return sorted({r["Kernel Name"] for r in rows})


def _exercise_names():
    """The names exercise 1's checks make up (another library's RoPE, torch.compile's fused one)."""
    made_up = [in_a_model._GEMM, in_a_model._ATTN_FWD, in_a_model._ATTN_BWD,
               in_a_model._LAYERNORM, in_a_model._ADAMW, in_a_model._MUL, in_a_model._CAT,
               in_a_model._COMPILED_ROPE]
    # and names on the tables' edges: case, order, a fragment inside another, no name at all
    edges = ["_rope_kernel", "rotary_embedding_kernel", "Rope_kernel", "copy_kernel",
             "CatArrayBatchedCopy_vectorized<x>", "AddFunctor_copy", "slice_backward_Fill", ""]
    return made_up + edges


def _all_names():
    _, steps = _committed_steps()
    step_names = sorted({name for events in steps.values() for name, _ in events})
    return step_names + _ncu_names() + _exercise_names() + sorted(set(_aten_ops_of_one_layer()))


def _same(new, old, name):
    try:
        expected = ("value", old(name))
    except ValueError as e:
        expected = ("ValueError", str(e))
    try:
        got = ("value", new(name))
    except ValueError as e:
        got = ("ValueError", str(e))
    return got == expected


@pytest.mark.parametrize("new, old", [
    (kn.kernel_kind, _old_kernel_kind), (kn.chain_kind, _old_kind), (kn.chain_op, _old_op_of),
    (kn.kernel_group, _old_group_of)], ids=["kernel_kind", "kind", "op_of", "group_of"])
def test_the_module_classifies_every_name_as_the_notebooks_classifiers_did(new, old):
    names = _all_names()
    assert len(names) > 80                  # the committed step's 64 names and more
    differ = [n for n in names if not _same(new, old, n)]
    assert not differ, differ[:3]


def test_the_committed_steps_kernels_read_as_the_notebook_states():
    """The counts appendix A.2 and A.3 assert, from the committed step through the module."""
    _, steps = _committed_steps()
    launched = {rope: Counter(name for name, _ in events) for rope, events in steps.items()}
    only_ref = launched["reference"] - launched["ropelib"]
    assert dict(launched["ropelib"] - launched["reference"]) == {"_rope_kernel": 12}
    assert kn.kernel_kind("_rope_kernel") == "rope"
    assert dict(Counter(kn.kernel_kind(n) for n in only_ref.elements())) == {
        "cast": 48, "mul": 48, "cat": 36, "add": 36, "neg": 24, "fill": 12}
    assert Counter(kn.chain_kind(n) for n in only_ref.elements()) == {
        "elementwise": 156, "cat": 36, "fill": 12}
    assert Counter(kn.chain_op(n) for n in only_ref.elements()) == {
        "mul": 48, "neg": 24, "upcast": 24, "downcast": 24, "add": 36, "cat": 36,
        "slice_backward": 12}
    groups = Counter(kn.kernel_group(n) for n in only_ref.elements())
    assert groups == {"elementwise_kernel<128>": 84, "CatArrayBatchedCopy<": 24,
                      "vectorised or unrolled": 96}


def test_the_aten_ops_of_one_layer_count_as_their_kernels():
    """Per kind, a layer's aten ops and the kernels of the committed step agree (A.3's check)."""
    meta, steps = _committed_steps()
    launched = {rope: Counter(name for name, _ in events) for rope, events in steps.items()}
    only_ref = launched["reference"] - launched["ropelib"]
    n_layer = int(re.search(r"n_layer=(\d+)", meta["config"]).group(1))
    per_layer = Counter(kn.chain_kind(n) for n in _aten_ops_of_one_layer())
    assert Counter({k: n_layer * n for k, n in per_layer.items()}) \
        == Counter(kn.chain_kind(n) for n in only_ref.elements())


def test_a_kernel_outside_the_chain_has_no_op():
    with pytest.raises(ValueError, match="nvjet"):
        kn.chain_op("nvjet_sm90_tst_104x128_64x7_1x2_h_bz_TNN")
    assert kn.kernel_kind("nvjet_sm90_tst_104x128_64x7_1x2_h_bz_TNN") == "other"


def test_the_notebook_defines_no_classifier_of_its_own():
    """Every cell asks the module: none of the four is defined in the notebook any more."""
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert not defined & {"kernel_kind", "kind", "op_of", "group_of", "chain_kind", "chain_op",
                          "kernel_group"}
    assert "from ropelib.course.nb09_kernel_names import" in NOTEBOOK.read_text(encoding="utf-8")
