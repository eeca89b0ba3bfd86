"""Why apply_rope at 1 GiB bf16 measures below its own flat pass (GPU only).

In the 2026-11-29 H200 floor run apply_rope (sbhd s16384 b8 h32 d128, TE-style angles) ran at
0.905 of a copy, while a copy of its flat pass with the same machine code reached 0.993 in
paired_rows_probe.py; earlier, with the previous flat pass, one process timed the route forced
at 0.940 and the same route as planned at 0.897. This probe times, in one process and in
alternating rounds (so drift of clocks or of the memory system shows as a trend across rounds,
not as a difference between providers):

    copy            y.copy_(x)
    planned         ropelib.apply_rope(x, freqs)                 (the eager route, rows kept)
    forced          the same with the two-pass route forced      (bench.routes.forced)
    flat pass       the planned flat pass alone, on the kept rows, into one preallocated y
    probe copy      paired_rows_probe's kernel on the same rows  (pairs in one thread)
    torch.compile   Hugging Face's formula on a bf16 table

    python benchmarks/one_gib_probe.py --out DIR [--rounds 5]     # ~1 min on an H200

Writes one_gib_probe-<gpu>.csv: round, provider, ms, ratio_to_copy (the copy of that round).

What it found (H200, 2026-11-29, benchmarks/NOTES.md): the bare flat pass ran at 0.915 where
the probe's kernel ran at 0.992 on the same rows, so the kernel, not the route: compiled with
the GPU's Triton, its cos/sin addresses took four base registers and ptxas issued three table
loads late. With each row's pointer first, apply_rope ran at 0.986.

The probe's kernel reads both members' entries of every row, so this probe runs the route
without the pre-pass's flags per row (tiles.TWO_PASS_ROW_FLAGS = False: full rows written and
read, as when it was written); half_rows_probe.py times the flags.
"""
import argparse
import os
import sys

import torch
import triton

import ropelib
import ropelib.eager
from ropelib import ops
from ropelib.bench import compare, routes
from ropelib.kernels import launch, planning, tiles

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:            # the other benchmarks, however this file is loaded
    sys.path.insert(0, HERE)
import paired_rows_probe  # noqa: E402  (its kernel, timed beside apply_rope)


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("one_gib_probe.py times GPU kernels: run it on a machine with a GPU")
    os.makedirs(args.out, exist_ok=True)
    tiles.TWO_PASS_ROW_FLAGS = False        # full rows, which the probe's kernel reads
    S, B, H, D = 16384, 8, 32, 128
    x = torch.randn(S, B, H, D, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    freqs = compare.angles(S, D, interleaved=False, device="cuda")       # [S, 1, 1, D] fp32
    f = freqs[:, 0, 0, :]
    cos16, sin16 = torch.cos(f).to(torch.bfloat16), torch.sin(f).to(torch.bfloat16)
    tshape = (S, 1, 1, D)

    ropelib.eager.TABLE_ROWS.clear()
    want = ropelib.apply_rope(x, freqs)
    cos_rows, sin_rows, row_flags = next(reversed(ropelib.eager.TABLE_ROWS.entries.values()))[1][:3]
    view = ops.kernel_view(x, "sbhd")
    route, _ = launch.plan(view, ops.kernel_view(y, "sbhd"), launch.Table(f, None),
                           launch.Positions(), R=D, interleaved=False, backward=False,
                           layout="sbhd", rows_kept=True)
    assert isinstance(route, launch.TwoPass), "1 GiB with angles takes the two-pass route"
    flat = route.rotate_pass
    print("flat pass:", flat.grid, flat.num_warps, "warps,", flat.args, flush=True)

    def flat_alone():
        planning.start(flat.launcher, flat, (x, y, None, None, cos_rows, sin_rows, None,
                                             row_flags))

    flat_alone()
    assert torch.equal(y, want), "the flat pass alone differs from apply_rope"
    probe = paired_rows_probe
    grid = (triton.cdiv(S * B * H, 8),)

    def probe_copy():
        probe._pairs_rows[grid](x, y, cos_rows, sin_rows, S * B * H, S, B, H, D, LAYOUT=0,
                                PAIRED=0, ROWS=8, num_warps=2)

    probe_copy()
    assert torch.equal(y, want), "the probe's copy differs from apply_rope"
    comp = torch.compile(lambda t: compare.hf_rotate(t, cos16.view(tshape), sin16.view(tshape),
                                                     False))
    comp(x)

    def forced():
        with routes.forced("two-pass"):
            return ropelib.apply_rope(x, freqs)

    providers = {"copy": lambda: y.copy_(x), "planned": lambda: ropelib.apply_rope(x, freqs),
                 "forced": forced, "flat pass": flat_alone, "probe copy": probe_copy,
                 "torch.compile": lambda: comp(x)}
    rows = []
    for rnd in range(args.rounds):
        order = list(providers) if rnd % 2 == 0 else ["copy"] + list(providers)[:0:-1]
        times = {name: ms(providers[name]) for name in order}
        for name in providers:
            rows.append(dict(round=rnd, provider=name, ms=f"{times[name]:.5f}",
                             ratio_to_copy=f"{times['copy'] / times[name]:.4f}"))
        print(f"round {rnd}: " + ", ".join(f"{n} {times['copy'] / times[n]:.3f}"
                                          for n in providers), flush=True)
    path = compare.write_csv(rows, os.path.join(args.out,
                                                f"one_gib_probe-{compare.gpu_slug()}.csv"),
                             meta=compare.environment_meta(),
                             fields=["round", "provider", "ms", "ratio_to_copy"])
    print("wrote", path)


if __name__ == "__main__":
    main()
