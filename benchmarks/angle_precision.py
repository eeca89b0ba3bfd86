"""RoPE angle precision at long positions: ropelib's table-free angles against two tables.

    TRITON_INTERPRET=1 python benchmarks/angle_precision.py --out precision.csv --figure p.png
    python benchmarks/angle_precision.py --out benchmarks/results/angle_precision.csv \\
        --figure figures/angle-precision.png --time                         # on a GPU
    TRITON_INTERPRET=1 python benchmarks/angle_precision.py --dry-run     # CPU: tiny, checks only

A Llama-like head (D = 128, base 500000, no scaling). At positions from 1 K to 16 M
(log-spaced, a window of consecutive positions at each) three ways of getting the angles are
compared with the exact angle m theta_j (theta_j in float64, reduced modulo 2 pi exactly by
ropelib.frequencies.reduced_angles):

* ropelib_exact: `apply_rope(x, angles=rope_angles(...))`, angles computed in the kernel from
  the position (the angle is read back with ropelib.kernels.launch.exact_angles);
* fp32_angle_table: Transformer Engine's `freqs`, fp32 position * fp32 inv_freq;
* bf16_cos_sin: Hugging Face's cos/sin cache under bf16 autocast: fp32 angles as above, cos
  and sin rounded to bf16 (its angle is atan2(sin, cos) of the rounded values).

For each: the largest angle error (radians, and fp32 ulps of the exact reduced angle) over the
window and the R/2 frequencies, and the largest error of the rotated output (x ~ N(0, 1) in
fp32, output fp32) against the float64 rotation by the exact angles. `--time` (GPU only) also
times the table-free kernel against the table kernels on 256 MiB of bf16 (bshd with a batch
loop, and thd), each output checked against the fp32 PyTorch reference first; do_bench
medians in ms (p20, p80) and GB/s (x read once, written once). The CSV starts with
`# key: value` lines (GPU, versions, date); a table is printed last.
"""
import argparse
import math
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
from ropelib import frequencies as F  # noqa: E402
from ropelib.kernels import launch  # noqa: E402
from ropelib.reference import rope_reference  # noqa: E402

FIELDS = ["kind", "method", "position", "window", "angle_err_rad", "angle_ulps", "out_err",
          "case", "dtype", "shape", "ms", "p20", "p80", "gbps", "check_err"]
METHODS = ("ropelib_exact", "fp32_angle_table", "bf16_cos_sin")
HEAD_DIM, BASE = 128, 500000.0
EXACT_ULPS = 0.5 + 1e-6     # the table-free angle: one rounding of the exact value


def _ulp32(x: torch.Tensor) -> torch.Tensor:
    _, e = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), (e - 24).to(torch.int64)) \
        .clamp_min(2.0 ** -149)


def _wrap(d: torch.Tensor) -> torch.Tensor:
    """An angle difference brought into [-pi, pi)."""
    return torch.remainder(d + math.pi, 2 * math.pi) - math.pi


def positions_grid(per_decade: int, lo: int = 2 ** 10, hi: int = 2 ** 24) -> list:
    n = max(2, round(per_decade * math.log10(hi / lo)) + 1)
    return sorted({round(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)})


