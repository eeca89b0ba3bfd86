"""RoPE fused with the KV-cache write, for decoding with a key/value cache.

At every decoding step an attention layer rotates q and k of its new tokens and appends k and v
to the cache. `rope_kv_cache` does both in one launch: it returns the rotated q and writes the
rotated k (and v) straight into the cache, at each sequence's own position, so the rotated k
never makes a round trip through memory.

    q_out = ropelib.rope_kv_cache(q, k, v, k_cache, v_cache, cache_seqlens, freqs)
    cache_seqlens += q.shape[1]          # the caller keeps the lengths (as flash-attn's API)

and the operator, registered like ropelib's others (ropelib.ops: a triton_op on GPUs, a
custom_op in the interpreter, a fake implementation; no autograd: this is for inference):

    torch.ops.ropelib.rope_kv_cache(q, k, v, k_cache, v_cache, cache_seqlens, block_table,
                                    table, sin, k_scale, v_scale, interleaved) -> q_out
        mutates k_cache and v_cache

`write_kv_cache` is the same cache write in plain PyTorch (the unfused path: rotate with
ropelib.apply_rope_qk, then write), and `quantize_fp8` the rounding a float8 cache uses.

Supported: q [B, S, HQ, D], k [B, S, HK, D], v [B, S, HK, DV] (bshd, any strides; decode S = 1
or a prefill chunk S > 1); GQA (HK divides HQ); q, k, v in fp16, bf16 or fp32; caches in fp16,
bf16, fp32 or float8_e4m3fn (with a per-tensor fp32 scale each: stored = fp8(value / scale),
saturating at +-448); contiguous caches [B, L, HK, D] or paged ones [NB, BS, HK, D] with a
block table [B, MAX_BLOCKS]; rotate-half or interleaved pairs; angle tables or cos/sin tables
[P, R] (R <= D: features R..D-1 pass through). Not supported: fp64, layouts other than bshd,
per-head or per-token scales, other fp8 formats, autograd.

The kernels (ropelib.kernels.kv_cache) read q, k and v token-major (each token's heads one
dense block, the tokens evenly spaced), the table dense and the index tensors contiguous: an
input that is not so is copied first (contiguous tensors, views of one projection split along
its last dim and every decode step S = 1 of them are read as they are). The caches are written
in place, so they are not copied: their features must be at stride 1, and the two caches of a
paged call laid out alike (views of one pool, or two pools of one layout); others are refused.
"""
import math
from typing import Optional

import torch
from torch import Tensor

from . import eager
from . import validation as V
from .api import _tables, checked_tables
from .kernels import kv_cache as kernel
from .conventions import KV_CACHE_DTYPES, KV_INPUT_DTYPES
from .kernels.kv_cache import FP8_MAX, launch as launch_kernel
from .ops import define_op

__all__ = ["rope_kv_cache", "write_kv_cache", "quantize_fp8"]

FP8 = torch.float8_e4m3fn


# --- the operator ---------------------------------------------------------------------------

@define_op("ropelib::rope_kv_cache", mutates_args=("k_cache", "v_cache"))
def rope_kv_cache_op(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                     cache_seqlens: Tensor, block_table: Optional[Tensor], table: Tensor,
                     sin: Optional[Tensor], k_scale: Optional[Tensor], v_scale: Optional[Tensor],
                     interleaved: bool) -> Tensor:
    # Run on real tensors (a direct call, or a graph of torch.compile's "eager" backend), an
    # input that shares memory with a cache would be read after the kernel wrote it: refused
    # here, before the launch. A graph that PyTorch functionalizes (aot_eager, Inductor) reads
    # every input as it was before the call, and fake tensors have no addresses to compare.
    tensors = {"q": q, "k": k, "v": v, "cache_seqlens": cache_seqlens,
               "block_table": block_table, "table (freqs or cos)": table, "sin": sin,
               "k_scale": k_scale, "v_scale": v_scale}
    if _addressable(*tensors.values(), k_cache, v_cache):
        _check_aliasing(tensors, k_cache, v_cache)
    _check_cache_layout(k_cache, v_cache, block_table is not None)
    q, k, v, cache_seqlens, block_table, table, sin = _kernel_inputs(
        q, k, v, cache_seqlens, block_table, table, sin)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch_kernel(q, k, v, q_out, k_cache, v_cache, cache_seqlens, block_table, table, sin,
                  k_scale, v_scale, interleaved=interleaved)
    return q_out


