"""Decode latency measured: RoPE fused with the KV-cache write against RoPE, then the write in
PyTorch, and against RoPE, then the write as one kernel.

One decoding step of one attention layer: q [B, 1, 32, 128], k and v [B, 1, 8, 128] in bf16
(bshd), each sequence at its own random position of a cache of 4096 positions, for batch 1, 8,
64 and 256 (`TINY`: the interpreter's stand-in dimensions). Three providers do the same work:

* fused: `ropelib.rope_kv_cache`, one launch: rotated q out, rotated k and v into the cache;
* unfused: `ropelib.apply_rope_qk(q, k, freqs, start_positions=cache_seqlens)`, then
  `ropelib.kv_cache.write_kv_cache` (index arithmetic and two index_put_ in PyTorch);
* two_kernels: the same `apply_rope_qk` launch, then `ropelib.bench.cache_write.write_kv_cache`,
  one Triton kernel writing k and v into the cache (as vLLM's `reshape_and_cache`): the
  unfused step of a serving stack that writes its cache with one kernel.

`PROVIDERS` holds the first two (the floor suite times them, notebook 11 counts their kernels);
`TIMED` all three.

Each runs against a contiguous cache [B, 4096, 8, 128] and a paged one (blocks of 16 positions,
handed out in a shuffled order), in bf16 and in float8_e4m3fn (per-tensor scales), eagerly and
replayed from a CUDA graph. `check` verifies the fused step's outputs before anything is timed:
q against an fp64 reference (one bf16 rounding), q and the cache slots against the unfused step
(the same bits; within one e4m3 step for fp8, where the unfused path rounds to bf16 first);
`check_two_kernels` the two-kernel step's against the unfused step's: the same bits, q and
every element of both caches (the same RoPE launch, then the same value divided and rounded
once). What fails a check is not timed: the fused and the unfused step after `check`, the
two-kernel step after `check_two_kernels`.
`time_step` times one step with `triton.testing.do_bench` (ms; median, 20 %/80 % quantiles),
eagerly or as the replay of a graph holding one step; GB/s counts q, k, v read, q written, k and
v written in the cache's dtype and one table row per sequence (the same bytes for every
provider). Each row's `speedup_vs_unfused` is the unfused step's time over its own, and
`speedup_vs_two_kernels` the two-kernel step's over its own (same case, cache and mode).
"""
import torch

import ropelib
from .. import kv_cache, runtime
from ..reference import rope_reference
from . import cache_write, compare

FP8 = torch.float8_e4m3fn
BATCHES = (1, 8, 64, 256)
DIMS = dict(HQ=32, HK=8, D=128, cache_len=4096, page=16)
# the interpreter's stand-ins (and its batches)
TINY = dict(batches=(1, 3), HQ=4, HK=2, D=16, cache_len=32, page=4)


def make_case(B, HQ, HK, D, cache_len, page, paged, cache_dtype, device, seed=0):
    """One decoding step's tensors: q, k, v, the caches (paged: block_table), cache_seqlens,
    the angle table and the fp8 scales (none for a bf16 cache)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, 1, HQ, D, generator=g).to(device=device, dtype=torch.bfloat16)
    k = torch.randn(B, 1, HK, D, generator=g).to(device=device, dtype=torch.bfloat16)
    v = torch.randn(B, 1, HK, D, generator=g).to(device=device, dtype=torch.bfloat16)
    seqlens = torch.randint(0, cache_len, (B,), generator=g).to(device=device,
                                                               dtype=torch.int32)
    if paged:
        per_seq = cache_len // page
        table = torch.randperm(B * per_seq, generator=g).view(B, per_seq)
        block_table = table.to(device=device, dtype=torch.int32)
        shape = (B * per_seq, page, HK, D)
    else:
        block_table, shape = None, (B, cache_len, HK, D)
    caches = [torch.zeros(shape, device=device, dtype=cache_dtype) for _ in range(2)]
    scales = {}
    if cache_dtype == FP8:
        scales = dict(k_scale=torch.tensor([0.02], device=device),
                      v_scale=torch.tensor([0.02], device=device))
    freqs = ropelib.rope_freqs(cache_len, D, device=device)
    return dict(q=q, k=k, v=v, k_cache=caches[0], v_cache=caches[1], cache_seqlens=seqlens,
                block_table=block_table, freqs=freqs, scales=scales)


def fused_step(c):
    return ropelib.rope_kv_cache(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"],
                                 c["cache_seqlens"], c["freqs"], block_table=c["block_table"],
                                 **c["scales"])


def unfused_step(c):
    q, k = ropelib.apply_rope_qk(c["q"], c["k"], c["freqs"], layout="bshd",
                                 start_positions=c["cache_seqlens"])
    kv_cache.write_kv_cache(k, c["v"], c["k_cache"], c["v_cache"], c["cache_seqlens"],
                            block_table=c["block_table"], **c["scales"])
    return q


def two_kernel_step(c):
    q, k = ropelib.apply_rope_qk(c["q"], c["k"], c["freqs"], layout="bshd",
                                 start_positions=c["cache_seqlens"])
    cache_write.write_kv_cache(k, c["v"], c["k_cache"], c["v_cache"], c["cache_seqlens"],
                               block_table=c["block_table"], **c["scales"])
    return q


PROVIDERS = {"fused": fused_step, "unfused": unfused_step}
TWO_KERNELS = "two_kernels"
TIMED = {**PROVIDERS, TWO_KERNELS: two_kernel_step}


def _on_fresh_caches(step, c):
    """(q, k_cache, v_cache) of one step run on zeroed copies of the case's caches."""
    cc = dict(c, k_cache=torch.zeros_like(c["k_cache"]), v_cache=torch.zeros_like(c["v_cache"]))
    return step(cc), cc["k_cache"], cc["v_cache"]


