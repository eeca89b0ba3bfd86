"""Public entry points: apply_rope and apply_rope_qk (autograd-aware), on the finished kernel.

A call is planned once (validate, map x to the kernel's [S, B, H, D] view, build the table and
position specs), then the same plan runs forward (+theta) and backward (-theta).
"""
import os
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch

from . import validation as V
from .kernels.launch import Positions, Segment, Table, launch, prepare


@dataclass
class Plan:
    layout: str
    S: int
    B: int
    D: int
    R: int
    table: Table
    pos: Positions
    interleaved: bool
    out_dtype: Optional[torch.dtype] = None   # None: x's dtype (HF promotes with cos's dtype)


def _view4(t: torch.Tensor, layout: str) -> torch.Tensor:
    """x in `layout` -> a [S, B, H, D] view of the same memory."""
    if layout == "sbhd":
        return t
    if layout == "bshd":
        return t.transpose(0, 1)
    if layout == "bhsd":    # Hugging Face's [B, H, S, D] (internal)
        return t.permute(2, 0, 1, 3)
    return t.unsqueeze(1)   # thd -> [T, 1, H, D]


def _table(freqs, cos, sin, x: torch.Tensor, name="freqs") -> Tuple[Table, int]:
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    if freqs is not None:
        if cos is not None or sin is not None:
            raise ValueError("pass either freqs (angles) or cos and sin (a table), not both")
        f = V.table_2d(freqs, name)
        if f.dtype != compute:
            f = f.to(compute)   # TE's convention: angles in fp32 (fp64 for fp64 inputs)
        return Table(f, None, f.shape[0], f.stride(0), 0, f.stride(1)), f.shape[1]
    if cos is None or sin is None:
        raise ValueError("pass freqs (angles [P, 1, 1, R] or [P, R]) or both cos and sin ([P, R])")
    c, s = V.cos_sin_pair(V.table_2d(cos, "cos"), V.table_2d(sin, "sin"))
    return Table(c, s, c.shape[0], c.stride(0), 0, c.stride(1)), c.shape[1]


