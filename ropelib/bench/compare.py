"""One comparison engine behind notebook 07's dashboard, the benchmark suite and the tests.

A *provider* computes RoPE on the same inputs as every other provider: ropelib's kernels (each
generation), Transformer Engine's fused and unfused paths, plain PyTorch, ``torch.compile`` of
plain PyTorch, Liger Kernel and flash-attn's rotary. For one :class:`Config`, :func:`run_case`
returns one row per provider with

* forward and forward+backward time (median, 20th and 80th percentile): ``triton.testing.do_bench``
  on a GPU; on the CPU (Triton interpreter) a small wall-clock timer whose numbers mean nothing.
  Forward+backward is timed in rounds (:data:`FWDBWD_ROUNDS`), every provider and the copy in
  turn in each round: the median over rounds. An eager forward+backward costs the host about as
  much as the GPU at 64-256 MiB, so one slow spell of the host would otherwise land on whichever
  provider ran then. Its gradients are returned (``torch.autograd.grad``), not summed into the
  inputs' ``.grad``, as a layer's q and k pass theirs on inside a model (:func:`fwdbwd_step`);
* GB/s from a bytes-moved model: read x + write y + read the fp32 angle table (forward), twice
  that for forward+backward (the backward reads dy, writes dx and reads the table again);
* the time of a plain device copy of the same bytes measured in the same run
  (``y.copy_(x)``; twice for forward+backward) and ``ratio = copy_ms / provider_ms``
  (1.0 = as fast as a copy; RoPE is memory-bound, so a copy is the floor);
* max abs / max relative / max ulp error of the forward output against an fp64 reference, and
  ``max_head_ulp_err``: the error in ulps of the largest value of its head vector (see
  :func:`error_metrics` for why that is the fair one for fp32 outputs).

A provider that is not installed, or does not support a configuration, is listed with the reason
and never raises. Nothing here touches the GPU at import time.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import importlib
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from .. import reference, runtime
from ..conventions import LAYOUTS

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CONFIG_FIELDS = ("seq_len", "batch", "heads", "head_dim", "dtype", "layout", "interleaved",
                 "rotary_percent", "start_positions", "kv_heads")
RESULT_FIELDS = ("provider", "available", "reason", "fwd_ms", "fwd_ms_p20", "fwd_ms_p80",
                 "fwdbwd_ms", "fwdbwd_ms_p20", "fwdbwd_ms_p80", "fwd_gbps", "fwdbwd_gbps",
                 "copy_fwd_ms", "copy_fwdbwd_ms", "ratio_fwd", "ratio_fwdbwd", "max_abs_err",
                 "max_rel_err", "max_ulp_err", "max_head_ulp_err", "device", "timing")
ROW_FIELDS = CONFIG_FIELDS + RESULT_FIELDS
TIMING_GPU = "do_bench"
FWDBWD_ROUNDS = 5       # rounds of forward+backward timings on a GPU (every provider each round)
ROUNDS_ORDER = "fixed"  # each round's order: "fixed" (as given) or "shuffled" (round_order)
ROUNDS_SEED = 0         # shuffled rounds: runs with the same seed visit the same orders
TIMING_CPU = "wall-clock (interpreter; meaningless)"


# --- configuration ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One RoPE problem. ``kv_heads`` set: Q [.., heads, D] and K [.., kv_heads, D] in one call.

    ``start_positions=True`` gives each sequence a random start offset (TE's semantics; the angle
    table is then 2*seq_len long). ``layout="thd"`` packs ``batch`` sequences of ``seq_len``.
    """
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    dtype: str = "bf16"
    layout: str = "sbhd"
    interleaved: bool = False
    rotary_percent: float = 1.0
    start_positions: bool = False
    kv_heads: Optional[int] = None

    def __post_init__(self):
        for name in ("seq_len", "batch", "heads", "head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Config.{name} must be a positive int, got {v!r}")
        if self.kv_heads is not None and (isinstance(self.kv_heads, bool)
                                          or not isinstance(self.kv_heads, int)
                                          or self.kv_heads < 1):
            raise ValueError(f"Config.kv_heads must be None or a positive int, got {self.kv_heads!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Config.dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"Config.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not (0.0 < float(self.rotary_percent) <= 1.0):
            raise ValueError(f"Config.rotary_percent must be in (0, 1], got {self.rotary_percent!r}")
        rot = self.rotary_dim
        if rot < 2 or rot % 2:
            raise ValueError(f"Config.rotary_percent={self.rotary_percent} gives rotary dim {rot} "
                             f"for head_dim={self.head_dim}; it must be even and >= 2")

    @property
    def rotary_dim(self) -> int:
        """TE's convention: ``int(head_dim * rotary_percent)``."""
        return int(self.head_dim * self.rotary_percent)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in CONFIG_FIELDS}


def angles(seq_len: int, rot_dim: int, *, interleaved: bool = False, base: float = 10000.0,
           device=None) -> torch.Tensor:
    """TE's angle table ``[seq_len, 1, 1, R]`` fp32: ``cat(f, f)`` (rotate-half) or
    ``f0 f0 f1 f1 ...`` (interleaved), ``f[p, j] = p * base^(-2j/R)``."""
    inv = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim))
    f = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv)  # [P, R/2]
    emb = f.repeat_interleave(2, dim=-1) if interleaved else torch.cat((f, f), dim=-1)
    return emb.view(seq_len, 1, 1, rot_dim)


@dataclass
class Case:
    """The inputs of one run, shared by all providers (they must not modify them)."""
    config: Config
    x: torch.Tensor                        # [S,B,H,D] / [B,S,H,D] / [B*S,H,D]
    k: Optional[torch.Tensor]              # same with kv_heads, or None
    freqs: torch.Tensor                    # [P, 1, 1, R] fp32 angles (TE convention)
    start: Optional[torch.Tensor]          # [B] int32 start offsets, or None
    cu_seqlens: Optional[torch.Tensor]     # [B+1] int32 (thd), or None

    @property
    def tensors(self):
        return (self.x,) if self.k is None else (self.x, self.k)


def make_case(config: Config, device=None, seed: int = 0) -> Case:
    """Fresh random inputs for ``config`` on ``device`` (default: ropelib's device)."""
    if not isinstance(config, Config):
        raise TypeError(f"config must be a ropelib.bench.compare.Config, got "
                        f"{type(config).__name__}")
    device = torch.device(device or runtime.default_device())
    g = torch.Generator().manual_seed(seed)
    c = config
    dtype = c.torch_dtype

    def shape(h):
        if c.layout == "sbhd":
            return (c.seq_len, c.batch, h, c.head_dim)
        if c.layout == "bshd":
            return (c.batch, c.seq_len, h, c.head_dim)
        return (c.batch * c.seq_len, h, c.head_dim)

    x = torch.randn(shape(c.heads), generator=g).to(device=device, dtype=dtype)
    k = None if c.kv_heads is None else \
        torch.randn(shape(c.kv_heads), generator=g).to(device=device, dtype=dtype)
    start = None
    table_len = c.seq_len
    if c.start_positions:
        start = torch.randint(0, c.seq_len, (c.batch,), generator=g).to(device=device,
                                                                        dtype=torch.int32)
        table_len = 2 * c.seq_len
    cu = None
    if c.layout == "thd":
        cu = (torch.arange(c.batch + 1, dtype=torch.int32) * c.seq_len).to(device)
    freqs = angles(table_len, c.rotary_dim, interleaved=c.interleaved, device=device)
    return Case(c, x, k, freqs, start, cu)


