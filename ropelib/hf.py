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
        (q_embed, k_embed), dtype promoted from q's and cos's like HF's arithmetic.
    """
    del position_ids   # unused in transformers too
    tables_and_index = (cos, sin, None, None, None)
    sig = eager.signature(("hf", unsqueeze_dim, type(unsqueeze_dim)), (q, k, cos, sin)) \
        if eager.active() else None
    if sig is not None:
        planned = eager.SIGNATURES.get(sig)
        if planned is not None:
            return planned((q, k), tables_and_index)
    for t, name in ((q, "q"), (k, "k")):
        V.check_tensor(t, name, dims=(4,))
        V.check_kernel_device(t, name)
    if type(unsqueeze_dim) is not int or unsqueeze_dim not in LAYOUT_OF_UNSQUEEZE_DIM:
        raise ValueError(f"unsqueeze_dim must be 1 ([b, h, s, d]) or 2 ([b, s, h, d]) (or -3, "
                         f"-2), got {unsqueeze_dim!r}")
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
    e.g. [16, 24, 24]) says which axis's table each feature takes. This function takes those
    materialised tables by definition: it picks each feature's axis row out of them (one gather
    into [batch, seq, head_dim], which transformers builds as well with its split and cat) and
    rotates q and k in one launch with `apply_rotary_pos_emb`'s cos/sin path. To skip the
    tables altogether, use ropelib.apply_mrope_qk with the positions (the kernel forms the
    angles itself).

    Args:
        q, k: `[batch, heads, seq, head_dim]` (unsqueeze_dim=1) or `[batch, seq, heads,
            head_dim]` (unsqueeze_dim=2); k's head count may differ (GQA).
        cos, sin: `[3, batch or 1, seq, head_dim]`.
        mrope_section: three ints (a list or tuple) summing to head_dim / 2.
        unsqueeze_dim: 1 or 2 (or -3 / -2), as in transformers.
    Returns:
        (q_embed, k_embed), dtype promoted from q's and cos's like transformers' arithmetic.
    """
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
    index = _feature_axes(tuple(mrope_section), D, c.device)[None, None, None, :].expand(
        1, *c.shape[1:])
    return apply_rotary_pos_emb(q, k, c.gather(0, index)[0], s.gather(0, index)[0],
                                unsqueeze_dim=unsqueeze_dim)


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
    pair = torch.arange(D, device=device) % (D // 2)
    t, h = mrope_section[0], mrope_section[0] + mrope_section[1]
    axes = (pair >= t).to(torch.int64) + (pair >= h).to(torch.int64)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if active and not capturing:     # (made while capturing, it is filled at replay)
        _FEATURE_AXES[key] = axes
    return axes
