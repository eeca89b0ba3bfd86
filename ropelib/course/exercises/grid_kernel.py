"""Notebook 04's kernel exercise: write the batch-reusing kernel from a blank `@triton.jit`.

The learner's kernel has a fixed signature (`KERNEL_SIGNATURE`, printed in the notebook) and is
launched by the check itself, on grid (S, H), into an output buffer the check allocates and fills
with NaN. So nothing a Python function returns can pass, an element the kernel forgets to write
stays NaN, and a kernel that skips the batch loop leaves every batch entry but the first unwritten.
The inputs are drawn fresh: several shapes, a non-contiguous x (a bshd tensor seen as sbhd, with
a feature stride of 2), partial rotary (features R..D-1 copied unchanged), fp16, and tables whose
two halves hold different angles (so a kernel must read theta2 as well as theta1). Under the
interpreter the check also counts how often the kernel evaluates cos/sin: once per program, not
once per batch row, is the point of the grid.

Every launch runs with ropelib's own answers barred (`own_code`): a kernel of ropelib's (the
teaching kernels, the finished ones, the worked solution below), or a kernel that calls one of
ropelib's @triton.jit helpers, is refused before it runs, whatever it would write.

The helpers here (blank-kernel detection, the launch, the comparison) also
serve notebook 06's backward-kernel exercise (`backward_kernel`).

Notebook 04's exercise 5 (`check_granularity`) turns the grid into a knob: the learner's kernel
(`GRANULAR_SIGNATURE`) rotates ROWS batch rows a program on grid (S, H, B // ROWS), and a
function of theirs predicts what that launch issues (programs, sines and cosines, angle and x
elements loaded). The check runs the kernel through Triton's interpreter on any machine
(`ropelib.course.work_count`), compares its output with the reference, and compares the counts
with the prediction.
"""
import inspect
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from ... import reference, runtime
from . import _compare, check, exception_line, is_blank_kernel, is_kernel, solution
from ..work_count import count_work, interpreted
from .own_code import fresh_seed, launch_barred, library_barred, notebook_kernels, run_own_code

__all__ = ["KERNEL_SIGNATURE", "check_batch_reuse_kernel", "show_solution", "launch",
           "is_blank_kernel", "GRANULAR_SIGNATURE", "check_granularity",
           "count_granular", "show_granular_solution"]

KERNEL_SIGNATURE = '''\
@triton.jit
def my_batch_reuse_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], contiguous, same dtype as x
    freqs_ptr,  # *fp32: angles [S, R], contiguous; R = 2 * ROT_HALF <= D
    B,  # batch size: each program loops over it
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
    D,  # head dim: features R..D-1 are copied unchanged (partial rotary)
    ROT_HALF: tl.constexpr,  # R // 2: features in each rotated half
    BLOCK_HALF: tl.constexpr,  # next power of two >= ROT_HALF
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R (1 when R == D)
):
    # launched on grid (S, H): program (s, h) rotates x[s, b, h, :] for every b
    pass  # your code
'''


# --- what every kernel check needs ------------------------------------------------------------

def kernel_ready(name: str, kernel) -> bool:
    """Print ❌ and return False when `kernel` is missing, not a Triton kernel, or still blank."""
    if kernel is None or kernel is Ellipsis:
        print(f"❌ {name}: no answer yet (define the kernel)")
        return False
    if not is_kernel(kernel):
        print(f"❌ {name}: expected a @triton.jit kernel, got {type(kernel).__name__}: the check "
              "launches your kernel itself, so a Python function cannot answer")
        return False
    if is_blank_kernel(kernel):
        print(f"❌ {name}: no answer yet (write the kernel body in place of `pass`, then rerun "
              "the cell)")
        return False
    return True


def launch(kernel, x: torch.Tensor, freqs2d: torch.Tensor) -> torch.Tensor:
    """Launch `kernel` (KERNEL_SIGNATURE's argument order) on grid (S, H); return its output.

    x: [S, B, H, D], any strides; freqs2d: contiguous fp32 [S, R], R <= D, R even. The output
    starts as NaN, so an element the kernel does not write stays NaN.
    """
    S, B, H, D = x.shape
    R = freqs2d.shape[-1]
    y = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    kernel[(S, H)](
        x, y, freqs2d, B,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        y.stride(0), y.stride(1), y.stride(2),
        D,
        ROT_HALF=R // 2, BLOCK_HALF=triton.next_power_of_2(R // 2),
        BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)),
    )
    return y


