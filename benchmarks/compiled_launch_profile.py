"""Where the host time of one compiled ropelib call goes (GPU): the code Inductor generates for
it, then a cProfile of 2000 calls, beside the same for an empty compiled graph (`q + 0`: one
of Inductor's own kernels), two ropelib calls in one graph, and a user-defined Triton copy of
24 runtime arguments (compiled_launch_cost.py's). Decode size (s=1, b=64, h=32, d=128, bf16).

    TORCH_LOGS=output_code python benchmarks/compiled_launch_profile.py

With TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 Inductor launches ropelib's
kernel through its own static launcher, as it does its own kernels (benchmarks/NOTES.md).
"""
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ropelib  # noqa: E402
from compiled_launch_cost import _copy_ops  # noqa: E402


def main():
    q = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
    f = ropelib.rope_freqs(4096, 128, device="cuda")
    _, copy24 = _copy_ops()
    graphs = {
        "empty": torch.compile(lambda q, f: q + 0, fullgraph=True),
        "ropelib": torch.compile(lambda q, f: ropelib.apply_rope(q, f), fullgraph=True),
        "two ropelib": torch.compile(lambda q, f: ropelib.apply_rope(ropelib.apply_rope(q, f), f),
                                     fullgraph=True),
        "copy, 24 arguments": torch.compile(lambda q, f: copy24(q), fullgraph=True),
    }
    for _ in range(20):
        for fn in graphs.values():
            fn(q, f)
    torch.cuda.synchronize()
    for _ in range(2):                                              # taking turns, twice
        for name, fn in graphs.items():
            t0 = time.perf_counter()
            for _ in range(3000):
                fn(q, f)
            torch.cuda.synchronize()
            print(f"{name}: {(time.perf_counter() - t0) / 3000 * 1e6:.1f} us per call", flush=True)
    for name, fn in graphs.items():
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn(q, f)
        torch.cuda.synchronize()
        prof.disable()
        print(f"===== cProfile {name}, 2000 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)

if __name__ == "__main__":
    main()
