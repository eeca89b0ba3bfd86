"""Train ropelib's GPT with context parallelism: every sequence split across the ranks.

    torchrun --nproc_per_node 8 benchmarks/cp_train.py --steps 200 --out benchmarks/results/cp.csv
    torchrun --nproc_per_node 8 benchmarks/cp_train.py --steps 200 --compare-single --out ...
    TRITON_INTERPRET=1 torchrun --nproc_per_node 2 benchmarks/cp_train.py --dry-run   # CPU, gloo

Each of the N ranks holds Transformer Engine's dual-chunk share (chunks r and 2N-1-r of 2N) of
every sequence, rotates its q and k with ropelib at their global positions (`cp_size`,
`cp_rank`), all-gathers k and v, and attends with the causal mask by global positions (see
`ropelib.context_parallel`; `ropelib.course.context_parallel_training` wraps the GPT with it).
Gradients are averaged over the ranks after every backward. NCCL on
GPUs, gloo on the CPU, and gloo where a host has more ranks than GPUs (two ranks sharing one GPU,
as notebook 11 runs its check on a machine with one).

The default case is long: a 12-layer, 1024-wide model (16 heads of 64) on sequences of 131072
characters of Python's own docs (`pydoc_data.topics`, no download), batch 1, bf16 autocast. By
Megatron's estimate (up to 34 bytes per token and hidden unit per layer with flash attention in
16-bit; less without dropout) that is up to 51 GiB of activations in one process: on an 80 GiB
GPU, with weights, AdamW state and the allocator's slack, it does not fit comfortably. Split 8
ways, each rank keeps 1/8 of them (~6.4 GiB) plus every layer's gathered k and v (4 bytes per
token and hidden unit per layer, ~6 GiB over 12 layers: the price of all-gather CP, which ring
attention would avoid). The CSV records each rank's measured peak.

The CSV (`--out`) holds one row per step: the whole batch's loss, the 1-process loss for the
first `--compare-steps` steps with `--compare-single`, the step time and tokens/s (all ranks
together; each step's loss is read back, so the time includes that sync). It starts with the
environment header (`# key: value`, as ropelib.bench.compare.read_meta reads) plus the run's sizes,
each rank's peak memory and the summary. With `--compare-single`, rank 0 trains the same model
from the same seed on the same batches in one process (the other ranks wait) and reports the
largest |loss difference| over those steps; in fp32 (`--dtype fp32`, and `--dry-run`) the run
fails when it exceeds 1e-4. A 1-process run that does not fit in memory is reported, not fatal.
`--dry-run`: a tiny model for 3 steps, on the CPU through Triton's interpreter with gloo where
there is no GPU, with `--compare-single` implied.
"""
import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's @triton.jit runs

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import torch.distributed as dist  # noqa: E402

from ropelib import runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib import context_parallel as cp  # noqa: E402
from ropelib.course import context_parallel_training as cpt  # noqa: E402
from ropelib.course.model import GPT, CharDataset, GPTConfig  # noqa: E402

FIELDS = ["step", "loss", "single_loss", "ms", "tokens_per_s"]
FP32_TOLERANCE = 1e-4
DRY = dict(seq_len=16, n_layer=2, n_head=2, n_embd=16, batch_size=2, steps=3)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seq-len", type=int, default=131072,
                    help="global sequence length (a multiple of 2 * ranks)")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=16)
    ap.add_argument("--n-embd", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope", choices=("ropelib", "reference"), default="ropelib")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                    help="autocast dtype (default: bf16 on a GPU, fp32 on the CPU)")
    ap.add_argument("--compare-single", action="store_true",
                    help="also train the 1-process baseline for the first --compare-steps steps")
    ap.add_argument("--compare-steps", type=int, default=5)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help="CSV path (written by rank 0)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny model, 3 steps (CPU: interpreter and gloo), compared with 1 process")
    args = ap.parse_args(argv)
    if args.dry_run:
        for k, v in DRY.items():
            setattr(args, k, v)
        args.compare_single, args.compare_steps, args.log_every = True, DRY["steps"], 1
    if args.out is None and not args.dry_run:
        ap.error("--out is required (where the CSV goes)")
    if args.dtype is None:
        args.dtype = "bf16" if torch.cuda.is_available() else "fp32"
    args.compare_steps = min(args.compare_steps, args.steps)
    return args


def setup():
    """(device, group size, rank, backend): torchrun's process group, or one process without."""
    if "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda" if runtime.on_gpu() else "cpu")
        return device, 1, 0, "none"
    if runtime.on_gpu():
        local, gpus = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if int(os.environ.get("LOCAL_WORLD_SIZE", 1)) <= gpus:
            device, backend = torch.device("cuda", local), "nccl"
        else:
            # more ranks than GPUs on this host (notebook 11: two ranks on one GPU): NCCL
            # refuses two ranks on one GPU, gloo carries the collectives through host memory
            device, backend = torch.device("cuda", local % gpus), "gloo"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return device, dist.get_world_size(), dist.get_rank(), backend


def gather_objects(obj, world):
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def write(rows, path, meta):
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)