def reference_output(case: Case):
    """fp64 RoPE of each input tensor (not rounded): the oracle of the error columns."""
    c = case.config
    return tuple(reference.rope_reference(t.double(), case.freqs.double(), layout=c.layout,
                                          interleaved=c.interleaved,
                                          start_positions=case.start, cu_seqlens=case.cu_seqlens)
                 for t in case.tensors)


# --- providers --------------------------------------------------------------------------------

@dataclass
class Provider:
    """``fn(case) -> output tensor`` (or ``(q_out, k_out)`` when ``kv_heads`` is set), autograd-
    aware. ``supports(config)`` returns ``None`` or the reason a configuration cannot run."""
    name: str
    available: bool
    reason: str
    fn: Optional[Callable] = None
    supports: Optional[Callable[[Config], Optional[str]]] = None
    description: str = ""
    inplace: bool = False   # fn writes into its inputs: timed on a private copy of them

    def why_not(self, config: Config) -> Optional[str]:
        if not self.available:
            return self.reason
        return self.supports(config) if self.supports is not None else None


# Transformer Engine warns at import when it finds Jax installed without its Jax extension; it
# says nothing about the PyTorch side compared here, so it is not shown
_TE_JAX_WARNING = "Detected a Jax installation but could not find the shared object file"


def try_import(module: str):
    """(the module, "") where it imports, else (None, why not)."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TE_JAX_WARNING, category=RuntimeWarning)
            return importlib.import_module(module), ""
    except Exception as e:  # ImportError, or a broken CUDA extension raising at import
        return None, f"{module} does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def _kernels_runnable() -> Optional[str]:
    if runtime.on_gpu() or runtime.INTERPRET:
        return None
    return "Triton kernels cannot run here: " + runtime.mode()


def _each(case: Case, fn):
    """Apply a single-tensor RoPE to x (and k): the two-launch Q+K path of providers without one."""
    outs = tuple(fn(t) for t in case.tensors)
    return outs[0] if case.k is None else outs


def _ropelib_as_planned() -> Provider:
    import ropelib
    why = _kernels_runnable()
    if not hasattr(ropelib, "apply_rope"):
        return Provider("ropelib", False, "ropelib.apply_rope is not there yet")
    if why:
        return Provider("ropelib", False, why)

    def fn(case):
        c = case.config
        kw = dict(layout=c.layout, interleaved=c.interleaved, start_positions=case.start,
                  cu_seqlens=case.cu_seqlens)
        if case.k is not None:
            return ropelib.apply_rope_qk(case.x, case.k, case.freqs, **kw)
        return ropelib.apply_rope(case.x, case.freqs, **kw)
    return Provider("ropelib", True, "", fn, description="ropelib.apply_rope, its route as planned "
                    "(the finished kernel, or two passes on large tensors)")


class _GenerationFn(torch.autograd.Function):
    """Autograd for the teaching generations: their launcher computes the backward itself."""

    @staticmethod
    def forward(ctx, x, freqs, launcher):
        ctx.save_for_backward(freqs)
        ctx.launcher = launcher
        return launcher(x, freqs, backward=False)

    @staticmethod
    def backward(ctx, dy):
        (freqs,) = ctx.saved_tensors
        return ctx.launcher(dy.contiguous(), freqs, backward=True), None, None


def teaching_kernel_supports(config: Config, *, power_of_two_head_dim: bool = False
                             ) -> Optional[str]:
    """None, or why a teaching kernel (sbhd, rotate-half, full rotary, positions 0..S-1, one
    tensor a launch; a power-of-two head dim where asked) cannot run `config`."""
    reasons = []
    if config.layout != "sbhd":
        reasons.append("sbhd only")
    if config.interleaved:
        reasons.append("rotate-half only")
    if config.rotary_percent != 1.0:
        reasons.append("full rotary only")
    if config.start_positions:
        reasons.append("no start_positions")
    if config.kv_heads is not None:
        reasons.append("one tensor per launch (no Q+K)")
    if power_of_two_head_dim and config.head_dim & (config.head_dim - 1):
        reasons.append("a power-of-two head dim")
    return ("unsupported config: " + ", ".join(reasons)) if reasons else None


def _ropelib_generation(name: str, module: str, attr: str, description: str) -> Provider:
    mod, why = try_import(module)
    if mod is None or not hasattr(mod, attr):
        return Provider(name, False, why or f"{module}.{attr} is missing")
    why = _kernels_runnable()
    if why:
        return Provider(name, False, why)
    launcher = getattr(mod, attr)

    def fn(case):
        return _GenerationFn.apply(case.x, case.freqs, launcher)
    return Provider(name, True, "", fn, teaching_kernel_supports, description)


def _pytorch_fn(case):
    c = case.config
    return _each(case, lambda t: reference.te_unfused(
        t, case.freqs, tensor_format=c.layout, start_positions=case.start,
        interleaved=c.interleaved, cu_seqlens=case.cu_seqlens))


def _pytorch() -> Provider:
    return Provider("pytorch", True, "", _pytorch_fn,
                    description="plain PyTorch, TE's unfused math in the input dtype")


def _compiled_provider(name: str, description: str, make_core, supports=None) -> Provider:
    """torch.compile of `make_core(case) -> (core, extra inputs)`: static shapes, compiled afresh
    for each new configuration (Dynamo's recompile limit, 8 per function, would otherwise make a
    long sweep fall back to eager)."""
    if not runtime.on_gpu():
        return Provider(name, False, "interpreter mode: torch.compile is benchmarked on a GPU only")
    state = {"key": None, "fn": None, "extra": ()}

    def fn(case):
        key = (case.config, tuple(t.shape for t in case.tensors), case.x.device)
        if key != state["key"]:
            torch._dynamo.reset()
            core, extra = make_core(case)
            state.update(key=key, fn=torch.compile(core, dynamic=False), extra=extra)
        return state["fn"](case.x, case.k, *state["extra"])
    return Provider(name, True, "", fn, supports, description)


def hf_rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool):
    """Hugging Face's formula, `t * cos + rotate_half(t) * sin`, on the first R = cos.shape[-1]
    features (the rest pass through); interleaved pairs rotate as GPT-J's rotate_every_two."""
    R = cos.shape[-1]
    rot = t[..., :R]
    if interleaved:
        rotated = torch.stack((-rot[..., 1::2], rot[..., 0::2]), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((-rot[..., R // 2:], rot[..., :R // 2]), dim=-1)
    out = rot * cos + rotated * sin
    return out if R == t.shape[-1] else torch.cat((out, t[..., R:]), dim=-1)


def _hf_formula_core(case):
    """What a user writes and compiles: cos/sin tables in the input dtype, built once as a
    model caches them; the rows of each token gathered inside the compiled function."""
    c = case.config
    f = case.freqs[:, 0, 0, :]
    cos_t, sin_t = torch.cos(f).to(case.x.dtype), torch.sin(f).to(case.x.dtype)   # [P, R]
    S = c.seq_len
    if c.layout == "thd":
        pos = torch.arange(c.batch * S, device=case.x.device) % S                   # [T]
    elif case.start is not None:
        pos = case.start.long()[:, None] + torch.arange(S, device=case.x.device)    # [B, S]
    else:
        pos = None

    def core(x, k, cos_t, sin_t, pos):
        if pos is None:
            cos, sin = cos_t[:S], sin_t[:S]                        # [S, R]
        else:
            cos, sin = cos_t[pos], sin_t[pos]                      # [B, S, R] or [T, R]
        if c.layout == "thd":
            cos, sin = cos[:, None], sin[:, None]                  # [T, 1, R]
        elif pos is None:
            shape = (S, 1, 1, -1) if c.layout == "sbhd" else (1, S, 1, -1)
            cos, sin = cos.view(shape), sin.view(shape)
        else:
            cos, sin = cos[:, :, None], sin[:, :, None]            # [B, S, 1, R]
            if c.layout == "sbhd":
                cos, sin = cos.transpose(0, 1), sin.transpose(0, 1)
        y = hf_rotate(x, cos, sin, c.interleaved)
        return y if k is None else (y, hf_rotate(k, cos, sin, c.interleaved))
    return core, (cos_t, sin_t, pos)


def _torch_compile() -> Provider:
    return _compiled_provider(
        "torch.compile", "torch.compile of Hugging Face's formula x*cos + rotate_half(x)*sin "
        "(cos/sin tables in the input dtype)", _hf_formula_core)


def _te_unfused_core(case):
    c, start, cu = case.config, case.start, case.cu_seqlens

    def core(x, k, freqs):
        kw = dict(tensor_format=c.layout, start_positions=start, interleaved=c.interleaved,
                  cu_seqlens=cu)
        y = reference.te_unfused(x, freqs, **kw)
        return y if k is None else (y, reference.te_unfused(k, freqs, **kw))
    return core, (case.freqs,)


def _torch_compile_te_unfused() -> Provider:
    return _compiled_provider(
        "torch.compile_te_unfused", "torch.compile of TE's unfused PyTorch path (which Inductor "
        "cannot fuse into one pass)", _te_unfused_core,
        lambda c: "thd is not compiled (per-sequence Python loop)" if c.layout == "thd" else None)


def _te(fused: bool) -> Provider:
    name = "te_fused" if fused else "te_unfused"
    mod, why = try_import("transformer_engine.pytorch.attention.rope")
    if mod is None:
        return Provider(name, False, why)
    te_apply = mod.apply_rotary_pos_emb

    def fn(case):
        c = case.config
        kw = dict(tensor_format=c.layout, fused=fused)
        if c.interleaved:
            kw["interleaved"] = True
        if case.start is not None:
            kw["start_positions"] = case.start
        if case.cu_seqlens is not None:
            kw["cu_seqlens"] = case.cu_seqlens
        return _each(case, lambda t: te_apply(t, case.freqs, **kw))
    return Provider(name, True, "", fn,
                    lambda c: None if runtime.on_gpu() else "Transformer Engine needs a GPU",
                    f"Transformer Engine apply_rotary_pos_emb(fused={fused})")


def _liger() -> Provider:
    mod, why = try_import("liger_kernel.ops.rope")
    if mod is None:
        return Provider("liger", False, why)

    def supports(c):
        reasons = []
        if not runtime.on_gpu():
            reasons.append("GPU only")
        if c.layout != "bshd":
            reasons.append("takes (batch, heads, seq, dim) views of bshd; other layouts copy")
        if c.interleaved:
            reasons.append("rotate-half only")
        if c.rotary_percent != 1.0:
            reasons.append("full rotary only")
        if c.start_positions:
            reasons.append("no start_positions")
        return ("unsupported config: " + ", ".join(reasons)) if reasons else None

    tables = {}

    def fn(case):
        c = case.config
        key = (case.freqs.data_ptr(), c.seq_len, case.x.dtype)
        if key not in tables:   # the cos/sin cache is built once, as a model does
            f = case.freqs[:c.seq_len, 0, 0, :]                       # [S, D], cat(f, f)
            tables.clear()
            tables[key] = (torch.cos(f).unsqueeze(0).to(case.x.dtype),  # [1, S, D]
                           torch.sin(f).unsqueeze(0).to(case.x.dtype))
        cos, sin = tables[key]
        q = case.x.transpose(1, 2)                 # [B, H, S, D] view of bshd: rotated in place
        # Liger rotates Q and K together; without kv_heads a one-head K rides along (1/H extra).
        k = (case.k if case.k is not None else case.x[:, :, :1].detach().clone()).transpose(1, 2)
        qo, ko = mod.LigerRopeFunction.apply(q, k, cos, sin)
        return qo.transpose(1, 2) if case.k is None else (qo.transpose(1, 2), ko.transpose(1, 2))
    return Provider("liger", True, "", fn, supports, "Liger Kernel LigerRopeFunction (in place)",
                    inplace=True)


def _flash_attn() -> Provider:
    mod, why = try_import("flash_attn.layers.rotary")
    if mod is None:
        return Provider("flash_attn", False, why)

    def supports(c):
        return None if runtime.on_gpu() else "GPU only"

    tables = {}

    def fn(case):
        c = case.config
        R = c.rotary_dim
        key = (case.freqs.data_ptr(), case.freqs.shape, c.interleaved, case.x.dtype)
        if key not in tables:   # the cos/sin cache is built once, as a model does
            half = case.freqs[:, 0, 0, 0:R:2] if c.interleaved else case.freqs[:, 0, 0, :R // 2]
            tables.clear()
            tables[key] = (torch.cos(half).to(case.x.dtype),            # [P, R/2]
                           torch.sin(half).to(case.x.dtype))
        cos, sin = tables[key]
        kw = dict(interleaved=c.interleaved)
        if case.start is not None:
            kw["seqlen_offsets"] = case.start
        if c.layout == "thd":
            kw.update(cu_seqlens=case.cu_seqlens, max_seqlen=c.seq_len)

        def one(t):
            if c.layout == "sbhd":
                return mod.apply_rotary_emb(t.transpose(0, 1), cos, sin, **kw).transpose(0, 1)
            return mod.apply_rotary_emb(t, cos, sin, **kw)
        return _each(case, one)
    return Provider("flash_attn", True, "", fn, supports,
                    "flash-attn apply_rotary_emb (cos/sin table in the input dtype)")


PROVIDER_NAMES = ("ropelib", "ropelib_naive", "ropelib_batch_reuse", "te_fused", "te_unfused",
                  "pytorch", "torch.compile", "torch.compile_te_unfused", "liger", "flash_attn")


def providers() -> list:
    """Every provider ropelib knows, available or not (then with the reason)."""
    out = []
    makers = {
        "ropelib": _ropelib_as_planned,
        "ropelib_naive": lambda: _ropelib_generation(
            "ropelib_naive", "ropelib.course.kernels.naive", "rope_naive",
            "generation 1: one program per (token, batch, head) row"),
        "ropelib_batch_reuse": lambda: _ropelib_generation(
            "ropelib_batch_reuse", "ropelib.course.kernels.batch_reuse", "rope_batch_reuse",
            "generation 2: grid (S, H), cos/sin reused over the batch"),
        "te_fused": lambda: _te(True),
        "te_unfused": lambda: _te(False),
        "pytorch": _pytorch,
        "torch.compile": _torch_compile,
        "torch.compile_te_unfused": _torch_compile_te_unfused,
        "liger": _liger,
        "flash_attn": _flash_attn,
    }
    for name in PROVIDER_NAMES:
        try:
            out.append(makers[name]())
        except Exception as e:  # a provider must never break the listing
            out.append(Provider(name, False, f"failed to set up: {type(e).__name__}: {e}"))
    return out


def _resolve(selection) -> list:
    if selection is None:
        return providers()
    if isinstance(selection, (str, Provider)):
        selection = [selection]
    known = None
    out = []
    for p in selection:
        if isinstance(p, Provider):
            out.append(p)
        elif isinstance(p, str):
            if known is None:
                known = {q.name: q for q in providers()}
            if p not in known:
                raise ValueError(f"providers: unknown provider {p!r}; known: {PROVIDER_NAMES}")
            out.append(known[p])
        else:
            raise TypeError(f"providers must hold names or Provider objects, got {type(p).__name__}")
    return out


# --- timing -----------------------------------------------------------------------------------

def sync(device) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def wall_clock(fn, reps=3, warmup=1) -> tuple:
    """(median, 20th, 80th percentile) wall-clock ms of fn() over `reps` calls after `warmup`;
    for the CPU interpreter, where the numbers say nothing about a GPU."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    q = lambda p: ts[min(len(ts) - 1, int(round(p * (len(ts) - 1))))]
    return statistics.median(ts), q(0.2), q(0.8)


def time_ms(fn, device, grad_to_none=None) -> tuple:
    """(median, 20th, 80th percentile) in ms of fn(): ``triton.testing.do_bench`` on a CUDA
    device (L2 flushed between calls; ``grad_to_none``: tensors whose .grad is reset between
    calls); elsewhere a few wall-clock calls whose numbers mean nothing (the interpreter)."""
    if torch.device(device).type == "cuda":
        import triton.testing
        return tuple(triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8],
                                             grad_to_none=grad_to_none))
    return wall_clock(fn)


def time_in_rounds(steps: dict, device, rounds: Optional[int] = None) -> dict:
    """{name: (median, 20th, 80th percentile) ms} of several steps timed in turn: each round
    times every step once (``time_ms``), and a step's numbers are the median and percentiles of
    its rounds' medians. A slow spell of the host (another process, a clock change) then falls
    on every step alike. A step that raises is dropped from the later rounds; its exception is
    its value. ``rounds``: default :data:`FWDBWD_ROUNDS` on a GPU, 1 elsewhere. Each round
    visits the steps in :data:`ROUNDS_ORDER`: as given, or in a new order every round (so that
    no step always runs right after the same one)."""
    if rounds is None:
        rounds = FWDBWD_ROUNDS if torch.device(device).type == "cuda" else 1
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    failed = {}

    def time_one(name):
        if name in failed:
            return None
        try:
            return time_ms(steps[name], device)[0]
        except Exception as e:  # noqa: BLE001 -- the caller's row says why
            failed[name] = e
            return None
    medians = times_in_rounds(steps, rounds, time_one)
    out = dict(failed)
    for name, ms in medians.items():
        if name not in failed:
            q = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) > 1 else ms * 9
            out[name] = (statistics.median(ms), q[1], q[7])
    return out


def times_in_rounds(names, rounds: int, time_one: Callable, order: Optional[str] = None,
                    seed: Optional[int] = None) -> dict:
    """{name: [its time in each round it was timed]}: each of `rounds` rounds times every name
    once, ``time_one(name)`` (None: not timed), in :func:`round_order`'s order (``order`` and
    ``seed`` passed on: by default the run's)."""
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in round_order(list(times), r, order, seed):
            t = time_one(name)
            if t is not None:
                times[name].append(t)
    return times


def round_order(names: list, r: int, order: Optional[str] = None,
                seed: Optional[int] = None) -> list:
    """The names in round r's order: as given ("fixed"), or shuffled ("shuffled") by a
    generator seeded with r + 1,000,003 seed, so that runs with the same ``seed`` visit the
    same orders (seed 0: seed r) and runs with different seeds, other orders; ``order`` and
    ``seed`` default to :data:`ROUNDS_ORDER` and :data:`ROUNDS_SEED`."""
    order = ROUNDS_ORDER if order is None else order
    seed = ROUNDS_SEED if seed is None else seed
    if order not in ("fixed", "shuffled"):
        raise ValueError(f"order must be 'fixed' or 'shuffled', got {order!r}")
    got = list(names)
    if order == "shuffled":
        import random
        random.Random(r + 1_000_003 * seed).shuffle(got)
    return got


def add_round_order_arguments(ap, *, prefix: str = "", default: str = "shuffled",
                              what: str = "providers") -> None:
    """Add the two options that choose the order of timing rounds to an argparse parser:
    ``--{prefix}order`` (fixed or shuffled, see :func:`round_order`) and ``--{prefix}seed``;
    :func:`use_round_order` applies what was parsed."""
    ap.add_argument(f"--{prefix}order", choices=("fixed", "shuffled"), default=default,
                    help=f"the {what}' order in each round: as listed (fixed), or a new one "
                         "every round (shuffled; round r by a generator seeded from r and the "
                         "seed): in a fixed order one always runs right after the same other, "
                         "which moved qkv_forward_ab.py's variants by up to 10 %% "
                         f"(default {default}; recorded in the CSV's header)")
    ap.add_argument(f"--{prefix}seed", type=int, default=0,
                    help="shuffled rounds: runs with the same seed visit the same orders; "
                         "give another for an independent run (recorded in the CSV's header)")


def use_round_order(args, *, prefix: str = "") -> None:
    """Make the parsed ``--{prefix}order`` and ``--{prefix}seed`` the defaults of
    :func:`round_order` (and what the CSV's header records)."""
    global ROUNDS_ORDER, ROUNDS_SEED
    attr = prefix.replace("-", "_")
    ROUNDS_ORDER, ROUNDS_SEED = getattr(args, attr + "order"), getattr(args, attr + "seed")


def time_rows_in_rounds(rows: list, steps: dict, device) -> list:
    """Time ``steps`` ({row index: step}) with :func:`time_in_rounds` into their rows (``ms``,
    ``p20``, ``p80``); a step that raised makes its row unavailable, with the reason. Returns
    the indices of the rows timed."""
    timed = []
    for i, got in time_in_rounds(steps, device).items():
        if isinstance(got, Exception):
            rows[i].update(available=False, reason=f"{type(got).__name__}: {got}"[:200])
            continue
        rows[i]["ms"], rows[i]["p20"], rows[i]["p80"] = got
        timed.append(i)
    return timed


def fwdbwd_inputs(case, fill: Optional[float] = None) -> tuple:
    """(case on leaf copies of its tensors that require grad, the leaves, gradients for the
    outputs): what a forward+backward step runs on. The gradients are random, or all ``fill``
    (no random numbers drawn: a CUDA-graph capture that failed before can leave the generator
    unusable outside capture)."""
    leaves = [t.detach().clone().requires_grad_() for t in case.tensors]
    gcase = dataclasses.replace(case, x=leaves[0], k=leaves[1] if len(leaves) > 1 else None)
    grads = [torch.randn_like(t) if fill is None else torch.full_like(t, fill)
             for t in case.tensors]
    return gcase, leaves, grads


def fwdbwd_step(fn: Callable[[], object], leaves, grads) -> Callable[[], object]:
    """One forward+backward as a step to time: ``fn()``, then the gradients of ``leaves`` for
    ``grads`` through ``torch.autograd.grad``. They are handed back, not summed into the leaves'
    ``.grad``: inside a model a layer's q and k are intermediates whose gradients flow on into
    the projection's backward. Summing into ``.grad`` would add a pass of its own (read the old
    and the new gradient, write the sum) to every call where ``.grad`` is not reset between
    calls, as under CUDA-graph replay and in back-to-back host timings."""
    leaves, grads = list(leaves), list(grads)

    def step():
        return torch.autograd.grad(output_tuple(fn()), leaves, grads)
    return step


def bytes_moved(config: Config, backward: bool = False) -> int:
    """The bytes model behind GB/s: read x (+k), write y, read the fp32 angle table; the backward
    moves as much again."""
    c = config
    elem = torch.tensor([], dtype=c.torch_dtype).element_size()
    heads = c.heads + (c.kv_heads or 0)
    tokens = c.seq_len * c.batch
    n = 2 * tokens * heads * c.head_dim * elem + c.seq_len * c.rotary_dim * 4
    return 2 * n if backward else n


# --- errors -----------------------------------------------------------------------------------

def ulp(ref: torch.Tensor, dtype: torch.dtype, floor: float = 0.0) -> torch.Tensor:
    """The unit in the last place of ``dtype`` at each value of ``ref`` (fp64 result); floored at
    the ulp of the smallest normal so zeros do not divide by zero.

    ``floor``: values smaller than this are measured in the ulp at ``floor``. RoPE outputs near
    zero come from cancellation (x_a cos - x_b sin), where fp32 arithmetic is exact only to a few
    fp32 ulps *of the operands*: an error metric in the output's own ulp would count that as
    many ulps of a tiny result (seen on an H100 in bf16: 8 ulps at |y| ~ 1e-5)."""
    fi = torch.finfo(dtype)
    mag_in = ref.double().abs()
    if floor > 0:
        mag_in = mag_in.clamp(min=floor)
    _, e = torch.frexp(mag_in)                      # |ref| = m * 2**e, m in [0.5, 1)
    mag = torch.ldexp(torch.ones_like(ref, dtype=torch.float64), e - 1)  # 2**floor(log2|ref|)
    mag = torch.where(mag_in == 0, torch.zeros_like(mag), mag)             # frexp(0) has e = 0
    return torch.clamp(mag, min=fi.tiny) * fi.eps


def error_metrics(actual, reference_fp64) -> dict:
    """Errors of ``actual`` (tensor or tuple) against fp64 values.

    * ``max_abs_err``, ``max_rel_err``;
    * ``max_ulp_err``: element-wise, in ulps of ``actual``'s dtype at the reference value.
      Relative and ulp errors use ``max(|ref|, 1e-3 * max|ref|)`` so values near zero do not turn
      tiny absolute errors into huge relative ones (see ``ulp``);
    * ``max_head_ulp_err``: in ulps of the largest |value| of the same head vector (the last
      dimension). This is the fair measure of the arithmetic: an output near zero comes from
      cancellation (``x_a cos - x_b sin``), and fp32 arithmetic is exact only to about an ulp
      *of the operands*, which are as large as the head's largest values. An output that is
      computed exactly and rounded once scores at most 0.5 on both measures; fp32 arithmetic
      with an fp32 cos/sin table scores a few head ulps of fp32 on the second, while on the
      element-wise one it can reach hundreds of ulps of a value near zero.
    """
    if isinstance(actual, torch.Tensor):
        actual = (actual,)
    if isinstance(reference_fp64, torch.Tensor):
        reference_fp64 = (reference_fp64,)
    if len(actual) != len(reference_fp64):
        raise ValueError(f"actual has {len(actual)} tensors, reference {len(reference_fp64)}")
    abs_e = rel_e = ulp_e = head_e = 0.0
    for a, r in zip(actual, reference_fp64):
        if a.shape != r.shape:
            raise ValueError(f"actual shape {tuple(a.shape)} != reference shape {tuple(r.shape)}")
        if not r.numel():
            continue
        r = r.detach().double()
        diff = (a.detach().double() - r).abs()
        if not torch.isfinite(diff).all():
            return {"max_abs_err": math.inf, "max_rel_err": math.inf, "max_ulp_err": math.inf,
                    "max_head_ulp_err": math.inf}
        floor = 1e-3 * float(r.abs().max())
        abs_e = max(abs_e, float(diff.max()))
        rel_e = max(rel_e, float((diff / r.abs().clamp(min=max(floor, 1e-300))).max()))
        ulp_e = max(ulp_e, float((diff / ulp(r, a.dtype, floor)).max()))
        head_max = r.abs().amax(dim=-1, keepdim=True)                    # [..., 1]
        head_e = max(head_e, float((diff.amax(dim=-1, keepdim=True) / ulp(head_max, a.dtype)).max()))
    return {"max_abs_err": abs_e, "max_rel_err": rel_e, "max_ulp_err": ulp_e,
            "max_head_ulp_err": head_e}


# --- one configuration ------------------------------------------------------------------------

def _empty_row(config, name, device, timing, available, reason):
    row = dict(config.as_dict())
    row.update({f: None for f in RESULT_FIELDS})
    row.update(provider=name, available=available, reason=reason, device=str(device),
               timing=timing)
    return row


def copy_floor(tensors) -> tuple:
    """(copy_once, copy_twice): device copies of the bytes of `tensors` (into buffers made here,
    from clones of them), once (a forward's floor) and twice (forward+backward)."""
    src = [t.clone() for t in tensors]
    dst = [torch.empty_like(t) for t in tensors]

    def copy_once():
        for d, s in zip(dst, src):
            d.copy_(s)

    def copy_twice():
        copy_once()
        copy_once()
    return copy_once, copy_twice


def output_tuple(out) -> tuple:
    """A provider's output as a tuple of tensors (one tensor, or q and k)."""
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def run_case(config: Config, providers=None, *, backward: bool = True, device=None,
             seed: int = 0, rounds: Optional[int] = None) -> list:
    """One row per provider for ``config`` (see the module docstring for the columns).

    ``providers``: None (all), names, or :class:`Provider` objects. Unavailable or unsupported
    providers, and providers that fail at run time, give a row with ``available=False`` and the
    reason instead of raising. ``rounds``: rounds of the forward+backward timings
    (default :data:`FWDBWD_ROUNDS` on a GPU, 1 elsewhere).
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a ropelib.bench.compare.Config, got "
                        f"{type(config).__name__}")
    provs = _resolve(providers)
    device = torch.device(device or runtime.default_device())
    timing = TIMING_GPU if device.type == "cuda" else TIMING_CPU
    case = make_case(config, device)
    ref = reference_output(case)

    # the copy floor of the same bytes, measured in this run
    copy_once, copy_twice = copy_floor(case.tensors)
    copy_fwd = time_ms(copy_once, device)[0]
    nbytes, nbytes_bwd = bytes_moved(config), bytes_moved(config, backward=True)

    rows, fwdbwd_steps = [], {}
    shared = fwdbwd_inputs(case) if backward else None
    for p in provs:
        why = p.why_not(config)
        row = _empty_row(config, p.name, device, timing, why is None, why or "")
        row.update(copy_fwd_ms=copy_fwd)
        if why is None:
            try:
                step = _measure(p, case, ref, row, shared, device, nbytes, copy_fwd)
                if step is not None:
                    fwdbwd_steps[len(rows)] = step
            except Exception as e:
                _failed(row, e)
        rows.append(row)
    if backward:
        timed = time_in_rounds({"copy": copy_twice, **fwdbwd_steps}, device, rounds)
        copy_fwdbwd = timed["copy"][0]
        for i, row in enumerate(rows):
            row.update(copy_fwdbwd_ms=copy_fwdbwd)
            ms = timed.get(i)
            if isinstance(ms, Exception):
                _failed(row, ms)
            elif ms is not None:
                row.update(fwdbwd_ms=ms[0], fwdbwd_ms_p20=ms[1], fwdbwd_ms_p80=ms[2],
                           fwdbwd_gbps=nbytes_bwd / ms[0] / 1e6,
                           ratio_fwdbwd=copy_fwdbwd / ms[0])
    return rows


def _failed(row: dict, e: Exception) -> None:
    row.update(available=False, reason=f"failed: {type(e).__name__}: "
                                       f"{str(e).splitlines()[0] if str(e) else ''}")


def _measure(p, case, ref, row, shared, device, nbytes, copy_fwd):
    """Check provider p's forward output against ``ref`` and time its forward into ``row``;
    returns its forward+backward step (``fwdbwd_step``) on the ``shared`` leaves and gradients
    (``fwdbwd_inputs``; a provider that works in place gets its own), or None when
    ``shared`` is None (forward only)."""
    inputs = [t.clone() for t in case.tensors]
    fresh = dataclasses.replace(case, x=inputs[0], k=inputs[1] if len(inputs) > 1 else None)
    with torch.no_grad():
        out = output_tuple(p.fn(fresh))
    if not p.inplace:
        for t, t0 in zip(inputs, case.tensors):
            if not torch.equal(t, t0):
                raise RuntimeError("provider modified its input (in place) without saying so "
                                   "(Provider.inplace): rows would mislead")
    row.update(error_metrics(out, ref))
    if p.inplace:   # time on a private copy so the shared inputs stay as drawn
        own = [t.clone() for t in case.tensors]
        case = dataclasses.replace(case, x=own[0], k=own[1] if len(own) > 1 else None)

    def fwd():
        with torch.no_grad():
            p.fn(case)
    ms = time_ms(fwd, device)
    row.update(fwd_ms=ms[0], fwd_ms_p20=ms[1], fwd_ms_p80=ms[2],
               fwd_gbps=nbytes / ms[0] / 1e6, ratio_fwd=copy_fwd / ms[0])
    if shared is None:
        return None
    gcase, leaves, grads = fwdbwd_inputs(case) if p.inplace else shared
    return fwdbwd_step(lambda: p.fn(gcase), leaves, grads)


# --- sweeps -----------------------------------------------------------------------------------

class _TextBar:
    """A progress bar for terminals without tqdm."""

    def __init__(self, total, desc):
        self.total, self.n, self.desc = total, 0, desc
        self._draw()

    def _draw(self):
        w = 30
        done = int(w * self.n / max(self.total, 1))
        sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (w - done)}] {self.n}/{self.total}")
        sys.stderr.flush()

    def update(self, k=1):
        self.n += k
        self._draw()

    def close(self):
        sys.stderr.write("\n")
        sys.stderr.flush()


class _WidgetBar:
    def __init__(self, total, desc):
        import ipywidgets
        from IPython.display import display
        self.bar = ipywidgets.IntProgress(value=0, min=0, max=total, description=desc[:20])
        display(self.bar)

    def update(self, k=1):
        self.bar.value += k

    def close(self):
        self.bar.bar_style = "success"


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
        ip = get_ipython()
        return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"
    except Exception:
        return False


def progress_bar(total: int, desc: str = "sweep", kind=True):
    """``kind``: True (auto: ipywidgets in a notebook, else tqdm, else text), "widget", "tqdm",
    "text". Returns an object with ``update()`` and ``close()``."""
    if kind is True:
        kind = "widget" if _in_notebook() else "tqdm"
    if kind == "widget":
        try:
            return _WidgetBar(total, desc)
        except Exception:
            kind = "tqdm"
    if kind == "tqdm":
        try:
            from tqdm.auto import tqdm
            return tqdm(total=total, desc=desc)
        except ImportError:
            kind = "text"
    if kind == "text":
        return _TextBar(total, desc)
    raise ValueError(f"progress must be True, False, 'widget', 'tqdm' or 'text', got {kind!r}")


def sweep(base: Config, axis: str, values: Iterable, providers=None, *, progress=True,
          on_row: Optional[Callable[[dict], None]] = None, backward: bool = True,
          device=None) -> list:
    """``run_case`` for ``base`` with ``axis`` set to each of ``values``; rows in order.
    ``on_row(row)`` is called as each row arrives (the dashboard's live update)."""
    if not isinstance(base, Config):
        raise TypeError(f"base must be a ropelib.bench.compare.Config, got {type(base).__name__}")
    if axis not in CONFIG_FIELDS:
        raise ValueError(f"axis must be one of {CONFIG_FIELDS}, got {axis!r}")
    values = list(values)
    if not values:
        raise ValueError("values must not be empty")
    provs = _resolve(providers)   # resolved once: torch.compile caches live in the provider
    configs = [dataclasses.replace(base, **{axis: v}) for v in values]
    bar = progress_bar(len(configs), f"{axis} sweep", progress) if progress else None
    rows = []
    try:
        for cfg in configs:
            for row in run_case(cfg, provs, backward=backward, device=device):
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rows


# --- CSV and provenance -----------------------------------------------------------------------

def source_sha(root: Optional[Path] = None) -> str:
    """The first 12 hex digits of a SHA-256 over ropelib's Python sources (every .py file under
    the package, or under `root`, by relative path and content): which code a measurement ran,
    also where the checkout has no git history (a copy sent to a GPU machine). At a checkout of
    a commit with no other .py files under the package, it is that commit's value. "unknown"
    where the files cannot be read. (The benchmark script itself is not covered: it is named in
    the file's own header or name.)"""
    import hashlib
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    digest = hashlib.sha256()
    try:
        for path in sorted(p for p in root.rglob("*.py") if p.is_file()):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    except OSError:
        return "unknown"
    return digest.hexdigest()[:12]


def source_revision() -> str:
    """The checkout's commit (12 hex digits; "+modified" where ropelib's or the benchmarks'
    tracked Python files differ from it), $ROPELIB_REVISION where that is set (a copy without git
    history), else "unknown": also where the package is not in its own checkout (an install
    inside some other repository)."""
    given = os.environ.get("ROPELIB_REVISION")
    if given:
        return given
    root = Path(__file__).resolve().parents[2]

    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args],
                              capture_output=True, text=True, timeout=10)
    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode or Path(top.stdout.strip()).resolve() != root \
                or git("ls-files", "--error-unmatch", "ropelib/bench/compare.py").returncode:
            return "unknown"
        head = git("rev-parse", "--short=12", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no", "--", "ropelib",
                     ":(glob)benchmarks/*.py")
        if head.returncode or status.returncode:
            return "unknown"
        return head.stdout.strip() + ("+modified" if status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_meta() -> dict:
    """Where the numbers come from: GPU, driver, versions, date, execution mode, and which code
    (the commit where there is one, and a hash of ropelib's sources that holds without git)."""
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "mode": runtime.mode(), "python": platform.python_version(),
            "platform": platform.platform(), "torch": torch.__version__,
            "cuda": torch.version.cuda or "none",
            "revision": source_revision(), "ropelib_source": source_sha(),
            "rounds_order": ROUNDS_ORDER}
    if ROUNDS_ORDER == "shuffled":
        meta["rounds_seed"] = str(ROUNDS_SEED)
    try:
        import triton
        meta["triton"] = triton.__version__
    except Exception:
        meta["triton"] = "not installed"
    try:
        from importlib.metadata import version
        meta["transformer_engine"] = version("transformer_engine")
    except Exception:
        meta["transformer_engine"] = "not installed"
    meta["gpu"] = torch.cuda.get_device_name() if runtime.on_gpu() else "none"
    meta["driver"] = "none"
    if runtime.on_gpu():
        try:
            meta["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except Exception:
            meta["driver"] = "unknown"
    return meta


def gpu_slug(name: Optional[str] = None) -> str:
    """A GPU's name as results files carry it: lower case, every run of other characters a dash
    ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"); by default this machine's GPU."""
    name = torch.cuda.get_device_name() if name is None else name
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def ncu_table(text: str) -> list:
    """The lines of an `ncu --csv` table in `text`, from its header row (the one that starts
    with "ID") on; [] where there is none. Anything before the header (the ==PROF== lines, the
    profiled program's own output) is left out. Both of ncu's pages start so: the details page
    (one row per kernel, section and metric: measured.ncu_kernels) and the raw page (one row per
    kernel: benchmarks/mechanism.parse_ncu_csv)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    return [] if start is None else lines[start:]


# Nsight Compute metrics for a launch that waits rather than streams: time, active and elapsed
# cycles, grid, registers, instructions, the share of cycles a scheduler issued (issue slots
# busy), DRAM bytes, and where an average warp spent its cycles between two instructions it
# issued (the warp-state ratios: long_scoreboard = global memory, barrier, wait = fixed latency,
# short_scoreboard = XU or shared memory, ...). benchmarks/decode_ncu.py, puzzle9_ncu.py and
# mrope_angles_ncu.py profile with them.
WARP_STALLS = ("long_scoreboard", "barrier", "wait", "short_scoreboard", "math_pipe_throttle",
               "lg_throttle", "mio_throttle", "branch_resolving", "dispatch_stall",
               "no_instruction", "not_selected", "selected", "drain", "membar", "imc_miss",
               "misc", "sleeping", "tex_throttle")
WARP_STATE_METRICS = (
    "gpu__time_duration.sum", "sm__cycles_active.avg", "gpc__cycles_elapsed.max",
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
    "smsp__inst_executed.sum", "smsp__issue_active.avg.per_cycle_active",
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__average_warp_latency_per_inst_issued.ratio",
    *(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in WARP_STALLS))


# The instruction mix: thread instructions by kind (fp32 adds, multiplies and fmas, integer,
# conversions, memory, control, bit operations, moves and the rest) and warp instructions per
# pipe (the XU pipe runs float-int conversions and special functions). benchmarks/ladder_opcodes_ncu.py and te_ncu.py profile
# with them.
INSTRUCTION_KINDS = ("fadd", "fmul", "ffma", "integer", "conversion", "memory", "control", "bit",
                     "misc", "uniform", "inter_thread_communication")
INSTRUCTION_MIX_METRICS = (
    *(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in INSTRUCTION_KINDS),
    "smsp__inst_executed_pipe_xu.sum", "smsp__inst_executed_pipe_alu.sum",
    "smsp__inst_executed_pipe_fma.sum", "smsp__inst_executed_pipe_lsu.sum")


# Metrics Nsight Compute derives from a launch's configuration and the compiled kernel's
# resources, not from hardware counters: `ncu --query-metrics` does not list them, yet
# `--metrics` takes them (its LaunchStats and Occupancy sections are made of them).
LAUNCH_METRICS = ("launch__grid_size", "launch__block_size", "launch__registers_per_thread",
                  "launch__occupancy_limit_registers", "launch__occupancy_limit_blocks",
                  "launch__occupancy_limit_warps", "launch__occupancy_limit_shared_mem",
                  "sm__maximum_warps_per_active_cycle_pct")


def known_metrics(metrics, ncu: str) -> tuple:
    """`metrics` less those this Nsight Compute (the executable `ncu`) does not know on this
    machine's GPU: one unknown metric would fail the whole run. A metric's base name is the part
    before its first dot. LAUNCH_METRICS are kept: the query does not list them."""
    import subprocess
    listed = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True,
                            timeout=300).stdout
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    return tuple(m for m in metrics if m.split(".")[0] in names or m in LAUNCH_METRICS)


def profile_main(argv, script: str, launches: Callable, check: Callable,
                 metrics: tuple = WARP_STATE_METRICS) -> int:
    """The command line of a probe that Nsight Compute profiles with `metrics`
    (benchmarks/decode_ncu.py, puzzle9_ncu.py, te_ncu.py, mrope_angles_ncu.py): `--metrics`
    prints the metric list
    (with `--ncu PATH`, only those that Nsight Compute knows here: known_metrics); `--check`
    runs `check(calls, extra, device)` (any machine: a GPU, or Triton's interpreter) and prints
    what it returns; otherwise, on a CUDA GPU, each of the calls once under the profiler
    (`profiled_launches`). `launches(device)` -> ([(label, call), ...], extra)."""
    if "--metrics" in argv:
        ncu = argv[argv.index("--ncu") + 1] if "--ncu" in argv else None
        print(",".join(known_metrics(metrics, ncu) if ncu else metrics))
        return 0
    device = "cuda" if torch.cuda.is_available() and not runtime.INTERPRET else "cpu"
    calls, extra = launches(device)
    if "--check" in argv:
        print(check(calls, extra, device))
        return 0
    if device != "cuda":
        print(f"{script} profiles on a CUDA GPU; --check runs on a CPU", file=sys.stderr)
        return 2
    profiled_launches([call for _, call in calls])
    return 0


def profiled_launches(calls, warmup: int = 3) -> None:
    """Run each of `calls` `warmup` times (compiled and planned), then each once more between
    cudaProfilerStart and cudaProfilerStop, synchronised: what Nsight Compute profiles with
    `--profile-from-start off`, one record per launch, in order."""
    for call in calls:
        for _ in range(warmup):
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def write_csv(rows, path, meta=None, fields=None) -> str:
    """Rows to CSV; ``meta`` (e.g. :func:`environment_meta`) as leading ``# key: value`` lines.
    ``fields``: the columns, in order (a benchmark's own); by default the comparison rows'
    ``ROW_FIELDS`` and then any other keys the rows have. A missing value is an empty cell."""
    rows = list(rows)
    if fields is None:
        if not rows:
            raise ValueError("rows must not be empty")
        fields = list(ROW_FIELDS) + sorted({k for r in rows for k in r} - set(ROW_FIELDS))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        for k, v in (meta or {}).items():
            f.write(f"# {k}: {str(v).replace(chr(10), ' ')}\n")
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")   # (one line ending)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r.get(k) for k in fields})
    return str(path)


_STRING_FIELDS = ("provider", "reason", "device", "timing", "dtype", "layout")


def _parse(v: str, key: str = ""):
    if key in _STRING_FIELDS:
        return v
    if v == "":
        return None
    if v in ("True", "False"):
        return v == "True"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def note_read(path) -> None:
    """Append `path` to the file named by ROPELIB_DATA_READS, when set: benchmarks/
    run_notebooks.py sets it while it executes a notebook, so that a rendered page records the
    committed data its outputs came from (and tests/test_executed_pages.py can tell a page whose
    data have changed since). Every reader of committed measurements calls this."""
    log = os.environ.get("ROPELIB_DATA_READS")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(str(Path(path).resolve()) + "\n")


def read_meta(path) -> dict:
    """The ``# key: value`` header of a CSV written by :func:`write_csv`."""
    note_read(path)
    meta = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("# "):
                break
            k, _, v = line[2:].rstrip("\n").partition(": ")
            meta[k] = v
    return meta


def read_csv(path) -> list:
    """Rows of a CSV written by :func:`write_csv`, values parsed back to int/float/bool/None."""
    note_read(path)
    with open(path, newline="") as f:
        lines = [ln for ln in f if not ln.startswith("# ")]
    rows = []
    for r in csv.DictReader(lines):
        row = {k: _parse(v, k) for k, v in r.items()}
        if isinstance(row.get("rotary_percent"), int):
            row["rotary_percent"] = float(row["rotary_percent"])
        rows.append(row)
    return rows


# --- plots ------------------------------------------------------------------------------------

def plot_sweep(rows, axis: str, *, metric: str = "fwd_gbps", ax=None, title=None,
               group=("provider",), show_copy: bool = True):
    """Draw ``metric`` vs ``axis`` per provider (and extra ``group`` fields) with matplotlib.
    For GB/s metrics, ``show_copy`` adds the GB/s the same bytes would reach at the speed of
    the copy measured in the same run (the floor a memory-bound kernel aims at)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ratio = {"fwd_gbps": "ratio_fwd", "fwdbwd_gbps": "ratio_fwdbwd"}.get(metric)
    if show_copy and ratio:
        floor = {}
        for r in rows:
            if r.get(metric) and r.get(ratio) and r[axis] not in floor:
                floor[r[axis]] = r[metric] / r[ratio]
        if floor:
            xs = sorted(floor)
            ax.plot(xs, [floor[x] for x in xs], ls="--", color="gray", label="copy speed")
    series = {}
    for r in rows:
        if r.get(metric) is None or not r.get("available"):
            continue
        key = " ".join(str(r[g]) if g == "provider" else f"{g}={r[g]}" for g in group)
        series.setdefault(key, []).append((r[axis], r[metric]))
    for key, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
    ax.set_xlabel(axis)
    ax.set_ylabel(metric)
    timing = {r.get("timing") for r in rows}
    t = title or f"{metric} vs {axis}"
    if TIMING_CPU in timing:
        t += "\n(CPU interpreter: timings meaningless)"
    ax.set_title(t, fontsize=9)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    return ax


# --- sweeps from earlier studies -------------------------------------------------------------

SEED_PROVIDERS = ("ropelib", "ropelib_batch_reuse", "te_fused", "te_unfused", "pytorch",
                  "torch.compile")


@dataclass(frozen=True)
class SeedSweep:
    """A sweep from the earlier projects, reproduced: ``sweep(base, axis, values, providers)``."""
    name: str
    base: Config
    axis: str
    values: tuple
    providers: tuple = SEED_PROVIDERS
    note: str = ""


def _seed_sweeps() -> tuple:
    out = []
    # Seed 2: GB/s vs seq_len at head_num 64, head_dim 128, batch 1/2/4/8 (RTX 2070 Super).
    for dtype in ("fp32", "bf16"):
        for b in (1, 2, 4, 8):
            out.append(SeedSweep(f"seq_len-b{b}-{dtype}", Config(256, b, 64, 128, dtype),
                                 "seq_len", tuple(range(256, 4096, 256)),
                                 ("ropelib", "ropelib_batch_reuse", "te_fused", "pytorch"),
                                 note="seed 2: batch-reuse grid vs TE, head_num 64, head_dim 128"))
    # Seed 3: Triton fused vs CUDA fused (TE) vs PyTorch unfused over each axis.
    base = Config(2048, 2, 32, 128, "bf16")
    note = "seed 3: Triton fused vs TE fused vs PyTorch unfused"
    out += [SeedSweep("seq-bf16", base, "seq_len", (512, 1024, 2048, 4096, 8192), note=note),
            SeedSweep("hidden-bf16", base, "head_dim", (64, 128, 256), note=note),
            SeedSweep("heads-bf16", base, "heads", (8, 16, 32, 64), note=note),
            SeedSweep("batch-bf16", base, "batch", (1, 2, 4, 8, 16), note=note)]
    return tuple(out)


SEED_SWEEPS = _seed_sweeps()


def shrink(sweep_def: SeedSweep, seq_len=16, batch=None, heads=2, head_dim=16,
           n_values=3) -> SeedSweep:
    """A tiny copy of a seed sweep for the CPU interpreter (same axis, first values scaled)."""
    scale = {"seq_len": seq_len, "batch": batch or min(sweep_def.base.batch, 2),
             "heads": heads, "head_dim": head_dim}
    base = dataclasses.replace(sweep_def.base, **scale)
    tiny = {"seq_len": (4, 8, 16, 32), "head_dim": (8, 16, 32), "heads": (1, 2, 4),
            "batch": (1, 2, 4)}.get(sweep_def.axis, sweep_def.values)
    return dataclasses.replace(sweep_def, base=base, values=tuple(tiny[:n_values]))
