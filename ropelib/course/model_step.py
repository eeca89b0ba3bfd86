"""A compiled GPT's training step with ropelib's RoPE and with plain PyTorch's: the step time,
Dynamo's graphs and graph breaks, and the two loss curves (ropelib.course.model's GPT, the model
notebook 09 trains).

    python -m ropelib.course.model_step --out benchmarks/results/   # GPU: 200 compiled steps each

One CSV row per (rope implementation, step), with the environment (GPU, versions, date) in it,
written through ropelib.bench's CSV writer.
"""
import argparse
import sys

import torch

from ..bench.compare import environment_meta, write_csv
from ..bench.suite import out_path
from ..runtime import on_gpu
from .model import CharDataset, GPTConfig, build, train

MODEL_IMPLS = ("reference", "ropelib")
BATCH_SIZE, LR = 8, 1e-4        # the timed step: 8 sequences of block_size tokens, AdamW's rate


def model_config(data: CharDataset, *, block_size: int = 512, n_layer: int = 4, n_head: int = 8,
                 n_embd: int = 512) -> GPTConfig:
    """The GPT this module times (4 layers, 512 wide, 8 heads, 512-token blocks) on `data`."""
    return GPTConfig(vocab_size=data.vocab_size, block_size=block_size, n_layer=n_layer,
                     n_head=n_head, n_embd=n_embd)


def model_suite(*, steps: int = 200, batch_size: int = BATCH_SIZE, block_size: int = 512,
                n_layer: int = 4, n_head: int = 8, n_embd: int = 512, lr: float = LR,
                timing_warmup: int = 20, compile: bool = True, mode: str = "default",
                device=None) -> list:
    """ropelib.course.model's GPT trained for `steps` steps, once with RoPE by plain PyTorch
    ("reference") and once by ropelib, same seed, same weights, same batches (bf16 autocast on a
    GPU, AdamW). Under torch.compile (default) it also records how many graphs and graph breaks
    Dynamo makes of a training forward; `mode` is torch.compile's ("reduce-overhead": CUDA
    graphs). One row per (impl, step): train_loss; every row carries the impl's ms_per_step,
    tokens_per_s, graphs and graph_breaks."""
    device = device or ("cuda" if on_gpu() else "cpu")
    data = CharDataset.from_pydoc_topics()
    cfg = model_config(data, block_size=block_size, n_layer=n_layer, n_head=n_head,
                       n_embd=n_embd)
    rows = []
    for impl in MODEL_IMPLS:
        torch._dynamo.reset()
        model = build(cfg, impl, seed=0, device=device)
        graphs = breaks = None
        if compile:
            x, y = data.get_batch("train", batch_size, block_size,
                                  torch.Generator().manual_seed(0), device)
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                                enabled=torch.device(device).type == "cuda"):
                explained = torch._dynamo.explain(model)(x, y)
            graphs, breaks = explained.graph_count, explained.graph_break_count
            torch._dynamo.reset()
            runner = torch.compile(model, mode=mode)
        else:
            runner = model
        res = train(runner, data, steps=steps, batch_size=batch_size, lr=lr,
                    timing_warmup=min(timing_warmup, steps - 1), eval_every=steps, eval_iters=2)
        for step, loss in zip(res["step"], res["train_loss"]):
            rows.append(dict(suite="model", case=f"gpt-{impl}", provider=impl, step=step,
                             train_loss=loss, ms_per_step=res["ms_per_step"],
                             tokens_per_s=res["tokens_per_s"], graphs=graphs,
                             graph_breaks=breaks, compiled=compile,
                             compile_mode=mode if compile else None, amp_dtype=res["amp_dtype"],
                             batch=batch_size, seq_len=block_size, n_layer=n_layer,
                             heads=n_head, head_dim=n_embd // n_head, available=True))
    return rows


def model_summary(rows: list) -> str:
    """ms/step, graphs and breaks per impl, and how far apart the two loss curves are."""
    by = {}
    for r in rows:
        by.setdefault(r["provider"], []).append(r)
    lines = [f"{'rope':10s} {'ms/step':>8s} {'tokens/s':>10s} {'graphs':>6s} {'breaks':>6s} "
             f"{'first loss':>10s} {'last loss':>9s}"]
    for impl, rs in by.items():
        r = rs[0]
        lines.append(f"{impl:10s} {r['ms_per_step']:8.2f} {r['tokens_per_s']:10.0f} "
                     f"{str(r['graphs']):>6s} {str(r['graph_breaks']):>6s} "
                     f"{rs[0]['train_loss']:10.4f} {rs[-1]['train_loss']:9.4f}")
    if len(by) == 2:
        a, b = by.values()
        diff = max(abs(x["train_loss"] - y["train_loss"]) for x, y in zip(a, b))
        ratio = b[0]["ms_per_step"] / a[0]["ms_per_step"]
        lines.append(f"largest loss difference over {len(a)} steps: {diff:.4f}; "
                     f"ropelib step time / reference: {ratio:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ropelib.course.model_step",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200,
                    help="training steps per rope implementation (default 200)")
    ap.add_argument("--mode", default="default",
                    choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                    help="torch.compile's mode (reduce-overhead: CUDA graphs, what a host-bound "
                         "step wants)")
    ap.add_argument("--out", default=None,
                    help="CSV path, or a folder for model-<gpu-slug>-<date>.csv (default: the "
                         "current folder)")
    args = ap.parse_args(argv)
    if not on_gpu():
        ap.error("needs a CUDA GPU (a 4-layer GPT, 200 compiled steps per implementation)")
    if args.steps < 2:
        ap.error("--steps must be >= 2")
    meta = environment_meta()
    meta["suite"] = "model"
    meta["compile_mode"] = args.mode
    rows = model_suite(steps=args.steps, mode=args.mode)
    out = out_path(args.out, "model", meta)
    write_csv(rows, out, meta=meta)
    print(model_summary(rows))
    print(f"{len(rows)} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
