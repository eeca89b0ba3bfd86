"""Multi-axis RoPE: M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) and 2-D / 3-D axial RoPE.

A token of an image or a video has more than one position: its frame t, its row h and its
column w. Multi-axis RoPE gives each frequency pair of the rotary half one of those axes: pair j
turns by pos[a_j] * w_j. What differs between the variants is which pair follows which axis and
at which inverse frequency w_j (`multi_axis_frequencies` builds both, as an `AxisFrequencies`):

* "mrope" (Qwen2-VL, Qwen2.5-VL): one frequency ladder w_j = base^(-2j/R) over the whole rotary
  dim, cut into contiguous sections, `mrope_section` = pairs per axis, e.g. [16, 24, 24] for
  d = 128: pairs 0-15 follow t, 16-39 follow h, 40-63 follow w. A text token has t = h = w, so
  it gets plain 1-D RoPE.
* "mrope_interleaved" (Qwen3-VL): the same ladder, axes assigned round-robin so every axis gets
  high and low frequencies: pair j follows axis a >= 1 when j % n_axes == a and
  j < n_axes * section[a], and axis 0 otherwise ([24, 20, 20]: t h w t h w ... t t t t).
* "axial" (Qwen2-VL's vision encoder for 2-D (row, column); 3-D (t, h, w) for video models):
  contiguous sections, each axis with its own ladder base^(-2i / (2 section[a])).

Positions are a [n_axes, tokens] (thd, or shared by the batch) or [n_axes, B, S] int tensor, as
transformers' Qwen2-VL builds them ([3, B, S]); `grid_positions` gives those of an image or
video grid. The kernel (ropelib.kernels.mrope) forms the angles itself from the positions and the
[R/2] frequencies: no [n_axes, B, S, R] cos/sin tensor is built.

    ropelib.apply_mrope(x, positions, freqs, layout="bshd")          one tensor
    ropelib.apply_mrope_qk(q, k, positions, freqs, layout="bshd")    q and k in one launch
    ropelib.MultiAxisRotaryEmbedding(head_dim, section, style=...)   an nn.Module
    ropelib.hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section)   transformers 4.x

Operators (ropelib.ops' registration: a triton_op on GPUs, a custom_op in the interpreter, each
with a fake implementation and an autograd formula; the backward is the same operator rotating
by -theta, itself differentiable):
    torch.ops.ropelib.mrope(x, positions, inv_freq, axis, layout, interleaved, backward) -> y
    torch.ops.ropelib.mrope_qk(q, k, positions, inv_freq, axis, layout, interleaved, backward)
        -> (q', k')
with positions [n_axes, B or 1, S] (thd: [n_axes, 1, T]), which the kernel reads contiguous (the
operators make a contiguous copy of other strides; positions expanded over the batch are read
as [n_axes, 1, S]).

Supported: layouts sbhd, bshd, thd (packed: positions per token); fp16, bf16, fp32, fp64 (math in
fp32, fp64 for fp64); partial rotary (R < D: features R..D-1 pass through); both pairings
(rotate-half as transformers, interleaved); GQA (any head counts for q and k); 1 to 4 axes; any
inverse frequencies (so linear / NTK / Llama-3 scaled ladders, passed as `inv_freq`). Not
supported: in-place output, per-batch frequencies, YaRN's attention factor (cos/sin scaled by a
constant), gradients for the frequencies.
"""
import math
import numbers
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from . import eager
from . import validation as V
from .api import check_no_table_grad, needs_grad, saveable
from .frequencies import _default_inv_freq
from .kernels import mrope as kernel
from .kernels.mrope import MAX_AXES
from .ops import define_op, view4

__all__ = ["AxisFrequencies", "multi_axis_frequencies", "axis_of_pairs", "grid_positions",
           "apply_mrope", "apply_mrope_qk", "MultiAxisRotaryEmbedding", "STYLES"]

STYLES = ("mrope", "mrope_interleaved", "axial")


class AxisFrequencies(NamedTuple):
    """Which axis each frequency pair follows, and how fast.

    inv_freq: [R/2] float32 (or float64) inverse frequencies, pair j turns by pos[axis[j]] *
        inv_freq[j]; axis: [R/2] int32 in [0, n_axes); n_axes: how many position rows the
        positions must have."""
    inv_freq: Tensor
    axis: Tensor
    n_axes: int

    @property
    def rotary_dim(self) -> int:
        return 2 * self.inv_freq.shape[0]

    def to(self, device) -> "AxisFrequencies":
        return AxisFrequencies(self.inv_freq.to(device), self.axis.to(device), self.n_axes)


