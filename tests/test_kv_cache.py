"""ropelib.rope_kv_cache: RoPE fused with the KV-cache write, and generation with it.

* the same bits as the unfused path (ropelib.apply_rope_qk, then the write in PyTorch) and the
  fp64 reference within one rounding: contiguous and paged caches, per-sequence positions,
  decode (S = 1) and prefill chunks, GQA, both pairings, angle and cos/sin tables, partial
  rotary, strided inputs; every cache element outside the new tokens' slots left untouched;
* float8_e4m3fn caches with per-tensor scales: the same bits as torch's conversion of
  value / scale (clamped), also in the interpreter (the kernel encodes e4m3 itself there);
* bad positions and block tables: a clear error where the values are checked, and never a write
  outside the caches where they are not (guard regions), with NaN q rows;
* torch.library.opcheck, torch.compile(aot_eager, fullgraph=True) of a decode step;
* ropelib.course.model.generate: fused, unfused and no-cache greedy decoding give the same tokens;
* benchmarks/decode_cache_bench.py --dry-run.
"""
from pathlib import Path

import pytest
import torch
import torch._dynamo

import ropelib
from ropelib import eager, kv_cache
from ropelib.kernels import kv_cache as kernel
from ropelib.reference import rope_reference
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPS = torch.ops.ropelib
FP8 = torch.float8_e4m3fn
# dtype -> (atol, rtol): one rounding of values of a few units
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 2**-10), torch.bfloat16: (3e-2, 2**-7)}


def make(B=3, S=1, HQ=4, HK=2, D=16, DV=None, L=12, dtype=torch.float32, cache_dtype=None,
         paged_block=None, P=None, R=None, interleaved=False, seqlens=None):
    """New tokens, caches poisoned with NaN, positions and a table (angles [P, R] fp32)."""
    DV = DV or D
    cache_dtype = cache_dtype or dtype
    q = torch.randn(B, S, HQ, D).to(dtype)
    k = torch.randn(B, S, HK, D).to(dtype)
    v = torch.randn(B, S, HK, DV).to(dtype)
    if seqlens is None:
        seqlens = torch.randint(0, L - S + 1, (B,))
    seqlens = torch.as_tensor(seqlens, dtype=torch.int32)
    if paged_block:
        per_seq = -(-L // paged_block)
        n_blocks = B * per_seq + 2                              # two blocks nobody owns
        block_table = torch.randperm(n_blocks)[:B * per_seq].view(B, per_seq).to(torch.int32)
        lead = (n_blocks, paged_block)
    else:
        block_table, lead = None, (B, L)
    fill = float("nan") if cache_dtype != FP8 else 0.0
    k_cache = torch.full((*lead, HK, D), fill).to(cache_dtype)
    v_cache = torch.full((*lead, HK, DV), fill).to(cache_dtype)
    freqs = ropelib.rope_freqs(P or L + 4, D, rotary_percent=(R or D) / D,
                               interleaved=interleaved)
    return dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, cache_seqlens=seqlens,
                block_table=block_table, freqs=freqs)


def unfused(c, *, interleaved=False, k_scale=None, v_scale=None, cos=None, sin=None):
    """ropelib.apply_rope_qk, then the cache write in PyTorch, on copies of the caches."""
    S = c["q"].shape[1]
    pos = c["cache_seqlens"].long()[:, None] + torch.arange(S, device=c["cache_seqlens"].device)
    tab = dict(cos=cos, sin=sin) if cos is not None else dict(freqs=c["freqs"])
    q, k = ropelib.apply_rope_qk(c["q"], c["k"], **tab, layout="bshd", position_ids=pos,
                                 interleaved=interleaved)
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    kv_cache.write_kv_cache(k, c["v"], kc, vc, c["cache_seqlens"], block_table=c["block_table"],
                            k_scale=k_scale, v_scale=v_scale)
    return q, kc, vc


