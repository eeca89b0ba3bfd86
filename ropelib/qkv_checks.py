"""The argument checks of ropelib.qkv_rope_linear and ropelib.QKVRoPE: each bad argument raises
an error that names it and says what to pass.

Each check gives back what the kernels read of its arguments: the heads as ints, the angle
table as [P, R] (or Angles' turns and amplitude), position ids as [B or 1, S] and contiguous
index tensors, their values checked where they can be read without a synchronisation
(ropelib.set_index_checks). `sizes` says how the checks (and the plans) read x: (B, S, K) of
x [B, S, K], packed x [T, K] as one sequence set of T tokens.

A plain eager call is checked in full at the first call of its signature (qkv_plan.PlannedCall
keeps what the checks decided); a later call of it checks only the position values
(`checked_position_values`) and takes the table as `table_view` gives it.
"""
import numbers
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import validation as V
from .api import check_no_table_grad
from .conventions import QKV_LINEAR_DTYPES, QKV_LINEAR_LAYOUTS, QKV_LINEAR_MAX_HEAD_DIM
from .frequencies import EXACT_POSITIONS, Angles

DTYPES = QKV_LINEAR_DTYPES        # x and the weight
OUT_LAYOUTS = QKV_LINEAR_LAYOUTS
BACKWARDS = ("prologue", "dy")


def resolved_backward(backward: Optional[str]) -> str:
    """The backward qkv_rope_linear runs: `backward` checked; None is "dy" (dY written once,
    cuBLAS's GEMMs: the faster, measured)."""
    if backward is None:
        return "dy"
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be None or one of {BACKWARDS}, got {backward!r}")
    return backward


def sizes(x: Tensor) -> Tuple[int, int, int]:
    """(B, S, K) of x [B, S, K], or (1, T, K) of packed x [T, K]."""
    shape = x.shape
    if len(shape) == 3:
        return shape[0], shape[1], shape[2]
    return 1, shape[0], shape[1]


def table_positions(table: Tensor) -> int:
    """Positions a table serves (Angles' turns: every position up to 2^31 - 2)."""
    return EXACT_POSITIONS if table.dtype == torch.int64 else table.shape[0]


def check_count(v, name: str, minimum: int) -> int:
    """v as an int, at least `minimum` (an integral v converted; a bool is not a count)."""
    if type(v) is int and v >= minimum:       # (the common case, without the ABC's check)
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} ({v!r})")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def checked_heads(n_heads, n_kv_heads, head_dim) -> Tuple[int, int, int]:
    """(n_heads, n_kv_heads, head_dim) as ints: a head of q and of k and v at least, and
    head_dim from 2 to QKV_LINEAR_MAX_HEAD_DIM."""
    n_heads = check_count(n_heads, "n_heads", 1)
    n_kv_heads = check_count(n_kv_heads, "n_kv_heads", 1)
    head_dim = check_count(head_dim, "head_dim", 2)
    if head_dim > QKV_LINEAR_MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be <= {QKV_LINEAR_MAX_HEAD_DIM} (a head's columns live "
                         f"in one program's registers), got {head_dim}")
    return n_heads, n_kv_heads, head_dim


def check_out_layout(out_layout) -> None:
    """out_layout one of OUT_LAYOUTS: where q, k and v are put."""
    if out_layout not in OUT_LAYOUTS:
        raise ValueError(f"out_layout must be one of {OUT_LAYOUTS}, got {out_layout!r}")


def check_projection(x, weight, bias, n_heads, n_kv_heads, head_dim) -> None:
    """x [B, S, hidden] or [T, hidden] on a device the kernels run on; a fused nn.Linear's
    weight (and bias) in x's dtype, as many rows as the heads take."""
    V.check_tensor(x, "x", dims=(2, 3), dtypes=DTYPES)
    V.check_kernel_device(x, "x")
    V.check_tensor(weight, "weight", dims=(2,), dtypes=DTYPES)
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype ({x.dtype}), got {weight.dtype}")
    V.check_same_device(x, "x", weight=weight)
    K = x.shape[-1]
    if K == 0:      # (QKVRoPE's hidden_size >= 1 too: the backward kernels' grids are over K)
        raise ValueError(f"x's last dim (hidden) must be >= 1, got x of shape {tuple(x.shape)}")
    N = (n_heads + 2 * n_kv_heads) * head_dim
    if tuple(weight.shape) != (N, K):
        raise ValueError(f"weight must be [(n_heads + 2 n_kv_heads) * head_dim, hidden] = "
                         f"[({n_heads} + 2*{n_kv_heads}) * {head_dim}, {K}] = [{N}, {K}] "
                         f"(q's rows, then k's, then v's, as a fused nn.Linear stores them), "
                         f"got {tuple(weight.shape)}")
    if bias is not None:
        V.check_tensor(bias, "bias", dims=(1,), dtypes=DTYPES)
        if bias.dtype != x.dtype:
            raise TypeError(f"bias must have x's dtype ({x.dtype}), got {bias.dtype}")
        if bias.shape[0] != N:
            raise ValueError(f"bias must be [{N}] (one per output feature), got "
                             f"{tuple(bias.shape)}")
        V.check_same_device(x, "x", bias=bias)


