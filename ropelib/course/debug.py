"""The allclose debugger behind notebook 08: why `torch.allclose(tokens_te, tokens_triton)` fails
although the first ten printed values are identical.

The story: a Triton RoPE written after Unsloth's kernel was checked against
Transformer Engine's fused RoPE with ``assert torch.allclose(tokens_te, tokens_triton)``; it
failed, the first ten printed values of both tensors were identical, and the cause was never
found. This module reproduces it with a small *teaching* kernel and lets each possible cause be
switched on and off (:class:`Causes`), with the tools to look in the right place: an error map
over position x feature, the argmax location, errors in ulps and dtype-aware tolerances, a
norm-wise error per rotated pair, the positions a rotated output encodes, and a decision table
from the shape of a difference to its family of causes (:data:`DECISIONS`, :func:`classify`).

With Transformer Engine installed (and a GPU) the comparison uses the real TE fused kernel;
otherwise ``ropelib.reference.te_fused_emulation`` (TE's math: fp32 sin/cos of fp32 angles,
fp32 multiply-add, one rounding), labelled "TE emulation".
"""
from __future__ import annotations

import collections
import ctypes
import re
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import reference, runtime
from ..bench.compare import DTYPES, angles, note_read, ulp
from ..kernels.common import BF16_RTNE, round_to

__all__ = ["Causes", "Scenario", "REPRO", "FIXED", "CAUSE_DOCS", "DECISIONS", "tolerances",
           "unit_roundoff", "ulp_error", "one_ulp_up", "steps_apart", "normwise_error",
           "recovered_positions", "error_map", "argmax_location", "plot_heatmap", "te_fused",
           "te_label", "rope_unsloth_repro", "check_repro_kernel", "REPRO_KERNEL_ARGS",
           "apply_rotary_pos_emb_triton", "reproduce",
           "diagnose", "classify", "model_pairing", "LAYOUT_NORMWISE_U", "te_bits_file",
           "te_bits_files", "te_bits_counts", "load_te_bits", "te_bits_inputs", "te_bits_case",
           "TeBitsCase", "bits_differ",
           "CONTRACTION_WAYS", "contraction_emulations", "float_instructions",
           "repro_kernel_instructions", "ptx_products", "combine_kernel_products",
           "repro_kernel_products"]


# --- the reproduction kernel ------------------------------------------------------------------
# THE REPRODUCTION, NOT ropelib's KERNEL. Written after Unsloth's `_rope_embedding`: rows are the
# flattened first two dims of a bshd tensor, the position of a row is `row % SEQ_LEN`, the
# cos/sin table [P, D/2] comes precomputed (in the model's dtype, as HF/Unsloth caches it), the
# math runs in the table's dtype (`x.to(sin.dtype)`), and the tensor is rotated in place. Each
# constexpr switches one of the causes notebook 08 studies.
#
# How it is parallelised: grid (ROWS, H); one program rotates the first R features of one head
# of one row, loading the two halves as two tiles of BLOCK_HALF.

@triton.jit
def _fused_pair(x1, x2, c, s):
    """The pair's rotation with each sum one fused multiply-add, one product entering it exact.
    Which product that is decides whether the output equals TE's bit for bit: notebook 08's
    section 4b has the learner find it, so the reproduction keeps its choice here."""
    return tl.fma(x1, c, -(x2 * s)), tl.fma(x2, c, x1 * s)


