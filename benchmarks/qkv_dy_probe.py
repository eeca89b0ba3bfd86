"""The QKV projection's backward with its gradient written once: what the prologues cost.

`ropelib.qkv_rope_linear(..., backward="prologue")` never writes the un-rotated gradient of the
projection, dY [M, N]: its dX and dW GEMMs re-form dY from the gradients of the rotated q, k
(inverse rotation) and v as they load their operand, dW once per column block of x.
`backward="dy"` writes it once (`qkv_linear.written_dy`: ropelib's RoPE rotates the gradients of
q and k back in one launch, storing them straight into their columns of dY, and v's are copied
into theirs) and runs cuBLAS for dX = dY W and dW = dY^T x. This probe times both on the benchmark's case
(Llama-3-8B's projection, bf16, table-free angles, no QK-norm; benchmarks/qkv_rope_bench.py):

* fused, prologues: `qkv_rope_linear(..., backward="prologue")`;
* fused, dY written, cuBLAS: `qkv_rope_linear(..., backward="dy")`;
* fused, dY written, Triton: the same forward and dY, then ropelib's dX and dW kernels without
  their rotation (qkv_rope_bench's triton_gemm backward): the prologues' cost at the same GEMMs;
* unfused: cuBLAS then `apply_rope_qk` (autograd through both), the baseline.

`--qk-norm`: the same with Qwen3's QK-norm (`backward="dy"` then undoes the norm and the rotation
with `ropelib.qk_norm_rope`'s backward): the prologues, dY written, and cuBLAS then
`qk_norm_rope`, from table-free angles; dY written and the unfused pipeline also from an angle
table (`ropelib.rope_freqs`, whose pairs the forward finds equal: two tiles of the rows).

Each provider's outputs and gradients are compared with the unfused pipeline's first (as the
benchmark does), then timed forward+backward with `triton.testing.do_bench`.

    python benchmarks/qkv_dy_probe.py [--qk-norm] [--rounds 7 --out CSV] [--order fixed]  # GPU
    TRITON_INTERPRET=1 python benchmarks/qkv_dy_probe.py --dry-run   # CPU: checks, tiny shapes
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qkv_rope_bench as bench  # noqa: E402  (it puts the checkout on sys.path)

import ropelib  # noqa: E402
from ropelib import qkv_linear, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402


class _DYTriton(torch.autograd.Function):
    """qkv_rope_linear's forward; a backward that writes dY (qkv_linear.written_dy), then runs
    ropelib's dX and dW kernels without their rotation."""

    @staticmethod
    def forward(ctx, x, weight, angles, HQ, HK, D):
        with torch.no_grad():
            q, k, v = ropelib.qkv_rope_linear(x, weight, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                              angles=angles)
        ctx.save_for_backward(x, weight)
        ctx.angles, ctx.heads = angles, (HQ, HK, D)
        return q, k, v

    @staticmethod
    def backward(ctx, gq, gk, gv):
        x, weight = ctx.saved_tensors
        a = ctx.angles
        dy = qkv_linear.written_dy(gq, gk, gv, x, a.turns, a.amplitude, None, None, False)
        HQ, HK, D = ctx.heads
        B, S, _ = x.shape
        with torch.enable_grad():
            xs, ws = x.detach().requires_grad_(), weight.detach().requires_grad_()
            outs = bench._TritonGemm.apply(xs, ws, a.turns, a.amplitude, HQ, HK, D)
            grads = [t.view(B, S, -1, D) for t in dy.split([HQ * D, HK * D, HK * D], 1)]
            dx, dw = torch.autograd.grad(outs, (xs, ws), grads)
        return dx, dw, None, None, None, None


