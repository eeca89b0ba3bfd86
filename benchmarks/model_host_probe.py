"""The host time RoPE adds to an eager model step, per layer: ropelib beside Transformer Engine's
fused RoPE and PyTorch's formula, inside a model rather than as a call of its own (GPU).

A benchmark that times one RoPE call's forward+backward makes that call's outputs the roots of
`torch.autograd.grad`: autograd then builds and checks a gradient per root, which no layer of a
model pays (its q and k feed attention; the backward starts from one loss). This probe times
what a model pays instead: a stack of LAYERS attention-shaped layers at decode size (x [s=1,
b=64, 4096] bf16, RMS-normed before each layer; q = x Wq as 32 heads of 128, k = x Wk as 8
heads; q and k rotated; a stand-in for attention that uses both, q's first 8 heads times k,
projected back by Wo and added to x), one loss, one backward, autograd's device thread on (the
default). Each provider rotates q and k its own way:

    no RoPE          q and k as they are: the model's own host time
    PyTorch          Hugging Face's q * cos + rotate_half(q) * sin, bf16 cos/sin [s, 1, 1, d]
    TE fused         Transformer Engine's apply_rotary_pos_emb(fused=True), one call for q and
                     one for k (where TE is installed)
    ropelib          ropelib.apply_rope, one call for q and one for k
    ropelib q+k      ropelib.apply_rope_qk, one call for both

Timed for a training step (forward, loss, backward) and for an inference step (the forward
under torch.inference_mode), all providers in turns (suite.host_us_interleaved: calls back to
back, one synchronisation at the end of each round, the best of the rounds). At this size the
GPU finishes each step's kernels before the host has issued the next, so a step's time is the
host's. What a provider adds per layer is (its step - the no-RoPE step) / LAYERS.

    python benchmarks/model_host_probe.py [--layers 8] [--rounds 7] [--calls 50] [--parts]
    TRITON_INTERPRET=1 python benchmarks/model_host_probe.py --dry-run   # CPU: tiny, checks only

`--parts` takes ropelib's training step apart instead, with autograd's device thread on and
then off (set_multithreading_enabled(False): the backward runs on the calling thread), every
variant in the same rounds:

    trivial Function               an autograd.Function per tensor that only allocates its
                                   output (empty_like) both ways: what any Python Function costs
    ropelib, launches removed      ropelib's own Python (its eager starts replaced by nothing)
    ropelib, trivial backward      ropelib's forward, a backward that only allocates
    ropelib, trivial backward, launches removed

Prints a table; `--out CSV` also writes the rows (provider, step, us_per_step,
us_per_layer_over_no_rope).
"""
import argparse
import sys
from pathlib import Path

import torch

try:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb as te_rope
except Exception:  # noqa: BLE001 -- TE absent or broken: the run goes on without it
    te_rope = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.bench.suite import host_us_interleaved  # noqa: E402
from ropelib.course.probe_timers import without_launches  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from autograd_host_probe import function_with  # noqa: E402  (the trivial Function)


def rotate_half(t):
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rotations(freqs, cos, sin) -> dict:
    """{provider: rotate(q, k) -> (q', k')} for q [s, b, hq, d] and k [s, b, hk, d] (sbhd)."""
    out = {
        "no RoPE": lambda q, k: (q, k),
        "PyTorch": lambda q, k: (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin),
        "ropelib": lambda q, k: (ropelib.apply_rope(q, freqs), ropelib.apply_rope(k, freqs)),
        "ropelib q+k": lambda q, k: ropelib.apply_rope_qk(q, k, freqs),
    }
    if te_rope is not None and torch.cuda.is_available():
        out["TE fused"] = lambda q, k: (te_rope(q, freqs, fused=True),
                                        te_rope(k, freqs, fused=True))
    return out


