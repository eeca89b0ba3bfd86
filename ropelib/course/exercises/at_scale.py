"""Exercises of notebook 11 (RoPE at scale): the global positions a context-parallel rank holds,
and the slot of a position in a paged KV cache.

Each `check_...` calls the learner's function on several cases and compares it with what
ropelib computes (`ropelib.context_parallel.dual_chunk_positions`,
`ropelib.kv_cache.cache_slots`), never with a hard-coded answer; `solution_...` are the worked
answers the notebook shows folded away (tests/test_exercises_at_scale.py checks that they pass).
"""
from typing import Callable

import torch

from ... import context_parallel, kv_cache
from . import _compare, call_answer, check

__all__ = ["check_dual_chunk_positions", "solution_dual_chunk_positions", "check_paged_slot",
           "solution_paged_slot"]


def _cases(name: str, fn: Callable, cases, hint: str) -> bool:
    """Run fn on every case; report the first wrong one (or ✅ for all). Never raises."""
    answer = expected = None
    for label, args, expected in cases:
        ok, answer = call_answer(f"{name} ({label})", fn, *args)
        if not ok:
            return False
        try:
            answer = torch.as_tensor(answer) if isinstance(answer, (list, tuple)) else answer
        except (TypeError, ValueError, RuntimeError):
            pass  # not a list of numbers: check() below says what is wrong with it
        same, _ = _compare(answer, expected, None, None)
        if not same:
            return check(f"{name} ({label})", answer, expected, hint=hint)
    return check(name, answer, expected, hint=hint)


# --- 1. which global positions does rank r hold? ---------------------------------------------

def check_dual_chunk_positions(fn: Callable) -> bool:
    """fn(seq_len, cp_size, cp_rank) -> the seq_len / cp_size global positions (ints, in the
    order the rank holds them) of Transformer Engine's dual-chunk split."""
    cases = []
    for S, n, r in ((8, 2, 0), (8, 2, 1), (24, 3, 1), (16, 4, 3), (16, 4, 0), (6, 1, 0)):
        want = context_parallel.dual_chunk_positions(S // n, n, r)
        cases.append((f"seq_len={S}, cp_size={n}, rank {r}", (S, n, r), want))
    return _cases("dual-chunk positions", fn, cases,
                  hint="cut the sequence into 2*cp_size chunks of seq_len / (2*cp_size); rank r "
                       "holds chunk r, then chunk 2*cp_size-1-r")


def solution_dual_chunk_positions(seq_len, cp_size, cp_rank):
    seg = seq_len // (2 * cp_size)                       # positions per chunk
    first = range(cp_rank * seg, (cp_rank + 1) * seg)    # chunk r
    mirror = 2 * cp_size - 1 - cp_rank                   # chunk 2*cp_size-1-r
    second = range(mirror * seg, (mirror + 1) * seg)
    return list(first) + list(second)


# --- 2. where does position p of a sequence live in a paged cache? ---------------------------

def _slot(row, block_size: int, position: int):
    rows, slots = kv_cache.cache_slots(torch.tensor([position]), 1, torch.tensor([row]),
                                       block_size)
    return torch.tensor([int(rows[0, 0]), int(slots[0, 0])])


def check_paged_slot(fn: Callable) -> bool:
    """fn(block_table_row, block_size, position) -> (block, offset): where the key of `position`
    of a sequence whose block-table row is `block_table_row` is stored in a paged cache
    [n_blocks, block_size, H, D]."""
    cases = []
    for row, bs, p in (([5, 2, 7, 0], 4, 9), ([5, 2, 7, 0], 4, 3), ([3, 1], 16, 16),
                       ([6, 4, 1, 0, 2], 2, 7), ([0, 1, 2], 8, 23)):
        cases.append((f"row {row}, block_size={bs}, position {p}", (list(row), bs, p),
                      _slot(row, bs, p)))
    return _cases("paged slot", fn, cases,
                  hint="the sequence's position p sits in its (p // block_size)-th block, at "
                       "offset p % block_size; the block table says which block of the pool "
                       "that is")


def solution_paged_slot(block_table_row, block_size, position):
    logical = position // block_size           # the sequence's own block number
    return block_table_row[logical], position % block_size