def _unwritten(y: torch.Tensor, R: int) -> Optional[str]:
    """None when every element was written; else what was left NaN, and the likely reason."""
    bad = torch.isnan(y)
    if not bool(bad.any()):
        return None
    S, B, H, D = y.shape
    first = tuple(int(i) for i in bad.nonzero()[0])
    why = ""
    if B > 1 and not bool(bad[:, 0].any()) and bool(bad[:, 1:].all()):
        why = "only batch entry b = 0 was written: loop over b in range(0, B)"
    elif R < D and bool(bad[..., R:].all()) and not bool(bad[..., :R].any()):
        why = "the pass-through features R..D-1 were not copied"
    elif bool(bad.all()):
        why = "nothing was written: does the kernel tl.store into y_ptr?"
    return (f"{int(bad.sum())} of {bad.numel()} output elements were not written (the output "
            f"starts as NaN), first at [s, b, h, d] = {list(first)}" + (f"; {why}" if why else ""))


def check_kernel_cases(name: str, kernel, cases, expected: Callable, *, hint: str,
                       reuse_check: bool = True, what: str = "your kernel",
                       bar=()) -> bool:
    """Launch `kernel` on every (label, x, freqs2d); compare with expected(x, freqs2d).

    Prints one ✅ line, or ❌ for the first case that fails; returns the verdict; never raises.
    Every launch runs with ropelib's answers and `bar` barred (`what` names the exercise in a
    refusal). With `reuse_check`, also checks under the interpreter that cos/sin are evaluated as
    often for a batch of 3 as for a batch of 1 (once per program, before the batch loop).
    """
    if not kernel_ready(name, kernel):
        return False
    for label, x, f2 in cases:
        ok, y = launch_barred(name, label, what, lambda: launch(kernel, x, f2), bar=bar)
        if not ok:
            return False
        missing = _unwritten(y, f2.shape[-1])
        if missing:
            print(f"❌ {name} ({label}): {missing}")
            return False
        want = expected(x, f2)
        ok, _ = _compare(y, want, None, None)
        if not ok:
            return check(f"{name} ({label})", y, want, hint=hint)
    run = _as_interpreted(kernel) if reuse_check else None
    counted = run is not None
    if counted:     # counted in Triton's interpreter, on CPU tensors, on a GPU machine too
        evaluations = []
        for B in (1, 3):
            x, f2 = _inputs(torch.Generator().manual_seed(7), 2, B, 2, 16, 16, torch.float32)
            with count_work() as work:
                try:
                    with library_barred(what, bar=(*bar, *notebook_kernels())):
                        launch(run, x.cpu(), f2.cpu())
                except Exception as exc:  # noqa: BLE001
                    print(f"❌ {name} (B={B}): launching your kernel raised {exception_line(exc)}")
                    return False
            evaluations.append(work.sincos)
        if evaluations[1] > evaluations[0]:
            print(f"❌ {name}: correct outputs, but {evaluations[0]} cos/sin values were evaluated "
                  f"for a batch of 1 and {evaluations[1]} for a batch of 3 (same S, H): "
                  "compute them once per program, before the loop over the batch, and reuse them")
            return False
    print(f"✅ {name}: correct on {len(cases)} launches"
          + (", cos/sin computed once per program" if counted else ""))
    return True


def _as_interpreted(kernel):
    """The kernel as Triton's interpreter runs it (to count its cos/sin), or None where it
    cannot: any kernel under TRITON_INTERPRET=1; on a GPU machine a @triton.jit kernel
    (work_count.interpreted)."""
    if runtime.INTERPRET:
        return kernel
    try:
        return interpreted(kernel)
    except TypeError:
        return None


def _inputs(gen, S, B, H, D, R, dtype, *, strided=False, table="te"):
    """Fresh x [S, B, H, D] (strided: a bshd tensor seen as sbhd, feature stride 2) and angles."""
    device = runtime.default_device()
    if strided:
        base = torch.randn(B, S, H, 2 * D, generator=gen).to(device=device, dtype=dtype)
        x = base.permute(1, 0, 2, 3)[..., ::2]
    else:
        x = torch.randn(S, B, H, D, generator=gen).to(device=device, dtype=dtype)
    if table == "te":  # TE's cat(f, f) with f = s * 10000^(-2i/R)
        inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
        f = torch.outer(torch.arange(S, dtype=torch.float32), inv)
        f2 = torch.cat((f, f), dim=-1)
    else:  # one free angle per feature: the two halves of a pair differ
        f2 = torch.rand(S, R, generator=gen) * 6.0 - 3.0
    return x, f2.to(device).contiguous()


