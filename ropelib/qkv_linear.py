"""RoPE fused into the QKV projection: `qkv_rope_linear` and the module `QKVRoPE`.

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

One path: the public function checks its arguments and calls an operator, registered like
ropelib's others (ropelib.ops: a triton_op on GPUs, a custom_op in the interpreter, each with a
fake implementation), which launches the kernel. A plain eager call (ropelib.eager.active: no
compiler, tracer, transform or dispatch mode at work) runs the same implementation and autograd
formula without the dispatcher (_EagerQKVRoPE), as ropelib's other eager calls do:

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

Plans kept. A plain eager call plans each launch once and keeps it in ropelib.eager.SIGNATURES,
the one cache of every plan ropelib keeps (eager.SIGNATURES.clear() drops them all), each entry
under a key of its own kind:
  ("qkv_rope_linear", ...)   a call, checked in full once (`_PlannedCall`: what the checks
                             decided and the ForwardPlan): every tensor's shape, strides,
                             dtype, device and requires_grad, which table (Angles: rot_dim),
                             the options and their types, grad mode; a later call checks only
                             the position values (`_positions`);
  ("qkv_forward", ...)       the forward's whole plan (`ForwardPlan`: the output and cos/sin
                             rows' shapes, the pre-pass plan and the GEMM's Launch below),
                             looked up once a call: x's shape, the dtypes of x, the weight,
                             bias, table, sin, position ids, cu_seqlens and norm weights,
                             whether the norm's statistics are written, the device, the
                             table's shape and strides, the position ids' and cu_seqlens'
                             shapes, the heads, D, eps, interleaved, out_layout. The eager
                             route keeps it on the autograd context, and the backward keeps
                             its dY step in it (`DyStep`: dY's column views and the entry
                             below, "rotate_into" or "undo_norm_rope", the call would have
                             kept), by the gradients' strides and dtype and the strides the
                             key leaves out: no signature is built (a plan from before a
                             clear(), eager.SIGNATURES.epoch, serves no more);
  ("qkv_gemm", ...)          the forward's, dX's and dW's GEMM (`planned`): the kind, B, S, K,
                             the heads, D, R, the table's positions P, whether position ids
                             have a row per batch entry, cu_seqlens' length, out_layout,
                             interleaved, eps, the device, every pointer's dtype, rotate,
                             shared_angle;
  ("qkv_cos_sin_rows", ...)  the pre-pass of the cos/sin rows (`_prepass`): S, the row sets,
                             R, the table's shape and strides, the position ids' and cu_seqlens'
                             lengths, the dtypes of the table, sin, ids and cu_seqlens,
                             interleaved, the device, whether pairs_differ is asked;
  ("rotate_into", ...)       the backward's dY rotation (eager.rotate_into) where no
                             ForwardPlan came with the context (the operator's forward, or
                             one from before eager.SIGNATURES.clear()): an eager signature,
                             every tensor's shape, strides, dtype, device and requires_grad,
                             the layout, interleaved, the direction;
  ("undo_norm_rope", ...)    likewise, with QK-norm, the backward's dY norm and rotation
                             (qk_norm.undo_norm_rope into dY's columns: its Route and what
                             follows from strides, whether the kernel stores into dY's
                             columns, kernels/qk_norm_rope.BackwardInto): an eager signature
                             likewise, with eps and weight_offset.
Never a tensor's values, and never the planners' own settings: code that changes a tile table
(kernels/qkv_gemm.GPU_TILES, ...) or patches a planner, as a probe or a test does, calls
eager.SIGNATURES.clear() for the next call to plan again.
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
import math
import numbers
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import eager, qk_norm as ops_qk_norm, validation as V
from .conventions import QKV_LINEAR_DTYPES, QKV_LINEAR_LAYOUTS
from .eager import SIGNATURES, rotate_into
from .api import check_no_table_grad, needs_grad, saveable
from .frequencies import EXACT_POSITIONS, Angles
from .kernels import qkv_gemm as kernel
from .kernels.launch import COS_SIN_ROWS, Positions, Table, plan_cos_sin_rows
from .kernels.planning import Launch, pointer_dtypes, start
from .ops import define_op

__all__ = ["qkv_rope_linear", "QKVRoPE"]

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


def _sizes(x: Tensor) -> Tuple[int, int, int]:
    """(B, S, K) of x [B, S, K], or (1, T, K) of packed x [T, K]."""
    shape = x.shape
    if len(shape) == 3:
        return shape[0], shape[1], shape[2]
    return 1, shape[0], shape[1]


def _rows(table: Tensor) -> int:
    """Positions a table serves (Angles' turns: every position up to 2^31 - 2)."""
    return EXACT_POSITIONS if table.dtype == torch.int64 else table.shape[0]


def _run(kind: str, pointers: tuple, x: Tensor, table: Tensor, position_ids, cu_seqlens,
         n_heads, n_kv_heads, head_dim, interleaved, out_layout, eps=1e-6,
         launch: Optional[Launch] = None) -> None:
    """Plan one of the three kernels for these pointers (in its *_POINTERS order) and start it
    (the plan kept for the next call with the same sizes, dtypes and options: `planned`).
    launch: the caller's kept plan (the forward's ForwardPlan), taken where it was planned for
    pointers of these dtypes; a TMA forward then sets Triton's allocator as `planned` does."""
    dtypes = pointer_dtypes(pointers)
    if launch is None or launch.dtypes != dtypes:
        launch = _gemm_plan(kind, x, table, position_ids, cu_seqlens, n_heads, n_kv_heads,
                            head_dim, interleaved, out_layout, eps, dtypes)
    if launch.launcher is kernel.FWD_TMA and not kernel.INTERPRET:
        kernel.ensure_allocator()      # (a thread without Triton's allocator: see planned)
    kernel.run(launch, pointers)


def _gemm_plan(kind: str, x: Tensor, table: Tensor, position_ids, cu_seqlens, n_heads,
               n_kv_heads, head_dim, interleaved, out_layout, eps, dtypes: tuple) -> Launch:
    """`planned` for one of the three kernels, its sizes read from x and the table."""
    B, S, K = _sizes(x)
    turns = table.dtype == torch.int64          # Angles' turns
    R = table.shape[0] if turns else table.shape[1]
    return planned(kind, S=S, B=B, K=K, HQ=n_heads, HK=n_kv_heads, D=head_dim, R=R,
                   P=EXACT_POSITIONS if turns else table.shape[0], ids=position_ids,
                   cu_seqlens=cu_seqlens, layout=out_layout, interleaved=interleaved, eps=eps,
                   device=x.device, dtypes=dtypes, shared_angle=turns)


def planned(kind: str, *, S, B, K, HQ, HK, D, R, P, ids, cu_seqlens, layout: str,
            interleaved: bool, eps: float, device: torch.device, dtypes: tuple,
            rotate: bool = True, shared_angle: bool = False) -> Launch:
    """qkv_gemm.plan(...) with the same arguments, kept in eager.SIGNATURES for the next call
    with the same sizes, dtypes and options (concrete sizes only: a symbolic one, under
    torch.compile, is planned anew). ids and cu_seqlens count by what plan reads of them:
    whether ids has a row per entry, and cu_seqlens' length. The Launch is shared: leave it
    unchanged. A kept TMA forward needs Triton's allocator set in the thread that starts it,
    as plan sets it: `_run` sees to that at every start (ensure_allocator)."""
    rows_per_entry = 0 if ids is None else ids.shape[0]
    n_seq = -1 if cu_seqlens is None else cu_seqlens.shape[0]
    if any(type(n) is not int for n in (S, B, K, P, R, rows_per_entry, n_seq)) \
            or type(eps) is not float:
        return kernel.plan(kind, S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=R, P=P, ids=ids,
                           cu_seqlens=cu_seqlens, layout=layout, interleaved=interleaved,
                           eps=eps, device=device, dtypes=dtypes, rotate=rotate,
                           shared_angle=shared_angle)
    key = ("qkv_gemm", kind, S, B, K, HQ, HK, D, R, P, rows_per_entry > 1, n_seq, layout,
           interleaved, eps, device, dtypes, rotate, shared_angle)
    launch = SIGNATURES.get(key)
    if launch is None:
        launch = SIGNATURES.put(key, kernel.plan(
            kind, S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=R, P=P, ids=ids, cu_seqlens=cu_seqlens,
            layout=layout, interleaved=interleaved, eps=eps, device=device, dtypes=dtypes,
            rotate=rotate, shared_angle=shared_angle))
    return launch


def _prepass(table: Tensor, sin: Optional[Tensor], position_ids, cu_seqlens, S, nb: int, R,
             interleaved: bool, device, pairs_differ: bool):
    """launch.plan_cos_sin_rows for cos_sin_rows (forward pass, any_length), kept in
    eager.SIGNATURES by what it reads of its arguments: dtypes, shapes and strides of the table,
    of the position ids and of cu_seqlens, never their values."""
    def plan():
        return plan_cos_sin_rows(Table(table, sin), Positions(position_ids, cu_seqlens), S, nb,
                                 R=R, interleaved=interleaved, backward=False, device=device,
                                 any_length=True, pairs_differ=pairs_differ)
    sizes = (S, nb, R, *table.shape, *table.stride(),
             0 if position_ids is None else position_ids.shape[0],
             0 if cu_seqlens is None else cu_seqlens.shape[0])
    if any(type(n) is not int for n in sizes):
        return plan()        # (symbolic sizes: torch.compile's tracing plans every time)
    key = ("qkv_cos_sin_rows", sizes, table.dtype, sin is None or sin.dtype,
           position_ids is None or position_ids.dtype, cu_seqlens is None or cu_seqlens.dtype,
           interleaved, device, pairs_differ)
    pre = SIGNATURES.get(key)
    if pre is None:
        pre = SIGNATURES.put(key, plan())
    return pre


def cos_sin_rows(x: Tensor, table: Tensor, sin: Optional[Tensor], position_ids, cu_seqlens,
                 interleaved: bool, pairs_differ: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Tensor]:
    """Every token's fp32 cos and signed sine rows [NB * S, R] (NB = B with per-entry position
    ids, else 1), written by the two-pass route's pre-pass from the table and the positions, NaN
    where a position is outside the table: what the forward kernel reads instead of evaluating
    sin and cos (the same functions, so the same bits), and what dX's kernel reads again in the
    backward, written anew there from the saved table and positions. pairs_differ (a zeroed
    int32 [1]) is set to 1 where some pair's two members have different cos or sin."""
    nb, S, R = _row_sets(x, table, position_ids)
    pre = _prepass(table, sin, position_ids, cu_seqlens, S, nb, R, interleaved, x.device,
                   pairs_differ is not None) if nb * S else None
    return _write_rows(pre, (nb * S, R), x.device, table, sin, position_ids, cu_seqlens,
                       pairs_differ)


def _row_sets(x: Tensor, table: Tensor, position_ids) -> Tuple[int, int, int]:
    """(NB, S, R): the cos/sin rows' sets (B where position ids differ between batch entries,
    else 1), tokens a set and rotary width."""
    B, S, _ = _sizes(x)
    R = table.shape[0] if table.dtype == torch.int64 else table.shape[1]
    return (B if kernel.per_entry(position_ids) else 1), S, R


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
    fp = _forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
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
             norm_input: Optional[Tensor], fp: Optional["ForwardPlan"] = None,
             keep_rows: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k and v fresh, written by the pre-pass and the forward kernel (rstd and norm_input:
    where the norm's statistics and input go, or None), as the call's ForwardPlan says (fp:
    the caller's, looked up for these arguments). keep_rows (a plain eager call's): where the
    positions are the token index, the pre-pass's rows are kept between calls (`_kept_rows`)."""
    if fp is None:
        fp = _forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
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


def _kept_rows(fp: "ForwardPlan", table: Tensor, sin: Optional[Tensor], device) -> tuple:
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


def _dtype(t: Optional[Tensor]):
    return None if t is None else t.dtype


def _forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                  k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout,
                  stats: bool) -> "ForwardPlan":
    """The call's ForwardPlan: kept in eager.SIGNATURES under `_forward_key`, made where none
    is (and kept where the key is one)."""
    key = _forward_key(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                       k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved,
                       out_layout, stats)
    fp = SIGNATURES.get(key) if key is not None else None
    if fp is None:
        fp = ForwardPlan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                         k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved,
                         out_layout, stats)
        if key is not None:
            SIGNATURES.put(key, fp)
    return fp


