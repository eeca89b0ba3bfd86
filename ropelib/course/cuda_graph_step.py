"""One training step of a model captured in a CUDA graph and replayed: the step's kernels launched
by one call, so the device sets the pace and the host's Python, dispatch and launch costs drop
out (notebook 09, appendix A.4, "who saves what"; `benchmarks/graph_pair_probe.py`).

The step: the forward under bf16 autocast, the backward, gradient clipping to norm 1 and an AdamW
step (its capturable for-each version, which a graph can hold). The graph reads and writes
memory it does not own: the model's weights and gradients and the optimizer's state. The replay
that `graphed_step` returns holds the optimizer and the graph (its attribute `holds`), so none of
that memory is freed while a caller can still replay. `torch.cuda.graph` empties the caching
allocator's cache when a capture starts, so memory a graph still reads but nobody holds can be
handed back to the driver, and a replay may then read memory that is no longer mapped.
`benchmarks/graph_pair_probe.py --arm freed` reproduces that: it keeps only
`replay.holds[0].replay`, the graph's own replay, and lets the optimizer go.
"""
from typing import Callable

import torch

__all__ = ["graphed_step"]


def graphed_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float = 1e-4,
                 amp_dtype: torch.dtype = torch.bfloat16, grad_clip: float = 1.0,
                 warmup: int = 3) -> Callable[[], None]:
    """`model`'s training step on the batch (x, y), captured once in a CUDA graph.

    Args:
        model: a module on a CUDA device whose `model(x, y)` returns `(logits, loss)` (the
            course's GPT).
        x, y: the batch, on the model's device; every replay trains on these same tensors
            (write new data into them in place to train on other batches).
        lr: AdamW's learning rate (betas (0.9, 0.95), `capturable=True`).
        amp_dtype: autocast's dtype for the forward (its cast cache off, as capturing a CUDA
            graph under autocast requires).
        grad_clip: the gradients' norm is clipped to this.
        warmup: steps run on a side stream before the capture (Triton compiles its kernels,
            AdamW builds its state, the allocator sees the step's sizes).

    Returns:
        `replay()`: runs the captured step once (not synchronised). `replay.holds` is
        `(graph, optimizer)`, kept alive as long as `replay` is.
    """
    if not x.is_cuda or not y.is_cuda or not next(model.parameters()).is_cuda:
        raise ValueError("graphed_step captures a CUDA graph: the model, x and y must be on a "
                         f"CUDA device (got x on {x.device}, y on {y.device}, the model on "
                         f"{next(model.parameters()).device})")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), capturable=True)

    def step():
        with torch.autocast("cuda", dtype=amp_dtype, cache_enabled=False):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):            # warm-up: Triton compiles, AdamW builds its state
        for _ in range(warmup):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)          # the captured backward allocates the gradients
    with torch.cuda.graph(graph):
        step()

    def replay():
        graph.replay()

    replay.holds = (graph, opt)              # alive as long as the replay is
    return replay
