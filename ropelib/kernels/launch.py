"""Host side of the finished kernel: a planner and one launch path.

`plan(...)` turns what is to be rotated (strided [S, B, H, D] views, tables, positions, options)
into a `Launch`: the grid, the warps and every kernel argument by name. `run(launch)` starts it.
Both see only shapes, strides, dtypes and options, never tensor values, so the same code runs
eagerly, under torch.compile (sizes may be symbolic) and while a CUDA graph is captured.
Arguments are validated before they get here (ropelib.validation).
"""
from typing import NamedTuple, Optional

import torch

from ..frequencies import EXACT_POSITIONS
from ..runtime import INTERPRET
from .direct import DirectLauncher
from .fused import _exact_angles_kernel, _rope_kernel
from .tiles import (BATCH_LOOP_MIN, MIN_TILE, PROGRAMS_PER_SM, TILE_LOOP, TILE_NOLOOP, TILE_WIDE,
                    device_index, device_tiles, exact_loop_tile)

_I32_LIMIT = 2**31 - 1


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


# The kernel's pointer arguments, in its order. An unused one is None.
POINTERS = ("q_ptr", "q_out_ptr", "k_ptr", "k_out_ptr", "cos_ptr", "sin_ptr", "k_cos_ptr",
            "k_sin_ptr", "position_ids_ptr", "cu_seqlens_ptr", "start_ptr")


class Launch:
    """One planned launch of the finished kernel: the grid, the warps and every argument except
    the pointers, by name; the pointers' dtypes and device. Pointers are bound per call, so one
    Launch serves every call with the same shapes, strides, dtypes and options.

    Equal Launches compare and hash equal (used to find the compiled kernel of an eager launch).
    """
    __slots__ = ("grid", "num_warps", "args", "dtypes", "device", "_key", "_hash")

    def __init__(self, grid: tuple, num_warps: int, args: dict, dtypes: tuple, device):
        self.grid, self.num_warps, self.args = grid, num_warps, args
        self.dtypes, self.device = dtypes, device
        self._key = self._hash = None

    def key(self) -> tuple:
        if self._key is None:   # only for concrete sizes (an eager launch), never while tracing
            self._key = (self.grid, self.num_warps, tuple(self.args.items()), self.dtypes,
                         self.device)
            self._hash = hash(self._key)
        return self._key

    def __eq__(self, other):
        return self is other or (isinstance(other, Launch) and self.key() == other.key())

    def __hash__(self):
        if self._hash is None:
            self.key()
        return self._hash


# --- tiles ----------------------------------------------------------------------------------

def needs_int64(tensors) -> bool:
    """Does an element offset into one of these tensors (any strides) come near int32's limit?"""
    return any(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)
               > _I32_LIMIT - 1024 for t in tensors)


def pow2_at_least(n: int, cap: int) -> int:
    """min(cap, next power of two >= n), by comparisons only (n may be a symbolic size)."""
    p = 1
    while p < cap and p < n:
        p *= 2
    return p


