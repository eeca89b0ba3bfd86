"""Which tiles serve the multi-axis, fused QK-norm and table-free kernels best on this GPU: each
candidate timed against a device copy of the same bytes (a GPU is needed).

    python benchmarks/feature_tiles.py                 # every kernel, ~3 minutes
    python benchmarks/feature_tiles.py --only mrope    # one of: mrope, qk_norm, exact

* mrope: the three cases of benchmarks/mrope_bench.py (Qwen2-VL text attention with per-batch
  positions, 2-D axial vision patches packed thd, 3-D axial video): the forward launch of
  ropelib.kernels.mrope for every (BLOCK_S, heads per step, num_warps); the backward is the
  same kernel with sin negated.
* qk_norm: the case of benchmarks/qk_norm_bench.py (q [8, 4096, 32, 128], k with 8 heads, bf16),
  forward and backward launches of ropelib.kernels.qk_norm_rope for every (BLOCK_S, BLOCK_H,
  num_warps) candidate.
* exact: table-free angles against the cos/sin table on the two cases of
  benchmarks/angle_precision.py --time and on 1 GiB (bshd, batch 16), for every (elements per
  thread, warps) tile knob.

Times are triton.testing.do_bench medians; "of copy" is the copy's time over the kernel's, the
copy moving the bytes the kernel must move (q and k read and written; the QK-norm backward also
reads the output gradients). The picked tiles (what ropelib launches) are marked with *.
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import triton.testing

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import ropelib  # noqa: E402
from ropelib import frequencies as F  # noqa: E402
from ropelib import mrope  # noqa: E402
from ropelib.kernels import launch as L  # noqa: E402
from ropelib.kernels.tiles import BATCH_LOOP_MIN, device_tiles  # noqa: E402
from ropelib.kernels import mrope as MK  # noqa: E402
from ropelib.kernels import qk_norm_rope as QK  # noqa: E402
from ropelib.ops import view4  # noqa: E402


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def _print(rows, title):
    print(f"\n{title}")
    rows = sorted(rows, key=lambda r: -r[0])
    for ratio, t, label, picked in rows:
        print(f"  {'*' if picked else ' '} {label:<40} {t:8.4f} ms  {ratio:6.3f} of copy")
    return rows[0]


MROPE_CANDIDATES = [(bs, hps, w) for bs in (1, 2, 4, 8, 16, 32) for hps in (1, 2, 4, 8)
                    for w in (2, 4, 8, 16)]


def mrope_tiles() -> list:
    import mrope_bench as MB
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    best = []
    for case, (layout, B, S, HQ, HK, D, section, style, base) in MB.CASES.items():
        freqs = mrope.multi_axis_frequencies(D, section, base, style=style, device="cuda")
        pos = MB.positions_for(case, B, S, "cuda")
        pos3 = mrope._positions3(pos)       # [3, B or 1, S], contiguous, as the checks leave it
        shape = (lambda h: (S, h, D)) if layout == "thd" else (lambda h: (B, S, h, D))
        q, k = (torch.randn(shape(h), device="cuda", dtype=torch.bfloat16) for h in (HQ, HK))
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        copy = ms(lambda: (qo.copy_(q), ko.copy_(k)))
        q4, k4, qo4, ko4 = (view4(t, layout) for t in (q, k, qo, ko))
        per_batch = pos3.shape[1] > 1
        picked = MK.pick_tiles(q4.shape[0], q4.shape[1], HQ + HK, D, D, per_batch, sm)
        row = MK._row(D, D)
        for backward in (False,):
            rows = []
            for block_s, hps, warps in MROPE_CANDIDATES:
                tile = block_s * hps * row
                if not 1024 <= tile <= 8192 or not 4 <= tile // (32 * warps) <= 32:
                    continue
                group, chunk = MK.fit_grid(q4.shape[0], q4.shape[1], HQ + HK, block_s,
                                           per_batch, sm)
                tiles = (block_s, hps, group, chunk, warps)
                plan, ptrs = MK.plan(q4, qo4, pos3, freqs.inv_freq, freqs.axis,
                                     interleaved=False, backward=backward, layout=layout,
                                     k4=k4, k_out4=ko4, tiles=tiles)
                t = ms(lambda: MK.run(plan, ptrs))
                rows.append((copy / t, t, f"BLOCK_S {block_s:3d} HPS {hps} heads {group:3d} "
                             f"chunk {chunk} warps {warps}", tiles == picked))
            best.append((f"mrope {case} {'bwd' if backward else 'fwd'}",
                         _print(rows, f"mrope {case} ({'backward' if backward else 'forward'}), "
                                f"copy {copy:.4f} ms")))
    return best


QK_CANDIDATES = [(bs, bh, w) for bh in (1, 2, 4, 8) for bs in (1, 2, 4, 8, 16, 32)
                 for w in (1, 2, 4, 8) if 256 <= bs * bh * 128 <= 8192
                 and bs * bh * 128 >= 32 * w * 4]


def qk_norm_tiles() -> list:
    import qk_norm_bench as QB
    B, S, HQ, HK, D = 8, 4096, 32, 8, 128
    (q, k, w_q, w_k, cos, sin), (gq, gk) = QB.inputs(B, S, HQ, HK, D, torch.bfloat16, "cuda")
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    copy_f = ms(lambda: (qo.copy_(q), ko.copy_(k)))
    # backward moves 3 reads (q, gq') and 1 write (gq) per element: as two copies
    copy_b = 2 * copy_f
    q4, k4, qo4, ko4, gq4, gk4 = (view4(t, "bshd") for t in (q, k, qo, ko, gq, gk))
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    picked = QK.pick_tiles(S, B, HQ, HK, D, sm)
    original = QK.pick_tiles
    best = []
    try:
        for backward in (False, True):
            rows = []
            for bs, bh, w in QK_CANDIDATES:
                def fixed(S_, B_, HQ_, HK_, D_, sm_, _t=(bs, bh, w)):
                    chunk = original(S_, B_, HQ_, HK_, D_, sm_)[2]
                    return _t[0], _t[1], chunk, _t[2]
                QK.pick_tiles = fixed
                grads = dict(gq4=gq4, gk4=gk4) if backward else {}
                plan = QK.plan(q4, k4, qo4, ko4, w_q, w_k, cos, sin, None, layout="bshd",
                               interleaved=False, eps=1e-6, weight_offset=0.0, **grads)
                ptrs = QK.pointers(plan, q4, k4, qo4, ko4, w_q, w_k, cos, sin, None,
                                   grads.get("gq4"), grads.get("gk4"), QK.partials(plan))
                t = ms(lambda: QK.run(plan, ptrs))
                floor = copy_b if backward else copy_f
                rows.append((floor / t, t, f"BLOCK_S {bs:3d} BLOCK_H {bh} warps {w}",
                             (bs, bh, w) == (picked[0], picked[1], picked[3])))
            best.append((f"qk_norm {'bwd' if backward else 'fwd'}",
                         _print(rows, f"qk_norm ({'backward' if backward else 'forward'}), "
                                f"copy {copy_f:.4f} ms")))
    finally:
        QK.pick_tiles = original
    return best


EXACT_CANDIDATES = [(4, 16), (8, 8), (8, 16), (16, 4), (16, 8), (32, 4), (32, 8), (64, 4)]


def exact_tiles() -> list:
    D, base = 128, 10000.0
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    knobs = device_tiles(0)[1]
    best = []
    for case, shape, layout in (("bshd-b4-s8192-h32", (4, 8192, 32, D), "bshd"),
                                ("bshd-b16-s8192-h32 (1 GiB)", (16, 8192, 32, D), "bshd"),
                                ("thd-t32768-h32", (32768, 32, D), "thd")):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        copy = ms(lambda: y.copy_(x))
        S = shape[1] if layout == "bshd" else shape[0]
        x4, y4 = view4(x, layout), view4(y, layout)
        pos = L.Positions()
        if layout == "thd":
            pos = L.Positions(cu_seqlens=torch.arange(0, S + 1, S // 8, device="cuda",
                                                      dtype=torch.int32))
        angles = F.rope_angles(D, base=base, device="cuda")
        cos, sin = ropelib.rope_cos_sin(S, D, base=base, device="cuda")
        tables = {"exact": L.Table(angles.turns, angles.amplitude), "cos/sin": L.Table(cos, sin)}
        knob = "tile_loop" if x4.shape[1] >= BATCH_LOOP_MIN else "tile_noloop"
        default = L.pick_tiles(x4.shape[0], x4.shape[1], (x4.shape[2], 0), D, D, 2, sm, **knobs)
        rows = []
        for name, table in tables.items():
            for ept, warps in EXACT_CANDIDATES:
                tiles = L.pick_tiles(x4.shape[0], x4.shape[1], (x4.shape[2], 0), D, D, 2, sm,
                                     **{**knobs, knob: (ept, warps)})
                plan, ptrs = L.plan(L.View.of(x4), L.View.of(y4), table, pos, R=D,
                                    interleaved=False, backward=False, layout="sbhd",
                                    tiles=tiles)
                t = ms(lambda: L.run(plan, ptrs))
                rows.append((copy / t, t, f"{name:8s} ept {ept:3d} warps {warps:2d} {tiles}",
                             tiles == default))
        for name in tables:
            best.append((f"exact {case} {name}",
                         _print([r for r in rows if r[2].startswith(name)],
                                f"{case} {name}, copy {copy:.4f} ms")))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("mrope", "qk_norm", "exact"), action="append")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("needs a CUDA GPU with compiled kernels")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    best = []
    for name, fn in (("mrope", mrope_tiles), ("qk_norm", qk_norm_tiles), ("exact", exact_tiles)):
        if not args.only or name in args.only:
            best += fn()
    print("\n| kernel, case | best tiles | ms | of copy |\n|---|---|---:|---:|")
    for what, (ratio, t, label, _) in best:
        print(f"| {what} | {label} | {t:.4f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
