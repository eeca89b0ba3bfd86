"""The GPU tile choice (launch.pick_tiles with an SM count), checked on any machine.

The interpreter plans its own large tiles, so the tiles a GPU gets are only ever compiled on a
GPU; Triton refuses a launch whose num_warps is not a power of two. Here every choice is made
for an H100's and an H200's SM counts over decode, training and partial-rotary shapes, for
RoPE's finished kernel and the multi-axis kernel."""
import itertools

import pytest

from ropelib.kernels import launch, planning


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@pytest.mark.parametrize("sm_count", [114, 132])
@pytest.mark.parametrize("elem_size", [2, 4])
def test_gpu_tiles_are_powers_of_two(sm_count, elem_size):
    shapes = itertools.product((1, 3, 16, 1000, 4096), (1, 2, 64), ((32,), (32, 8), (4, 2), (1,)),
                               ((128, 128), (64, 128), (4, 6), (8, 16), (16, 20), (12, 16)))
    for S, B, heads, (R, D) in shapes:
        bs, bh, chunk, warps = launch.pick_tiles(S, B, heads, R, D, elem_size, sm_count)
        what = f"S={S} B={B} heads={heads} R={R} D={D} elem={elem_size}: {bs, bh, chunk, warps}"
        assert _pow2(warps) and warps <= 32, what
        assert _pow2(bs) and _pow2(bh), what
        assert 1 <= chunk <= max(B, 1), what


@pytest.mark.parametrize("sm_count", [114, 132])
def test_multi_axis_gpu_tiles_are_powers_of_two(sm_count):
    from ropelib.kernels import mrope
    for S, B, heads, (R, D), per_batch in itertools.product(
            (1, 7, 16, 4096), (1, 4), (1, 5, 40), ((128, 128), (64, 80), (16, 20), (32, 48)),
            (False, True)):
        bs, hps, group, chunk, warps = mrope.pick_tiles(S, B, heads, R, D, per_batch, sm_count)
        what = f"S={S} B={B} heads={heads} R={R} D={D}: {bs, hps, group, chunk, warps}"
        assert _pow2(warps) and warps <= 16, what
        assert _pow2(bs) and _pow2(hps), what


def test_a_launch_refuses_a_warp_count_triton_refuses():
    with pytest.raises(ValueError, match="num_warps must be a power of two"):
        planning.Launch((1,), 3, {}, (), None)
