"""Context parallelism: train `ropelib.model.GPT` with every sequence split across ranks.

Long sequences cost activation memory in proportion to their length. Context parallelism (CP)
splits each sequence over the `cp_size` ranks of a `torch.distributed` group (NCCL on GPUs, gloo
on CPUs), so every rank holds `S / cp_size` tokens of every layer's activations:

    dist.init_process_group("nccl")                       # torchrun --nproc_per_node N ...
    torch.manual_seed(0); model = context_parallel(GPT(cfg), group=None).cuda()
    opt = make_optimizer(model, lr=1e-3)
    x, y = data.get_batch("train", B, cfg.block_size, g, "cuda")      # the same batch on every rank
    loss = train_step(model, opt, shard(x), shard(y))     # the loss of the whole batch

The split is Transformer Engine's dual-chunk one: the sequence is cut into 2*cp_size chunks and
rank r holds chunks r and 2*cp_size-1-r. Under a causal mask a token at position p attends p+1
keys, so chunk r alone would give rank cp_size-1 the most work; pairing an early chunk with a
late one gives every rank the same number of (query, key) pairs. With S = 8 and cp_size = 2:

    global positions   0 1 | 2 3 | 4 5 | 6 7      chunks 0..3 of seg = S / (2 * cp_size) = 2
    rank 0 holds       0 1               6 7      chunks 0 and 3
    rank 1 holds             2 3   4 5            chunks 1 and 2

What each rank does in every attention layer (`ContextParallelAttention`):

1. q, k, v of its own tokens [B, S_loc, H, D]; RoPE by ropelib with `cp_size`, `cp_rank`, so every
   token is rotated by its *global* position (the kernel maps local index -> global position).
2. All-gather k and v along the sequence (`all_gather_seq`, one collective for both). Autograd
   sees it: the backward of an all-gather is a reduce-scatter, which sums what every rank's
   queries contributed to the gradient of this rank's keys and values.
3. Reorder the gathered [rank 0's tokens, rank 1's tokens, ...] to global order
   (`global_order`), then attend with the causal mask by global positions. Each local chunk is
   a block of consecutive positions [p0, p0 + seg), so it sees exactly the keys [0, p0 + seg)
   with a causal mask aligned to the bottom right: two `scaled_dot_product_attention` calls with
   `causal_lower_right`, no [S_loc, S] mask in memory (flash / memory-efficient kernels apply).

Everything else in a transformer is per token: embeddings, MLPs, norms and the loss need no
communication. Each rank's loss is the mean over its tokens; every rank holds the same number
of tokens, so the mean of the ranks' losses is the loss of the whole batch, and the mean of the
ranks' gradients (`all_reduce_grads`, DDP-style) is its gradient. Data parallelism is not
mixed in here: every rank of the group sees the same batch.
"""
import math
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from . import reference
from .model import GPT, CausalSelfAttention, CharDataset, ROPE_LABEL

__all__ = ["dual_chunk_positions", "shard", "global_order", "unshard", "all_gather_seq",
           "dual_chunk_attention", "ContextParallelAttention", "context_parallel",
           "group_size_rank", "all_reduce_grads", "broadcast_params", "mean_across_ranks",
           "make_optimizer", "train_step", "train"]


# --- the dual-chunk split (pure PyTorch, no processes) ----------------------------------------

def _check_split(local_len: int, cp_size: int, cp_rank: int) -> None:
    if type(cp_size) is not int or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")
    if type(cp_rank) is not int or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be an int in [0, cp_size={cp_size}), got {cp_rank!r}")
    if cp_size > 1 and local_len % 2:
        raise ValueError(f"with cp_size={cp_size} every rank holds two chunks, so the local "
                         f"sequence length must be even, got {local_len} (the global length "
                         f"must be a multiple of 2*cp_size = {2 * cp_size})")


