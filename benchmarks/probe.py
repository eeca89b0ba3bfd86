"""GPU probe for the performance work of issue 5: host cost per call, kernel variants, fwd+bwd.

    python benchmarks/probe.py [--quick]

Three parts, each printed as a table (and all of it to stdout, for benchmarks/results/):

1. Host cost at decode size (s=1, b=64, h=32, d=128, bf16): wall-clock microseconds per call of
   many back-to-back calls (host-bound at this size), and the same calls under CUDA-graph replay
   (GPU time only), for a device copy, ropelib (no grad, with start positions, Q+K) and TE fused.
2. Kernel variants on large tensors (forward, do_bench median, ratio to a copy in the same run):
   the default, equal-halves reading off, cos/sin tables instead of angles, and tile shapes
   around the heuristic's choice.
3. Forward+backward: do_bench time against the sum of the kernels the profiler saw in one
   iteration, to tell host-bound or extra-kernel slowness from kernel slowness.
"""
import argparse
import time

import torch
import triton
import triton.testing

import ropelib
from ropelib import api, compare
from ropelib.bench import graph_replay_ms
from ropelib.kernels import launch as L


def wall_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def graph_us(fn, n=100):
    """Microseconds per call under CUDA-graph replay (the bench suite's measurement)."""
    return graph_replay_ms(fn, n)[0] * 1e3


def bench_ms(fn, **kw):
    return triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8], **kw)


