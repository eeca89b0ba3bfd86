"""Notebook 09, exercise 1 (b): `check_rope_copies`, RoPE's bytes and copies in a profiled step.

The worked solution typed in passes, and so does an answer written differently; the worked
solution itself, an answer that calls into ropelib, an answer recorded from an earlier run of the
check (a hard-coded table) and the likely slips fail."""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import ropelib  # noqa: E402
from ropelib import frequencies  # noqa: E402
from ropelib.course.exercises import in_a_model  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
learner_copy = load_file("own_code_tests_nb09_copies",
                         ROOT / "tests" / "test_own_code.py").learner_copy
check = in_a_model.check_rope_copies


def _written_here(events, rope_names, qk_shape, elt_bytes, copy_gbps):
    times = [us for name, us in events if any(s in name for s in rope_names)]
    if not times:
        return 0, 0.0
    b, s, h, d = qk_shape
    moved = 4 * len(times) * b * s * h * d * elt_bytes
    return moved, sum(times) * copy_gbps * 1e3 / moved


def _slip(n_launches=None, factor=4, us_per_byte=1e-3):
    def answer(events, rope_names, qk_shape, elt_bytes, copy_gbps):
        times = [us for name, us in events if any(s in name for s in rope_names)]
        if not times:
            return 0, 0.0
        b, s, h, d = qk_shape
        moved = factor * (n_launches or len(times)) * b * s * h * d * elt_bytes
        return moved, sum(times) / (moved / copy_gbps * us_per_byte)
    return answer


def test_the_worked_solution_typed_in_and_an_own_answer_pass(capsys):
    assert check(learner_copy(in_a_model.solution_rope_copies))
    assert check(_written_here)
    out = capsys.readouterr().out
    assert "✅ rope_copies: correct" in out and "❌" not in out, out


def test_the_committed_step_is_a_case_and_matches_section_5(capsys):
    cases = {label: (args, expected) for label, args, expected in in_a_model._copies_cases()}
    label = next(k for k in cases if k.startswith("notebook 09's step with ropelib's RoPE"))
    (events, names, shape, elt, gbps), (moved, copies) = cases[label]
    assert shape == (64, 256, 6, 64) and elt == 2
    assert moved == 603979776 and round(copies, 2) == 1.28   # the profile's bytes, 12 launches
    assert any(k.startswith("a step, shape, dtype and bandwidth drawn with seed") for k in cases)


def test_the_worked_solution_and_a_library_call_are_refused(capsys):
    assert check(in_a_model.solution_rope_copies) is False
    assert "called ropelib's solution_rope_copies" in capsys.readouterr().out
    assert check(lambda *a: in_a_model.solution_rope_share(a[0], a[1]) and _written_here(*a)) \
        is False
    assert "called ropelib's solution_rope_share" in capsys.readouterr().out
    x, f = torch.randn(2, 1, 1, 4), frequencies.rope_freqs(2, 4)

    def after_a_library_call(*a):
        ropelib.apply_rope(x, f)
        return _written_here(*a)
    assert check(after_a_library_call) is False
    assert "called ropelib's apply_rope" in capsys.readouterr().out


def test_a_table_recorded_from_an_earlier_run_fails_at_the_drawn_case(capsys):
    seen = []

    def recording(*args):
        seen.append(args)
        return _written_here(*args)
    assert check(recording)
    table = [(repr(a), in_a_model.solution_rope_copies(*a)) for a in seen]

    def hard_coded(*args):
        return next((r for k, r in table if k == repr(args)), (0, 0.0))
    for _ in range(3):                 # a draw may, rarely, repeat one: a few draws
        capsys.readouterr()
        if not check(hard_coded):
            break
    failed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("❌")]
    assert failed and "drawn with seed" in failed[0], failed


def test_the_likely_slips_fail(capsys):
    assert check(_slip(n_launches=12)) is False        # the layers from the model, not the events
    assert check(_slip(factor=2)) is False             # q and k read, not written (or one of them)
    assert check(_slip(us_per_byte=1e-9)) is False     # GB/s taken as bytes a µs
    assert check(lambda *a: (0, 0.0)) is False
    capsys.readouterr()