def _thd_positions(cu: torch.Tensor, T: int, start, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Per-token positions [1, T] for packed sequences, computed on the device (no sync)."""
    cu = cu.to(torch.int64) // cp_size
    lens = cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(lens.shape[0], device=cu.device), lens,
                                  output_size=T)
    idx = torch.arange(T, device=cu.device) - cu[seq]
    if cp_size > 1:
        seg = lens[seq] // 2
        idx = torch.where(idx < seg, cp_rank * seg + idx,
                          cp_size * lens[seq] - (cp_rank + 1) * seg + (idx - seg))
    if start is not None:
        idx = idx + start.to(torch.int64)[seq]
    return idx.to(torch.int32).unsqueeze(0)


def _check_range(t: torch.Tensor, limit: int, message: str) -> None:
    """Raise ValueError(message) unless every value of t lies in [0, limit) (one device read)."""
    lo, hi = torch.stack([t.min(), t.max()]).tolist()
    if lo < 0 or hi >= limit:
        raise ValueError(message.format(lo=lo, hi=hi, P=limit))


def plan(x: torch.Tensor, freqs=None, *, cos=None, sin=None, layout="sbhd", interleaved=False,
         start_positions=None, position_ids=None, cu_seqlens=None, cp_size=1, cp_rank=0,
         name="x", kernel_device=True) -> Plan:
    """Validate one call and build its kernel plan. Raises before anything runs.

    kernel_device=False skips the check that a Triton kernel can run on x's device (for the
    plain-PyTorch paths that share these checks)."""
    V.check_tensor(x, name)
    V.check_layout(x, layout, name)
    if kernel_device:
        V.check_kernel_device(x, name)
    V.check_cp(cp_size, cp_rank)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {interleaved!r}")
    V.check_same_device(x, name, freqs=freqs, cos=cos, sin=sin, start_positions=start_positions,
                        position_ids=position_ids, cu_seqlens=cu_seqlens)
    table, R = _table(freqs, cos, sin, x)
    D = x.shape[-1]
    V.check_rotary_dim(R, D, "freqs" if freqs is not None else "cos")
    x4 = _view4(x, layout)
    S, B = x4.shape[0], x4.shape[1]
    P = table.length
    if position_ids is not None:
        if start_positions is not None or cp_size > 1 or cu_seqlens is not None:
            raise ValueError("position_ids gives every token's position: do not combine it with "
                             "start_positions, cp_size > 1 or cu_seqlens")
        V.check_int_tensor(position_ids, "position_ids", dims=(1, 2))
        if layout == "thd" and position_ids.dim() != 1:
            raise ValueError(f"position_ids for layout='thd' must be [T], got {tuple(position_ids.shape)}")
        p = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
        if p.shape[1] != S or p.shape[0] not in (1, B):
            raise ValueError(f"position_ids must be [S={S}] or [B={B}, S={S}] (or [1, S]), "
                             f"got {tuple(position_ids.shape)}")
    else:
        if start_positions is not None:
            V.check_int_tensor(start_positions, "start_positions", dims=(1,))
        if layout == "thd":
            if cu_seqlens is None:
                raise ValueError("cu_seqlens must be given when layout is 'thd' "
                                 "(or pass position_ids with every token's position)")
            V.check_int_tensor(cu_seqlens, "cu_seqlens", dims=(1,))
            n_seq = cu_seqlens.shape[0] - 1
            if start_positions is not None and start_positions.shape[0] != n_seq:
                raise ValueError(f"start_positions must have one entry per sequence ({n_seq}), "
                                 f"got {start_positions.shape[0]}")
        elif cu_seqlens is not None:
            raise ValueError(f"cu_seqlens is only for layout='thd', got layout={layout!r}")
        elif cp_size > 1 and S % 2:
            raise ValueError(f"with cp_size={cp_size} the local sequence length must be even "
                             f"(two chunks per rank), got {S}")
        elif start_positions is not None and start_positions.shape[0] != B:
            raise ValueError(f"start_positions must have one entry per batch entry ({B}), "
                             f"got {start_positions.shape[0]}")
        elif start_positions is None and S * cp_size > P:
            raise ValueError(f"the table (freqs/cos) has {P} positions but the input needs "
                             f"seq_len*cp_size = {S}*{cp_size} = {S * cp_size}")
    pos = positions(x, layout, S, B, P, start_positions, position_ids, cu_seqlens, cp_size, cp_rank)
    return Plan(layout, S, B, D, R, table, pos, interleaved)


def positions(x, layout, S, B, P, start_positions, position_ids, cu_seqlens, cp_size,
              cp_rank) -> Positions:
    """The part of a plan that depends on index *values*: checks and derived positions.

    Arguments are already validated for shape and dtype (plan). Value checks read the device
    once per index tensor object and version (validation.remembered) and are skipped while a
    CUDA graph is being captured.
    """
    pos = Positions(cp_size=cp_size, cp_rank=cp_rank)
    if position_ids is None and start_positions is None and cu_seqlens is None:
        return pos
    checkable = V.values_checkable(x)
    if position_ids is not None:
        p = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
        if checkable and p.numel():
            V.remembered(position_ids, ("position_ids", P), lambda: _check_range(
                p, P, "position_ids must lie in [0, {P}) (the table has {P} rows), "
                "got values in [{lo}, {hi}]"))
        pos.explicit = p
    elif layout == "thd":
        def thd_positions():
            p = _thd_positions(cu_seqlens, S, start_positions, cp_size, cp_rank)
            if checkable and p.numel():
                _check_range(p, P, "the positions used ({lo}..{hi}, from cu_seqlens, "
                             "start_positions and cp) must lie inside the table of {P} rows")
            return p
        if checkable:
            V.remembered(cu_seqlens, ("cu_seqlens", S, cp_size),
                         lambda: V.check_cu_seqlens(cu_seqlens, S, cp_size))
        if start_positions is None:   # derived once per cu_seqlens object and version
            pos.explicit = V.remembered(cu_seqlens, ("thd", S, cp_size, cp_rank, P, checkable),
                                        thd_positions)
        else:
            pos.explicit = thd_positions()
    elif start_positions is not None:
        pos.start = start_positions
        if checkable and B:
            V.remembered(start_positions, ("start", S * cp_size, P), lambda: _check_range(
                start_positions, P - S * cp_size + 1,
                "start_positions + seq_len*cp_size must fit in the table of " f"{P} rows, got "
                "start_positions in [{lo}, {hi}] with " f"seq_len={S}, cp_size={cp_size}"))
    return pos


def _run(pl: Plan, segs, *, backward: bool, copy_pass: bool, k_plan: Optional[Plan] = None,
         v: Optional[Segment] = None) -> None:
    if pl.S == 0 or pl.B == 0:
        return
    q = segs[0]
    k = segs[1] if len(segs) > 1 else None
    launch(q, pl.table, pl.pos, S=pl.S, B=pl.B, R=pl.R, D=pl.D, interleaved=pl.interleaved,
           backward=backward, copy_pass=copy_pass, k=k,
           k_table=k_plan.table if k_plan is not None else None, v=v)


def _out_like(x: torch.Tensor, dtype=None) -> torch.Tensor:
    return torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)


# --- calls: a plan without its tensors, run again for every call of the same signature --------

def _bare(pl: Plan) -> Plan:
    """pl without references to tensors (a cached call must not keep a caller's tensors alive)."""
    return replace(pl, table=replace(pl.table, c=None, s=None),
                   pos=replace(pl.pos, explicit=None, start=None))


class _Call:
    """One call signature of apply_rope / apply_rope_qk: plans and compiled launches.

    The tensors of a call are bound per call: `tabs` = ((cos or angles, sin or None) of q,
    the same of k, (explicit positions, start positions)). A call is *reusable* when the
    kernel's pointer arguments are exactly those tensors (no table had to be converted or made
    contiguous); then every later call with the same signature (the key apply_rope builds
    from _sig and _options) runs its launches without planning again.
    """

    def __init__(self, pq: Plan, pk: Optional[Plan], inplace: bool):
        self.pq, self.pk = _bare(pq), (_bare(pk) if pk is not None else None)
        self.inplace = inplace
        self.empty = pq.S == 0 or pq.B == 0
        self.fwd = {}          # table flags -> Prepared forward launch
        self.bwd = {}          # (gradient signatures, table flags) -> Prepared backward launch
        self.reusable = True

    def _bind(self, pl: Plan, tab, pos) -> tuple:
        return (replace(pl.table, c=tab[0], s=tab[1], same_halves=tab[2]),
                replace(pl.pos, explicit=pos[0], start=pos[1]))

    @staticmethod
    def _pointers(q, qo, k, ko, tab, ktab, pos):
        """The kernel's 12 pointer arguments, in launch.prepare's order."""
        c, s = tab[0], tab[1] if tab[1] is not None else tab[0]
        kc, ks = ktab[0], ktab[1] if ktab[1] is not None else ktab[0]
        return (q, qo, k, ko, q, qo, c, s, kc, ks,
                pos[0] if pos[0] is not None else q, pos[1] if pos[1] is not None else q)

    def _launch(self, cached, pairs, tabs, *, backward: bool, k_only: bool = False):
        """Run one launch over pairs [(in, out)] (q, then k); cached: the Prepared or None."""
        tab, ktab, pos = tabs
        if len(pairs) == 1:
            (a, b), = pairs
            if k_only:
                tab = ktab
            ptrs = self._pointers(a, b, a, b, tab, tab, pos)
        else:
            (a, b), (ka, kb) = pairs
            ptrs = self._pointers(a, b, ka, kb, tab, ktab, pos)
        if cached is not None:
            cached.run(ptrs)
            return cached
        pl = self.pk if k_only else self.pq
        table, position = self._bind(pl, tab, pos)
        segs = [Segment.of(_view4(i, pl.layout), _view4(o, pl.layout)) for i, o in pairs]
        k_table = self._bind(self.pk, ktab, pos)[0] if len(pairs) == 2 else None
        prepared, tensors = prepare(
            segs[0], table, position, S=pl.S, B=pl.B, R=pl.R, D=pl.D,
            interleaved=pl.interleaved, backward=backward, copy_pass=backward or not self.inplace,
            k=segs[1] if len(segs) > 1 else None, k_table=k_table)
        prepared.run(tensors)
        same = all(a.data_ptr() == b.data_ptr() and a.dtype == b.dtype
                   for a, b in zip(tensors, ptrs))
        if not same:
            self.reusable = False
        return prepared if same else None

    def forward(self, xs, tabs):
        """Rotate xs (one tensor, or q and k) by +theta; returns the outputs."""
        pl = self.pq
        outs = xs if self.inplace else tuple(_out_like(x, pl.out_dtype) for x in xs)
        if not self.empty:
            flags = (tabs[0][2], tabs[1][2])
            prepared = self._launch(self.fwd.get(flags), list(zip(xs, outs)), tabs, backward=False)
            if prepared is not None:
                self.fwd[flags] = prepared
        return outs

    def backward(self, gs, x_dtype, tabs):
        """Gradients of the inputs from gs (None where no gradient flows): rotate by -theta."""
        outs = [None if g is None else _out_like(g, x_dtype) for g in gs]
        if self.empty or all(g is None for g in gs):
            return outs
        k_only = gs[0] is None
        key = (tuple(None if g is None else (g.stride(), g.dtype, g.data_ptr() & 15 == 0)
                     for g in gs), tabs[0][2], tabs[1][2])
        pairs = [(g, o) for g, o in zip(gs, outs) if g is not None]
        prepared = self._launch(self.bwd.get(key), pairs, tabs, backward=True, k_only=k_only)
        if prepared is not None and len(self.bwd) < 16:
            self.bwd[key] = prepared
        return outs


class _RopeFn(torch.autograd.Function):
    """x (one tensor, or q and k) -> rotated; backward rotates the gradients back."""

    @staticmethod
    def forward(ctx, call: _Call, tabs, *xs):
        outs = call.forward(xs, tabs)
        if call.inplace:
            ctx.mark_dirty(*xs)
        ctx.call, ctx.tabs, ctx.x_dtype = call, tabs, xs[0].dtype
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *gs):
        return (None, None, *ctx.call.backward(gs, ctx.x_dtype, ctx.tabs))