class Layers(torch.nn.Module):
    """LAYERS attention-shaped layers; `rotate` rotates each layer's q and k."""

    def __init__(self, layers, hidden, heads, kv_heads, head_dim, device, dtype):
        super().__init__()
        make = lambda i, o: torch.nn.Parameter(
            torch.randn(i, o, device=device, dtype=dtype) / i ** 0.5)
        self.wq = torch.nn.ParameterList(make(hidden, heads * head_dim) for _ in range(layers))
        self.wk = torch.nn.ParameterList(make(hidden, kv_heads * head_dim) for _ in range(layers))
        self.wo = torch.nn.ParameterList(make(kv_heads * head_dim, hidden) for _ in range(layers))
        self.shape = (heads, kv_heads, head_dim)

    def forward(self, x, rotate):
        heads, kv_heads, d = self.shape
        s, b, _ = x.shape
        for wq, wk, wo in zip(self.wq, self.wk, self.wo):
            h = torch.nn.functional.rms_norm(x, (x.shape[-1],))     # pre-norm: x stays finite
            q = (h @ wq).view(s, b, heads, d)
            k = (h @ wk).view(s, b, kv_heads, d)
            q, k = rotate(q, k)
            x = x + (q[:, :, :kv_heads] * k).reshape(s, b, kv_heads * d) @ wo
        return x


# an autograd.Function that allocates its output both ways and saves the table, nothing else:
# apply(x, table)
trivial = function_with(None, "neither")


def _trivial_backward(ctx, *grads):
    """Rotate.backward's inputs and outputs, with only the gradients' allocation."""
    reads = ctx.saved_tensors
    return (None, None, *(torch.empty_like(g) for g in grads)) + (None,) * len(reads)


def _patched(fn, patches):
    """fn with (owner, attribute, value) patches in place while it runs."""
    def run():
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
        for owner, name, value in patches:
            setattr(owner, name, value)
        try:
            fn()
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
    return run


def parts(model, x, rotate_by, freqs) -> dict:
    """{variant: training step} of --parts (see the module docstring)."""
    from ropelib import eager
    trivial_bwd = (eager.Rotate, "backward", staticmethod(_trivial_backward))
    train = lambda rotate: steps(model, x, rotate)["training"]
    out = {name: train(rotate_by[name]) for name in ("no RoPE", "TE fused", "ropelib", "ropelib q+k")
           if name in rotate_by}
    out["trivial Function"] = train(lambda q, k: (trivial(q, freqs), trivial(k, freqs)))
    ropelib_step = train(rotate_by["ropelib"])
    out["ropelib, launches removed"] = without_launches(ropelib_step, replan=False)
    out["ropelib, trivial backward"] = _patched(ropelib_step, [trivial_bwd])
    out["ropelib, trivial backward, launches removed"] = without_launches(
        out["ropelib, trivial backward"], replan=False)
    return out


def steps(model, x, rotate) -> dict:
    """{'training': forward, loss, backward; 'inference': the forward in inference mode}."""
    def training():
        loss = model(x, rotate).float().square().mean()
        loss.backward()

    def inference():
        with torch.inference_mode():
            model(x, rotate)
    return {"training": training, "inference": inference}


def check(model, x, rotate_by) -> None:
    """Every provider gives the PyTorch formula's output and gradients (bf16 tolerance)."""
    def run(rotate):
        model.zero_grad(set_to_none=True)
        y = model(x, rotate)
        y.float().square().mean().backward()
        return y.float(), [p.grad.float() for p in model.parameters()]
    want, want_grads = run(rotate_by["PyTorch"])
    for name, rotate in rotate_by.items():
        if name == "no RoPE":
            continue
        got, grads = run(rotate)
        for g, w in zip([got, *grads], [want, *want_grads]):   # bf16: 5 % of each tensor's scale
            assert torch.isfinite(w).all(), "the PyTorch formula's step is not finite"
            torch.testing.assert_close(g, w, atol=5e-2 * w.abs().max().item(), rtol=5e-2,
                                       msg=name)
    model.zero_grad(set_to_none=True)


