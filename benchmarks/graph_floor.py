"""What replaying a CUDA graph costs before any kernel in it does work (GPU only).

The decode benchmark (`ropelib.bench.kv_cache_decode`, notebook 11) times one decoding step as
the replay of a CUDA graph holding that step, with `triton.testing.do_bench`. A line through
the unfused steps' replayed times against their kernel counts has an intercept of a few
microseconds and a slope of about two microseconds a kernel. This probe times, the same way
(`kv_cache_decode.time_step`, mode "graph"), graphs that hold n kernels that do nothing worth
timing (`kv_cache_decode.fill_step`: each fills one 4-byte element), for n = 1 to 18, the
counts of the decode steps among them. Its intercept is what a replay costs at all; its slope
what one more kernel in a graph costs when the kernel itself takes no time.

    python benchmarks/graph_floor.py --out DIR [--rounds 5]     # ~10 s on an H200

Writes graph_floor-<gpu>.csv: round, kernels, us (the median of do_bench's samples), and
prints the medians over the rounds and a least-squares line through them last.
"""
import argparse
import os
import statistics

import torch

from ropelib.bench import compare, kv_cache_decode

KERNELS = (1, 2, 4, 7, 10, 15, 18)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("graph_floor.py times CUDA-graph replays: run it on a machine with a GPU")
    os.makedirs(args.out, exist_ok=True)
    steps = {n: kv_cache_decode.fill_step(n) for n in KERNELS}
    rows = []
    for rnd in range(args.rounds):
        order = KERNELS if rnd % 2 == 0 else KERNELS[::-1]
        for n in order:
            us = kv_cache_decode.time_step(steps[n], None, "graph")[0] * 1e3
            rows.append(dict(round=rnd, kernels=n, us=f"{us:.4f}"))
    path = compare.write_csv(rows, os.path.join(args.out, f"graph_floor-{compare.gpu_slug()}.csv"),
                             meta=compare.environment_meta(), fields=["round", "kernels", "us"])
    print("wrote", path)
    med = {n: statistics.median(float(r["us"]) for r in rows if r["kernels"] == n)
           for n in KERNELS}
    for n, us in med.items():
        print(f"{n:>3} kernels: {us:.2f} us a replay")
    slope, intercept = statistics.linear_regression(list(med), list(med.values()))
    print(f"line: {intercept:.2f} us + {slope:.2f} us a kernel")


if __name__ == "__main__":
    main()