def table(meta) -> str:
    keys = ["device", "backend", "cp_size", "seq_len", "batch_size", "params", "dtype", "steps",
            "tokens_per_s", "ms_per_step", "peak_mem_gib_per_rank", "single_process",
            "max_loss_diff"]
    width = max(map(len, keys))
    return "\n".join(f"{k:<{width}}  {meta.get(k, '')}" for k in keys)


def main(argv=None) -> int:
    args = parse(argv)
    device, world, rank, backend = setup()
    try:
        status = run(args, device, world, rank, backend)
        if world > 1:
            # every rank is done (rank 0 writes and prints after the others finish) before any
            # tears its process group down: under a loaded CPU a gloo rank that tore down first
            # was once aborted at exit ("terminate called without an active exception")
            dist.barrier()
        return status
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(args, device, world, rank, backend) -> int:
    if args.seq_len % (2 * world):
        raise SystemExit(f"--seq-len {args.seq_len} must be a multiple of 2 * ranks = {2 * world}")
    amp = torch.bfloat16 if args.dtype == "bf16" else None
    say = print if rank == 0 else (lambda *a, **k: None)
    say(runtime.mode(), f"| {world} rank(s), backend {backend}")
    data = CharDataset.from_pydoc_topics()
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=args.seq_len, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    torch.manual_seed(args.seed)
    model = cpt.context_parallel(GPT(cfg, args.rope)).to(device)
    cp.broadcast_params(model)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: {n_params / 1e6:.1f} M parameters, {args.n_layer} layers x {args.n_embd} "
        f"({args.n_head} heads); sequence {args.seq_len} = {world} x {args.seq_len // world}")
    kw = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
              amp_dtype=amp)

    rows, t_prev = [], [None]

    def log(it, loss):
        now = time.perf_counter()
        ms = None if t_prev[0] is None else 1e3 * (now - t_prev[0])
        t_prev[0] = now
        tps = args.batch_size * args.seq_len / (ms / 1e3) if ms else None
        rows.append({"step": it + 1, "loss": f"{loss:.6f}",
                     "ms": None if ms is None else f"{ms:.2f}",
                     "tokens_per_s": None if tps is None else f"{tps:.1f}"})
        if (it + 1) % args.log_every == 0 or it + 1 == args.steps:
            say(f"step {it + 1:5d}  loss {loss:.4f}" +
                ("" if ms is None else f"  {ms:8.1f} ms  {tps:10.0f} tok/s"), flush=True)

    t_prev[0] = time.perf_counter()
    hist = cpt.train(model, data, on_step=log, **kw)
    peaks = gather_objects(hist["peak_mem_gib"], world)
    meta = {**compare.environment_meta(), "script": "benchmarks/cp_train.py",
            "device": str(device), "backend": backend, "cp_size": world,
            "seq_len": args.seq_len, "local_seq_len": args.seq_len // world,
            "batch_size": args.batch_size, "n_layer": args.n_layer, "n_head": args.n_head,
            "n_embd": args.n_embd, "params": n_params, "rope": args.rope, "dtype": args.dtype,
            "lr": args.lr, "seed": args.seed, "steps": args.steps,
            "tokens_per_s": f"{hist['tokens_per_s']:.1f}",
            "ms_per_step": f"{hist['ms_per_step']:.2f}",
            "timing": "wall clock per step incl. reading the loss back; summary over the steps "
                      "after the first min(5, max(1, steps // 5)) (none left out of 1 step)",
            "peak_mem_gib_per_rank": ("none (CPU)" if peaks[0] is None
                                      else " ".join(f"{p:.2f}" for p in peaks))}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()

    status = 0
    if args.compare_single:
        solo = dist.new_group([0]) if world > 1 else None   # every rank takes part in new_group
        if rank == 0:
            try:
                torch.manual_seed(args.seed)
                single = GPT(cfg, args.rope).to(device)
                h1 = cpt.train(single, data, group=solo, stop_after=args.compare_steps, **kw)
                diffs = [abs(a - b) for a, b in zip(hist["train_loss"], h1["train_loss"])]
                for r, loss in zip(rows, h1["train_loss"]):
                    r["single_loss"] = f"{loss:.6f}"
                meta["single_process"] = (
                    f"{args.compare_steps} steps" + ("" if h1["peak_mem_gib"] is None
                                                     else f", peak {h1['peak_mem_gib']:.2f} GiB"))
                meta["max_loss_diff"] = f"{max(diffs):.3g}"
                print(f"max |loss difference| over the first {args.compare_steps} steps, "
                      f"{world} ranks vs 1 process ({args.dtype}): {max(diffs):.3g}")
                if amp is None and max(diffs) > FP32_TOLERANCE:
                    print(f"FAILED: more than {FP32_TOLERANCE} in fp32")
                    status = 1
                del single
            except torch.cuda.OutOfMemoryError as e:
                meta["single_process"] = "out of memory"
                print(f"the 1-process baseline does not fit: {str(e).splitlines()[0]}")
        if world > 1:
            dist.barrier()
    if rank == 0:
        if args.out is not None:
            print("wrote", write(rows, args.out, meta))
        print(table(meta))
    return status


if __name__ == "__main__":
    sys.exit(main())
