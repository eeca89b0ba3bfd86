"""Public entry points: apply_rope and apply_rope_qk.

Each call checks its arguments (metadata only, plus index values where that is free: see
ropelib.validation) and normalises them (tables to [P, R] views, position ids to [B or 1, S]).
Traced (torch.compile, export, ...), it then calls one of ropelib's operators (ropelib.ops);
a plain eager call takes the eager route (ropelib.eager), which keeps the check and plan of each
signature and launches the same kernel directly. Nothing reads a GPU tensor's values unless
asked to.
"""
import operator
from typing import NamedTuple, Optional, Tuple

import torch

from . import eager, ops
from . import validation as V
from .frequencies import Angles
from .kernels.launch import EXACT_POSITIONS, Positions, Table


class Call(NamedTuple):
    """One call's tables, index tensors and options, checked and normalised for the operators."""
    table: torch.Tensor                    # angles [P, R], cos [P, R], or Angles.turns [R]
    sin: Optional[torch.Tensor]            # sin [P, R] (None with angles), Angles.amplitude [1]
    position_ids: Optional[torch.Tensor]   # [B or 1, S]
    cu_seqlens: Optional[torch.Tensor]     # [N + 1], contiguous
    start_positions: Optional[torch.Tensor]  # [B] or [N], contiguous
    layout: str
    interleaved: bool
    cp_size: int
    cp_rank: int
    S: int
    B: int
    R: int

    def index(self) -> tuple:
        return self.position_ids, self.cu_seqlens, self.start_positions

    def options(self) -> tuple:
        return self.layout, self.interleaved, self.cp_size, self.cp_rank

    def rows(self) -> int:
        """Positions the table serves (angles computed in the kernel: up to 2^31 - 1)."""
        return Table(self.table, self.sin).rows


def _check_angles(angles) -> None:
    if not isinstance(angles, Angles):
        raise TypeError(f"angles must be a ropelib.frequencies.Angles (from "
                        f"ropelib.frequencies.rope_angles), got {type(angles).__name__}")


def _tables(freqs, cos, sin, names=("freqs", "cos", "sin"), angles=None):
    """(table, sin): angles [P, R] (sin None), cos and sin [P, R] with one set of strides, or
    an Angles' turns [R] and amplitude [1]."""
    if angles is not None:
        _check_angles(angles)
        if freqs is not None or cos is not None or sin is not None:
            raise ValueError(f"pass either angles (computed in the kernel) or a table "
                             f"({names[0]}, or {names[1]} and {names[2]}), not both")
        return angles.turns.contiguous(), angles.amplitude
    if freqs is not None:
        if cos is not None or sin is not None:
            raise ValueError(f"pass either {names[0]} (angles) or {names[1]} and {names[2]} "
                             "(a table), not both")
        return V.angle_table(freqs, names[0]), None
    if cos is None or sin is None:
        raise ValueError(f"pass {names[0]} (angles [P, 1, 1, R] or [P, R]), or both {names[1]} "
                         f"and {names[2]} ([P, R]), or angles (ropelib.rope_angles)")
    return V.cos_sin_pair(V.table_2d(cos, names[1]), V.table_2d(sin, names[2]), names[1:])


def checked_tables(freqs, cos, sin, angles=None):
    """(table, sin) as `_tables` leaves them, without its checks: for a call whose signature
    (shapes, strides, dtypes) was checked before (the eager routes of ropelib.qk_norm and
    ropelib.kv_cache)."""
    if angles is not None:
        return angles.turns.contiguous(), angles.amplitude
    if freqs is not None:
        return V.kernel_table(freqs[:, 0, 0, :] if freqs.dim() == 4 else freqs), None
    c, s = (t[:, 0, 0, :] if t.dim() == 4 else t for t in (cos, sin))
    return V.cos_sin_pair(c, s)


