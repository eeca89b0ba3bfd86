"""Does the flat pass's program size hold the large forwards behind torch.compile on this GPU?

The two-pass route's flat pass (kernels/flat.py) takes tiles.TWO_PASS_ELEMENTS elements a
program (rotate-half: whole head rows, 8 rows of 128) on tiles.TWO_PASS_PAIR_WARPS warps, a
choice measured on an H200. This probe times `ropelib.apply_rope`'s forward with other program
sizes and warp counts beside torch.compile of Hugging Face's formula and a device copy of the
same bytes, in shuffled rounds (`compare.time_in_rounds`: every variant once a round, a new
order each round), on the floor's sbhd forward cases: 1 GiB bf16 (s16384 b8), 2 GiB fp32,
256 MiB bf16 (s4096 b8) and 128 MiB bf16 at batch 1 (s16384 b1); 32 heads of 128. Every
variant's output is checked bit for bit against the shipped tile's first.

    python benchmarks/flat_tiles_probe.py --out DIR [--rounds 5]        # a GPU; ~2 min
    TRITON_INTERPRET=1 python benchmarks/flat_tiles_probe.py --dry-run  # CPU: the plumbing
"""
import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ropelib  # noqa: E402
from ropelib import eager  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.kernels import launch, tiles  # noqa: E402

CASES = (("forward 1 GiB bf16 sbhd", dict(seq_len=16384, batch=8, dtype="bf16")),
         ("forward 2 GiB fp32 sbhd", dict(seq_len=16384, batch=8, dtype="fp32")),
         ("forward 256 MiB bf16 sbhd", dict(seq_len=4096, batch=8, dtype="bf16")),
         ("forward 128 MiB bf16 sbhd", dict(seq_len=16384, batch=1, dtype="bf16")))
# (elements a program, warps a rotate-half program); the first is the shipped one
TILES = ((tiles.TWO_PASS_ELEMENTS, tiles.TWO_PASS_PAIR_WARPS), (1024, 4), (2048, 2), (2048, 4),
         (512, 1), (4096, 4), (4096, 8))


_planned_at = [None]     # the tile the eager plans were made at


def with_tile(elements: int, warps: int, fn):
    """fn() with the flat pass planned at this tile. The eager route's plans are dropped only
    when the tile changes, so that do_bench's back-to-back calls of one variant reuse its plan
    (and its kept cos/sin rows), as a model's calls do."""
    def run():
        if _planned_at[0] != (elements, warps):
            launch.TWO_PASS_ELEMENTS, launch.TWO_PASS_PAIR_WARPS = elements, warps
            eager.SIGNATURES.clear()
            _planned_at[0] = (elements, warps)
        return fn()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes (the interpreter)")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not a.dry_run else "cpu"
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "CPU (interpreter)"
    slug = gpu.lower().replace(" ", "-")
    compare.ROUNDS_ORDER = "shuffled"
    by_name = {p.name: p for p in compare.providers()}
    rows = []
    print(f"# {gpu}, torch {torch.__version__}; forward, ratio to a copy, median of "
          f"{a.rounds} shuffled rounds (do_bench medians)", flush=True)
    for label, fields in CASES:
        if a.dry_run:
            fields = dict(fields, seq_len=8, batch=2)
        config = compare.Config(**dict(dict(heads=32 if not a.dry_run else 2, head_dim=128,
                                            layout="sbhd"), **fields))
        case = compare.make_case(config, dev, seed=1)
        x = case.tensors[0]
        freqs = ropelib.rope_freqs(config.seq_len, 128, device=dev)
        if a.dry_run:       # the two-pass route on tiny shapes
            launch._tiles_module.TWO_PASS_MIN_BYTES = 0
        steps = {}
        want = None
        for elements, warps in TILES:
            if a.dry_run:   # (the interpreter plans its own program size)
                launch._tiles_module.TWO_PASS_INTERPRETED_ELEMENTS = elements
            step = with_tile(elements, warps, lambda: ropelib.apply_rope(x, freqs))
            got = step()
            if want is None:
                want = got
            assert torch.equal(got, want), (label, elements, warps)
            steps[f"ropelib {elements}/{warps}w"] = step
        tc = by_name["torch.compile"]
        if dev == "cuda" and tc.why_not(config) is None:
            steps["torch.compile"] = lambda: tc.fn(case)
            steps["torch.compile"]()
        copy_once, _ = compare.copy_floor(case.tensors)
        steps["copy"] = copy_once
        t0 = time.time()
        if dev == "cuda":
            times = compare.time_in_rounds(steps, dev, rounds=a.rounds)
        else:
            times = {n: compare.wall_clock(s) for n, s in steps.items()}
        copy_ms = times["copy"][0]
        print(f"{label} ({time.time() - t0:.0f} s): copy {copy_ms:.4f} ms", flush=True)
        for name, t in times.items():
            if isinstance(t, BaseException):
                print(f"  {name:22} failed: {t}")
                continue
            rows.append(dict(case=label, variant=name, ms=round(t[0], 5),
                             ratio_to_copy=round(copy_ms / t[0], 4)))
            print(f"  {name:22} {t[0]:.4f} ms  {copy_ms / t[0]:.3f}")
    launch.TWO_PASS_ELEMENTS, launch.TWO_PASS_PAIR_WARPS = TILES[0]
    eager.SIGNATURES.clear()
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"flat_tiles_probe-{slug}-{stamp}.csv"
    with open(path, "w", newline="") as f:
        f.write(f"# gpu: {gpu}\n# torch: {torch.__version__}\n# rounds: {a.rounds} shuffled\n")
        w = csv.DictWriter(f, fieldnames=("case", "variant", "ms", "ratio_to_copy"))
        w.writeheader()
        w.writerows(rows)
    print("\n" + "".join(f"{r['case'][8:]:>22} {r['variant']:18} {r['ratio_to_copy']:.3f}\n"
                         for r in rows if r["variant"] != "copy"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
