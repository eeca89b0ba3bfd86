"""Host overhead per call at decode size: wall clock of many calls vs CUDA-graph replay."""
import time
import torch
import triton
import ropelib
from ropelib.api import _view4, plan
from ropelib.kernels.launch import Segment, launch

x = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
f = ropelib.rope_freqs(4096, 128, device="cuda")
y = torch.empty_like(x)
pl = plan(x, f)
seg = Segment.of(x, y)


def wall(fn, n=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def graph(fn, n=100):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / (20 * n) * 1e6


L = lambda: launch(seg, pl.table, pl.pos, S=pl.S, B=pl.B, R=pl.R, D=pl.D, interleaved=False,
                   backward=False, copy_pass=True)
print(f"copy_        wall {wall(lambda: y.copy_(x)):7.1f} us  graph {graph(lambda: y.copy_(x)):6.1f} us")
print(f"launch()     wall {wall(L):7.1f} us  graph {graph(L):6.1f} us")
print(f"apply_rope   wall {wall(lambda: ropelib.apply_rope(x, f)):7.1f} us")
