"""ropelib.course.branch_count: the finished kernel's sin/cos evaluations per launch, counted in
Triton's interpreter (notebook 05 reads which way the equal-halves branch goes with it)."""
import pytest

from ropelib.course.branch_count import sin_cos_evaluations


@pytest.mark.parametrize("tiles", [(1, 32, 8, 8), (2, 4, 1, 4)])
def test_one_evaluation_a_program_with_equal_halves_two_without(tiles):
    same = sin_cos_evaluations(4, 8, 32, 32, tiles=tiles)
    unequal = sin_cos_evaluations(4, 8, 32, 32, tiles=tiles, equal_halves=False)
    assert same["programs"] == unequal["programs"] > 1
    assert same["evaluations"] == same["programs"]
    assert unequal["evaluations"] == 2 * unequal["programs"]


@pytest.mark.parametrize("bad", [dict(S=0), dict(D=7), dict(H=True), dict(B=2.0)])
def test_bad_sizes_are_refused(bad):
    sizes = dict(dict(S=2, B=2, H=2, D=8), **bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        sin_cos_evaluations(**sizes)
