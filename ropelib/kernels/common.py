"""The @triton.jit helpers the kernel families share (RoPE, QK-norm + RoPE, the KV-cache write,
multi-axis RoPE), and the two settings that follow from where the kernels run.

    batch_range     the batch entries of a program (grid axis 2 splits the batch into chunks)
    pair_features   the two features (d_a, d_b) of each rotated pair: rotate-half or interleaved
    load_table      cos and sin of table rows: angles (sin_ptr None) or cos and sin tables
    cos_sin         cos and sin of angles (libdevice's on the GPU)
    nan_unless      a table tile made NaN where a position is outside the table, once per tile
    rotate_pair     the rotation, one fma per output in Transformer Engine's order
                    (rotated_a, rotated_b: each output alone)
    store_pair      a tile of rotated pairs stored, rounded once, NaN where a position is bad
    dual_chunk_position   TE's context-parallel map from a rank's token to its global position
    tile_width      the power-of-two width of a tile of n features, for constexpr n
    contiguous_strides    the strides of a fresh output, from its shape and layout
    round_to        the one rounding at the store (round-to-nearest-even, also in the interpreter)
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..runtime import INTERPRET

# Accurate sin/cos (libdevice's cosf/sinf, which reduce any angle exactly, as TE's sincosf) on
# the GPU; the interpreter has no libdevice, and numpy's cos/sin are accurate too.
ACCURATE = tl.constexpr(not INTERPRET)

# Triton's CPU interpreter converts fp32 -> bf16 by truncation (round toward zero), while the
# GPU rounds to nearest even. round_to rounds by bits in the interpreter so both modes give the
# same bits: one round-to-nearest-even, as torch's .to(torch.bfloat16) does.
BF16_RTNE: bool = INTERPRET
ROUND_BF16_RTNE = tl.constexpr(BF16_RTNE)


class ConstexprRule:
    """A function of constexprs that a kernel calls while it compiles, held as a constexpr
    global (`tile_width = tl.constexpr(_TileWidth())`): it runs in every Triton from 3.2
    (triton.constexpr_function only exists from 3.6), and a planner can call the same rule.
    Subclasses define __call__, returning a tl.constexpr."""

    # Triton puts the constexpr globals a kernel uses into its cache key, by repr and equality:
    # both must be the same in every process, or no compiled kernel would be found on disk. And
    # torch.compile's Inductor, which writes a user kernel's source out with its globals, writes
    # `tile_width = tl.constexpr(<repr>)`: the repr is an expression that makes one again.
    def __repr__(self):
        cls = type(self)
        return f"__import__({cls.__module__!r}, fromlist=[{cls.__name__!r}]).{cls.__name__}()"

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(repr(self))


class _TileWidth(ConstexprRule):
    """(n, at_least=0) -> the smallest power of two >= n (0 for n <= 0), and >= at_least: the
    width of a tile that holds n features (tl.arange needs a power of two, tl.dot 16), for
    constexpr n inside @triton.jit code."""

    def __call__(self, n, at_least=0):
        n, at_least = getattr(n, "value", n), getattr(at_least, "value", at_least)
        return tl.constexpr(max(at_least, 0 if n <= 0 else 1 << (n - 1).bit_length()))


tile_width = tl.constexpr(_TileWidth())


@triton.jit
def round_to(y, DTYPE: tl.constexpr, BF16_RTNE: tl.constexpr):
    """Cast fp32 (or fp64) `y` to DTYPE with round-to-nearest-even, also in the interpreter."""
    if BF16_RTNE and DTYPE == tl.bfloat16:
        if y.dtype == tl.float64:
            y = y.to(tl.float32)   # fp64 math (fp64 tables or outputs) rounds through fp32 here
        u = y.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16    # NaN stays NaN, overflow goes to inf
        return u.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(DTYPE)


# On the GPU a tile of cos values made NaN where a position is outside the table (nan_unless)
# passes through an opaque register move. Without it LLVM folds the select into every fma that
# reads the tile (fma(x, NaN, z) is NaN) and the guard is back on every output element, where it
# cost the finished kernel one SEL and 1.5 PRMT an element on an H200 (bf16: the compiler
# unpacked the rounded halves, selected each against a bf16 NaN and packed them again;
# benchmarks/results/ladder_opcodes_per_opcode-nvidia-h200-20261130-0313-guard-per-output.csv).
# With the move: rung 6's count of both, and its time within 0.5 % under the profiler
# (ladder_opcodes_per_opcode-nvidia-h200.csv, ladder_opcodes_ncu-nvidia-h200.csv).
OPAQUE_NAN = tl.constexpr(not INTERPRET)


@triton.jit
def nan_unless(ok, v):
    """v (fp32 or fp64, a table tile) where ok, NaN elsewhere, as a value the compiler cannot see
    into: the select stays where it is made, once per table element, not per output."""
    v = tl.where(ok, v, float("nan"))
    if OPAQUE_NAN:
        if v.dtype == tl.float64:
            v = tl.inline_asm_elementwise("mov.b64 $0, $1;", "=l,l", [v], dtype=tl.float64,
                                          is_pure=True, pack=1)
        else:
            v = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.float32,
                                          is_pure=True, pack=1)
    return v


@triton.jit
def cos_sin(angle, ACCURATE: tl.constexpr):
    """cos and sin of `angle` (any shape; fp32 or fp64)."""
    if ACCURATE:
        return libdevice.cos(angle), libdevice.sin(angle)
    else:
        return tl.cos(angle), tl.sin(angle)


@triton.jit
def offset_int(i, INT64: tl.constexpr):
    """i as offsets are computed from it: int64 when the tensors may pass 2^31 elements. (i may
    be a Python int: a loop counter in the interpreter.)"""
    if INT64:
        j = tl.cast(i, tl.int64)
    else:
        j = i
    return j


@triton.jit
def batch_range(B, ENTRIES: tl.constexpr = 0):
    """The batch entries [b_lo, b_hi) of this program: grid axis 2 splits the B entries into
    chunks of cdiv(B, programs on that axis), so the planner's choice of grid is the only one.
    ENTRIES > 0: the planner's chunk, fixed when the kernel is compiled (short chunks: decode's
    one entry a program), so the program's first entry needs no division. A division by the
    runtime grid is some 25 dependent instructions (a reciprocal, a float-to-int conversion,
    corrections) that every address of x waits for: at decode size, where a program's time is
    one chain of waits, a part of that chain."""
    if ENTRIES > 0:
        chunk = ENTRIES
    else:
        chunk = tl.cdiv(B, tl.num_programs(2))
    b_lo = tl.program_id(2) * chunk
    return b_lo, tl.minimum(b_lo + chunk, B)


@triton.jit
def pair_features(j, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """j [BLOCK_HALF] pair indices -> (d_a, d_b): rotate-half pairs j with j + R/2, interleaved
    pairs 2j with 2j + 1."""
    if INTERLEAVED:
        d_a = 2 * j
        d_b = 2 * j + 1
    else:
        d_a = j
        d_b = j + HALF
    return d_a, d_b


@triton.jit
def head_tile(pid_s, h0, S, H, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
              BLOCK_HALF: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
              INT64: tl.constexpr):
    """A program's tile of BLOCK_S tokens from pid_s * BLOCK_S, BLOCK_H heads from h0 and the
    pairs of a head: s_idx [BLOCK_S] and s_off (its offsets, int64 when INT64), h_idx [BLOCK_H],
    the pairs' features d_a, d_b [BLOCK_HALF], and the masks row_ok [BLOCK_S, BLOCK_H] (token
    and head in range), m [BLOCK_S, BLOCK_H, BLOCK_HALF] (and the pair) and tab_mask
    [BLOCK_S, 1, BLOCK_HALF] (token and pair: a table row)."""
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    h_idx = h0 + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    d_a, d_b = pair_features(j, HALF, INTERLEAVED)
    if INT64:
        s_off = s_idx.to(tl.int64)
    else:
        s_off = s_idx
    row_ok = (s_idx < S)[:, None] & (h_idx < H)[None, :]
    m = row_ok[:, :, None] & (j < HALF)[None, None, :]
    tab_mask = (s_idx < S)[:, None, None] & (j < HALF)[None, None, :]
    return s_idx, s_off, h_idx, d_a, d_b, row_ok, m, tab_mask


@triton.jit
def load_table(cos_ptr, sin_ptr, rows, b, stride_tab_b, stride_tab_p, stride_tab_d, d_a, d_b,
               mask, CDT: tl.constexpr):
    """rows [BLOCK_S] of the table of batch entry b (batch stride 0: one table for all), pairs'
    features d_a, d_b [BLOCK_HALF] -> c_a, s_a, c_b, s_b, each [BLOCK_S, 1, BLOCK_HALF] in CDT.

    The table is angles (sin_ptr None: their cos and sin are evaluated here) or cos and sin.
    Angle tables usually repeat every frequency in both members of a pair (TE's cat([f, f]) or
    repeat_interleave(f, 2)): where the two columns of the rows read are equal bit for bit,
    sin/cos is evaluated once per pair, half the special-function work. The comparison is a
    reduction over the tile (block barriers): evaluating both columns without it was slower at
    decode (H200, s1 b64: 0.532 -> 0.506 of a copy; 0.579 -> 0.553 packed)."""
    base = rows[:, None, None].to(tl.int64) * stride_tab_p + b * stride_tab_b
    off_a = base + d_a[None, None, :] * stride_tab_d
    off_b = base + d_b[None, None, :] * stride_tab_d
    if sin_ptr is None:
        angle_a = tl.load(cos_ptr + off_a, mask=mask, other=0.0)
        angle_b = tl.load(cos_ptr + off_b, mask=mask, other=0.0)
        c_a, s_a = cos_sin(angle_a.to(CDT), ACCURATE)
        if cos_ptr.dtype.element_ty == tl.float64:
            bits = tl.int64
        else:
            bits = tl.int32
        differ = tl.max(tl.where(angle_a.to(bits, bitcast=True)
                                 == angle_b.to(bits, bitcast=True), 0, 1))
        if differ == 0:
            c_b = c_a
            s_b = s_a
        else:
            c_b, s_b = cos_sin(angle_b.to(CDT), ACCURATE)
    else:
        c_a = tl.load(cos_ptr + off_a, mask=mask, other=0.0).to(CDT)
        s_a = tl.load(sin_ptr + off_a, mask=mask, other=0.0).to(CDT)
        c_b = tl.load(cos_ptr + off_b, mask=mask, other=0.0).to(CDT)
        s_b = tl.load(sin_ptr + off_b, mask=mask, other=0.0).to(CDT)
    return c_a, s_a, c_b, s_b


@triton.jit
def rotate_pair(x_a, x_b, c_a, s_a, c_b, s_b):
    """y_a = x_a c_a - x_b s_a, y_b = x_b c_b + x_a s_b, each one fma in the order Transformer
    Engine's CUDA kernel contracts to. Left to the compiler, which product is fused may differ
    from one specialisation of a kernel to another (a packed-QKV launch and a plain one);
    written out, every launch, and the interpreter, round the same way."""
    return rotated_a(x_a, x_b, c_a, s_a), rotated_b(x_a, x_b, c_b, s_b)


@triton.jit
def rotated_a(x_a, x_b, c_a, s_a):
    """rotate_pair's y_a alone (for a caller that forms the two members in turn)."""
    return tl.fma(x_a, c_a, -(x_b * s_a))