def prepare(x: torch.Tensor, freqs=None, *, cos=None, sin=None, layout="sbhd",
            interleaved=False, start_positions=None, position_ids=None, cu_seqlens=None,
            cp_size=1, cp_rank=0, name="x", kernel_device=True, angles=None,
            table_names=("freqs", "cos", "sin")) -> Call:
    """Check one call and normalise its arguments. Raises before anything runs.

    kernel_device=False skips the check that a Triton kernel can run on x's device (for the
    plain-PyTorch paths that share these checks); table_names name the table arguments in
    errors."""
    table, sin, position_ids, cu_seqlens, start_positions, S, B, R, _ = checked_call(
        x, freqs, cos, sin, angles, layout, interleaved, start_positions, position_ids,
        cu_seqlens, cp_size, cp_rank, name, kernel_device, table_names)
    return Call(table, sin, position_ids, cu_seqlens, start_positions, layout, interleaved,
                cp_size, cp_rank, S, B, R)


def checked_call(x, freqs, cos, sin, angles, layout, interleaved, start_positions, position_ids,
                 cu_seqlens, cp_size, cp_rank, name, kernel_device, table_names) -> tuple:
    """`prepare`'s checks and normalisation: (table, sin, position_ids, cu_seqlens,
    start_positions, S, B, R, P), P the positions the table serves.

    What a call traced by torch.compile runs: every argument given (no default read) and a
    plain tuple back (no NamedTuple built), so that Dynamo guards little more than the code
    objects it inlines (benchmarks/compiled_guard_probe.py)."""
    V.check_tensor(x, name, dims=None, dtypes=V.FLOAT_DTYPES)
    V.check_layout(x, layout, name)
    V.check_no_grad_transform("ropelib")
    if kernel_device:
        V.check_kernel_device(x, name)
    V.check_cp(cp_size, cp_rank)
    V.check_bool(interleaved, "interleaved")
    if start_positions is not None:
        V.check_int_tensor(start_positions, "start_positions", (1,))
    if position_ids is not None:
        V.check_int_tensor(position_ids, "position_ids", (1, 2))
    if cu_seqlens is not None:
        V.check_int_tensor(cu_seqlens, "cu_seqlens", (1,))
    table, sin_t = _tables(freqs, cos, sin, table_names, angles)
    V.check_same_device(x, name, freqs=freqs, cos=cos, sin=sin, start_positions=start_positions,
                        position_ids=position_ids, cu_seqlens=cu_seqlens,
                        angles=table if angles is not None else None)
    sin = sin_t
    # (angles: the turns [R] int64, Table.exact; a table: [P, R])
    exact = angles is not None
    D, P = x.shape[-1], EXACT_POSITIONS if exact else table.shape[-2]
    R = table.shape[0] if exact else table.shape[1]
    table_name = "angles" if exact else table_names[0 if freqs is not None else 1]
    V.check_rotary_dim(R, D, table_name)
    if P == 0 and x.numel():
        raise ValueError(f"the table ({table_name}) has no positions")
    x4 = ops.view4(x, layout)
    S, B = x4.shape[0], x4.shape[1]
    if position_ids is not None:
        if start_positions is not None or cp_size > 1 or cu_seqlens is not None:
            raise ValueError("position_ids gives every token's position: do not combine it with "
                             "start_positions, cp_size > 1 or cu_seqlens")
        if layout == "thd" and position_ids.dim() != 1:
            raise ValueError(f"position_ids for layout='thd' must be [T], got "
                             f"{tuple(position_ids.shape)}")
        # [B or 1, S], contiguous: the kernel reads a row of ids at stride 1
        position_ids = (position_ids if position_ids.dim() == 2
                        else position_ids.unsqueeze(0)).contiguous()
        if position_ids.shape[1] != S or position_ids.shape[0] not in (1, B):
            raise ValueError(f"position_ids must be [S={S}] or [B={B}, S={S}] (or [1, S]), "
                             f"got {tuple(position_ids.shape)}")
    elif layout == "thd":
        if cu_seqlens is None:
            raise ValueError("cu_seqlens must be given when layout is 'thd' "
                             "(or pass position_ids with every token's position)")
        if cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must have at least 2 entries ([0, len0, ...]), "
                             f"got {cu_seqlens.shape[0]}")
        n_seq = cu_seqlens.shape[0] - 1
        if start_positions is not None and start_positions.shape[0] != n_seq:
            raise ValueError(f"start_positions must have one entry per sequence ({n_seq}), "
                             f"got {start_positions.shape[0]}")
    elif cu_seqlens is not None:
        raise ValueError(f"cu_seqlens is only for layout='thd', got layout={layout!r}")
    else:
        # Each sequence covers rows start_positions[b] .. start_positions[b] + S * cp_size - 1
        # of the table (the whole global sequence, of which this rank holds two chunks), as in
        # Transformer Engine; the start values themselves are checked by check_values.
        if cp_size > 1 and S % 2:
            raise ValueError(f"with cp_size={cp_size} the local sequence length must be even "
                             f"(two chunks per rank), got {S}")
        if start_positions is not None and start_positions.shape[0] != B:
            raise ValueError(f"start_positions must have one entry per batch entry ({B}), "
                             f"got {start_positions.shape[0]}")
        if S * cp_size > P:
            raise ValueError(f"the table ({table_name}) has {P} positions but the input needs "
                             f"seq_len*cp_size = {S}*{cp_size} = {S * cp_size}"
                             + (" (plus start_positions)" if start_positions is not None else ""))
    if start_positions is not None:
        start_positions = start_positions.contiguous()
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()
    if position_ids is not None or cu_seqlens is not None or start_positions is not None:
        index_values(position_ids, cu_seqlens, start_positions, S, B, P, layout, cp_size)
    return table, sin, position_ids, cu_seqlens, start_positions, S, B, R, P