def host_costs():
    print("\n## 1. host cost per call at decode size (us)")
    cfg = compare.Config(seq_len=1, batch=64, heads=32, head_dim=128, dtype="bf16",
                         start_positions=True)
    case = compare.make_case(cfg, "cuda")
    x, f, sp = case.x, case.freqs, case.start
    k = torch.randn(1, 64, 8, 128, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    te = next(p for p in compare.providers() if p.name == "te_fused")
    rows = [
        ("copy_", lambda: y.copy_(x)),
        ("apply_rope", lambda: ropelib.apply_rope(x, f)),
        ("apply_rope +start", lambda: ropelib.apply_rope(x, f, start_positions=sp)),
        ("apply_rope_qk +start", lambda: ropelib.apply_rope_qk(x, k, f, start_positions=sp)),
    ]
    xg = x.clone().requires_grad_()
    rows.append(("apply_rope (x needs grad)", lambda: ropelib.apply_rope(xg, f)))
    if te.available:
        rows.append(("te_fused +start", lambda: te.fn(case)))
    print(f"{'call':28s} {'wall':>8s} {'graph':>8s}")
    out = {}
    with torch.no_grad():
        for name, fn in rows:
            if "grad" in name:
                continue
            out[name] = (wall_us(fn), graph_us(fn))
    for name, fn in rows:
        if "grad" in name:
            out[name] = (wall_us(fn), float("nan"))
    # forward + backward per call, wall clock (host-bound at this size)
    kg = k.clone().requires_grad_()
    dy, dk = torch.randn_like(x), torch.randn_like(k)

    def fb():
        xg.grad = None
        ropelib.apply_rope(xg, f).backward(dy)
    out["apply_rope fwd+bwd"] = (wall_us(fb, 1000), float("nan"))
    if te.available:
        import dataclasses
        gcase = dataclasses.replace(case, x=xg)

        def te_fb():
            xg.grad = None
            te.fn(gcase).backward(dy)
        out["te_fused fwd+bwd +start"] = (wall_us(te_fb, 1000), float("nan"))
    for name, (w, g) in out.items():
        print(f"{name:28s} {w:8.1f} {g:8.1f}")
    # decode tiles: the smallest tile an underfilled grid is split into
    with torch.no_grad():
        for mt in (512, 1024, 2048, 4096):
            L.MIN_TILE = mt
            L.pick_tiles.cache_clear()
            api.clear_cache()
            print(f"decode MIN_TILE={mt:5d}: graph {graph_us(lambda: ropelib.apply_rope(x, f, start_positions=sp)):6.2f} us")
    L.MIN_TILE = _MIN_TILE
    L.pick_tiles.cache_clear()
    api.clear_cache()
    # where the host time of a forward+backward goes
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        fb()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return out


def _copy_ms(x):
    y = torch.empty_like(x)
    return bench_ms(lambda: y.copy_(x))[0]


_MIN_TILE = L.MIN_TILE
KNOBS = ("TILE_LOOP", "TILE_NOLOOP", "TILE_FP32")
_DEFAULT = {k: getattr(L, k) for k in KNOBS}


def _set(halves=True, tile=None):
    """One (elements per thread, warps) for every regime (None: the defaults), the equal-halves
    switch; caches cleared."""
    for k in KNOBS:
        setattr(L, k, tile or _DEFAULT[k])
    api.SAME_HALVES = halves
    L.pick_tiles.cache_clear()
    api.clear_cache()


def variants(quick):
    print("\n## 2. kernel variants, forward (ratio = copy / variant, same run)")
    print(f"tile knobs (elements per thread, warps): defaults {_DEFAULT}")
    cases = [
        ("ref-1GiB-bf16-sbhd", compare.Config(16384, 8, 32, 128, "bf16", "sbhd")),
        ("256M-bf16-thd", compare.Config(4096, 8, 32, 128, "bf16", "thd")),
        ("256M-bf16-thd-il", compare.Config(4096, 8, 32, 128, "bf16", "thd", interleaved=True)),
        ("256M-bf16-bshd", compare.Config(4096, 8, 32, 128, "bf16", "bshd")),
        ("256M-fp32-sbhd", compare.Config(2048, 8, 32, 128, "fp32", "sbhd")),
        ("64M-bf16-sbhd", compare.Config(1024, 8, 32, 128, "bf16", "sbhd")),
    ]
    if quick:
        cases = cases[:2]
    vs = [("default", None, True, False), ("equal-halves off", None, False, False),
          ("cos/sin tables", None, True, True)]
    for ept in (8, 16, 32):
        for w in (2, 4, 8, 16):
            if ept * w in (32, 64, 128, 256):
                vs.append((f"ept={ept} warps={w}", (ept, w), True, False))
    vs32 = [v for v in vs[3:] if v[1] in ((8, 8), (16, 4), (32, 4), (16, 8), (16, 16), (8, 16))]
    results = []
    for name, cfg in cases:
        case = compare.make_case(cfg, "cuda")
        x, f = case.x, case.freqs
        kw = dict(layout=cfg.layout, interleaved=cfg.interleaved, cu_seqlens=case.cu_seqlens)
        cos, sin = f[:, 0, 0].cos(), f[:, 0, 0].sin()
        copy = _copy_ms(x)
        mine = vs[:3] + ([v for v in vs[3:]] if x.element_size() == 2 else vs32)
        for label, tile, halves, tables in mine:
            _set(halves, tile)
            if tables:
                fn = lambda: ropelib.apply_rope(x, cos=cos, sin=sin, **kw)
            else:
                fn = lambda: ropelib.apply_rope(x, f, **kw)
            with torch.no_grad():
                fn()
                tiles = [p.grid for c in api._CALLS.values() for p in c.fwd.values()]
                ms = bench_ms(fn)
            results.append((name, label, ms[0], copy / ms[0]))
            print(f"{name:20s} {label:24s} grid {str(tiles[:1]):22s} {ms[0]*1e3:9.1f} us  "
                  f"ratio {copy / ms[0]:.3f}", flush=True)
        _set()
        del case, x
        torch.cuda.empty_cache()
    return results


def fwdbwd():
    print("\n## 3. forward+backward: do_bench vs the kernels' own time")
    for cfg in (compare.Config(4096, 8, 32, 128, "bf16", "bshd"),
                compare.Config(4096, 8, 32, 128, "bf16", "sbhd", interleaved=True)):
        case = compare.make_case(cfg, "cuda")
        x = case.x.detach().clone().requires_grad_()
        dy = torch.randn_like(x)
        y2 = torch.empty_like(x)
        kw = dict(layout=cfg.layout, interleaved=cfg.interleaved)

        def step():
            ropelib.apply_rope(x, case.freqs, **kw).backward(dy)

        def copy2():
            y2.copy_(x.detach())
            y2.copy_(dy)
        c = bench_ms(copy2)[0]
        ms = bench_ms(step, grad_to_none=[x])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                x.grad = None
                step()
            torch.cuda.synchronize()
        kern = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                d = kern.setdefault(e.name[:60], [0, 0.0])
                d[0] += 1
                d[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        print(f"{cfg.layout} il={cfg.interleaved}: fwd+bwd {ms[0]*1e3:.1f} us (p20 {ms[1]*1e3:.1f}, "
              f"p80 {ms[2]*1e3:.1f}), two copies {c*1e3:.1f} us, ratio {c / ms[0]:.3f}")
        for name, (n, t) in sorted(kern.items(), key=lambda kv: -kv[1][1]):
            print(f"    {n:5d} x {t / n:9.1f} us  {name}")
        del case, x, dy, y2
        torch.cuda.empty_cache()


def qk_rule(choice_file=None):
    """Part 4: one BLOCK_H for q and k sized to the smaller (min) or larger (max) segment."""
    print("\n## 4. Q+K in one launch: BLOCK_H sized to the smaller or the larger segment")
    score = {"min": [], "max": []}
    for dt, layout in (("bf16", "sbhd"), ("bf16", "bshd"), ("bf16", "thd"), ("fp32", "sbhd")):
        elem = 2 if dt == "bf16" else 4
        seq = 320 * 2**20 // (8 * 40 * 128 * elem)
        cfg = compare.Config(seq, 8, 32, 128, dt, layout, kv_heads=8)
        case = compare.make_case(cfg, "cuda")
        kw = dict(layout=layout, cu_seqlens=case.cu_seqlens)
        yq, yk = torch.empty_like(case.x), torch.empty_like(case.k)

        def copy():
            yq.copy_(case.x)
            yk.copy_(case.k)
        c = bench_ms(copy)[0]
        for rule in ("min", "max"):
            L.SEGMENT_BLOCK_H = rule
            L.pick_tiles.cache_clear()
            api.clear_cache()
            with torch.no_grad():
                ms = bench_ms(lambda: ropelib.apply_rope_qk(case.x, case.k, case.freqs, **kw))[0]
            score[rule].append(c / ms)
            print(f"qk-{dt}-{layout}-kv8 BLOCK_H={rule}: {ms*1e3:8.1f} us  ratio {c / ms:.3f}",
                  flush=True)
        del case, yq, yk
        torch.cuda.empty_cache()
    best = max(score, key=lambda r: sum(score[r]))
    print(f"mean ratio: min {sum(score['min'])/4:.3f}, max {sum(score['max'])/4:.3f} -> {best}")
    L.SEGMENT_BLOCK_H = _SEGMENT
    L.pick_tiles.cache_clear()
    api.clear_cache()
    if choice_file:
        with open(choice_file, "w") as fh:
            fh.write(best)


_SEGMENT = L.SEGMENT_BLOCK_H


def fwdbwd_scatter():
    """Part 5: why do forward+backward ratios scatter between runs? Repeat run_case and watch
    the caching allocator (cudaMalloc calls, retries) and the garbage collector."""
    import gc
    print("\n## 5. forward+backward scatter: repeated run_case, allocator and GC")
    for cfg in (compare.Config(4096, 8, 32, 128, "bf16", "thd", interleaved=True),
                compare.Config(4096, 8, 32, 128, "bf16", "sbhd")):
        for trial in range(4):
            no_gc = trial >= 2
            if no_gc:
                gc.disable()
            before = torch.cuda.memory_stats()
            row = compare.run_case(cfg, ["ropelib"], device="cuda")[0]
            after = torch.cuda.memory_stats()
            gc.enable()
            mallocs = after.get("segment.all.allocated", 0) - before.get("segment.all.allocated", 0)
            retries = after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0)
            print(f"{cfg.layout} il={cfg.interleaved} trial {trial} gc={'off' if no_gc else 'on '}: "
                  f"fwd {row['ratio_fwd']:.3f} fwd+bwd {row['ratio_fwdbwd']:.3f} "
                  f"(p20 {row['fwdbwd_ms_p20']*1e3:.0f} us, p50 {row['fwdbwd_ms']*1e3:.0f}, "
                  f"p80 {row['fwdbwd_ms_p80']*1e3:.0f}) cudaMalloc segments +{mallocs} "
                  f"retries +{retries}", flush=True)
        # host time per forward+backward against GPU time, back to back without do_bench
        case = compare.make_case(cfg, "cuda")
        x = case.x.detach().clone().requires_grad_()
        dy = torch.randn_like(x)
        kw = dict(layout=cfg.layout, interleaved=cfg.interleaved, cu_seqlens=case.cu_seqlens)
        for _ in range(5):
            x.grad = None
            ropelib.apply_rope(x, case.freqs, **kw).backward(dy)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        host = []
        for _ in range(50):
            h = time.perf_counter()
            x.grad = None
            ropelib.apply_rope(x, case.freqs, **kw).backward(dy)
            host.append(time.perf_counter() - h)
        e1.record()
        torch.cuda.synchronize()
        host.sort()
        print(f"    50 back-to-back fwd+bwd: wall {(time.perf_counter() - t0) / 50 * 1e6:.0f} us/iter, "
              f"GPU {e0.elapsed_time(e1) / 50 * 1e3:.0f} us/iter, host p50 {host[25] * 1e6:.0f} us, "
              f"host max {host[-1] * 1e6:.0f} us")
        del case, x, dy
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="12345")
    ap.add_argument("--choice-file", default=None, help="part 4 writes the better rule here")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    if "1" in a.parts:
        host_costs()
    if "3" in a.parts:
        fwdbwd()
    if "2" in a.parts:
        variants(a.quick)
    if "4" in a.parts:
        qk_rule(a.choice_file)
    if "5" in a.parts:
        fwdbwd_scatter()


if __name__ == "__main__":
    main()
