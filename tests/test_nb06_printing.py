"""Notebook 06: the notebook's times print in µs."""
import json
import re
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06-backward-pass.ipynb"


def _code_cells():
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def test_times_print_in_microseconds_never_us():
    # the unit after a number, a closing brace or parenthesis, a comma: "{t:.1f} us", ", us:"
    us = re.compile(r"[\d}),] us\b|\(us\)")
    hits = [line.strip() for c in _code_cells() for line in c.splitlines() if us.search(line)]
    assert not hits, hits