def check_values(call: Call, rows: Optional[int] = None, index=None) -> None:
    """The index value checks, where the current mode wants them (validation.set_index_checks).

    `index` (position_ids, cu_seqlens, start_positions) defaults to the call's own."""
    position_ids, cu_seqlens, start_positions = index if index is not None else call.index()
    index_values(position_ids, cu_seqlens, start_positions, call.S, call.B,
                 rows if rows is not None else call.rows(), call.layout, call.cp_size)


def index_values(position_ids, cu_seqlens, start_positions, S, B, P, layout, cp_size) -> None:
    """check_values with every argument given: P the positions the table serves."""
    present = [t for t in (position_ids, cu_seqlens, start_positions) if t is not None]
    if present and V.values_checkable(*present):
        V.check_index_values(S=S, B=B, P=P, layout=layout, start_positions=start_positions,
                             position_ids=position_ids, cu_seqlens=cu_seqlens, cp_size=cp_size)


def check_no_table_grad(*tables) -> None:
    if torch.is_grad_enabled():
        for name, t in tables:
            if t is not None and t.requires_grad:
                raise ValueError(
                    f"{name} requires grad, but ropelib's kernels give no gradient for the angle "
                    f"or cos/sin tables: pass {name}.detach() (as RoPE tables usually are), or "
                    "use ropelib.reference for learned tables")


def needs_grad(*xs) -> bool:
    if torch.is_grad_enabled():
        for x in xs:    # (a loop, not any(): no builtin for a traced call to guard)
            if x.requires_grad:
                return True
    return False


def check_in_place(x: torch.Tensor, name: str) -> None:
    """Refuse, before anything is written, what rotating x in place could not do correctly."""
    if x.numel() == 0:
        return
    if not V.non_overlapping(x):
        raise ValueError(f"inplace=True needs {name} without overlapping memory (an expand()ed or "
                         "stride-0 view would be written twice); pass inplace=False")
    if needs_grad(x):
        # (torch.compile knows no ._base; there autograd's own check on views of leaves holds)
        base = None if torch.compiler.is_compiling() else x._base
        if x.is_leaf or (base is not None and base.is_leaf and base.requires_grad):
            raise ValueError(f"inplace=True on {name}, a leaf tensor that requires grad (or a "
                             "view of one): autograd forbids changing it in place; pass "
                             "inplace=False")


