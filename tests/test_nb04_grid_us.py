"""Notebook 04's exercise 3 (the grid's predicted time): the check takes a learner's own model
and refuses the worked solution, notebook 03's worked prediction and wrong models."""


def _own(S, B, H, sms, ns_per_program_per_sm, copy_us):
    starts = S * H / sms * ns_per_program_per_sm / 1e3
    return starts if starts > copy_us else copy_us


def test_grid_us_accepts_own_model(capsys):
    from ropelib.course.exercises import kernels as ex
    assert ex.check_grid_us(_own) is True
    assert "✅" in capsys.readouterr().out


def test_grid_us_refuses_the_worked_solutions(capsys):
    """The worked solution, and notebook 03's prediction handed the grid's rows, are refused."""
    from ropelib.course.exercises import kernels as ex
    assert ex.check_grid_us(ex.solution_grid_us) is False
    assert "ropelib's" in capsys.readouterr().out

    def via_notebook_03(S, B, H, sms, ns, copy_us):
        return ex.solution_predicted_us(S * B * H, B, sms, ns, copy_us)
    assert ex.check_grid_us(via_notebook_03) is False
    assert "ropelib's" in capsys.readouterr().out


def test_grid_us_refuses_wrong_models(capsys):
    from ropelib.course.exercises import kernels as ex
    for wrong in (lambda S, B, H, sms, ns, c: S * H / sms * ns / 1e3,          # bytes forgotten
                  lambda S, B, H, sms, ns, c: max(S * B * H / sms * ns / 1e3, c),  # naive grid
                  lambda S, B, H, sms, ns, c: ...):
        assert ex.check_grid_us(wrong) is False
        assert "❌" in capsys.readouterr().out


def test_grid_us_accepts_the_worked_solution_as_a_learner_typed_it(capsys):
    from loading import learner_copy
    from ropelib.course.exercises import kernels as ex
    assert ex.check_grid_us(learner_copy(ex.solution_grid_us)) is True
    assert "✅" in capsys.readouterr().out


def test_grid_us_refuses_a_right_answer_behind_ropelib(capsys):
    """The right numbers, after a call into ropelib's finished API or the bytes model: refused."""
    import torch

    import ropelib
    from ropelib.bench import compare
    from ropelib.course.exercises import kernels as ex

    def after_apply_rope(*args):
        x = torch.randn(2, 1, 1, 8)
        ropelib.apply_rope(x, ropelib.rope_freqs(2, 8))
        return _own(*args)

    def after_bytes_model(S, B, H, sms, ns, copy_us):
        compare.bytes_moved(compare.Config(S, B, H, 128, dtype="bf16"))
        return _own(S, B, H, sms, ns, copy_us)
    for answer in (after_apply_rope, after_bytes_model):
        assert ex.check_grid_us(answer) is False
        assert "ropelib's" in capsys.readouterr().out
