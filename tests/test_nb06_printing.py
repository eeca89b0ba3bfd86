"""Notebook 06: section 2's learner writes a prediction in a cell of its own before the check
prints the table that answers it, and the notebook's times print in µs."""
import ast
import re
from pathlib import Path

from loading import load_file

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06-backward-pass.ipynb"
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")


def _code_cells():
    return run_notebooks.notebook_code_cells(NOTEBOOK)


def test_the_prediction_is_written_before_the_table_prints():
    cells = _code_cells()
    prediction = [i for i, c in enumerate(cells) if "my_prediction = None" in c]
    table = [i for i, c in enumerate(cells) if "largest error" in c]
    assert len(prediction) == 1 and len(table) == 1, (prediction, table)
    assert prediction[0] < table[0], "the table would answer before the learner predicts"
    # the prediction's cell runs nothing else: one assignment, left at None
    (stmt,) = ast.parse(cells[prediction[0]]).body
    assert isinstance(stmt, ast.Assign) and stmt.targets[0].id == "my_prediction"
    assert isinstance(stmt.value, ast.Constant) and stmt.value.value is None
    assert "my_prediction" in cells[table[0]], "the check compares the table with the prediction"


def test_times_print_in_microseconds_never_us():
    # the unit after a number, a closing brace or parenthesis, a comma: "{t:.1f} us", ", us:"
    us = re.compile(r"[\d}),] us\b|\(us\)")
    hits = [line.strip() for c in _code_cells() for line in c.splitlines() if us.search(line)]
    assert not hits, hits
