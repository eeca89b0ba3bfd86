"""RotaryEmbedding: an nn.Module that owns its angle table and rotates q (and k) with the
finished kernel."""
from typing import Optional

import torch

from .api import apply_rope, apply_rope_qk
from .frequencies import rope_cos_sin, rope_freqs, rotary_dim
from .reference import LAYOUTS
from .validation import remembered


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embedding for attention inputs.

    Args:
        head_dim: features per head (D).
        base: RoPE base (10000 in RoFormer/Llama 2, 500000 in Llama 3).
        rotary_percent: share of the head that rotates; R = int(head_dim * rotary_percent).
        interleaved: pair (2j, 2j+1) (GPT-J) instead of (j, j + R/2) (GPT-NeoX/Llama).
        scaling: None or a scaling from ropelib.frequencies (Linear, NTK, DynamicNTK, Llama3,
            YaRN). YaRN's attention factor is applied through a cos/sin table.
        max_seq_len: initial table length; the table grows (doubling) when a call needs more.
        layout: "sbhd", "bshd" or "thd" for the tensors passed to forward.

    forward(q, k=None, *, start_positions=None, position_ids=None, cu_seqlens=None) returns the
    rotated q, or (q, k) rotated in one launch.
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, rotary_percent: float = 1.0,
                 interleaved: bool = False, scaling=None, max_seq_len: int = 2048,
                 layout: str = "bshd"):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.head_dim, self.base, self.rotary_percent = head_dim, base, rotary_percent
        self.interleaved, self.scaling, self.layout = interleaved, scaling, layout
        self.rotary_dim = rotary_dim(head_dim, rotary_percent)
        # YaRN scales cos and sin by its attention factor: that needs a table, not angles.
        self._use_table = scaling is not None and getattr(scaling, "attention_scaling", 1.0) != 1.0
        self.register_buffer("freqs", torch.empty(0), persistent=False)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self._build(max_seq_len, None)

    def _build(self, length: int, device) -> None:
        # Built on the CPU and moved, so the table has the same bits on every device.
        opts = dict(base=self.base, rotary_percent=self.rotary_percent,
                    interleaved=self.interleaved, scaling=self.scaling)
        if self._use_table:
            cos, sin = rope_cos_sin(length, self.head_dim, **opts)
            self.cos, self.sin = cos.to(device), sin.to(device)
        else:
            self.freqs = rope_freqs(length, self.head_dim, **opts).to(device)

    def table_length(self) -> int:
        return (self.cos if self._use_table else self.freqs).shape[0]

    def _needed(self, x, start_positions, position_ids, cu_seqlens) -> int:
        # Maxima of index tensors are read from the device once per tensor object and version
        # (validation.remembered), so a layer stack reusing them synchronises once.
        def most(t):
            return remembered(t, ("max",), lambda: int(t.max())) if t.numel() else 0
        if position_ids is not None:
            return most(position_ids) + 1 if position_ids.numel() else 0
        if self.layout == "thd":
            longest = remembered(cu_seqlens, ("longest",), lambda: int(
                (cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0) \
                if cu_seqlens is not None else 0
        else:
            longest = x.shape[0] if self.layout == "sbhd" else x.shape[1]
        return longest + (most(start_positions) if start_positions is not None else 0)

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, *,
                start_positions=None, position_ids=None, cu_seqlens=None):
        need = self._needed(q, start_positions, position_ids, cu_seqlens)
        ref = self.cos if self._use_table else self.freqs
        if need > ref.shape[0]:
            self._build(max(need, 2 * ref.shape[0]), q.device)   # grow by doubling
        elif ref.device != q.device:
            self._build(ref.shape[0], q.device)
        table = (dict(cos=self.cos, sin=self.sin) if self._use_table else dict(freqs=self.freqs))
        opts = dict(layout=self.layout, interleaved=self.interleaved,
                    start_positions=start_positions, position_ids=position_ids,
                    cu_seqlens=cu_seqlens, **table)
        if k is None:
            return apply_rope(q, **opts)
        return apply_rope_qk(q, k, **opts)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"interleaved={self.interleaved}, layout={self.layout!r}, scaling={self.scaling}")
