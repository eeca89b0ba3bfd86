"""Exercise checks for notebook 09 (ropelib inside a small GPT).

Two judgements the notebook makes with numbers, written by the learner:

* `same_training(curve, reference, other_seed)`: does a validation-loss curve stay as close to the
  reference as a second seed of the reference does? The notebook's rule: the mean absolute
  difference d(curve, reference) is at most 1.5 times d(other_seed, reference).
* `rope_share(events, rope_names)`: from (kernel name, device µs) pairs of one profiled step and
  substrings naming RoPE's kernels, RoPE's µs, the step's µs and RoPE's share of the step.

Each check tries the learner's function on made-up inputs whose answer is known, chosen so that
the usual slips (a signed mean, the maximum, the last evaluation alone, a strict inequality; an
exact name match, a dict that keeps one launch per name, a kernel counted once per substring, a
percentage) give a wrong answer somewhere. The function runs with ropelib's own answers and the
worked solutions below barred (`own_code`).
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, List, Sequence, Tuple

from .own_code import check_cases

__all__ = ["check_same_training", "check_rope_share", "solution_same_training",
           "solution_rope_share"]


# --- exercise 1: parity of two training runs ---------------------------------------------------

def _curve(n: int = 8) -> List[float]:
    """A made-up validation-loss curve: falls fast, then levels off."""
    return [1.9 + 2.3 * math.exp(-i / 2.5) for i in range(n)]


def _plus(curve: Sequence[float], offsets: Sequence[float]) -> List[float]:
    return [c + o for c, o in zip(curve, offsets)]


def _parity_cases() -> list:
    ref = _curve()
    n = len(ref)
    noise = [0.04, -0.03, 0.05, -0.02, 0.03, -0.04, 0.02, -0.03]      # d(seed, ref) = 0.0325
    seed = _plus(ref, noise)
    crossing = _plus(ref, [0.05, 0.04, 0.04, 0.03, 0.03, 0.02, 0.01, 0.0])   # d = 0.0275
    # dyadic numbers: every difference and mean below is exact, d(curve, ref) = 1.5 d(seed, ref)
    ref4 = [4.0, 3.0, 2.5, 2.25]
    raw = [
        ("the same curve", ref, ref, seed),
        ("0.08 above the reference all along", _plus(ref, [0.08] * n), ref, seed),
        ("0.04 below the reference all along", _plus(ref, [-0.04] * n), ref, seed),
        ("0.1 below the reference all along", _plus(ref, [-0.1] * n), ref, seed),
        ("equal at first, then drifting away", _plus(ref, [0, 0, 0, 0, 0, 0.05, 0.15, 0.30]),
         ref, seed),
        ("zigzagging around the reference", _plus(ref, [0.06, -0.06] * (n // 2)), ref, seed),
        ("one evaluation far off, the rest close",
         _plus(ref, [0.01, 0.0, 0.2, 0.0, -0.01, 0.0, 0.0, 0.0]), ref, seed),
        ("0.02 above, the other seed meeting the reference at the end",
         _plus(ref, [0.02] * n), ref, crossing),
        ("exactly 1.5 times the seed gap, 4 evaluations",
         _plus(ref4, [-0.375, 0.375, -0.375, 0.375]), ref4,
         _plus(ref4, [0.25, -0.25, 0.25, -0.25])),
    ]
    return [(label, (curve, r, other), solution_same_training(curve, r, other))
            for label, curve, r, other in raw]


class _Fresh:
    """Cases whose lists are copied for each call: an answer that changes a list in place does not
    change the next case (or the expected value, computed beforehand)."""

    def __init__(self, cases: Iterable):
        self.cases = list(cases)

    def __iter__(self):
        for label, args, expected in self.cases:
            yield label, tuple(_copy(a) for a in args), expected


def _copy(a):
    return set(a) if isinstance(a, (set, frozenset)) else list(a) if isinstance(a, list) else a


def check_same_training(fn: Callable) -> bool:
    """fn(curve, reference, other_seed) -> True when `curve` stays as close to `reference` as
    `other_seed` does: mean |curve - reference| <= 1.5 * mean |other_seed - reference| over the
    evaluations (three lists of validation losses of equal length).

    Tried on made-up curves whose answer is known (the same curve, constant offsets above and
    below, a late drift, a zigzag, one far-off evaluation, a second seed that meets the reference
    at the end, a curve exactly at the limit), with ropelib and the worked solutions barred.
    """
    return check_cases(
        "same_training", "your parity test", fn, _Fresh(_parity_cases()),
        hint="d(a, b) = the mean of |a_i - b_i| over all evaluations; True when "
             "d(curve, reference) <= 1.5 * d(other_seed, reference), the limit included",
        bar=_WORKED)


def solution_same_training(curve: Sequence[float], reference: Sequence[float],
                           other_seed: Sequence[float]) -> bool:
    def distance(a, b):                      # mean absolute difference over the evaluations
        return sum(abs(x - y) for x, y in zip(a, b)) / len(a)

    return distance(curve, reference) <= 1.5 * distance(other_seed, reference)


# --- exercise 2: RoPE's share of a profiled step -----------------------------------------------

_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
_ATTN_FWD, _ATTN_BWD = "flash_fwd_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"
_LAYERNORM = "vectorized_layer_norm_kernel<float, float>"
_ADAMW = "multi_tensor_apply_kernel<FusedAdamWMathFunctor>"
_MUL = "vectorized_elementwise_kernel<4, MulFunctor<float>>"
_CAT = "CatArrayBatchedCopy_aligned16_contig<float, unsigned int, 4, 64, 64>"


def _share_cases() -> list:
    # ropelib: one kernel, launched forward and backward in each of 2 layers
    one_kernel = [(_LAYERNORM, 6.5), (_GEMM, 41.0), ("_rope_kernel", 3.25), (_ATTN_FWD, 22.0),
                  (_GEMM, 18.5), (_LAYERNORM, 6.5), (_GEMM, 41.0), ("_rope_kernel", 3.5),
                  (_ATTN_FWD, 22.0), (_GEMM, 18.5), (_GEMM, 37.0), (_ATTN_BWD, 55.0),
                  ("_rope_kernel", 3.75), (_GEMM, 80.0), (_ATTN_BWD, 55.0),
                  ("_rope_kernel", 4.0), (_GEMM, 80.0), (_ADAMW, 12.25)]
    # a compiled model: RoPE fused into kernels named after what they fuse, and another library's
    split = [(_GEMM, 41.0), ("triton_poi_fused_add_cat_mul_rope_fwd_0", 5.5), (_ATTN_FWD, 22.0),
             ("rotary_embedding_kernel", 2.75), (_GEMM, 80.0), (_ATTN_BWD, 55.0),
             ("triton_poi_fused_cat_mul_neg_rope_bwd_1", 6.25), (_LAYERNORM, 6.5),
             ("triton_poi_fused_add_native_layer_norm_2", 4.0), (_ADAMW, 12.25)]
    # the PyTorch reference: generic elementwise kernels, none named after RoPE
    no_rope = [(_GEMM, 41.0), (_MUL, 3.0), (_MUL, 3.0), (_CAT, 2.5),
               ("vectorized_elementwise_kernel<4, AddFunctor<float>>", 3.0), (_ATTN_FWD, 22.0),
               (_GEMM, 80.0), (_ATTN_BWD, 55.0), (_ADAMW, 12.25)]
    raw = [
        ("one RoPE kernel, launched 4 times", one_kernel, {"_rope_kernel"}),
        ("RoPE split over 3 kernels, named inside longer names", split, {"rope", "rotary"}),
        ("a kernel that two of the substrings name", one_kernel, {"rope", "_rope_kernel"}),
        ("no kernel named after RoPE", no_rope, {"rope", "rotary"}),
    ]
    return [(label, (events, names), solution_rope_share(events, names))
            for label, events, names in raw]


def check_rope_share(fn: Callable) -> bool:
    """fn(events, rope_names) -> (rope_us, step_us, share): `events` lists (kernel name, device µs)
    pairs of one profiled step (a kernel launched several times appears several times);
    `rope_names` is a set of substrings, and a kernel is RoPE's when its name contains one of them
    (a kernel counts once however many it contains). rope_us sums RoPE's kernels, step_us every
    kernel, share = rope_us / step_us (a fraction, 0 when no kernel is RoPE's).

    Tried on made-up event lists whose answer is known, with ropelib and the worked solutions
    barred.
    """
    return check_cases(
        "rope_share", "your share of the step", fn, _Fresh(_share_cases()),
        hint="add up every event's µs for the step, and those whose name contains any of "
             "rope_names (each event once) for RoPE; share = rope_us / step_us, a fraction",
        rtol=1e-9, atol=1e-9, bar=_WORKED)


def solution_rope_share(events: Sequence[Tuple[str, float]],
                        rope_names: Iterable[str]) -> Tuple[float, float, float]:
    rope_us = step_us = 0.0
    for name, us in events:                      # a kernel launched n times is n events
        step_us += us
        if any(part in name for part in rope_names):   # counted once, however many match
            rope_us += us
    return rope_us, step_us, rope_us / step_us


_WORKED = (solution_same_training, solution_rope_share)
