"""The QKV projection's backward with its gradient written once: what the prologues cost.

`ropelib.qkv_rope_linear`'s backward never writes the un-rotated gradient of the projection,
dY [M, N]: its dX and dW GEMMs re-form dY from the gradients of the rotated q, k (inverse
rotation) and v as they load their operand, dW once per column block of x. This probe times
the other way, against it, on the benchmark's case (Llama-3-8B's projection, bf16, table-free
angles, no QK-norm; benchmarks/qkv_rope_bench.py):

* fused: `ropelib.qkv_rope_linear`, forward and backward (the prologues);
* fused, dY written, cuBLAS: the same forward; the backward rotates the gradients of q and k
  back with ropelib's RoPE operator (`ropelib.ops.rope_qk`, backward=True), writes dY
  (torch.cat of q's, k's and v's gradients as [M, N]) and runs cuBLAS for dX = dY W and
  dW = dY^T x;
* fused, dY written, Triton: the same dY, then ropelib's dX and dW kernels without their
  rotation (qkv_rope_bench's triton_gemm backward): the prologues' cost at the same GEMMs;
* unfused: cuBLAS then `apply_rope_qk` (autograd through both), the baseline.

Each provider's outputs and gradients are compared with the unfused pipeline's first (as the
benchmark does), then timed forward+backward with `triton.testing.do_bench`.

    python benchmarks/qkv_dy_probe.py                      # GPU: prints a table
    TRITON_INTERPRET=1 python benchmarks/qkv_dy_probe.py --dry-run   # CPU: checks, tiny shapes
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qkv_rope_bench as bench  # noqa: E402  (it puts the checkout on sys.path)

import ropelib  # noqa: E402
from ropelib import runtime  # noqa: E402


def unrotated_dy(gq, gk, gv, angles):
    """dY [M, N]: the gradients of q and k rotated back (ropelib's RoPE, backward), then q's,
    k's and v's side by side, as the projection's rows."""
    dq, dk = ropelib.ops.rope_qk(gq.contiguous(), gk.contiguous(), angles.turns,
                                 angles.amplitude, None, None, None, "bshd", False, 1, 0, True,
                                 None)
    M = gq.shape[0] * gq.shape[1]
    return torch.cat([t.reshape(M, -1) for t in (dq, dk, gv.contiguous())], dim=1)


class _WrittenDY(torch.autograd.Function):
    """qkv_rope_linear's forward; a backward that writes dY, then its GEMMs (cuBLAS, or ropelib's
    dX/dW kernels without the rotation)."""

    @staticmethod
    def forward(ctx, x, weight, angles, HQ, HK, D, gemms):
        with torch.no_grad():
            q, k, v = ropelib.qkv_rope_linear(x, weight, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                              angles=angles)
        ctx.save_for_backward(x, weight)
        ctx.angles, ctx.heads, ctx.gemms = angles, (HQ, HK, D), gemms
        return q, k, v

    @staticmethod
    def backward(ctx, gq, gk, gv):
        x, weight = ctx.saved_tensors
        dy = unrotated_dy(gq, gk, gv, ctx.angles)
        if ctx.gemms == "cublas":
            dx = (dy @ weight).view_as(x)
            dw = dy.t() @ x.reshape(-1, x.shape[-1])
        else:
            HQ, HK, D = ctx.heads
            B, S, _ = x.shape
            with torch.enable_grad():
                xs, ws = x.detach().requires_grad_(), weight.detach().requires_grad_()
                outs = bench._TritonGemm.apply(xs, ws, ctx.angles.turns, ctx.angles.amplitude,
                                               HQ, HK, D)
                grads = [t.view(B, S, -1, D) for t in dy.split([HQ * D, HK * D, HK * D], 1)]
                dx, dw = torch.autograd.grad(outs, (xs, ws), grads)
        return dx, dw, None, None, None, None, None


def providers(HQ, HK, D, angles, freqs):
    base = dict(bench.providers(HQ, HK, D, angles, freqs, norm=False))
    return [("fused", base["fused"]),
            ("fused, dY written, cuBLAS",
             lambda x, w, wq, wk: _WrittenDY.apply(x, w, angles, HQ, HK, D, "cublas")),
            ("fused, dY written, Triton",
             lambda x, w, wq, wk: _WrittenDY.apply(x, w, angles, HQ, HK, D, "triton")),
            ("unfused", base["unfused"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, checks only (CPU)")
    a = ap.parse_args(argv)
    device = runtime.default_device()
    if not a.dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    sizes = [(16, 32, 2, 1, 16)] if a.dry_run else [(8192, 4096, 32, 8, 128),
                                                    (32768, 4096, 32, 8, 128)]
    print(f"{'tokens':>7} {'provider':28} {'fwd+bwd ms':>11} {'max rel diff':>13}")
    for tokens, hidden, HQ, HK, D in sizes:
        angles = ropelib.rope_angles(D, base=500000.0, device=device)
        freqs = ropelib.rope_freqs(tokens, D, base=500000.0, device=device)
        args, grads = bench.inputs(tokens, hidden, HQ, HK, D, device)
        provs = providers(HQ, HK, D, angles, freqs)
        ref = bench._run_once(dict(provs)["unfused"], args, grads, True, False)
        for name, fn in provs:
            got = bench._run_once(fn, args, grads, True, False)
            rel = bench._max_rel_diff(got, ref)
            assert rel <= 2.0**-5, f"{name} differs from the unfused pipeline ({rel:.3g})"
            ms = float("nan")
            if not a.dry_run:
                import triton.testing
                leaves = bench._leaves(args, True, False)

                def step(fn=fn, leaves=leaves):
                    torch.autograd.backward(fn(*leaves), grads)
                ms = triton.testing.do_bench(step, grad_to_none=leaves[:2])
            print(f"{tokens:>7} {name:28} {ms:11.3f} {rel:13.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
