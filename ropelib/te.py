"""Drop-ins for Transformer Engine 2.x's RoPE functions: swap one import.

    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
    from ropelib.te import apply_rotary_pos_emb          # same signature, same defaults

`fused=True` runs ropelib's finished kernel (fp32 math, one rounding, as TE's fused CUDA
kernel); `fused=False` runs TE's plain-PyTorch path (cos/sin rounded to the input dtype),
line for line, so results match whichever TE path a model used.
"""
from typing import List, Optional, Tuple

import torch

from . import validation as V
from .api import Plan, _run, _view4, apply_rope, plan
from .kernels.launch import Segment
from .reference import te_unfused

__all__ = ["apply_rotary_pos_emb", "apply_fused_qkv_rotary_pos_emb"]


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         start_positions: Optional[torch.Tensor] = None,
                         interleaved: bool = False, fused: bool = False,
                         cu_seqlens: Optional[torch.Tensor] = None, cp_size: int = 1,
                         cp_rank: int = 0) -> torch.Tensor:
    """Transformer Engine's `apply_rotary_pos_emb`.

    Args:
        t: `[s, b, h, d]`, `[b, s, h, d]` or `[t, h, d]`.
        freqs: angles `[s2, 1, 1, d2]`, `s2 >= s * cp_size`, `d2 <= d`.
        tensor_format: "sbhd", "bshd" or "thd".
        start_positions: `[b]` per-sequence offsets (KV-cache decoding).
        interleaved: pair features (2j, 2j+1).
        fused: True runs ropelib's kernel; False TE's unfused PyTorch path.
        cu_seqlens: `[b + 1]` int32 cumulative (padded, global) sequence lengths for "thd".
        cp_size, cp_rank: context parallelism (dual-chunk split).
    """
    if tensor_format == "thd" and cu_seqlens is None:
        raise ValueError("cu_seqlens must not be None when tensor_format is 'thd'")
    if fused:
        return apply_rope(t, freqs, layout=tensor_format, interleaved=interleaved,
                          start_positions=start_positions, cu_seqlens=cu_seqlens,
                          cp_size=cp_size, cp_rank=cp_rank)
    # The unfused path validates as the kernel path does (on any device), then follows TE exactly.
    plan(t, freqs, layout=tensor_format, interleaved=interleaved, start_positions=start_positions,
         cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank, name="t", kernel_device=False)
    return te_unfused(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                      cp_size, cp_rank)


def _qkv_segments(qkv4: torch.Tensor, split, n_q: int):
    """[S, B, G, dq + dk + dv] -> strided q/k/v pieces of the packed tensor (no copy).

    q: head h = g * n_q + i lives at g * stride_g + i * dk, i.e. grouped with hpg = n_q.
    """
    dq, dk, dv = split
    st = qkv4.stride()
    G = qkv4.shape[2]
    q_part = qkv4[..., :dq]
    k_part = qkv4[..., dq:dq + dk]
    v_part = qkv4[..., dq + dk:]
    q_strides = (st[0], st[1], st[2], dk * st[3], st[3])
    return q_part, q_strides, G * n_q, k_part, v_part


class _FusedQKVFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, pq: Plan, pk: Plan, split, layout):
        dq, dk, dv = split
        n_q = dq // dk
        qkv4 = _view4(qkv, layout)
        S, B, G = qkv4.shape[0], qkv4.shape[1], qkv4.shape[2]
        shape = (lambda h, d: (S, B, h, d)) if layout == "sbhd" else (lambda h, d: (B, S, h, d))
        qo = torch.empty(shape(G * n_q, dk), dtype=qkv.dtype, device=qkv.device)
        ko = torch.empty(shape(G, dk), dtype=qkv.dtype, device=qkv.device)
        vo = torch.empty(shape(G, dv), dtype=qkv.dtype, device=qkv.device)
        q_part, q_strides, HQ, k_part, v_part = _qkv_segments(qkv4, split, n_q)
        qo4, ko4, vo4 = _view4(qo, layout), _view4(ko, layout), _view4(vo, layout)
        qseg = Segment(q_part, qo4, HQ, q_strides, _grouped(qo4, n_q), hpg=n_q)
        _run(pq, [qseg, Segment.of(k_part, ko4)], backward=False, copy_pass=True, k_plan=pk,
             v=Segment.of(v_part, vo4))
        ctx.plans, ctx.split, ctx.layout, ctx.shape = (pq, pk), split, layout, qkv.shape
        return qo, ko, vo

    @staticmethod
    def backward(ctx, gq, gk, gv):
        pq, pk = ctx.plans
        split, layout = ctx.split, ctx.layout
        dq, dk, dv = split
        n_q = dq // dk
        dev = next(g for g in (gq, gk, gv) if g is not None).device
        dtype = next(g for g in (gq, gk, gv) if g is not None).dtype
        gqkv = torch.empty(ctx.shape, dtype=dtype, device=dev)
        g4 = _view4(gqkv, layout)
        gq_part, gq_strides, HQ, gk_part, gv_part = _qkv_segments(g4, split, n_q)
        if gq is None:
            gq_part.zero_()
        if gk is None:
            gk_part.zero_()
        if gv is None:
            gv_part.zero_()
        segs = []
        if gq is not None:
            gq4 = _view4(gq, layout)
            segs.append(Segment(gq4, gq_part, HQ, _grouped(gq4, n_q), gq_strides, hpg=n_q))
        if gk is not None:
            segs.append(Segment.of(_view4(gk, layout), gk_part))
        v = Segment.of(_view4(gv, layout), gv_part) if gv is not None else None
        if segs:
            _run(pq if gq is not None else pk, segs, backward=True, copy_pass=True,
                 k_plan=pk if len(segs) == 2 else None, v=v)
        elif v is not None:
            gv_part.copy_(_view4(gv, layout))
        return gqkv, None, None, None, None


