"""Notebook 13, puzzle 9: `nb13_table_reuse` runs the given kernel on one table and on a table
per batch entry, beside the worked solution at two tiles. In the interpreter every launch is
right and touches all of x, the tables and y; the one-table launch makes the given kernel's very
loads and the per-entry launch the same number on bytes of their own; both layouts compile to
the same sm_90 code. On the CPU nothing is timed; with a stand-in for the GPU the launches and a
copy of each byte size alternate round by round."""
import pytest
import torch

from ropelib.course import nb13_table_reuse as reuse
from ropelib.course import puzzles as pz

S, B = 32, 8


@pytest.fixture(scope="module")
def small():
    return reuse.launches(S, B, "cpu")


@pytest.fixture(scope="module")
def memories(small):
    return {name: reuse.run_checked(launch) for name, launch in small.items()}


def test_every_launch_is_right_and_touches_every_element(small, memories):
    assert list(small) == [reuse.SOLUTION, reuse.SOLUTION_16, reuse.ONE_TABLE, reuse.PER_ENTRY]
    for name, memory in memories.items():
        assert reuse.touched(memory) == {"x": 1.0, "cos": 1.0, "sin": 1.0, "y": 1.0}, name
        assert not torch.isnan(small[name].y).any()
    nbytes = {n: reuse.touched_bytes(small[n], reuse.touched(m)) for n, m in memories.items()}
    x_and_y, table = 2 * S * B * 128 * 4, 2 * S * 64 * 4
    assert nbytes[reuse.SOLUTION] == nbytes[reuse.ONE_TABLE] == x_and_y + table
    assert nbytes[reuse.PER_ENTRY] == x_and_y + B * table


def test_touched_bytes_refuses_a_tensor_touched_in_part(small):
    with pytest.raises(AssertionError):
        reuse.touched_bytes(small[reuse.SOLUTION], {"x": 1.0, "cos": 0.5, "sin": 1.0, "y": 1.0})


def test_a_wrong_output_is_caught(small):
    """The per-entry tables read with one table's strides: rows of the wrong positions."""
    launch = small[reuse.PER_ENTRY]
    y = torch.full_like(launch.y, float("nan"))
    wrong = reuse.Launch(launch.kernel, launch.grid, (*launch.args[:3], y, S, B, 64, 0),
                         launch.constexprs, launch.inputs, y)
    with pytest.raises(AssertionError):
        reuse.run_checked(wrong)


def test_table_loads_per_layout(memories):
    def most(name, t):
        return int(memories[name].counts(t, "load").max())

    for t in ("cos", "sin"):
        assert most(reuse.ONE_TABLE, t) == B and most(reuse.PER_ENTRY, t) == 1
        assert most(reuse.SOLUTION, t) == most(reuse.SOLUTION_16, t) == 1
        assert (memories[reuse.PER_ENTRY].counts(t, "load") == 1).all()


def test_one_table_makes_the_given_kernels_loads(small, memories):
    """The strided kernel on one table issues the given kernel's accesses, address for address;
    on a table per entry the same number of instructions, no address of a table twice."""
    launch = small[reuse.SOLUTION]
    y = torch.full_like(launch.y, float("nan"))
    given = pz.run_in_checked_memory(pz.given_shared_table_kernel, launch.grid, *launch.args[:3],
                                     y, S, B, inputs=launch.inputs, outputs={"y": y},
                                     **launch.constexprs)
    one = memories[reuse.ONE_TABLE]
    regions = {r.name: r for r in one.regions}
    given_regions = {r.name: r for r in given.regions}

    def offsets(memory, regs):
        return [(o, a.kind, tuple(int(v) - regs[o].base for v in a.addresses))
                for a, o in zip(memory.accesses, memory.owners)]

    assert offsets(one, regions) == offsets(given, given_regions)
    per = memories[reuse.PER_ENTRY]
    assert len(per.accesses) == len(one.accesses)


def test_both_layouts_compile_to_the_same_sm90_code():
    one, per = (reuse.compiled_sm90(layout) for layout in (reuse.ONE_TABLE, reuse.PER_ENTRY))
    assert one["sass"] == per["sass"] and one["instructions"] > 0


def test_on_the_cpu_nothing_is_timed_and_it_says_why(capsys):
    if pz.runtime.on_gpu():
        pytest.skip("on a GPU the launches are timed")
    assert reuse.time_in_rounds({}) is None
    assert "⏱ not timed: needs a GPU" in capsys.readouterr().out


@pytest.fixture
def stand_in(gpu_stand_in):
    """A GPU stood in for (conftest's gpu_stand_in): do_bench's call k returns 10 + k us; the
    launches run in the interpreter on CPU tensors."""
    return gpu_stand_in(lambda k: (10.0 + k) / 1e3).calls


def test_rounds_alternate_launches_and_copies(stand_in, small, memories):
    nbytes = {n: reuse.touched_bytes(small[n], reuse.touched(m)) for n, m in memories.items()}
    out = reuse.time_in_rounds(nbytes, S=S, B=B, device="cpu", rounds=3)
    per_round = len(small) + len(set(nbytes.values()))      # four launches, two copies
    assert len(stand_in) == 3 * per_round
    for j, name in enumerate(small):                          # call k returned 10 + k us
        t = out[name]
        assert t.rounds == tuple(10.0 + r * per_round + j for r in range(3))
        assert t.us == 10.0 + per_round + j and t.nbytes == nbytes[name]
        assert len(t.copy_rounds) == 3 and t.gpu == "a CPU standing in"
    assert out[reuse.SOLUTION].copy_rounds == out[reuse.ONE_TABLE].copy_rounds
    assert out[reuse.PER_ENTRY].copy_rounds != out[reuse.ONE_TABLE].copy_rounds
