"""Exercise checks for notebooks 03, 04 and 06 (the naive kernel, the batch-reusing grid, the backward).

Every `check_...` computes its expected answer from ropelib itself (the kernel modules' grid and
tile helpers, `reference`, `compare`), prints ✅ or ❌ through `ropelib.course.exercises.check`, returns
a bool and never raises. Helpers that take the learner's *function* try it on several inputs and
report the first one that fails. They run it with ropelib's own answers barred (`own_code`): the
teaching kernels' helpers that compute the very thing asked (`naive.naive_grid`,
`naive.half_tile`, `angle_bytes_requested`), the finished API, `ropelib.reference`, the teaching
kernels themselves and the worked solutions below are refused, whatever they return. The worked
solutions are the `solution_*` functions below, shown folded in the notebooks with
`ropelib.course.exercises.solution(kernels.solution_...)`.

Inputs are tiny so that checks which launch a learner's Triton kernel stay fast in the CPU
interpreter.
"""
import math
import sys
from pathlib import Path
from typing import Callable

import torch
import triton

from ... import reference, runtime
from ..kernels import batch_reuse, naive
from . import _compare, check, is_blank_kernel
from .own_code import (LibraryAnswer, check_cases, fresh_generator, library_barred,
                       notebook_kernels, run_own_code)

__all__ = [
    "check_naive_grid", "check_half_tile", "check_row_index", "check_rope_interleaved",
    "check_rope_rows", "check_predicted_us", "launch_rows",
    "solution_rope_rows", "solution_predicted_us",
    "check_angle_bytes", "check_floor_ms", "check_percent_of_copy", "check_grid_us",
    "check_backward_matrix", "check_rope_backward", "check_rope_function",
    "solution_naive_grid", "solution_half_tile", "solution_row_index", "solution_rope_interleaved",
    "solution_angle_bytes", "solution_floor_ms", "solution_percent_of_copy", "solution_grid_us",
    "solution_backward_matrix", "solution_rope_backward", "SolutionRopeFunction",
    "te_angles",
]


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
    seed, g = fresh_generator()     # and a shape drawn now: a table made beforehand fails
    drawn = tuple(int(v) for v in torch.randint(1, 200, (3,), generator=g))
    cases = [(f"S={S}, B={B}, H={H}" + (f" (drawn with seed {seed})" if i == len(_SHAPES) else ""),
              (S, B, H), tuple(naive.naive_grid(S, B, H)))
             for i, (S, B, H) in enumerate((*_SHAPES, drawn))]
    return check_cases("naive grid", "your grid", fn, cases,
                       hint="one program per (token, batch, head) row, on one grid axis")


def check_half_tile(fn: Callable) -> bool:
    """fn(head_dim) -> (HALF, BLOCK_HALF, masked lanes per half) for the rotate-half loads."""
    cases = []
    seed, g = fresh_generator()     # and a head dim drawn now: a table made beforehand fails
    drawn = 2 * int(torch.randint(1, 2 ** 15, (), generator=g))
    for i, D in enumerate((16, 64, 72, 80, 96, 128, 256, drawn)):
        half, block = naive.half_tile(D)
        cases.append((f"D={D}" + (f" (drawn with seed {seed})" if i == 7 else ""), (D,),
                      (half, block, block - half)))
    return check_cases("half tile", "your tile sizes", fn, cases,
                       hint="tl.arange needs a power of two: triton.next_power_of_2(D // 2)")


def check_row_index(fn: Callable) -> bool:
    """fn(row, S, B, H) -> (s, b, h): which row of x [S, B, H, D] program `row` rotates."""
    cases = []
    seed, g = fresh_generator()     # and rows drawn now: a table made beforehand fails
    drawn = tuple(int(v) for v in torch.randint(2, 40, (3,), generator=g))
    for i, (S, B, H) in enumerate(((4, 2, 3), (5, 1, 4), (2, 3, 1), drawn)):
        rows = (0, 1, H, B * H - 1, B * H + 1, S * B * H - 1)
        if i == 3:
            rows = tuple(int(r) for r in torch.randint(0, S * B * H, (3,), generator=g))
        for row in rows:
            # sbhd rows in memory order: unravel the flat row index over the shape [S, B, H]
            want = tuple(int(i) for i in torch.unravel_index(torch.tensor(row), (S, B, H)))
            cases.append((f"row={row} of [S={S}, B={B}, H={H}]"
                          + (f" (drawn with seed {seed})" if i == 3 else ""),
                          (row, S, B, H), want))
    return check_cases("program id -> (s, b, h)", "your index arithmetic", fn, cases,
                       hint="h moves fastest, then b, then s: s = row // (B * H)")


