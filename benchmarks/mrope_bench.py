"""Multi-axis RoPE: ropelib's kernel against a copy of q and k, transformers' own code, and
torch.compile of it.

    python benchmarks/mrope_bench.py --out benchmarks/results/mrope.csv    # on a GPU
    TRITON_INTERPRET=1 python benchmarks/mrope_bench.py --dry-run           # CPU: tiny shapes

Three cases, bf16, q and k together at least 256 MiB:

* mrope: Qwen2-VL-7B's text attention, q [4, 8192, 28, 128], k [4, 8192, 4, 128] (bshd),
  mrope_section [16, 24, 24], positions [3, 4, 8192] (text, then an image grid, per batch);
* axial2d: Qwen2-VL's vision encoder, 2-D (row, column) RoPE over 65536 packed patches (thd),
  q and k [65536, 16, 80];
* axial3d: a video of 16 x 32 x 32 patches (bshd, batch 1, 32 heads, head dim 128), 3-D
  (time, row, column) axial RoPE with sections [22, 21, 21] pairs.

Providers:

* ropelib: `ropelib.apply_mrope_qk` from the positions (the kernel forms the angles);
* copy: `q.clone()` and `k.clone()`: the memory floor (the same bytes of q and k moved);
* hf_eager: transformers' code, eagerly: Qwen2VLRotaryEmbedding + apply_rotary_pos_emb (mrope),
  Qwen2VLVisionRotaryEmbedding + apply_rotary_pos_emb_vision (axial2d); for axial3d, which no
  transformers model here implements, the same plain PyTorch (angles gathered per pair, cos/sin,
  rotate_half);
* hf_compile: the same function under `torch.compile` (Inductor; aot_eager in --dry-run).

Two passes: the forward, and forward + backward (gradients of q and k). Each provider's outputs
(and gradients) are checked against an fp64 reference before it is timed (max_err:
max |got - ref| / (1 + |ref|), at most 2^-5). Timings are
`triton.testing.do_bench` medians (20 %/80 % quantiles alongside) in ms; GB/s uses one bytes
model for every provider: q and k read and written once per pass (positions and frequencies
are not counted). The CSV starts with `# key: value` lines (GPU, versions, date). `--dry-run`
runs tiny shapes in Triton's interpreter and checks the outputs; it times nothing.
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
from ropelib import mrope, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.reference import rotate_half  # noqa: E402

# case -> (layout, B, S, HQ, HK, D, section, style, base); dry run: tiny shapes of each
CASES = {
    "mrope": ("bshd", 4, 8192, 28, 4, 128, [16, 24, 24], "mrope", 1e6),
    "axial2d": ("thd", 1, 65536, 16, 16, 80, [20, 20], "axial", 1e4),
    "axial3d": ("bshd", 1, 16 * 32 * 32, 32, 32, 128, [22, 21, 21], "axial", 1e4),
}
DRY = {"mrope": (2, 12, 4, 2, 16, [2, 3, 3]), "axial2d": (1, 24, 2, 2, 16, [4, 4]),
       "axial3d": (1, 18, 2, 2, 24, [4, 4, 4])}
# max |got - ref| / (1 + |ref|): bf16 outputs are within a few ulps (2**-8 relative each);
# transformers rounds cos/sin and each product to bf16
TOL = 2**-5


def positions_for(case, B, S, device):
    """Positions [axes, B, S] (thd: [axes, S]) as the models build them."""
    if case == "mrope":     # text, an image grid, text again (Qwen2-VL's get_rope_index pattern)
        n_text = S // 4
        side = int((S - 2 * n_text) ** 0.5)
        image = mrope.grid_positions(1, side, side, start=n_text)
        rest = S - n_text - image.shape[1]
        after = torch.arange(rest) + int(image.max()) + 1
        pos = torch.cat([torch.arange(n_text).expand(3, n_text), image, after.expand(3, rest)], 1)
        return torch.stack([pos + b for b in range(B)], 1).to(device)
    if case == "axial2d":   # one square image of S patches (or a strip in the dry run)
        side = int(S ** 0.5)
        h, w = (side, S // side) if side * (S // side) == S else (1, S)
        return mrope.grid_positions(1, h, w, axes=2).to(device)
    t = 16 if S == 16 * 32 * 32 else 2
    hw = S // t
    h = int(hw ** 0.5)
    return mrope.grid_positions(t, h, hw // h).to(device)[:, None].expand(3, B, S)


def gathered_cos_sin(positions, freqs, dtype):
    """Plain PyTorch: cos/sin [B', S, R] (or [S, R] for 2-D positions) in `dtype`."""
    inv, axis, _ = freqs
    ang = positions[..., None].to(dtype) * inv.to(dtype)                # [A, ..., R/2]
    idx = axis.long().view(*([1] * positions.dim()), -1).expand(1, *ang.shape[1:])
    theta = ang.gather(0, idx)[0]
    emb = torch.cat((theta, theta), -1)
    return emb.cos(), emb.sin()


def torch_mrope(q, k, positions, freqs):
    """Plain PyTorch multi-axis RoPE in fp32 with one rounding (q, k in bshd or thd)."""
    cos, sin = gathered_cos_sin(positions, freqs, torch.float32)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)                     # broadcast over heads
    return tuple((x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype) for x in (q, k))


