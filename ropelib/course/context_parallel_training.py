"""Context parallelism for the course's demo GPT: `ropelib.course.model.GPT` trained with every
sequence split across ranks (notebook 11, benchmarks/cp_train.py).

    dist.init_process_group("nccl")                       # torchrun --nproc_per_node N ...
    torch.manual_seed(0); model = context_parallel(GPT(cfg), group=None).cuda()
    opt = make_optimizer(model, lr=1e-3)
    x, y = data.get_batch("train", B, cfg.block_size, g, "cuda")      # the same batch on every rank
    loss = train_step(model, opt, shard(x), shard(y))     # the loss of the whole batch

The split, the collectives and the attention over the whole sequence are the product's
(`ropelib.context_parallel`); this module wraps the demo GPT's attention with them
(`ContextParallelAttention`) and trains the result (`train_step`, `train`).
"""
import math
import time
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import reference
from ..context_parallel import (_check_split, all_gather_seq, all_reduce_grads,
                                 dual_chunk_attention, dual_chunk_positions, global_order,
                                 group_size_rank, mean_across_ranks, shard)
from .model import GPT, CausalSelfAttention, CharDataset, ROPE_LABEL

__all__ = ["ContextParallelAttention", "context_parallel", "make_optimizer", "train_step",
           "train"]


