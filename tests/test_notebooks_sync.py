"""The notebooks' jupytext pairs are in sync, committed without outputs, and listed in the README.

notebooks/NN-slug.py (jupytext percent format) is the source people edit and review;
notebooks/NN-slug.ipynb is what learners open. `jupytext --sync notebooks/NN-slug.py` rebuilds
the .ipynb from the .py (jupytext.toml pairs them); the checks below say which command fixes what.
"""
import json
import re
from pathlib import Path

import pytest

jupytext = pytest.importorskip(
    "jupytext", reason="the notebook checks need the lab extras: pip install -e '.[lab]'")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAME = re.compile(r"^\d\d-[a-z0-9]+(?:-[a-z0-9]+)*$")  # NN-kebab-slug

PY_SOURCES = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]-*.py"))
IPYNBS = sorted(NOTEBOOKS.glob("*.ipynb"))


def _cells(nb):
    """(cell_type, source) per cell: what a reader sees, without outputs or metadata."""
    return [(cell.cell_type, cell.source.strip("\n")) for cell in nb.cells]


def test_there_are_notebooks():
    assert PY_SOURCES, f"no notebooks/NN-slug.py sources found in {NOTEBOOKS}"


@pytest.mark.parametrize("py", PY_SOURCES, ids=lambda p: p.stem)
def test_py_source_is_percent_format_and_well_named(py):
    assert NAME.match(py.stem), f"{py.name}: notebooks are named NN-kebab-slug.py"
    text = py.read_text(encoding="utf-8")
    assert "# %%" in text, f"{py.name} has no '# %%' cell markers: not a jupytext percent script"


@pytest.mark.parametrize("py", PY_SOURCES, ids=lambda p: p.stem)
def test_paired_ipynb_has_the_same_cells(py):
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `jupytext --sync notebooks/{py.name}`"
    from_py = _cells(jupytext.read(py, fmt="py:percent"))
    from_ipynb = _cells(jupytext.read(ipynb))
    if from_py == from_ipynb:
        return
    if len(from_py) != len(from_ipynb):
        pytest.fail(
            f"{py.name} has {len(from_py)} cells, {ipynb.name} has {len(from_ipynb)}: "
            f"run `jupytext --sync notebooks/{py.name}` (the newer file wins)"
        )
    first = next(i for i, (a, b) in enumerate(zip(from_py, from_ipynb)) if a != b)
    pytest.fail(
        f"cell {first} differs between {py.name} and {ipynb.name}:\n"
        f"--- .py ({from_py[first][0]}):\n{from_py[first][1][:400]}\n"
        f"--- .ipynb ({from_ipynb[first][0]}):\n{from_ipynb[first][1][:400]}\n"
        f"run `jupytext --sync notebooks/{py.name}` (the newer file wins)"
    )


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_ipynb_has_a_py_source(ipynb):
    assert ipynb.with_suffix(".py").exists(), (
        f"{ipynb.name} has no percent source: run `jupytext --set-formats ipynb,py:percent notebooks/{ipynb.name}`"
    )


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_ipynb_is_committed_without_outputs(ipynb):
    nb = json.loads(ipynb.read_text(encoding="utf-8"))
    fix = (
        f"strip it with `jupytext --sync notebooks/{ipynb.stem}.py` after clearing outputs, or "
        f"`jupyter nbconvert --clear-output --inplace notebooks/{ipynb.name}`"
    )
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs", []) == [], f"{ipynb.name} cell {i} has stored outputs: {fix}"
            assert cell.get("execution_count") is None, f"{ipynb.name} cell {i} has an execution count: {fix}"
        # figures are PNG files in figures/, linked by relative path, never embedded
        assert not cell.get("attachments"), f"{ipynb.name} cell {i} embeds an attachment; link a file in figures/"
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        assert "data:image/" not in source, f"{ipynb.name} cell {i} embeds a base64 image; link a file in figures/"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_ipynb_opens_with_the_python3_kernel(ipynb):
    nb = json.loads(ipynb.read_text(encoding="utf-8"))
    kernel = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    assert kernel == "python3", (
        f"{ipynb.name} asks for kernel {kernel!r}; JupyterLab should open it ready to run: "
        f"`jupytext --set-kernel python3 notebooks/{ipynb.stem}.py && jupytext --sync notebooks/{ipynb.stem}.py`"
    )


def test_readme_lists_exactly_the_notebooks():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"notebooks/(\d\d-[a-z0-9-]+)\.ipynb", readme))
    present = {p.stem for p in PY_SOURCES}
    assert listed == present, (
        f"README.md links notebooks {sorted(listed - present)} that do not exist"
        if listed - present
        else f"README.md does not list notebooks {sorted(present - listed)}"
    )
