"""Per-head QK-RMSNorm and RoPE in one kernel, forward and backward (Qwen3, Gemma 3).

    q_out = rope(rmsnorm(q) * (w_q + weight_offset)),   k_out likewise with w_k

where rmsnorm normalises each head vector over the head dim (statistics in fp32). Qwen3 uses
weight_offset 0, Gemma 3 uses 1 (its scale is 1 + w). OLMo 2 normalises the whole q (k)
projection across all heads, which is a different operation and not this one.

Three ways in:
    ropelib.qk_norm_rope(q, k, w_q, w_k, freqs, layout="bshd")   the function (autograd-aware)
    ropelib.QKNormRoPE(head_dim)                                 an nn.Module holding w_q, w_k
    ropelib.qk_norm.qk_norm_apply_rotary_pos_emb(q, k, cos, sin, q_norm.weight, k_norm.weight)
                                                                 replaces HF's q_norm, k_norm and
                                                                 apply_rotary_pos_emb

and two operators, registered like ropelib's others (ropelib.ops: a triton_op on GPUs, a
custom_op in the interpreter, each with a fake implementation):
    torch.ops.ropelib.qk_norm_rope(q, k, w_q, w_k, table, sin, position_ids, cu_seqlens,
                                   layout, interleaved, eps, weight_offset) -> (q_out, k_out)
    torch.ops.ropelib.qk_norm_rope_backward(grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin,
                                            position_ids, cu_seqlens, layout, interleaved, eps,
                                            weight_offset) -> (grad_q, grad_k, grad_w_q, grad_w_k)
The forward saves q, k and the weights for the backward (the per-row statistics are recomputed
there: the backward reads q and k anyway). Double backward is not supported.

Supported: layouts sbhd, bshd and thd (packed sequences: cu_seqlens, as for ropelib.apply_rope,
or position_ids); GQA (k's heads divide q's); fp16, bf16, fp32 and fp64 inputs (weights of any
of these dtypes); partial rotary (the norm covers the whole head, the rotation the first R
features, the rest is scaled and passed through); both pairings (rotate-half, interleaved);
angle tables or cos/sin tables [P, R], or no table (Angles: every angle computed in the kernel
from its position); explicit position ids [S] or [B, S].
Not supported: start_positions, context parallelism, in-place output, separate tables for q
and k.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import eager
from . import validation as V
from .conventions import LAYOUT_OF_UNSQUEEZE_DIM
from .api import _tables, check_no_table_grad, checked_tables, needs_grad, saveable
from .frequencies import EXACT_POSITIONS, Angles
from .kernels import qk_norm_rope as kernel
from .ops import define_op, view4

__all__ = ["qk_norm_rope", "QKNormRoPE", "qk_norm_apply_rotary_pos_emb"]



def _pos2d(position_ids: Optional[Tensor]) -> Optional[Tensor]:
    return position_ids.unsqueeze(0) if position_ids is not None and position_ids.dim() == 1 \
        else position_ids


def kernel_positions(position_ids: Optional[Tensor],
                     cu_seqlens: Optional[Tensor]) -> tuple:
    """(pos, packed) as the kernel reads them: cu_seqlens [N + 1] where given (packed), else
    position ids [B or 1, S] (or None)."""
    if cu_seqlens is not None:
        return cu_seqlens, True
    return _pos2d(position_ids), False


# --- the operators --------------------------------------------------------------------------

@define_op("ropelib::qk_norm_rope")
def qk_norm_rope_op(q: Tensor, k: Tensor, w_q: Tensor, w_k: Tensor, table: Tensor,
                    sin: Optional[Tensor], position_ids: Optional[Tensor],
                    cu_seqlens: Optional[Tensor], layout: str, interleaved: bool, eps: float,
                    weight_offset: float) -> Tuple[Tensor, Tensor]:
    pos, packed = kernel_positions(position_ids, cu_seqlens)
    args = kernel.readable(q, k, w_q, w_k, table, sin, pos, layout)
    return kernel.Route(*args, layout=layout, interleaved=interleaved, eps=eps,
                        weight_offset=weight_offset, packed=packed).forward(*args)


@define_op("ropelib::qk_norm_rope_backward")
def qk_norm_rope_backward_op(grad_q_out: Tensor, grad_k_out: Tensor, q: Tensor, k: Tensor,
                             w_q: Tensor, w_k: Tensor, table: Tensor, sin: Optional[Tensor],
                             position_ids: Optional[Tensor], cu_seqlens: Optional[Tensor],
                             layout: str, interleaved: bool, eps: float, weight_offset: float
                             ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return undo_norm_rope(grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, position_ids,
                          cu_seqlens, layout, interleaved, eps, weight_offset)


def undo_norm_rope(grad_q_out: Tensor, grad_k_out: Tensor, q: Tensor, k: Tensor, w_q: Tensor,
                   w_k: Tensor, table: Tensor, sin: Optional[Tensor],
                   position_ids: Optional[Tensor], cu_seqlens: Optional[Tensor], layout: str,
                   interleaved: bool, eps: float, weight_offset: float,
                   into: Optional[tuple] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward operator's work: (grad_q, grad_k, grad_w_q, grad_w_k). `into`: tensors of
    the caller's to hold grad_q and grad_k (column slices of one token-major buffer are stored
    into directly: kernel.Route.backward), for code inside ropelib's operators that owns them
    (the QKV projection's dY backward). That one, called plain eager (eager.active), keeps its
    kernel.Route in eager.SIGNATURES by signature (every tensor's shape, strides, dtype, device
    and requires_grad, `into`'s too, and the options): planned once, started through the direct
    launcher, as qk_norm_rope's eager route, with what the backward into `into` decides from
    strides decided once (kernel.BackwardInto); the same plans, so the same bits. (The operator's
    own backward, which qk_norm_rope's eager route never calls, makes a Route every call.)"""
    pos, packed = kernel_positions(position_ids, cu_seqlens)
    sig = eager.signature(
        ("undo_norm_rope", layout, interleaved, eps, type(eps), weight_offset,
         type(weight_offset)),
        (grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, position_ids, cu_seqlens, *into)) \
        if into is not None and eager.active() else None
    if sig is None:
        q, k, w_q, w_k, table, sin, pos = kernel.readable(q, k, w_q, w_k, table, sin, pos,
                                                          layout)
        route = kernel.Route(q, k, w_q, w_k, table, sin, pos, layout=layout,
                             interleaved=interleaved, eps=eps, weight_offset=weight_offset,
                             packed=packed)
        grad_q, grad_k, gw_q, gw_k = route.backward(grad_q_out, grad_k_out, q, k, w_q, w_k,
                                                    table, sin, pos, into=into)
    else:
        # the Route and what its backward into `into` decides from strides (kernel.BackwardInto)
        backward = eager.SIGNATURES.get(sig)
        if backward is None:
            backward = eager.SIGNATURES.put(sig, backward_into(
                grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, position_ids, cu_seqlens,
                layout, interleaved, eps, weight_offset, into))
        grad_q, grad_k, gw_q, gw_k = backward(grad_q_out, grad_k_out, q, k, w_q, w_k, table,
                                              sin, pos, into)
    return grad_q, grad_k, gw_q.to(w_q.dtype), gw_k.to(w_k.dtype)


