"""Host side of the finished kernel: strided views, tile heuristics, one launch.

Arguments here are already validated (ropelib.validation); this module only maps tensors to
the kernel's [S, B, H, D] view and picks tile sizes.
"""
import inspect
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import INTERPRET
from .common import BF16_RTNE
from .fused import _rope_kernel

_I32_LIMIT = 2**31 - 1


@dataclass
class Segment:
    """One rotated tensor as the kernel sees it: x[S, B, H, D] -> y, heads possibly grouped.

    Head h lives at (h // hpg) * stride_g + (h % hpg) * stride_h; hpg = 1 for plain tensors,
    > 1 for the q of a packed QKV ([.., G, hpg * D]).
    """
    x: torch.Tensor
    y: torch.Tensor
    heads: int
    x_strides: tuple   # (s, b, g, h, d)
    y_strides: tuple
    hpg: int = 1

    @staticmethod
    def of(x4: torch.Tensor, y4: torch.Tensor) -> "Segment":
        """A plain [S, B, H, D] strided view pair."""
        xs, ys = x4.stride(), y4.stride()
        return Segment(x4, y4, x4.shape[2], (xs[0], xs[1], xs[2], 0, xs[3]),
                       (ys[0], ys[1], ys[2], 0, ys[3]))

    def max_offset(self, S, B, D) -> int:
        def span(st):
            g_max = (self.heads - 1) // self.hpg
            h_max = min(self.hpg, self.heads) - 1
            return (S - 1) * abs(st[0]) + (B - 1) * abs(st[1]) + g_max * abs(st[2]) \
                + h_max * abs(st[3]) + (D - 1) * abs(st[4])
        return max(span(self.x_strides), span(self.y_strides))


@dataclass
class Table:
    """cos/sin (or angle) table rows indexed by position (and optionally batch)."""
    c: torch.Tensor                  # cos table, or angles when s is None
    s: Optional[torch.Tensor]        # sin table (same strides as c), None for angles
    length: int                      # P: number of positions
    stride_p: int
    stride_b: int                    # 0 when shared across the batch
    stride_d: int
    same_halves: bool = False        # columns of each pair hold equal values (checked by caller)


@dataclass
class Positions:
    explicit: Optional[torch.Tensor] = None   # [B or 1, S] ints; strides used as given
    start: Optional[torch.Tensor] = None      # [B] ints
    cp_size: int = 1
    cp_rank: int = 0


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


# Tile knobs: (elements per thread, warps) per program, measured on an H100 (benchmarks/NOTES.md,
# probe-h100-20261122-session2.log). 16-bit inputs with a batch loop of >= 4 entries stream best
# with many threads (8 x 16 warps); without one (thd, batch < 4) the cos/sin of a program's
# tokens is evaluated per thread and not reused, so fewer threads with more elements each win
# (32 x 4 warps). The environment overrides them for tuning runs (benchmarks/probe.py).
def _knob(name, default):
    v = os.environ.get(name)
    return tuple(int(t) for t in v.split(",")) if v else default


TILE_LOOP = _knob("ROPELIB_TILE_LOOP", (8, 16))       # 16-bit, batch loop of >= 4 entries
TILE_NOLOOP = _knob("ROPELIB_TILE_NOLOOP", (32, 4))   # 16-bit, shorter batch loop
TILE_FP32 = _knob("ROPELIB_TILE_FP32", (16, 8))       # 32- and 64-bit
BATCH_LOOP_MIN = 4
SEGMENT_BLOCK_H = os.environ.get("ROPELIB_SEGMENT_BLOCK_H", "min")   # "min" or "max" (see below)
MIN_TILE = 512          # elements: the smallest tile an underfilled grid is split into


