"""The finished RoPE kernels' planner (kernels/fused.py); what every family shares on the host
(the Launch record, how it starts, grid arithmetic) is in kernels/planning.py.

`plan(...)` turns what is to be rotated (strided [S, B, H, D] views, tables, positions, options)
into a route: a `Launch` of one of the finished kernels (by where positions come from: the grid,
the warps and every kernel argument by name), or, for large contiguous inputs, a `TwoPass`
(kernels/flat.py: a cos/sin table of the call's tokens, then a flat pass). `plan_qkv(...)` plans
Transformer Engine's packed QKV. `run(route, pointers)` starts either.
Both see only shapes, strides, dtypes and options, never tensor values, so the same code runs
eagerly, under torch.compile (sizes may be symbolic) and while a CUDA graph is captured.
Arguments are validated before they get here (ropelib.validation).
"""
from typing import NamedTuple, Optional

import torch

from ..conventions import HF_LAYOUT
from ..frequencies import EXACT_POSITIONS
from ..runtime import INTERPRET
from .direct import DirectLauncher
from .flat import (_cos_sin_rows_kernel, _rope_rows_kernel, _token_rows_kernel,
                   by_element as flat_by_element, qk_by_tokens as flat_qk_by_tokens)
from .fused import (_exact_angles_kernel, _rope_ids_kernel, _rope_kernel, _rope_packed_kernel,
                    _rope_qkv_kernel)
from .planning import (I32_LIMIT, OUT_LAYOUT, Launch, cdiv, needs_int64, pointer_dtypes,
                       pow2_at_least, pow2_at_most,
                       start)
from . import tiles as _tiles_module
from .tiles import (BATCH_LOOP_MIN, MIN_TILE, PROGRAMS_PER_SM, TILE_LOOP, TILE_NOLOOP, TILE_WIDE,
                    TWO_PASS_ELEMENTS, TWO_PASS_PAIR_WARPS, TWO_PASS_TABLE_ELEMENTS,
                    TWO_PASS_WARPS, device_index,
                    device_tiles, exact_loop_tile, launches_early)

class View(NamedTuple):
    """A tensor as the kernel addresses it: x[s, b, h, d] at s*s_ + b*b_ + head(h) + d*d_.

    head(h) = (h // hpg) * g + (h % hpg) * h_; hpg = 1 (plain tensors: g is the head stride)
    except for the q of a packed QKV, whose heads come in groups of hpg. `tensor` is the whole
    tensor the kernel reads or writes through this view ([S, B, ...]: torch.compile sees it as
    the buffer), head_dim its features per head.
    """
    tensor: torch.Tensor
    heads: int
    strides: tuple          # (s, b, g, h, d) in elements
    hpg: int = 1
    head_dim: Optional[int] = None   # None: tensor.shape[3]

    @staticmethod
    def of(t4: torch.Tensor) -> "View":
        """A plain [S, B, H, D] strided view."""
        s, b, h, d = t4.stride()
        return View(t4, t4.shape[2], (s, b, h, 0, d))

    def features(self) -> int:
        return self.tensor.shape[3] if self.head_dim is None else self.head_dim


class Table(NamedTuple):
    """Angles (sin is None) or cos and sin: [P, R] or, one per batch entry, [B or 1, P, R].

    Or no table at all (`exact`): cos is the turns [R] int64 of ropelib.frequencies.Angles and
    sin its amplitude [1]; the kernel computes every angle from the position, for positions up
    to EXACT_POSITIONS."""
    cos: torch.Tensor
    sin: Optional[torch.Tensor]
    # One table per axis (Qwen2-VL's multimodal cos/sin, read as they are by the two-pass
    # route's flat pass): cos and sin are the time axis's [B or 1, P, R], and `axes` is
    # (first pair of the height section, first pair of the width section, stride from one
    # axis's table to the next's).
    axes: Optional[tuple] = None

    @property
    def exact(self) -> bool:
        return self.cos.dtype == torch.int64

    def strides(self) -> tuple:
        """(batch, position, feature) strides; batch 0 when one table serves every entry."""
        t = self.cos
        if self.exact:
            return 0, 0, t.stride(0)
        if t.dim() == 2:
            return 0, t.stride(0), t.stride(1)
        return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1), t.stride(2)

    @property
    def rows(self):
        """Positions the table serves (valid positions are 0 .. rows - 1)."""
        return EXACT_POSITIONS if self.exact else self.cos.shape[-2]


class Positions(NamedTuple):
    """Where each token's table row comes from (one of three)."""
    position_ids: Optional[torch.Tensor] = None   # [B or 1, S] ints, any strides
    cu_seqlens: Optional[torch.Tensor] = None     # [N + 1] ints, contiguous (packed sequences)
    start: Optional[torch.Tensor] = None          # [B] or [N] ints, contiguous
    cp_size: int = 1
    cp_rank: int = 0


# --- tiles ----------------------------------------------------------------------------------