def backward_into(grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, position_ids, cu_seqlens,
                  layout, interleaved, eps, weight_offset, into) -> kernel.BackwardInto:
    """undo_norm_rope's entry for a plain eager call's signature (its arguments as it takes
    them): the eager Route and what its backward into `into` decides from strides. Called as
    undo_norm_rope calls it, with `pos` as kernel_positions makes it, (grad_q, grad_k, gw_q,
    gw_k) come back, the weights' gradients in fp32 (fp64 for fp64 inputs). A caller that knows the
    signature already keeps it itself (the QKV projection's backward: qkv_plan.DyStep)."""
    pos, _ = kernel_positions(position_ids, cu_seqlens)
    return kernel.BackwardInto(
        _route(q, k, w_q, w_k, table, sin, position_ids, cu_seqlens, layout, interleaved, eps,
               weight_offset),
        grad_q_out, grad_k_out, q, k, w_q, w_k, table, sin, pos, into)


def _setup(ctx, inputs, output):
    q, k, w_q, w_k, table, sin, position_ids, cu_seqlens, *options = inputs
    ctx.save_for_backward(q, k, w_q, w_k, table, sin, position_ids, cu_seqlens)
    ctx.options = options   # layout, interleaved, eps, weight_offset


def output_grads(grad_q_out, grad_k_out, q, k) -> tuple:
    """The gradients of (q_out, k_out) as the backward kernel reads them: an output that took
    no part in the loss has no gradient (None), and contributes zero. The operator's backward
    and the eager route's both start here."""
    return (torch.zeros_like(q) if grad_q_out is None else grad_q_out,
            torch.zeros_like(k) if grad_k_out is None else grad_k_out)


