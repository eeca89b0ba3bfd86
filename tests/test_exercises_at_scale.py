"""The notebook 11 checks in ropelib.course.exercises.at_scale: each accepts its worked solution,
rejects wrong answers (the mistakes a learner is likely to make), answers that call ropelib's
own (the library computes the expected values; the learner's code must compute the answer) and
unanswered placeholders, and never raises. The kernels run under Triton's interpreter on the
CPU, on tiny decoding steps."""
import pytest
import torch
import triton
import triton.language as tl

import ropelib
from ropelib import context_parallel as cp
from ropelib import kv_cache
from ropelib.course.exercises import at_scale
from ropelib.kernels.common import rotate_pair
from loading import learner_copy  # noqa: E402  (a solution as a learner who typed it has it)


# --- 1. dual-chunk positions --------------------------------------------------------------------

def test_dual_chunk_solution_passes(capsys):
    assert at_scale.check_dual_chunk_positions(
        learner_copy(at_scale.solution_dual_chunk_positions)) is True
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


_OWN_DUAL_CHUNK = learner_copy(at_scale.solution_dual_chunk_positions)


def _sorted_wrongly(S, n, r):                   # the right set, in the wrong order
    return sorted(_OWN_DUAL_CHUNK(S, n, r), reverse=True)


@pytest.mark.parametrize("wrong", [_contiguous, _chunks_in_rank_order, _mirror_off_by_one,
                                   _sorted_wrongly])
def test_dual_chunk_rejects_wrong_answers(wrong, capsys):
    assert at_scale.check_dual_chunk_positions(wrong) is False
    out = capsys.readouterr().out
    assert "❌ dual-chunk positions" in out and "hint:" in out


@pytest.mark.parametrize("library", [
    lambda S, n, r: cp.dual_chunk_positions(S // n, n, r),
    lambda S, n, r: cp.shard(torch.arange(S), n, r, dim=0),
], ids=["dual_chunk_positions", "shard"])
def test_dual_chunk_rejects_the_library(library, capsys):
    assert at_scale.check_dual_chunk_positions(library) is False
    out = capsys.readouterr().out
    assert "❌ dual-chunk positions" in out and "ropelib's" in out \
        and "ropelib/context_parallel.py" in out


def test_dual_chunk_rejects_unanswered_and_never_raises(capsys):
    def unanswered(S, n, r):
        ...

    def crashes(S, n, r):
        raise ZeroDivisionError("oops")

    assert at_scale.check_dual_chunk_positions(unanswered) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ dual-chunk positions") and "returned None" in out, out
    assert "replace the `...` with code that returns the list of the seq_len / cp_size global " \
        "positions rank cp_rank holds" in out, out
    assert at_scale.check_dual_chunk_positions(crashes) is False
    assert "raised ZeroDivisionError" in capsys.readouterr().out
    assert at_scale.check_dual_chunk_positions(...) is False
    assert at_scale.check_dual_chunk_positions(lambda S, n, r: "0 1 6 7") is False
    assert at_scale.check_dual_chunk_positions(lambda S, n, r: [[0, 1], [6, 7]]) is False


# --- 2. the slot of a position in a paged cache -------------------------------------------------

def test_paged_slot_solution_passes(capsys):
    assert at_scale.check_paged_slot(learner_copy(at_scale.solution_paged_slot)) is True
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


def test_paged_slot_rejects_the_library(capsys):
    def with_cache_slots(row, bs, p):
        rows, slots = kv_cache.cache_slots(torch.tensor([p]), 1, torch.tensor([row]), bs)
        return int(rows[0, 0]), int(slots[0, 0])

    assert at_scale.check_paged_slot(with_cache_slots) is False
    out = capsys.readouterr().out
    assert "ropelib's cache_slots (ropelib/kv_cache.py)" in out


def test_paged_slot_rejects_unanswered(capsys):
    def unanswered(row, bs, p):
        ...

    assert at_scale.check_paged_slot(unanswered) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ paged slot") and "returned None" in out, out
    assert "replace the `...` with code that returns (block, offset)" in out, out
    assert at_scale.check_paged_slot(...) is False
    assert "no answer yet" in capsys.readouterr().out
    assert at_scale.check_paged_slot(lambda row, bs, p: row[100]) is False
    assert "raised IndexError" in capsys.readouterr().out


# --- 3. and 4. RoPE + KV-cache write kernels ----------------------------------------------------

@triton.jit
def _rotate_heads(x_ptr, y_ptr, rows, c, s, HALF: tl.constexpr):
    j = tl.arange(0, HALF)[None, :]
    x1 = tl.load(x_ptr + rows + j).to(tl.float32)
    x2 = tl.load(x_ptr + rows + HALF + j).to(tl.float32)
    tl.store(y_ptr + rows + j, x1 * c - x2 * s)
    tl.store(y_ptr + rows + HALF + j, x2 * c + x1 * s)


@triton.jit
def _step(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, freqs_ptr, b, pos, slot_row,
          HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, ROTATE_K: tl.constexpr):
    # one decoding step of sequence b at position pos, k and v to cache row slot_row
    HALF: tl.constexpr = D // 2
    theta = tl.load(freqs_ptr + pos * D + tl.arange(0, HALF)[None, :])
    c, s = tl.cos(theta), tl.sin(theta)
    hq = tl.arange(0, HQ)[:, None]
    _rotate_heads(q_ptr, q_out_ptr, (b * HQ + hq) * D, c, s, HALF)
    hk = tl.arange(0, HK)[:, None]
    slot = (slot_row * HK + hk) * D
    f = tl.arange(0, D)[None, :]
    if ROTATE_K:
        j = tl.arange(0, HALF)[None, :]
        k1 = tl.load(k_ptr + (b * HK + hk) * D + j).to(tl.float32)
        k2 = tl.load(k_ptr + (b * HK + hk) * D + HALF + j).to(tl.float32)
        tl.store(k_cache_ptr + slot + j, k1 * c - k2 * s)
        tl.store(k_cache_ptr + slot + HALF + j, k2 * c + k1 * s)
    else:                                   # the key stored as it came: RoPE forgotten
        tl.store(k_cache_ptr + slot + f, tl.load(k_ptr + (b * HK + hk) * D + f))
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


@triton.jit
def unrotated_k_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                       freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    _step(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, freqs_ptr, b, pos,
          b * L + pos, HQ, HK, D, False)


@triton.jit
def next_slot_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                     freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr):
    # writes one slot too far (position seqlens[b] + 1), wraps the last one
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    _step(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, freqs_ptr, b, pos,
          b * L + (pos + 1) % L, HQ, HK, D, True)