def check_qk_in_place(q: torch.Tensor, k: torch.Tensor) -> None:
    check_in_place(q, "q")
    check_in_place(k, "k")
    if not torch.compiler.is_compiling() and V.memory_overlaps(q, k):
        raise ValueError("inplace=True with q and k overlapping in memory: each would be "
                         "rotated on top of the other; pass inplace=False")


def saveable(t):
    """Tables and index tensors made under torch.inference_mode cannot be saved for backward:
    a plain copy can (they are small)."""
    if t is not None and not torch.compiler.is_compiling() and t.is_inference():
        return t.clone()
    return t


class PlannedCall:
    """One checked and planned signature of a public function (see ropelib.eager): the rotation,
    which of the caller's tables and index tensors it reads (`read_slots`: indices into the
    5-tuple (table, sin, position_ids, cu_seqlens, start_positions)), and what each call must
    still check."""
    __slots__ = ("rotation", "read_slots", "call", "rows", "in_place", "grad", "names", "has_index",
                 "index_on_host", "_reads")

    def __init__(self, rotation, read_slots: tuple, call: Call, rows: int, in_place: bool,
                 grad: bool, names):
        self.rotation, self.read_slots, self.rows = rotation, read_slots, rows
        # the read slots' tensors as a tuple, in one C call (one slot: a slice of one)
        self._reads = (operator.itemgetter(*read_slots) if len(read_slots) > 1 else
                       operator.itemgetter(slice(read_slots[0], read_slots[0] + 1)))
        self.in_place, self.grad, self.names = in_place, grad, names
        self.call = call._replace(table=None, sin=None, position_ids=None, cu_seqlens=None,
                                  start_positions=None)   # keeps no tensor
        index = [t for t in call.index() if t is not None]
        self.has_index = bool(index)
        # (devices are part of the signature: every later call's index tensors are where these
        # are, so only the mode is asked on each call)
        self.index_on_host = all(t.device.type == "cpu" for t in index)

    def __call__(self, xs: tuple, tables_and_index: tuple, checked: bool = False):
        if not checked:
            if self.has_index and V.checks_wanted(self.index_on_host):
                check_values(self.call, self.rows, tables_and_index[2:])
            if self.in_place:
                if len(xs) == 2:
                    check_qk_in_place(*xs)
                else:
                    check_in_place(xs[0], self.names[0])
        reads = self._reads(tables_and_index)
        if self.grad:
            for t in reads:     # (saveable's test: a plain eager call is never compiling)
                if t.is_inference():
                    reads = tuple(map(saveable, reads))
                    break
            out = eager.rotate(self.rotation, reads, *xs)
            if not self.in_place:
                return out
            outs = out if isinstance(out, tuple) else (out,)
        else:
            outs = self.rotation.run(xs, reads)
        if self.in_place and not self.rotation.in_place:
            # in place through fresh outputs (with grad, or where the kernels cannot store in
            # place: ops.writes_in_place): an ordinary in-place copy, which autograd tracks
            outs = tuple(x.copy_(y) for x, y in zip(xs, outs))
        return outs if len(outs) > 1 else outs[0]


