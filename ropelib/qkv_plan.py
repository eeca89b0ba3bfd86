"""The launch plans of ropelib.qkv_rope_linear (ropelib/qkv_linear.py), and where they are kept.

Planning reads only what a call's tensors are, never their values: shapes, strides, dtypes,
the device and the options. A plain eager call plans each launch once and keeps it in
ropelib.eager.SIGNATURES, the one cache of every plan ropelib keeps (eager.SIGNATURES.clear()
drops them all), each entry under a key of its own kind:
  ("qkv_rope_linear", ...)   a call, checked in full once (`PlannedCall`: what the checks
                             decided and the ForwardPlan): every tensor's shape, strides,
                             dtype, device and requires_grad, which table (Angles: rot_dim),
                             the options and their types, grad mode (`call_signature`); a later
                             call checks only the position values
                             (qkv_checks.checked_position_values);
  ("qkv_forward", ...)       the forward's whole plan (`ForwardPlan`: the output and cos/sin
                             rows' shapes, the pre-pass plan and the GEMM's Launch below),
                             looked up once a call (`forward_key`): x's shape, the dtypes of x,
                             the weight, bias, table, sin, position ids, cu_seqlens and norm
                             weights, whether the norm's statistics are written, the device,
                             the table's shape and strides, the position ids' and cu_seqlens'
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
  ("qkv_cos_sin_rows", ...)  the pre-pass of the cos/sin rows (`prepass_plan`): S, the row
                             sets, R, the table's shape and strides, the position ids' and
                             cu_seqlens' lengths, the dtypes of the table, sin, ids and
                             cu_seqlens, interleaved, the device, whether pairs_differ is asked;
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
eager.SIGNATURES.clear() for the next call to plan again. Nothing here launches a kernel
(qkv_linear starts them; a DyStep, called, runs its kept entry).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import eager, qk_norm as ops_qk_norm
from .eager import SIGNATURES
from .frequencies import EXACT_POSITIONS, Angles
from .kernels import qkv_gemm as kernel
from .kernels.launch import Positions, Table, plan_cos_sin_rows
from .kernels.planning import Launch
from .qkv_checks import sizes


def planned(kind: str, *, S, B, K, HQ, HK, D, R, P, ids, cu_seqlens, layout: str,
            interleaved: bool, eps: float, device: torch.device, dtypes: tuple,
            rotate: bool = True, shared_angle: bool = False) -> Launch:
    """qkv_gemm.plan(...) with the same arguments, kept in eager.SIGNATURES for the next call
    with the same sizes, dtypes and options (concrete sizes only: a symbolic one, under
    torch.compile, is planned anew). ids and cu_seqlens count by what plan reads of them:
    whether ids has a row per entry, and cu_seqlens' length. The Launch is shared: leave it
    unchanged. A kept TMA forward needs Triton's allocator set in the thread that starts it,
    as plan sets it: qkv_linear._run sees to that at every start (ensure_allocator)."""
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


def gemm_plan(kind: str, x: Tensor, table: Tensor, position_ids, cu_seqlens, n_heads,
              n_kv_heads, head_dim, interleaved, out_layout, eps, dtypes: tuple) -> Launch:
    """`planned` for one of the three kernels, its sizes read from x and the table."""
    B, S, K = sizes(x)
    turns = table.dtype == torch.int64          # Angles' turns
    R = table.shape[0] if turns else table.shape[1]
    return planned(kind, S=S, B=B, K=K, HQ=n_heads, HK=n_kv_heads, D=head_dim, R=R,
                   P=EXACT_POSITIONS if turns else table.shape[0], ids=position_ids,
                   cu_seqlens=cu_seqlens, layout=out_layout, interleaved=interleaved, eps=eps,
                   device=x.device, dtypes=dtypes, shared_angle=turns)


def prepass_plan(table: Tensor, sin: Optional[Tensor], position_ids, cu_seqlens, S, nb: int,
                 R, interleaved: bool, device, pairs_differ: bool):
    """launch.plan_cos_sin_rows for qkv_linear.cos_sin_rows (forward pass, any_length), kept in
    eager.SIGNATURES by what it reads of its arguments: dtypes, shapes and strides of the table,
    of the position ids and of cu_seqlens, never their values."""
    def plan():
        return plan_cos_sin_rows(Table(table, sin), Positions(position_ids, cu_seqlens), S, nb,
                                 R=R, interleaved=interleaved, backward=False, device=device,
                                 any_length=True, pairs_differ=pairs_differ)
    read = (S, nb, R, *table.shape, *table.stride(),
            0 if position_ids is None else position_ids.shape[0],
            0 if cu_seqlens is None else cu_seqlens.shape[0])
    if any(type(n) is not int for n in read):
        return plan()        # (symbolic sizes: torch.compile's tracing plans every time)
    key = ("qkv_cos_sin_rows", read, table.dtype, sin is None or sin.dtype,
           position_ids is None or position_ids.dtype, cu_seqlens is None or cu_seqlens.dtype,
           interleaved, device, pairs_differ)
    pre = SIGNATURES.get(key)
    if pre is None:
        pre = SIGNATURES.put(key, plan())
    return pre


def row_sets(x: Tensor, table: Tensor, position_ids) -> Tuple[int, int, int]:
    """(NB, S, R): the cos/sin rows' sets (B where position ids differ between batch entries,
    else 1), tokens a set and rotary width."""
    B, S, _ = sizes(x)
    R = table.shape[0] if table.dtype == torch.int64 else table.shape[1]
    return (B if kernel.per_entry(position_ids) else 1), S, R


def _dtype(t: Optional[Tensor]):
    return None if t is None else t.dtype


def forward_plan(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout,
                 stats: bool) -> "ForwardPlan":
    """The call's ForwardPlan: kept in eager.SIGNATURES under `forward_key`, made where none
    is (and kept where the key is one)."""
    key = forward_key(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
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


def forward_key(x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
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
    """Everything of one forward that follows from its key (`forward_key`): the shapes of q
    and of k and v, of the norm's statistics, the cos/sin rows' shape, whether the pre-pass
    sets a pairs_differ flag, the pre-pass plan (`prepass_plan`) and the GEMM's Launch
    (`planned`; None where there is no token, nothing launched). The eager route keeps it on
    the autograd context, and the backward keeps its dY steps here (`dy_step`), by what the
    backward adds to the key: the gradients' strides."""
    __slots__ = ("q_shape", "kv_shape", "stats", "rows", "differ", "prepass", "launch",
                 "options", "epoch", "dy", "__weakref__")

    def __init__(self, x, weight, bias, table, sin, position_ids, cu_seqlens, q_norm_weight,
                 k_norm_weight, n_heads, n_kv_heads, head_dim, eps, interleaved, out_layout,
                 stats):
        B, S, _ = sizes(x)
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
        nb, _, R = row_sets(x, table, position_ids)
        self.rows, self.differ = (nb * S, R), table.dtype != torch.int64   # (not Angles' turns)
        self.prepass = self.launch = None
        if B * S == 0:
            return
        device = x.device
        self.prepass = prepass_plan(table, sin, position_ids, cu_seqlens, S, nb, R,
                                    interleaved, device, self.differ)
        f32 = torch.float32
        dtypes = (x.dtype, weight.dtype, _dtype(bias), x.dtype, x.dtype, x.dtype, f32, f32,
                  _dtype(q_norm_weight), _dtype(k_norm_weight), f32 if stats else None,
                  x.dtype if stats else None, torch.int32 if self.differ else None)
        self.launch = gemm_plan("fwd", x, table, position_ids, cu_seqlens, n_heads,
                                n_kv_heads, head_dim, interleaved, out_layout, eps, dtypes)

    def statistics(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Fresh rstd [M, HQ + HK] (fp32) and norm_input [M, (HQ + HK) D] (x's dtype)."""
        return (torch.empty(self.stats[0], dtype=torch.float32, device=x.device),
                torch.empty(self.stats[1], dtype=x.dtype, device=x.device))

    def dy_step(self, grads: tuple, sin, position_ids, cu_seqlens, q_norm_weight,
                k_norm_weight) -> Tuple[Optional["DyStep"], tuple]:
        """(the kept DyStep or None, its key) for the gradients of q, k and v (token-major:
        qkv_linear._token_major) and the tensors the forward saved: the strides of the gradients and
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


def dy_layout(gq: Tensor, gk: Tensor, gv: Tensor, M: int) -> tuple:
    """Where the backward writes the projection's gradient dY [M, N]: (dY's shape, then the
    as_strided (shape, strides, offset) of its q, k and v column blocks, each shaped as that
    output's gradient, [B, S, H, D] or [T, H, D]). Token rows are N apart and heads D apart, so
    each block is one view of dY, and q's, k's and v's columns sit in the weight's row order."""
    lead = gq.shape[:-2]                         # [B, S] or [T]
    D = gq.shape[-1]
    nq, nk = gq.shape[-2] * D, gk.shape[-2] * D
    N = nq + nk + gv.shape[-2] * gv.shape[-1]
    rows = (lead[1] * N, N, D, 1) if len(lead) == 2 else (N, D, 1)
    return (M, N), (gq.shape, rows, 0), (gk.shape, rows, nq), (gv.shape, rows, nq + nk)


def dy_with_v(layout: tuple, gq: Tensor, gv: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(dY fresh in the gradients' dtype with v's gradient copied into its columns, and dY's q
    and k column views) for the backward kernels to store into; layout is dy_layout's. v's
    gradient is copied in as it comes (bhsd's transposed view too: one copy), with no
    indexing."""
    shape, q_cols, k_cols, v_cols = layout
    dy = torch.empty(shape, dtype=gq.dtype, device=gq.device)
    dy.as_strided(*v_cols).copy_(gv)
    return dy, dy.as_strided(*q_cols), dy.as_strided(*k_cols)


class DyStep:
    """The backward's dY step ("dy", plain eager) for one ForwardPlan and gradients' strides,
    planned at its first call: what qkv_linear._written_dy (or, with QK-norm,
    qkv_linear._written_dy_normed) does, with what follows from shapes and strides kept. dY's
    shape and the as_strided views of its q, k and v columns (dy_layout), and the
    entry eager.rotate_into (qk_norm.undo_norm_rope) would keep under the call's signature: the
    same plans, so the same bits, without building that signature every call. With QK-norm,
    the norm's input of q and k as as_strided views of norm_input (the forward's fresh
    [M, (HQ + HK) D], as qkv_linear._written_dy_normed's views)."""
    __slots__ = ("dy_layout", "layout", "norm", "q_in", "k_in",
                 "packed", "entry")

    def __init__(self, fp: ForwardPlan, grads: tuple, x, norm_input, q_norm_weight,
                 k_norm_weight, table, sin, position_ids, cu_seqlens):
        n_heads, n_kv_heads, head_dim, eps, interleaved, self.packed = fp.options
        gq, gk, gv = grads
        lead = gq.shape[:-2]                     # [B, S] or [T]
        D = head_dim
        nq = n_heads * D
        self.dy_layout = dy_layout(gq, gk, gv, x.numel() // x.shape[-1])
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
        return dy_with_v(self.dy_layout, gq, gv)

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
        pos, _ = ops_qk_norm.kernel_positions(position_ids, cu_seqlens)  # (undo_norm_rope's)
        _, _, dwq, dwk = self.entry(gq, gk, q_in, k_in, q_norm_weight, k_norm_weight, table,
                                    sin, pos, (dq, dk))
        return dy, dwq.to(q_norm_weight.dtype), dwk.to(k_norm_weight.dtype)


def call_signature(x, weight, bias, freqs, angles, position_ids, cu_seqlens, q_norm_weight,
                   k_norm_weight, *options) -> Optional[tuple]:
    """A plain eager call's signature (`PlannedCall`): every tensor's shape, strides, dtype,
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


class PlannedCall:
    """qkv_rope_linear's plain eager call, checked in full at the first call of its signature
    (`call_signature`), with what the checks decided that follows from the signature alone:
    the tokens a sequence S, the batch B and the table's positions P (for the position values'
    checks), whether there is a norm, whether gradients are asked for, the resolved backward
    and the forward's ForwardPlan. A later call of the signature (qkv_linear.qkv_rope_linear)
    does only what depends on more: the position ids' and cu_seqlens' values
    (qkv_checks.checked_position_values, where ropelib.set_index_checks wants them read),
    Gemma's weight offset added, copies of tensors made under inference_mode before they are
    saved, the table's [P, R] view (qkv_checks.table_view) and the contiguous views (as the
    checks make them)."""
    __slots__ = ("S", "B", "P", "norm", "grad", "backward", "fp")

    def __init__(self, S, B, P, norm, grad, backward, fp):
        self.S, self.B, self.P = S, B, P
        self.norm, self.grad, self.backward, self.fp = norm, grad, backward, fp