def _backward(ctx, grad_q_out, grad_k_out):
    q, k, w_q, w_k, table, sin, position_ids, cu_seqlens = ctx.saved_tensors
    grad_q_out, grad_k_out = output_grads(grad_q_out, grad_k_out, q, k)
    gq, gk, gw_q, gw_k = qk_norm_rope_backward_op(grad_q_out, grad_k_out, q, k, w_q, w_k, table,
                                                  sin, position_ids, cu_seqlens, *ctx.options)
    return gq, gk, gw_q, gw_k, None, None, None, None, None, None, None, None


qk_norm_rope_op.register_autograd(_backward, setup_context=_setup)


# --- the eager route ------------------------------------------------------------------------
# As for ropelib.apply_rope (ropelib.eager): a plain eager call is checked and planned once per
# signature, then goes straight to the compiled kernel, forward and backward.

def _route(q, k, w_q, w_k, table, sin, position_ids, cu_seqlens, layout, interleaved, eps,
           weight_offset):
    """The eager route of a signature: the operator's kernel.Route, its launches started
    through the direct launcher (eager.EagerLaunch)."""
    pos, packed = kernel_positions(position_ids, cu_seqlens)
    return kernel.Route(q, k, w_q, w_k, table, sin, pos, layout=layout,
                        interleaved=interleaved, eps=eps, weight_offset=weight_offset,
                        packed=packed,
                        starter=lambda planned: eager.EagerLaunch(planned.launcher, planned))


class _NormRotate(torch.autograd.Function):
    """(q, k, w_q, w_k) -> (q_out, k_out) through a planned kernel.Route. Differentiable once,
    as the operator: a backward that would itself be differentiated (create_graph) raises."""

    @staticmethod
    def forward(ctx, route, reads, q, k, w_q, w_k):
        # reads: (table, sin, pos), pos the position ids [B or 1, S] or cu_seqlens as the route
        # reads them (kernel_positions); one tuple, not inputs of their own: they take no
        # gradient, and autograd does work for every tensor input both ways (eager.Rotate)
        ctx.route = route
        ctx.save_for_backward(q, k, w_q, w_k, *reads)
        return route.forward(q, k, w_q, w_k, *reads)

    @staticmethod
    def backward(ctx, grad_q_out, grad_k_out):
        if torch.is_grad_enabled():
            raise RuntimeError("ropelib.qk_norm_rope has no double backward: its gradients "
                               "cannot be differentiated again (create_graph=True)")
        q, k, w_q, w_k, table, sin, pos = ctx.saved_tensors
        grad_q_out, grad_k_out = output_grads(grad_q_out, grad_k_out, q, k)
        gq, gk, gw_q, gw_k = ctx.route.backward(grad_q_out, grad_k_out, q, k, w_q, w_k, table,
                                                sin, pos)
        return None, None, gq, gk, gw_q.to(w_q.dtype), gw_k.to(w_k.dtype)


# --- argument checks ------------------------------------------------------------------------

