"""What notebook 12 derives in its prose, checked by brute force: section 3's claim that a run of
output columns holds every rotate-half partner only when it starts and ends on a head's edge
(and question 3's answer, that interleaved pairs need only an even start and width),
section 5's inverse rotation (the gradient through R(theta) is R(-theta) g, by autograd), and
section 8's chance of a lone resolution among its six live comparisons."""
import math
import re
from pathlib import Path

import pytest
import torch

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "12-rope-in-the-qkv-projection.py"


def partner(c, D):
    """Section 3's pi(c): column c = hD + j pairs with c + D/2 (j < D/2) or c - D/2."""
    return c + D // 2 if c % D < D // 2 else c - D // 2


@pytest.mark.parametrize("D", [2, 4, 8, 16, 32])
def test_a_column_tile_holds_every_partner_only_on_whole_heads(D):
    columns = 3 * D                                     # three heads side by side
    for n0 in range(columns):
        for width in range(1, columns - n0 + 1):
            tile = range(n0, n0 + width)
            closed = all(partner(c, D) in tile for c in tile)
            assert closed == (n0 % D == 0 and width % D == 0), (D, n0, width)


def test_interleaved_pairs_need_only_an_even_start_and_width():
    # question 3's answer: interleaved, the partner of c is c + 1 (even c) or c - 1 (odd c)
    for n0 in range(48):
        for width in range(1, 49 - n0):
            tile = range(n0, n0 + width)
            closed = all((c ^ 1) in tile for c in tile)
            assert closed == (n0 % 2 == 0 and width % 2 == 0), (n0, width)


def test_the_backward_rotates_by_minus_theta():
    gen = torch.Generator().manual_seed(12)
    a, b, theta = (torch.randn(64, generator=gen, dtype=torch.float64) for _ in range(3))
    a.requires_grad_(), b.requires_grad_()
    c, s = theta.cos(), theta.sin()
    q_a, q_b = a * c - b * s, b * c + a * s             # section 2's rotation, R(theta)
    g_a, g_b = (torch.randn(64, generator=gen, dtype=torch.float64) for _ in range(2))
    da, db = torch.autograd.grad((q_a, q_b), (a, b), (g_a, g_b))
    torch.testing.assert_close(da, g_a * c + g_b * s, rtol=0, atol=1e-14)   # section 5's dY_a
    torch.testing.assert_close(db, g_b * c - g_a * s, rtol=0, atol=1e-14)   # and dY_b
    # the same as rotating g by -theta
    torch.testing.assert_close(da, g_a * (-theta).cos() - g_b * (-theta).sin(), rtol=0, atol=1e-14)


def test_six_live_comparisons_and_their_chance_of_a_lone_resolution():
    source = NOTEBOOK.read_text(encoding="utf-8")
    sites = re.findall(r"^\s*(?:\w+ = )?grid_pair\((.+?)\)", source, re.M)
    # five call sites, one of them in a loop over two variants: six comparisons
    assert len(sites) == 5 and sites.count('v, "cublas"') == 1
    assert 'for v in ("persistent", "one_a_tile"):' in source
    p_eight = 2 * (math.comb(9, 8) + math.comb(9, 9)) / 2**9    # 8 or more wins of 9, either way
    assert p_eight == 20 / 512 and round(p_eight, 3) == 0.039
    assert round(6 * p_eight, 2) == 0.23                        # "at most 6 x 0.039 = 0.23"
    prose = " ".join(line.lstrip("# ") for line in source.splitlines())
    assert "(p = 20/512 ≈ 0.039)" in prose and "6 × 0.039 ≈ 0.23" in prose