def _forward_cases(gen):
    """(label, x, freqs2d) for each launch. TE's table gives both halves of a pair one angle, so a
    kernel that reads only theta1 would pass on it: two cases draw the halves' angles apart."""
    c = []
    for S, B, H, D, R, dtype, strided, table in (
            (3, 2, 2, 16, 16, torch.float32, False, "te"),
            (3, 2, 2, 16, 16, torch.float32, False, "free"),
            (2, 3, 3, 24, 24, torch.float32, False, "te"),
            (3, 2, 2, 16, 16, torch.float32, True, "te"),
            (2, 2, 2, 20, 8, torch.float32, False, "free"),
            (2, 1, 3, 32, 32, torch.float16, False, "te")):
        x, f2 = _inputs(gen, S, B, H, D, R, dtype, strided=strided, table=table)
        label = (f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')}"
                 + (", non-contiguous" if strided else "")
                 + (", halves with different angles" if table != "te" else "")
                 + (f", rotary dim {R} of {D}" if R < D else ""))
        c.append((label, x, f2))
    return c


def _forward_expected(x, f2):
    return reference.rope_reference(x, f2)


# --- notebook 04 ----------------------------------------------------------------------------------

def check_batch_reuse_kernel(kernel) -> bool:
    """Launch the learner's kernel (KERNEL_SIGNATURE) on grid (S, H) and compare with the
    reference: several shapes, non-contiguous x, partial rotary, fp16, TE's table and tables whose
    halves differ; cos/sin once per program."""
    return check_kernel_cases(
        "batch-reusing kernel", kernel, _forward_cases(torch.Generator().manual_seed(4)),
        _forward_expected, what="your batch-reusing kernel",
        hint="y1 = x1*cos1 - x2*sin1 and y2 = x2*cos2 + x1*sin2 with angles theta1 = freqs[s, j], "
             "theta2 = freqs[s, j + ROT_HALF]; load x with its strides, store y at offsets "
             "b * stride_yb + ... ; copy features 2*ROT_HALF .. D-1 as they are")