def providers(HQ, HK, D, angles, freqs, norm: bool = False):
    """(name, fn(x, w, wq, wk) -> (q, k, v)), the unfused pipeline last; with `norm` the QK-norm
    case, from table-free angles and from an angle table, against the unfused pipeline with
    qk_norm_rope on each."""
    base = dict(bench.providers(HQ, HK, D, angles, norm=norm))

    def fused(backward, **table):
        table = table or dict(angles=angles)
        return lambda x, w, wq, wk: ropelib.qkv_rope_linear(
            x, w, n_heads=HQ, n_kv_heads=HK, head_dim=D, q_norm_weight=wq if norm else None,
            k_norm_weight=wk if norm else None, backward=backward, **table)
    if norm:
        def unfused_table(x, w, wq, wk):
            q, k, v = bench.split_heads(torch.nn.functional.linear(x, w), HQ, HK, D)
            return ropelib.qk_norm_rope(q, k, wq, wk, freqs, eps=bench.EPS, layout="bshd") + (v,)
        return [("fused, prologues, QK-norm", fused("prologue")),
                ("fused, dY written, QK-norm", fused("dy")),
                ("fused, dY written, QK-norm, table", fused("dy", freqs=freqs)),
                ("unfused, QK-norm, table", unfused_table),
                ("unfused, QK-norm", base["unfused"])]
    return [("fused, prologues", fused("prologue")),
            ("fused, dY written, cuBLAS", fused("dy")),
            ("fused, dY written, Triton",
             lambda x, w, wq, wk: _DYTriton.apply(x, w, angles, HQ, HK, D)),
            ("unfused", base["unfused"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, checks only (CPU)")
    ap.add_argument("--qk-norm", action="store_true",
                    help="the QK-norm case instead")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every provider once a round, this many rounds: a provider's ms "
                         "is its median, its ratio the median of the rounds' unfused ms / ms")
    compare.add_round_order_arguments(ap)
    ap.add_argument("--out", default=None, help="CSV of the rounds' medians (GPU)")
    a = ap.parse_args(argv)
    compare.use_round_order(a)          # (round_order's default, and the CSV's header)
    device = runtime.default_device()
    if not a.dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    sizes = [(16, 32, 2, 1, 16)] if a.dry_run else [(8192, 4096, 32, 8, 128),
                                                    (32768, 4096, 32, 8, 128)]
    print(f"{'tokens':>7} {'provider':34} {'fwd+bwd ms':>11} {'max rel diff':>13}"
          + ("   of the unfused speed (rounds)" if a.rounds > 1 else ""))
    rows = []
    for tokens, hidden, HQ, HK, D in sizes:
        angles = ropelib.rope_angles(D, base=500000.0, device=device)
        freqs = ropelib.rope_freqs(tokens, D, base=500000.0, device=device)
        args, grads = bench.inputs(tokens, hidden, HQ, HK, D, device)
        provs = providers(HQ, HK, D, angles, freqs, a.qk_norm)
        ref = bench._run_once(provs[-1][1], args, grads, True, a.qk_norm)   # the unfused one
        rels, steps = {}, {}
        for name, fn in provs:
            got = bench._run_once(fn, args, grads, True, a.qk_norm)
            rels[name] = bench._max_rel_diff(got, ref)
            assert rels[name] <= 2.0**-5, \
                f"{name} differs from the unfused pipeline ({rels[name]:.3g})"
            leaves = bench._leaves(args, True, a.qk_norm)

            def step(fn=fn, leaves=leaves):
                torch.autograd.backward(fn(*leaves), grads)
            steps[name] = (step, [t for t in leaves if t.requires_grad])
        import triton.testing

        def time_one(name):
            step, wanted = steps[name]
            return triton.testing.do_bench(step, grad_to_none=wanted)
        times = compare.times_in_rounds(steps, 0 if a.dry_run else a.rounds, time_one)
        unfused = provs[-1][0]
        for name in steps:
            ms = statistics.median(times[name]) if times[name] else float("nan")
            ratios = [u / t for u, t in zip(times[unfused], times[name])]
            rows.append(dict(tokens=tokens, qk_norm=a.qk_norm, provider=name, ms=ms,
                             unfused_ms_over_ms=statistics.median(ratios) if ratios else None,
                             low=min(ratios, default=None), high=max(ratios, default=None),
                             rounds=len(ratios), max_rel_diff=rels[name]))
            spread = (f"   {rows[-1]['unfused_ms_over_ms']:.3f} ({min(ratios):.3f}-"
                      f"{max(ratios):.3f})" if len(ratios) > 1 else "")
            print(f"{tokens:>7} {name:34} {ms:11.3f} {rels[name]:13.2e}{spread}", flush=True)
    if a.out:
        compare.write_csv(rows, a.out, compare.environment_meta(),
                          fields=["tokens", "qk_norm", "provider", "ms", "unfused_ms_over_ms",
                                  "low", "high", "rounds", "max_rel_diff"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
