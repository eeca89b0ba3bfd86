"""Notebook 03's kernel exercises: the learner writes a @triton.jit kernel, the check launches it.

`check_rope_interleaved(kernel)` takes the learner's *kernel*, not a function that returns a
tensor: it draws fresh inputs, allocates the output itself (filled with NaN, so an element the
kernel never writes cannot pass, inside NaN guard bands that catch stores outside it), launches
`kernel[grid](...)` with the signature below and compares what the kernel wrote with
`ropelib.reference`. Returning the input, a PyTorch result or the reference has nothing to
return to: only what the kernel stores through `y_ptr` counts. Its masked case runs once more on
the CPU with every load recorded (`access.recording`): a load without its mask, whose values a
masked store drops, reads past the end of x and fails the check. The launch runs with ropelib's
own answers barred (`own_code`): one of ropelib's kernels (the worked solution below included),
or a kernel that calls one of ropelib's @triton.jit helpers, is refused.

The kernel rotates the interleaved form (GPT-J, RoFormer: pair j is features (2j, 2j+1)) with a
*partial* rotary dim R <= D: the first R features are rotated, the last D - R pass through
unchanged. Its arguments, in order (the grid is one program per row, (S * B * H,)):

    x_ptr,                                         # *x: input [S, B, H, D], any strides
    y_ptr,                                         # *y: output [S, B, H, D], contiguous
    freqs_ptr,                                     # *fp32: angles [P, R], f0 f0 f1 f1 ...
    B, H,                                          # batch size and heads (program id -> s, b, h)
    stride_xs, stride_xb, stride_xh, stride_xd,    # x strides, in elements
    D: tl.constexpr,                               # head dim
    R: tl.constexpr,                               # rotary dim: even, <= D
    BLOCK_PAIRS: tl.constexpr,                     # next power of two >= D // 2

Exercise 5 (`check_rope_rows`, signature at its section below) asks for step 3's kernel with
`ROWS` consecutive rows a program, ROWS heads of one token that evaluate its sines and cosines
once. It is checked the same way (its loads recorded too), plus a launch of program 0 alone
that must write its own ROWS rows and no others, and a count in the interpreter (`work_count`)
of the sines and cosines a program evaluates: one row's worth, not ROWS rows'. `check_predicted_us` checks the
learner's prediction of such a kernel's time from the cost of a program, on notebook 03's numbers
and on a kernel drawn when the check runs.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import reference, runtime
from . import _compare, check, guard_band_writes, guarded_view, kernel_answer
from .own_code import fresh_seed, launch_barred

__all__ = ["check_rope_interleaved", "solution_rope_interleaved", "launch_interleaved",
           "CASES", "check_rope_rows", "solution_rope_rows", "launch_rows", "ROWS_CASES",
           "check_predicted_us", "solution_predicted_us", "rows_sincos_every_row", "COUNT_CASE"]

# (S, B, H, D, R, dtype, layout): the tail D - R > 0 in most; bshd is a transposed view.
CASES = (
    (3, 2, 2, 16, 16, torch.float32, "sbhd"),
    (2, 3, 2, 24, 16, torch.float32, "bshd"),   # D/2 = 12 pairs: a masked tile; 4 features pass
    (3, 1, 3, 20, 8, torch.bfloat16, "sbhd"),   # bf16, 12 features pass through
)


def launch_interleaved(kernel, x: torch.Tensor, freqs: torch.Tensor, out: torch.Tensor) -> None:
    """Launch a kernel of the signature above: x [S, B, H, D], freqs [P, R], out contiguous."""
    S, B, H, D = x.shape
    R = freqs.shape[-1]
    kernel[(S * B * H,)](x, out, freqs, B, H, *x.stride(),
                         D=D, R=R, BLOCK_PAIRS=triton.next_power_of_2(D // 2))


def _pad(D: int) -> int:
    return 4 * triton.next_power_of_2(D) + 64  # wider than any unmasked tile of one row


def _inputs(case, gen, device):
    S, B, H, D, R, dtype, layout = case
    shape = (B, S, H, D) if layout == "bshd" else (S, B, H, D)
    _, x = guarded_view(shape, _pad(D), dtype=dtype, device=device, fill=0.0)
    x.copy_(torch.randn(shape, generator=gen).to(dtype))
    if layout == "bshd":  # a [B, S, H, D] tensor seen as sbhd: strides (D*H, S*H*D, D, 1)
        x = x.transpose(0, 1)
    # TE's interleaved table, f0 f0 f1 f1 ..., for R rotary features and a table longer than S;
    # a random offset per call so a kernel that hard-codes angles cannot pass
    base = float(torch.rand((), generator=gen)) * 3
    inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
    f = torch.outer(torch.arange(S + 2, dtype=torch.float32) + base, inv).repeat_interleave(2, -1)
    _, f_view = guarded_view(tuple(f.shape), _pad(D), dtype=torch.float32, device=device, fill=0.0)
    return x, f_view.copy_(f)


def _stray_loads(name: str, what: str, launch, x, freqs, y) -> Optional[int]:
    """Lanes the kernel loads outside x's and freqs's elements, recorded in the interpreter on
    CPU tensors (guarded views: a stray load lands in a guard band); None when the launch failed
    (reported). `launch(kernel_to_run, x, freqs, y)` starts the learner's kernel; run after its
    barred launches have passed, so nothing is barred here."""
    from .. import access
    with access.recording() as log:
        ok, _ = launch_barred(name, "its loads, recorded", what,
                              lambda: launch(access.interpreted, x, freqs, y), barred=False)
    return access.outside(log, (x, freqs), "load") if ok else None


def _say_stray(name: str, label: str, stray: int) -> bool:
    """Print why `stray` loaded lanes fail the check (False), or nothing (True) when none."""
    if stray:
        print(f"❌ {name} ({label}): the kernel loaded {stray} lanes outside x and freqs: a "
              "tl.load without its mask reads past the end of a row. The masked stores drop "
              "those values, so no output shows it, but on a GPU a load past the end of an "
              "allocation can fault: give every load the mask of its store")
    return not stray


def check_rope_interleaved(kernel, *, seed: Optional[int] = None) -> bool:
    """Launch the learner's @triton.jit kernel on fresh inputs; compare with the reference.

    Args:
        kernel: a @triton.jit function with the signature in this module's docstring.
        seed: for the random inputs (fresh ones each call by default).
    Returns:
        True when every case matches: rotated pairs, the untouched tail, every element written.
    """
    name = "interleaved RoPE kernel"
    if not kernel_answer(name, kernel, "the output buffer it allocated"):
        return False
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    for case in CASES:
        S, B, H, D, R, dtype, layout = case
        label = f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')} {layout}, R={R}"
        x, freqs = _inputs(case, gen, device)
        x_before = x.clone()
        pad = _pad(D)
        y_buf, y = guarded_view((S, B, H, D), pad, dtype=dtype, device=device)  # poisoned, guarded
        ok, _ = launch_barred(name, label, "your interleaved RoPE kernel",
                              lambda: launch_interleaved(kernel, x, freqs, y), last_line=True)
        if not ok:
            return False
        if not torch.equal(x, x_before):
            print(f"❌ {name} ({label}): the kernel changed its input x")
            return False
        outside = guard_band_writes(y_buf, pad)
        if outside:
            print(f"❌ {name} ({label}): the kernel stored {outside} elements outside y "
                  "(a store without its mask, or a wrong row offset)")
            return False
        unwritten = int(y.isnan().sum())
        if unwritten:
            where = tuple(int(i) for i in y.isnan().nonzero()[0])
            print(f"❌ {name} ({label}): {unwritten} of {y.numel()} output elements were never "
                  f"written (first at {where}; features >= R = {R} must be copied)")
            return False
        want = reference.rope_reference(x, freqs, interleaved=True)
        tol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.6e-2)
        same, _ = _compare(y, want, *tol)
        if not same:
            return check(f"{name} ({label})", y, want, atol=tol[0], rtol=tol[1],
                         hint="pair j is (2j, 2j+1) and uses angle freqs[s, 2j]; pairs j >= R/2 "
                              "are copied (an angle of 0 rotates by nothing)")
    # the masked case again on the CPU, its loads recorded: none may fall outside x and freqs
    case = CASES[1]
    S, B, H, D, R, dtype, layout = case
    x, freqs = _inputs(case, gen, "cpu")
    _, y = guarded_view((S, B, H, D), _pad(D), dtype=dtype, device="cpu")
    stray = _stray_loads(name, "your interleaved RoPE kernel",
                         lambda run, x_, f_, y_: launch_interleaved(run(kernel), x_, f_, y_),
                         x, freqs, y)
    if stray is None or not _say_stray(name, f"x [{S}, {B}, {H}, {D}] {layout}, R={R}", stray):
        return False
    print(f"✅ {name}: correct on {len(CASES)} launches (sbhd and bshd views, fp32 and bf16, "
          "a masked tile, partial rotary), and no load outside x and freqs")
    return True


@triton.jit
def solution_rope_interleaved(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], contiguous
    freqs_ptr,  # *fp32: angles [P, R], contiguous, f0 f0 f1 f1 ...
    B, H,  # batch size and heads: split the program id into (s, b, h)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    D: tl.constexpr,  # head dim
    R: tl.constexpr,  # rotary dim (even, <= D): pairs j < R // 2 turn, the rest are copied
    BLOCK_PAIRS: tl.constexpr,  # next power of two >= D // 2
):
    row = tl.program_id(0).to(tl.int64)  # one program per row x[s, b, h, :]
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_PAIRS)  # pair index: features 2j and 2j + 1
    live = j < D // 2
    # angle 0 for the tail pairs (j >= R/2): cos 1, sin 0 copies them unchanged
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=j < R // 2, other=0.0)
    c, sn = tl.cos(theta), tl.sin(theta)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    x_even = tl.load(x_row + 2 * j * stride_xd, mask=live, other=0.0).to(tl.float32)
    x_odd = tl.load(x_row + (2 * j + 1) * stride_xd, mask=live, other=0.0).to(tl.float32)
    y_row = y_ptr + row * D
    tl.store(y_row + 2 * j, (x_even * c - x_odd * sn).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(y_row + 2 * j + 1, (x_odd * c + x_even * sn).to(y_ptr.dtype.element_ty), mask=live)


# --- exercise 5: fewer programs, each doing more ---------------------------------------------
#
# Step 3's kernel of notebook 03 with one more constexpr, ROWS: program p rotates the ROWS
# consecutive rows p * ROWS ... p * ROWS + ROWS - 1 of x (rotate-half, any strides). H is a
# multiple of ROWS, so they are ROWS heads of one token (s, b): one position, one row of angles,
# whose sines and cosines the program evaluates once. Its arguments, in order (the grid is
# (n_rows // ROWS,)):
#
#     x_ptr,                                         # *x: [S, B, H, D], any strides
#     y_ptr,                                         # *y: [S, B, H, D], contiguous, x's dtype
#     freqs_ptr,                                     # *fp32: angles [P, D], P >= S
#     n_rows,                                        # S * B * H, a multiple of ROWS
#     B, H,                                          # program id -> rows -> (s, b, h)
#     stride_xs, stride_xb, stride_xh, stride_xd,    # x strides, in elements
#     stride_fs, stride_fd,                          # freqs strides, in elements
#     HALF: tl.constexpr,                            # D // 2
#     BLOCK_HALF: tl.constexpr,                      # next power of two >= HALF
#     ROWS: tl.constexpr,                            # rows per program, a power of two

# (S, B, H, D, ROWS, dtype, layout): H a multiple of ROWS; two programs a token (H = 2 ROWS),
# a masked half (D = 24), a transposed bshd view, fp32 and bf16, ROWS = 1 too
ROWS_CASES = (
    (3, 2, 8, 16, 4, torch.float32, "sbhd"),    # 48 rows: 12 programs, 2 a token
    (2, 3, 8, 24, 8, torch.float32, "bshd"),    # 48 rows: 6 programs, 1 a token
    (5, 1, 4, 16, 2, torch.bfloat16, "sbhd"),   # 20 rows: 10 programs
    (2, 2, 1, 16, 1, torch.float32, "sbhd"),    # one row a program: step 3
)
# the sin/cos count: x [2, 1, 8, 16] in ROWS = 4 rows a program (4 programs); the tl.sin and
# tl.cos lanes of one row's 16 angles are 2 * 16, or 4 * BLOCK_HALF as step 3 evaluates them
COUNT_CASE = (2, 1, 8, 16, 4, torch.float32, "sbhd")


def launch_rows(kernel, x: torch.Tensor, freqs: torch.Tensor, out: torch.Tensor, rows: int,
                programs: Optional[int] = None, num_warps: Optional[int] = None) -> None:
    """Launch a kernel of exercise 5's signature: x [S, B, H, D] (H a multiple of rows), freqs
    [P, D], out contiguous; `programs` (default all, S * B * H // rows) limits the grid. `num_warps` defaults to
    `rows_warps(rows, D)`, the ablation's warps for its tile of `rows` heads."""
    S, B, H, D = x.shape
    n_rows = S * B * H
    if H % rows:
        raise ValueError(f"ROWS={rows} must divide H={H}: a program's rows are heads of one token")
    warps = rows_warps(rows, D) if num_warps is None else num_warps
    grid = (n_rows // rows if programs is None else programs,)
    kernel[grid](x, out, freqs, n_rows, B, H, *x.stride(), *freqs.stride(),
                 HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2), ROWS=rows,
                 num_warps=warps)


def rows_warps(rows: int, D: int) -> int:
    """The ablation's warps (ablation.default_warps) for a [rows, BLOCK_HALF] half-tile."""
    from ..kernels import ablation
    return ablation.default_warps(rows * triton.next_power_of_2(D // 2))


def _rows_inputs(case, gen, device):
    S, B, H, D, rows, dtype, layout = case
    shape = (B, S, H, D) if layout == "bshd" else (S, B, H, D)
    _, x = guarded_view(shape, _pad(D), dtype=dtype, device=device, fill=0.0)
    x.copy_(torch.randn(shape, generator=gen).to(dtype))
    if layout == "bshd":  # a [B, S, H, D] tensor seen as sbhd
        x = x.transpose(0, 1)
    # any table (not cat(f, f)), longer than S, random per call: each feature has its own angle
    f = torch.rand(S + 3, D, generator=gen) * 6
    _, f_view = guarded_view(tuple(f.shape), _pad(D), dtype=torch.float32, device=device, fill=0.0)
    return x, f_view.copy_(f)


def check_rope_rows(kernel, *, seed: Optional[int] = None, launch=None) -> bool:
    """Exercise 5: launch the learner's kernel of ROWS rows a program on fresh inputs, through
    `launch` (the notebook's launcher, of `launch_rows`'s signature; default `launch_rows`).

    Each case goes into a NaN-filled output inside NaN guard bands, on the grid
    (cdiv(n_rows, ROWS),), and is compared with the reference. Then program 0 is launched alone:
    it must write rows 0 ... ROWS - 1 and nothing else, so a kernel whose every program rotates
    all rows (or one row) fails. Returns True when all of it holds; never raises.
    """
    name = "RoPE kernel of ROWS rows a program"
    if not kernel_answer(name, kernel, "the output buffer it allocated"):
        return False
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    start = launch_rows if launch is None else launch

    def launch(x, freqs, y, rows, label, programs=None):
        warps = rows_warps(rows, x.shape[-1])      # (ropelib's own code: before the barring)
        ok, _ = launch_barred(name, label, "your kernel of ROWS rows a program",
                              lambda: start(kernel, x, freqs, y, rows, programs,
                                            num_warps=warps))
        return ok

    for case in ROWS_CASES:
        S, B, H, D, rows, dtype, layout = case
        n_rows = S * B * H
        label = (f"x [{S}, {B}, {H}, {D}] {str(dtype).replace('torch.', '')} {layout}, "
                 f"ROWS={rows}: {n_rows // rows} programs for {n_rows} rows")
        x, freqs = _rows_inputs(case, gen, device)
        x_before = x.clone()
        pad = _pad(D)
        y_buf, y = guarded_view((S, B, H, D), pad, dtype=dtype, device=device)
        if not launch(x, freqs, y, rows, label):
            return False
        if not torch.equal(x, x_before):
            print(f"❌ {name} ({label}): the kernel changed its input x")
            return False
        outside = guard_band_writes(y_buf, pad)
        if outside:
            print(f"❌ {name} ({label}): the kernel stored {outside} elements outside y (a store "
                  "without its mask: rows past n_rows, or lanes past HALF)")
            return False
        unwritten = y.isnan().reshape(n_rows, D).any(-1)
        if unwritten.any():
            first = int(unwritten.nonzero()[0])
            print(f"❌ {name} ({label}): {int(unwritten.sum())} of {n_rows} rows were not "
                  f"(wholly) written, first row {first}: program p rotates rows p * ROWS to "
                  "p * ROWS + ROWS - 1")
            return False
        want = reference.rope_reference(x, freqs)
        tol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.6e-2)
        same, _ = _compare(y, want, *tol)
        if not same:
            return check(f"{name} ({label})", y, want, atol=tol[0], rtol=tol[1],
                         hint="each row has its own (s, b, h): split every row index as step 3 "
                              "splits its program id")
    # program 0 alone: exactly its ROWS rows
    S, B, H, D, rows, dtype, layout = ROWS_CASES[0]
    x, freqs = _rows_inputs(ROWS_CASES[0], gen, device)
    y = torch.full((S, B, H, D), float("nan"), dtype=dtype, device=device)
    if not launch(x, freqs, y, rows, "program 0 alone", programs=1):
        return False
    written = (~y.isnan()).reshape(S * B * H, D).all(-1).nonzero().flatten().tolist()
    if written != list(range(rows)):
        print(f"❌ {name}: launched alone, program 0 wrote rows {written}, not rows 0 to "
              f"{rows - 1}: each program rotates its own ROWS consecutive rows, and only those")
        return False
    # the masked case again on the CPU, its loads recorded: none may fall outside x and freqs
    S, B, H, D, rows, dtype, layout = ROWS_CASES[1]
    x, freqs = _rows_inputs(ROWS_CASES[1], gen, "cpu")
    _, y = guarded_view((S, B, H, D), _pad(D), dtype=dtype, device="cpu")
    stray = _stray_loads(name, "your kernel of ROWS rows a program",
                         lambda run, x_, f_, y_: start(run(kernel), x_, f_, y_, rows,
                                                       num_warps=1), x, freqs, y)
    if stray is None or not _say_stray(name, f"x [{S}, {B}, {H}, {D}] {layout}, ROWS={rows}",
                                       stray):
        return False
    # the sines and cosines a program evaluates, counted in the interpreter on CPU tensors (the
    # launches above were barred already: this one runs as it is, on a GPU machine too)
    from .. import work_count
    S, B, H, D, rows, dtype, layout = COUNT_CASE
    x, freqs = _rows_inputs(COUNT_CASE, gen, "cpu")
    y = torch.full((S, B, H, D), float("nan"), dtype=dtype)
    with work_count.count_work() as work:
        ok, _ = launch_barred(name, "the sin/cos count", "your kernel of ROWS rows a program",
                              lambda: start(work_count.interpreted(kernel), x, freqs, y,
                                            rows, num_warps=1), barred=False)
    if not ok:
        return False
    per_program = work.sincos / max(work.programs, 1)
    if per_program > 2 * D:
        print(f"❌ {name} (x [{S}, {B}, {H}, {D}], ROWS={rows}): a program evaluated "
              f"{per_program:.0f} sines and cosines, {per_program / (2 * D):.0f} rows' worth. Its "
              f"{rows} rows are heads of one token: load the position's angles once, as a "
              "[1, BLOCK_HALF] row, evaluate tl.cos and tl.sin of it once, and let them broadcast")
        return False
    print(f"✅ {name}: correct on {len(ROWS_CASES)} launches (ROWS = 1 to 8, a masked half, a "
          "bshd view, fp32 and bf16), no load outside x and freqs, program 0 rotates its ROWS "
          "rows only, and a program "
          f"evaluates one row's sines and cosines ({per_program:.0f} for D = {D}), not ROWS rows'")
    return True


def check_predicted_us(fn) -> bool:
    """fn(n_rows, rows_per_program, sms, ns_per_program_per_sm, copy_us) -> the time in µs a
    kernel of one program per `rows_per_program` rows takes when its programs start at
    ns_per_program_per_sm a program per SM, the `sms` SMs sharing them evenly (that is,
    ns_per_program_per_sm / sms a program GPU-wide: notebook 03 measures the rate, and finds its
    limit in the GPU, not in each SM), and no kernel is faster than a copy of its bytes
    (copy_us).

    Tried on notebook 03's numbers and a few others, and on a kernel drawn when the check runs
    (`own_code.fresh_generator`, its seed in the case's label): a table of times worked out
    beforehand has no entry for it."""
    from .own_code import check_cases, fresh_generator

    seed, g = fresh_generator()     # and a kernel drawn now: a table made beforehand fails

    def drawn(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    draw = (drawn(1_000, 4_000_000), drawn(1, 16), drawn(8, 160), drawn(200, 2_000) / 10,
            drawn(2, 400) / 2)
    cases = []
    for args in ((1_048_576, 1, 132, 79.8, 130.0), (1_048_576, 4, 132, 79.8, 130.0),
                 (1_048_576, 8, 132, 79.8, 130.0), (1000, 3, 10, 100.0, 1.0),
                 (524_288, 2, 108, 91.0, 60.0), draw):
        n, r, sms, ns, copy = args
        programs = -(-n // r)
        cases.append((f"{n:,} rows, {r} a program, {sms} SMs, {ns} ns, copy {copy} us"
                      + (f" (drawn with seed {seed})" if args is draw else ""),
                      args, max(programs * ns / sms / 1e3, copy)))
    return check_cases("predicted time", "your prediction", fn, cases, rtol=1e-3, atol=1e-9,
                       hint="programs = rows / ROWS, rounded up, started at "
                            "ns_per_program_per_sm / sms each across the GPU (the per-SM "
                            "figure, the SMs sharing the programs evenly); and the bytes "
                            "still have to move",
                       bar=(solution_predicted_us,))


@triton.jit
def solution_rope_rows(
    x_ptr,  # *x: [S, B, H, D], any strides
    y_ptr,  # *y: [S, B, H, D], contiguous, x's dtype
    freqs_ptr,  # *fp32: angles [P, D], P >= S
    n_rows,  # S * B * H, a multiple of ROWS
    B, H,  # program id -> rows -> (s, b, h)
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_fs, stride_fd,  # freqs strides, in elements
    HALF: tl.constexpr,  # D // 2
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    ROWS: tl.constexpr,  # rows per program, a power of two dividing H
):
    row0 = tl.program_id(0).to(tl.int64) * ROWS  # this program's first row
    s, b = row0 // (B * H), (row0 // H) % B  # H % ROWS == 0: all ROWS rows are token (s, b)'s
    h = (row0 % H + tl.arange(0, ROWS))[:, None]  # [ROWS, 1]: its heads
    offs = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BLOCK_HALF]
    mask = offs < HALF
    # the position's angles, and their cos and sin, once a program: [1, BLOCK_HALF]
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0)
    c1, s1, c2, s2 = tl.cos(theta1), tl.sin(theta1), tl.cos(theta2), tl.sin(theta2)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh  # [ROWS, 1]
    x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)  # [ROWS, BLOCK_HALF]
    x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    y_row = y_ptr + (row0 + tl.arange(0, ROWS))[:, None] * 2 * HALF  # y contiguous: row r at r * D
    tl.store(y_row + offs, (x1 * c1 - x2 * s1).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + HALF + offs, (x2 * c2 + x1 * s2).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rows_sincos_every_row(
    x_ptr, y_ptr, freqs_ptr, n_rows, B, H, stride_xs, stride_xb, stride_xh, stride_xd,
    stride_fs, stride_fd, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr,
):
    """Exercise 5's signature, rows of any positions: cos and sin evaluated for every row (the
    check refuses it). Profiled as `solution_rope_rows` in rows_ncu-nvidia-h200.csv; notebook
    03's appendix reads why 8 rows a program are slower than 2."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS] this program's rows
    s = (rows // (B * H))[:, None]  # [ROWS, 1]: each row its own position, batch, head
    b = ((rows // H) % B)[:, None]
    h = (rows % H)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BLOCK_HALF]
    mask = (rows[:, None] < n_rows) & (offs < HALF)  # [ROWS, BLOCK_HALF]
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * tl.cos(theta1) - x2 * tl.sin(theta1)
    y2 = x2 * tl.cos(theta2) + x1 * tl.sin(theta2)
    y_row = y_ptr + rows[:, None] * 2 * HALF
    tl.store(y_row + offs, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + HALF + offs, y2.to(y_ptr.dtype.element_ty), mask=mask)


def solution_predicted_us(n_rows, rows_per_program, sms, ns_per_program_per_sm, copy_us):
    programs = -(-n_rows // rows_per_program)                    # the last may hold fewer rows
    starts_us = programs / sms * ns_per_program_per_sm / 1e3     # GPU-wide: ns / sms a program
    return max(starts_us, copy_us)                               # and the bytes must still move
