"""RoPE fused into the QKV projection: `qkv_rope_linear`, its operators and their autograd
formula.

    q, k, v = ropelib.qkv_rope_linear(x, weight, bias, n_heads=32, n_kv_heads=8, head_dim=128,
                                      angles=ropelib.rope_angles(128, base=500000.0))

computes a fused nn.Linear's projection x W^T + b, splits it into q, k and v heads, RMS-norms
each q and k head (with norm weights, as Qwen3 and Gemma 3 do) and rotates q and k, all in one
Triton GEMM whose epilogue does the norm and the rotation while the tile is in registers
(ropelib/kernels/qkv_gemm.py says how). Its backward writes the projection's gradient dY once
(backward="dy", the default): ropelib's RoPE undoes the rotation of the gradients of q and k and
stores them straight into their columns of dY (with QK-norm, qk_norm_rope's backward undoes the
norm and the rotation, storing into dY's columns too), and cuBLAS runs dX and dW on dY.
backward="prologue" never writes dY: ropelib's dX and dW GEMMs undo the rotation (and the norm)
as they load the gradient, at the price of re-forming it in every column block; on an H200 at
8192 tokens of Llama-3-8B's projection it took 2.7 times as long (3.7 with QK-norm;
benchmarks/qkv_dy_probe.py).

One path: the public function checks its arguments (ropelib/qkv_checks.py) and calls an
operator, registered like ropelib's others (ropelib.ops: a triton_op on GPUs, a custom_op in
the interpreter, each with a fake implementation), which launches the kernels as their plans
say (ropelib/qkv_plan.py). A plain eager call (ropelib.eager.active: no compiler, tracer,
transform or dispatch mode at work) runs the same implementation and autograd formula without
the dispatcher (_EagerQKVRoPE), as ropelib's other eager calls do. The operators:

    torch.ops.ropelib.qkv_rope_linear(x, weight, bias, table, sin, position_ids, cu_seqlens,
        q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved,
        out_layout, save_for_norm, backward) -> (q, k, v, rstd, norm_input)
    torch.ops.ropelib.qkv_rope_linear_backward(grad_q, grad_k, grad_v, x, weight, table, sin,
        position_ids, cu_seqlens, q_norm_weight, k_norm_weight, rstd, norm_input, n_heads,
        n_kv_heads, head_dim, interleaved, out_layout, grad_x, grad_params, has_bias)
        -> (grad_x, grad_weight, grad_bias, grad_q_norm_weight, grad_k_norm_weight)
    torch.ops.ropelib.qkv_rotated_dy(grad_q, grad_k, grad_v, x, table, sin, position_ids,
        cu_seqlens, interleaved) -> dY
    torch.ops.ropelib.qkv_rotated_dy_normed(grad_q, grad_k, grad_v, x, norm_input,
        q_norm_weight, k_norm_weight, table, sin, position_ids, cu_seqlens, n_heads,
        n_kv_heads, head_dim, eps, interleaved) -> (dY, grad_q_norm_weight, grad_k_norm_weight)

The module around it, QKVRoPE, is ropelib/qkv_module.py.

Plans kept. A plain eager call plans each launch once and keeps it in ropelib.eager.SIGNATURES
(eager.SIGNATURES.clear() drops them all): the call's checks' outcome and its forward's whole
plan, the GEMMs' and the pre-pass's plans and the backward's dY step; ropelib/qkv_plan.py makes
them and says what each is keyed on. A later call of a signature checked in full checks only
the position values (qkv_checks.checked_position_values).
Rows kept. Where positions are the token index, the forward's cos/sin rows (and pairs_differ
flag) follow from its plan and the table alone: a plain eager forward keeps them in
eager.TABLE_ROWS as the eager RoPE route keeps its two-pass rows (the same ForwardPlan, the
same table tensor unwritten since, the same stream), and the next forward of that plan and
table, every layer's after the first, launches no pre-pass (`_kept_rows`).

The forward's autograd formula is qkv_rotated_dy (with QK-norm qkv_rotated_dy_normed) and two
matrix products (backward="dy"), or the backward operator (backward="prologue"); double
backward is not supported.
rstd and norm_input are what the norm's backward needs (empty without norm weights or when no
gradient will be asked for; the eager route's forward makes no empty ones: None); tensors an
operator does not compute come back empty ([0]).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import eager, qk_norm as ops_qk_norm, validation as V
from .api import needs_grad, saveable
from .eager import SIGNATURES, rotate_into
from .frequencies import Angles
from .kernels import qkv_gemm as kernel
from .kernels.launch import COS_SIN_ROWS
from .kernels.planning import Launch, pointer_dtypes, start
from .ops import define_op
from .qkv_checks import (check_norm_weights, check_out_layout, check_projection, checked_heads,
                         checked_position_values, checked_positions, checked_table,
                         resolved_backward, sizes, table_positions, table_view)
from .qkv_plan import (DyStep, ForwardPlan, PlannedCall, call_signature, dy_layout, dy_with_v,
                       forward_plan, gemm_plan, prepass_plan, row_sets)

__all__ = ["qkv_rope_linear"]


# --- starting the kernels (their plans: qkv_plan) -------------------------------------------

def _run(kind: str, pointers: tuple, x: Tensor, table: Tensor, position_ids, cu_seqlens,
         n_heads, n_kv_heads, head_dim, interleaved, out_layout, eps=1e-6,
         launch: Optional[Launch] = None) -> None:
    """Plan one of the three kernels for these pointers (in its *_POINTERS order) and start it
    (the plan kept for the next call with the same sizes, dtypes and options:
    qkv_plan.planned). launch: the caller's kept plan (the forward's ForwardPlan), taken where
    it was planned for pointers of these dtypes; a TMA forward then sets Triton's allocator as
    qkv_plan.planned does."""
    dtypes = pointer_dtypes(pointers)
    if launch is None or launch.dtypes != dtypes:
        launch = gemm_plan(kind, x, table, position_ids, cu_seqlens, n_heads, n_kv_heads,
                           head_dim, interleaved, out_layout, eps, dtypes)
    if launch.launcher is kernel.FWD_TMA and not kernel.INTERPRET:
        kernel.ensure_allocator()      # (a thread without Triton's allocator: see planned)
    kernel.run(launch, pointers)


def cos_sin_rows(x: Tensor, table: Tensor, sin: Optional[Tensor], position_ids, cu_seqlens,
                 interleaved: bool, pairs_differ: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Tensor]:
    """Every token's fp32 cos and signed sine rows [NB * S, R] (NB = B with per-entry position
    ids, else 1), written by the two-pass route's pre-pass from the table and the positions, NaN
    where a position is outside the table: what the forward kernel reads instead of evaluating
    sin and cos (the same functions, so the same bits), and what dX's kernel reads again in the
    backward, written anew there from the saved table and positions. pairs_differ (a zeroed
    int32 [1]) is set to 1 where some pair's two members have different cos or sin."""
    nb, S, R = row_sets(x, table, position_ids)
    pre = prepass_plan(table, sin, position_ids, cu_seqlens, S, nb, R, interleaved, x.device,
                       pairs_differ is not None) if nb * S else None
    return _write_rows(pre, (nb * S, R), x.device, table, sin, position_ids, cu_seqlens,
                       pairs_differ)


