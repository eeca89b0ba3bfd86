"""Notebook 00's prose against what it describes: the set-up it tells a learner to have (README.md,
environment.yml, pyproject.toml) and the sections of other notebooks it sends them to."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB00 = ROOT / "notebooks" / "00-setup-and-tour.py"


def _markdown(path):
    """The markdown cells of a percent-format notebook as one text, lines joined (a phrase may
    wrap) and without their leading '# '."""
    words, in_markdown = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            in_markdown = "[markdown]" in line
        elif in_markdown:
            words.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return " ".join(" ".join(words).split())


def test_the_floors_00_states_are_pyprojects():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    python = re.search(r'requires-python = ">=([\d.]+)"', pyproject).group(1)
    torch_ = re.search(r'"torch>=([\d.]+)"', pyproject).group(1)
    triton = re.search(r'"triton>=([\d.]+)"', pyproject).group(1)
    said = f"ropelib needs Python {python}, PyTorch {torch_} and Triton {triton} or newer"
    assert said in _markdown(NB00), said
    # and the reason it gives is the one pyproject.toml and README.md give
    assert "torch.library.triton_op" in pyproject and "triton==3.2.0" in pyproject
    assert f"PyTorch {torch_} or newer" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_set_up_commands_00_names_are_the_projects():
    md = _markdown(NB00)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    env = (ROOT / "environment.yml").read_text(encoding="utf-8")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "## Set up and open the notebooks" in readme and "Set up and open the notebooks" in md
    for command in ("conda env create -f environment.yml", 'pip install -e ".[lab]"',
                    'pip install --no-build-isolation "transformer_engine[pytorch]"'):
        assert command in md and command in readme, command
    # the CPU build of torch first, on a machine without a GPU
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "CPU build of PyTorch first" in md
    # transformers: the `hf` extra, which the conda environment installs too
    assert 'pip install -e ".[hf]"' in md
    assert re.search(r'^hf = \[\s*"transformers",\s*\]', pyproject, re.M)
    assert "-e .[test,hf]" in env
    # Transformer Engine in the conda environment, under the name 00 gives
    assert "`transformer-engine-torch`" in md and "- transformer-engine-torch" in env
