"""What a program costs an SM to start and retire, apart from its work (notebook 03, section 4).

    python benchmarks/program_cost.py [--out DIR]     # GPU; writes program_cost-<gpu>.csv

Three kernels, each launched with a million programs (the naive kernel's grid at S=4096, B=8,
H=32: one program per head row) at 1, 2, 4 and 8 warps a program:

    empty     does nothing (it returns at once): the cost of the programs alone
    one row   loads one 256-byte bf16 row of x and stores it to y, as the naive kernel moves
              one head row per program (no arithmetic)
    copy      torch's device copy of the same x (the yardstick, one launch)

Each row records the median of triton.testing.do_bench and ns per program on each SM
(time x SMs / programs): if starting and retiring programs is what the naive kernel pays for,
the empty kernel's ns per program is of the naive kernel's order.
"""
import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from ropelib.bench import compare  # noqa: E402


@triton.jit
def _empty_kernel(x_ptr):
    # grid (programs,): nothing to do
    pass


@triton.jit
def _one_row_kernel(x_ptr, y_ptr, D: tl.constexpr):
    # grid (rows,): program r moves row r of x [rows, D] to y
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    tl.store(y_ptr + r * D + d, tl.load(x_ptr + r * D + d))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    assert torch.cuda.is_available(), "program_cost.py needs a GPU"
    S, B, H, D = 4096, 8, 32, 128
    rows = S * B * H
    x = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []

    def add(label, warps, fn, programs):
        ms = do_bench(fn, quantiles=[0.5, 0.2, 0.8])[0]
        out.append(dict(kernel=label, num_warps=warps, programs=programs, us=round(ms * 1e3, 2),
                        ns_per_program_per_sm=round(ms * 1e6 * sms / programs, 2)
                        if programs else None, sms=sms))
        print(f"  {label:8s} {warps} warps  {ms * 1e3:8.1f} us", flush=True)

    for warps in (1, 2, 4, 8):
        add("empty", warps, lambda w=warps: _empty_kernel[(rows,)](x, num_warps=w), rows)
        add("one row", warps, lambda w=warps: _one_row_kernel[(rows,)](x, y, D=D, num_warps=w),
            rows)
    add("copy", 0, lambda: y.copy_(x), 0)
    meta = compare.environment_meta()
    meta["what"] = (f"a million programs ({rows}: S={S} B={B} H={H}, one per head row of "
                    f"{D} bf16) doing nothing or moving their row; ns_per_program_per_sm = "
                    "time x SMs / programs")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    path = os.path.join(args.out, f"program_cost-{compare.gpu_slug()}-{stamp}.csv")
    compare.write_csv(out, path, meta, fields=["kernel", "num_warps", "programs", "us",
                                               "ns_per_program_per_sm", "sms"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
