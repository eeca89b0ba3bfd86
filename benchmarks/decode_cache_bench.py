"""Decode latency: RoPE fused with the KV-cache write against RoPE, then the write in PyTorch.

    python benchmarks/decode_cache_bench.py --out benchmarks/results/decode_cache.csv   # on a GPU
    TRITON_INTERPRET=1 python benchmarks/decode_cache_bench.py --dry-run               # CPU

One decoding step of one attention layer: q [B, 1, 32, 128], k and v [B, 1, 8, 128] in bf16
(bshd), each sequence at its own random position of a cache of 4096 positions, for batch 1, 8,
64 and 256. Three providers do the same work:

* fused: `ropelib.rope_kv_cache`, one launch: rotated q out, rotated k and v into the cache;
* unfused: `ropelib.apply_rope_qk(q, k, freqs, start_positions=cache_seqlens)`, then
  `ropelib.kv_cache.write_kv_cache` (index arithmetic and two index_put_ in PyTorch);
* two_kernels: the same RoPE launch, then one Triton kernel that writes k and v into their
  slots (`ropelib.bench.cache_write`, as a serving stack's cache-write kernel does): the
  unfused path with the fewest kernels.

Each runs against a contiguous cache [B, 4096, 8, 128] and a paged one (blocks of 16 positions,
handed out in a shuffled order), in bf16 and in float8_e4m3fn (per-tensor scales), eagerly and
replayed from a CUDA graph (`torch.cuda.CUDAGraph`: the launch overhead gone, what remains is
the kernels' time). Before timing, the fused step's outputs are checked: q against an fp64
reference (one bf16 rounding), q and the cache slots against the unfused step (the same bits;
within one e4m3 step for fp8, where the unfused path rounds to bf16 first).

Timings are `triton.testing.do_bench` medians in ms (20 %/80 % quantiles alongside); GB/s counts
q, k, v read, q written, k and v written in the cache's dtype and one table row per sequence.
The CSV starts with `# key: value` lines (GPU, versions, date) that ropelib.bench.compare.read_meta
reads back. `--dry-run` runs tiny shapes through Triton's interpreter, eagerly, and checks the
outputs; it times nothing. The measuring code is `ropelib.bench.kv_cache_decode`;
`python -m ropelib.bench --suite floor` runs batch 64 under CUDA graphs beside every other
performance row, against a copy of the same bytes.
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
from ropelib.bench import kv_cache_decode  # noqa: E402
from ropelib.bench.kv_cache_decode import BATCHES, run, table  # noqa: E402

SCRIPT = "benchmarks/decode_cache_bench.py"


def write(rows, path) -> str:
    return kv_cache_decode.write(rows, path, SCRIPT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV path")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check outputs, time nothing")
    ap.add_argument("--batch", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--cache-len", type=int, default=4096)
    ap.add_argument("--no-fp8", action="store_true", help="bf16 caches only")
    args = ap.parse_args(argv)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    print(runtime.mode())
    dtypes = ("bfloat16",) if args.no_fp8 else ("bfloat16", "float8_e4m3fn")
    rows = run(args.dry_run, batches=tuple(args.batch), cache_len=args.cache_len, dtypes=dtypes)
    if args.out is not None:
        print("wrote", write(rows, args.out))
    failed = sorted({f"{r['cache']}/{r['cache_dtype']}/b{r['batch']}: {r['reason']}"
                     for r in rows if not r["available"]})
    if failed:
        print("failed or differ:", *failed, sep="\n  ")
    print(table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
