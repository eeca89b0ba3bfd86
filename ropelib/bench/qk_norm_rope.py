"""Fused per-head QK-RMSNorm + RoPE measured: ropelib's kernel against the same math in PyTorch,
eagerly and under torch.compile.

The case is a Qwen3-sized attention block: q [8, 4096, 32, 128] and k [8, 4096, 8, 128] in bf16
(bshd), with learned weights w_q, w_k [128] (fp32) and a cos/sin table [4096, 128] (fp32). Four
providers compute rope(rmsnorm(x) * w) for q and for k, each with statistics and math in fp32
and one rounding to bf16:

* ropelib: `ropelib.qk_norm_rope` on the cos/sin table, one launch forward, one backward;
* ropelib_angles: the same with no table (`angles=ropelib.rope_angles(128)`, the angles
  computed in the kernel from the positions);
* torch_compile: `norm_rope_torch` under `torch.compile` (Inductor on a GPU, aot_eager in the
  interpreter);
* eager: `norm_rope_torch`, eagerly.

`measure` returns one row per (provider, pass): "fwd", and "fwd+bwd" (gradients of q, k, w_q,
w_k). Every provider's outputs (and gradients) are checked against an fp64 reference before it
is timed; `timed=True` times through `ropelib.bench.compare.time_ms` (do_bench medians in ms on
a GPU, meaningless wall clock in the interpreter). GB/s uses one bytes model for every provider:
forward reads q, k and writes q', k'; the backward reads q, k, gq', gk' and writes gq, gk (table
and weights are counted once). `with_copy=True` adds "copy" rows, a device copy of q and k (two
for forward+backward) on the same tensors, and `fraction_of_copy` on every row.
"""
from functools import lru_cache

import torch

import ropelib
from .. import runtime
from ..reference import rotate_half
from . import compare

FIELDS = ["case", "provider", "pass", "dtype", "layout", "B", "S", "HQ", "HK", "D", "ms", "p20",
          "p80", "gbps", "speedup_vs_eager", "max_abs_err", "available", "reason"]
EPS = 1e-6
SHAPE = dict(B=8, S=4096, HQ=32, HK=8, D=128)
TINY_SHAPE = dict(B=2, S=8, HQ=4, HK=2, D=16)
PASSES = ("fwd", "fwd+bwd")
# bf16 outputs and gradients: a few ulps at values of a few units
MAX_ABS_ERR = 5e-2


def norm_rope_torch(q, k, w_q, w_k, cos, sin):
    """Plain PyTorch: per-head RMSNorm (fp32) scaled by w, then RoPE (fp32), one rounding.
    q, k [B, S, H, D]; cos, sin [S, D] fp32."""
    c, s = cos[:, None, :], sin[:, None, :]     # [S, 1, D]: broadcast over batch and heads

    def one(x, w):
        x = x.float()
        u = x * (x.pow(2).mean(-1, keepdim=True) + EPS).rsqrt() * w.float()
        return (u * c + rotate_half(u) * s).to(q.dtype)
    return one(q, w_q), one(k, w_k)


def norm_rope_ropelib(q, k, w_q, w_k, cos, sin):
    return ropelib.qk_norm_rope(q, k, w_q, w_k, cos=cos, sin=sin, eps=EPS, layout="bshd")


def norm_rope_ropelib_angles(q, k, w_q, w_k, cos, sin):
    """ropelib with no table: the same angles computed in the kernel from the positions."""
    return ropelib.qk_norm_rope(q, k, w_q, w_k, eps=EPS, layout="bshd",
                                angles=_angles(q.shape[-1], str(q.device)))


@lru_cache(maxsize=None)
def _angles(D: int, device: str) -> "ropelib.frequencies.Angles":
    return ropelib.rope_angles(D, device=device)


