"""Where an eager forward+backward's host time goes, beside Transformer Engine's fused RoPE (GPU).

At decode size (s=1, b=64, h=32, d=128, bf16, sbhd) an eager forward costs ropelib's host about
what TE's costs, but a forward+backward more. This probe takes the difference apart, every
variant timed in the same rounds (best of the rounds, calls back to back; `suite.host_us_interleaved`):

* ropelib and TE, a forward with grad (what a forward+backward's forward pays) and a
  forward+backward (gradients taken with torch.autograd.grad, as the floor suite does); and
  q (32 heads) with k (8 heads), as an attention layer rotates them: TE's two calls against
  ropelib's `apply_rope_qk`;
* a trivial autograd.Function (empty_like both ways) with one piece of work added in its forward
  or its backward: one of ropelib's planned Triton launches, an ATen kernel (neg), or a release
  of the GIL (time.sleep(0)): is it the launch, any kernel, or handing the GIL over that costs;
* ropelib with its launches removed (its own Python only);
* all of it again with autograd's device thread off (set_multithreading_enabled(False): the
  backward runs on the calling thread), which takes the thread hand-over out.

    python benchmarks/autograd_host_probe.py [--rounds 7] [--calls 200]
"""
import argparse
import time

import torch

try:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb as te_rope
except Exception:  # noqa: BLE001
    te_rope = None

import ropelib
from ropelib.bench.compare import fwdbwd_step
from ropelib.bench.suite import host_us_interleaved
from ropelib.course.probe_timers import launches_removed
from ropelib.kernels import launch as L


def function_with(work, where: str):
    """A trivial autograd.Function (empty_like both ways, the table saved) that also runs
    work(tensor) in its 'forward', its 'backward', or 'neither'."""
    class With(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, table):
            ctx.save_for_backward(table)
            if where == "forward":
                work(x)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, grad):
            ctx.saved_tensors
            if where == "backward":
                work(grad)
            return torch.empty_like(grad), None
    return With.apply


def variants(x, xg, freqs, g):
    """{name: step} of every variant (the launch-removed one is timed apart: it patches ropelib)."""
    y = torch.empty_like(x)
    launch, pointers = L.plan(L.View.of(x), L.View.of(y), L.Table(freqs[:, 0, 0], None),
                              L.Positions(), R=x.shape[-1], interleaved=False, backward=False,
                              layout="sbhd")
    work = {
        "a planned Triton launch": lambda t: launch.launcher(launch, pointers),
        "an ATen kernel (neg)": torch.neg,
        "a GIL release (sleep(0))": lambda t: time.sleep(0),
    }
    steps = {}
    if te_rope is not None:
        steps["TE fused: forward with grad"] = lambda: te_rope(xg, freqs, fused=True)
        steps["TE fused: forward+backward"] = fwdbwd_step(
            lambda: te_rope(xg, freqs, fused=True), [xg], [g])
    # what an attention layer pays: q (32 heads) and k (8): TE rotates each with a call of its
    # own, ropelib both in one
    kg = xg.detach()[:, :, :8].clone().requires_grad_(True)
    gk = g[:, :, :8].clone()
    if te_rope is not None:
        steps["TE fused: q and k forward+backward (two calls)"] = fwdbwd_step(
            lambda: (te_rope(xg, freqs, fused=True), te_rope(kg, freqs, fused=True)),
            [xg, kg], [g, gk])
    steps["ropelib: apply_rope_qk forward+backward"] = fwdbwd_step(
        lambda: ropelib.apply_rope_qk(xg, kg, freqs), [xg, kg], [g, gk])
    steps["ropelib: forward with grad"] = lambda: ropelib.apply_rope(xg, freqs)
    steps["ropelib: forward+backward"] = fwdbwd_step(
        lambda: ropelib.apply_rope(xg, freqs), [xg], [g])
    trivial = function_with(None, "neither")
    steps["trivial Function: forward+backward"] = fwdbwd_step(lambda: trivial(xg, freqs), [xg], [g])
    for what, fn in work.items():
        for where in ("forward", "backward"):
            f = function_with(fn, where)
            steps[f"trivial + {what} in its {where}"] = fwdbwd_step(
                lambda f=f: f(xg, freqs), [xg], [g])
    return steps


def removed_launches_row(xg, freqs, g):
    """ropelib's forward+backward with its eager starts replaced by nothing (planned afresh)."""
    with launches_removed(replan=True):
        step = fwdbwd_step(lambda: ropelib.apply_rope(xg, freqs), [xg], [g])
        return host_us_interleaved({"ropelib: forward+backward, launches removed": (step, CALLS)},
                                   ROUNDS, DEVICE)


def measure(x, xg, freqs, g) -> dict:
    out = host_us_interleaved({n: (s, CALLS) for n, s in variants(x, xg, freqs, g).items()},
                              ROUNDS, DEVICE)
    out.update(removed_launches_row(xg, freqs, g))
    return out


def main():
    global CALLS, ROUNDS, DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    CALLS, ROUNDS = a.calls, a.rounds
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"    # cpu: a dry run (interpreter)
    s, b, h, d = 1, 64, 32, 128
    x = torch.randn(s, b, h, d, device=DEVICE, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    freqs = ropelib.rope_freqs(4096, d, device=DEVICE)
    g = torch.randn_like(x)
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (interpreter)"
    print(f"# {gpu}, torch {torch.__version__}, TE "
          f"{'installed' if te_rope is not None else 'not installed'}; "
          f"best of {ROUNDS} rounds of {CALLS} calls, host us per call", flush=True)
    threaded = measure(x, xg, freqs, g)
    torch.autograd.set_multithreading_enabled(False)
    try:
        single = measure(x, xg, freqs, g)
    finally:
        torch.autograd.set_multithreading_enabled(True)
    print("\n| variant | device thread on (default) | off |\n|---|---:|---:|")
    for name, us in threaded.items():
        other = single.get(name)
        fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else f"failed: {v!r}"[:60]
        print(f"| {name} | {fmt(us)} | {fmt(other)} |")


CALLS, ROUNDS, DEVICE = 200, 7, "cuda"

if __name__ == "__main__":
    main()