class ContextParallelAttention(nn.Module):
    """`ropelib.course.model.CausalSelfAttention` with the sequence split over `group`.

    Takes over the attention's own qkv, proj and rotary modules (same parameters, same
    state_dict keys); forward maps this rank's x [B, S_loc, C] to [B, S_loc, C]. With one rank
    it computes exactly what the wrapped attention does.
    """

    def __init__(self, attn: CausalSelfAttention, group=None):
        super().__init__()
        if not isinstance(attn, CausalSelfAttention):
            raise TypeError(f"attn must be a ropelib.course.model.CausalSelfAttention, got "
                            f"{type(attn).__name__}")
        self.n_head, self.head_dim, self.dropout = attn.n_head, attn.head_dim, attn.dropout
        self.qkv, self.proj, self.rotary = attn.qkv, attn.proj, attn.rotary
        self.group = group
        self._orders = {}

    def _order(self, local_len, cp_size, device):
        key = (local_len, cp_size, str(device))
        if key not in self._orders:
            self._orders[key] = global_order(local_len, cp_size, device)
        return self._orders[key]

    def _rope(self, q, k, cp_size, cp_rank):
        """RoPE of this rank's q, k [B, S_loc, H, D] at their global positions."""
        S = q.shape[1] * cp_size
        rows = self.rotary.freqs.shape[0]
        if S > rows:
            raise ValueError(f"the global sequence has {S} tokens (local {q.shape[1]} x cp_size "
                             f"{cp_size}), more than block_size={rows}")
        with torch.profiler.record_function(ROPE_LABEL):
            if self.rotary.impl == "ropelib":
                from ..api import apply_rope_qk   # the kernel maps local index -> global position
                return apply_rope_qk(q, k, self.rotary.freqs[:S], layout="bshd",
                                     cp_size=cp_size, cp_rank=cp_rank)
            pos = dual_chunk_positions(q.shape[1], cp_size, cp_rank, q.device)
            cos, sin = self.rotary.cos[pos, None, :], self.rotary.sin[pos, None, :]  # [S_loc, 1, R]
            return (reference.apply_rope_ref(q.float(), cos, sin).to(q.dtype),
                    reference.apply_rope_ref(k.float(), cos, sin).to(k.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cp_size, cp_rank = group_size_rank(self.group)
        B, S_loc, C = x.shape
        q, k, v = self.qkv(x).view(B, S_loc, 3, self.n_head, self.head_dim).unbind(2)
        q, k = self._rope(q, k, cp_size, cp_rank)
        dropout_p = self.dropout if self.training else 0.0
        if cp_size == 1:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True,
                                               dropout_p=dropout_p)
        else:
            _check_split(S_loc, cp_size, cp_rank)
            kv = torch.stack((k.transpose(0, 1), v.transpose(0, 1)), 1)   # [S_loc, 2, B, H, D]
            kv = all_gather_seq(kv, self.group)                     # [S, 2, B, H, D], rank-major
            kv = kv.index_select(0, self._order(S_loc, cp_size, kv.device))   # global order
            k_all, v_all = kv.permute(1, 2, 3, 0, 4).unbind(0)      # [B, H, S, D] each
            y = dual_chunk_attention(q.transpose(1, 2), k_all, v_all, cp_size, cp_rank,
                                     dropout_p)
        return self.proj(y.transpose(1, 2).reshape(B, S_loc, C))


def context_parallel(model: GPT, group=None) -> GPT:
    """Make `model` context-parallel over `group` (default: the default process group), in place:
    every block's attention becomes a `ContextParallelAttention` over the same parameters.
    The model then takes each rank's `shard` of the batch: idx [B, S / cp_size]; its loss is the
    mean over this rank's tokens (`mean_across_ranks` gives the whole batch's). Returns model.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a ropelib.course.model.GPT, got {type(model).__name__}")
    for block in model.blocks:
        if not isinstance(block.attn, ContextParallelAttention):
            block.attn = ContextParallelAttention(block.attn, group)
    return model


# --- training ---------------------------------------------------------------------------------

def make_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """AdamW as `ropelib.course.model.train` sets it up: decay on matrices, none on gains and
    biases."""
    device = next(model.parameters()).device
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def train_step(model: GPT, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               *, group=None, grad_clip: float = 1.0, amp_dtype=None) -> torch.Tensor:
    """One optimizer step on this rank's shard x, y [B, S_loc] (the whole batch in one process).

    Forward, backward (the all-gathers' reduce-scatters run inside), gradients averaged over the
    group, clipped (the same norm on every rank), stepped. Returns the whole batch's loss,
    detached, on the device (no host sync).
    """
    device = x.device
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    all_reduce_grads(model, group)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return mean_across_ranks(loss, group)


def lr_schedule(it: int, steps: int, lr: float, min_lr: Optional[float] = None,
                warmup: Optional[int] = None) -> float:
    """The learning rate `train` sets for step `it` (from 0) of a `steps`-step run: a linear
    warmup over `warmup` steps (by default min(100, steps // 10)), then a cosine from `lr` down
    to `min_lr` (by default lr / 10) over the rest. The schedule depends on `steps`: two runs
    of different lengths part from their second step on unless both warm up over it."""
    min_lr = lr / 10 if min_lr is None else min_lr
    warmup = min(100, steps // 10) if warmup is None else warmup
    if it < warmup:
        return lr * (it + 1) / warmup
    t = (it - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))


def train(model: GPT, data: CharDataset, *, steps: int, batch_size: int, group=None,
          lr: float = 1e-3, min_lr: Optional[float] = None, warmup: Optional[int] = None,
          weight_decay: float = 0.1, grad_clip: float = 1.0, seed: int = 0, amp_dtype=None,
          timing_warmup: Optional[int] = None, stop_after: Optional[int] = None,
          on_step=None) -> dict:
    """Train a `context_parallel` model (or a plain GPT with group=None in one process) with the
    schedule of `ropelib.course.model.train`: AdamW, linear warmup, cosine decay to min_lr.

    Every rank draws the same batches (a generator seeded with `seed`) of block_size tokens and
    keeps its `shard`, so a 1-process run with the same seed sees the same data. `on_step(it,
    loss)` is called with the loss as a float after every step (a host sync; None: no sync).
    `stop_after=n` runs only the first n steps of the `steps`-step schedule (a baseline for the
    start of a longer run).

    Returns `step`, `train_loss` (the whole batch's, every step), `tokens_per_s` and
    `ms_per_step` (whole-batch tokens over the steps after `timing_warmup`; by default
    min(5, steps // 5), and at least the first step, which compiles, where there are two or
    more), `train_time_s`,
    `cp_size`, and on a GPU `peak_mem_gib` (this rank's peak allocated memory).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    run_steps = steps if stop_after is None else stop_after
    if not 1 <= run_steps <= steps:
        raise ValueError(f"stop_after must be in [1, steps={steps}], got {stop_after}")
    cp_size, cp_rank = group_size_rank(group)
    device = next(model.parameters()).device
    T = model.config.block_size
    min_lr = lr / 10 if min_lr is None else min_lr
    warmup = min(100, steps // 10) if warmup is None else warmup
    if timing_warmup is None:       # the first step compiles: never in the summary of 2 or more
        timing_warmup = min(5, max(1, run_steps // 5)) if run_steps > 1 else 0
    opt = make_optimizer(model, lr, weight_decay)

    def lr_at(it):
        return lr_schedule(it, steps, lr, min_lr, warmup)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    g = torch.Generator().manual_seed(seed)
    losses = torch.zeros(run_steps, device=device)
    t_all, t_start = time.perf_counter(), None
    model.train()
    for it in range(run_steps):
        if it == timing_warmup:
            sync()
            t_start = time.perf_counter()
        for group_ in opt.param_groups:
            group_["lr"] = lr_at(it)
        x, y = data.get_batch("train", batch_size, T, g, device)
        x, y = shard(x, cp_size, cp_rank), shard(y, cp_size, cp_rank)
        losses[it] = train_step(model, opt, x, y, group=group, grad_clip=grad_clip,
                                amp_dtype=amp_dtype)
        if on_step is not None:
            on_step(it, losses[it].item())
    sync()
    t_end = time.perf_counter()
    timed = run_steps - timing_warmup
    elapsed = t_end - t_start if t_start is not None else float("nan")
    return {
        "step": list(range(1, run_steps + 1)),
        "train_loss": losses.tolist(),
        "tokens_per_s": timed * batch_size * T / elapsed if timed else float("nan"),
        "ms_per_step": 1e3 * elapsed / timed if timed else float("nan"),
        "train_time_s": t_end - t_all,
        "cp_size": cp_size,
        "peak_mem_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                         if device.type == "cuda" else None),
    }