def inputs(B, S, HQ, HK, D, dtype, device, seed=0):
    """((q, k, w_q, w_k, cos, sin), (gq, gk)): fresh inputs and output gradients."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, S, HQ, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(B, S, HK, D, generator=g).to(device=device, dtype=dtype)
    w_q = (1 + 0.3 * torch.randn(D, generator=g)).to(device)
    w_k = (1 + 0.3 * torch.randn(D, generator=g)).to(device)
    gq = torch.randn(B, S, HQ, D, generator=g).to(device=device, dtype=dtype)
    gk = torch.randn(B, S, HK, D, generator=g).to(device=device, dtype=dtype)
    cos, sin = ropelib.rope_cos_sin(S, D, device=device)
    return (q, k, w_q, w_k, cos, sin), (gq, gk)


def reference(args, grads, exact_angles: bool = False):
    """fp64 outputs and gradients of q, k, w_q, w_k (from the same inputs). exact_angles: on
    the angles of ropelib.rope_angles, exact in fp64 here, instead of the fp32 cos/sin table
    (whose angles were rounded to fp32 before their cos and sin: at position 4095 that moves
    an angle by up to 2.4e-4, more than the bf16 outputs' rounding once the weights'
    gradients sum over every row)."""
    if exact_angles:
        S, D = args[4].shape
        theta = torch.outer(torch.arange(S, dtype=torch.float64, device=args[0].device),
                            _angles(D, str(args[0].device)).inv_freq.to(args[0].device))
        theta = torch.cat([theta, theta], -1)
        args = args[:4] + (theta.cos(), theta.sin())
    q, k, w_q, w_k, cos, sin = (a.double() for a in args)
    leaves = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    c, s = cos[:, None, :], sin[:, None, :]

    def one(x, w):
        u = x * (x.pow(2).mean(-1, keepdim=True) + EPS).rsqrt() * w
        return u * c + rotate_half(u) * s
    outs = (one(q, w_q), one(k, w_k))
    return outs, torch.autograd.grad(outs, leaves, [g.double() for g in grads])


def max_abs_err(got, want) -> float:
    return max(float((a.detach().double() - b.detach()).abs().max()) for a, b in zip(got, want))


def _leaves(args, backward):
    """The inputs as leaves; q, k and the weights require grad for the backward pass."""
    return [a.detach().requires_grad_(i < 4 and backward) for i, a in enumerate(args)]


def _run_once(fn, args, grads, backward):
    leaves = _leaves(args, backward)
    out = fn(*leaves)
    if not backward:
        return out
    return out + torch.autograd.grad(out, leaves[:4], grads)


def bytes_moved(B, S, HQ, HK, D, elem, backward) -> int:
    x = B * S * (HQ + HK) * D * elem
    extras = 2 * S * D * 4 + 2 * D * 4       # cos, sin, w_q, w_k read once
    return 2 * x + extras + (3 * x + 2 * D * 4 if backward else 0)


def providers(backend: str):
    """(name, fn) of ropelib, compiled PyTorch (`backend`: Inductor or aot_eager) and eager."""
    return [("ropelib", norm_rope_ropelib), ("ropelib_angles", norm_rope_ropelib_angles),
            ("torch_compile", torch.compile(norm_rope_torch, backend=backend, fullgraph=True)),
            ("eager", norm_rope_torch)]


def measure(*, tiny: bool, timed: bool, device, with_copy: bool = False, **shape) -> list:
    """Rows of every provider, forward and forward+backward (see the module docstring);
    `shape` overrides B, S, HQ, HK, D of SHAPE (or TINY_SHAPE when `tiny`)."""
    dims = dict(TINY_SHAPE if tiny else SHAPE, **shape)
    B, S, HQ, HK, D = (dims[n] for n in ("B", "S", "HQ", "HK", "D"))
    args, grads = inputs(B, S, HQ, HK, D, torch.bfloat16, device)
    refs = {exact: reference(args, grads, exact) for exact in (False, True)}
    case = "tiny" if tiny else f"b{B}-s{S}-h{HQ}/{HK}-d{D}"
    backend = "inductor" if timed and torch.device(device).type == "cuda" else "aot_eager"
    base = dict(case=case, dtype="bfloat16", layout="bshd", B=B, S=S, HQ=HQ, HK=HK, D=D,
                available=True, reason="")
    rows, steps = [], {}
    for name, fn in providers(backend):
        for backward in (False, True):
            row = dict(base, provider=name, **{"pass": PASSES[backward]})
            rows.append(row)
            try:
                got = _run_once(fn, args, grads, backward)
            except Exception as exc:  # noqa: BLE001 -- recorded in the CSV, never hidden
                row.update(available=False, reason=f"{type(exc).__name__}: {exc}"[:200])
                continue
            ref_out, ref_grads = refs[name.endswith("_angles")]
            row["max_abs_err"] = max_abs_err(got, ref_out + (ref_grads if backward else ()))
            if not row["max_abs_err"] <= MAX_ABS_ERR:       # NaN fails too
                row.update(available=False, reason="differs from the fp64 reference")
                continue
            steps[len(rows) - 1] = _step(fn, args, grads, backward)
    if with_copy:
        copy_once, copy_twice = compare.copy_floor(args[:2])
        for backward, fn in ((False, copy_once), (True, copy_twice)):
            rows.append(dict(base, provider="copy", **{"pass": PASSES[backward]}))
            steps[len(rows) - 1] = fn
    # every provider and the copy in turn, round after round: eager forward+backward at this
    # size costs the host about what it costs the GPU
    for i in compare.time_rows_in_rounds(rows, steps, device) if timed else ():
        r = rows[i]
        if r["provider"] != "copy":
            backward = r["pass"] == PASSES[True]
            r["gbps"] = bytes_moved(B, S, HQ, HK, D, 2, backward) / r["ms"] / 1e6
    _relative_columns(rows)
    return rows


def _step(fn, args, grads, backward):
    """fn's forward, or its forward+backward with the gradients of q, k and the two norm
    weights handed back (compare.fwdbwd_step), as a step to time."""
    leaves = _leaves(args, backward)
    if backward:
        return compare.fwdbwd_step(lambda: fn(*leaves), leaves[:4], grads)
    return lambda: fn(*leaves)


def _relative_columns(rows) -> None:
    """speedup_vs_eager and (with copy rows) fraction_of_copy, per pass."""
    def timed_row(provider, pass_):
        return next((e for e in rows if e["provider"] == provider and e["pass"] == pass_
                     and e.get("ms")), None)
    for r in rows:
        if not r.get("ms"):
            continue
        eager, copy = timed_row("eager", r["pass"]), timed_row("copy", r["pass"])
        if eager:
            r["speedup_vs_eager"] = eager["ms"] / r["ms"]
        if copy:
            r["fraction_of_copy"] = copy["ms"] / r["ms"]


def run(dry_run: bool, B=8, S=4096, HQ=32, HK=8, D=128) -> list:
    """The rows of the script: timed on a GPU, tiny shapes checked only in a dry run."""
    device = runtime.default_device()
    if not dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    shape = {} if dry_run else dict(B=B, S=S, HQ=HQ, HK=HK, D=D)
    return measure(tiny=dry_run, timed=not dry_run, device=device, **shape)


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
        err = f"{r['max_abs_err']:9.2e}" if r.get("max_abs_err") is not None else f"{'-':>9}"
        out.append(f"{r['provider']:<14} {r['pass']:<8} {ms} {gb} {sp} {err}")
    return "\n".join(out)


def write(rows, path, script: str) -> str:
    """The rows as a CSV with the environment header (GPU, versions, date)."""
    meta = compare.environment_meta()
    meta["script"] = script
    meta["bytes_model"] = ("fwd: q, k read + q', k' written; bwd adds q, k, gq', gk' read + "
                           "gq, gk written; cos/sin and weights once")
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if runtime.on_gpu() else \
        "none (dry run: outputs checked only)"
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)