def plan_eager_call(xs, tables_and_index, normalized, c: Call, *, inplace: bool, rows: int,
                    names, out_dtype=None, axes: Optional[tuple] = None) -> PlannedCall:
    """Plan the eager route of a checked call. normalized = (table, sin): the table as the
    checks left it; tables_and_index: the caller's (table, sin, position_ids, cu_seqlens,
    start_positions). `axes`: one table per axis (kernels/launch.Table.axes; the caller's table
    and sin are then Qwen2-VL's [3, B or 1, S, R], normalized their time axis's)."""
    grad = needs_grad(*xs)
    direct_in_place = inplace and not grad and ops.writes_in_place(*xs)
    outs = xs if direct_in_place else tuple(
        torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device) for x in xs)
    table, sin = normalized
    # kernel pointer -> (the normalized tensor it reads, where the caller gave it)
    reads = {"cos_ptr": (table, 0), "sin_ptr": (sin, 1), "position_ids_ptr": (c.position_ids, 2),
             "cu_seqlens_ptr": (c.cu_seqlens, 3), "start_ptr": (c.start_positions, 4)}
    reads = {name: (t, j) for name, (t, j) in reads.items() if t is not None}
    read_slots = tuple(sorted({j for _, j in reads.values()}))
    # a pointer reads the caller's tensor, or a contiguous copy of it where the checks made one
    pointer_sources = [(name, read_slots.index(j), t.data_ptr() != tables_and_index[j].data_ptr())
                       for name, (t, j) in reads.items()]
    rotation = eager.PlannedRotation(
        xs=xs, outs=outs, table=Table(table, sin, axes),
        positions=Positions(c.position_ids, c.cu_seqlens, c.start_positions, c.cp_size,
                            c.cp_rank),
        pointer_sources=pointer_sources, out_dtype=out_dtype, in_place=direct_in_place,
        backward=False, interleaved=c.interleaved, layout=c.layout)
    return PlannedCall(rotation, read_slots, c, rows, inplace, grad, names)


def _kernel_reads(freqs, cos, sin, angles, position_ids, cu_seqlens, start_positions):
    """(tables_and_index, tables): the caller's 5-tuple (table, sin, position_ids, cu_seqlens,
    start_positions) of what the kernel reads, and the table arguments for the signature
    (None: a call the eager route does not cache; the full checks say what is wrong). With
    angles the kernel reads the Angles' turns and amplitude where it reads a table."""
    if angles is None:
        return ((freqs if freqs is not None else cos, sin if freqs is None else None,
                 position_ids, cu_seqlens, start_positions), (freqs, cos, sin))
    if not isinstance(angles, Angles) or freqs is not None or cos is not None \
            or sin is not None:
        return (None,) * 5, None
    return ((angles.turns, angles.amplitude, position_ids, cu_seqlens, start_positions),
            (angles.turns, angles.amplitude))


def _options_head(name, layout, interleaved, cp_size, cp_rank, inplace) -> tuple:
    """The options part of a signature, with their types (1 == True, but interleaved=1 is an
    error)."""
    return (name, layout, type(layout), interleaved, type(interleaved), cp_size, type(cp_size),
            cp_rank, type(cp_rank), inplace, type(inplace))