# --- frequencies and positions --------------------------------------------------------------

def _check_section(section, half: Optional[int]) -> list:
    if isinstance(section, Tensor):
        section = section.tolist()
    if not isinstance(section, (list, tuple)) or not section:
        raise TypeError(f"section must be a non-empty list of ints (pairs per axis), got "
                        f"{section!r}")
    for n in section:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"section must hold ints >= 0 (frequency pairs per axis), got "
                             f"{list(section)}")
    if len(section) > MAX_AXES:
        raise ValueError(f"at most {MAX_AXES} axes are supported, section has {len(section)}")
    if half is not None and sum(section) != half:
        raise ValueError(f"section {list(section)} sums to {sum(section)} pairs, but the rotary "
                         f"dim {2 * half} has {half} frequency pairs: the sections must cover "
                         "them exactly (Qwen2-VL: [16, 24, 24] for head dim 128)")
    return [int(n) for n in section]


def axis_of_pairs(section: Sequence[int], style: str = "mrope") -> Tensor:
    """[sum(section)] int32: the axis that frequency pair j follows.

    "mrope" and "axial": contiguous runs, section[0] pairs of axis 0, then section[1] of axis
    1, ...; "mrope_interleaved" (Qwen3-VL): pair j follows axis a >= 1 when
    j % len(section) == a and j < len(section) * section[a], else axis 0."""
    section = _check_section(section, None)
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    half, n = sum(section), len(section)
    if style != "mrope_interleaved":
        return torch.repeat_interleave(torch.arange(n, dtype=torch.int32),
                                       torch.tensor(section)).to(torch.int32)
    j = torch.arange(half)
    axis = torch.zeros(half, dtype=torch.int32)
    for a in range(1, n):
        axis[(j % n == a) & (j < n * section[a])] = a
    counts = torch.bincount(axis.long(), minlength=n).tolist()
    if counts != section:
        raise ValueError(f"section {section} cannot be interleaved round-robin over {half} "
                         f"pairs (the axes would get {counts} pairs): the last pair of axis "
                         f"a >= 1, a + {n} * (section[a] - 1), must be < {half}")
    return axis


def multi_axis_frequencies(rotary_dim: int, section: Sequence[int], base: float = 10000.0, *,
                           style: str = "mrope", inv_freq: Optional[Tensor] = None,
                           device=None) -> AxisFrequencies:
    """The frequencies and axes of multi-axis RoPE.

    Args:
        rotary_dim: R, the rotated features per head (the head dim, or less for partial rotary).
        section: frequency pairs per axis, summing to R/2: Qwen2-VL [16, 24, 24] (R = 128),
            Qwen3-VL [24, 20, 20]; 2-D axial for head dim 64: [16, 16].
        base: the RoPE base (transformers' rope_theta).
        style: "mrope" (Qwen2-VL), "mrope_interleaved" (Qwen3-VL) or "axial" (one ladder per
            axis). See the module docstring.
        inv_freq: [R/2] inverse frequencies to use instead of base's ladder (a scaled ladder
            from ropelib.frequencies, or a model's own buffer); not with style="axial".
        device: where the two [R/2] tensors live.
    Returns:
        AxisFrequencies(inv_freq [R/2] float32, axis [R/2] int32, n_axes).
    """
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral) \
            or rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be an even int >= 2, got {rotary_dim!r}")
    half = rotary_dim // 2
    section = _check_section(section, half)
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not math.isfinite(base) \
            or base <= 1:
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    axis = axis_of_pairs(section, style)
    if inv_freq is not None:
        if style == "axial":
            raise ValueError("inv_freq is for the 'mrope' styles (one ladder); 'axial' builds "
                             "one ladder per axis from base")
        V.check_tensor(inv_freq, "inv_freq", dims=(1,), dtypes=V.ANGLE_DTYPES)
        if inv_freq.shape[0] != half:
            raise ValueError(f"inv_freq must be [{half}] (rotary_dim / 2), got "
                             f"{tuple(inv_freq.shape)}")
        freqs = inv_freq.detach()
    elif style == "axial":
        freqs = torch.cat([_default_inv_freq(2 * n, float(base)) for n in section if n])
    else:
        freqs = _default_inv_freq(rotary_dim, float(base))
    return AxisFrequencies(freqs.to(device).contiguous(), axis.to(device), len(section))