@triton.jit
def rotated_b(x_a, x_b, c_b, s_b):
    """rotate_pair's y_b alone."""
    return tl.fma(x_b, c_b, x_a * s_b)


@triton.jit
def store_pair(rows, d_a, d_b, y_a, y_b, bad, mask):
    """Store a tile of pairs' members, y_a at features d_a and y_b at d_b of the rows `rows`
    ([BLOCK_S, BLOCK_H, 1] pointers), each with the one rounding to the output's dtype, and NaN
    where `bad` (a position outside the table: never a silently clamped row; None where the
    caller's cos is already NaN there, nan_unless)."""
    if bad is not None:
        y_a = tl.where(bad, float("nan"), y_a)
        y_b = tl.where(bad, float("nan"), y_b)
    tl.store(rows + d_a[None, None, :], round_to(y_a, rows.dtype.element_ty, ROUND_BF16_RTNE),
             mask=mask)
    tl.store(rows + d_b[None, None, :], round_to(y_b, rows.dtype.element_ty, ROUND_BF16_RTNE),
             mask=mask)


@triton.jit
def dual_chunk_position(idx, length, cp_size, cp_rank):
    """Index idx of a rank's `length` local tokens -> its index in the global sequence of
    cp_size * length tokens, under TE's dual-chunk split: rank r holds chunks r and
    2*cp_size-1-r of 2*cp_size (ropelib.reference.positions writes the same map in PyTorch)."""
    seg = length // 2
    return tl.where(idx < seg, cp_rank * seg + idx,
                    cp_size * length - (cp_rank + 1) * seg + (idx - seg))


