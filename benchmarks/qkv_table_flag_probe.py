"""qkv_rope_linear's forward from an angle table against the same from table-free angles: the
pre-pass's pairs flag as the GPU wrote it, each kernel's GPU time, and do_bench side by side.

From a table (`freqs=`) the pre-pass (`qkv_linear.cos_sin_rows`) writes every token's cos and
sine rows and sets a flag where some pair's two members have different angles; the TMA forward
branches on it (one cos and one sin tile a pair where none differ, each member's own rows in
turn where some do). From `angles=` both members share one angle by construction: no flag, and
the forward compiles only the first branch. Hugging Face's and TE's tables, like
`ropelib.rope_freqs`, repeat each frequency, so the flag must read 0 and the two calls should
take the same time. For Llama-3-8B's projection (hidden 4096, 32/8 heads of 128, bf16) at 8192
and 32768 tokens this prints:

    the flag the table's pre-pass wrote (0: every pair's members equal)
    each CUDA kernel's time per call under torch.profiler (20 calls), for both calls
    do_bench of both calls, side by side, `--pairs` times (default 5)

    python benchmarks/qkv_table_flag_probe.py [--pairs 5]     # a GPU with TMA (H100, H200)
"""
import argparse
import collections
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ropelib  # noqa: E402
from ropelib import qkv_linear  # noqa: E402
from ropelib.course.kernel_bandwidth import device_kernels  # noqa: E402

HIDDEN, HQ, HK, D = 4096, 32, 8, 128


def flag_of(call):
    """The pairs flag the pre-pass wrote during call() (None where there was none)."""
    seen = {}
    rows = qkv_linear.cos_sin_rows

    def spy(*args, **kwargs):
        seen["flag"] = args[6] if len(args) > 6 else kwargs.get("pairs_differ")
        return rows(*args, **kwargs)
    qkv_linear.cos_sin_rows = spy
    try:
        call()
        torch.cuda.synchronize()
    finally:
        qkv_linear.cos_sin_rows = rows
    flag = seen.get("flag")
    return None if flag is None else int(flag.item())


def kernel_times(call, calls: int = 20) -> dict:
    """{kernel name: µs per call} under torch.profiler."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    for name, us in device_kernels(prof.events(), skip=()):     # every GPU event, fills too
        per[name[:60]] += us / calls
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("qkv_table_flag_probe times a GPU")
    from ropelib.bench import compare
    print(f"GPU ({torch.cuda.get_device_name()}), torch {torch.__version__}, "
          f"triton {triton.__version__}, ropelib revision {compare.source_revision()}, "
          f"source {compare.source_sha()}")
    for tokens in (8192, 32768):
        x = torch.randn(1, tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        w = torch.randn((HQ + 2 * HK) * D, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
        angles = ropelib.rope_angles(D, base=500000.0, device="cuda")
        freqs = ropelib.rope_freqs(tokens, D, base=500000.0, device="cuda")
        calls = {
            "angles": lambda: ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK,
                                                      head_dim=D, angles=angles),
            "table": lambda: ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK,
                                                     head_dim=D, freqs=freqs)}
        for name, call in calls.items():
            print(f"{tokens} {name:6s} flag: {flag_of(call)}")
        for name, call in calls.items():
            for kernel, us in kernel_times(call).items():
                print(f"{tokens} {name:6s} {us:9.1f} us a call  {kernel}")
        for _ in range(a.pairs):
            ms = {name: triton.testing.do_bench(call) for name, call in calls.items()}
            print(f"{tokens} do_bench ms  angles {ms['angles']:.4f}  table {ms['table']:.4f}  "
                  f"table / angles {ms['table'] / ms['angles']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