@triton.jit
def no_block_table_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                          block_table_ptr, freqs_ptr, MAX_BLOCKS, BS, HQ: tl.constexpr,
                          HK: tl.constexpr, D: tl.constexpr):
    # the sequence's own block number taken as the pool's block
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    _step(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, freqs_ptr, b, pos,
          (b * MAX_BLOCKS + pos // BS) * BS + pos % BS, HQ, HK, D, True)


@triton.jit
def library_paged_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                         block_table_ptr, freqs_ptr, MAX_BLOCKS, BS, HQ: tl.constexpr,
                         HK: tl.constexpr, D: tl.constexpr):
    # the right slots, k rotated by ropelib's rotate_pair
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    j = tl.arange(0, HALF)[None, :]
    theta = tl.load(freqs_ptr + pos * D + j)
    c, s = tl.cos(theta), tl.sin(theta)
    _rotate_heads(q_ptr, q_out_ptr, (b * HQ + tl.arange(0, HQ)[:, None]) * D, c, s, HALF)
    hk = tl.arange(0, HK)[:, None]
    block = tl.load(block_table_ptr + b * MAX_BLOCKS + pos // BS)
    slot = ((block * BS + pos % BS) * HK + hk) * D
    k1 = tl.load(k_ptr + (b * HK + hk) * D + j).to(tl.float32)
    k2 = tl.load(k_ptr + (b * HK + hk) * D + HALF + j).to(tl.float32)
    z1, z2 = rotate_pair(k1, k2, c, s, c, s)
    tl.store(k_cache_ptr + slot + j, z1)
    tl.store(k_cache_ptr + slot + HALF + j, z2)
    f = tl.arange(0, D)[None, :]
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


@triton.jit
def library_rotation_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                            seqlens_ptr, freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr,
                            D: tl.constexpr):
    # the worked solution's structure, with the rotation taken from ropelib's kernels
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    j = tl.arange(0, HALF)[None, :]
    theta = tl.load(freqs_ptr + pos * D + j)
    c, s = tl.cos(theta), tl.sin(theta)
    hq = tl.arange(0, HQ)[:, None]
    x1 = tl.load(q_ptr + (b * HQ + hq) * D + j).to(tl.float32)
    x2 = tl.load(q_ptr + (b * HQ + hq) * D + HALF + j).to(tl.float32)
    y1, y2 = rotate_pair(x1, x2, c, s, c, s)
    tl.store(q_out_ptr + (b * HQ + hq) * D + j, y1)
    tl.store(q_out_ptr + (b * HQ + hq) * D + HALF + j, y2)
    hk = tl.arange(0, HK)[:, None]
    slot = ((b * L + pos) * HK + hk) * D
    k1 = tl.load(k_ptr + (b * HK + hk) * D + j).to(tl.float32)
    k2 = tl.load(k_ptr + (b * HK + hk) * D + HALF + j).to(tl.float32)
    z1, z2 = rotate_pair(k1, k2, c, s, c, s)
    tl.store(k_cache_ptr + slot + j, z1)
    tl.store(k_cache_ptr + slot + HALF + j, z2)
    f = tl.arange(0, D)[None, :]
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


@triton.jit
def blank_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                 freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr):
    # 1. ... 2. ... 3. ...
    pass