def apply_rope(x: torch.Tensor, freqs: Optional[torch.Tensor] = None, *,
               cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
               layout: str = "sbhd", interleaved: bool = False,
               start_positions: Optional[torch.Tensor] = None,
               position_ids: Optional[torch.Tensor] = None,
               cu_seqlens: Optional[torch.Tensor] = None, cp_size: int = 1, cp_rank: int = 0,
               inplace: bool = False, angles: Optional[Angles] = None) -> torch.Tensor:
    """Rotary position embedding of x with the finished Triton kernel (autograd-aware).

    Args:
        x: [S, B, H, D] (sbhd), [B, S, H, D] (bshd) or [T, H, D] (thd); any strides (no copy is
            made); fp16, bf16, fp32 (math in fp32) or fp64 (math in fp64).
        freqs: angles [P, 1, 1, R] (TE's convention) or [P, R], float32 (or float64); sin/cos
            are computed in the kernel.
        cos, sin: instead of freqs, a table [P, R] of any float dtype (both the same).
        angles: instead of a table, `ropelib.frequencies.rope_angles(...)`: the kernel computes
            every angle from the position, reduced exactly (within an fp32 ulp at positions up
            to 2^31 - 2), and multiplies cos and sin by its attention scaling (YaRN's).
        layout: "sbhd", "bshd" or "thd".
        interleaved: pair features (2j, 2j+1) instead of (j, j + R/2).
        start_positions: [B] (or [n_seq] for thd) offsets added to every position (KV cache).
        position_ids: explicit positions, [S], [B, S] or [T]; replaces the implicit ones.
        cu_seqlens: [n_seq + 1] cumulative global sequence lengths for thd (TE's convention).
        cp_size, cp_rank: context parallelism with TE's dual-chunk split.
        inplace: write the result into x (features R.. untouched); x must not self-overlap.

    Returns:
        A tensor shaped like x (contiguous in `layout`), or x itself when inplace. Features
        R..D-1 are passed through unchanged.

    A position outside the table gives NaN in the rows it touches; see
    ropelib.set_index_checks for when index values are checked on the host instead.
    """
    sig = None
    if eager.active():      # plain eager: a signature checked and planned before runs as it was
        tables_and_index, tables = _kernel_reads(freqs, cos, sin, angles, position_ids,
                                                 cu_seqlens, start_positions)
        if tables is not None:
            sig = eager.signature(_options_head("rope" if angles is None else "rope_angles",
                                                layout, interleaved, cp_size, cp_rank, inplace),
                                  (x, *tables, position_ids, cu_seqlens, start_positions))
        if sig is not None:
            planned = eager.SIGNATURES.get(sig)
            if planned is not None:
                return planned((x,), tables_and_index)
    V.check_bool(inplace, "inplace")
    table, sin_t, *index, S, B, R, P = checked_call(
        x, freqs, cos, sin, angles, layout, interleaved, start_positions, position_ids,
        cu_seqlens, cp_size, cp_rank, "x", True, ("freqs", "cos", "sin"))
    check_no_table_grad(("freqs" if freqs is not None else "cos", table), ("sin", sin_t))
    if inplace:
        check_in_place(x, "x")
    if sig is not None:
        c = Call(table, sin_t, *index, layout, interleaved, cp_size, cp_rank, S, B, R)
        planned = eager.SIGNATURES.put(sig, plan_eager_call(
            (x,), tables_and_index, (table, sin_t), c, inplace=inplace, rows=P, names=("x",)))
        return planned((x,), tables_and_index, checked=True)
    # traced (torch.compile, export, ...): ropelib's operators
    grad = needs_grad(x)
    if inplace and not grad:
        ops.rope_inplace_overload(x, table, sin_t, *index, layout, interleaved, cp_size, cp_rank)
        return x
    tensors = [table, sin_t, *index]
    if grad:
        tensors = [saveable(t) for t in tensors]
    y = ops.rope_overload(x, *tensors, layout, interleaved, cp_size, cp_rank, False, None)
    if inplace:   # under autograd: an ordinary in-place copy, which autograd tracks (views too)
        return x.copy_(y)
    return y