def grid_positions(t: int, h: int, w: int, *, start: int = 0, axes: int = 3,
                   device=None) -> Tensor:
    """[axes, t*h*w] int64 positions of a video (t frames of h x w patches) in raster order
    (frame, then row, then column), each axis offset by `start`.

    axes=3: rows (time, row, column), as Qwen2-VL's M-RoPE gives an image or video after the
    text before it (start = the next text position); axes=2: (row, column) of one frame, for 2-D
    axial RoPE (t must be 1)."""
    for name, v in (("t", t), ("h", h), ("w", w)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if axes not in (2, 3):
        raise ValueError(f"axes must be 2 (row, column) or 3 (time, row, column), got {axes!r}")
    if axes == 2 and t != 1:
        raise ValueError(f"axes=2 gives the (row, column) positions of one frame: t must be 1, "
                         f"got {t}")
    tt, hh, ww = torch.meshgrid(torch.arange(t, device=device), torch.arange(h, device=device),
                                torch.arange(w, device=device), indexing="ij")
    rows = (tt, hh, ww) if axes == 3 else (hh, ww)
    return torch.stack([r.reshape(-1) for r in rows]) + start


# --- the operators --------------------------------------------------------------------------

@define_op("ropelib::mrope")
def mrope_op(x: Tensor, positions: Tensor, inv_freq: Tensor, axis: Tensor, layout: str,
             interleaved: bool, backward: bool) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    kernel.launch(view4(x, layout), view4(y, layout), _positions3(positions), inv_freq, axis,
                  interleaved=interleaved, backward=backward, layout=layout)
    return y


@define_op("ropelib::mrope_qk")
def mrope_qk_op(q: Tensor, k: Tensor, positions: Tensor, inv_freq: Tensor, axis: Tensor,
                layout: str, interleaved: bool, backward: bool) -> Tuple[Tensor, Tensor]:
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    kernel.launch(view4(q, layout), view4(q_out, layout), _positions3(positions), inv_freq,
                  axis, interleaved=interleaved, backward=backward, layout=layout,
                  k4=view4(k, layout), k_out4=view4(k_out, layout))
    return q_out, k_out


# The backward of a rotation is the rotation by -theta, with the same positions and frequencies.

def _setup(ctx, inputs, output):
    x, positions, inv_freq, axis, *options = inputs
    ctx.save_for_backward(positions, inv_freq, axis)
    ctx.options = options   # layout, interleaved, backward


def _backward(ctx, grad):
    layout, interleaved, backward = ctx.options
    return (mrope_op(grad, *ctx.saved_tensors, layout, interleaved, not backward),
            None, None, None, None, None, None)


def _setup_qk(ctx, inputs, output):
    q, k, positions, inv_freq, axis, *options = inputs
    ctx.save_for_backward(positions, inv_freq, axis)
    ctx.options = options


def _backward_qk(ctx, grad_q, grad_k):
    layout, interleaved, backward = ctx.options
    opts = (layout, interleaved, not backward)
    if grad_q is not None and grad_k is not None:
        gq, gk = mrope_qk_op(grad_q, grad_k, *ctx.saved_tensors, *opts)
    else:   # an output that took no part in the loss
        gq = mrope_op(grad_q, *ctx.saved_tensors, *opts) if grad_q is not None else None
        gk = mrope_op(grad_k, *ctx.saved_tensors, *opts) if grad_k is not None else None
    return (gq, gk) + (None,) * 6


mrope_op.register_autograd(_backward, setup_context=_setup)
mrope_qk_op.register_autograd(_backward_qk, setup_context=_setup_qk)


# --- argument checks ------------------------------------------------------------------------

def _check_freqs(freqs, ref: Tensor, ref_name: str, D: int) -> AxisFrequencies:
    if not isinstance(freqs, AxisFrequencies):
        raise TypeError(f"freqs must be an AxisFrequencies (ropelib.multi_axis_frequencies), "
                        f"got {type(freqs).__name__}")
    inv, axis, n_axes = freqs
    V.check_tensor(inv, "freqs.inv_freq", dims=(1,), dtypes=V.ANGLE_DTYPES)
    V.check_int_tensor(axis, "freqs.axis", dims=(1,))
    if axis.shape != inv.shape:
        raise ValueError(f"freqs.axis {tuple(axis.shape)} and freqs.inv_freq "
                         f"{tuple(inv.shape)} must have one entry per frequency pair each")
    if isinstance(n_axes, bool) or not isinstance(n_axes, int) or not 1 <= n_axes <= MAX_AXES:
        raise ValueError(f"freqs.n_axes must be an int in [1, {MAX_AXES}], got {n_axes!r}")
    V.check_same_device(ref, ref_name, **{"freqs.inv_freq": inv, "freqs.axis": axis})
    V.check_rotary_dim(2 * inv.shape[0], D, "freqs")
    check_no_table_grad(("freqs.inv_freq", inv))
    if V.values_checkable(axis):
        _check_axis_values(axis, n_axes)
    return _kernel_freqs(freqs)


def _kernel_freqs(freqs: AxisFrequencies) -> AxisFrequencies:
    """The frequencies as the kernel reads them: contiguous, axes int32."""
    inv, axis, n_axes = freqs
    return AxisFrequencies(inv.contiguous(), axis.to(torch.int32).contiguous(), n_axes)


def _positions3(positions: Tensor) -> Tensor:
    """[n_axes, S] (shared by the batch, or thd) -> [n_axes, 1, S]; [n_axes, B, S] as is, or
    [n_axes, 1, S] when expanded over the batch (stride 0). Contiguous, as the kernel reads
    them (a no-op for the usual input)."""
    if positions.dim() == 2:
        positions = positions.unsqueeze(1)
    elif positions.shape[1] > 1 and positions.stride(1) == 0:
        positions = positions[:, :1]
    return positions.contiguous()


def _check_axis_values(axis: Tensor, n_axes: int) -> None:
    if axis.numel():
        lo, hi = torch.stack([axis.min(), axis.max()]).tolist()
        if lo < 0 or hi >= n_axes:
            raise ValueError(f"freqs.axis must lie in [0, {n_axes}), got values in [{lo}, {hi}]")


def _check_positions(positions, n_axes: int, layout: str, S: int, B: int, ref: Tensor,
                     ref_name: str) -> Tensor:
    """positions [n_axes, S] / [n_axes, B or 1, S] (thd: [n_axes, T]) -> [n_axes, B or 1, S],
    contiguous (see _positions3)."""
    V.check_int_tensor(positions, "positions", dims=(2,) if layout == "thd" else (2, 3))
    V.check_same_device(ref, ref_name, positions=positions)
    positions = _positions3(positions)
    if positions.shape[0] != n_axes or positions.shape[2] != S \
            or positions.shape[1] not in (1, B):
        want = f"[{n_axes}, {S}]" if layout == "thd" else \
            f"[{n_axes}, {S}] or [{n_axes}, {B} or 1, {S}]"
        raise ValueError(f"positions must be {want} (one row per axis, one position per token) "
                         f"for layout={layout!r}, got {tuple(positions.shape)}")
    return positions


def _prepare(xs, names, positions, freqs, layout, interleaved):
    V.check_no_grad_transform("the multi-axis RoPE")
    if layout not in V.LAYOUTS:
        raise ValueError(f"layout must be one of {V.LAYOUTS}, got {layout!r}")
    for t, name in zip(xs, names):
        V.check_tensor(t, name)
        V.check_layout(t, layout, name)
        V.check_kernel_device(t, name)
    V.check_bool(interleaved, "interleaved")
    ref = xs[0]
    if len(xs) > 1:
        q, k = xs
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
        V.check_same_device(q, "q", k=k)
        q4, k4 = view4(q, layout), view4(k, layout)
        if (q4.shape[0], q4.shape[1], q4.shape[3]) != (k4.shape[0], k4.shape[1], k4.shape[3]):
            raise ValueError(f"q and k must agree in sequence, batch and head dim, got "
                             f"{tuple(q.shape)} and {tuple(k.shape)} ({layout})")
    x4 = view4(ref, layout)
    S, B, D = x4.shape[0], x4.shape[1], x4.shape[3]
    freqs = _check_freqs(freqs, ref, names[0], D)
    positions = _check_positions(positions, freqs.n_axes, layout, S, B, ref, names[0])
    if needs_grad(*xs):
        positions, inv, axis = (saveable(t) for t in (positions, freqs.inv_freq, freqs.axis))
        freqs = AxisFrequencies(inv, axis, freqs.n_axes)
    return positions, freqs


# --- the eager route ------------------------------------------------------------------------
# As for ropelib.apply_rope (ropelib.eager): a plain eager call is checked and planned once per
# signature, then goes straight to the compiled kernel; gradients through eager.Rotate, whose
# backward is the same route rotating back.

class _Route:
    """One checked and planned call of the multi-axis kernel (q, or q and k): the launch, and
    the launches back for gradients of given strides. `used`: (positions, inv_freq, axis)."""
    __slots__ = ("start", "n", "layout", "interleaved", "backward", "empty", "_used",
                 "_reverses")
    whole_grads = False     # (eager.Rotate: a missing gradient is simply not rotated)

    def __init__(self, xs, used, layout: str, interleaved: bool, backward: bool):
        positions, inv, axis = used
        outs = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs]
        x4, o4 = [view4(t, layout) for t in xs], [view4(t, layout) for t in outs]
        planned, _ = kernel.plan(x4[0], o4[0], positions, inv, axis, interleaved=interleaved,
                                 backward=backward, layout=layout,
                                 k4=x4[1] if len(xs) > 1 else None,
                                 k_out4=o4[1] if len(xs) > 1 else None)
        self.start = eager.EagerLaunch(kernel.DIRECT, planned)
        self.n, self.layout, self.interleaved, self.backward = len(xs), layout, interleaved, \
            backward
        self.empty = x4[0].shape[0] == 0 or x4[0].shape[1] == 0
        self._used = tuple(eager._stand_in(t) for t in used)   # shapes and strides, no data
        self._reverses = {}

    def run(self, xs: tuple, used: tuple) -> tuple:
        outs = tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs)
        if not self.empty:
            k, k_out = (xs[1], outs[1]) if self.n > 1 else (None, None)
            self.start(kernel.kernel_pointers(xs[0], outs[0], k, k_out, *used))
        return outs

    def reverse(self, grads: tuple) -> "_Route":
        """The rotation back for gradients with these strides (q's and k's, either None)."""
        key = tuple(None if g is None else g.stride() for g in grads)
        rev = self._reverses.get(key)
        if rev is None:
            present = tuple(g for g in grads if g is not None)
            rev = self._reverses[key] = _Route(present, self._used, self.layout,
                                               self.interleaved, not self.backward)
        return rev