def test_contiguous_kernel_solution_passes(capsys):
    assert at_scale.check_rope_kv_cache_kernel(
        learner_copy(at_scale.solution_rope_kv_cache_kernel)) is True
    assert capsys.readouterr().out.startswith(
        "✅ RoPE + contiguous KV-cache write kernel: q, k cache and v cache as "
        "ropelib.rope_kv_cache writes them")


def test_paged_kernel_solution_passes(capsys):
    assert at_scale.check_rope_kv_paged_kernel(
        learner_copy(at_scale.solution_rope_kv_paged_kernel)) is True
    assert capsys.readouterr().out.startswith("✅ RoPE + paged KV-cache write kernel")


@pytest.mark.parametrize("check,kernel", [
    (at_scale.check_rope_kv_cache_kernel, library_rotation_kernel),
    (at_scale.check_rope_kv_paged_kernel, library_paged_kernel)], ids=["contiguous", "paged"])
def test_kv_kernel_calling_ropelibs_kernels_fails(check, kernel, capsys):
    assert check(kernel, seed=0) is False
    out = capsys.readouterr().out
    assert "ropelib's rotate_pair (ropelib/kernels/common.py)" in out


@pytest.mark.parametrize("check", [at_scale.check_rope_kv_cache_kernel,
                                   at_scale.check_rope_kv_paged_kernel])
def test_kv_kernel_check_rejects_the_finished_function(check, capsys):
    def fused(q, k, v, q_out, k_cache, v_cache, seqlens, *rest):   # the library's answer
        q_out.copy_(ropelib.rope_kv_cache(q[:, None], k[:, None], v[:, None], k_cache,
                                          v_cache, seqlens, rest[-1])[:, 0])

    assert check(fused) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,paged,says", [
    (unrotated_k_kernel, False, "k_cache"),
    (next_slot_kernel, False, "the kernel wrote the k cache at (sequence, position)"),
    (no_block_table_kernel, True, "block_table[b, p // BS] names the block"),
    (learner_copy(at_scale.solution_rope_kv_cache_kernel), True, "the launch raised TypeError"),
])
def test_kv_kernel_rejects_wrong_kernels(wrong, paged, says, capsys):
    check = at_scale.check_rope_kv_paged_kernel if paged else at_scale.check_rope_kv_cache_kernel
    assert check(wrong, seed=4) is False
    out = capsys.readouterr().out
    assert "❌ RoPE +" in out and says in out


def test_kv_kernel_rejects_blank_and_nothing(capsys):
    assert at_scale.check_rope_kv_cache_kernel(blank_kernel) is False
    assert "no kernel yet" in capsys.readouterr().out
    assert at_scale.check_rope_kv_paged_kernel(None) is False
    assert "no kernel yet" in capsys.readouterr().out


