"""Batch 1: where do the microseconds between the flat pass's kernel time and its timed call go?

Under Nsight Compute (benchmarks/b1_gap_ncu.py, base clock) the flat pass at s16384 b1 h32 d128
bf16 takes less time than torch.compile's kernel of Hugging Face's formula, yet the floor's
do_bench rows put the eager call behind it. This probe times each provider three ways in
alternating rounds in one process, beside the device copy of the same bytes:

    call     triton.testing.do_bench's median (L2 flushed before each call): what the floor times
    kernel   the kernels' own device time per call, from torch.profiler (CUDA activity, 20 calls)
    replay   20 calls captured in one CUDA graph, replayed: ms per call

for ropelib's eager call (its cos/sin rows kept by an earlier call, as every layer after the
first reads them) launched as shipped (programmatic dependent launch where the GPU has it: the
kernel may start before the one before it ends and waits for it) and with that early launch
off; for ropelib's call on a table made under inference_mode (whose rows are never kept); and
torch.compile's kernel reading bf16 tables made before the timing. A captured call keeps no
rows: "replay" times what a call whose rows cannot be kept runs.

    python benchmarks/b1_launch_probe.py [--out DIR] [--rounds 5]   # GPU; b1_launch_probe-<gpu>.csv
"""
import argparse
import csv
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

import ropelib  # noqa: E402
from ropelib import eager  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.bench.compare import hf_rotate  # noqa: E402
from ropelib.kernels import tiles  # noqa: E402

CASES = [("sbhd 128 MiB s16k b1", "sbhd", 16384, 1, 32, 128),
         ("bshd 128 MiB s16k b1", "bshd", 16384, 1, 32, 128),
         ("sbhd 1 GiB s16k b8", "sbhd", 16384, 8, 32, 128)]
CALLS = 20


def early(on: bool) -> None:
    """Plans with (as shipped) or without the flat pass's early launch; kept rows forgotten."""
    tiles.EARLY_LAUNCH = on
    eager.TABLE_ROWS.clear()
    eager.SIGNATURES.clear()


def kernel_ms(fn) -> float:
    """Device time of the kernels fn launches, per call (torch.profiler's CUDA activity)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    us = sum(e.device_time_total for e in prof.key_averages()
             if e.device_time_total > 0 and e.key and not e.key.startswith("cudaDevice"))
    return us / CALLS / 1e3


def replay_ms(fn) -> float:
    """ms per call of CALLS calls captured in one CUDA graph, replayed (median of 20)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / CALLS)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"b1_launch_probe-{compare.gpu_slug()}.csv")
    f = open(path, "w", newline="")
    f.write(f"# gpu: {torch.cuda.get_device_name()}\n# torch: {torch.__version__}\n"
            f"# triton: {triton.__version__}\n"
            f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n"
            f"# rounds: {args.rounds}, providers alternating in each; ms the median over rounds\n"
            "# call: do_bench median (L2 flushed); kernel: torch.profiler device time per call; "
            f"replay: {CALLS} calls in one CUDA graph, per call\n"
            "# ratio: copy's call ms / provider's ms of the same column\n")
    w = csv.writer(f)
    w.writerow(["case", "provider", "how", "ms", "ratio_to_copy", "ms_per_round"])
    print(f"{'case':22s} {'provider':18s} {'call':>8s} {'kernel':>8s} {'replay':>8s}", flush=True)
    try:
        for name, layout, S, B, H, D in CASES:
            shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            y = torch.empty_like(x)
            freqs = ropelib.rope_freqs(S, D, device="cuda")
            cos, sin = ropelib.rope_cos_sin(S, D, device="cuda", dtype=torch.bfloat16)
            tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
            c16, s16 = cos.view(tshape), sin.view(tshape)
            comp = torch.compile(lambda t: hf_rotate(t, c16, s16, False).to(t.dtype))
            comp(x)

            with torch.inference_mode():
                frozen = ropelib.rope_freqs(S, D, device="cuda")

            def rope():
                return ropelib.apply_rope(x, freqs, layout=layout)

            providers = {"copy": (True, lambda: y.copy_(x)), "ropelib": (True, rope),
                         "ropelib, not early": (False, rope),
                         "ropelib, inference table": (
                             True, lambda: ropelib.apply_rope(x, frozen, layout=layout)),
                         "torch.compile": (True, lambda: comp(x))}
            times = {(p, how): [] for p in providers for how in ("call", "kernel", "replay")}
            for _ in range(args.rounds):
                for p, (on, fn) in providers.items():
                    early(on)
                    fn()                       # rows written (and kept) before the timing
                    times[(p, "call")].append(triton.testing.do_bench(fn, warmup=25, rep=100))
                    times[(p, "kernel")].append(kernel_ms(fn))
                    times[(p, "replay")].append(replay_ms(fn))
            copy = statistics.median(times[("copy", "call")])
            for (p, how), t in times.items():
                med = statistics.median(t)
                w.writerow([name, p, how, f"{med:.5f}", f"{copy / med:.4f}",
                            " ".join(f"{v:.5f}" for v in t)])
            for p in providers:
                print(f"{name:22s} {p:18s} " + " ".join(
                    f"{statistics.median(times[(p, how)]) * 1e3:8.1f}"
                    for how in ("call", "kernel", "replay")) + "  us", flush=True)
            f.flush()
            del x, y, comp
            torch.cuda.empty_cache()
    finally:
        early(True)
        f.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
