"""RotaryEmbedding: an nn.Module that owns its angle table and rotates q (and k) with the
finished kernel."""
from typing import Optional

import torch

from .api import apply_rope, apply_rope_qk
from .frequencies import rope_cos_sin, rope_freqs, rotary_dim
from .conventions import LAYOUTS


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embedding for attention inputs.

    Args:
        head_dim: features per head (D).
        base: RoPE base (10000 in RoFormer/Llama 2, 500000 in Llama 3).
        rotary_percent: share of the head that rotates; R = int(head_dim * rotary_percent).
        interleaved: pair (2j, 2j+1) (GPT-J) instead of (j, j + R/2) (GPT-NeoX/Llama).
        scaling: None or a scaling from ropelib.frequencies (Linear, NTK, DynamicNTK, Llama3,
            YaRN). YaRN's attention factor is applied through a cos/sin table.
        max_seq_len: positions the table covers. It grows (doubling) when an input's sequence
            is longer, but index tensors (start_positions, position_ids, cu_seqlens) are not read
            to find their largest position (that would synchronise with the GPU): set
            max_seq_len to the longest position you use, e.g. the KV cache's length. A position
            outside the table gives NaN (or an error where ropelib.set_index_checks asks).
        layout: "sbhd", "bshd" or "thd" for the tensors passed to forward.

    The tables stay float32 whatever the module is converted to (`.to(torch.bfloat16)`,
    `.half()`): angles rounded to 16 bits would be off by radians at long positions.

    forward(q, k=None, *, start_positions=None, position_ids=None, cu_seqlens=None, cp_size=1,
    cp_rank=0) returns the rotated q, or (q, k) rotated in one launch. With context parallelism
    (cp_size > 1) q and k hold this rank's two chunks of every sequence, and a sequence's
    positions are its start position (if given) plus the token's global position.
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
        # Built in float32 on the CPU and moved, so the table has the same bits on every device.
        opts = dict(base=self.base, rotary_percent=self.rotary_percent,
                    interleaved=self.interleaved, scaling=self.scaling)
        if self._use_table:
            cos, sin = rope_cos_sin(length, self.head_dim, **opts)
            self.cos, self.sin = cos.to(device), sin.to(device)
        else:
            self.freqs = rope_freqs(length, self.head_dim, **opts).to(device)

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() would round the tables: rebuild them in float32 where they went.
        super()._apply(fn, recurse)
        table = self.cos if self._use_table else self.freqs
        if table.dtype != torch.float32:
            self._build(table.shape[0], table.device)
        return self

    def __prepare_scriptable__(self):
        raise NotImplementedError(
            "ropelib.RotaryEmbedding cannot be compiled by torch.jit.script (TorchScript compiles "
            "neither ropelib's Python nor its Triton kernel): use torch.jit.trace, torch.export "
            "or torch.compile")

    def table_length(self) -> int:
        return (self.cos if self._use_table else self.freqs).shape[0]

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, *,
                start_positions=None, position_ids=None, cu_seqlens=None, cp_size: int = 1,
                cp_rank: int = 0):
        table = self.cos if self._use_table else self.freqs
        if self.layout != "thd" and type(cp_size) is int:   # an input longer than the table:
            # grow it (shapes only; the global sequence is cp_size times the local one)
            length = (q.shape[0] if self.layout == "sbhd" else q.shape[1]) * max(cp_size, 1)
            if length > table.shape[0]:
                self._build(max(length, 2 * table.shape[0]), q.device)
        if (self.cos if self._use_table else self.freqs).device != q.device:
            self._build(table.shape[0], q.device)
        tables = dict(cos=self.cos, sin=self.sin) if self._use_table else dict(freqs=self.freqs)
        opts = dict(layout=self.layout, interleaved=self.interleaved,
                    start_positions=start_positions, position_ids=position_ids,
                    cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank, **tables)
        if k is None:
            return apply_rope(q, **opts)
        return apply_rope_qk(q, k, **opts)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"interleaved={self.interleaved}, layout={self.layout!r}, scaling={self.scaling}")
