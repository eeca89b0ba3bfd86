"""Notebook 13's RoPE puzzles: short Triton kernels to write or repair, graded on the CPU.

Each puzzle is one RoPE kernel with a fixed signature, built around a bug that real RoPE kernels
shipped with. Beside it: a plain-PyTorch spec (`spec_*`, fp64), a `check_*` that launches the
learner's kernel itself, and a worked solution (`solution_*_kernel`, shown folded in the
notebook; tests/test_puzzles.py runs the notebook with them filled in). A check

1. launches the kernel on small fresh inputs in Triton's interpreter, drawn from a seed that a
   ❌ line prints (`seed=` draws the same inputs again), with ropelib's own answers barred
   (`exercises.own_code`): the library's kernels, a kernel that calls its @triton.jit helpers,
   and the puzzle's worked solution itself fail, whatever they compute (a learner's
   copy of the solution, typed into the notebook, is the learner's code);
2. watches every load and store (`BoundsCheckedMemory`): each live lane must be an element of an
   input (loads) or of the output (stores). A lane outside them is reported and masked off
   before it touches memory, so a buggy kernel cannot read or overwrite what the check does not
   own. Outputs start as NaN, so an element the kernel never writes cannot pass;
3. compares the output with the spec and says what differs and where (the ❌ line states the
   symptom only); when the output is what a known wrong kernel gives, it keeps that diagnosis
   for `hint(n)`, which prints it with where to look (`hint(n, fix=True)`: the fix);
4. draws which elements of each tensor the kernel loaded and stored (inline, from the recorded
   accesses: they depend on the learner's kernel);
5. on a GPU with no interpreter, runs the compiled kernel on the same cases, then times it
   against a device copy of the bytes a right answer moves (`triton.testing.do_bench`; the
   copy is timed once per byte size, in COPY_ROUNDS rounds, and its median reused by every line
   of that size, so equal kernels of equal bytes get equal fractions); on the CPU it says why
   it does not.
   `time_solution` prints the same line for a puzzle's worked solution (the
   notebook shows it under the solution, as the time to aim for). `time_in_rounds` times several
   kernels against each other in alternating rounds, each round a do_bench median of each.

Checks print ✅ / ❌ with the reason and return a bool; they never raise. `last_grade` keeps what
the last check of a puzzle found (its seed, and for a pass the accesses it printed). `COPY` is
graded the same way but is no puzzle: the notebook's worked example of a pass (a masked copy).

One memory layer does something more for puzzle 7: a tensor can be *virtual*, rows far apart in
addresses (row i at element i * row_stride, past 2^31) but held compactly in memory. The layer
maps each address the kernel computes to the row it falls in, so a kernel's 64-bit offsets are
checked without allocating the gigabytes between the rows.
"""
import contextlib
import functools
import inspect
import itertools
import math
import re
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import triton
import triton.language as tl

from .. import runtime
from . import access
from .exercises import guarded_view, kernel_answer
from .exercises.own_code import LibraryAnswer, fresh_seed, run_own_code
from .exercises.own_code import _refusal, _Rules   # run_own_code's rules, for a kernel's body
from .work_count import interpreted

__all__ = ["PUZZLES", "BoundsCheckedMemory", "Region", "run_in_checked_memory", "draw_accesses",
           "grade", "Graded", "last_grade", "hint", "sector_use", "at_timed_shape",
           "SOLUTIONS_AT_TIMED_SHAPE", "scoreboard", "show_spec",
           "Timing", "time_solution", "solution_times", "time_kernel", "time_in_rounds",
           "stated",
           "given_shared_table_kernel", "copy_of", "COPY", "check_copy",
           "check_rotate_row", "check_interleaved", "check_partial", "check_odd_head_dim",
           "check_long_context", "check_position_ids", "check_int64_offsets", "check_backward",
           "check_shared_table", "check_packed_sequences", "check_bf16_table",
           "check_packed_partial_backward"]

_WHY, _END = "\x1e", "\x1f"   # around a diagnosis inside a problem: pz.hint(n) shows it


def _why(text: str) -> str:
    """A diagnosis, kept out of the ❌ line (which states the symptom) for `hint` to print."""
    return f"{_WHY}{text}{_END}"


def _split_why(problem: str) -> Tuple[str, List[str]]:
    """(the problem with its diagnoses taken out, the diagnoses)."""
    whys = re.findall(f"{_WHY}(.*?){_END}", problem, flags=re.S)
    return (re.sub(f"{_WHY}.*?{_END}", "", problem, flags=re.S).strip(),
            list(dict.fromkeys(whys)))


PAD = 256            # guard elements on each side of every input and output buffer
INT32_MAX = 2**31 - 1


# --- the specs: plain PyTorch, fp64 -------------------------------------------------------------

def spec_copy(x):
    """x [N] -> y [N], the same values: the worked example's spec, no RoPE."""
    return x.clone()


def spec_rotate_row(x, theta):
    """x [..., 2H], theta [..., H] -> y: rotate-half, pair j = features (j, j + H) by theta[j]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = theta.cos(), theta.sin()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def spec_interleaved(x, theta):
    """x [N, 2H], theta [N, H] -> y: GPT-J's interleaved pairs, j = features (2j, 2j + 1)."""
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    c, s = theta.cos(), theta.sin()
    return torch.stack((x_even * c - x_odd * s, x_odd * c + x_even * s), dim=-1).flatten(-2)


