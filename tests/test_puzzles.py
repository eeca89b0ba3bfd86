"""Notebook 13's puzzles (ropelib.course.puzzles): each worked solution passes its check, each
starting kernel of the notebook fails it for the reason the puzzle is about, an answer that does
nothing (blank, or launched and storing nothing) or calls ropelib's own @triton.jit helpers
fails, and the notebook with the solutions filled in grades
exactly those solutions (every check ✅). The memory layer the checks run kernels in is tested on
its own: faults masked off, virtual rows past 2^31, load counts."""
import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from ropelib.course import puzzles as pz
from ropelib.course.work_count import interpreted
from ropelib.kernels.common import cos_sin, rotate_pair
from loading import written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "13-rope-puzzles.py"
KEYS = list(pz.PUZZLES)

# what each starting kernel of the notebook gets wrong, as the check words it: (the symptom its
# ❌ line states, the diagnosis only pz.hint(n) prints, or None)
STARTER_FAILS_WITH = {
    "rotate_row": ("no kernel yet", None),
    "interleaved": ("no kernel yet", None),
    "partial": ("features 16-31, 48-63", "your partner of feature j is at j + D/2"),
    "odd_head_dim": ("no kernel yet", None),
    "long_context": ("at position", "bf16 values near"),
    "position_ids": ("read no element of any input", None),
    "int64_offsets": ("element offset -2,147,483,520", "a 32-bit offset"),
    "backward": ("no kernel yet", None),
    "shared_table": ("was loaded 4 times", "before the loop over b"),
    "packed_sequences": ("elements differ", "RoPE at each row's index in the packed x"),
    "bf16_table": ("bf16 ulp from the rotation", "eager PyTorch's x * cos + rotate_half(x) * sin"),
    "packed_partial_backward": ("no kernel yet", None),
}


def _hinted(capsys, number: int, out: str) -> str:
    """What pz.hint(number) prints after a failed check whose output was `out`; the diagnoses
    it recognised must not be in that ❌ output (the ❌ line states the symptom only)."""
    pz.hint(number)
    told = capsys.readouterr().out
    assert told.startswith(f"puzzle {number} "), told
    for line in told.splitlines():
        if "what your last check recognised: " in line:
            assert line.split("recognised: ", 1)[1] not in out, (line, out)
    return told


def _notebook_kernels(source: str):
    """{name: (first line, last line)} of the notebook's learner kernels `my_*_kernel`
    (1-based, decorator included)."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and re.fullmatch(r"my_\w+_kernel", node.name):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found[node.name] = (first, node.end_lineno)
    return found


@pytest.fixture(scope="module")
def starters(tmp_path_factory):
    """The notebook's starting kernels, imported from a file holding exactly their source."""
    source = NOTEBOOK.read_text(encoding="utf-8")
    lines = source.splitlines()
    blocks = [("\n".join(lines[a - 1:b])) for a, b in _notebook_kernels(source).values()]
    return written_module("puzzle_starters",
                          tmp_path_factory.mktemp("starters") / "puzzle_starters.py",
                          "import triton\nimport triton.language as tl\n\n\n"
                          + "\n\n\n".join(blocks) + "\n")


def test_the_notebook_has_a_kernel_cell_per_puzzle():
    kernels = _notebook_kernels(NOTEBOOK.read_text(encoding="utf-8"))
    assert sorted(kernels) == sorted(f"my_{k}_kernel" for k in KEYS)
    assert 8 <= len(KEYS) <= 12
    assert [p.number for p in pz.PUZZLES.values()] == list(range(1, len(KEYS) + 1))


def _solution_as_learner(key: str) -> str:
    """The worked solution's source as a learner who typed it into the notebook has it."""
    fn = pz.PUZZLES[key].solution.fn
    src = textwrap.dedent(inspect.getsource(fn))
    return src.replace(f"def {fn.__name__}(", f"def my_{key}_kernel(", 1)


@pytest.fixture(scope="module")
def own_solutions(tmp_path_factory):
    """Every worked solution, copied into a file of the learner's (their own code objects)."""
    return written_module("puzzle_solutions",
                          tmp_path_factory.mktemp("solutions") / "puzzle_solutions.py",
                          "import triton\nimport triton.language as tl\n\n\n"
                          + "\n\n\n".join(_solution_as_learner(k) for k in KEYS) + "\n")


@pytest.mark.parametrize("key", KEYS)
def test_worked_solution_passes(key, own_solutions, capsys):
    p = pz.PUZZLES[key]
    for seed in (0, 1):
        assert pz.grade(p, getattr(own_solutions, f"my_{key}_kernel"), seed=seed,
                        draw=False) is True
        out = capsys.readouterr().out
        assert f"✅ puzzle {p.number} " in out and "❌" not in out, out


@pytest.mark.parametrize("key", KEYS)
def test_handing_in_the_solution_object_fails(key, capsys):
    p = pz.PUZZLES[key]
    assert pz.grade(p, p.solution, seed=0, draw=False) is False
    assert (f"ropelib's {p.solution.fn.__name__} (ropelib/course/puzzles.py)"
            in capsys.readouterr().out)


@pytest.mark.parametrize("key", KEYS)
def test_starting_kernel_fails_for_its_reason(key, starters, capsys):
    kernel = getattr(starters, f"my_{key}_kernel")
    assert pz.grade(pz.PUZZLES[key], kernel, seed=3, draw=False) is False
    out = capsys.readouterr().out
    number = pz.PUZZLES[key].number
    assert out.startswith(f"❌ puzzle {number} "), out
    symptom, diagnosis = STARTER_FAILS_WITH[key]
    assert symptom in out, out
    told = _hinted(capsys, number, out)
    if diagnosis is not None:
        assert diagnosis in told and diagnosis not in out, (out, told)
        assert f"a hint: pz.hint({number})" in out, out


# The bugs puzzles 2, 4 and 8 are built on, as a learner might hand them in (the notebook gives
# those puzzles an empty body): each fails, and the check names the bug.

