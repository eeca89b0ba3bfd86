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

`--pieces` (a CPU is enough; on a GPU it runs there) times the eager route's Python piece by
piece instead, with the launches removed (planning.start as qkv_linear and qkv_gemm call it,
and ropelib.eager's launches, replaced by nothing), at a small shape like the tests' (fp32,
B=2, S=13, hidden 64, 4/2 heads of 32, angles): the whole call (forward under no_grad, with
gradients, and the backward through autograd), then each step of the forward and of the
backward, and the same with QK-norm (norm weights [D]: the forward, the forward+backward, the
backward and its dY step, qk_norm.undo_norm_rope into dY's columns), and the unfused
pipeline's forward and forward+backward (F.linear, then apply_rope_qk with a table, as the GPU
rows run it), best of --rounds rounds of --calls calls back to back
(benchmarks/eager_python_pieces.py's way). What is left is
ropelib's own Python and PyTorch's calls (allocations, views, and on the backward's "dy" route
dX and dW's matrix products, here on the CPU, denormals flushed: with the launches removed dY
is whatever torch.empty held).

    python benchmarks/qkv_host_probe.py [--tokens 8192] [--calls 20] [--rounds 7]   # GPU
    TRITON_INTERPRET=1 python benchmarks/qkv_host_probe.py --dry-run                # CPU
    TRITON_INTERPRET=1 python benchmarks/qkv_host_probe.py --pieces [--calls 2000]  # CPU
"""
import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qkv_rope_bench as bench  # noqa: E402  (it puts the checkout on sys.path)
from eager_python_pieces import best_us  # noqa: E402  (best of rounds, µs a call)

import ropelib  # noqa: E402
from ropelib import qkv_linear, qkv_plan, runtime  # noqa: E402
from ropelib.course.probe_timers import launches_removed  # noqa: E402
from ropelib.kernels import launch as kernel_launch, planning, qkv_gemm  # noqa: E402
from ropelib.kernels import qk_norm_rope as kernel_qk_norm  # noqa: E402


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


@contextlib.contextmanager
def qkv_launches_removed():
    """A block in which ropelib's launches do nothing (planning.start, wherever the QKV
    projection's forward and backward call it: qkv_linear, qkv_gemm, the RoPE and QK-norm
    launchers; and ropelib.eager's launches); every other step of the eager route runs. On exit
    the launches are back."""
    def no_start(direct, launch, pointers):
        pass
    modules = [m for m in (qkv_linear, qkv_gemm, kernel_launch, kernel_qk_norm)
               if getattr(m, "start", None) is planning.start]
    real = [m.start for m in modules]
    for m in modules:
        m.start = no_start
    try:
        with launches_removed(replan=False):
            yield
    finally:
        for m, fn in zip(modules, real):
            m.start = fn


def pieces(device) -> dict:
    """{piece: a call with no arguments} of one eager qkv_rope_linear at a small shape (the
    caller removes the launches). Pieces indented under a whole are parts of it."""
    B, S, K, HQ, HK, D = 2, 13, 64, 4, 2, 32
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, K, generator=g).to(dev)
    w = (torch.randn((HQ + 2 * HK) * D, K, generator=g) / K ** 0.5).to(dev)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    angles = ropelib.rope_angles(D, device=dev)
    opts = dict(n_heads=HQ, n_kv_heads=HK, head_dim=D, angles=angles)
    table, sin = angles.turns, angles.amplitude
    args = (x, w, None, table, sin, None, None, None, None, HQ, HK, D, 1e-6, False, "bshd",
            False, "dy")
    gargs = (xg, wg) + args[2:]
    grads = [torch.randn(B, S, h, D, generator=g).to(dev) for h in (HQ, HK, HK)]
    out = ropelib.qkv_rope_linear(xg, wg, **opts)
    ctx = out[0].grad_fn
    # with QK-norm (Qwen3's q_norm and k_norm: weights [D])
    wq, wk = (torch.rand(D, generator=g).add(0.5).to(dev).requires_grad_() for _ in range(2))
    nopts = dict(opts, q_norm_weight=wq, k_norm_weight=wk)
    normed = ropelib.qkv_rope_linear(xg, wg, **nopts)
    nctx = normed[0].grad_fn
    norm_input = nctx.saved_tensors[-1]
    made = qkv_linear._forward(*args)
    tok = qkv_linear._token_major(grads, "bshd")
    key = (x, w, None, table, sin, None, None, None, None, HQ, HK, D, 1e-6, False, "bshd", False)

    freqs = ropelib.rope_freqs(S, D, device=dev)

    def unfused(x, w):
        q, k, v = bench.split_heads(F.linear(x, w), HQ, HK, D)
        return ropelib.apply_rope_qk(q, k, freqs, layout="bshd") + (v,)

    def forward_plan():         # (a forward's one lookup of its whole plan)
        return qkv_plan.SIGNATURES.get(qkv_plan.forward_key(*key))

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    return {
        "forward, no_grad (whole)": no_grad(lambda: ropelib.qkv_rope_linear(x, w, **opts)),
        # (timed with qkv_linear's forward answering at once with outputs made beforehand:
        # _forward, and _project where the no_grad call runs it)
        "  checks and arguments (the whole less the forward)": (
            no_grad(lambda: ropelib.qkv_rope_linear(x, w, **opts)),
            {"_forward": lambda *a: made, "_project": lambda *a: made[:3]}),
        "  _forward (the operator's implementation)": no_grad(lambda: qkv_linear._forward(*args)),
        "    torch.empty, one output [B, S, HQ, D]": lambda: torch.empty(
            (B, S, HQ, D), dtype=x.dtype, device=dev),
        "    the forward's plan (key + lookup, qkv_plan.ForwardPlan)": forward_plan,
        "forward, with gradients (whole)": lambda: ropelib.qkv_rope_linear(xg, wg, **opts),
        "  _eager_qkv_rope (Function: plan, _project, _setup)": lambda: qkv_linear._eager_qkv_rope(
            *gargs, None),
        "forward+backward (autograd.backward, whole)": lambda: torch.autograd.backward(
            ropelib.qkv_rope_linear(xg, wg, **opts), grads),
        "  backward under no_grad (_backward with a saved ctx)": no_grad(
            lambda: qkv_linear._backward(ctx, *grads, None, None)),
        "    dY written (_written_dy)": no_grad(lambda: qkv_linear._written_dy(
            *tok, x, table, sin, None, None, False)),
        "    dX = dY W and dW = dY^T x (torch)": no_grad(lambda: (
            torch.empty(B * S, w.shape[0], dtype=x.dtype, device=dev) @ w,
            torch.empty(B * S, w.shape[0], dtype=x.dtype, device=dev).t()
            @ x.reshape(-1, K))),
        "QK-norm: forward, no_grad (whole)": no_grad(
            lambda: ropelib.qkv_rope_linear(x, w, **nopts)),
        "QK-norm: forward+backward (autograd.backward, whole)": lambda: torch.autograd.backward(
            ropelib.qkv_rope_linear(xg, wg, **nopts), grads),
        "  backward under no_grad, QK-norm (_backward with a saved ctx)": no_grad(
            lambda: qkv_linear._backward(nctx, *grads, None, None)),
        "    dY written (_written_dy_normed)": no_grad(lambda: qkv_linear._written_dy_normed(
            *tok, x, norm_input, wq, wk, table, sin, None, None, HQ, HK, D, 1e-6, False)),
        # the unfused pipeline the GPU rows time (F.linear, then apply_rope_qk on q and k)
        "unfused: forward, no_grad (F.linear + apply_rope_qk)": no_grad(
            lambda: unfused(x, w)),
        "unfused: forward, with gradients": lambda: unfused(xg, wg),
        "unfused: forward+backward (autograd.backward)": lambda: torch.autograd.backward(
            unfused(xg, wg), grads),
    }


def run_pieces(device, calls: int, rounds: int) -> None:
    """Print every piece's µs a call; denormals flushed and one thread while it runs (the CPU's
    matrix products, which read whatever torch.empty held: no slow denormals, no thread pool's
    wake-up), torch's defaults after (no flushing)."""
    threads = torch.get_num_threads()
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    try:
        _print_pieces(device, calls, rounds)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _print_pieces(device, calls: int, rounds: int) -> None:
    with qkv_launches_removed():
        steps = pieces(device)
        where = (torch.cuda.get_device_name() if device == "cuda" else
                 f"CPU ({os.cpu_count()} cores), Triton interpreter")
        print(f"# {where}, torch {torch.__version__}; launches removed; best of {rounds} rounds "
              f"of {calls} calls, host µs a call")
        for name, fn in steps.items():
            fn, stand_ins = fn if isinstance(fn, tuple) else (fn, {})
            stand_ins = {n: f for n, f in stand_ins.items() if hasattr(qkv_linear, n)}
            real = {n: getattr(qkv_linear, n) for n in stand_ins}
            for n, f in stand_ins.items():
                setattr(qkv_linear, n, f)
            try:
                us = f"{best_us(fn, calls, rounds):7.2f}"
            except RuntimeError as e:   # (on an H100 the saved-ctx backward found its tensors
                us = f"failed: {str(e)[:60]}"      # freed, where the CPU's run kept them)
            finally:
                for n, f in real.items():
                    setattr(qkv_linear, n, f)
            print(f"{name:68s} {us}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--pieces", action="store_true",
                    help="the eager route's Python piece by piece, launches removed")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args(argv)
    device = runtime.default_device()
    if a.pieces:
        run_pieces(device, a.calls or 2000, a.rounds)
        return 0
    a.calls = a.calls or 20
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
