"""Where the host time of one compiled ropelib call goes (GPU): the code Inductor generates for
it, then a cProfile of 2000 calls, beside the same for an empty compiled graph (`q + 0`: one
of Inductor's own kernels). Decode size (s=1, b=64, h=32, d=128, bf16).

    TORCH_LOGS=output_code python benchmarks/compiled_launch_profile.py

With TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 Inductor launches ropelib's
kernel through its own static launcher, as it does its own kernels (benchmarks/NOTES.md).
"""
import cProfile
import pstats
import time

import torch

import ropelib


def main():
    q = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
    f = ropelib.rope_freqs(4096, 128, device="cuda")
    rope = torch.compile(lambda q, f: ropelib.apply_rope(q, f), fullgraph=True)
    empty = torch.compile(lambda q, f: q + 0, fullgraph=True)
    for _ in range(20):
        rope(q, f)
        empty(q, f)
    torch.cuda.synchronize()
    for name, fn in (("empty", empty), ("ropelib", rope)) * 2:    # taking turns, twice
        t0 = time.perf_counter()
        for _ in range(3000):
            fn(q, f)
        torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - t0) / 3000 * 1e6:.1f} us per call", flush=True)
    for name, fn in (("ropelib", rope), ("empty", empty)):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn(q, f)
        torch.cuda.synchronize()
        prof.disable()
        print(f"===== cProfile {name}, 2000 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
