"""What each feature of an autograd.Function costs a forward+backward, beside a trivial one.

    TRITON_INTERPRET=1 python benchmarks/autograd_node_costs.py     # a CPU is enough

At decode size (s=1, b=64, h=32, d=128, bf16, sbhd) a trivial Function (an empty_like each way,
the table saved, started through autograd's C++ apply as ropelib's eager route starts Rotate) is
changed one feature at a time: the number and kind of its inputs, what it saves and how, its
ctx, what its backward returns, its output's dtype and layout. Each variant is timed as a
forward+backward (`torch.autograd.grad` of a fresh output), µs of host time a call, best of
--rounds rounds of --calls calls, every variant once in each round (the CPU is shared; the
trivial Function is timed first and last: their difference is the noise). Then ropelib's own
route, with its kernel launches removed: eager.Rotate with the tables as inputs of their own (as
it was) and as one tuple (as it is), and apply_rope whole.

Last, why a forward+backward costs more than its pieces timed one by one: apply_rope's forward
alone, calls back to back, against the same forward right after a trivial forward+backward
(less that forward+backward): the same Python, run with what autograd's engine left in the
caches instead of with its own.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ropelib  # noqa: E402
from ropelib import eager  # noqa: E402
from ropelib.course.probe_timers import launches_removed  # noqa: E402

_CONTIGUOUS = torch.contiguous_format


def function(forward, backward, setup_context=None) -> type:
    """An autograd.Function class of these static methods."""
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    if setup_context is not None:
        methods["setup_context"] = staticmethod(setup_context)
    return type("Variant", (torch.autograd.Function,), methods)


def direct(cls: type):
    """cls's apply as ropelib's eager route calls it: autograd's C++ apply (eager.direct_apply)."""
    return eager.direct_apply(cls)


def _trivial_forward(ctx, x, table):
    ctx.save_for_backward(table)
    return torch.empty_like(x)


def _trivial_backward(ctx, grad):
    ctx.saved_tensors
    return torch.empty_like(grad), None


TRIVIAL = function(_trivial_forward, _trivial_backward)


class RotateReadsAsInputs(torch.autograd.Function):
    """eager.Rotate as it was before the tables and index tensors came as one tuple:
    apply(rotation, n, *xs, *reads), each read an input of its own (single backward only)."""

    @staticmethod
    def forward(ctx, rotation, n, *tensors):
        reads = tensors[n:]
        outs = rotation.run(tensors[:n], reads)
        ctx.rotation = rotation
        ctx.save_for_backward(*reads)
        return outs[0] if n == 1 else outs

    @staticmethod
    def backward(ctx, *grads):
        reads = ctx.saved_tensors
        rotation = ctx.rotation
        every = True
        for g in grads:
            if g is None:
                every = False
        present = grads if every else tuple(g for g in grads if g is not None)
        gx = rotation.reverse(grads).run(present, reads)
        return (None, None, *gx) + (None,) * len(reads)


class RotateReadsSaved(torch.autograd.Function):
    """eager.Rotate as it was before its reads were kept on ctx with their version counters:
    apply(rotation, reads, *xs), the reads saved for backward (single backward only)."""

    @staticmethod
    def forward(ctx, rotation, reads, *xs):
        outs = rotation.run(xs, reads)
        ctx.rotation = rotation
        ctx.save_for_backward(*reads)
        return outs[0] if len(xs) == 1 else outs

    @staticmethod
    def backward(ctx, *grads):
        reads = ctx.saved_tensors
        gx = ctx.rotation.reverse(grads).run(grads, reads)
        return (None, None, *gx)