def _forward_key(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout,
                 stats: bool) -> Optional[tuple]:
    """The forward's key in eager.SIGNATURES ("qkv_forward"): what its ForwardPlan follows
    from (shapes, dtypes, the table's strides, the device, the options and whether the norm's
    statistics are written: rstd fp32 and norm_input in x's dtype), or None where a size is not
    a plain int (torch.compile's tracing: planned every call)."""
    ids = () if position_ids is None else position_ids.shape
    seqs = () if cu_seqlens is None else cu_seqlens.shape
    if type(eps) is not float or any(type(n) is not int for n in (*x.shape, *table.shape,
                                                                   *ids, *seqs)):
        return None
    return ("qkv_forward", x.shape, x.dtype, x.device, weight.dtype, _dtype(bias),
            table.shape, table.stride(), table.dtype, _dtype(sin), ids, _dtype(position_ids),
            seqs, _dtype(cu_seqlens), _dtype(q_norm_weight), _dtype(k_norm_weight), stats,
            n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout)


class ForwardPlan:
    """Everything of one forward that follows from its key (`_forward_key`): the shapes of q
    and of k and v, of the norm's statistics, the cos/sin rows' shape, whether the pre-pass
    sets a pairs_differ flag, the pre-pass plan (`_prepass`) and the GEMM's Launch (`planned`;
    None where there is no token, nothing launched). The eager route keeps it on the autograd
    context, and the backward keeps its dY steps here (`dy_step`), by what the backward adds
    to the key: the gradients' strides."""
    __slots__ = ("q_shape", "kv_shape", "stats", "rows", "differ", "prepass", "launch",
                 "options", "epoch", "dy", "__weakref__")

    def __init__(self, x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout,
                 stats):
        B, S, _ = _sizes(x)
        NQK = n_heads + n_kv_heads
        self.stats = ((B * S, NQK), (B * S, NQK * head_dim))        # rstd, norm_input
        self.options = (n_heads, n_kv_heads, head_dim, eps, interleaved, x.dim() == 2)
        self.epoch, self.dy = SIGNATURES.epoch, {}
        if x.dim() == 2:
            shapes = [(S, h, head_dim) for h in (n_heads, n_kv_heads)]     # packed: [T, H, D]
        elif out_layout == "bshd":
            shapes = [(B, S, h, head_dim) for h in (n_heads, n_kv_heads)]
        else:
            shapes = [(B, h, S, head_dim) for h in (n_heads, n_kv_heads)]
        self.q_shape, self.kv_shape = shapes
        nb, _, R = _row_sets(x, table, position_ids)
        self.rows, self.differ = (nb * S, R), table.dtype != torch.int64   # (not Angles' turns)
        self.prepass = self.launch = None
        if B * S == 0:
            return
        device = x.device
        self.prepass = _prepass(table, sin, position_ids, cu_seqlens, S, nb, R, interleaved,
                                device, self.differ)
        f32 = torch.float32
        dtypes = (x.dtype, weight.dtype, _dtype(bias), x.dtype, x.dtype, x.dtype, f32, f32,
                  _dtype(q_norm_weight), _dtype(k_norm_weight), f32 if stats else None,
                  x.dtype if stats else None, torch.int32 if self.differ else None)
        self.launch = _gemm_plan("fwd", x, table, position_ids, cu_seqlens, n_heads,
                                 n_kv_heads, head_dim, interleaved, out_layout, eps, dtypes)

    def statistics(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Fresh rstd [M, HQ + HK] (fp32) and norm_input [M, (HQ + HK) D] (x's dtype)."""
        return (torch.empty(self.stats[0], dtype=torch.float32, device=x.device),
                torch.empty(self.stats[1], dtype=x.dtype, device=x.device))

    def dy_step(self, grads: tuple, sin, position_ids, cu_seqlens, q_norm_weight,
                k_norm_weight) -> Tuple[Optional["DyStep"], tuple]:
        """(the kept DyStep or None, its key) for the gradients of q, k and v (token-major:
        _token_major) and the tensors the forward saved: the strides of the gradients and
        their dtype, and what the forward's key leaves out of the saved tensors the dY step
        reads (sin's shape and strides, the position ids', cu_seqlens' and norm weights'
        strides). A plan of an earlier SIGNATURES epoch serves no more (None: the caller
        plans through eager.SIGNATURES, as an uncached backward does)."""
        if self.epoch != SIGNATURES.epoch:
            return None, None
        gq, gk, gv = grads
        key = (gq.stride(), gk.stride(), gv.stride(), gq.dtype,
               None if sin is None else (sin.shape, sin.stride()),
               None if position_ids is None else position_ids.stride(),
               None if cu_seqlens is None else cu_seqlens.stride(),
               None if q_norm_weight is None else (q_norm_weight.stride(),
                                                   k_norm_weight.stride()))
        return self.dy.get(key), key

    def keep_dy_step(self, key: tuple, step: "DyStep") -> "DyStep":
        if len(self.dy) >= 16:          # (gradients of many strides: bounded)
            self.dy.clear()
        self.dy[key] = step
        return step


class DyStep:
    """The backward's dY step ("dy", plain eager) for one ForwardPlan and gradients' strides,
    planned at its first call: what _written_dy (or, with QK-norm, _written_dy_normed) does,
    with what follows from shapes and strides kept. dY's shape and the as_strided views of its
    q, k and v columns (_dy_with_v's), and the entry eager.rotate_into (qk_norm.undo_norm_rope)
    would keep under the call's signature: the same plans, so the same bits, without building
    that signature every call. With QK-norm, the norm's input of q and k as as_strided views of
    norm_input (the forward's fresh [M, (HQ + HK) D], as _written_dy_normed's views)."""
    __slots__ = ("dy_shape", "v_cols", "q_cols", "k_cols", "layout", "norm", "q_in", "k_in",
                 "packed", "entry")

    def __init__(self, fp: ForwardPlan, grads: tuple, x, norm_input, q_norm_weight,
                 k_norm_weight, table, sin, position_ids, cu_seqlens):
        n_heads, n_kv_heads, head_dim, eps, interleaved, self.packed = fp.options
        gq, gk, gv = grads
        lead = gq.shape[:-2]                     # [B, S] or [T]
        D = head_dim
        nq, nk = n_heads * D, n_kv_heads * D
        N = nq + nk + gv.shape[-2] * gv.shape[-1]
        self.dy_shape = (x.numel() // x.shape[-1], N)
        rows = (lead[1] * N, N, D, 1) if len(lead) == 2 else (N, D, 1)
        self.v_cols = (gv.shape, rows, nq + nk)
        self.q_cols, self.k_cols = (gq.shape, rows, 0), (gk.shape, rows, nq)
        self.layout = "thd" if self.packed else "bshd"
        self.norm = q_norm_weight is not None
        dy, dq, dk = self.columns(gq, gv)
        if not self.norm:
            self.entry = eager.plan_into(gq, dq, gk, dk, table, sin, position_ids, cu_seqlens,
                                         self.layout, interleaved, True)
            return
        W = (n_heads + n_kv_heads) * D
        in_rows = (lead[1] * W, W, D, 1) if len(lead) == 2 else (W, D, 1)
        self.q_in = (lead + (n_heads, D), in_rows, 0)
        self.k_in = (lead + (n_kv_heads, D), in_rows, nq)
        q_in, k_in = self.inputs(norm_input)
        if self.packed and position_ids is not None:
            position_ids = position_ids[0]
        self.entry = ops_qk_norm.backward_into(
            gq, gk, q_in, k_in, q_norm_weight, k_norm_weight, table, sin, position_ids,
            cu_seqlens, self.layout, interleaved, eps, 0.0, (dq, dk))

    def columns(self, gq: Tensor, gv: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(dY fresh with v's gradient copied into its columns, dY's q and k columns)."""
        dy = torch.empty(self.dy_shape, dtype=gq.dtype, device=gq.device)
        dy.as_strided(*self.v_cols).copy_(gv)
        return dy, dy.as_strided(*self.q_cols), dy.as_strided(*self.k_cols)

    def inputs(self, norm_input: Tensor) -> Tuple[Tensor, Tensor]:
        """The norm's input of q and of k, [B, S, H, D] (packed: [T, H, D]) views."""
        at = norm_input.storage_offset()
        q_shape, q_rows, q_at = self.q_in
        k_shape, k_rows, k_at = self.k_in
        return (norm_input.as_strided(q_shape, q_rows, at + q_at),
                norm_input.as_strided(k_shape, k_rows, at + k_at))

    def __call__(self, gq, gk, gv, norm_input, q_norm_weight, k_norm_weight, table, sin,
                 position_ids, cu_seqlens) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """(dY, the norm weights' gradients or None)."""
        dy, dq, dk = self.columns(gq, gv)
        if not self.norm:
            self.entry(gq, dq, gk, dk, table, sin, position_ids, cu_seqlens)
            return dy, None, None
        q_in, k_in = self.inputs(norm_input)
        if self.packed and position_ids is not None:    # (as __init__ gave backward_into)
            position_ids = position_ids[0]
        pos, _ = ops_qk_norm._index(position_ids, cu_seqlens)   # (as undo_norm_rope reads it)
        _, _, dwq, dwk = self.entry(gq, gk, q_in, k_in, q_norm_weight, k_norm_weight, table,
                                    sin, pos, (dq, dk))
        return dy, dwq.to(q_norm_weight.dtype), dwk.to(k_norm_weight.dtype)


qkv_rope_linear_op = define_op("ropelib::qkv_rope_linear")(_forward)


def _backward_impl(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, x: Tensor,
                   weight: Tensor, table: Tensor, sin: Optional[Tensor],
                   position_ids: Optional[Tensor], cu_seqlens: Optional[Tensor],
                   q_norm_weight: Optional[Tensor], k_norm_weight: Optional[Tensor],
                   rstd: Tensor, norm_input: Tensor, n_heads: int, n_kv_heads: int,
                   head_dim: int, interleaved: bool, out_layout: str, grad_x: bool,
                   grad_params: bool, has_bias: bool
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    B, S, K = _sizes(x)
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
    dy, dq, dk = _dy_with_v(grad_q, grad_k, grad_v, x)
    rotate_into(grad_q, dq, grad_k, dk, table, sin, position_ids, cu_seqlens,
                "thd" if x.dim() == 2 else "bshd", interleaved, backward=True)
    return dy


written_dy = define_op("ropelib::qkv_rotated_dy")(_written_dy)


def _dy_with_v(grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, x: Tensor) -> tuple:
    """(dY [M, N] fresh in the gradients' dtype with v's gradient copied into its columns, and
    dY's q and k column slices shaped as their gradients, [B, S, H, D] or [T, H, D]), for the
    backward kernels to store into. Each slice is one as_strided view of dY (token rows N
    apart, heads D apart): v's gradient is copied in as it comes (bhsd's transposed view too:
    one copy), with no indexing."""
    lead = grad_q.shape[:-2]                     # [B, S] or [T]
    HQ, HK, D = grad_q.shape[-2], grad_k.shape[-2], grad_q.shape[-1]
    M = x.numel() // x.shape[-1]
    nq, nk = HQ * D, HK * D
    N = nq + nk + grad_v.shape[-2] * grad_v.shape[-1]
    dy = torch.empty((M, N), dtype=grad_q.dtype, device=grad_q.device)
    rows = (lead[1] * N, N, D, 1) if len(lead) == 2 else (N, D, 1)
    dy.as_strided(grad_v.shape, rows, nq + nk).copy_(grad_v)
    return (dy, dy.as_strided(grad_q.shape, rows, 0), dy.as_strided(grad_k.shape, rows, nq))


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
    dy, dq, dk = _dy_with_v(grad_q, grad_k, grad_v, x)
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
            fp = _forward_plan(*inputs[:15], keep)
        rstd, norm_input = fp.statistics(inputs[0]) if keep else (None, None)
        output = _project(*inputs[:15], rstd, norm_input, fp, True) + (rstd, norm_input)
        _setup(ctx, inputs, output)
        ctx.plan = fp
        return output

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads) + (None,)


_eager_qkv_rope = eager.direct_apply(_EagerQKVRoPE)


# --- argument checks ------------------------------------------------------------------------

def _check_count(v, name: str, minimum: int) -> int:
    if type(v) is int and v >= minimum:       # (the common case, without the ABC's check)
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} ({v!r})")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def _check_table(freqs, angles, rotary_dim, head_dim: int, x: Tensor):
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
        rotary_dim = _check_count(rotary_dim, "rotary_dim", 2)
        if rotary_dim != R:
            raise ValueError(f"rotary_dim={rotary_dim} but {name} rotates {R} features (its "
                             f"last dim{'' if freqs is not None else ': rot_dim'}); build "
                             f"{name} for rotary_dim={rotary_dim} (rotary_percent="
                             f"{rotary_dim}/{head_dim}) or leave rotary_dim out")
    check_no_table_grad((name, table))
    return table, sin, R


def _check_positions(x: Tensor, position_ids, cu_seqlens, P: int, out_layout: str):
    """position_ids as [B or 1, S] contiguous (int), cu_seqlens contiguous; values checked where
    they can be read without a synchronisation (ropelib.set_index_checks)."""
    B, S, _ = _sizes(x)
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
    return _positions(position_ids, cu_seqlens, S, B, P)


def _positions(position_ids, cu_seqlens, S: int, B: int, P: int):
    """What _check_positions does at every call once the shapes are checked: position_ids as
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


def _check_norm_weights(q_norm_weight, k_norm_weight, head_dim: int, x: Tensor) -> bool:
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


def _check_projection(x, weight, bias, n_heads, n_kv_heads, head_dim):
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
    sig = _call_signature(x, weight, bias, freqs, angles, position_ids, cu_seqlens,
                          q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim, eps,
                          weight_offset, rotary_dim, interleaved, out_layout, backward) \
        if plain else None
    kept = SIGNATURES.get(sig) if sig is not None else None
    if kept is not None:
        return kept(x, weight, bias, freqs, angles, position_ids, cu_seqlens, q_norm_weight,
                    k_norm_weight, n_heads, n_kv_heads, head_dim, eps, weight_offset,
                    interleaved, out_layout)
    n_heads = _check_count(n_heads, "n_heads", 1)
    n_kv_heads = _check_count(n_kv_heads, "n_kv_heads", 1)
    head_dim = _check_count(head_dim, "head_dim", 2)
    if head_dim > kernel.MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be <= {kernel.MAX_HEAD_DIM} (a head's columns live in "
                         f"one program's registers), got {head_dim}")
    if not plain:       # (a plain eager call runs under no torch.func transform)
        V.check_no_grad_transform("qkv_rope_linear")
    _check_projection(x, weight, bias, n_heads, n_kv_heads, head_dim)
    V.check_bool(interleaved, "interleaved")
    if out_layout not in OUT_LAYOUTS:
        raise ValueError(f"out_layout must be one of {OUT_LAYOUTS}, got {out_layout!r}")
    eps = V.check_real(eps, "eps", positive=True)
    weight_offset = V.check_real(weight_offset, "weight_offset")
    table, sin, _ = _check_table(freqs, angles, rotary_dim, head_dim, x)
    position_ids, cu_seqlens = _check_positions(x, position_ids, cu_seqlens, _rows(table),
                                                out_layout)
    norm = _check_norm_weights(q_norm_weight, k_norm_weight, head_dim, x)
    backward = resolved_backward(backward)
    grad = needs_grad(x, weight, *(t for t in (bias, q_norm_weight, k_norm_weight)
                                   if t is not None))
    q, k, v, fp = _checked_run(x, weight, bias, table, sin, position_ids, cu_seqlens,
                               q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim, eps,
                               weight_offset, interleaved, out_layout, norm, grad, backward,
                               plain, None)
    if sig is not None:     # checked in full: later calls of this signature skip the checks
        B, S, _ = _sizes(x)
        SIGNATURES.put(sig, _PlannedCall(S, B, _rows(table), norm, grad, backward, fp))
    return q, k, v


def _checked_run(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, weight_offset, interleaved,
                 out_layout, norm: bool, grad: bool, backward: str, plain: bool,
                 fp: Optional["ForwardPlan"]) -> tuple:
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
        fp = _forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
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


def _call_signature(x, weight, bias, freqs, angles, position_ids, cu_seqlens, q_norm_weight,
                    k_norm_weight, *options) -> Optional[tuple]:
    """A plain eager call's signature (`_PlannedCall`): every tensor's shape, strides, dtype,
    device and requires_grad (x, the weight, bias, the freqs table or Angles' turns and
    amplitude, position ids, cu_seqlens, norm weights: plain tensors or nn.Parameters), which
    table (Angles: its rot_dim), the options and each option's type, grad mode; or None
    (something else, both tables or neither: the full checks say what is wrong)."""
    if angles is None and type(freqs) is torch.Tensor:
        tables, kind = (freqs, None), "freqs"
    elif freqs is None and type(angles) is Angles:
        tables, kind = (angles.turns, angles.amplitude), angles.rot_dim
    else:
        return None
    sig = ["qkv_rope_linear", kind, torch.is_grad_enabled(), *options, *map(type, options)]
    try:
        hash(options)
    except TypeError:
        return None
    for t in (x, weight, bias, *tables, position_ids, cu_seqlens, q_norm_weight,
              k_norm_weight):
        if t is None:
            sig.append(None)
        elif type(t) is torch.Tensor or type(t) is nn.Parameter:
            sig.append((t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        else:
            return None
    return tuple(sig)


class _PlannedCall:
    """qkv_rope_linear's plain eager call, checked in full at the first call of its signature
    (`_call_signature`), with what the checks decided that follows from the signature alone:
    the tokens a sequence S, the batch B and the table's positions P (for the position values'
    checks), whether there is a norm, whether gradients are asked for, the resolved backward
    and the forward's ForwardPlan. A later call of the signature does only what depends on
    more: the position ids' and cu_seqlens' values (`_positions`, where
    ropelib.set_index_checks wants them read), Gemma's weight offset added, copies of tensors
    made under inference_mode before they are saved, the table's [P, R] view and the
    contiguous views (as the checks make them)."""
    __slots__ = ("S", "B", "P", "norm", "grad", "backward", "fp")

    def __init__(self, S, B, P, norm, grad, backward, fp):
        self.S, self.B, self.P = S, B, P
        self.norm, self.grad, self.backward, self.fp = norm, grad, backward, fp

    def __call__(self, x, weight, bias, freqs, angles, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, weight_offset, interleaved,
                 out_layout) -> Tuple[Tensor, Tensor, Tensor]:
        if freqs is None:
            table, sin = angles.turns.contiguous(), angles.amplitude
        else:       # (V.angle_table's [P, R] view of [P, 1, 1, R] or [P, R], contiguous)
            table, sin = (freqs[:, 0, 0, :] if freqs.dim() == 4 else freqs).contiguous(), None
        position_ids, cu_seqlens = _positions(position_ids, cu_seqlens, self.S, self.B,
                                              self.P)
        q, k, v, _ = _checked_run(x, weight, bias, table, sin, position_ids, cu_seqlens,
                                  q_norm_weight, k_norm_weight, n_heads, n_kv_heads, head_dim,
                                  eps, weight_offset, interleaved, out_layout, self.norm,
                                  self.grad, self.backward, True, self.fp)
        return q, k, v


# --- the module -----------------------------------------------------------------------------

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
        self.hidden_size = _check_count(hidden_size, "hidden_size", 1)
        self.n_heads = _check_count(n_heads, "n_heads", 1)
        self.n_kv_heads = _check_count(n_kv_heads, "n_kv_heads", 1)
        self.head_dim = _check_count(head_dim, "head_dim", 2)
        for name, flag in (("bias", bias), ("qk_norm", qk_norm), ("interleaved", interleaved)):
            V.check_bool(flag, name)
        if out_layout not in OUT_LAYOUTS:
            raise ValueError(f"out_layout must be one of {OUT_LAYOUTS}, got {out_layout!r}")
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
        return cls._wrap(qkv_proj.weight, getattr(qkv_proj, "bias", None), n_heads, n_kv_heads, head_dim, q_w, k_w,
                         eps, **kwargs)

    @classmethod
    def from_linears(cls, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear, *,
                     head_dim: int, q_norm: Optional[nn.Module] = None,
                     k_norm: Optional[nn.Module] = None, eps: Optional[float] = None,
                     **kwargs) -> "QKVRoPE":
        """From separate q, k and v projections (as transformers' Llama, Qwen3 and Gemma 3 keep
        them); their weights (and biases) are concatenated into new parameters, the norm
        weights shared. The head counts follow from the projections' sizes."""
        head_dim = _check_count(head_dim, "head_dim", 2)
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
