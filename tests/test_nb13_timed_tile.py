"""Notebook 13 times puzzle 9's worked solution at the tile its appendix found fastest, and the
benchmark that sweeps the tiles labels that tile as the timed case."""
import importlib.util
from pathlib import Path

from ropelib.course import puzzles as pz


def _puzzle_fractions():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "puzzle_fractions.py"
    spec = importlib.util.spec_from_file_location("puzzle_fractions_nb13", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_puzzle9_timed_tile_is_block_s_4_and_the_sweep_labels_it():
    big = pz.PUZZLES["shared_table"].big("meta")
    assert big.constexprs["BLOCK_S"] == 4 and big.grid == (16384 // 4,)
    rows = [row for row, _ in _puzzle_fractions().puzzle9_cases("meta")]
    timed = [(row["block"], row["num_warps"]) for row in rows
             if "(the timed case)" in row["variant"]]
    assert timed == [(4, 4)]
