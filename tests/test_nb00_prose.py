"""Notebook 00's prose against what it describes: the set-up it tells a learner to have (README.md,
environment.yml, pyproject.toml) and the sections of other notebooks it sends them to."""
import re
from pathlib import Path

import pytest
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")
NB00 = ROOT / "notebooks" / "00-setup-and-tour.py"


def _markdown(path):
    """The markdown cells of a notebook (its .py or .ipynb path) as one text, one-spaced (a
    phrase may wrap)."""
    return " ".join(run_notebooks.notebook_markdown(path.with_suffix(".ipynb")).split())


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


def _headings(stem):
    py = next((ROOT / "notebooks").glob(f"{stem}-*.py"))
    return [line for line in py.read_text(encoding="utf-8").splitlines()
            if re.match(r"^# #{2,3} |^# \*\*\d\. ", line)]


# what 00's prose says -> (the notebook it points at, the start of the heading it means, words
# the heading must hold)
REFERENCES = [
    ("*two-pass route*: a pre-pass that writes each token's cosine and sine, then a *flat pass* "
     "over the elements (notebook 05, section 6", "05", "# ## 6. ", "two passes for large tensors"),
    ("a row of NaN (notebook 02, section 4)", "02", "# ## 4. ", "Position offsets"),
    ("notebook 03 writes the first in section 3 (3.4 is the version in ropelib)", "03",
     "# ### 3.4 ", "The kernel ropelib ships"),
    ("notebook 03 writes the first in section 3", "03", "# ## 3. ", "The kernel"),
    ("notebook 04 the second in section 2 (2.1 a first version, 2.3 ropelib's)", "04",
     "# ### 2.1 ", "A first kernel"),
    ("2.3 ropelib's", "04", "# ### 2.3 ", "The version in ropelib"),
    ("notebook 04's question (its exercise 3 finds", "04", "# **3. ", "Predict the grid's time"),
    ("notebook 03 (section 4.3) measures it", "03", "# ### 4.3 ",
     "What a program costs when it does nothing"),
    ("and finds in 4.4", "03", "# ### 4.4 ", "Two GPUs"),
    ("Notebook 03 (section 4) takes this apart", "03", "# ## 4. ", "what a program costs"),
    ("notebook 04, appendix A.5", "04", "# ### A.5 ", "DRAM bytes against the model"),
    ("Notebook 04 (sections 2 and 5.3) sets the grid against three floors", "04", "# ### 5.3 ",
     "one factor at a time"),
    ("Little's law (notebook 05, section 2)", "05", "# ## 2. ", "in flight"),
    ("Notebook 07 (optional part A) takes the host's part apart", "07", "# ## A. ",
     "the host against the device"),
]


@pytest.mark.parametrize("said, stem, start, words", REFERENCES, ids=[r[0][:40] for r in REFERENCES])
def test_a_section_00_points_at_exists_and_is_about_what_00_says(said, stem, start, words):
    assert said in _markdown(NB00), f"00 no longer says {said!r}: update REFERENCES"
    found = [h for h in _headings(stem) if h.startswith(start)]
    assert len(found) == 1, (stem, start, found)
    assert words in found[0], (found[0], words)


def test_notebook_04_exercise_3_finds_what_00_says_it_finds():
    # "from b = 4 on neither the grid's programs nor its bytes bound its time"
    assert "from $b = 4$ on neither the grid's programs nor its bytes bound its time" in _markdown(NB00)
    nb04 = _markdown(next((ROOT / "notebooks").glob("04-*.py")))
    assert "From $b = 4$ on it takes" in nb04 and "neither programs nor bytes bound it there" in nb04


def test_the_appendix_00_cites_explains_the_short_writes():
    # 00: the writes come out short, likely lines of y still in L2 when counting stops
    nb04 = _markdown(next((ROOT / "notebooks").glob("04-*.py")))
    assert "the last lines of `y` are still in L2 when the kernel ends" in nb04


def test_the_map_counts_what_notebooks_05_and_13_hold():
    md = _markdown(NB00)
    # 05: two kernels to write on the main path, two optional ones after them
    assert "a 3-D tile kernel and a flat pass of your own (and two optional kernels" in md
    exercises = [h for h in _headings("05") if re.match(r"# #{2,3} Exercise", h)]
    assert [re.match(r"# #{2,3} (Exercise \w+)", h).group(1) for h in exercises] == \
        ["Exercise 1", "Exercise 1b", "Exercise 2", "Exercise 3"]
    assert [("optional" in h) for h in exercises] == [False, True, False, True]
    assert "3-D tile" in exercises[0] and "flat pass" in exercises[2]
    # 13: twelve puzzles (the map's cell counts them); nine from mistakes, one about loads,
    # a capstone needing four of the fixes, as 13's own introduction says
    assert "nine are built on a mistake RoPE code makes" in md and "needs four of the fixes" in md
    nb13 = _markdown(next((ROOT / "notebooks").glob("13-*.py")))
    assert "nine are built on a mistake RoPE code makes" in nb13
    assert "puzzle 9 gives the right output and is about the loads it spends" in nb13
    assert "the capstone, puzzle 12, needs four of the fixes at once" in nb13


def test_notebook_05_measures_the_pre_pass_00_sends_the_reader_to():
    # 00: "A new table every call adds the pre-pass each time (notebook 05, section 6 measures
    # its share)"; 05 says its timings keep the rows, and states the share at 256 MiB and 1 GiB
    assert "notebook 05, section 6 measures its share" in _markdown(NB00)
    nb05 = _markdown(next((ROOT / "notebooks").glob("05-*.py")))
    assert "so the eager route keeps the pre-pass's rows" in nb05
    assert "A table that changes every call pays the pre-pass each time" in nb05


def test_exercise_4_starts_from_the_signature_its_check_and_solution_use():
    from ropelib.course.exercises import nb00_strided_copy
    assert nb00_strided_copy.STRIDED_COPY_SIGNATURE in NB00.read_text(encoding="utf-8")
