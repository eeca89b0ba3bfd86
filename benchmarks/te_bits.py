"""Which change makes notebook 08's Triton RoPE equal Transformer Engine's fused RoPE bit for bit?

    python3 benchmarks/te_bits.py --out DIR            # on a GPU with TE: DIR/te-bits-<gpu>.pt
    TRITON_INTERPRET=1 python3 benchmarks/te_bits.py --dry-run --out DIR   # CPU: vs TE emulation

TE's fused kernel (transformer_engine/common/fused_rope/fused_rope.cu, `fused_rope_block_forward`)
computes, per element and in fp32::

    sincosf(freqs[s_id * d2 + d_id], &v_sin, &v_cos);
    v_src_rotate = d_id < d2 / 2 ? -x[d_id + d2 / 2] : x[d_id - d2 / 2];
    dst = v_src * v_cos + v_src_rotate * v_sin;       // one rounding to the output dtype

and nvcc contracts the last line into one fma by default (-fmad=true). This script runs that real
kernel and variants of notebook 08's teaching kernel (ropelib.course.debug's Unsloth-style
reproduction: rows b*S + s, position row % S, one program per (row, head), the two halves as two
tiles) that each differ in one thing, on the inputs notebook 08 compares (debug.Scenario, seed 0):

* the contraction (``CONTRACTIONS``): ``x1*c - x2*s`` / ``x2*c + x1*s`` left to the compiler
  (the teaching kernel's spelling, ``free_sub``) or in TE's spelling ``x*c + rot*s`` with
  ``rot = -x2 | x1`` (``free_te``); explicit ``tl.fma(x, c, rot*s)`` (``fma_xc``) or
  ``tl.fma(rot, s, x*c)`` (``fma_rs``); none at all (``none_rn``: libdevice's ``mul_rn`` /
  ``add_rn``, which compile to ``mul.rn.f32`` / ``add.rn.f32``, instructions ptxas never fuses);
  and the two free spellings compiled with ``enable_fp_fusion=False`` (Triton's option: LLVM
  does not contract and ptxas runs with ``--fmad=false``), suffix ``-nofuse``;
* where cos/sin come from (``SINCOS``): ``tl.cos``/``tl.sin`` of the fp32 angles, libdevice's
  precise ``cos``/``sin``, libdevice's ``fast_cosf``/``fast_sinf`` (the ``cos.approx`` /
  ``sin.approx`` instructions, what TE built with fast math would use), or a table: fp32 by torch
  on the run's device (``table_fp32``), fp32 by torch on the CPU (``table_cpu_fp32``, what the TE
  emulation and a CPU notebook use), TE's own fp32 cos/sin (``table_te_fp32``, read back from TE
  itself: an fp32 input of ones in the first half and zeros in the second makes TE's output
  exactly its cos and sin), or the fp32 table rounded to the input dtype (``table_input_dtype``);
* the dtype of the math: fp32, or the input dtype (``input``: the teaching kernel's
  ``x.to(sin.dtype)``, cos/sin and both products rounded to x's dtype, as debug's REPRO);

plus debug's own presets (REPRO, FIXED, FIXED + fma, FIXED with an fp32 table) through
``debug.apply_rotary_pos_emb_triton``, and ``ropelib.reference.te_fused_emulation`` (torch on the
GPU and on the CPU) for the record. The scenarios: notebook 08's GPU comparison (``nb_gpu``,
S=512 B=2 H=8 D=128 bf16 sbhd), its CPU one (``nb_cpu``, S=32 B=2 H=2 D=32), and both in fp32
(``nb_gpu_fp32``, ``nb_cpu_fp32``): an fp32 output shows each rounding difference that a bf16
output mostly hides, so the contraction order is read off there.

Printed: per scenario one row per variant with the elements differing from TE (bits), the most
dtype steps apart (``debug.steps_apart``; across zero this counts every tiny value between), the
largest |difference| and the first differing (s, b, h, d); then how many cos/sin entries of each
source differ from TE's own. Saved (``torch.save``, CPU tensors, ~2 MB): see :func:`main`'s
docstring and :func:`output` / :func:`unpack` to read a tensor back; beside it
``<name>.asm.txt.gz``, the PTX and SASS of every variant compiled for ``nb_gpu`` (the rows keep
their fp32 opcode counts and the PTX's last 16 fp32 instructions).
Without a GPU or without Transformer Engine it says so and exits 2; ``--dry-run`` runs every
variant through whatever runs here (Triton's interpreter on a CPU) on the two small scenarios and
compares with ``te_fused_emulation`` in TE's place (libdevice does not run in the interpreter:
those variants are recorded as "not run", and ``none_rn`` uses plain ``*``/``+``, which numpy never
contracts).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import platform
import re
import sys
import time
import traceback
from pathlib import Path

try:  # Transformer Engine first: it loads its own CUDA libraries before torch and triton do
    import transformer_engine.pytorch  # noqa: F401
    TE_WHY = ""
except Exception as exc:  # noqa: BLE001 -- optional here; the reason is reported
    TE_WHY = f"Transformer Engine is not importable ({type(exc).__name__}: {exc})"

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit below or in ropelib

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from ropelib import reference, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.bench.compare import DTYPES, angles  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.kernels.common import BF16_RTNE, round_to  # noqa: E402

FORMAT = "te-bits/1"

# --- what varies ------------------------------------------------------------------------------

CONTRACTIONS = {  # name: (CONTRACT code, enable_fp_fusion, description)
    "free_sub": (0, True, "y1 = x1*c - x2*s, y2 = x2*c + x1*s (the teaching kernel's spelling); "
                          "the compiler may contract"),
    "free_te": (1, True, "y = x*c + rot*s with rot = -x2 | x1 (TE's spelling); the compiler may "
                         "contract"),
    "fma_xc": (2, True, "y = tl.fma(x, c, rot*s): x*c fused, rot*s rounded (nvcc's contraction "
                        "of TE's line)"),
    "fma_rs": (3, True, "y = tl.fma(rot, s, x*c): rot*s fused, x*c rounded (the other order)"),
    "none_rn": (4, True, "y = add_rn(mul_rn(x, c), mul_rn(rot, s)): both products and the sum "
                         "rounded (mul.rn/add.rn are never fused; plain ops in the interpreter)"),
    "free_sub-nofuse": (0, False, "free_sub compiled with enable_fp_fusion=False (LLVM no "
                                  "contraction, ptxas --fmad=false)"),
    "free_te-nofuse": (1, False, "free_te compiled with enable_fp_fusion=False"),
}

SINCOS = {  # name: (SINCOS code, description)
    "tl": (0, "tl.cos / tl.sin of the fp32 angles in the kernel"),
    "libdevice": (1, "libdevice.cos / libdevice.sin (precise cosf/sinf) in the kernel"),
    "fast": (2, "libdevice.fast_cosf / fast_sinf (cos.approx / sin.approx) in the kernel"),
    "table_fp32": (3, "fp32 table: torch.cos / torch.sin of the angles on the run's device"),
    "table_cpu_fp32": (3, "fp32 table: torch.cos / torch.sin of the angles on the CPU"),
    "table_te_fp32": (3, "fp32 table: TE's own cos/sin, read back from TE (ones/zeros input)"),
    "table_input_dtype": (3, "table_fp32 rounded to the input dtype"),
}

MATHS = {"fp32": "math in fp32, one rounding at the store",
         "input": "math in the input dtype: cos/sin and each product rounded to x's dtype, the "
                  "sum rounded again at the store (debug's math_in_input_dtype)"}


@dataclasses.dataclass(frozen=True)
class Variant:
    contract: str          # a key of CONTRACTIONS ("free_sub" for math "input": not used there)
    sincos: str            # a key of SINCOS
    math: str = "fp32"     # a key of MATHS

    @property
    def name(self) -> str:
        if self.math == "input":
            return f"input_dtype_math/{self.sincos}"
        return f"{self.contract}/{self.sincos}"

    @property
    def description(self) -> str:
        if self.math == "input":
            return f"{MATHS['input']}; cos/sin: {SINCOS[self.sincos][1]}"
        return f"{CONTRACTIONS[self.contract][2]}; cos/sin: {SINCOS[self.sincos][1]}"


def variants() -> list[Variant]:
    """Every contraction with each in-kernel / TE sin/cos, every sin/cos source with the explicit
    TE-order fma and with the teaching kernel's free spelling, and the input-dtype math."""
    out: list[Variant] = []
    for sc in ("tl", "libdevice", "table_te_fp32"):
        out += [Variant(c, sc) for c in CONTRACTIONS]
    for c in ("fma_xc", "free_sub"):
        out += [Variant(c, sc) for sc in ("fast", "table_fp32", "table_cpu_fp32",
                                          "table_input_dtype")]
    out += [Variant("free_sub", sc, "input") for sc in ("tl", "libdevice", "table_fp32",
                                                        "table_input_dtype")]
    names = [v.name for v in out]
    assert len(names) == len(set(names)), names
    return out


