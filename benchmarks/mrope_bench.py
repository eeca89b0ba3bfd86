"""Multi-axis RoPE: ropelib's kernel against a copy of q and k, transformers' own code, and
torch.compile of it.

    python benchmarks/mrope_bench.py --out benchmarks/results/mrope.csv    # on a GPU
    python benchmarks/mrope_bench.py --tables --case mrope --out t.csv   # + 4.x drop-in vs Liger
    TRITON_INTERPRET=1 python benchmarks/mrope_bench.py --dry-run           # CPU: tiny shapes

Three cases, bf16, q and k together at least 256 MiB: mrope (Qwen2-VL-7B's text attention,
q [4, 8192, 28, 128], k [4, 8192, 4, 128], bshd, mrope_section [16, 24, 24]), axial2d (Qwen2-VL's
vision encoder, 65536 packed patches, thd, head dim 80) and axial3d (a 16 x 32 x 32 video, bshd,
3-D axial RoPE).

Providers:

* ropelib: `ropelib.apply_mrope_qk` from the positions (the kernel forms the angles);
* copy: `q.clone()` and `k.clone()`: the memory floor (the same bytes of q and k moved);
* hf_eager: transformers' code, eagerly: Qwen2VLRotaryEmbedding + apply_rotary_pos_emb (mrope),
  Qwen2VLVisionRotaryEmbedding + apply_rotary_pos_emb_vision (axial2d); for axial3d, which no
  transformers model here implements, the same plain PyTorch (angles gathered per pair, cos/sin,
  rotate_half);
* hf_compile: the same function under `torch.compile` (Inductor; aot_eager in --dry-run).

`--tables` adds the mrope case on transformers 4.x's materialised bf16 cos/sin tables
[3, B, S, D]: `ropelib.hf.apply_multimodal_rotary_pos_emb` against Liger Kernel's
`LigerQwen2VLMRopeFunction` on the same tables (and the 4.x formula eagerly and compiled).

Two passes: the forward, and forward + backward (gradients of q and k). Each provider's outputs
(and gradients) are checked against an fp64 reference before it is timed (max_err:
max |got - ref| / (1 + |ref|), at most 2^-5). Timings are
`triton.testing.do_bench` medians (20 %/80 % quantiles alongside) in ms; GB/s uses one bytes
model for every provider: q and k read and written once per pass (positions and frequencies
are not counted). The CSV starts with `# key: value` lines (GPU, versions, date). `--dry-run`
runs tiny shapes in Triton's interpreter and checks the outputs; it times nothing. The
measuring code is `ropelib.bench.multi_axis`; `python -m ropelib.bench --suite floor` runs the
mrope case (and the tables comparison) beside every other performance row.
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
from ropelib.bench import multi_axis  # noqa: E402
# CASES and positions_for: benchmarks/feature_tiles.py reads them from this script
from ropelib.bench.multi_axis import CASES, positions_for, run, table  # noqa: E402,F401

SCRIPT = "benchmarks/mrope_bench.py"


def write(rows, path) -> str:
    return multi_axis.write(rows, path, SCRIPT)


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check outputs, time nothing")
    ap.add_argument("--case", choices=tuple(CASES), action="append",
                    help="run only this case (repeatable; default: all)")
    ap.add_argument("--tables", action="store_true",
                    help="also ropelib.hf.apply_multimodal_rotary_pos_emb against Liger's kernel "
                         "on materialised bf16 tables (the mrope case)")
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    print(runtime.mode())
    rows = run(args.dry_run, tuple(args.case or CASES), tables=args.tables)
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