def fused(c, **opts):
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    tab = {} if "cos" in opts else dict(freqs=c["freqs"])
    q = ropelib.rope_kv_cache(c["q"], c["k"], c["v"], kc, vc, c["cache_seqlens"], **tab,
                              block_table=c["block_table"], **opts)
    return q, kc, vc


def same_bits(a, b):
    """Equal, NaN where the other is NaN (the untouched poison)."""
    if a.dtype == FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else True
    if a.is_floating_point():
        a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
    assert torch.equal(a, b), (a.double() - b.double()).abs().max()


def written_mask(c):
    """[rows, slots] True at the cache slots of the new tokens."""
    rows, slots = kv_cache.cache_slots(c["cache_seqlens"], c["q"].shape[1], c["block_table"],
                                       c["k_cache"].shape[1])
    mask = torch.zeros(c["k_cache"].shape[:2], dtype=torch.bool)
    mask[rows, slots] = True
    return mask


# --- parity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("paged_block", [None, 4], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("S", [1, 3], ids=["decode", "prefill"])
def test_same_bits_as_rope_then_write(paged_block, dtype, S, seeded):
    c = make(S=S, dtype=dtype, paged_block=paged_block)
    q, kc, vc = fused(c)
    q_u, kc_u, vc_u = unfused(c)
    same_bits(q, q_u)
    same_bits(kc, kc_u)
    same_bits(vc, vc_u)
    # only the new tokens' slots were written, each with the rotated k of the fp64 reference
    mask = written_mask(c)
    assert not kc[mask].isnan().any() and kc[~mask].isnan().all() and vc[~mask].isnan().all()
    pos = c["cache_seqlens"].long()[:, None] + torch.arange(S, device=c["cache_seqlens"].device)
    f = c["freqs"][:, 0, 0].double()
    want_q = rope_reference(c["q"].double(), cos=f.cos(), sin=f.sin(), layout="bshd",
                            position_ids=pos)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q.double(), want_q, atol=atol, rtol=rtol)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3), (4, 1)], ids=["gqa", "mha", "mqa"])
def test_pairings_heads_and_partial_rotary(interleaved, heads, seeded):
    """Head dim 24 (not a power of two) with R = 16 (the rest passes through), v's head dim 8,
    per-feature angles read by each member of a pair."""
    c = make(B=2, S=2, HQ=heads[0], HK=heads[1], D=24, DV=8, R=16, interleaved=interleaved,
             paged_block=3)
    q, kc, vc = fused(c, interleaved=interleaved)
    q_u, kc_u, vc_u = unfused(c, interleaved=interleaved)
    for a, b in ((q, q_u), (kc, kc_u), (vc, vc_u)):
        same_bits(a, b)


