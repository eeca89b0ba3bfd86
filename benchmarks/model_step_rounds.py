"""The compiled GPT's training step with ropelib's RoPE and with plain PyTorch's, timed in
alternating rounds (GPU).

`python -m ropelib.course.model_step` trains one model after the other, so a slow spell of the
host falls on one of them only, and one run per mode cannot tell a 3 % difference from the run.
This probe builds and compiles both models (ropelib.course.model's GPT: 4 layers, 512 wide,
batch 8 x 512, bf16 autocast, fused AdamW), warms each up, then times `--rounds` rounds, each of
`--steps` training steps per model in a new order every round (seeded), and prints each round's
ms per step, the medians, and the ratio ropelib / reference per round (paired: the same round).

    python benchmarks/model_step_rounds.py [--mode reduce-overhead] [--rounds 7] [--steps 50]
"""
import argparse
import random
import statistics
import time

import torch

from ropelib.course.model import CharDataset, build, make_optimizer, train_step
from ropelib.course.model_step import BATCH_SIZE, LR, MODEL_IMPLS, model_config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="reduce-overhead",
                    choices=("default", "reduce-overhead"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args()
    device = "cuda"
    data = CharDataset.from_pydoc_topics()
    cfg = model_config(data)
    runs = {}
    for impl in MODEL_IMPLS:
        model = build(cfg, impl, seed=0, device=device)
        runs[impl] = (torch.compile(model, mode=args.mode), make_optimizer(model, lr=LR),
                      torch.Generator().manual_seed(0))
    mark = args.mode == "reduce-overhead"

    def steps(impl, n):
        runner, opt, g = runs[impl]
        for _ in range(n):
            if mark:
                torch.compiler.cudagraph_mark_step_begin()
            x, y = data.get_batch("train", BATCH_SIZE, cfg.block_size, g, device)
            train_step(runner, opt, x, y, amp_dtype=torch.bfloat16)

    for impl in MODEL_IMPLS:
        steps(impl, args.warmup)
    torch.cuda.synchronize()
    rng = random.Random(0)
    per_round = []
    for r in range(args.rounds):
        order = list(MODEL_IMPLS)
        rng.shuffle(order)
        got = {}
        for impl in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            steps(impl, args.steps)
            torch.cuda.synchronize()
            got[impl] = (time.perf_counter() - t0) * 1e3 / args.steps
        per_round.append((order, got))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, mode {args.mode}; "
          f"{args.rounds} rounds of {args.steps} steps a model, a new order each round (seed 0), "
          f"after {args.warmup} warm-up steps each; ms per step")
    print(f"{'round':>5s} {'order':24s} {'reference':>9s} {'ropelib':>8s} {'ratio':>6s}")
    for i, (order, got) in enumerate(per_round):
        print(f"{i:5d} {' then '.join(order):24s} {got['reference']:9.3f} {got['ropelib']:8.3f} "
              f"{got['ropelib'] / got['reference']:6.3f}")
    ratios = [got["ropelib"] / got["reference"] for _, got in per_round]
    med = {impl: statistics.median(got[impl] for _, got in per_round) for impl in MODEL_IMPLS}
    print(f"median: reference {med['reference']:.3f} ms, ropelib {med['ropelib']:.3f} ms; "
          f"ratio per round: median {statistics.median(ratios):.3f}, range "
          f"{min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
