"""Decode latency: RoPE fused with the KV-cache write against RoPE, then the write in PyTorch.

    python benchmarks/decode_cache_bench.py --out benchmarks/results/decode_cache.csv   # on a GPU
    TRITON_INTERPRET=1 python benchmarks/decode_cache_bench.py --dry-run               # CPU

One decoding step of one attention layer: q [B, 1, 32, 128], k and v [B, 1, 8, 128] in bf16
(bshd), each sequence at its own random position of a cache of 4096 positions, for batch 1, 8,
64 and 256. Two providers do the same work:

* fused: `ropelib.rope_kv_cache`, one launch: rotated q out, rotated k and v into the cache;
* unfused: `ropelib.apply_rope_qk(q, k, freqs, start_positions=cache_seqlens)`, then
  `ropelib.kv_cache.write_kv_cache` (index arithmetic and two index_put_ in PyTorch).

Each runs against a contiguous cache [B, 4096, 8, 128] and a paged one (blocks of 16 positions,
handed out in a shuffled order), in bf16 and in float8_e4m3fn (per-tensor scales), eagerly and
replayed from a CUDA graph (`torch.cuda.CUDAGraph`: the launch overhead gone, what remains is
the kernels' time). Before timing, the fused step's outputs are checked: q against an fp64
reference (one bf16 rounding), q and the cache slots against the unfused step (the same bits;
within one e4m3 step for fp8, where the unfused path rounds to bf16 first).

Timings are `triton.testing.do_bench` medians in ms (20 %/80 % quantiles alongside); GB/s counts
q, k, v read, q written, k and v written in the cache's dtype and one table row per sequence.
The CSV starts with `# key: value` lines (GPU, versions, date) that ropelib.bench.compare.read_meta
reads back. `--dry-run` runs tiny shapes through Triton's interpreter, eagerly, and checks the
outputs; it times nothing.
"""
import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's @triton.jit runs

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import ropelib  # noqa: E402
from ropelib import kv_cache, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.reference import rope_reference  # noqa: E402

FP8 = torch.float8_e4m3fn
BATCHES = (1, 8, 64, 256)


def make_case(B, HQ, HK, D, cache_len, page, paged, cache_dtype, device, seed=0):
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


PROVIDERS = {"fused": fused_step, "unfused": unfused_step}


def check(c) -> float:
    """Run both providers on fresh caches; raise if they disagree. Returns q's max abs error
    against the fp64 reference."""
    outs = {}
    for name, fn in PROVIDERS.items():
        cc = dict(c, k_cache=torch.zeros_like(c["k_cache"]),
                  v_cache=torch.zeros_like(c["v_cache"]))
        outs[name] = (fn(cc), cc["k_cache"], cc["v_cache"])
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


def bytes_moved(c) -> int:
    B, _, HQ, D = c["q"].shape
    HK = c["k"].shape[2]
    tokens = B * (2 * HQ + 2 * HK) * D * 2              # q, k, v read; q written (bf16)
    cached = B * 2 * HK * D * c["k_cache"].element_size()
    return tokens + cached + B * D * 4 + B * 4          # a table row and a position each


def time_step(fn, c, mode):
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


def run(dry_run: bool, batches=BATCHES, HQ=32, HK=8, D=128, cache_len=4096, page=16,
        dtypes=("bfloat16", "float8_e4m3fn")) -> list:
    device = runtime.default_device()
    if dry_run:
        batches, HQ, HK, D, cache_len, page = (1, 3), 4, 2, 16, 32, 4
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
                for mode in modes:
                    for name, fn in PROVIDERS.items():
                        row = dict(base, provider=name, mode=mode, max_abs_err=err,
                                   available=not reason, reason=reason, ms=None, p20=None,
                                   p80=None, gbps=None, speedup_vs_unfused=None)
                        rows.append(row)
                        if reason or dry_run:
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
        other = next((e for e in rows if e["provider"] == "unfused" and e["mode"] == r["mode"]
                      and e["case"] == r["case"] and e["cache"] == r["cache"]
                      and e["cache_dtype"] == r["cache_dtype"] and e.get("ms")), None)
        if r.get("ms") and other:
            r["speedup_vs_unfused"] = other["ms"] / r["ms"]
    return rows


def table(rows) -> str:
    head = (f"{'cache':<11} {'dtype':<14} {'mode':<6} {'B':>4} {'provider':<8} {'ms':>8} "
            f"{'GB/s':>7} {'vs unfused':>10}")
    out = [head, "-" * len(head)]
    for r in rows:
        lead = (f"{r['cache']:<11} {r['cache_dtype']:<14} {r['mode']:<6} {r['batch']:>4} "
                f"{r['provider']:<8}")
        if not r["available"]:
            out.append(f"{lead} unavailable: {r['reason']}")
            continue
        ms = f"{r['ms']:8.4f}" if r.get("ms") else f"{'-':>8}"
        gb = f"{r['gbps']:7.0f}" if r.get("gbps") else f"{'-':>7}"
        sp = f"{r['speedup_vs_unfused']:9.2f}x" if r.get("speedup_vs_unfused") else f"{'-':>10}"
        out.append(f"{lead} {ms} {gb} {sp}")
    return "\n".join(out)


def write(rows, path) -> str:
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/decode_cache_bench.py"
    meta["bytes_model"] = ("q, k, v read + q written (bf16); k, v written in the cache dtype; "
                           "one fp32 table row and one position per sequence")
    meta["timing"] = ("triton.testing.do_bench median ms (p20, p80); graph: CUDAGraph.replay"
                      if runtime.on_gpu() else "none (dry run: outputs checked only)")
    return compare.write_csv(rows, path, meta=meta)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check outputs, time nothing")
    ap.add_argument("--batch", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--cache-len", type=int, default=4096)
    ap.add_argument("--no-fp8", action="store_true", help="bf16 caches only")
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    print(runtime.mode())
    dtypes = ("bfloat16",) if args.no_fp8 else ("bfloat16", "float8_e4m3fn")
    rows = run(args.dry_run, batches=tuple(args.batch), cache_len=args.cache_len, dtypes=dtypes)
    if args.out is not None:
        print("wrote", write(rows, args.out))
    failed = sorted({f"{r['cache']}/{r['cache_dtype']}/b{r['batch']}: {r['reason']}"
                     for r in rows if not r["available"]})
    if failed:
        print("failed or differ:", *failed, sep="\n  ")
    print(table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