def precision(per_decade: int, window: int, heads: int, device: str, seed: int = 0) -> list:
    angles = F.rope_angles(HEAD_DIM, base=BASE, device=device)
    inv32 = F.inv_freq(HEAD_DIM, BASE)                 # TE's and HF's fp32 frequencies
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p0 in positions_grid(per_decade):
        pos = torch.arange(p0, p0 + window)                                        # [W]
        exact = F.reduced_angles(pos, angles.inv_freq.cpu())                       # [W, R/2]
        ang32 = pos[:, None].float() * inv32                                       # [W, R/2]
        c16, s16 = ang32.cos().bfloat16(), ang32.sin().bfloat16()
        got = {
            "ropelib_exact": launch.exact_angles(angles.turns, pos.to(device)).cpu().double(),
            "fp32_angle_table": ang32.double(),
            "bf16_cos_sin": torch.atan2(s16.double(), c16.double()),
        }
        x = torch.randn(window, 1, heads, HEAD_DIM, generator=g)                  # sbhd, fp32
        ref = rope_reference(x.double(), cos=torch.cat([exact.cos()] * 2, -1),
                             sin=torch.cat([exact.sin()] * 2, -1))
        xd, idx = x.to(device), torch.arange(window, device=device)[None, :]
        out = {
            "ropelib_exact": ropelib.apply_rope(xd, angles=angles, position_ids=pos[None, :]
                                                .to(device)),
            "fp32_angle_table": ropelib.apply_rope(xd, torch.cat([ang32] * 2, -1).to(device),
                                                   position_ids=idx),
            "bf16_cos_sin": ropelib.apply_rope(xd, cos=torch.cat([c16] * 2, -1).to(device),
                                               sin=torch.cat([s16] * 2, -1).to(device),
                                               position_ids=idx),
        }
        for m in METHODS:
            err = _wrap(got[m] - exact).abs()
            rows.append(dict(kind="precision", method=m, position=p0, window=window,
                             angle_err_rad=float(err.max()),
                             angle_ulps=float((err / _ulp32(exact)).max()),
                             out_err=float((out[m].cpu().double() - ref).abs().max())))
    return rows


