"""Notebook 08's own wrapper and launcher (section 1's `apply_rotary_pos_emb_triton` and
`launch_repro`) give what the course's `debug.apply_rotary_pos_emb_triton` gives, bit for bit,
for every cause, both layouts: the notebook shows the launch the course helper would make.
Section 4b's `launch_combine` starts `_rope_combine_kernel` as `debugging.launch` does, and
`TeParity` counts the same through it.
"""
import ast
import dataclasses
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401  (the interpreter needs it beside a @triton.jit)

from ropelib import runtime  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.course import nb08_te_parity as tp  # noqa: E402
from ropelib.course.exercises import debugging as ex  # noqa: E402
from ropelib.kernels.common import BF16_RTNE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "08-debugging-allclose.py"
NAMES = ("launch_repro", "apply_rotary_pos_emb_triton", "launch_combine")


def _notebook_functions() -> dict:
    text = NOTEBOOK.read_text(encoding="utf-8")
    nodes = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in NAMES]
    assert sorted(n.name for n in nodes) == sorted(NAMES), "the notebook defines both, once"
    namespace = {"debug": debug, "triton": triton, "torch": torch, "REPRO": debug.REPRO,
                 "BF16_RTNE": BF16_RTNE, "_rope_combine_kernel": ex._rope_combine_kernel}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(NOTEBOOK), "exec"), namespace)
    return {name: namespace[name] for name in NAMES}


NB = _notebook_functions()
FLAGS = [f.name for f in dataclasses.fields(debug.Causes)]
CASES = ([("REPRO", debug.REPRO), ("FIXED", debug.FIXED)] +
         [(f"FIXED+{f}", dataclasses.replace(debug.FIXED, **{f: not getattr(debug.FIXED, f)}))
          for f in FLAGS if f != "sincos_in_kernel"])


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
@pytest.mark.parametrize("name,causes", CASES, ids=[c[0] for c in CASES])
def test_the_notebooks_wrapper_is_the_courses(name, causes, layout):
    sc = debug.Scenario(seq_len=8, batch=2, heads=2, head_dim=8, layout=layout)
    device = runtime.default_device()
    mine = debug.reproduce(sc, causes, device=device, wrapper=NB["apply_rotary_pos_emb_triton"])
    course = debug.reproduce(sc, causes, device=device)
    assert torch.equal(mine.tokens_triton, course.tokens_triton)
    assert torch.equal(mine.tokens_te, course.tokens_te)   # in-place writes included


def test_the_notebooks_launcher_is_the_courses():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 2, 8, generator=g).bfloat16().to(runtime.default_device())
    ang = torch.rand(3, 4, generator=g).to(x.device)
    for kw in (dict(from_angles=True, compute_fp32=True),
               dict(compute_fp32=False, use_fma=False), dict(compute_fp32=True, use_fma=True)):
        cos, sin = (ang, None) if kw.get("from_angles") else (ang.cos(), ang.sin())
        a = NB["launch_repro"](x.clone(), cos, sin, seq_len=3, **kw)
        b = debug.rope_unsloth_repro(x.clone(), cos, sin, seq_len=3, **kw)
        assert torch.equal(a, b), kw


@triton.jit
def _as_written(x1, x2, c, s):
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    return y1, y2


def test_the_notebooks_combine_launcher_is_the_courses():
    g = torch.Generator().manual_seed(2)
    dev = runtime.default_device()
    x = torch.randn(5, 2, 3, 16, generator=g).bfloat16().to(dev)     # 30 rows: a partial block
    ang = (torch.rand(5, 8, generator=g) * 6).to(dev)
    cos, sin = ang.cos(), ang.sin()
    for kw in (dict(sincos="table"), dict(sincos="table", block_rows=16),
               dict(sincos="tl", enable_fp_fusion=False)):
        for kernel in (None, ex._rope_combine_kernel):   # None: the notebook's global, at call time
            a = NB["launch_combine"](kernel, _as_written, x, ang, cos, sin, **kw)
            b = ex.launch(ex._rope_combine_kernel, _as_written, x, ang, cos, sin, **kw)
            assert torch.equal(a, b), kw


def test_te_parity_through_the_notebooks_launcher():
    case = debug.te_bits_case(debug.load_te_bits(debug.te_bits_file()), "nb_cpu_fp32")
    side = {case.key: tp.te_side(case, "cpu", live=False)}
    kw = dict(sincos="table", here_name="CPU, Triton interpreter", te_where="TE's stored output",
              reference_col="NVIDIA H200 run")
    course = tp.TeParity(ex._rope_combine_kernel, side, "cpu", **kw)
    mine = tp.TeParity(None, side, "cpu", launch=NB["launch_combine"], **kw)
    for fn in (_as_written, ex.solution_te_combine):
        a, b = (p.check_bits(case, fn, quiet=True) for p in (mine, course))
        assert a["n"] == b["n"] and torch.equal(a["y"], b["y"])
    assert all(torch.equal(u, v) for u, v in zip(mine.kernel_cos_sin(case, "tl", _as_written),
                                                 course.kernel_cos_sin(case, "tl", _as_written)))


def test_reproduce_refuses_a_wrapper_that_is_not_a_function():
    with pytest.raises(TypeError, match="wrapper must be a function"):
        debug.reproduce(debug.Scenario(seq_len=4, batch=1, heads=1, head_dim=4), wrapper=3)
