"""Fused per-head QK-RMSNorm + RoPE: ropelib's kernel against the same math in PyTorch.

    python benchmarks/qk_norm_bench.py --out benchmarks/results/qk_norm.csv   # on a GPU
    TRITON_INTERPRET=1 python benchmarks/qk_norm_bench.py --dry-run            # CPU: tiny shapes

The case is a Qwen3-sized attention block: q [8, 4096, 32, 128] and k [8, 4096, 8, 128] in bf16
(bshd), with learned weights w_q, w_k [128] (fp32) and a cos/sin table [4096, 128] (fp32). Three
providers compute rope(rmsnorm(x) * w) for q and for k, each with statistics and math in fp32
and one rounding to bf16:

* ropelib: `ropelib.qk_norm_rope`, one launch forward, one backward;
* torch_compile: the plain PyTorch below under `torch.compile` (default Inductor);
* eager: the same PyTorch, eagerly.

Two passes are timed: the forward, and forward + backward (gradients of q, k, w_q, w_k). Every
provider's outputs (and gradients) are checked against an fp64 reference before it is timed.
Timings are `triton.testing.do_bench` medians (20 %/80 % quantiles alongside) in ms; GB/s uses
one bytes model for every provider: forward reads q, k and writes q', k'; the backward reads q,
k, gq', gk' and writes gq, gk (table and weights are counted once). The CSV starts with
`# key: value` lines (GPU, versions, date) that ropelib.bench.compare.read_meta reads back. `--dry-run`
runs tiny shapes through Triton's interpreter (torch.compile with the aot_eager backend, since
Inductor's code needs a GPU there) and checks the outputs; it times nothing. The measuring code
is `ropelib.bench.qk_norm_rope`; `python -m ropelib.bench --suite floor` runs this case beside
every other performance row, against a copy of q and k.
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

from ropelib import runtime  # noqa: E402
from ropelib.bench import qk_norm_rope  # noqa: E402
# inputs: benchmarks/feature_tiles.py reads it from this script
from ropelib.bench.qk_norm_rope import inputs, run, table  # noqa: E402,F401

SCRIPT = "benchmarks/qk_norm_bench.py"


def write(rows, path) -> str:
    return qk_norm_rope.write(rows, path, SCRIPT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check outputs, time nothing")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    print(runtime.mode())
    rows = run(args.dry_run, B=args.batch, S=args.seq)
    print(table(rows))
    if args.out is not None:
        print("wrote", write(rows, args.out))
    failed = [f"{r['provider']}/{r['pass']}" for r in rows if not r["available"]]
    if failed:
        print("failed or differ from the reference:", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
