"""Drop-ins for Transformer Engine 2.x's RoPE functions: swap one import.

    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
    from ropelib.te import apply_rotary_pos_emb          # same signature, same defaults

`fused=True` runs ropelib's finished kernel (fp32 math, one rounding, as TE's fused CUDA
kernel); `fused=False` runs TE's plain-PyTorch path (cos/sin rounded to the input dtype),
line for line, so results match whichever TE path a model used.
"""
from typing import List, Optional, Tuple

import torch

from . import ops
from . import validation as V
from .api import apply_rope, check_no_table_grad, needs_grad, prepare
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
        start_positions: `[b]` (or `[n_seq]` for "thd") per-sequence offsets. With
            `cp_size > 1` each sequence's positions are `start_positions[i]` plus the token's
            global (dual-chunk) position, and the table needs
            `max(start_positions) + seq_len * cp_size` rows, as in Transformer Engine.
        interleaved: pair features (2j, 2j+1).
        fused: True runs ropelib's kernel; False TE's unfused PyTorch path.
        cu_seqlens: `[b + 1]` int32 cumulative (padded, global) sequence lengths for "thd";
            ignored for "sbhd" and "bshd", as in Transformer Engine.
        cp_size, cp_rank: context parallelism (dual-chunk split).
    """
    if tensor_format == "thd" and cu_seqlens is None:
        raise ValueError("cu_seqlens must not be None when tensor_format is 'thd'")
    if tensor_format != "thd":
        cu_seqlens = None   # TE reads cu_seqlens only for "thd" and ignores it otherwise
    V.check_bool(fused, "fused")
    if fused:
        return apply_rope(t, freqs, layout=tensor_format, interleaved=interleaved,
                          start_positions=start_positions, cu_seqlens=cu_seqlens,
                          cp_size=cp_size, cp_rank=cp_rank)
    # The unfused path validates as the kernel path does (on any device), then follows TE exactly.
    if isinstance(freqs, torch.Tensor) and freqs.dtype in (torch.float16, torch.bfloat16):
        freqs_meta = freqs.float()   # TE's unfused path takes 16-bit angles as they are
    else:
        freqs_meta = freqs
    prepare(t, freqs_meta, layout=tensor_format, interleaved=interleaved,
            start_positions=start_positions, cu_seqlens=cu_seqlens, cp_size=cp_size,
            cp_rank=cp_rank, name="t", kernel_device=False)
    return te_unfused(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                      cp_size, cp_rank)


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
        start_positions, cp_size, cp_rank: as in `apply_rotary_pos_emb`; start_positions
            combine with cp_size > 1 the same way there (TE's fused QKV function refuses the
            combination; its kernel computes the same positions).
        cu_seqlens: unused (as in TE; "thd" is not supported there).
    Returns:
        (q `[s, b, g * dq/dk, dk]`, k `[s, b, g, dk]`, v `[s, b, g, dv]`), contiguous.
    """
    V.check_tensor(qkv, "qkv")
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"tensor_format must be 'sbhd' or 'bshd' for packed QKV, got {tensor_format!r}")
    if (not isinstance(qkv_split_arg_list, (list, tuple)) or len(qkv_split_arg_list) != 3
            or not all(type(v) is int and v > 0 for v in qkv_split_arg_list)):
        raise ValueError(f"qkv_split_arg_list must be 3 positive ints [dq, dk, dv], got {qkv_split_arg_list!r}")
    dq, dk, dv = qkv_split_arg_list
    if qkv.dim() != 4 or dq + dk + dv != qkv.shape[-1]:
        raise ValueError(f"qkv must be 4-D with last dim dq+dk+dv = {dq + dk + dv}, got {tuple(qkv.shape)}")
    if dq % dk:
        raise ValueError(f"qkv_split_arg_list: dq ({dq}) must be a multiple of dk ({dk})")
    opts = dict(layout=tensor_format, interleaved=interleaved, start_positions=start_positions,
                cp_size=cp_size, cp_rank=cp_rank)
    probe = qkv[..., dq:dq + dk]   # k's view: checks shapes, tables and positions
    cq = prepare(probe, q_freqs, name="qkv", **opts)
    ck = prepare(probe, k_freqs, name="qkv", **opts)
    if cq.R != ck.R:
        raise ValueError(f"q_freqs and k_freqs must have the same rotary dim, got {cq.R} and {ck.R}")
    check_no_table_grad(("q_freqs", cq.table), ("k_freqs", ck.table))
    rows = min(cq.table.shape[0], ck.table.shape[0])   # the kernel reads both with one length
    q_table, k_table = cq.table[:rows], ck.table[:rows]
    if q_table.stride() != k_table.stride():
        q_table, k_table = q_table.contiguous(), k_table.contiguous()
    start = cq.start_positions
    if needs_grad(qkv) and start is not None and start.is_inference():
        start = start.clone()
    return ops.rope_qkv(qkv, q_table, k_table, start, tensor_format, [dq, dk, dv],
                        interleaved, cp_size, cp_rank)