def hf_function(case, D, section, base, freqs, device):
    """transformers' implementation of the case, as a function of (q, k, positions), or the
    plain PyTorch one (axial3d), and a note saying which."""
    if case == "mrope":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
        cfg = Qwen2VLTextConfig(hidden_size=D * 4, num_attention_heads=4, rope_parameters=dict(
            rope_type="default", rope_theta=base, mrope_section=section))
        rotary = m.Qwen2VLRotaryEmbedding(cfg).to(device)

        def fn(q, k, positions):    # q, k [B, S, H, D]: transformers works on [B, H, S, D]
            cos, sin = rotary(q, positions)
            qe, ke = m.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return qe.transpose(1, 2), ke.transpose(1, 2)
        return fn, "transformers Qwen2VLRotaryEmbedding + apply_rotary_pos_emb"
    if case == "axial2d":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        rotary = m.Qwen2VLVisionRotaryEmbedding(
            Qwen2VLVisionConfig(embed_dim=D * 4, num_heads=4, rope_parameters=dict(
                rope_type="axial", rope_theta=base))).to(device)

        def fn(q, k, positions):    # q, k [T, H, D]; transformers takes positions [T, 2]
            cos, sin = rotary(q, positions.T)
            return m.apply_rotary_pos_emb_vision(q, k, cos, sin)
        return fn, "transformers Qwen2VLVisionRotaryEmbedding + apply_rotary_pos_emb_vision"
    return (lambda q, k, positions: torch_mrope(q, k, positions, freqs)), \
        "plain PyTorch (no transformers model has 3-D axial RoPE)"


def reference(q, k, positions, freqs, grads):
    """fp64 outputs and gradients of q and k."""
    qd, kd = (x.detach().double().requires_grad_() for x in (q, k))
    cos, sin = gathered_cos_sin(positions, freqs, torch.float64)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    outs = tuple(x * cos + rotate_half(x) * sin for x in (qd, kd))
    return outs, torch.autograd.grad(outs, (qd, kd), [g.double() for g in grads])


def _max_err(got, want) -> float:
    return max(float(((a.detach().double() - b.detach()).abs() / (1 + b.detach().abs())).max())
               for a, b in zip(got, want))


