"""Why two of notebook 13's worked solutions stream below a copy: puzzle 5 (angles at long
context) and puzzle 9 (one table for the batch), each timed beside variants that change one
thing, with a device copy of the same bytes in the same run.

    python benchmarks/puzzle_fractions.py [--out DIR]      # GPU; writes puzzle_fractions-<gpu>.csv

Puzzle 5's solution evaluates sin and cos of fp32 angles p * w_j. libdevice's sinf and cosf
reduce an argument below 105,615 with a few multiply-adds and take a long path (Payne-Hanek,
a loop over the bits of 2/pi) at or above it; the timed case's positions run to 131,071, so the
rows from 105,615 on (19 % of them) have one or two pairs on the long path, and a warp waits
for its slowest lane. Variants: the same bytes with positions below 105,000 (no angle on the
long path), and the copy of only the bytes the kernel moves (the bf16 angle table it is handed
is never read).

Puzzle 9's solution loads a tile of table rows once and loops over the batch. Variants: tiles
of 4 to 32 positions and 4 or 8 warps, to see how the fraction follows the number of programs
(and warps) an SM holds; each row records the compiled kernel's registers a thread.

Each case is timed with triton.testing.do_bench (median), in two alternating rounds, the
median of the two kept; of_copy = copy us / kernel us.
"""
import argparse
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from ropelib.bench import compare  # noqa: E402
from ropelib.course import puzzles as pz  # noqa: E402

SLOW_PATH_FROM = 105615.0    # libdevice's sinf/cosf: the long reduction at |x| >= this


def _bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def puzzle5_cases(device="cuda"):
    big = pz.PUZZLES["long_context"].big(device)
    x, table, pos, inv, y, n = big.args
    low = (pos % 105000).to(torch.int32)
    handed = _bytes(x, table, pos, inv, y)
    moved = _bytes(x, pos, inv, y)
    slow_rows = int((pos.float() >= SLOW_PATH_FROM).sum())
    for variant, p, copy_bytes in (("positions 0..131071 (the timed case)", pos, handed),
                                   ("positions below 105,000 (no angle on the long path)", low,
                                    handed),
                                   ("positions 0..131071, copy of the bytes moved", pos, moved)):
        args = (x, table, p, inv, y, n)
        yield dict(puzzle=5, variant=variant, block=big.constexprs["BLOCK_ROWS"], num_warps=4,
                   programs=big.grid[0], nbytes=copy_bytes, slow_rows=slow_rows if p is pos
                   else 0, rows=n), (pz.solution_long_context_kernel, big.grid, args,
                                     dict(big.constexprs))


def puzzle9_cases(device="cuda"):
    big = pz.PUZZLES["shared_table"].big(device)
    x, cos, sin, y, S, B = big.args
    handed = _bytes(x, cos, sin, y)
    for bs, warps in ((16, 4), (4, 4), (8, 4), (32, 4), (16, 8), (32, 8)):
        timed = (bs, warps) == (big.constexprs["BLOCK_S"], 4)   # the ⏱ lines' tile
        variant = f"BLOCK_S={bs}, {warps} warps" + (" (the timed case)" if timed else "")
        const = dict(big.constexprs, BLOCK_S=bs)
        grid = (triton.cdiv(S, bs),)
        yield dict(puzzle=9, variant=variant, block=bs, num_warps=warps, programs=grid[0],
                   nbytes=handed, rows=S * B), (pz.solution_shared_table_kernel, grid,
                                                big.args, dict(const, num_warps=warps))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    assert torch.cuda.is_available(), "puzzle_fractions.py needs a GPU"
    cases = list(puzzle5_cases()) + list(puzzle9_cases())
    rows = []
    for row, (kernel, grid, kargs, const) in cases:
        compiled = kernel[grid](*kargs, **const)
        torch.cuda.synchronize()
        row["registers"] = compiled.n_regs
        row["spills"] = compiled.n_spills
        rows.append(row)
    times = {i: [] for i in range(len(cases))}
    copies = {i: [] for i in range(len(cases))}
    for _ in range(2):
        for i, (row, (kernel, grid, kargs, const)) in enumerate(cases):
            times[i].append(do_bench(lambda: kernel[grid](*kargs, **const),
                                     quantiles=[0.5, 0.2, 0.8])[0] * 1e3)
            copies[i].append(do_bench(pz.copy_of(row["nbytes"], "cuda"),
                                      quantiles=[0.5, 0.2, 0.8])[0] * 1e3)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for i, row in enumerate(rows):
        row["us"] = round(statistics.median(times[i]), 2)
        row["copy_us"] = round(statistics.median(copies[i]), 2)
        row["of_copy"] = round(row["copy_us"] / row["us"], 4)
        row["sms"] = sms
    meta = compare.environment_meta()
    meta["what"] = ("notebook 13's worked solutions of puzzles 5 and 9 beside variants; of_copy "
                    "= a device copy of nbytes over the kernel's time, medians of two rounds")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    path = os.path.join(args.out, f"puzzle_fractions-{compare.gpu_slug()}-{stamp}.csv")
    fields = ["puzzle", "variant", "block", "num_warps", "programs", "registers", "spills",
              "rows", "slow_rows", "nbytes", "us", "copy_us", "of_copy", "sms"]
    compare.write_csv(rows, path, meta, fields=fields)
    print(f"wrote {path}")
    for r in rows:
        print(f"  puzzle {r['puzzle']}  {r['variant']:55s} regs {r['registers']:>3}  "
              f"{r['us']:8.1f} us  copy {r['copy_us']:8.1f} us  {r['of_copy']:.3f}")


if __name__ == "__main__":
    main()
