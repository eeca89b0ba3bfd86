"""Exercise checks for notebooks 00-02 (setup, RoFormer math, PyTorch reference and layouts).

Every `check_...` computes its expected answer from ropelib itself (`reference`, `frequencies`,
`compare`), prints ✅ or ❌ through `ropelib.course.exercises.check`, returns a bool and never raises.
Helpers that take the learner's *function* try it on several fresh inputs and report the first
one that fails; they run it with ropelib's own answers barred (`own_code`): a function that calls
`ropelib.reference`, `ropelib.frequencies`, the finished API, the worked solution below or (for
the rotation matrix) `torch.block_diag` is refused, whatever it returns. The worked solutions are
the `solution_*` functions below, shown folded in the notebooks with
`ropelib.course.exercises.solution(basics.solution_...)`; the tests run every check on a learner's
copy of its solution, on library answers and on wrong answers.
"""
import math
from typing import Callable, Sequence

import torch

from ... import frequencies, reference, runtime
from . import check
from .own_code import check_cases

__all__ = [
    "check_device", "check_rotary_dim", "check_apply_rope",
    "check_rotation_matrix", "check_relative_angle", "check_rotate_half",
    "check_interleave_permutation",
    "check_positions", "check_cos_sin_from_freqs", "check_bytes_moved",
    "rotation_matrix_ref",
]


# --- notebook 00: setup and tour -------------------------------------------------------------

def check_device(answer) -> bool:
    """Which device do ropelib's notebooks put tensors on, on this machine? ("cuda" or "cpu")"""
    return check("the device ropelib picks", answer, runtime.default_device(),
                 hint="ropelib.default_device() is 'cuda' only with a GPU and without the interpreter")


def check_rotary_dim(answer, head_dim: int = 80, rotary_percent: float = 0.5) -> bool:
    """How many features of each head are rotated for this head_dim and rotary_percent?"""
    return check(f"rotary dim for head_dim={head_dim}, rotary_percent={rotary_percent}", answer,
                 frequencies.rotary_dim(head_dim, rotary_percent),
                 hint="TE and HF both take int(head_dim * rotary_percent)")


def check_apply_rope(y, x: torch.Tensor, freqs: torch.Tensor, *, layout: str = "sbhd",
                     interleaved: bool = False) -> bool:
    """Is y the RoPE of x (layout, interleaved) with the angle table freqs?"""
    expected = reference.rope_reference(x.detach(), freqs, layout=layout, interleaved=interleaved)
    return check(f"RoPE of x ({layout}{', interleaved' if interleaved else ''})", y, expected,
                 hint="ropelib.apply_rope(x, freqs, layout=..., interleaved=...): "
                 "are the layout and the pairing right?")


# --- notebook 01: RoFormer math --------------------------------------------------------------

