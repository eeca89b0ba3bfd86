"""Notebook 08's exercise (section 4b): a combine line that gives Transformer Engine's bits.

The section's kernel, `_rope_combine_kernel`, rotates the rows of an sbhd tensor in fp32 and
leaves one line to a `@triton.jit` function it is handed as a constexpr,
``COMBINE(x1, x2, c, s) -> (y1, y2)``: the line ``y = x c + rot s`` with ``rot = -x2`` in the
first half and ``x1`` in the second. The learner writes that function so that the kernel's
output equals TE's fused RoPE bit for bit.

`check_te_combine(fn)` launches the kernel with the learner's combine on the two cases notebook
08 compares with TE, read from the committed GPU measurements
(``benchmarks/results/te-bits-<gpu>.pt``, inputs drawn again and checked against the stored
hashes): ``nb_cpu_fp32``, fp32 S=32 B=2 H=2 D=32, where every rounding shows, and ``nb_gpu``,
bf16 S=512 B=2 H=8 D=128. Cos and sin are TE's own (read back from TE on the GPU), so only the
combine can differ; the output is rounded once to the input dtype and its bits are compared with
TE's stored output. It passes when no element differs in either case, and prints how many do
otherwise.

The line counts as written: in Triton's interpreter (a CPU) every product is rounded unless the
line fuses it with ``tl.fma``; compiled (a GPU), the kernel is built with
``enable_fp_fusion=False``, so no compiler contracts what the line leaves unfused (the file's
``-nofuse`` rows: the same counts as the interpreter's). The plain ``x1 * c - x2 * s``, which a
GPU compiler may contract either way, fails on every machine.

The launch runs with ropelib's own answers barred (`own_code`): a combine that is, or calls, one
of ropelib's ``@triton.jit`` helpers (``ropelib.kernels.common.rotate_pair`` computes this very
line, and so does ``debug._fused_pair``, the reproduction kernel's fma line) or the worked
solution below is refused.
"""
import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ... import runtime
from .. import debug
from . import exception_line, is_blank_kernel, is_kernel
from .own_code import launch_barred

__all__ = ["check_te_combine", "solution_te_combine", "launch", "CASE_KEYS", "te_cases"]

# the te-bits scenarios the check compares: fp32 first (cheap, every rounding visible), then the
# notebook's bf16 comparison at the GPU size
CASE_KEYS = ("nb_cpu_fp32", "nb_gpu")


@triton.jit
def _rope_combine_kernel(
    x_ptr,  # *x: input [S, B, H, D], sbhd, contiguous
    y_ptr,  # *y: output [S, B, H, D], fp32, contiguous (the caller rounds it to x's dtype)
    ang_ptr,  # *fp32: angles [S, D/2], read unless SINCOS == "table"
    cos_ptr, sin_ptr,  # *fp32: cos and sin [S, D/2], read when SINCOS == "table"
    n_rows,  # S * B * H: rows of D features
    rows_per_pos,  # B * H: the rows of one position (sbhd: row = (s*B + b)*H + h)
    HALF: tl.constexpr,  # D // 2, a power of two
    BLOCK_ROWS: tl.constexpr,  # rows per program
    SINCOS: tl.constexpr,  # "tl", "libdevice" or "fast" (GPU only): computed here; "table": read
    COMBINE: tl.constexpr,  # @triton.jit (x1, x2, c, s) -> (y1, y2): the line y = x c + rot s
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]   # [BLOCK_ROWS, 1]
    j = tl.arange(0, HALF)[None, :]                                            # [1, HALF]
    m = row < n_rows
    pos = row // rows_per_pos
    x1 = tl.load(x_ptr + row * 2 * HALF + j, mask=m).to(tl.float32)
    x2 = tl.load(x_ptr + row * 2 * HALF + HALF + j, mask=m).to(tl.float32)
    if SINCOS == "table":                           # where cos and sin come from
        c = tl.load(cos_ptr + pos * HALF + j, mask=m)
        s = tl.load(sin_ptr + pos * HALF + j, mask=m)
    else:
        theta = tl.load(ang_ptr + pos * HALF + j, mask=m)
        if SINCOS == "tl":
            c = tl.cos(theta)
            s = tl.sin(theta)
        elif SINCOS == "libdevice":                 # CUDA's precise cosf / sinf
            c = libdevice.cos(theta)
            s = libdevice.sin(theta)
        else:                                       # "fast": the cos.approx / sin.approx units
            c = libdevice.fast_cosf(theta)
            s = libdevice.fast_sinf(theta)
    y1, y2 = COMBINE(x1, x2, c, s)
    tl.store(y_ptr + row * 2 * HALF + j, y1, mask=m)
    tl.store(y_ptr + row * 2 * HALF + HALF + j, y2, mask=m)