def apply_rope_qk(q: torch.Tensor, k: torch.Tensor, freqs: Optional[torch.Tensor] = None, *,
                  cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
                  k_freqs: Optional[torch.Tensor] = None, k_cos: Optional[torch.Tensor] = None,
                  k_sin: Optional[torch.Tensor] = None, layout: str = "sbhd",
                  interleaved: bool = False, start_positions=None, position_ids=None,
                  cu_seqlens=None, cp_size: int = 1, cp_rank: int = 0,
                  inplace: bool = False, angles: Optional[Angles] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in one launch (same positions; head counts may differ, as in GQA).

    Same arguments as apply_rope; k_freqs (or k_cos/k_sin) give k its own table of the same
    rotary dim, otherwise k uses q's (with `angles`, k uses the same angles); with its own
    table k is rotated by a launch of its own. Returns (q_out, k_out).
    """
    own_k_table = k_freqs is not None or k_cos is not None or k_sin is not None
    if angles is not None and own_k_table:
        raise ValueError("angles serve q and k alike: do not pass k_freqs, k_cos or k_sin "
                         "with angles")
    sig = None
    if eager.active() and not own_k_table:     # plain eager: as in apply_rope
        tables_and_index, tables = _kernel_reads(freqs, cos, sin, angles, position_ids,
                                                 cu_seqlens, start_positions)
        if tables is not None:
            sig = eager.signature(_options_head(
                "rope_qk" if angles is None else "rope_qk_angles", layout, interleaved, cp_size,
                cp_rank, inplace), (q, k, *tables, position_ids, cu_seqlens, start_positions))
        if sig is not None:
            planned = eager.SIGNATURES.get(sig)
            if planned is not None:
                return planned((q, k), tables_and_index)
    V.check_bool(inplace, "inplace")
    table, sin_t, *index, S, B, R, P = checked_call(
        q, freqs, cos, sin, angles, layout, interleaved, start_positions, position_ids,
        cu_seqlens, cp_size, cp_rank, "q", True, ("freqs", "cos", "sin"))
    V.check_tensor(k, "k", dims=None, dtypes=V.FLOAT_DTYPES)
    V.check_layout(k, layout, "k")
    V.check_kernel_device(k, "k")
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q is on {q.device} but k is on {k.device}")
    k4 = ops.view4(k, layout)
    if (k4.shape[0], k4.shape[1], k.shape[-1]) != (S, B, q.shape[-1]):
        raise ValueError(f"q and k must agree in sequence, batch and head dim, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    check_no_table_grad(("freqs" if freqs is not None else "cos", table), ("sin", sin_t))
    if own_k_table:
        opts = dict(layout=layout, interleaved=interleaved, start_positions=start_positions,
                    position_ids=position_ids, cu_seqlens=cu_seqlens, cp_size=cp_size,
                    cp_rank=cp_rank)
        # every check of both before either is written: k's table as apply_rope checks it
        ck = prepare(k, k_freqs, cos=k_cos, sin=k_sin, name="k",
                     table_names=("k_freqs", "k_cos", "k_sin"), **opts)
        if ck.R != R or (ck.sin is None) != (sin_t is None):
            raise ValueError("q's and k's tables must have the same rotary dim and kind "
                             "(angles or cos/sin)")
        check_no_table_grad(("k_freqs" if k_freqs is not None else "k_cos", ck.table),
                            ("k_sin", ck.sin))
        if inplace:
            check_qk_in_place(q, k)
        return (apply_rope(q, freqs, cos=cos, sin=sin, inplace=inplace, **opts),
                apply_rope(k, k_freqs, cos=k_cos, sin=k_sin, inplace=inplace, **opts))
    if inplace:
        check_qk_in_place(q, k)
    if sig is not None:
        c = Call(table, sin_t, *index, layout, interleaved, cp_size, cp_rank, S, B, R)
        planned = eager.SIGNATURES.put(sig, plan_eager_call(
            (q, k), tables_and_index, (table, sin_t), c, inplace=inplace, rows=P,
            names=("q", "k")))
        return planned((q, k), tables_and_index, checked=True)
    grad = needs_grad(q, k)
    if inplace and not grad:
        ops.rope_qk_inplace_overload(q, k, table, sin_t, *index, layout, interleaved, cp_size,
                                     cp_rank)
        return q, k
    tensors = [table, sin_t, *index]
    if grad:
        tensors = [saveable(t) for t in tensors]
    q_out, k_out = ops.rope_qk_overload(q, k, *tensors, layout, interleaved, cp_size, cp_rank,
                                        False, None)
    if inplace:
        return q.copy_(q_out), k.copy_(k_out)
    return q_out, k_out