def variants(x, table, extra) -> dict:
    """{name: (apply, its arguments)}: the trivial Function, one feature changed at a time."""
    v = {"trivial Function (C++ apply), first": (direct(TRIVIAL), (x, table))}
    v["Function.apply (its Python wrapper)"] = (TRIVIAL.apply, (x, table))

    def fwd(x, t):
        return torch.empty_like(x)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
    v["setup_context style (through Function.apply)"] = (
        function(fwd, _trivial_backward, setup).apply, (x, table))

    def fwd(ctx, obj, n, x, t):
        ctx.save_for_backward(t)
        return torch.empty_like(x)

    def bwd(ctx, grad):
        ctx.saved_tensors
        return None, None, torch.empty_like(grad), None
    v["+2 non-tensor inputs (an object, an int)"] = (direct(function(fwd, bwd)),
                                                      (object(), 1, x, table))

    def fwd(ctx, x, t, a, b, c):
        ctx.save_for_backward(t)
        return torch.empty_like(x)

    def bwd(ctx, grad):
        ctx.saved_tensors
        return torch.empty_like(grad), None, None, None, None
    v["+3 None inputs"] = (direct(function(fwd, bwd)), (x, table, None, None, None))

    def fwd(ctx, x, t, a, b, c):
        ctx.save_for_backward(t, a, b, c)
        return torch.empty_like(x)
    v["+3 tensor inputs (no grad), all 4 saved"] = (direct(function(fwd, bwd)),
                                                     (x, table, *extra))

    def fwd(ctx, x, reads):
        ctx.save_for_backward(*reads)
        return torch.empty_like(x)
    v["the 4 no-grad tensors in one tuple input, saved"] = (direct(function(fwd, _trivial_backward)),
                                                             (x, (table, *extra)))

    def fwd(ctx, x, reads):
        ctx.save_for_backward(*reads)
        return torch.empty_like(x)
    v["the table in a tuple input, saved"] = (direct(function(fwd, _trivial_backward)),
                                               (x, (table,)))

    def fwd(ctx, x, t):
        ctx.table = t
        return torch.empty_like(x)

    def bwd(ctx, grad):
        ctx.table
        return torch.empty_like(grad), None
    v["the table a ctx attribute, not saved"] = (direct(function(fwd, bwd)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t, x)
        return torch.empty_like(x)
    v["x (requires grad) saved too"] = (direct(function(fwd, _trivial_backward)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        ctx.rotation = table
        return torch.empty_like(x)

    def bwd(ctx, grad):
        ctx.saved_tensors
        ctx.rotation
        return torch.empty_like(grad), None
    v["+1 ctx attribute"] = (direct(function(fwd, bwd)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        ctx.a = ctx.b = ctx.c = ctx.d = ctx.e = table
        return torch.empty_like(x)
    v["+5 ctx attributes"] = (direct(function(fwd, _trivial_backward)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        ctx.set_materialize_grads(False)
        return torch.empty_like(x)
    v["set_materialize_grads(False)"] = (direct(function(fwd, _trivial_backward)), (x, table))
    v["once_differentiable backward"] = (direct(function(
        _trivial_forward, once_differentiable(_trivial_backward))), (x, table))

    def fwd(ctx, *tensors):
        ctx.save_for_backward(*tensors[1:])
        return torch.empty_like(tensors[0])

    def bwd(ctx, *grads):
        ctx.saved_tensors
        return torch.empty_like(grads[0]), None
    v["*tensors forward, *grads backward"] = (direct(function(fwd, bwd)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        return torch.empty_like(x, dtype=x.dtype, memory_format=_CONTIGUOUS)

    def bwd(ctx, grad):
        ctx.saved_tensors
        return torch.empty_like(grad, dtype=grad.dtype, memory_format=_CONTIGUOUS), None
    v["empty_like(dtype=, memory_format=) both ways"] = (direct(function(fwd, bwd)), (x, table))

    def bwd(ctx, grad):
        ctx.saved_tensors
        return torch.empty_like(grad), None, None, None, None, None
    v["backward returns 4 Nones too many"] = (direct(function(_trivial_forward, bwd)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        y = torch.empty_like(x)
        aux = torch.empty((), device=x.device)
        ctx.mark_non_differentiable(aux)
        return y, aux

    def bwd(ctx, grad, grad_aux):
        ctx.saved_tensors
        return torch.empty_like(grad), None
    v["+1 output marked non-differentiable"] = (
        lambda x, t, f=direct(function(fwd, bwd)): f(x, t)[0], (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        return torch.empty_like(x).view(x.shape)
    v["output a view of a fresh tensor"] = (direct(function(fwd, _trivial_backward)), (x, table))

    def fwd(ctx, x, t):
        ctx.save_for_backward(t)
        return torch.empty_like(x, dtype=torch.float32)
    v["output fp32 from bf16 x (its gradient converted)"] = (
        direct(function(fwd, _trivial_backward)), (x, table))

    def bwd(ctx, grad):
        ctx.saved_tensors
        return torch.empty_like(grad, dtype=torch.float32), None
    v["backward returns an fp32 gradient for bf16 x"] = (
        direct(function(_trivial_forward, bwd)), (x, table))

    def bwd(ctx, grad):
        ctx.saved_tensors
        return torch.empty(grad.shape[::-1], dtype=grad.dtype,
                           device=grad.device).permute(3, 2, 1, 0), None
    v["backward returns a non-contiguous gradient"] = (
        direct(function(_trivial_forward, bwd)), (x, table))

    def bwd(ctx, grad):
        ctx.saved_tensors
        return grad, None
    v["backward returns the incoming gradient itself"] = (
        direct(function(_trivial_forward, bwd)), (x, table))

    def hooked(x, t, f=direct(TRIVIAL)):
        y = f(x, t)
        y.register_hook(lambda g: None)
        return y
    v["a hook on the output (register_hook)"] = (hooked, (x, table))
    return v


def ropelib_rows(x, freqs) -> dict:
    """ropelib's route, launches removed (call inside launches_removed)."""
    y = ropelib.apply_rope(x, freqs)
    rotation, table = y.grad_fn.rotation, y.grad_fn.reads[0]
    return {
        "eager.Rotate, the table an input (as it was)": (
            direct(RotateReadsAsInputs), (rotation, 1, x, table)),
        "eager.Rotate, reads saved for backward (as it was)": (
            direct(RotateReadsSaved), (rotation, (table,), x)),
        "eager.Rotate, reads kept on ctx (now)": (
            eager.rotate, (rotation, (table,), x)),
        "ropelib.apply_rope (whole)": (ropelib.apply_rope, (x, freqs)),
        "trivial Function (C++ apply), last": (direct(TRIVIAL), (x, table)),
    }


def forward_backward(apply, args, x, g):
    return lambda: torch.autograd.grad(apply(*args), [x], [g])


def best_us(steps: dict, calls: int, rounds: int) -> dict:
    """{name: best µs a call}, every step once in each round."""
    for step in steps.values():
        step()
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(rounds):
        for name, step in steps.items():
            t = time.perf_counter()
            for _ in range(calls):
                step()
            best[name] = min(best[name], (time.perf_counter() - t) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args()
    device = ropelib.runtime.default_device()
    x = torch.randn(1, 64, 32, 128, device=device, dtype=torch.bfloat16).requires_grad_(True)
    g = torch.randn_like(x)
    freqs = ropelib.rope_freqs(4096, 128, device=device)
    extra = [torch.zeros(4, device=device) for _ in range(3)]
    where = (torch.cuda.get_device_name() if device == "cuda" else
             f"CPU ({os.cpu_count()} cores)")
    with launches_removed(replan=True):
        rows = {**variants(x, freqs, extra), **ropelib_rows(x, freqs)}
        steps = {name: forward_backward(apply, args, x, g) for name, (apply, args) in rows.items()}
        trivial_fb = steps["trivial Function (C++ apply), last"]
        steps["apply_rope forward alone"] = lambda: ropelib.apply_rope(x, freqs)
        steps["trivial forward+backward, then apply_rope forward"] = lambda: (
            trivial_fb(), ropelib.apply_rope(x, freqs))
        us = best_us(steps, a.calls, a.rounds)
    base = us["trivial Function (C++ apply), first"]
    print(f"# {where}, torch {torch.__version__}; launches removed; best of {a.rounds} rounds of "
          f"{a.calls} calls, host us per forward+backward, and over the trivial Function")
    for name in rows:
        print(f"{name:52s} {us[name]:7.2f} {us[name] - base:+7.2f}")
    alone = us["apply_rope forward alone"]
    after = us["trivial forward+backward, then apply_rope forward"] - us[
        "trivial Function (C++ apply), last"]
    print(f"{'apply_rope forward, calls back to back':52s} {alone:7.2f}")
    print(f"{'apply_rope forward, each after a forward+backward':52s} {after:7.2f}")


if __name__ == "__main__":
    main()
