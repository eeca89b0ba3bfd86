"""What the QKV projection's forward and forward+backward cost the host, beside the unfused
pipeline's (GPU; `--dry-run` on the CPU runs the same calls, tiny).

`qkv_backward_profile.py` found the fused forward+backward's device busy for less of its step
than the unfused pipeline's: the device waits for the host. This times each call's host side
(GPU): after a synchronisation, `--calls` calls are issued back to back (few enough that the
launch queue never fills, so no call waits for the device) and the host's wall-clock time over
them is divided by the calls; best of `--rounds` rounds. Cases: the fused forward under
`no_grad` and with gradients, the fused forward+backward (`torch.autograd.backward` with
given output gradients), each through the eager route (what a plain call takes) and through
the operator (`torch.ops.ropelib.qkv_rope_linear` and its registered autograd formula, what
torch.compile sees; forced here by telling qkv_linear that a tracer is at work), and the same
three of the unfused pipeline (F.linear, then `apply_rope_qk` on q and k). Then `cProfile` of
the fused forward's host side: the functions with the most time of their own.

    python benchmarks/qkv_host_probe.py [--tokens 8192] [--calls 20] [--rounds 7]   # GPU
    TRITON_INTERPRET=1 python benchmarks/qkv_host_probe.py --dry-run                # CPU
"""
import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qkv_rope_bench as bench  # noqa: E402  (it puts the checkout on sys.path)

import ropelib  # noqa: E402
from ropelib import qkv_linear, runtime  # noqa: E402


@contextlib.contextmanager
def operator_route():
    """qkv_rope_linear through its operator, as under a tracer: qkv_linear sees no plain eager
    call (its forward and backward both ask `eager.active()`)."""
    real = qkv_linear.eager

    class NotEager:                 # all qkv_linear asks of ropelib.eager at call time
        active = staticmethod(lambda: False)
    qkv_linear.eager = NotEager
    try:
        yield
    finally:
        qkv_linear.eager = real


def through_operator(fn):
    def call():
        with operator_route():
            fn()
    return call


def sync(device) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def host_us(fn, device, calls: int, rounds: int) -> float:
    """Best over rounds of the host's µs a call, `calls` calls issued after a synchronisation."""
    best = float("inf")
    for _ in range(rounds):
        sync(device)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
        sync(device)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args(argv)
    device = runtime.default_device()
    if not a.dry_run and device != "cuda":
        raise SystemExit("timing the host beside a GPU needs one; use --dry-run on the CPU")
    tokens, hidden, HQ, HK, D = (16, 32, 2, 1, 16) if a.dry_run else (a.tokens, 4096, 32, 8, 128)
    calls, rounds = (2, 1) if a.dry_run else (a.calls, a.rounds)
    angles = ropelib.rope_angles(D, base=500000.0, device=device)
    freqs = ropelib.rope_freqs(tokens, D, base=500000.0, device=device)
    (x, w, _, _), grads = bench.inputs(tokens, hidden, HQ, HK, D, device)
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

    def fused(x, w):
        return ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                       angles=angles)

    def unfused(x, w):
        q, k, v = bench.split_heads(F.linear(x, w), HQ, HK, D)
        return ropelib.apply_rope_qk(q, k, freqs, layout="bshd") + (v,)

    cases = {}
    for name, fn in (("fused", fused), ("unfused", unfused)):
        def forward_no_grad(fn=fn):
            with torch.no_grad():
                fn(x, w)
        cases[f"{name} forward, no_grad"] = forward_no_grad
        cases[f"{name} forward, with gradients"] = lambda fn=fn: fn(xg, wg)
        cases[f"{name} forward+backward"] = lambda fn=fn: torch.autograd.backward(
            fn(xg, wg), grads)
    for name in [n for n in cases if n.startswith("fused")]:
        cases[name.replace("fused", "fused (operator)")] = through_operator(cases[name])
    for fn in cases.values():       # compile, plan, warm up
        fn()
        fn()
    sync(device)
    where = "CPU, Triton interpreter" if a.dry_run else torch.cuda.get_device_name()
    print(f"{where}, {tokens} tokens: host µs a call, best of {rounds} rounds of {calls} calls")
    for name, fn in cases.items():
        print(f"  {name:45s} {host_us(fn, device, calls, rounds):9.1f}")
    prof = cProfile.Profile()
    sync(device)
    with torch.no_grad():
        prof.enable()
        for _ in range(calls):
            fused(x, w)
        prof.disable()
    sync(device)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    print(f"\ncProfile of {calls} fused forwards (no_grad), by own time:")
    print("\n".join(out.getvalue().splitlines()[4:30]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