def _grouped(t4: torch.Tensor, hpg: int) -> tuple:
    """Strides of a plain [S, B, H, D] view written in grouped form (hpg heads per group)."""
    st = t4.stride()
    return (st[0], st[1], hpg * st[2], st[2], st[3])


def apply_fused_qkv_rotary_pos_emb(qkv: torch.Tensor, q_freqs: torch.Tensor,
                                   k_freqs: torch.Tensor, qkv_split_arg_list: List[int],
                                   tensor_format: str = "sbhd",
                                   start_positions: Optional[torch.Tensor] = None,
                                   interleaved: bool = False,
                                   cu_seqlens: Optional[torch.Tensor] = None,
                                   cp_size: int = 1, cp_rank: int = 0
                                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Transformer Engine's `apply_fused_qkv_rotary_pos_emb`: q and k rotated, v copied, one launch.

    Args:
        qkv: `[s, b, g, dq + dk + dv]` (or bshd) with q, k and v of each KV group concatenated
            along the last dim; `dq` is a multiple of `dk` (dq / dk query heads per group).
        q_freqs, k_freqs: angles `[s2, 1, 1, d2]`.
        qkv_split_arg_list: `[dq, dk, dv]`.
        cu_seqlens: unused (as in TE; "thd" is not supported there).
    Returns:
        (q `[s, b, g * dq/dk, dk]`, k `[s, b, g, dk]`, v `[s, b, g, dv]`), contiguous.
    """
    V.check_tensor(qkv, "qkv")
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"tensor_format must be 'sbhd' or 'bshd' for packed QKV, got {tensor_format!r}")
    if cp_size > 1 and start_positions is not None:
        raise ValueError("start_positions with cp_size > 1 is not supported (as in TE)")
    if (not isinstance(qkv_split_arg_list, (list, tuple)) or len(qkv_split_arg_list) != 3
            or not all(isinstance(v, int) and v > 0 for v in qkv_split_arg_list)):
        raise ValueError(f"qkv_split_arg_list must be 3 positive ints [dq, dk, dv], got {qkv_split_arg_list!r}")
    dq, dk, dv = qkv_split_arg_list
    if qkv.dim() != 4 or dq + dk + dv != qkv.shape[-1]:
        raise ValueError(f"qkv must be 4-D with last dim dq+dk+dv = {dq + dk + dv}, got {tuple(qkv.shape)}")
    if dq % dk:
        raise ValueError(f"qkv_split_arg_list: dq ({dq}) must be a multiple of dk ({dk})")
    opts = dict(layout=tensor_format, interleaved=interleaved, start_positions=start_positions,
                cp_size=cp_size, cp_rank=cp_rank)
    probe = qkv[..., dq:dq + dk]   # k's view: validates shapes, tables and positions
    pq = plan(probe, q_freqs, name="qkv", **opts)
    pk = plan(probe, k_freqs, name="qkv", **opts)
    if pq.R != pk.R:
        raise ValueError(f"q_freqs and k_freqs must have the same rotary dim, got {pq.R} and {pk.R}")
    return _FusedQKVFn.apply(qkv, pq, pk, (dq, dk, dv), tensor_format)