def check(c) -> float:
    """Run the fused and the unfused step on fresh caches; raise if they disagree. Returns q's
    max abs error against the fp64 reference."""
    outs = {name: _on_fresh_caches(fn, c) for name, fn in PROVIDERS.items()}
    (qf, kf, vf), (qu, ku, vu) = outs["fused"], outs["unfused"]
    # Two different kernels, each fp32 math rounded once: on a GPU the compiler may contract a
    # product and a sum into an FMA in one and not the other. That moves the fp32 result of
    # x_a c - x_b s by an fp32 rounding of its terms (a few 2^-24 |x|), which can change the
    # rounded output by one ulp, or by more where the terms cancel and the output is small (the
    # H200 showed both at batch 64 and 256). More than that is an error.
    def within_rounding(a, b, x, dtype=None):
        bound = compare.ulp(b.double(), dtype or b.dtype) + 2**-20 * float(x.abs().max())
        return bool(((a.double() - b.double()).abs() <= bound).all())
    if not within_rounding(qf, qu, c["q"]):
        raise AssertionError("fused q differs from the unfused q by more than one ulp and an "
                             "fp32 rounding")
    rows, slots = kv_cache.cache_slots(c["cache_seqlens"], 1, c["block_table"],
                                       c["k_cache"].shape[1])
    kf, ku, vf, vu = (t[rows, slots].float() for t in (kf, ku, vf, vu))
    if c["k_cache"].dtype == FP8:   # the unfused path rounds to bf16 before fp8
        ok = bool(((kf - ku).abs() <= 2**-3 * ku.abs() + 2**-9).all())
    else:
        ok = within_rounding(kf, ku, c["k"], c["k_cache"].dtype)
    if not ok or not torch.equal(vf, vu):
        raise AssertionError("the fused step wrote other cache values than the unfused one")
    f = c["freqs"][:, 0, 0].double()
    pos = c["cache_seqlens"].long()[:, None]
    want = rope_reference(c["q"].double(), cos=f.cos(), sin=f.sin(), layout="bshd",
                          position_ids=pos)
    err = float((qf.double() - want).abs().max())
    if err > 3e-2:      # one bf16 rounding of values of a few units
        raise AssertionError(f"q differs from the fp64 reference by {err:.3g}")
    return err


def check_two_kernels(c) -> None:
    """Run the two-kernel and the unfused step on fresh caches; raise unless q and both whole
    caches are the same bits."""
    two = _on_fresh_caches(two_kernel_step, c)
    unfused = _on_fresh_caches(unfused_step, c)
    for name, a, b in zip(("q", "k_cache", "v_cache"), two, unfused):
        if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
            raise AssertionError(f"the two-kernel step's {name} differs from the unfused step's")


def bytes_moved(c) -> int:
    B, _, HQ, D = c["q"].shape
    HK = c["k"].shape[2]
    tokens = B * (2 * HQ + 2 * HK) * D * 2              # q, k, v read; q written (bf16)
    cached = B * 2 * HK * D * c["k_cache"].element_size()
    return tokens + cached + B * D * 4 + B * 4          # a table row and a position each


def decode_case(batch: int, paged: bool, cache_dtype: torch.dtype, *, tiny: bool, device):
    """make_case at DIMS (or TINY's dimensions when `tiny`)."""
    dims = {n: (TINY if tiny else DIMS)[n] for n in ("HQ", "HK", "D", "cache_len", "page")}
    return make_case(batch, paged=paged, cache_dtype=cache_dtype, device=device, **dims)


def copy_of_the_same_bytes(c):
    """A callable copying as many bytes as a step reads (q, k and v, bf16), from one buffer into
    another in one launch: the floor of a decode step."""
    n = sum(c[name].numel() for name in ("q", "k", "v"))
    src = torch.randn(n, device=c["q"].device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def time_step(fn, c, mode):
    """(median, p20, p80) ms of one step, eagerly ("eager") or as the replay of a CUDA graph
    holding one step ("graph")."""
    import triton.testing
    if mode == "eager":
        return triton.testing.do_bench(lambda: fn(c), quantiles=[0.5, 0.2, 0.8])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):      # warm up (compile, allocate) outside the capture
        for _ in range(3):
            fn(c)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(c)
    return triton.testing.do_bench(graph.replay, quantiles=[0.5, 0.2, 0.8])


