"""The kernel code notebooks 02-06, 08 and 10 show inline is the code ropelib runs.

A notebook shows a ropelib object's source in a markdown cell, so it can be read without running
anything:

    <!-- ropelib-source: ropelib.course.kernels.naive._rope_naive_kernel -->
    ```python
    @triton.jit
    def _rope_naive_kernel(
    ...
    ```

The marker names the object; the fenced block right after it must equal
`inspect.getsource(object)` (for a `@triton.jit` kernel, of the Python function it wraps). The
notebook's code cells must import that object from ropelib, so what runs is what is shown.

A runnable copy is a code cell that starts with the marker as a comment and holds the source
after it, so the learner can edit and launch it (notebook 03's last kernel step):

    # ropelib-source: ropelib.course.kernels.naive._rope_naive_kernel
    @triton.jit
    def _rope_naive_kernel(
    ...

When a kernel changes, refresh every shown copy and rebuild the .ipynb files:

    python tests/test_notebook_kernels_same.py && jupytext --sync notebooks/0[345]-*.py
"""
import importlib
import inspect
import os
import re
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
# Each notebook and the ropelib objects it must show.
REQUIRED = {
    # (02 launches its copy with its own `launch_mul`, as nb02_narrow_loads.multiply does)
    "02-pytorch-reference-and-layouts": ["ropelib.course.nb02_narrow_loads._mul_kernel"],
    # (03's launcher is its own `my_rope_naive`, checked bit for bit against rope_naive there)
    "03-naive-triton-kernel": ["ropelib.course.kernels.naive._rope_naive_kernel",
                               "ropelib.course.kernels.pair_swap._pair_swap_kernel",
                               "ropelib.course.kernels.pair_swap.pair_swap"],
    "04-batch-reuse-grid-kernel": ["ropelib.course.kernels.batch_reuse._rope_batch_reuse_kernel",
                                   "ropelib.course.kernels.ablation._rotate_tile",
                                   "ropelib.course.kernels.ablation._rope_ablation_kernel"],
    # (05 prints the part of ropelib.kernels.flat._rotate_pairs it discusses, from the source)
    "05-finished-kernel": [],
    "06-backward-pass": ["ropelib.course.kernels.batch_reuse._rope_batch_reuse_kernel"],
    "08-debugging-allclose": ["ropelib.course.exercises.debugging._rope_combine_kernel"],
    "10-multi-axis-rope": ["ropelib.kernels.mrope._mrope_cos_sin",
                           "ropelib.kernels.mrope._mrope_kernel",
                           "ropelib.kernels.mrope._rotate_segment",
                           "ropelib.kernels.mrope._rotate_heads",
                           "ropelib.course.exercises.multi_axis.launch_mrope"],
    # (11's comparison kernel and its launcher, each a runnable copy the timing cell uses)
    "11-rope-at-scale": ["ropelib.course.nb11_program_code.cs_table_kernel",
                         "ropelib.course.nb11_program_code.launch_cs_table"],
}
MARKER = re.compile(r"<!--\s*ropelib-source:\s*([\w.]+)\s*-->")
CODE_MARKER = re.compile(r"\A# ropelib-source: ([\w.]+)\n")
FENCE = re.compile(r"```python\n(.*?)\n```", re.S)


