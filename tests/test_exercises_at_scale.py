"""The notebook 11 checks in ropelib.course.exercises.at_scale: each accepts its worked solution,
rejects wrong answers (the mistakes a learner is likely to make) and unanswered placeholders,
and never raises."""
import pytest
import torch

from ropelib import context_parallel as cp
from ropelib.course.exercises import at_scale


# --- 1. dual-chunk positions --------------------------------------------------------------------

def test_dual_chunk_solution_passes(capsys):
    assert at_scale.check_dual_chunk_positions(at_scale.solution_dual_chunk_positions) is True
    assert capsys.readouterr().out.startswith("✅ dual-chunk positions: correct")


@pytest.mark.parametrize("S,n", [(8, 2), (24, 3), (16, 4)])
def test_dual_chunk_solution_is_ropelibs_split(S, n):
    for r in range(n):
        assert at_scale.solution_dual_chunk_positions(S, n, r) == \
            cp.dual_chunk_positions(S // n, n, r).tolist()


def _contiguous(S, n, r):                       # the split that does not balance the work
    return list(range(r * S // n, (r + 1) * S // n))


def _chunks_in_rank_order(S, n, r):             # the second chunk taken as r + cp_size
    seg = S // (2 * n)
    return list(range(r * seg, (r + 1) * seg)) + list(range((r + n) * seg, (r + n + 1) * seg))


def _mirror_off_by_one(S, n, r):                # chunk 2*cp_size - r instead of 2*cp_size-1-r
    seg = S // (2 * n)
    m = min(2 * n - r, 2 * n - 1)
    return list(range(r * seg, (r + 1) * seg)) + list(range(m * seg, (m + 1) * seg))


def _sorted_wrongly(S, n, r):                   # the right set, in the wrong order
    return sorted(at_scale.solution_dual_chunk_positions(S, n, r), reverse=True)


@pytest.mark.parametrize("wrong", [_contiguous, _chunks_in_rank_order, _mirror_off_by_one,
                                   _sorted_wrongly])
def test_dual_chunk_rejects_wrong_answers(wrong, capsys):
    assert at_scale.check_dual_chunk_positions(wrong) is False
    out = capsys.readouterr().out
    assert "❌ dual-chunk positions" in out and "hint:" in out


def test_dual_chunk_rejects_unanswered_and_never_raises(capsys):
    def unanswered(S, n, r):
        ...

    def crashes(S, n, r):
        raise ZeroDivisionError("oops")

    assert at_scale.check_dual_chunk_positions(unanswered) is False
    assert "returned None" in capsys.readouterr().out
    assert at_scale.check_dual_chunk_positions(crashes) is False
    assert "raised ZeroDivisionError" in capsys.readouterr().out
    assert at_scale.check_dual_chunk_positions(...) is False
    assert at_scale.check_dual_chunk_positions(lambda S, n, r: "0 1 6 7") is False
    assert at_scale.check_dual_chunk_positions(lambda S, n, r: [[0, 1], [6, 7]]) is False


# --- 2. the slot of a position in a paged cache -------------------------------------------------

def test_paged_slot_solution_passes(capsys):
    assert at_scale.check_paged_slot(at_scale.solution_paged_slot) is True
    assert capsys.readouterr().out.startswith("✅ paged slot: correct")


def test_paged_slot_solution_matches_a_paged_write():
    # the slot the solution names is the one ropelib's cache write fills
    from ropelib.kv_cache import write_kv_cache
    row, bs, p = [3, 0, 2, 1], 4, 10
    cache = torch.zeros(4, bs, 1, 2)
    other = torch.zeros_like(cache)
    k = torch.ones(1, 1, 1, 2)
    write_kv_cache(k, k, cache, other, torch.tensor([p]), block_table=torch.tensor([row]))
    block, offset = at_scale.solution_paged_slot(row, bs, p)
    assert cache.nonzero()[:, :2].unique(dim=0).tolist() == [[block, offset]]


@pytest.mark.parametrize("wrong", [
    lambda row, bs, p: (p // bs, p % bs),                 # ignores the block table
    lambda row, bs, p: (row[p % bs], p // bs),            # index and offset swapped
    lambda row, bs, p: (row[p // bs], p),                 # offset not reduced
    lambda row, bs, p: (row.index(p // bs), p % bs),      # the table read backwards
])
def test_paged_slot_rejects_wrong_answers(wrong, capsys):
    assert at_scale.check_paged_slot(wrong) is False
    assert "❌ paged slot" in capsys.readouterr().out


def test_paged_slot_rejects_unanswered(capsys):
    assert at_scale.check_paged_slot(lambda row, bs, p: None) is False
    assert "returned None" in capsys.readouterr().out
    assert at_scale.check_paged_slot(lambda row, bs, p: row[100]) is False
    assert "raised IndexError" in capsys.readouterr().out
