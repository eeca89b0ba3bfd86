"""Notebook 13, puzzle 9: `pz.time_in_rounds` times kernels against each other in alternating
rounds. On the CPU it says why nothing was timed; with a stand-in for the GPU (the interpreter
runs the kernels on the puzzles' small cases, do_bench returns a number per call) it checks each
kernel compiled first, alternates the kernels and a copy of each byte size round by round, and
keeps the median and every round of each."""
import pytest

from loading import puzzles_built_on_the_cpu
from ropelib.course import puzzles as pz

KERNELS = {"given": ("shared_table", pz.given_shared_table_kernel),
           "solution 9": ("shared_table", pz.solution_shared_table_kernel),
           "solution 6": ("position_ids", pz.solution_position_ids_kernel)}


@pytest.fixture
def stand_in(gpu_stand_in, monkeypatch):
    """A GPU stood in for (conftest's gpu_stand_in); every puzzle's cases (and its timed case)
    built on the CPU; do_bench's call k returns 10 + k us."""
    benched = gpu_stand_in(lambda k: (10.0 + k) / 1e3).calls
    puzzles_built_on_the_cpu(monkeypatch, pz)
    return benched


def test_on_the_cpu_nothing_is_timed_and_it_says_why(capsys):
    if pz.runtime.on_gpu():
        pytest.skip("on a GPU the kernels are timed")
    assert pz.time_in_rounds(KERNELS) is None
    assert "⏱ not timed in rounds (" in capsys.readouterr().out


def test_rounds_alternate_kernels_and_copies_and_keep_medians(stand_in, capsys):
    out = pz.time_in_rounds(KERNELS, rounds=3)
    assert "❌" not in capsys.readouterr().out
    assert list(out) == list(KERNELS)
    sizes = {t.nbytes for t in out.values()}
    assert out["given"].nbytes == out["solution 9"].nbytes != out["solution 6"].nbytes
    per_round = len(KERNELS) + len(sizes)               # three kernels, a copy per byte size
    assert len(stand_in) == 3 * per_round
    for r in range(1, 3):                       # the same runs, in the same order, each round
        assert stand_in[r * per_round:(r + 1) * per_round] == stand_in[:per_round]
    assert len(set(map(id, stand_in[:per_round]))) == per_round
    for j, name in enumerate(KERNELS):                  # call k returned 10 + k us
        t = out[name]
        assert t.rounds == tuple(10.0 + r * per_round + j for r in range(3))
        assert t.us == 10.0 + per_round + j             # the median of its three rounds
        assert len(t.copy_rounds) == 3 and t.copy_us == sorted(t.copy_rounds)[1]
        assert t.copy_spread == max(t.copy_rounds) / min(t.copy_rounds) - 1
        assert t.gpu == "a CPU standing in" and t.label == pz.PUZZLES[KERNELS[name][0]].big(
            "cpu").label
    assert out["given"].copy_rounds == out["solution 9"].copy_rounds   # one copy per size


def test_a_kernel_wrong_on_the_gpu_is_not_timed(stand_in, capsys):
    # the forward handed in as the backward: same arguments, rotated the wrong way
    out = pz.time_in_rounds({"forward as backward": ("backward", pz.solution_interleaved_kernel)})
    assert out is None and stand_in == []
    assert "❌ forward as backward: not timed, wrong on the GPU" in capsys.readouterr().out


def test_rounds_line_gives_the_median_and_the_range_of_each_round(stand_in, capsys):
    """Notebook 13's "Where you stand" prints each solution's rounds with pz.rounds_line."""
    out = pz.time_in_rounds(KERNELS, rounds=3)
    capsys.readouterr()
    t = out["solution 9"]
    assert t.round_fractions == tuple(c / k for c, k in zip(t.copy_rounds, t.rounds))
    line = pz.rounds_line("9. one table for the batch", t)
    low, high = min(t.round_fractions), max(t.round_fractions)
    assert line.startswith("9. one table for the batch") and t.label in line
    assert f"{t.us:7.1f} us ({min(t.rounds):.1f}-{max(t.rounds):.1f})" in line
    assert line.endswith(f"{t.of_copy:4.0%} of a copy ({low:.0%}-{high:.0%})")


def test_every_timed_solution_in_rounds_as_where_you_stand_does(stand_in, capsys):
    """The call and the lines of notebook 13's "Where you stand", on the stand-in GPU."""
    timed = [p for p in pz.PUZZLES.values() if p.big is not None]
    out = pz.time_in_rounds({f"{p.number}. {p.title}": (p.key, p.solution) for p in timed},
                            rounds=2)
    assert "❌" not in capsys.readouterr().out
    assert out is not None and len(out) == len(timed) == 11
    lines = [pz.rounds_line(name, t) for name, t in out.items()]
    assert all(line.startswith(f"{p.number}. ") for line, p in zip(lines, timed))