def _eager_call(xs: tuple, positions, freqs, layout, interleaved):
    """The eager route's result, or None when the call must take the checked operator path
    (first call of a signature, a tracer at work, something the signature cannot hold)."""
    if not eager.active() or not isinstance(freqs, AxisFrequencies) \
            or not isinstance(positions, Tensor):
        return None
    inv, axis, n_axes = freqs
    head = ("mrope", layout, type(layout), interleaved, type(interleaved), n_axes, type(n_axes))
    sig = eager.signature(head, (*xs, positions, inv, axis))
    if sig is None:
        return None
    route = eager.SIGNATURES.get(sig)
    if route is None:
        positions, freqs = _prepare(xs, ("q", "k") if len(xs) == 2 else ("x",), positions,
                                    freqs, layout, interleaved)
        route = eager.SIGNATURES.put(sig, _Route(xs, (positions, freqs.inv_freq, freqs.axis), layout,
                                        interleaved, False))
    else:       # checked before: only the values of host index tensors are new
        if V.values_checkable(axis):
            _check_axis_values(axis, n_axes)
        positions, freqs = _positions3(positions), _kernel_freqs(freqs)
    reads = (positions, freqs.inv_freq, freqs.axis)       # what the kernel reads besides xs
    if needs_grad(*xs):
        return eager.rotate(route, tuple(map(saveable, reads)), *xs)
    outs = route.run(xs, reads)
    return outs if len(outs) > 1 else outs[0]


