"""ropelib's PyTorch operators: the seam between the public API and the kernel.

    torch.ops.ropelib.rope(x, ...)          -> y            rotate one tensor
    torch.ops.ropelib.rope_qk(q, k, ...)    -> (q', k')     q and k in one launch
    torch.ops.ropelib.rope_(x, ...)                          in place (no autograd)
    torch.ops.ropelib.rope_qk_(q, k, ...)                    in place (no autograd)
    torch.ops.ropelib.rope_qk_axes(q, k, ...) -> (q', k')   Qwen2-VL's per-axis tables
    torch.ops.ropelib.rope_qkv(qkv, ...)    -> (q, k, v)    Transformer Engine's packed QKV
    torch.ops.ropelib.rope_qkv_backward(gq, gk, gv, ...) -> gqkv

Each is registered with torch.library: on a GPU as a `triton_op`, so torch.compile sees the
Triton kernel itself and Inductor launches it; in Triton's interpreter (CPU) as an opaque
`custom_op`, whose kernel runs as Python. Both have a fake implementation (the same code, which
only allocates when given fake tensors) and the functional ones an autograd formula: the
backward of a rotation is the same op rotating by -theta, itself differentiable, so double
backward works. What the backward reads (tables and index tensors) is saved for backward, so
changing one of them in place between forward and backward raises autograd's usual error.

Arguments are validated by the public API (ropelib.api) before they get here. Shared arguments:
  table [P, R] or [B or 1, P, R]: angles (sin None) or cos, with sin of the same shape;
        or, for angles computed in the kernel (ropelib.frequencies.Angles), table = turns [R]
        int64 and sin = amplitude [1];
  position_ids [B or 1, S] | cu_seqlens [N + 1] (layout "thd") | start_positions [B] or [N];
  layout: "sbhd", "bshd", "thd" or "bhsd" (Hugging Face's [B, H, S, D]).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .conventions import view4
from .kernels import launch
from .kernels.launch import Positions, Table, View, plan, plan_qkv
from .runtime import INTERPRET


def define_op(name: str, mutates_args=()):
    """Register fn as the op `name`: a triton_op on GPUs, a custom_op in the interpreter."""
    def register(fn):
        if INTERPRET:
            op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
            op.register_fake(fn)    # fn allocates; the launch does nothing for fake tensors
            return op
        return torch.library.triton_op(name, mutates_args=mutates_args)(fn)
    return register


def kernel_view(t: Optional[Tensor], layout: str) -> Optional[View]:
    """t in `layout` as the kernels address it (a plain [S, B, H, D] View); None stays None."""
    return View.of(view4(t, layout)) if t is not None else None


def _launch(x: Tensor, y: Optional[Tensor], table: Table, positions: Positions, layout: str, *,
            interleaved: bool, backward: bool, k: Optional[Tensor] = None,
            k_out: Optional[Tensor] = None) -> None:
    """Rotate x (and k) in `layout` into y (and k_out), or in place (y None), in one launch. y
    and k_out are fresh contiguous tensors, or column slices of one token-major buffer with one
    token row stride (launch.output_row: the QKV projection's dY, written straight into). Where
    the kernels cannot store (writes_in_place, output_row), into fresh tensors copied there."""
    x4 = view4(x, layout)
    if x4.shape[0] == 0 or x4.shape[1] == 0:
        return
    stores = writes_in_place(x, k) if y is None else \
        launch.output_row(kernel_view(y, layout), kernel_view(k_out, layout), layout) is not None
    if not stores:
        fresh_y, fresh_k = _empty_like(x, y.dtype if y is not None else None), \
            (_empty_like(k, k_out.dtype if k_out is not None else None)
             if k is not None else None)
        _launch(x, fresh_y, table, positions, layout, interleaved=interleaved,
                backward=backward, k=k, k_out=fresh_k)
        (x if y is None else y).copy_(fresh_y)
        if k is not None:
            (k if k_out is None else k_out).copy_(fresh_k)
        return
    launch.run(*plan(kernel_view(x, layout), kernel_view(y, layout), table, positions,
                     R=table.cos.shape[-1], interleaved=interleaved, backward=backward,
                     layout=layout, k=kernel_view(k, layout), k_out=kernel_view(k_out, layout)))


def rotate_into(q: Tensor, q_out: Tensor, k: Tensor, k_out: Tensor, table: Tensor,
                sin: Optional[Tensor], position_ids: Optional[Tensor],
                cu_seqlens: Optional[Tensor], layout: str, interleaved: bool,
                backward: bool) -> None:
    """Rotate q and k into q_out and k_out, tensors of the caller's (column slices of one
    token-major buffer are stored into directly: `_launch`). For code inside ropelib's own
    operators, which own the outputs (qkv_linear.written_dy, through eager.rotate_into: planned
    once per signature where the call is plain eager); not an operator itself."""
    _launch(q, q_out, Table(table, sin), Positions(position_ids, cu_seqlens), layout,
            interleaved=interleaved, backward=backward, k=k, k_out=k_out)


def writes_in_place(*xs: Optional[Tensor]) -> bool:
    """Can the kernels store these tensors' rotated rows where they read them? They write a row
    with its features at stride 1 (the narrow kernels take no output feature stride), so in
    place on a tensor whose features are not (a transposed buffer, a `[..., ::2]` slice) is
    rotated into a fresh tensor and copied back instead."""
    return all(x.stride(-1) == 1 or x.shape[-1] <= 1 for x in xs if x is not None)


def _empty_like(x: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    return torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)


# --- rotate one tensor, or q and k ----------------------------------------------------------

@define_op("ropelib::rope")
def rope(x: Tensor, table: Tensor, sin: Optional[Tensor], position_ids: Optional[Tensor],
         cu_seqlens: Optional[Tensor], start_positions: Optional[Tensor], layout: str,
         interleaved: bool, cp_size: int, cp_rank: int, backward: bool,
         out_dtype: Optional[torch.dtype]) -> Tensor:
    y = _empty_like(x, out_dtype)
    _launch(x, y, Table(table, sin),
            Positions(position_ids, cu_seqlens, start_positions, cp_size, cp_rank), layout,
            interleaved=interleaved, backward=backward)
    return y


@define_op("ropelib::rope_qk")
def rope_qk(q: Tensor, k: Tensor, table: Tensor, sin: Optional[Tensor],
            position_ids: Optional[Tensor], cu_seqlens: Optional[Tensor],
            start_positions: Optional[Tensor], layout: str, interleaved: bool, cp_size: int,
            cp_rank: int, backward: bool, out_dtype: Optional[torch.dtype]
            ) -> Tuple[Tensor, Tensor]:
    q_out, k_out = _empty_like(q, out_dtype), _empty_like(k, out_dtype)
    _launch(q, q_out, Table(table, sin),
            Positions(position_ids, cu_seqlens, start_positions, cp_size, cp_rank), layout,
            interleaved=interleaved, backward=backward, k=k, k_out=k_out)
    return q_out, k_out


@define_op("ropelib::rope_", mutates_args=("x",))
def rope_(x: Tensor, table: Tensor, sin: Optional[Tensor], position_ids: Optional[Tensor],
          cu_seqlens: Optional[Tensor], start_positions: Optional[Tensor], layout: str,
          interleaved: bool, cp_size: int, cp_rank: int) -> None:
    _launch(x, None, Table(table, sin),
            Positions(position_ids, cu_seqlens, start_positions, cp_size, cp_rank), layout,
            interleaved=interleaved, backward=False)


@define_op("ropelib::rope_qk_", mutates_args=("q", "k"))
def rope_qk_(q: Tensor, k: Tensor, table: Tensor, sin: Optional[Tensor],
             position_ids: Optional[Tensor], cu_seqlens: Optional[Tensor],
             start_positions: Optional[Tensor], layout: str, interleaved: bool, cp_size: int,
             cp_rank: int) -> None:
    _launch(q, None, Table(table, sin),
            Positions(position_ids, cu_seqlens, start_positions, cp_size, cp_rank), layout,
            interleaved=interleaved, backward=False, k=k)


# The backward of a rotation is the rotation by -theta, with the same tables and positions.

def _setup_rope(ctx, inputs, output):
    x, table, sin, position_ids, cu_seqlens, start_positions, *options = inputs
    ctx.save_for_backward(table, sin, position_ids, cu_seqlens, start_positions)
    ctx.options = options   # layout, interleaved, cp_size, cp_rank, backward, out_dtype
    ctx.x_dtype = x.dtype


def _rope_backward(ctx, grad):
    layout, interleaved, cp_size, cp_rank, backward, _ = ctx.options
    gx = rope(grad, *ctx.saved_tensors, layout, interleaved, cp_size, cp_rank, not backward,
              ctx.x_dtype)
    return (gx,) + (None,) * 11


def _setup_rope_qk(ctx, inputs, output):
    q, k, table, sin, position_ids, cu_seqlens, start_positions, *options = inputs
    ctx.save_for_backward(table, sin, position_ids, cu_seqlens, start_positions)
    ctx.options = options
    ctx.x_dtype = q.dtype


def _rope_qk_backward(ctx, grad_q, grad_k):
    tables_and_index = ctx.saved_tensors
    layout, interleaved, cp_size, cp_rank, backward, _ = ctx.options
    opts = (layout, interleaved, cp_size, cp_rank, not backward, ctx.x_dtype)
    if grad_q is not None and grad_k is not None:
        gq, gk = rope_qk(grad_q, grad_k, *tables_and_index, *opts)
    else:
        gq = rope(grad_q, *tables_and_index, *opts) if grad_q is not None else None
        gk = rope(grad_k, *tables_and_index, *opts) if grad_k is not None else None
    return (gq, gk) + (None,) * 11


rope.register_autograd(_rope_backward, setup_context=_setup_rope)
rope_qk.register_autograd(_rope_qk_backward, setup_context=_setup_rope_qk)

# The same four operators as their OpOverloads (torch.ops.ropelib.<name>.default), which the
# public API calls: a call traced by torch.compile then guards one object, where calling the
# registered function (its __call__, then its overload) installs four guards.
rope_overload = torch.ops.ropelib.rope.default
rope_qk_overload = torch.ops.ropelib.rope_qk.default
rope_inplace_overload = torch.ops.ropelib.rope_.default
rope_qk_inplace_overload = torch.ops.ropelib.rope_qk_.default


# --- one table per axis (Qwen2-VL's materialised multimodal cos/sin) ------------------------

def axis_tables(cos: Tensor, sin: Tensor, sections: List[int]) -> Table:
    """Qwen2-VL's per-axis tables cos, sin [3, B or 1, S, R] as the two-pass route's flat pass
    reads them: the time axis's [B or 1, S, R] and, per section, where its table lies."""
    t, h = sections[0], sections[0] + sections[1]
    return Table(cos[0], sin[0], (t, h, cos.stride(0)))