def rotation_matrix_ref(m: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """R_m, the [R, R] block-diagonal rotation of position m (interleaved pairs, RoFormer eq. 13),
    read off the reference: column i is the RoPE of the basis vector e_i."""
    inv = inv_freq.to(torch.float64)
    ang = (m * inv).repeat_interleave(2)                                # [R], pairwise
    eye = torch.eye(ang.numel(), dtype=torch.float64)                   # rows e_i
    return reference.apply_rope_ref(eye, ang.cos(), ang.sin(), interleaved=True).T


def check_rotation_matrix(fn: Callable, rot_dim: int = 8, base: float = 10000.0) -> bool:
    """fn(m, inv_freq) -> the [R, R] block-diagonal matrix R_m (pairs (2j, 2j+1), angle m*theta_j)."""
    inv = frequencies.inv_freq(rot_dim, base).double()
    cases = [(f"m={m}", (m, inv.clone()), rotation_matrix_ref(m, inv)) for m in (0, 1, 5, 37)]
    return check_cases("rotation matrix R_m", "your rotation matrix, built from its 2x2 blocks "
                       "(no torch.block_diag, no ropelib)", fn, cases, atol=1e-6, rtol=0,
                       hint="block j is [[cos a, -sin a], [sin a, cos a]] with a = m * inv_freq[j]",
                       bar=(torch.block_diag, rotation_matrix_ref, solution_rotation_matrix))


def _wrap_to(answer, expected):
    """answer reduced modulo 2 pi into (expected - pi, expected + pi]."""
    a = torch.as_tensor(answer, dtype=torch.float64)
    if a.shape != expected.shape:
        return a
    return expected + torch.remainder(a - expected + math.pi, 2 * math.pi) - math.pi


def check_relative_angle(fn: Callable, rot_dim: int = 8, base: float = 10000.0) -> bool:
    """fn(m, n, inv_freq) -> [R/2] angles phi_j with R_m^T R_n = blockdiag(rot(phi_j)).

    The expected angles are read off the product of the reference matrices (atan2 of each
    block); answers are compared modulo 2 pi.
    """
    inv = frequencies.inv_freq(rot_dim, base).double()
    cases = []
    for m, n in [(0, 3), (5, 2), (7, 7), (100, 42), (1000, 1001)]:
        M = rotation_matrix_ref(m, inv).T @ rotation_matrix_ref(n, inv)
        j = torch.arange(0, rot_dim, 2)
        cases.append((f"m={m}, n={n}", (m, n, inv.clone()), torch.atan2(M[j + 1, j], M[j, j])))
    return check_cases("relative angle of R_m^T R_n", "your relative angles", fn, cases, atol=1e-4,
                       rtol=0, post=_wrap_to,
                       hint="R_m^T = R_{-m}, and rotations in the same plane add their angles",
                       bar=(rotation_matrix_ref, solution_relative_angle, solution_rotation_matrix))


def check_rotate_half(fn: Callable) -> bool:
    """fn(x, interleaved) -> rotate_half(x): [-x2, x1] (halves) or [-x1, x0, -x3, x2, ...]."""
    g = torch.Generator().manual_seed(1)
    cases = []
    for interleaved in (False, True):
        for shape in ((8,), (3, 2, 12)):
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            cases.append((f"interleaved={interleaved}, shape={shape}", (x.clone(), interleaved),
                          reference.rotate_half(x, interleaved)))
    return check_cases("rotate_half", "your own rotate_half", fn, cases,
                       atol=0, rtol=0,
                       hint="halves: torch.chunk(x, 2, -1); pairs: x[..., ::2] and x[..., 1::2]",
                       bar=(solution_rotate_half,))


def check_interleave_permutation(perm: Sequence[int], rot_dim: int = 8, *,
                                 to: str = "rotate_half") -> bool:
    """The feature permutation between the two pairings of the same rotation.

    to="rotate_half": perm with  interleaved RoPE(x) == rotate-half RoPE(x[..., perm])[..., inv]
    to="interleaved": perm with  rotate-half RoPE(x) == interleaved RoPE(x[..., perm])[..., inv]
    where inv = argsort(perm) undoes the permutation, and each side uses its own `rope_freqs`
    table. Checked by applying the reference to random inputs, not against a stored list.
    """
    if to not in ("rotate_half", "interleaved"):
        raise ValueError(f"to must be 'rotate_half' or 'interleaved', got {to!r}")
    src, dst = (True, False) if to == "rotate_half" else (False, True)   # interleaved flags
    name = f"{'interleaved' if src else 'rotate-half'} -> {to.replace('_', '-')} permutation (R={rot_dim})"
    if perm is None or perm is Ellipsis:
        return check(name, perm, None)
    try:
        p = torch.as_tensor(list(perm), dtype=torch.int64)
    except Exception:  # noqa: BLE001
        return check(name, False, True, hint=f"perm must be a list of ints, got {perm!r}")
    if p.shape != (rot_dim,) or not torch.equal(p.sort().values, torch.arange(rot_dim)):
        return check(name, sorted(p.tolist()), list(range(rot_dim)),
                     hint=f"perm must contain each of 0..{rot_dim - 1} exactly once")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2, 3, rot_dim, generator=g, dtype=torch.float64)      # [S, B, H, R]
    f_src = frequencies.rope_freqs(5, rot_dim, interleaved=src).double()
    f_dst = frequencies.rope_freqs(5, rot_dim, interleaved=dst).double()
    expected = reference.rope_reference(x, f_src, interleaved=src)
    answer = reference.rope_reference(x[..., p], f_dst, interleaved=dst)[..., torch.argsort(p)]
    return check(name, answer, expected, atol=1e-12, rtol=0,
                 hint="rotate-half pairs (j, j + R/2), interleaved pairs (2j, 2j+1): "
                 "where must each pair's two features go?")


# --- notebook 02: reference and layouts ------------------------------------------------------