def spec_partial(x, theta, R):
    """x [N, D], theta [N, R/2] -> y: the first R features rotate-half (pairs (j, j + R/2)),
    features R..D-1 copied unchanged."""
    x1, x2, rest = x[..., :R // 2], x[..., R // 2:R], x[..., R:]
    c, s = theta.cos(), theta.sin()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


def spec_long_context(x, positions, inv_freq):
    """x [N, 2H], positions [N] ints, inv_freq [H] -> y, the angles pos * inv_freq in fp64."""
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat((x1 * theta.cos() - x2 * theta.sin(), x2 * theta.cos() + x1 * theta.sin()), -1)


def spec_position_ids(x, position_ids, cos, sin):
    """x [B, S, 2H], position_ids [B, S] (any strides), cos/sin [P, H] -> y [B, S, 2H]."""
    c, s = cos[position_ids], sin[position_ids]        # [B, S, H]: the table row of each token
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def spec_backward(dy, theta):
    """dL/dy [N, 2H], theta [N, H] -> dL/dx: the autograd of spec_rotate_row."""
    x = torch.zeros(dy.shape, dtype=torch.float64, requires_grad=True)
    y = spec_rotate_row(x, theta.double())
    (dx,) = torch.autograd.grad(y, x, dy.double())
    return dx


def spec_shared_table(x, cos, sin):
    """x [S, B, 2H], cos/sin [S, H] -> y: every batch entry of position s uses row s."""
    c, s = cos[:, None, :], sin[:, None, :]            # [S, 1, H]: broadcast over the batch
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def spec_packed_sequences(x, cu_seqlens, cos, sin):
    """x [T, 2H], sequences packed one after another (thd), cu_seqlens [N + 1] (0, then where
    each sequence ends), cos/sin [P, H] -> y: row r of sequence i is at position
    r - cu_seqlens[i] (positions restart at 0 in every sequence)."""
    lengths = cu_seqlens.diff().long()                    # [N], zero-length sequences allowed
    starts = cu_seqlens[:-1].long().repeat_interleave(lengths)   # [T]: its sequence's first row
    positions = torch.arange(x.shape[0]) - starts
    c, s = cos[positions], sin[positions]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def spec_packed_partial_backward(dy, cu_seqlens, cos, sin, R):
    """dL/dy [T, D], sequences packed one after another (thd) as in spec_packed_sequences,
    cos/sin [P, R/2] -> dL/dx: the autograd of the forward in which row r of sequence i, at
    position r - cu_seqlens[i], turns its first R features as interleaved pairs (2j, 2j + 1) and
    passes features R..D-1 through unchanged."""
    lengths = cu_seqlens.diff().long()
    positions = torch.arange(dy.shape[0]) - cu_seqlens[:-1].long().repeat_interleave(lengths)
    c, s = cos.double()[positions], sin.double()[positions]       # [T, R/2]
    x = torch.zeros(dy.shape, dtype=torch.float64, requires_grad=True)
    x_even, x_odd = x[:, 0:R:2], x[:, 1:R:2]
    turned = torch.stack((x_even * c - x_odd * s, x_odd * c + x_even * s), dim=-1).flatten(-2)
    y = torch.cat((turned, x[:, R:]), dim=-1)
    (dx,) = torch.autograd.grad(y, x, dy.double())
    return dx


def spec_bf16_table(x, cos, sin):
    """x [N, 2H], cos/sin [N, H] (one row per token, as the caller cached them: bf16) -> y in
    fp64, the rotation by exactly those table values."""
    x, c, s = x.double(), cos.double(), sin.double()
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


# --- the memory the checks launch kernels into --------------------------------------------------

@dataclass
class Region:
    """A tensor as the memory layer sees it: its name, whether the kernel reads or writes it, and
    (virtual tensors) the row stride in elements of the addresses the kernel is given."""
    name: str
    tensor: torch.Tensor               # CPU; a virtual region's rows, [N, W] contiguous
    kind: str                          # "in" (the kernel loads it) or "out" (stores)
    row_stride: Optional[int] = None   # virtual: row i at element i * row_stride of the base

    @property
    def itemsize(self) -> int:
        return self.tensor.element_size()

    @property
    def base(self) -> int:
        return self.tensor.data_ptr()

    @functools.cached_property
    def addresses(self) -> np.ndarray:
        """uint64 byte address of each element, shaped like the tensor (a virtual region: where
        its rows really are)."""
        t = self.tensor
        offs = torch.zeros(t.shape, dtype=torch.int64)
        for d, (n, st) in enumerate(zip(t.shape, t.stride())):
            shape = [1] * t.dim()
            shape[d] = n
            offs = offs + (torch.arange(n, dtype=torch.int64) * st).view(shape)
        return (np.uint64(self.base) + (offs * self.itemsize).numpy().astype(np.uint64))

    @functools.cached_property
    def _sorted(self) -> np.ndarray:
        return np.unique(self.addresses.ravel())

    def locate(self, lanes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(hit, real): which lanes (uint64 addresses) are elements of this region, and the
        address in memory of each hit (the same, except in a virtual region)."""
        if self.row_stride is None:
            pos = np.searchsorted(self._sorted, lanes)
            hit = self._sorted[np.minimum(pos, len(self._sorted) - 1)] == lanes
            return hit, lanes
        rows, width = self.tensor.shape
        off = (lanes - np.uint64(self.base)).view(np.int64)      # bytes from the base, signed
        hit = (off >= 0) & (off % self.itemsize == 0)
        elem = np.where(hit, off // self.itemsize, 0)
        row, col = elem // self.row_stride, elem % self.row_stride
        hit &= (row < rows) & (col < width)
        real = np.where(hit, np.uint64(self.base)
                        + ((row * width + col) * self.itemsize).astype(np.uint64), lanes)
        return hit, real.astype(np.uint64)

    def element_offset(self, address: int) -> int:
        """Signed element offset of `address` from this region's base, the byte difference taken
        as a signed 64-bit value (as the kernel's pointer arithmetic wraps it). A 32-bit offset
        that wrapped negative is then negative whatever the base: below a base under 2^33 the
        address itself wraps past 0, and its uint64 value is just under 2^64."""
        d = (int(address) - self.base) % 2**64
        if d >= 2**63:
            d -= 2**64
        return d // self.itemsize

    def describe(self) -> str:
        t = self.tensor
        if self.row_stride is not None:
            return (f"{self.name} [{t.shape[0]}, {t.shape[1]}] with rows {self.row_stride:,} "
                    f"elements apart (virtual: only the rows exist)")
        return f"{self.name} {list(t.shape)}, strides {tuple(t.stride())}"


@dataclass
class Fault:
    """Lanes of one memory instruction that were no element of a tensor they may touch."""
    program: Tuple[int, int, int]
    kind: str                  # "load" or "store"
    lanes: np.ndarray          # uint64 addresses (masked off: never touched)
    why: str                   # "outside" or "into input x" / "from output y"
    near: Optional[str]        # the region the instruction's other lanes hit, if any


class BoundsCheckedMemory:
    """The interpreter's loads and stores, checked against named tensors and recorded.

    Within `installed()`, every tl.load / tl.store the interpreter runs is checked lane by lane:
    a load must read an element of an "in" region, a store write an element of an "out" region.
    Other lanes are recorded as a Fault and masked off (a load gets its `other` value), so they
    never touch memory. Each instruction's live lanes are recorded as an `access.Access` at the
    address they really use (virtual regions are mapped to their rows)."""

    def __init__(self, regions: Sequence[Region]):
        self.regions = list(regions)
        self.accesses: List[access.Access] = []
        self.owners: List[Optional[str]] = []      # region of each access (its first lane)
        self.faults: List[Fault] = []

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def _route(self, builder, kind, ptrs, mask):
        from triton.runtime.interpreter import TensorHandle

        program = tuple(int(i) for i in builder.grid_idx)
        live = np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)
        addrs = np.ascontiguousarray(ptrs.data).astype(np.uint64)
        lanes = addrs[live]
        real = lanes.copy()
        owner = np.full(lanes.shape, -1)
        for k, reg in enumerate(self.regions):          # virtual regions are listed first
            free = owner < 0
            if not free.any():
                break
            hit, mapped = reg.locate(lanes[free])
            idx = np.flatnonzero(free)[hit]
            owner[idx] = k
            real[idx] = mapped[hit]
        wanted = "in" if kind == "load" else "out"
        ok = owner >= 0
        ok[ok] = np.array([self.regions[k].kind == wanted for k in owner[ok]], dtype=bool)
        if not ok.all():
            bad_owner = owner[~ok]
            near = self.regions[int(owner[ok][0])].name if ok.any() else None
            if (bad_owner < 0).any():
                self.faults.append(Fault(program, kind, lanes[~ok][bad_owner < 0], "outside",
                                         near))
            for k in sorted(set(bad_owner[bad_owner >= 0].tolist())):
                reg = self.regions[k]
                why = f"into input {reg.name}" if kind == "store" else f"from output {reg.name}"
                self.faults.append(Fault(program, kind, lanes[~ok][bad_owner == k], why, near))
        new_live = live.copy()
        new_live[live] = ok
        addrs[live] = np.where(ok, real, lanes)
        if ok.any():
            first = int(owner[ok][0])
            self.accesses.append(access.Access(program, kind, real[ok].copy(),
                                               ptrs.get_element_ty().primitive_bitwidth // 8))
            self.owners.append(self.regions[first].name)
        return TensorHandle(addrs, ptrs.dtype), TensorHandle(new_live, mask.dtype)

    @contextlib.contextmanager
    def installed(self):
        """Route the interpreter's masked loads and stores through this memory."""
        from triton.runtime import interpreter as interp

        builder = interp.InterpreterBuilder
        load, store = builder.create_masked_load, builder.create_masked_store
        memory = self

        # the builder's other arguments (cache and eviction policies, volatility) differ between
        # Triton releases: pass them through as they come
        def masked_load(b, ptrs, mask, *rest, **kw):
            ptrs, mask = memory._route(b, "load", ptrs, mask)
            return load(b, ptrs, mask, *rest, **kw)

        def masked_store(b, ptrs, value, mask, *rest, **kw):
            ptrs, mask = memory._route(b, "store", ptrs, mask)
            return store(b, ptrs, value, mask, *rest, **kw)

        builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
        try:
            yield self
        finally:
            builder.create_masked_load, builder.create_masked_store = load, store

    def counts(self, name: str, kind: str) -> np.ndarray:
        """How many live lanes of `kind` hit each element of region `name` (its shape)."""
        reg = self.region(name)
        mine = [a.addresses for a, o in zip(self.accesses, self.owners) if a.kind == kind]
        lanes = np.concatenate(mine) if mine else np.zeros(0, np.uint64)
        flat = reg.addresses.ravel()
        uniq, n = np.unique(lanes, return_counts=True)
        pos = np.searchsorted(uniq, flat)
        pos = np.minimum(pos, max(len(uniq) - 1, 0))
        found = (uniq[pos] == flat) if len(uniq) else np.zeros(flat.shape, bool)
        return np.where(found, n[pos] if len(uniq) else 0, 0).reshape(reg.addresses.shape)

    def storing_programs(self, name: str) -> np.ndarray:
        """Per element of region `name`: -1 never stored, -2 stored by two or more programs,
        else the index (in order of appearance) of the one program that stored it."""
        reg = self.region(name)
        flat = reg.addresses.ravel()
        where = {int(a): i for i, a in enumerate(flat)}
        programs: Dict[Tuple[int, int, int], int] = {}
        out = np.full(flat.shape, -1)
        for a in self.accesses:
            if a.kind != "store":
                continue
            p = programs.setdefault(a.program, len(programs))
            for addr in a.addresses.tolist():
                i = where.get(addr)
                if i is not None:
                    out[i] = p if out[i] in (-1, p) else -2
        return out.reshape(reg.addresses.shape)

    def fault_report(self, marked: bool = False) -> Optional[str]:
        """One paragraph on the lanes that were masked off, or None when every lane was fine
        (`marked`: the diagnoses kept apart for `hint`, as a check prints them)."""
        if not self.faults:
            return None
        lines = []
        for kind in ("load", "store"):
            mine = [f for f in self.faults if f.kind == kind]
            if not mine:
                continue
            lanes = sum(len(f.lanes) for f in mine)
            programs = sorted({f.program for f in mine})
            first = mine[0]
            where = self._nearest(first)
            lines.append(f"{lanes} {kind} lane{'s' if lanes > 1 else ''} in "
                         f"{len(programs)} program{'s' if len(programs) > 1 else ''} "
                         f"(first: program {first.program[0]}"
                         f"{', ' + str(first.program[1]) if any(p[1] for p in programs) else ''}) "
                         f"{where}; the check masked them off")
        text = "; ".join(lines)
        return text if marked else text.replace(_WHY, " — ").replace(_END, "")

    def _nearest(self, fault: Fault) -> str:
        if fault.why != "outside":
            return f"went {fault.why}"
        addr = int(fault.lanes[0])
        wanted = "in" if fault.kind == "load" else "out"
        if fault.near is not None:      # the tensor the instruction's other lanes are in
            reg = self.region(fault.near)
        else:
            cands = [r for r in self.regions if r.kind == wanted] or self.regions
            reg = min(cands, key=lambda r: abs(r.element_offset(addr)))
        off = reg.element_offset(addr)
        text = (f"{'read' if fault.kind == 'load' else 'wrote'} no element of any "
                f"{'input' if fault.kind == 'load' else 'output'}: the first at element offset "
                f"{off:,} from {reg.describe()}")
        if abs(off) >= 2**30 and (reg.row_stride is None or off < 0):
            text += _why("an offset near -2^31 is what a 32-bit offset gives once it wraps past "
                         f"2^31 - 1 = {INT32_MAX:,}")
        return text


# --- the cases a check launches -----------------------------------------------------------------

@dataclass
class Case:
    """One launch of a puzzle's kernel: its arguments, and what the spec says it must write."""
    label: str
    grid: Tuple[int, ...]
    args: tuple                                    # the kernel's arguments, in order
    constexprs: Dict[str, int]
    inputs: Dict[str, torch.Tensor]                # name -> a tensor the kernel reads
    out_name: str
    out: torch.Tensor                              # the graded output, filled with NaN
    out_buffer: Optional[torch.Tensor]             # out in the middle of NaN guard bands
    expected: Optional[torch.Tensor]               # the spec's answer, fp64 (None: timing only)
    tol: Tuple[float, float] = (1e-5, 1e-5)        # (atol, rtol)
    wrong: List[Tuple[str, torch.Tensor]] = field(default_factory=list)  # (mistake, its output)
    row_strides: Dict[str, int] = field(default_factory=dict)            # virtual regions
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def virtual(self) -> bool:
        return bool(self.row_strides)

    def regions(self) -> List[Region]:
        regs = [Region(n, t, "in", self.row_strides.get(n)) for n, t in self.inputs.items()]
        regs.append(Region(self.out_name, self.out, "out", self.row_strides.get(self.out_name)))
        return sorted(regs, key=lambda r: r.row_stride is None)     # virtual first


def _placed(t: torch.Tensor, device, pad: int = PAD) -> torch.Tensor:
    """t copied into the middle of a buffer with `pad` guard elements each side (NaN for floats,
    0 for integers): a compiled kernel that reads past t's ends reads the band."""
    fill = float("nan") if t.is_floating_point() else 0
    buf = torch.full((pad + t.numel() + pad,), fill, dtype=t.dtype, device=device)
    return buf[pad:pad + t.numel()].view(t.shape).copy_(t)


def _poisoned(shape, dtype, device, pad: int = PAD) -> Tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): a NaN-filled `shape` view in the middle of NaN guard bands."""
    return guarded_view(shape, pad, dtype=dtype, device=device)


def _angles(gen, *shape) -> torch.Tensor:
    return torch.rand(*shape, generator=gen) * 12.0 - 6.0       # any angle, both signs


def _randn(gen, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _row_case(label, grid, names_in, out_shape, expected, constexprs, device, *, args_after=(),
              out_dtype=torch.float32, wrong=(), tol=(1e-5, 1e-5)):
    """A case whose kernel takes (inputs..., out, *args_after): the common puzzle signature."""
    inputs = {n: _placed(t, device) for n, t in names_in.items()}
    buf, out = _poisoned(out_shape, out_dtype, device)
    args = tuple(inputs.values()) + (out,) + tuple(args_after)
    return Case(label, grid, args, constexprs, inputs, "y", out, buf, expected, tol,
                list(wrong))


# --- the puzzles --------------------------------------------------------------------------------

@dataclass
class Puzzle:
    number: int
    key: str
    title: str
    spec: Callable
    build: Callable                  # (generator, device) -> [Case]
    solution: object                 # the worked solution, a @triton.jit kernel (None: none)
    hint: str                        # the fix in words: pz.hint(n, fix=True)
    big: Optional[Callable] = None   # (device, rows=None) -> a Case worth timing on a GPU
    no_timing: str = ""              # why a puzzle is not timed
    picture: int = 0                 # which case's accesses to draw when every case passes
    compare: Optional[Callable] = None   # (case, got) -> problem or None (default: tolerances)
    require: Optional[Callable] = None   # (case, memory) -> problem or None: a further rule
    plot: Optional[Callable] = None      # (ax, case, got): a panel beside the access picture
    report: Optional[Callable] = None    # [Case] -> lines printed under the ✅ (outputs in .out)
    nudge: str = ""                      # where to look, not the fix: pz.hint(n) (else the hint)


PUZZLES: Dict[str, Puzzle] = {}
_RESULTS: Dict[str, bool] = {}


def _register(p: Puzzle) -> Puzzle:
    PUZZLES[p.key] = p
    return p


# 0. the worked example: a masked copy (not in PUZZLES) ------------------------------------------

def _build_copy(gen, device):
    cases = []
    for n, block in ((10, 4), (200, 64), (1000, 128)):
        x = _randn(gen, n)
        cases.append(_row_case(f"x [{n}], BLOCK={block}", (triton.cdiv(n, block),), {"x": x},
                               (n,), spec_copy(x.double()), {"BLOCK": block}, device,
                               args_after=(n,)))
    return cases


def _big_copy(device):
    n, block = 1 << 24, 1024
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    return Case(f"x [{n}] fp32", (triton.cdiv(n, block),), (x, y, n), {"BLOCK": block},
                {"x": x}, "y", y, None, None)


# graded as the puzzles are, shown passing in the notebook's section 0: no RoPE, nothing to give
# away; not in PUZZLES (the scoreboard and the timed table count the puzzles)
COPY = Puzzle(
    0, "copy", "a masked copy", spec_copy, _build_copy, None,
    nudge="which lanes of the last tile lie past N, and what stops them?",
    hint="mask every load and store with offs < N: the last tile runs past the end",
    big=_big_copy, picture=1)


# 1. one row, rotate-half ------------------------------------------------------------------------

@triton.jit
def solution_rotate_row_kernel(
    x_ptr,  # *fp32: x [2 * HALF], one row
    theta_ptr,  # *fp32: angles [HALF], one per pair
    y_ptr,  # *fp32: y [2 * HALF]
    HALF: tl.constexpr,  # features per half (a power of two in this puzzle)
):
    j = tl.arange(0, HALF)  # pair j is features (j, j + HALF)
    theta = tl.load(theta_ptr + j)
    x1 = tl.load(x_ptr + j)
    x2 = tl.load(x_ptr + HALF + j)
    c, s = tl.cos(theta), tl.sin(theta)
    tl.store(y_ptr + j, x1 * c - x2 * s)
    tl.store(y_ptr + HALF + j, x2 * c + x1 * s)


def _build_rotate_row(gen, device):
    cases = []
    for half in (4, 16, 64):
        x, theta = _randn(gen, 2 * half), _angles(gen, half)
        cases.append(_row_case(f"D={2 * half}", (1,), {"x": x, "theta": theta}, (2 * half,),
                               spec_rotate_row(x.double(), theta.double()), {"HALF": half},
                               device))
    return cases


ROTATE_ROW = _register(Puzzle(
    1, "rotate_row", "rotate one row", spec_rotate_row, _build_rotate_row,
    solution_rotate_row_kernel,
    nudge="a tile cannot be sliced, so each half is a load of its own; then each line of the "
          "formula above is one store",
    hint="load the two halves as two tiles, x[j] and x[j + HALF]; y1 = x1 cos - x2 sin, "
         "y2 = x2 cos + x1 sin",
    no_timing="one program on one row: a launch's fixed cost is all a timer would see (the "
              "puzzles after this one are timed)"))


# 2. interleaved (GPT-J) pairs ------------------------------------------------------------------

@triton.jit
def solution_interleaved_kernel(
    x_ptr,  # *fp32: x [N_ROWS, 2 * HALF], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous, one per pair
    y_ptr,  # *fp32: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)  # pair j is features (2j, 2j + 1)
    f = tl.arange(0, 2 * HALF)  # the row's features: offsets the compiler sees as one run
    live = rows[:, None] < N_ROWS  # [BLOCK_ROWS, 1]: the last tile may be short
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    offs = rows[:, None] * (2 * HALF) + f[None, :]  # [BLOCK_ROWS, 2 * HALF]
    x = tl.load(x_ptr + offs, mask=live, other=0.0)
    # [BLOCK_ROWS, HALF, 2] in registers: feature 2j is x_even[:, j], 2j + 1 is x_odd[:, j]
    x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_ROWS, HALF, 2)))
    c, s = tl.cos(theta), tl.sin(theta)
    y = tl.join(x_even * c - x_odd * s, x_odd * c + x_even * s)  # [BLOCK_ROWS, HALF, 2]
    tl.store(y_ptr + offs, tl.reshape(y, (BLOCK_ROWS, 2 * HALF)), mask=live)


def _build_interleaved(gen, device, block_rows=4):
    cases = []
    for n, half in ((5, 8), (3, 32), (8, 4)):
        x, theta = _randn(gen, n, 2 * half), _angles(gen, n, half)
        x64, t64 = x.double(), theta.double()
        wrong = [("your kernel pairs feature j with j + D/2: that is rotate-half (GPT-NeoX, "
                  "Hugging Face's Llama). GPT-J's interleaved form pairs 2j with 2j + 1",
                  spec_rotate_row(x64, t64))]
        cases.append(_row_case(f"x [{n}, {2 * half}]", (triton.cdiv(n, block_rows),),
                               {"x": x, "theta": theta}, (n, 2 * half),
                               spec_interleaved(x64, t64),
                               {"HALF": half, "BLOCK_ROWS": block_rows}, device,
                               args_after=(n,), wrong=wrong))
    return cases


def _big_interleaved(device, rows=None):
    n, half, br = rows or 1 << 17, 64, 16
    x = torch.randn(n, 2 * half, device=device)
    theta = torch.rand(n, half, device=device)
    y = torch.empty_like(x)
    return Case(f"x [{n}, {2 * half}] fp32", (triton.cdiv(n, br),), (x, theta, y, n),
                {"HALF": half, "BLOCK_ROWS": br}, {"x": x, "theta": theta}, "y", y, None,
                None)


INTERLEAVED = _register(Puzzle(
    2, "interleaved", "interleaved pairs", spec_interleaved, _build_interleaved,
    solution_interleaved_kernel,
    nudge="pair j is features 2j and 2j + 1, side by side in memory: which offsets give the "
          "even features, which the odd, and which angle turns both?",
    hint="GPT-J pairs features (2j, 2j + 1), both turned by theta[j]: load x[2j] and x[2j + 1]",
    big=_big_interleaved))


# 3. partial rotary --------------------------------------------------------------------------------

@triton.jit
def solution_partial_kernel(
    x_ptr,  # *fp32: x [N_ROWS, D], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, R // 2], contiguous
    y_ptr,  # *fp32: y [N_ROWS, D], contiguous
    N_ROWS,  # rows in x
    D: tl.constexpr,  # head dim
    R: tl.constexpr,  # rotary dim (R // 2 a power of two here); features R..D-1 pass through
    BLOCK_ROWS: tl.constexpr,  # rows per program
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = rows[:, None] < N_ROWS
    j = tl.arange(0, R // 2)  # pair j is features (j, j + R/2): the halves of the rotary part
    theta = tl.load(theta_ptr + rows[:, None] * (R // 2) + j[None, :], mask=live, other=0.0)
    row_x = x_ptr + rows[:, None] * D
    row_y = y_ptr + rows[:, None] * D
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
    x2 = tl.load(row_x + R // 2 + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(row_y + R // 2 + j[None, :], x2 * c + x1 * s, mask=live)
    k = R + tl.arange(0, BLOCK_PASS)  # the pass-through features, copied unchanged
    tail = live & (k[None, :] < D)
    tl.store(row_y + k[None, :], tl.load(row_x + k[None, :], mask=tail), mask=tail)


def _build_partial(gen, device, block_rows=4):
    cases = []
    for n, d, r in ((4, 64, 32), (5, 80, 32), (3, 24, 8)):
        x, theta = _randn(gen, n, d), _angles(gen, n, r // 2)
        cases.append(_row_case(f"x [{n}, {d}], R={r}", (triton.cdiv(n, block_rows),),
                               {"x": x, "theta": theta}, (n, d),
                               spec_partial(x.double(), theta.double(), r),
                               {"D": d, "R": r, "BLOCK_ROWS": block_rows,
                                "BLOCK_PASS": triton.next_power_of_2(d - r)},
                               device, args_after=(n,), wrong=[_partner_at_half_d(x, theta, r)]))
    return cases


def _partner_at_half_d(x, theta, r) -> Tuple[str, torch.Tensor]:
    """Full rotary's pairing in a partial-rotary head: feature j (j < R/2) turned with feature
    j + D/2. Only y's first R/2 features are given (NaN elsewhere: not compared), since where
    the rest lands depends on the order of the kernel's stores."""
    d, h = x.shape[-1], r // 2
    x64, t64 = x.double(), theta.double()
    y = torch.full(x64.shape, float("nan"), dtype=torch.float64)
    y[:, :h] = x64[:, :h] * t64.cos() - x64[:, d // 2:d // 2 + h] * t64.sin()
    return (f"features 0-{h - 1} of y are x_j cos(theta_j) - x_(j+{d // 2}) sin(theta_j): your "
            f"partner of feature j is at j + D/2 = j + {d // 2}, but the rotary halves are "
            f"R/2 = {h} wide, so the partner is at j + {h}", y)


def _big_partial(device, rows=None):
    n, d, r, br = rows or 1 << 17, 128, 64, 16
    x = torch.randn(n, d, device=device)
    theta = torch.rand(n, r // 2, device=device)
    y = torch.empty_like(x)
    return Case(f"x [{n}, {d}] fp32, R={r}", (triton.cdiv(n, br),), (x, theta, y, n),
                {"D": d, "R": r, "BLOCK_ROWS": br, "BLOCK_PASS": triton.next_power_of_2(d - r)},
                {"x": x, "theta": theta}, "y", y, None, None)


PARTIAL = _register(Puzzle(
    3, "partial", "partial rotary", spec_partial, _build_partial, solution_partial_kernel,
    nudge="read the ❌ line's features against the spec: where does the kernel look for the "
          "partner of feature j, and which features of y does it never store? The picture's y "
          "panel shows the latter in grey",
    hint="the rotary halves are R/2 wide (pairs j, j + R/2, not j + D/2), and features "
         "R..D-1 of y must be written too: copy them from x",
    big=_big_partial, picture=1))


# 4. head dims that are not powers of two ------------------------------------------------------

@triton.jit
def solution_odd_head_dim_kernel(
    x_ptr,  # *fp32: x [N_ROWS, 2 * HALF], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous
    y_ptr,  # *fp32: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # features per half: any size (80 / 2 = 40)
    BLOCK_ROWS: tl.constexpr,  # rows per program
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile a half is loaded in
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, BLOCK_HALF)
    live = (rows[:, None] < N_ROWS) & (j[None, :] < HALF)  # lanes past HALF neither load nor store
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(row_y + HALF + j[None, :], x2 * c + x1 * s, mask=live)


def _build_odd_head_dim(gen, device, block_rows=4):
    cases = []
    for n, d in ((5, 80), (3, 96), (6, 72), (4, 64)):
        half = d // 2
        x, theta = _randn(gen, n, d), _angles(gen, n, half)
        cases.append(_row_case(f"x [{n}, {d}]", (triton.cdiv(n, block_rows),),
                               {"x": x, "theta": theta}, (n, d),
                               spec_rotate_row(x.double(), theta.double()),
                               {"HALF": half, "BLOCK_ROWS": block_rows,
                                "BLOCK_HALF": triton.next_power_of_2(half)},
                               device, args_after=(n,)))
    return cases


def _big_odd_head_dim(device, rows=None):
    n, d, br = rows or 1 << 17, 80, 16
    x = torch.randn(n, d, device=device)
    theta = torch.rand(n, d // 2, device=device)
    y = torch.empty_like(x)
    return Case(f"x [{n}, {d}] fp32", (triton.cdiv(n, br),), (x, theta, y, n),
                {"HALF": d // 2, "BLOCK_ROWS": br, "BLOCK_HALF": triton.next_power_of_2(d // 2)},
                {"x": x, "theta": theta}, "y", y, None, None)


ODD_HEAD_DIM = _register(Puzzle(
    4, "odd_head_dim", "head dims 80, 96, 72", spec_rotate_row, _build_odd_head_dim,
    solution_odd_head_dim_kernel,
    nudge="a tile of BLOCK_HALF lanes is wider than a half of HALF features: which lanes of "
          "each load and store fall on a feature of the other half, or of the next row?",
    hint="a tile of BLOCK_HALF lanes is wider than a half of HALF features: mask the lanes "
         "j >= HALF in every load and store, not only the rows past N_ROWS",
    big=_big_odd_head_dim))


# 5. angles at long context -----------------------------------------------------------------------

@triton.jit
def solution_long_context_kernel(
    x_ptr,  # *bf16: x [N_ROWS, 2 * HALF], contiguous
    freqs_ptr,  # *bf16: the caller's angle table [N_ROWS, HALF], rounded to bf16 (not read)
    pos_ptr,  # *int32: position of each row [N_ROWS]
    inv_freq_ptr,  # *fp32: inverse frequencies [HALF]
    y_ptr,  # *bf16: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    pos = tl.load(pos_ptr + rows, mask=rows < N_ROWS, other=0)
    inv = tl.load(inv_freq_ptr + j)
    # the angle in fp32 from the integer position: exact positions up to 2^24, one rounding
    theta = pos.to(tl.float32)[:, None] * inv[None, :]
    c, s = tl.cos(theta), tl.sin(theta)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0).to(tl.float32)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(row_y + HALF + j[None, :], (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=live)


ANGLE_TOL = 0.03   # radians: fp32 angles err by at most 2^-8 below position 2^17, bf16 y 0.006


def _inv_freq(half: int) -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))


def _build_long_context(gen, device, block_rows=8):
    cases = []
    spread = (torch.arange(40) * (math.log(131071) / 39)).exp().round().to(torch.int32).unique()
    for label, pos, half in (
            ("positions 0 .. 131,071", torch.tensor([0, 1, 100, 256, 257, 1000, 4097, 65537,
                                                     100003, 120001, 131071, 99999],
                                                    dtype=torch.int32), 16),
            (f"{len(spread)} positions spread over 1 .. 131,071", spread, 8)):
        n = len(pos)
        x = _randn(gen, n, 2 * half).to(torch.bfloat16)
        inv = _inv_freq(half)
        table = (pos.double()[:, None] * inv.double()[None, :]).to(torch.bfloat16)
        case = _row_case(label, (triton.cdiv(n, block_rows),),
                         {"x": x, "freqs": table, "pos": pos, "inv_freq": inv}, (n, 2 * half),
                         spec_long_context(x, pos, inv), {"HALF": half, "BLOCK_ROWS": block_rows},
                         device, args_after=(n,), out_dtype=torch.bfloat16)
        case.extra["positions"] = pos
        case.extra["inv_freq"] = inv
        cases.append(case)
    return cases


def _rotated_by(x, theta) -> torch.Tensor:
    """x [N, 2H] rotated (rotate-half) by the angles theta [N, H], in fp64."""
    half = x.shape[-1] // 2
    x1, x2, theta = x[..., :half].double(), x[..., half:].double(), theta.double()
    return torch.cat((x1 * theta.cos() - x2 * theta.sin(), x2 * theta.cos() + x1 * theta.sin()), -1)


def _long_context_mistakes(case) -> List[Tuple[str, torch.Tensor]]:
    """(what went wrong, the output it gives) for the two 16-bit mistakes of puzzle 5: the angle
    held in bf16 (the caller's table, or an fp32 angle rounded to bf16 in the kernel), and the
    inverse frequencies rounded to bf16 before the multiply. bf16 rounds to nearest on a GPU
    and truncates in Triton's interpreter, so each comes in both roundings."""
    x, pos, inv = (case.inputs[n].cpu() for n in ("x", "pos", "inv_freq"))
    p64 = pos.double()[:, None]
    angle = p64 * inv.double()[None, :]
    angle32 = pos.float()[:, None] * inv[None, :]
    out = []
    for truncate in (False, True):
        out.append(("table", _rotated_by(x, _to_bf16(angle if not truncate else angle32,
                                                     truncate).double())))
        out.append(("inv_freq", _rotated_by(x, p64 * _to_bf16(inv, truncate).double()[None, :])))
    return out


def _pair_angle_error(case, got, expected: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[N]: per row, the largest angle error in radians, from |y_pair - spec_pair| / |x_pair|
    (or against `expected` in place of the spec)."""
    x = case.inputs["x"].double().cpu()
    half = x.shape[-1] // 2
    d = got.double().cpu() - (case.expected if expected is None else expected).cpu()
    num = (d[:, :half] ** 2 + d[:, half:] ** 2).sqrt()
    den = (x[:, :half] ** 2 + x[:, half:] ** 2).sqrt().clamp_min(1e-3)
    chord = (num / den).nan_to_num(float("inf")).amax(dim=1)
    return 2 * (chord / 2).clamp(max=1.0).asin()   # a chord of 2 sin(a/2) is an angle a


def _bf16_spacing(p: int) -> int:
    return 1 if p < 256 else 2 ** (int(math.log2(p)) - 7)


def _compare_long_context(case, got) -> Optional[str]:
    err = _pair_angle_error(case, got)
    worst = int(err.argmax())
    if float(err[worst]) <= ANGLE_TOL:
        return None
    pos = case.extra["positions"]
    p = int(pos[worst])
    right = [f"{int(q):,}" for q in pos[err <= ANGLE_TOL]]
    text = (f"at position {p:,} the rotation is off by {float(err[worst]):.2f} rad (allowed "
            f"{ANGLE_TOL}); right at {len(right)} of {len(pos)} positions"
            + (f" ({', '.join(right[:6])}{', ...' if len(right) > 6 else ''})" if right else ""))
    cause = next((what for what, alt in _long_context_mistakes(case)
                  if float(_pair_angle_error(case, got, alt).max()) <= ANGLE_TOL), None)
    if cause == "table":
        return text + _why(f"your y is the rotation by the angle held in bf16: bf16 values near "
                           f"{p:,} are {_bf16_spacing(p)} apart, so an angle held in bf16 is off "
                           "by up to half that")
    if cause == "inv_freq":
        return text + _why("your y is the rotation by inverse frequencies rounded to bf16: that "
                           "moves each inv_freq[j] by up to 2^-8 of itself (bf16 keeps 8 "
                           "significant bits), and so the angle at position p by up to "
                           "p * inv_freq[j] / 256 rad. Multiply by the fp32 inv_freq as loaded")
    return text + _why("the angle of pair j at position p is p * inv_freq[j]: compute it in "
                       "fp32 from the integer position and the fp32 inverse frequencies")


def _plot_long_context(ax, case, got):
    err = _pair_angle_error(case, got).clamp(1e-6, 10)
    pos = case.extra["positions"]
    pos, order = pos[pos > 0].sort()                # a log axis: position 0 turns by nothing
    order = (case.extra["positions"] > 0).nonzero().flatten()[order]
    ax.loglog(pos.numpy(), err[order].numpy(), "o-", ms=3)
    ax.axhline(ANGLE_TOL, color="tab:red", lw=1, ls="--", label=f"allowed {ANGLE_TOL} rad")
    ax.set_xlabel("position", fontsize=7)
    ax.set_ylabel("angle error (rad)", fontsize=7)
    ax.set_title("angle error by position", fontsize=8)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=7)


def _big_long_context(device):
    n, half, br = 1 << 17, 64, 16
    x = torch.randn(n, 2 * half, device=device, dtype=torch.bfloat16)
    pos = torch.arange(n, device=device, dtype=torch.int32)
    inv = _inv_freq(half).to(device)
    table = (pos.double()[:, None] * inv.double()[None, :]).to(torch.bfloat16)
    y = torch.empty_like(x)
    return Case(f"x [{n}, {2 * half}] bf16", (triton.cdiv(n, br),), (x, table, pos, inv, y, n),
                {"HALF": half, "BLOCK_ROWS": br}, {"x": x, "pos": pos, "inv_freq": inv}, "y", y,
                None, None)


LONG_CONTEXT = _register(Puzzle(
    5, "long_context", "angles at position 100k", spec_long_context, _build_long_context,
    solution_long_context_kernel,
    nudge="at which positions is the output right, and how far apart are bf16 values there? "
          "Of the kernel's inputs, which hold the angle's parts exactly?",
    hint="no kernel can get back what a bf16 table lost: compute theta = position * inv_freq in "
         "fp32 from pos_ptr and inv_freq_ptr (and do the rotation in fp32)",
    big=_big_long_context, picture=1, compare=_compare_long_context, plot=_plot_long_context))


# 6. position ids with strides ---------------------------------------------------------------------

@triton.jit
def solution_position_ids_kernel(
    x_ptr,  # *fp32: x [B, S, 2 * HALF], contiguous
    pos_ptr,  # *int64: position_ids [B, S], any strides (stride 0 over the batch included)
    cos_ptr,  # *fp32: cos table [P, HALF], contiguous
    sin_ptr,  # *fp32: sin table [P, HALF], contiguous
    y_ptr,  # *fp32: y [B, S, 2 * HALF], contiguous
    S,  # tokens per sequence
    stride_pb, stride_ps,  # position_ids strides, in elements
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_S: tl.constexpr,  # tokens per program
):
    b = tl.program_id(0)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    live_s = s < S
    pos = tl.load(pos_ptr + b * stride_pb + s * stride_ps, mask=live_s, other=0)
    j = tl.arange(0, HALF)
    live = live_s[:, None]
    c = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = (b * S + s)[:, None] * (2 * HALF)
    x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
    tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


def _table(P, half):
    ang = torch.arange(P, dtype=torch.float64)[:, None] * _inv_freq(half).double()[None, :]
    return ang.cos().float(), ang.sin().float()


def _build_position_ids(gen, device, block_s=4):
    B, S, half, P = 3, 5, 8, 40
    cases = []
    for kind in ("contiguous", "expanded", "strided", "generation"):
        x = _randn(gen, B, S, 2 * half)
        cos, sin = _table(P, half)
        if kind == "contiguous":
            ids = _placed(torch.randint(0, P, (B, S), generator=gen), device)
            label = "position_ids [3, 5], contiguous"
        elif kind == "expanded":    # one row of positions for the whole batch: stride 0
            ids = _placed(torch.arange(S)[None, :] + 7, device).expand(B, S)
            label = "position_ids [1, 5].expand(3, 5): stride 0 over the batch"
        elif kind == "strided":     # every other row of a transposed [S, 2B] tensor
            base = _placed(torch.randint(0, P, (S, 2 * B), generator=gen), device)
            ids = base.t()[::2]
            label = f"position_ids = t.t()[::2], strides {tuple(ids.stride())}"
        else:   # generation, a left-padded batch: positions counted from the attention mask,
            # the last S of them (Hugging Face's generate): each sequence its own start
            pad = torch.randperm(S + 2, generator=gen)[:B]
            mask = torch.arange(2 * S + 2)[None, :] >= pad[:, None]           # [B, L]
            counted = (mask.long().cumsum(-1) - 1).clamp_min(0)
            ids = _placed(counted, device)[:, -S:]
            label = (f"position_ids = (mask.cumsum(-1) - 1)[:, -{S}:], starts "
                     f"{ids[:, 0].tolist()}, strides {tuple(ids.stride())}")
        expected = spec_position_ids(x.double(), ids.cpu(), cos.double(), sin.double())
        inputs = {"x": _placed(x, device), "position_ids": ids, "cos": _placed(cos, device),
                  "sin": _placed(sin, device)}
        buf, out = _poisoned((B, S, 2 * half), torch.float32, device)
        args = (inputs["x"], ids, inputs["cos"], inputs["sin"], out, S, *ids.stride())
        cases.append(Case(label, (B, triton.cdiv(S, block_s)), args,
                          {"HALF": half, "BLOCK_S": block_s}, inputs, "y", out, buf, expected))
    return cases


def _big_position_ids(device, rows=None):
    B, S, half, bs = 8, rows or 16384, 64, 16
    x = torch.randn(B, S, 2 * half, device=device)
    cos, sin = (t.to(device) for t in _table(S, half))
    ids = torch.arange(S, device=device)[None, :].expand(B, S)
    y = torch.empty_like(x)
    return Case(f"x [{B}, {S}, {2 * half}] fp32, expanded ids", (B, triton.cdiv(S, bs)),
                (x, ids, cos, sin, y, S, *ids.stride()), {"HALF": half, "BLOCK_S": bs},
                {"x": x, "position_ids": ids, "cos": cos, "sin": sin}, "y", y, None,
                None)


POSITION_IDS = _register(Puzzle(
    6, "position_ids", "position ids with strides", spec_position_ids, _build_position_ids,
    solution_position_ids_kernel,
    nudge="the kernel is handed position_ids' strides and never uses them: where in memory is "
          "element (b, s) of a tensor with strides (stride_pb, stride_ps)?",
    hint="position b, s is at pos_ptr + b * stride_pb + s * stride_ps: an expanded tensor has "
         "stride_pb == 0, a sliced one strides that are not (S, 1)",
    big=_big_position_ids, picture=1))


# 7. 64-bit offsets --------------------------------------------------------------------------------

@triton.jit
def solution_int64_offsets_kernel(
    x_ptr,  # *fp32: x [N_ROWS, 2 * HALF], rows stride_x elements apart
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous
    y_ptr,  # *fp32: y [N_ROWS, 2 * HALF], rows stride_y elements apart
    N_ROWS,  # rows in x
    stride_x,  # x's row stride, in elements (int32 when it fits)
    stride_y,  # y's row stride, in elements
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    # int64 before any multiplication: row * stride passes 2^31 in a tensor of 2^31 elements
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row_x = x_ptr + rows[:, None] * stride_x
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    row_y = y_ptr + rows[:, None] * stride_y
    tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(row_y + HALF + j[None, :], x2 * c + x1 * s, mask=live)


# rows far apart: row 2 of x starts at element 2^31 + 128, row 2 of y at 2,400,000,000
VIRTUAL_STRIDE_X, VIRTUAL_STRIDE_Y = 2**30 + 64, 1_200_000_000


def _build_int64_offsets(gen, device, block_rows=4):
    half = 16
    cases = []
    # an ordinary strided case: rows padded to 48 and 40 elements
    n = 5
    x, theta = _randn(gen, n, 2 * half), _angles(gen, n, half)
    xs = _placed(torch.zeros(n, 48), device)
    xs[:, :2 * half] = x.to(device)
    x_view = xs[:, :2 * half]
    ybuf, ys = _poisoned((n, 40), torch.float32, device)
    y_view = ys[:, :2 * half]
    inputs = {"x": x_view, "theta": _placed(theta, device)}
    cases.append(Case("rows 48 and 40 elements apart", (triton.cdiv(n, block_rows),),
                      (x_view, inputs["theta"], y_view, n, 48, 40),
                      {"HALF": half, "BLOCK_ROWS": block_rows}, inputs, "y", y_view, ybuf,
                      spec_rotate_row(x.double(), theta.double())))
    if device == "cpu":     # the interpreter's memory layer holds only the rows: CPU only
        n = 3
        x, theta = _randn(gen, n, 2 * half), _angles(gen, n, half)
        inputs = {"x": _placed(x, device), "theta": _placed(theta, device)}
        ybuf, y = _poisoned((n, 2 * half), torch.float32, device)
        cases.append(Case(f"rows {VIRTUAL_STRIDE_X:,} and {VIRTUAL_STRIDE_Y:,} elements apart: "
                          "row 2 past 2^31", (triton.cdiv(n, block_rows),),
                          (inputs["x"], inputs["theta"], y, n, VIRTUAL_STRIDE_X, VIRTUAL_STRIDE_Y),
                          {"HALF": half, "BLOCK_ROWS": block_rows}, inputs, "y", y, ybuf,
                          spec_rotate_row(x.double(), theta.double()),
                          row_strides={"x": VIRTUAL_STRIDE_X, "y": VIRTUAL_STRIDE_Y}))
    return cases


def _big_int64_offsets(device, rows=None):
    n, half, br = rows or 1 << 17, 64, 16
    x = torch.randn(n, 2 * half, device=device)
    theta = torch.rand(n, half, device=device)
    y = torch.empty_like(x)
    return Case(f"x [{n}, {2 * half}] fp32", (triton.cdiv(n, br),),
                (x, theta, y, n, x.stride(0), y.stride(0)), {"HALF": half, "BLOCK_ROWS": br},
                {"x": x, "theta": theta}, "y", y, None, None)


INT64_OFFSETS = _register(Puzzle(
    7, "int64_offsets", "offsets past 2^31", spec_rotate_row, _build_int64_offsets,
    solution_int64_offsets_kernel,
    nudge="which integer type do rows and the strides have, and how large does rows * stride "
          "get for row 2?",
    hint="program ids, tl.arange and strides below 2^31 are int32, and so is their product: "
         "make the row index int64 (.to(tl.int64)) before multiplying by a stride",
    big=_big_int64_offsets, picture=1))


# 8. the backward ---------------------------------------------------------------------------------

@triton.jit
def solution_backward_kernel(
    dy_ptr,  # *fp32: dL/dy [N_ROWS, 2 * HALF], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous
    dx_ptr,  # *fp32: dL/dx [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in dL/dy
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = rows[:, None] * (2 * HALF)
    g1 = tl.load(dy_ptr + row + j[None, :], mask=live, other=0.0)
    g2 = tl.load(dy_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    # the transpose of [[c, -s], [s, c]]: the rotation by -theta
    tl.store(dx_ptr + row + j[None, :], g1 * c + g2 * s, mask=live)
    tl.store(dx_ptr + row + HALF + j[None, :], g2 * c - g1 * s, mask=live)


def _build_backward(gen, device, block_rows=4):
    cases = []
    for n, half in ((5, 8), (3, 32)):
        dy, theta = _randn(gen, n, 2 * half), _angles(gen, n, half)
        dy64, t64 = dy.double(), theta.double()
        half_wrong = spec_rotate_row(dy64, -t64).clone()
        half_wrong[:, half:] = spec_rotate_row(dy64, t64)[:, half:]
        wrong = [("your dL/dx is the forward rotation of dL/dy (by +theta): that is J dL/dy, "
                  "the backward needs J^T dL/dy, the rotation by -theta",
                  spec_rotate_row(dy64, t64)),
                 ("the first half is right, the second still rotates by +theta: flip the sign "
                  "of its sine term too", half_wrong)]
        case = _row_case(f"dL/dy [{n}, {2 * half}]", (triton.cdiv(n, block_rows),),
                         {"dy": dy, "theta": theta}, (n, 2 * half), spec_backward(dy, theta),
                         {"HALF": half, "BLOCK_ROWS": block_rows}, device, args_after=(n,),
                         wrong=wrong)
        case.out_name = "dx"
        cases.append(case)
    return cases


def _big_backward(device, rows=None):
    case = _big_interleaved(device, rows)
    case.out_name, case.inputs = "dx", {"dy": case.inputs["x"], "theta": case.inputs["theta"]}
    return case


BACKWARD = _register(Puzzle(
    8, "backward", "the backward's sign", spec_backward, _build_backward,
    solution_backward_kernel,
    nudge="write out the two rows of J^T times (g1, g2) for one pair: which terms change sign "
          "from the forward?",
    hint="dL/dx = J^T dL/dy; J rotates each pair by +theta, so J^T rotates it by -theta: "
         "dx1 = g1 cos + g2 sin, dx2 = g2 cos - g1 sin",
    big=_big_backward))


# 9. one table for the whole batch ---------------------------------------------------------------

@triton.jit
def solution_shared_table_kernel(
    x_ptr,  # *fp32: x [S, B, 2 * HALF], contiguous
    cos_ptr,  # *fp32: cos table [S, HALF], contiguous
    sin_ptr,  # *fp32: sin table [S, HALF], contiguous
    y_ptr,  # *fp32: y [S, B, 2 * HALF], contiguous
    S,  # positions
    B,  # batch entries per position (the program loops over them)
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_S: tl.constexpr,  # positions per program
):
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    j = tl.arange(0, HALF)
    live = (s < S)[:, None]
    # the table rows of these positions, loaded once and used for every batch entry
    c = tl.load(cos_ptr + s[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + s[:, None] * HALF + j[None, :], mask=live, other=0.0)
    for b in range(B):
        row = (s * B + b)[:, None] * (2 * HALF)
        x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
        x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
        tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
        tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


@triton.jit
def given_shared_table_kernel(
    x_ptr,  # *fp32: x [S, B, 2 * HALF], contiguous
    cos_ptr,  # *fp32: cos table [S, HALF], contiguous
    sin_ptr,  # *fp32: sin table [S, HALF], contiguous
    y_ptr,  # *fp32: y [S, B, 2 * HALF], contiguous
    S,  # positions
    B,  # batch entries per position (the program loops over them)
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_S: tl.constexpr,  # positions per program
):
    # the kernel notebook 13 hands out for puzzle 9 (a test keeps the two the same), kept here so
    # that it can be timed beside the worked solution whatever a learner did to their copy
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    j = tl.arange(0, HALF)
    live = (s < S)[:, None]
    for b in range(B):
        c = tl.load(cos_ptr + s[:, None] * HALF + j[None, :], mask=live, other=1.0)
        sn = tl.load(sin_ptr + s[:, None] * HALF + j[None, :], mask=live, other=0.0)
        row = (s * B + b)[:, None] * (2 * HALF)
        x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
        x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
        tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
        tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


def _build_shared_table(gen, device, block_s=4):
    cases = []
    for S, B, half in ((5, 4, 8), (3, 2, 16)):
        x = _randn(gen, S, B, 2 * half)
        ang = _angles(gen, S, half).double()
        cos, sin = ang.cos().float(), ang.sin().float()
        inputs = {"x": _placed(x, device), "cos": _placed(cos, device),
                  "sin": _placed(sin, device)}
        buf, out = _poisoned((S, B, 2 * half), torch.float32, device)
        cases.append(Case(f"x [{S}, {B}, {2 * half}]", (triton.cdiv(S, block_s),),
                          (inputs["x"], inputs["cos"], inputs["sin"], out, S, B),
                          {"HALF": half, "BLOCK_S": block_s}, inputs, "y", out, buf,
                          spec_shared_table(x.double(), cos.double(), sin.double())))
    return cases


def _each_table_element_once(case, memory) -> Optional[str]:
    for name in ("cos", "sin"):
        n = memory.counts(name, "load")
        if n.max() > 1:
            B = case.args[5]
            return (f"right values, but each element of {name} was loaded {int(n.max())} times "
                    f"({int(n.sum())} loads for {n.size} elements; B = {B})"
                    + _why("the table of a position is the same for every batch entry: load "
                           "it once per program, before the loop over b"))
    return None


def _big_shared_table(device):
    S, B, half, bs = 16384, 8, 64, 4     # BLOCK_S=4: the fastest of six tiles on an H200
    x = torch.randn(S, B, 2 * half, device=device)
    cos, sin = (t.to(device) for t in _table(S, half))
    y = torch.empty_like(x)
    return Case(f"x [{S}, {B}, {2 * half}] fp32", (triton.cdiv(S, bs),), (x, cos, sin, y, S, B),
                {"HALF": half, "BLOCK_S": bs}, {"x": x, "cos": cos, "sin": sin}, "y", y, None,
                None)


SHARED_TABLE = _register(Puzzle(
    9, "shared_table", "one table for the batch", spec_shared_table, _build_shared_table,
    solution_shared_table_kernel,
    nudge="which of the loads inside the loop over b depend on b?",
    hint="the cos/sin rows depend on s only: load them before `for b in range(B)`",
    big=_big_shared_table, require=_each_table_element_once))


# 10. packed sequences (thd, cu_seqlens) ---------------------------------------------------------

@triton.jit
def solution_packed_sequences_kernel(
    x_ptr,  # *fp32: x [TOTAL, 2 * HALF], the sequences packed one after another, contiguous
    cu_seqlens_ptr,  # *int32: cu_seqlens [N_SEQS + 1]: 0, then where each sequence ends
    cos_ptr,  # *fp32: cos table [P, HALF], contiguous (P >= the longest sequence)
    sin_ptr,  # *fp32: sin table [P, HALF], contiguous
    y_ptr,  # *fp32: y [TOTAL, 2 * HALF], contiguous
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_T: tl.constexpr,  # tokens per program
):
    seq = tl.program_id(0)  # grid (N_SEQS, cdiv(longest sequence, BLOCK_T))
    start = tl.load(cu_seqlens_ptr + seq)  # the sequence's first row
    end = tl.load(cu_seqlens_ptr + seq + 1)  # one past its last row: the next sequence's first
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # positions within the sequence
    live = (t < end - start)[:, None]  # a shorter sequence's last tiles are partly or all masked
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + t[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = (start + t)[:, None] * (2 * HALF)
    x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
    tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


def _cu_seqlens(lengths: Sequence[int]) -> torch.Tensor:
    """[5, 1, 12, 0] -> int32 [0, 5, 6, 18, 18]."""
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)


def _build_packed_sequences(gen, device, block_t=4):
    cases = []
    for lengths, half in (([5, 1, 12, 0], 8), ([4, 4, 4], 16), ([7, 0, 2, 9, 3], 4)):
        cu = _cu_seqlens(lengths)
        total, longest = int(cu[-1]), max(lengths)
        x = _randn(gen, total, 2 * half)
        # a row for every index of x and one past: a kernel that rotates at the wrong index
        # reads a wrong row (the check names it), not memory outside the table
        cos, sin = _table(total + 1, half)
        x64, c64, s64 = x.double(), cos.double(), sin.double()
        wrong = [("this is RoPE at each row's index in the packed x, 0 .. "
                  f"{total - 1}: positions restart at 0 in every sequence, row r of sequence i "
                  "is at position r - cu_seqlens[i]",
                  spec_position_ids(x64, torch.arange(total), c64, s64))]
        inputs = {"x": _placed(x, device), "cu_seqlens": _placed(cu, device),
                  "cos": _placed(cos, device), "sin": _placed(sin, device)}
        buf, out = _poisoned((total, 2 * half), torch.float32, device)
        case = Case(f"x [{total}, {2 * half}], lengths {lengths}, BLOCK_T={block_t}",
                    (len(lengths), triton.cdiv(longest, block_t)),
                    (inputs["x"], inputs["cu_seqlens"], inputs["cos"], inputs["sin"], out),
                    {"HALF": half, "BLOCK_T": block_t}, inputs, "y", out, buf,
                    spec_packed_sequences(x64, cu, c64, s64), wrong=wrong)
        case.extra["cu_seqlens"] = cu
        cases.append(case)
    return cases


def _each_row_stored_by_one_program(case, memory) -> Optional[str]:
    who = memory.storing_programs(case.out_name)           # [TOTAL, 2 * HALF]
    twice = np.flatnonzero((who == -2).any(axis=1)).tolist()
    if not twice:
        return None
    firsts = set(case.extra["cu_seqlens"].tolist())
    return (f"right values in the interpreter, but rows {_ranges(twice)} of {case.out_name} were "
            "stored by two "
            f"programs{' (each the first row of a sequence)' if firsts.issuperset(twice) else ''}"
            ": the interpreter runs programs in order, so the last store wins here; on a GPU "
            "they run in no fixed order"
            + _why("cu_seqlens[i + 1] is one past the last row of sequence i: a program must "
                   "store its own sequence's rows only"))


def _big_packed_sequences(device, rows=None):
    n_seqs, half, bt = (64, 64, 16) if rows is None else (4, 64, 16)
    lengths = torch.randint(1, rows or 4096, (n_seqs,),
                            generator=torch.Generator().manual_seed(0))
    cu = _cu_seqlens(lengths.tolist()).to(device)
    total, longest = int(lengths.sum()), int(lengths.max())
    x = torch.randn(total, 2 * half, device=device)
    cos, sin = (t.to(device) for t in _table(longest, half))
    y = torch.empty_like(x)
    return Case(f"x [{total}, {2 * half}] fp32, {n_seqs} sequences", (n_seqs,
                triton.cdiv(longest, bt)), (x, cu, cos, sin, y), {"HALF": half, "BLOCK_T": bt},
                {"x": x, "cu_seqlens": cu, "cos": cos, "sin": sin}, "y", y, None, None)


PACKED_SEQUENCES = _register(Puzzle(
    10, "packed_sequences", "packed sequences (cu_seqlens)", spec_packed_sequences,
    _build_packed_sequences, solution_packed_sequences_kernel,
    nudge="for row r of sequence i, what position does the spec give it? And is row "
          "cu_seqlens[i + 1] a row of sequence i?",
    hint="the position of row r of sequence i is r - cu_seqlens[i], 0 at its first row; and "
         "cu_seqlens[i + 1] is one past its last row, so a program's live tokens are "
         "t < cu_seqlens[i + 1] - cu_seqlens[i]",
    big=_big_packed_sequences, require=_each_row_stored_by_one_program))


# 11. cos/sin cached in bf16 ----------------------------------------------------------------------

@triton.jit
def solution_bf16_table_kernel(
    x_ptr,  # *bf16: x [N_ROWS, 2 * HALF], contiguous
    cos_ptr,  # *bf16: cos [N_ROWS, HALF], the row of each token's position, cached in bf16
    sin_ptr,  # *bf16: sin [N_ROWS, HALF], likewise
    y_ptr,  # *bf16: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    tab = rows[:, None] * HALF + j[None, :]
    # every bf16 tile to fp32 right after its load: the product of two bf16 values is exact in
    # fp32 (8 + 8 significant bits), so each output is rounded once in fp32 and once on the store
    c = tl.load(cos_ptr + tab, mask=live, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + tab, mask=live, other=0.0).to(tl.float32)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0).to(tl.float32)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(row_y + HALF + j[None, :], (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=live)


ULP_TOL = 1.0   # bf16 ulps of y: rounding to nearest errs by 0.5, the interpreter's truncation < 1
TABLE_BOUND = math.sqrt(2) * 2**-9   # a bf16 cos or sin in [-1, 1] is off by <= 2^-9 absolute


def _bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values (8 significant bits) at |v|, as fp64."""
    _, e = torch.frexp(v.double().abs().clamp_min(2.0**-126))    # |v| = m 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(v, dtype=torch.float64), e - 8)


def _to_bf16(t: torch.Tensor, truncate: bool) -> torch.Tensor:
    """fp32 values to bf16: rounded to nearest (PyTorch, a GPU's cvt), or truncated toward zero
    (what Triton's interpreter does with .to(tl.bfloat16) and with a store into bf16)."""
    t = t.float()
    if truncate:
        t = (t.view(torch.int32) & -65536).view(torch.float32)     # keep the top 16 bits
    return t.to(torch.bfloat16)


def _eager_bf16(x, cos, sin, truncate: bool) -> torch.Tensor:
    """eager PyTorch's x * cos + rotate_half(x) * sin in bf16: each product rounded to bf16,
    then the sum (products of two bf16 values are exact in fp32)."""
    half = x.shape[-1] // 2
    x1, x2, c, s = x[:, :half].float(), x[:, half:].float(), cos.float(), sin.float()

    def r(t):
        return _to_bf16(t, truncate).float()

    return _to_bf16(torch.cat((r(x1 * c) - r(x2 * s), r(x2 * c) + r(x1 * s)), dim=-1), truncate)


def _build_bf16_table(gen, device, block_rows=8):
    cases = []
    spread = (torch.arange(40) * (math.log(131071) / 39)).exp().round()
    spread = torch.cat((spread, torch.tensor([100000.0]))).to(torch.int32).unique()
    for label, pos, half in (
            ("positions 0 .. 131,071", torch.tensor([0, 1, 100, 256, 257, 1000, 4097, 65537,
                                                     100000, 120001, 131071, 99999],
                                                    dtype=torch.int32), 16),
            (f"{len(spread)} positions spread over 1 .. 131,071", spread, 8)):
        n = len(pos)
        x = _randn(gen, n, 2 * half).to(torch.bfloat16)
        angle = pos.double()[:, None] * _inv_freq(half).double()[None, :]     # exact, fp64
        cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
        case = _row_case(label, (triton.cdiv(n, block_rows),), {"x": x, "cos": cos, "sin": sin},
                         (n, 2 * half), spec_bf16_table(x, cos, sin),
                         {"HALF": half, "BLOCK_ROWS": block_rows}, device, args_after=(n,),
                         out_dtype=torch.bfloat16)
        case.extra.update(
            positions=pos, angle=angle,
            eager=[_eager_bf16(x, cos, sin, truncate) for truncate in (False, True)],
            # the rotation with an fp32 table: cos and sin of the exact angle, rounded to fp32
            fp32_table=spec_bf16_table(x, angle.cos().float(), angle.sin().float()))
        cases.append(case)
    return cases


def _pair_error(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[N]: per row, the largest |y_pair - ref_pair| / |x_pair| (fp64)."""
    x = x.double().cpu()
    half = x.shape[-1] // 2
    d = y.double().cpu() - ref.double().cpu()
    num = (d[:, :half] ** 2 + d[:, half:] ** 2).sqrt()
    den = (x[:, :half] ** 2 + x[:, half:] ** 2).sqrt().clamp_min(1e-3)
    return (num / den).nan_to_num(float("inf")).amax(dim=1)


def bf16_table_costs(case: Case, got: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Per row of a puzzle-11 case (the graded launches run in Triton's interpreter), what the
    output's error is made of:

    - ulps: the kernel's own rounding, |y - spec| in bf16 ulps of the spec (the rotation by the
      same bf16 table values, in fp64), the largest of the row;
    - total: |y_pair - fp32-table rotation| / |x_pair|, the largest of the row;
    - table: the same for the exact rotation by the bf16 table (the table's own cost);
    - rounding: the same for the fp32-table rotation converted to bf16 as the interpreter
      converts (truncating): y's own conversion;
    - angle: the same for a rotation by a bf16 *angle* (puzzle 5's table), for contrast."""
    x = case.inputs["x"].cpu()
    want, ref32 = case.expected.cpu(), case.extra["fp32_table"]
    got = got.detach().cpu()
    ulps = ((got.double() - want).abs() / _bf16_ulp(want)).nan_to_num(float("inf"))
    angle16 = case.extra["angle"].to(torch.bfloat16).double()
    return {"ulps": ulps.amax(dim=1),
            "total": _pair_error(got, ref32, x),
            "table": _pair_error(want, ref32, x),
            "rounding": _pair_error(_to_bf16(ref32, truncate=True), ref32, x),
            "angle": _pair_error(spec_bf16_table(x, angle16.cos(), angle16.sin()), ref32, x)}


def _compare_bf16_table(case, got) -> Optional[str]:
    want = case.expected.cpu()
    got = got.detach().cpu()
    err = (got.double() - want).abs().nan_to_num(float("inf"))
    ulps = err / _bf16_ulp(want)
    if float(ulps.max()) <= ULP_TOL:
        return None
    worst = tuple(int(i) for i in torch.unravel_index(ulps.argmax(), ulps.shape))
    p = int(case.extra["positions"][worst[0]])
    text = (f"{int((ulps > ULP_TOL).sum())} of {ulps.numel()} elements are more than "
            f"{ULP_TOL:g} bf16 ulp from the rotation by the same bf16 table values (worst "
            f"{float(ulps[worst]):.3g} ulp at {worst}, position {p:,}: got "
            f"{got[worst].item():.6g}, expected {want[worst].item():.6g})")
    if any(torch.equal(got, e) for e in case.extra["eager"]):
        return text + _why("your y is, bit for bit, eager PyTorch's x * cos + rotate_half(x) * "
                           "sin in bf16: each product rounded to bf16 before the add, then the "
                           "sum rounded again. Where the two products nearly cancel, their "
                           "rounding errors are many ulps of the small result")
    if float(err.max()) > 0.1 * float(case.inputs["x"].double().abs().max()):
        text += (": far more than rounding"
                 + _why("if your kernel does arithmetic on bf16 tiles: Triton's interpreter "
                        "computes on their raw bits, not their values; convert each tile to "
                        "fp32 first"))
    return text


def _report_bf16_table(cases) -> str:
    """The kernel's own rounding; the table's cost is drawn in the panel, and the notebook
    computes it with torch alone."""
    ulps = max(float(bf16_table_costs(c, c.out)["ulps"].max()) for c in cases)
    return (f"   the kernel's part: y within {ulps:.3f} bf16 ulp of the rotation by the bf16 "
            f"table's own values (allowed {ULP_TOL:g}: rounding to nearest errs by up to 0.5, "
            "and the interpreter's conversion to bf16 truncates)")


def _plot_bf16_table(ax, case, got):
    k = bf16_table_costs(case, got)
    pos = case.extra["positions"]
    pos, order = pos[pos > 0].sort()                # a log axis: position 0 turns by nothing
    order = (case.extra["positions"] > 0).nonzero().flatten()[order]
    for key, label, style in (("total", "your y", "o-"), ("table", "bf16 table alone", "s--"),
                              ("rounding", "y's conversion to bf16 alone", "^:"),
                              ("angle", "a bf16 angle (puzzle 5)", "x-")):
        ax.loglog(pos.numpy(), k[key][order].clamp(1e-5, 10).numpy(), style, ms=3, lw=1,
                  label=label)
    ax.axhline(TABLE_BOUND, color="tab:red", lw=1, ls="--")
    ax.set_ylim(1e-5, 50)
    ax.set_xlabel("position", fontsize=7)
    ax.set_ylabel("worst pair error / |x|", fontsize=7)
    ax.set_title(f"error against an fp32 table\nthe kernel's part: {float(k['ulps'].max()):.3g} "
                 f"ulp (allowed {ULP_TOL:g})", fontsize=8)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              frameon=False)                  # beside the axes, not over the curves


def _big_bf16_table(device, rows=None):
    n, half, br = rows or 1 << 17, 64, 16
    x = torch.randn(n, 2 * half, device=device, dtype=torch.bfloat16)
    angle = torch.arange(n, device=device, dtype=torch.float64)[:, None] \
        * _inv_freq(half).to(device).double()[None, :]
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    y = torch.empty_like(x)
    return Case(f"x [{n}, {2 * half}] bf16, bf16 table", (triton.cdiv(n, br),),
                (x, cos, sin, y, n), {"HALF": half, "BLOCK_ROWS": br},
                {"x": x, "cos": cos, "sin": sin}, "y", y, None, None)


BF16_TABLE = _register(Puzzle(
    11, "bf16_table", "cos/sin cached in bf16", spec_bf16_table, _build_bf16_table,
    solution_bf16_table_kernel,
    nudge="count the places the kernel rounds to bf16 on the way from the loads to the store: "
          "how many does one output need?",
    hint="convert each loaded tile to fp32 (.to(tl.float32)), compute x1 c - x2 s and "
         "x2 c + x1 s in fp32, and round to bf16 only in the store",
    big=_big_bf16_table, picture=1, compare=_compare_bf16_table, plot=_plot_bf16_table,
    report=_report_bf16_table))


# 12. the capstone: the backward of packed, partial, interleaved RoPE -----------------------------

@triton.jit
def solution_packed_partial_backward_kernel(
    dy_ptr,  # *fp32: dL/dy [TOTAL, D], the sequences packed one after another, contiguous
    cu_seqlens_ptr,  # *int32: cu_seqlens [N_SEQS + 1]: 0, then where each sequence ends
    cos_ptr,  # *fp32: cos table [P, R // 2], contiguous (P >= the longest sequence)
    sin_ptr,  # *fp32: sin table [P, R // 2], contiguous
    dx_ptr,  # *fp32: dL/dx [TOTAL, D], contiguous
    D: tl.constexpr,  # features per row (any even size)
    R: tl.constexpr,  # rotary features: the first R of each row (R // 2 a power of two)
    BLOCK_D: tl.constexpr,  # the power of two at or above D
    BLOCK_T: tl.constexpr,  # tokens per program
):
    seq = tl.program_id(0)  # grid (N_SEQS, cdiv(longest sequence, BLOCK_T)), as in puzzle 10
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)  # one past the sequence's last row
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # positions: 0 at the first row
    tok = (t < end - start)[:, None]  # a shorter sequence's last tiles are partly or all masked
    row = (start + t)[:, None] * D
    # the rotary part, whole rows as in puzzle 2: pair j is features (2j, 2j + 1)
    f = tl.arange(0, R)
    g = tl.load(dy_ptr + row + f[None, :], mask=tok, other=0.0)
    g_even, g_odd = tl.split(tl.reshape(g, (BLOCK_T, R // 2, 2)))
    j = tl.arange(0, R // 2)
    c = tl.load(cos_ptr + t[:, None] * (R // 2) + j[None, :], mask=tok, other=1.0)
    s = tl.load(sin_ptr + t[:, None] * (R // 2) + j[None, :], mask=tok, other=0.0)
    # the transpose of the rotation, as in puzzle 8: each pair turned by -theta
    dx = tl.join(g_even * c + g_odd * s, g_odd * c - g_even * s)  # [BLOCK_T, R // 2, 2]
    tl.store(dx_ptr + row + f[None, :], tl.reshape(dx, (BLOCK_T, R)), mask=tok)
    # the features past R: y = x there, so dL/dx = dL/dy (masked to D, as in puzzle 4)
    rest = R + tl.arange(0, BLOCK_D)
    tail = tok & (rest < D)[None, :]
    tl.store(dx_ptr + row + rest[None, :], tl.load(dy_ptr + row + rest[None, :], mask=tail),
             mask=tail)


def _turned(dy, positions, cos, sin, R, *, adjacent: bool, backward: bool):
    """dy's first R features turned at `positions` by the table (its transpose when
    `backward`), in adjacent or rotate-half pairs; the rest copied: the known wrong answers."""
    c, s = cos[positions], sin[positions]
    s = -s if backward else s
    out = dy.clone()
    if adjacent:
        a, b = dy[:, 0:R:2], dy[:, 1:R:2]
        out[:, :R] = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = dy[:, :R // 2], dy[:, R // 2:R]
        out[:, :R] = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return out


def _build_packed_partial_backward(gen, device, block_t=4):
    cases = []
    for lengths, D, R in (([5, 1, 12, 0], 24, 16), ([4, 4, 4], 80, 32),
                          ([7, 0, 2, 9, 3], 40, 8)):
        cu = _cu_seqlens(lengths)
        total, longest = int(cu[-1]), max(lengths)
        dy = _randn(gen, total, D)
        cos, sin = _table(total + 1, R // 2)    # rows past every packed index, as in puzzle 10
        dy64, c64, s64 = dy.double(), cos.double(), sin.double()
        pos = torch.arange(total) - cu[:-1].long().repeat_interleave(cu.diff().long())
        tail_zero = _turned(dy64, pos, c64, s64, R, adjacent=True, backward=True)
        tail_zero[:, R:] = 0.0
        wrong = [
            ("this is the forward: each pair turned by +theta. The backward of a rotation is "
             "its transpose, the turn by -theta: flip the sign of the sine terms",
             _turned(dy64, pos, c64, s64, R, adjacent=True, backward=False)),
            ("this pairs feature j with j + R/2 (rotate-half); this model's forward turns "
             "adjacent features (2j, 2j + 1), and its backward turns the same pairs back",
             _turned(dy64, pos, c64, s64, R, adjacent=False, backward=True)),
            ("this turns each row at its index in the packed dL/dy: positions restart at 0 in "
             "every sequence, row r of sequence i is at position r - cu_seqlens[i]",
             _turned(dy64, torch.arange(total), c64, s64, R, adjacent=True, backward=True)),
            ("the features past R pass through the forward unchanged (y = x there), so their "
             "gradient is dL/dy itself, not 0", tail_zero)]
        inputs = {"dy": _placed(dy, device), "cu_seqlens": _placed(cu, device),
                  "cos": _placed(cos, device), "sin": _placed(sin, device)}
        buf, out = _poisoned((total, D), torch.float32, device)
        case = Case(f"dL/dy [{total}, {D}], R={R}, lengths {lengths}, BLOCK_T={block_t}",
                    (len(lengths), triton.cdiv(longest, block_t)),
                    (inputs["dy"], inputs["cu_seqlens"], inputs["cos"], inputs["sin"], out),
                    {"D": D, "R": R, "BLOCK_D": triton.next_power_of_2(D), "BLOCK_T": block_t},
                    inputs, "dx", out, buf,
                    spec_packed_partial_backward(dy64, cu, c64, s64, R), wrong=wrong)
        case.extra["cu_seqlens"] = cu
        cases.append(case)
    return cases


def _big_packed_partial_backward(device, rows=None):
    """ChatGLM's head, D = 128 with its first R = 64 features turned, on puzzle 10's timed
    sequences (the same lengths): a backward of the forward puzzle 10 times."""
    n_seqs, D, R, bt = (64, 128, 64, 16) if rows is None else (4, 128, 64, 16)
    lengths = torch.randint(1, rows or 4096, (n_seqs,),
                            generator=torch.Generator().manual_seed(0))
    cu = _cu_seqlens(lengths.tolist()).to(device)
    total, longest = int(lengths.sum()), int(lengths.max())
    dy = torch.randn(total, D, device=device)
    cos, sin = (t.to(device) for t in _table(longest, R // 2))
    dx = torch.empty_like(dy)
    return Case(f"dL/dy [{total}, {D}] fp32, R={R}, {n_seqs} sequences",
                (n_seqs, triton.cdiv(longest, bt)), (dy, cu, cos, sin, dx),
                {"D": D, "R": R, "BLOCK_D": triton.next_power_of_2(D), "BLOCK_T": bt},
                {"dy": dy, "cu_seqlens": cu, "cos": cos, "sin": sin}, "dx", dx, None, None)


PACKED_PARTIAL_BACKWARD = _register(Puzzle(
    12, "packed_partial_backward", "capstone: the backward of packed, partial, interleaved RoPE",
    spec_packed_partial_backward, _build_packed_partial_backward,
    solution_packed_partial_backward_kernel,
    nudge="one earlier puzzle at a time: the tokens, their positions and the mask (10); the "
          "pairs and the table column (2, 3); the features past R, up to D (3, 4); the sign "
          "(8). The features and rows the ❌ line names say which part is still wrong",
    hint="four earlier puzzles at once. Puzzle 10: program (i, b) has the tokens t = b * BLOCK_T "
         "+ arange(BLOCK_T) of sequence i, live where t < cu_seqlens[i + 1] - cu_seqlens[i], "
         "at row cu_seqlens[i] + t and position t. Puzzles 2 and 3: of the first R features, 2j "
         "pairs with 2j + 1 and reads table column j; features R..D-1 (masked to D, as in "
         "puzzle 4) are dL/dy copied. Puzzle 8: the backward turns each pair by -theta: "
         "dx_2j = g_2j c + g_2j+1 s, dx_2j+1 = g_2j+1 c - g_2j s",
    big=_big_packed_partial_backward, require=_each_row_stored_by_one_program))


# --- grading ----------------------------------------------------------------------------------



def _ranges(idx: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, idx = [], sorted(idx)
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        out.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ", ".join(out)


def _what_differs(case: Case, got: torch.Tensor, stored: bool = False) -> Optional[str]:
    """None when got matches the spec within the case's tolerances, else what differs
    (`stored`: the NaN elements of got are values the kernel stored, not elements it skipped)."""
    got64 = got.detach().to("cpu", torch.float64)
    want = case.expected.to("cpu", torch.float64)
    width = want.shape[-1]
    atol, rtol = case.tol
    nan = got64.isnan()
    close = torch.isclose(got64, want, atol=atol, rtol=rtol)
    if close.all():
        return None
    # a known mistake, named even when other elements were never written: a wrong output's NaN
    # elements are the ones it does not pin down
    named = None
    for why, alt in case.wrong:
        alt = alt.to("cpu", torch.float64)
        known = ~alt.isnan()
        if known.any() and torch.isclose(got64[known], alt[known], atol=atol, rtol=rtol).all():
            named = why
            break
    if nan.any():
        flat = nan.reshape(-1, width)
        first = tuple(int(i) for i in nan.nonzero()[0])
        what = "are NaN, as your kernel stored them" if stored else "were never written"
        text = (f"{int(nan.sum())} of {nan.numel()} output elements {what} (first "
                f"at {first}); features {_ranges(flat.any(0).nonzero().flatten().tolist())} "
                f"of rows {_ranges(flat.any(1).nonzero().flatten().tolist())}")
        off = (~close & ~nan).reshape(-1, width)
        if off.any():
            text += (f"; and {int(off.sum())} written elements differ (features "
                     f"{_ranges(off.any(0).nonzero().flatten().tolist())} of rows "
                     f"{_ranges(off.any(1).nonzero().flatten().tolist())})")
        return text if named is None else text + _why(named)
    bad = (~close).reshape(-1, width)
    err = (got64 - want).abs().masked_fill(close, 0)
    worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    return (f"{int(bad.sum())} of {bad.numel()} elements differ (features "
            f"{_ranges(bad.any(0).nonzero().flatten().tolist())} of rows "
            f"{_ranges(bad.any(1).nonzero().flatten().tolist())}); worst at {worst}: got "
            f"{got64[worst].item():.5g}, expected {want[worst].item():.5g}"
            + ("" if named is None else _why(named)))


def _judge(p: Puzzle, case: Case, got: torch.Tensor,
           memory: Optional[BoundsCheckedMemory] = None) -> Optional[str]:
    nan = got.isnan()
    if nan.any() and memory is not None:
        stored = memory.storing_programs(case.out_name) != -1
        if stored.reshape(nan.shape)[nan.cpu().numpy()].all():   # NaN the kernel computed
            return (p.compare(case, got) if p.compare is not None
                    else _what_differs(case, got, stored=True))
    if p.compare is not None and not nan.any():
        return p.compare(case, got)
    return _what_differs(case, got)


class _Ran:
    """What the launch closure hands back: the exception the launch raised, if any."""

    def __init__(self, error: Optional[BaseException] = None):
        self.error = error


def _launch_checked(kernel, case: Case, memory: BoundsCheckedMemory,
                    bar: Sequence = ()) -> Callable[[], _Ran]:
    """The launch a check runs inside `run_own_code`. That watch of the answer's calls is off
    while a kernel it allows runs (a compiled kernel calls no Python); in the interpreter the
    kernel's body is Python, so a lighter watch of its own refuses, by run_own_code's rules, a
    call the body makes into ropelib's finished functions (one that launches a kernel is
    refused at its launch anyway)."""
    interp = interpreted(kernel)
    runner = interp if isinstance(getattr(interp, "pre_run_hooks", None), list) else interp.run
    rules, verdicts, refused = _Rules((runtime,), bar), {}, []

    def body_watch(frame, event, arg):
        if event == "call":
            code = frame.f_code
            hit = verdicts.get(code)
            if hit is None:
                hit = verdicts[code] = rules.verdict(code) or ""
            if hit == "barred":
                refused.append(_refusal("your kernel", "called", code))
                raise LibraryAnswer(refused[-1])
        elif event == "c_call" and arg is sys.setprofile \
                and frame.f_code.co_filename != run_own_code.__code__.co_filename:  # the guard
            refused.append("this exercise wants your kernel, but its body switched off the "
                           "check's watch of the calls it makes (sys.setprofile): write it "
                           "yourself, without touching the profiler")
            raise LibraryAnswer(refused[-1])

    def watch_the_body(*args, **kwargs):     # run by the interpreter before the first program
        sys.setprofile(body_watch)

    def launch() -> _Ran:
        runner.pre_run_hooks.append(watch_the_body)
        try:             # run_own_code's launch guard puts its own watch back when it returns
            with memory.installed():
                interp[case.grid](*case.args, **case.constexprs)
        except Exception as exc:  # noqa: BLE001 -- reported by the check
            if not refused:
                return _Ran(exc)
        finally:
            runner.pre_run_hooks.remove(watch_the_body)
        if refused:               # even if the body caught it: not the learner's code
            raise LibraryAnswer(refused[0])
        return _Ran()
    return launch


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip()
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text = f"{type(cause).__name__}: {str(cause).strip()}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def draw_accesses(memory: BoundsCheckedMemory, title: str,
                  panel: Optional[Callable] = None) -> None:
    """Draw, per tensor of `memory`, which elements the kernel loaded (inputs: how often) and
    stored (outputs: which program); `panel(ax)` may draw one more plot beside them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    regions = sorted(memory.regions, key=lambda r: r.kind != "in")     # inputs, then outputs
    panels = len(regions) + (1 if panel is not None else 0)
    wide = 2.0 if panel is not None else 0.0          # room for the panel's legend, outside it
    fig, axes = plt.subplots(1, panels, figsize=(min(3.1 * panels, 15.5) + wide, 2.9),
                             squeeze=False)
    load_colors = np.array([[0.90, 0.90, 0.90], [0.62, 0.79, 0.88], [0.26, 0.57, 0.78],
                            [0.03, 0.32, 0.61], [0.03, 0.19, 0.42]])
    programs = plt.get_cmap("tab10")
    for ax, reg in zip(axes[0], regions):
        width = reg.addresses.shape[-1] if reg.addresses.ndim else 1
        if reg.kind == "in":
            n = memory.counts(reg.name, "load")
            img = load_colors[np.clip(n, 0, 4)].reshape(-1, width, 3)
            top = int(n.max()) if n.size else 0
            what = f"loads per element: up to {top}" if top else "never read"
        else:
            who = memory.storing_programs(reg.name).reshape(-1, width)
            img = np.zeros(who.shape + (3,))
            img[who == -1] = load_colors[0]
            img[who == -2] = (0.0, 0.0, 0.0)
            for k in sorted(set(who[who >= 0].tolist())):
                img[who == k] = programs(k % 10)[:3]
            what = "stored: colour = program"
        ax.imshow(img, aspect="auto", interpolation="nearest")
        dims = "x".join(str(d) for d in reg.tensor.shape)
        ax.set_title(f"{reg.name} [{dims}]\n{what}", fontsize=8)
        ax.set_xlabel("last dim", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if img.shape[0] == 1:
            ax.set_yticks([0])
    if panel is not None:
        panel(axes[0][-1])
    handles = [Patch(color=load_colors[0], label="never touched")]
    handles += [Patch(color=load_colors[k], label=f"loaded {what}")
                for k, what in ((1, "once"), (2, "twice"), (3, "3 times"), (4, "4 or more"))]
    handles.append(Patch(color=(0, 0, 0), label="stored by 2+ programs"))
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=7, frameon=False)
    if memory.faults:
        title += (f"\n{len(memory.faults)} instructions had lanes outside the tensors (not drawn: "
                  "the check masked them off)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    plt.show()
    plt.close(fig)


def run_in_checked_memory(kernel, grid, *args, inputs: Dict[str, torch.Tensor],
                          outputs: Dict[str, torch.Tensor], **kwargs) -> BoundsCheckedMemory:
    """Launch kernel[grid](*args, **kwargs) in the interpreter with every load and store checked
    against `inputs` (may be loaded) and `outputs` (may be stored), all CPU tensors; return the
    memory, with its recorded accesses and faults. An exception of the launch propagates."""
    regions = [Region(n, t, "in") for n, t in inputs.items()]
    regions += [Region(n, t, "out") for n, t in outputs.items()]
    memory = BoundsCheckedMemory(regions)
    with memory.installed():
        interpreted(kernel)[grid](*args, **kwargs)
    return memory


def _picture(p: Puzzle, case: Case, memory: BoundsCheckedMemory, verdict: str) -> None:
    panel = None if p.plot is None else (lambda ax: p.plot(ax, case, case.out))
    draw_accesses(memory, f"puzzle {p.number}, {case.label}: {verdict}", panel)


def sector_use(memory: BoundsCheckedMemory) -> Dict[str, Tuple[int, float]]:
    """Per tensor the kernel touched: (its load or store instructions, the fraction of the moved
    sectors' bytes they used), from the recorded accesses."""
    out = {}
    for reg in memory.regions:
        kind = "load" if reg.kind == "in" else "store"
        mine = [a for a, o in zip(memory.accesses, memory.owners) if o == reg.name]
        if mine:
            s = access.summary(mine, kind)
            out[reg.name] = (s["instructions"], s["efficiency"])
    return out


SOLUTIONS_AT_TIMED_SHAPE = (2, 3, 4, 6, 7, 8, 10, 11, 12)   # at_timed_shape builds these


def at_timed_shape(number: int, rows: int = 32) -> Tuple[str, BoundsCheckedMemory]:
    """Puzzle `number`'s worked solution run in checked memory on its timed case cut to `rows`
    rows (positions; for puzzles 10 and 12, tokens per sequence of four sequences), same head
    dim, dtypes and tiles: (the case's label, the memory with its recorded accesses)."""
    assert number in SOLUTIONS_AT_TIMED_SHAPE, number
    p = next(q for q in PUZZLES.values() if q.number == number)
    case = p.big("cpu", rows=rows)
    memory = run_in_checked_memory(p.solution, case.grid, *case.args, inputs=case.inputs,
                                   outputs={case.out_name: case.out}, **case.constexprs)
    return case.label, memory


def _sectors(memory: BoundsCheckedMemory) -> str:
    parts = []
    for name, (n, used) in sector_use(memory).items():
        kind = "load" if memory.region(name).kind == "in" else "store"
        parts.append(f"{name} {n} {kind}{'s' if n > 1 else ''} ({used:.0%} of the sectors' bytes "
                     "used)")
    return "; ".join(parts)


@dataclass
class Graded:
    """What the last check of a puzzle found: the seed its inputs were drawn from (hand it back
    as `seed=` to run the same cases again), and for a pass, the accesses its line printed."""
    key: str
    passed: bool
    seed: Optional[int]
    case: Optional[str] = None                       # the case whose accesses were printed
    sectors: Dict[str, Tuple[int, float]] = field(default_factory=dict)   # see sector_use
    why: List[str] = field(default_factory=list)     # a fail's diagnoses, which `hint` prints


_GRADES: Dict[str, Graded] = {}


def last_grade(key: str) -> Optional[Graded]:
    """The last check of puzzle `key` (or "copy", the worked example) in this process."""
    return _GRADES.get(key)


def _fail(p: Puzzle, label: str, problem: str, seed: int, kernel=None) -> bool:
    """Print the ❌ line: the symptom only (what differs, where); the diagnosis waits for
    `hint(p.number)`."""
    you = getattr(getattr(kernel, "fn", None), "__name__", "your_kernel")
    symptom, whys = _split_why(problem)
    print(f"❌ puzzle {p.number} ({p.title}), {label} (seed={seed}): {symptom}\n"
          f"   the same inputs again: pz.check_{p.key}({you}, seed={seed}); "
          f"a hint: pz.hint({p.number})")
    _RESULTS[p.key] = False
    _GRADES[p.key] = Graded(p.key, False, seed, why=whys)
    return False


def hint(number: int, fix: bool = False) -> None:
    """Print the hint for puzzle `number` (0: the masked copy): what the last failed check of
    it recognised, when it recognised the mistake, then where to look (the puzzle's nudge);
    with `fix=True`, the fix in words in place of the nudge."""
    p = next((q for q in list(PUZZLES.values()) + [COPY] if q.number == number), None)
    if p is None:
        print(f"no puzzle {number}: the puzzles are 1 to {len(PUZZLES)}")
        return
    g = _GRADES.get(p.key)
    lines = [f"puzzle {p.number} ({p.title}), a hint:"]
    if g is not None and not g.passed and g.why:
        lines += [f"   what your last check recognised: {w}" for w in g.why]
    if fix or not p.nudge:
        lines.append(f"   {p.hint}")
    else:
        lines += [f"   {p.nudge}",
                  f"   the fix in words: pz.hint({p.number}, fix=True)"]
    print("\n".join(lines))


def grade(p: Puzzle, kernel, *, seed: Optional[int] = None, draw: bool = True,
          time_it: bool = True) -> bool:
    """Check a learner's kernel for puzzle p: ✅ or ❌ with what differs; never raises.

    The inputs are drawn from `seed`, a fresh one when None; a ❌ line prints it, and the same
    seed handed back runs the same cases again."""
    seed = fresh_seed() if seed is None else int(seed)
    try:
        return _grade(p, kernel, seed=seed, draw=draw, time_it=time_it)
    except Exception as exc:  # noqa: BLE001 -- a check must not stop the notebook
        print(f"❌ puzzle {p.number} ({p.title}), seed={seed}: the check could not run your "
              f"kernel ({type(exc).__name__}: {_error_line(exc)})")
        _RESULTS[p.key] = False
        _GRADES[p.key] = Graded(p.key, False, seed)
        return False


def _grade(p: Puzzle, kernel, *, seed, draw, time_it) -> bool:
    name = f"puzzle {p.number} ({p.title})"
    if not kernel_answer(name, kernel, "the output it allocated"):
        _RESULTS[p.key] = False
        _GRADES[p.key] = Graded(p.key, False, None)
        return False
    cases = p.build(torch.Generator().manual_seed(seed), "cpu")
    bar = () if p.solution is None else (p.solution,)
    shown = None
    for i, case in enumerate(cases):
        memory = BoundsCheckedMemory(case.regions())
        ok, ran = run_own_code(f"{name}, {case.label}", "your kernel",
                               _launch_checked(kernel, case, memory, bar), bar=bar)
        if not ok:
            _RESULTS[p.key] = False
            _GRADES[p.key] = Graded(p.key, False, None)
            return False
        if ran.error is not None:
            return _fail(p, case.label, f"the launch raised {_error_line(ran.error)}", seed,
                         kernel)
        problems = [memory.fault_report(marked=True), _judge(p, case, case.out, memory)]
        if not any(problems) and p.require is not None:
            problems.append(p.require(case, memory))
        problem = "; and ".join(q for q in problems if q) or None
        if problem is not None:
            _fail(p, case.label, problem, seed, kernel)
            if draw:
                _picture(p, case, memory, "wrong")
            return False
        if i == p.picture or shown is None:
            shown = (case, memory)
    case, memory = shown
    print(f"✅ {name}: correct on {len(cases)} launches ({'; '.join(c.label for c in cases)})")
    print(f"   accesses of {case.label}: {_sectors(memory)}")
    if p.report is not None:
        print(p.report(cases))
    if draw:
        _picture(p, case, memory, "correct")
    _RESULTS[p.key] = True
    _GRADES[p.key] = Graded(p.key, True, seed, case.label, sector_use(memory))
    if time_it:
        return _on_gpu(p, kernel, seed)
    return True


@dataclass
class Timing:
    """A compiled kernel's time on a puzzle's timed case, and a device copy's of the same bytes."""
    gpu: str
    label: str                       # the timed case
    us: float                        # the kernel, median of do_bench
    copy_us: float                   # a device copy of the same bytes: its rounds' median
    nbytes: int                      # the bytes of the tensors a right answer reads or writes
    copy_spread: float = 0.0         # how far that copy's rounds moved: max / min - 1
    rounds: Tuple[float, ...] = ()   # time_in_rounds: the kernel's time in each round, us
    copy_rounds: Tuple[float, ...] = ()   # time_in_rounds: the copy's time in each round, us

    @property
    def of_copy(self) -> float:
        """The copy's time over the kernel's: 1.0 is copy speed."""
        return self.copy_us / self.us

    def against_copy(self) -> str:
        """The kernel's time, the bytes, the copy's time and the fraction of copy speed."""
        return (f"{self.us:.1f} us for {self.nbytes / 1e6:.0f} MB of tensors; a device copy of "
                f"the same bytes {self.copy_us:.1f} us: {self.of_copy:.0%} of copy speed "
                "(median of do_bench)")

    @property
    def round_fractions(self) -> Tuple[float, ...]:
        """time_in_rounds: per round, the copy's time over the kernel's in that round."""
        return tuple(c / k for c, k in zip(self.copy_rounds, self.rounds))


def rounds_line(name: str, t: Timing) -> str:
    """One line for a kernel timed by `time_in_rounds`: its median and its rounds' range, and
    its fraction of copy speed at the median with the lowest and highest round's fraction."""
    f = t.round_fractions
    return (f"{name[:34]:34s} {t.label[:34]:34s} {t.us:7.1f} us ({min(t.rounds):.1f}-"
            f"{max(t.rounds):.1f}); {t.of_copy:4.0%} of a copy ({min(f):.0%}-{max(f):.0%})")


def _why_no_timing() -> str:
    return ("no GPU here" if not torch.cuda.is_available() else
            "TRITON_INTERPRET=1 runs kernels in the interpreter")


def _compiled_problem(p: Puzzle, kernel, seed: int) -> Optional[Tuple[str, str]]:
    """(case, what differs) for the first case the compiled kernel gets wrong on the GPU."""
    cases = [c for c in p.build(torch.Generator().manual_seed(seed), "cuda") if not c.virtual]
    for case in cases:
        kernel[case.grid](*case.args, **case.constexprs)
        torch.cuda.synchronize()
        outside = case.out_buffer.numel() - case.out.numel() - int(case.out_buffer.isnan().sum()) \
            + int(case.out.isnan().sum())
        problem = (f"the compiled kernel stored {outside} elements outside {case.out_name}"
                   if outside else _judge(p, case, case.out))
        if problem is not None:
            return case.label, problem
    return None


def _on_gpu(p: Puzzle, kernel, seed: int) -> bool:
    """The compiled kernel on the same cases, then its time against a device copy; CPU: why not."""
    if not runtime.on_gpu():
        print(f"   ⏱ timing skipped ({_why_no_timing()}): the interpreter runs programs one after "
              "another in Python, so its time says nothing about a GPU's")
        return True
    wrong = _compiled_problem(p, kernel, seed)
    if wrong is not None:
        return _fail(p, wrong[0] + " (compiled, on the GPU)",
                     wrong[1] + " — it passed in the interpreter"
                     + _why("look for a race between programs or a load whose mask differs "
                            "from its store's"), seed, kernel)
    if p.big is None:
        print(f"   ⏱ not timed: {p.no_timing}")
        return True
    t = _CHECK_TIMES[p.key] = _time_big(p, kernel)
    print(f"   ⏱ {t.gpu}, {t.label}: your kernel {t.against_copy()}")
    return True


def copy_of(nbytes: int, device) -> Callable[[], object]:
    """A device copy that moves `nbytes` (reads half, writes half): the yardstick a kernel
    that moves `nbytes` in all is timed against."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


COPY_ROUNDS = 5                                  # do_bench rounds of each byte size's copy
_COPY_ROUNDS: Dict[Tuple[int, str], List[float]] = {}   # (bytes, device) -> the rounds, us


def _copy_rounds(nbytes: int, device) -> List[float]:
    """The device copy of `nbytes`, timed once per byte size in this process (COPY_ROUNDS
    do_bench medians, us) and reused: every ⏱ line of that size reads the same copy."""
    from triton.testing import do_bench

    key = (nbytes, str(device))
    if key not in _COPY_ROUNDS:
        copy = copy_of(nbytes, device)
        _COPY_ROUNDS[key] = [do_bench(copy, quantiles=[0.5, 0.2, 0.8])[0] * 1e3
                             for _ in range(COPY_ROUNDS)]
    return _COPY_ROUNDS[key]


def _moved_bytes(case: Case) -> int:
    """The bytes of the tensors a right answer reads or writes (each storage once): the case's
    inputs and its output. A tensor the kernel is handed but need not read (puzzle 5's bf16
    angle table) is not counted, so a fraction of copy speed does not flatter the kernel."""
    storages = {}
    for t in [*case.inputs.values(), case.out]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _time_big(p: Puzzle, kernel) -> Timing:
    """The compiled kernel on the puzzle's timed case, and a device copy of the same bytes."""
    from triton.testing import do_bench

    big = p.big("cuda")

    def run():
        kernel[big.grid](*big.args, **big.constexprs)

    run()
    torch.cuda.synchronize()
    nbytes = _moved_bytes(big)
    ms = do_bench(run, quantiles=[0.5, 0.2, 0.8])[0]
    rounds = _copy_rounds(nbytes, big.out.device)
    return Timing(torch.cuda.get_device_name(), big.label, ms * 1e3,
                  float(np.median(rounds)), nbytes, max(rounds) / min(rounds) - 1)


_SOLUTION_TIMES: Dict[str, Timing] = {}
_CHECK_TIMES: Dict[str, Timing] = {}     # the ⏱ line of the last passing check, per puzzle


def check_time(key: str) -> Optional[Timing]:
    """The ⏱ line the last passing check of `key` printed (section 0's copy included), or None
    where nothing was timed (no GPU, or the check failed)."""
    return _CHECK_TIMES.get(key)


def time_solution(key: str) -> Optional[Timing]:
    """Time puzzle `key`'s worked solution on the GPU, compiled, as a check times a right answer
    (same case, same copy): the line a learner's ⏱ line can be set against. On the CPU, say that
    timing needs a GPU. The solution is launched here, not graded: an answer that is the worked
    solution still fails its check. Never raises; returns None when nothing was timed.
    """
    p = PUZZLES[key]
    head = f"   ⏱ worked solution of puzzle {p.number}"
    if not runtime.on_gpu():
        print(f"{head}: timing needs a GPU ({_why_no_timing()})")
        return None
    if p.big is None:
        print(f"{head}: not timed: {p.no_timing}")
        return None
    try:
        wrong = _compiled_problem(p, p.solution, seed=0)
        if wrong is not None:
            print(f"❌{head[4:]}: not timed, the compiled solution is wrong on the GPU "
                  f"({wrong[0]}: {wrong[1]})")
            return None
        t = _SOLUTION_TIMES[key] = _time_big(p, p.solution)
    except Exception as exc:  # noqa: BLE001 -- the notebook goes on; the summary names it
        print(f"❌{head[4:]}: could not be timed ({type(exc).__name__}: {_error_line(exc)})")
        return None
    print(f"{head} (the time to aim for), {t.gpu}, {t.label}: {t.against_copy()}")
    return t


def time_kernel(key: str, kernel, who: str) -> Optional[Timing]:
    """Time `kernel` (named `who` in the line printed) on puzzle `key`'s timed case as a check
    times a right answer, after it is found right on the GPU; it is not graded (a kernel that
    fails its check for its loads, such as `given_shared_table_kernel`, can be timed). On the
    CPU, say that timing needs a GPU. Never raises; returns None when nothing was timed."""
    p = PUZZLES[key]
    head = f"   ⏱ {who}, puzzle {p.number}"
    if not runtime.on_gpu() or p.big is None:
        print(f"{head}: not timed ({_why_no_timing() if p.big else p.no_timing})")
        return None
    try:
        wrong = _compiled_problem(p, kernel, seed=0)
        if wrong is not None:
            print(f"❌{head[4:]}: not timed, wrong on the GPU ({wrong[0]}: {wrong[1]})")
            return None
        t = _time_big(p, kernel)
    except Exception as exc:  # noqa: BLE001 -- the notebook goes on
        print(f"❌{head[4:]}: could not be timed ({type(exc).__name__}: {_error_line(exc)})")
        return None
    print(f"{head}, {t.gpu}, {t.label}: {t.against_copy()}")
    return t


def time_in_rounds(kernels: Dict[str, Tuple[str, object]],
                   rounds: int = COPY_ROUNDS) -> Optional[Dict[str, Timing]]:
    """Time several kernels, each on its puzzle's timed case, in `rounds` alternating rounds.

    Args:
        kernels: {name: (puzzle key, kernel)}; each kernel is first run compiled on its puzzle's
            cases and must be right there, as a check's kernel is (it is not graded: a kernel
            that fails its check for its loads can be timed).
        rounds: how many rounds. Each round times every kernel once, then a device copy of each
            byte size once (`copy_of`), each a do_bench median, so a drift of the GPU's clocks
            during the cell reaches every kernel alike.

    Returns {name: Timing}: `us` the median of the kernel's rounds and `rounds` all of them,
    `copy_us` and `copy_rounds` the same for the copy of its bytes. On the CPU, or when a
    kernel is wrong or cannot be timed, it prints why and returns None; it never raises.
    """
    if not runtime.on_gpu():
        print(f"   ⏱ not timed in rounds ({_why_no_timing()})")
        return None
    from triton.testing import do_bench

    def timed(run) -> float:
        return do_bench(run, quantiles=[0.5, 0.2, 0.8])[0] * 1e3

    try:
        cases, runs = {}, {}
        for name, (key, kernel) in kernels.items():
            wrong = _compiled_problem(PUZZLES[key], kernel, seed=0)
            if wrong is not None:
                print(f"❌ {name}: not timed, wrong on the GPU ({wrong[0]}: {wrong[1]})")
                return None
            big = cases[name] = PUZZLES[key].big("cuda")
            runs[("kernel", name)] = (lambda k, c: lambda: k[c.grid](*c.args, **c.constexprs))(
                kernel, big)
        nbytes = {name: _moved_bytes(big) for name, big in cases.items()}
        for n in sorted(set(nbytes.values())):
            device = next(c.out.device for name, c in cases.items() if nbytes[name] == n)
            runs[("copy", n)] = copy_of(n, device)
        for run in runs.values():      # compiled and warm before the first round
            run()
        torch.cuda.synchronize()
        us: Dict[tuple, List[float]] = {what: [] for what in runs}
        for _ in range(rounds):
            for what, run in runs.items():
                us[what].append(timed(run))
    except Exception as exc:  # noqa: BLE001 -- the notebook goes on
        print(f"❌ not timed in rounds ({type(exc).__name__}: {_error_line(exc)})")
        return None
    gpu = torch.cuda.get_device_name()
    out = {}
    for name, big in cases.items():
        mine, copy = us[("kernel", name)], us[("copy", nbytes[name])]
        out[name] = Timing(gpu, big.label, float(np.median(mine)), float(np.median(copy)),
                           nbytes[name], max(copy) / min(copy) - 1, tuple(mine), tuple(copy))
    return out


def stated(claims: Sequence[Tuple[str, object, object]]) -> None:
    """Print each number the notebook's text states beside what the data give, one row a claim
    (what, as the text writes it, as computed), and assert every pair equal: the text cannot
    drift from the committed data it quotes. When all agree it prints one line; the table of
    every claim, only on a mismatch."""
    wrong = [what for what, text, got in claims if text != got]
    if not wrong:
        print(f"✓ the {len(claims)} numbers the text quotes agree with the data")
        return
    width = max(len(what) for what, _, _ in claims)
    cols = max([13] + [max(len(str(t)), len(str(g))) for _, t, g in claims])
    print(f"{'the text says':{width}s}  {'stated':>{cols}s}  {'from the data':>{cols}s}")
    for what, text, got in claims:
        print(f"{what:{width}s}  {str(text):>{cols}s}  {str(got):>{cols}s}  "
              f"{'✓' if text == got else '✗'}")
    assert not wrong, f"the text no longer matches the data: {wrong}"


def solution_times() -> Dict[str, Timing]:
    """The worked solutions :func:`time_solution` has timed in this process, in puzzle order."""
    return {k: _SOLUTION_TIMES[k] for k in PUZZLES if k in _SOLUTION_TIMES}


# --- what the notebook calls --------------------------------------------------------------------

def check_copy(kernel, **kw) -> bool:
    """The worked example of section 0: a masked copy of x [N] into y, in tiles of BLOCK."""
    return grade(COPY, kernel, **kw)


def check_rotate_row(kernel, **kw) -> bool:
    """Puzzle 1: rotate one row of 2 * HALF features, rotate-half pairs (j, j + HALF)."""
    return grade(ROTATE_ROW, kernel, **kw)


def check_interleaved(kernel, **kw) -> bool:
    """Puzzle 2: GPT-J's interleaved pairs (2j, 2j + 1), a tile of rows per program."""
    return grade(INTERLEAVED, kernel, **kw)


def check_partial(kernel, **kw) -> bool:
    """Puzzle 3: partial rotary, the first R features rotated and the rest copied."""
    return grade(PARTIAL, kernel, **kw)


def check_odd_head_dim(kernel, **kw) -> bool:
    """Puzzle 4: head dims whose halves are no power of two (80, 96, 72)."""
    return grade(ODD_HEAD_DIM, kernel, **kw)


def check_long_context(kernel, **kw) -> bool:
    """Puzzle 5: angles at positions up to 131,071, graded by angle error vs the fp64 spec."""
    return grade(LONG_CONTEXT, kernel, **kw)


def check_position_ids(kernel, **kw) -> bool:
    """Puzzle 6: position ids read through their strides (expanded, sliced)."""
    return grade(POSITION_IDS, kernel, **kw)


def check_int64_offsets(kernel, **kw) -> bool:
    """Puzzle 7: row offsets past 2^31 elements (a virtual tensor: only its rows exist)."""
    return grade(INT64_OFFSETS, kernel, **kw)


def check_backward(kernel, **kw) -> bool:
    """Puzzle 8: dL/dx from dL/dy, checked against the autograd of the spec."""
    return grade(BACKWARD, kernel, **kw)


def check_shared_table(kernel, **kw) -> bool:
    """Puzzle 9: one cos/sin table row per position, loaded once for the whole batch."""
    return grade(SHARED_TABLE, kernel, **kw)


def check_packed_sequences(kernel, **kw) -> bool:
    """Puzzle 10: sequences packed in one tensor (thd), positions restarting at each
    cu_seqlens entry."""
    return grade(PACKED_SEQUENCES, kernel, **kw)


def check_bf16_table(kernel, **kw) -> bool:
    """Puzzle 11: cos/sin cached in bf16, graded in bf16 ulps against the same table's rotation."""
    return grade(BF16_TABLE, kernel, **kw)


def check_packed_partial_backward(kernel, **kw) -> bool:
    """Puzzle 12, the capstone: dL/dx of interleaved RoPE on the first R of D features, for
    sequences packed in one tensor (thd, cu_seqlens)."""
    return grade(PACKED_PARTIAL_BACKWARD, kernel, **kw)


def show_spec(key: str) -> None:
    """Show a puzzle's plain-PyTorch spec (its source) as a code block."""
    src = textwrap.dedent(inspect.getsource(PUZZLES[key].spec)).strip("\n")
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        from IPython.display import Markdown, display
        display(Markdown(f"```python\n{src}\n```"))
    else:
        print(src)


def scoreboard() -> Dict[str, Optional[bool]]:
    """Print which puzzles passed in this kernel process; return {key: True/False/None}."""
    result = {}
    for p in PUZZLES.values():
        r = _RESULTS.get(p.key)
        result[p.key] = r
        mark = "✅" if r else ("❌" if r is False else "· ")
        print(f"{mark} {p.number:2d}. {p.title}")
    done = sum(1 for r in result.values() if r)
    print(f"{done} of {len(result)} solved")
    return result