# --- plain PyTorch: the unfused cache write -------------------------------------------------

def quantize_fp8(x: Tensor, scale: Tensor) -> Tensor:
    """x / scale rounded to float8_e4m3fn (nearest even), saturating at +-448, NaN kept."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _store(x: Tensor, cache: Tensor, scale: Optional[Tensor]) -> Tensor:
    if cache.dtype == FP8:
        return quantize_fp8(x, scale)
    return x.to(cache.dtype)


def cache_slots(cache_seqlens: Tensor, S: int, block_table: Optional[Tensor] = None,
                block_size: Optional[int] = None):
    """(row, slot) index tensors [B, S] of the new tokens in a cache: (b, p) for a contiguous
    cache, (block_table[b, p // BS], p % BS) for a paged one; p = cache_seqlens[b] + s."""
    p = cache_seqlens.long()[:, None] + torch.arange(S, device=cache_seqlens.device)
    if block_table is None:
        return torch.arange(p.shape[0], device=p.device)[:, None].expand_as(p), p
    return block_table.long().gather(1, p // block_size), p % block_size


def write_kv_cache(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                   cache_seqlens: Tensor, *, block_table: Optional[Tensor] = None,
                   k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None) -> None:
    """Write k, v [B, S, HK, D] (already rotated) into the caches at each sequence's positions,
    in plain PyTorch: the second half of the unfused path. Same caches, tables and scales as
    `rope_kv_cache`; positions are not checked (an index outside the cache raises PyTorch's own
    error)."""
    rows, slots = cache_slots(cache_seqlens, k.shape[1], block_table, k_cache.shape[1])
    k_cache.index_put_((rows, slots), _store(k, k_cache, k_scale))
    v_cache.index_put_((rows, slots), _store(v, v_cache, v_scale))


# --- argument checks ------------------------------------------------------------------------

def _kernel_inputs(q, k, v, cache_seqlens, block_table, table, sin) -> tuple:
    """The inputs as the kernels read them (ropelib.kernels.kv_cache.plan): q, k, v token-major
    (each token's heads one dense block, tokens evenly spaced), the table dense [P, R],
    cache_seqlens and block_table contiguous. Each is the tensor itself where it already is so
    (contiguous tensors, views of one projection split along its last dim, any decode step:
    nothing is copied), else a contiguous copy."""
    qkv = tuple(t if kernel.token_stride(t) is not None else t.contiguous() for t in (q, k, v))
    rest = tuple(t if t is None or t.is_contiguous() else t.contiguous()
                 for t in (cache_seqlens, block_table, table, sin))
    return qkv + rest


def _check_cache_layout(k_cache: Tensor, v_cache: Tensor, paged: bool) -> None:
    """Caches the kernels can write as they are (they are written in place, so they cannot be
    copied): features at stride 1; paged, the two laid out alike (one set of strides, in units
    of the head dim, serves both: ropelib.kernels.kv_cache.paged_units)."""
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if not kernel.cache_feature_stride_ok(t):
            raise ValueError(f"{name}'s features (its last dim) must be at stride 1, got strides "
                             f"{tuple(t.stride())}: it is written in place, so it cannot be "
                             "copied")
    if paged and kernel.paged_units(k_cache, v_cache) is None:
        D, DV = k_cache.shape[3], v_cache.shape[3]
        raise ValueError(f"a paged k_cache and v_cache must be laid out alike: each of "
                         f"k_cache's (block, slot, head) strides a multiple of its head dim "
                         f"D={D} and v_cache's the same multiple of DV={DV} (views of one pool, "
                         f"or two pools of one layout), got strides {tuple(k_cache.stride())} "
                         f"and {tuple(v_cache.stride())}")


def _check_scale(scale, cache: Tensor, name: str, cache_name: str) -> Optional[Tensor]:
    if cache.dtype != FP8:
        if scale is not None:
            raise ValueError(f"{name} is for a float8_e4m3fn {cache_name}; {cache_name} is "
                             f"{cache.dtype}: pass {name}=None")
        return None
    if scale is None:
        raise ValueError(f"{cache_name} is float8_e4m3fn: pass {name}, its fp32 per-tensor "
                         "scale (stored = fp8(value / scale))")
    V.check_tensor(scale, name, dtypes=(torch.float32,))
    if scale.numel() != 1:
        raise ValueError(f"{name} must hold one value (a per-tensor scale), got shape "
                         f"{tuple(scale.shape)}")
    V.check_same_device(cache, cache_name, **{name: scale})
    return scale.reshape(1)


def _check_scale_values(k_scale: Optional[Tensor], v_scale: Optional[Tensor]) -> None:
    """Scales finite and non-zero (stored = fp8(value / scale): zero would store +-448 or NaN
    for every value), where the values can be read without a synchronisation (as positions)."""
    present = {n: t for n, t in (("k_scale", k_scale), ("v_scale", v_scale)) if t is not None}
    if not present or not V.values_checkable(*present.values()):
        return
    values = torch.cat([t.reshape(1) for t in present.values()]).tolist()   # one host read
    for (name, _), value in zip(present.items(), values):
        if value == 0 or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite, non-zero fp32 scale (stored = "
                             f"fp8(value / {name})), got {value}")


def _addressable(*tensors) -> bool:
    """Tensors (or None) with memory of their own, outside any compiler, tracer, transform or
    dispatch mode: their addresses can be compared. Traced, the operator's schema declares
    which arguments it writes."""
    return eager.active() and all(t is None or type(t) in (Tensor, torch.nn.Parameter)
                                  and t.device.type != "meta" for t in tensors)


def _span(t: Optional[Tensor]) -> int:
    """Bytes from t's first element to just past its last (0: empty or None)."""
    if t is None or t.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _shares_memory(a: Tensor, a0: int, a_span: int, b: Tensor, b0: int, b_span: int) -> bool:
    """Could a (first byte at a0, reaching a_span bytes) and b share an element?"""
    if not (a_span and b_span and a0 < b0 + b_span and b0 < a0 + a_span):
        return False
    # the address ranges interleave: exact for views with one set of strides into one buffer
    # (k and v caches side by side in one pool), conservative otherwise
    if a.element_size() != b.element_size() or \
            a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return True
    return V.memory_overlaps(a, b)


def _check_aliasing(reads: dict, k_cache: Tensor, v_cache: Tensor, spans=None) -> None:
    """Refuse caches that share memory with each other or with anything the call reads (name ->
    tensor or None): one launch reads and writes all of them at once, so a shared element
    would be read after it was overwritten, or written twice. `spans` (from `_span`, reads
    first, then the caches) when the caller knows them: they depend on shapes and strides only
    (the eager route keeps them, so that a call only asks each tensor where it starts)."""
    if spans is None:
        spans = [_span(t) for t in (*reads.values(), k_cache, v_cache)]
    *read_spans, kc_span, vc_span = spans
    caches = (("k_cache", k_cache, k_cache.data_ptr(), kc_span),
              ("v_cache", v_cache, v_cache.data_ptr(), vc_span))
    if _shares_memory(*caches[0][1:], *caches[1][1:]):
        raise ValueError("k_cache and v_cache share memory: they are written in place")
    for (name, t), span in zip(reads.items(), read_spans):
        if not span:
            continue
        t0 = t.data_ptr()
        for cache_name, cache, c0, c_span in caches:
            if _shares_memory(t, t0, span, cache, c0, c_span):
                raise ValueError(f"{name} shares memory with {cache_name}, which this call "
                                 f"writes: {name} would be read after it was (partly) "
                                 f"overwritten; pass {name} in memory of its own (a clone)")


def _check_values(cache_seqlens: Tensor, block_table: Optional[Tensor], S: int, capacity: int,
                  P: int, block_size: int, n_blocks: int) -> None:
    """Positions inside the cache and the table, block-table entries inside the pool, where the
    values can be read without a synchronisation (see ropelib.set_index_checks)."""
    present = [t for t in (cache_seqlens, block_table) if t is not None]
    if not V.values_checkable(*present) or cache_seqlens.numel() == 0 or S == 0:
        return
    lo, hi = (int(x) for x in torch.stack([cache_seqlens.min(), cache_seqlens.max()]).tolist())
    if lo < 0 or hi + S > capacity:
        raise ValueError(f"cache_seqlens + {S} new tokens must fit in the cache of {capacity} "
                         f"positions per sequence, got cache_seqlens in [{lo}, {hi}]")
    if hi + S > P:
        raise ValueError(f"the new tokens' positions reach {hi + S - 1}, beyond the table's "
                         f"{P} rows (freqs/cos)")
    if block_table is not None:
        rows, slots = cache_slots(cache_seqlens, S, block_table, block_size)
        blo, bhi = (int(x) for x in torch.stack([rows.min(), rows.max()]).tolist())
        if blo < 0 or bhi >= n_blocks:
            raise ValueError(f"block_table entries of the blocks written must lie in [0, "
                             f"{n_blocks}) (the caches' blocks), got values in [{blo}, {bhi}]")
        # two new tokens in one slot: on a GPU their writes race (a contiguous cache cannot
        # have any: each sequence owns its row, each token its position)
        flat = (rows * block_size + slots).flatten()
        if torch.unique(flat).numel() < flat.numel():
            order = torch.sort(flat, stable=True).indices
            at = int((flat[order[1:]] == flat[order[:-1]]).nonzero()[0, 0])
            (b0, s0), (b1, s1) = (divmod(int(order[i]), S) for i in (at, at + 1))
            pos = cache_seqlens.long()
            raise ValueError(
                f"block_table maps two new tokens to one cache slot (block "
                f"{int(rows.flatten()[order[at]])}, offset {int(slots.flatten()[order[at]])}): "
                f"sequence {b0} at position {int(pos[b0]) + s0} and sequence {b1} at position "
                f"{int(pos[b1]) + s1}; the blocks a call writes must not repeat in block_table "
                "(within a sequence or across sequences)")


# --- the eager route ------------------------------------------------------------------------
# As for ropelib.apply_rope (ropelib.eager): a decoding step repeats the same call with new
# values, so a plain eager call is checked and planned once per signature and then goes
# straight to the compiled kernel. Every call still checks what its signature cannot hold: the
# values of host index tensors and scales, and whether the caches share memory with each other
# or with what the call reads (where each tensor lies; how far it reaches is in the signature).

class _Route:
    """One checked and planned rope_kv_cache call: the launch, which inputs each call copies
    for the kernel (`copies`, in _kernel_inputs' order: none in the usual case) and what each
    call re-checks."""
    __slots__ = ("start", "capacity", "rows", "block_size", "n_blocks", "empty", "tname",
                 "spans", "copies")

    def __init__(self, q, k, v, k_cache, v_cache, cache_seqlens, block_table, table, sin,
                 k_scale, v_scale, interleaved, capacity, tname):
        self.empty = q.shape[0] == 0 or q.shape[1] == 0
        self.start = None
        inputs = (q, k, v, cache_seqlens, block_table, table, sin)
        readable = _kernel_inputs(*inputs)      # as the kernel reads them (copies where needed)
        # the signature fixes every stride, so what this call copies every later one copies
        copies = tuple(r is not i for r, i in zip(readable, inputs))
        self.copies = copies if any(copies) else None
        if not self.empty:      # nothing to launch (and no tiles for an empty batch)
            uq, uk, uv, useq, ubt, utab, usin = readable
            q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            planned, _ = kernel.plan(uq, uk, uv, q_out, k_cache, v_cache, useq, ubt, utab,
                                     usin, k_scale, v_scale, interleaved=interleaved)
            self.start = eager.EagerLaunch(planned.launcher, planned)
        self.capacity, self.rows = capacity, table.shape[0]
        self.block_size, self.n_blocks = k_cache.shape[1], k_cache.shape[0]
        self.tname = tname
        self.spans = [_span(t) for t in (q, k, v, cache_seqlens, block_table, table, sin,
                                         k_scale, v_scale, k_cache, v_cache)]

    def __call__(self, q, k, v, k_cache, v_cache, cache_seqlens, block_table, table, sin,
                 k_scale, v_scale) -> Tensor:
        _check_aliasing({"q": q, "k": k, "v": v, "cache_seqlens": cache_seqlens,
                         "block_table": block_table, self.tname: table, "sin": sin,
                         "k_scale": k_scale, "v_scale": v_scale}, k_cache, v_cache, self.spans)
        _check_values(cache_seqlens, block_table, q.shape[1], self.capacity, self.rows,
                      self.block_size, self.n_blocks)
        _check_scale_values(k_scale, v_scale)
        if self.copies is not None:
            q, k, v, cache_seqlens, block_table, table, sin = (
                t.contiguous() if c else t for t, c in zip(
                    (q, k, v, cache_seqlens, block_table, table, sin), self.copies))
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if not self.empty:
            self.start(kernel.kernel_pointers(q, k, v, q_out, k_cache, v_cache, cache_seqlens,
                                              block_table, table, sin, k_scale, v_scale))
            torch.autograd.graph.increment_version(k_cache)
            torch.autograd.graph.increment_version(v_cache)
        return q_out


# --- the public function --------------------------------------------------------------------

def rope_kv_cache(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                  cache_seqlens: Tensor, freqs: Optional[Tensor] = None, *,
                  cos: Optional[Tensor] = None, sin: Optional[Tensor] = None,
                  block_table: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                  v_scale: Optional[Tensor] = None, interleaved: bool = False) -> Tensor:
    """Rotate q and k of the new tokens and write k and v into the cache; one launch.

    Token s of sequence b sits at position p = cache_seqlens[b] + s: it reads row p of the
    table and is written to the cache at p. The caches are written in place; cache_seqlens is
    not advanced (the caller adds S after the step).

    Args:
        q: [B, S, HQ, D] new tokens' queries (bshd, any strides: copied where not
            token-major, see the module docstring), fp16, bf16 or fp32.
        k: [B, S, HK, D] keys, HK divides HQ (GQA); v: [B, S, HK, DV] values; q's dtype.
        k_cache, v_cache: contiguous [B, L, HK, D] (and DV), or, with block_table, paged
            [NB, BS, HK, D]: NB blocks of BS positions. fp16, bf16, fp32 or float8_e4m3fn.
            Features at stride 1; paged, laid out alike (k_cache's block, slot and head
            strides D times one set of units, v_cache's DV times the same).
        cache_seqlens: [B] int32 (or int64) on q's device: tokens already cached per sequence.
        freqs: angles [P, 1, 1, R] or [P, R], float32, as ropelib.rope_freqs builds them; or
        cos, sin: tables [P, R] (ropelib.rope_cos_sin).
        block_table: [B, MAX_BLOCKS] int32: sequence b's position p lives in block
            block_table[b, p // BS] at offset p % BS.
        k_scale, v_scale: fp32 per-tensor scales (one value each), required for a
            float8_e4m3fn cache (stored = fp8(value / scale), saturating at +-448), else None.
        interleaved: pair features (2j, 2j+1) instead of (j, j + R/2).

    Returns:
        q_out: the rotated q, [B, S, HQ, D] contiguous, q's dtype.

    Positions are checked against the cache and the table, the block table's entries against
    the pool, the new tokens' slots for repeats (two tokens of the call in one slot: a paged
    cache whose block_table repeats a block written now) and the scales for zero or non-finite
    values, where their values sit on the host (ropelib.set_index_checks("on") checks GPU
    tensors too, at one synchronisation). Unchecked, the kernel never writes outside the
    caches: a token without a valid slot is not written and its q_out row comes out NaN; a
    position outside the table gives NaN in q_out and in the cached k; two tokens in one slot
    both write it, in no set order, so it holds one token's k and v or, element by element, a
    mix of both; a zero scale stores +-448 (NaN for zero values).

    The caches must not share memory with each other or with anything the call reads (q, k,
    v, the tables, cache_seqlens, block_table, the scales): that is refused, before anything is
    written, wherever the call runs on real tensors (torch.compile's "eager" backend included);
    a graph that PyTorch functionalizes (aot_eager, Inductor) reads every input as it was
    before the call. q, k and v may be views of one projection: they are only read.
    """
    sig = eager.signature(("rope_kv_cache", interleaved, type(interleaved)),
                          (q, k, v, k_cache, v_cache, cache_seqlens, freqs, cos, sin,
                           block_table, k_scale, v_scale)) if eager.active() else None
    route = eager.SIGNATURES.get(sig) if sig is not None else None
    if route is not None:   # checked before: only values and the caches' overlap are new
        table, sin_t = checked_tables(freqs, cos, sin)
        return route(q, k, v, k_cache, v_cache, cache_seqlens, block_table, table, sin_t,
                     k_scale.reshape(1) if k_scale is not None else None,
                     v_scale.reshape(1) if v_scale is not None else None)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        V.check_tensor(t, name, dims=(4,), dtypes=KV_INPUT_DTYPES)
        V.check_kernel_device(t, name)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    V.check_bool(interleaved, "interleaved")
    B, S, HQ, D = q.shape
    HK, DV = k.shape[2], v.shape[3]
    if tuple(k.shape) != (B, S, HK, D) or tuple(v.shape[:3]) != (B, S, HK):
        raise ValueError(f"q [B, S, HQ, D], k [B, S, HK, D] and v [B, S, HK, DV] must agree, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    if HK == 0 or HQ % HK:
        raise ValueError(f"k's head count ({HK}) must divide q's ({HQ}) (grouped-query "
                         "attention)")
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        V.check_tensor(t, name, dims=(4,), dtypes=KV_CACHE_DTYPES)
        if not V.non_overlapping(t):
            raise ValueError(f"{name} has elements that share memory (an expanded tensor?): it "
                             "is written in place")
    paged = block_table is not None
    lead = k_cache.shape[:2]
    if tuple(k_cache.shape[2:]) != (HK, D) or tuple(v_cache.shape) != (*lead, HK, DV):
        kind = "[NB, BS, HK, D]" if paged else "[B, L, HK, D]"
        raise ValueError(f"k_cache must be {kind} with HK={HK}, D={D} (and v_cache the same "
                         f"with DV={DV}), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    V.check_int_tensor(cache_seqlens, "cache_seqlens", dims=(1,))
    if cache_seqlens.dtype not in (torch.int32, torch.int64) or cache_seqlens.shape[0] != B:
        raise ValueError(f"cache_seqlens must be [B={B}] int32 (or int64), got "
                         f"{cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)}")
    if paged:
        V.check_int_tensor(block_table, "block_table", dims=(2,))
        if block_table.dtype not in (torch.int32, torch.int64) or block_table.shape[0] != B:
            raise ValueError(f"block_table must be [B={B}, MAX_BLOCKS] int32, got "
                             f"{block_table.dtype} of shape {tuple(block_table.shape)}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"a contiguous k_cache must be [B={B}, L, HK, D], got "
                             f"{tuple(k_cache.shape)} (pass block_table for a paged cache)")
        capacity = k_cache.shape[1]
    _check_cache_layout(k_cache, v_cache, paged)
    k_scale = _check_scale(k_scale, k_cache, "k_scale", "k_cache")
    v_scale = _check_scale(v_scale, v_cache, "v_scale", "v_cache")
    table, sin_t = _tables(freqs, cos, sin)
    tname = "freqs" if freqs is not None else "cos"
    V.check_same_device(q, "q", k=k, v=v, k_cache=k_cache, v_cache=v_cache,
                        cache_seqlens=cache_seqlens, block_table=block_table,
                        **{tname: table}, sin=sin_t)
    V.check_rotary_dim(table.shape[1], D, tname)
    if sig is not None and not any(t.requires_grad for t in (q, k, v, k_cache, v_cache)):
        # planning reads shapes only; the route checks the values, the scales and shared
        # memory before its launch, on this call as on every later one
        # (the tables as later calls of this signature give them: see checked_tables)
        table, sin_t = checked_tables(freqs, cos, sin)
        route = eager.SIGNATURES.put(sig, _Route(q, k, v, k_cache, v_cache, cache_seqlens, block_table,
                                        table, sin_t, k_scale, v_scale, interleaved, capacity,
                                        tname))
        return route(q, k, v, k_cache, v_cache, cache_seqlens, block_table, table, sin_t,
                     k_scale, v_scale)
    _check_values(cache_seqlens, block_table, S, capacity, table.shape[0], k_cache.shape[1],
                  k_cache.shape[0])
    _check_scale_values(k_scale, v_scale)
    # (the operator itself refuses caches sharing memory with its inputs, on real tensors)
    return rope_kv_cache_op(q, k, v, k_cache, v_cache, cache_seqlens, block_table, table, sin_t,
                            k_scale, v_scale, interleaved)