def test_paged_solution_writes_where_the_block_table_says():
    # the worked kernel on one step: the pool slot of each sequence's new token, nothing else
    B, MB, BS, HQ, HK, D = 2, 3, 2, 2, 1, 8
    table = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32)
    seqlens = torch.tensor([3, 4], dtype=torch.int32)
    pool_k, pool_v = torch.zeros(6, BS, HK, D), torch.zeros(6, BS, HK, D)
    q, k, v = torch.randn(B, HQ, D), torch.randn(B, HK, D), torch.randn(B, HK, D)
    freqs = ropelib.rope_freqs(MB * BS, D).view(MB * BS, D)
    at_scale.launch_kv_paged(at_scale.solution_rope_kv_paged_kernel, q, k, v,
                             torch.empty_like(q), pool_k, pool_v, seqlens, table, freqs)
    # position 3 of sequence 0: its block 1 -> pool block 0, offset 1; position 4 of
    # sequence 1: its block 2 -> pool block 3, offset 0
    assert pool_v.flatten(2).any(-1).nonzero().tolist() == [[0, 1], [3, 0]]
    assert torch.equal(pool_v[0, 1], v[0]) and torch.equal(pool_v[3, 0], v[1])


# --- the worked solutions are not the learner's answers ----------------------------------------

@triton.jit
def _calls_the_worked_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                             seqlens_ptr, freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr,
                             D: tl.constexpr):
    at_scale.solution_rope_kv_cache_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr,
                                           v_cache_ptr, seqlens_ptr, freqs_ptr, L, HQ, HK, D)


@pytest.mark.parametrize("check,answer", [
    (at_scale.check_dual_chunk_positions, at_scale.solution_dual_chunk_positions),
    (at_scale.check_dual_chunk_positions,
     lambda s, n, r: at_scale.solution_dual_chunk_positions(s, n, r)),
    (at_scale.check_paged_slot, at_scale.solution_paged_slot),
    (at_scale.check_paged_slot, lambda row, bs, p: at_scale.solution_paged_slot(row, bs, p)),
    (at_scale.check_rope_kv_cache_kernel, at_scale.solution_rope_kv_cache_kernel),
    (at_scale.check_rope_kv_cache_kernel, _calls_the_worked_kernel),
    (at_scale.check_rope_kv_paged_kernel, at_scale.solution_rope_kv_paged_kernel),
], ids=["dual-chunk", "dual-chunk-wrapped", "slot", "slot-wrapped", "contiguous",
        "contiguous-wrapped", "paged"])