def _apply(call: _Call, tabs, *xs):
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return _RopeFn.apply(call, tabs, *xs)
    outs = call.forward(xs, tabs)
    if call.inplace:
        for x in xs:
            torch.autograd.graph.increment_version(x)
    return outs if len(outs) > 1 else outs[0]


# Tables whose paired columns hold equal values (TE's freqs: cat([f, f]) for rotate-half,
# repeat_interleave(f, 2) for interleaved) are read and evaluated once per pair in the kernel.
# Checked once per table tensor and version (one device read); ROPELIB_SAME_HALVES=0 turns it off.
SAME_HALVES: bool = os.environ.get("ROPELIB_SAME_HALVES", "1") == "1"


def _equal_halves(t: torch.Tensor, R: int, interleaved: bool) -> bool:
    t = V.table_2d(t, "table")
    a, b = (t[:, 0:R:2], t[:, 1:R:2]) if interleaved else (t[:, :R // 2], t[:, R // 2:R])
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return torch.equal(a.view(bits), b.view(bits))   # bitwise: -0.0 and 0.0 differ


def _same_halves(c, s, R: int, interleaved: bool) -> bool:
    if not SAME_HALVES or c.numel() == 0 or not V.values_checkable(c):
        return False
    key = ("halves", R, interleaved)
    return all(V.remembered(t, key, lambda t=t: _equal_halves(t, R, interleaved))
               for t in (c, s) if t is not None)


def _given(freqs, cos, sin) -> tuple:
    """The caller's tables as (cos or angles, sin or None)."""
    return (freqs, None) if freqs is not None else (cos, sin)


def _tab(freqs, cos, sin, R: int, interleaved: bool):
    c, s = _given(freqs, cos, sin)
    return c, s, _same_halves(c, s, R, interleaved)


def _plan_tabs(pl: Plan, given: tuple):
    """The plan's tables; inspected for equal halves only when they are the given tensors, and
    then through the given objects (a converted copy, or the plan's view, is new on every call:
    inspecting it would cost a device read per call)."""
    t = pl.table
    same = _same_tensors((t.c, t.s), given) and _same_halves(*given, pl.R, pl.interleaved)
    return t.c, t.s, same


def _same_tensors(planned, given) -> bool:
    """Did the plan use the given tables as they are (views of the same memory and dtype)?

    Only then can a later call pass its own tables straight to the kernel."""
    return all((a is None and b is None) or (a is not None and b is not None
               and a.data_ptr() == b.data_ptr() and a.dtype == b.dtype)
               for a, b in zip(planned[:2], given[:2]))


def _bound_positions(x, pl: Plan, P: int, start_positions, position_ids, cu_seqlens, cp_size,
                     cp_rank) -> tuple:
    """(explicit positions, start positions) of a cached call: its index tensors checked and
    derived (positions(), remembered per tensor), or (None, None) when it has none."""
    if start_positions is None and position_ids is None and cu_seqlens is None:
        return None, None
    p = positions(x, pl.layout, pl.S, pl.B, P, start_positions, position_ids, cu_seqlens,
                  cp_size, cp_rank)
    return p.explicit, p.start


def _sig(t):
    """What a launch depends on, of one (optional) tensor argument: not its data."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15 == 0)


def _options(layout, interleaved, cp_size, cp_rank, inplace) -> tuple:
    """The options part of a signature, with types: 1 == True, but interleaved=1 is an error."""
    return (type(layout), layout, type(interleaved), interleaved, type(cp_size), cp_size,
            type(cp_rank), cp_rank, bool(inplace))


# Calls by signature: positional tensors' signatures, then the options. Bounded; no tensors.
_CALLS: dict = {}
_MAX_CALLS = 1024


def _remember(key, call: _Call) -> None:
    if key is None or not call.reusable:
        return
    if len(_CALLS) >= _MAX_CALLS:
        _CALLS.clear()
    _CALLS[key] = call


def clear_cache() -> None:
    """Forget every planned call (they are re-planned, and re-validated, on next use)."""
    _CALLS.clear()


def _check_inplace(x: torch.Tensor, name: str) -> None:
    if not V.non_overlapping(x):
        raise ValueError(f"inplace=True needs {name} without overlapping memory (an expand()ed or "
                         "stride-0 view would be written twice); pass inplace=False")


def apply_rope(x: torch.Tensor, freqs: Optional[torch.Tensor] = None, *,
               cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
               layout: str = "sbhd", interleaved: bool = False,
               start_positions: Optional[torch.Tensor] = None,
               position_ids: Optional[torch.Tensor] = None,
               cu_seqlens: Optional[torch.Tensor] = None, cp_size: int = 1, cp_rank: int = 0,
               inplace: bool = False) -> torch.Tensor:
    """Rotary position embedding of x with the finished Triton kernel (autograd-aware).

    Args:
        x: [S, B, H, D] (sbhd), [B, S, H, D] (bshd) or [T, H, D] (thd); any strides (no copy is
            made); fp16, bf16, fp32 (math in fp32) or fp64 (math in fp64).
        freqs: angles [P, 1, 1, R] (TE's convention) or [P, R]; sin/cos computed in the kernel.
        cos, sin: instead of freqs, a table [P, R] of any float dtype.
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

    The first call with given shapes, strides, dtypes, alignment and options is validated and
    planned in full; later calls like it reuse the plan and the compiled launch (clear_cache()
    forgets them) and only re-check index tensors they have not seen before.
    """
    try:
        key = (_sig(x), _sig(freqs), _sig(cos), _sig(sin), _sig(start_positions),
               _sig(position_ids), _sig(cu_seqlens), _options(layout, interleaved, cp_size,
                                                              cp_rank, inplace))
        call = _CALLS.get(key)
    except Exception:   # not tensors, or unhashable options: the full checks will say what
        key = call = None
    if call is not None:
        pl = call.pq
        pos = _bound_positions(x, pl, pl.table.length, start_positions, position_ids, cu_seqlens,
                               cp_size, cp_rank)
        tab = _tab(freqs, cos, sin, pl.R, pl.interleaved)
        return _apply(call, (tab, tab, pos), x)
    pl = plan(x, freqs, cos=cos, sin=sin, layout=layout, interleaved=interleaved,
              start_positions=start_positions, position_ids=position_ids, cu_seqlens=cu_seqlens,
              cp_size=cp_size, cp_rank=cp_rank)
    if inplace:
        _check_inplace(x, "x")
    call = _Call(pl, None, bool(inplace))
    given = _given(freqs, cos, sin)
    tab = _plan_tabs(pl, given)
    out = _apply(call, (tab, tab, (pl.pos.explicit, pl.pos.start)), x)
    if _same_tensors(tab, given):
        _remember(key, call)
    return out


def apply_rope_qk(q: torch.Tensor, k: torch.Tensor, freqs: Optional[torch.Tensor] = None, *,
                  cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
                  k_freqs: Optional[torch.Tensor] = None, k_cos: Optional[torch.Tensor] = None,
                  k_sin: Optional[torch.Tensor] = None, layout: str = "sbhd",
                  interleaved: bool = False, start_positions=None, position_ids=None,
                  cu_seqlens=None, cp_size: int = 1, cp_rank: int = 0,
                  inplace: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in one launch (same positions; head counts may differ, as in GQA).

    Same arguments as apply_rope; k_freqs (or k_cos/k_sin) give k its own table of the same
    rotary dim, otherwise k uses q's. Returns (q_out, k_out).
    """
    if k_freqs is None and k_cos is None and k_sin is None:
        k_freqs, k_cos, k_sin = freqs, cos, sin
    try:
        key = (_sig(q), _sig(k), _sig(freqs), _sig(cos), _sig(sin), _sig(k_freqs), _sig(k_cos),
               _sig(k_sin), _sig(start_positions), _sig(position_ids), _sig(cu_seqlens),
               _options(layout, interleaved, cp_size, cp_rank, inplace))
        call = _CALLS.get(key)
    except Exception:
        key = call = None
    if call is not None and not (inplace and _share_storage(q, k)):
        pl = call.pq
        pos = _bound_positions(q, pl, min(pl.table.length, call.pk.table.length),
                               start_positions, position_ids, cu_seqlens, cp_size, cp_rank)
        R, il = pl.R, pl.interleaved
        return _apply(call, (_tab(freqs, cos, sin, R, il), _tab(k_freqs, k_cos, k_sin, R, il), pos),
                      q, k)
    opts = dict(layout=layout, interleaved=interleaved, start_positions=start_positions,
                position_ids=position_ids, cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
    pq = plan(q, freqs, cos=cos, sin=sin, name="q", **opts)
    pk = plan(k, k_freqs, cos=k_cos, sin=k_sin, name="k", **opts)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q is on {q.device} but k is on {k.device}")
    if (pq.S, pq.B, pq.D) != (pk.S, pk.B, pk.D):
        raise ValueError(f"q and k must agree in sequence, batch and head dim, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if pq.R != pk.R or (pq.table.s is None) != (pk.table.s is None):
        raise ValueError("q's and k's tables must have the same rotary dim and kind (angles or cos/sin)")
    if inplace:
        _check_inplace(q, "q")
        _check_inplace(k, "k")
        if _share_storage(q, k):
            raise ValueError("inplace=True with q and k sharing storage is ambiguous; pass inplace=False")
    call = _Call(pq, pk, bool(inplace))
    given, kgiven = _given(freqs, cos, sin), _given(k_freqs, k_cos, k_sin)
    tab, ktab = _plan_tabs(pq, given), _plan_tabs(pk, kgiven)
    out = _apply(call, (tab, ktab, (pq.pos.explicit, pq.pos.start)), q, k)
    if _same_tensors(tab, given) and _same_tensors(ktab, kgiven):
        _remember(key, call)
    return out


def _share_storage(q: torch.Tensor, k: torch.Tensor) -> bool:
    return q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
