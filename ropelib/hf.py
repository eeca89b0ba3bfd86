"""Drop-in for Hugging Face transformers' `apply_rotary_pos_emb` (Llama and its many copies).

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    from ropelib.hf import apply_rotary_pos_emb          # same signature, same semantics

q and k are rotated in one launch, in fp32 with one rounding (HF rounds after each multiply
and add in the input dtype, so 16-bit results can differ from HF's by an ulp: ropelib's are
closer to the exact value).
"""
from typing import Optional, Tuple

import torch

from . import eager, ops
from . import validation as V
from .conventions import HF_LAYOUT, LAYOUT_OF_UNSQUEEZE_DIM
from .api import Call, plan_eager_call, check_no_table_grad, needs_grad, saveable

__all__ = ["apply_rotary_pos_emb", "apply_multimodal_rotary_pos_emb"]


def _layout_hint(unsqueeze_dim: int) -> str:
    """What a shape mismatch may mean: q and k in the other layout than unsqueeze_dim says."""
    if LAYOUT_OF_UNSQUEEZE_DIM[unsqueeze_dim] == HF_LAYOUT:
        return (f" (unsqueeze_dim={unsqueeze_dim} expects Hugging Face's layout q, k = [batch, "
                "heads, seq, head_dim]; for [batch, seq, heads, head_dim] (bshd) inputs pass "
                "q.transpose(1, 2) and k.transpose(1, 2), or unsqueeze_dim=2)")
    return (f" (unsqueeze_dim={unsqueeze_dim} expects q, k = [batch, seq, heads, head_dim]; "
            "for Hugging Face's [batch, heads, seq, head_dim] pass unsqueeze_dim=1)")


