"""Public entry points: apply_rope and apply_rope_qk (autograd-aware), on the finished kernel.

A call is planned once (validate, map x to the kernel's [S, B, H, D] view, build the table and
position specs), then the same plan runs forward (+theta) and backward (-theta).
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from . import validation as V
from .kernels.launch import Positions, Segment, Table, launch


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
    pos = Positions(cp_size=cp_size, cp_rank=cp_rank)
    checkable = V.values_checkable(x)

    if position_ids is not None:
        if start_positions is not None or cp_size > 1 or cu_seqlens is not None:
            raise ValueError("position_ids gives every token's position: do not combine it with "
                             "start_positions, cp_size > 1 or cu_seqlens")
        V.check_int_tensor(position_ids, "position_ids", dims=(1, 2))
        p = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
        if layout == "thd" and position_ids.dim() != 1:
            raise ValueError(f"position_ids for layout='thd' must be [T], got {tuple(position_ids.shape)}")
        if p.shape[1] != S or p.shape[0] not in (1, B):
            raise ValueError(f"position_ids must be [S={S}] or [B={B}, S={S}] (or [1, S]), "
                             f"got {tuple(position_ids.shape)}")
        if checkable and p.numel():
            V.remembered(position_ids, ("position_ids", P), lambda: _check_range(
                p, P, "position_ids must lie in [0, {P}) (the table has {P} rows), "
                "got values in [{lo}, {hi}]"))
        pos.explicit = p
        return Plan(layout, S, B, D, R, table, pos, interleaved)

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
            p = V.remembered(cu_seqlens, ("thd", S, cp_size, cp_rank, P, checkable), thd_positions)
        else:
            p = thd_positions()
        pos.explicit = p
        return Plan(layout, S, B, D, R, table, pos, interleaved)

    if cu_seqlens is not None:
        raise ValueError(f"cu_seqlens is only for layout='thd', got layout={layout!r}")
    if cp_size > 1 and S % 2:
        raise ValueError(f"with cp_size={cp_size} the local sequence length must be even "
                         f"(two chunks per rank), got {S}")
    if start_positions is not None:
        if start_positions.shape[0] != B:
            raise ValueError(f"start_positions must have one entry per batch entry ({B}), "
                             f"got {start_positions.shape[0]}")
        pos.start = start_positions
        if checkable and B:
            V.remembered(start_positions, ("start", S * cp_size, P), lambda: _check_range(
                start_positions, P - S * cp_size + 1,
                "start_positions + seq_len*cp_size must fit in the table of " f"{P} rows, got "
                "start_positions in [{lo}, {hi}] with " f"seq_len={S}, cp_size={cp_size}"))
    elif S * cp_size > P:
        raise ValueError(f"the table (freqs/cos) has {P} positions but the input needs "
                         f"seq_len*cp_size = {S}*{cp_size} = {S * cp_size}")
    return Plan(layout, S, B, D, R, table, pos, interleaved)


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


class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pl: Plan, inplace: bool):
        x4 = _view4(x, pl.layout)
        if inplace:
            _run(pl, [Segment.of(x4, x4)], backward=False, copy_pass=False)
            ctx.mark_dirty(x)
            y = x
        else:
            y = _out_like(x, pl.out_dtype)
            _run(pl, [Segment.of(x4, _view4(y, pl.layout))], backward=False, copy_pass=True)
        ctx.pl, ctx.x_dtype = pl, x.dtype
        return y

    @staticmethod
    def backward(ctx, g):
        pl = ctx.pl
        gx = _out_like(g, ctx.x_dtype)
        _run(pl, [Segment.of(_view4(g, pl.layout), _view4(gx, pl.layout))],
             backward=True, copy_pass=True)
        return gx, None, None


class _RopeQKFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, pq: Plan, pk: Plan, inplace: bool):
        q4, k4 = _view4(q, pq.layout), _view4(k, pq.layout)
        if inplace:
            _run(pq, [Segment.of(q4, q4), Segment.of(k4, k4)], backward=False,
                 copy_pass=False, k_plan=pk)
            ctx.mark_dirty(q, k)
            qo, ko = q, k
        else:
            qo, ko = _out_like(q, pq.out_dtype), _out_like(k, pq.out_dtype)
            _run(pq, [Segment.of(q4, _view4(qo, pq.layout)), Segment.of(k4, _view4(ko, pq.layout))],
                 backward=False, copy_pass=True, k_plan=pk)
        ctx.plans, ctx.x_dtype = (pq, pk), q.dtype
        return qo, ko

    @staticmethod
    def backward(ctx, gq, gk):
        pq, pk = ctx.plans
        segs, outs = [], []
        for g in (gq, gk):
            if g is None:
                outs.append(None)
                continue
            gx = _out_like(g, ctx.x_dtype)
            segs.append(Segment.of(_view4(g, pq.layout), _view4(gx, pq.layout)))
            outs.append(gx)
        if gq is not None and gk is not None:
            _run(pq, segs, backward=True, copy_pass=True, k_plan=pk)
        elif gq is not None:
            _run(pq, segs, backward=True, copy_pass=True)
        elif gk is not None:
            _run(pk, segs, backward=True, copy_pass=True)
        return outs[0], outs[1], None, None, None


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
    """
    pl = plan(x, freqs, cos=cos, sin=sin, layout=layout, interleaved=interleaved,
              start_positions=start_positions, position_ids=position_ids, cu_seqlens=cu_seqlens,
              cp_size=cp_size, cp_rank=cp_rank)
    if inplace:
        _check_inplace(x, "x")
    return _RopeFn.apply(x, pl, bool(inplace))


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
    opts = dict(layout=layout, interleaved=interleaved, start_positions=start_positions,
                position_ids=position_ids, cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
    pq = plan(q, freqs, cos=cos, sin=sin, name="q", **opts)
    if k_freqs is None and k_cos is None and k_sin is None:
        k_freqs, k_cos, k_sin = freqs, cos, sin
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
        if q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr():
            raise ValueError("inplace=True with q and k sharing storage is ambiguous; pass inplace=False")
    return _RopeQKFn.apply(q, k, pq, pk, bool(inplace))