def dual_chunk_positions(local_len: int, cp_size: int, cp_rank: int, device=None) -> torch.Tensor:
    """Global positions [local_len] (int64) of the tokens rank `cp_rank` holds: chunks cp_rank
    and 2*cp_size-1-cp_rank of a sequence of cp_size * local_len tokens."""
    _check_split(local_len, cp_size, cp_rank)
    return reference._cp_positions(local_len, cp_size, cp_rank, device)   # the one definition


def shard(t: torch.Tensor, cp_size: Optional[int] = None, cp_rank: Optional[int] = None, *,
          dim: int = 1, group=None) -> torch.Tensor:
    """The dual-chunk share of `t` along `dim` (default 1: the S of [B, S, ...] batches) that rank
    cp_rank holds. cp_size and cp_rank default to the group's (see `group_size_rank`)."""
    if cp_size is None or cp_rank is None:
        g_size, g_rank = group_size_rank(group)
        cp_size = g_size if cp_size is None else cp_size
        cp_rank = g_rank if cp_rank is None else cp_rank
    _check_split(2, cp_size, cp_rank)      # the types and ranges (a length is checked below)
    S = t.shape[dim]
    if S % cp_size:
        raise ValueError(f"t has {S} positions along dim {dim}, not a multiple of "
                         f"cp_size={cp_size}")
    if cp_size == 1:
        return t
    local = S // cp_size
    _check_split(local, cp_size, cp_rank)
    seg = local // 2
    return torch.cat((t.narrow(dim, cp_rank * seg, seg),
                      t.narrow(dim, S - (cp_rank + 1) * seg, seg)), dim)


def global_order(local_len: int, cp_size: int, device=None) -> torch.Tensor:
    """Index [cp_size * local_len] that puts an all-gathered sequence (rank 0's tokens, then rank
    1's, ...) in global order: `gathered.index_select(dim, global_order(...))`."""
    held = torch.cat([dual_chunk_positions(local_len, cp_size, r) for r in range(cp_size)])
    return torch.argsort(held).to(device)


def unshard(shards, dim: int = 1) -> torch.Tensor:
    """Inverse of `shard`: the shards of ranks 0..cp_size-1 -> the whole tensor in global order."""
    shards = list(shards)
    gathered = torch.cat(shards, dim)
    order = global_order(shards[0].shape[dim], len(shards), gathered.device)
    return gathered.index_select(dim, order)


# --- communication ----------------------------------------------------------------------------