def launch(kernel, combine, x: torch.Tensor, angles: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor, sincos: str = "table", block_rows: int = 64,
           **options) -> torch.Tensor:
    """Launch `kernel` (`_rope_combine_kernel`'s signature) with COMBINE=combine on x [S, B, H, D]
    (sbhd, contiguous); angles, cos, sin [S, D/2] fp32 on x's device. Returns y in fp32, NaN
    where the kernel wrote nothing; `options` go to the launch (enable_fp_fusion=False)."""
    S, B, H, D = x.shape
    y = torch.full(x.shape, float("nan"), dtype=torch.float32, device=x.device)
    kernel[(triton.cdiv(S * B * H, block_rows),)](
        x, y, angles, cos, sin, S * B * H, B * H,
        HALF=D // 2, BLOCK_ROWS=block_rows, SINCOS=sincos, COMBINE=combine, **options)
    return y


@functools.lru_cache(maxsize=1)
def te_cases() -> Optional[tuple]:
    """The te-bits cases of CASE_KEYS from the committed file (None when there is none)."""
    path = debug.te_bits_file()
    if path is None:
        return None
    data = debug.load_te_bits(path)
    return tuple(debug.te_bits_case(data, key) for key in CASE_KEYS)


def _label(case) -> str:
    S, B, H, D = case.x.shape
    return f"{str(case.x.dtype).replace('torch.', '')}, S={S} B={B} H={H} D={D}"


def _answer(name: str, fn) -> bool:
    """Print ❌ and return False unless fn is a @triton.jit function with a body."""
    if fn is None or fn is Ellipsis or (is_kernel(fn) and is_blank_kernel(fn)):
        print(f"❌ {name}: no answer yet (write the two lines of the @triton.jit function)")
        return False
    if not is_kernel(fn):
        called = f"{type(fn).__name__} {getattr(fn, '__name__', '')!s}".rstrip()
        print(f"❌ {name}: expected a @triton.jit function (the kernel calls it as COMBINE), "
              f"got {called}")
        return False
    return True


def check_te_combine(fn) -> bool:
    """Launch the section's kernel with the learner's combine on CASE_KEYS' cases and count the
    elements whose bits differ from TE's stored output (see the module's docstring).

    Args:
        fn: a @triton.jit function (x1, x2, c, s) -> (y1, y2), fp32 tiles of one shape.
    Returns:
        True when no element differs from TE's in any case. Prints one line per case; never
        raises.
    """
    name = "combine with TE's bits"
    if not _answer(name, fn):
        return False
    try:
        cases = te_cases()
    except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
        print(f"❌ {name}: could not read TE's stored outputs: {exception_line(exc)}")
        return False
    if cases is None:
        print(f"❌ {name}: benchmarks/results/te-bits-<gpu>.pt is missing: TE's outputs to "
              "compare with come from there")
        return False
    device = runtime.default_device()
    interpreted = not runtime.on_gpu()
    counts, wrong_values = [], False
    for case in cases:
        label = _label(case)
        args = [t.to(device) for t in (case.x, case.angles, case.te_cos, case.te_sin)]
        ok, y = launch_barred(
            name, label, "your combine",
            lambda: launch(_rope_combine_kernel, fn, *args, sincos="table",
                           enable_fp_fusion=False),
            bar=(debug._fused_pair,))      # the reproduction kernel's fma line
        if not ok:
            return False
        y = y.to(case.x.dtype).cpu()
        differ = debug.bits_differ(y, case.te)
        n = int(differ.sum())
        counts.append(n)
        # more than roundings: off by a sizeable part of the inputs' scale (or NaN)
        off = (y.double() - case.te.double()).abs().nan_to_num(float("inf")).max()
        wrong_values |= bool(off > 0.05 * case.x.double().abs().max())
        if n:
            steps = debug.steps_apart(y, case.te)[differ]
            values, times = torch.unique(steps, return_counts=True)
            hist = dict(zip(values.tolist(), times.tolist()))
            print(f"❌ {name} ({label}): {n:,} of {y.numel():,} elements differ from TE's "
                  f"output; {str(case.x.dtype).replace('torch.', '')} steps apart -> count: "
                  f"{dict(list(hist.items())[:6])}" + (" ..." if len(hist) > 6 else ""))
        else:
            print(f"   {label}: 0 of {y.numel():,} elements differ from TE's output")
    where = ("in Triton's interpreter" if interpreted
             else "compiled without contraction (enable_fp_fusion=False)")
    if wrong_values:
        print("   hint: these are not rounding differences, the values are wrong: y1 = x1*c - "
              "x2*s and y2 = x2*c + x1*s (rot = -x2 in the first half, x1 in the second)")
        return False
    if any(counts):
        print("   hint: the values are right, their roundings are not TE's. tl.fma(a, b, d) "
              "computes a*b + d with one rounding: which product enters TE's compiled line "
              "exact?")
        return False
    print(f"✅ {name}: bit for bit with TE's output in both cases ({where})")
    return True


@triton.jit
def solution_te_combine(x1, x2, c, s):
    # TE's contraction, fma(x, c, rot*s): x*c enters the sum exact, rot*s is rounded once
    y1 = tl.fma(x1, c, -(x2 * s))
    y2 = tl.fma(x2, c, x1 * s)
    return y1, y2
