"""Context parallelism: RoPE'd attention with every sequence split across ranks.

Long sequences cost activation memory in proportion to their length. Context parallelism (CP)
splits each sequence over the `cp_size` ranks of a `torch.distributed` group (NCCL on GPUs, gloo
on CPUs), so every rank holds `S / cp_size` tokens of every layer's activations:

    dist.init_process_group("nccl")                       # torchrun --nproc_per_node N ...
    x = shard(x)                              # this rank's dual-chunk share of [B, S, ...]
    q, k = apply_rope_qk(q, k, freqs, cp_size=cp_size, cp_rank=cp_rank)   # global positions
    k_all = all_gather_seq(k_seq_major).index_select(0, global_order(S_loc, cp_size))
    y = dual_chunk_attention(q, k_all, v_all, cp_size, cp_rank)   # (v gathered the same way)

`ropelib.course.context_parallel_training` puts these together for the course's demo GPT
(`ContextParallelAttention`, `context_parallel`, `train_step`, `train`).

The split is Transformer Engine's dual-chunk one: the sequence is cut into 2*cp_size chunks and
rank r holds chunks r and 2*cp_size-1-r. Under a causal mask a token at position p attends p+1
keys, so chunk r alone would give rank cp_size-1 the most work; pairing an early chunk with a
late one gives every rank the same number of (query, key) pairs. With S = 8 and cp_size = 2:

    global positions   0 1 | 2 3 | 4 5 | 6 7      chunks 0..3 of seg = S / (2 * cp_size) = 2
    rank 0 holds       0 1               6 7      chunks 0 and 3
    rank 1 holds             2 3   4 5            chunks 1 and 2

What each rank does in every attention layer (as `ropelib.course.context_parallel_training`'s
`ContextParallelAttention` does it):

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
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from . import reference

__all__ = ["dual_chunk_positions", "shard", "global_order", "unshard", "all_gather_seq",
           "dual_chunk_attention", "group_size_rank", "all_reduce_grads", "broadcast_params",
           "mean_across_ranks"]


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