def _checked(q, k, cos, sin, unsqueeze_dim):
    """q, k and Hugging Face's cos/sin ([batch or 1, seq, head_dim] or [seq, head_dim]) checked
    against each other: (layout, S, B, D, cos, sin as the kernels read them)."""
    V.check_no_grad_transform("ropelib.hf")
    for t, name in ((q, "q"), (k, "k")):
        V.check_tensor(t, name, dims=(4,))
        V.check_kernel_device(t, name)
    if type(unsqueeze_dim) is not int or unsqueeze_dim not in LAYOUT_OF_UNSQUEEZE_DIM:
        raise ValueError(f"unsqueeze_dim must be 1 ([b, h, s, d]) or 2 ([b, s, h, d]) (or -3, "
                         f"-2), got {unsqueeze_dim!r}")
    # a constant from here on, also where torch.compile has made it a symbol (a caller passing
    # both values): the hints below format it
    unsqueeze_dim = int(unsqueeze_dim)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    V.check_same_device(q, "q", k=k, cos=cos, sin=sin)
    layout = LAYOUT_OF_UNSQUEEZE_DIM[unsqueeze_dim]
    q4, k4 = ops.view4(q, layout), ops.view4(k, layout)
    S, B, D = q4.shape[0], q4.shape[1], q4.shape[3]
    if k4.shape[0] != S or k4.shape[1] != B or k4.shape[3] != D:
        raise ValueError(f"q and k must agree in batch, seq and head_dim, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}{_layout_hint(unsqueeze_dim)}")
    c, s = V.hf_cos_sin(cos, sin, S, B, D, partial="ropelib.apply_rope",
                        hint=_layout_hint(unsqueeze_dim))
    check_no_table_grad(("cos", c), ("sin", s))
    return layout, S, B, D, c, s


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                         unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Applies rotary position embedding to the query and key tensors (Hugging Face semantics).

    Args:
        q: `[batch, heads, seq, head_dim]` (unsqueeze_dim=1) or `[batch, seq, heads, head_dim]`
            (unsqueeze_dim=2).
        k: same layout as q; its head count may differ (GQA).
        cos, sin: `[batch or 1, seq, head_dim]` (or `[seq, head_dim]`), already gathered at the
            positions, as HF's rotary modules return them.
        position_ids: deprecated and unused, as in transformers.
        unsqueeze_dim: 1 or 2 (or -3 / -2), the dimension along which cos/sin broadcast over heads.
    Returns:
        (q_embed, k_embed), dtype promoted from q's and cos's like HF's arithmetic. Where q and
        k are transformers' `[batch, heads, seq, head_dim]` views of `[batch, seq, heads,
        head_dim]` projections, the outputs are such views too (transformers' formula gives
        them q's strides); otherwise they are contiguous.
    """
    del position_ids   # unused in transformers too
    tables_and_index = (cos, sin, None, None, None)
    sig = eager.signature(("hf", unsqueeze_dim, type(unsqueeze_dim)), (q, k, cos, sin)) \
        if eager.active() else None
    if sig is not None:
        planned = eager.SIGNATURES.get(sig)
        if planned is not None:
            return planned((q, k), tables_and_index)
    if type(unsqueeze_dim) is int and LAYOUT_OF_UNSQUEEZE_DIM.get(unsqueeze_dim) == HF_LAYOUT \
            and _bshd_views(q, k):
        # transformers' q and k: [B, H, S, D] views of bshd projections. Rotated in that memory
        # order, where large ones take the flat pass whole: 0.983 of a copy forward, where as
        # strided views they took the finished kernel at 0.778 (b4 s8192 28/4 heads bf16, H200,
        # results/hf_tables-*). The outputs have q's strides, as transformers' formula gives.
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        q_out, k_out = apply_rotary_pos_emb(qt, kt, cos, sin, unsqueeze_dim=2)
        if sig is not None:     # later calls: straight to the bshd call's plan
            _remember_plan(sig, ("hf", 2, int), (qt, kt, cos, sin), views=True)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    layout, S, B, D, c, s = _checked(q, k, cos, sin, unsqueeze_dim)
    out_dtype = torch.promote_types(q.dtype, cos.dtype)
    # the rows of cos/sin are the tokens already: position s reads row s (of its batch entry)
    if sig is not None:
        call = Call(c, s, None, None, None, layout, False, 1, 0, S, B, D)
        planned = eager.SIGNATURES.put(sig, plan_eager_call(
            (q, k), tables_and_index, (c, s), call, inplace=False, rows=S, names=("q", "k"),
            out_dtype=out_dtype))
        return planned((q, k), tables_and_index, checked=True)
    if needs_grad(q, k):
        c, s = saveable(c), saveable(s)
    return ops.rope_qk(q, k, c, s, None, None, None, layout, False, 1, 0, False, out_dtype)


def apply_multimodal_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                    sin: torch.Tensor, mrope_section, unsqueeze_dim: int = 1
                                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL's multimodal RoPE (transformers 4.x `apply_multimodal_rotary_pos_emb`): same
    signature, same results.

    cos/sin hold one table per axis (time, height, width), [3, batch, seq, head_dim], as
    Qwen2-VL's rotary module of transformers 4.x returns them; `mrope_section` (pairs per axis,
    e.g. [16, 24, 24]) says which axis's table each feature takes. Large q and k (the two-pass
    route's size, kernels/tiles.py), dense in their memory order, are rotated in one pass that
    reads each feature's row from its axis's table as it is (kernels/flat.py); smaller ones get
    the tables gathered into one [batch, seq, head_dim] table first (what transformers builds
    with its split and cat) and take `apply_rotary_pos_emb`'s cos/sin path. Both give the same
    bits. Where q and k are transformers' [batch, heads, seq, head_dim] views of [batch, seq,
    heads, head_dim] projections, they are rotated in that memory order and the outputs have
    their strides, as transformers' own formula gives them; otherwise the outputs are
    contiguous. To skip the tables altogether, use ropelib.apply_mrope_qk with the positions
    (the kernel forms the angles itself).

    Args:
        q, k: `[batch, heads, seq, head_dim]` (unsqueeze_dim=1) or `[batch, seq, heads,
            head_dim]` (unsqueeze_dim=2); k's head count may differ (GQA).
        cos, sin: `[3, batch or 1, seq, head_dim]`.
        mrope_section: three ints (a list or tuple) summing to head_dim / 2.
        unsqueeze_dim: 1 or 2 (or -3 / -2), as in transformers.
    Returns:
        (q_embed, k_embed), dtype promoted from q's and cos's like transformers' arithmetic.
    """
    sections_key = _sections_key(mrope_section)
    sig = eager.signature(("hf-multimodal", sections_key, unsqueeze_dim, type(unsqueeze_dim)),
                          (q, k, cos, sin)) \
        if sections_key is not None and eager.active() else None
    planned = eager.SIGNATURES.get(sig) if sig is not None else None
    if planned is not None:
        return planned((q, k), (cos, sin, None, None, None))
    for t, name in ((cos, "cos"), (sin, "sin")):
        V.check_tensor(t, name, dims=(4,))
    c, s = V.cos_sin_pair(cos, sin)
    if not isinstance(mrope_section, (list, tuple)) or len(mrope_section) != 3 or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in mrope_section):
        raise ValueError(f"mrope_section must be three ints >= 0 (frequency pairs of the time, "
                         f"height and width axes), got {mrope_section!r}")
    D = c.shape[-1]
    if 2 * sum(mrope_section) != D:
        raise ValueError(f"mrope_section {list(mrope_section)} covers {2 * sum(mrope_section)} "
                         f"features, but cos/sin have head_dim {D}: twice its sum must equal it")
    if c.shape[0] != 3:
        raise ValueError(f"cos/sin must be [3, batch, seq, head_dim] (one table per axis: "
                         f"time, height, width), got {tuple(cos.shape)}")
    sections = list(mrope_section)
    # later calls of this signature go straight to _multimodal's plan, where it made one and
    # the checks above changed nothing (cos and sin read as they were given)
    remember = sig is not None and c is cos and s is sin
    if LAYOUT_OF_UNSQUEEZE_DIM.get(unsqueeze_dim) == HF_LAYOUT and _bshd_views(q, k):
        # transformers' q and k: [B, H, S, D] views of bshd projections. Rotated in that memory
        # order; the outputs have q's strides, as transformers' own formula gives them
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        q_out, k_out = _multimodal(qt, kt, c, s, sections, 2)
        if remember:
            _remember_plan(sig, ("hf-axis-tables", tuple(sections), 2), (qt, kt, c, s),
                           views=True)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    out = _multimodal(q, k, c, s, sections, unsqueeze_dim)
    if remember:
        _remember_plan(sig, ("hf-axis-tables", tuple(sections), unsqueeze_dim), (q, k, c, s))
    return out


def _sections_key(mrope_section) -> Optional[tuple]:
    """mrope_section as part of a signature: a tuple of three ints, else None (such a call
    takes the full checks, which say what is wrong with it)."""
    if type(mrope_section) in (list, tuple) and len(mrope_section) == 3 \
            and all(type(n) is int for n in mrope_section):
        return tuple(mrope_section)
    return None


class _ViewsOfBshd:
    """A planned eager call (api.PlannedCall) on the bshd transposes of transformers' [B, H, S,
    D] views, called with the views: outputs transposed back, with q's strides."""
    __slots__ = ("planned",)

    def __init__(self, planned):
        self.planned = planned

    def __call__(self, xs: tuple, tables_and_index: tuple):
        q_out, k_out = self.planned(tuple(x.transpose(1, 2) for x in xs), tables_and_index)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)


def _remember_plan(sig: tuple, inner_head: tuple, inner_tensors: tuple,
                   views: bool = False) -> None:
    """Keep, under the caller's signature `sig`, the plan the inner call made under
    (inner_head, inner_tensors), if it made one (`views`: the inner call was on the bshd
    transposes of the caller's views): a later call with that signature then skips the checks
    (the same for every call of a signature) and the views test."""
    inner = eager.SIGNATURES.get(eager.signature(inner_head, inner_tensors))
    if inner is not None:
        eager.SIGNATURES.put(sig, _ViewsOfBshd(inner) if views else inner)


def _multimodal(q, k, cos, sin, sections: list, unsqueeze_dim: int):
    """Qwen2-VL's per-axis tables cos, sin [3, B or 1, S, D] on q and k: read as they are by
    the flat pass where q and k are large and contiguous, else gathered into one table."""
    layout = LAYOUT_OF_UNSQUEEZE_DIM.get(unsqueeze_dim) if type(unsqueeze_dim) is int else None
    if layout is not None and all(type(t) is torch.Tensor and t.dim() == 4 for t in (q, k)):
        # the eager route (ropelib.eager): checked and planned once per signature
        tables_and_index = (cos, sin, None, None, None)
        sig = eager.signature(("hf-axis-tables", tuple(sections), unsqueeze_dim),
                              (q, k, cos, sin)) if eager.active() else None
        planned = eager.SIGNATURES.get(sig) if sig is not None else None
        if planned is not None:
            return planned((q, k), tables_and_index)
        if ops.takes_axis_tables(q, k, cos, sin, sections, layout):
            _, S, B, D, c, s = _checked(q, k, cos[0], sin[0], unsqueeze_dim)
            out_dtype = torch.promote_types(q.dtype, cos.dtype)
            if sig is None:
                return ops.rope_qk_axes(q, k, cos, sin, sections, layout, False, out_dtype)
            call = Call(c, s, None, None, None, layout, False, 1, 0, S, B, D)
            planned = eager.SIGNATURES.put(sig, plan_eager_call(
                (q, k), tables_and_index, (c, s), call, inplace=False, rows=S,
                names=("q", "k"), out_dtype=out_dtype,
                axes=ops.axis_tables(cos, sin, sections).axes))
            return planned((q, k), tables_and_index, checked=True)
    axes = _feature_axes(tuple(sections), cos.shape[-1], cos.device)
    return apply_rotary_pos_emb(q, k, *ops.gathered_tables(cos, sin, sections, axes),
                                unsqueeze_dim=unsqueeze_dim)


def _bshd_views(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Are q and k ([B, H, S, D]) transformers' views of contiguous [B, S, H, D] projections:
    both laid out so, and not both contiguous as they are? (A tensor of one head, such as k
    with one kv head, or of one token is contiguous both ways.)"""
    return all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.transpose(1, 2).is_contiguous()
               for t in (q, k)) and not (q.is_contiguous() and k.is_contiguous())


_FEATURE_AXES = {}    # (mrope_section, head_dim, device) -> [head_dim] int64 on that device


def _feature_axes(mrope_section: tuple, D: int, device) -> torch.Tensor:
    """The axis (0 time, 1 height, 2 width) whose table feature i takes: sections of
    mrope_section pairs in each half of the head. Made on the device from Python ints (no copy
    from host memory, which would wait for the stream and cannot be captured in a CUDA graph),
    once per (sections, head_dim, device) in eager calls."""
    key, active = (mrope_section, D, device), eager.active()
    found = _FEATURE_AXES.get(key) if active else None
    if found is not None:
        return found
    axes = ops.feature_axes(list(mrope_section), D, device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if active and not capturing:     # (made while capturing, it is filled at replay)
        _FEATURE_AXES[key] = axes
    return axes
