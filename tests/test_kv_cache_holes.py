"""ropelib.rope_kv_cache: what a call must refuse before it writes, and what must not crash.

1. memory shared between a cache the call writes and anything it reads (q, k, v, index
   tensors, tables, scales): refused with both names, before any write, on the eager route, on
   the operator and in a graph of torch.compile's eager backend; functionalized graphs read
   every input as it was; views of one fused projection and a shared k/v pool stay accepted;
2. two new tokens mapped to one cache slot (a repeated block in block_table): refused where
   the index values are read on the host; blocks shared but not written stay accepted;
3. torch.compile(fullgraph=True) with symbolic sizes (dynamic=True, and a recompile after a
   new batch size) of rope_kv_cache and of the in-place rotations: eager's bits;
4. an empty batch (and no new tokens): empty outputs, no write, no crash;
5. a zero or non-finite k_scale / v_scale of a float8 cache: refused where readable.

Inputs are drawn afresh per test (the `seeded` fixture), caches poisoned where a write must not
land, q checked against the float64 reference.
"""
import re

import pytest
import torch
import torch._dynamo

import ropelib
from ropelib import eager, kv_cache
from ropelib.reference import rope_reference

FP8 = torch.float8_e4m3fn


def make(B=2, S=1, HQ=4, HK=2, D=16, L=8, paged_block=None, cache_dtype=torch.float32,
         seqlens=None, fill=None):
    """New tokens (fp32), caches (random, or `fill`), positions, angles [L + 4, D]."""
    q = torch.randn(B, S, HQ, D)
    k = torch.randn(B, S, HK, D)
    v = torch.randn(B, S, HK, D)
    if seqlens is None:
        seqlens = torch.randint(0, L - S + 1, (B,))
    seqlens = torch.as_tensor(seqlens, dtype=torch.int32)
    if paged_block:
        per_seq = -(-L // paged_block)
        n_blocks = B * per_seq + 1
        block_table = torch.randperm(n_blocks)[:B * per_seq].view(B, per_seq).to(torch.int32)
        lead = (n_blocks, paged_block)
    else:
        block_table, lead = None, (B, L)
    caches = []
    for _ in range(2):
        t = torch.randn(*lead, HK, D) if fill is None else torch.full((*lead, HK, D), fill)
        caches.append(t.to(cache_dtype))
    return dict(q=q, k=k, v=v, k_cache=caches[0], v_cache=caches[1], cache_seqlens=seqlens,
                block_table=block_table, freqs=ropelib.rope_freqs(L + 4, D))


def call(c, **opts):
    return ropelib.rope_kv_cache(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"],
                                 c["cache_seqlens"], c["freqs"], block_table=c["block_table"],
                                 **opts)


def call_op(c, k_scale=None, v_scale=None):
    return torch.ops.ropelib.rope_kv_cache(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"],
                                           c["cache_seqlens"], c["block_table"],
                                           c["freqs"][:, 0, 0], None, k_scale, v_scale, False)


def bits(t):
    """A tensor's bits, comparable with torch.equal (NaN equal to NaN, fp8 as bytes)."""
    return t.view(torch.uint8) if t.dtype == FP8 else t.view(torch.int32)


def snapshot(c):
    return [bits(c[n]).clone() for n in ("k_cache", "v_cache")]


def untouched(c, before):
    return all(torch.equal(bits(c[n]), b) for n, b in zip(("k_cache", "v_cache"), before))


def reference_q(c):
    S = c["q"].shape[1]
    pos = c["cache_seqlens"].long()[:, None] + torch.arange(S)
    f = c["freqs"][:, 0, 0].double()
    return rope_reference(c["q"].double(), cos=f.cos(), sin=f.sin(), layout="bshd",
                          position_ids=pos)


def unfused_caches(c, k_scale=None, v_scale=None):
    """The caches after ropelib.apply_rope_qk and the cache write in PyTorch (on copies)."""
    S = c["q"].shape[1]
    pos = c["cache_seqlens"].long()[:, None] + torch.arange(S)
    _, k = ropelib.apply_rope_qk(c["q"], c["k"], c["freqs"], layout="bshd", position_ids=pos)
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    kv_cache.write_kv_cache(k, c["v"], kc, vc, c["cache_seqlens"],
                            block_table=c["block_table"], k_scale=k_scale, v_scale=v_scale)
    return kc, vc


# --- 1. inputs sharing memory with a cache the call writes -----------------------------------

ALIAS_CASES = {
    # case: (make's options, the input that shares memory, the cache it shares it with)
    "v_in_the_k_cache_slots_written": (dict(), "v", "k_cache"),
    "q_in_v_cache": (dict(), "q", "v_cache"),
    "paged_k_in_a_block_another_sequence_writes": (dict(paged_block=4, seqlens=[5, 2]), "k",
                                                   "k_cache"),
    "freqs_in_k_cache": (dict(), "freqs", "k_cache"),
    "cache_seqlens_in_k_cache": (dict(), "cache_seqlens", "k_cache"),
    "block_table_in_v_cache": (dict(paged_block=4), "block_table", "v_cache"),
    "k_scale_in_v_cache": (dict(cache_dtype=FP8), "k_scale", "v_cache"),
}


def aliased(case):
    """(inputs, one of them a view of a cache's memory, that input's name, the cache's name,
    the scales)."""
    opts, name, cache_name = ALIAS_CASES[case]
    c = make(**opts)
    kc, vc, S = c["k_cache"], c["v_cache"], c["q"].shape[1]
    scales = {}
    if case == "v_in_the_k_cache_slots_written":     # v_cache would receive the rotated k
        p = int(c["cache_seqlens"][0])
        c["v"] = kc[:, p:p + S]
    elif case == "q_in_v_cache":
        B, HQ, D = c["q"].shape[0], c["q"].shape[2], c["q"].shape[3]
        c["q"] = vc.view(B, -1, HQ, D)[:, :S]
    elif case == "paged_k_in_a_block_another_sequence_writes":
        # sequence 0 writes position 5: block block_table[0, 1], offset 1; sequence 1's k is
        # that slot (and sequence 0's the one before it)
        w = int(c["block_table"][0, 1]) * kc.shape[1] + 1
        c["k"] = kc.view(-1, *kc.shape[2:])[w - 1:w + 1].unsqueeze(1)
    elif case == "freqs_in_k_cache":
        f = c["freqs"]
        c["freqs"] = kc.view(-1)[:f.numel()].view(f.shape)
        c["freqs"].copy_(f)
    elif case in ("cache_seqlens_in_k_cache", "block_table_in_v_cache"):
        t = c[name]
        ints = (kc if cache_name == "k_cache" else vc).view(torch.int32).view(-1)
        c[name] = ints[-t.numel():].view(t.shape)
        c[name].copy_(t)
    elif case == "k_scale_in_v_cache":
        scales["k_scale"] = vc.view(torch.float32).view(-1)[-1:]
        scales["k_scale"].fill_(0.5)
        scales["v_scale"] = torch.tensor([0.25])
    return c, name, cache_name, scales


def fresh(c, scales):
    """The same call with every input in memory of its own (same shapes, strides, dtypes: the
    same signature), and caches of their own."""
    def own(t):
        if t is None:
            return None
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        return out.copy_(t)
    return ({n: own(t) for n, t in c.items()}, {n: own(t) for n, t in scales.items()})


@pytest.mark.parametrize("path", ["first_call", "planned_route", "operator",
                                  "compiled_eager_backend"])
@pytest.mark.parametrize("case", list(ALIAS_CASES))
def test_1_input_sharing_memory_with_a_written_cache_is_refused(case, path, seeded):
    c, name, cache_name, scales = aliased(case)
    eager.SIGNATURES.clear()
    if path == "planned_route":    # the same signature planned by a call without sharing
        good, good_scales = fresh(c, scales)
        call(good, **good_scales)
        assert len(eager.SIGNATURES.entries) == 1
    before = snapshot(c)
    if name == "freqs" and path in ("operator", "compiled_eager_backend"):
        name = "table (freqs or cos)"       # the operator's name of the argument
    with pytest.raises(ValueError, match=re.escape(f"{name} shares memory with {cache_name}")):
        if path == "operator":
            call_op(c, **scales)
        elif path == "compiled_eager_backend":
            torch._dynamo.reset()
            try:
                torch.compile(lambda c, s: call(c, **s), backend="eager",
                              fullgraph=True)(c, scales)
            finally:
                torch._dynamo.reset()
        else:
            call(c, **scales)
    assert untouched(c, before), "a cache was written before the error"


@pytest.mark.parametrize("case", ["v_in_the_k_cache_slots_written",
                                  "paged_k_in_a_block_another_sequence_writes"])
def test_1_functionalized_graph_reads_inputs_as_they_were(case, seeded):
    """aot_eager functionalizes the operator: the inputs are read as they were before the
    call, so the result is the call's on copies of them."""
    c, _, _, scales = aliased(case)
    want_c, _ = fresh(c, scales)
    want_q = call(want_c, **scales)
    torch._dynamo.reset()
    try:
        q = torch.compile(lambda c: call(c, **scales), backend="aot_eager", fullgraph=True)(c)
    finally:
        torch._dynamo.reset()
    assert torch.equal(q, want_q)
    for n in ("k_cache", "v_cache"):
        assert torch.equal(bits(c[n]), bits(want_c[n]))


def test_1_views_of_one_projection_into_one_kv_pool_are_accepted(seeded):
    """q, k, v as views of one fused projection, k and v caches side by side in one paged pool
    [NB, BS, 2, HK, D]: nothing shared that is written, so no refusal; the fp64 reference's q
    and the unfused path's caches."""
    B, S, H, D, BS = 2, 2, 2, 16, 4
    c = make(B=B, S=S, HQ=H, HK=H, D=D, paged_block=BS, seqlens=[3, 6], fill=float("nan"))
    qkv = torch.randn(B, S, 3, H, D)
    c["q"], c["k"], c["v"] = qkv.unbind(2)
    pool = torch.full((c["k_cache"].shape[0], BS, 2, H, D), float("nan"))
    c["k_cache"], c["v_cache"] = pool[:, :, 0], pool[:, :, 1]
    want_kc, want_vc = unfused_caches(c)
    eager.SIGNATURES.clear()
    for _ in range(2):          # the first call, then the planned route
        q = call(c)
        torch.testing.assert_close(q.double(), reference_q(c), atol=2e-5, rtol=2e-5)
        for n, want in (("k_cache", want_kc), ("v_cache", want_vc)):
            assert torch.equal(c[n].isnan(), want.isnan())
            assert torch.equal(c[n].nan_to_num(0), want.nan_to_num(0))


@pytest.mark.parametrize("case", ["k_features_strided", "v_features_strided",
                                  "paged_caches_laid_out_differently"])
@pytest.mark.parametrize("path", ["call", "operator"])
def test_1_caches_the_kernel_cannot_write_as_they_are_are_refused(case, path, seeded):
    """Caches are written in place, so never copied: features at stride 1, and a paged call's
    two caches laid out alike (one set of strides in units of the head dim). Refused with the
    argument's name, before any write."""
    c = make(paged_block=4 if case.startswith("paged") else None, S=1)
    if case == "k_features_strided":
        c["k_cache"] = torch.randn(*c["k_cache"].shape[:3], 32)[..., ::2]
        match = "k_cache's features"
    elif case == "v_features_strided":
        c["v_cache"] = torch.randn(*c["v_cache"].shape[:3], 32)[..., ::2]
        match = "v_cache's features"
    else:       # v_cache head-major ([NB, HK, BS, D] transposed), k_cache slot-major
        c["v_cache"] = c["v_cache"].transpose(1, 2).contiguous().transpose(1, 2)
        match = "paged k_cache and v_cache must be laid out alike"
    before = snapshot(c)
    with pytest.raises(ValueError, match=re.escape(match)):
        call(c) if path == "call" else call_op(c)
    assert untouched(c, before)


def test_1_paged_pools_of_one_layout_are_accepted(seeded):
    """Two head-major pools ([NB, HK, BS, D] transposed), as FlashInfer's HND layout: laid out
    alike, accepted; the unfused path's caches."""
    c = make(paged_block=4, S=2, seqlens=[3, 5])
    for n in ("k_cache", "v_cache"):
        c[n] = c[n].transpose(1, 2).contiguous().transpose(1, 2)
    want_kc, want_vc = unfused_caches(c)
    eager.SIGNATURES.clear()
    for _ in range(2):
        kc, vc = c["k_cache"].clone(), c["v_cache"].clone()     # (clones keep the strides)
        assert kc.stride() == c["k_cache"].stride() and not kc.is_contiguous()
        q = call(dict(c, k_cache=kc, v_cache=vc))
        torch.testing.assert_close(q.double(), reference_q(c), atol=2e-5, rtol=2e-5)
        assert torch.equal(bits(kc), bits(want_kc)) and torch.equal(bits(vc), bits(want_vc))


# --- 2. two new tokens in one cache slot -----------------------------------------------------

def _repeated_slot(case):
    if case == "across_sequences":      # both sequences write offset 1 of one block
        c = make(B=2, S=1, paged_block=4, seqlens=[1, 1])
        c["block_table"][1, 0] = c["block_table"][0, 0]
    else:                               # positions 2..5 of one sequence: blocks 1 and 2 repeat
        c = make(B=1, S=4, paged_block=2, seqlens=[2])
        c["block_table"][0, 2] = c["block_table"][0, 1]
    return c


@pytest.mark.parametrize("path", ["first_call", "planned_route", "checks_on"])
@pytest.mark.parametrize("case", ["across_sequences", "within_a_sequence"])
def test_2_repeated_cache_slots_are_refused(case, path, seeded):
    c = _repeated_slot(case)
    eager.SIGNATURES.clear()
    if path == "planned_route":
        good = dict(c, block_table=torch.arange(c["block_table"].numel(), dtype=torch.int32)
                    .view(c["block_table"].shape), k_cache=c["k_cache"].clone(),
                    v_cache=c["v_cache"].clone())
        call(good)
        assert len(eager.SIGNATURES.entries) == 1
    before = snapshot(c)
    with ropelib.set_index_checks("on" if path == "checks_on" else "auto"):
        with pytest.raises(ValueError, match="block_table maps two new tokens to one cache "
                                             r"slot \(block \d+, offset \d+\)"):
            call(c)
    assert untouched(c, before)


def test_2_unchecked_repeated_slot_writes_only_that_slot(seeded):
    """Index checks off (as for GPU index tensors by default): accepted, as documented; the
    repeated slot holds one of the two tokens' values, nothing else changes but the slots
    written."""
    c = _repeated_slot("across_sequences")
    c["k_cache"].fill_(float("nan"))
    c["v_cache"].fill_(float("nan"))
    with ropelib.set_index_checks("off"):
        call(c)
    blk = int(c["block_table"][0, 0])
    written = ~c["v_cache"].isnan().all(-1).all(-1)
    assert written.nonzero().tolist() == [[blk, 1]]
    assert any(torch.equal(c["v_cache"][blk, 1], c["v"][b, 0]) for b in (0, 1))


def test_2_shared_blocks_not_written_are_accepted(seeded):
    """Two sequences share a prefix block (read, not written now) and write their own blocks."""
    c = make(B=2, S=1, paged_block=4, seqlens=[5, 6], fill=float("nan"))
    c["block_table"][1, 0] = c["block_table"][0, 0]
    want_kc, want_vc = unfused_caches(c)
    q = call(c)
    torch.testing.assert_close(q.double(), reference_q(c), atol=2e-5, rtol=2e-5)
    for n, want in (("k_cache", want_kc), ("v_cache", want_vc)):
        assert torch.equal(c[n].isnan(), want.isnan())
        assert torch.equal(c[n].nan_to_num(0), want.nan_to_num(0))


# --- 3. torch.compile with symbolic sizes ----------------------------------------------------

H, D, L = 2, 16, 8
FREQS = ropelib.rope_freqs(L, D)


def _kv_step(q, k, v, kc, vc, seqlens, freqs):
    return ropelib.rope_kv_cache(q, k, v, kc, vc, seqlens, freqs)


def _rope_in_place(q, k, v, kc, vc, seqlens, freqs):
    return ropelib.apply_rope(q, freqs, layout="bshd", inplace=True)


def _rope_qk_in_place(q, k, v, kc, vc, seqlens, freqs):
    return ropelib.apply_rope_qk(q, k, freqs, layout="bshd", inplace=True)


def _step_args(B, device="cpu"):
    S = 2
    args = [torch.randn(B, S, 2 * H, D), torch.randn(B, S, H, D), torch.randn(B, S, H, D),
            torch.full((B, L, H, D), float("nan")), torch.full((B, L, H, D), float("nan")),
            torch.randint(0, L - S + 1, (B,), dtype=torch.int32)]
    return [t.to(device) for t in args]


def _check_compiled(fn, compiled, batches, freqs, device):
    """compiled(...) returns and writes (outputs and caches, NaN where eager's are) what fn does
    eagerly, for a step of each batch size in turn."""
    for B in batches:
        args = _step_args(B, device)
        want_args = [t.clone() for t in args]
        want = fn(*want_args, freqs)
        got = compiled(*args, freqs)
        for a, b in zip(torch.utils._pytree.tree_leaves((got, args)),
                        torch.utils._pytree.tree_leaves((want, want_args))):
            assert torch.equal(a.isnan(), b.isnan())
            assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))


