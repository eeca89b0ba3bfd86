"""ropelib/course/exercises/nb09_one_angle.py: notebook 09's exercise 4, one angle a pair."""

from pathlib import Path

from ropelib.course.exercises import in_a_model
from ropelib.course.exercises import nb09_one_angle as ex
from loading import load_file

ROOT = Path(__file__).resolve().parents[1]
_model_tests = load_file("exercises_model_tests", ROOT / "tests" / "test_exercises_model.py")
learner_copy = _model_tests.learner_copy


def test_the_worked_one_angle_kernel_typed_in_passes(capsys):
    mine = learner_copy(in_a_model.solution_model_rope_one_angle)
    assert ex.check_one_angle_kernel(mine, seed=0)
    out = capsys.readouterr().out
    assert "✅ one angle a pair: 1 sine or cosine an element" in out and "❌" not in out, out


def test_exercise_3s_kernel_with_two_angles_a_pair_fails_the_count(capsys):
    mine = learner_copy(in_a_model.solution_model_rope_kernel)
    assert ex.check_one_angle_kernel(mine, seed=0) is False
    out = capsys.readouterr().out
    assert "✅ RoPE kernel in the model" in out                 # exercise 3's check passes
    assert "❌ one angle a pair: 2 sines and cosines an element" in out, out


def test_the_worked_solution_from_ropelib_is_refused(capsys):
    assert ex.check_one_angle_kernel(in_a_model.solution_model_rope_one_angle, seed=0) is False
    out = capsys.readouterr().out
    assert "solution_model_rope_one_angle" in out and "write it yourself" in out, out
    assert "✅" not in out, out


def test_a_kernel_that_calls_the_worked_one_is_refused(capsys):
    calling = _model_tests._calling(in_a_model.solution_model_rope_one_angle)
    assert ex.check_one_angle_kernel(calling, seed=0) is False
    out = capsys.readouterr().out
    assert "solution_model_rope_one_angle" in out and "write it yourself" in out, out


def test_a_kernel_that_ignores_its_input_fails(capsys):
    # one cosine a pair, but the rotation of a fixed input: a hard-coded answer
    blank = _model_tests._kernel_variant(
        "fixed input", ("x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0)",
                        "x1 = 0.0 * tl.load(x_row + offs * stride_xd, mask=mask, other=0.0)"))
    assert ex.check_one_angle_kernel(blank, seed=0) is False
    assert "❌ RoPE kernel in the model" in capsys.readouterr().out


def test_the_count_reads_the_compiled_code():
    assert ex.trig_per_element(in_a_model.solution_model_rope_one_angle) == 1
    assert ex.trig_per_element(in_a_model.solution_model_rope_kernel) == 2