@triton.jit
def _rotate_half_for_gptj_kernel(x_ptr, theta_ptr, y_ptr, N_ROWS, HALF: tl.constexpr,
                                 BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row + j[None, :], mask=live, other=0.0)  # pair j: features j and j + HALF
    x2 = tl.load(row + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    out = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(out + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(out + HALF + j[None, :], x2 * c + x1 * s, mask=live)


@triton.jit
def _stride_two_interleaved_kernel(x_ptr, theta_ptr, y_ptr, N_ROWS, HALF: tl.constexpr,
                                   BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = rows[:, None] * (2 * HALF)
    x0 = tl.load(x_ptr + row + 2 * j[None, :], mask=live, other=0.0)
    x1 = tl.load(x_ptr + row + 2 * j[None, :] + 1, mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    tl.store(y_ptr + row + 2 * j[None, :], x0 * c - x1 * s, mask=live)
    tl.store(y_ptr + row + 2 * j[None, :] + 1, x1 * c + x0 * s, mask=live)


@triton.jit
def _rows_only_mask_kernel(x_ptr, theta_ptr, y_ptr, N_ROWS, HALF: tl.constexpr,
                           BLOCK_ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, BLOCK_HALF)
    live = rows[:, None] < N_ROWS                         # the lanes j >= HALF are not masked
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(row_y + HALF + j[None, :], x2 * c + x1 * s, mask=live)


@triton.jit
def _backward_forward_kernel(dy_ptr, theta_ptr, dx_ptr, N_ROWS, HALF: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = rows[:, None] * (2 * HALF)
    g1 = tl.load(dy_ptr + row + j[None, :], mask=live, other=0.0)
    g2 = tl.load(dy_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    tl.store(dx_ptr + row + j[None, :], g1 * c - g2 * s, mask=live)    # the forward's formula
    tl.store(dx_ptr + row + HALF + j[None, :], g2 * c + g1 * s, mask=live)


@triton.jit
def _backward_one_sign_kernel(dy_ptr, theta_ptr, dx_ptr, N_ROWS, HALF: tl.constexpr,
                              BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = rows[:, None] * (2 * HALF)
    g1 = tl.load(dy_ptr + row + j[None, :], mask=live, other=0.0)
    g2 = tl.load(dy_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    tl.store(dx_ptr + row + j[None, :], g1 * c + g2 * s, mask=live)    # turned back
    tl.store(dx_ptr + row + HALF + j[None, :], g2 * c + g1 * s, mask=live)  # still +theta


WRITTEN_PUZZLE_BUGS = [
    ("interleaved", _rotate_half_for_gptj_kernel, "that is rotate-half"),
    ("odd_head_dim", _rows_only_mask_kernel, "read no element of any input"),
    ("backward", _backward_forward_kernel, "the rotation by -theta"),
    ("backward", _backward_one_sign_kernel, "flip the sign of its sine term too"),
]


@pytest.mark.parametrize("key, kernel, says", WRITTEN_PUZZLE_BUGS,
                         ids=[k.__name__ for _, k, _ in WRITTEN_PUZZLE_BUGS])
def test_the_bug_a_written_puzzle_is_built_on_fails_for_its_reason(key, kernel, says, capsys):
    assert "    ...  # your code" in NOTEBOOK.read_text(encoding="utf-8").split(
        f"def my_{key}_kernel(", 1)[1].split("pz.check_", 1)[0]           # the notebook's blank
    for seed in (0, 3):
        assert pz.grade(pz.PUZZLES[key], kernel, seed=seed, draw=False) is False
        out = capsys.readouterr().out
        number = pz.PUZZLES[key].number
        assert out.startswith(f"❌ puzzle {number} "), out
        assert says in out + _hinted(capsys, number, out), out


def test_interleaved_passes_with_stride_two_loads_too(capsys):
    """The notebook says puzzle 2 can be solved with stride-2 loads or whole rows."""
    assert pz.check_interleaved(_stride_two_interleaved_kernel, seed=0, draw=False) is True
    assert "✅ puzzle 2 " in capsys.readouterr().out


def _with_library_call(kernel, name: str) -> str:
    """The solution's source, renamed, with a call to ropelib's pair_features at the top."""
    src = textwrap.dedent(inspect.getsource(kernel.fn))
    src = src.replace(f"def {kernel.fn.__name__}(", f"def {name}(", 1)
    lines = src.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("):"))
    lines.insert(end + 1, "    _a, _b = pair_features(tl.arange(0, 2), 1, False)  # ropelib's")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def library_answers(tmp_path_factory):
    blocks = [_with_library_call(p.solution, f"lib_{k}_kernel") for k, p in pz.PUZZLES.items()]
    return written_module("puzzle_library_answers",
                          tmp_path_factory.mktemp("library") / "puzzle_library_answers.py",
                          "import triton\nimport triton.language as tl\n"
                          "from ropelib.kernels.common import pair_features\n\n\n"
                          + "\n\n\n".join(blocks) + "\n")


@pytest.mark.parametrize("key", KEYS)
def test_an_answer_calling_ropelib_fails(key, library_answers, capsys):
    kernel = getattr(library_answers, f"lib_{key}_kernel")
    assert pz.grade(pz.PUZZLES[key], kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "ropelib's pair_features (ropelib/kernels/common.py)" in out, out


def _with_body(kernel, name: str, body: str) -> str:
    """`kernel`'s signature under `name`, with `body` in place of its code."""
    src = textwrap.dedent(inspect.getsource(kernel.fn))
    src = src.replace(f"def {kernel.fn.__name__}(", f"def {name}(", 1)
    lines = src.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("):"))
    return "\n".join(lines[:end + 1] + [f"    {body}"])


@pytest.fixture(scope="module")
def blank_answers(tmp_path_factory):
    """Per puzzle, two answers that do nothing: the notebook's blank body, which the check
    recognises before launching, and a body that stores nothing, which it launches."""
    blocks = [_with_body(p.solution, f"{kind}_{k}_kernel", body)
              for k, p in pz.PUZZLES.items()
              for kind, body in (("blank", "...  # your code"), ("idle", "tl.program_id(0)"))]
    return written_module("puzzle_blank_answers",
                          tmp_path_factory.mktemp("blank") / "puzzle_blank_answers.py",
                          "import triton\nimport triton.language as tl\n\n\n"
                          + "\n\n\n".join(blocks) + "\n")


@pytest.mark.parametrize("key", KEYS)
def test_an_answer_that_does_nothing_fails(key, blank_answers, capsys):
    """Repair puzzles too: a learner who empties the given kernel gets a ❌, not a ✅."""
    number = pz.PUZZLES[key].number
    assert pz.grade(pz.PUZZLES[key], getattr(blank_answers, f"blank_{key}_kernel"), seed=0,
                    draw=False) is False
    out = capsys.readouterr().out
    assert out.startswith(f"❌ puzzle {number} ") and "no kernel yet" in out, out
    assert pz.grade(pz.PUZZLES[key], getattr(blank_answers, f"idle_{key}_kernel"), seed=0,
                    draw=False) is False
    out = capsys.readouterr().out
    assert out.startswith(f"❌ puzzle {number} ") and "never written" in out, out


@triton.jit
def _rotate_row_with_ropelib(
    x_ptr,  # *fp32: x [2 * HALF]
    theta_ptr,  # *fp32: angles [HALF]
    y_ptr,  # *fp32: y [2 * HALF]
    HALF: tl.constexpr,  # features per half
):
    j = tl.arange(0, HALF)
    c, s = cos_sin(tl.load(theta_ptr + j), False)            # ropelib's helpers: not allowed
    y1, y2 = rotate_pair(tl.load(x_ptr + j), tl.load(x_ptr + HALF + j), c, s, c, s)
    tl.store(y_ptr + j, y1)
    tl.store(y_ptr + HALF + j, y2)


def test_a_right_answer_built_on_ropelibs_helpers_fails(capsys):
    assert pz.check_rotate_row(_rotate_row_with_ropelib, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "ropelib's" in out and "(ropelib/kernels/common.py)" in out, out


def test_a_teaching_kernel_handed_in_fails(capsys):
    from ropelib.course.kernels.naive import _rope_naive_kernel
    assert pz.check_rotate_row(_rope_naive_kernel, seed=0, draw=False) is False
    assert "❌ puzzle 1" in capsys.readouterr().out


def test_checks_never_raise(capsys):
    def plain_function(x, theta):
        return x

    @triton.jit
    def raises(x_ptr, theta_ptr, y_ptr, HALF: tl.constexpr):
        tl.store(y_ptr + tl.arange(0, 3), tl.load(x_ptr))     # arange of 3: refused

    for answer in (None, ..., plain_function, raises, pz.solution_rotate_row_kernel):
        assert pz.check_rotate_row(answer, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert out.count("❌ puzzle 1") == 5, out
    assert "expected a @triton.jit kernel" in out and "the launch raised" in out


def test_timing_line_on_the_cpu_says_why_it_is_skipped(own_solutions, capsys):
    if pz.runtime.on_gpu():
        pytest.skip("on a GPU the checks time the kernel")
    assert pz.check_interleaved(own_solutions.my_interleaved_kernel, seed=0, draw=False) is True
    assert "⏱ timing skipped (" in capsys.readouterr().out


def test_pictures_draw_for_right_and_wrong_kernels(starters, own_solutions, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: shown.append(len(plt.gcf().axes)))
    assert pz.check_long_context(own_solutions.my_long_context_kernel, seed=0, time_it=False)
    assert pz.check_int64_offsets(starters.my_int64_offsets_kernel, seed=0) is False
    assert shown == [6, 3]     # x, freqs, pos, inv_freq, y + the angle-error panel; x, theta, y


# --- section 0: the worked example, graded as a puzzle is -------------------------------------

@triton.jit
def _masked_copy_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < N
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=live), mask=live)


@triton.jit
def _unmasked_copy_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def test_the_worked_copy_passes_and_reports_whole_sectors(capsys):
    """Section 0 shows a ✅: the masked copy passes, and the accesses line it prints (every byte
    of each moved sector used) is what last_grade hands the notebook to assert."""
    assert pz.check_copy(_masked_copy_kernel, seed=5, draw=False) is True
    out = capsys.readouterr().out
    assert "✅ puzzle 0 (a masked copy): correct on 3 launches" in out, out
    assert "x 4 loads (100% of the sectors' bytes used); y 4 stores (100%" in out, out
    graded = pz.last_grade("copy")
    assert graded.passed and graded.seed == 5 and graded.case == "x [200], BLOCK=64"
    assert graded.sectors == {"x": (4, 1.0), "y": (4, 1.0)}
    assert "copy" not in pz.PUZZLES                    # the scoreboard counts the puzzles only


def test_the_copy_without_a_mask_fails_with_its_stray_lanes(capsys):
    assert pz.check_copy(_unmasked_copy_kernel, seed=5, draw=False) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ puzzle 0 (a masked copy), x [10], BLOCK=4 (seed=5): "), out
    assert "2 load lanes" in out and "2 store lanes" in out, out
    assert pz.last_grade("copy").passed is False


def test_the_worked_copy_on_a_gpu_gets_a_timing_line(gpu_stand_in, monkeypatch, capsys):
    """The copy's GPU path (compiled cases, then its timed case against a device copy) run here
    with the cases on the CPU and a GPU stood in for; a compiled failure names its seed."""
    gpu_stand_in(lambda k: 0.01)
    build = pz.COPY.build
    monkeypatch.setattr(pz.COPY, "build", lambda gen, device: build(gen, "cpu"))
    monkeypatch.setattr(pz.COPY, "big", lambda device: build(torch.Generator(), "cpu")[1])
    kernel = interpreted(_masked_copy_kernel)
    assert pz.check_copy(kernel, seed=2, draw=False) is True
    out = capsys.readouterr().out
    assert "   ⏱ a CPU standing in, x [200], BLOCK=64: your kernel 10.0 us for " in out, out
    monkeypatch.setattr(pz, "_compiled_problem", lambda p, kernel, seed: ("x [10]", "wrong"))
    assert pz.check_copy(kernel, seed=2, draw=False) is False
    out = capsys.readouterr().out
    assert "❌ puzzle 0 (a masked copy), x [10] (compiled, on the GPU) (seed=2): wrong" in out, out


def test_sector_use_counts_half_sectors_for_stride_two():
    @triton.jit
    def stride_two(x_ptr, y_ptr, HALF: tl.constexpr):
        j = tl.arange(0, HALF)
        tl.store(y_ptr + 2 * j, tl.load(x_ptr + 2 * j))
        tl.store(y_ptr + 2 * j + 1, tl.load(x_ptr + 2 * j + 1))

    x, y = torch.randn(128), torch.full((128,), float("nan"))
    memory = pz.run_in_checked_memory(stride_two, (1,), x, y, HALF=64, inputs={"x": x},
                                      outputs={"y": y})
    assert torch.equal(x, y) and pz.sector_use(memory) == {"x": (2, 0.5), "y": (2, 0.5)}


# --- seeds: a failure can be run again ----------------------------------------------------------

def test_a_failure_prints_its_seed_and_the_seed_reruns_it(starters, capsys):
    """Without a seed the check draws one and prints it in the ❌ line, with the call that runs
    the same inputs again; that call prints the same failure, word for word."""
    kernel = starters.my_long_context_kernel              # its worst position depends on x
    assert pz.check_long_context(kernel, draw=False) is False
    first = capsys.readouterr().out
    seed = int(re.search(r"\(seed=(\d+)\): ", first.splitlines()[0]).group(1))
    assert f"the same inputs again: pz.check_long_context(my_long_context_kernel, seed={seed})" \
        in first, first
    assert pz.last_grade("long_context").seed == seed
    assert pz.check_long_context(kernel, seed=seed, draw=False) is False
    assert capsys.readouterr().out == first


def test_different_seeds_draw_different_inputs():
    a, b = (pz.PARTIAL.build(torch.Generator().manual_seed(s), "cpu")[0] for s in (1, 2))
    assert not torch.equal(a.inputs["x"], b.inputs["x"])


def test_a_check_that_cannot_run_names_its_seed(capsys):
    def broken_build(gen, device):
        raise RuntimeError("no cases")

    p = pz.Puzzle(0, "broken", "a broken check", pz.spec_copy, broken_build, None, hint="")
    assert pz.grade(p, _masked_copy_kernel, seed=9, draw=False) is False
    assert "seed=9: the check could not run your kernel" in capsys.readouterr().out


# --- puzzle 3: the check names the partner at j + D/2 ------------------------------------------

def _partial_source(partner: str, tail: bool) -> str:
    tail_lines = textwrap.indent(textwrap.dedent("""
        k = R + tl.arange(0, BLOCK_PASS)
        tail = live & (k[None, :] < D)
        tl.store(row_y + k[None, :], tl.load(row_x + k[None, :], mask=tail), mask=tail)
    """), "    ") if tail else ""
    return textwrap.dedent(f"""
    @triton.jit
    def partial_kernel(x_ptr, theta_ptr, y_ptr, N_ROWS, D: tl.constexpr, R: tl.constexpr,
                       BLOCK_ROWS: tl.constexpr, BLOCK_PASS: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        live = rows[:, None] < N_ROWS
        j = tl.arange(0, R // 2)
        theta = tl.load(theta_ptr + rows[:, None] * (R // 2) + j[None, :], mask=live, other=0.0)
        row_x = x_ptr + rows[:, None] * D
        row_y = y_ptr + rows[:, None] * D
        x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
        x2 = tl.load(row_x + {partner} + j[None, :], mask=live, other=0.0)
        c, s = tl.cos(theta), tl.sin(theta)
        tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
        tl.store(row_y + {partner} + j[None, :], x2 * c + x1 * s, mask=live)
    """) + tail_lines


@pytest.fixture(scope="module")
def partial_variants(tmp_path_factory):
    """Puzzle 3 answers that repair one of the given kernel's two mistakes, or both."""
    variants = {"tail_only": ("D // 2", True), "partner_only": ("R // 2", False),
                "both": ("R // 2", True)}
    folder = tmp_path_factory.mktemp("partial")
    out = {}
    for name, (partner, tail) in variants.items():
        out[name] = written_module(f"partial_{name}", folder / f"partial_{name}.py",
                                   "import triton\nimport triton.language as tl\n"
                                   + _partial_source(partner, tail)).partial_kernel
    return out


def test_partial_names_the_partner_at_half_d_with_the_tail_copied(partial_variants, capsys):
    """A learner who adds the pass-through copy but keeps D // 2 is told about the partner, not
    only that features R/2..R-1 were never written."""
    for seed in (0, 3):
        assert pz.check_partial(partial_variants["tail_only"], seed=seed, draw=False) is False
        out = capsys.readouterr().out
        assert out.startswith("❌ puzzle 3 ") and "features 16-31 of rows" in out, out
        told = _hinted(capsys, 3, out)
        assert "your partner of feature j is at j + D/2 = j + 32" in told, told
        assert "the partner is at j + 16" in told and "your partner" not in out, (out, told)


def test_partial_starter_is_told_both_mistakes(starters, capsys):
    assert pz.check_partial(starters.my_partial_kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "were never written" in out and "features 16-31, 48-63" in out, out
    assert "j + D/2 = j + 32" in _hinted(capsys, 3, out)


def test_partial_with_the_right_partner_is_not_blamed_for_it(partial_variants, capsys):
    assert pz.check_partial(partial_variants["partner_only"], seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "were never written" in out and "features 32-63" in out, out
    assert "your partner" not in out + _hinted(capsys, 3, out), out
    assert pz.check_partial(partial_variants["both"], seed=0, draw=False) is True
    assert "✅ puzzle 3 " in capsys.readouterr().out


# --- puzzle 6: position ids as generation hands them over --------------------------------------

def test_position_ids_has_a_generation_case_with_a_start_per_sequence():
    for seed in (0, 1, 2):
        case = pz.POSITION_IDS.build(torch.Generator().manual_seed(seed), "cpu")[-1]
        ids = case.args[1]
        B, S = ids.shape
        starts = ids[:, 0]
        assert len(set(starts.tolist())) == B                      # each sequence its own start
        assert torch.equal(ids, starts[:, None] + torch.arange(S))
        assert not ids.is_contiguous() and ids.stride() == (2 * S + 2, 1), case.label
        assert f"starts {starts.tolist()}" in case.label


# --- puzzle 10: packed sequences, the inclusive end of a sequence ------------------------------

# Answers with the right positions that take cu_seqlens[i + 1] for the last row of sequence i
# (`rows <= end`); the second also masks the rows past the packed tensor.

@triton.jit
def _packed_inclusive_end_kernel(x_ptr, cu_seqlens_ptr, cos_ptr, sin_ptr, y_ptr,
                                 HALF: tl.constexpr, BLOCK_T: tl.constexpr):
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = start + t
    live = (rows <= end)[:, None]                           # one row past the sequence
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + t[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = rows[:, None] * (2 * HALF)
    x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
    tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


@triton.jit
def _packed_inclusive_end_clamped_kernel(x_ptr, cu_seqlens_ptr, cos_ptr, sin_ptr, y_ptr,
                                         HALF: tl.constexpr, BLOCK_T: tl.constexpr):
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    total = tl.load(cu_seqlens_ptr + tl.num_programs(0))   # rows in the packed tensor
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = start + t
    live = ((rows <= end) & (rows < total))[:, None]        # one row past, but inside y
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + t[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = rows[:, None] * (2 * HALF)
    x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
    tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


def test_packed_cases_are_the_ones_the_notebook_names():
    """The notebook lists the lengths and BLOCK_T; the first case has a boundary inside a tile,
    a sequence of one token and an empty one last."""
    cases = pz.PACKED_SEQUENCES.build(torch.Generator().manual_seed(0), "cpu")
    lengths = [c.extra["cu_seqlens"].diff().tolist() for c in cases]
    assert lengths == [[5, 1, 12, 0], [4, 4, 4], [7, 0, 2, 9, 3]]
    assert all(c.constexprs["BLOCK_T"] == 4 and c.label.endswith(", BLOCK_T=4") for c in cases)
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert "`BLOCK_T` = 4 tokens" in text and "lengths 5, 1, 12 and 0" in text
    assert "4, 4 and 4" in text and "7, 0, 2, 9\n# and 3" in text
    for c in cases:
        cu = c.extra["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu[0] == 0 and c.grid == (
            len(cu) - 1, triton.cdiv(int(cu.diff().max()), 4))
        positions = torch.cat([torch.arange(n) for n in cu.diff().tolist()])
        assert torch.equal(c.expected, pz.spec_position_ids(c.inputs["x"].double(), positions,
                                                            c.inputs["cos"].double(),
                                                            c.inputs["sin"].double()))


def test_packed_inclusive_end_spills_past_the_tensor(capsys):
    for seed in (0, 3):
        assert pz.check_packed_sequences(_packed_inclusive_end_kernel, seed=seed,
                                         draw=False) is False
        out = capsys.readouterr().out
        assert out.startswith("❌ puzzle 10 ") and "lengths [5, 1, 12, 0]" in out, out
        assert "store lanes in 1 program" in out and "wrote no element of any output" in out, out
        told = _hinted(capsys, 10, out)
        assert "index in the packed x" not in out + told, out      # the positions are right


def test_packed_inclusive_end_clamped_is_failed_for_the_race(capsys):
    """Clamped at the packed tensor's end, the inclusive end leaves no stray lane and, with the
    interpreter's programs in order, right values: the rows stored by two programs fail it."""
    kernel = _packed_inclusive_end_clamped_kernel
    assert pz.check_packed_sequences(kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "right values in the interpreter, but rows 5-6 of y were stored by two programs " \
        "(each the first row of a sequence)" in out, out
    case = pz.PACKED_SEQUENCES.build(torch.Generator().manual_seed(0), "cpu")[0]
    memory = pz.BoundsCheckedMemory(case.regions())
    with memory.installed():
        interpreted(kernel)[case.grid](*case.args, **case.constexprs)
    assert not memory.faults and torch.allclose(case.out.double(), case.expected, atol=1e-5)


def test_packed_inclusive_end_does_not_show_when_no_tile_runs_past():
    """The notebook: with lengths 4, 4, 4 in tiles of 4 the inclusive end does not show."""
    case = pz.PACKED_SEQUENCES.build(torch.Generator().manual_seed(0), "cpu")[1]
    memory = pz.BoundsCheckedMemory(case.regions())
    with memory.installed():
        interpreted(_packed_inclusive_end_kernel)[case.grid](*case.args, **case.constexprs)
    assert not memory.faults and (memory.storing_programs("y") >= 0).all()
    assert torch.allclose(case.out.double(), case.expected, atol=1e-5)


# --- puzzle 5's panel: position 0 has no place on a log axis ------------------------------------

def test_long_context_panel_leaves_out_position_0(own_solutions):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    case = pz.LONG_CONTEXT.build(torch.Generator().manual_seed(0), "cpu")[0]
    assert (case.extra["positions"] == 0).any()
    interpreted(own_solutions.my_long_context_kernel)[case.grid](*case.args, **case.constexprs)
    fig, ax = plt.subplots()
    pz._plot_long_context(ax, case, case.out)
    xs, ys = ax.lines[0].get_data()
    plt.close(fig)
    positive = sorted(int(p) for p in case.extra["positions"] if p > 0)
    assert list(xs) == positive                          # every other position, once, in order
    err = pz._pair_angle_error(case, case.out)
    by_pos = {int(p): float(e) for p, e in zip(case.extra["positions"], err)}
    assert list(ys) == pytest.approx([max(by_pos[p], 1e-6) for p in positive])


# --- puzzle 5: the check names which 16-bit mistake an answer made -----------------------------

@triton.jit
def _long_context_bf16_inv_freq_kernel(
    x_ptr, freqs_ptr, pos_ptr, inv_freq_ptr, y_ptr, N_ROWS,
    HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    pos = tl.load(pos_ptr + rows, mask=rows < N_ROWS, other=0)
    inv = tl.load(inv_freq_ptr + j).to(tl.bfloat16).to(tl.float32)   # as after model.to(bf16)
    theta = pos.to(tl.float32)[:, None] * inv[None, :]
    c, s = tl.cos(theta), tl.sin(theta)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0).to(tl.float32)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(row_y + HALF + j[None, :], (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _long_context_bf16_angle_kernel(
    x_ptr, freqs_ptr, pos_ptr, inv_freq_ptr, y_ptr, N_ROWS,
    HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    pos = tl.load(pos_ptr + rows, mask=rows < N_ROWS, other=0)
    inv = tl.load(inv_freq_ptr + j)
    theta = (pos.to(tl.float32)[:, None] * inv[None, :]).to(tl.bfloat16).to(tl.float32)
    c, s = tl.cos(theta), tl.sin(theta)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0).to(tl.float32)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(row_y + HALF + j[None, :], (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=live)


@pytest.mark.parametrize("kernel, says, not_says", [
    (_long_context_bf16_inv_freq_kernel, "inverse frequencies rounded to bf16",
     "angle held in bf16"),
    (_long_context_bf16_angle_kernel, "angle held in bf16", "inverse frequencies"),
])
def test_long_context_names_the_16_bit_mistake(kernel, says, not_says, capsys):
    """A kernel that rounds inv_freq to bf16 (as a model cast with .to(bfloat16) hands it) is
    told so, not blamed for a bf16 table; one that rounds its own fp32 angle to bf16 is told the
    table's story. Both fail."""
    for seed in (0, 3):
        assert pz.check_long_context(kernel, seed=seed, draw=False) is False
        out = capsys.readouterr().out
        told = _hinted(capsys, 5, out)
        assert out.startswith("❌ puzzle 5 ") and says in told and not_says not in told, told
        assert says not in out, out


def test_long_context_starter_is_blamed_on_the_table(starters, capsys):
    assert pz.check_long_context(starters.my_long_context_kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    told = _hinted(capsys, 5, out)
    assert "rotation by the angle held in bf16" in told and "inverse frequencies" not in told, told


# --- puzzle 11: what the check measures, and the claims the notebook makes about it -----------

def test_bf16_table_report_separates_the_table_from_the_kernel(own_solutions, capsys):
    """The ✅ of puzzle 11 prints the kernel's own rounding only (the notebook computes the
    table's cost with torch); the numbers its panel draws hold."""
    kernel = own_solutions.my_bf16_table_kernel
    assert pz.check_bf16_table(kernel, seed=0, draw=False, time_it=False) is True
    out = capsys.readouterr().out
    line = re.search(r"the kernel's part: y within ([0-9.]+) bf16 ulp of the rotation by the "
                     r"bf16 table's own values \(allowed 1", out)
    assert line and float(line.group(1)) <= pz.ULP_TOL, out
    assert "position 100,000" not in out, out
    for case in pz.BF16_TABLE.build(torch.Generator().manual_seed(0), "cpu"):
        interpreted(kernel)[case.grid](*case.args, **case.constexprs)
        k = pz.bf16_table_costs(case, case.out)
        assert k["ulps"].max() <= pz.ULP_TOL                      # the kernel rounds once
        assert (k["table"] <= pz.TABLE_BOUND).all()              # at every position
        at = case.extra["positions"] == 100000
        assert at.any()
        assert (k["table"][at] < k["rounding"][at]).all()         # y's conversion costs more
        assert (k["angle"][at] > 0.5).all()                       # a bf16 angle: wrong there


def test_bf16_table_starter_is_eager_pytorch_bit_for_bit(starters):
    """The notebook says its starting kernel computes what eager PyTorch computes in bf16."""
    for case in pz.BF16_TABLE.build(torch.Generator().manual_seed(3), "cpu"):
        x, cos, sin = (case.inputs[n] for n in ("x", "cos", "sin"))
        half = x.shape[-1] // 2
        x1, x2 = x[:, :half], x[:, half:]
        eager = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)    # bf16 ops
        assert torch.equal(case.extra["eager"][0], eager)
        interpreted(starters.my_bf16_table_kernel)[case.grid](*case.args, **case.constexprs)
        assert torch.equal(case.out, case.extra["eager"][1])       # the interpreter truncates
        try:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        except ImportError:
            continue
        cat = lambda t: torch.cat((t, t), dim=-1)[None]           # noqa: E731 (HF's layout)
        q, _ = apply_rotary_pos_emb(x[None, None], x[None, None], cat(cos), cat(sin))
        assert torch.equal(q.reshape(eager.shape), eager)


@triton.jit
def _to_bf16_kernel(a_ptr, y_ptr, z_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i)
    tl.store(y_ptr + i, a.to(tl.bfloat16))
    tl.store(z_ptr + i, a)                                     # the store converts


def test_the_interpreter_truncates_to_bf16():
    """Puzzle 11's allowance of one ulp rests on this: Triton's interpreter converts fp32 to
    bf16 by truncating (a GPU rounds to nearest). If it ever rounds, the text can say 0.5."""
    a = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    y = torch.empty(4096, dtype=torch.bfloat16)
    z = torch.empty_like(y)
    interpreted(_to_bf16_kernel)[(1,)](a, y, z, N=4096)
    want = pz._to_bf16(a, truncate=True)
    assert torch.equal(y, want) and torch.equal(z, want)
    assert not torch.equal(want, a.to(torch.bfloat16))


@triton.jit
def _bf16_arithmetic_kernel(
    x_ptr, cos_ptr, sin_ptr, y_ptr, N_ROWS, HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    tab = rows[:, None] * HALF + j[None, :]
    c = tl.load(cos_ptr + tab, mask=live, other=1.0)              # bf16 tiles, no conversion
    s = tl.load(sin_ptr + tab, mask=live, other=0.0)
    x1 = tl.load(x_ptr + rows[:, None] * (2 * HALF) + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + rows[:, None] * (2 * HALF) + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + rows[:, None] * (2 * HALF) + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(y_ptr + rows[:, None] * (2 * HALF) + HALF + j[None, :], x2 * c + x1 * s, mask=live)


def test_bf16_arithmetic_in_the_interpreter_is_named(capsys):
    assert pz.check_bf16_table(_bf16_arithmetic_kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "far more than rounding" in out and "raw bits" in _hinted(capsys, 11, out), out
    assert "never written" not in out, out                    # it stored NaN: it wrote them


@triton.jit
def _stores_nan_kernel(x_ptr, theta_ptr, y_ptr, HALF: tl.constexpr):
    j = tl.arange(0, 2 * HALF)
    x = tl.load(x_ptr + j)
    tl.store(y_ptr + j, x * float("nan"))


def test_nan_the_kernel_stored_is_not_called_unwritten(capsys):
    assert pz.check_rotate_row(_stores_nan_kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert "are NaN, as your kernel stored them" in out and "never written" not in out, out


# --- the memory layer -------------------------------------------------------------------------

@triton.jit
def _copy_rows_kernel(
    x_ptr,  # *fp32: x rows, stride_x elements apart
    y_ptr,  # *fp32: y rows, stride_y elements apart
    N_ROWS,  # rows
    stride_x, stride_y,  # row strides, in elements
    W: tl.constexpr,  # elements per row
    INT64: tl.constexpr,  # offsets in int64
):
    rows = tl.arange(0, 4)
    if INT64:
        rows = rows.to(tl.int64)
    cols = tl.arange(0, W)
    live = rows[:, None] < N_ROWS
    v = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=live)
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], v, mask=live)


def _virtual_copy(int64: bool):
    x = torch.randn(3, 8)
    y = torch.full((3, 8), float("nan"))
    memory = pz.BoundsCheckedMemory([pz.Region("x", x, "in", row_stride=2**30 + 64),
                                     pz.Region("y", y, "out", row_stride=2**30 + 8)])
    with memory.installed():
        interpreted(_copy_rows_kernel)[(1,)](x, y, 3, 2**30 + 64, 2**30 + 8, W=8,
                                                 INT64=int64)
    return x, y, memory


def test_virtual_rows_past_2_31_are_mapped_with_int64_offsets():
    x, y, memory = _virtual_copy(int64=True)
    assert not memory.faults
    assert torch.equal(x, y)


def test_virtual_rows_past_2_31_fault_with_int32_offsets():
    x, y, memory = _virtual_copy(int64=False)
    assert torch.equal(x[:2], y[:2]) and y[2].isnan().all()     # row 2 never touched
    assert [(f.kind, len(f.lanes)) for f in memory.faults] == [("load", 8), ("store", 8)]
    report = memory.fault_report()
    wrapped = 2 * (2**30 + 64) - 2**32
    assert f"element offset {wrapped:,} from x" in report and "32-bit offset" in report


def test_element_offset_is_signed_64_bit_whatever_the_base(monkeypatch):
    """A 32-bit offset that wrapped to -2^31 + 128 elements reads below the base. Where the base
    is under 2^33 bytes (a non-PIE Python's heap: the GPU machine's), that address wraps past 0
    and arrives as a uint64 just under 2^64; the offset must still come out negative."""
    region = pz.Region("x", torch.zeros(3, 8), "in", row_stride=2**30 + 64)
    wrapped = 2 * (2**30 + 64) - 2**32                           # -2,147,483,520 elements
    for base in (0x1000, 0x10000000, 2**33 - 4, 0x5585_83E6_93C0, 2**63 + 64):
        monkeypatch.setattr(pz.Region, "base", property(lambda self, b=base: b))
        address = (base + 4 * wrapped) % 2**64
        assert region.element_offset(address) == wrapped, hex(base)
        assert region.element_offset(base + 4 * 7) == 7
        assert region.element_offset((base - 4) % 2**64) == -1


def _low_buffer(floats: int):
    """A float32 tensor below 2^33 (a fixed Linux mmap, else an ordinary tensor where the heap
    already lies there), or None; and its release."""
    import ctypes
    import mmap
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None, None
    want, size = 0x10000000, 4 * floats
    got = libc.mmap(want, size, mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100000, -1, 0)  # FIXED_NOREPLACE
    if got != want:
        if got not in (None, ctypes.c_void_p(-1).value):
            libc.munmap(got, size)
        plain = torch.empty(floats)          # a heap that already lies low (a non-PIE Python)
        return (plain, lambda: None) if plain.data_ptr() + 4 * floats < 2**33 else (None, None)
    buf = torch.frombuffer((ctypes.c_float * floats).from_address(got), dtype=torch.float32)
    return buf, lambda: libc.munmap(got, size)


def test_virtual_rows_below_a_low_base_report_the_wrapped_offset():
    """The same fault as above with x and y at an address below 2^33: the report names the
    offset near -2^31 and the 32-bit wrap, as it does with a high base."""
    buf, release = _low_buffer(1 << 14)
    if buf is None:
        pytest.skip("no mapping at a fixed low address here")
    try:
        x, y = buf[:24].view(3, 8), buf[4096:4096 + 24].view(3, 8)
        x.copy_(torch.randn(3, 8))
        y.fill_(float("nan"))
        assert x.data_ptr() < 2**33
        memory = pz.BoundsCheckedMemory([pz.Region("x", x, "in", row_stride=2**30 + 64),
                                         pz.Region("y", y, "out", row_stride=2**30 + 8)])
        with memory.installed():
            interpreted(_copy_rows_kernel)[(1,)](x, y, 3, 2**30 + 64, 2**30 + 8, W=8,
                                                     INT64=False)
        report = memory.fault_report()
        assert torch.equal(x[:2], y[:2]) and y[2].isnan().all()
        wrapped = 2 * (2**30 + 64) - 2**32
        assert f"element offset {wrapped:,} from x" in report, report
        assert "a 32-bit offset gives once it wraps" in report, report
        del x, y, memory
    finally:
        del buf
        release()


def test_faults_are_masked_off_and_counted():
    x = torch.arange(10.0)
    y = torch.full((10,), float("nan"))
    memory = pz.run_in_checked_memory(_copy_rows_kernel, (1,), x, y, 3, 4, 4, W=4, INT64=False,
                                      inputs={"x": x[:8].view(2, 4)}, outputs={"y": y})
    # rows 0-1 of x are inputs; row 2 (elements 8-11) is not: its load lanes are masked off,
    # and y[8:12] stores lanes 10, 11 outside y
    assert torch.equal(y[:8], x[:8]) and (y[8:] == 0).all()
    kinds = sorted((f.kind, len(f.lanes)) for f in memory.faults)
    assert kinds == [("load", 4), ("store", 2)]
    counts = memory.counts("x", "load")
    assert counts.shape == (2, 4) and (counts == 1).all()
    assert (memory.storing_programs("y") == 0).sum() == 10


def test_region_addresses_follow_strides():
    base = torch.arange(12).view(3, 4)
    region = pz.Region("ids", base.t()[::2], "in")               # [2, 3], strides (2, 4)
    want = base.data_ptr() + 8 * np.array([[0, 4, 8], [2, 6, 10]], dtype=np.uint64)
    assert np.array_equal(region.addresses, want)
    hit, real = region.locate(np.array([want[1, 2], want[1, 2] + 8], dtype=np.uint64))
    assert hit.tolist() == [True, False] and real[0] == want[1, 2]


# --- the notebook -------------------------------------------------------------------------------

def test_each_section_checks_and_shows_its_own_puzzle():
    text = NOTEBOOK.read_text(encoding="utf-8")
    last = -1
    for key in KEYS:
        spec = text.index(f'pz.show_spec("{key}")')
        check = text.index(f"pz.check_{key}(my_{key}_kernel)")
        shown = text.index(f"solution(pz.solution_{key}_kernel.fn")
        assert last < spec < check < shown, key
        last = shown


@pytest.mark.slow
def test_notebook_with_the_worked_solutions_passes_every_check(tmp_path):
    """The notebook's cells, run as a script with each learner kernel replaced by the worked
    solution the notebook shows, typed in under the learner's name: every check says ✅, and
    the scoreboard counts all puzzles."""
    source = NOTEBOOK.read_text(encoding="utf-8")
    lines = source.splitlines()
    for name, (first, last) in sorted(_notebook_kernels(source).items(),
                                      key=lambda kv: -kv[1][0]):
        key = name[len("my_"):-len("_kernel")]
        lines[first - 1:last] = _solution_as_learner(key).splitlines()
    script = tmp_path / "13-rope-puzzles-solved.py"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1"),
           "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, str(script)], cwd=NOTEBOOK.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert "❌" not in out, out
    for p in pz.PUZZLES.values():
        assert f"✅ puzzle {p.number} ({p.title}): correct" in out, out
    assert f"{len(KEYS)} of {len(KEYS)} solved" in out
    assert seconds < 120, f"the solved notebook took {seconds:.0f} s"


def test_interpreter_compat_turns_one_element_scalars_into_indices():
    """A launch through the interpreter from a compiled-mode process (a GPU machine) gets an
    __index__ that takes a scalar argument held as a 1-element array: Triton 3.6 converted it
    with int(array), which NumPy 2 refuses, and puzzle 9's `for b in range(B)` failed on the
    H200. Outside the block the interpreter's own patching is back."""
    from triton.runtime import interpreter
    from ropelib.course.work_count import interpreter_compat

    class Scope:
        def set_attr(self, obj, name, value):
            setattr(obj, name, value)

    class Handle:
        data = np.array([7], dtype=np.int32)

    class Tensor:
        handle = Handle()

    before = interpreter._patch_lang_tensor
    with interpreter_compat():
        interpreter._patch_lang_tensor(Tensor, Scope())
        assert range(Tensor()) == range(7)
    assert interpreter._patch_lang_tensor is before


def test_hint_prints_the_diagnosis_only_after_a_failed_check(starters, capsys):
    """The ❌ line states the symptom; pz.hint(n) adds what the check recognised, and a pass (or
    no check yet) leaves only the puzzle's nudge."""
    pz.check_shared_table(starters.my_shared_table_kernel, seed=0, draw=False)
    out = capsys.readouterr().out
    assert "loaded 4 times" in out and "before the loop" not in out, out
    told = _hinted(capsys, 9, out)
    assert "what your last check recognised" in told and pz.SHARED_TABLE.nudge in told, told
    pz.hint(99)
    assert "no puzzle 99" in capsys.readouterr().out
    pz.hint(0)
    assert pz.COPY.nudge in capsys.readouterr().out


@pytest.mark.parametrize("key", KEYS)
def test_a_hint_says_where_to_look_and_the_fix_only_when_asked(key, capsys):
    """pz.hint(n) points where to look without the fix (the notebook says so); the fix in words
    waits for pz.hint(n, fix=True), the step before the worked solution."""
    p = pz.PUZZLES[key]
    assert p.nudge and p.nudge != p.hint
    pz.hint(p.number)
    told = capsys.readouterr().out
    assert p.nudge in told and p.hint not in told, told
    assert f"pz.hint({p.number}, fix=True)" in told, told
    pz.hint(p.number, fix=True)
    told = capsys.readouterr().out
    assert p.hint in told and p.nudge not in told, told


def test_given_shared_table_kernel_is_the_notebooks_starting_kernel():
    """The kernel the notebook times beside puzzle 9's solution is the one it hands out."""
    source = NOTEBOOK.read_text(encoding="utf-8")
    first, last = _notebook_kernels(source)["my_shared_table_kernel"]
    starter = "\n".join(source.splitlines()[first - 1:last])

    def body(src):
        lines = src.split("):\n", 1)[1].splitlines()
        return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    given = inspect.getsource(pz.given_shared_table_kernel.fn)
    assert body(given) == body(starter)


def test_given_shared_table_kernel_handed_in_is_refused(capsys):
    """ropelib's copy of the given kernel is not a learner's answer (nor a right one)."""
    assert pz.check_shared_table(pz.given_shared_table_kernel, seed=0, draw=False) is False
    assert "ropelib's given_shared_table_kernel" in capsys.readouterr().out


def test_time_kernel_on_the_cpu_says_nothing_was_timed(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert pz.time_kernel("shared_table", pz.given_shared_table_kernel, "the given kernel") is None
    assert "not timed" in capsys.readouterr().out


def test_stated_prints_one_line_or_each_claim_on_a_mismatch(capsys):
    pz.stated([("a share", "74%", "74%"), ("a count", 8, 8)])
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "2 numbers" in out and "a share" not in out, out
    with pytest.raises(AssertionError, match="a count"):
        pz.stated([("a share", "74%", "74%"), ("a count", 8, 9)])
    out = capsys.readouterr().out                    # on a mismatch: every claim, marked
    assert "a share" in out and out.count("✓") == 1 and out.count("✗") == 1, out


def test_access_picture_legend_has_every_shade(monkeypatch):
    """The legend names the four load shades the notebook's intro promises, 4 or more included."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = []
    real_show = plt.show

    def keep(*a, **k):
        for leg in plt.gcf().legends:
            labels.extend(t.get_text() for t in leg.get_texts())
    monkeypatch.setattr(plt, "show", keep)
    x = torch.arange(8.0)
    y = torch.full((8,), float("nan"))

    @triton.jit
    def _twice(x_ptr, y_ptr):
        i = tl.arange(0, 8)
        tl.store(y_ptr + i, tl.load(x_ptr + i) + tl.load(x_ptr + i))
    memory = pz.run_in_checked_memory(_twice, (1,), x, y, inputs={"x": x}, outputs={"y": y})
    pz.draw_accesses(memory, "legend")
    monkeypatch.setattr(plt, "show", real_show)
    assert labels == ["never touched", "loaded once", "loaded twice", "loaded 3 times",
                      "loaded 4 or more", "stored by 2+ programs"], labels


@pytest.mark.parametrize("number", pz.SOLUTIONS_AT_TIMED_SHAPE)
def test_worked_solutions_at_their_timed_shape_cut_to_a_few_rows(number):
    """Answer 5 counts these: the timed case's head dim, dtypes and tiles, a few rows, no fault,
    every byte of the rows' and tables' sectors used."""
    p = next(q for q in pz.PUZZLES.values() if q.number == number)
    big = p.big("meta")
    label, memory = pz.at_timed_shape(number, rows=32)
    assert not memory.faults and label.split(" [")[0] == big.label.split(" [")[0]
    small = p.big("cpu", rows=32)
    assert small.constexprs == big.constexprs and small.out.dtype == big.out.dtype
    assert small.out.shape[-1] == big.out.shape[-1]
    use = pz.sector_use(memory)
    assert all(share == 1.0 for name, (_, share) in use.items() if name != "cu_seqlens")
    if number == 6:                                  # expanded ids: each table row, once per entry
        assert all(int(memory.counts(t, "load").min()) == 8 for t in ("cos", "sin"))


def test_at_timed_shape_leaves_the_timed_case_as_it_was():
    for number in pz.SOLUTIONS_AT_TIMED_SHAPE:
        p = next(q for q in pz.PUZZLES.values() if q.number == number)
        assert p.big("meta").out.numel() >= 8 * 16384 * 64      # the full size by default
    with pytest.raises(AssertionError):
        pz.at_timed_shape(9)
