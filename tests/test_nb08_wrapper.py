"""Notebook 08's own wrapper and launcher (section 1's `apply_rotary_pos_emb_triton` and
`launch_repro`) give what the course's `debug.apply_rotary_pos_emb_triton` gives, bit for bit,
for every cause, both layouts: the notebook shows the launch the course helper would make.
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

from ropelib import runtime  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.kernels.common import BF16_RTNE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "08-debugging-allclose.py"
NAMES = ("launch_repro", "apply_rotary_pos_emb_triton")


def _notebook_functions() -> dict:
    text = NOTEBOOK.read_text(encoding="utf-8")
    nodes = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in NAMES]
    assert sorted(n.name for n in nodes) == sorted(NAMES), "the notebook defines both, once"
    namespace = {"debug": debug, "triton": triton, "torch": torch, "REPRO": debug.REPRO,
                 "BF16_RTNE": BF16_RTNE}
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


def test_reproduce_refuses_a_wrapper_that_is_not_a_function():
    with pytest.raises(TypeError, match="wrapper must be a function"):
        debug.reproduce(debug.Scenario(seq_len=4, batch=1, heads=1, head_dim=4), wrapper=3)
