"""Notebook 02, section 6: the count's table has no angle near a bf16 tie (so its two runs of
TE's chain agree bit for bit on any CPU), and `near_bf16_tie` finds the ones a longer table has."""
import torch

from ropelib.course.nb02_bf16_ties import near_bf16_tie
from ropelib.frequencies import rope_freqs


def test_finds_the_ties_of_a_longer_table():
    # cos(435 theta_50) rounds to 0.947265625 in fp32, the midpoint of two bf16 values
    near = near_bf16_tie(rope_freqs(512, 128))
    assert near.shape == (512, 1, 1, 128)
    assert sorted(near.nonzero()[:, 0].tolist()) == [143, 143, 435, 435]
    assert not near_bf16_tie(rope_freqs(512, 128), ulps=0).any()


def test_the_count_tables_have_none():
    assert not near_bf16_tie(rope_freqs(128, 128)).any()     # notebook 02's count (Sc, Dc)
    assert not near_bf16_tie(rope_freqs(8, 128)).any()       # its te_unfused_sbhd check
    assert not near_bf16_tie(rope_freqs(16, 32)).any()       # section 2 in the interpreter


def test_exercise_4_tables_have_none():
    # its fixed cases, and every table nb02_lean_chain's check can draw (2 to 11 rows, head_dim
    # 4 to 32)
    drawn = [(s, d) for s in range(2, 12) for d in range(4, 34, 2)]
    for s, d in [(16, 32), (7, 8), (9, 16)] + drawn:
        angles = torch.arange(s, dtype=torch.float32)[:, None] * \
            (10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d))
        assert not near_bf16_tie(torch.cat((angles, angles), -1)).any(), (s, d)
