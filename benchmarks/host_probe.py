"""Where the host time of one eager call goes (GPU): public API, operator dispatch, planner,
Triton's launcher. Decode size (s=1, b=64, h=32, d=128, bf16), calls back to back.

    python benchmarks/host_probe.py
"""
import torch

try:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb as te_rope
except Exception:  # noqa: BLE001
    te_rope = None

import ropelib
from ropelib.bench.suite import host_us
from ropelib.course.probe_timers import launches_removed
from ropelib import ops
from ropelib.kernels import launch as L
from ropelib.kernels.fused import _rope_kernel


def per_call_us(fn):
    return host_us(fn, calls=2000)


def main():
    dev = "cuda"
    s, b, h, d = 1, 64, 32, 128
    x = torch.randn(s, b, h, d, device=dev, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    freqs = ropelib.rope_freqs(4096, d, device=dev)
    f2 = freqs[:, 0, 0]
    sp = torch.randint(0, 4000, (b,), device=dev)
    g = torch.randn_like(x)
    rows = []

    def add(name, fn):
        rows.append((name, per_call_us(fn)))
        print(f"{name:55s} {rows[-1][1]:8.1f} us", flush=True)

    add("empty_like (floor of one torch op)", lambda: torch.empty_like(x))
    add("apply_rope fwd", lambda: ropelib.apply_rope(x, freqs))
    add("apply_rope fwd start_positions", lambda: ropelib.apply_rope(x, freqs, start_positions=sp))
    add("te drop-in fused fwd start_positions",
        lambda: ropelib.te.apply_rotary_pos_emb(x, freqs, start_positions=sp, fused=True))
    add("torch.ops.ropelib.rope fwd start_positions", lambda: ops.rope(
        x, f2, None, None, None, sp, "sbhd", False, 1, 0, False, None))
    add("apply_rope fwd+bwd", lambda: ropelib.apply_rope(xg, freqs).backward(g))
    add("apply_rope fwd+bwd start_positions",
        lambda: ropelib.apply_rope(xg, freqs, start_positions=sp).backward(g))
    y = torch.empty_like(x)
    v, vo = L.View.of(x), L.View.of(y)
    add("plan()", lambda: L.plan(v, vo, L.Table(f2, None), L.Positions(start=sp), R=d,
                                 interleaved=False, backward=False, layout="sbhd"))
    launch, pointers = L.plan(v, vo, L.Table(f2, None), L.Positions(start=sp), R=d,
                              interleaved=False, backward=False, layout="sbhd")
    named = dict(zip(launch.launcher.pointer_names, pointers))
    add("Triton's own launch of a planned call",
        lambda: _rope_kernel[launch.grid](**named, **launch.args, num_warps=launch.num_warps))
    add("direct launch of a planned call", lambda: launch.launcher(launch, pointers))
    # the parts of a direct launch: Triton's C launcher alone, with every argument prepared
    compiled = _rope_kernel[launch.grid](**named, **launch.args, num_warps=launch.num_warps)
    addresses = [t.data_ptr() if t is not None else None for t in pointers]
    tail = tuple(launch.args[n] for n in launch.launcher._params()[len(pointers):])
    stream = torch.cuda.current_stream().cuda_stream
    gr = tuple(launch.grid) + (1, 1)
    c_args = (gr[0], gr[1], gr[2], stream, compiled.function, compiled.packed_metadata, None,
              None, None, *addresses, *tail)
    run = compiled.run
    add(f"Triton's C launcher alone ({len(c_args)} arguments)", lambda: run(*c_args))
    from ropelib.kernels import direct
    add("current stream", lambda: direct.current_stream(0))
    add("10 data_ptr() calls", lambda: [t.data_ptr() for t in pointers if t is not None])
    add("apply_rope_qk fwd start_positions (q 32 heads, k 8)",
        lambda: ropelib.apply_rope_qk(x, x[:, :, :8], freqs, start_positions=sp))
    # the Python around the launch: everything with the launch replaced by nothing (at the
    # eager route's own start, which later calls take without passing DirectLauncher.__call__)
    with launches_removed(replan=True):
        add("apply_rope fwd, launch removed", lambda: ropelib.apply_rope(x, freqs))
        add("apply_rope fwd+bwd, launches removed",
            lambda: ropelib.apply_rope(xg, freqs).backward(g))

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, f):
            ctx.save_for_backward(f)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, grad):
            return torch.empty_like(grad), None
    add("trivial autograd.Function fwd+bwd (empty_like both ways)",
        lambda: Trivial.apply(xg, freqs).backward(g))
    # one planned launch inside an autograd.Function: what a launch costs among the autograd
    # engine's own work (on an H100 host: 7.4 us back to back, about 25 us here, forward or
    # backward alike)
    def function_with(work):
        """A trivial autograd.Function that runs work(tensor) in its forward, its backward or
        both (apply(x, in_forward, in_backward))."""
        class With(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, in_forward, in_backward):
                ctx.in_backward = in_backward
                if in_forward:
                    work(x)
                return torch.empty_like(x)

            @staticmethod
            def backward(ctx, grad):
                if ctx.in_backward:
                    work(grad)
                return torch.empty_like(grad), None, None
        return With
    WithLaunch = function_with(lambda t: launch.launcher(launch, pointers))
    add("trivial Function fwd+bwd, a planned launch in forward",
        lambda: WithLaunch.apply(xg, True, False).backward(g))
    add("trivial Function fwd+bwd, a planned launch in backward",
        lambda: WithLaunch.apply(xg, False, True).backward(g))
    add("trivial Function fwd+bwd, a planned launch in both",
        lambda: WithLaunch.apply(xg, True, True).backward(g))
    # is it the launch, or any kernel launched from an autograd forward? An ATen kernel in the
    # same places, and the launches again with autograd's device thread switched off (the
    # backward then runs on the calling thread, as the forward does)
    WithATen = function_with(torch.neg)
    add("trivial Function fwd+bwd, an ATen kernel (neg) in forward",
        lambda: WithATen.apply(xg, True, False).backward(g))
    add("trivial Function fwd+bwd, an ATen kernel (neg) in backward",
        lambda: WithATen.apply(xg, False, True).backward(g))
    torch.autograd.set_multithreading_enabled(False)
    add("no autograd device thread: trivial Function fwd+bwd",
        lambda: Trivial.apply(xg, freqs).backward(g))
    add("no autograd device thread: a planned launch in forward",
        lambda: WithLaunch.apply(xg, True, False).backward(g))
    add("no autograd device thread: a planned launch in backward",
        lambda: WithLaunch.apply(xg, False, True).backward(g))
    add("no autograd device thread: an ATen kernel in forward",
        lambda: WithATen.apply(xg, True, False).backward(g))
    add("no autograd device thread: apply_rope fwd+bwd",
        lambda: ropelib.apply_rope(xg, freqs).backward(g))
    torch.autograd.set_multithreading_enabled(True)
    if te_rope is not None:
        add("TE fused fwd", lambda: te_rope(x, freqs, fused=True))
        add("TE fused fwd start_positions", lambda: te_rope(x, freqs, start_positions=sp, fused=True))
        add("TE fused fwd+bwd", lambda: te_rope(xg, freqs, fused=True).backward(g))
    print("\n| call | host us |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