@lru_cache(maxsize=4096)
def pick_tiles(S: int, B: int, heads: tuple, R: int, D: int, elem_size: int, on_cuda: bool,
               device_index: int = 0):
    """(BLOCK_S, BLOCK_H, B_CHUNK, num_warps) for this shape; `heads` = heads of each segment.

    GPU: (elements per thread, warps) from the tile knobs above; a program's tile covers heads
    first, then tokens. The batch is split into chunks only when there would otherwise be too few
    programs to fill the machine (decode-sized inputs); 16-bit inputs whose programs then loop
    over fewer than BATCH_LOOP_MIN batch entries take TILE_NOLOOP. Interpreter: big tiles, since
    every program instance costs milliseconds.
    """
    row = 2 * triton.next_power_of_2(max(R // 2, 1)) + (triton.next_power_of_2(D - R) if D > R else 0)
    H = max(heads)
    if INTERPRET or not on_cuda:
        block_h = min(triton.next_power_of_2(H), 16)
        block_s = min(triton.next_power_of_2(S), _pow2_floor(2048 // (block_h * row)), 32)
        return block_s, block_h, B, 4
    want = 4 * _sm_count(device_index)
    # Several segments (q and k of GQA: 32 and 8 heads) share one BLOCK_H: sized to the largest,
    # the smaller segment's programs run mostly masked; sized to the smallest, none do.
    H_block = min(h for h in heads if h) if SEGMENT_BLOCK_H == "min" else H

    def tiles_for(ept, num_warps):
        target = ept * 32 * num_warps
        while True:
            block_h = min(triton.next_power_of_2(H_block), max(_pow2_floor(target // row), 1))
            block_s = min(triton.next_power_of_2(S), max(_pow2_floor(target // (block_h * row)), 1), 16)
            tiles = triton.cdiv(S, block_s) * sum(triton.cdiv(h, block_h) for h in heads if h)
            chunk = B
            while chunk > 1 and tiles * triton.cdiv(B, chunk) < want:
                chunk = triton.cdiv(chunk, 2)
            # still too few programs with one batch entry each (decode): smaller tiles
            if chunk > 1 or tiles * B >= want or target <= MIN_TILE or block_h * block_s == 1:
                break
            target //= 2
        while triton.cdiv(B, chunk) > 65535:
            chunk *= 2
        if block_s * block_h * row < 32 * num_warps * 4:   # tiny tiles: fewer threads
            num_warps = max(1, block_s * block_h * row // 128)
        return block_s, block_h, chunk, num_warps

    if elem_size > 2:
        return tiles_for(*TILE_FP32)
    picked = tiles_for(*TILE_LOOP)
    return picked if picked[2] >= BATCH_LOOP_MIN else tiles_for(*TILE_NOLOOP)


# Compiled kernels by arguments: Triton's generic dispatch cost ~150 us per call for a kernel
# with this many arguments (measured on an H100, benchmarks/NOTES.md). Calling the compiled
# kernel directly costs far less. The key holds every integer argument's exact value, each
# tensor's dtype and 16-byte alignment and the constexprs: a superset of what Triton
# specialises on, so a cached kernel is only reused where Triton would reuse it.
_COMPILED: dict = {}
FAST_LAUNCH = os.environ.get("ROPELIB_FAST_LAUNCH", "1") == "1" and not INTERPRET
# Streaming cache hints: x is read once (evict first), y written once (.cs, streaming).
# Measured on an H100 (benchmarks/NOTES.md): no gain, so off by default.
STREAM_HINTS = os.environ.get("ROPELIB_STREAM_HINTS", "0") == "1"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _np2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _key(tensors, ints, consts, num_warps, device):
    return (ints, tuple([(t.dtype, t.data_ptr() & 15 == 0) for t in tensors]),
            tuple(consts.values()), num_warps, device.index)


def _dispatch(grid, tensors, ints, consts, num_warps, device, key=None):
    """Launch through the cached compiled kernel; the first call compiles through Triton."""
    global FAST_LAUNCH
    if not FAST_LAUNCH:
        _rope_kernel[grid](*tensors, *ints, **consts, num_warps=num_warps)
        return None
    key = key or _key(tensors, ints, consts, num_warps, device)
    runner = _COMPILED.get(key)
    if runner is None:
        ck = _rope_kernel[grid](*tensors, *ints, **consts, num_warps=num_warps)
        if len(_COMPILED) < 4096:
            try:
                _COMPILED[key] = (ck[grid], tuple(consts.values()))
            except Exception as e:   # a Triton whose CompiledKernel API differs
                FAST_LAUNCH = False
                warnings.warn(f"ropelib: direct kernel launch unavailable ({e!r}); "
                              "using Triton's dispatch")
        return _COMPILED.get(key)
    run, const_values = runner
    run(*tensors, *ints, *const_values)
    return runner


class Prepared:
    """One planned launch with its 12 pointer arguments left open.

    Everything else (grid, integer arguments, constexprs) is fixed, so `run(tensors)` may be
    called again with other tensors of the same dtypes, 16-byte alignment, shapes and strides
    (callers key their caches on exactly that): it then costs one call of the compiled kernel.
    """
    __slots__ = ("grid", "ints", "consts", "num_warps", "device", "key", "_run", "_tail",
                 "_stream")

    def __init__(self, grid, ints, consts, num_warps, device, tensors):
        self.grid, self.ints, self.consts = grid, ints, consts
        self.num_warps, self.device = num_warps, device
        self.key = _key(tensors, ints, consts, num_warps, device) if FAST_LAUNCH else None
        self._run = self._tail = None
        self._stream = False

    def run(self, tensors) -> None:
        if self._run is not None and FAST_LAUNCH:
            # Pointers go in as ints: Triton's launcher then skips, per tensor, a data_ptr() call
            # and a driver query that checks the pointer (the tensors were validated when the
            # call was planned), and the stream comes from torch directly. Measured on an H100
            # host: see benchmarks/NOTES.md (version 9).
            ptrs = [t.data_ptr() for t in tensors]
            if self._stream:
                self._run(*ptrs, *self._tail, stream=_current_stream(self.device.index))
            else:
                self._run(*ptrs, *self._tail)
            return
        runner = _dispatch(self.grid, tensors, self.ints, self.consts, self.num_warps,
                           self.device, self.key)
        if runner is not None and FAST_LAUNCH:
            self._run, self._tail = runner[0], self.ints + runner[1]
            self._stream = _takes_stream(self._run) and self.device.index is not None


# The current CUDA stream of a device as an int (torch's C accessor where it has one).
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def _takes_stream(fn) -> bool:
    """Does Triton's compiled-kernel runner accept the stream as a keyword (Triton >= 3.0)?"""
    try:
        return "stream" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def launch(q: Segment, q_table: Table, pos: Positions, **kw) -> None:
    """Run the finished kernel once over q (and k, and the v copy) in a single launch."""
    prepared, tensors = prepare(q, q_table, pos, **kw)
    prepared.run(tensors)


def prepare(q: Segment, q_table: Table, pos: Positions, *, S: int, B: int, R: int, D: int,
            interleaved: bool, backward: bool, copy_pass: bool,
            k: Optional[Segment] = None, k_table: Optional[Table] = None,
            v: Optional[Segment] = None, tiles: Optional[tuple] = None):
    """Plan one launch: (Prepared, its 12 pointer tensors in kernel order).

    Pointer order: q.x, q.y, k.x, k.y, v.x, v.y, q cos (or angles), q sin, k cos, k sin,
    explicit positions, start positions; unused slots repeat q.x (or the cos table)."""
    dev = q.x.device
    heads = (q.heads, k.heads if k is not None else 0, v.heads if v is not None else 0)
    DV = v.x.shape[-1] if v is not None else 1
    on_cuda = dev.type == "cuda"
    block_s, block_h, chunk, num_warps = tiles or pick_tiles(
        S, B, heads, R, D, q.x.element_size(), on_cuda,
        (dev.index if dev.index is not None else torch.cuda.current_device()) if on_cuda else 0)
    nqb = _cdiv(q.heads, block_h)
    nkb = _cdiv(k.heads, block_h) if k is not None else 0
    nvb = _cdiv(v.heads, block_h) if v is not None else 0
    grid = (_cdiv(S, block_s), nqb + nkb + nvb, _cdiv(B, chunk))

    int64 = any(seg.max_offset(S, B, DV if seg is v else D) > _I32_LIMIT - 1024
                for seg in (q, k, v) if seg is not None)
    kt = k_table if k_table is not None else q_table
    ks = k if k is not None else q
    vs = v if v is not None else q
    explicit = pos.explicit
    if explicit is not None:
        pos_ptr, psb, pss = explicit, explicit.stride(0), explicit.stride(1)
    else:
        pos_ptr, psb, pss = q.x, 0, 0
    table_per_batch = (pos.start is not None
                       or (explicit is not None and explicit.shape[0] > 1)
                       or q_table.stride_b != 0 or kt.stride_b != 0)
    tensors = (
        q.x, q.y, ks.x, ks.y, vs.x, vs.y,
        q_table.c, q_table.s if q_table.s is not None else q_table.c,
        kt.c, kt.s if kt.s is not None else kt.c,
        pos_ptr, pos.start if pos.start is not None else q.x)
    ints = (
        S, B, q.heads, ks.heads, vs.heads, q.hpg, q_table.length, pos.cp_size, pos.cp_rank,
        *q.x_strides, *q.y_strides,
        ks.x_strides[0], ks.x_strides[1], ks.x_strides[2], ks.x_strides[4],
        ks.y_strides[0], ks.y_strides[1], ks.y_strides[2], ks.y_strides[4],
        vs.x_strides[0], vs.x_strides[1], vs.x_strides[2], vs.x_strides[4],
        vs.y_strides[0], vs.y_strides[1], vs.y_strides[2], vs.y_strides[4],
        q_table.stride_p, q_table.stride_b, q_table.stride_d,
        kt.stride_p, kt.stride_b, kt.stride_d,
        psb, pss,
        nqb, nkb, chunk,
    )
    consts = dict(
        R=R, D=D, DV=DV,
        BLOCK_S=block_s, BLOCK_H=block_h, BLOCK_HALF=_np2(max(R // 2, 1)),
        BLOCK_PASS=_np2(D - R) if D > R else 0,
        BLOCK_DV=_np2(DV),
        INTERLEAVED=interleaved, BACKWARD=backward, FROM_ANGLES=q_table.s is None,
        SAME_HALVES=q_table.same_halves and kt.same_halves,
        EXPLICIT_POS=explicit is not None, HAS_START=pos.start is not None,
        HAS_CP=pos.cp_size > 1, TABLE_PER_BATCH=table_per_batch, COPY_PASS=copy_pass,
        ACCURATE=not INTERPRET, INT64=int64,
        # fp64 math when the input or the output (HF promotes with cos) is fp64
        CDT=tl.float64 if torch.float64 in (q.x.dtype, q.y.dtype) else tl.float32,
        BF16_RTNE=BF16_RTNE,
        LOAD_EVICT="evict_first" if STREAM_HINTS else "",
        STORE_CACHE=".cs" if STREAM_HINTS else "",
    )
    return Prepared(grid, ints, consts, num_warps, dev, tensors), tensors
