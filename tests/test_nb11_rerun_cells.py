"""Notebook 11 after Run All, as a learner has it: every cell run once in order in one IPython
shell (the CPU, Triton's interpreter), then each exercise's cells run again (its check, its worked
solution, and the cell after that uses the result, unless a new section starts in between), as a
learner does who fills in an exercise late. A name a later cell rebinds must not break them.

The same run also draws the figures of committed data (the CSVs in benchmarks/results/); the
committed figures/ copies must be what the notebook draws now."""
import os
import re
from pathlib import Path

import matplotlib
import numpy as np
import pytest

jupytext = pytest.importorskip(
    "jupytext", reason="the notebook checks need the lab extras: pip install -e '.[lab]'")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "11-rope-at-scale.py"
# drawn from committed CSVs only: the same picture on every machine
FROM_COMMITTED_DATA = ("11-cp-gpu-loss.png", "11-cp-bf16-200-steps.png",
                       "11-decode-cache-latency.png")


def _rerun_groups(cells) -> list[list[int]]:
    """Per exercise: the indices of its check cell, its solution cell and the code cell after
    (that one only when no markdown cell between starts a new numbered section)."""
    groups = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or "ex.check_" not in cell.source:
            continue
        group, after = [i], cells[i + 1:]
        code_after = [j for j, c in enumerate(after, i + 1) if c.cell_type == "code"]
        solution_cell, follow_up = code_after[0], code_after[1]
        assert cells[solution_cell].source.startswith("solution("), cells[solution_cell].source
        group.append(solution_cell)
        between = cells[solution_cell + 1:follow_up]
        if not any(re.search(r"^## ", c.source, re.M) for c in between):
            group.append(follow_up)
        groups.append(group)
    return groups


@pytest.fixture(scope="module")
def after_run_all():
    from IPython.core.interactiveshell import InteractiveShell

    matplotlib.use("Agg")
    saved_env = os.environ.pop("ROPELIB_WRITE_FIGURES", None)   # figures to the scratch folder
    cwd = os.getcwd()
    os.chdir(NOTEBOOK.parent)                                    # where Jupyter starts it
    shell = InteractiveShell.instance()
    cells = jupytext.read(NOTEBOOK).cells
    try:
        for i, cell in enumerate(cells):
            if cell.cell_type == "code":
                result = shell.run_cell(cell.source, store_history=False)
                assert result.success, (f"cell {i} failed in Run All: {result.error_in_exec!r}\n"
                                        f"{cell.source[:400]}")
        yield shell, cells
    finally:
        os.chdir(cwd)
        InteractiveShell.clear_instance()
        if saved_env is not None:
            os.environ["ROPELIB_WRITE_FIGURES"] = saved_env


@pytest.mark.slow
def test_every_exercise_runs_again_after_run_all(after_run_all):
    shell, cells = after_run_all
    groups = _rerun_groups(cells)
    assert len(groups) == 6                                      # exercises 1, 1b, 2 to 5
    assert sum(len(g) == 3 for g in groups) == 5                 # exercise 1b ends its section
    # the last exercise first: a cell run again must not rebind, for the next group, a name that
    # a later cell of Run All changed
    for group in reversed(groups):
        for i in group:
            result = shell.run_cell(cells[i].source, store_history=False)
            assert result.success, (f"cell {i} fails when run again after Run All "
                                    f"({result.error_in_exec!r}) "
                                    f"(exercise cells {group}):\n{cells[i].source[:600]}")


@pytest.mark.slow
def test_the_committed_figures_are_what_the_notebook_draws(after_run_all):
    shell, _ = after_run_all
    drawn_dir = Path(shell.user_ns["FIGURES"])
    assert drawn_dir.resolve() != (ROOT / "figures").resolve()
    for name in FROM_COMMITTED_DATA:
        drawn = matplotlib.image.imread(drawn_dir / name)
        committed = matplotlib.image.imread(ROOT / "figures" / name)
        assert drawn.shape == committed.shape, (name, drawn.shape, committed.shape)
        # pixels that differ clearly (anti-aliasing of another font build aside): a redrawn
        # figure has next to none; a figure of other lines or other data a few percent
        off = float((np.abs(drawn - committed).max(axis=-1) > 0.25).mean())
        assert off < 0.002, (f"figures/{name} is not what notebook 11 draws from the committed "
                             f"data ({off:.2%} of its pixels differ): redraw it with "
                             "ROPELIB_WRITE_FIGURES=1")
