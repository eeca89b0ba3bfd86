"""Notebook 11's exercises 1 and 3 (`my_dual_chunk_positions`, `my_paged_slot`) hand every answer
to their check, a blank one too, as the course's other exercises do. Their cells, run as the
notebook has them (each in a file of its own, with the notebook's names): blank, the check prints
❌ with what to write and the cell raises nothing; with the worked solution's body typed in, ✅;
with a body that calls ropelib's own function, ❌."""
import inspect
import textwrap
from pathlib import Path

import pytest
import torch

jupytext = pytest.importorskip(
    "jupytext", reason="the notebook checks need the lab extras: pip install -e '.[lab]'")

import ropelib  # noqa: E402
from ropelib import context_parallel, kv_cache  # noqa: E402
from ropelib.course.exercises import at_scale  # noqa: E402
from loading import written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "11-rope-at-scale.py"
BLANK = "    ...  # your code\n"
NAMES = {"torch": torch, "ropelib": ropelib, "kv_cache": kv_cache, "cp": context_parallel,
         "ex": at_scale}

# exercise: (the learner's function, the worked solution, its ❌ line's first words, what the
#            blank answer's line says to write, a body calling ropelib, the function it names)
EXERCISES = {
    "1 dual-chunk positions": (
        "my_dual_chunk_positions", at_scale.solution_dual_chunk_positions,
        "❌ dual-chunk positions", "code that returns the list of the seq_len / cp_size global "
        "positions rank cp_rank holds",
        "    return cp.dual_chunk_positions(seq_len // cp_size, cp_size, cp_rank).tolist()\n",
        "ropelib's dual_chunk_positions"),
    "3 paged slot": (
        "my_paged_slot", at_scale.solution_paged_slot, "❌ paged slot",
        "code that returns (block, offset)",
        "    rows, slots = kv_cache.cache_slots(torch.tensor([position]), 1,\n"
        "                                       torch.tensor([block_table_row]), block_size)\n"
        "    return int(rows[0, 0]), int(slots[0, 0])\n",
        "ropelib's cache_slots"),
}


def _cell(name: str) -> str:
    """The notebook's code cell that defines `name` and checks it."""
    cells = [c.source for c in jupytext.read(NOTEBOOK).cells
             if c.cell_type == "code" and f"def {name}(" in c.source]
    assert len(cells) == 1, (name, len(cells))
    return cells[0] + "\n"


def _body(solution) -> str:
    """The worked solution's body, as a learner types it in place of the `...`."""
    lines = textwrap.dedent(inspect.getsource(solution)).splitlines(keepends=True)
    return "".join(lines[1:])


def _run(tmp_path, label: str, source: str, capsys) -> str:
    """The cell run from a file of its own, with the notebook's names; what it printed."""
    written_module(f"nb11_{label}", tmp_path / f"nb11_{label}.py", source, dict(NAMES))
    return capsys.readouterr().out


@pytest.mark.parametrize("exercise", list(EXERCISES))
def test_the_cell_hands_every_answer_to_its_check(exercise, tmp_path, capsys):
    name, solution, cross, to_write, library_body, library_name = EXERCISES[exercise]
    cell = _cell(name)
    assert BLANK in cell and "is None" not in cell, cell   # no skip of a blank answer
    assert cell.rstrip().endswith(f"ex.check_{name[len('my_'):]}({name});"), cell

    out = _run(tmp_path, "blank", cell, capsys)             # as the notebook ships it
    assert out.startswith(cross) and "✅" not in out, out
    assert "returned None" in out and to_write in out, out

    out = _run(tmp_path, "worked", cell.replace(BLANK, _body(solution)), capsys)
    assert out.startswith(f"✅ {cross[2:]}: correct"), out

    out = _run(tmp_path, "library", cell.replace(BLANK, library_body), capsys)
    assert out.startswith(cross) and library_name in out and "write it yourself" in out, out


def test_the_decode_step_count_reads_the_notebooks_device():
    # the kernel count's GPU branch follows the device the notebook picked at its top
    # (a GPU under TRITON_INTERPRET=1 runs the interpreter's branch, on the CPU)
    source = NOTEBOOK.read_text(encoding="utf-8")
    assert source.count("device = ropelib.default_device()") == 1
    flags = [line for line in source.splitlines() if line.startswith("GPU =")]
    assert flags == [flags[0]] and flags[0].startswith('GPU = device == "cuda"'), flags
