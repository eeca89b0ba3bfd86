"""Notebook 01's rotation matrix, relative score and rotate_half refuse a library's RoPE.

Each answer below computes the right values with transformers' RoPE code (GPT-J's
`apply_rotary_pos_emb` and `rotate_every_two`, Llama's `rotate_half`): the test first shows the
values are right, then that the check refuses the answer and names the function it reached. A
learner's own copy of each worked solution still passes. Skipped where transformers is absent.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from ropelib import frequencies  # noqa: E402
from ropelib.course.exercises import basics  # noqa: E402
from pathlib import Path  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
learner_copy = load_file("own_code_tests_nb01", ROOT / "tests" / "test_own_code.py").learner_copy

gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def _gptj_matrix(m, inv_freq):
    """GPT-J's RoPE applied to the basis vectors: column i is the RoPE of e_i."""
    d = 2 * inv_freq.numel()
    eye = torch.eye(d, dtype=inv_freq.dtype).view(d, 1, 1, d)
    ang = (m * inv_freq)[None, None]
    return gptj.apply_rotary_pos_emb(eye, ang.sin(), ang.cos()).view(d, d).T


def _gptj_score(q, k, offset, inv_freq):
    """The key rotated by GPT-J's RoPE, then a dot product."""
    ang = (offset * inv_freq)[None, None]
    k_rot = gptj.apply_rotary_pos_emb(k.view(1, 1, 1, -1), ang.sin(), ang.cos())
    return (q * k_rot.view(-1)).sum()


def _transformers_rotate_half(x, interleaved=False):
    if interleaved:
        d = x.shape[-1]
        return gptj.rotate_every_two(x.reshape(1, 1, -1, d)).reshape(x.shape)
    return llama.rotate_half(x)


def test_the_answers_compute_the_right_values():
    inv = frequencies.inv_freq(8, 10000.0, dtype=torch.float64)
    torch.testing.assert_close(_gptj_matrix(7, inv), basics.rotation_matrix_ref(7, inv))
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(_gptj_score(q, k, -5, inv),
                               basics.solution_relative_score(q, k, -5, inv))
    x = torch.randn(3, 12, dtype=torch.float64)
    for interleaved in (False, True):
        torch.testing.assert_close(_transformers_rotate_half(x, interleaved),
                                   basics.solution_rotate_half(x, interleaved))


@pytest.mark.parametrize("check, answer, words", [
    (basics.check_rotation_matrix, _gptj_matrix, "apply_rotary_pos_emb"),
    (basics.check_relative_score, _gptj_score, "apply_rotary_pos_emb"),
    (basics.check_rotate_half, _transformers_rotate_half, "rotate_"),
], ids=["ex1 GPT-J on the basis", "ex2 GPT-J rotates the key", "ex3 transformers' helpers"])
def test_a_library_rope_is_refused(check, answer, words, capsys):
    assert check(answer) is False
    out = capsys.readouterr().out
    assert "but the answer called" in out and "transformers" in out and words in out, out


@pytest.mark.parametrize("check, solution", [
    (basics.check_rotation_matrix, basics.solution_rotation_matrix),
    (basics.check_relative_score, basics.solution_relative_score),
    (basics.check_rotate_half, basics.solution_rotate_half),
])
def test_the_learners_own_code_still_passes(check, solution, capsys):
    assert check(learner_copy(solution)) is True, capsys.readouterr().out
