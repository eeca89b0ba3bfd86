"""Bugs found by random (differential) testing of the public RoPE entry points against
ropelib.reference, each pinned by the smallest input that showed it."""
import pytest
import torch

import ropelib
from ropelib.reference import rope_reference
from routes import forced  # tests/routes.py


@pytest.mark.parametrize("qk", [False, True])
def test_interleaved_odd_head_dim_rotates_each_heads_own_pairs(qk):
    # head dim 3, rotary dim 2: the pair is features (0, 1) of every head row. The two-pass
    # route (forced here; large inputs take it) paired elements by flat index parity, which for
    # an odd head dim pairs feature 2 of one row with feature 0 of the next
    torch.manual_seed(0)
    S, D, R = 4, 3, 2
    x, k = torch.randn(S, 1, D), torch.randn(S, 2, D)
    freqs = ropelib.rope_freqs(S, R, interleaved=True)
    opts = dict(layout="thd", interleaved=True, cu_seqlens=torch.tensor([0, S]))
    with forced("two-pass"):
        outs = (ropelib.apply_rope_qk(x, k, freqs, **opts) if qk
                else (ropelib.apply_rope(x, freqs, **opts),))
    for out, t in zip(outs, (x, k)):
        torch.testing.assert_close(out, rope_reference(t, freqs, **opts), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["sbhd", "thd"])
def test_start_positions_past_int32_give_nan_rows_not_wrapped_ones(layout):
    # with the value checks off (GPU index tensors by default) a position outside the table must
    # come out NaN; the kernel narrowed int64 start offsets to int32 first, so 2^32 + 1 wrapped
    # to 1 and read row 1.. of the table, a silently wrong rotation
    torch.manual_seed(0)
    freqs = ropelib.rope_freqs(8, 8)
    start = torch.tensor([2**32 + 1, 0])
    if layout == "thd":
        x, index = torch.randn(6, 2, 8), dict(cu_seqlens=torch.tensor([0, 3, 6]))
        inside = torch.tensor([False] * 3 + [True] * 3)
    else:
        x, index = torch.randn(3, 2, 2, 8), {}
        inside = torch.tensor([[False, True]] * 3)
    with ropelib.set_index_checks("off"):
        y = ropelib.apply_rope(x, freqs, layout=layout, start_positions=start, **index)
    assert torch.equal(torch.isnan(y).all(-1).all(-1), ~inside)