def timing(device: str) -> list:
    """Table-free against the two tables on 256 MiB of bf16 (GPU)."""
    import triton.testing
    rows = []
    cases = [("bshd-b4-s8192-h32", dict(shape=(4, 8192, 32, HEAD_DIM), layout="bshd")),
             ("thd-t32768-h32", dict(shape=(32768, 32, HEAD_DIM), layout="thd"))]
    angles = F.rope_angles(HEAD_DIM, base=BASE, device=device)
    for case, spec in cases:
        x = torch.randn(*spec["shape"], device=device, dtype=torch.bfloat16)
        S = spec["shape"][1] if spec["layout"] == "bshd" else spec["shape"][0]
        kw = dict(layout=spec["layout"])
        if spec["layout"] == "thd":   # 8 packed sequences of S/8 tokens
            kw["cu_seqlens"] = torch.arange(0, S + 1, S // 8, device=device, dtype=torch.int32)
        freqs = ropelib.rope_freqs(S, HEAD_DIM, base=BASE, device=device)
        cos, sin = ropelib.rope_cos_sin(S, HEAD_DIM, base=BASE, device=device)
        calls = {
            "ropelib_exact": lambda: ropelib.apply_rope(x, angles=angles, **kw),
            "fp32_angle_table": lambda: ropelib.apply_rope(x, freqs, **kw),
            "fp32_cos_sin_table": lambda: ropelib.apply_rope(x, cos=cos, sin=sin, **kw),
        }
        want = rope_reference(x, cos=cos, sin=sin, compute_dtype=torch.float32, **kw)
        for m, call in calls.items():
            check = float((call().float() - want.float()).abs().max())
            row = dict(kind="timing", method=m, case=case, dtype="bfloat16",
                       shape="x".join(map(str, spec["shape"])), check_err=check)
            rows.append(row)
            if check > 0.07:     # bf16 output: a few ulps at values of a few units
                row["ms"] = None
                continue
            ms, p20, p80 = triton.testing.do_bench(call, quantiles=[0.5, 0.2, 0.8])
            row.update(ms=ms, p20=p20, p80=p80, gbps=2 * x.numel() * x.element_size() / ms / 1e6)
    return rows


def figure(rows, path, where: str = "") -> str:
    """Angle and output errors against the position, one line per method; `where`: the machine
    the rows were measured on, in the figure's title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m in METHODS:
        sel = [r for r in rows if r["kind"] == "precision" and r["method"] == m]
        p = [r["position"] for r in sel]
        axes[0].loglog(p, [max(r["angle_err_rad"], 1e-12) for r in sel], "o-", label=m)
        axes[1].loglog(p, [max(r["out_err"], 1e-12) for r in sel], "o-", label=m)
    axes[0].set(xlabel="position", ylabel="max angle error (rad)",
                title=f"angle vs exact (D={HEAD_DIM}, base={BASE:g})")
    axes[1].set(xlabel="position", ylabel="max |y - y_fp64|", title="rotated output, fp32 x")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    if where:
        fig.suptitle(f"measured on {where}", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def write(rows, path) -> str:
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/angle_precision.py"
    meta["config"] = f"head_dim={HEAD_DIM} base={BASE:g} no scaling; errors vs exact reduction"
    meta["timing"] = "triton.testing.do_bench median ms (p20, p80)" if any(
        r.get("ms") for r in rows) else "none (precision only)"
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)


def table(rows) -> str:
    out = []
    prec = [r for r in rows if r["kind"] == "precision"]
    if prec:
        head = f"{'position':>10} " + " ".join(f"{m:>26}" for m in METHODS)
        out += ["max angle error, rad (fp32 ulps of the exact angle) | max output error",
                head, "-" * len(head)]
        for p in sorted({r["position"] for r in prec}):
            cells = []
            for m in METHODS:
                r = next(e for e in prec if e["position"] == p and e["method"] == m)
                cells.append(f"{r['angle_err_rad']:8.1e} ({r['angle_ulps']:7.2g}) "
                             f"{r['out_err']:7.1e}")
            out.append(f"{p:>10} " + " ".join(f"{c:>26}" for c in cells))
    timed = [r for r in rows if r["kind"] == "timing"]
    if timed:
        out += ["", f"{'case':<20} {'method':<20} {'ms':>8} {'GB/s':>7} {'check':>8}"]
        for r in timed:
            ms = f"{r['ms']:8.3f}" if r.get("ms") else f"{'-':>8}"
            gb = f"{r['gbps']:7.0f}" if r.get("gbps") else f"{'-':>7}"
            out.append(f"{r['case']:<20} {r['method']:<20} {ms} {gb} {r['check_err']:8.1e}")
    return "\n".join(out)


def failures(rows) -> list:
    bad = []
    for r in rows:
        if r["kind"] == "precision" and r["method"] == "ropelib_exact":
            if r["angle_ulps"] > EXACT_ULPS or r["out_err"] > 1e-5:
                bad.append(f"ropelib_exact at {r['position']}: {r['angle_ulps']:.3g} ulps, "
                           f"output {r['out_err']:.2e}")
        if r["kind"] == "timing" and r.get("ms") is None:
            bad.append(f"{r['method']} on {r['case']} differs from the reference "
                       f"({r['check_err']:.2e})")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--figure", type=Path, default=None, help="PNG path")
    ap.add_argument("--per-decade", type=int, default=None,
                    help="positions per decade (default 3 in the interpreter, 12 on a GPU)")
    ap.add_argument("--window", type=int, default=None,
                    help="consecutive positions at each (default 8 interpreter, 256 GPU)")
    ap.add_argument("--time", action="store_true", help="also time the kernels (GPU only)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny: 2 positions per decade, window 4, one head; checks, no timing")
    args = ap.parse_args(argv)
    device = runtime.default_device()
    gpu = runtime.on_gpu()
    if args.time and (args.dry_run or not gpu):
        ap.error("--time needs a CUDA GPU with compiled kernels (and no --dry-run)")
    if args.dry_run:
        per_decade, window, heads = 2, 4, 1
    else:
        per_decade = args.per_decade or (12 if gpu else 3)
        window = args.window or (256 if gpu else 8)
        heads = 4 if gpu else 1
    print(runtime.mode())
    rows = precision(per_decade, window, heads, device)
    if args.time:
        rows += timing(device)
    if args.figure is not None:
        print("wrote", figure(rows, args.figure, where=runtime.mode()))
    if args.out is not None:
        print("wrote", write(rows, args.out))
    print(table(rows))
    bad = failures(rows)
    if bad:
        print("failed:", "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