@triton.jit
def contiguous_strides(S, B, H, D: tl.constexpr, LAYOUT: tl.constexpr, INT64: tl.constexpr,
                       ROW: tl.constexpr = 0):
    """(s, b, h) strides of a fresh contiguous tensor seen as [S, B, H, D] (features at stride 1):
    LAYOUT 0 sbhd (and thd, B = 1), 1 bshd, 2 Hugging Face's bhsd (kernels/planning.OUT_LAYOUT).
    ROW > 0 (layouts 0 and 1): a token's row of heads starts ROW elements after the one before
    (ROW >= H * D), as in a column slice of a token-major [tokens, ROW] buffer. Products in
    int64 when the tensor may pass 2^31 elements."""
    if INT64:
        unit = tl.full([], 1, tl.int64)
    else:
        unit = tl.full([], 1, tl.int32)
    if ROW > 0:
        tl.static_assert(LAYOUT != 2, "token rows of their own stride: sbhd, thd or bshd only")
        hd = unit * ROW
    else:
        hd = unit * H * D
    if LAYOUT == 1:
        st_s = hd
        st_b = hd * S
        st_h = unit * D
    elif LAYOUT == 2:
        st_s = unit * D
        st_b = hd * S
        st_h = unit * S * D
    else:
        st_s = hd * B
        st_b = hd
        st_h = unit * D
    return st_s, st_b, st_h