def run_case(case, dry_run: bool, device) -> list:
    layout, B, S, HQ, HK, D, section, style, base = CASES[case]
    if dry_run:
        B, S, HQ, HK, D, section = DRY[case]
    dtype = torch.bfloat16
    freqs = mrope.multi_axis_frequencies(D, section, base, style=style, device=device)
    positions = positions_for(case, B, S, device)
    shape = (lambda h: (S, h, D)) if layout == "thd" else (lambda h: (B, S, h, D))
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, gq, gk = (torch.randn(shape(h), generator=g).to(device=device, dtype=dtype)
                    for h in (HQ, HK, HQ, HK))
    ref_out, ref_grads = reference(q, k, positions, freqs, (gq, gk))
    hf_fn, hf_note = hf_function(case, D, section, base, freqs, device)
    backend = "aot_eager" if dry_run else "inductor"
    providers = [
        ("ropelib", lambda q, k, p: ropelib.apply_mrope_qk(q, k, p, freqs, layout=layout), ""),
        ("copy", lambda q, k, p: (q.clone(), k.clone()), "q.clone(), k.clone()"),
        ("hf_eager", hf_fn, hf_note),
        ("hf_compile", torch.compile(hf_fn, backend=backend, fullgraph=True), hf_note),
    ]
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    label = "dry-run" if dry_run else f"b{B}-s{S}-h{HQ}/{HK}-d{D}"
    rows = []
    for name, fn, note in providers:
        for backward in (False, True):
            row = dict(case=f"{case}-{label}", provider=name, dtype="bfloat16", layout=layout,
                       B=B, S=S, HQ=HQ, HK=HK, D=D, section="/".join(map(str, section)),
                       style=style, note=note, available=True, reason="",
                       **{"pass": "fwd+bwd" if backward else "fwd"})
            rows.append(row)
            leaves = [x.detach().requires_grad_(backward) for x in (q, k)]
            try:
                out = fn(*leaves, positions)
                got = out + (torch.autograd.grad(out, leaves, (gq, gk)) if backward else ())
            except Exception as exc:  # noqa: BLE001 -- recorded in the CSV, never hidden
                row.update(available=False, reason=f"{type(exc).__name__}: {exc}"[:200])
                continue
            if name == "copy":
                if not all(torch.equal(a, b) for a, b in zip(got, (q, k, gq, gk))):
                    row.update(available=False, reason="the copy differs from its input")
                    continue
            else:
                row["max_err"] = _max_err(got, ref_out + (ref_grads if backward else ()))
                if row["max_err"] > TOL:
                    row.update(available=False, reason="differs from the fp64 reference")
                    continue
            if dry_run:
                continue
            import triton.testing
            if backward:
                def step():
                    torch.autograd.backward(fn(*leaves, positions), (gq, gk))
            else:
                def step():
                    fn(*leaves, positions)
            ms, p20, p80 = triton.testing.do_bench(step, quantiles=[0.5, 0.2, 0.8],
                                                   grad_to_none=leaves if backward else None)
            row.update(ms=ms, p20=p20, p80=p80,
                       gbps=nbytes * (2 if backward else 1) / ms / 1e6)
    for r in rows:
        floor = next((e for e in rows if e["provider"] == "copy" and e["pass"] == r["pass"]
                      and e.get("ms")), None)
        if r.get("ms") and floor:
            r["fraction_of_copy"] = floor["ms"] / r["ms"]
    return rows


def run(dry_run: bool, cases=tuple(CASES)) -> list:
    device = runtime.default_device()
    if not dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    return [row for case in cases for row in run_case(case, dry_run, device)]


def table(rows) -> str:
    head = (f"{'case':<34} {'provider':<11} {'pass':<8} {'ms':>9} {'GB/s':>7} {'of copy':>8} "
            f"{'max err':>9}")
    out = [head, "-" * len(head)]
    for r in rows:
        lead = f"{r['case']:<34} {r['provider']:<11} {r['pass']:<8}"
        if not r["available"]:
            out.append(f"{lead} unavailable: {r['reason']}")
            continue
        ms = f"{r['ms']:9.3f}" if r.get("ms") else f"{'-':>9}"
        gb = f"{r['gbps']:7.0f}" if r.get("gbps") else f"{'-':>7}"
        frac = f"{r['fraction_of_copy']:8.2f}" if r.get("fraction_of_copy") else f"{'-':>8}"
        err = f"{r['max_err']:9.2e}" if r.get("max_err") is not None else f"{'-':>9}"
        out.append(f"{lead} {ms} {gb} {frac} {err}")
    return "\n".join(out)


def write(rows, path) -> str:
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/mrope_bench.py"
    meta["bytes_model"] = "q and k read + written once per pass (positions, freqs not counted)"
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if runtime.on_gpu() else \
        "none (dry run: outputs checked only)"
    return compare.write_csv(rows, str(path), meta=meta)


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check outputs, time nothing")
    ap.add_argument("--case", choices=tuple(CASES), action="append",
                    help="run only this case (repeatable; default: all)")
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    print(runtime.mode())
    rows = run(args.dry_run, tuple(args.case or CASES))
    if args.out is not None:
        print("wrote", write(rows, args.out))
    print(table(rows))
    return rows


if __name__ == "__main__":
    result = main()
    failed = [f"{r['case']}/{r['provider']}/{r['pass']}" for r in result if not r["available"]]
    if failed:
        print("failed or differ from the reference:", ", ".join(failed))
    sys.exit(1 if failed else 0)