@triton.jit
def _rope_batch_reuse_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], contiguous, same dtype as x
    freqs_ptr,  # *fp32: angles [S, R], contiguous; R = 2 * ROT_HALF <= D
    B,  # batch size: each program loops over it
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
    D,  # head dim: features R..D-1 are copied unchanged (partial rotary)
    ROT_HALF: tl.constexpr,  # R // 2: features in each rotated half
    BLOCK_HALF: tl.constexpr,  # next power of two >= ROT_HALF
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R (1 when R == D)
):
    s = tl.program_id(0).to(tl.int64)  # grid (S, H): one program per (position, head)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < ROT_HALF
    # once per program: the angles of position s and their cos/sin, for both halves
    f_row = freqs_ptr + s * 2 * ROT_HALF
    theta1 = tl.load(f_row + offs, mask=mask, other=0.0)
    theta2 = tl.load(f_row + ROT_HALF + offs, mask=mask, other=0.0)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    p = 2 * ROT_HALF + tl.arange(0, BLOCK_PASS)  # pass-through features R..D-1
    p_mask = p < D
    for b in range(0, B):  # the same cos/sin for every row of the batch
        x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
        y_row = y_ptr + s * stride_ys + b * stride_yb + h * stride_yh
        x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (offs + ROT_HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, (x1 * cos1 - x2 * sin1).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + ROT_HALF + offs, (x2 * cos2 + x1 * sin2).to(y_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(y_row + p, tl.load(x_row + p * stride_xd, mask=p_mask), mask=p_mask)


def show_solution() -> None:
    """Show the worked kernel folded away (after the exercise)."""
    solution(_rope_batch_reuse_solution_kernel.fn, title="Solution: the batch-reusing kernel")


# --- notebook 04, exercise 5: program granularity, one knob ------------------------------------

GRANULAR_SIGNATURE = '''\
@triton.jit
def my_granular_kernel(
    x_ptr,  # *x: input [S, B, H, D], contiguous
    y_ptr,  # *y: output [S, B, H, D], contiguous, same dtype as x
    freqs_ptr,  # *fp32: angles [S, D], contiguous (row s: theta1, then theta2)
    B, H,  # batch size, heads
    ROWS,  # batch rows each program rotates; divides B
    HALF: tl.constexpr,  # D // 2, a power of two
):
    # launched on grid (S, H, B // ROWS): program (s, h, g) rotates x[s, b, h, :] for
    # b = g * ROWS ... g * ROWS + ROWS - 1, with the cos/sin of position s evaluated once
    pass  # your code
'''

# (S, B, H, D, ROWS): the knob from one row per program to the whole batch, at two head sizes
_GRANULAR_CASES = ((3, 4, 2, 16, 1), (3, 4, 2, 16, 2), (3, 4, 2, 16, 4), (2, 6, 3, 32, 3))
WORK_KEYS = ("programs", "sincos", "angle_loads", "x_loads")


def launch_granular(kernel, x: torch.Tensor, freqs2d: torch.Tensor, rows: int) -> torch.Tensor:
    """Launch `kernel` (GRANULAR_SIGNATURE's argument order) on grid (S, H, B // rows) through
    Triton's interpreter, on CPU tensors; return its output (it starts as NaN)."""
    S, B, H, D = x.shape
    y = torch.full(x.shape, float("nan"), dtype=x.dtype)
    interpreted(kernel)[(S, H, B // rows)](x, y, freqs2d, B, H, rows, HALF=D // 2)
    return y


def count_granular(kernel, x: torch.Tensor, freqs2d: torch.Tensor, rows: int):
    """(output, counts) of one interpreted launch: counts has WORK_KEYS (sin and cos evaluations
    together, every lane of every tile; elements loaded from the angle table and from x)."""
    with count_work(freqs=freqs2d, x=x) as work:
        y = launch_granular(kernel, x, freqs2d, rows)
    return y, dict(programs=work.programs, sincos=work.sincos,
                   angle_loads=work.loads["freqs"], x_loads=work.loads["x"])


def _granular_inputs(gen, S, B, H, D):
    x = torch.randn(S, B, H, D, generator=gen)
    return x, (torch.rand(S, D, generator=gen) * 6.0 - 3.0).contiguous()


def check_granularity(kernel, work: Callable) -> bool:
    """Exercise 5: the learner's kernel with the ROWS knob, and their prediction of its work.

    Every case launches the kernel through Triton's interpreter (on any machine, on CPU tensors)
    with ropelib's answers barred, checks its output against the reference, and counts its
    programs, sin/cos evaluations and loads; cos/sin must be evaluated once per program (as
    often per program at ROWS = 4 as at ROWS = 1), and x and the angles read no more often than
    the design needs (solution_granular_work's counts). Then `work(S, B, H, D, rows)`, run with
    ropelib's answers barred too, must predict those counts: a dict with WORK_KEYS.
    Prints one ✅ line or the first ❌; returns the verdict; never raises."""
    name = "program granularity"
    if not kernel_ready(name, kernel):
        return False
    gen = torch.Generator().manual_seed(fresh_seed())
    measured = []
    for S, B, H, D, rows in _GRANULAR_CASES:
        label = f"S={S}, B={B}, H={H}, D={D}, ROWS={rows}"
        x, f2 = _granular_inputs(gen, S, B, H, D)
        ok, out = launch_barred(name, label, "your granular kernel",
                                lambda: count_granular(kernel, x, f2, rows))
        if not ok:
            return False
        y, counts = out
        missing = _unwritten(y, D)
        if missing:
            print(f"❌ {name} ({label}): {missing}; program (s, h, g) covers rows g * ROWS .. "
                  "g * ROWS + ROWS - 1")
            return False
        want = _forward_expected(x, f2)
        if not _compare(y, want, None, None)[0]:
            return check(f"{name} ({label})", y, want,
                         hint="y1 = x1*cos1 - x2*sin1, y2 = x2*cos2 + x1*sin2; row (s, b, h) "
                              "starts at ((s * B + b) * H + h) * 2 * HALF")
        measured.append(((S, B, H, D, rows), counts))
    per_program = {rows: c["sincos"] / c["programs"] for (_, _, _, _, rows), c in measured[:3]}
    if per_program[4] > per_program[1]:
        print(f"❌ {name}: correct outputs, but a program evaluates {per_program[1]:g} sines and "
              f"cosines at ROWS = 1 and {per_program[4]:g} at ROWS = 4: evaluate cos/sin once "
              "per program, before the loop over its rows")
        return False
    for args, counts in measured:      # the design asked for: x once, a position's angles once
        need = solution_granular_work(*args)
        for key, what in (("x_loads", "elements of x"), ("angle_loads", "angles")):
            if counts[key] > need[key]:
                print(f"❌ {name} (S={args[0]}, B={args[1]}, H={args[2]}, D={args[3]}, "
                      f"ROWS={args[4]}): correct outputs, but your kernel read {counts[key]:,} "
                      f"{what} where {need[key]:,} do: "
                      + ("each element of x once, whatever the grid" if key == "x_loads" else
                         "a program loads its position's D angles once, before its rows"))
                return False
    for args, counts in measured:
        label = "S={}, B={}, H={}, D={}, rows={}".format(*args)
        ok, guess = run_own_code(f"{name}: your prediction ({label})", "your prediction", work,
                                 *args)
        if not ok:
            return False
        if not isinstance(guess, dict) or set(guess) != set(WORK_KEYS):
            print(f"❌ {name}: your prediction ({label}) should be a dict with the keys "
                  f"{', '.join(WORK_KEYS)}; got {guess!r}")
            return False
        wrong = {k: (guess[k], counts[k]) for k in WORK_KEYS if guess[k] != counts[k]}
        if wrong:
            print(f"❌ {name} ({label}): your kernel, counted in the interpreter, differs from "
                  "your prediction: " + "; ".join(f"{k} predicted {g}, counted {c}"
                                                 for k, (g, c) in wrong.items())
                  + ". Hint: programs = S * H * (B / rows); each loads its position's D angles "
                  "and evaluates cos and sin of each; x is read once whatever the grid")
            return False
    print(f"✅ {name}: correct on {len(measured)} launches, cos/sin once per program, and your "
          "prediction matches the interpreter's counts")
    return True


@triton.jit
def _rope_granular_solution_kernel(
    x_ptr,  # *x: input [S, B, H, D], contiguous
    y_ptr,  # *y: output [S, B, H, D], contiguous, same dtype as x
    freqs_ptr,  # *fp32: angles [S, D], contiguous (row s: theta1, then theta2)
    B, H,  # batch size, heads
    ROWS,  # batch rows each program rotates; divides B
    HALF: tl.constexpr,  # D // 2, a power of two
):
    s = tl.program_id(0).to(tl.int64)  # grid (S, H, B // ROWS)
    h = tl.program_id(1).to(tl.int64)
    g = tl.program_id(2).to(tl.int64)
    offs = tl.arange(0, HALF)
    theta1 = tl.load(freqs_ptr + s * 2 * HALF + offs)  # once per program: D angles,
    theta2 = tl.load(freqs_ptr + s * 2 * HALF + HALF + offs)
    cos1, sin1 = tl.cos(theta1), tl.sin(theta1)  # 2 * D sines and cosines
    cos2, sin2 = tl.cos(theta2), tl.sin(theta2)
    for i in range(0, ROWS):  # this program's rows of the batch
        b = g * ROWS + i
        row = ((s * B + b) * H + h) * 2 * HALF
        x1 = tl.load(x_ptr + row + offs).to(tl.float32)
        x2 = tl.load(x_ptr + row + HALF + offs).to(tl.float32)
        tl.store(y_ptr + row + offs, (x1 * cos1 - x2 * sin1).to(y_ptr.dtype.element_ty))
        tl.store(y_ptr + row + HALF + offs, (x2 * cos2 + x1 * sin2).to(y_ptr.dtype.element_ty))


def solution_granular_work(S, B, H, D, rows):
    """The counts of one launch of a kernel with GRANULAR_SIGNATURE, cos/sin once per program."""
    programs = S * H * (B // rows)
    return dict(programs=programs, sincos=programs * 2 * D, angle_loads=programs * D,
                x_loads=S * B * H * D)


def show_granular_solution() -> None:
    """Show exercise 5's worked kernel and prediction folded away."""
    solution(inspect.getsource(_rope_granular_solution_kernel.fn) + "\n\n"
             + inspect.getsource(solution_granular_work),
             title="Solution: the kernel with a ROWS knob, and its counts")
