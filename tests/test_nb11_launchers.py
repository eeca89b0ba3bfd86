"""Notebook 11's exercise launchers are the course's: each launcher a learner's kernel is started
through in an exercise cell (its grid and arguments) is, comments and docstring aside, the one
the exercise module uses for the worked solution and its own checks. A launcher edited in one
place and not the other would time or check a kernel under another launch than the page says."""
import ast
import copy
import inspect
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from loading import load_file  # noqa: E402
from ropelib.course.exercises import at_scale, nb11_cp_shard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "11-rope-at-scale.ipynb"
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")
LAUNCHERS = {
    "launch_cp_shard": nb11_cp_shard.launch_cp_shard,
    "launch_kv_cache": at_scale.launch_kv_cache,
    "launch_kv_paged": at_scale.launch_kv_paged,
    "launch_fp8_store": at_scale.launch_fp8_store,
}


def _bare(fn: ast.FunctionDef) -> str:
    """The function's code as the interpreter sees it: no docstring, no comments, no
    annotations (the notebook's copies leave the return annotation out)."""
    fn = copy.deepcopy(fn)
    if (fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
            and isinstance(fn.body[0].value.value, str)):
        fn.body = fn.body[1:]
    fn.returns = None
    for arg in fn.args.args + fn.args.kwonlyargs:
        arg.annotation = None
    return ast.dump(ast.fix_missing_locations(fn))


def _notebook_functions() -> dict:
    found = {}
    for source in run_notebooks.notebook_code_cells(NOTEBOOK):
        try:
            tree = ast.parse(source)
        except SyntaxError:       # (a cell with IPython magics: no launcher there)
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in LAUNCHERS:
                found.setdefault(node.name, []).append(node)
    return found


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_the_notebooks_launcher_is_the_exercise_modules(name):
    shown = _notebook_functions().get(name, [])
    assert len(shown) == 1, f"notebook 11 defines {name} {len(shown)} times, expected once"
    module_fn = ast.parse(inspect.getsource(LAUNCHERS[name])).body[0]
    assert _bare(shown[0]) == _bare(module_fn), (
        f"notebook 11's {name} launches otherwise than {LAUNCHERS[name].__module__}.{name}: "
        "make the two the same (grid, arguments, constexprs)")


def test_a_changed_launch_is_caught():
    module_fn = ast.parse(inspect.getsource(at_scale.launch_kv_cache)).body[0]
    edited = ast.parse(inspect.getsource(at_scale.launch_kv_cache)
                       .replace("kernel[(B,)]", "kernel[(B, 2)]")).body[0]
    assert _bare(edited) != _bare(module_fn)
