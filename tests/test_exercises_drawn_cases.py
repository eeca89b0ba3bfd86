"""Six exercise checks that draw a case when they run: notebook 01's permutation
(`check_interleave_permutation`), notebook 03's predicted time (`check_predicted_us`), notebook
08's recovered positions (`check_recovered_positions`), trap name (`check_trap_name`) and
combine with TE's bits (`check_te_combine`), and notebook 09's share of the step
(`check_rope_share`).

For each: a learner's own copy of the worked solution passes; an answer that returns results
recorded beforehand for the check's fixed cases (a table keyed on the inputs, computed outside
the check's watch) fails, at the drawn case, whose label carries its seed; an obviously wrong
answer fails. The draw comes from the operating system, not from torch's global generator, and
the seed in the label draws the same case again.
"""
import os
import re
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401 -- Triton wants it in a @triton.jit module

from ropelib import runtime  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.course.exercises import basics, debugging, in_a_model, naive_kernel  # noqa: E402
from ropelib.course.exercises import own_code  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _recorded(check, own, worked, fallback):
    """An answer that returns `worked`'s results for the inputs of an earlier run of `check`
    (recorded while `own` answered), computed outside any check; `fallback(*args)` for an input
    it has not seen."""
    seen = []

    def recording(*args):
        seen.append(tuple(a.clone() if isinstance(a, torch.Tensor) else
                          set(a) if isinstance(a, (set, frozenset)) else
                          list(a) if isinstance(a, list) else a for a in args))
        return own(*args)
    assert check(recording) is True                     # the recording run passes
    table = [(args, worked(*args)) for args in seen]

    def answer(*args):
        for known, result in table:
            if _same(known, args):
                return result
        return fallback(*args)
    return answer


def _fails_at_the_drawn_case(check, answer, capsys, tries: int = 3) -> str:
    """The first ❌ line of `check(answer)`, asserted to be the drawn case's (a draw may, rarely,
    repeat an input the table holds: a few draws)."""
    for _ in range(tries):
        capsys.readouterr()
        if not check(answer):
            break
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("❌")]
    assert failed and "drawn with seed " in failed[0], out
    return failed[0]


def _seed(line: str) -> int:
    return int(line.split("drawn with seed ")[1].split(")")[0].split(":")[0].split(",")[0])


# --- notebook 01: the permutation between the two pairings --------------------------------------

def test_permutation_worked_solution_passes_both_ways(capsys):
    own = learner_copy(basics.solution_interleave_permutation)
    assert basics.check_interleave_permutation(own)
    assert basics.check_interleave_permutation(lambda d: own(d, "interleaved"), to="interleaved")
    out = capsys.readouterr().out
    assert out.count("✅") == 2 and "❌" not in out, out


def test_permutation_table_made_beforehand_fails_at_the_drawn_rot_dim(capsys):
    own = learner_copy(basics.solution_interleave_permutation)
    answer = _recorded(basics.check_interleave_permutation, own,
                       basics.solution_interleave_permutation, lambda d: list(range(d)))
    line = _fails_at_the_drawn_case(basics.check_interleave_permutation, answer, capsys)
    assert "permutation (R=" in line


def test_permutation_wrong_answer_fails(capsys):
    assert not basics.check_interleave_permutation(lambda d: list(range(d)))
    assert not basics.check_interleave_permutation(lambda d: list(reversed(range(d))))
    assert "❌" in capsys.readouterr().out


# --- notebook 03: the predicted time ------------------------------------------------------------

def test_predicted_us_worked_solution_passes(capsys):
    assert naive_kernel.check_predicted_us(learner_copy(naive_kernel.solution_predicted_us))
    out = capsys.readouterr().out
    assert "✅" in out and "❌" not in out, out


def test_predicted_us_table_made_beforehand_fails_at_the_drawn_kernel(capsys):
    answer = _recorded(naive_kernel.check_predicted_us,
                       learner_copy(naive_kernel.solution_predicted_us),
                       naive_kernel.solution_predicted_us, lambda *args: 0.0)
    _fails_at_the_drawn_case(naive_kernel.check_predicted_us, answer, capsys)