def pick_tiles(S, B, heads: tuple, R: int, D: int, elem_size: int, sm_count: Optional[int],
               tile_loop=TILE_LOOP, tile_noloop=TILE_NOLOOP, tile_wide=TILE_WIDE):
    """(BLOCK_S, BLOCK_H, B_CHUNK, num_warps) for this shape; `heads` = heads of q (and of k).

    GPU (sm_count given): a program's tile covers heads first, then tokens, sized to (elements
    per thread) x (threads). The batch is split into chunks only when there would otherwise be
    too few programs to fill the machine (decode-sized inputs); 16-bit inputs whose programs then
    loop over fewer than BATCH_LOOP_MIN batch entries take the no-loop tile. Several segments (q
    and k of GQA: 32 and 8 heads) share one BLOCK_H sized to the smallest, so none runs mostly
    masked. Interpreter (sm_count None): big tiles, since every program instance costs
    milliseconds. S and B may be symbolic: they are only compared, never converted.
    """
    row = 2 * pow2_at_least(R // 2, 1 << 30) + (pow2_at_least(D - R, 1 << 30) if D > R else 0)
    heads = tuple(h for h in heads if h)
    if sm_count is None:
        block_h = pow2_at_least(max(heads), 16)
        block_s = pow2_at_least(S, min(32, pow2_at_most(max(2048 // (block_h * row), 1))))
        return block_s, block_h, max(B, 1), 4
    want = PROGRAMS_PER_SM * sm_count
    # Under torch.compile with dynamic shapes S or B may be symbolic: then the grid is not
    # fitted to the machine (every comparison with them would become a guard, and a new length
    # a recompilation); a symbolic length is >= 2 (Dynamo specialises 0 and 1) and usually long.
    fit = not isinstance(S, torch.SymInt) and not isinstance(B, torch.SymInt)

    def tiles_for(ept, num_warps):
        target = ept * 32 * num_warps
        while True:
            block_h = pow2_at_least(min(heads), pow2_at_most(max(target // row, 1)))
            block_s = pow2_at_least(S, min(16, pow2_at_most(max(target // (block_h * row), 1))))
            tiles = cdiv(S, block_s) * sum(cdiv(h, block_h) for h in heads)
            chunk = max(B, 1) if fit else B
            while fit and chunk > 1 and tiles * cdiv(B, chunk) < want:
                chunk = cdiv(chunk, 2)
            # still too few programs with one batch entry each (decode): smaller tiles
            if not fit or chunk > 1 or tiles * B >= want or target <= MIN_TILE \
                    or block_h * block_s == 1:
                break
            target //= 2
        while cdiv(B, chunk) > 65535:
            chunk *= 2
        if block_s * block_h * row < 32 * num_warps * 4:   # tiny tiles: fewer threads
            # (a power of two, as Triton requires; with partial rotary row is not one)
            num_warps = pow2_at_most(max(1, block_s * block_h * row // 128))
        return block_s, block_h, chunk, num_warps

    if elem_size > 2:
        return tiles_for(*tile_wide)
    picked = tiles_for(*tile_loop)
    if not fit:
        return picked if isinstance(B, torch.SymInt) or B >= BATCH_LOOP_MIN \
            else tiles_for(*tile_noloop)
    return picked if picked[2] >= BATCH_LOOP_MIN else tiles_for(*tile_noloop)


# --- the planner ----------------------------------------------------------------------------

def _span(v: View, S, B, D):
    s, b, g, h, d = (abs(x) for x in v.strides)
    groups = (v.heads - 1) // v.hpg
    within = min(v.hpg, v.heads) - 1
    return (S - 1) * s + (B - 1) * b + groups * g + within * h + (D - 1) * d



def _qk_strides(v: Optional[View]) -> tuple:
    """(s, b, h, d) of a plain view (zeros without one)."""
    if v is None:
        return 0, 0, 0, 0
    s, b, h, _, d = v.strides
    return s, b, h, d


def _table_strides(table: Table) -> tuple:
    """(per entry, row stride) of a table the kernels can read: features at stride 1 and a batch
    of tables dense (the checks in ropelib.validation.kernel_table make them so)."""
    tab_b, tab_p, tab_d = table.strides()
    assert tab_d == 1, "a table's features must be contiguous"
    per_entry = tab_b != 0
    assert not per_entry or tab_b == table.rows * tab_p or table.rows == 0, \
        "a batch of tables must be dense"       # (an empty one has any strides)
    return per_entry, tab_p


def _ids_per_entry(ids: torch.Tensor, S) -> bool:
    """Whether position ids [B or 1, S] hold a row per batch entry; the kernels read them dense
    (the checks in ropelib.validation make them so; empty ones have any strides)."""
    per_entry = ids.shape[0] > 1
    assert ids.stride(-1) == 1 or S == 1, "position ids must be contiguous"
    assert not per_entry or ids.stride(0) == S or S == 0, "position ids must be contiguous"
    return per_entry


def _tiles(x: torch.Tensor, S, B, heads: tuple, R: int, D: int, exact: bool):
    on_gpu = x.device.type == "cuda" and not INTERPRET
    sm, knobs = device_tiles(device_index(x.device)) if on_gpu else (None, {})
    if exact and on_gpu:
        knobs = dict(knobs, tile_loop=exact_loop_tile(device_index(x.device)))
    return pick_tiles(S, B, heads, R, D, x.element_size(), sm, **knobs)


def plan(q: View, q_out: Optional[View], table: Table, positions: Positions, *, R: int,
         interleaved: bool, backward: bool, layout: str, k: Optional[View] = None,
         k_out: Optional[View] = None, tiles: Optional[tuple] = None, rows_kept: bool = False):
    """One launch over q (and k): (Launch, its pointer arguments in its kernel's order).

    q and k are the [S, B, H, D] views the kernel reads; q_out and k_out the outputs in
    `layout`, or None to rotate in place: fresh contiguous tensors, or column slices of one
    token-major buffer, both with the same token row stride (`output_row`; the finished kernel
    only: explicit `tiles`, or a call the two-pass route does not take). `table` serves q and k. Which of the
    kernels runs follows from where positions come from: the token index (with start offsets
    and context parallelism), position ids, or packed sequences. Large contiguous inputs take
    the two-pass route instead (takes_two_passes); explicit `tiles` keep the finished kernel.
    `rows_kept`: an eager call, whose route keeps the pre-pass's rows between calls.
    """
    if tiles is None and takes_two_passes(q, q_out, k, k_out, table, positions, layout,
                                          rows_kept):
        return plan_two_pass(q, q_out, table, positions, R=R, interleaved=interleaved,
                             backward=backward, layout=layout, k=k, k_out=k_out,
                             rows_kept=rows_kept)
    assert table.axes is None, "per-axis tables are read by the two-pass route only"
    x = q.tensor
    S, B, D = x.shape[0], x.shape[1], q.features()
    HK = k.heads if k is not None else 0
    out_row = output_row(q_out, k_out, layout)
    assert out_row is not None, "the outputs must be contiguous, or token rows of one stride"
    block_s, block_h, chunk, num_warps = tiles or _tiles(x, S, B, (q.heads, HK), R, D,
                                                         table.exact)
    grid = (cdiv(S, block_s), cdiv(q.heads, block_h) + cdiv(HK, block_h), cdiv(B, chunk))
    views = [v for v in (q, q_out, k, k_out) if v is not None]
    int64 = any(_span(v, S, B, D) > I32_LIMIT - 1024 for v in views)
    per_entry, tab_p = _table_strides(table)
    qs, ks = _qk_strides(q), _qk_strides(k)
    pos = positions
    out = (q_out.tensor if q_out is not None else None,
           k_out.tensor if k_out is not None else None)
    tensors = (x, out[0], k.tensor if k is not None else None, out[1], table.cos, table.sin)
    options = dict(R=R, D=D, BLOCK_S=block_s, BLOCK_H=block_h, INTERLEAVED=interleaved,
                   BACKWARD=backward, INT64=int64, OUT_ROW=out_row)
    x_first = _x_first(B, chunk)           # (the packed kernel's one entry: always)
    if pos.position_ids is not None:
        ids = pos.position_ids
        ids_per_entry = _ids_per_entry(ids, S)
        launcher, pointers = IDS, tensors + (ids,)
        args = dict(S=S, B=B, HQ=q.heads, HK=HK, P=table.rows,
                    **_named("q", qs), **_named("k", ks), stride_tab_p=tab_p,
                    OUT_LAYOUT=OUT_LAYOUT[layout], TABLE_PER_ENTRY=per_entry,
                    IDS_PER_ENTRY=ids_per_entry, X_FIRST=x_first, **options)
    elif pos.cu_seqlens is not None:
        launcher, pointers = PACKED, tensors + (pos.cu_seqlens, pos.start)
        args = dict(T=S, HQ=q.heads, HK=HK, P=table.rows, N_SEQ=pos.cu_seqlens.shape[0] - 1,
                    cp_size=pos.cp_size, cp_rank=pos.cp_rank,
                    stride_q_t=qs[0], stride_q_h=qs[2], stride_q_d=qs[3],
                    stride_k_t=ks[0], stride_k_h=ks[2], stride_k_d=ks[3],
                    stride_tab_p=tab_p, **options)
    else:
        launcher, pointers = TOKENS, tensors + (pos.start,)
        args = dict(S=S, B=B, HQ=q.heads, HK=HK, P=table.rows, cp_size=pos.cp_size,
                    cp_rank=pos.cp_rank, **_named("q", qs), **_named("k", ks),
                    stride_tab_p=tab_p, OUT_LAYOUT=OUT_LAYOUT[layout],
                    TABLE_PER_ENTRY=per_entry, X_FIRST=x_first, **options)
    return Launch(grid, num_warps, args, pointer_dtypes(pointers), x.device, launcher), pointers


def output_row(q_out: Optional[View], k_out: Optional[View], layout: str) -> Optional[int]:
    """The finished kernel's OUT_ROW for these outputs ([S, B, H, D] views in `layout`, None in
    place): 0 where each is contiguous in the layout (or absent, or empty); the token row
    stride where both are column slices of one token-major buffer (sbhd, bshd or thd: features
    at stride 1, heads D apart, a token's row of heads ROW >= H * D elements after the one
    before, the same ROW for q's and k's); None for any other strides."""
    outs = [v for v in (q_out, k_out) if v is not None and v.tensor.numel()]  # (an empty
    if all(contiguous_in(v, layout) for v in outs):                         # one: any strides)
        return 0
    if layout not in ("sbhd", "bshd", "thd"):
        return None
    rows = set()
    for v in outs:
        t = v.tensor
        if any(isinstance(n, torch.SymInt) for n in (*t.shape, *t.stride())):
            return None                 # (OUT_ROW is a constexpr: a number known now)
        S, B, H, D = t.shape
        s, b, h, d = t.stride()
        if v.hpg != 1 or (d != 1 and D > 1) or (h != D and H > 1):
            return None
        # token rows ROW apart: bshd's tokens run b-major (s at ROW, b at S * ROW), sbhd's and
        # thd's s-major (b at ROW, s at B * ROW)
        inner, outer, n_inner, n_outer = (s, b, S, B) if layout == "bshd" else (b, s, B, S)
        row = inner if n_inner > 1 else (outer if n_outer > 1 else H * D)
        if n_outer > 1 and outer != row * n_inner:
            return None
        if row < H * D:
            return None
        rows.add(row)
    return rows.pop() if len(rows) == 1 else None


def _x_first(B, chunk) -> int:
    """The finished kernel's X_FIRST: where each program takes fewer than BATCH_LOOP_MIN batch
    entries, that number (its programs load x before their table work, fused._rope_heads, and
    find their entries without a division, common.batch_range); else 0. A symbolic chunk, under
    torch.compile with dynamic shapes, loops over the whole batch: 0."""
    if isinstance(chunk, torch.SymInt):
        return 0
    if chunk < BATCH_LOOP_MIN:
        return chunk
    if not isinstance(B, torch.SymInt) and B < BATCH_LOOP_MIN:
        return B                        # one program on grid axis 2 takes the whole batch
    return 0


def _named(tensor: str, strides: tuple) -> dict:
    return dict(zip((f"stride_{tensor}_s", f"stride_{tensor}_b", f"stride_{tensor}_h",
                     f"stride_{tensor}_d"), strides))


def plan_qkv(qkv4: torch.Tensor, q4: torch.Tensor, k4: torch.Tensor, q_table: torch.Tensor,
             k_table: torch.Tensor, start: Optional[torch.Tensor], *, heads_per_group: int,
             interleaved: bool, backward: bool, cp_size: int, cp_rank: int):
    """One launch of Transformer Engine's packed QKV: (Launch, pointers).

    qkv4 [S, B, G, W] is the packed tensor (features contiguous), q4 [S, B, G * hpg, D] and
    k4 [S, B, G, D] the separate q and k (outputs forward, gradients backward); q_table and
    k_table angles [P, R] with one set of strides."""
    S, B, G, D = k4.shape
    R = q_table.shape[-1]
    assert qkv4.stride(-1) == 1, "the packed tensor's features must be contiguous"
    assert q_table.stride() == k_table.stride() and q_table.stride(-1) == 1
    block_s, block_h, chunk, num_warps = _tiles(qkv4, S, B, (G * heads_per_group, G), R, D,
                                                False)
    grid = (cdiv(S, block_s), cdiv(G * heads_per_group, block_h) + cdiv(G, block_h),
            cdiv(B, chunk))
    args = dict(S=S, B=B, G=G, P=q_table.shape[0], cp_size=cp_size, cp_rank=cp_rank,
                stride_qkv_s=qkv4.stride(0), stride_qkv_b=qkv4.stride(1),
                stride_qkv_g=qkv4.stride(2), **_named("q", q4.stride()),
                **_named("k", k4.stride()), stride_tab_p=q_table.stride(0), R=R, D=D,
                HPG=heads_per_group, BLOCK_S=block_s, BLOCK_H=block_h,
                INTERLEAVED=interleaved, BACKWARD=backward, X_FIRST=_x_first(B, chunk),
                INT64=needs_int64((qkv4, q4, k4)))
    pointers = (qkv4, q4, k4, q_table, k_table, start)
    return Launch(grid, num_warps, args, pointer_dtypes(pointers), qkv4.device, QKV), pointers


def run(route, pointers: tuple) -> None:
    """Start a planned route: a Launch of the finished RoPE kernels (pointers in its kernel's
    order) or a TwoPass (pointers in TWO_PASS_POINTERS order)."""
    if isinstance(route, TwoPass):
        route.start(pointers)
    else:
        start(route.launcher, route, pointers)


def pointer_names(route) -> tuple:
    """The names of a planned route's pointer arguments, in the order `run` takes them."""
    return TWO_PASS_POINTERS if isinstance(route, TwoPass) else route.launcher.pointer_names


# --- the two-pass route (kernels/flat.py) -----------------------------------------------------

_ROUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LAYOUT_ORDER = {"sbhd": (0, 1, 2), "thd": (0, 1, 2), "bshd": (1, 0, 2), HF_LAYOUT: (1, 2, 0)}


def contiguous_in(v: View, layout: str) -> bool:
    """Is this [S, B, H, D] view a contiguous tensor in `layout` (dims of size 1 aside)?"""
    if v.hpg != 1:
        return False
    t = v.tensor
    sizes, strides = t.shape, t.stride()
    if strides[3] != 1 and sizes[3] > 1:
        return False
    expect = sizes[3]
    for dim in reversed(_LAYOUT_ORDER[layout]):
        if sizes[dim] > 1 and strides[dim] != expect:
            return False
        expect *= sizes[dim]
    return True


def _plain(positions: Positions) -> bool:
    """Are positions the token index (no ids, sequences, offsets or context parallelism)?"""
    pos = positions
    return pos.position_ids is None and pos.cu_seqlens is None and pos.start is None \
        and pos.cp_size == 1


def _table_rows_per_token(table: Table, positions: Positions, B) -> tuple:
    """(pre-pass?, table rows per token) of the two-pass route: the caller's cos/sin table is
    read as it is when positions are the token index; otherwise the pre-pass writes a row per
    token, or per (token, batch entry) when positions or tables differ between entries."""
    pos = positions
    per_entry = table.strides()[0] != 0
    if _plain(pos) and table.sin is not None and not table.exact:
        return False, (B if per_entry else 1)
    per_entry = per_entry or (pos.position_ids is not None and pos.position_ids.shape[0] > 1) \
        or (pos.start is not None and pos.cu_seqlens is None)
    return True, (B if per_entry else 1)


def _positions_below(table: Table, positions: Positions, S) -> int:
    """A bound on the call's positions: the table's rows, or fewer where positions come from
    packed sequences or context parallelism alone (each below the tokens' count times cp_size)."""
    pos = positions
    if pos.position_ids is None and pos.start is None:
        return min(table.rows, S * pos.cp_size)
    return table.rows


def by_sequence(table: Table, positions: Positions, S, B) -> int:
    """Positions per sequence (SEQ_ROWS > 0) where the flat pass can take packed sequences one
    sequence per grid row (flat.py's LAYOUT 3), else 0: thd (B = 1) with positions from
    cu_seqlens alone (no ids, start offsets or context parallelism), one table for every token,
    and a grid of n_seq sequences x min(P, S) positions at most tiles.TWO_PASS_SEQUENCE_GRID
    times the tokens there are (a sequence's programs past its end return at once; the grid
    must cover every sequence's positions below P without knowing the longest sequence on the
    host)."""
    pos = positions
    if B != 1 or pos.cu_seqlens is None or pos.position_ids is not None \
            or pos.start is not None or pos.cp_size != 1 or table.axes is not None \
            or table.strides()[0] != 0:
        return 0
    n_seq = pos.cu_seqlens.shape[0] - 1
    rows = min(table.rows, S)
    grid = _tiles_module.TWO_PASS_SEQUENCE_GRID
    return rows if 0 < n_seq and 0 < rows and n_seq * rows <= grid * S else 0


def table_bytes(table: Table, positions: Positions, S, B, R: int,
                rows_kept: bool = False) -> tuple:
    """(bytes, rows by position?, kept?) of the cheaper way for the flat pass to find every
    token's cos/sin, counting what a call writes and reads beside q and k: a row per token (the
    caller's table, or the pre-pass's fp32 cos and s' rows), or a row index per token (int32,
    from _token_rows_kernel) into the rows of positions 0..P'-1 (the caller's cos/sin table, or
    the pre-pass's rows of those positions). Rows by position are for tokens whose positions are
    not the token index, with one table for all batch entries.

    rows_kept: the call is eager, and the eager route keeps the pre-pass's rows between calls
    where they depend on the table alone (positions the token index, or rows by position;
    eager.TableRows): a later call with the same table reads them without writing them, so only
    their reads are counted, and `kept` says so."""
    pre_pass, rows_per_token = _table_rows_per_token(table, positions, B)
    row = 2 * R * (4 if pre_pass else table.cos.element_size())     # cos and sin of a row
    plain = _plain(positions)
    own = table.sin is None or table.exact                  # angles: the pre-pass writes rows
    row_p = 2 * R * (4 if own else table.cos.element_size())

    def position_rows(n):   # the rows of n positions: written and read, or (kept) only read
        return n * row_p * (1 if rows_kept or not own else 2)

    seq_rows = by_sequence(table, positions, S, B)
    if seq_rows:            # the rows of positions 0 .. seq_rows - 1, no row index
        return position_rows(seq_rows), True, rows_kept and own
    kept = rows_kept and pre_pass and plain
    by_token = S * rows_per_token * row * (1 if kept or not pre_pass else 2)  # (written, read)
    if plain or table.axes is not None or table.strides()[0] != 0:
        return by_token, False, kept
    by_position = S * rows_per_token * 4 * 2 \
        + position_rows(_positions_below(table, positions, S))
    if by_position < by_token:
        return by_position, True, rows_kept and own
    return by_token, False, False


def two_pass_min_bytes() -> int:
    """The least bytes of q and k (read) for which the two-pass route is taken."""
    return _tiles_module.TWO_PASS_MIN_BYTES


def takes_two_passes(q: View, q_out: Optional[View], k: Optional[View],
                     k_out: Optional[View], table: Table, positions: Positions,
                     layout: str, rows_kept: bool = False) -> bool:
    """Does this call take the two-pass route? Fresh outputs (not in place), an even head dim, q
    and k contiguous in their layout, 16- or 32-bit, sizes known (not symbolic under
    torch.compile), at least tiles.TWO_PASS_MIN_BYTES of q and k to read, and a cos/sin table
    small beside them (at most 1 / tiles.TWO_PASS_TABLE_SHARE of the bytes the flat pass moves;
    1 / TWO_PASS_KEPT_TABLE_SHARE of them where an eager call keeps the pre-pass's rows:
    `table_bytes`), unless the flat pass reads the caller's rows of every token and batch entry
    as they are (both routes read those)."""
    if q_out is None or (k is not None and k_out is None):
        return False
    if q.features() % 2:
        # the flat pass finds a feature's interleaved partner by the parity of its flat index
        # (flat.py, _swap_pairs), which is the feature's parity only for an even head dim
        return False
    views = [v for v in (q, q_out, k, k_out) if v is not None]
    if any(isinstance(n, torch.SymInt) for v in views for n in (*v.tensor.shape,
                                                                  *v.tensor.stride())):
        return False
    if any(v.tensor.dtype not in _ROUTE_DTYPES or not contiguous_in(v, layout) for v in views):
        return False
    read = sum(v.tensor.numel() * v.tensor.element_size() for v in (q, k) if v is not None)
    if read < _tiles_module.TWO_PASS_MIN_BYTES:
        return False
    S, B = q.tensor.shape[0], q.tensor.shape[1]
    pre_pass, _ = _table_rows_per_token(table, positions, B)
    if not pre_pass and (table.axes is not None or table.strides()[0] != 0):
        # the caller's rows, one per token and batch entry, read as they are: the finished
        # kernel reads each of them too, and again for tiles of heads (Qwen2-VL b4 s8192,
        # 268 MB of bf16 q and k: on the gathered [B, S, D] tables it read 402 MB, where the
        # flat pass on the three per-axis tables read 302; H200, results/tables_read_ncu-*)
        return True
    extra, _, kept = table_bytes(table, positions, S, B, table.cos.shape[-1], rows_kept)
    share = _tiles_module.TWO_PASS_KEPT_TABLE_SHARE if kept else \
        _tiles_module.TWO_PASS_TABLE_SHARE
    return extra * share <= 2 * read


class TwoPass(NamedTuple):
    """A planned two-pass rotation: the table pre-pass (None when the flat pass reads the
    caller's cos/sin table itself), the flat pass, and the shape of the fp32 cos and s' tables
    the first writes for the second; with rows by position (TableRead), the pass writing each
    token's row ([NB * S] int32) first. Pointers: TWO_PASS_POINTERS."""
    table_pass: Optional[Launch]
    rotate_pass: Launch
    table_shape: tuple
    index_pass: Optional[Launch] = None
    index_shape: tuple = (0,)
    seq_rows: int = 0       # > 0: the flat pass takes one packed sequence per grid row
    # the pre-pass writes a flag per row and the flat pass reads member b's cos and s' only
    # in rows where a pair's members differ (rotate-half rows after a pre-pass)
    row_flags: bool = False
    # the flat pass for rows whose flags are all 0 (kept rows found so, eager.PairsEqual): no
    # flags, no member b's entries read
    rotate_pass_equal: Optional[Launch] = None

    def start(self, pointers: tuple) -> None:
        """Every pass (planning.start), with the rows made here (the eager route,
        eager.EagerTwoPass, starts them its own way and may reuse the pre-pass's rows)."""
        q, q_out, k, k_out, cos, sin, position_ids, cu_seqlens, start_ = pointers
        token_rows = None
        (position_ids, cu_seqlens, start_), sequences = self.positions_split(
            position_ids, cu_seqlens, start_)
        if self.index_pass is not None:
            token_rows = self.new_index(q.device)
            start(self.index_pass.launcher, self.index_pass,
                  (position_ids, cu_seqlens, start_, token_rows))
            position_ids = cu_seqlens = start_ = None   # the pre-pass: positions 0..P'-1
        flags = None
        if self.table_pass is not None:
            rows = self.new_rows(q.device)
            start(self.table_pass.launcher, self.table_pass,
                  self.table_pass_pointers((cos, sin, position_ids, cu_seqlens, start_), rows))
            cos, sin, flags = rows
        start(self.rotate_pass.launcher, self.rotate_pass,
              (q, q_out, k, k_out, cos, sin, token_rows if sequences is None else sequences,
               flags))

    def positions_split(self, position_ids, cu_seqlens, start) -> tuple:
        """((position ids, cu_seqlens, start offsets) for the index pass or the pre-pass, what
        the flat pass reads in their place): with one packed sequence per grid row the pre-pass
        writes the rows of positions 0 .. seq_rows - 1 (no positions) and the flat pass reads
        cu_seqlens; otherwise the positions go on and the flat pass reads each token's row
        index (if any)."""
        if self.seq_rows:
            return (None, None, None), cu_seqlens
        return (position_ids, cu_seqlens, start), None

    def new_rows(self, device) -> tuple:
        """Fresh fp32 cos and s' rows for the pre-pass to write, and its flag per row (int8;
        None where the flat pass reads every entry)."""
        return (torch.empty(self.table_shape, dtype=torch.float32, device=device),
                torch.empty(self.table_shape, dtype=torch.float32, device=device),
                torch.empty(self.table_shape[:1], dtype=torch.int8, device=device)
                if self.row_flags else None)

    @staticmethod
    def table_pass_pointers(reads: tuple, rows: tuple) -> tuple:
        """The pre-pass's pointers (COS_SIN_ROWS.pointer_names) from what it reads (the table's
        cos and sin, position ids, cu_seqlens, start offsets) and `new_rows`' rows and flags;
        the QKV projection's table-wide flag is not given here."""
        cos_rows, sin_rows, flags = rows
        return tuple(reads) + (cos_rows, sin_rows, None, flags)

    def new_index(self, device) -> torch.Tensor:
        """A fresh row index per token, for the index pass to write."""
        return torch.empty(self.index_shape, dtype=torch.int32, device=device)


class TableRead(NamedTuple):
    """How the two-pass route's second pass reads cos and sin: the pre-pass that writes them
    (None: it reads the caller's table as it is), whether the sine is signed (s', the pre-pass's
    rows), a token's row stride and the batch-entry stride (0: one row serves every entry), and
    the shape of the pre-pass's rows. Rows by position (`table_bytes`): the index pass writing
    each token's row first ([NB * S] int32, entry b's from b * stride_rows_b), and then the
    pre-pass's rows are those of positions 0..P'-1."""
    table_pass: Optional[Launch]
    signed: bool
    stride_p: int
    stride_b: int
    table_shape: tuple
    index_pass: Optional[Launch] = None
    index_shape: tuple = (0,)
    stride_rows_b: int = 0
    seq_rows: int = 0       # > 0: one packed sequence per grid row (by_sequence), no row index


def plan_table_read(table: Table, positions: Positions, S, B, *, R: int, interleaved: bool,
                    backward: bool, device, rows_kept: bool = False,
                    row_flags: bool = False) -> TableRead:
    """The first half of a two-pass plan: the pre-pass writing every token's fp32 cos and s'
    rows (per batch entry where positions or tables differ between entries), or none where
    the caller's cos/sin table is read as it is (positions the token index); or, where that
    moves fewer bytes, each token's row index and the rows of the positions below P'.
    row_flags: the pre-pass writes a flag per row and member b's entries only where it is 1
    (for a flat pass that reads the flags)."""
    pos = positions
    per_entry, tab_p = _table_strides(table)
    on_gpu = device.type == "cuda" and not INTERPRET
    ids = pos.position_ids
    pre_pass, nb = _table_rows_per_token(table, pos, B)
    assert table.axes is None or (not pre_pass and table.rows >= S and not interleaved), \
        "one table per axis: read as it is, rotate-half pairs, positions the token index"
    if not pre_pass and table.rows >= S:
        return TableRead(None, False, tab_p, table.rows * tab_p if per_entry else 0, (0, R))
    ids_per_entry = ids is not None and _ids_per_entry(ids, S)
    n_seq = pos.cu_seqlens.shape[0] - 1 if pos.cu_seqlens is not None else 0
    seq_rows = by_sequence(table, pos, S, B)
    if seq_rows:    # the rows of positions 0 .. seq_rows - 1, read by each sequence's programs
        rows = plan_table_read(table, Positions(), seq_rows, 1, R=R, interleaved=interleaved,
                               backward=backward, device=device, rows_kept=rows_kept,
                               row_flags=row_flags)
        return rows._replace(seq_rows=seq_rows)
    if table_bytes(table, pos, S, B, R, rows_kept)[1]:
        block_s = pow2_at_least(S, 1024 if on_gpu else 1 << 14)
        below = _positions_below(table, pos, S)
        # (a position at or past the rows there are is outside: -1, a NaN row, never a read
        # past them; `below` bounds every position the call can express)
        index_pass = Launch(
            (cdiv(S, block_s), nb), TWO_PASS_WARPS,
            dict(S=S, P=below, N_SEQ=n_seq, cp_size=pos.cp_size, cp_rank=pos.cp_rank,
                 stride_ids_b=S if ids_per_entry else 0, BLOCK_S=block_s),
            pointer_dtypes((ids, pos.cu_seqlens, pos.start)), device, TOKEN_ROWS)
        rows = plan_table_read(table, Positions(), below, 1, R=R, interleaved=interleaved,
                               backward=backward, device=device, rows_kept=rows_kept,
                               row_flags=row_flags)
        return rows._replace(index_pass=index_pass, index_shape=(nb * S,),
                             stride_rows_b=S if nb > 1 else 0)
    table_pass = plan_cos_sin_rows(table, pos, S, nb, R=R, interleaved=interleaved,
                                   backward=backward, device=device, row_flags=row_flags)
    return TableRead(table_pass, True, R, S * R if nb > 1 else 0, (nb * S, R))


def plan_cos_sin_rows(table: Table, positions: Positions, S, nb: int, *, R: int,
                      interleaved: bool, backward: bool, device,
                      any_length: bool = False, pairs_differ: bool = False,
                      row_flags: bool = False) -> Launch:
    """The pre-pass (flat._cos_sin_rows_kernel, pointers COS_SIN_ROWS.pointer_names): every
    token's fp32 cos and signed sine s' rows [nb * S, R], nb = B where positions or tables
    differ between batch entries (else 1), from any table and source of positions; a NaN row
    for a position outside the table. The two-pass route's first pass, and what the QKV
    projection's kernels read (kernels/qkv_gemm.py). any_length: tokens per program that do not
    depend on S (compiled code with dynamic lengths then needs no new graph per length).
    pairs_differ: the caller passes the int32 flag (set where a pair's members differ);
    row_flags: the int8 flag per row (member b's entries then written only where it is 1).
    Each is a kernel of its own (the Launch names every pointer's dtype)."""
    pos = positions
    per_entry, tab_p = _table_strides(table)
    on_gpu = device.type == "cuda" and not INTERPRET
    ids = pos.position_ids
    ids_per_entry = ids is not None and ids.shape[0] > 1
    n_seq = pos.cu_seqlens.shape[0] - 1 if pos.cu_seqlens is not None else 0
    half = pow2_at_least(R // 2, 1 << 30)
    most = max(1, (TWO_PASS_TABLE_ELEMENTS if on_gpu else 1 << 14) // half)
    block_s = most if any_length else pow2_at_least(S, most)
    return Launch(
        (cdiv(S, block_s), nb), TWO_PASS_WARPS,
        dict(S=S, P=table.rows, N_SEQ=n_seq, cp_size=pos.cp_size, cp_rank=pos.cp_rank,
             stride_tab_b=table.rows * tab_p if per_entry else 0, stride_tab_p=tab_p,
             stride_ids_b=S if ids_per_entry else 0, R=R, INTERLEAVED=interleaved,
             BACKWARD=backward, BLOCK_S=block_s, BLOCK_HALF=half,
             EARLY_DEPENDENTS=launches_early(device)),
        pointer_dtypes((table.cos, table.sin, ids, pos.cu_seqlens, pos.start))
        + (torch.float32, torch.float32, torch.int32 if pairs_differ else None,
           torch.int8 if row_flags else None), device, COS_SIN_ROWS)


def plan_two_pass(q: View, q_out: View, table: Table, positions: Positions, *, R: int,
                  interleaved: bool, backward: bool, layout: str, k: Optional[View] = None,
                  k_out: Optional[View] = None, rows_kept: bool = False):
    """(TwoPass, pointers in TWO_PASS_POINTERS order) for a call takes_two_passes accepted."""
    x = q.tensor
    S, B, D = x.shape[0], x.shape[1], x.shape[3]
    HK = k.heads if k is not None else 0
    on_gpu = x.device.type == "cuda" and not INTERPRET
    axis_h_from, axis_w_from = table.axes[:2] if table.axes else (R // 2, R // 2)
    # flat._rope_rows_kernel's own choice of pass, from the same arguments
    by_element = bool(flat_by_element(D, R, interleaved, axis_h_from, axis_w_from))
    # rows of pairs read member b's entries by the pre-pass's flag per row (the pass by
    # element reads every entry)
    row_flags = not by_element and _tiles_module.TWO_PASS_ROW_FLAGS
    read = plan_table_read(table, positions, S, B, R=R, interleaved=interleaved,
                           backward=backward, device=x.device, rows_kept=rows_kept,
                           row_flags=row_flags)
    table_pass, signed, stride_p, stride_b, table_shape = read[:5]
    row_flags = row_flags and table_pass is not None
    out32 = torch.empty(0, dtype=torch.float32, device="meta")     # (the pre-pass's dtype)
    index = torch.empty(0, dtype=torch.int32, device="meta") if read.index_pass else None
    seqs = positions.cu_seqlens if read.seq_rows else None
    # elements per program (interleaved pairs, tables per axis); rotate-half programs take
    # xblock // D' whole head rows (D' = D's power of two), as flat._rope_rows_kernel counts them
    xblock = max(TWO_PASS_ELEMENTS if on_gpu else _tiles_module.TWO_PASS_INTERPRETED_ELEMENTS,
                 pow2_at_least(D, 1 << 30))
    n_q, n_k = S * B * q.heads * D, S * B * HK * D
    positions_per = read.seq_rows or S * B     # (rows of positions a grid row covers)
    kernel_layout = 3 if read.seq_rows else OUT_LAYOUT[layout]
    rows = xblock // pow2_at_least(D, 1 << 30)
    if by_element:
        blocks = cdiv(positions_per * q.heads * D, xblock) + cdiv(positions_per * HK * D, xblock)
    elif bool(flat_qk_by_tokens(kernel_layout, stride_b != 0, axis_h_from, R, by_element)):
        blocks = cdiv(positions_per, rows) * (q.heads + HK)
    else:
        blocks = cdiv(positions_per * q.heads, rows) + cdiv(positions_per * HK, rows)
    if read.seq_rows:       # one packed sequence per grid row: its first seq_rows positions
        grid = (blocks, positions.cu_seqlens.shape[0] - 1)
    else:
        grid = (blocks,)
    int64 = (max(n_q, n_k) + xblock > I32_LIMIT) or (table_shape[0] * R > I32_LIMIT - 1024) \
        or (table_pass is None and needs_int64((table.cos,))) \
        or (table.axes is not None and 2 * table.axes[2] + table.cos.numel() > I32_LIMIT - 1024)
    early = table_pass is not None and launches_early(x.device)
    rotate_pass = Launch(
        grid, TWO_PASS_WARPS if by_element else TWO_PASS_PAIR_WARPS,
        dict(S=S, B=read.seq_rows or B, HQ=q.heads, HK=HK, stride_tab_p=stride_p,
             stride_tab_b=stride_b,
             stride_rows_b=read.stride_rows_b,
             stride_tab_axis=table.axes[2] if table.axes else 0, D=D, R=R,
             LAYOUT=kernel_layout, INTERLEAVED=interleaved,
             BACKWARD=backward, SIGNED=signed, PER_ENTRY=stride_b != 0,
             # rows that serve every batch entry, or (by position) many tokens: kept in L2
             KEEP_TABLE=(B > 1 and stride_b == 0) or read.index_pass is not None
             or read.seq_rows > 0,
             AXIS_H_FROM=axis_h_from, AXIS_W_FROM=axis_w_from, XBLOCK=xblock, INT64=int64,
             WAIT_PRIOR=early, PAIRS_EQUAL=False),
        pointer_dtypes((x, q_out.tensor, k.tensor if k is not None else None,
                 k_out.tensor if k_out is not None else None)
                + ((table.cos, table.sin) if table_pass is None else (out32, out32))
                + (index if seqs is None else seqs,)) + (torch.int8 if row_flags else None,),
        x.device, ROWS, early=early)
    # where the rows are read once (no batch entries to keep them in L2 for): the pass for
    # kept rows with no differing pair (tiles.TWO_PASS_PAIRS_EQUAL)
    rotate_pass_equal = Launch(
        rotate_pass.grid, rotate_pass.num_warps, dict(rotate_pass.args, PAIRS_EQUAL=True),
        rotate_pass.dtypes[:-1] + (None,), x.device, ROWS, early=early) \
        if row_flags and _tiles_module.TWO_PASS_PAIRS_EQUAL \
        and not rotate_pass.args["KEEP_TABLE"] else None
    pointers = (x, q_out.tensor, k.tensor if k is not None else None,
                k_out.tensor if k_out is not None else None, table.cos, table.sin,
                positions.position_ids, positions.cu_seqlens, positions.start)
    return TwoPass(table_pass, rotate_pass, table_shape, read.index_pass,
                   read.index_shape, read.seq_rows, row_flags, rotate_pass_equal), pointers


# The finished kernels, by where positions come from, with their pointer arguments in order
# (an unused one is None).
_ROTATED = ("q_ptr", "q_out_ptr", "k_ptr", "k_out_ptr", "cos_ptr", "sin_ptr")
TOKENS = DirectLauncher(_rope_kernel, _ROTATED + ("start_ptr",))
IDS = DirectLauncher(_rope_ids_kernel, _ROTATED + ("position_ids_ptr",))
PACKED = DirectLauncher(_rope_packed_kernel, _ROTATED + ("cu_seqlens_ptr", "start_ptr"))
QKV = DirectLauncher(_rope_qkv_kernel, ("qkv_ptr", "q_ptr", "k_ptr", "q_cos_ptr", "k_cos_ptr",
                                        "start_ptr"))
COS_SIN_ROWS = DirectLauncher(_cos_sin_rows_kernel, (
    "cos_ptr", "sin_ptr", "position_ids_ptr", "cu_seqlens_ptr", "start_ptr", "cos_out_ptr",
    "sin_out_ptr", "pairs_differ_ptr", "row_flags_ptr"))
TOKEN_ROWS = DirectLauncher(_token_rows_kernel, ("position_ids_ptr", "cu_seqlens_ptr",
                                                 "start_ptr", "rows_out_ptr"))
ROWS = DirectLauncher(_rope_rows_kernel, _ROTATED + ("index_ptr", "row_flags_ptr"))
TWO_PASS_POINTERS = _ROTATED + ("position_ids_ptr", "cu_seqlens_ptr", "start_ptr")
LAUNCHERS = (TOKENS, IDS, PACKED, QKV, COS_SIN_ROWS, TOKEN_ROWS, ROWS)


def exact_angles(turns: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The angles the kernel rotates by without a table: [N, R/2] fp32 for positions [N] and
    the turns [R] of a ropelib.frequencies.Angles (for checking them against a reference).
    Positions must lie in [0, EXACT_POSITIONS)."""
    if turns.dtype != torch.int64 or turns.dim() != 1 or turns.shape[0] % 2:
        raise ValueError(f"turns must be Angles.turns ([R] int64), got {turns.dtype} "
                         f"{tuple(turns.shape)}")
    if positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be [N] int32 or int64, got {positions.dtype} "
                         f"{tuple(positions.shape)}")
    if positions.device != turns.device:
        raise ValueError(f"positions are on {positions.device} but turns on {turns.device}")
    half = turns.shape[0] // 2
    n = positions.shape[0]
    out = torch.empty(n, half, dtype=torch.float32, device=turns.device)
    if n:
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= EXACT_POSITIONS:
            raise ValueError(f"positions must lie in [0, {EXACT_POSITIONS}), got [{lo}, {hi}]")
        block_n = 16 if INTERPRET else 64
        _exact_angles_kernel[(cdiv(n, block_n),)](
            turns.contiguous(), positions.contiguous(), out, n, out.stride(0), HALF=half,
            BLOCK_N=block_n, BLOCK_HALF=pow2_at_least(half, 1 << 30))
    return out