def checked_table(freqs, angles, rotary_dim, head_dim: int, x: Tensor):
    """(table, sin, R): an angle table [P, R] (contiguous, sin None), or Angles' turns [R] and
    amplitude [1]."""
    if (freqs is None) == (angles is None):
        raise ValueError("pass freqs (angles [P, 1, 1, R] or [P, R], ropelib.rope_freqs) or "
                         "angles (ropelib.rope_angles: computed in the kernel, no table), "
                         "exactly one of them")
    if angles is not None:
        if not isinstance(angles, Angles):
            raise TypeError(f"angles must be a ropelib.frequencies.Angles (from "
                            f"ropelib.rope_angles), got {type(angles).__name__}")
        table, sin, name = angles.turns.contiguous(), angles.amplitude, "angles"
        R = angles.rot_dim
    else:
        table, sin, name = V.angle_table(freqs, "freqs").contiguous(), None, "freqs"
        R = table.shape[1]
    V.check_same_device(x, "x", **{name: table})
    V.check_rotary_dim(R, head_dim, name)
    if rotary_dim is not None:
        rotary_dim = check_count(rotary_dim, "rotary_dim", 2)
        if rotary_dim != R:
            raise ValueError(f"rotary_dim={rotary_dim} but {name} rotates {R} features (its "
                             f"last dim{'' if freqs is not None else ': rot_dim'}); build "
                             f"{name} for rotary_dim={rotary_dim} (rotary_percent="
                             f"{rotary_dim}/{head_dim}) or leave rotary_dim out")
    check_no_table_grad((name, table))
    return table, sin, R


def checked_positions(x: Tensor, position_ids, cu_seqlens, P: int, out_layout: str):
    """position_ids as [B or 1, S] contiguous (int), cu_seqlens contiguous; values checked where
    they can be read without a synchronisation (ropelib.set_index_checks)."""
    B, S, _ = sizes(x)
    for name, t in (("position_ids", position_ids), ("cu_seqlens", cu_seqlens)):
        if t is not None:
            V.check_int_tensor(t, name, dims=(1,) if name == "cu_seqlens" else (1, 2))
            V.check_same_device(x, "x", **{name: t})
    if x.dim() == 3:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens is for packed sequences, x [T, hidden]; x is "
                             f"[B, S, hidden] = {tuple(x.shape)}: pass position_ids instead")
    else:
        if (position_ids is None) == (cu_seqlens is None):
            raise ValueError(f"x [T, hidden] = {tuple(x.shape)} holds packed sequences: pass "
                             "cu_seqlens [N + 1] (their offsets) or position_ids [T] (every "
                             "token's position), exactly one; or give x as [B, S, hidden]")
        if out_layout != "bshd":
            raise ValueError(f"out_layout={out_layout!r} needs x [B, S, hidden]; packed x "
                             "[T, hidden] gives q, k, v as [T, H, D] (out_layout='bshd')")
    if position_ids is not None:
        ids = position_ids.unsqueeze(0) if position_ids.dim() == 1 else position_ids
        if ids.shape[1] != S or ids.shape[0] not in (1, B):
            want = f"[T={S}]" if x.dim() == 2 else f"[S={S}] or [B={B} or 1, S={S}]"
            raise ValueError(f"position_ids must be {want} for x of shape {tuple(x.shape)}, "
                             f"got {tuple(ids.shape)}")
    elif cu_seqlens is not None:
        if cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must have at least 2 entries ([0, len0, ...]), got "
                             f"{cu_seqlens.shape[0]}")
    elif S > P:
        raise ValueError(f"the table (freqs) has {P} positions but the sequence has {S} tokens: "
                         "pass a longer table, angles, or position_ids")
    return checked_position_values(position_ids, cu_seqlens, S, B, P)


def checked_position_values(position_ids, cu_seqlens, S: int, B: int, P: int):
    """What checked_positions does at every call once the shapes are checked: position_ids as
    [B or 1, S] contiguous, cu_seqlens contiguous, their values checked where they can be read
    without a synchronisation (ropelib.set_index_checks)."""
    if position_ids is not None:
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        position_ids = position_ids.contiguous()
        if position_ids.numel() and V.values_checkable(position_ids):
            V.check_index_values(S=S, B=B, P=P, layout="bshd", position_ids=position_ids)
    elif cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()
        if V.values_checkable(cu_seqlens):
            V.check_index_values(S=S, B=1, P=P, layout="thd", cu_seqlens=cu_seqlens)
    return position_ids, cu_seqlens


def check_norm_weights(q_norm_weight, k_norm_weight, head_dim: int, x: Tensor) -> bool:
    """Whether there is a QK-norm: both norm weights [head_dim] (any float dtype, x's device)
    or neither."""
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight (QK-norm), or neither")
    if q_norm_weight is None:
        return False
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        V.check_tensor(w, name, dims=(1,), dtypes=V.FLOAT_DTYPES)
        if w.shape[0] != head_dim:
            raise ValueError(f"{name} must be [head_dim] = [{head_dim}], got shape "
                             f"{tuple(w.shape)}")
        V.check_same_device(x, "x", **{name: w})
    return True


def table_view(freqs: Optional[Tensor], angles: Optional[Angles]
               ) -> Tuple[Tensor, Optional[Tensor]]:
    """(table, sin) as checked_table gives them, for a call of a signature checked in full
    before (freqs a tensor, or Angles): V.angle_table's [P, R] view of freqs [P, 1, 1, R] or
    [P, R], contiguous, and None; or Angles' turns (contiguous) and amplitude."""
    if freqs is None:
        return angles.turns.contiguous(), angles.amplitude
    return (freqs[:, 0, 0, :] if freqs.dim() == 4 else freqs).contiguous(), None
