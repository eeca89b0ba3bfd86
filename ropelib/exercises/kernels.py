"""Exercise checks for notebooks 03-05 (the naive kernel, the batch-reusing grid, the backward).

Every `check_...` computes its expected answer from ropelib itself (the kernel modules' grid and
tile helpers, `reference`, `compare`), prints ✅ or ❌ through `ropelib.exercises.check`, returns
a bool and never raises. Helpers that take the learner's *function* try it on several inputs and
report the first one that fails. The worked solutions are the `solution_*` functions below,
shown folded in the notebooks with `ropelib.exercises.solution(kernels.solution_...)`.

Inputs are tiny so that checks which launch a learner's Triton kernel stay fast in the CPU
interpreter.
"""
import math
from typing import Callable, Iterable, Optional

import torch
import triton
import triton.language as tl

from .. import reference, runtime
from ..kernels import batch_reuse, naive
from ..kernels.batch_reuse import rope_batch_reuse
from . import _compare, call_answer, check

__all__ = [
    "check_naive_grid", "check_half_tile", "check_row_index", "check_rope_interleaved",
    "check_angle_bytes", "check_floor_ms", "check_percent_of_copy",
    "check_backward_matrix", "check_rope_backward", "check_rope_function",
    "solution_naive_grid", "solution_half_tile", "solution_row_index", "solution_rope_interleaved",
    "solution_angle_bytes", "solution_floor_ms", "solution_percent_of_copy",
    "solution_backward_matrix", "solution_rope_backward", "SolutionRopeFunction",
    "te_angles",
]


def _cases(name: str, fn: Callable, cases: Iterable, *, hint: Optional[str] = None,
           atol: Optional[float] = None, rtol: Optional[float] = None) -> bool:
    """Run fn(*args) for each (label, args, expected); one ✅ line, or ❌ for the first failure."""
    answer = expected = None
    for label, args, expected in cases:
        ok, answer = call_answer(f"{name} ({label})", fn, *args)
        if not ok:
            return False
        same, _ = _compare(answer, expected, atol, rtol)
        if not same:
            return check(f"{name} ({label})", answer, expected, atol=atol, rtol=rtol, hint=hint)
    return check(name, answer, expected, atol=atol, rtol=rtol, hint=hint)


