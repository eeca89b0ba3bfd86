"""The two-pass route for large contiguous tensors: a cos/sin table of the call's tokens, then a
flat pass over the tensor that reads it.

    _cos_sin_rows_kernel   every token's fp32 cos and sin rows, from any table and positions  23 args
    _token_rows_kernel     or each token's table row (then the rows are positions 0..P'-1)    11 args
    _rope_rows_kernel      q (and k) rotated row by row (pairs) or element by element,       29 args
                           reading cos/sin per feature
                           (packed sequences: one per row of a 2-D grid, where it can)

Why two passes
--------------
The finished kernel (kernels/fused.py) evaluates cos/sin once per tile of tokens and keeps them
in registers across its loop over the batch. On large tensors those registers are what cost it:
Nsight Compute on an H100 (s4096 b8 h32 d128 bf16) found it at 37 registers x 512 threads and
64 % achieved occupancy, against 29 registers and 88 % for the kernel torch.compile generates
from Hugging Face's formula, which streams at 89 % of DRAM bandwidth to the finished kernel's
84 %. The flat pass has torch.compile's shape: no loop, nothing held across one, a few rows per
program; it reads cos and sin for every element from a small fp32 table that stays in L2. The
table costs one more launch and S x R x 8 bytes (the pre-pass), which is why this route is taken
only for large tensors (kernels/tiles.py, TWO_PASS_MIN_BYTES): benchmarks/NOTES.md has the
measurements.

How it is parallelised
----------------------
_cos_sin_rows_kernel: grid (cdiv(S, BLOCK_S), NB); a program finds the table rows of BLOCK_S
tokens of batch entry b (NB = B when positions or tables differ per entry, else 1) exactly as
the finished kernel does (fused.table_rows, fused.table_cos_sin: position ids, packed
sequences, start offsets, context parallelism, angles, cos/sin or no table) and writes
cos [NB * S, R] and the signed sine s' [NB * S, R], both fp32, row b * S + s:

    forward   s'_a = -s_a     s'_b = +s_b
    backward  s'_a = +s_b     s'_b = -s_a      (the transpose of the rotation)

so that every rotated feature d, with partner p(d) (d +- R/2, or d xor 1 interleaved), is one
fma in either direction: y_d = fma(x_d, c_d, x_p(d) s'_d), the same products and roundings as
the finished kernel's rotate_pair. A position outside the table writes a NaN row. Rotate-half
rows are stored as two contiguous halves; interleaved pairs are joined in registers and stored
as one contiguous row (two stores at stride 2 took the pre-pass twice as long: 15.1 against
7.8 us at s4096 b8 on an H100). Given pairs_differ_ptr (an int32 the caller zeroed), a program
that finds a pair whose two members' cos or sin differ in a valid row sets it to 1: the QKV
projection's forward then reads four tiles of the rows, and otherwise two (one cos and one sin
a pair), as it does for table-free angles. Given row_flags_ptr (the two-pass route's rotate-half
rows), it writes one flag per row instead, 1 where a pair's members differ, and writes member
b's cos and s' only in those rows: the tables models pass repeat each frequency in both members
of a pair, so member b's cos equals a's and its s' is -s'_a in either direction. The flat pass
then reads member b's entries only where its row's flag is 1: half the rows' bytes written and
read, which at batch 1 are 1 KiB a token beside 16 KiB of q moved. Per row, so no flag needs
zeroing before the pre-pass (a launch of its own): every call, kept rows or not, compiled or
replayed from a CUDA graph, writes and reads half.

On a GPU with programmatic dependent launch (compute capability 9.0 and up) the flat pass after
a pre-pass is launched early: the pre-pass lets it start at once (EARLY_DEPENDENTS), and its
programs wait at their first instruction until the pre-pass has finished and its rows are
visible (WAIT_PRIOR, griddepcontrol.wait). The flat pass's launch and the placing of its first
programs then overlap the pre-pass instead of following it; nothing is read before the wait,
so whatever kernel precedes the flat pass, it reads what that kernel wrote.

_token_rows_kernel: grid (cdiv(S, BLOCK_S), NB); a program finds the table rows of BLOCK_S
tokens of batch entry b as the pre-pass does and writes them, -1 where a position is outside.

_rope_rows_kernel: grid (programs over q's rows + programs over k's,); a row is one head of one
token (D features, contiguous). q and k (and their fresh outputs) are contiguous in their
layout, so a row's token s and batch entry b follow from its index (sbhd/thd, bshd, bhsd); its
cos/sin row is at s * stride_tab_p + b * stride_tab_b.
  Rotate-half pairs: a program takes ROWS = XBLOCK / D' whole rows (D' = D's power of two: 8
  rows of 128, 2 warps), as [ROWS, R/2] tiles of both members of each pair, x_j and x_{j+R/2},
  in the same thread: every feature is loaded once, with 16-byte vectors (2 of x, 8 of the fp32
  table for 8 bf16 pairs). Loading the partner again from its own address instead (a second
  vector load per feature, from L1) held the pass at 0.948 of a copy at 1 GiB bf16 on an H200,
  against 0.993 this way (benchmarks/paired_rows_probe.py). Qwen2-VL's per-axis tables are
  read so too where their sections start at multiples of 8 pairs (16, 24, 24 do): both members
  of pair j share j's frequency, so its section's table.
  Interleaved pairs (neighbours, swapped in registers), per-axis tables of other sections and
  heads whose D or R/2 is no power of two: a program takes XBLOCK elements (4 warps, 16-byte
  vectors), whatever rows they fall in.
Features R..D-1 are copied through.

With cos and sin tables of the caller's ([P, R] or [B, P, R]) and positions that are just the
token index, the flat pass reads the caller's table itself (SIGNED False): it signs the sine
and, backward, reads the partner's sine, and no pre-pass runs.

Rows by position. Where many tokens share few positions (packed sequences: T tokens, positions
below the longest sequence), a row per token costs more than a row per position. Then
_token_rows_kernel writes each token's table row ([NB * S] int32, -1 for a position outside the
table: the flat pass writes NaN there), and the flat pass reads row token_rows[token] of the
caller's cos/sin table, or of the fp32 cos and s' rows the pre-pass wrote for positions
0..P'-1 (positions the token index: rows an eager call can keep, kernels/launch.TableRead).

Packed sequences one per grid row (LAYOUT 3, kernels/launch.by_sequence). Where positions are
each token's index in its packed sequence, the grid is (blocks of q's and k's first P' positions
of a sequence, sequences): program (j, n) loads cu_seqlens[n] and [n + 1] (index_ptr holds
cu_seqlens then) and rotates elements j * XBLOCK .. of sequence n, reading the rows of positions
0..P'-1 as sbhd reads a token's row; no row index per token. Programs past a sequence's end
return at once; the last of a sequence writes NaN at its positions past P' (past the table).

Qwen2-VL's multimodal tables ([3, B, S, D], one per axis: time, height, width, as Hugging Face
materialises them; ropelib.hf.apply_multimodal_rotary_pos_emb) are read the same way, each
rotate-half pair j from the table of its section: axis (j >= AXIS_H_FROM) + (j >= AXIS_W_FROM),
stride_tab_axis apart. Nothing is gathered into a [B, S, D] table first.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import ConstexprRule, ROUND_BF16_RTNE, pair_features, round_to, tile_width
from .fused import table_cos_sin, table_rows


class _ByElement(ConstexprRule):
    """(D, R, interleaved, axis_h_from, axis_w_from) -> whether the flat pass rotates element by
    element (XBLOCK elements a program, 4 warps) rather than by rows of pairs (both members of a
    pair in one thread, 2 warps): interleaved pairs, per-axis tables whose sections do not start
    at multiples of 8 pairs, or a head dim or half rotary dim that is no power of two (rows of
    pairs pad those to powers of two: at d = 80 a third of every program's lanes idle). One rule
    for the kernel (a constexpr global, `by_element`, evaluated while it compiles) and the
    planner (launch.plan_two_pass, which sizes the grid and the warps by it)."""

    def __call__(self, D, R, interleaved, axis_h_from, axis_w_from):
        D, R, interleaved, axis_h_from, axis_w_from = (
            getattr(v, "value", v) for v in (D, R, interleaved, axis_h_from, axis_w_from))
        half = R // 2
        return tl.constexpr(bool(
            interleaved or D & (D - 1) or half & (half - 1)
            or (axis_h_from < half and (axis_h_from % 8 or axis_w_from % 8 or half % 8))))


by_element = tl.constexpr(_ByElement())


class _QkByTokens(ConstexprRule):
    """(LAYOUT, PER_ENTRY, AXIS_H_FROM, R, BY_ELEMENT) -> whether the rows pass orders its grid
    by chunks of ROWS token rows, each chunk's programs of q's rows followed by those of k's,
    rather than all of q's programs before k's. Where every token (and batch entry) has cos/sin
    rows of its own (PER_ENTRY, or Qwen2-VL's table per axis) those rows are as large as a fifth
    of q and k, and k's programs, coming after all of q's, found them evicted from L2: the pass
    read them from DRAM twice (Qwen2-VL b4 s8192, 28/4 heads, bf16 tables: 335 MB read where q
    and k are 268, 302 in this order; H200, results/tables_read_ncu-*). For rows of pairs in
    sbhd or bshd order (whose head rows run token by token); one rule for the kernel and the
    planner (launch.plan_two_pass sizes the grid by it: cdiv(rows, ROWS) * (HQ + HK)). Not in
    bhsd: there a grid so ordered (programs of one head's tokens) read what q's programs
    before k's read, 285 MB with Hugging Face's [B, S, D] tables at b4 s8192 28/4 heads, whose
    17 MB stay in L2 (138.9 against 138.6 us; H200, benchmarks/NOTES.md)."""

    def __call__(self, layout, per_entry, axis_h_from, R, by_element_pass):
        layout, per_entry, axis_h_from, R, by_element_pass = (
            getattr(v, "value", v) for v in (layout, per_entry, axis_h_from, R, by_element_pass))
        return tl.constexpr(bool(layout in (0, 1) and not by_element_pass
                                 and (per_entry or axis_h_from < R // 2)))


qk_by_tokens = tl.constexpr(_QkByTokens())


@triton.jit
def _element_tile(block, S, B, H, stride_tab_p, stride_tab_b, token_rows_ptr, stride_rows_b,
                  D: tl.constexpr, BLOCK: tl.constexpr, LAYOUT: tl.constexpr,
                  PER_ENTRY: tl.constexpr, VEC: tl.constexpr, INT64: tl.constexpr):
    """A program's BLOCK elements, from element block * BLOCK, of a tensor [S * B * H * D]
    contiguous in LAYOUT (0 sbhd, and thd with B = 1; 1 bshd; 2 Hugging Face's bhsd) -> (their
    indices [BLOCK], int64 when INT64; which of them exist; the offset of each one's cos/sin
    row, s * stride_tab_p, + b * stride_tab_b with a table row per batch entry, or with a row
    index (token_rows_ptr) its token's row times stride_tab_p; which of them have no row, their
    position lying outside the table)."""
    if INT64:               # sizes and products in int64 (the tensor passes 2^31 elements)
        S = tl.full([], 0, tl.int64) + S
        B = tl.full([], 0, tl.int64) + B
        H = tl.full([], 0, tl.int64) + H
        i = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        i = block * BLOCK + tl.arange(0, BLOCK)
    live = i < S * B * H * D
    if LAYOUT == 1:
        s = (i // (H * D)) % S
        b = i // (S * H * D)
    elif LAYOUT == 2:
        s = (i // D) % S
        b = i // (H * S * D)
    else:
        s = i // (B * H * D)
        b = (i // (H * D)) % B
    if token_rows_ptr is not None:
        if D % VEC == 0:
            # a thread's run of VEC features belongs to one token: one load of its row each
            # (said, or each element loads it)
            s = tl.max_constancy(s, VEC)
            b = tl.max_constancy(b, VEC)
        row = tl.load(token_rows_ptr + s + b * stride_rows_b, mask=live, other=0)
        outside = row < 0
        tab = tl.maximum(row, 0).to(i.dtype) * stride_tab_p
    else:                   # rows by token index: a NaN row where a position is outside
        outside = i < 0
        tab = s * stride_tab_p
        if PER_ENTRY:
            tab += b * stride_tab_b
    return i, live, tab, outside


@triton.jit
def _sequence_span(block, seq, cu_seqlens_ptr, T, SEQ_ROWS, PER_TOKEN, stride_tab_p,
                   BLOCK: tl.constexpr, INT64: tl.constexpr):
    """Block `block` of packed sequence `seq` of a thd tensor of T tokens, PER_TOKEN units each
    (elements: H * D; head rows: H), contiguous (LAYOUT 3): BLOCK units from unit
    block * BLOCK of the sequence, below its first SEQ_ROWS positions -> (their indices into
    the tensor [BLOCK], int64 when INT64; which of them exist; the offset of each one's cos/sin
    row, its position times stride_tab_p). A position is its token's index in its sequence, so
    rows follow each other as in sbhd: no row index to load, none outside the table (the grid
    covers positions below SEQ_ROWS, the rows there are; _sequence_tail writes the rest)."""
    lo = tl.load(cu_seqlens_ptr + seq)
    hi = tl.load(cu_seqlens_ptr + seq + 1)
    if INT64:
        lo = lo.to(tl.int64)
        hi = hi.to(tl.int64)
        e = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        e = block * BLOCK + tl.arange(0, BLOCK)
    i = lo * PER_TOKEN + e
    # the sequence's units below SEQ_ROWS positions (never past the tensor, whatever
    # cu_seqlens holds)
    n = tl.minimum(tl.where(lo >= 0, (hi - lo) * PER_TOKEN, 0), SEQ_ROWS * PER_TOKEN)
    live = (e < n) & (i < T * PER_TOKEN)
    tab = (e // PER_TOKEN) * stride_tab_p
    return i, live, tab


@triton.jit
def _sequence_tail(x_ptr, y_ptr, seq, cu_seqlens_ptr, T, SEQ_ROWS, H, D: tl.constexpr,
                   R: tl.constexpr, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """The positions of packed sequence `seq` at or past SEQ_ROWS, the rows the table has: NaN
    for every rotated feature (a position outside the table), the others copied. Only a
    sequence longer than the table has any."""
    lo = tl.load(cu_seqlens_ptr + seq)
    hi = tl.load(cu_seqlens_ptr + seq + 1)
    if INT64:
        lo = lo.to(tl.int64)
        hi = hi.to(tl.int64)
    hd = H * D
    n = tl.where(lo >= 0, (hi - lo) * hd, 0)
    for e0 in range(SEQ_ROWS * hd, n, BLOCK):
        e = e0 + tl.arange(0, BLOCK)
        i = lo * hd + e
        live = (e < n) & (i < T * hd)
        x = tl.load(x_ptr + i, mask=live, other=0.0)
        y = tl.where(i % D < R, float("nan"), x.to(tl.float32))
        tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _cos_sin_rows_kernel(
    cos_ptr, sin_ptr,                    # the table, as fused.table_cos_sin reads it
    position_ids_ptr, cu_seqlens_ptr, start_ptr,   # where positions come from (fused.table_rows)
    cos_out_ptr, sin_out_ptr,            # cos, s' [NB * S, R] fp32, contiguous
    pairs_differ_ptr,                    # int32 [1] set to 1 where a pair's members differ, or None
    row_flags_ptr,                       # int8 [NB * S]: 1 where one of the row's pairs has
                                         # members that differ, else 0 and member b's entries
                                         # are not written (rotate-half rows); or None
    S, P, N_SEQ, cp_size, cp_rank,       # tokens, table rows, packed sequences, context parallel
    stride_tab_b, stride_tab_p, stride_ids_b,
    R: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr,
    EARLY_DEPENDENTS: tl.constexpr = False,   # let a dependent launch (the flat pass) start now
):
    if EARLY_DEPENDENTS:
        gdc_launch_dependents()
    HALF: tl.constexpr = R // 2
    b = tl.program_id(1)
    s_idx = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)      # [BLOCK_S]
    j = tl.arange(0, BLOCK_HALF)
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)                  # [BLOCK_HALF]
    mask = (s_idx < S)[:, None, None] & (j < HALF)[None, None, :]   # [BLOCK_S, 1, BLOCK_HALF]
    rows, valid = table_rows(s_idx, b, S, P, position_ids_ptr, stride_ids_b, cu_seqlens_ptr,
                             start_ptr, N_SEQ, cp_size, cp_rank)
    c_a, s_a, c_b, s_b = table_cos_sin(cos_ptr, sin_ptr, rows, valid, b, stride_tab_b,
                                       stride_tab_p, d_a, d_b, mask, tl.float32, HALF, True)
    mask_b = mask           # member b's entries written (rotate-half rows)
    if pairs_differ_ptr is not None or row_flags_ptr is not None:
        # (rows outside the table are NaN whichever member is read)
        differ = (mask & valid[:, None, None] & ((c_a != c_b) | (s_a != s_b))).to(tl.int32)
        if pairs_differ_ptr is not None:
            if tl.max(differ) > 0:
                tl.store(pairs_differ_ptr, 1)
        if row_flags_ptr is not None:
            row_differs = tl.max(differ, axis=2)                        # [BLOCK_S, 1]
            tl.store(row_flags_ptr + (b * S + s_idx).to(tl.int64)[:, None],
                     row_differs.to(tl.int8), mask=(s_idx < S)[:, None])
            mask_b = mask & (row_differs != 0)[:, :, None]
    if BACKWARD:
        s_a, s_b = s_b, -s_a
    else:
        s_a = -s_a
    ok = valid[:, None, None]       # a position outside the table: a NaN row (cos already is)
    s_a = tl.where(ok, s_a, float("nan"))
    s_b = tl.where(ok, s_b, float("nan"))
    out = (b * S + s_idx).to(tl.int64)[:, None, None] * R
    if INTERLEAVED:     # a pair's members are neighbours: one contiguous row of R per store
        k = tl.arange(0, 2 * BLOCK_HALF)
        row = out + k[None, None, :]
        mask2 = (s_idx < S)[:, None, None] & (k < R)[None, None, :]
        tl.store(cos_out_ptr + row, _pairs_joined(c_a, c_b, BLOCK_S, BLOCK_HALF), mask=mask2)
        tl.store(sin_out_ptr + row, _pairs_joined(s_a, s_b, BLOCK_S, BLOCK_HALF), mask=mask2)
    else:               # the two halves: two contiguous stores of R/2
        tl.store(cos_out_ptr + out + d_a[None, None, :], c_a, mask=mask)
        tl.store(cos_out_ptr + out + d_b[None, None, :], c_b, mask=mask_b)
        tl.store(sin_out_ptr + out + d_a[None, None, :], s_a, mask=mask)
        tl.store(sin_out_ptr + out + d_b[None, None, :], s_b, mask=mask_b)


@triton.jit
def _token_rows_kernel(
    position_ids_ptr, cu_seqlens_ptr, start_ptr,   # where positions come from (fused.table_rows)
    rows_out_ptr,                        # [NB * S] int32: each token's table row, -1 outside
    S, P, N_SEQ, cp_size, cp_rank, stride_ids_b,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(1)
    s_idx = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)      # [BLOCK_S]
    rows, valid = table_rows(s_idx, b, S, P, position_ids_ptr, stride_ids_b, cu_seqlens_ptr,
                             start_ptr, N_SEQ, cp_size, cp_rank)
    tl.store(rows_out_ptr + b.to(tl.int64) * S + s_idx, tl.where(valid, rows, -1),
             mask=s_idx < S)


@triton.jit
def _pairs_joined(v_a, v_b, BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # v_a, v_b [BLOCK_S, 1, BLOCK_HALF] (members 2j and 2j + 1) -> [BLOCK_S, 1, 2 BLOCK_HALF]
    return tl.reshape(tl.join(v_a, v_b), (BLOCK_S, 1, 2 * BLOCK_HALF))


@triton.jit
def _swap_pairs(v, XBLOCK: tl.constexpr):
    # v [XBLOCK] -> v with elements 2j and 2j + 1 exchanged (in registers)
    even, odd = tl.split(tl.reshape(v, (XBLOCK // 2, 2)))
    return tl.reshape(tl.join(odd, even), (XBLOCK,))


@triton.jit
def _rotate_flat(x_ptr, y_ptr, cos_ptr, sin_ptr, index_ptr, block, seq, S, B, H, stride_tab_p,
                 stride_tab_b, stride_rows_b, stride_tab_axis, D: tl.constexpr, R: tl.constexpr,
                 LAYOUT: tl.constexpr,
                 INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, SIGNED: tl.constexpr,
                 PER_ENTRY: tl.constexpr, KEEP_TABLE: tl.constexpr, AXIS_H_FROM: tl.constexpr,
                 AXIS_W_FROM: tl.constexpr, XBLOCK: tl.constexpr, INT64: tl.constexpr):
    # Elements block * XBLOCK .. + XBLOCK of x [S * B * H * D] (contiguous in LAYOUT) -> y; with
    # LAYOUT 3, of packed sequence `seq` (cu_seqlens in index_ptr) of x [S * H * D] (thd, S
    # tokens), its first B positions.
    HALF: tl.constexpr = R // 2
    VEC: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth   # a 16-byte vector
    if LAYOUT == 3:
        i, live, tab = _sequence_span(block, seq, index_ptr, S, B, H * D, stride_tab_p, XBLOCK,
                                      INT64)
        outside = i < 0
        token_rows_ptr = None
    else:
        token_rows_ptr = index_ptr
        i, live, tab, outside = _element_tile(block, S, B, H, stride_tab_p, stride_tab_b,
                                              token_rows_ptr, stride_rows_b, D, XBLOCK, LAYOUT,
                                              PER_ENTRY, VEC, INT64)
    d = i % D                               # the feature
    if AXIS_H_FROM < HALF:      # one table per axis: pair j reads the table of its section
        j = d % HALF
        tab += ((j >= AXIS_H_FROM).to(tab.dtype) + (j >= AXIS_W_FROM).to(tab.dtype)) \
            * stride_tab_axis
        if AXIS_H_FROM % VEC == 0 and AXIS_W_FROM % VEC == 0 and HALF % VEC == 0 \
                and D % VEC == 0:
            # Each section starts at a multiple of VEC pairs (Qwen2-VL's 16, 24, 24 do) and the
            # tables' strides are multiples of VEC (ops.takes_axis_tables: contiguous tables),
            # so each thread's run of VEC features reads one row of one table, from a multiple
            # of VEC. The selects above hide that from Triton's analysis: unsaid, every entry
            # is its own 2-byte load (sm_90 SASS of the Qwen2-VL case: 32 such loads a thread
            # against 8 of 16 bytes with one gathered table). (Said here, where tab is made:
            # a hint on a helper's argument is lost.)
            tab = tl.max_constancy(tl.multiple_of(tab, VEC), VEC)
    rotated = d < R
    mr = live & rotated
    x = tl.load(x_ptr + i, mask=live, other=0.0)
    if KEEP_TABLE:          # the rows serve every batch entry: keep them in L2
        c = tl.load(cos_ptr + tab + d, mask=mr, other=0.0, eviction_policy="evict_last")
    else:
        c = tl.load(cos_ptr + tab + d, mask=mr, other=0.0)
    if INTERLEAVED:
        first = d % 2 == 0
        xp = _swap_pairs(x, XBLOCK)
        to_sin = d
    else:
        first = d < HALF
        step = tl.where(first, HALF, -HALF)     # to the partner: d + R/2 or d - R/2
        partner = i + step
        if HALF % VEC == 0 and D % VEC == 0:
            # each thread's run of VEC features lies in one half, so its partners are VEC
            # contiguous elements too, VEC-aligned; the where() hides that from Triton's
            # analysis (the loads would be one element each), so say it
            partner = tl.max_contiguous(tl.multiple_of(partner, VEC), VEC)
        xp = tl.load(x_ptr + partner, mask=mr, other=0.0)
        to_sin = d + step if BACKWARD and not SIGNED else d
    if KEEP_TABLE:
        sn = tl.load(sin_ptr + tab + to_sin, mask=mr, other=0.0, eviction_policy="evict_last")
    else:
        sn = tl.load(sin_ptr + tab + to_sin, mask=mr, other=0.0)
    if INTERLEAVED and BACKWARD and not SIGNED:
        sn = _swap_pairs(sn, XBLOCK)
    xf = x.to(tl.float32)
    t = xp.to(tl.float32) * sn.to(tl.float32)
    if not SIGNED:          # y_a = x_a c_a - x_b s, y_b = x_b c_b + x_a s (backward: negated)
        if BACKWARD:
            t = tl.where(first, t, -t)
        else:
            t = tl.where(first, -t, t)
    y = tl.where(rotated, tl.fma(xf, c.to(tl.float32), t), xf)
    if token_rows_ptr is not None:      # a position outside the table: NaN, never a clamped row
        y = tl.where(rotated & outside, float("nan"), y)
    tl.store(y_ptr + i, round_to(y, y_ptr.dtype.element_ty, ROUND_BF16_RTNE), mask=live)


@triton.jit
def _row_tile(block, S, B, H, LAYOUT: tl.constexpr, ROWS: tl.constexpr, INT64: tl.constexpr):
    """A program's ROWS head rows, from row block * ROWS, of a tensor [S * B * H rows of D]
    contiguous in LAYOUT (0 sbhd, and thd with B = 1; 1 bshd; 2 Hugging Face's bhsd) -> (their
    indices [ROWS], int64 when INT64; which exist; each one's token s and batch entry b)."""
    if INT64:
        S = tl.full([], 0, tl.int64) + S
        B = tl.full([], 0, tl.int64) + B
        H = tl.full([], 0, tl.int64) + H
        r = block.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    else:
        r = block * ROWS + tl.arange(0, ROWS)
    live = r < S * B * H
    if LAYOUT == 1:
        s = (r // H) % S
        b = r // (S * H)
    elif LAYOUT == 2:
        s = r % S
        b = r // (H * S)
    else:
        s = r // (B * H)
        b = (r // H) % B
    return r, live, s, b


@triton.jit
def _rotate_pairs(x_ptr, y_ptr, cos_ptr, sin_ptr, r, live, tab, s, b, token_rows_ptr,
                  stride_rows_b, stride_tab_p, stride_tab_axis, row_flags_ptr,
                  D: tl.constexpr, R: tl.constexpr,
                  BACKWARD: tl.constexpr, SIGNED: tl.constexpr, KEEP_TABLE: tl.constexpr,
                  ROW_POINTERS: tl.constexpr, AXIS_H_FROM: tl.constexpr,
                  AXIS_W_FROM: tl.constexpr, PAIRS_EQUAL: tl.constexpr):
    # Rotate-half rows r [ROWS] of x [rows, D] -> y: a thread holds both members of its pairs,
    # x_a = x[r, j] and x_b = x[r, j + R/2] ([ROWS, BLOCK_HALF] each), so no feature is loaded
    # twice; features R..D-1 are copied through. Each row's cos/sin row is at offset tab, or,
    # with a row index (token_rows_ptr), at token_rows[s + b * stride_rows_b] * stride_tab_p:
    # loaded after x, so x's loads do not wait on it (a row of -1, a position outside the
    # table, gives NaN). With one table per axis (AXIS_H_FROM < R/2) pair j and both its
    # members read the table of j's section, stride_tab_axis further on per axis. Given the
    # pre-pass's row flags (row_flags_ptr, one per row of its s' rows), member b's entries are
    # loaded only for rows where some pair's members differ: otherwise c_b = c_a and
    # s'_b = -s'_a (the pre-pass did not write them). PAIRS_EQUAL: no row's pairs differ
    # (every flag of kept rows was 0): member b's entries are never loaded, nor the flags.
    HALF: tl.constexpr = R // 2
    BLOCK_HALF: tl.constexpr = tile_width(HALF)
    j = tl.arange(0, BLOCK_HALF)
    col = j                                                          # the table's column of j
    if AXIS_H_FROM < HALF:
        col = j + ((j >= AXIS_H_FROM).to(tl.int32) + (j >= AXIS_W_FROM).to(tl.int32)) \
            * stride_tab_axis
        # sections start at multiples of 8 pairs (the planner's condition) and the tables'
        # strides are multiples of 8 (contiguous tables): runs of 8 columns stay contiguous,
        # which the selects hide from Triton's analysis (each entry would be its own load)
        col = tl.max_contiguous(tl.multiple_of(col, 8), 8)
    at = r[:, None] * D + j[None, :]                                 # x_a [ROWS, BLOCK_HALF]
    m = live[:, None] & (j < HALF)[None, :]
    xa = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
    xb = tl.load(x_ptr + at + HALF, mask=m, other=0.0).to(tl.float32)
    if token_rows_ptr is not None:
        row = tl.load(token_rows_ptr + s + b * stride_rows_b, mask=live, other=0)
        outside = row < 0
        tab = tl.maximum(row, 0).to(r.dtype) * stride_tab_p
    # Member a's cos/sin entries. A thread's 8 pairs are 4 16-byte pieces of a cos row and 4
    # of a sin row; which of the 8 loads ptxas issues before the rotation starts (the others
    # wait for registers, a second trip to memory) follows from how their addresses are
    # written. With each row's pointer first (ROW_POINTERS), a row's pieces are one address
    # plus constants: at 1 GiB sbhd 6 of the 8 loads go early (sm_90, Triton 3.6) and
    # apply_rope reached 0.986 of a copy where the offsets [row, feature] reached 0.913 (4 base
    # addresses; 5 early; H200, results/one_gib_probe-*). For one packed sequence per grid row
    # the offsets schedule better: 6 early against 4, 0.993-0.997 of a copy against 0.953
    # (H200, the floor's thd case, 2026-11-29).
    if ROW_POINTERS:
        cos_a = (cos_ptr + tab)[:, None] + col[None, :]
        sin_a = (sin_ptr + tab)[:, None] + col[None, :]
    else:
        cos_a = cos_ptr + (tab[:, None] + col[None, :])
        sin_a = sin_ptr + (tab[:, None] + col[None, :])
    if SIGNED and row_flags_ptr is not None and not PAIRS_EQUAL:
        # the row's flag: the pre-pass's rows are [NB * S, R], so row tab // R (where it is 0
        # the b loads move no bytes)
        differs = tl.load(row_flags_ptr + tab // R, mask=live, other=1)
        # (Only b's loads wait for it. With a's waiting too, ptxas issued all eight table loads
        # ahead of the first multiply, 9 of 11 against 7 of 11 (sm_90, Triton 3.6), yet the
        # pass was slower: 0.943 of a copy at 1 GiB b8 against 1.001, 0.900 at s16k b1 against
        # 0.941 (H200, results/half_rows_probe-*-1511-a-loads-wait.csv and -1443.csv).)
        m_b = m & (differs != 0)[:, None]
    else:
        m_b = m
    if SIGNED and PAIRS_EQUAL:  # (planned only where rows are read once: no KEEP_TABLE)
        tl.static_assert(not KEEP_TABLE, "PAIRS_EQUAL is planned for rows read once")
        ca = tl.load(cos_a, mask=m, other=0.0)
        sa = tl.load(sin_a, mask=m, other=0.0)
        cb = ca
        sb = -sa
    elif KEEP_TABLE:        # the rows serve every batch entry: keep them in L2
        ca = tl.load(cos_a, mask=m, other=0.0, eviction_policy="evict_last")
        sa = tl.load(sin_a, mask=m, other=0.0, eviction_policy="evict_last")
        cb = tl.load(cos_a + HALF, mask=m_b, other=0.0, eviction_policy="evict_last")
        sb = tl.load(sin_a + HALF, mask=m_b, other=0.0, eviction_policy="evict_last")
    else:
        ca = tl.load(cos_a, mask=m, other=0.0)
        sa = tl.load(sin_a, mask=m, other=0.0)
        cb = tl.load(cos_a + HALF, mask=m_b, other=0.0)
        sb = tl.load(sin_a + HALF, mask=m_b, other=0.0)
    sa = sa.to(tl.float32)
    sb = sb.to(tl.float32)
    if SIGNED and row_flags_ptr is not None and not PAIRS_EQUAL:
        # the two halves equal: a's entries serve b
        cb = tl.where(m_b, cb, ca)
        sb = tl.where(m_b, sb, -sa)
    if SIGNED:              # s' (the pre-pass's rows): y_a = x_a c_a + x_b s'_a, and so for b
        ta = xb * sa
        tb = xa * sb
    elif BACKWARD:          # the transpose: y_a = x_a c_a + x_b s_b, y_b = x_b c_b - x_a s_a
        ta = xb * sb
        tb = -xa * sa
    else:                   # y_a = x_a c_a - x_b s_a, y_b = x_b c_b + x_a s_b
        # x_b (-s_a) rather than -(x_b s_a), the same bits. Which loads ptxas issues before
        # the first multiply follows from how the product is written, and differently by
        # Triton version (sm_90): -(x_b s_a) 4 of 6 with Triton 3.6 and 6 with 3.9; (-x_b) s_a
        # 6 and 4; x_b (-s_a) 6 with both (40 registers, what 38 round to in the allocation).
        # With 3.6, the GPU runs', (-x_b) s_a took Qwen2-VL's bf16 tables forward from 167.8 to
        # 142.5 us (b4 s8192 28/4 heads, H200, results/tables_flat_pass_variants-*); this form
        # ran at 139.0 us under Nsight Compute, as (-x_b) s_a's 138.7 (results/tables_read_ncu-*)
        ta = xb * (-sa)
        tb = xa * sb
    ya = tl.fma(xa, ca.to(tl.float32), ta)
    yb = tl.fma(xb, cb.to(tl.float32), tb)
    if token_rows_ptr is not None:      # a position outside the table: NaN, never a clamped row
        ya = tl.where(outside[:, None], float("nan"), ya)
        yb = tl.where(outside[:, None], float("nan"), yb)
    tl.store(y_ptr + at, round_to(ya, y_ptr.dtype.element_ty, ROUND_BF16_RTNE), mask=m)
    tl.store(y_ptr + at + HALF, round_to(yb, y_ptr.dtype.element_ty, ROUND_BF16_RTNE),
             mask=m)
    if R < D:               # the features not rotated, copied
        PASS: tl.constexpr = D - R
        k = tl.arange(0, tile_width(PASS))
        pt = r[:, None] * D + R + k[None, :]
        mp = live[:, None] & (k < PASS)[None, :]
        xp = tl.load(x_ptr + pt, mask=mp, other=0.0).to(tl.float32)
        tl.store(y_ptr + pt, round_to(xp, y_ptr.dtype.element_ty, ROUND_BF16_RTNE), mask=mp)


@triton.jit
def _rotate_rows(x_ptr, y_ptr, cos_ptr, sin_ptr, index_ptr, row_flags_ptr, block, seq, S, B,
                 H, stride_tab_p, stride_tab_b, stride_rows_b, stride_tab_axis, D: tl.constexpr,
                 R: tl.constexpr,
                 LAYOUT: tl.constexpr, BACKWARD: tl.constexpr, SIGNED: tl.constexpr,
                 PER_ENTRY: tl.constexpr, KEEP_TABLE: tl.constexpr, AXIS_H_FROM: tl.constexpr,
                 AXIS_W_FROM: tl.constexpr, ROWS: tl.constexpr, INT64: tl.constexpr,
                 PAIRS_EQUAL: tl.constexpr):
    # Rotate-half: head rows block * ROWS .. + ROWS of x (contiguous in LAYOUT) -> y; with
    # LAYOUT 3, of packed sequence `seq` (cu_seqlens in index_ptr), its first B positions.
    if LAYOUT == 3:
        r, live, tab = _sequence_span(block, seq, index_ptr, S, B, H, stride_tab_p, ROWS,
                                      INT64)
        _rotate_pairs(x_ptr, y_ptr, cos_ptr, sin_ptr, r, live, tab, r, r, None, 0,
                      stride_tab_p, stride_tab_axis, row_flags_ptr, D, R, BACKWARD, SIGNED,
                      KEEP_TABLE, False, AXIS_H_FROM, AXIS_W_FROM, PAIRS_EQUAL)
    else:
        r, live, s, b = _row_tile(block, S, B, H, LAYOUT, ROWS, INT64)
        tab = s * stride_tab_p          # (rows by token index; with a row index, found later)
        if PER_ENTRY:
            tab += b * stride_tab_b
        _rotate_pairs(x_ptr, y_ptr, cos_ptr, sin_ptr, r, live, tab, s, b, index_ptr,
                      stride_rows_b, stride_tab_p, stride_tab_axis, row_flags_ptr, D, R,
                      BACKWARD, SIGNED, KEEP_TABLE, True, AXIS_H_FROM, AXIS_W_FROM,
                      PAIRS_EQUAL)


@triton.jit
def _rope_rows_kernel(
    q_ptr, q_out_ptr, k_ptr, k_out_ptr,  # contiguous in LAYOUT; outputs fresh, same layout
    cos_ptr, sin_ptr,                    # cos, s' of the pre-pass (SIGNED), or the caller's
    index_ptr,                           # None, or each token's row [NB * S] int32 (-1: none),
                                         # or (LAYOUT 3) the packed sequences' cu_seqlens
    row_flags_ptr,                       # None, or the pre-pass's int8 flag per row: 0 where
                                         # every pair's members are equal (read half)
    S, B, HQ, HK,                        # (LAYOUT 3: S tokens, B the positions each sequence's
                                         # programs cover)
    stride_tab_p, stride_tab_b,          # a token's row: s * stride_tab_p (+ b * stride_tab_b),
                                         # or token_rows[s + b * stride_rows_b] * stride_tab_p
    stride_rows_b,
    stride_tab_axis,                     # (one table per axis) the next axis's table
    D: tl.constexpr, R: tl.constexpr,
    LAYOUT: tl.constexpr,                # 0 sbhd (thd: B = 1), 1 bshd, 2 bhsd, 3 thd by sequence
    INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    SIGNED: tl.constexpr,                # sin_ptr holds s' (signed and transposed as needed)
    PER_ENTRY: tl.constexpr,             # a table row per (token, batch entry)
    KEEP_TABLE: tl.constexpr,            # load the table with evict_last (B > 1, one table)
    AXIS_H_FROM: tl.constexpr,           # Qwen2-VL's sections: pairs [0, AXIS_H_FROM) read the
    AXIS_W_FROM: tl.constexpr,           # time axis's table, then height's, from AXIS_W_FROM
                                         # width's (both R/2: one table)
    XBLOCK: tl.constexpr, INT64: tl.constexpr,
    WAIT_PRIOR: tl.constexpr = False,    # launched early (programmatic dependent launch): wait
                                         # for the kernel before, the pre-pass, to finish first
    PAIRS_EQUAL: tl.constexpr = False,   # (SIGNED, rotate-half) no row's pairs differ: member
                                         # b's entries are a's; row_flags_ptr None
):
    if WAIT_PRIOR:
        gdc_wait()
    # Program blocks of q's elements first, then of k's (without k the grid has q's only), or
    # by chunks of tokens, q's then k's (qk_by_tokens); with LAYOUT 3 the blocks of one
    # sequence's first B positions, the sequence program_id(1).
    pid = tl.program_id(0)
    seq = tl.program_id(1)
    rows = B if LAYOUT == 3 else S * B
    # interleaved pairs, one table per axis whose sections do not start at multiples of 8
    # pairs, or a head dim or half rotary dim that is no power of two: XBLOCK elements per
    # program; rotate-half: ROWS whole head rows, both members of each pair in one thread.
    # (Rows of pairs pad a head to powers of two: at d = 80 a third of every program's lanes
    # idle, and apply_rope at s4096 b8 h32 d80 bf16 ran at 88.4 % of a copy where the pass by
    # element had 95 %, H200, results/generations-*.csv.)
    ROWS: tl.constexpr = XBLOCK // tile_width(D)
    BY_ELEMENT: tl.constexpr = by_element(D, R, INTERLEAVED, AXIS_H_FROM, AXIS_W_FROM)
    if INT64:               # q's element count passes 2^31: count it in int64
        rows = tl.full([], 0, tl.int64) + rows
    if BY_ELEMENT:
        q_blocks = tl.cdiv(rows * HQ * D, XBLOCK)
    else:
        q_blocks = tl.cdiv(rows * HQ, ROWS)
    on_q = pid < q_blocks
    q_block = pid
    k_block = pid - q_blocks
    if qk_by_tokens(LAYOUT, PER_ENTRY, AXIS_H_FROM, R, BY_ELEMENT):
        # chunks of ROWS token rows (ROWS * HQ rows of q, ROWS * HK of k): a chunk's HQ
        # programs of q, then its HK of k, which find the chunk's cos/sin rows still in L2
        chunk = pid // (HQ + HK)
        within = pid - chunk * (HQ + HK)
        on_q = within < HQ
        q_block = chunk * HQ + within
        k_block = chunk * HK + (within - HQ)
    if on_q:
        if BY_ELEMENT:
            _rotate_flat(q_ptr, q_out_ptr, cos_ptr, sin_ptr, index_ptr, q_block, seq, S, B, HQ,
                         stride_tab_p, stride_tab_b, stride_rows_b, stride_tab_axis, D, R,
                         LAYOUT, INTERLEAVED, BACKWARD, SIGNED, PER_ENTRY, KEEP_TABLE,
                         AXIS_H_FROM, AXIS_W_FROM, XBLOCK, INT64)
        else:
            _rotate_rows(q_ptr, q_out_ptr, cos_ptr, sin_ptr, index_ptr, row_flags_ptr,
                         q_block, seq, S, B, HQ, stride_tab_p, stride_tab_b, stride_rows_b,
                         stride_tab_axis, D, R, LAYOUT, BACKWARD, SIGNED, PER_ENTRY, KEEP_TABLE,
                         AXIS_H_FROM, AXIS_W_FROM, ROWS, INT64, PAIRS_EQUAL)
        if LAYOUT == 3:
            if pid == q_blocks - 1:     # a sequence longer than the table: the rest is NaN
                _sequence_tail(q_ptr, q_out_ptr, seq, index_ptr, S, B, HQ, D, R, XBLOCK, INT64)
    elif k_ptr is not None:
        if BY_ELEMENT:
            _rotate_flat(k_ptr, k_out_ptr, cos_ptr, sin_ptr, index_ptr, k_block, seq, S,
                         B, HK, stride_tab_p, stride_tab_b, stride_rows_b, stride_tab_axis, D,
                         R, LAYOUT, INTERLEAVED, BACKWARD, SIGNED, PER_ENTRY, KEEP_TABLE,
                         AXIS_H_FROM, AXIS_W_FROM, XBLOCK, INT64)
        else:
            _rotate_rows(k_ptr, k_out_ptr, cos_ptr, sin_ptr, index_ptr, row_flags_ptr,
                         k_block, seq, S, B, HK, stride_tab_p, stride_tab_b, stride_rows_b,
                         stride_tab_axis, D, R, LAYOUT, BACKWARD, SIGNED, PER_ENTRY, KEEP_TABLE,
                         AXIS_H_FROM, AXIS_W_FROM, ROWS, INT64, PAIRS_EQUAL)
        if LAYOUT == 3:
            if pid == tl.num_programs(0) - 1:
                _sequence_tail(k_ptr, k_out_ptr, seq, index_ptr, S, B, HK, D, R, XBLOCK, INT64)