def _write_rows(pre, shape: tuple, device, table: Tensor, sin: Optional[Tensor], position_ids,
                cu_seqlens, pairs_differ: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Fresh fp32 cos and sine rows of `shape`, written by the pre-pass plan `pre` (None:
    no token, nothing written)."""
    rows = (torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device))
    if pre is not None:
        start(COS_SIN_ROWS, pre, (table, sin, position_ids, cu_seqlens, None) + rows
              + (pairs_differ, None))
    return rows


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return t.contiguous() if t is not None else None


def _aligned(t: Tensor) -> Tensor:
    """t contiguous and starting on a 16-byte boundary (a TMA descriptor's base must: the
    forward's main loop loads x and the weight by TMA); a view that starts between two is
    copied."""
    t = t.contiguous()
    offset = t.storage_offset()
    return t.clone() if offset and (offset * t.element_size()) % 16 else t


# --- the operators --------------------------------------------------------------------------

def _forward(x: Tensor, weight: Tensor, bias: Optional[Tensor], table: Tensor,
             sin: Optional[Tensor], position_ids: Optional[Tensor],
             cu_seqlens: Optional[Tensor], q_norm_weight: Optional[Tensor],
             k_norm_weight: Optional[Tensor], n_heads: int, n_kv_heads: int,
             head_dim: int, eps: float, interleaved: bool, out_layout: str,
             save_for_norm: bool, backward: str
             ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward operator's implementation (qkv_rope_linear_op). The eager route runs the
    same steps without the dispatcher (_EagerQKVRoPE; under no_grad _project), with None where
    this returns empty rstd and norm_input."""
    keep = save_for_norm and q_norm_weight is not None
    fp = forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                      k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout,
                      keep)
    if keep:
        rstd, norm_input = fp.statistics(x)
    else:
        rstd = torch.empty((0,), dtype=torch.float32, device=x.device)
        norm_input = torch.empty((0,), dtype=x.dtype, device=x.device)
    q, k, v = _project(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                       k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved,
                       out_layout, rstd if keep else None, norm_input if keep else None, fp)
    return q, k, v, rstd, norm_input


def _project(x: Tensor, weight: Tensor, bias: Optional[Tensor], table: Tensor,
             sin: Optional[Tensor], position_ids: Optional[Tensor],
             cu_seqlens: Optional[Tensor], q_norm_weight: Optional[Tensor],
             k_norm_weight: Optional[Tensor], n_heads: int, n_kv_heads: int, head_dim: int,
             eps: float, interleaved: bool, out_layout: str, rstd: Optional[Tensor],
             norm_input: Optional[Tensor], fp: Optional[ForwardPlan] = None,
             keep_rows: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k and v fresh, written by the pre-pass and the forward kernel (rstd and norm_input:
    where the norm's statistics and input go, or None), as the call's ForwardPlan says (fp:
    the caller's, looked up for these arguments). keep_rows (a plain eager call's): where the
    positions are the token index, the pre-pass's rows are kept between calls (`_kept_rows`)."""
    if fp is None:
        fp = forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                          k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved,
                          out_layout, rstd is not None)
    device = x.device
    q = torch.empty(fp.q_shape, dtype=x.dtype, device=device)
    k = torch.empty(fp.kv_shape, dtype=x.dtype, device=device)
    v = torch.empty(fp.kv_shape, dtype=x.dtype, device=device)
    if fp.launch is not None:
        # a table's pairs may or may not repeat one angle (Angles' always do): the pre-pass
        # says, and the forward reads one cos and one sin tile where they do, else each
        # member's own (kernels/qkv_gemm.py)
        if keep_rows and position_ids is None and cu_seqlens is None:
            *rows, differ = _kept_rows(fp, table, sin, device)
            rows = tuple(rows)
        else:
            differ = torch.zeros((1,), dtype=torch.int32, device=device) if fp.differ else None
            rows = _write_rows(fp.prepass, fp.rows, device, table, sin, position_ids,
                               cu_seqlens, differ)
        _run("fwd", (_aligned(x), _aligned(weight), _contiguous(bias), q, k, v) + rows
             + (q_norm_weight, k_norm_weight, rstd, norm_input, differ), x, table,
             position_ids, cu_seqlens, n_heads, n_kv_heads, head_dim, interleaved, out_layout,
             eps, launch=fp.launch)
    return q, k, v


def _kept_rows(fp: ForwardPlan, table: Tensor, sin: Optional[Tensor], device) -> tuple:
    """(cos rows, sine rows, the pairs_differ flag or None) of a forward whose positions are the
    token index: they follow from the plan and the table alone, so eager.TABLE_ROWS keeps them
    (as the eager RoPE route keeps its two-pass rows: the same plan, the same table tensor
    unwritten since, the same stream; never from a table made under inference_mode nor while
    a CUDA graph is captured) and a later forward of the same plan and table, every layer's
    after the first, launches no pre-pass: the rows and flag the pre-pass wrote, read again."""
    tables = (table,) if sin is None else (table, sin)
    keeps = eager.TableRows.keeps(tables)
    key, kept = eager.TABLE_ROWS.get(fp, tables) if keeps else (None, None)
    if kept is not None:
        return kept
    differ = torch.zeros((1,), dtype=torch.int32, device=device) if fp.differ else None
    rows = _write_rows(fp.prepass, fp.rows, device, table, sin, None, None, differ) + (differ,)
    if keeps:
        eager.TABLE_ROWS.put(key, fp, tables, rows)
    return rows


qkv_rope_linear_op = define_op("ropelib::qkv_rope_linear")(_forward)


def _backward_impl(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, x: Tensor,
                   weight: Tensor, table: Tensor, sin: Optional[Tensor],
                   position_ids: Optional[Tensor], cu_seqlens: Optional[Tensor],
                   q_norm_weight: Optional[Tensor], k_norm_weight: Optional[Tensor],
                   rstd: Tensor, norm_input: Tensor, n_heads: int, n_kv_heads: int,
                   head_dim: int, interleaved: bool, out_layout: str, grad_x: bool,
                   grad_params: bool, has_bias: bool
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    B, S, K = sizes(x)
    M, NQK = B * S, n_heads + n_kv_heads
    norm = q_norm_weight is not None
    if norm and M and rstd.numel() == 0:
        raise RuntimeError("qkv_rope_linear_backward needs the norm's statistics: the forward "
                           "ran with save_for_norm=False")
    def empty(like: Tensor) -> Tensor:     # an output not computed (each its own tensor)
        return torch.empty((0,), dtype=like.dtype, device=like.device)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if grad_x else empty(x)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if grad_params \
        else empty(weight)
    db32 = torch.zeros((weight.shape[0],), dtype=torch.float32, device=x.device) \
        if grad_params and has_bias else None
    dnorm = torch.zeros((NQK, head_dim), dtype=torch.float32, device=x.device) \
        if grad_params and norm else None
    saved = (q_norm_weight, k_norm_weight, rstd if norm else None, norm_input if norm else None)
    tables = (table, sin, position_ids, cu_seqlens) + saved
    grads = tuple(g.contiguous() for g in (grad_q, grad_k, grad_v))
    if M and grad_x:
        # dX reads every token's cos and s' rows (written again here: 8 MiB at 8192 tokens and
        # a rotary dim of 128, not kept from the forward); dW evaluates sin and cos itself
        rows = cos_sin_rows(x, table, sin, position_ids, cu_seqlens, interleaved)
        _run("dx", grads + (weight.contiguous(), dx) + rows + saved, x, table, position_ids,
             cu_seqlens, n_heads, n_kv_heads, head_dim, interleaved, out_layout)
    if grad_params:
        if M:
            _run("dw", grads + (x.contiguous(), dw, db32, dnorm) + tables, x, table,
                 position_ids, cu_seqlens, n_heads, n_kv_heads, head_dim, interleaved,
                 out_layout)
        else:
            dw.zero_()
    db = db32.to(weight.dtype) if db32 is not None else empty(weight)
    if dnorm is not None:       # the q heads' rows, then the k heads': in a fixed order
        dwq = dnorm[:n_heads].sum(0).to(q_norm_weight.dtype)
        dwk = dnorm[n_heads:].sum(0).to(k_norm_weight.dtype)
    else:
        dwq, dwk = empty(x), empty(x)
    return dx, dw, db, dwq, dwk


qkv_rope_linear_backward_op = define_op("ropelib::qkv_rope_linear_backward")(_backward_impl)


def _setup(ctx, inputs, output):
    (x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight, k_norm_weight,
     n_heads, n_kv_heads, head_dim, _eps, interleaved, out_layout, _save, backward) = inputs
    _, _, _, rstd, norm_input = output
    ctx.save_for_backward(x, weight, table, sin, position_ids, cu_seqlens, q_norm_weight,
                          k_norm_weight, rstd, norm_input)
    ctx.options = (n_heads, n_kv_heads, head_dim, interleaved, out_layout)
    ctx.has_bias = bias is not None
    ctx.backward, ctx.eps = backward, _eps
    ctx.outputs = [(o.shape, o.dtype, o.device) for o in output[:3]]
    if rstd is not None:        # (the eager route's forward gives None where none are kept)
        ctx.mark_non_differentiable(rstd, norm_input)


def _token_major(grads: tuple, out_layout: str) -> tuple:
    """The gradients of q, k and v as [B, S, H, D] (packed: [T, H, D]): bhsd's as transposed
    views (the RoPE kernels read strides)."""
    return tuple(g.transpose(1, 2) for g in grads) if out_layout == "bhsd" else tuple(grads)


def _written_dy(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, x: Tensor, table: Tensor,
                sin: Optional[Tensor], position_ids: Optional[Tensor],
                cu_seqlens: Optional[Tensor], interleaved: bool) -> Tensor:
    """The projection's gradient dY [M, N] (the gradients' dtype) from the gradients of q, k and
    v as [B, S, H, D] (packed x: [T, H, D]; _token_major), q's columns, then k's, then v's, in
    the weight's row order: ropelib's RoPE rotates q's and k's back in one launch and stores
    them straight into their columns of dY (column slices of one token-major buffer: the
    finished kernel's OUT_ROW), and v's are copied into theirs. q's and k's gradients are so
    read once and written once, where rotating them into tensors of their own and setting the
    three side by side (torch.cat) moved them twice. position_ids as qkv_rope_linear keeps
    them: [B or 1, S] (packed: [1, T]), what ropelib's RoPE operator reads. x gives the token
    count only."""
    dy, dq, dk = dy_with_v(dy_layout(grad_q, grad_k, grad_v, x.numel() // x.shape[-1]),
                           grad_q, grad_v)
    rotate_into(grad_q, dq, grad_k, dk, table, sin, position_ids, cu_seqlens,
                "thd" if x.dim() == 2 else "bshd", interleaved, backward=True)
    return dy


written_dy = define_op("ropelib::qkv_rotated_dy")(_written_dy)


def _written_dy_normed(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, x: Tensor,
                       norm_input: Tensor, q_norm_weight: Tensor, k_norm_weight: Tensor,
                       table: Tensor, sin: Optional[Tensor], position_ids: Optional[Tensor],
                       cu_seqlens: Optional[Tensor], n_heads: int, n_kv_heads: int,
                       head_dim: int, eps: float, interleaved: bool
                       ) -> Tuple[Tensor, Tensor, Tensor]:
    """With QK-norm: (dY [M, N], the norm weights' gradients). qk_norm_rope's backward undoes
    the rotation and the norm of q's and k's gradients (laid out as for written_dy) in one
    launch, from the norm's input the forward kept (the projection's q and k columns), and
    stores them straight into their columns of dY (its GX_ROW); v's are copied into theirs.
    Packed x comes with position ids [1, T] or with cu_seqlens (the kernel finds each token's
    index in its sequence)."""
    lead = grad_q.shape[:-2]                     # [B, S] or [T]
    q_in = norm_input[:, :n_heads * head_dim].view(*lead, n_heads, head_dim)
    k_in = norm_input[:, n_heads * head_dim:].view(*lead, n_kv_heads, head_dim)
    packed = x.dim() == 2
    if packed and position_ids is not None:
        position_ids = position_ids[0]
    dy, dq, dk = dy_with_v(dy_layout(grad_q, grad_k, grad_v, x.numel() // x.shape[-1]),
                           grad_q, grad_v)
    _, _, dwq, dwk = ops_qk_norm.undo_norm_rope(
        grad_q, grad_k, q_in, k_in, q_norm_weight, k_norm_weight, table, sin, position_ids,
        cu_seqlens, "thd" if packed else "bshd", interleaved, eps, 0.0, into=(dq, dk))
    return dy, dwq, dwk


written_dy_normed = define_op("ropelib::qkv_rotated_dy_normed")(_written_dy_normed)


def _backward(ctx, grad_q, grad_k, grad_v, _grad_rstd, _grad_norm_input):
    (x, weight, table, sin, position_ids, cu_seqlens, q_norm_weight, k_norm_weight, rstd,
     norm_input) = ctx.saved_tensors
    # an output that took no part in the loss has no gradient: its gradient is zero
    grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
             for g, (shape, dtype, device) in zip((grad_q, grad_k, grad_v), ctx.outputs)]
    need = ctx.needs_input_grad
    # a plain eager backward calls the operators' implementations without the dispatcher; one
    # that builds a graph (create_graph) calls the operators, which have no autograd formula:
    # a second backward through them raises, on either route
    plain = eager.active() and not torch.is_grad_enabled()
    if ctx.backward == "dy":
        n_heads, n_kv_heads, head_dim, interleaved, out_layout = ctx.options
        dwq = dwk = None
        grads = _token_major(grads, out_layout)
        # the eager route's forward left its ForwardPlan: the dY step kept there for these
        # gradients' strides (else planned through eager.SIGNATURES by the call's signature)
        fp = getattr(ctx, "plan", None) if plain else None
        step, key = fp.dy_step(grads, sin, position_ids, cu_seqlens, q_norm_weight,
                               k_norm_weight) if fp is not None else (None, None)
        if key is not None:
            if step is None:
                step = fp.keep_dy_step(key, DyStep(fp, grads, x, norm_input, q_norm_weight,
                                                   k_norm_weight, table, sin, position_ids,
                                                   cu_seqlens))
            dy, dwq, dwk = step(*grads, norm_input, q_norm_weight, k_norm_weight, table, sin,
                                position_ids, cu_seqlens)
        elif q_norm_weight is None:
            rotated_dy = _written_dy if plain else written_dy
            dy = rotated_dy(*grads, x, table, sin, position_ids, cu_seqlens, interleaved)
        else:
            rotated_dy_normed = _written_dy_normed if plain else written_dy_normed
            dy, dwq, dwk = rotated_dy_normed(*grads, x, norm_input, q_norm_weight,
                                             k_norm_weight, table, sin, position_ids,
                                             cu_seqlens, n_heads, n_kv_heads, head_dim,
                                             ctx.eps, interleaved)
        dx = (dy @ weight).view(x.shape) if need[0] else None
        dw = dy.t() @ x.reshape(-1, x.shape[-1]) if need[1] else None
        db = dy.sum(0) if need[2] else None
        return (dx, dw, db, None, None, None, None, dwq if need[7] else None,
                dwk if need[8] else None) + (None,) * 8
    grad_x = need[0]
    grad_params = need[1] or need[2] or need[7] or need[8]
    if rstd is None:        # (an eager forward that kept no norm statistics: the operator's
        rstd = torch.empty((0,), dtype=torch.float32, device=x.device)     # empty ones)
        norm_input = torch.empty((0,), dtype=x.dtype, device=x.device)
    dx, dw, db, dwq, dwk = (_backward_impl if plain else qkv_rope_linear_backward_op)(
        *grads, x, weight, table, sin, position_ids, cu_seqlens, q_norm_weight, k_norm_weight,
        rstd, norm_input, *ctx.options, grad_x, grad_params, ctx.has_bias)
    return (dx if need[0] else None, dw if need[1] else None, db if need[2] else None,
            None, None, None, None, dwq if need[7] else None, dwk if need[8] else None,
            None, None, None, None, None, None, None, None)


qkv_rope_linear_op.register_autograd(_backward, setup_context=_setup)


class _EagerQKVRoPE(torch.autograd.Function):
    """The forward operator and its autograd formula without the dispatcher: what a plain eager
    call runs (eager.active); under torch.compile, a tracer, a transform or a dispatch mode the
    operator runs. The same steps either way (_forward's, _setup, _backward), but for the
    norm's statistics where none are kept (None, where the operator returns empty tensors) and
    the ForwardPlan, which the context keeps for the backward's dY step (ForwardPlan.dy_step)."""

    @staticmethod
    def forward(ctx, *args):
        # the operator's inputs, then the call's ForwardPlan (None: looked up here)
        inputs, fp = args[:-1], args[-1]
        keep = inputs[15] and inputs[7] is not None     # save_for_norm, with norm weights
        if fp is None:
            fp = forward_plan(*inputs[:15], keep)
        rstd, norm_input = fp.statistics(inputs[0]) if keep else (None, None)
        output = _project(*inputs[:15], rstd, norm_input, fp, True) + (rstd, norm_input)
        _setup(ctx, inputs, output)
        ctx.plan = fp
        return output

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads) + (None,)


_eager_qkv_rope = eager.direct_apply(_EagerQKVRoPE)


# --- the public function --------------------------------------------------------------------

def qkv_rope_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, n_heads: int,
                    n_kv_heads: int, head_dim: int, freqs: Optional[Tensor] = None,
                    angles: Optional[Angles] = None, position_ids: Optional[Tensor] = None,
                    cu_seqlens: Optional[Tensor] = None,
                    q_norm_weight: Optional[Tensor] = None,
                    k_norm_weight: Optional[Tensor] = None, eps: float = 1e-6,
                    weight_offset: float = 0.0, rotary_dim: Optional[int] = None,
                    interleaved: bool = False, out_layout: str = "bshd",
                    backward: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The QKV projection with (QK-RMSNorm and) RoPE in its epilogue: one Triton GEMM.

    Equals `F.linear(x, weight, bias)` split into q, k, v heads, then (with norm weights) the
    per-head RMS norm of q and k, then `ropelib.apply_rope` on q and k, up to the GEMM's own
    rounding (see Exactness), forward and backward.

    Args:
        x: [B, S, hidden], or packed sequences [T, hidden] (with cu_seqlens or position_ids);
            fp16, bf16 (fp32 accumulation) or fp32 (multiplied in fp32, not TF32).
        weight: [(n_heads + 2 n_kv_heads) * head_dim, hidden] in x's dtype: a fused nn.Linear's
            weight (q's rows, then k's, then v's). bias: None or [that many], x's dtype.
        n_heads, n_kv_heads, head_dim: the heads of q and of k and v (GQA when they differ),
            head_dim <= 256.
        freqs: angles [P, 1, 1, R] or [P, R], float32 (ropelib.rope_freqs); or instead
        angles: ropelib.rope_angles(...): every angle computed in the kernel from the position,
            exactly reduced, no table to load (preferred here: the epilogue reads nothing).
        position_ids: [S] or [B or 1, S] integer positions (packed x: [T]); by default token s
            of each sequence is at position s.
        cu_seqlens: [N + 1] offsets of N packed sequences in x [T, hidden] (token t of sequence
            i is at position t - cu_seqlens[i]).
        q_norm_weight, k_norm_weight: [head_dim] QK-norm weights (any float dtype), both or
            neither: q and k heads are RMS-normed (statistics in fp32) and scaled by
            w + weight_offset (0.0 Qwen3, 1.0 Gemma 3) before the rotation. eps: the norm's.
        rotary_dim: R, checked against the table's (partial rotary: features R..head_dim-1 pass
            through unrotated); by default the table's.
        interleaved: pair features (2j, 2j+1) instead of (j, j + R/2).
        out_layout: "bshd" ([B, S, H, D]) or "bhsd" ([B, H, S, D], what
            scaled_dot_product_attention takes); packed x gives [T, H, D].
        backward: how the gradients are made. "dy": dY is written once (ropelib's RoPE
            rotates q's and k's gradients back; with QK-norm, ropelib.qk_norm_rope's backward
            undoes the norm too, from the norm's input the forward keeps) and cuBLAS runs
            dX = dY W and dW = dY^T x. "prologue": ropelib's dX and dW GEMMs undo the rotation
            (and the norm) as they load the gradients of q, k and v, and dY is never written
            (it is re-formed in every column block). None (the default): "dy". On an H200 at
            8192 tokens of Llama-3-8B's projection (bf16, table-free angles, medians of 7
            rounds), forward+backward 1.86 ms with "dy", 5.09 with "prologue" and 1.95 for
            cuBLAS then ropelib's RoPE; with QK-norm 2.21, 8.17 and 2.01
            (benchmarks/qkv_dy_probe.py). Forward and v are the same either way.

    Returns:
        (q, k, v), fresh contiguous tensors in out_layout and x's dtype, q and k rotated, v as
        projected. Differentiable in x, weight, bias and the norm weights (not twice).

    Exactness: the unfused pipeline rounds the projection to x's dtype before the norm and the
    rotation; here they run on the fp32 accumulator and round once. Take a pair (y_a, y_b)
    entering the rotation, rho = sqrt(y_a^2 + y_b^2) (the rotated pair has the same norm), and
    u the unit roundoff of x's dtype (2^-8 bf16, 2^-11 fp16, 2^-24 fp32). Each rounding of the
    rotation's inputs by a relative u moves its outputs by at most u (|y_a||c| + |y_b||s|)
    <= u rho (Cauchy-Schwarz, c^2 + s^2 = 1), and the two final roundings add half an ulp each:

        |fused - unfused| <= k u rho + ulp(fused)/2 + ulp(unfused)/2

    per rotated element, k the roundings the unfused pipeline makes before its last: 1 for
    F.linear then apply_rope; 2 for F.linear then ropelib.qk_norm_rope (rounding y also moves
    the norm's r by a relative u); 3 for a norm that rounds its output, then apply_rope. As
    u rho < ulp(rho), that is within k + 1 ulps of rho: 2 bf16 ulps without the norm, 3 with
    it. Pass-through features and v are rounded once by both: equal for equal accumulators. The
    two GEMMs' accumulators themselves differ by fp32 summation order (at most
    2 K 2^-24 sum_k |x_k w_k| apart), which adds to the bound.
    tests/test_qkv_rope_linear.py asserts it element by element.

    A position outside the table (with freqs) gives NaN in the q and k rows it touches, forward
    and backward; position ids in CPU memory are checked (ropelib.set_index_checks).
    """
    plain = eager.active()
    sig = call_signature(x, weight, bias, freqs, angles, position_ids, cu_seqlens,
                         q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim, eps,
                         weight_offset, rotary_dim, interleaved, out_layout, backward) \
        if plain else None
    kept = SIGNATURES.get(sig) if sig is not None else None
    if kept is not None:    # (a PlannedCall: checked in full before; the position values now)
        table, sin = table_view(freqs, angles)
        position_ids, cu_seqlens = checked_position_values(position_ids, cu_seqlens, kept.S,
                                                           kept.B, kept.P)
        q, k, v, _ = _checked_run(x, weight, bias, table, sin, position_ids, cu_seqlens,
                                  q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim,
                                  eps, weight_offset, interleaved, out_layout, kept.norm,
                                  kept.grad, kept.backward, True, kept.fp)
        return q, k, v
    n_heads, n_kv_heads, head_dim = checked_heads(n_heads, n_kv_heads, head_dim)
    if not plain:       # (a plain eager call runs under no torch.func transform)
        V.check_no_grad_transform("qkv_rope_linear")
    check_projection(x, weight, bias, n_heads, n_kv_heads, head_dim)
    V.check_bool(interleaved, "interleaved")
    check_out_layout(out_layout)
    eps = V.check_real(eps, "eps", positive=True)
    weight_offset = V.check_real(weight_offset, "weight_offset")
    table, sin, _ = checked_table(freqs, angles, rotary_dim, head_dim, x)
    position_ids, cu_seqlens = checked_positions(x, position_ids, cu_seqlens,
                                                 table_positions(table), out_layout)
    norm = check_norm_weights(q_norm_weight, k_norm_weight, head_dim, x)
    backward = resolved_backward(backward)
    grad = needs_grad(x, weight, *(t for t in (bias, q_norm_weight, k_norm_weight)
                                   if t is not None))
    q, k, v, fp = _checked_run(x, weight, bias, table, sin, position_ids, cu_seqlens,
                               q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim, eps,
                               weight_offset, interleaved, out_layout, norm, grad, backward,
                               plain, None)
    if sig is not None:     # checked in full: later calls of this signature skip the checks
        B, S, _ = sizes(x)
        SIGNATURES.put(sig, PlannedCall(S, B, table_positions(table), norm, grad, backward, fp))
    return q, k, v


def _checked_run(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, weight_offset, interleaved,
                 out_layout, norm: bool, grad: bool, backward: str, plain: bool,
                 fp: Optional[ForwardPlan]) -> tuple:
    """A checked call, from its tables and index tensors as the checks leave them: Gemma's
    weight offset added, what backward saves made saveable, x, the weight and bias contiguous;
    then the operator (traced), the eager autograd.Function (plain, with gradients) or the
    projection alone. (q, k, v, the ForwardPlan of a plain call: fp, or the one looked up)."""
    if norm and weight_offset != 0.0:   # Gemma's scale 1 + w, in fp32 (autograd sees the sum)
        q_norm_weight = q_norm_weight.float() + weight_offset
        k_norm_weight = k_norm_weight.float() + weight_offset
    if grad:
        table, sin, position_ids, cu_seqlens = (saveable(t) for t in (table, sin, position_ids,
                                                                      cu_seqlens))
    x, weight = x.contiguous(), weight.contiguous()
    if bias is not None:
        bias = bias.contiguous()
    if not plain:
        q, k, v, _, _ = qkv_rope_linear_op(x, weight, bias, table, sin, position_ids, cu_seqlens,
                                           q_norm_weight, k_norm_weight, n_heads, n_kv_heads,
                                           head_dim, eps, interleaved, out_layout, norm and grad,
                                           backward)
        return q, k, v, None
    if fp is None:
        fp = forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                          k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved,
                          out_layout, norm and grad)
    if grad:
        q, k, v, _, _ = _eager_qkv_rope(x, weight, bias, table, sin, position_ids, cu_seqlens,
                                        q_norm_weight, k_norm_weight, n_heads, n_kv_heads,
                                        head_dim, eps, interleaved, out_layout, norm, backward,
                                        fp)
    else:               # (no gradient: the norm's statistics are not kept)
        q, k, v = _project(x, weight, bias, table, sin, position_ids, cu_seqlens,
                           q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim, eps,
                           interleaved, out_layout, None, None, fp, True)   # (keep_rows)
    return q, k, v, fp