def group_size_rank(group=None) -> tuple:
    """(cp_size, cp_rank) of `group` (the default group when None); (1, 0) without
    torch.distributed, so the same code runs in one process."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


# torch >= 2.13 names them *_single; older releases only have *_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllGatherSeq(torch.autograd.Function):
    """[n, ...] on each rank -> [cp_size * n, ...] (rank-major) on every rank; backward: the
    gathered gradient summed over ranks, each rank keeping its own n rows (reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        size = dist.get_world_size(group)
        out = x.new_empty((size * x.shape[0], *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        size = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // size, *grad.shape[1:]))
        _reduce_scatter(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_gather_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather x [n, ...] along dim 0 over `group`, autograd-aware: [cp_size * n, ...] with
    rank r's rows at [r*n, (r+1)*n)."""
    if group_size_rank(group)[0] == 1:
        return x
    return _AllGatherSeq.apply(x, group)


def all_reduce_grads(model: nn.Module, group=None) -> None:
    """Average every parameter's gradient over `group` (one flat all-reduce, like DDP's buckets).

    A rank whose parameter got no gradient contributes zeros, so every rank ends with the same
    grads whichever parameters its tokens used."""
    size = group_size_rank(group)[0]
    if size == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def broadcast_params(model: nn.Module, group=None) -> None:
    """Copy the parameters and buffers of the group's first rank to every rank (models built
    from the same seed are equal already; this makes it so whatever the seeding)."""
    if group_size_rank(group)[0] == 1:
        return
    src = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src, group=group)


def mean_across_ranks(t: torch.Tensor, group=None) -> torch.Tensor:
    """The mean over `group` of a (detached) tensor, e.g. each rank's loss."""
    size = group_size_rank(group)[0]
    t = t.detach().clone()
    if size > 1:
        dist.all_reduce(t, group=group)
        t /= size
    return t


# --- attention over the whole sequence --------------------------------------------------------

def dual_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp_size: int,
                         cp_rank: int, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal attention of one rank's queries against the whole sequence's keys and values.

    q [B, H, S_loc, D]: this rank's dual-chunk share; k, v [B, H, S, D] in global order
    (S = cp_size * S_loc). The mask is causal by global positions: each of the two local chunks
    holds consecutive positions [p0, p0 + seg), so it attends keys [0, p0 + seg) with a
    lower-right-aligned causal mask. Returns [B, H, S_loc, D].
    """
    from torch.nn.attention.bias import causal_lower_right

    S_loc, S = q.shape[2], k.shape[2]
    if S != cp_size * S_loc:
        raise ValueError(f"k holds {S} positions, expected cp_size * S_loc = {cp_size * S_loc}")
    if cp_size == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    _check_split(S_loc, cp_size, cp_rank)
    seg = S_loc // 2
    outs = []
    for i, end in enumerate(((cp_rank + 1) * seg, S - cp_rank * seg)):   # chunk ends (exclusive)
        qi = q[:, :, i * seg:(i + 1) * seg]
        outs.append(F.scaled_dot_product_attention(
            qi, k[:, :, :end], v[:, :, :end], attn_mask=causal_lower_right(seg, end),
            dropout_p=dropout_p))
    return torch.cat(outs, dim=2)


class ContextParallelAttention(nn.Module):
    """`ropelib.model.CausalSelfAttention` with the sequence split over `group`.

    Takes over the attention's own qkv, proj and rotary modules (same parameters, same
    state_dict keys); forward maps this rank's x [B, S_loc, C] to [B, S_loc, C]. With one rank
    it computes exactly what the wrapped attention does.
    """

    def __init__(self, attn: CausalSelfAttention, group=None):
        super().__init__()
        if not isinstance(attn, CausalSelfAttention):
            raise TypeError(f"attn must be a ropelib.model.CausalSelfAttention, got "
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
                from .api import apply_rope_qk   # the kernel maps local index -> global position
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
        raise TypeError(f"model must be a ropelib.model.GPT, got {type(model).__name__}")
    for block in model.blocks:
        if not isinstance(block.attn, ContextParallelAttention):
            block.attn = ContextParallelAttention(block.attn, group)
    return model


# --- training ---------------------------------------------------------------------------------

def make_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """AdamW as `ropelib.model.train` sets it up: decay on matrices, none on gains and biases."""
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


def train(model: GPT, data: CharDataset, *, steps: int, batch_size: int, group=None,
          lr: float = 1e-3, min_lr: Optional[float] = None, warmup: Optional[int] = None,
          weight_decay: float = 0.1, grad_clip: float = 1.0, seed: int = 0, amp_dtype=None,
          timing_warmup: Optional[int] = None, stop_after: Optional[int] = None,
          on_step=None) -> dict:
    """Train a `context_parallel` model (or a plain GPT with group=None in one process) with the
    schedule of `ropelib.model.train`: AdamW, linear warmup, cosine decay to min_lr.

    Every rank draws the same batches (a generator seeded with `seed`) of block_size tokens and
    keeps its `shard`, so a 1-process run with the same seed sees the same data. `on_step(it,
    loss)` is called with the loss as a float after every step (a host sync; None: no sync).
    `stop_after=n` runs only the first n steps of the `steps`-step schedule (a baseline for the
    start of a longer run).

    Returns `step`, `train_loss` (the whole batch's, every step), `tokens_per_s` and
    `ms_per_step` (whole-batch tokens over the steps after `timing_warmup`), `train_time_s`,
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
    timing_warmup = min(5, run_steps // 5) if timing_warmup is None else timing_warmup
    opt = make_optimizer(model, lr, weight_decay)

    def lr_at(it):
        if it < warmup:
            return lr * (it + 1) / warmup
        t = (it - warmup) / max(1, steps - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))

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
