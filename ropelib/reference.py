"""Plain-PyTorch rotary position embedding: the specification every kernel is checked against.

RoPE rotates each pair of features (x_a, x_b) of a head by the angle theta = pos * inv_freq:

    y_a = x_a cos(theta) - x_b sin(theta)
    y_b = x_b cos(theta) + x_a sin(theta)

Two pairings are in use. Rotate-half (GPT-NeoX, Llama, TE's default) pairs feature i with
i + R/2; interleaved (GPT-J, RoFormer) pairs 2j with 2j+1. A table row holds one angle (or
cos/sin value) per *feature*, so the two members of a pair may read different entries: this
is how TE defines it, and the kernels follow it exactly.
"""
from typing import Optional

import torch

from .conventions import LAYOUTS


def rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] (halves) or [x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...] (pairs)."""
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   interleaved: bool = False) -> torch.Tensor:
    """x[..., :R] * cos + rotate_half(x[..., :R]) * sin, with x[..., R:] passed through.

    cos/sin broadcast against x[..., :R] (R = cos.shape[-1]). Computes in the promoted dtype of
    the inputs; upcast them first for a high-precision reference.
    """
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    y = x_rot * cos + rotate_half(x_rot, interleaved) * sin
    return torch.cat((y, x_pass.to(y.dtype)), dim=-1)


def rope_complex(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """The RoFormer view: interleaved pairs as complex numbers, multiplied by exp(i * angles).

    x [..., R] (R even, pairs (2j, 2j+1)), angles [..., R/2] broadcasting against the pairs.
    Returns a tensor of x's real dtype; equals apply_rope_ref(..., interleaved=True) with the
    angles repeated pairwise.
    """
    real = torch.float64 if x.dtype == torch.float64 else torch.float32
    z = torch.view_as_complex(x.to(real).reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = torch.polar(torch.ones_like(angles, dtype=real), angles.to(real))
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


def _cp_positions(local_len: int, cp_size: int, cp_rank: int, device) -> torch.Tensor:
    """Global positions of the local_len tokens rank cp_rank holds under TE's dual-chunk split.

    The global sequence (cp_size * local_len tokens) is cut into 2 * cp_size chunks; rank r holds
    chunk r and chunk 2*cp_size - 1 - r, so causal attention work is balanced across ranks.
    """
    idx = torch.arange(local_len, device=device)
    if cp_size == 1:
        return idx
    seg = local_len // 2
    full = cp_size * local_len
    first = cp_rank * seg + idx
    second = full - (cp_rank + 1) * seg + (idx - seg)
    return torch.where(idx < seg, first, second)


def positions(layout: str, seq_len: int, batch: int = 1, *, start_positions=None,
              cp_size: int = 1, cp_rank: int = 0, cu_seqlens=None, device=None) -> torch.Tensor:
    """Positions each token is rotated by, with Transformer Engine's semantics.

    sbhd/bshd: returns [B, S]; pos[b, s] = start_positions[b] + cp_map(s).
    thd: returns [T] where T = cu_seqlens[-1] // cp_size; cu_seqlens are the cumulative lengths
    of the *global* (padded) sequences, as TE takes them; sequence i holds
    (cu_seqlens[i+1]-cu_seqlens[i]) // cp_size local tokens at start_positions[i] + cp_map(t).
    """
    if layout in ("sbhd", "bshd"):
        pos = _cp_positions(seq_len, cp_size, cp_rank, device).unsqueeze(0).expand(batch, -1)
        if start_positions is not None:
            pos = pos + start_positions.to(device=device, dtype=torch.int64).view(-1, 1)
        return pos.contiguous()
    if layout != "thd":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    cu = (cu_seqlens.to(torch.int64) // cp_size).tolist()
    parts = []
    for i in range(len(cu) - 1):
        p = _cp_positions(cu[i + 1] - cu[i], cp_size, cp_rank, device)
        if start_positions is not None:
            p = p + int(start_positions[i])
        parts.append(p)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def _table(freqs, cos, sin, dtype):
    """(cos, sin) tables [P, R] in `dtype` from angles [P,1,1,R]/[P,R] or given tables."""
    if freqs is not None:
        f = freqs.reshape(freqs.shape[0], freqs.shape[-1]).to(dtype)
        return torch.cos(f), torch.sin(f)
    return (cos.reshape(cos.shape[0], cos.shape[-1]).to(dtype),
            sin.reshape(sin.shape[0], sin.shape[-1]).to(dtype))


def rope_reference(x: torch.Tensor, freqs: Optional[torch.Tensor] = None, *,
                   cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
                   layout: str = "sbhd", interleaved: bool = False,
                   start_positions: Optional[torch.Tensor] = None,
                   position_ids: Optional[torch.Tensor] = None,
                   cu_seqlens: Optional[torch.Tensor] = None, cp_size: int = 1, cp_rank: int = 0,
                   compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """RoPE of x in `compute_dtype`, rounded once to x.dtype. The oracle for every test.

    x: [S, B, H, D] (sbhd), [B, S, H, D] (bshd) or [T, H, D] (thd).
    freqs: angles [P, 1, 1, R] or [P, R]; or cos/sin tables [P, R]. position_ids [S], [B, S]
    (sbhd/bshd) or [T] (thd) replace the implicit positions.
    """
    c, s = _table(freqs, cos, sin, compute_dtype)
    if position_ids is not None:
        pos = position_ids.to(device=x.device, dtype=torch.int64)
        if layout != "thd" and pos.dim() == 1:
            pos = pos.unsqueeze(0)
    elif layout == "thd":
        pos = positions("thd", 0, start_positions=start_positions, cp_size=cp_size,
                        cp_rank=cp_rank, cu_seqlens=cu_seqlens, device=x.device)
    else:
        S, B = (x.shape[0], x.shape[1]) if layout == "sbhd" else (x.shape[1], x.shape[0])
        pos = positions(layout, S, B, start_positions=start_positions, cp_size=cp_size,
                        cp_rank=cp_rank, device=x.device)
    c, s = c.to(x.device)[pos], s.to(x.device)[pos]   # [B, S, R], [1, S, R] or [T, R]
    if layout == "sbhd":
        c, s = c.transpose(0, 1).unsqueeze(2), s.transpose(0, 1).unsqueeze(2)  # [S, B, 1, R]
    elif layout == "bshd":
        c, s = c.unsqueeze(2), s.unsqueeze(2)                                  # [B, S, 1, R]
    else:
        c, s = c.unsqueeze(1), s.unsqueeze(1)                                  # [T, 1, R]
    return apply_rope_ref(x.to(compute_dtype), c, s, interleaved).to(x.dtype)


# --- Transformer Engine's two paths, for drop-in parity and the allclose story ----------------

def _te_base(t, freqs, tensor_format, interleaved):
    # A copy of TE 2.x `_apply_rotary_pos_emb_base`: cos/sin rounded to t.dtype, math in t.dtype.
    if tensor_format == "bshd":
        freqs = freqs.transpose(0, 1)
    cos_ = torch.cos(freqs).to(t.dtype)
    sin_ = torch.sin(freqs).to(t.dtype)
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    t = (t * cos_) + (rotate_half(t, interleaved) * sin_)
    return torch.cat((t, t_pass), dim=-1)


def _te_cp_freqs(freqs, seqlen, cp_size, cp_rank):
    if cp_size > 1:
        seg = seqlen // 2
        full = cp_size * seqlen
        return torch.cat([freqs[cp_rank * seg:(cp_rank + 1) * seg],
                          freqs[full - (cp_rank + 1) * seg:full - cp_rank * seg]])
    return freqs[:seqlen]


def _te_check_table(freqs, start_positions, seqlens, cp_size):
    # TE's table-length assertion (read on the host, as TE does), as a ValueError: sequence i
    # uses rows start_positions[i] .. start_positions[i] + seqlens[i] * cp_size - 1.
    starts = [0] * len(seqlens) if start_positions is None else start_positions.tolist()
    need = max((s0 + n * cp_size for s0, n in zip(starts, seqlens) if n), default=0)
    if need > freqs.shape[0]:
        raise ValueError(f"freqs has {freqs.shape[0]} positions but the input needs {need} "
                         f"(max over sequences of start_positions + seq_len * cp_size, "
                         f"cp_size={cp_size})")


def te_unfused(t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False,
               cu_seqlens=None, cp_size=1, cp_rank=0):
    """Transformer Engine 2.x `apply_rotary_pos_emb(..., fused=False)`, line for line.

    With start_positions and cp_size > 1 (as TE does it): each sequence's table is first
    offset by its start position, then the rank takes its two dual chunks of the
    seq_len * cp_size rows that follow."""
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("cu_seqlens must not be None when tensor_format is 'thd'")
        cu = cu_seqlens // cp_size
        seqlens = (cu[1:] - cu[:-1]).tolist()
        _te_check_table(freqs, start_positions, seqlens, cp_size)
        return torch.cat([
            _te_base(x.unsqueeze(1),
                     _te_cp_freqs(freqs[start_positions[i]:] if start_positions is not None
                                  else freqs, x.size(0), cp_size, cp_rank),
                     "sbhd", interleaved)
            for i, x in enumerate(torch.split(t, seqlens))]).squeeze(1)
    seqlen = t.size(0) if tensor_format == "sbhd" else t.size(1)
    if start_positions is not None:
        _te_check_table(freqs, start_positions, [seqlen] * len(start_positions), cp_size)
        freqs = torch.cat([freqs[i:i + seqlen * cp_size] for i in start_positions], dim=1)
    return _te_base(t, _te_cp_freqs(freqs, seqlen, cp_size, cp_rank), tensor_format, interleaved)


def te_fused_emulation(t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False,
                       cu_seqlens=None, cp_size=1, cp_rank=0):
    """What TE's fused CUDA kernel computes: sin/cos in fp32 from fp32 angles, fp32 multiply-add,
    one rounding to t.dtype. An emulation for machines without TE, labelled as such."""
    return rope_reference(t, freqs.float(), layout=tensor_format, interleaved=interleaved,
                          start_positions=start_positions, cu_seqlens=cu_seqlens,
                          cp_size=cp_size, cp_rank=cp_rank, compute_dtype=torch.float32)
