"""Fused per-head QK-RMSNorm + RoPE: ropelib's kernel against the same math in PyTorch.

    python benchmarks/qk_norm_bench.py --out benchmarks/results/qk_norm.csv   # on a GPU
    TRITON_INTERPRET=1 python benchmarks/qk_norm_bench.py --dry-run            # CPU: tiny shapes

The case is a Qwen3-sized attention block: q [8, 4096, 32, 128] and k [8, 4096, 8, 128] in bf16
(bshd), with learned weights w_q, w_k [128] (fp32) and a cos/sin table [4096, 128] (fp32). Three
providers compute rope(rmsnorm(x) * w) for q and for k, each with statistics and math in fp32
and one rounding to bf16:

* ropelib: `ropelib.qk_norm_rope`, one launch forward, one backward;
* torch_compile: the plain PyTorch below under `torch.compile` (default Inductor);
* eager: the same PyTorch, eagerly.

Two passes are timed: the forward, and forward + backward (gradients of q, k, w_q, w_k). Every
provider's outputs (and gradients) are checked against an fp64 reference before it is timed.
Timings are `triton.testing.do_bench` medians (20 %/80 % quantiles alongside) in ms; GB/s uses
one bytes model for every provider: forward reads q, k and writes q', k'; the backward reads q,
k, gq', gk' and writes gq, gk (table and weights are counted once). The CSV starts with
`# key: value` lines (GPU, versions, date) that ropelib.bench.compare.read_meta reads back. `--dry-run`
runs tiny shapes through Triton's interpreter (torch.compile with the aot_eager backend, since
Inductor's code needs a GPU there) and checks the outputs; it times nothing.
"""
import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's @triton.jit runs

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import ropelib  # noqa: E402
from ropelib import runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.reference import rotate_half  # noqa: E402

FIELDS = ["case", "provider", "pass", "dtype", "layout", "B", "S", "HQ", "HK", "D", "ms", "p20",
          "p80", "gbps", "speedup_vs_eager", "max_abs_err", "available", "reason"]
EPS = 1e-6


def norm_rope_torch(q, k, w_q, w_k, cos, sin):
    """Plain PyTorch: per-head RMSNorm (fp32) scaled by w, then RoPE (fp32), one rounding.
    q, k [B, S, H, D]; cos, sin [S, D] fp32."""
    c, s = cos[:, None, :], sin[:, None, :]     # [S, 1, D]: broadcast over batch and heads

    def one(x, w):
        x = x.float()
        u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
        return (u * c + rotate_half(u) * s).to(q.dtype)
    return one(q, w_q), one(k, w_k)


def norm_rope_ropelib(q, k, w_q, w_k, cos, sin):
    return ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, eps=EPS, layout="bshd")