def test_checks_refuse_the_worked_solution(check, answer, capsys):
    """Handing in the worked solution, or a wrapper of it, is not an answer."""
    assert check(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "solution" in out, out


# --- 5. the fp8 store (optional) ---------------------------------------------------------------

@triton.jit
def _fp8_slash_divide(k_ptr, cache_ptr, scale_ptr, seqlens_ptr, L, HK: tl.constexpr,
                      D: tl.constexpr):
    # the solution with `/`: exact IEEE division in the interpreter, so it passes there
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    h, f = tl.arange(0, HK)[:, None], tl.arange(0, D)[None, :]
    y = tl.load(k_ptr + (b * HK + h) * D + f) / tl.load(scale_ptr)
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    tl.store(cache_ptr + ((b * L + pos) * HK + h) * D + f, y.to(tl.float8e4nv))


@triton.jit
def _fp8_no_clamp(k_ptr, cache_ptr, scale_ptr, seqlens_ptr, L, HK: tl.constexpr,
                  D: tl.constexpr):
    # values above 448 are not saturated
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    h, f = tl.arange(0, HK)[:, None], tl.arange(0, D)[None, :]
    y = tl.div_rn(tl.load(k_ptr + (b * HK + h) * D + f), tl.load(scale_ptr))
    tl.store(cache_ptr + ((b * L + pos) * HK + h) * D + f, y.to(tl.float8e4nv))


@triton.jit
def _fp8_no_scale(k_ptr, cache_ptr, scale_ptr, seqlens_ptr, L, HK: tl.constexpr,
                  D: tl.constexpr):
    # the value stored as it is, never divided by the scale
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    h, f = tl.arange(0, HK)[:, None], tl.arange(0, D)[None, :]
    y = tl.minimum(tl.maximum(tl.load(k_ptr + (b * HK + h) * D + f), -448.0), 448.0)
    tl.store(cache_ptr + ((b * L + pos) * HK + h) * D + f, y.to(tl.float8e4nv))


@triton.jit
def _fp8_last_slot(k_ptr, cache_ptr, scale_ptr, seqlens_ptr, L, HK: tl.constexpr,
                   D: tl.constexpr):
    # right values, in the cache's last position instead of seqlens[b]
    b = tl.program_id(0)
    h, f = tl.arange(0, HK)[:, None], tl.arange(0, D)[None, :]
    y = tl.div_rn(tl.load(k_ptr + (b * HK + h) * D + f), tl.load(scale_ptr))
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    tl.store(cache_ptr + ((b * L + L - 1) * HK + h) * D + f, y.to(tl.float8e4nv))


@pytest.mark.parametrize("seed", [0, 1])
def test_fp8_store_own_solution_passes(seed, capsys):
    assert at_scale.check_fp8_store_kernel(learner_copy(at_scale.solution_fp8_store_kernel),
                                           seed=seed) is True, capsys.readouterr().out
    assert capsys.readouterr().out.startswith("✅ fp8 KV-cache store kernel")


def test_fp8_store_slash_divide_passes_in_the_interpreter(capsys):
    assert at_scale.check_fp8_store_kernel(_fp8_slash_divide, seed=0) is True


@pytest.mark.parametrize("wrong,says", [
    (_fp8_no_clamp, "quantize_fp8 gives"), (_fp8_no_scale, "quantize_fp8 gives"),
    (_fp8_last_slot, "only the new tokens' slots"),
])
def test_fp8_store_rejects_wrong_kernels(wrong, says, capsys):
    for seed in (0, 1):
        assert at_scale.check_fp8_store_kernel(wrong, seed=seed) is False
        out = capsys.readouterr().out
        assert out.startswith("❌") and says in out, out


def test_fp8_store_rejects_the_worked_solution_blank_and_nothing(capsys):
    assert at_scale.check_fp8_store_kernel(at_scale.solution_fp8_store_kernel, seed=0) is False
    assert "launched ropelib's solution_fp8_store_kernel" in capsys.readouterr().out
    for unanswered in (None, ...):
        assert at_scale.check_fp8_store_kernel(unanswered) is False
    assert "no kernel yet" in capsys.readouterr().out


def test_fp8_cases_reach_what_the_check_claims():
    # the cases saturate values, reach the subnormals, and hold values whose rounding the
    # interpreter's conversion gets wrong (hence its second accepted byte)
    gen = torch.Generator().manual_seed(0)
    saturated = subnormal = carried = 0
    for case in at_scale.FP8_CASES:
        k, cache, scale, seqlens = at_scale._fp8_step(case, gen)
        right = (k / scale).clamp(-448, 448)
        saturated += int(((k / scale).abs() > 448).sum())
        subnormal += int((right.abs() < 2 ** -6).sum())
        carried += int((at_scale._interpreter_fp8(right).view(torch.uint8)
                        != kv_cache.quantize_fp8(k, scale).view(torch.uint8)).sum())
    assert saturated > 0 and subnormal > 0 and carried > 0


@pytest.mark.parametrize("check,kernel,default", [
    (at_scale.check_rope_kv_cache_kernel, at_scale.solution_rope_kv_cache_kernel,
     at_scale.launch_kv_cache),
    (at_scale.check_rope_kv_paged_kernel, at_scale.solution_rope_kv_paged_kernel,
     at_scale.launch_kv_paged),
    (at_scale.check_fp8_store_kernel, at_scale.solution_fp8_store_kernel,
     at_scale.launch_fp8_store)], ids=["contiguous", "paged", "fp8"])
def test_checks_launch_through_the_notebooks_launcher(check, kernel, default, capsys):
    """Notebook 11 defines its own launchers and hands them to the checks: the check launches
    through the one it is given (a launcher that launches nothing fails it)."""
    calls = []

    def launch(kern, *args):
        calls.append(len(args))
        default(kern, *args)

    assert check(learner_copy(kernel), seed=0, launch=launch) is True, capsys.readouterr().out
    assert calls
    assert check(learner_copy(kernel), seed=0, launch=lambda kern, *args: None) is False
    assert "❌" in capsys.readouterr().out
