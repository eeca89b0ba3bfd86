"""Exercises of notebook 11 (RoPE at scale): the global positions a context-parallel rank holds,
the slot of a position in a paged KV cache, and RoPE fused with the KV-cache write as a kernel,
for a contiguous cache and then for a paged one.

Each `check_...` runs the learner's answer with ropelib's own answers barred (`own_code`: the
product's modules, so `ropelib.context_parallel`, `ropelib.kv_cache` and the finished kernels, and
the teaching kernels) and compares it with what ropelib computes
(`ropelib.context_parallel.dual_chunk_positions`, `ropelib.kv_cache.cache_slots`,
`ropelib.rope_kv_cache`), never with a hard-coded answer; `solution_...` are the worked answers
the notebook shows folded away (tests/test_exercises_at_scale.py checks that they pass and that
library answers fail).

The kernel exercises take the learner's @triton.jit *kernel*: the check draws one decoding step
(one new token per sequence, each at its own position), fills the caches with a history and NaN
in every free slot, launches the kernel through Triton's interpreter on the CPU with ropelib
barred (on a GPU, then compiled there too) and compares the rotated q and both caches with what
`ropelib.rope_kv_cache` makes of the same step. One program per sequence (grid (B,)), all heads
of its token as one tile. The contiguous kernel's arguments:

    q_ptr, k_ptr, v_ptr,        # the new token of each sequence: q [B, HQ, D], k and v
                                #   [B, HK, D], contiguous
    q_out_ptr,                  # the rotated q [B, HQ, D], contiguous
    k_cache_ptr, v_cache_ptr,   # caches [B, L, HK, D], contiguous, written in place
    seqlens_ptr,                # [B] int32: tokens already cached = the new token's position
    freqs_ptr,                  # angles [P, D] fp32, contiguous (ropelib.rope_freqs viewed
                                #   [P, D]): pair (j, j + D/2) at position p turns by
                                #   freqs[p, j]
    L,                          # positions per sequence in the cache
    HQ: tl.constexpr,           # heads of q (a power of two)
    HK: tl.constexpr,           # heads of k and v (a power of two)
    D: tl.constexpr,            # head dim (a power of two), all rotated

The paged kernel takes the same, with the caches pools [NB, BS, HK, D] (contiguous) and, in
place of L, the block table:

    ..., seqlens_ptr,
    block_table_ptr,            # [B, MAX_BLOCKS] int32, contiguous: position p of sequence b
                                #   lives in block block_table[b, p // BS] at offset p % BS
    freqs_ptr,
    MAX_BLOCKS,                 # block-table columns
    BS,                         # positions per block
    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,

The optional fifth exercise is the store such a kernel ends with for a float8_e4m3fn cache
(`check_fp8_store_kernel`, signature at its section below): value / scale, clamped to +-448,
rounded to fp8, compared byte for byte with `kv_cache.quantize_fp8`.
"""
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from ... import context_parallel, frequencies, kv_cache, runtime
from ..work_count import interpreted
from . import _compare, check, kernel_answer
from .own_code import check_cases, fresh_generator, fresh_seed, launch_on, listed_as_tensor

__all__ = ["check_dual_chunk_positions", "solution_dual_chunk_positions", "check_paged_slot",
           "solution_paged_slot", "check_rope_kv_cache_kernel", "solution_rope_kv_cache_kernel",
           "check_rope_kv_paged_kernel", "solution_rope_kv_paged_kernel", "launch_kv_cache",
           "launch_kv_paged", "CONTIGUOUS_CASES", "PAGED_CASES", "check_fp8_store_kernel",
           "solution_fp8_store_kernel", "launch_fp8_store", "FP8_CASES"]


# --- 1. which global positions does rank r hold? ---------------------------------------------

