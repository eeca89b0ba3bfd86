"""Where the host time of an eager forward+backward goes, by cProfile (decode size, bf16).

    python benchmarks/host_profile.py      # prints the top functions by own time
"""
import cProfile
import pstats

import torch

import ropelib


def main(calls: int = 300):
    x = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    f = ropelib.rope_freqs(4096, 128, device="cuda")
    g = torch.randn_like(x)

    def step():
        ropelib.apply_rope(x, f).backward(g)
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