def test_predicted_us_wrong_answers_fail(capsys):
    for wrong in (lambda n, r, sms, ns, copy: n * ns / sms / 1e3,           # ROWS ignored
                  lambda n, r, sms, ns, copy: copy,                         # the copy alone
                  lambda n, r, sms, ns, copy: (n // r) * ns / sms / 1e3):    # no copy floor
        assert naive_kernel.check_predicted_us(wrong) is False
    assert "❌" in capsys.readouterr().out


def test_the_draw_ignores_torch_global_seed_and_its_seed_draws_it_again(monkeypatch, capsys):
    table = _recorded(naive_kernel.check_predicted_us,
                      learner_copy(naive_kernel.solution_predicted_us),
                      naive_kernel.solution_predicted_us, lambda *args: 0.0)
    torch.manual_seed(0)
    first = _fails_at_the_drawn_case(naive_kernel.check_predicted_us, table, capsys, tries=1)
    torch.manual_seed(0)
    second = _fails_at_the_drawn_case(naive_kernel.check_predicted_us, table, capsys, tries=1)
    assert _seed(first) != _seed(second)       # two draws, the notebook's seed the same
    # the failing line names its seed; that seed draws the very same case
    monkeypatch.setattr(own_code, "fresh_seed", lambda: _seed(first))
    assert naive_kernel.check_predicted_us(table) is False
    assert capsys.readouterr().out.splitlines()[0] == first


# --- notebook 08: the trap's name, and the combine with TE's bits -------------------------------

def test_trap_name_worked_solution_passes(capsys):
    assert debugging.check_trap_name(learner_copy(debugging.solution_trap_name)) is True
    out = capsys.readouterr().out
    assert "✅" in out and "❌" not in out, out


def test_recovered_positions_worked_solution_passes(capsys):
    own = learner_copy(debugging.solution_recovered_positions)
    assert debugging.check_recovered_positions(own) is True
    out = capsys.readouterr().out
    assert "✅" in out and "❌" not in out, out


def test_trap_name_drawn_cases_hold_every_trap_and_a_right_rope():
    drawn = debugging._drawn_trap_outputs()
    assert sorted(t for _, _, t in drawn) == sorted((*debugging.TRAPS_WITH_A_CURVE, "none"))
    assert all("drawn with seed " in label for label, _, _ in drawn)
    assert all(layout == "sbhd" for _, (_, _, layout), _ in drawn)     # no name leaks
    assert debugging._drawn_trap_outputs()[0][0] != drawn[0][0]   # a new seed on every call


def test_trap_names_recorded_beforehand_fail_at_the_drawn_cases(capsys):
    own = learner_copy(debugging.solution_trap_name)
    answer = _recorded(debugging.check_trap_name, own, debugging.solution_trap_name,
                       lambda pos: "none")
    _fails_at_the_drawn_case(debugging.check_trap_name, answer, capsys, tries=1)


def test_recovered_positions_recorded_beforehand_fail_at_the_drawn_cases(capsys):
    own = learner_copy(debugging.solution_recovered_positions)
    answer = _recorded(debugging.check_recovered_positions, own,
                       debugging.solution_recovered_positions,
                       lambda x, y, layout: torch.zeros(y.shape[:3], dtype=torch.float64))
    _fails_at_the_drawn_case(debugging.check_recovered_positions, answer, capsys, tries=1)


def test_trap_name_wrong_answers_fail(capsys):
    assert debugging.check_trap_name(lambda pos: "none") is False
    assert debugging.check_trap_name(lambda pos: "sbhd_row_indexing") is False
    assert "❌" in capsys.readouterr().out


needs_te_bits = pytest.mark.skipif(debug.te_bits_file() is None,
                                   reason="no benchmarks/results/te-bits-*.pt here")


@needs_te_bits
def test_te_rounding_worked_out_here_is_te_bit_for_bit():
    # the drawn case's expected value: on both stored cases it is TE's stored output exactly
    for case in debugging.te_cases():
        y = debugging._te_rounding(case.x.float(), case.te_cos.float(), case.te_sin.float())
        assert int(debug.bits_differ(y.to(case.x.dtype), case.te).sum()) == 0, case.key


def test_fma32_rounds_once_also_where_the_fp64_sum_lands_halfway():
    # a*b + d = 256 + 2^-15 + 2^-16 - 2^-46: the fp64 sum rounds to the fp32 midpoint, and
    # rounding that again (ties to even) would give 256 + 2^-14; one rounding gives 256 + 2^-15
    a, b = torch.tensor([2.0 ** -16 * (1 + 2.0 ** -15)]), torch.tensor([1 - 2.0 ** -15])
    d = torch.tensor([256 + 2.0 ** -15])
    assert float((a.double() * b.double() + d.double()).float()) == 256 + 2.0 ** -14
    assert float(debugging._fma32(a, b, d)) == 256 + 2.0 ** -15
    assert float(debugging._fma32(-a, b, -d)) == -(256 + 2.0 ** -15)
    # and where a*b + d is exact in fp32 and fp64 alike
    assert float(debugging._fma32(torch.tensor([3.0]), torch.tensor([0.5]),
                                  torch.tensor([1.0]))) == 2.5


@needs_te_bits
def test_te_combine_worked_solution_passes(capsys):
    assert debugging.check_te_combine(learner_copy(debugging.solution_te_combine)) is True
    out = capsys.readouterr().out
    assert "❌" not in out and "x drawn with seed " in out and "has TE's rounding" in out, out


# TE's stored outputs, recorded beforehand: x's first half of each row -> the row's two halves
_TE_TABLE: dict = {}


def _te_look_up(y1, y2, x1):
    """In Triton's interpreter a @triton.jit function runs Python: overwrite each row of the
    tiles with TE's stored output where x's row is one the table holds."""
    rows = x1.handle.data
    for i in range(rows.shape[0]):
        hit = _TE_TABLE.get(np.ascontiguousarray(rows[i]).tobytes())
        if hit is not None:
            y1.handle.data[i] = hit[0]
            y2.handle.data[i] = hit[1]
    return y1, y2


@triton.jit
def _table_combine(x1, x2, c, s):
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    return _te_look_up(y1, y2, x1)


@triton.jit
def _wrong_sign(x1, x2, c, s):
    return x1 * c + x2 * s, x2 * c - x1 * s


@needs_te_bits
@pytest.mark.skipif(not runtime.INTERPRET, reason="a table look-up runs only in the interpreter")
def test_te_outputs_recorded_beforehand_fail_at_the_drawn_x(capsys):
    for case in debugging.te_cases():
        D = case.x.shape[-1]
        xs = case.x.float().reshape(-1, D).numpy()
        ys = case.te.float().reshape(-1, D).numpy()
        for x_row, y_row in zip(xs, ys):
            _TE_TABLE[x_row[:D // 2].tobytes()] = (y_row[:D // 2].copy(), y_row[D // 2:].copy())
    try:
        assert debugging.check_te_combine(_table_combine) is False
    finally:
        _TE_TABLE.clear()
    out = capsys.readouterr().out
    stored_exact = re.findall(r"^\s+\S+, S=\d+ B=\d+ H=\d+ D=\d+: 0 of [\d,]+ elements differ", out, re.M)
    assert len(stored_exact) == 2, out        # the table holds both stored cases' bits...
    failed = [line for line in out.splitlines() if line.startswith("❌")]
    assert failed and "x drawn with seed " in failed[0], out      # ...and nothing for x drawn now


@needs_te_bits
def test_te_combine_wrong_line_fails(capsys):
    assert debugging.check_te_combine(_wrong_sign) is False
    out = capsys.readouterr().out
    assert "❌" in out and "the values are wrong" in out, out


# --- notebook 09: RoPE's share of a profiled step -----------------------------------------------

def test_rope_share_worked_solution_passes(capsys):
    assert in_a_model.check_rope_share(learner_copy(in_a_model.solution_rope_share))
    out = capsys.readouterr().out
    assert "✅" in out and "❌" not in out, out


def test_rope_share_drawn_step_names_some_kernels_and_varies():
    label, events, names = in_a_model._drawn_step()
    assert "drawn with seed " in label and 6 <= len(events) <= 24 and names
    assert all(us > 0 for _, us in events)
    assert in_a_model._drawn_step()[0] != label           # a new seed on every call


def test_rope_shares_recorded_beforehand_fail_at_the_drawn_step(capsys):
    answer = _recorded(in_a_model.check_rope_share,
                       learner_copy(in_a_model.solution_rope_share),
                       in_a_model.solution_rope_share, lambda events, names: (0.0, 1.0, 0.0))
    _fails_at_the_drawn_case(in_a_model.check_rope_share, answer, capsys)


def test_rope_share_wrong_answers_fail(capsys):
    def exact_names(events, names):
        rope = sum(us for k, us in events if k in names)
        step = sum(us for _, us in events)
        return rope, step, rope / step

    assert in_a_model.check_rope_share(exact_names) is False
    assert in_a_model.check_rope_share(lambda events, names: (0.0, 0.0, 0.0)) is False
    assert "❌" in capsys.readouterr().out