@pytest.mark.parametrize("fn", [_kv_step, _rope_in_place, _rope_qk_in_place],
                         ids=["rope_kv_cache", "apply_rope_inplace", "apply_rope_qk_inplace"])
@pytest.mark.parametrize("mode", ["dynamic", "recompile_after_batch_change"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_3_compiled_with_symbolic_sizes_equals_eager(fn, mode, backend, seeded):
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend=backend, fullgraph=True,
                                 dynamic=True if mode == "dynamic" else None)
        # batch 3 after 2: a recompile; dynamic=True: batch 3 with symbolic sizes
        _check_compiled(fn, compiled, (3,) if mode == "dynamic" else (2, 3), FREQS, "cpu")
    finally:
        torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("fn", [_kv_step, _rope_in_place, _rope_qk_in_place],
                         ids=["rope_kv_cache", "apply_rope_inplace", "apply_rope_qk_inplace"])
@pytest.mark.parametrize("mode", ["static", "dynamic", "recompile_after_batch_change"])
def test_3_inductor_on_the_gpu_equals_eager(fn, mode, seeded):
    """The same under Inductor, which functionalizes the graph and generates the launch."""
    torch._dynamo.reset()
    freqs = FREQS.cuda()
    try:
        compiled = torch.compile(fn, backend="inductor", fullgraph=True,
                                 dynamic={"static": False, "dynamic": True}.get(mode))
        _check_compiled(fn, compiled, (2, 3) if mode == "recompile_after_batch_change" else (3,),
                        freqs, "cuda")
    finally:
        torch._dynamo.reset()


# --- 4. empty batches ------------------------------------------------------------------------

@pytest.mark.parametrize("B, S", [(0, 1), (0, 3), (2, 0)])
@pytest.mark.parametrize("cache", ["contiguous", "paged", "paged_fp8"])
def test_4_empty_calls_write_nothing(B, S, cache, seeded):
    fp8 = cache == "paged_fp8"
    c = make(B=B, S=S, paged_block=4 if cache != "contiguous" else None, seqlens=[3] * B,
             cache_dtype=FP8 if fp8 else torch.float32)
    if B == 0 and cache == "contiguous":
        assert c["k_cache"].shape[0] == 0
    scales = dict(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([2.0])) if fp8 else {}
    before = snapshot(c)
    eager.SIGNATURES.clear()
    for q in (call(c, **scales), call(c, **scales), call_op(c, **scales)):   # planned, reused
        assert q.shape == (B, S, 4, 16) and q.dtype == torch.float32
    assert untouched(c, before)


def test_4_empty_batch_rotations(seeded):
    """The rotations without a cache, in place or not, with an empty batch."""
    f = ropelib.rope_freqs(8, 16)
    for _ in range(2):     # the first call, then the planned route
        x = torch.randn(0, 3, 2, 16)
        assert ropelib.apply_rope(x, f, layout="bshd").shape == x.shape
        assert ropelib.apply_rope(x, f, layout="bshd", inplace=True) is x
        q, k = ropelib.apply_rope_qk(x, x.clone(), f, layout="bshd",
                                     start_positions=torch.zeros(0, dtype=torch.int32))
        assert q.shape == k.shape == x.shape


# --- 5. zero scales of float8 caches ---------------------------------------------------------

@pytest.mark.parametrize("path", ["first_call", "planned_route"])
@pytest.mark.parametrize("name, value", [("k_scale", 0.0), ("v_scale", 0.0), ("v_scale", -0.0),
                                         ("k_scale", float("inf")), ("v_scale", float("nan"))])
def test_5_zero_or_non_finite_scales_are_refused(name, value, path, seeded):
    c = make(S=2, cache_dtype=FP8, paged_block=4)
    scales = dict(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([2.0]))
    eager.SIGNATURES.clear()
    if path == "planned_route":
        call(dict(c, k_cache=c["k_cache"].clone(), v_cache=c["v_cache"].clone()), **scales)
        assert len(eager.SIGNATURES.entries) == 1
    scales[name] = torch.tensor([value])
    before = snapshot(c)
    with pytest.raises(ValueError, match=f"{name} must be a finite, non-zero"):
        call(c, **scales)
    assert untouched(c, before)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning",
                            "ignore:invalid value:RuntimeWarning")   # the interpreter's numpy
def test_5_unchecked_zero_scale_saturates(seeded):
    """Index checks off (as for GPU scales by default): accepted, and as documented every value
    stored is +-448 (NaN for a zero value)."""
    c = make(B=1, S=1, cache_dtype=FP8, seqlens=[2], fill=0.0)
    c["v"][0, 0, 0, 0] = 0.0
    with ropelib.set_index_checks("off"):
        call(c, k_scale=torch.tensor([0.5]), v_scale=torch.tensor([0.0]))
    got = c["v_cache"][0, 2].float()
    v = c["v"][0, 0]
    assert torch.equal(got[v != 0].abs(), torch.full_like(got[v != 0], 448.0))
    assert got[v == 0].isnan().all()