def resolve(dotted: str):
    """ropelib.course.kernels.naive._rope_naive_kernel -> the object (module path, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {dotted}")


def source_of(dotted: str) -> str:
    obj = resolve(dotted)
    fn = getattr(obj, "fn", obj)  # a triton JITFunction wraps the Python function in .fn
    return inspect.getsource(fn).rstrip("\n")


def shown_sources(cells):
    """[(dotted name, shown code)] for every marker in the markdown cells."""
    found = []
    for cell_type, text in cells:
        if cell_type == "code":
            m = CODE_MARKER.match(text)
            if m:  # a runnable copy: the rest of the cell is the source
                found.append((m.group(1), text[m.end():].strip("\n")))
            continue
        if cell_type != "markdown":
            continue
        for m in MARKER.finditer(text):
            fence = FENCE.search(text, m.end())
            between = text[m.end():fence.start()] if fence else ""
            if fence is None or between.strip():
                raise AssertionError(f"marker for {m.group(1)} is not followed by a ```python block")
            found.append((m.group(1), fence.group(1)))
    return found


def notebook_cells(path: Path):
    import jupytext
    nb = jupytext.read(path, fmt="py:percent" if path.suffix == ".py" else None)
    return [(c.cell_type, c.source) for c in nb.cells]


def _diff(shown: str, actual: str, name: str) -> str:
    import difflib
    return "\n".join(difflib.unified_diff(shown.splitlines(), actual.splitlines(),
                                          f"{name} (notebook)", f"{name} (ropelib)", lineterm=""))


PAIRS = [(slug, ext) for slug in REQUIRED for ext in (".py", ".ipynb")]


@pytest.mark.parametrize("slug, ext", PAIRS, ids=[f"{s}{e}" for s, e in PAIRS])
def test_shown_kernel_is_ropelibs(slug, ext):
    path = NOTEBOOKS / f"{slug}{ext}"
    assert path.exists(), f"{path} is missing"
    cells = notebook_cells(path)
    shown = shown_sources(cells)
    names = [n for n, _ in shown]
    for required in REQUIRED[slug]:
        assert required in names, f"{path.name} must show {required} (a '<!-- ropelib-source: "\
                                  f"{required} -->' marker and a ```python block)"
    for name, code in shown:
        actual = source_of(name)
        assert code == actual, (f"{path.name} shows a stale copy of {name}; run "
                                f"`python tests/test_notebook_kernels_same.py` and jupytext --sync:\n"
                                + _diff(code, actual, name))
        # ...and the notebook runs that very object: a code cell imports it from its module
        # (a runnable copy is itself the code that runs).
        module, attr = name.rsplit(".", 1)
        runnable = any(k == "code" and CODE_MARKER.match(t) and CODE_MARKER.match(t).group(1) == name
                       for k, t in cells)
        if not runnable and "." in module and not hasattr(importlib.import_module(module), "__path__"):
            imports = [t for k, t in cells if k == "code"
                       and re.search(rf"from\s+{re.escape(module)}\s+import[^\n]*\b{attr}\b", t)]
            assert imports, f"{path.name} shows {name} but no code cell imports it from {module}"


def test_markers_are_found_and_compared():
    # The checker itself: a stale copy is caught, a fresh one passes.
    name = "ropelib.course.kernels.naive._rope_naive_kernel"
    fresh = f"<!-- ropelib-source: {name} -->\n```python\n{source_of(name)}\n```"
    assert shown_sources([("markdown", fresh)]) == [(name, source_of(name))]
    stale = fresh.replace("row = tl.program_id(0)", "row = tl.program_id(1)")
    ((_, code),) = shown_sources([("markdown", stale)])
    assert code != source_of(name)
    # a runnable copy in a code cell is compared the same way
    runnable = f"# ropelib-source: {name}\n{source_of(name)}\n"
    assert shown_sources([("code", runnable)]) == [(name, source_of(name))]
    ((_, code),) = shown_sources([("code", runnable.replace("program_id(0)", "program_id(1)"))])
    assert code != source_of(name)
    assert shown_sources([("code", "x = 1  # ropelib-source: not at the top")]) == []
    with pytest.raises(AssertionError, match="not followed"):
        shown_sources([("markdown", f"<!-- ropelib-source: {name} -->\nprose\n```python\nx\n```")])


def refresh_py_sources() -> None:
    """Rewrite every shown block in notebooks/0[345]-*.py with the current ropelib source."""
    block = re.compile(r"(# <!--\s*ropelib-source:\s*([\w.]+)\s*-->\n# ```python\n)(.*?)(^# ```$)",
                       re.S | re.M)
    # a runnable copy: from its marker to the next cell marker (or the end of the file)
    runnable = re.compile(r"(^# ropelib-source: ([\w.]+)\n)(.*?)(?=^\n*# %%|\Z)", re.S | re.M)
    for slug in REQUIRED:
        path = NOTEBOOKS / f"{slug}.py"
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")

        def fill(m):
            code = "\n".join(("# " + ln) if ln else "#" for ln in source_of(m.group(2)).split("\n"))
            return m.group(1) + code + "\n" + m.group(4)
        new = block.sub(fill, text)
        new = runnable.sub(lambda m: m.group(1) + source_of(m.group(2)) + "\n", new)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"refreshed {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    refresh_py_sources()