def te_angles(P: int, D: int, *, interleaved: bool = False, device=None) -> torch.Tensor:
    """TE's fp32 angle table [P, 1, 1, D]: cat(f, f), or f0 f0 f1 f1 ... when interleaved."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    f = torch.outer(torch.arange(P, dtype=torch.float32), inv)
    emb = f.repeat_interleave(2, dim=-1) if interleaved else torch.cat((f, f), dim=-1)
    return emb.view(P, 1, 1, D).to(device or runtime.default_device())


# --- notebook 03: the naive kernel ------------------------------------------------------------

_SHAPES = ((1, 1, 1), (4, 2, 8), (4096, 8, 32), (3, 5, 7))


def check_naive_grid(fn: Callable) -> bool:
    """fn(S, B, H) -> the launch grid (a tuple) of the naive kernel: one program per row."""
    cases = [(f"S={S}, B={B}, H={H}", (S, B, H), tuple(naive.naive_grid(S, B, H)))
             for S, B, H in _SHAPES]
    return _cases("naive grid", fn, cases,
                  hint="one program per (token, batch, head) row, on one grid axis")


def check_half_tile(fn: Callable) -> bool:
    """fn(head_dim) -> (HALF, BLOCK_HALF, masked lanes per half) for the rotate-half loads."""
    cases = []
    for D in (16, 64, 72, 80, 96, 128, 256):
        half, block = naive.half_tile(D)
        cases.append((f"D={D}", (D,), (half, block, block - half)))
    return _cases("half tile", fn, cases,
                  hint="tl.arange needs a power of two: triton.next_power_of_2(D // 2)")


def check_row_index(fn: Callable) -> bool:
    """fn(row, S, B, H) -> (s, b, h): which row of x [S, B, H, D] program `row` rotates."""
    cases = []
    for S, B, H in ((4, 2, 3), (5, 1, 4), (2, 3, 1)):
        for row in (0, 1, H, B * H - 1, B * H + 1, S * B * H - 1):
            # sbhd rows in memory order: unravel the flat row index over the shape [S, B, H]
            want = tuple(int(i) for i in torch.unravel_index(torch.tensor(row), (S, B, H)))
            cases.append((f"row={row} of [S={S}, B={B}, H={H}]", (row, S, B, H), want))
    return _cases("program id -> (s, b, h)", fn, cases,
                  hint="h moves fastest, then b, then s: s = row // (B * H)")


def check_rope_interleaved(fn: Callable) -> bool:
    """fn(x, freqs) -> y: interleaved RoPE (pairs 2j, 2j+1) of sbhd x [S, B, H, D] with TE's
    interleaved angle table [P, 1, 1, D] (f0 f0 f1 f1 ...), checked against the reference."""
    device = runtime.default_device()
    cases = []
    gen = torch.Generator().manual_seed(0)
    for S, B, H, D, dtype in ((3, 2, 2, 16, torch.float32), (2, 1, 2, 24, torch.float32),
                              (3, 1, 1, 8, torch.bfloat16)):
        x = torch.randn(S, B, H, D, generator=gen).to(device=device, dtype=dtype)
        freqs = te_angles(S + 1, D, interleaved=True, device=device)
        want = reference.rope_reference(x, freqs, interleaved=True)
        cases.append((f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')}",
                      (x, freqs), want))
    return _cases("interleaved RoPE", fn, cases,
                  hint="pair j is (2j, 2j+1): load the even and the odd features as two tiles "
                       "(offsets 2*offs and 2*offs + 1), and read the angle of each")


# --- notebook 04: the batch-reusing grid ------------------------------------------------------

_GENERATIONS = {"naive": naive.angle_bytes_requested,
                "batch_reuse": batch_reuse.angle_bytes_requested}


def check_angle_bytes(fn: Callable) -> bool:
    """fn(generation, S, B, H, D) -> bytes of fp32 angles all programs load, for generation
    "naive" or "batch_reuse" (each program loads the D angles of its position)."""
    cases = [(f"{g}, S={S}, B={B}, H={H}, D={D}", (g, S, B, H, D), _GENERATIONS[g](S, B, H, D))
             for g in _GENERATIONS for S, B, H, D in ((16384, 8, 32, 128), (7, 3, 2, 72))]
    return _cases("angle-table bytes requested", fn, cases,
                  hint="programs launched x D angles x 4 bytes; how many programs does each "
                       "grid have?")


def check_floor_ms(fn: Callable) -> bool:
    """fn(nbytes, copy_gbps) -> the fastest possible time in ms for a kernel that moves
    nbytes, at the bandwidth a device copy reached (GB/s, 1 GB = 1e9 bytes)."""
    cases = [(f"{n} bytes at {g} GB/s", (n, g), n / (g * 1e9) * 1e3)
             for n, g in ((2 ** 31, 3000.0), (10 ** 9, 1000.0), (123456789, 777.0))]
    return _cases("time floor", fn, cases, rtol=1e-9, atol=1e-12,
                  hint="seconds = bytes / (bytes per second); ms = 1000 x seconds")


def check_percent_of_copy(fn: Callable) -> bool:
    """fn(kernel_ms, copy_ms, S, B, H, D, dtype) -> the kernel's GB/s as a percentage of the
    copy's GB/s, with ropelib.compare's bytes model for the kernel (x + y + fp32 angles) and
    x + y for the copy."""
    from ..compare import Config, bytes_moved  # imported late: compare is a heavier module

    cases = []
    for kms, cms, S, B, H, D, dt in ((0.8, 0.6, 16384, 8, 32, 128, "bf16"),
                                     (0.05, 0.04, 1024, 2, 8, 64, "fp32")):
        cfg = Config(S, B, H, D, dtype=dt)
        elem = torch.tensor([], dtype=cfg.torch_dtype).element_size()
        kernel_gbps = bytes_moved(cfg) / (kms * 1e6)
        copy_gbps = 2 * S * B * H * D * elem / (cms * 1e6)
        cases.append((f"{kms} ms vs copy {cms} ms, [{S}, {B}, {H}, {D}] {dt}",
                      (kms, cms, S, B, H, D, dt), 100.0 * kernel_gbps / copy_gbps))
    return _cases("percent of copy bandwidth", fn, cases, rtol=1e-9, atol=1e-9,
                  hint="GB/s = bytes / (ms * 1e6); the kernel also reads S * D fp32 angles")


# --- notebook 05: the backward pass -----------------------------------------------------------

def _jacobian_pair(theta: float) -> torch.Tensor:
    """d y / d x [2, 2] of RoPE on one pair (x_a, x_b) rotated by theta (reference, fp64)."""
    freqs = torch.full((1, 1, 1, 2), float(theta), dtype=torch.float32)

    def f(v):
        return reference.rope_reference(v.view(1, 1, 1, 2), freqs).view(2)
    return torch.autograd.functional.jacobian(f, torch.zeros(2, dtype=torch.float64))


def check_backward_matrix(fn: Callable) -> bool:
    """fn(theta) -> M [2, 2] with grad_x = M @ grad_y for one pair rotated by theta."""
    cases = [(f"theta={t:g}", (t,), _jacobian_pair(t).T) for t in (0.3, -1.2, 2.5, 10.0)]
    return _cases("backward matrix of one pair", fn, cases, atol=1e-6, rtol=1e-6,
                  hint="grad_x = J^T grad_y, and J is the rotation by theta")


def _reference_grad(grad_y: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    x = torch.zeros(grad_y.shape, dtype=torch.float64, device=grad_y.device, requires_grad=True)
    (gx,) = torch.autograd.grad(reference.rope_reference(x, freqs), x, grad_y.double())
    return gx.to(grad_y.dtype)


def check_rope_backward(fn: Callable) -> bool:
    """fn(grad_y, freqs) -> grad_x for sbhd grad_y [S, B, H, D] (also stride-0 grad_y)."""
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(1)
    cases = []
    for S, B, H, D, expand in ((3, 2, 2, 16, False), (2, 3, 1, 24, False), (3, 2, 2, 8, True)):
        if expand:  # what y.sum() or an expand gives: stride 0 along the batch
            g = torch.randn(S, 1, H, D, generator=gen).to(device).expand(S, B, H, D)
        else:
            g = torch.randn(S, B, H, D, generator=gen).to(device)
        freqs = te_angles(S, D, device=device)
        label = f"grad_y [{S}, {B}, {H}, {D}]" + (" stride 0 over batch" if expand else "")
        cases.append((label, (g, freqs), _reference_grad(g, freqs)))
    return _cases("grad_x from grad_y", fn, cases, atol=1e-5, rtol=1e-5,
                  hint="rotate grad_y by -theta: rope_batch_reuse(grad_y, freqs, backward=True)")


def check_rope_function(cls) -> bool:
    """cls: a torch.autograd.Function with forward(ctx, x, freqs) -> y (sbhd RoPE). Checks y,
    grad_x against autograd of the reference, and that ctx did not save x (RoPE is linear in x:
    its backward needs the angles, not the activation)."""
    name = "RoPE autograd.Function"
    if cls is None or cls is Ellipsis:
        return check(name, None, True)
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        print(f"❌ {name}: expected a torch.autograd.Function subclass, got {cls!r}")
        return False
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 2, 16, generator=gen).to(device).requires_grad_()
    freqs = te_angles(3, 16, device=device)
    g = torch.randn(3, 2, 2, 16, generator=gen).to(device)
    ok, y = call_answer(f"{name} (forward)", cls.apply, x, freqs)
    if not ok:
        return False
    want_y = reference.rope_reference(x.detach(), freqs)
    same, _ = _compare(y, want_y, 1e-5, 1e-5)
    if not same:
        return check(f"{name} (forward)", y, want_y, atol=1e-5, rtol=1e-5)
    saved = getattr(y.grad_fn, "saved_tensors", ()) if y.grad_fn is not None else ()
    if any(t.data_ptr() == x.data_ptr() and t.shape == x.shape for t in saved):
        print(f"❌ {name}: ctx saved x; the backward only needs freqs (RoPE is linear in x), "
              "so saving x keeps an activation alive for nothing")
        return False
    try:
        (gx,) = torch.autograd.grad(y, x, g)
    except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
        print(f"❌ {name} (backward): raised {type(exc).__name__}: {exc}")
        return False
    return check(f"{name} (grad_x)", gx, _reference_grad(g, freqs), atol=1e-5, rtol=1e-5,
                 hint="backward returns one gradient per forward input: (grad_x, None)")


# --- worked solutions (shown folded in the notebooks) ----------------------------------------

def solution_naive_grid(S, B, H):
    return (S * B * H,)  # one program per row x[s, b, h, :], all on axis 0


def solution_half_tile(head_dim):
    half = head_dim // 2
    block = triton.next_power_of_2(half)  # tl.arange(0, BLOCK) needs a power of two
    return half, block, block - half      # lanes past HALF are masked off


def solution_row_index(row, S, B, H):
    s = row // (B * H)      # h moves fastest, then b, then s (sbhd memory order)
    b = (row // H) % B
    h = row % H
    return s, b, h


@triton.jit
def _rope_interleaved_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], contiguous
    freqs_ptr,  # *fp32: angles [P, D] (f0 f0 f1 f1 ...), contiguous
    B, H,  # batch size and heads: split the program id into (s, b, h)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    HALF: tl.constexpr,  # D // 2: number of pairs
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
):
    # One program per row, as the naive kernel; pair j is (2j, 2j+1).
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_HALF)
    mask = j < HALF
    theta_even = tl.load(freqs_ptr + s * 2 * HALF + 2 * j, mask=mask, other=0.0)
    theta_odd = tl.load(freqs_ptr + s * 2 * HALF + 2 * j + 1, mask=mask, other=0.0)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    x_even = tl.load(x_row + 2 * j * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_odd = tl.load(x_row + (2 * j + 1) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    y_even = x_even * tl.cos(theta_even) - x_odd * tl.sin(theta_even)
    y_odd = x_odd * tl.cos(theta_odd) + x_even * tl.sin(theta_odd)
    y_row = y_ptr + row * 2 * HALF
    tl.store(y_row + 2 * j, y_even.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + 2 * j + 1, y_odd.to(y_ptr.dtype.element_ty), mask=mask)


def solution_rope_interleaved(x, freqs):
    S, B, H, D = x.shape
    f = freqs.reshape(freqs.shape[0], D).contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rope_interleaved_solution_kernel[(S * B * H,)](
        x, y, f, B, H, *x.stride(), HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2))
    return y


def solution_angle_bytes(generation, S, B, H, D):
    programs = S * B * H if generation == "naive" else S * H  # batch_reuse: grid (S, H)
    return programs * D * 4                                    # D fp32 angles per program


def solution_floor_ms(nbytes, copy_gbps):
    return nbytes / (copy_gbps * 1e9) * 1e3


def solution_percent_of_copy(kernel_ms, copy_ms, S, B, H, D, dtype):
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    x_bytes = S * B * H * D * elem
    kernel_gbps = (2 * x_bytes + S * D * 4) / (kernel_ms * 1e6)
    copy_gbps = 2 * x_bytes / (copy_ms * 1e6)
    return 100.0 * kernel_gbps / copy_gbps


def solution_backward_matrix(theta):
    c, s = math.cos(theta), math.sin(theta)
    # forward J = [[c, -s], [s, c]]; backward is its transpose, the rotation by -theta
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


def solution_rope_backward(grad_y, freqs):
    return rope_batch_reuse(grad_y, freqs, backward=True)  # reads stride-0 grad_y as it is


class SolutionRopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, freqs):
        ctx.save_for_backward(freqs)  # not x: the backward is linear and needs only the angles
        return rope_batch_reuse(x, freqs)

    @staticmethod
    def backward(ctx, grad_y):
        (freqs,) = ctx.saved_tensors
        return rope_batch_reuse(grad_y, freqs, backward=True), None  # no gradient for freqs