def check_dual_chunk_positions(fn: Callable) -> bool:
    """fn(seq_len, cp_size, cp_rank) -> the seq_len / cp_size global positions (ints, in the
    order the rank holds them) of Transformer Engine's dual-chunk split. Your own code:
    ropelib.context_parallel is barred."""
    cases = []
    seed, g = fresh_generator()     # and a split drawn now: a table made beforehand fails
    n = int(torch.randint(1, 17, (), generator=g))
    drawn = (2 * n * int(torch.randint(1, 513, (), generator=g)), n,
             int(torch.randint(0, n, (), generator=g)))
    for c, (S, n, r) in enumerate(((8, 2, 0), (8, 2, 1), (24, 3, 1), (16, 4, 3), (16, 4, 0),
                                   (6, 1, 0), drawn)):
        want = context_parallel.dual_chunk_positions(S // n, n, r)
        cases.append((f"seq_len={S}, cp_size={n}, rank {r}"
                      + (f" (drawn with seed {seed})" if c == 6 else ""), (S, n, r), want))
    return check_cases("dual-chunk positions", "the positions worked out by your code", fn, cases,
                       post=listed_as_tensor,
                       hint="cut the sequence into 2*cp_size chunks of seq_len / (2*cp_size); "
                            "rank r holds chunk r, then chunk 2*cp_size-1-r",
                       returns="the list of the seq_len / cp_size global positions rank "
                               "cp_rank holds, its first chunk then its second")


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
    [n_blocks, block_size, H, D]. Your own code: ropelib.kv_cache is barred."""
    cases = []
    seed, g = fresh_generator()     # and a sequence drawn now: a table made beforehand fails
    bs, blocks = 2 ** int(torch.randint(0, 6, (), generator=g)), int(torch.randint(1, 9, (),
                                                                                 generator=g))
    drawn = (torch.randperm(16, generator=g)[:blocks].tolist(), bs,
             int(torch.randint(0, bs * blocks, (), generator=g)))
    for c, (row, bs, p) in enumerate((([5, 2, 7, 0], 4, 9), ([5, 2, 7, 0], 4, 3),
                                      ([3, 1], 16, 16), ([6, 4, 1, 0, 2], 2, 7),
                                      ([0, 1, 2], 8, 23), drawn)):
        cases.append((f"row {row}, block_size={bs}, position {p}"
                      + (f" (drawn with seed {seed})" if c == 5 else ""), (list(row), bs, p),
                      _slot(row, bs, p)))
    return check_cases("paged slot", "the slot worked out by your code", fn, cases,
                       post=listed_as_tensor,
                       hint="the sequence's position p sits in its (p // block_size)-th block, at "
                            "offset p % block_size; the block table says which block of the pool "
                            "that is",
                       returns="(block, offset): the pool block that holds position and its "
                               "offset in that block")


def solution_paged_slot(block_table_row, block_size, position):
    logical = position // block_size           # the sequence's own block number
    return block_table_row[logical], position % block_size


# --- 3. RoPE fused with the KV-cache write, as a kernel --------------------------------------

# (B, L, HQ, HK, D, dtype): contiguous caches [B, L, HK, D]
CONTIGUOUS_CASES = (
    (3, 8, 4, 2, 8, torch.float32),
    (2, 6, 2, 2, 16, torch.float32),        # a cache length that is not a power of two
    (4, 5, 2, 1, 8, torch.bfloat16),
)
# (B, MAX_BLOCKS, BS, HQ, HK, D, dtype): pools [B * MAX_BLOCKS + 3, BS, HK, D], blocks shuffled
PAGED_CASES = (
    (3, 4, 2, 4, 2, 8, torch.float32),
    (2, 2, 4, 2, 2, 16, torch.float32),
    (4, 3, 2, 2, 1, 8, torch.bfloat16),
)


def launch_kv_cache(kernel, q, k, v, q_out, k_cache, v_cache, seqlens, freqs) -> None:
    """Launch a contiguous-cache kernel of this module's signature: q [B, HQ, D], k, v
    [B, HK, D], caches [B, L, HK, D], freqs [P, D]; one program per sequence."""
    B, HQ, D = q.shape
    kernel[(B,)](q, k, v, q_out, k_cache, v_cache, seqlens, freqs, k_cache.shape[1],
                 HQ=HQ, HK=k.shape[1], D=D)


def launch_kv_paged(kernel, q, k, v, q_out, k_cache, v_cache, seqlens, block_table,
                    freqs) -> None:
    """Launch a paged-cache kernel of this module's signature: pools [NB, BS, HK, D] and
    block_table [B, MAX_BLOCKS]; one program per sequence."""
    B, HQ, D = q.shape
    kernel[(B,)](q, k, v, q_out, k_cache, v_cache, seqlens, block_table, freqs,
                 block_table.shape[1], k_cache.shape[1], HQ=HQ, HK=k.shape[1], D=D)


def _decode_step(case, paged: bool, gen):
    """One decoding step's inputs: (q, k, v, seqlens, block_table or None, freqs [P, D],
    k_cache, v_cache) with a history in the held slots and NaN in every free one."""
    if paged:
        B, MB, BS, HQ, HK, D, dtype = case
        L = MB * BS
        block_table = torch.randperm(B * MB + 3, generator=gen)[:B * MB].view(B, MB).int()
        lead = (B * MB + 3, BS)
    else:
        B, L, HQ, HK, D, dtype = case
        block_table, lead = None, (B, L)
    q = torch.randn(B, HQ, D, generator=gen).to(dtype)
    k = torch.randn(B, HK, D, generator=gen).to(dtype)
    v = torch.randn(B, HK, D, generator=gen).to(dtype)
    seqlens = torch.randint(0, L, (B,), generator=gen, dtype=torch.int32)
    base = float(torch.randint(100, 20000, (), generator=gen))
    freqs = frequencies.rope_freqs(L + 2, D, base=base).view(L + 2, D)
    k_cache = torch.full((*lead, HK, D), float("nan"), dtype=dtype)
    v_cache = torch.full((*lead, HK, D), float("nan"), dtype=dtype)
    for b in range(B):                        # the history: positions 0 .. seqlens[b] - 1
        for p in range(int(seqlens[b])):
            row, slot = (int(block_table[b, p // BS]), p % BS) if paged else (b, p)
            k_cache[row, slot] = torch.randn(HK, D, generator=gen).to(dtype)
            v_cache[row, slot] = torch.randn(HK, D, generator=gen).to(dtype)
    return q, k, v, seqlens, block_table, freqs, k_cache, v_cache


def _expected(q, k, v, seqlens, block_table, freqs, k_cache, v_cache, device):
    """ropelib.rope_kv_cache on copies: (q_out [B, HQ, D], k_cache, v_cache) on the CPU."""
    kc, vc = k_cache.to(device, copy=True), v_cache.to(device, copy=True)
    q_out = kv_cache.rope_kv_cache(
        q[:, None].to(device), k[:, None].to(device), v[:, None].to(device), kc, vc,
        seqlens.to(device), freqs.to(device),
        block_table=None if block_table is None else block_table.to(device))
    return q_out[:, 0].cpu(), kc.cpu(), vc.cpu()


def _slots_changed(before, after):
    """[(row, slot)] of the cache whose contents changed (NaN == NaN)."""
    diff = ~((before == after) | (before.isnan() & after.isnan()))
    return sorted(map(tuple, diff.flatten(2).any(-1).nonzero().tolist()))


def _check_kv_kernel(kernel, paged: bool, seed: Optional[int],
                     launch: Optional[Callable] = None) -> bool:
    name = f"RoPE + {'paged' if paged else 'contiguous'} KV-cache write kernel"
    if not kernel_answer(name, kernel, "the outputs and caches it allocated"):
        return False
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    on_gpu = runtime.on_gpu()
    cases = PAGED_CASES if paged else CONTIGUOUS_CASES
    if launch is None:
        launch = launch_kv_paged if paged else launch_kv_cache
    for case in cases:
        step = _decode_step(case, paged, gen)
        q, k, v, seqlens, block_table, freqs, k_cache, v_cache = step
        B, HQ, D = q.shape
        dtype = q.dtype
        label = (f"B={B}, {HQ} q and {k.shape[1]} kv heads, D={D}, "
                 f"{str(dtype).replace('torch.', '')}, positions {seqlens.tolist()}")
        # (atol, rtol); fp32 leaves room for tl.sin and tl.cos, fast approximations on GPUs
        tol = (3e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.6e-2)
        want_q, want_k, want_v = _expected(*step, "cuda" if on_gpu else "cpu")
        for device in ("cpu", "cuda") if on_gpu else ("cpu",):
            where = "interpreter" if device == "cpu" else "compiled on the GPU"
            # copies: the kernel writes the caches, and a faulty one might write anything
            qd, kd, vd, sd, kc, vc, fd = (t.to(device, copy=True) for t in (
                q, k, v, seqlens, k_cache, v_cache, freqs))
            bt = None if block_table is None else block_table.to(device)
            q_out = torch.full_like(qd, float("nan"))
            args = (qd, kd, vd, q_out, kc, vc, sd) + ((bt,) if paged else ()) + (fd,)
            if not launch_on(device, name, f"{label}, {where}", launch, kernel, *args):
                return False
            kc, vc, q_out = kc.cpu(), vc.cpu(), q_out.cpu()
            lbl = f"{label}, {where}"
            if not torch.equal(qd.cpu(), q) or not torch.equal(kd.cpu(), k):
                print(f"❌ {name} ({lbl}): the kernel changed its inputs q or k")
                return False
            wrote, should = _slots_changed(k_cache, kc), _slots_changed(k_cache, want_k)
            if wrote != should:
                what = "(block, offset)" if paged else "(sequence, position)"
                print(f"❌ {name} ({lbl}): the kernel wrote the k cache at {what} {wrote}, the new "
                      f"tokens belong at {should}" + (
                          "; block_table[b, p // BS] names the block, p % BS the offset"
                          if paged else "; sequence b's new token goes to position seqlens[b]"))
                return False
            for which, got, want in (("q_out", q_out, want_q), ("k_cache", kc, want_k),
                                     ("v_cache", vc, want_v)):
                same, _ = _compare(got, want, *tol)
                if not same:
                    return check(f"{name} ({lbl}): {which}", got, want, atol=tol[0],
                                 rtol=tol[1],
                                 hint="rotate q and k by freqs[seqlens[b], j] (pair j, j + D/2); "
                                      "store v as it is")
    gpu = " and compiled on the GPU" if on_gpu else ""
    print(f"✅ {name}: q, k cache and v cache as ropelib.rope_kv_cache writes them, on "
          f"{len(cases)} decoding steps in the interpreter{gpu} (fp32 and bf16, GQA)")
    return True


def check_rope_kv_cache_kernel(kernel, *, seed: Optional[int] = None,
                               launch: Optional[Callable] = None) -> bool:
    """Launch the learner's RoPE + contiguous KV-cache write kernel (the signature in this
    module's docstring) on fresh decoding steps; compare with ropelib.rope_kv_cache. `launch`
    (the notebook's launcher, `launch_kv_cache`'s signature) launches it; by default
    `launch_kv_cache`."""
    return _check_kv_kernel(kernel, False, seed, launch)


def check_rope_kv_paged_kernel(kernel, *, seed: Optional[int] = None,
                               launch: Optional[Callable] = None) -> bool:
    """Launch the learner's RoPE + paged KV-cache write kernel (the signature in this module's
    docstring) on fresh decoding steps; compare with ropelib.rope_kv_cache(block_table=...).
    `launch` (the notebook's launcher, `launch_kv_paged`'s signature) launches it; by default
    `launch_kv_paged`."""
    return _check_kv_kernel(kernel, True, seed, launch)


@triton.jit
def solution_rope_kv_cache_kernel(
    q_ptr, k_ptr, v_ptr,  # the new token of each sequence: q [B, HQ, D], k, v [B, HK, D]
    q_out_ptr,  # the rotated q [B, HQ, D], contiguous
    k_cache_ptr, v_cache_ptr,  # caches [B, L, HK, D], contiguous, written in place
    seqlens_ptr,  # [B] int32: tokens already cached = the new token's position
    freqs_ptr,  # angles [P, D] fp32, contiguous: pair (j, j + D/2) turns by freqs[p, j]
    L,  # positions per sequence in the cache
    HQ: tl.constexpr,  # heads of q (a power of two)
    HK: tl.constexpr,  # heads of k and v (a power of two)
    D: tl.constexpr,  # head dim (a power of two), all rotated
):
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)  # one program per sequence
    pos = tl.load(seqlens_ptr + b)  # the new token's position
    j = tl.arange(0, HALF)[None, :]  # [1, HALF] pairs
    theta = tl.load(freqs_ptr + pos * D + j)  # [1, HALF]: one row of the table
    c, s = tl.cos(theta), tl.sin(theta)
    hq = tl.arange(0, HQ)[:, None]  # [HQ, 1]
    q_row = q_ptr + (b * HQ + hq) * D
    x1 = tl.load(q_row + j).to(tl.float32)
    x2 = tl.load(q_row + HALF + j).to(tl.float32)
    out_row = q_out_ptr + (b * HQ + hq) * D
    tl.store(out_row + j, x1 * c - x2 * s)
    tl.store(out_row + HALF + j, x2 * c + x1 * s)
    hk = tl.arange(0, HK)[:, None]  # [HK, 1]
    k_row = k_ptr + (b * HK + hk) * D
    k1 = tl.load(k_row + j).to(tl.float32)
    k2 = tl.load(k_row + HALF + j).to(tl.float32)
    slot = ((b * L + pos) * HK + hk) * D  # [HK, 1]: cache[b, pos, h, :]
    tl.store(k_cache_ptr + slot + j, k1 * c - k2 * s)
    tl.store(k_cache_ptr + slot + HALF + j, k2 * c + k1 * s)
    f = tl.arange(0, D)[None, :]  # v is stored as it is
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


@triton.jit
def solution_rope_kv_paged_kernel(
    q_ptr, k_ptr, v_ptr,  # the new token of each sequence: q [B, HQ, D], k, v [B, HK, D]
    q_out_ptr,  # the rotated q [B, HQ, D], contiguous
    k_cache_ptr, v_cache_ptr,  # pools [NB, BS, HK, D], contiguous, written in place
    seqlens_ptr,  # [B] int32: tokens already cached = the new token's position
    block_table_ptr,  # [B, MAX_BLOCKS] int32: position p lives in block_table[b, p // BS]
    freqs_ptr,  # angles [P, D] fp32, contiguous: pair (j, j + D/2) turns by freqs[p, j]
    MAX_BLOCKS,  # block-table columns
    BS,  # positions per block
    HQ: tl.constexpr,  # heads of q (a power of two)
    HK: tl.constexpr,  # heads of k and v (a power of two)
    D: tl.constexpr,  # head dim (a power of two), all rotated
):
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)  # one program per sequence
    pos = tl.load(seqlens_ptr + b)  # the new token's position
    j = tl.arange(0, HALF)[None, :]  # [1, HALF] pairs
    theta = tl.load(freqs_ptr + pos * D + j)  # [1, HALF]: one row of the table
    c, s = tl.cos(theta), tl.sin(theta)
    hq = tl.arange(0, HQ)[:, None]  # [HQ, 1]
    q_row = q_ptr + (b * HQ + hq) * D
    x1 = tl.load(q_row + j).to(tl.float32)
    x2 = tl.load(q_row + HALF + j).to(tl.float32)
    out_row = q_out_ptr + (b * HQ + hq) * D
    tl.store(out_row + j, x1 * c - x2 * s)
    tl.store(out_row + HALF + j, x2 * c + x1 * s)
    hk = tl.arange(0, HK)[:, None]  # [HK, 1]
    k_row = k_ptr + (b * HK + hk) * D
    k1 = tl.load(k_row + j).to(tl.float32)
    k2 = tl.load(k_row + HALF + j).to(tl.float32)
    block = tl.load(block_table_ptr + b * MAX_BLOCKS + pos // BS)  # the physical block
    slot = ((block * BS + pos % BS) * HK + hk) * D  # [HK, 1]: pool[block, pos % BS, h, :]
    tl.store(k_cache_ptr + slot + j, k1 * c - k2 * s)
    tl.store(k_cache_ptr + slot + HALF + j, k2 * c + k1 * s)
    f = tl.arange(0, D)[None, :]  # v is stored as it is
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


# --- 5. the fp8 store (optional) ---------------------------------------------------------------
#
# The store the fused kernel ends with when the cache is float8_e4m3fn: the new token's value
# (fp32, already rotated for k) divided by the cache's per-tensor scale, clamped to +-448 and
# rounded to fp8, into slot seqlens[b] of sequence b. Its arguments, in order (grid (B,)):
#
#     k_ptr,                      # the new token's values [B, HK, D] fp32, contiguous
#     cache_ptr,                  # the cache [B, L, HK, D] float8_e4m3fn, contiguous, in place
#     scale_ptr,                  # [1] fp32: the cache stores fp8(value / scale)
#     seqlens_ptr,                # [B] int32: tokens already cached = the new token's position
#     L,                          # positions per sequence in the cache
#     HK: tl.constexpr,           # heads (a power of two)
#     D: tl.constexpr,            # head dim (a power of two)

FP8 = torch.float8_e4m3fn

# (B, L, HK, D, scale as a multiple of amax / 448): 1 maps the largest value to 448; 0.25
# saturates the large values; 64 sends the small ones into the subnormals
FP8_CASES = (
    (3, 8, 2, 8, 1.0),
    (2, 6, 4, 16, 0.25),
    (4, 5, 1, 8, 64.0),
)


def launch_fp8_store(kernel, k, cache, scale, seqlens) -> None:
    """Launch an fp8 store kernel of exercise 5's signature: k [B, HK, D] fp32, cache
    [B, L, HK, D] float8_e4m3fn, scale [1] fp32, seqlens [B] int32; one program per sequence."""
    B, HK, D = k.shape
    kernel[(B,)](k, cache, scale, seqlens, cache.shape[1], HK=HK, D=D)


@triton.jit
def _to_fp8_kernel(x_ptr, y_ptr, N: tl.constexpr):
    # x fp32 [N] (already clamped to +-448) -> y float8_e4m3fn [N], by Triton's own conversion
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv))


def _interpreter_fp8(x: torch.Tensor) -> torch.Tensor:
    """x (fp32, clamped) rounded to fp8 by the interpreter's conversion, which is wrong where
    the rounding carries into the exponent (127.1 -> 64, not 128): the bits a right kernel gets
    in the interpreter from `.to(tl.float8e4nv)`."""
    flat = x.reshape(-1).contiguous()
    n = triton.next_power_of_2(max(flat.numel(), 1))
    padded = torch.zeros(n)
    padded[:flat.numel()] = flat
    out = torch.empty(n, dtype=FP8)
    interpreted(_to_fp8_kernel)[(1,)](padded, out, N=n)
    return out[:flat.numel()].view(x.shape)


def _fp8_step(case, gen):
    """(k [B, HK, D] fp32, cache with an fp8 history and NaN in every free slot, scale [1],
    seqlens [B] int32)."""
    B, L, HK, D, times = case
    k = torch.randn(B, HK, D, generator=gen) * torch.logspace(-2, 1, D)   # small and large
    scale = torch.tensor([k.abs().max().item() / 448 * times])
    seqlens = torch.randint(0, L, (B,), generator=gen, dtype=torch.int32)
    cache = torch.full((B, L, HK, D), float("nan")).to(FP8)
    for b in range(B):
        held = int(seqlens[b])
        cache[b, :held] = (torch.randn(held, HK, D, generator=gen) * 100).to(FP8)
    return k, cache, scale, seqlens


def check_fp8_store_kernel(kernel, *, seed: Optional[int] = None,
                           launch: Optional[Callable] = None) -> bool:
    """Launch the learner's fp8 store kernel (exercise 5's signature) on fresh decoding steps
    and compare the cache's bytes, bit for bit, with `kv_cache.quantize_fp8` in the new tokens'
    slots and the history everywhere else.

    In the interpreter a right kernel's `.to(tl.float8e4nv)` gives the interpreter's conversion,
    which is wrong where the rounding carries into the exponent; there each byte may be either
    quantize_fp8's or the interpreter's conversion of the right quotient (so the division, the
    clamp and the slot are checked bit for bit). Compiled on a GPU it must be quantize_fp8's.
    `launch` (the notebook's launcher, `launch_fp8_store`'s signature) launches it; by default
    `launch_fp8_store`.
    """
    name = "fp8 KV-cache store kernel"
    if not kernel_answer(name, kernel, "the cache it allocated"):
        return False
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    on_gpu = runtime.on_gpu()
    for case in FP8_CASES:
        k, cache, scale, seqlens = _fp8_step(case, gen)
        B, L, HK, D, times = case
        label = (f"B={B}, L={L}, {HK} heads, D={D}, scale {times:g} x amax/448, positions "
                 f"{seqlens.tolist()}")
        rows = torch.arange(B)
        right = (k / scale).clamp(-kv_cache.FP8_MAX, kv_cache.FP8_MAX)   # the quotient, fp32
        want = cache.clone()
        want[rows, seqlens.long()] = kv_cache.quantize_fp8(k, scale)
        also = cache.clone()                                  # the interpreter's conversion
        also[rows, seqlens.long()] = _interpreter_fp8(right)
        for device in ("cpu", "cuda") if on_gpu else ("cpu",):
            where = "interpreter" if device == "cpu" else "compiled on the GPU"
            kd, cd, sd, qd = (t.to(device, copy=True) for t in (k, cache, scale, seqlens))
            if not launch_on(device, name, f"{label}, {where}", launch or launch_fp8_store,
                             kernel, kd, cd, sd, qd):
                return False
            got = cd.cpu().view(torch.uint8)
            ok = got == want.view(torch.uint8)
            if device == "cpu":
                ok |= got == also.view(torch.uint8)
            if bool(ok.all()):
                continue
            bad = (~ok).flatten(2).any(-1).nonzero().tolist()          # [(sequence, position)]
            should = [[b, int(seqlens[b])] for b in range(B)]
            if any(slot not in should for slot in bad):
                print(f"❌ {name} ({label}, {where}): the cache differs at (sequence, position) "
                      f"{bad}; only the new tokens' slots {should} may change")
                return False
            b, p = bad[0]
            i = int((~ok[b, p]).flatten().nonzero()[0])
            print(f"❌ {name} ({label}, {where}): slot ({b}, {p}) holds "
                  f"{cd.cpu()[b, p].flatten()[i].float().item():g} at its element {i}, "
                  f"quantize_fp8 gives {want[b, p].flatten()[i].float().item():g} (the value "
                  f"{k[b].flatten()[i].item():.6g}, divided and clamped "
                  f"{right[b].flatten()[i].item():.6g})")
            print("   hint: divide by the scale with tl.div_rn (IEEE division, as torch's; `/` is "
                  "an approximate division on a GPU), clamp to +-448, then .to(tl.float8e4nv)")
            return False
    gpu = " and compiled on the GPU" if on_gpu else ""
    print(f"✅ {name}: the cache bit for bit as kv_cache.quantize_fp8 stores it, on "
          f"{len(FP8_CASES)} decoding steps in the interpreter{gpu} (saturated values and "
          "subnormals among them)")
    return True


@triton.jit
def solution_fp8_store_kernel(
    k_ptr,  # the new token's values [B, HK, D] fp32, contiguous
    cache_ptr,  # the cache [B, L, HK, D] float8_e4m3fn, contiguous, written in place
    scale_ptr,  # [1] fp32: the cache stores fp8(value / scale)
    seqlens_ptr,  # [B] int32: tokens already cached = the new token's position
    L,  # positions per sequence in the cache
    HK: tl.constexpr,  # heads (a power of two)
    D: tl.constexpr,  # head dim (a power of two)
):
    b = tl.program_id(0)  # one program per sequence
    pos = tl.load(seqlens_ptr + b)  # the new token's position
    h = tl.arange(0, HK)[:, None]  # [HK, 1]
    f = tl.arange(0, D)[None, :]  # [1, D]
    y = tl.load(k_ptr + (b * HK + h) * D + f)
    y = tl.div_rn(y, tl.load(scale_ptr))  # IEEE division, as torch's (`/` is approximate)
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)  # e4m3's largest finite value
    tl.store(cache_ptr + ((b * L + pos) * HK + h) * D + f, y.to(tl.float8e4nv))
