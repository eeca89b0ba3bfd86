"""The Python of ropelib's eager route, piece by piece, with its kernel launches removed.

    TRITON_INTERPRET=1 python benchmarks/eager_python_pieces.py     # a CPU is enough
    python benchmarks/eager_python_pieces.py                        # or on a GPU

At decode size (s=1, b=64, h=32, d=128, bf16, sbhd, one tensor) it times, in µs of host time a
call (best of --rounds rounds of --calls calls back to back), what a forward with grad and a
backward of `ropelib.apply_rope` spend outside the kernel: the public function whole, each step of
its cached route (`ropelib.eager`), `Rotate.backward` under no_grad (as autograd's engine runs
it), a forward+backward whole, and a trivial autograd.Function (an empty_like each way) as the
floor every Function pays.
The launches are replaced by nothing, so the numbers are ropelib's own Python and PyTorch calls;
`benchmarks/autograd_host_probe.py` times the launches and TE beside them on a GPU.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ropelib  # noqa: E402
from autograd_host_probe import function_with  # noqa: E402  (the floor: a trivial Function)
from ropelib import api, eager  # noqa: E402
from ropelib.course.probe_timers import launches_removed  # noqa: E402


def best_us(fn, calls: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def pieces(device: str) -> dict:
    """{piece: a call with no arguments} at decode size (the caller removes the launches)."""
    x = torch.randn(1, 64, 32, 128, device=device, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    freqs = ropelib.rope_freqs(4096, 128, device=device)
    g = torch.randn_like(x)
    reads, tables = api._kernel_reads(freqs, None, None, None, None, None, None)
    head = api._options_head("rope", "sbhd", False, 1, 0, False)
    sig = eager.signature(head, (xg, *tables, None, None, None))
    ropelib.apply_rope(xg, freqs)                                  # plans the signature
    planned = eager.SIGNATURES.get(sig)
    y = ropelib.apply_rope(xg, freqs)
    ctx = y.grad_fn
    rev = ctx.rotation.reverse((g,))
    saved = ctx.reads           # the tables Rotate kept for its backward
    trivial = function_with(None, "neither")      # empty_like each way, the table saved
    yt = trivial(xg, freqs)

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    return {
        "apply_rope, forward with grad (whole)": lambda: ropelib.apply_rope(xg, freqs),
        "  eager.active()": eager.active,
        "  the signature (eager.signature)": lambda: eager.signature(
            head, (xg, *tables, None, None, None)),
        "  its lookup (SIGNATURES.get)": lambda: eager.SIGNATURES.get(sig),
        "  the planned call (PlannedCall.__call__)": lambda: planned((xg,), reads),
        "    the autograd.Function (eager.rotate)": lambda: eager.rotate(
            planned.rotation, (freqs,), xg),
        "      its run (output + pointer pick)": lambda: planned.rotation.run((xg,), [freqs]),
        "      torch.empty_like(x, dtype, contiguous)": lambda: torch.empty_like(
            x, dtype=x.dtype, memory_format=torch.contiguous_format),
        "trivial Function, forward with grad": lambda: trivial(xg, freqs),
        "Rotate.backward under no_grad": no_grad(lambda: eager.Rotate.backward(ctx, g)),
        "  the reverse's lookup (PlannedRotation.reverse)": lambda: ctx.rotation.reverse((g,)),
        "  its run": lambda: rev.run((g,), saved),
        "trivial Function's backward under no_grad": no_grad(
            lambda: trivial.__self__.backward(yt.grad_fn, g)),     # trivial: the class's apply
        "autograd.grad of apply_rope's output (retain_graph)": lambda: torch.autograd.grad(
            y, [xg], [g], retain_graph=True),
        "autograd.grad of the trivial Function's output": lambda: torch.autograd.grad(
            yt, [xg], [g], retain_graph=True),
        "apply_rope, forward+backward (autograd.grad)": lambda: torch.autograd.grad(
            ropelib.apply_rope(xg, freqs), [xg], [g]),
        "trivial Function, forward+backward (autograd.grad)": lambda: torch.autograd.grad(
            trivial(xg, freqs), [xg], [g]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    device = ropelib.runtime.default_device()
    with launches_removed(replan=True):      # planned afresh, with the launches removed
        steps = pieces(device)
        where = (torch.cuda.get_device_name() if device == "cuda" else
                 f"CPU ({os.cpu_count()} cores), Triton interpreter")
        print(f"# {where}, torch {torch.__version__}; launches removed; best of {a.rounds} "
              f"rounds of {a.calls} calls, host us per call")
        for name, fn in steps.items():
            print(f"{name:58s} {best_us(fn, a.calls, a.rounds):6.2f}")


if __name__ == "__main__":
    main()