DECODE = dict(s=1, b=64, hidden=4096, heads=32, kv_heads=8, d=128, dtype=torch.bfloat16)
DRY_RUN = dict(s=1, b=2, hidden=32, heads=4, kv_heads=2, d=16, dtype=torch.float32)


def setup(layers: int, device, s, b, hidden, heads, kv_heads, d, dtype) -> tuple:
    """(model, x, freqs, {provider: rotate}) for `layers` layers of these sizes (DECODE or
    DRY_RUN), seeded: the model, its input x [s, b, hidden] and the fp32 angle table freqs."""
    torch.manual_seed(0)
    model = Layers(layers, hidden, heads, kv_heads, d, device, dtype)
    x = torch.randn(s, b, hidden, device=device, dtype=dtype)
    freqs = ropelib.rope_freqs(4096, d, device=device)[:s]                  # [s, 1, 1, d] fp32
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    return model, x, freqs, rotations(freqs, cos, sin)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50, help="steps a round, back to back")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes, any machine")
    ap.add_argument("--parts", action="store_true",
                    help="take ropelib's training step apart (device thread on and off)")
    ap.add_argument("--out", help="also write the rows to this CSV")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not a.dry_run else "cpu"
    sizes = DRY_RUN if a.dry_run else DECODE
    layers, rounds, calls = (2, 1, 1) if a.dry_run else (a.layers, a.rounds, a.calls)
    s, b, hidden, heads, kv_heads, d, dtype = sizes.values()
    model, x, freqs, rotate_by = setup(layers, device, **sizes)
    check(model, x, rotate_by)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter)"
    print(f"# {where}, torch {torch.__version__}, TE "
          f"{'installed' if 'TE fused' in rotate_by else 'not installed'}; {layers} layers, "
          f"x [{s}, {b}, {hidden}] {str(dtype)[6:]}, q {heads} and k {kv_heads} heads of {d}; "
          f"host us per step, best of {rounds} rounds of {calls} steps; providers checked against "
          f"the PyTorch formula", flush=True)
    timed = {}
    if a.parts:
        for step, threaded in (("training", True), ("training, device thread off", False)):
            torch.autograd.set_multithreading_enabled(threaded)
            try:
                fns = {name: (fn, calls) for name, fn in parts(model, x, rotate_by, freqs).items()}
                timed[step] = host_us_interleaved(fns, rounds, device, warmup=min(10, calls))
            finally:
                torch.autograd.set_multithreading_enabled(True)
    else:
        for step in ("training", "inference"):
            fns = {name: (steps(model, x, rotate)[step], calls)
                   for name, rotate in rotate_by.items()}
            timed[step] = host_us_interleaved(fns, rounds, device, warmup=min(10, calls))
    rows = []
    for step, by_name in timed.items():
        base = by_name["no RoPE"]
        for name, us in by_name.items():
            if isinstance(us, Exception):
                raise us
            rows.append(dict(provider=name, step=step, us_per_step=round(us, 1),
                             us_per_layer_over_no_rope=round((us - base) / layers, 2)))
    first, second = timed
    print(f"\n| provider | {first}: us a step | RoPE per layer | {second}: us a step | "
          "RoPE per layer |\n|---|---:|---:|---:|---:|")
    for name in timed[first]:
        t, i = (next(r for r in rows if r["provider"] == name and r["step"] == st)
                for st in (first, second))
        print(f"| {name} | {t['us_per_step']:.1f} | {t['us_per_layer_over_no_rope']:.1f} | "
              f"{i['us_per_step']:.1f} | {i['us_per_layer_over_no_rope']:.1f} |")
    if a.out:
        meta = compare.environment_meta()
        meta.update(script="benchmarks/model_host_probe.py", layers=layers,
                    shape=f"x [{s}, {b}, {hidden}], q {heads} / k {kv_heads} heads of {d}",
                    timing=f"host us per step, best of {rounds} rounds of {calls} steps")
        compare.write_csv(rows, a.out, meta, fields=list(rows[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
