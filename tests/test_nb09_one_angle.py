"""Notebook 09, section 9's timing cell: the worked kernel's variant with one angle a pair
(`in_a_model.solution_model_rope_one_angle`) rotates as the worked kernel does at every ROWS the
cell sweeps, and it is a worked solution: an answer to exercise 3 that calls it is refused."""
import ast
import inspect
import os
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

from ropelib import reference  # noqa: E402
from ropelib.course.exercises import in_a_model  # noqa: E402
from ropelib.frequencies import rope_freqs  # noqa: E402
from loading import scratch_folder, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"
_DIR = scratch_folder("ropelib-nb09-one-angle-")


@pytest.mark.parametrize("rows", [4, 16, 64])
def test_one_angle_a_pair_rotates_as_the_worked_kernel(rows):
    B, S, H, D = 2, 5, 3, 16                       # 30 rows: the last program holds fewer
    qkv = torch.randn(B, S, 3, H, D, generator=torch.Generator().manual_seed(rows))
    q = qkv[:, :, 0]                               # strided, as the model's q
    freqs = rope_freqs(S, D).reshape(S, D).contiguous()          # TE's cat(f, f), [S, D]
    want = reference.rope_reference(q, freqs.reshape(S, 1, 1, D), layout="bshd")
    for kernel in (in_a_model.solution_model_rope_kernel,
                   in_a_model.solution_model_rope_one_angle):
        y = torch.full((B, S, H, D), float("nan"))
        in_a_model.launch_model_rope(kernel, q, freqs, y, rows)
        torch.testing.assert_close(y, want, atol=1e-6, rtol=1e-6)


def _calling(target):
    """A kernel of the learner's (named my_...) with exercise 3's parameters whose body only
    calls `target` with them."""
    import triton
    import triton.language as tl
    fn = in_a_model.solution_model_rope_kernel.fn
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    node.name, node.decorator_list = "my_calls_one_angle", []
    node.body = [ast.Expr(ast.Call(func=ast.Name("TARGET", ast.Load()),
                                   args=[ast.Name(a.arg, ast.Load()) for a in node.args.args],
                                   keywords=[]))]
    source = "@triton.jit\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return getattr(written_module(node.name, _DIR / f"{node.name}.py", source,
                                  {"triton": triton, "tl": tl, "TARGET": target}), node.name)


def test_the_one_angle_kernel_is_refused_as_an_answer(capsys):
    assert in_a_model.check_model_rope_kernel(in_a_model.solution_model_rope_one_angle,
                                              seed=0) is False
    out = capsys.readouterr().out
    assert "solution_model_rope_one_angle" in out and "write it yourself" in out, out
    assert in_a_model.check_model_rope_kernel(
        _calling(in_a_model.solution_model_rope_one_angle), seed=0) is False
    out = capsys.readouterr().out
    assert "solution_model_rope_one_angle" in out and "write it yourself" in out, out


def test_the_notebook_sweeps_rows_and_measures_without_the_profiler():
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert 'in_a_model.solution_model_rope_one_angle' in text
    assert "for rows in (4, 16, 64)" in text
    assert "torch.cuda.graph(graph)" in text and "NoRotary()" in text
    assert "autograd.grad" not in text.split("## 5.")[1].split("## 6.")[0]   # no per-call probe