def inputs(B, S, HQ, HK, D, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, S, HQ, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(B, S, HK, D, generator=g).to(device=device, dtype=dtype)
    w_q = (1 + 0.3 * torch.randn(D, generator=g)).to(device)
    w_k = (1 + 0.3 * torch.randn(D, generator=g)).to(device)
    gq = torch.randn(B, S, HQ, D, generator=g).to(device=device, dtype=dtype)
    gk = torch.randn(B, S, HK, D, generator=g).to(device=device, dtype=dtype)
    cos, sin = ropelib.rope_cos_sin(S, D, device=device)
    return (q, k, w_q, w_k, cos, sin), (gq, gk)


def _reference(args, grads):
    """fp64 outputs and gradients of q, k, w_q, w_k (from the same inputs)."""
    q, k, w_q, w_k, cos, sin = (a.double() for a in args)
    leaves = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    c, s = cos[:, None, :], sin[:, None, :]

    def one(x, w):
        u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
        return u * c + rotate_half(u) * s
    outs = (one(q, w_q), one(k, w_k))
    return outs, torch.autograd.grad(outs, leaves, [g.double() for g in grads])


def _max_err(got, want) -> float:
    return max(float((a.detach().double() - b.detach()).abs().max()) for a, b in zip(got, want))


def _run_once(fn, args, grads, backward):
    leaves = [a.detach().requires_grad_(i < 4 and backward) for i, a in enumerate(args)]
    out = fn(*leaves)
    if not backward:
        return out
    return out + torch.autograd.grad(out, leaves[:4], grads)


def bytes_moved(B, S, HQ, HK, D, elem, backward) -> int:
    x = B * S * (HQ + HK) * D * elem
    extras = 2 * S * D * 4 + 2 * D * 4       # cos, sin, w_q, w_k read once
    return 2 * x + extras + (3 * x + 2 * D * 4 if backward else 0)


def providers(dry_run: bool):
    backend = "aot_eager" if dry_run else "inductor"
    return [("ropelib", norm_rope_ropelib),
            ("torch_compile", torch.compile(norm_rope_torch, backend=backend, fullgraph=True)),
            ("eager", norm_rope_torch)]


def run(dry_run: bool, B=8, S=4096, HQ=32, HK=8, D=128) -> list:
    device = runtime.default_device()
    if dry_run:
        B, S, HQ, HK, D = 2, 8, 4, 2, 16
    elif device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    dtype = torch.bfloat16
    args, grads = inputs(B, S, HQ, HK, D, dtype, device)
    ref_out, ref_grads = _reference(args, grads)
    case = "dry-run" if dry_run else f"b{B}-s{S}-h{HQ}/{HK}-d{D}"
    rows = []
    for name, fn in providers(dry_run):
        for backward in (False, True):
            row = dict(case=case, provider=name, dtype="bfloat16", layout="bshd", B=B, S=S,
                       HQ=HQ, HK=HK, D=D, available=True, reason="",
                       **{"pass": "fwd+bwd" if backward else "fwd"})
            rows.append(row)
            try:
                got = _run_once(fn, args, grads, backward)
            except Exception as exc:  # noqa: BLE001 -- recorded in the CSV, never hidden
                row.update(available=False, reason=f"{type(exc).__name__}: {exc}"[:200])
                continue
            want = ref_out + (ref_grads if backward else ())
            row["max_abs_err"] = _max_err(got, want)
            # bf16 outputs and gradients: a few ulps at values of a few units
            if row["max_abs_err"] > 5e-2:
                row.update(available=False, reason="differs from the fp64 reference")
                continue
            if dry_run:
                continue
            import triton.testing
            leaves = [a.detach().requires_grad_(i < 4 and backward) for i, a in enumerate(args)]
            if backward:
                def step():
                    torch.autograd.backward(fn(*leaves), grads)
            else:
                def step():
                    fn(*leaves)
            ms, p20, p80 = triton.testing.do_bench(
                step, quantiles=[0.5, 0.2, 0.8], grad_to_none=leaves[:4] if backward else None)
            row.update(ms=ms, p20=p20, p80=p80,
                       gbps=bytes_moved(B, S, HQ, HK, D, 2, backward) / ms / 1e6)
    for r in rows:
        base = next((e for e in rows if e["provider"] == "eager" and e["pass"] == r["pass"]
                     and e.get("ms")), None)
        if r.get("ms") and base:
            r["speedup_vs_eager"] = base["ms"] / r["ms"]
    return rows


def table(rows) -> str:
    head = f"{'provider':<14} {'pass':<8} {'ms':>9} {'GB/s':>8} {'vs eager':>9} {'max err':>9}"
    out = [f"case {rows[0]['case']} (bf16, bshd)", head, "-" * len(head)]
    for r in rows:
        if not r["available"]:
            out.append(f"{r['provider']:<14} {r['pass']:<8} unavailable: {r['reason']}")
            continue
        ms = f"{r['ms']:9.3f}" if r.get("ms") else f"{'-':>9}"
        gb = f"{r['gbps']:8.0f}" if r.get("gbps") else f"{'-':>8}"
        sp = f"{r['speedup_vs_eager']:8.2f}x" if r.get("speedup_vs_eager") else f"{'-':>9}"
        out.append(f"{r['provider']:<14} {r['pass']:<8} {ms} {gb} {sp} {r['max_abs_err']:9.2e}")
    return "\n".join(out)


def write(rows, path) -> str:
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/qk_norm_bench.py"
    meta["bytes_model"] = ("fwd: q, k read + q', k' written; bwd adds q, k, gq', gk' read + "
                           "gq, gk written; cos/sin and weights once")
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if runtime.on_gpu() else \
        "none (dry run: outputs checked only)"
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check outputs, time nothing")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    print(runtime.mode())
    rows = run(args.dry_run, B=args.batch, S=args.seq)
    print(table(rows))
    if args.out is not None:
        print("wrote", write(rows, args.out))
    failed = [f"{r['provider']}/{r['pass']}" for r in rows if not r["available"]]
    if failed:
        print("failed or differ from the reference:", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