def fill_step(n: int, device="cuda"):
    """A step of n kernels that do no work worth timing, for `time_step`: each fills one 4-byte
    element (`zero_` on its own one-element tensor, so no two are merged). Replayed as a graph,
    it measures what the replay and its kernel launches cost before any kernel does work."""
    cells = [torch.empty(1, device=device) for _ in range(n)]

    def step(_case):
        for cell in cells:
            cell.zero_()
    return step


def run(dry_run: bool, batches=BATCHES, HQ=32, HK=8, D=128, cache_len=4096, page=16,
        dtypes=("bfloat16", "float8_e4m3fn")) -> list:
    """Every (cache dtype, contiguous/paged, batch, eager/graph, provider): timed on a GPU,
    tiny shapes checked only in a dry run."""
    device = runtime.default_device()
    if dry_run:
        batches, HQ, HK, D, cache_len, page = (TINY[n] for n in ("batches", "HQ", "HK", "D",
                                                                 "cache_len", "page"))
        modes = ("eager",)
    elif device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    else:
        modes = ("eager", "graph")
    timing = "triton.testing.do_bench" if not dry_run else "none (dry run)"
    rows = []
    for dname in dtypes:
        for paged in (False, True):
            for B in batches:
                c = make_case(B, HQ, HK, D, cache_len, page, paged, getattr(torch, dname),
                              device)
                base = dict(case=f"b{B}-h{HQ}/{HK}-d{D}-L{cache_len}", dtype="bfloat16",
                            cache="paged" if paged else "contiguous", cache_dtype=dname,
                            batch=B, heads=HQ, kv_heads=HK, head_dim=D, cache_len=cache_len,
                            page=page if paged else None, device=device, timing=timing)
                try:
                    err, reason = check(c), ""
                except Exception as exc:  # noqa: BLE001 -- recorded in the CSV, never hidden
                    err, reason = None, f"{type(exc).__name__}: {exc}"[:200]
                try:
                    check_two_kernels(c)
                    two_reason = ""
                except Exception as exc:  # noqa: BLE001 -- recorded in the CSV, never hidden
                    two_reason = f"{type(exc).__name__}: {exc}"[:200]
                for mode in modes:
                    for name, fn in TIMED.items():
                        why = two_reason if name == TWO_KERNELS else reason
                        row = dict(base, provider=name, mode=mode, max_abs_err=err,
                                   available=not why, reason=why, ms=None, p20=None,
                                   p80=None, gbps=None, speedup_vs_unfused=None,
                                   speedup_vs_two_kernels=None)
                        rows.append(row)
                        if why or dry_run:
                            continue
                        try:
                            ms, p20, p80 = time_step(fn, c, mode)
                        except Exception as exc:  # noqa: BLE001
                            row.update(available=False,
                                       reason=f"{type(exc).__name__}: {exc}"[:200])
                            continue
                        row.update(ms=ms, p20=p20, p80=p80, gbps=bytes_moved(c) / ms / 1e6)
                del c
    for r in rows:
        for provider, column in (("unfused", "speedup_vs_unfused"),
                                 (TWO_KERNELS, "speedup_vs_two_kernels")):
            other = next((e for e in rows if e["provider"] == provider
                          and e["mode"] == r["mode"] and e["case"] == r["case"]
                          and e["cache"] == r["cache"] and e["cache_dtype"] == r["cache_dtype"]
                          and e.get("ms")), None)
            if r.get("ms") and other:
                r[column] = other["ms"] / r["ms"]
    return rows


def table(rows) -> str:
    head = (f"{'cache':<11} {'dtype':<14} {'mode':<6} {'B':>4} {'provider':<11} {'ms':>8} "
            f"{'GB/s':>7} {'vs unfused':>10} {'vs two_kernels':>14}")
    out = [head, "-" * len(head)]
    for r in rows:
        lead = (f"{r['cache']:<11} {r['cache_dtype']:<14} {r['mode']:<6} {r['batch']:>4} "
                f"{r['provider']:<11}")
        if not r["available"]:
            out.append(f"{lead} unavailable: {r['reason']}")
            continue
        ms = f"{r['ms']:8.4f}" if r.get("ms") else f"{'-':>8}"
        gb = f"{r['gbps']:7.0f}" if r.get("gbps") else f"{'-':>7}"
        sp = f"{r['speedup_vs_unfused']:9.2f}x" if r.get("speedup_vs_unfused") else f"{'-':>10}"
        sp2 = (f"{r['speedup_vs_two_kernels']:13.2f}x" if r.get("speedup_vs_two_kernels")
               else f"{'-':>14}")
        out.append(f"{lead} {ms} {gb} {sp} {sp2}")
    return "\n".join(out)


def write(rows, path, script: str) -> str:
    """The rows as a CSV with the environment header (GPU, versions, date)."""
    meta = compare.environment_meta()
    meta["script"] = script
    meta["bytes_model"] = ("q, k, v read + q written (bf16); k, v written in the cache dtype; "
                           "one fp32 table row and one position per sequence")
    meta["timing"] = ("triton.testing.do_bench median ms (p20, p80); graph: CUDAGraph.replay"
                      if runtime.on_gpu() else "none (dry run: outputs checked only)")
    return compare.write_csv(rows, path, meta=meta)