PRESETS = {  # name: (debug.Causes, description)
    "debug:REPRO": (debug.REPRO, "debug.REPRO: table in the input dtype, math in the input dtype"),
    "debug:FIXED": (debug.FIXED, "debug.FIXED: tl.cos/tl.sin in the kernel, fp32 math, free "
                                 "contraction (x1*c - x2*s)"),
    "debug:FIXED+fma": (dataclasses.replace(debug.FIXED, fma=True),
                        "debug.FIXED with fma=True: tl.fma(x1, c, -(x2*s)), tl.fma(x2, c, x1*s)"),
    "debug:FIXED-table_fp32": (dataclasses.replace(debug.FIXED, sincos_in_kernel=False),
                               "debug.FIXED with an fp32 torch table instead of in-kernel sin/cos"),
}

SCENARIOS = {  # notebook 08's SC on a GPU and on a CPU, and both in fp32
    "nb_gpu": debug.Scenario(seq_len=512, batch=2, heads=8, head_dim=128),
    "nb_cpu": debug.Scenario(seq_len=32, batch=2, heads=2, head_dim=32),
    "nb_gpu_fp32": debug.Scenario(seq_len=512, batch=2, heads=8, head_dim=128, dtype="fp32"),
    "nb_cpu_fp32": debug.Scenario(seq_len=32, batch=2, heads=2, head_dim=32, dtype="fp32"),
}
DRY_SCENARIOS = ("nb_cpu", "nb_cpu_fp32")
SMALL_NUMEL = 1 << 16       # scenarios up to this size keep every tensor whole
SPARSE_MAX_BIG = 2048       # a big scenario's variant is stored sparse up to this many differences


