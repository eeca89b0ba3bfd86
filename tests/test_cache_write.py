"""ropelib.bench.cache_write: the KV-cache write as one Triton kernel (the second kernel of the
two-kernel decode step that ropelib.bench.kv_cache_decode times).

* the same bits as ropelib.kv_cache.write_kv_cache (the write in PyTorch), every element of both
  caches: contiguous and paged caches, bf16, fp32 and float8_e4m3fn (values that saturate and
  values below e4m3's normal range), decode (S = 1) and S > 1, head counts and head dims that
  are no powers of two, DV != D, k and v as views of one projection;
* a token whose slot lies outside the cache is not written;
* the benchmark's own check passes on its tiny cases and fails for a write that is off by one
  element.
"""
import pytest
import torch

from ropelib import kv_cache, runtime
from ropelib.bench import cache_write, kv_cache_decode

FP8 = torch.float8_e4m3fn
DEVICE = runtime.default_device()


def bits(t):
    return t.view(torch.uint8)


def make(B, S, HK, D, DV, L, cache_dtype, paged, block=4, projection=False, seed=0):
    """New tokens (magnitudes from 2^-12 to 2^6, so that an fp8 cache sees subnormals and
    saturation), caches poisoned with random bytes, positions, block table and scales."""
    g = torch.Generator().manual_seed(seed)

    def values(*shape):
        magnitude = torch.exp2(torch.randint(-12, 7, shape, generator=g).float())
        return (torch.randn(*shape, generator=g) * magnitude).bfloat16()

    if projection:      # k and v as views of one [B, S, HK*(D + DV)] projection
        kv = values(B, S, HK * (D + DV)).to(DEVICE)
        k, v = kv[..., :HK * D].unflatten(-1, (HK, D)), kv[..., HK * D:].unflatten(-1, (HK, DV))
    else:
        k, v = values(B, S, HK, D), values(B, S, HK, DV)
    seqlens = torch.randint(0, L - S + 1, (B,), generator=g, dtype=torch.int32)
    if paged:
        per_seq = L // block
        block_table = torch.randperm(B * per_seq, generator=g).view(B, per_seq).int()
        lead = (B * per_seq, block)
    else:
        block_table, lead = None, (B, L)
    caches = []     # random bytes (NaN patterns among them: the caches are compared as bits)
    for dim in (D, DV):
        n_bytes = torch.Size((*lead, HK, dim)).numel() * cache_dtype.itemsize
        poison = torch.randint(0, 256, (n_bytes,), generator=g, dtype=torch.uint8)
        caches.append(poison.view(cache_dtype).view(*lead, HK, dim))
    scales = {}
    if cache_dtype == FP8:
        scales = dict(k_scale=torch.tensor([0.05]), v_scale=torch.tensor([0.01]))
    to = lambda t: t.to(DEVICE) if t is not None else None     # noqa: E731
    return (to(k), to(v), *(to(c) for c in caches), to(seqlens), to(block_table),
            {n: to(t) for n, t in scales.items()})


SHAPES = {"decode": dict(B=3, S=1, HK=2, D=16, DV=16, L=16),
          "chunk, odd heads and dims": dict(B=2, S=3, HK=3, D=12, DV=20, L=16),
          "one projection": dict(B=2, S=1, HK=5, D=8, DV=8, L=8, projection=True)}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32, FP8], ids=str)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_same_bits_as_the_pytorch_write(shape, cache_dtype, paged):
    k, v, kc, vc, seqlens, block_table, scales = make(**SHAPES[shape], cache_dtype=cache_dtype,
                                                      paged=paged)
    want = (kc.clone(), vc.clone())
    kv_cache.write_kv_cache(k, v, *want, seqlens, block_table=block_table, **scales)
    got = (kc.clone(), vc.clone())
    cache_write.write_kv_cache(k, v, *got, seqlens, block_table=block_table, **scales)
    for name, g, w, before in zip(("k_cache", "v_cache"), got, want, (kc, vc)):
        assert not torch.equal(bits(w), bits(before)), name      # the write changed something
        assert torch.equal(bits(g), bits(w)), name
    if cache_dtype == FP8:      # the inputs reach both ends of e4m3's range
        stored = want[0].float().abs()
        assert (stored == 448).any() and ((stored > 0) & (stored < 2**-6)).any()


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_a_slot_outside_the_cache_is_not_written(paged):
    k, v, kc, vc, seqlens, block_table, scales = make(B=3, S=1, HK=2, D=16, DV=16, L=16,
                                                      cache_dtype=torch.bfloat16, paged=paged)
    seqlens[0] = 16                          # sequence 0: past the cache's last position
    if paged:
        block_table[2] = kc.shape[0]         # sequence 2: blocks past the pool
    want = (kc.clone(), vc.clone())
    if paged:       # sequence 1 alone is written
        kv_cache.write_kv_cache(k[1:2], v[1:2], *want, seqlens[1:2], block_table=block_table[1:2])
    else:           # sequences 1 and 2: rows 1 and 2 of the cache
        kv_cache.write_kv_cache(k[1:], v[1:], want[0][1:], want[1][1:], seqlens[1:])
    got = (kc.clone(), vc.clone())
    cache_write.write_kv_cache(k, v, *got, seqlens, block_table=block_table, **scales)
    for g, w in zip(got, want):
        assert torch.equal(bits(g), bits(w))


def test_refuses_what_it_cannot_write():
    k, v, kc, vc, seqlens, _, _ = make(B=2, S=1, HK=2, D=16, DV=16, L=8,
                                       cache_dtype=FP8, paged=False)
    with pytest.raises(ValueError, match="k_scale"):
        cache_write.write_kv_cache(k, v, kc, vc, seqlens)
    with pytest.raises(ValueError, match="stride 1"):
        cache_write.write_kv_cache(k.transpose(2, 3).contiguous().transpose(2, 3), v, kc, vc,
                                   seqlens, k_scale=torch.ones(1, device=DEVICE),
                                   v_scale=torch.ones(1, device=DEVICE))


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8], ids=str)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_benchmark_check_of_the_two_kernel_step(paged, cache_dtype, monkeypatch):
    c = kv_cache_decode.decode_case(3, paged, cache_dtype, tiny=True, device=DEVICE)
    kv_cache_decode.check_two_kernels(c)
    real = cache_write.write_kv_cache

    def off_by_one_element(k, v, k_cache, v_cache, *args, **kwargs):
        real(k, v, k_cache, v_cache, *args, **kwargs)
        bits(v_cache).view(-1)[0] ^= 1

    monkeypatch.setattr(cache_write, "write_kv_cache", off_by_one_element)
    with pytest.raises(AssertionError, match="v_cache"):
        kv_cache_decode.check_two_kernels(c)
