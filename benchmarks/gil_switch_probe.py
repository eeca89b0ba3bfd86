"""Is the GIL handed between threads during a training step? (GPU)

model_host_probe's 8-layer model, timed with CPython's switch interval at its default (5 ms) and
at 0.1 ms: a thread waiting for the GIL asks its holder to drop it after one interval, so a step
that gets slower at the short interval is one where a thread waited for the GIL while another
held it. Variants: no RoPE; one or two trivial autograd.Functions a layer (they allocate their
output both ways, nothing else); ropelib's `apply_rope_qk`. Prints the Python threads before and
after, and the host µs per step of each variant at each interval (best of 7 rounds of 50 steps).

    python benchmarks/gil_switch_probe.py
"""
import os
import sys
import threading

import torch

try:
    import transformer_engine.pytorch  # noqa: F401  (as model_host_probe imports it)
except Exception:  # noqa: BLE001
    pass
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_host_probe as M  # noqa: E402

from ropelib.bench.suite import host_us_interleaved  # noqa: E402


def main():
    print("threads:", [t.name for t in threading.enumerate()])
    dev = "cuda"
    model, x, freqs, rotate_by = M.setup(8, dev, **M.DECODE)
    variants = {
        "no RoPE": rotate_by["no RoPE"],
        "trivial x2": lambda q, k: (M.trivial(q, freqs), M.trivial(k, freqs)),
        "trivial x1": lambda q, k: (M.trivial(q, freqs), k),
        "ropelib q+k": rotate_by["ropelib q+k"],
    }
    for interval in (0.005, 0.0001):
        sys.setswitchinterval(interval)
        fns = {name: (M.steps(model, x, rotate)["training"], 50)
               for name, rotate in variants.items()}
        res = host_us_interleaved(fns, 7, dev, warmup=10)
        print("switchinterval", interval, {k: round(v, 1) for k, v in res.items()})
    print("threads after:", [t.name for t in threading.enumerate()])


if __name__ == "__main__":
    main()