# The kernel exercises of notebook 03 live in naive_kernel: their checks launch the learner's
# @triton.jit kernel themselves (re-exported here with their solutions), and exercise 5's
# prediction goes with its kernel.
from .naive_kernel import check_rope_interleaved, solution_rope_interleaved  # noqa: E402
from .naive_kernel import (check_predicted_us, check_rope_rows, launch_rows,  # noqa: E402
                           solution_predicted_us, solution_rope_rows)


# --- notebook 04: the batch-reusing grid ------------------------------------------------------

_GENERATIONS = {"naive": naive.angle_bytes_requested,
                "batch_reuse": batch_reuse.angle_bytes_requested}


def check_angle_bytes(fn: Callable) -> bool:
    """fn(generation, S, B, H, D) -> bytes of fp32 angles all programs load, for generation
    "naive" or "batch_reuse" (each program loads the D angles of its position)."""
    seed, gen = fresh_generator()   # and a shape drawn now: a table made beforehand fails
    S, B, H = (int(v) for v in torch.randint(1, 300, (3,), generator=gen))
    drawn = (S, B, H, 8 * int(torch.randint(1, 33, (), generator=gen)))
    cases = [(f"{g}, S={S}, B={B}, H={H}, D={D}"
              + (f" (drawn with seed {seed})" if shape is drawn else ""),
              (g, S, B, H, D), _GENERATIONS[g](S, B, H, D))
             for shape in ((16384, 8, 32, 128), (7, 3, 2, 72), drawn)
             for g, (S, B, H, D) in ((g, shape) for g in _GENERATIONS)]
    return check_cases("angle-table bytes requested", "your count of the bytes", fn, cases,
                       hint="programs launched x D angles x 4 bytes; how many programs does each "
                            "grid have?")


def check_floor_ms(fn: Callable) -> bool:
    """fn(nbytes, copy_gbps) -> the fastest possible time in ms for a kernel that moves
    nbytes, at the bandwidth a device copy reached (GB/s, 1 GB = 1e9 bytes)."""
    from .. import kernel_bandwidth     # notebook 02's bandwidth arithmetic: the same answer

    seed, gen = fresh_generator()   # and a case drawn now: a table made beforehand fails
    drawn = (int(torch.randint(1, 2 ** 31, (), generator=gen)),
             float(torch.randint(100, 5000, (), generator=gen)))
    cases = [(f"{n} bytes at {g} GB/s" + (f" (drawn with seed {seed})" if i == 3 else ""),
              (n, g), n / (g * 1e9) * 1e3)
             for i, (n, g) in enumerate(((2 ** 31, 3000.0), (10 ** 9, 1000.0),
                                         (123456789, 777.0), drawn))]
    return check_cases("time floor", "your time floor", fn, cases, rtol=1e-9, atol=1e-12,
                       hint="seconds = bytes / (bytes per second); ms = 1000 x seconds",
                       bar=(kernel_bandwidth.us_at_copy_speed, kernel_bandwidth.gbps))


# benchmarks/generations.py: its `pct_of_copy(row)` is the definition notebook 04's cells use
_GENERATIONS_SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "generations.py"


def _shared_percent_of_copy() -> tuple:
    """`pct_of_copy` of benchmarks/generations.py in every module that file is loaded as
    (notebook 04 imports it as `generations`): given a row of the two times it returns exercise
    3's answer, so the check bars it. A checkout without the file has none to bar."""
    found = []
    for module in list(sys.modules.values()):
        where = getattr(module, "__file__", None)
        if where and Path(where).name == _GENERATIONS_SCRIPT.name \
                and Path(where).resolve() == _GENERATIONS_SCRIPT:
            fn = getattr(module, "pct_of_copy", None)
            if callable(fn):
                found.append(fn)
    return tuple(found)


