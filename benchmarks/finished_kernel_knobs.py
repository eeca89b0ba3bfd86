"""Two knobs of the finished kernel, timed for the next choice of their values (GPU).

The finished kernel (kernels/fused.py, `_rope_heads`) has two constexpr globals that decide its
machine code by tile size, both set to what was measured so far:

- `X_FIRST_PAIRS` (512): tiles of at most this many pairs (decode's) load a batch entry's x
  before the table work it waits for (positions, cos/sin, sin/cos from angles). Larger tiles do
  not: x held through the sin/cos evaluation costs registers (the no-loop tile, one batch entry
  a program: 78 -> 124 a thread on sm_90). But a run with every tile loading x first timed the
  finished kernel on 8 x 4096 packed tokens at 0.943 of a copy against 0.827 before (with the
  pivot search in both; H200, 2026-11-29). Variant "x first, every tile": 1 << 30.
- `NO_HALVES_CHECK_PAIRS` (0): tiles of at most this many pairs evaluate sin/cos of both halves
  of a pair without first comparing their angles, a reduction over the tile with two or three
  block barriers (sm_90 SASS at decode: 856 -> 824 instructions, no shared memory). Variant
  "no halves check, decode tiles": 512.

Each variant runs in its own Python (the globals are read when a kernel compiles), variants
alternate, every case is timed beside a copy of its bytes, with the route forced to the
finished kernel (routes.forced) so that mid-size inputs do not take the two-pass route; decode
is timed under CUDA-graph replay, as a decode loop runs it.

    python benchmarks/finished_kernel_knobs.py --out DIR [--rounds 3]     # ~4 min on an H200

Writes finished_kernel_knobs-<gpu>.csv: round, variant, case, pass, ms, copy_ms, ratio_to_copy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

VARIANTS = {"as shipped": {},
            "x first, every tile": {"X_FIRST_PAIRS": 1 << 30},
            "no halves check, decode tiles": {"NO_HALVES_CHECK_PAIRS": 512}}
# name: (layout, S, B, H, D)
CASES = {"bf16 sbhd s4096 b1 (32 MiB)": ("sbhd", 4096, 1, 32, 128),
         "bf16 sbhd s8192 b2 (128 MiB)": ("sbhd", 8192, 2, 32, 128),
         "bf16 bshd s2048 b2 (32 MiB)": ("bshd", 2048, 2, 32, 128),
         "bf16 sbhd s1024 b8 (64 MiB)": ("sbhd", 1024, 8, 32, 128),
         "bf16 thd 8 x 1024 (64 MiB)": ("thd", 1024, 8, 32, 128),
         "bf16 sbhd s1 b64 decode": ("sbhd", 1, 64, 32, 128),
         "bf16 thd 64 x 1 decode": ("thd", 1, 64, 32, 128)}
TINY = {name: (layout, min(S, 8), min(B, 2), 2, 16) for name, (layout, S, B, H, D)
        in CASES.items()}


def _one_process(knobs: dict, tiny: bool) -> list:
    """Time every case with the knobs set, in this Python: rows of dicts."""
    import triton.language as tl
    from ropelib.kernels import fused
    for name, value in knobs.items():               # before any kernel compiles
        assert hasattr(fused, name), name
        setattr(fused, name, tl.constexpr(value))
    import torch
    import ropelib
    from ropelib.bench import compare, routes, suite
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for name, (layout, S, B, H, D) in (TINY if tiny else CASES).items():
        shape = {"sbhd": (S, B, H, D), "bshd": (B, S, H, D), "thd": (S * B, H, D)}[layout]
        x = torch.randn(shape, device=device, dtype=torch.bfloat16)
        xg = x.clone().requires_grad_(True)
        g = torch.randn_like(x)
        y = torch.empty_like(x)
        freqs = ropelib.rope_freqs(max(S, 16), D, device=device)
        kw = dict(layout=layout)
        if layout == "thd":
            kw["cu_seqlens"] = torch.arange(0, S * B + 1, S, device=device, dtype=torch.int32)
        want = compare.reference.rope_reference(x.double(), freqs, **kw)
        with routes.forced("finished"):
            got = ropelib.apply_rope(x, freqs, **kw)
            torch.testing.assert_close(got.double(), want, atol=1e-2, rtol=1e-2)
            if S == 1 and device == "cuda":     # decode: latency, as a decode loop replays it
                copy = suite.graph_replay_ms(lambda: y.copy_(x), 100)[0]
                fwd = suite.graph_replay_ms(lambda: ropelib.apply_rope(x, freqs, **kw), 100)[0]
                passes = (("forward under CUDA graphs", fwd, copy),)
            else:
                copy = compare.time_ms(lambda: y.copy_(x), device)[0]
                fwd = compare.time_ms(lambda: ropelib.apply_rope(x, freqs, **kw), device)[0]
                both = compare.time_ms(lambda: ropelib.apply_rope(xg, freqs, **kw).backward(g),
                                       device, grad_to_none=[xg])[0]
                passes = (("forward", fwd, copy), ("forward+backward", both, 2 * copy))
        for pass_, ms, base in passes:
            rows.append(dict(case=name, **{"pass": pass_}, ms=ms, copy_ms=base,
                             ratio_to_copy=base / ms))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="small shapes (the interpreter: "
                    "plumbing only, timings meaningless)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_one_process(json.loads(args.child), args.tiny)))
        return
    import torch
    from ropelib.bench import compare
    if not torch.cuda.is_available() and not args.tiny:
        raise SystemExit("finished_kernel_knobs.py times GPU kernels: run it on a GPU (or --tiny "
                         "in the interpreter, to check the plumbing)")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for rnd in range(args.rounds):
        order = list(VARIANTS) if rnd % 2 == 0 else list(VARIANTS)[::-1]
        for variant in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--child",
                   json.dumps(VARIANTS[variant])]
            cmd += ["--tiny"] if args.tiny else []
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            if done.returncode != 0:
                raise SystemExit(f"{variant}: {done.stderr[-3000:]}")
            for r in json.loads(done.stdout.strip().splitlines()[-1]):
                rows.append(dict(round=rnd, variant=variant, **r))
            print(f"round {rnd}, {variant}: done", flush=True)
    slug = compare.gpu_slug() if torch.cuda.is_available() else "interpreter"
    path = compare.write_csv(rows, os.path.join(args.out, f"finished_kernel_knobs-{slug}.csv"),
                             meta=compare.environment_meta(),
                             fields=["round", "variant", "case", "pass", "ms", "copy_ms",
                                     "ratio_to_copy"])
    print("wrote", path)
    print(f"\n{'case':32s} {'pass':26s}" + "".join(f"{v[:28]:>30s}" for v in VARIANTS))
    for case in (TINY if args.tiny else CASES):
        for pass_ in sorted({r["pass"] for r in rows if r["case"] == case}):
            med = [statistics.median(r["ratio_to_copy"] for r in rows if r["case"] == case
                                     and r["pass"] == pass_ and r["variant"] == v)
                   for v in VARIANTS]
            print(f"{case:32s} {pass_:26s}" + "".join(f"{m:30.3f}" for m in med))


if __name__ == "__main__":
    main()