# --- the kernel -------------------------------------------------------------------------------
# The teaching kernel of ropelib.course.debug (_rope_unsloth_repro_kernel), written to a separate
# output, with three switches: SINCOS, CONTRACT and MATH_FP32. Grid (ROWS, H), rows b*S + s.

@triton.jit
def _rope_bits_kernel(
    x_ptr, y_ptr,  # [ROWS, H, D] in, out (same strides); last dim contiguous
    ang_ptr,  # [P, HALF] fp32 angles (SINCOS 0-2)
    cos_ptr, sin_ptr,  # [P, HALF] cos / sin tables (SINCOS 3), any float dtype
    stride_xr, stride_xh,  # x / y strides (rows, heads), in elements
    stride_a, stride_t,  # row strides of the angles and of the tables
    SEQ_LEN,  # position of a row: row % SEQ_LEN
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    SINCOS: tl.constexpr,  # 0 tl.cos/sin, 1 libdevice cos/sin, 2 libdevice fast_cosf/sinf, 3 table
    CONTRACT: tl.constexpr,  # 0 x1*c - x2*s, 1 x*c + rot*s (both free), 2 fma(x, c, rot*s),
                             # 3 fma(rot, s, x*c), 4 no contraction (mul_rn / add_rn)
    MATH_FP32: tl.constexpr,  # False: cos/sin and the products rounded to x's dtype (debug's REPRO)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
    INTERPRET: tl.constexpr,  # the interpreter has no libdevice: none_rn uses plain * and +
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    pos = row % SEQ_LEN
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    if SINCOS == 3:
        c = tl.load(cos_ptr + pos * stride_t + offs, mask=mask, other=0.0)
        s = tl.load(sin_ptr + pos * stride_t + offs, mask=mask, other=0.0)
    else:
        theta = tl.load(ang_ptr + pos * stride_a + offs, mask=mask, other=0.0).to(tl.float32)
        if SINCOS == 0:
            c = tl.cos(theta)
            s = tl.sin(theta)
        elif SINCOS == 1:
            c = libdevice.cos(theta)
            s = libdevice.sin(theta)
        else:
            c = libdevice.fast_cosf(theta)
            s = libdevice.fast_sinf(theta)
    x_row = x_ptr + row * stride_xr + head * stride_xh
    y_row = y_ptr + row * stride_xr + head * stride_xh
    x1 = tl.load(x_row + offs, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF + offs, mask=mask, other=0.0)
    if not MATH_FP32:
        c = round_to(c.to(tl.float32), x_ptr.dtype.element_ty, BF16_RTNE)
        s = round_to(s.to(tl.float32), x_ptr.dtype.element_ty, BF16_RTNE)
    c = c.to(tl.float32)
    s = s.to(tl.float32)
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if not MATH_FP32:  # debug's math_in_input_dtype: each product rounded, then the sum
        y1 = (round_to(x1 * c, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32)
              - round_to(x2 * s, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32))
        y2 = (round_to(x2 * c, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32)
              + round_to(x1 * s, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32))
    elif CONTRACT == 0:  # the teaching kernel's FIXED line
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    elif CONTRACT == 1:  # TE's line: v_src * v_cos + v_src_rotate * v_sin
        r1 = -x2
        r2 = x1
        y1 = x1 * c + r1 * s
        y2 = x2 * c + r2 * s
    elif CONTRACT == 2:  # fma(v_src, v_cos, v_src_rotate * v_sin)
        y1 = tl.fma(x1, c, -x2 * s)
        y2 = tl.fma(x2, c, x1 * s)
    elif CONTRACT == 3:  # fma(v_src_rotate, v_sin, v_src * v_cos)
        y1 = tl.fma(-x2, s, x1 * c)
        y2 = tl.fma(x1, s, x2 * c)
    else:  # no contraction: every product and the sum rounded to fp32
        if INTERPRET:
            y1 = x1 * c + (-x2) * s
            y2 = x2 * c + x1 * s
        else:
            y1 = libdevice.add_rn(libdevice.mul_rn(x1, c), libdevice.mul_rn(-x2, s))
            y2 = libdevice.add_rn(libdevice.mul_rn(x2, c), libdevice.mul_rn(x1, s))
    tl.store(y_row + offs, round_to(y1, x_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
    tl.store(y_row + HALF + offs, round_to(y2, x_ptr.dtype.element_ty, BF16_RTNE), mask=mask)


@triton.jit
def _sincos_kernel(ang_ptr, c_ptr, s_ptr, N, SINCOS: tl.constexpr, BLOCK: tl.constexpr):
    """cos and sin of N fp32 angles, as _rope_bits_kernel computes them for SINCOS 0-2."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    theta = tl.load(ang_ptr + offs, mask=m, other=0.0)
    if SINCOS == 0:
        c = tl.cos(theta)
        s = tl.sin(theta)
    elif SINCOS == 1:
        c = libdevice.cos(theta)
        s = libdevice.sin(theta)
    else:
        c = libdevice.fast_cosf(theta)
        s = libdevice.fast_sinf(theta)
    tl.store(c_ptr + offs, c, mask=m)
    tl.store(s_ptr + offs, s, mask=m)


NEEDS_LIBDEVICE = ("libdevice", "fast")


class NotHere(RuntimeError):
    """A variant that cannot run where the script runs (libdevice in the interpreter)."""


def rope_bits(x: torch.Tensor, ang: torch.Tensor, tables: dict, v: Variant):
    """Variant ``v`` of the teaching kernel on sbhd ``x`` [S, B, H, D] (all D features rotated,
    rotate-half) with fp32 angles ``ang`` [S, D/2]; ``tables`` maps a table source to (cos, sin).
    Returns (y sbhd contiguous, the compiled kernel or None)."""
    S, B, H, D = x.shape
    half = D // 2
    if ang.shape != (S, half):
        raise ValueError(f"angles must be [S, D/2] = {(S, half)}, got {tuple(ang.shape)}")
    if runtime.INTERPRET and v.sincos in NEEDS_LIBDEVICE:
        raise NotHere("libdevice does not run in Triton's interpreter")
    code, _ = SINCOS[v.sincos]
    if code == 3:
        if v.sincos not in tables:
            raise RuntimeError(f"no {v.sincos} table in this run")
        cos, sin = tables[v.sincos]
    else:
        cos = sin = ang
    contract, fusion, _ = CONTRACTIONS[v.contract]
    rows = x.transpose(0, 1).contiguous().view(B * S, H, D)        # rows b*S + s
    y = torch.empty_like(rows)
    compiled = _rope_bits_kernel[(B * S, H)](
        rows, y, ang, cos, sin, rows.stride(0), rows.stride(1), ang.stride(0), cos.stride(0), S,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), SINCOS=code, CONTRACT=contract,
        MATH_FP32=v.math == "fp32", BF16_RTNE=BF16_RTNE, INTERPRET=runtime.INTERPRET,
        enable_fp_fusion=fusion)
    return y.view(B, S, H, D).transpose(0, 1).contiguous(), compiled


def kernel_sincos(ang: torch.Tensor, source: str):
    """(cos, sin) of fp32 angles by the in-kernel source "tl", "libdevice" or "fast"."""
    if runtime.INTERPRET and source in NEEDS_LIBDEVICE:
        raise NotHere("libdevice does not run in Triton's interpreter")
    a = ang.contiguous().view(-1)
    c, s = torch.empty_like(a), torch.empty_like(a)
    _sincos_kernel[(triton.cdiv(a.numel(), 1024),)](a, c, s, a.numel(), SINCOS=SINCOS[source][0],
                                                    BLOCK=1024)
    return c.view(ang.shape), s.view(ang.shape)


# --- the TE side ------------------------------------------------------------------------------

def te_apply():
    """(TE's apply_rotary_pos_emb, where it came from) or (None, why)."""
    if TE_WHY:
        return None, TE_WHY
    for module in ("transformer_engine.pytorch.attention.rope",
                   "transformer_engine.pytorch.attention", "transformer_engine.pytorch"):
        try:
            mod = __import__(module, fromlist=["apply_rotary_pos_emb"])
            return mod.apply_rotary_pos_emb, module
        except (ImportError, AttributeError):
            continue
    return None, "apply_rotary_pos_emb not found in transformer_engine.pytorch"


def te_fused_real(fn):
    def run(t, freqs4):
        return fn(t, freqs4, tensor_format="sbhd", fused=True)
    return run


def te_emulation(t, freqs4):
    return reference.te_fused_emulation(t, freqs4, tensor_format="sbhd")


def te_sincos(te, ang: torch.Tensor):
    """TE's own fp32 (cos, sin) of the angles [P, R/2]: an fp32 input with ones in the first half
    and zeros in the second gives y1 = 1*cos + (-0)*sin = cos and y2 = 0*cos + 1*sin = sin
    exactly, whichever product is fused."""
    P, half = ang.shape
    freqs4 = torch.cat((ang, ang), dim=-1).view(P, 1, 1, 2 * half)
    probe = torch.cat((torch.ones(P, 1, 1, half), torch.zeros(P, 1, 1, half)), dim=-1)
    y = te(probe.to(ang.device), freqs4).float()
    return y[:, 0, 0, :half].contiguous(), y[:, 0, 0, half:].contiguous()


# --- inputs, comparisons, storage -------------------------------------------------------------

def inputs(sc: debug.Scenario, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x sbhd, angles [S, D/2] fp32) exactly as debug.reproduce(sc, FIXED, device) draws them:
    the CPU generator's randn cast on the device, the angles of bench.compare.angles computed on
    the device."""
    if sc.layout != "sbhd":
        raise ValueError("te_bits compares sbhd scenarios only")
    g = torch.Generator().manual_seed(sc.seed)
    x = torch.randn((sc.seq_len, sc.batch, sc.heads, sc.head_dim), generator=g).to(
        device=device, dtype=DTYPES[sc.dtype])
    freqs4 = angles(sc.seq_len, sc.head_dim, device=device)
    return x, freqs4[:, 0, 0, :sc.head_dim // 2].contiguous()


_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
        torch.float64: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT[t.dtype])


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
                          ).hexdigest()


def compare_bits(a: torch.Tensor, ref: torch.Tensor) -> dict:
    """Elements whose bits differ, the most dtype steps apart, the first differing index and a
    histogram {steps: count} (CPU tensors of one shape and dtype)."""
    diff = bits(a) != bits(ref)
    n = int(diff.sum())
    steps = debug.steps_apart(a, ref)
    first = None
    moved = int((steps > 0).sum())
    if n:
        flat = int(diff.flatten().nonzero()[0])
        first = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    vals, counts = torch.unique(steps[diff], return_counts=True) if n else ([], [])
    return {"n_differ": n, "numel": a.numel(), "max_steps": int(steps.max()) if a.numel() else 0,
            "first": first, "n_signed_zero_only": n - moved,
            "max_abs_diff": float((a.double() - ref.double()).abs().max()) if a.numel() else 0.0,
            "hist": {int(v): int(c) for v, c in zip(vals, counts)}}


def pack(t: torch.Tensor, base, limit: int, allow_full: bool = False,
         base_name: str = "te") -> dict:
    """``t`` stored sparse against ``base`` (flat indices and values where the bits differ) up
    to ``limit`` differences; beyond that whole if ``allow_full`` or ``limit`` is a third of
    ``t`` or more, else not at all (its summary row stays). No ``base``: whole."""
    t = t.detach().cpu().contiguous()
    if base is not None:
        diff = (bits(t) != bits(base)).flatten()
        n = int(diff.sum())
        if n <= limit:
            idx = diff.nonzero().flatten().to(torch.int32)
            return {"kind": "sparse", "base": base_name, "idx": idx, "val": t.flatten()[idx.long()],
                    "shape": tuple(t.shape), "dtype": str(t.dtype), "sha256": sha256(t)}
        if limit < t.numel() // 3 and not allow_full:
            return {"kind": "none", "shape": tuple(t.shape), "dtype": str(t.dtype),
                    "sha256": sha256(t), "why": f"{n} elements differ from the base"}
    return {"kind": "full", "tensor": t, "shape": tuple(t.shape), "dtype": str(t.dtype),
            "sha256": sha256(t)}


def unpack(p: dict, base=None):
    """The tensor of a :func:`pack` entry (``base``: what its "base" names, for "sparse"), or
    None where only its summary was kept."""
    if p["kind"] == "full":
        return p["tensor"]
    if p["kind"] == "sparse":
        if base is None:
            raise ValueError("a sparse entry needs its base (the scenario's TE output)")
        t = base.detach().cpu().clone().contiguous()
        t.view(-1)[p["idx"].long()] = p["val"]
        return t
    return None


def output(data: dict, scenario: str, name: str):
    """A saved output (variant, preset, "te" or an emulation) of one scenario, or None where the
    file keeps only its summary. ``data`` = torch.load(path)."""
    sc = data["scenarios"][scenario]
    te = sc["te"]["tensor"] if sc["te"]["kind"] == "full" else None
    if name == "te":
        return te
    return unpack(sc["outputs"][name], te)


_PTX_OPS = re.compile(r"^\s*(?:@%p\d+\s+)?((?:fma|mul|add|sub|neg)(?:\.rn|\.rz|\.ftz)*\.f32|"
                      r"(?:sin|cos)\.approx(?:\.ftz)?\.f32)\b", re.M)
_SASS_OPS = re.compile(r"\b(FFMA|FMUL|FADD|MUFU\.(?:SIN|COS))\b")


def asm_record(compiled, sass: bool = True) -> dict:
    """fp32 arithmetic of a compiled kernel: PTX and SASS opcode counts, and the PTX lines of the
    last 16 fp32 arithmetic instructions (the rotation ends there)."""
    if compiled is None or not hasattr(compiled, "asm"):
        return {}
    rec: dict = {}
    try:
        ptx = compiled.asm["ptx"]
        ops = _PTX_OPS.findall(ptx)
        rec["ptx_ops"] = {o: ops.count(o) for o in sorted(set(ops))}
        lines = [ln.strip() for ln in ptx.splitlines() if _PTX_OPS.match(ln)]
        rec["ptx_tail"] = lines[-16:]
        rec["ptx"] = ptx
    except Exception as exc:  # noqa: BLE001
        rec["ptx_error"] = repr(exc)
    if not sass:
        return rec
    try:
        text = compiled.asm["sass"]
        ops = _SASS_OPS.findall(text)
        rec["sass_ops"] = {o: ops.count(o) for o in sorted(set(ops))}
        rec["sass"] = text
    except Exception as exc:  # noqa: BLE001
        rec["sass_error"] = repr(exc)
    return rec


def environment(dry_run: bool, te_where: str) -> dict:
    from importlib.metadata import version
    meta = {"format": FORMAT, "script": "benchmarks/te_bits.py", "dry_run": dry_run,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": runtime.mode(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda or "none", "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "interpret": runtime.INTERPRET, "bf16_rtne_by_hand": bool(BF16_RTNE)}
    try:
        meta["transformer_engine"] = version("transformer_engine")
    except Exception:  # noqa: BLE001
        meta["transformer_engine"] = "not installed"
    meta["te_side"] = ("ropelib.reference.te_fused_emulation (dry run)" if dry_run else
                       f"{te_where}.apply_rotary_pos_emb(..., tensor_format='sbhd', fused=True)")
    if torch.cuda.is_available():
        meta["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return meta


# --- one scenario -----------------------------------------------------------------------------

def run_scenario(key: str, sc: debug.Scenario, te, device, asm_out: list, log) -> dict:
    """Everything of one scenario: TE, the variants, the presets, the emulations, the sin/cos."""
    t0 = time.time()
    x, ang = inputs(sc, device)
    P, half = ang.shape
    freqs4 = torch.cat((ang, ang), dim=-1).view(P, 1, 1, 2 * half)
    small = x.numel() <= SMALL_NUMEL
    limit = x.numel() if small else SPARSE_MAX_BIG
    rec: dict = {"scenario": dataclasses.asdict(sc), "shape": tuple(x.shape),
                 "x_sha256": sha256(x), "angles_sha256": sha256(ang),
                 "outputs": {}, "rows": [], "sincos": {}, "errors": {}}
    ang_cpu_x, ang_cpu = inputs(sc, "cpu")
    rec["angles_equal_cpu"] = bool(torch.equal(bits(ang.cpu()), bits(ang_cpu)))
    rec["x_equal_cpu"] = bool(torch.equal(bits(x.cpu()), bits(ang_cpu_x)))
    if small or not rec["angles_equal_cpu"]:
        rec["angles"] = ang.cpu()
    if small:
        rec["x"] = x.cpu()

    # TE, and TE's own cos/sin
    te_out = te(x, freqs4).contiguous().cpu()
    if te_out.dtype != x.dtype:
        raise RuntimeError(f"TE returned {te_out.dtype} for a {x.dtype} input")
    keep_te = small or te_out.element_size() <= 2
    rec["te"] = pack(te_out, None, 0) if keep_te else {
        "kind": "none", "shape": tuple(te_out.shape), "dtype": str(te_out.dtype),
        "sha256": sha256(te_out), "why": "fp32 output of the big scenario not kept (size)"}
    tables = {"table_fp32": (torch.cos(ang), torch.sin(ang)),
              "table_cpu_fp32": (torch.cos(ang.cpu()).to(device), torch.sin(ang.cpu()).to(device))}
    tables["table_input_dtype"] = tuple(t.to(x.dtype) for t in tables["table_fp32"])
    rec["sincos_reference"] = "table_te_fp32"
    try:
        te_c, te_s = te_sincos(te, ang)
        tables["table_te_fp32"] = (te_c, te_s)
    except Exception:  # noqa: BLE001 -- the variants with TE's table report the error
        rec["errors"]["te_sincos"] = traceback.format_exc(limit=4)
        print(f"  TE's own cos/sin could not be read back:\n{rec['errors']['te_sincos']}")
        te_c, te_s = tables["table_fp32"]
        rec["sincos_reference"] = "table_fp32 (TE's own could not be read back)"

    # how far each cos/sin source is from TE's own
    sources = {k: tables[k] for k in ("table_fp32", "table_cpu_fp32")}
    for src in ("tl", "libdevice", "fast"):
        try:
            sources[src] = kernel_sincos(ang, src)
        except NotHere:
            pass
        except Exception as exc:  # noqa: BLE001
            rec["errors"][f"sincos:{src}"] = f"{type(exc).__name__}: {exc}"
    for src, (c, s) in sources.items():
        rec["sincos"][src] = {"cos": compare_bits(c.cpu(), te_c.cpu()),
                              "sin": compare_bits(s.cpu(), te_s.cpu())}
    rec["sincos_ref"] = {"cos": pack(te_c.cpu(), None, 0), "sin": pack(te_s.cpu(), None, 0)} \
        if small else {"cos": pack(te_c.cpu(), torch.cos(ang_cpu), 4096, True,
                                   "torch.cos of the angles on the CPU"),
                       "sin": pack(te_s.cpu(), torch.sin(ang_cpu), 4096, True,
                                   "torch.sin of the angles on the CPU")}
    if small:
        rec["sincos_tables"] = {k: (c.cpu(), s.cpu()) for k, (c, s) in sources.items()}

    def add(name, kind, description, fn):
        row = {"variant": name, "kind": kind, "description": description}
        try:
            out, compiled = fn()
            out = out.contiguous().cpu()
            row.update(compare_bits(out, te_out))
            rec["outputs"][name] = pack(out, te_out, limit)
            with_sass = key == "nb_gpu"
            a = asm_record(compiled, sass=with_sass)
            if a:
                row["ptx_ops"] = a.get("ptx_ops")
                row["sass_ops"] = a.get("sass_ops")
                row["ptx_tail"] = a.get("ptx_tail")
                if with_sass:
                    asm_out.append((name, a))
        except NotHere as exc:
            row["error"] = f"not run: {exc}"
        except Exception as exc:  # noqa: BLE001 -- one failure must not lose the others
            row["error"] = f"{type(exc).__name__}: {exc}"
            rec["errors"][name] = traceback.format_exc(limit=4)
        rec["rows"].append(row)
        log(row)

    for v in variants():
        add(v.name, "variant", v.description, lambda v=v: rope_bits(x, ang, tables, v))
    for name, (causes, description) in PRESETS.items():
        add(name, "preset", description,
            lambda c=causes: (debug.apply_rotary_pos_emb_triton(x, freqs4, "sbhd", c), None))
    add("emulation:device", "emulation", f"te_fused_emulation with torch on {x.device.type}",
        lambda: (te_emulation(x, freqs4), None))
    add("emulation:cpu", "emulation", "te_fused_emulation with torch on the CPU",
        lambda: (te_emulation(x.cpu(), freqs4.cpu()), None))
    rec["seconds"] = round(time.time() - t0, 1)
    return rec


# --- printing ---------------------------------------------------------------------------------

def format_row(r: dict) -> str:
    if "error" in r:
        return f"  {r['variant']:<34} {'error':>8}  {r['error'][:90]}"
    first = "-" if r["first"] is None else "(" + ",".join(map(str, r["first"])) + ")"
    return (f"  {r['variant']:<34} {r['n_differ']:>8} {r['max_steps']:>6} "
            f"{r['max_abs_diff']:>10.3g}  {first}")


def header(key: str, sc: debug.Scenario, te_name: str) -> str:
    return (f"\n== {key}: S={sc.seq_len} B={sc.batch} H={sc.heads} D={sc.head_dim} {sc.dtype} "
            f"sbhd seed {sc.seed}; vs {te_name}\n"
            f"  {'variant':<34} {'differ':>8} {'steps':>6} {'max |d|':>10}  first (s,b,h,d)")


def print_sincos(rec: dict, te_name: str) -> None:
    print(f"  cos/sin sources vs {rec['sincos_reference']} of {te_name} (entries differing / "
          "most fp32 steps apart):")
    for src, d in rec["sincos"].items():
        c, s = d["cos"], d["sin"]
        print(f"    {src:<16} cos {c['n_differ']:>6}/{c['numel']} ({c['max_steps']})   "
              f"sin {s['n_differ']:>6}/{s['numel']} ({s['max_steps']})")


# --- main -------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True,
                   help="a folder (gets te-bits-<gpu-slug>.pt) or a file ending in .pt")
    p.add_argument("--dry-run", action="store_true",
                   help="the small scenarios on whatever runs here (the Triton interpreter on a "
                        "CPU), compared with ropelib.reference.te_fused_emulation instead of TE")
    p.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS),
                   help="which scenarios (default: all four; --dry-run: the two small ones)")
    p.add_argument("--no-asm", action="store_true",
                   help="do not write the PTX/SASS of nb_gpu's variants (<name>.asm.txt.gz)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run the comparison; returns the exit status (0 done, 2 cannot run here).

    The saved dict: ``meta`` (GPU, capability, versions of torch / CUDA / Triton / TE, what the
    TE side is, date), ``variants`` / ``contractions`` / ``sincos_sources`` / ``maths`` /
    ``presets`` (descriptions), ``scenarios[key]`` with: ``scenario`` (debug.Scenario's fields),
    ``x`` and ``angles`` (small scenarios; else their sha256, recomputable with :func:`inputs`),
    ``te`` (TE's output, packed: whole for bf16 and small scenarios), ``sincos_ref`` (TE's own fp32
    cos/sin of the angles), ``sincos`` (each cos/sin source vs TE's, :func:`compare_bits`),
    ``sincos_tables`` (small scenarios: every source's tables), ``outputs[name]`` (each variant,
    preset and emulation, packed against TE's output: :func:`output` reads one back), ``rows``
    (the printed table, with PTX/SASS opcode counts of each compiled variant) and ``errors``."""
    args = parse_args(argv)
    out = Path(args.out)
    if args.dry_run:
        te, te_where, te_name = te_emulation, "ropelib.reference", "TE emulation"
        device = runtime.default_device()
        keys = args.scenarios or list(DRY_SCENARIOS)
    else:
        if not torch.cuda.is_available() or runtime.INTERPRET:
            print("te_bits: needs a CUDA GPU with compiled Triton kernels "
                  f"(torch.cuda.is_available() = {torch.cuda.is_available()}, TRITON_INTERPRET = "
                  f"{os.environ.get('TRITON_INTERPRET', '0')}); use --dry-run for the CPU check",
                  file=sys.stderr)
            return 2
        fn, te_where = te_apply()
        if fn is None:
            print(f"te_bits: needs Transformer Engine: {te_where}; use --dry-run to compare with "
                  "ropelib's TE emulation instead", file=sys.stderr)
            return 2
        te, te_name, device = te_fused_real(fn), "TE fused", "cuda"
        keys = args.scenarios or list(SCENARIOS)
    meta = environment(args.dry_run, te_where)
    slug = compare.gpu_slug(meta["gpu"]) if meta["gpu"] != "none" else "cpu"
    name = f"te-bits-{slug}{'-dry-run' if args.dry_run else ''}.pt"
    path = out if out.suffix == ".pt" else out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"te_bits: {meta['gpu']} | torch {meta['torch']} | triton {meta['triton']} | TE "
          f"{meta['transformer_engine']} | {meta['mode']} | TE side: {meta['te_side']}", flush=True)
    data = {"meta": meta,
            "variants": {v.name: dataclasses.asdict(v) | {"description": v.description}
                         for v in variants()},
            "contractions": {k: {"code": c, "enable_fp_fusion": f, "description": d}
                             for k, (c, f, d) in CONTRACTIONS.items()},
            "sincos_sources": {k: d for k, (_, d) in SINCOS.items()}, "maths": MATHS,
            "presets": {k: {"causes": dataclasses.asdict(c), "description": d}
                        for k, (c, d) in PRESETS.items()},
            "scenarios": {}}
    asm_out: list = []
    status = 0
    for key in keys:
        sc = SCENARIOS[key]
        print(header(key, sc, te_name), flush=True)
        try:
            rec = run_scenario(key, sc, te, device, asm_out,
                               lambda r: print(format_row(r), flush=True))
        except Exception:  # noqa: BLE001 -- TE itself or the inputs failed: keep the rest
            print(f"  scenario {key} failed:\n{traceback.format_exc()}", flush=True)
            data["scenarios"][key] = {"error": traceback.format_exc()}
            status = 1
            continue
        print_sincos(rec, te_name)
        print(f"  ({rec['seconds']} s; angles equal to the CPU's: {rec['angles_equal_cpu']}; "
              f"x equal: {rec['x_equal_cpu']})", flush=True)
        data["scenarios"][key] = rec
        torch.save(data, path)  # after every scenario: a later failure keeps the earlier ones
    torch.save(data, path)
    print(f"\nsaved {path} ({path.stat().st_size / 1e6:.2f} MB)")
    if asm_out and not args.no_asm:
        import gzip
        asm_path = path.with_suffix(".asm.txt.gz")
        with gzip.open(asm_path, "wt") as f:
            for name, a in asm_out:
                f.write(f"######## {name}\n## ptx ops {a.get('ptx_ops')}\n## sass ops "
                        f"{a.get('sass_ops')}\n")
                f.write(a.get("ptx", a.get("ptx_error", "")) + "\n")
                f.write(a.get("sass", a.get("sass_error", "")) + "\n")
        print(f"saved {asm_path} ({asm_path.stat().st_size / 1e6:.2f} MB): PTX and SASS of every "
              "compiled variant of nb_gpu")
    return status


if __name__ == "__main__":
    sys.exit(main())