def test_cos_sin_tables_and_strided_inputs(seeded):
    """q, k, v as strided views of one projection [B, S, 3, H, D]; a cos/sin table."""
    B, S, H, D, L = 2, 2, 2, 16, 9
    qkv = torch.randn(B, S, 3, H, D, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    c = make(B=B, S=S, HQ=H, HK=H, D=D, L=L, dtype=torch.bfloat16, seqlens=[0, 7])
    c.update(q=q, k=k, v=v)
    cos, sin = ropelib.rope_cos_sin(L, D)
    q_f, kc, vc = fused(c, cos=cos, sin=sin)
    q_u, kc_u, vc_u = unfused(c, cos=cos, sin=sin)
    for a, b in ((q_f, q_u), (kc, kc_u), (vc, vc_u)):
        same_bits(a, b)
    assert q_f.is_contiguous() and q_f.dtype == torch.bfloat16


def _strided_like_hf(t):
    """t [B, S, H, D] as a transposed [B, H, S, D] (Hugging Face's layout): not token-major for
    S > 1 (heads at stride S*D), so the call copies it."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("paged_block", [None, 3], ids=["contiguous", "paged"])
def test_inputs_the_kernel_cannot_read_as_they_are_are_copied(paged_block, seeded):
    """q, k, v not token-major (transposed [B, H, S, D], tokens unevenly spaced), a table whose
    rows are not dense (features sliced off), index tensors with strides: copied before the
    launch, on the first call, on the planned route and through the operator; the same bits
    as the unfused path, and the caller's tensors untouched."""
    c = make(B=2, S=3, HQ=4, HK=2, D=16, DV=8, paged_block=paged_block, seqlens=[0, 5])
    want = unfused(c)
    c["q"] = _strided_like_hf(c["q"])
    c["k"] = torch.cat([c["k"], torch.zeros_like(c["k"])], 1)[:, :3]     # batch stride 2S x
    c["v"] = _strided_like_hf(c["v"])
    c["freqs"] = torch.cat([c["freqs"], c["freqs"]], -1)[..., :16]          # rows of 32
    c["cache_seqlens"] = torch.stack([c["cache_seqlens"], c["cache_seqlens"]], 1)[:, 0]
    if paged_block:
        c["block_table"] = c["block_table"].t().contiguous().t()
    assert kernel.token_stride(c["q"]) is None and kernel.token_stride(c["k"]) is None
    assert not c["freqs"].is_contiguous() and not c["cache_seqlens"].is_contiguous()
    eager.SIGNATURES.clear()
    for _ in range(2):          # the first call, then the planned route
        for a, b in zip(fused(c), want):
            same_bits(a, b)
    assert len(eager.SIGNATURES.entries) == 1
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    q = OPS.rope_kv_cache(c["q"], c["k"], c["v"], kc, vc, c["cache_seqlens"], c["block_table"],
                          c["freqs"][:, 0, 0], None, None, None, False)
    for a, b in zip((q, kc, vc), want):
        same_bits(a, b)


def test_decode_views_are_read_as_they_are():
    """Views of one projection, and any decode step (S = 1) of a transposed [B, H, 1, D], are
    token-major: the kernel reads them without a copy."""
    qkv = torch.randn(2, 3, 10, 16)                  # [B, S, HQ + 2 HK, D]: 6 + 2 + 2 heads
    for t in (qkv[:, :, :6], qkv[:, :, 6:8], qkv[:, :, 8:],
              torch.randn(2, 4, 1, 16).transpose(1, 2), torch.randn(2, 3, 4, 16)):
        assert kernel.token_stride(t) is not None
    assert kernel.token_stride(torch.randn(2, 4, 3, 16).transpose(1, 2)) is None


def test_contiguous_caches_of_different_layouts(seeded):
    """Contiguous caches keep strides of their own: k_cache [B, L, HK, D] and v_cache a
    transposed [B, HK, L, DV] (Hugging Face's), both written as the unfused path writes them."""
    c = make(B=2, S=2, HQ=4, HK=2, D=16, DV=8, L=6, seqlens=[0, 3])
    c["v_cache"] = c["v_cache"].transpose(1, 2).contiguous().transpose(1, 2)
    q, kc, vc = fused(c)
    for a, b in zip((q, kc, vc), unfused(c)):
        same_bits(a, b)


def test_each_kernel_takes_at_most_33_arguments():
    """One entry kernel per kind of cache; none wider than 33 arguments (host time per launch;
    the 33rd, ENTRIES, a constexpr: a program's batch entries, fixed on a GPU)."""
    widths = {lc.kernel.fn.__name__: len(lc.kernel.arg_names) for lc in kernel.LAUNCHERS}
    assert widths == {"_rope_kv_cache_kernel": 33, "_rope_kv_paged_kernel": 33}, widths


def test_caches_of_another_dtype(seeded):
    """fp32 tokens into bf16 caches: rounded once (to nearest even) at the store."""
    c = make(S=2, dtype=torch.float32, cache_dtype=torch.bfloat16)
    _, kc, vc = fused(c)
    _, kc_u, vc_u = unfused(c)
    same_bits(kc, kc_u)
    same_bits(vc, vc_u)


# --- float8 caches --------------------------------------------------------------------------

def test_fp8_encoding_matches_torch_bit_for_bit():
    """The kernel's e4m3 rounding (bit encoding in the interpreter, the hardware's on a GPU):
    ties to even, subnormals, saturation at +-448, signed zeros, NaN."""
    special = torch.tensor([0.0, -0.0, 1.0625, 1.1875, -7.77, 447.0, 448.0, 464.0, 1e6, -1e6,
                            2**-6, 2**-7, 2**-9, 2**-10, 1.5 * 2**-9, 2.5 * 2**-9, 3.5 * 2**-9,
                            float("nan")])
    x = torch.cat([special, 60 * torch.randn(3000), 0.02 * torch.randn(1000)])
    x = x.view(1, -1, 1, 1).expand(1, x.numel(), 1, 2).contiguous()      # [1, N, 1, 2]
    # v [1, N, 1, 2] -> v_cache (scale 0.5): stored = fp8(v / 0.5)
    scale = torch.tensor([0.5])
    L = x.shape[1]
    vc = torch.zeros(1, L, 1, 2).to(FP8)
    kc = torch.zeros(1, L, 1, 2).to(FP8)
    ropelib.rope_kv_cache(torch.zeros_like(x), torch.zeros_like(x), x, kc, vc,
                          torch.zeros(1, dtype=torch.int32), ropelib.rope_freqs(L, 2),
                          k_scale=scale, v_scale=scale)
    want = kv_cache.quantize_fp8(x, scale)
    got, want = vc.view(torch.uint8), want.view(torch.uint8)
    nan = vc.float().isnan()
    assert torch.equal(nan, want.view(FP8).float().isnan())
    assert torch.equal(got[~nan], want[~nan])
    assert (vc.float().abs().nan_to_num(0) <= 448).all()


@pytest.mark.parametrize("paged_block", [None, 4], ids=["contiguous", "paged"])
def test_fp8_cache_with_scales(paged_block, seeded):
    """fp32 tokens: the same bits as rotating, dividing by the scale and converting in torch."""
    c = make(S=2, dtype=torch.float32, cache_dtype=FP8, paged_block=paged_block)
    scales = dict(k_scale=torch.tensor([0.25]), v_scale=torch.tensor([3.0]))
    q, kc, vc = fused(c, **scales)
    q_u, kc_u, vc_u = unfused(c, **scales)
    same_bits(q, q_u)
    same_bits(kc, kc_u)
    same_bits(vc, vc_u)
    mask = written_mask(c)
    assert (kc.float()[mask] != 0).any() and (kc.float()[~mask] == 0).all()


def test_fp8_bf16_tokens_within_one_fp8_step(seeded):
    """bf16 tokens: the fused path quantizes the fp32 rotation once; the unfused one rounds to
    bf16 first. Both lie within one e4m3 step (2^-3 relative) of the fp64 value."""
    c = make(S=1, dtype=torch.bfloat16, cache_dtype=FP8)
    scale = torch.tensor([0.5])
    _, kc, _ = fused(c, k_scale=scale, v_scale=scale)
    _, kc_u, _ = unfused(c, k_scale=scale, v_scale=scale)
    mask = written_mask(c)
    a, b = kc.float()[mask], kc_u.float()[mask]
    assert ((a - b).abs() <= 2**-3 * b.abs() + 2**-9).all()


# --- bad positions and block tables ---------------------------------------------------------

def _call(c, **over):
    args = dict(c, **over)
    return ropelib.rope_kv_cache(args["q"], args["k"], args["v"], args["k_cache"],
                                 args["v_cache"], args["cache_seqlens"], args["freqs"],
                                 block_table=args["block_table"],
                                 **{k: v for k, v in over.items() if k.endswith("scale")})


@pytest.mark.parametrize("case, match", [
    (dict(cache_seqlens=[0, 11, 2]), "must fit in the cache of 12 positions"),
    (dict(cache_seqlens=[0, -1, 2]), "must fit in the cache"),
    (dict(P=10, cache_seqlens=[0, 9, 2]), "beyond the table's 10 rows"),
], ids=["past_the_end", "negative", "table"])
def test_positions_are_checked_on_the_host(case, match, seeded):
    c = make(S=2, P=case.get("P"), seqlens=case["cache_seqlens"])
    with pytest.raises(ValueError, match=match):
        _call(c)


def test_block_table_entries_are_checked(seeded):
    c = make(S=1, paged_block=4, seqlens=[0, 5, 9])
    bt = c["block_table"].clone()
    bt[1, 1] = 99
    with pytest.raises(ValueError, match=r"block_table entries .* \[0, 11\)"):
        _call(c, block_table=bt)
    bt = c["block_table"].clone()
    bt[1, 0] = -5     # a block sequence 1 does not write now: not its business
    _call(c, block_table=bt)


@pytest.mark.parametrize("paged_block", [None, 4], ids=["contiguous", "paged"])
def test_unchecked_bad_slots_never_write_outside(paged_block, seeded):
    """Index checks off: the caches are views inside larger guard buffers; a position past the
    cache, a negative one and a block-table entry outside the pool write nothing outside, and
    those tokens' q rows come out NaN."""
    B, S, H, D, L = 3, 2, 2, 16, 8
    c = make(B=B, S=S, HQ=H, HK=H, D=D, L=L, paged_block=paged_block, seqlens=[7, -1, 2])
    guards = []
    for name in ("k_cache", "v_cache"):
        t = c[name]
        big = torch.full((t.shape[0] + 2, *t.shape[1:]), 5.0)
        big[1:-1] = t
        c[name] = big[1:-1]
        guards.append(big)
    if paged_block:
        c["block_table"][2, 0] = 1000       # sequence 2's positions 2, 3: block out of the pool
    with ropelib.set_index_checks("off"):
        q = _call(c)
    bad = torch.tensor([[False, True], [True, False], [bool(paged_block)] * 2])
    assert q[bad].isnan().all() and not q[~bad].isnan().any()
    for big in guards:     # the guards as they were; inside, only the good tokens' slots written
        assert (big[0] == 5).all() and (big[-1] == 5).all()
        assert (~big[1:-1].isnan()).sum() == (~bad).sum() * H * D


def test_position_outside_the_table_gives_nan(seeded):
    c = make(S=2, P=6, L=12, seqlens=[0, 5, 1])
    with ropelib.set_index_checks("off"):
        kc, vc = c["k_cache"], c["v_cache"]
        q = _call(c)
    assert q[1, 1].isnan().all() and not q[1, 0].isnan().any()
    assert kc[1, 6].isnan().all() and not vc[1, 6].isnan().any()    # v has no table row


def test_every_q_element_is_written(seeded):
    """q_out poisoned before the launch (odd head counts, pass-through features)."""
    c = make(B=2, S=3, HQ=6, HK=3, D=20, R=12, paged_block=2)
    q_out = torch.full_like(c["q"], float("nan"))
    kernel.launch(c["q"], c["k"], c["v"], q_out, c["k_cache"], c["v_cache"],
                  c["cache_seqlens"], c["block_table"], c["freqs"][:, 0, 0], None, None, None,
                  interleaved=False)
    assert not q_out.isnan().any()


@pytest.mark.parametrize("over, error, match", [
    (dict(q=torch.randn(3, 1, 4, 16, dtype=torch.float64)), TypeError, "q must have dtype"),
    (dict(k=torch.randn(3, 1, 3, 16), v=torch.randn(3, 1, 3, 16)), ValueError,
     "k's head count"),
    (dict(v=torch.randn(3, 2, 2, 16)), ValueError, "must agree"),
    (dict(k_cache=torch.zeros(3, 12, 2, 8)), ValueError, "k_cache must be"),
    (dict(k_cache=torch.zeros(4, 12, 2, 16), v_cache=torch.zeros(4, 12, 2, 16)), ValueError,
     "contiguous k_cache must be"),
    (dict(k_cache=torch.zeros(3, 12, 2, 16, dtype=torch.int8)), TypeError, "k_cache must have"),
    (dict(k_cache=torch.zeros(3, 1, 2, 16).expand(3, 12, 2, 16)), ValueError, "share memory"),
    (dict(cache_seqlens=torch.zeros(2, dtype=torch.int32)), ValueError, "cache_seqlens must be"),
    (dict(cache_seqlens=torch.zeros(3)), TypeError, "cache_seqlens must be an integer"),
    (dict(block_table=torch.zeros(3, 4)), TypeError, "block_table must be an integer"),
    (dict(freqs=torch.randn(16, 16, dtype=torch.bfloat16)), TypeError, "freqs must be float32"),
    (dict(k_cache=torch.zeros(3, 12, 2, 16).to(FP8)), ValueError, "pass k_scale"),
    (dict(k_scale=torch.ones(1)), ValueError, "k_scale is for a float8"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_arguments_name_the_argument(over, error, match, seeded):
    c = make(S=1)
    with pytest.raises(error, match=match):
        _call(c, **over)


def test_k_and_v_caches_may_not_overlap(seeded):
    c = make(S=1)
    with pytest.raises(ValueError, match="share memory"):
        _call(c, v_cache=c["k_cache"])
    kv = torch.zeros(3, 12, 2, 2, 16)      # one buffer, k and v side by side: allowed
    _call(c, k_cache=kv[:, :, 0], v_cache=kv[:, :, 1])
    assert not kv.isnan().any() and kv.abs().sum() > 0


# --- the eager route ------------------------------------------------------------------------

@pytest.mark.parametrize("paged_block", [None, 4], ids=["contiguous", "paged"])
def test_eager_route_equals_the_operator_step_after_step(paged_block, seeded):
    """Decoding repeats one signature: after the first (checked) call the route is planned; its
    q and cache writes are the operator's bits, step after step, and it is planned once."""
    c = make(S=1, paged_block=paged_block, seqlens=[0, 3, 5])
    eager.SIGNATURES.clear()
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    kc_op, vc_op = c["k_cache"].clone(), c["v_cache"].clone()
    for _ in range(3):
        q = ropelib.rope_kv_cache(c["q"], c["k"], c["v"], kc, vc, c["cache_seqlens"],
                                  c["freqs"], block_table=c["block_table"])
        q_op = torch.ops.ropelib.rope_kv_cache(c["q"], c["k"], c["v"], kc_op, vc_op,
                                               c["cache_seqlens"], c["block_table"],
                                               c["freqs"][:, 0, 0, :], None, None, None, False)
        same_bits(q, q_op)
        same_bits(kc, kc_op)
        same_bits(vc, vc_op)
        c["cache_seqlens"] += 1
    assert len(eager.SIGNATURES.entries) == 1


def test_eager_route_still_checks_values_and_overlap(seeded):
    """A planned signature skips the shape checks, not what its signature cannot hold."""
    c = make(S=1)
    kv = torch.zeros(3, 12, 2, 2, 16)       # k and v side by side in one buffer: allowed
    _call(c, k_cache=kv[:, :, 0], v_cache=kv[:, :, 1])
    with pytest.raises(ValueError, match="cache_seqlens"):
        _call(c, k_cache=kv[:, :, 0], v_cache=kv[:, :, 1],
              cache_seqlens=torch.full((3,), 12, dtype=torch.int32))
    with pytest.raises(ValueError, match="share memory"):      # the same signature
        _call(c, k_cache=kv[:, :, 0], v_cache=kv[:, :, 0])
    assert len(eager.SIGNATURES.entries) >= 1


# --- operator and torch.compile -------------------------------------------------------------

def test_opcheck(seeded):
    for paged_block, cache_dtype in ((None, torch.float32), (4, torch.bfloat16)):
        c = make(S=2, paged_block=paged_block, cache_dtype=cache_dtype)
        for name in ("k_cache", "v_cache"):
            c[name] = c[name].nan_to_num(0.0)
        torch.library.opcheck(
            OPS.rope_kv_cache.default,
            (c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], c["cache_seqlens"],
             c["block_table"], c["freqs"][:, 0, 0], None, None, None, False))


def test_registered_as_a_triton_op_on_a_gpu():
    from torch._library.triton import get_triton_kernels_for_op
    assert bool(get_triton_kernels_for_op("ropelib::rope_kv_cache")) == (not ropelib.INTERPRET)


def test_compiled_decode_step_has_no_graph_break(seeded):
    """A decode step (projection, fused RoPE + cache write, attention over the cache) traces
    into one graph and gives eager's bits, caches included."""
    B, H, D, L = 2, 2, 16, 8
    w = torch.randn(3 * H * D, H * D) / 8
    freqs = ropelib.rope_freqs(L, D)

    def step(x, k_cache, v_cache, seqlens):
        q, k, v = (x @ w.T).view(B, 1, 3, H, D).unbind(2)
        q = ropelib.rope_kv_cache(q, k, v, k_cache, v_cache, seqlens, freqs)
        att = torch.einsum("bshd,blhd->bhsl", q, k_cache).softmax(-1)
        return torch.einsum("bhsl,blhd->bshd", att, v_cache)

    x = torch.randn(B, 1, H * D)
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    caches = [torch.randn(B, L, H, D) for _ in range(2)]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(x, *[t.clone() for t in caches], seqlens)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, \
        [str(b.reason) for b in explained.break_reasons]
    torch._dynamo.reset()
    eager = [t.clone() for t in caches]
    compiled = [t.clone() for t in caches]
    out_e = step(x, *eager, seqlens)
    out_c = torch.compile(step, backend="aot_eager", fullgraph=True)(x, *compiled, seqlens)
    assert torch.equal(out_c, out_e)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
    assert not torch.equal(eager[0], caches[0])
    torch._dynamo.reset()


# --- generation -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    """A small GPT with weights large enough that greedy decoding does not just repeat a token
    (std 0.3; untrained, at GPT-2's 0.02, every sequence repeats its last token)."""
    from ropelib.course.model import GPTConfig, build
    cfg = GPTConfig(vocab_size=40, block_size=24, n_layer=2, n_head=4, n_embd=32)
    m = build(cfg, "ropelib", seed=0)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1)
                    + (1.0 if p.dim() == 1 else 0.0))
    return m


@pytest.fixture(scope="module")
def prompts():
    return torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def full_forward_tokens(model, prompts):
    from ropelib.course.model import generate
    return generate(model, prompts, 10, cache=None)


def test_full_forward_baseline_is_greedy(model, prompts, full_forward_tokens):
    out = full_forward_tokens
    logits, _ = model(out[:, :-1])
    assert torch.equal(out[:, 5:], logits[:, 4:].argmax(-1))
    # a model that says something: not one repeated token per sequence, no near-ties
    assert all(len(set(row)) > 2 for row in out[:, 5:].tolist())
    top2 = logits[:, 4:].topk(2, -1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-3


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("fused_rope", [True, False], ids=["fused", "unfused"])
def test_generate_with_cache_matches_full_forward(model, prompts, full_forward_tokens, cache,
                                                  fused_rope):
    from ropelib.course.model import generate
    out = generate(model, prompts, 10, cache=cache, fused=fused_rope, page_size=4)
    assert torch.equal(out, full_forward_tokens)


def test_cached_logits_match_the_full_forward(model, full_forward_tokens):
    """Prefill of 9 tokens, then 5 decode steps: each step's logits against the full forward
    (fp32; attention over the cache sums in another order), fused and unfused bit-equal."""
    from ropelib.course.model import KVCache, forward_cached
    tokens = full_forward_tokens[:, :14]
    want, _ = model(tokens)
    got = {}
    for fused_rope in (True, False):
        kv = KVCache(model.config, 3, 14, kind="paged", page_size=4)
        steps = [forward_cached(model, tokens[:, :9], kv, fused=fused_rope)]
        steps += [forward_cached(model, tokens[:, t:t + 1], kv, fused=fused_rope)
                  for t in range(9, 14)]
        got[fused_rope] = torch.cat(steps, 1)
        assert kv.length == 14 and kv.seqlens.tolist() == [14] * 3
    assert torch.equal(got[True], got[False])
    torch.testing.assert_close(got[True], want, atol=1e-5, rtol=1e-5)


def test_generate_fp8_cache_fused_equals_unfused(model, prompts):
    from ropelib.course.model import generate
    opts = dict(cache="contiguous", cache_dtype=FP8, k_scale=0.5, v_scale=0.25)
    assert torch.equal(generate(model, prompts, 6, fused=True, **opts),
                       generate(model, prompts, 6, fused=False, **opts))


def test_generate_arguments(model, prompts):
    from ropelib.course.model import generate
    with pytest.raises(ValueError, match="block_size=24"):
        generate(model, prompts, 21)
    with pytest.raises(ValueError, match="cache must be one of"):
        generate(model, prompts, 2, cache="ring")
    assert torch.equal(generate(model, prompts, 0), prompts)
    assert model.training      # generate leaves the mode as it found it


# --- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8])
@pytest.mark.parametrize("paged_block", [None, 16], ids=["contiguous", "paged"])
def test_gpu_decode_under_cuda_graph(cache_dtype, paged_block):
    """bf16 decode on the GPU, captured in a CUDA graph and replayed with new positions."""
    torch.manual_seed(0)
    c = make(B=8, S=1, HQ=32, HK=8, D=128, L=256, dtype=torch.bfloat16,
             cache_dtype=cache_dtype, paged_block=paged_block)
    c = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in c.items()}
    scales = dict(k_scale=torch.tensor([0.5], device="cuda"),
                  v_scale=torch.tensor([0.25], device="cuda")) if cache_dtype == FP8 else {}
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    args = (c["q"], c["k"], c["v"], kc, vc, c["cache_seqlens"])
    ropelib.rope_kv_cache(*args, c["freqs"], block_table=c["block_table"], **scales)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out = ropelib.rope_kv_cache(*args, c["freqs"], block_table=c["block_table"], **scales)
    c["cache_seqlens"].copy_(torch.randint(0, 255, (8,), device="cuda", dtype=torch.int32))
    graph.replay()
    q_u, kc_u, vc_u = unfused(dict(c, k_cache=c["k_cache"], v_cache=c["v_cache"]), **scales)
    same_bits(q_out, q_u)
    mask = written_mask({n: (t.cpu() if isinstance(t, torch.Tensor) else t)
                         for n, t in c.items()}).cuda()
    if cache_dtype == FP8:      # bf16 rounding before the fp8 one in the unfused path
        a, b = kc.float()[mask], kc_u.float()[mask]
        assert ((a - b).abs() <= 2**-3 * b.abs() + 2**-9).all()
    else:
        same_bits(kc[mask], kc_u[mask])
    same_bits(vc[mask], vc_u[mask])


# --- the benchmark's dry run ----------------------------------------------------------------

def test_benchmark_dry_run(tmp_path, capsys):
    from ropelib.bench import compare
    bench = load_file("decode_cache_bench", ROOT / "benchmarks" / "decode_cache_bench.py")
    out = tmp_path / "decode.csv"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    rows = compare.read_csv(out)
    meta = compare.read_meta(out)
    assert meta["script"] == "benchmarks/decode_cache_bench.py" and "dry run" in meta["timing"]
    assert {r["provider"] for r in rows} == {"fused", "unfused", "two_kernels"}
    assert {r["cache"] for r in rows} == {"contiguous", "paged"}
    assert {r["cache_dtype"] for r in rows} == {"bfloat16", "float8_e4m3fn"}
    assert all(r["available"] is True and r["ms"] is None for r in rows)
    assert all(0 <= r["max_abs_err"] < 3e-2 for r in rows)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].split()[4] == "two_kernels"      # the table comes last
