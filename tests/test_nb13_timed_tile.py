"""Notebook 13 times puzzle 9's worked solution at the tile its appendix found fastest, and the
benchmark that sweeps the tiles labels that tile as the timed case."""
from loading import ROOT, load_file

from ropelib.course import puzzles as pz


def _puzzle_fractions():
    return load_file("puzzle_fractions_nb13", ROOT / "benchmarks" / "puzzle_fractions.py")


def test_puzzle9_timed_tile_is_block_s_4_and_the_sweep_labels_it():
    big = pz.PUZZLES["shared_table"].big("meta")
    assert big.constexprs["BLOCK_S"] == 4 and big.grid == (16384 // 4,)
    rows = [row for row, _ in _puzzle_fractions().puzzle9_cases("meta")]
    timed = [(row["block"], row["num_warps"]) for row in rows
             if "(the timed case)" in row["variant"]]
    assert timed == [(4, 4)]