@triton.jit
def _rope_unsloth_repro_kernel(
    x_ptr,  # *x: [ROWS, H, D] rotated in place; last dim contiguous
    cos_ptr,  # *table: [P, HALF] cos values (or angles when FROM_ANGLES)
    sin_ptr,  # *table: [P, HALF] sin values (ignored when FROM_ANGLES)
    stride_xr, stride_xh,  # x strides (rows, heads), in elements
    stride_t,  # table row stride, in elements
    SEQ_LEN,  # the modulus of `row % SEQ_LEN`: the position of a row (Unsloth's indexing)
    HALF: tl.constexpr,  # R // 2: features per half of the rotated part
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    FROM_ANGLES: tl.constexpr,  # True: the table holds fp32 angles, cos/sin computed here
    COMPUTE_FP32: tl.constexpr,  # False: math in the table's dtype (Unsloth's `.to(sin1.dtype)`)
    USE_FMA: tl.constexpr,  # True: each sum one fused multiply-add (_fused_pair)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    pos = row % SEQ_LEN  # right for bshd rows b*S + s with SEQ_LEN == S; wrong otherwise
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    if FROM_ANGLES:
        theta = tl.load(cos_ptr + pos * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
        c = tl.cos(theta)
        s = tl.sin(theta)
    else:
        c = tl.load(cos_ptr + pos * stride_t + offs, mask=mask, other=0.0)
        s = tl.load(sin_ptr + pos * stride_t + offs, mask=mask, other=0.0)
    x_row = x_ptr + row * stride_xr + head * stride_xh
    x1 = tl.load(x_row + offs, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF + offs, mask=mask, other=0.0)
    if not COMPUTE_FP32:
        # Math "in the input dtype": the table is rounded to x's dtype and so is every product
        # (what bf16/fp16 arithmetic does; spelled out in fp32 so the interpreter agrees).
        c = round_to(c.to(tl.float32), x_ptr.dtype.element_ty, BF16_RTNE)
        s = round_to(s.to(tl.float32), x_ptr.dtype.element_ty, BF16_RTNE)
    c = c.to(tl.float32)
    s = s.to(tl.float32)
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if USE_FMA:
        # one product and the sum rounded once, the other product rounded on its own
        y1, y2 = _fused_pair(x1, x2, c, s)
    elif COMPUTE_FP32:
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    else:
        y1 = (round_to(x1 * c, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32)
              - round_to(x2 * s, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32))
        y2 = (round_to(x2 * c, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32)
              + round_to(x1 * s, x_ptr.dtype.element_ty, BF16_RTNE).to(tl.float32))
    tl.store(x_row + offs, round_to(y1, x_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
    tl.store(x_row + HALF + offs, round_to(y2, x_ptr.dtype.element_ty, BF16_RTNE), mask=mask)


# The arguments a stand-in for the kernel above must take, in this order: the launcher passes the
# first seven by position and the constexprs by name.
REPRO_KERNEL_ARGS = ("x_ptr", "cos_ptr", "sin_ptr", "stride_xr", "stride_xh", "stride_t", "SEQ_LEN",
                     "HALF", "BLOCK_HALF", "FROM_ANGLES", "COMPUTE_FP32", "USE_FMA", "BF16_RTNE")


def check_repro_kernel(kernel):
    """The kernel to launch: ``_rope_unsloth_repro_kernel`` for None, else ``kernel`` itself once
    it is known to be a Triton kernel (``@triton.jit``) whose arguments begin with
    :data:`REPRO_KERNEL_ARGS` (a copy of the reproduction kernel, edited or not)."""
    if kernel is None:
        return _rope_unsloth_repro_kernel
    if not isinstance(kernel, triton.runtime.jit.KernelInterface):
        raise TypeError(f"kernel must be a Triton kernel (a function decorated with @triton.jit, "
                        f"taking the arguments of ropelib.course.debug's "
                        f"_rope_unsloth_repro_kernel), got {kernel!r}")
    names = tuple(getattr(kernel, "arg_names", ()))
    if names[:len(REPRO_KERNEL_ARGS)] != REPRO_KERNEL_ARGS:
        raise TypeError(f"kernel must take the arguments of ropelib.course.debug's "
                        f"_rope_unsloth_repro_kernel, in its order: {', '.join(REPRO_KERNEL_ARGS)}"
                        f"; {getattr(kernel, '__name__', kernel)!s} takes {', '.join(names)}")
    return kernel


def rope_unsloth_repro(x: torch.Tensor, cos: torch.Tensor, sin: Optional[torch.Tensor] = None, *,
                       seq_len: int, from_angles: bool = False, compute_fp32: bool = False,
                       use_fma: bool = False, kernel=None,
                       enable_fp_fusion: bool = True) -> torch.Tensor:
    """Rotate ``x`` [ROWS, H, D] (rows = flattened bshd batch x seq) **in place**, Unsloth-style.

    ``cos``/``sin`` [P, R/2] tables (or ``cos`` = fp32 angles [P, R/2] with ``from_angles``);
    the first R = 2 * cos.shape[1] features are rotated, the rest left alone. A row's position is
    ``row % seq_len``. ``kernel``: the Triton kernel to launch, by default
    ``_rope_unsloth_repro_kernel`` (see :func:`check_repro_kernel`). ``enable_fp_fusion``:
    Triton's launch option; False keeps a GPU compiler from contracting a multiply and an add
    into one fma (the interpreter never does). Returns ``x``.
    """
    kernel = check_repro_kernel(kernel)
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a 3-D tensor [ROWS, H, D], got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.stride(-1) != 1:
        raise ValueError("x's last dim must be contiguous")
    if cos.dim() != 2 or (sin is not None and sin.shape != cos.shape):
        raise ValueError(f"cos/sin must be [P, R/2] tables of one shape, got {tuple(cos.shape)}")
    if sin is None and not from_angles:
        raise ValueError("sin is required unless from_angles=True")
    if cos.stride(-1) != 1 or (sin is not None and sin.stride() != cos.stride()):
        raise ValueError("cos/sin must have a contiguous last dim and equal strides")
    half = cos.shape[1]
    if 2 * half > x.shape[2]:
        raise ValueError(f"the table rotates {2 * half} features but x has head dim {x.shape[2]}")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    runtime.check_kernel_device(x, "x")
    kernel[(x.shape[0], x.shape[1])](
        x, cos, cos if sin is None else sin, x.stride(0), x.stride(1), cos.stride(0), seq_len,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), FROM_ANGLES=bool(from_angles),
        COMPUTE_FP32=bool(compute_fp32), USE_FMA=bool(use_fma), BF16_RTNE=BF16_RTNE,
        enable_fp_fusion=bool(enable_fp_fusion))
    return x


# --- the causes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Causes:
    """Each field switches one cause on (True) or off. :data:`REPRO` is the reported failure,
    :data:`FIXED` every cause off (plus the in-kernel sin/cos TE uses).

    ``sincos_one_ulp`` stands for a different but equally correct sin/cos: the fp32 table TE's
    emulation uses, moved one fp32 ulp up (:func:`one_ulp_up`) at every position but 0, where
    every implementation gives cos 0 = 1 and sin 0 = 0 exactly. It replaces in-kernel sin/cos."""
    table_in_input_dtype: bool = True       # cos/sin table precomputed and stored in x's dtype
    math_in_input_dtype: bool = True        # x.to(sin.dtype): multiply-add in x's dtype
    sincos_in_kernel: bool = False          # cos/sin computed in the kernel from fp32 angles
    fma: bool = False                       # explicit fused multiply-add (one rounding less)
    sincos_one_ulp: bool = False            # fp32 cos/sin one ulp up at every position but 0
    sbhd_row_indexing: bool = False         # sbhd rows fed to the bshd `row % S` position formula
    te_freqs_reshaped: bool = False         # TE's [s,1,1,d] freqs .view(-1, d/2) as [s, d/2] table
    interleaved_mismatch: bool = False      # the model (TE) pairs (2j, 2j+1); the kernel halves
    partial_rotary_ignored: bool = False    # TE rotary_percent=0.5; the kernel rotates all of D
    table_margin: bool = False              # table has extra rows; kernel takes S from the table
    inplace_double_rotation: bool = False   # in-place kernel runs first; TE rotates its output


CAUSE_DOCS = {
    "table_in_input_dtype": "cos/sin table precomputed in the input dtype (HF/Unsloth cache)",
    "math_in_input_dtype": "multiply-add in the input dtype (x.to(sin.dtype))",
    "sincos_in_kernel": "sin/cos computed in the kernel from fp32 angles (as TE does)",
    "fma": "explicit fused multiply-add (operation order / one rounding less)",
    "sincos_one_ulp": "fp32 sin/cos one ulp off from position 1 on (another correct sin/cos)",
    "sbhd_row_indexing": "sbhd tensor indexed with the bshd position formula row % S",
    "te_freqs_reshaped": "TE's duplicated [s,1,1,d] freqs viewed as an [s, d/2] table",
    "interleaved_mismatch": "model uses interleaved pairs, kernel rotates halves",
    "partial_rotary_ignored": "model rotates 50% of the head (rotary_percent=0.5), kernel all",
    "table_margin": "table longer than the sequence; kernel takes S from the table",
    "inplace_double_rotation": "in-place kernel ran first, TE rotated the rotated tensor",
}

REPRO = Causes()
FIXED = Causes(table_in_input_dtype=False, math_in_input_dtype=False, sincos_in_kernel=True)


@dataclass(frozen=True)
class Scenario:
    """Sizes of the story. ``layout`` is TE's ``tensor_format`` (sbhd, TE's default)."""
    seq_len: int = 64
    batch: int = 2
    heads: int = 4
    head_dim: int = 32
    dtype: str = "bf16"
    layout: str = "sbhd"
    margin: int = 8
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"Scenario.dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.layout not in ("sbhd", "bshd"):
            raise ValueError(f"Scenario.layout must be 'sbhd' or 'bshd', got {self.layout!r}")
        if self.head_dim % 4 or self.head_dim < 4:
            raise ValueError(f"Scenario.head_dim must be a multiple of 4 (partial rotary halves "
                             f"it), got {self.head_dim}")
        for name in ("seq_len", "batch", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"Scenario.{name} must be >= 1")


# --- the two sides of the comparison ----------------------------------------------------------

def _te_module():
    from ..bench.compare import try_import    # (quiet about TE's Jax check)
    mod, _ = try_import("transformer_engine.pytorch.attention.rope")
    return getattr(mod, "apply_rotary_pos_emb", None)


def te_label(device=None) -> str:
    """"TE fused" when the real Transformer Engine runs here, else "TE emulation"."""
    dev = torch.device(device or runtime.default_device())
    return "TE fused" if (_te_module() is not None and dev.type == "cuda") else "TE emulation"


def te_fused(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
             interleaved: bool = False) -> torch.Tensor:
    """TE's fused RoPE: the real one when installed (GPU), else ropelib's faithful emulation."""
    fn = _te_module()
    if fn is not None and t.device.type == "cuda":
        kw = {"interleaved": True} if interleaved else {}
        return fn(t, freqs, tensor_format=tensor_format, fused=True, **kw)
    return reference.te_fused_emulation(t, freqs, tensor_format=tensor_format,
                                        interleaved=interleaved)


def apply_rotary_pos_emb_triton(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                                causes: Causes = REPRO, kernel=None) -> torch.Tensor:
    """The learner's wrapper around the Unsloth-style kernel, with the chosen causes.

    ``t`` sbhd [S, B, H, D] or bshd [B, S, H, D]; ``freqs`` the kernel's own TE-style angles
    [P, 1, 1, R] (rotate-half); ``kernel`` the Triton kernel to launch (default: the course's,
    see :func:`check_repro_kernel`). Returns the rotated tensor; with ``inplace_double_rotation``
    the result is also written into ``t`` (the in-place kernel's side effect).
    """
    kernel = check_repro_kernel(kernel)
    P, R = freqs.shape[0], freqs.shape[-1]
    S = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
    f32 = freqs.float()
    if causes.te_freqs_reshaped:
        half = f32.reshape(-1, R // 2)[:P]   # rows 2p and 2p+1 both hold f_p: position p -> p//2
    else:
        half = f32[:, 0, 0, :R // 2]         # [P, R/2]: the distinct angles, f_p
    half = half.contiguous()
    if causes.sincos_in_kernel and not causes.sincos_one_ulp:
        cos, sin, from_angles = half, None, True
    else:
        cos, sin = torch.cos(half), torch.sin(half)    # fp32, as TE's emulation computes them
        if causes.sincos_one_ulp:                      # a table, since the kernel's can't be nudged
            cos, sin = one_ulp_up(cos), one_ulp_up(sin)
        tdt = t.dtype if causes.table_in_input_dtype else torch.float32
        cos, sin, from_angles = cos.to(tdt), sin.to(tdt), False
    seq_mod = P if causes.table_margin else S
    if tensor_format == "sbhd" and causes.sbhd_row_indexing:
        work = t if causes.inplace_double_rotation else t.clone()
        rows = work.view(-1, *work.shape[2:])          # rows s*B + b: position row % S is wrong
        rope_unsloth_repro(rows, cos, sin, seq_len=seq_mod, from_angles=from_angles,
                           compute_fp32=not causes.math_in_input_dtype, use_fma=causes.fma,
                           kernel=kernel)
        return work
    bshd = t.transpose(0, 1) if tensor_format == "sbhd" else t
    work = bshd.contiguous()
    if work.data_ptr() == bshd.data_ptr() and not causes.inplace_double_rotation:
        work = work.clone()                            # a safe wrapper never writes into t
    rows = work.view(-1, *work.shape[2:])              # rows b*S + s
    rope_unsloth_repro(rows, cos, sin, seq_len=seq_mod, from_angles=from_angles,
                       compute_fp32=not causes.math_in_input_dtype, use_fma=causes.fma,
                       kernel=kernel)
    out = work.transpose(0, 1) if tensor_format == "sbhd" else work
    if causes.inplace_double_rotation and out.data_ptr() != t.data_ptr():
        t.copy_(out)
    return out


@dataclass
class Result:
    """One run of the story: the input, both outputs, the fp64 truth and what was compared."""
    scenario: Scenario
    causes: Causes
    x: torch.Tensor               # the input as drawn (before any in-place write)
    tokens_te: torch.Tensor
    tokens_triton: torch.Tensor
    reference: torch.Tensor       # fp64 RoPE of x with the model's settings (not rounded)
    te_label: str
    layout: str


def reproduce(scenario: Scenario = Scenario(), causes: Causes = REPRO, device=None, *,
              kernel=None, wrapper=None) -> Result:
    """Run the seed's check: the Triton wrapper on ``tokens``, then TE on ``tokens``.

    ``kernel``: the Triton kernel the wrapper launches, by default the course's
    ``_rope_unsloth_repro_kernel``; pass a copy of it (edited or not) to run that copy instead.
    It must be a ``@triton.jit`` function that takes the same arguments
    (:func:`check_repro_kernel`). ``wrapper``: the function that builds the table and launches
    it, called as ``wrapper(tokens, freqs, layout, causes, kernel)``, by default
    :func:`apply_rotary_pos_emb_triton`; notebook 08 passes its own copy."""
    kernel = check_repro_kernel(kernel)
    if wrapper is None:
        wrapper = apply_rotary_pos_emb_triton
    elif not callable(wrapper):
        raise TypeError(f"wrapper must be a function like ropelib.course.debug."
                        f"apply_rotary_pos_emb_triton, got {type(wrapper).__name__}")
    if not isinstance(causes, Causes):
        raise TypeError(f"causes must be ropelib.course.debug.Causes, got {type(causes).__name__}")
    if not isinstance(scenario, Scenario):
        raise TypeError(f"scenario must be ropelib.course.debug.Scenario, got "
                        f"{type(scenario).__name__}")
    sc = scenario
    device = torch.device(device or runtime.default_device())
    dtype = DTYPES[sc.dtype]
    g = torch.Generator().manual_seed(sc.seed)
    shape = ((sc.seq_len, sc.batch, sc.heads, sc.head_dim) if sc.layout == "sbhd"
             else (sc.batch, sc.seq_len, sc.heads, sc.head_dim))
    tokens = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    x = tokens.clone()
    table_len = sc.seq_len + (sc.margin if causes.table_margin else 0)
    # the model's angles (what TE gets) and the kernel's own (rotate-half, maybe full rotary)
    R_model = sc.head_dim // 2 if causes.partial_rotary_ignored else sc.head_dim
    freqs_model = angles(table_len, R_model, interleaved=causes.interleaved_mismatch,
                         device=device)
    freqs_kernel = angles(table_len, sc.head_dim, device=device)
    tokens_triton = wrapper(tokens, freqs_kernel, sc.layout, causes, kernel)
    tokens_te = te_fused(tokens, freqs_model, sc.layout, interleaved=causes.interleaved_mismatch)
    ref = reference.rope_reference(x.double(), freqs_model.double(), layout=sc.layout,
                                   interleaved=causes.interleaved_mismatch)
    return Result(sc, causes, x, tokens_te, tokens_triton, ref, te_label(device), sc.layout)


# --- looking in the right place ---------------------------------------------------------------

def tolerances(dtype) -> dict:
    """Dtype-aware ``rtol``/``atol`` for ``torch.allclose(..., **tolerances(dtype))``.

    rtol ~ a couple of ulps of the dtype (torch.testing's defaults): bf16 has 8 significant bits
    (eps 2^-7), fp16 11, fp32 24. Compare with ``torch.allclose``'s defaults, rtol 1e-5 and
    atol 1e-8, which ask bf16 for more bits than it has.
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)} or a torch dtype, got {dtype!r}")
        dtype = DTYPES[dtype]
    table = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5),
             torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}
    if dtype not in table:
        raise TypeError(f"dtype must be a floating dtype among {list(table)}, got {dtype}")
    rtol, atol = table[dtype]
    return {"rtol": rtol, "atol": atol}


def ulp_error(actual: torch.Tensor, reference_fp64: torch.Tensor) -> torch.Tensor:
    """|actual - reference| in units of ``actual.dtype``'s ulp at the reference value (fp64),
    values below 1e-3 * max|reference| measured at that floor (see ``compare.ulp``)."""
    if actual.shape != reference_fp64.shape:
        raise ValueError(f"actual {tuple(actual.shape)} and reference "
                         f"{tuple(reference_fp64.shape)} must have one shape")
    r = reference_fp64.double()
    floor = 1e-3 * float(r.abs().max()) if r.numel() else 0.0
    return (actual.double() - r).abs() / ulp(r, actual.dtype, floor)


def unit_roundoff(dtype) -> float:
    """u = 2^-p for a dtype with p significant bits: the largest relative error of one rounding
    to nearest. bf16 has p = 8 (7 stored + the implicit bit), so u = 2^-8; fp16 2^-11, fp32
    2^-24. (``torch.finfo(dtype).eps`` = 2u is the gap between 1 and the next number.)"""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)} or a torch dtype, "
                             f"got {dtype!r}")
        dtype = DTYPES[dtype]
    return torch.finfo(dtype).eps / 2


def one_ulp_up(table: torch.Tensor, first_position: int = 1) -> torch.Tensor:
    """A copy of a cos/sin ``table`` [P, ...] with rows ``first_position:`` moved one ulp of its
    dtype towards +inf (``torch.nextafter``): what a different, equally correct sin/cos
    implementation gives for some entries. Row 0 (angle 0: cos 1, sin 0) stays exact."""
    if not table.is_floating_point():
        raise TypeError(f"table must be a floating tensor, got {table.dtype}")
    out = table.clone()
    rows = out[first_position:]
    rows.copy_(torch.nextafter(rows, torch.full_like(rows, float("inf"))))
    return out


_INT_OF = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    # floats as int64 that count representable values: ..., -tiny -> -1, +-0 -> 0, tiny -> 1, ...
    i = t.contiguous().view(_INT_OF[t.dtype]).long()
    mag = i & (2 ** (8 * t.element_size() - 1) - 1)
    return torch.where(i < 0, -mag, mag)


def steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values of their (common) dtype lie between ``a`` and ``b``,
    elementwise: 0 for equal values, 1 for neighbours (one rounding step apart)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a ({tuple(a.shape)}, {a.dtype}) and b ({tuple(b.shape)}, {b.dtype}) "
                         f"must have one shape and one dtype")
    if a.dtype not in _INT_OF:
        raise TypeError(f"dtype must be one of {list(_INT_OF)}, got {a.dtype}")
    return (_ordered(a) - _ordered(b)).abs()


def normwise_error(actual: torch.Tensor, reference_fp64: torch.Tensor, x: torch.Tensor, *,
                   rot_dim: Optional[int] = None, interleaved: bool = False) -> torch.Tensor:
    """|y - y*| / (|x_a| + |x_b|) for every element, (a, b) the rotated pair it belongs to.

    A rotation keeps |y*_a| <= |x_a| + |x_b|, so an output rounded once has norm-wise error
    <= u (:func:`unit_roundoff`); a cos/sin table rounded to the dtype adds at most about u more.
    Unlike the error in ulps of y* it does not blow up where y* is near zero by cancellation.
    ``x`` is the input (last dim D, the first ``rot_dim`` features rotated: pairs (j, j + R/2),
    or (2j, 2j+1) with ``interleaved``); a pass-through feature is measured against |x_j|.
    A zero pair gives 0 where y is exact, inf elsewhere.
    """
    if not (actual.shape == reference_fp64.shape == x.shape):
        raise ValueError(f"actual {tuple(actual.shape)}, reference {tuple(reference_fp64.shape)} "
                         f"and x {tuple(x.shape)} must have one shape")
    D = x.shape[-1]
    R = D if rot_dim is None else rot_dim
    if R % 2 or not 0 < R <= D:
        raise ValueError(f"rot_dim must be even and in (0, {D}], got {rot_dim}")
    ax = x.detach().double().abs()
    rot = ax[..., :R]
    if interleaved:
        partner = rot.unflatten(-1, (R // 2, 2)).flip(-1).flatten(-2)
    else:
        partner = torch.cat((rot[..., R // 2:], rot[..., :R // 2]), dim=-1)
    denom = torch.cat((rot + partner, ax[..., R:]), dim=-1)
    err = (actual.detach().double() - reference_fp64.detach().double()).abs()
    safe = err / denom.clamp(min=torch.finfo(torch.float64).tiny)
    return torch.where(denom > 0, safe, torch.where(err == 0, torch.zeros_like(err),
                                                    torch.full_like(err, float("inf"))))


def recovered_positions(x: torch.Tensor, y: torch.Tensor, layout: str = "sbhd", *,
                        rot_dim: Optional[int] = None, interleaved: bool = False,
                        base: float = 10000.0) -> torch.Tensor:
    """The position each token's output encodes: the angle from the input pair to the output
    pair of the lowest frequency, atan2(x_a y_b - x_b y_a, x_a y_a + x_b y_b), divided by that
    frequency base^(-(R-2)/R). [S, B, H] (fp64). A right RoPE gives back s; a wrong position
    gives the wrong s; wrong pairs or frequencies give no clean curve. The lowest frequency
    turns by less than pi over ~31 000 positions (R = 128), so nothing wraps; use fp32 or
    fp64 outputs (bf16 rounding hides angles below ~2^-8 rad)."""
    if x.shape != y.shape or x.dim() != 4:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must be one 4-D shape")
    if layout not in ("sbhd", "bshd"):
        raise ValueError(f"layout must be 'sbhd' or 'bshd', got {layout!r}")
    D = x.shape[-1]
    R = D if rot_dim is None else rot_dim
    if R % 2 or not 0 < R <= D:
        raise ValueError(f"rot_dim must be even and in (0, {D}], got {rot_dim}")
    j = R // 2 - 1
    a, b = (2 * j, 2 * j + 1) if interleaved else (j, j + R // 2)
    xs, ys = _to_sbhd(x.detach().double(), layout), _to_sbhd(y.detach().double(), layout)
    cross = xs[..., a] * ys[..., b] - xs[..., b] * ys[..., a]
    dot = xs[..., a] * ys[..., a] + xs[..., b] * ys[..., b]
    return torch.atan2(cross, dot) / base ** (-2 * j / R)


def _to_sbhd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "sbhd" else t.transpose(0, 1)


def error_map(a: torch.Tensor, b: torch.Tensor, layout: str = "sbhd") -> torch.Tensor:
    """max |a - b| over batch and heads: a [S, D] float64 map over position x feature."""
    if a.shape != b.shape:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must have one shape")
    if layout not in ("sbhd", "bshd"):
        raise ValueError(f"layout must be 'sbhd' or 'bshd', got {layout!r}")
    d = _to_sbhd((a.double() - b.double()).abs(), layout)   # [S, B, H, D]
    return d.amax(dim=(1, 2)).cpu()


def flush_device_prints(pause: float = 0.2) -> None:
    """Let the lines a kernel printed (`tl.device_print`) reach the page before the host prints
    again. On a GPU they wait in the device's buffer until the host synchronises, then in C's
    stdout buffer (a pipe under Jupyter, written out only when full, so 32 lines broke mid-word
    between the host's prints); Jupyter's kernel copies that pipe into the cell's output from a
    thread of its own, given `pause` seconds here. Harmless in the interpreter (Python prints)."""
    sys.stdout.flush()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    try:
        ctypes.CDLL(None).fflush(None)   # every C stream, stdout among them
    except (OSError, AttributeError):     # no C library to ask (not on Linux or macOS)
        pass
    time.sleep(pause)
    sys.stdout.flush()


def argmax_location(a: torch.Tensor, b: torch.Tensor, layout: str = "sbhd") -> dict:
    """Where |a - b| is largest: position, batch, head, feature and both values."""
    d = _to_sbhd((a.double() - b.double()).abs(), layout)
    idx = int(torch.argmax(d))
    S, B, H, D = d.shape
    s, rem = divmod(idx, B * H * D)
    bb, rem = divmod(rem, H * D)
    h, f = divmod(rem, D)
    av, bv = _to_sbhd(a, layout)[s, bb, h, f], _to_sbhd(b, layout)[s, bb, h, f]
    return {"position": s, "batch": bb, "head": h, "dim": f, "a": float(av), "b": float(bv),
            "abs_diff": float(d[s, bb, h, f])}


def plot_heatmap(err: torch.Tensor, ax=None, title: str = "max |difference| over batch, heads",
                 log: bool = True):
    """Draw an [S, D] error map (positions down, features across)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    e = err.double().numpy()
    pos = e[e > 0]
    norm = LogNorm(vmin=max(pos.min(), 1e-8), vmax=max(pos.max(), 1e-7)) if (log and pos.size) \
        else None
    im = ax.imshow(e if norm is None else e.clip(min=norm.vmin), aspect="auto",
                   interpolation="nearest", cmap="magma", norm=norm)
    ax.set_xlabel("feature (dim)")
    ax.set_ylabel("position")
    ax.set_title(title, fontsize=9)
    ax.figure.colorbar(im, ax=ax)
    return ax


def diagnose(result: Result, tolerance: str = "default") -> dict:
    """What the learner should look at. ``tolerance``: "default" (torch.allclose's rtol 1e-5,
    atol 1e-8) or "dtype" (:func:`tolerances`). Besides allclose, the argmax and the max ulp
    error of each side vs fp64: ``n_differ`` (elements not bit-equal), ``max_steps_apart``
    (:func:`steps_apart`), each side's max :func:`normwise_error` in units of u, and the
    ``verdict`` of :func:`classify`."""
    if tolerance not in ("default", "dtype"):
        raise ValueError(f"tolerance must be 'default' or 'dtype', got {tolerance!r}")
    a, b = result.tokens_te, result.tokens_triton
    tol = {"rtol": 1e-5, "atol": 1e-8} if tolerance == "default" else tolerances(a.dtype)
    dt = tolerances(a.dtype)
    ref = result.reference
    first_te, first_tr = a.flatten()[:10], b.flatten()[:10]
    loc = argmax_location(a, b, result.layout)
    pairing = model_pairing(result)
    u = unit_roundoff(a.dtype)
    diag = {
        "te": result.te_label,
        "tolerance": tolerance, "rtol": tol["rtol"], "atol": tol["atol"],
        "allclose": bool(torch.allclose(a, b, **tol)),
        "first_ten_equal": bool(torch.equal(first_te, first_tr)),
        "first_ten_te": [round(float(v), 4) for v in first_te],
        "first_ten_triton": [round(float(v), 4) for v in first_tr],
        "max_abs_diff": loc["abs_diff"], "argmax": loc,
        "n_mismatched": int((~torch.isclose(a, b, **tol)).sum()),
        "numel": a.numel(),
        "te_max_ulp": float(ulp_error(a, ref).max()),
        "triton_max_ulp": float(ulp_error(b, ref).max()),
        "te_matches_fp64": bool(torch.allclose(a.double(), ref, **dt)),
        "triton_matches_fp64": bool(torch.allclose(b.double(), ref, **dt)),
        "n_differ": int((a != b).sum()),
        "max_steps_apart": int(steps_apart(a, b).max()),
        "te_max_normwise_u": float(normwise_error(a, ref, result.x, **pairing).max()) / u,
        "triton_max_normwise_u": float(normwise_error(b, ref, result.x, **pairing).max()) / u,
    }
    diag["verdict"] = classify(diag)
    return diag


def model_pairing(result: Result) -> dict:
    """The model's (TE's) rotary dim and pairing in a run: ``rot_dim``, ``interleaved``."""
    sc, c = result.scenario, result.causes
    return {"rot_dim": sc.head_dim // 2 if c.partial_rotary_ignored else sc.head_dim,
            "interleaved": c.interleaved_mismatch}


# --- from the shape of a difference to its cause ----------------------------------------------

# Rounding causes stay within a few u norm-wise (cos, sin, two products and the sum rounded once
# each); a layout trap moves outputs by O(1) of the pair's size, i.e. hundreds of u in bf16.
LAYOUT_NORMWISE_U = 8.0

DECISIONS = {
    "equal": {
        "shape": "no element differs",
        "cause": "nothing to find",
        "toggles": (),
        "fix": "-"},
    "tolerance": {
        "shape": "a few scattered elements, most one rounding step apart (outputs near zero "
                 "several); both sides within 1 ulp of fp64",
        "cause": "two correct kernels: sin/cos, FMA or operation order differ in the last fp32 bit",
        "toggles": ("sincos_one_ulp", "fma"),
        "fix": "compare with dtype-aware tolerances (tolerances(dtype))"},
    "precision": {
        "shape": "many ulps off fp64 where outputs are near zero, yet a few u norm-wise",
        "cause": "a cos/sin table (or the products) in the input dtype: bf16 rounding before the "
                 "cancellation",
        "toggles": ("table_in_input_dtype", "math_in_input_dtype"),
        "fix": "fp32 table or sin/cos from fp32 angles, fp32 math, one rounding on the store"},
    "layout": {
        "shape": f"O(1) differences (norm-wise > {LAYOUT_NORMWISE_U:g} u) in a pattern over "
                 "positions, batches or features",
        "cause": "a layout trap: sbhd vs bshd, duplicated TE angles, interleaved vs rotate-half, "
                 "partial rotary, table margin, in-place double rotation",
        "toggles": ("sbhd_row_indexing", "te_freqs_reshaped", "interleaved_mismatch",
                    "partial_rotary_ignored", "table_margin", "inplace_double_rotation"),
        "fix": "recover the positions the output encodes (recovered_positions) and fix the "
               "indexing, pairing or rotary dim"},
}


def classify(diag: dict) -> str:
    """The row of :data:`DECISIONS` that a :func:`diagnose` result falls in: "equal",
    "layout" (norm-wise error beyond :data:`LAYOUT_NORMWISE_U` u on either side), "tolerance"
    (both sides within 1 ulp of fp64: two correct results) or "precision" (the rest).

    Made for outputs narrower than the fp32 math (bf16, fp16), where the final rounding hides
    fp32's own errors; fp32 outputs show those as several ulps near zero."""
    if diag["n_differ"] == 0:
        return "equal"
    if max(diag["te_max_normwise_u"], diag["triton_max_normwise_u"]) > LAYOUT_NORMWISE_U:
        return "layout"
    if max(diag["te_max_ulp"], diag["triton_max_ulp"]) <= 1.0:
        return "tolerance"
    return "precision"


# --- bit for bit against the real TE: the measurements of benchmarks/te_bits.py ---------------
# benchmarks/te_bits.py ran the teaching kernel's variants against the real TE fused RoPE on a GPU
# and saved TE's outputs, TE's own fp32 cos/sin and a row per variant to
# benchmarks/results/te-bits-<gpu>.pt. Notebook 08 reads that file: on a CPU its kernels run
# against TE's stored outputs, on the same inputs regenerated here.

def te_bits_files(root=None):
    """Every committed ``benchmarks/results/te-bits-<gpu>.pt`` (never a ``-dry-run`` file), by
    name."""
    from pathlib import Path
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    return sorted(p for p in (root / "benchmarks" / "results").glob("te-bits-*.pt")
                  if "dry-run" not in p.name)


def te_bits_file(root=None):
    """The committed ``benchmarks/results/te-bits-<gpu>.pt`` to read (an H200's if there is one,
    else an H100's, else any GPU's; never a ``-dry-run`` file), or None."""
    files = te_bits_files(root)
    for gpu in ("h200", "h100"):
        for p in files:
            if gpu in p.name:
                return p
    return files[0] if files else None


def load_te_bits(path) -> dict:
    """The dict benchmarks/te_bits.py saved (CPU tensors)."""
    note_read(path)
    data = torch.load(path, map_location="cpu", weights_only=False)
    if data.get("meta", {}).get("format") != "te-bits/1":
        raise ValueError(f"{path} is not a te-bits/1 file")
    if data["meta"].get("dry_run"):
        raise ValueError(f"{path} is a dry run (TE emulation), not a GPU run against TE")
    return data


def _sha256(t: torch.Tensor) -> str:
    import hashlib
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
                          ).hexdigest()


def bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: do the bits of ``a`` and ``b`` (one shape, one dtype) differ?"""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a ({tuple(a.shape)}, {a.dtype}) and b ({tuple(b.shape)}, {b.dtype}) "
                         f"must have one shape and one dtype")
    it = _INT_OF[a.dtype]
    return a.contiguous().view(it) != b.contiguous().view(it)


# How each product of the line "in the input dtype" can reach the sum: rounded to x's dtype first
# ("rounded", as the source writes it) or exact ("exact": a fused multiply-add in that dtype).
CONTRACTION_WAYS = ("rounded", "x1 exact", "x2 exact", "both exact")


def contraction_emulations(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """The reproduction kernel's math in x's dtype, y1 = x1 c - x2 s and y2 = x2 c + x1 s, with
    each output half's two products rounded to x's dtype or left exact, independently (4 x 4
    ways), evaluated in float64 and rounded once to x's dtype: {(way of y1, way of y2): y}.

    x: [S, B, H, D] (sbhd) in bf16 or fp16; cos, sin: [S, D/2] in x's dtype. A product of two
    bf16 (fp16) numbers and its sum with one more are exact in float64, so "exact" is what one
    fused multiply-add in x's dtype gives, and the way of each half is which product it fuses.
    "x1 exact" in y1 is fma(x1, c, -rn(x2 s)); in y2 it is fma(x1, s, rn(x2 c))."""
    half = x.shape[-1] // 2
    if cos.shape != (x.shape[0], half) or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must be [S, D/2] = [{x.shape[0]}, {half}] for x "
                         f"{tuple(x.shape)}; got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not (x.dtype == cos.dtype == sin.dtype) or x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"x, cos and sin must share one dtype, bf16 or fp16 (the products are "
                         f"rounded to it); got {x.dtype}, {cos.dtype}, {sin.dtype}")
    xd = x.double()
    x1, x2 = xd[..., :half], xd[..., half:]
    c, s = (t.double()[:, None, None, :] for t in (cos, sin))

    def rn(v):
        return v.to(x.dtype).double()

    def line(a, b, sign, way):       # a + sign * b, a product with x1 and one with x2
        a = a if way in ("x1 exact", "both exact") else rn(a)
        b = b if way in ("x2 exact", "both exact") else rn(b)
        return a + sign * b

    y1 = {w: line(x1 * c, x2 * s, -1, w) for w in CONTRACTION_WAYS}
    y2 = {w: line(x1 * s, x2 * c, +1, w) for w in CONTRACTION_WAYS}
    return {(w1, w2): torch.cat((y1[w1], y2[w2]), -1).to(x.dtype)
            for w1 in CONTRACTION_WAYS for w2 in CONTRACTION_WAYS}


# Floating-point multiplies, adds and fmas in a kernel's PTX (with the rounding modifier and
# type: `mul.rn.bf16` is a product rounded to bf16 where the source says so, `mul.bf16` one the
# assembler may still contract) and its SASS (`HFMA2.BF16_V2`: a bf16 fma on two lanes).
_PTX_FLOAT_OPS = r"\b((?:fma|mul|add|sub|neg)(?:\.r[nzmp])?\.(?:bf16x2|bf16|f16x2|f16|f32))\b"
_SASS_FLOAT_OPS = r"\b((?:HFMA2|HMUL2|HADD2|FFMA|FMUL|FADD)(?:\.[A-Z0-9_]+)*)\b"


def float_instructions(ptx: str, sass: Optional[str] = None) -> dict:
    """{"ptx": {op: count}, "sass": {op: count}} of the floating-point multiplies, adds and fmas
    in a compiled kernel's PTX and SASS (sass None or empty: {})."""
    def count(pattern, text):
        return dict(sorted(collections.Counter(re.findall(pattern, text or "")).items()))
    return {"ptx": count(_PTX_FLOAT_OPS, ptx), "sass": count(_SASS_FLOAT_OPS, sass)}


def _repro_code(fixed: bool, enable_fp_fusion: bool, arch: int) -> dict:
    """The reproduction kernel at notebook 08's GPU size (bf16 rows [1024, 8, 128], S = 512),
    compiled for sm_<arch> on this machine (offline_compile.compiled_code): with section 1's
    reported switches (a bf16 table, math in bf16) or, `fixed`, debug.FIXED's (sin/cos from
    fp32 angles, math in fp32); the line as written either way."""
    from .offline_compile import compiled_code
    x = torch.empty(1024, 8, 128, dtype=torch.bfloat16)              # [rows, H, D]: bshd rows
    # [S, D/2]: fp32 angles, or the cos/sin table in x's dtype
    table = torch.empty(512, 64, dtype=torch.float32 if fixed else torch.bfloat16)
    return compiled_code(
        _rope_unsloth_repro_kernel,
        dict(x_ptr=x, cos_ptr=table, sin_ptr=table, stride_xr=x.stride(0), stride_xh=x.stride(1),
             stride_t=table.stride(0), SEQ_LEN=512, HALF=64, BLOCK_HALF=64, FROM_ANGLES=fixed,
             COMPUTE_FP32=fixed, USE_FMA=False, BF16_RTNE=False),
        num_warps=4, arch=arch, enable_fp_fusion=enable_fp_fusion)


def repro_kernel_instructions(enable_fp_fusion: bool = True, arch: int = 90) -> dict:
    """The floating-point instructions (`float_instructions`) of the reproduction kernel's math
    in the input dtype (bf16: section 1's reported failure), compiled for sm_<arch> with Triton's
    contraction on or off. No GPU is needed: Triton and ptxas run on the CPU (under the
    interpreter in a second Python without TRITON_INTERPRET)."""
    code = _repro_code(False, bool(enable_fp_fusion), arch)
    return float_instructions(code["ptx"], code["sass"])


# Which product of `y = a * b +/- c * d` a compiled kernel rounds and which it fuses, read from the
# PTX's line info: `.loc <file> <line> <column>` precedes the instructions of a source position;
# Triton 3.9 places a product at its left operand's column, Triton 3.6 a few columns into it
# (`_product_at` takes either).
_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')
_PTX_MUL_FMA = re.compile(r"^\s*(?:@%p\d+\s+)?((?:mul|fma\.rn)\.f32)\b")


def _products(text: str) -> Optional[tuple]:
    """(target, {(first, last) 1-based column of a product: its text}, the sum) of a line
    `y = a * b +/- c * d`, else None."""
    import ast
    indent = len(text) - len(text.lstrip())
    try:
        node = ast.parse(text.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.BinOp)
            and isinstance(node.value.op, (ast.Add, ast.Sub))):
        return None
    terms = (node.value.left, node.value.right)
    if not all(isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult) for t in terms):
        return None
    return (node.targets[0].id,
            {(indent + t.col_offset + 1, indent + t.end_col_offset): ast.unparse(t)
             for t in terms}, ast.unparse(node.value))


def _product_at(products: dict, column: int, total: str) -> str:
    """The product whose columns hold `column` (Triton 3.9 puts a multiply's line info on the
    product's first column, Triton 3.6 a few columns into it), else the whole sum."""
    return next((text for (first, last), text in products.items() if first <= column <= last),
                total)


def ptx_products(ptx: str, source: str, path: Optional[str] = None) -> dict:
    """How compiled code computes each line `y = a * b +/- c * d` of `source` (the text of the
    file `path` it was compiled from, matched by file name, since Triton's cache may hand back
    code compiled from the same text elsewhere; None: the file of the PTX's first line info,
    the kernel's own, whatever it was named when compiled): {y: {"rounded": the products
    compiled as mul.f32, "fused": the line's other product where an fma.rn.f32 adds it
    unrounded, "mul.f32": n, "fma.rn.f32": n, "lines": the instructions, each with the source
    it came from}}."""
    name = lambda p: p.replace("\\", "/").rsplit("/", 1)[-1]
    files = {m[1]: m[2] if m[3] is None else f"{m[2]}/{m[3]}"      # listed after the code
             for m in map(_PTX_FILE.match, ptx.splitlines()) if m}
    if path is None:
        first = next((m for m in map(_PTX_LOC.match, ptx.splitlines()) if m), None)
        mine = name(files.get(first[1], "")) if first else None
    else:
        mine = name(str(path))
    loc, found = None, {}
    src_lines = source.splitlines()
    for line in ptx.splitlines():
        if m := _PTX_LOC.match(line):
            loc = (m[1], int(m[2]), int(m[3]))
        elif (m := _PTX_MUL_FMA.match(line)) and loc and name(files.get(loc[0], "")) == mine:
            parsed = _products(src_lines[loc[1] - 1]) if loc[1] <= len(src_lines) else None
            if parsed is None:
                continue
            y, products, total = parsed
            rec = found.setdefault(y, {"rounded": set(), "mul.f32": 0, "fma.rn.f32": 0,
                                       "lines": [], "products": products})
            rec[m[1]] += 1
            what = _product_at(products, loc[2], total) if m[1] == "mul.f32" else total
            if m[1] == "mul.f32":
                rec["rounded"].add(what)
            rec["lines"].append(f"{line.strip():44s} // column {loc[2]}: {what}")
    for rec in found.values():
        products = rec.pop("products")
        rec["fused"] = (sorted(set(products.values()) - rec["rounded"]) if rec["fma.rn.f32"]
                        else [])
        rec["rounded"] = sorted(rec["rounded"])
    return found


def combine_kernel_products(kernel_source: str, kernel: str = "_rope_combine_kernel",
                            combine: str = "as_written", shape=(512, 2, 8, 128),
                            arch: int = 90) -> dict:
    """`ptx_products` of notebook 08's combine kernel: `kernel` launched with COMBINE=`combine`
    (both defined in `kernel_source`, a module's text), sin/cos from the angles ("tl"), 64 rows
    a program and 4 warps on bf16 x of `shape` (sbhd), compiled for sm_<arch> with Triton's
    default contraction (enable_fp_fusion=True). No GPU is needed: Triton and ptxas run on the
    CPU, in a second Python without TRITON_INTERPRET."""
    import importlib.util
    import tempfile
    from pathlib import Path
    from .offline_compile import compiled_code
    S, B, H, D = shape
    x, y = torch.empty(S, B, H, D, dtype=torch.bfloat16), torch.empty(S, B, H, D)
    a = torch.empty(S, D // 2)
    with tempfile.TemporaryDirectory() as tmp:      # the kernel and COMBINE, from the text
        path = Path(tmp) / "combine_kernels.py"     # the PTX's line info names this file
        path.write_text(kernel_source)
        spec = importlib.util.spec_from_file_location("combine_kernels", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    code = compiled_code(getattr(module, kernel), dict(
        x_ptr=x, y_ptr=y, ang_ptr=a, cos_ptr=a, sin_ptr=a, n_rows=S * B * H, rows_per_pos=B * H,
        HALF=D // 2, BLOCK_ROWS=64, SINCOS="tl", COMBINE=getattr(module, combine)),
        num_warps=4, arch=arch, enable_fp_fusion=True, source=kernel_source)
    return ptx_products(code["ptx"], kernel_source)


def repro_kernel_products(arch: int = 90) -> dict:
    """`ptx_products` of the reproduction kernel with debug.FIXED's switches (sin/cos from the
    angles, fp32 math, the line as written), compiled for sm_<arch> with Triton's default
    contraction, at notebook 08's GPU size (bf16 rows [1024, 8, 128], S = 512)."""
    import inspect
    ptx = _repro_code(True, True, arch)["ptx"]
    path = inspect.getsourcefile(_rope_unsloth_repro_kernel.fn)
    with open(path) as f:
        return ptx_products(ptx, f.read(), path)


def te_bits_inputs(scenario: Scenario, device="cpu"):
    """(x sbhd, angles [S, D/2] fp32) drawn as benchmarks/te_bits.py draws them: the CPU
    generator's randn cast to the dtype, the angles of bench.compare.angles on ``device``."""
    g = torch.Generator().manual_seed(scenario.seed)
    x = torch.randn((scenario.seq_len, scenario.batch, scenario.heads, scenario.head_dim),
                    generator=g).to(device=device, dtype=DTYPES[scenario.dtype])
    f = angles(scenario.seq_len, scenario.head_dim, device=device)
    return x, f[:, 0, 0, :scenario.head_dim // 2].contiguous()


def _unpack(p: dict, base):
    if p["kind"] == "full":
        return p["tensor"]
    if p["kind"] == "sparse":
        t = base.clone().contiguous()
        t.view(-1)[p["idx"].long()] = p["val"]
        return t
    return None


@dataclass
class TeBitsCase:
    """One scenario of a te-bits file, ready to run on the CPU: the inputs (regenerated, checked
    against the stored hashes), TE's output and TE's own fp32 cos/sin of the angles."""
    key: str
    scenario: Scenario
    x: torch.Tensor            # sbhd, the scenario's dtype
    angles: torch.Tensor       # [S, D/2] fp32, the angles the GPU computed
    te: Optional[torch.Tensor]  # TE's output (None where the file keeps only its hash)
    te_cos: torch.Tensor       # [S, D/2] fp32: TE's own cos/sin, read back from TE
    te_sin: torch.Tensor
    rows: dict                 # variant -> its row (n_differ, max_steps, hist, ptx_tail, ...)
    sincos: dict               # cos/sin source -> {"cos": ..., "sin": ...} vs TE's own

    def output(self, name: str) -> Optional[torch.Tensor]:
        """A variant's stored GPU output (None where only its row was kept)."""
        return _unpack(self.rec["outputs"][name], self.te)


def te_bits_counts(data: dict) -> dict:
    """{(scenario, variant): elements that differ from TE} over every row of a te-bits file (a
    failed scenario counts as its error text)."""
    counts = {}
    for key, rec in data["scenarios"].items():
        if "error" in rec:
            counts[(key, None)] = rec["error"]
            continue
        counts.update({(key, r["variant"]): r["n_differ"] for r in rec["rows"]})
    return counts


def te_bits_case(data: dict, key: str) -> TeBitsCase:
    """Scenario ``key`` of a te-bits file; x is drawn again here and must hash to the stored x,
    the angles are the GPU's (stored) and must hash to the stored angles."""
    rec = data["scenarios"][key]
    if "error" in rec:
        raise RuntimeError(f"scenario {key} failed on the GPU:\n{rec['error']}")
    sc = Scenario(**rec["scenario"])
    x, ang_here = te_bits_inputs(sc, "cpu")
    if _sha256(x) != rec["x_sha256"]:
        raise AssertionError(f"{key}: x drawn here differs from the x the GPU compared")
    ang = rec.get("angles", ang_here)
    if _sha256(ang) != rec["angles_sha256"]:
        raise AssertionError(f"{key}: the angles differ from the ones the GPU compared")
    te = _unpack(rec["te"], None)
    base = (torch.cos(ang_here), torch.sin(ang_here))
    cos, sin = (_unpack(rec["sincos_ref"][k], b) for k, b in zip(("cos", "sin"), base))
    case = TeBitsCase(key, sc, x, ang, te, cos, sin, {r["variant"]: r for r in rec["rows"]},
                      rec["sincos"])
    case.rec = rec
    return case