def check_positions(answer, layout: str = "sbhd", seq_len: int = 8, batch: int = 1, *,
                    start_positions=None, cp_size: int = 1, cp_rank: int = 0,
                    cu_seqlens=None) -> bool:
    """The positions the tokens are rotated by, with TE's semantics ([B, S] or [T]).

    For sbhd/bshd a 1-D answer of S positions is accepted when every sequence has the same
    positions (no start_positions).
    """
    sp = None if start_positions is None else torch.as_tensor(start_positions)
    cu = None if cu_seqlens is None else torch.as_tensor(cu_seqlens)
    expected = reference.positions(layout, seq_len, batch, start_positions=sp, cp_size=cp_size,
                                   cp_rank=cp_rank, cu_seqlens=cu)
    if layout != "thd" and not isinstance(answer, (type(None), type(Ellipsis))):
        try:
            a = torch.as_tensor(answer)
            if a.dim() == 1 and bool((expected == expected[:1]).all()):
                expected = expected[0]
        except Exception:  # noqa: BLE001 -- check() reports the wrong type
            pass
    what = [f"layout={layout}"]
    if cp_size > 1:
        what.append(f"cp rank {cp_rank} of {cp_size}")
    if sp is not None:
        what.append(f"start_positions={sp.tolist()}")
    return check(f"positions ({', '.join(what)})", answer, expected,
                 hint="context parallel: 2*cp_size chunks, rank r holds chunks r and 2*cp_size-1-r"
                 if cp_size > 1 else "position = start offset + index in the sequence")


def check_cos_sin_from_freqs(fn: Callable) -> bool:
    """fn(freqs [S, 1, 1, R]) -> (cos, sin), each [S, R]: TE's angle table to HF's cache."""
    cases = []
    for interleaved, percent in ((False, 1.0), (True, 1.0), (False, 0.5)):
        f = frequencies.rope_freqs(6, 16, rotary_percent=percent, interleaved=interleaved, offset=3)
        want = frequencies.rope_cos_sin(6, 16, rotary_percent=percent, interleaved=interleaved,
                                        offset=3)
        cases.append((f"interleaved={interleaved}, rotary_percent={percent}", (f.clone(),),
                      tuple(want)))
    return check_cases("freqs -> (cos, sin)", "your own conversion", fn, cases,
                       hint="drop the two middle dims of [S, 1, 1, R], then take cos and sin",
                       bar=(solution_cos_sin_from_freqs,))


def check_bytes_moved(answer, seq_len: int, batch: int, heads: int, head_dim: int,
                      dtype: str = "bf16") -> bool:
    """Bytes a fused forward must move at least: read x, write y, read the fp32 angle table."""
    from ...bench.compare import Config, bytes_moved  # imported late: compare is a heavier module

    expected = bytes_moved(Config(seq_len, batch, heads, head_dim, dtype=dtype))
    return check(f"bytes moved, x [{seq_len}, {batch}, {heads}, {head_dim}] {dtype}", answer,
                 expected, hint="2 bytes per bf16 element, read once and written once, "
                 "plus seq_len * head_dim fp32 angles")


# --- worked solutions (shown folded in the notebooks) ----------------------------------------

def solution_rotation_matrix(m, inv_freq):
    R = 2 * inv_freq.numel()
    M = torch.zeros(R, R, dtype=inv_freq.dtype)
    for j, theta in enumerate(inv_freq):
        c, s = torch.cos(m * theta), torch.sin(m * theta)
        M[2 * j, 2 * j], M[2 * j, 2 * j + 1] = c, -s
        M[2 * j + 1, 2 * j], M[2 * j + 1, 2 * j + 1] = s, c
    return M


def solution_relative_angle(m, n, inv_freq):
    # R_m^T R_n = R_{-m} R_n = R_{n-m}: only the offset n - m survives.
    return (n - m) * inv_freq


def solution_rotate_half(x, interleaved=False):
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x_odd, x_even), dim=-1).flatten(-2)


def solution_interleave_permutation(rot_dim=8, to="rotate_half"):
    if to == "rotate_half":
        # even features first (they become the first half), then the odd ones
        return list(range(0, rot_dim, 2)) + list(range(1, rot_dim, 2))
    # the way back: feature i of the first half and i + R/2 become the pair (2i, 2i+1)
    half = rot_dim // 2
    return [i // 2 + (i % 2) * half for i in range(rot_dim)]


def solution_cos_sin_from_freqs(freqs):
    angles = freqs[:, 0, 0, :]          # [S, 1, 1, R] -> [S, R]
    return angles.cos(), angles.sin()


def solution_bytes_moved(seq_len, batch, heads, head_dim, bytes_per_element=2):
    x_bytes = seq_len * batch * heads * head_dim * bytes_per_element
    table_bytes = seq_len * head_dim * 4          # fp32 angles, read once
    return 2 * x_bytes + table_bytes              # read x, write y, read the table