def pow2_at_most(n: int) -> int:
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def cdiv(a, b):
    return (a + b - 1) // b


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
            num_warps = max(1, block_s * block_h * row // 128)
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


def plan(q: View, q_out: View, table: Table, positions: Positions, *, R: int,
         interleaved: bool, backward: bool, copy_pass: bool,
         k: Optional[View] = None, k_out: Optional[View] = None,
         k_table: Optional[Table] = None, tiles: Optional[tuple] = None):
    """One launch over q (and k): (Launch, its pointer arguments in POINTERS order).

    q and q_out (k and k_out) are the [S, B, H, D] views the kernel reads and writes; `table`
    serves q and, unless `k_table` is given, k (a given k_table has the same strides).
    """
    x = q.tensor
    S, B, D = x.shape[0], x.shape[1], q.features()
    HK = k.heads if k is not None else 0
    on_gpu = x.device.type == "cuda" and not INTERPRET
    sm, knobs = device_tiles(device_index(x.device)) if on_gpu else (None, {})
    if table.exact and on_gpu:
        knobs = dict(knobs, tile_loop=exact_loop_tile(device_index(x.device)))
    block_s, block_h, chunk, num_warps = tiles or pick_tiles(
        S, B, (q.heads, HK), R, D, x.element_size(), sm, **knobs)
    grid = (cdiv(S, block_s), cdiv(q.heads, block_h) + cdiv(HK, block_h), cdiv(B, chunk))

    views = [v for v in (q, q_out, k, k_out) if v is not None]
    int64 = any(_span(v, S, B, D) > _I32_LIMIT - 1024 for v in views)
    has_k = k is not None
    kt = (k_table or table) if has_k else None
    tab_b, tab_p, tab_d = table.strides()
    pos = positions
    ids, cu = pos.position_ids, (pos.cu_seqlens if pos.position_ids is None else None)
    ids_b = ids.stride(0) if ids is not None and ids.shape[0] > 1 else 0
    ids_s = ids.stride(1) if ids is not None else 0
    n_seq = cu.shape[0] - 1 if cu is not None else 0
    per_batch = (cu is None and pos.start is not None) or ids_b != 0 or tab_b != 0
    pointers = (x, q_out.tensor, k.tensor if has_k else None, k_out.tensor if has_k else None,
                table.cos, table.sin, kt.cos if has_k else None, kt.sin if has_k else None,
                ids, cu, pos.start)
    no_k = (0, 0, 0, 0, 0)
    args = dict(
        S=S, B=B, HQ=q.heads, HK=HK, P=table.rows, N_SEQ=n_seq,
        cp_size=pos.cp_size, cp_rank=pos.cp_rank,
        **dict(zip(("stride_q_s", "stride_q_b", "stride_q_g", "stride_q_h", "stride_q_d"),
                   q.strides)),
        **dict(zip(("stride_qo_s", "stride_qo_b", "stride_qo_g", "stride_qo_h", "stride_qo_d"),
                   q_out.strides)),
        **dict(zip(("stride_k_s", "stride_k_b", "stride_k_h", "stride_k_d"),
                   _plain(k.strides if has_k else no_k))),
        **dict(zip(("stride_ko_s", "stride_ko_b", "stride_ko_h", "stride_ko_d"),
                   _plain(k_out.strides if has_k else no_k))),
        stride_tab_b=tab_b, stride_tab_p=tab_p, stride_tab_d=tab_d,
        stride_ids_b=ids_b, stride_ids_s=ids_s,
        R=R, D=D, HPG=q.hpg,
        BLOCK_S=block_s, BLOCK_H=block_h, BLOCK_HALF=pow2_at_least(R // 2, 1 << 30),
        BLOCK_PASS=pow2_at_least(D - R, 1 << 30) if D > R else 0,
        INTERLEAVED=interleaved, BACKWARD=backward,
        TABLE_PER_BATCH=per_batch, COPY_PASS=copy_pass, INT64=int64,
    )
    dtypes = tuple(t.dtype if t is not None else None for t in pointers)
    return Launch(grid, num_warps, args, dtypes, x.device), pointers


def _plain(strides: tuple) -> tuple:
    """(s, b, g, h, d) of an ungrouped view -> the kernel's (s, b, h, d) for k."""
    return strides[0], strides[1], strides[2], strides[4]


# --- the launch path ------------------------------------------------------------------------

def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta"


def _eager(t: torch.Tensor) -> bool:
    """A plain tensor outside any tracing: the launch can go straight to the compiled kernel."""
    return (type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0)


def start(direct: DirectLauncher, launch: Launch, pointers: tuple) -> None:
    """Start direct.kernel (pointers in direct.pointer_names order): eagerly through ropelib's
    direct launcher (kernels/direct.py); while torch.compile or another tracer is at work,
    through torch.library.wrap_triton, so the Triton kernel itself lands in the graph; in the
    interpreter as Python on CPU tensors (and not at all when the op is only being evaluated
    for its output shapes). Every kernel family (RoPE, multi-axis, KV-cache write) starts here."""
    q = pointers[0]
    named = dict(zip(direct.pointer_names, pointers))
    if INTERPRET:
        if not _is_fake(q):
            direct.kernel[launch.grid](**named, **launch.args, num_warps=launch.num_warps)
        return
    if _eager(q):
        direct(launch, pointers)
        return
    torch.library.wrap_triton(direct.kernel)[launch.grid](**named, **launch.args,
                                                          num_warps=launch.num_warps)


def run(launch: Launch, pointers: tuple) -> None:
    """Start the finished RoPE kernel (pointers in POINTERS order); see `start`."""
    start(DIRECT, launch, pointers)


DIRECT = DirectLauncher(_rope_kernel, POINTERS)


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
