"""The notebooks' jupytext pairs are in sync, committed without outputs, and listed in the README.

notebooks/NN-slug.py (jupytext percent format) is the source people edit and review;
notebooks/NN-slug.ipynb is what learners open. `jupytext --sync notebooks/NN-slug.py` rebuilds
the .ipynb from the .py (jupytext.toml pairs them); the checks below say which command fixes what.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from loading import load_file  # noqa: E402

jupytext = pytest.importorskip(
    "jupytext", reason="the notebook checks need the lab extras: pip install -e '.[lab]'")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
strip_notebook_outputs = load_file("strip_notebook_outputs", ROOT / "scripts" / "strip_notebook_outputs.py")
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


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _in_git_checkout() -> bool:
    try:
        return _git("rev-parse", "--is-inside-work-tree").stdout.strip() == "true"
    except OSError:  # no git on this machine
        return False


def _committed_text(ipynb: Path) -> str:
    """The notebook as git stores it (the index: what the next commit holds); outside a git
    checkout, the file on disk as git would store it (stripped)."""
    if _in_git_checkout():
        shown = _git("show", f":{ipynb.relative_to(ROOT).as_posix()}")
        if shown.returncode == 0:
            return shown.stdout
    return strip_notebook_outputs.strip_text(ipynb.read_text(encoding="utf-8"))


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_ipynb_is_committed_without_outputs(ipynb):
    """What git holds (or would commit) has no outputs and no session state: it is exactly what
    scripts/strip_notebook_outputs.py makes of it. The copy on disk may hold a learner's outputs."""
    text = _committed_text(ipynb)
    nb = json.loads(text)
    fix = (f"strip it: `python3 scripts/strip_notebook_outputs.py notebooks/{ipynb.name}`, then "
           f"`git add notebooks/{ipynb.name}`")
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs", []) == [], f"{ipynb.name} cell {i} has stored outputs: {fix}"
            assert cell.get("execution_count") is None, f"{ipynb.name} cell {i} has an execution count: {fix}"
        # figures are PNG files in figures/, linked by relative path, never embedded
        assert not cell.get("attachments"), f"{ipynb.name} cell {i} embeds an attachment; link a file in figures/"
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        assert "data:image/" not in source, f"{ipynb.name} cell {i} embeds a base64 image; link a file in figures/"
    assert strip_notebook_outputs.strip_text(text) == text, (
        f"{ipynb.name} is stored with session state (language_info, widget state, cell timings or "
        f"another kernelspec): {fix}")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_outputs_on_disk_cannot_be_committed(ipynb):
    """A notebook run and saved in JupyterLab keeps its outputs on disk; git must then read it
    through the output-stripping filter, so `git status` stays clean and no output is committed."""
    on_disk = ipynb.read_text(encoding="utf-8")
    if strip_notebook_outputs.strip_text(on_disk) == on_disk or not _in_git_checkout():
        return  # nothing on disk that git could pick up by accident (or no git to commit with)
    rel = ipynb.relative_to(ROOT).as_posix()
    attr = _git("check-attr", "filter", "--", rel).stdout.strip()
    assert attr.endswith(": filter: ropelib-notebook"), f".gitattributes does not filter {rel}: {attr!r}"
    clean = _git("config", "filter.ropelib-notebook.clean").stdout.strip()
    assert clean, (
        f"{ipynb.name} holds outputs from a run, and this clone does not strip them when git reads "
        f"notebooks, so they would be committed: turn the filter on with "
        f"`git config include.path ../.gitconfig` (in the repository root)")


def test_the_strip_filter_gives_back_the_committed_notebook():
    """Outputs, counts, language_info, widget state and a session's cell metadata all go; the
    result is the committed file, byte for byte (what keeps `git status` clean after a run)."""
    ipynb = NOTEBOOKS / "00-setup-and-tour.ipynb"
    committed = _committed_text(ipynb)
    nb = json.loads(committed)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "notebook 00 has no code cell to run"
    for n, cell in enumerate(code, 1):
        cell["execution_count"] = n
        cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": ["ran\n"]}]
        cell["metadata"]["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
        cell["metadata"]["scrolled"] = True
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.12.3"}
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3"
    ran = json.dumps(nb, indent=1)
    assert ran != committed
    assert strip_notebook_outputs.strip_text(ran) == committed
    # as git runs it: the notebook on stdin, the stripped one on stdout
    script = ROOT / "scripts" / "strip_notebook_outputs.py"
    out = subprocess.run([sys.executable, str(script)], input=ran.encode(), capture_output=True,
                         check=True).stdout.decode()
    assert out == committed
    # and what git is told to run is that script
    gitconfig = (ROOT / ".gitconfig").read_text(encoding="utf-8")
    assert "clean = python3 scripts/strip_notebook_outputs.py" in gitconfig
    assert "notebooks/*.ipynb filter=ropelib-notebook" in (ROOT / ".gitattributes").read_text()


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
