"""Why `do_bench` times an eager forward+backward longer than the host takes to issue it (GPU).

Notebook 07 (7.3) times one eager forward+backward (S=2048, B=1, H=64, D=128, bf16, sbhd;
gradients through torch.autograd.grad) three ways. On an H200 ropelib's `do_bench` median came
out above its enqueue time (the host's time per call, 50 calls back to back, no synchronisation)
by far more than the device's replayed time, while TE's lay close to its enqueue time. Where does
the difference go? This probe times one call inside loops built like do_bench's, piece by piece,
for each provider, in the same rounds:

* `enqueue`: 50 calls back to back, clock stopped before synchronising (notebook 07's enqueue);
* `do_bench`: triton.testing.do_bench's median;
* `loop memset`: do_bench's loop written out (zero a 256 MiB buffer, record an event, call,
  record an event), with the host's clock read around the call: `host` is the host's time per
  call inside that loop, `events` the device's time between the two events;
* `loop no memset`: the same without the memset;
* `loop memset, synced`: the memset, then a synchronisation, then the events and the call: the
  device is idle when the call starts;
* `loop memset, one thread` and `enqueue, one thread`: with autograd's device thread off
  (torch.autograd.set_multithreading_enabled(False): the backward runs on the calling thread).

Then the last of six iterations of the memset loop under torch.profiler: the host's spans of the call's
forward and backward and the device's kernels, as offsets in µs from the memset's launch, and
`torch.cuda.set_sync_debug_mode("warn")` over one call (does the call wait for the device?).

    python benchmarks/dobench_gap_probe.py [--rounds 5] [--iters 100]
"""
import argparse
import random
import statistics
import time
import warnings

try:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
except Exception:  # noqa: BLE001
    pass

import torch

from ropelib.bench import compare, suite


def enqueue_us(step, calls=50) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    took = time.perf_counter() - start
    torch.cuda.synchronize()
    return took / calls * 1e6


def loop_us(step, flush, iters, *, memset=True, synced=False) -> tuple:
    """(median host µs of the call, median µs between the events) over `iters` iterations of a
    do_bench-like loop."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    host = []
    torch.cuda.synchronize()
    for i in range(iters):
        if memset:
            flush.zero_()
        if synced:
            torch.cuda.synchronize()
        starts[i].record()
        t0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - t0) * 1e6)
        ends[i].record()
    torch.cuda.synchronize()
    events = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return statistics.median(host), statistics.median(events)


def one_thread(fn):
    def run(*a, **k):
        torch.autograd.set_multithreading_enabled(False)
        try:
            return fn(*a, **k)
        finally:
            torch.autograd.set_multithreading_enabled(True)
    return run


def timeline(step, flush, iterations=6) -> list:
    """The last of `iterations` memset-loop iterations under torch.profiler (the first ones
    carry the profiler's own start-up on each thread): [(side, name, start µs, length µs)], the
    offsets from that iteration's memset, host side."""
    from torch.profiler import ProfilerActivity, profile, record_function
    for _ in range(3):
        flush.zero_()
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iterations):
            with record_function(f"iteration {i}: memset"):
                flush.zero_()
            with record_function(f"iteration {i}: call"):
                step()
        torch.cuda.synchronize()
    last = f"iteration {iterations - 1}:"
    events = list(prof.events())
    t0 = min(e.time_range.start for e in events if e.name == last + " memset")
    events = [e for e in events if e.time_range.start >= t0 or e.name.startswith(last)]
    out = []
    for e in events:
        on_device = e.device_type == torch.autograd.DeviceType.CUDA
        top = e.name.startswith("iteration") or e.name in (
            "autograd::engine::evaluate_function: RotateBackward", "cudaLaunchKernel",
            "cuLaunchKernel", "cuLaunchKernelEx", "cudaStreamSynchronize", "cudaMemsetAsync",
            "cudaDeviceSynchronize", "aten::empty_like", "aten::empty")
        if on_device or top or "evaluate_function" in e.name or "Backward" in e.name:
            out.append(("device" if on_device else "host", e.name[:60],
                        e.time_range.start - t0, e.time_range.end - e.time_range.start))
    return sorted(out, key=lambda r: r[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()
    device = "cuda"
    provs = {p.name: p for p in compare.providers() if p.name in ("ropelib", "te_fused")
             and p.available}
    case = compare.make_case(compare.Config(seq_len=2048, batch=1, heads=64, head_dim=128,
                                            dtype="bf16"), device, seed=1)
    steps = {}
    for name, p in provs.items():
        gcase, leaves, grads = compare.fwdbwd_inputs(case, fill=0.5)
        steps[name] = compare.fwdbwd_step(lambda p=p, g=gcase: p.fn(g), leaves, grads)
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device=device)   # 256 MiB, as do_bench
    for s in steps.values():
        for _ in range(5):
            s()
    torch.cuda.synchronize()
    import triton.testing
    measures = {
        "enqueue": lambda s: (enqueue_us(s), float("nan")),
        "do_bench": lambda s: (float("nan"), triton.testing.do_bench(s) * 1e3),
        "loop memset": lambda s: loop_us(s, flush, args.iters),
        "loop no memset": lambda s: loop_us(s, flush, args.iters, memset=False),
        "loop memset, synced": lambda s: loop_us(s, flush, args.iters, synced=True),
        "loop memset, one thread": one_thread(lambda s: loop_us(s, flush, args.iters)),
        "enqueue, one thread": one_thread(lambda s: (enqueue_us(s), float("nan"))),
    }
    got = {}
    rng = random.Random(0)
    for r in range(args.rounds):
        order = [(m, n) for m in measures for n in steps]
        rng.shuffle(order)
        for m, n in order:
            got.setdefault((m, n), []).append(measures[m](steps[n]))
    flush_ms = triton.testing.do_bench(flush.zero_)
    replay = {n: suite.graph_replay_ms(s, 20, device)[0] * 1e3 for n, s in steps.items()}
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{args.rounds} rounds in a new order each (seed 0), {args.iters} iterations a loop; "
          f"memset of 256 MiB {flush_ms * 1e3:.1f} us (do_bench); medians of the rounds' medians")
    print(f"{'measure':26s} {'provider':9s} {'host us':>8s} {'events us':>10s}")
    for m in measures:
        for n in steps:
            vals = got[m, n]
            host = statistics.median(v[0] for v in vals)
            ev = statistics.median(v[1] for v in vals)
            print(f"{m:26s} {n:9s} {host:8.1f} {ev:10.1f}")
    for n in steps:
        print(f"{'replayed (CUDA graph)':26s} {n:9s} {'':8s} {replay[n]:10.1f}")
    for n, s in steps.items():
        print(f"\n== one memset-loop iteration under torch.profiler: {n} (offsets from the "
              "memset's host-side start, us)")
        for side, name, start, length in timeline(s, flush):
            print(f"  {side:6s} {start:9.1f} {length:8.1f}  {name}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                s()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message).splitlines()[0] for w in caught
                 if "prototype feature" not in str(w.message)]
        print(f"  synchronising operations in one call (torch.cuda.set_sync_debug_mode): "
              f"{len(syncs)}" + "".join(f"\n    {m}" for m in syncs[:5]))


if __name__ == "__main__":
    main()