# --- the public functions -------------------------------------------------------------------

def apply_mrope(x: Tensor, positions: Tensor, freqs: AxisFrequencies, *, layout: str = "bshd",
                interleaved: bool = False) -> Tensor:
    """Multi-axis RoPE of one tensor (autograd-aware; backward = the same kernel by -theta).

    Args:
        x: [B, S, H, D] (bshd), [S, B, H, D] (sbhd) or [T, H, D] (thd, packed); any strides;
            fp16, bf16, fp32 or fp64.
        positions: int [n_axes, S] (shared by the batch) or [n_axes, B, S] (thd: [n_axes, T]):
            each token's position on every axis (ropelib.mrope.grid_positions for a grid).
        freqs: ropelib.multi_axis_frequencies(...): inverse frequency and axis of each pair.
        layout: "bshd", "sbhd" or "thd".
        interleaved: pair features (2j, 2j+1) instead of (j, j + R/2) (transformers' rotate_half).
    Returns:
        y shaped like x (contiguous in `layout`), in x's dtype; features R..D-1 copied.
    """
    out = _eager_call((x,), positions, freqs, layout, interleaved)
    if out is not None:
        return out
    positions, freqs = _prepare((x,), ("x",), positions, freqs, layout, interleaved)
    return mrope_op(x, positions, freqs.inv_freq, freqs.axis, layout, interleaved, False)


