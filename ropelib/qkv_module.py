"""The nn.Module of RoPE fused into the QKV projection: `QKVRoPE`, a fused nn.Linear's weight
(and bias, and QK-norm weights) whose forward is ropelib.qkv_rope_linear (ropelib/qkv_linear.py),
built afresh or around an existing model's projections and norms.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import validation as V
from .frequencies import Angles
from .qkv_checks import check_count, check_out_layout, resolved_backward
from .qkv_linear import qkv_rope_linear

__all__ = ["QKVRoPE"]


class QKVRoPE(nn.Module):
    """A fused QKV projection with RoPE (and QK-norm) in its GEMM's epilogue: the nn.Linear of
    an attention block's q, k, v projections, with the rotation (and the norms) folded in.

    Holds `weight` [(n_heads + 2 n_kv_heads) * head_dim, hidden_size], `bias` (or None) and,
    with qk_norm=True, `q_norm_weight` and `k_norm_weight` [head_dim] (initialised so that the
    scale w + weight_offset is 1). forward(x, freqs=None, *, angles=None, position_ids=None,
    cu_seqlens=None) -> (q, k, v) with the arguments of ropelib.qkv_rope_linear.

    `QKVRoPE.from_linear(qkv_proj, ...)` takes an existing fused nn.Linear (its parameters are
    shared, not copied); `QKVRoPE.from_linears(q_proj, k_proj, v_proj, ...)` three separate ones
    (their weights are concatenated into a new parameter).
    """

    def __init__(self, hidden_size: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                 bias: bool = False, qk_norm: bool = False, eps: float = 1e-6,
                 weight_offset: float = 0.0, interleaved: bool = False,
                 out_layout: str = "bshd", backward: Optional[str] = None, device=None,
                 dtype=None):
        super().__init__()
        self.hidden_size = check_count(hidden_size, "hidden_size", 1)
        self.n_heads = check_count(n_heads, "n_heads", 1)
        self.n_kv_heads = check_count(n_kv_heads, "n_kv_heads", 1)
        self.head_dim = check_count(head_dim, "head_dim", 2)
        for name, flag in (("bias", bias), ("qk_norm", qk_norm), ("interleaved", interleaved)):
            V.check_bool(flag, name)
        check_out_layout(out_layout)
        self.eps = V.check_real(eps, "eps", positive=True)
        self.weight_offset = V.check_real(weight_offset, "weight_offset")
        self.interleaved, self.out_layout = interleaved, out_layout
        resolved_backward(backward)     # checked now; None stays None (resolved at each call)
        self.backward = backward
        n = (n_heads + 2 * n_kv_heads) * head_dim
        bound = 1.0 / math.sqrt(hidden_size)        # nn.Linear's initialisation
        self.weight = nn.Parameter(torch.empty((n, hidden_size), device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty((n,), device=device, dtype=dtype)) if bias else None
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)
        if qk_norm:
            init = 1.0 - self.weight_offset
            self.q_norm_weight = nn.Parameter(torch.full((head_dim,), init, device=device,
                                                         dtype=dtype))
            self.k_norm_weight = nn.Parameter(torch.full((head_dim,), init, device=device,
                                                         dtype=dtype))
        else:
            self.q_norm_weight = self.k_norm_weight = None

    @staticmethod
    def _norm_settings(q_norm, k_norm, eps):
        """(eps, q weight, k weight) of two RMSNorm modules (transformers' Qwen3RMSNorm:
        `variance_epsilon`; Gemma3RMSNorm and torch's nn.RMSNorm: `eps`)."""
        if (q_norm is None) != (k_norm is None):
            raise ValueError("pass both q_norm and k_norm (RMSNorm modules), or neither")
        if q_norm is None:
            return eps, None, None
        for name, mod in (("q_norm", q_norm), ("k_norm", k_norm)):
            if not isinstance(getattr(mod, "weight", None), torch.Tensor):
                raise TypeError(f"{name} must be an RMSNorm module with a weight, got "
                                f"{type(mod).__name__}")
        found = getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", None))
        if eps is None:
            if found is None:
                if hasattr(q_norm, "eps"):      # torch's nn.RMSNorm(eps=None)
                    raise ValueError("q_norm.eps is None (torch's nn.RMSNorm then takes "
                                     "torch.finfo(input dtype).eps when it runs): pass eps=")
                raise ValueError("q_norm has neither variance_epsilon nor eps: pass eps=")
            eps = found
        return eps, q_norm.weight, k_norm.weight

    @classmethod
    def _wrap(cls, weight, bias, n_heads, n_kv_heads, head_dim, q_w, k_w, eps, **kwargs):
        """A module around existing parameters (built on the meta device, then given them)."""
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise TypeError("the projection must be an nn.Linear (a 2-D weight)")
        m = cls(weight.shape[1], n_heads, n_kv_heads, head_dim, bias=bias is not None,
                qk_norm=q_w is not None, eps=1e-6 if eps is None else eps, device="meta",
                **kwargs)
        n = (m.n_heads + 2 * m.n_kv_heads) * m.head_dim
        if weight.shape[0] != n:
            raise ValueError(f"the projection has {weight.shape[0]} output features, but "
                             f"n_heads={n_heads}, n_kv_heads={n_kv_heads}, head_dim={head_dim} "
                             f"need (n_heads + 2 n_kv_heads) * head_dim = {n}")
        m.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
        if bias is not None:
            m.bias = bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias)
        if q_w is not None:
            for name, w in (("q_norm_weight", q_w), ("k_norm_weight", k_w)):
                if tuple(w.shape) != (head_dim,):
                    raise ValueError(f"{name} must be [head_dim] = [{head_dim}], got "
                                     f"{tuple(w.shape)}")
                setattr(m, name, w if isinstance(w, nn.Parameter) else nn.Parameter(w))
        return m

    @classmethod
    def from_linear(cls, qkv_proj: nn.Linear, *, n_heads: int, n_kv_heads: int, head_dim: int,
                    q_norm: Optional[nn.Module] = None, k_norm: Optional[nn.Module] = None,
                    eps: Optional[float] = None, **kwargs) -> "QKVRoPE":
        """From a fused nn.Linear (q's rows, then k's, then v's) and, optionally, the q and k
        RMSNorm modules; their parameters are shared with the new module, not copied. kwargs:
        weight_offset, interleaved, out_layout, backward."""
        if not isinstance(getattr(qkv_proj, "weight", None), torch.Tensor):
            raise TypeError(f"qkv_proj must be an nn.Linear, got {type(qkv_proj).__name__}")
        eps, q_w, k_w = cls._norm_settings(q_norm, k_norm, eps)
        return cls._wrap(qkv_proj.weight, getattr(qkv_proj, "bias", None), n_heads, n_kv_heads,
                         head_dim, q_w, k_w, eps, **kwargs)

    @classmethod
    def from_linears(cls, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear, *,
                     head_dim: int, q_norm: Optional[nn.Module] = None,
                     k_norm: Optional[nn.Module] = None, eps: Optional[float] = None,
                     **kwargs) -> "QKVRoPE":
        """From separate q, k and v projections (as transformers' Llama, Qwen3 and Gemma 3 keep
        them); their weights (and biases) are concatenated into new parameters, the norm
        weights shared. The head counts follow from the projections' sizes."""
        head_dim = check_count(head_dim, "head_dim", 2)
        projs = (("q_proj", q_proj), ("k_proj", k_proj), ("v_proj", v_proj))
        for name, p in projs:
            if not isinstance(getattr(p, "weight", None), torch.Tensor) or p.weight.dim() != 2:
                raise TypeError(f"{name} must be an nn.Linear, got {type(p).__name__}")
            if p.weight.shape[0] % head_dim:
                raise ValueError(f"{name} has {p.weight.shape[0]} output features, not a "
                                 f"multiple of head_dim={head_dim}")
        if k_proj.weight.shape != v_proj.weight.shape or \
                k_proj.weight.shape[1] != q_proj.weight.shape[1]:
            raise ValueError(f"k_proj and v_proj must have one shape and q_proj the same input "
                             f"size, got {tuple(q_proj.weight.shape)}, "
                             f"{tuple(k_proj.weight.shape)}, {tuple(v_proj.weight.shape)}")
        biases = [p.bias for _, p in projs]
        if any(b is None for b in biases) and any(b is not None for b in biases):
            raise ValueError("q_proj, k_proj and v_proj must all have a bias or none")
        for name, p in projs[1:]:       # (torch.cat would promote dtypes, name no projection)
            for what in ("weight", "bias"):
                t, t0 = getattr(p, what), getattr(q_proj, what)
                if t is not None and (t.dtype != t0.dtype or t.device != t0.device):
                    raise ValueError(f"q_proj, k_proj and v_proj must share one dtype and "
                                     f"device: q_proj.{what} is {t0.dtype} on {t0.device}, "
                                     f"{name}.{what} {t.dtype} on {t.device}")
        eps, q_w, k_w = cls._norm_settings(q_norm, k_norm, eps)
        with torch.no_grad():
            weight = torch.cat([p.weight for _, p in projs]).detach()
            bias = torch.cat(biases).detach() if biases[0] is not None else None
        return cls._wrap(weight, bias, q_proj.weight.shape[0] // head_dim,
                         k_proj.weight.shape[0] // head_dim, head_dim, q_w, k_w, eps, **kwargs)

    def forward(self, x: Tensor, freqs: Optional[Tensor] = None, *,
                angles: Optional[Angles] = None, position_ids: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        return qkv_rope_linear(x, self.weight, self.bias, n_heads=self.n_heads,
                               n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, freqs=freqs,
                               angles=angles, position_ids=position_ids, cu_seqlens=cu_seqlens,
                               q_norm_weight=self.q_norm_weight, k_norm_weight=self.k_norm_weight,
                               eps=self.eps, weight_offset=self.weight_offset,
                               interleaved=self.interleaved, out_layout=self.out_layout,
                               backward=self.backward)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"bias={self.bias is not None}, qk_norm={self.q_norm_weight is not None}, "
                f"eps={self.eps}, weight_offset={self.weight_offset}, "
                f"interleaved={self.interleaved}, out_layout={self.out_layout!r}, "
                f"backward={self.backward!r}")