def feature_axes(sections: List[int], R: int, device) -> Tensor:
    """[R] int64: the axis (0 time, 1 height, 2 width) whose table rotate-half feature i reads
    (sections of pairs, in each half of the head). Made on the device from Python ints: no copy
    from host memory (which waits for the stream and cannot be captured in a CUDA graph)."""
    pair = torch.arange(R, device=device) % (R // 2)
    return (pair >= sections[0]).to(torch.int64) \
        + (pair >= sections[0] + sections[1]).to(torch.int64)


def gathered_tables(cos: Tensor, sin: Tensor, sections: List[int],
                    axes: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The per-axis tables [3, B or 1, S, R] gathered into one [B or 1, S, R] table each: every
    feature's row from its axis's table (what transformers builds with its split and cat)."""
    if axes is None:
        axes = feature_axes(sections, cos.shape[-1], cos.device)
    index = axes[None, None, None, :].expand(1, *cos.shape[1:])
    return cos.gather(0, index)[0], sin.gather(0, index)[0]


def takes_axis_tables(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, sections: List[int],
                      layout: str) -> bool:
    """Does the two-pass route's flat pass take q and k with these per-axis tables as they are
    (large, q and k contiguous in `layout`, the tables contiguous)? Otherwise the tables are
    gathered into one first. Sizes first: a small call is turned away without planning."""
    if (q.numel() + k.numel()) * q.element_size() < launch.two_pass_min_bytes():
        return False
    if not (cos.is_contiguous() and sin.is_contiguous()):
        return False
    q4, k4 = kernel_view(q, layout), kernel_view(k, layout)
    return launch.takes_two_passes(q4, q4, k4, k4, axis_tables(cos, sin, sections), Positions(),
                                   layout)


@define_op("ropelib::rope_qk_axes")
def rope_qk_axes(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, sections: List[int],
                 layout: str, backward: bool, out_dtype: Optional[torch.dtype]
                 ) -> Tuple[Tensor, Tensor]:
    """q and k rotated by Qwen2-VL's per-axis tables cos, sin [3, B or 1, S, R] (rotate-half,
    positions the token index): each pair reads the table of its section. Outputs contiguous in
    `layout`. Large inputs read the tables as they are (the flat pass); others gather them into
    one table first and take the finished kernel."""
    q_out, k_out = _empty_like(q, out_dtype), _empty_like(k, out_dtype)
    if takes_axis_tables(q, k, cos, sin, sections, layout):
        table = axis_tables(cos, sin, sections)
    else:
        table = Table(*gathered_tables(cos, sin, sections))
    _launch(q, q_out, table, Positions(), layout, interleaved=False, backward=backward, k=k,
            k_out=k_out)
    return q_out, k_out


def _setup_rope_qk_axes(ctx, inputs, output):
    q, k, cos, sin, *options = inputs
    ctx.save_for_backward(cos, sin)
    ctx.options = options   # sections, layout, backward, out_dtype
    ctx.x_dtype = q.dtype
    ctx.outputs = [(o.shape, o.dtype, o.device) for o in output]


def _rope_qk_axes_backward(ctx, grad_q, grad_k):
    # an output that took no part in the loss has no gradient: it contributes zero
    sections, layout, backward, _ = ctx.options
    gq, gk = (g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
              for g, (shape, dtype, device) in zip((grad_q, grad_k), ctx.outputs))
    gq, gk = rope_qk_axes(gq, gk, *ctx.saved_tensors, sections, layout, not backward,
                          ctx.x_dtype)
    return (gq, gk) + (None,) * 6


rope_qk_axes.register_autograd(_rope_qk_axes_backward, setup_context=_setup_rope_qk_axes)


# --- Transformer Engine's packed QKV --------------------------------------------------------

def _launch_qkv(qkv: Tensor, q: Tensor, k: Tensor, q_table: Tensor, k_table: Tensor,
                start_positions: Optional[Tensor], layout: str, split: List[int], *,
                interleaved: bool, backward: bool, cp_size: int, cp_rank: int) -> None:
    """Packed qkv -> rotated q, k (forward), or the gradients q, k -> packed (backward)."""
    k4 = view4(k, layout)
    if k4.shape[0] == 0 or k4.shape[1] == 0:
        return
    launch.run(*plan_qkv(view4(qkv, layout), view4(q, layout), k4, q_table, k_table,
                         start_positions, heads_per_group=split[0] // split[1],
                         interleaved=interleaved, backward=backward, cp_size=cp_size,
                         cp_rank=cp_rank))


@define_op("ropelib::rope_qkv")
def rope_qkv(qkv: Tensor, q_table: Tensor, k_table: Tensor, start_positions: Optional[Tensor],
             layout: str, split: List[int], interleaved: bool, cp_size: int, cp_rank: int
             ) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = split
    lead = qkv.shape[:3]    # (S, B, G) or (B, S, G)
    G = lead[2]
    q_out = torch.empty((*lead[:2], G * (dq // dk), dk), dtype=qkv.dtype, device=qkv.device)
    k_out = torch.empty((*lead[:2], G, dk), dtype=qkv.dtype, device=qkv.device)
    v_out = torch.empty((*lead[:2], G, dv), dtype=qkv.dtype, device=qkv.device)
    if qkv.stride(-1) != 1:     # the kernel reads features at stride 1
        qkv = qkv.contiguous()
    _launch_qkv(qkv, q_out, k_out, q_table, k_table, start_positions, layout, split,
                interleaved=interleaved, backward=False, cp_size=cp_size, cp_rank=cp_rank)
    view4(v_out, layout).copy_(view4(qkv, layout)[..., dq + dk:])
    return q_out, k_out, v_out


@define_op("ropelib::rope_qkv_backward")
def rope_qkv_backward(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, q_table: Tensor,
                      k_table: Tensor, start_positions: Optional[Tensor], layout: str,
                      split: List[int], interleaved: bool, cp_size: int, cp_rank: int) -> Tensor:
    lead = grad_k.shape[:3]
    grad_qkv = torch.empty((*lead, sum(split)), dtype=grad_k.dtype, device=grad_k.device)
    _launch_qkv(grad_qkv, grad_q, grad_k, q_table, k_table, start_positions, layout, split,
                interleaved=interleaved, backward=True, cp_size=cp_size, cp_rank=cp_rank)
    view4(grad_qkv, layout)[..., split[0] + split[1]:].copy_(view4(grad_v, layout))
    return grad_qkv


def _setup_qkv(ctx, inputs, output):
    qkv, q_table, k_table, start_positions, *options = inputs
    ctx.save_for_backward(q_table, k_table, start_positions)
    ctx.options = options
    ctx.outputs = [(o.shape, o.dtype, o.device) for o in output]


def _qkv_backward(ctx, grad_q, grad_k, grad_v):
    # an output that took no part in the loss has no gradient: its slice of grad_qkv is zero
    grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
             for g, (shape, dtype, device) in zip((grad_q, grad_k, grad_v), ctx.outputs)]
    return (rope_qkv_backward(*grads, *ctx.saved_tensors, *ctx.options),) + (None,) * 8


def _setup_qkv_backward(ctx, inputs, output):
    grad_q, grad_k, grad_v, q_table, k_table, start_positions, *options = inputs
    ctx.save_for_backward(q_table, k_table, start_positions)
    ctx.options = options


def _qkv_double_backward(ctx, grad_grad_qkv):
    gq, gk, gv = rope_qkv(grad_grad_qkv, *ctx.saved_tensors, *ctx.options)
    return (gq, gk, gv) + (None,) * 8


rope_qkv.register_autograd(_qkv_backward, setup_context=_setup_qkv)
rope_qkv_backward.register_autograd(_qkv_double_backward, setup_context=_setup_qkv_backward)