def check_percent_of_copy(fn: Callable) -> bool:
    """fn(kernel_ms, copy_ms) -> the kernel's percentage of a copy: the copy's time over the
    kernel's, in percent (100 at the copy's speed, above 100 for a kernel faster than the copy).
    Calling the course's own definition (`pct_of_copy` of benchmarks/generations.py, which the
    notebook's cells use) is refused: the exercise asks for the formula."""
    seed, g = fresh_generator()     # and a case drawn now: a table made beforehand fails
    drawn = (round(float(torch.rand((), generator=g)) + 0.01, 4),
             round(float(torch.rand((), generator=g)) + 0.01, 4))
    cases = [(f"{kms} ms vs copy {cms} ms" + (f" (drawn with seed {seed})" if i == 3 else ""),
              (kms, cms), 100.0 * cms / kms)
             for i, (kms, cms) in enumerate(((0.8, 0.6), (0.05, 0.04),
                                             (0.0364, 0.0369), drawn))]
    return check_cases("percent of a copy", "your percentage", fn, cases, rtol=1e-9, atol=1e-9,
                       hint="the same bytes in less time is faster: copy time / kernel time, "
                            "x 100",
                       bar=(solution_percent_of_copy, *_shared_percent_of_copy()))


def check_grid_us(fn: Callable) -> bool:
    """fn(S, B, H, sms, ns_per_program_per_sm, copy_us) -> the time in µs of the (S, H) grid (one
    program per position and head, each looping over the B rows) when its programs start at
    ns_per_program_per_sm a program per SM, the `sms` SMs sharing them evenly
    (ns_per_program_per_sm / sms a program GPU-wide: notebook 03 measures the rate, and finds its
    limit in the GPU, not in each SM), and no kernel is faster than a copy of its tensors
    (copy_us).
    Notebook 03's worked prediction (`solution_predicted_us`, which takes rows and rows per
    program) is refused with the worked solution: the exercise asks for the model."""
    seed, g = fresh_generator()     # and a launch drawn now: a table made beforehand fails

    def drawn(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    draw = (drawn(1, 40_000), drawn(1, 64), drawn(1, 128), drawn(8, 160), drawn(200, 2_000) / 10,
            drawn(2, 4_000) / 4)
    cases = [(f"S={S}, B={B}, H={H}, {sms} SMs, {ns} ns, copy {copy} us"
              + (f" (drawn with seed {seed})" if args is draw else ""),
              args, max(S * H / sms * ns / 1e3, copy))
             for args in ((4096, 1, 32, 132, 79.8, 20.5), (4096, 8, 32, 132, 79.8, 130.4),
                          (100, 3, 7, 10, 50.0, 1.0), (16384, 2, 8, 108, 91.0, 300.0), draw)
             for S, B, H, sms, ns, copy in (args,)]
    return check_cases("the grid's predicted time", "your prediction", fn, cases, rtol=1e-3,
                       atol=1e-9,
                       hint="programs = S x H whatever B, started at ns_per_program_per_sm / sms "
                            "each across the GPU (the per-SM figure, the SMs sharing the "
                            "programs evenly); and the bytes still have to move",
                       bar=(solution_grid_us, solution_predicted_us))


# --- notebook 06: the backward pass -----------------------------------------------------------

def _jacobian_pair(theta: float) -> torch.Tensor:
    """d y / d x [2, 2] of RoPE on one pair (x_a, x_b) rotated by theta (reference, fp64)."""
    freqs = torch.full((1, 1, 1, 2), float(theta), dtype=torch.float32)

    def f(v):
        return reference.rope_reference(v.view(1, 1, 1, 2), freqs).view(2)
    return torch.autograd.functional.jacobian(f, torch.zeros(2, dtype=torch.float64))


def check_backward_matrix(fn: Callable) -> bool:
    """fn(theta) -> M [2, 2] with grad_x = M @ grad_y for one pair rotated by theta."""
    seed, g = fresh_generator()     # and an angle drawn now: a table made beforehand fails
    drawn = round(float(torch.empty((), dtype=torch.float64).uniform_(-20, 20, generator=g)), 6)
    cases = [(f"theta={t:g}" + (f" (drawn with seed {seed})" if t is drawn else ""), (t,),
              _jacobian_pair(t).T) for t in (0.3, -1.2, 2.5, 10.0, drawn)]
    return check_cases("backward matrix of one pair", "your matrix", fn, cases, atol=1e-6, rtol=1e-6,
                       hint="grad_x = J^T grad_y, and J is the rotation by theta",
                       bar=(_jacobian_pair,))


def _reference_grad(grad_y: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    x = torch.zeros(grad_y.shape, dtype=torch.float64, device=grad_y.device, requires_grad=True)
    (gx,) = torch.autograd.grad(reference.rope_reference(x, freqs), x, grad_y.double())
    return gx.to(grad_y.dtype)


def _solutions():
    """What the checks of notebook 06 bar besides ropelib: the worked answers and the helpers that
    compute the expected gradient."""
    from .backward_kernel import _rope_backward_solution_kernel, reference_grad
    return (solution_rope_backward, SolutionRopeFunction, _rope_backward_solution_kernel,
            reference_grad, _reference_grad)


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", type(kernel).__name__)


def _launched(kernel, kernels) -> bool:
    """Was `kernel` (or a kernel of the same function) among the launched `kernels`?"""
    fn = getattr(kernel, "fn", kernel)
    return any(k is kernel or getattr(k, "fn", None) is fn for k in kernels)


def _kernel_wrote(launches: dict, kernel, want: torch.Tensor) -> bool:
    """Did a launch (of `kernel` when given, else of any @triton.jit kernel but ropelib's) write a
    tensor holding `want`? `launches` from count_launches(written=True)."""
    for launched, t in launches["written"]:
        if kernel is not None and not _launched(kernel, [launched]):
            continue
        if t.shape == want.shape and _compare(t, want, 1e-5, 1e-5)[0]:
            return True
    return False


def _returned_what_kernel_wrote(launches: dict, kernel, got) -> bool:
    """Is `got` (what the answer returned) a tensor that a launch of `kernel` (when given, else
    of any @triton.jit kernel) wrote into, or a view of one? `launches` from
    count_launches(written=True)."""
    if not isinstance(got, torch.Tensor):
        return False
    at = got.untyped_storage().data_ptr()
    return any(ptr == at for launched, ptr in launches["written_storage"]
               if kernel is None or _launched(kernel, [launched]))


def _kernel_written(name: str, kernel) -> bool:
    """False (with a ❌ line) when exercise 2's kernel is given but still blank."""
    if kernel is not None and is_blank_kernel(kernel):
        print(f"❌ {name}: your backward kernel ({_kernel_name(kernel)}) is still blank: write it "
              "first (exercise 2), then launch it here")
        return False
    return True


def check_rope_backward(fn: Callable, kernel=None) -> bool:
    """fn(grad_y, freqs) -> grad_x for sbhd grad_y [S, B, H, D] (also stride-0 grad_y) and TE's
    table freqs [P, 1, 1, R] (P >= S; also R < D, partial rotary), computed
    by a Triton kernel of the learner's that the function launches: `kernel` (exercise 2's) when
    given. A PyTorch-only answer does not count, and neither do ropelib's kernels: the function
    runs with ropelib's answers barred (`ropelib.apply_rope(g, -freqs)`, the teaching kernels'
    `rope_batch_reuse(g, freqs, backward=True)`, the worked solution and its kernel) and with
    the kernels the running notebook defines barred too (`own_code.notebook_kernels`: notebook
    06's section-2 kernel, which `rope_cell` launches). The tensor it returns must be the one
    the learner's kernel wrote into: a launch beside an answer computed another way fails."""
    from .backward_kernel import count_launches

    name = "grad_x from grad_y"
    what = "your launcher of your backward kernel"
    if not _kernel_written(name, kernel):
        return False
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(1)
    cases = []
    # (S, B, H, D, rotary dim R, table positions P >= S, stride 0 over the batch)
    seed, fresh = fresh_generator()  # the last case drawn now: answers made beforehand fail
    for S, B, H, D, R, P, expand in ((3, 2, 2, 16, 16, 3, False), (2, 3, 1, 24, 16, 5, False),
                                     (3, 2, 2, 8, 8, 3, True), (3, 2, 2, 16, 16, 4, None)):
        if expand is None:
            g = torch.randn(S, B, H, D, generator=fresh).to(device)
        elif expand:  # what y.sum() or an expand gives: stride 0 along the batch
            g = torch.randn(S, 1, H, D, generator=gen).to(device).expand(S, B, H, D)
        else:
            g = torch.randn(S, B, H, D, generator=gen).to(device)
        freqs = te_angles(P, R, device=device)
        label = (f"grad_y [{S}, {B}, {H}, {D}]" + (" stride 0 over batch" if expand else "")
                 + (f", rotary dim {R} of {D}" if R < D else "")
                 + (f", a table of {P} positions" if P > S else "")
                 + (f" (drawn with seed {seed})" if expand is None else ""))
        cases.append((label, (g, freqs), _reference_grad(g, freqs)))
    with count_launches(written=True) as launched:
        ok, got = run_own_code(f"{name} ({cases[0][0]})", what, fn, *cases[0][1],
                               bar=(*_solutions(), *notebook_kernels()))
    if not ok:
        return False
    if launched["launches"] == 0:
        print(f"❌ {name}: no Triton kernel was launched: launch your backward kernel "
              "(exercise 2) on grid (S, H), into a tensor you allocate")
        return False
    if kernel is not None and not _launched(kernel, launched["kernels"]):
        print(f"❌ {name}: your function launched "
              f"{', '.join(sorted({_kernel_name(k) for k in launched['kernels']}))}, not your "
              f"backward kernel {_kernel_name(kernel)} (exercise 2): launch that one")
        return False
    right = isinstance(got, torch.Tensor) and got.shape == cases[0][2].shape and \
        _compare(got, cases[0][2], 1e-5, 1e-5)[0]
    if right and not _kernel_wrote(launched, kernel, cases[0][2]):   # (wrong values: below)
        print(f"❌ {name}: your kernel ran, but no tensor it wrote holds grad_x: the gradient "
              "your function returns must be what your backward kernel computes, not a "
              "PyTorch formula beside a launch")
        return False
    if right and not _returned_what_kernel_wrote(launched, kernel, got):
        print(f"❌ {name}: your kernel wrote grad_x, but your function returned another tensor: "
              "return the grad_x you allocated and launched your backward kernel into, not a "
              "copy of it or a gradient computed another way")
        return False
    return check_cases(name, what, fn, cases, atol=1e-5, rtol=1e-5,
                       bar=(*_solutions(), *notebook_kernels()),
                       hint="the transpose of each pair's rotation (section 1); read grad_y through "
                            "its strides, stride 0 included, and allocate a contiguous grad_x")


def _held_tensors(obj, depth: int = 0):
    """Tensors in obj: a tensor, or lists/tuples/dicts of them (two levels deep)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 2 and isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _held_tensors(o, depth + 1)
    elif depth < 2 and isinstance(obj, dict):
        for o in obj.values():
            yield from _held_tensors(o, depth + 1)


def check_rope_function(cls, kernel=None) -> bool:
    """cls: a torch.autograd.Function with forward(ctx, x, freqs) -> y (sbhd RoPE).

    Checks, on fresh inputs: y and grad_x against the reference (grad_x also for the stride-0
    gradient of y.sum()); that forward and backward each launch a Triton kernel; and that nothing
    keeps x alive or holds a tensor as large as x once forward has returned (RoPE is linear in x:
    its backward needs the angles, not the activation). The last is what is checkable about
    memory: `ctx.save_for_backward(x)`, `ctx.x = x`, a copy of x or of y in ctx, or x parked in a
    global all fail it. Beyond that, the only tensor the Function may keep in ctx is freqs
    itself (saved or as an attribute): -freqs or cos/sin tables beside or instead of it fail.

    The forward must launch a kernel of the learner's: their own backward launcher at -freqs
    (the transpose of the rotation by -theta is the rotation by theta), or a forward kernel of
    their own. ropelib's teaching kernels are barred like its finished API, and so are the
    kernels the running notebook defines (`own_code.notebook_kernels`: notebook 06's section-2
    kernel, which `rope_cell` launches). The backward runs with the same bars, so it must launch
    the learner's own kernel (`kernel`, exercise 2's, when given). The worked solution is barred
    in both.
    """
    import gc
    import weakref

    from .backward_kernel import count_launches

    name = "RoPE autograd.Function"
    what_fwd = "your autograd.Function, its forward with a kernel of yours"
    what_bwd = "your autograd.Function's backward, with your own kernel"
    if cls is None or cls is Ellipsis:
        return check(name, None, True)
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        print(f"❌ {name}: expected a torch.autograd.Function subclass, got {cls!r}")
        return False
    device = runtime.default_device()
    _, gen = fresh_generator()      # inputs drawn now: answers computed beforehand fail
    S, B, H, D = 3, 2, 2, 16                 # x holds B * H = 4 times as many numbers as freqs
    leaf = torch.randn(S, B, H, D, generator=gen).to(device).requires_grad_()
    freqs = te_angles(S, D, device=device)
    g = torch.randn(S, B, H, D, generator=gen).to(device)
    want_y = reference.rope_reference(leaf.detach(), freqs)
    x = leaf * 1.0                           # a non-leaf: only what keeps it alive can hold it
    x_alive, x_numel = weakref.ref(x), x.numel()
    if not _kernel_written(name, kernel):
        return False
    with count_launches() as fwd_launches:
        ok, y = run_own_code(f"{name} (forward)", what_fwd, cls.apply, x, freqs,
                             bar=(*_solutions(), *notebook_kernels()))
    del x
    if not ok:
        return False
    same, _ = _compare(y, want_y, 1e-5, 1e-5)
    if not same:
        return check(f"{name} (forward)", y, want_y, atol=1e-5, rtol=1e-5)
    if fwd_launches["launches"] == 0:
        print(f"❌ {name}: forward launched no Triton kernel (a PyTorch formula does not count): "
              "call a kernel launcher of yours: your backward launcher at -freqs")
        return False
    gc.collect()
    ctx = y.grad_fn
    held = list(getattr(ctx, "saved_tensors", ()) or ())
    held += [t for v in vars(ctx).values() for t in _held_tensors(v)] if hasattr(ctx, "__dict__") else []
    big = [tuple(t.shape) for t in held if t.numel() >= x_numel]
    if x_alive() is not None or big:
        what = "x is still alive after forward returned" if x_alive() is not None else \
            f"ctx holds a tensor as large as x ({big[0]})"
        print(f"❌ {name}: {what}. The backward of RoPE needs only the angles (it is linear in "
              "x): save freqs with ctx.save_for_backward, and keep no activation for it")
        return False
    others = [tuple(t.shape) for t in held
              if not (t.data_ptr() == freqs.data_ptr() and t.shape == freqs.shape)]
    if others:
        print(f"❌ {name}: your Function keeps {', '.join(map(str, others))} beside freqs. Keep "
              "only freqs (ctx.save_for_backward(freqs)): the backward is your launcher at "
              "freqs, and needs nothing else")
        return False
    y_sum = y.sum()                          # outside the block: autograd's sum, not the answer's
    with count_launches(written=True) as bwd_launches:
        try:
            with library_barred(what_bwd, bar=(*_solutions(), *notebook_kernels())):
                (gx,) = torch.autograd.grad(y, leaf, g, retain_graph=True)
                (gx_sum,) = torch.autograd.grad(y_sum, leaf)
        except LibraryAnswer as exc:
            print(f"❌ {name} (backward): {exc}")
            return False
        except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
            print(f"❌ {name} (backward): raised {type(exc).__name__}: {exc}")
            return False
    if bwd_launches["launches"] < 2:
        print(f"❌ {name}: backward launched no Triton kernel: launch your backward kernel "
              "(exercise 2), through your launcher (exercise 3)")
        return False
    if kernel is not None and not _launched(kernel, bwd_launches["kernels"]):
        print(f"❌ {name}: the backward launched "
              f"{', '.join(sorted({_kernel_name(k) for k in bwd_launches['kernels']}))}, not your "
              f"backward kernel {_kernel_name(kernel)} (exercise 2)")
        return False
    if not _compare(gx, _reference_grad(g, freqs), 1e-5, 1e-5)[0]:
        return check(f"{name} (grad_x)", gx, _reference_grad(g, freqs), atol=1e-5, rtol=1e-5,
                     hint="backward returns one gradient per forward input: (grad_x, None)")
    if not _kernel_wrote(bwd_launches, kernel, _reference_grad(g, freqs)):
        print(f"❌ {name}: the backward launched a kernel, but no tensor it wrote holds grad_x: "
              "backward must return what your backward kernel computes")
        return False
    want_sum = _reference_grad(torch.ones((), device=device).expand(S, B, H, D), freqs)
    if not _compare(gx_sum, want_sum, 1e-5, 1e-5)[0]:
        return check(f"{name} (grad_x of y.sum(), a stride-0 gradient)", gx_sum, want_sum,
                     atol=1e-5, rtol=1e-5)
    print(f"✅ {name}: y and grad_x match the reference (also for y.sum()), forward and backward "
          "launch kernels, and nothing as large as x is kept for the backward")
    return True


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


def solution_angle_bytes(generation, S, B, H, D):
    programs = S * B * H if generation == "naive" else S * H  # batch_reuse: grid (S, H)
    return programs * D * 4                                    # D fp32 angles per program


def solution_floor_ms(nbytes, copy_gbps):
    return nbytes / (copy_gbps * 1e9) * 1e3


def solution_percent_of_copy(kernel_ms, copy_ms):
    # a ratio of times: a ratio of GB/s would count the fp32 angles for the kernel and not for
    # the copy, and put the kernel higher by (2Ne + 4SD) / 2Ne
    return 100.0 * copy_ms / kernel_ms


def solution_grid_us(S, B, H, sms, ns_per_program_per_sm, copy_us):
    programs = S * H                                   # grid (S, H): B does not change it
    starts_us = programs / sms * ns_per_program_per_sm / 1e3   # GPU-wide: ns / sms a program
    return max(starts_us, copy_us)                     # and the bytes must still move


def solution_backward_matrix(theta):
    c, s = math.cos(theta), math.sin(theta)
    # forward J = [[c, -s], [s, c]]; backward is its transpose, the rotation by -theta
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


def solution_rope_backward(grad_y, freqs):
    from .backward_kernel import _rope_backward_solution_kernel  # exercise 2's kernel

    S, B, H, D = grad_y.shape
    R = freqs.shape[-1]
    f2 = freqs.reshape(freqs.shape[0], R)[:S].float().contiguous()   # [S, R] as the kernel reads it
    grad_x = torch.empty(grad_y.shape, dtype=grad_y.dtype, device=grad_y.device)
    _rope_backward_solution_kernel[(S, H)](                          # grid (S, H), loop over B
        grad_y, grad_x, f2, B,
        *grad_y.stride(),                 # any strides: stride-0 grad_y is read as it is
        grad_x.stride(0), grad_x.stride(1), grad_x.stride(2),
        D, ROT_HALF=R // 2, BLOCK_HALF=triton.next_power_of_2(R // 2),
        BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)))
    return grad_x


class SolutionRopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, freqs):
        ctx.save_for_backward(freqs)  # not x: the backward is linear and needs only the angles
        # the backward's kernel at -theta: the transpose of the rotation by -theta is the
        # rotation by theta
        return solution_rope_backward(x, -freqs)

    @staticmethod
    def backward(ctx, grad_y):
        (freqs,) = ctx.saved_tensors
        return solution_rope_backward(grad_y, freqs), None  # your kernel; no gradient for freqs