def apply_mrope_qk(q: Tensor, k: Tensor, positions: Tensor, freqs: AxisFrequencies, *,
                   layout: str = "bshd", interleaved: bool = False) -> Tuple[Tensor, Tensor]:
    """Multi-axis RoPE of q and k in one launch (k may have fewer heads: GQA).

    Arguments as `apply_mrope`; q and k share layout, sequence, batch, head dim and dtype.
    Returns (q', k')."""
    out = _eager_call((q, k), positions, freqs, layout, interleaved)
    if out is not None:
        return out
    positions, freqs = _prepare((q, k), ("q", "k"), positions, freqs, layout, interleaved)
    return mrope_qk_op(q, k, positions, freqs.inv_freq, freqs.axis, layout, interleaved, False)


class MultiAxisRotaryEmbedding(nn.Module):
    """Multi-axis RoPE as a module: holds the frequencies and axes as buffers.

    MultiAxisRotaryEmbedding(128, [16, 24, 24], 1e6)                     Qwen2-VL / Qwen2.5-VL
    MultiAxisRotaryEmbedding(128, [24, 20, 20], 5e6, style="mrope_interleaved")   Qwen3-VL
    MultiAxisRotaryEmbedding(64, [16, 16], 1e4, style="axial")           2-D (row, column)

    forward(q, k, positions) -> (q', k'); forward(x, None, positions) -> x'. `rotary_dim`
    (default head_dim) below head_dim gives partial rotary.

    The frequencies stay float32 whatever the module is converted to (`.to(torch.bfloat16)`,
    `.half()`, `.double()`): rounded to 16 bits they would be off by radians at long
    positions, and float64 ones would make the kernel compute in float64 for every input.
    """

    def __init__(self, head_dim: int, section: Sequence[int], base: float = 10000.0, *,
                 style: str = "mrope", rotary_dim: Optional[int] = None, layout: str = "bshd",
                 interleaved: bool = False, device=None):
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2:
            raise ValueError(f"head_dim must be an int >= 2, got {head_dim!r}")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not isinstance(rotary_dim, int) or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be an int <= head_dim ({head_dim}), got "
                             f"{rotary_dim!r}")
        if layout not in V.LAYOUTS:
            raise ValueError(f"layout must be one of {V.LAYOUTS}, got {layout!r}")
        V.check_bool(interleaved, "interleaved")
        f = multi_axis_frequencies(rotary_dim, section, base, style=style, device=device)
        self.register_buffer("inv_freq", f.inv_freq, persistent=False)
        self.register_buffer("axis", f.axis, persistent=False)
        self.n_axes, self.head_dim, self.rotary_dim = f.n_axes, head_dim, rotary_dim
        self.section, self.base, self.style = list(section), float(base), style
        self.layout, self.interleaved = layout, interleaved

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() would round the frequencies: keep them as built, moved to the
        # device the module went to.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != inv_freq.dtype:
            self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    @property
    def freqs(self) -> AxisFrequencies:
        return AxisFrequencies(self.inv_freq, self.axis, self.n_axes)

    def forward(self, q: Tensor, k: Optional[Tensor], positions: Tensor):
        if k is None:
            return apply_mrope(q, positions, self.freqs, layout=self.layout,
                               interleaved=self.interleaved)
        return apply_mrope_qk(q, k, positions, self.freqs, layout=self.layout,
                              interleaved=self.interleaved)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
                f"section={self.section}, base={self.base}, style={self.style!r}, "
                f"layout={self.layout!r}, interleaved={self.interleaved}")
