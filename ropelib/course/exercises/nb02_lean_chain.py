"""Notebook 02, exercise 4: an eager chain without the two costs section 6 found in TE's.

Section 6 timed TE's plain-PyTorch rotation and found two things beyond its bytes: the two
multiplies read the cos/sin table broadcast over batch and heads (so PyTorch runs them from its
non-vectorized template), and TE's partial-rotary split ends in a `cat` that copies all of the
output to join it with nothing. The learner writes `lean_chain(t, freqs)`: the same rotation
(`sbhd`, rotate-half, every feature turned), in plain PyTorch, whose arithmetic never reads a
broadcast operand and which has no split.

`check_lean_chain` asks three things. (1) The output equals TE's chain bit for bit, on several
shapes and dtypes and on one drawn when it runs (so a tensor made beforehand fails); the
learner's code runs with ropelib's answers barred (`own_code`: ropelib, its benchmarks, the
worked solution). (2) Every arithmetic op whose output has as many elements as `t` reads
operands of its output's shape, none of them broadcast (a stride of 0): a table made
contiguous at `t`'s shape first, by a copy, is what passes. (3) The bytes the ops touch, counted
at dispatch as notebook 02's `CountTraffic` counts them (a broadcast view counted by the
elements it holds, not the ones it shows), stay within 14 times the bytes of `t` plus 8 times
the fp32 table's (its cos, sin and casts, as TE's chain has them): the worked answer's count.
On `t` that is TE's 12 less the split's `cat` (2), plus the two tables written at `t`'s shape
and read back by the multiplies (2 each). A chain that keeps the split, or that makes its tables at `t`'s shape in fp32,
moves more.
"""
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ... import reference
from . import check
from .own_code import check_cases, fresh_generator

__all__ = ["check_lean_chain", "solution_lean_chain", "chain_ops", "BYTES_OF_X", "TABLE_TIMES"]

# the arithmetic ops whose operands must not be broadcast (copies such as clone or cat may read
# a broadcast view: that is how a table is made contiguous)
ARITHMETIC = {"mul", "add", "sub", "neg", "div", "addcmul", "addcdiv", "mul_", "add_", "sub_",
              "neg_", "div_", "addcmul_", "addcdiv_", "rsub", "lerp", "where"}
BYTES_OF_X = 14           # the budget: bytes of t, besides the table's few (see the docstring)
TABLE_TIMES = 8           # and the fp32 table's bytes: cos, sin, their casts, as in TE's chain


def _held_bytes(t: torch.Tensor) -> int:
    """The bytes a tensor holds: a dimension of stride 0 (a broadcast view) counts once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


class _Ops(TorchDispatchMode):
    """Record (op, bytes read and written, broadcast operands of an x-sized arithmetic op)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema, name = func._schema, func.overloadpacket.__name__
        aliases = [r.alias_info for r in schema.returns]
        if aliases and all(a is not None and not a.is_write for a in aliases):
            return out                                            # a view: no bytes move
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        moved = sum(_held_bytes(t) for t in inputs) + sum(_held_bytes(t) for t in outputs)
        broadcast = []
        if name in ARITHMETIC and any(o.numel() == self.numel for o in outputs):
            shape = outputs[0].shape
            broadcast = [f"{tuple(t.shape)} with strides {tuple(t.stride())}" for t in inputs
                         if t.shape != shape or 0 in t.stride()]
        self.ops.append((name, moved, broadcast))
        return out


def chain_ops(fn: Callable, t: torch.Tensor, freqs: torch.Tensor) -> list:
    """[(op, bytes touched, broadcast operands as "shape with strides")] of fn(t, freqs), each
    non-view ATen op."""
    with _Ops(t.numel()) as seen:
        fn(t, freqs)
    return seen.ops


def _case(s, b, h, d, dtype, g, label=""):
    t = torch.randn(s, b, h, d, generator=g).to(dtype)
    angles = torch.arange(s, dtype=torch.float32)[:, None] * \
        (10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.cat((angles, angles), -1)[:, None, None, :]
    return (f"t [{s}, {b}, {h}, {d}] {str(dtype).replace('torch.', '')}{label}",
            (t, freqs), reference.te_unfused(t, freqs))


def check_lean_chain(fn: Callable) -> bool:
    """fn(t [S, B, H, D], freqs [S, 1, 1, D] fp32) -> TE's rotation of t (rotate-half, every
    feature turned) bit for bit, with no broadcast operand in its arithmetic on t-sized tensors
    and at most BYTES_OF_X times the bytes of t (plus the table's) touched."""
    g = torch.Generator().manual_seed(2)
    cases = [_case(16, 2, 3, 32, torch.bfloat16, g), _case(7, 1, 4, 8, torch.float32, g),
             _case(9, 3, 2, 16, torch.float16, g)]
    seed, drawn = fresh_generator()
    s, b, h = (int(v) for v in torch.randint(2, 12, (3,), generator=drawn))
    d = 2 * int(torch.randint(2, 17, (), generator=drawn))
    cases.append(_case(s, b, h, d, torch.bfloat16, drawn, f" (drawn with seed {seed})"))
    name = "an eager chain without broadcast operands or the split"
    if not check_cases(name + ": its output", "your chain", fn, cases, atol=0, rtol=0,
                       hint="the same ops in the same order as TE's chain give the same bits: "
                            "make the tables contiguous at t's shape in t's dtype"):
        return False
    label, (t, freqs), _ = cases[0]
    try:                       # the same call as the first case's, which passed: ops recorded
        ops = chain_ops(fn, t, freqs)
    except Exception as exc:  # noqa: BLE001 -- a checker must not stop the notebook
        print(f"❌ {name}: recording its ops failed ({type(exc).__name__}: {exc})")
        return False
    bad = [(op, shapes) for op, _, shapes in ops if shapes]
    if bad:
        op, shapes = bad[0]
        return check(f"{name}: operands of the arithmetic on t ({label})",
                     f"`{op}` reads {', '.join(shapes)}: not t's shape {tuple(t.shape)}, or "
                     "broadcast to it (a stride of 0 repeats one element)",
                     "no broadcast operand", hint="expand the cos/sin table to t's shape and "
                     "make it contiguous (.contiguous() copies it) before multiplying")
    x_bytes = t.numel() * t.element_size()
    budget = BYTES_OF_X * x_bytes + TABLE_TIMES * _held_bytes(freqs)
    moved = sum(m for _, m, _ in ops)
    if moved > budget:
        return check(f"{name}: bytes ({label})",
                     f"{moved / x_bytes:.2f}x the bytes of t",
                     f"at most {BYTES_OF_X}x (plus {TABLE_TIMES}x the fp32 table's)",
                     hint="a final cat copies all of t again; tables made at t's shape in fp32 "
                          "are twice the bytes: cast to t's dtype before expanding")
    print(f"✅ {name}: TE's bits, no broadcast operand, {len(ops)} ops touching "
          f"{moved / x_bytes:.2f}x the bytes of t")
    return True


def solution_lean_chain(t, freqs):
    half = t.shape[-1] // 2
    cos = torch.cos(freqs).to(t.dtype).expand_as(t).contiguous()   # the tables at t's shape,
    sin = torch.sin(freqs).to(t.dtype).expand_as(t).contiguous()   # copied into contiguous memory
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)    # rotate_half, as TE's
    return t * cos + rotated * sin                                   # no split, no final cat