def _check_inputs(q, k, w_q, w_k, layout: str, w_names=("w_q", "w_k")) -> None:
    """q, k and the weights: tensors of supported dtypes on one device, shapes that agree."""
    V.check_no_grad_transform("qk_norm_rope")
    for t, name in ((q, "q"), (k, "k")):
        V.check_tensor(t, name)
        V.check_kernel_device(t, name)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    for t, name in zip((w_q, w_k), w_names):
        V.check_tensor(t, name, dims=(1,))
    V.check_same_device(q, "q", k=k, **dict(zip(w_names, (w_q, w_k))))
    q4, k4 = view4(q, layout), view4(k, layout)
    S, B, HQ, D = q4.shape
    if (k4.shape[0], k4.shape[1], k4.shape[3]) != (S, B, D):
        raise ValueError(f"q and k must agree in sequence, batch and head dim, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    HK = k4.shape[2]
    if HQ % HK:
        raise ValueError(f"k's head count ({HK}) must divide q's ({HQ}) (grouped-query "
                         "attention)")
    for t, name in zip((w_q, w_k), w_names):
        if t.shape[0] != D:
            raise ValueError(f"{name} must be [head_dim] = [{D}], got shape {tuple(t.shape)}")
    if D > V.MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is larger than the supported {V.MAX_HEAD_DIM}")


def _check_index_values(position_ids, cu_seqlens, tokens: int, rows: int) -> None:
    """Position ids inside the table, and cu_seqlens well formed ([0, ..., tokens],
    non-decreasing, every sequence inside the table), where their values can be read without a
    synchronisation (see ropelib.set_index_checks); elsewhere a position outside the table
    gives NaN rows."""
    index = [t for t in (position_ids, cu_seqlens) if t is not None]
    if index and V.values_checkable(*index):
        V.check_index_values(S=tokens, B=1, P=rows, layout="thd", position_ids=position_ids,
                             cu_seqlens=cu_seqlens)


# --- the public function ----------------------------------------------------------------------

def qk_norm_rope(q: Tensor, k: Tensor, w_q: Tensor, w_k: Tensor, freqs: Optional[Tensor] = None,
                 *, cos: Optional[Tensor] = None, sin: Optional[Tensor] = None, eps: float = 1e-6,
                 layout: str = "bshd", interleaved: bool = False,
                 position_ids: Optional[Tensor] = None, weight_offset: float = 0.0,
                 angles: Optional[Angles] = None,
                 cu_seqlens: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Per-head RMSNorm of q and k, scaled by (w + weight_offset), then RoPE; one kernel launch.

    Args:
        q: [B, S, Hq, D] (bshd), [S, B, Hq, D] (sbhd) or [T, Hq, D] (thd); any strides; fp16,
            bf16, fp32 (math in fp32) or fp64 (math in fp64).
        k: like q with Hk heads; Hk divides Hq (GQA); same dtype.
        w_q, w_k: [D] weights of q's and k's norm (any float dtype; their gradients come back
            in it).
        freqs: angles [P, 1, 1, R] or [P, R], float32 (or float64), as ropelib.rope_freqs
            builds them; or instead
        cos, sin: tables [P, R] of one float dtype (ropelib.rope_cos_sin); or instead
        angles: ropelib.rope_angles(...): no table, every angle computed in the kernel from
            its position, reduced exactly (as ropelib.apply_rope(..., angles=) computes it).
        eps: added to the mean square (1e-6 in Qwen3 and Gemma 3).
        layout: "bshd", "sbhd" or "thd".
        interleaved: pair features (2j, 2j+1) instead of (j, j + R/2).
        position_ids: [S] or [B, S] (thd: [T]) integer positions, rows of the table (with
            angles: positions up to 2^31 - 2); by default token s is at position s.
        cu_seqlens: thd only, instead of position_ids: [N + 1] integer offsets of N packed
            sequences ([0, len0, len0 + len1, ..., T]); each token's position is its index in
            its sequence, found in the kernel (as ropelib.apply_rope finds it).
        weight_offset: the scale is w + weight_offset: 0.0 (Qwen3) or 1.0 (Gemma 3's 1 + w).

    Returns:
        (q_out, k_out): shaped like q and k, in q's dtype; with q's and k's strides where both
        are dense, else contiguous in `layout` (a slice of a fused QKV projection). With R < D
        the features R..D-1 are normed and scaled but not rotated.

    A position outside the table gives NaN in the rows it touches (and in the gradients).
    """
    exact = (angles.turns, angles.amplitude) if isinstance(angles, Angles) else (None, None)
    sig = eager.signature(("qk_norm_rope", layout, type(layout), interleaved, type(interleaved),
                           eps, type(eps), weight_offset, type(weight_offset), type(angles)),
                          (q, k, w_q, w_k, freqs, cos, sin, position_ids, cu_seqlens) + exact) \
        if eager.active() else None
    hit = eager.SIGNATURES.get(sig) if sig is not None else None
    if hit is not None:     # checked before: only the values of CPU position ids are new
        route, rows = hit
        table, sin_t = checked_tables(freqs, cos, sin, angles)
        _check_index_values(position_ids, cu_seqlens, q.shape[0], rows)
        return _run_route(route, q, k, w_q, w_k, table, sin_t, position_ids, cu_seqlens)
    if layout not in V.LAYOUTS:
        raise ValueError(f"layout must be one of {V.LAYOUTS}, got {layout!r}")
    V.check_tensor(q, "q")
    V.check_layout(q, layout, "q")
    V.check_tensor(k, "k")
    V.check_layout(k, layout, "k")
    V.check_bool(interleaved, "interleaved")
    eps = V.check_real(eps, "eps", positive=True)
    weight_offset = V.check_real(weight_offset, "weight_offset")
    _check_inputs(q, k, w_q, w_k, layout)
    # the table as apply_rope checks it: angles [P, R], cos and sin [P, R], or an Angles'
    # turns [R] and amplitude [1] (no rows: any position)
    table, sin_t = _tables(freqs, cos, sin, angles=angles)
    if angles is not None:
        tname, R, P = "angles", table.shape[0], EXACT_POSITIONS
    else:
        tname, R, P = "freqs" if freqs is not None else "cos", table.shape[1], table.shape[0]
    V.check_same_device(q, "q", **{tname: table}, sin=sin_t)
    D = q.shape[-1]
    V.check_rotary_dim(R, D, tname)
    check_no_table_grad((tname, table), ("sin", sin_t))
    S = q.shape[0] if layout in ("sbhd", "thd") else q.shape[1]
    B = 1 if layout == "thd" else (q.shape[1] if layout == "sbhd" else q.shape[0])
    if cu_seqlens is not None:
        if layout != "thd":
            raise ValueError(f"cu_seqlens is only for layout='thd', got layout={layout!r}")
        if position_ids is not None:
            raise ValueError("pass either position_ids or cu_seqlens, not both: position_ids "
                             "gives every token's position already")
        V.check_int_tensor(cu_seqlens, "cu_seqlens", dims=(1,))
        V.check_same_device(q, "q", cu_seqlens=cu_seqlens)
        if cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must have at least 2 entries ([0, len0, ...]), got "
                             f"{cu_seqlens.shape[0]}")
        _check_index_values(None, cu_seqlens, S, P)
    elif position_ids is not None:
        V.check_int_tensor(position_ids, "position_ids", dims=(1,) if layout == "thd" else (1, 2))
        V.check_same_device(q, "q", position_ids=position_ids)
        if position_ids.shape[-1] != S or (position_ids.dim() == 2
                                           and position_ids.shape[0] not in (1, B)):
            want = f"[{S}]" if layout == "thd" else f"[{S}] or [{B} or 1, {S}]"
            raise ValueError(f"position_ids must be {want} for q of shape {tuple(q.shape)} "
                             f"({layout}), got {tuple(position_ids.shape)}")
        _check_index_values(position_ids, None, S, P)
    elif layout == "thd":
        raise ValueError("layout='thd' (packed sequences) needs cu_seqlens [N + 1] (the "
                         "sequences' offsets) or position_ids [T] (each token's position in "
                         "its sequence)")
    elif S > P:
        raise ValueError(f"the table has {P} positions but the sequence has {S}: pass a longer "
                         "table or position_ids")
    if sig is not None:
        route = _route(q, k, w_q, w_k, table, sin_t, position_ids, cu_seqlens, layout,
                       interleaved, eps, weight_offset)
        eager.SIGNATURES.put(sig, (route, P))
        return _run_route(route, q, k, w_q, w_k, table, sin_t, position_ids, cu_seqlens)
    if needs_grad(q, k, w_q, w_k):
        table, sin_t = saveable(table), saveable(sin_t)
        position_ids, cu_seqlens = saveable(position_ids), saveable(cu_seqlens)
    return qk_norm_rope_op(q, k, w_q, w_k, table, sin_t, position_ids, cu_seqlens, layout,
                           interleaved, eps, weight_offset)


_norm_rotate = eager.direct_apply(_NormRotate)


def _run_route(route, q, k, w_q, w_k, table, sin, position_ids, cu_seqlens):
    """The eager route's call (a tracer at work never comes here: eager.active)."""
    pos = kernel_positions(position_ids, cu_seqlens)[0]
    if needs_grad(q, k, w_q, w_k):
        return _norm_rotate(route, (saveable(table), saveable(sin), saveable(pos)), q, k, w_q,
                            w_k)
    return route.forward(q, k, w_q, w_k, table, sin, pos)


class QKNormRoPE(nn.Module):
    """The q and k norms of a Qwen3 (weight_offset=0) or Gemma 3 (weight_offset=1) attention
    block, fused with RoPE.

    Holds w_q and w_k [head_dim], initialised so that the scale w + weight_offset is 1.
    forward(q, k, freqs=None, *, cos=None, sin=None, position_ids=None, angles=None,
            cu_seqlens=None) -> (q_out, k_out), with the arguments of ropelib.qk_norm_rope.
    """

    def __init__(self, head_dim: int, eps: float = 1e-6, weight_offset: float = 0.0, *,
                 layout: str = "bshd", interleaved: bool = False, device=None, dtype=None):
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2:
            raise ValueError(f"head_dim must be an int >= 2, got {head_dim!r}")
        if layout not in V.LAYOUTS:
            raise ValueError(f"layout must be one of {V.LAYOUTS}, got {layout!r}")
        V.check_bool(interleaved, "interleaved")
        self.head_dim, self.layout, self.interleaved = head_dim, layout, interleaved
        self.eps = V.check_real(eps, "eps", positive=True)
        self.weight_offset = V.check_real(weight_offset, "weight_offset")
        init = 1.0 - self.weight_offset
        self.w_q = nn.Parameter(torch.full((head_dim,), init, device=device, dtype=dtype))
        self.w_k = nn.Parameter(torch.full((head_dim,), init, device=device, dtype=dtype))

    @classmethod
    def from_norms(cls, q_norm: nn.Module, k_norm: nn.Module, weight_offset: float = 0.0,
                   **kwargs) -> "QKNormRoPE":
        """From a model's two RMSNorm modules (Qwen3RMSNorm: `weight`, `variance_epsilon`;
        Gemma3RMSNorm: `weight`, `eps`, with weight_offset=1.0). The weights are copied."""
        eps = getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", None))
        if eps is None:
            raise ValueError("q_norm has neither variance_epsilon nor eps")
        w = q_norm.weight
        m = cls(w.shape[0], eps, weight_offset, device=w.device, dtype=w.dtype, **kwargs)
        with torch.no_grad():
            m.w_q.copy_(q_norm.weight)
            m.w_k.copy_(k_norm.weight)
        return m

    def forward(self, q: Tensor, k: Tensor, freqs: Optional[Tensor] = None, *,
                cos: Optional[Tensor] = None, sin: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, angles: Optional[Angles] = None,
                cu_seqlens: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        return qk_norm_rope(q, k, self.w_q, self.w_k, freqs, cos=cos, sin=sin, eps=self.eps,
                            layout=self.layout, interleaved=self.interleaved,
                            position_ids=position_ids, weight_offset=self.weight_offset,
                            angles=angles, cu_seqlens=cu_seqlens)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, eps={self.eps}, weight_offset={self.weight_offset}, "
                f"layout={self.layout!r}, interleaved={self.interleaved}")


# --- Hugging Face drop-in ---------------------------------------------------------------------



def qk_norm_apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                                 q_norm_weight: Tensor, k_norm_weight: Tensor, eps: float = 1e-6,
                                 unsqueeze_dim: int = 1, weight_offset: float = 0.0
                                 ) -> Tuple[Tensor, Tensor]:
    """`q_norm`, `k_norm` and `apply_rotary_pos_emb` of a Hugging Face Qwen3 (Gemma 3) attention
    in one launch. In Qwen3Attention.forward,

        q = self.q_norm(self.q_proj(h).view(hidden_shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(hidden_shape)).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)

    becomes

        q = self.q_proj(h).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(h).view(hidden_shape).transpose(1, 2)
        q, k = qk_norm_apply_rotary_pos_emb(q, k, cos, sin, self.q_norm.weight,
                                            self.k_norm.weight, self.q_norm.variance_epsilon)

    (Gemma 3: weight_offset=1.0, eps=self.q_norm.eps).

    Args:
        q, k: the projections before the norm, `[batch, heads, seq, head_dim]` (unsqueeze_dim=1)
            or `[batch, seq, heads, head_dim]` (unsqueeze_dim=2); any strides; k's heads divide q's.
        cos, sin: `[batch or 1, seq, head_dim]` (or `[seq, head_dim]`), gathered at the positions,
            as HF's rotary modules return them.
        q_norm_weight, k_norm_weight: `[head_dim]`.
        eps: the norms' epsilon. unsqueeze_dim: 1 or 2 (or -3 / -2), as in HF.
        weight_offset: 0.0 (Qwen3) or 1.0 (Gemma 3).
    Returns:
        (q_embed, k_embed) shaped like q and k, with their strides where both are dense (as
        HF's own functions return them), else contiguous; in q's dtype. The math is fp32 with
        one rounding; HF rounds after the norm and after each multiply and add in the model's
        dtype, so 16-bit results can differ from HF's by a few ulps.
    """
    if type(unsqueeze_dim) is not int or unsqueeze_dim not in LAYOUT_OF_UNSQUEEZE_DIM:
        raise ValueError(f"unsqueeze_dim must be 1 ([b, h, s, d]) or 2 ([b, s, h, d]) (or -3, "
                         f"-2), got {unsqueeze_dim!r}")
    layout = LAYOUT_OF_UNSQUEEZE_DIM[unsqueeze_dim]
    for t, name in ((q, "q"), (k, "k")):
        V.check_tensor(t, name, dims=(4,))
    eps = V.check_real(eps, "eps", positive=True)
    weight_offset = V.check_real(weight_offset, "weight_offset")
    _check_inputs(q, k, q_norm_weight, k_norm_weight, layout,
                  w_names=("q_norm_weight", "k_norm_weight"))
    q4 = view4(q, layout)
    S, B, D = q4.shape[0], q4.shape[1], q4.shape[3]
    c, s = V.hf_cos_sin(cos, sin, S, B, D, partial="ropelib.qk_norm_rope")
    V.check_same_device(q, "q", cos=c, sin=s)
    check_no_table_grad(("cos", c), ("sin", s))
    if needs_grad(q, k, q_norm_weight, k_norm_weight):
        c, s = saveable(c), saveable(s)
    # the rows of cos/sin are the tokens already: token s reads row s (of its batch entry)
    return qk_norm_rope_op(q, k, q_norm_weight, k_norm_weight, c, s, None, None, layout, False,
                           eps, weight_offset)
