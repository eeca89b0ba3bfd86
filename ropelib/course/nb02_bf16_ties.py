"""Notebook 02, section 6: where two evaluations of TE's chain can disagree.

Every op of TE's plain-PyTorch chain but `cos` and `sin` is an IEEE operation, correctly rounded
on any CPU or GPU, whatever its vector width or the way a parallel loop splits the tensor. `cos`
and `sin` are not: a math library may return either fp32 neighbour of the exact value, and two
code paths of one library may differ by that ulp. The chain rounds them to bf16 at once, so an
angle whose fp32 cosine or sine lies within an ulp or two of a bf16 rounding tie can give a
different bf16 table, and then different outputs, from one evaluation to the next.
`near_bf16_tie` finds those angles.
"""
import torch

__all__ = ["near_bf16_tie"]


def near_bf16_tie(angles: torch.Tensor, ulps: int = 3) -> torch.Tensor:
    """A bool tensor of `angles`' shape: True where cos or sin, correctly rounded to fp32 (from
    fp64) and then moved by up to `ulps` fp32 ulps either way, rounds to another bf16 value."""
    near = torch.zeros(angles.shape, dtype=torch.bool)
    exact = angles.detach().cpu().double()
    for value in (exact.cos().float(), exact.sin().float()):
        for towards in (float("inf"), float("-inf")):
            moved = value
            for _ in range(ulps):
                moved = torch.nextafter(moved, torch.full_like(moved, towards))
                near |= moved.bfloat16() != value.bfloat16()
    return near
