"""Notebook 12's kernel exercises: RoPE in the epilogue of the QKV GEMM, and its inverse in the
prologue of the dX GEMM.

The learner edits two small Triton GEMMs whose main loops are written (the signatures of
`ropelib.course.kernels.qkv_teaching`'s kernels):

* the forward, grid (cdiv(M, BLOCK_M), H), one program per (tile of tokens, head) holding the
  head as two accumulators (features j and j + D/2): the epilogue rotates a q or k head's tile
  by each token's angles before it is stored, and stores a v head as it is;
* the same forward holding the head as one accumulator [BLOCK_M, D] (one tl.dot a K step, as
  ropelib's forward does): the epilogue splits it into its two halves, rotates, and joins them;
* the forward on a persistent main loop with TMA loads (section 7.2's editable kernel, written
  out in the notebook): PROGRAMS programs walk the (token tile, head) tiles; its check launches
  fewer programs than tiles, twice, with different counts (check_persistent_kernel);
* the dX GEMM, grid (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K)), looping over the heads: the prologue
  turns the gradient of a rotated q or k head into the gradient of the projection,
  dY = R(-theta) dL/dq, as the tile is loaded, so dY is never written.

Each check launches the learner's kernel itself on inputs it draws fresh: token counts that are
not multiples of BLOCK_M, hidden sizes that are not multiples of BLOCK_K, grouped-query heads
(HQ > HK), head dims 32 and 64, positions in random order (so a token's position is not its
index), and an angle table of free angles (so every feature's sine matters). The output starts as
NaN between NaN guard bands, so an unwritten element or a store past the last token shows. The
expected values are the fp64 PyTorch reference (`reference_qkv`, and autograd through it for
dX); a test holds that reference to `ropelib.qkv_rope_linear`. Where the dX kernel's results are
right, the check runs it once more in Triton's interpreter and counts the elements it loads from
cos and sin (`work_count.count_work`): the exercise asks for them once per program, so a kernel
that loads them for every head is refused.

Beside the exercises, `paired_rounds` (ropelib.course.rounds's, which the notebook calls as
`round_stats.paired_rounds`) compares two variants timed in the same rounds round by round
(section 7.1): the median ratio, its range, the rounds each won and a sign test.

Only a `@triton.jit` kernel is accepted, and it runs with ropelib's own answers barred
(`own_code`): the finished kernels, the teaching kernels (the worked solutions, shown with
`show_epilogue_solution`, `show_split_epilogue_solution` and `show_prologue_solution`) and a
kernel that calls one of their
@triton.jit helpers are refused.
"""
from typing import Callable, Optional

import torch
import triton

from ... import runtime
from ..kernels import qkv_teaching
from ..rounds import paired_rounds  # noqa: F401  (ex.paired_rounds, as tests call it)
from . import _compare, check, exception_line, is_blank_kernel, is_kernel, solution
from .own_code import fresh_seed, launch_barred

__all__ = ["check_epilogue_kernel", "check_split_epilogue_kernel", "check_prologue_kernel",
           "check_persistent_kernel", "PERSISTENT_PROGRAMS",
           "show_epilogue_solution", "show_split_epilogue_solution", "show_prologue_solution", "reference_qkv", "reference_dx", "draw_inputs",
           "launch_forward", "launch_dx", "CASES"]

# (M tokens, K hidden, HQ, HK, D, BLOCK_M, BLOCK_K): a few programs each, for the interpreter
CASES = (
    (20, 48, 2, 1, 32, 16, 16),     # a partial token tile, three steps of the K loop
    (37, 40, 3, 1, 64, 32, 32),     # D = 64, a partial K step
    (16, 32, 4, 2, 32, 16, 16),     # grouped-query heads, one token tile
)
_PAD = 2        # guard band: tokens of NaN before the output, and _PAD + BLOCK_M after it (an
                # unmasked last tile stores into the band, not past the buffer)


def _tolerance():
    # the interpreter multiplies fp32 in fp32; a GPU's tl.dot multiplies fp32 inputs in TF32
    return (1e-4, 1e-4) if runtime.INTERPRET else (2e-2, 2e-2)


def draw_inputs(gen: torch.Generator, M, K, HQ, HK, D, device=None):
    """x [M, K], weight [(HQ + 2 HK) D, K] (outputs of order 1), cos and sin [P, D/2] of free
    angles, positions [M] int64 in random order (P = 2 M + 3 rows, not all used)."""
    device = device or runtime.default_device()
    H, P = HQ + 2 * HK, 2 * M + 3
    x = torch.randn(M, K, generator=gen)
    w = torch.randn(H * D, K, generator=gen) / K ** 0.5
    theta = torch.rand(P, D // 2, generator=gen) * 6.0 - 3.0
    pos = torch.randperm(P, generator=gen)[:M]
    return (x.to(device), w.to(device), theta.cos().to(device), theta.sin().to(device),
            pos.to(device))


def reference_qkv(x, weight, cos, sin, positions, HQ, HK, D) -> torch.Tensor:
    """qkv [M, H, D] in fp64: x @ weight^T split into heads, q's and k's heads rotated
    rotate-half (feature j with j + D/2) by the angles of each token's position."""
    M, H, half = x.shape[0], HQ + 2 * HK, D // 2
    y = (x.double() @ weight.double().T).view(M, H, D)
    c = cos.double()[positions][:, None, :]
    s = sin.double()[positions][:, None, :]
    a, b = y[..., :half], y[..., half:]
    rotated = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    n_rot = HQ + HK
    return torch.cat((rotated[:, :n_rot], y[:, n_rot:]), dim=1)


def reference_dx(grad_qkv, x, weight, cos, sin, positions, HQ, HK, D) -> torch.Tensor:
    """dL/dx [M, K] in fp64 for the gradient grad_qkv [M, H, D] of reference_qkv's output:
    autograd through the fp64 reference (it does not use the inverse rotation's formula)."""
    x64 = x.double().detach().requires_grad_(True)
    y = reference_qkv(x64, weight, cos, sin, positions, HQ, HK, D)
    (gx,) = torch.autograd.grad(y, x64, grad_qkv.double())
    return gx


def launch_forward(kernel, x, weight, out, cos, sin, positions, HQ, HK, D, BLOCK_M, BLOCK_K,
                   rotate=True, programs=None, **options):
    """Launch a forward kernel (the teaching kernel's signature) on grid (cdiv(M, BLOCK_M), H).
    rotate=False passes N_ROT = 0: no head is a q or k head, so every head is stored as v is,
    unrotated, and the launch times the same GEMM without the epilogue's rotation.

    programs=P: a persistent kernel (the same signature and a last constexpr PROGRAMS) on grid
    (P,), each program walking the (token tile, head) tiles program_id, program_id + P, ... On a
    GPU this sets the allocator Triton asks for the scratch of descriptors made in a kernel
    (tl.make_tensor_descriptor): this module's own, so that the launch calls no code of the
    library (the check refuses answers that do).

    options: Triton's launch options (num_warps, num_stages), passed on as they are; Triton's
    defaults (4 warps, 3 stages) where absent. The interpreter accepts and ignores them."""
    M, K = x.shape
    H = HQ + 2 * HK
    n_rot = HQ + HK if rotate else 0
    if programs is None:
        grid, persistent = (triton.cdiv(M, BLOCK_M), H), {}
    else:
        grid, persistent = (programs,), dict(PROGRAMS=programs)
        if not runtime.INTERPRET:
            triton.set_allocator(_descriptor_scratch)
    kernel[grid](x, weight, out, cos, sin, positions, M, K, H, n_rot,
                 D=D, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, **persistent, **options)


# programs the persistent check launches: fewer than every case's tiles (8, 10 and 8), so a kernel
# that does not walk its tiles leaves some unwritten; two counts, so none is built into it
PERSISTENT_PROGRAMS = (3, 5)


def _descriptor_scratch(size: int, alignment: int, stream):
    """The scratch a launch's device-side descriptors ask for: torch's caching allocator."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch_dx(kernel, grad_qkv, weight, grad_x, cos, sin, positions, HQ, HK, D, BLOCK_M,
              BLOCK_K):
    """Launch a dX kernel (the teaching kernel's signature) on grid
    (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K))."""
    M, K = grad_x.shape
    H = HQ + 2 * HK
    kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(K, BLOCK_K))](
        grad_qkv, weight, grad_x, cos, sin, positions, M, K, H, HQ + HK,
        D=D, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K)


def _ready(name: str, kernel, reads: str) -> bool:
    if kernel is None or kernel is Ellipsis:
        print(f"❌ {name}: no answer yet (define the kernel)")
        return False
    if not is_kernel(kernel):
        print(f"❌ {name}: expected a function decorated with @triton.jit, got "
              f"{type(kernel).__name__}: the check launches your kernel on inputs it draws "
              f"itself, so only what the kernel stores through {reads} counts")
        return False
    if is_blank_kernel(kernel):
        print(f"❌ {name}: no answer yet (write the kernel's body, then rerun the cell)")
        return False
    return True


def _label(M, K, HQ, HK, D, BLOCK_M, BLOCK_K) -> str:
    return (f"M={M} tokens, K={K}, {HQ} q / {HK} k,v heads of {D}, "
            f"BLOCK_M={BLOCK_M}, BLOCK_K={BLOCK_K}")


def _run_cases(name: str, what: str, kernel, seed: Optional[int], make_output: Callable,
               launch: Callable, expected: Callable, where: Callable, hint: str,
               structure: Optional[Callable] = None) -> bool:
    """Launch `kernel` on each case into a NaN output inside NaN guard bands; compare. Where
    every case is right, `structure(kernel)` (if given) may still refuse the kernel: it returns
    None to accept it, or what is wrong with how it is built."""
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    atol, rtol = _tolerance()
    for case in CASES:
        M, K, HQ, HK, D, BLOCK_M, BLOCK_K = case
        label = _label(*case)
        inputs = draw_inputs(gen, M, K, HQ, HK, D)
        x, w, cos, sin, pos = inputs
        extra = make_output(gen, case, inputs)          # (kernel input or None, buffer, view)
        kin, buf, out = extra
        before = [t.clone() for t in (x, w, cos, sin, pos) + ((kin,) if kin is not None else ())]
        ok, _ = launch_barred(name, label, what, lambda: launch(kernel, case, inputs, kin, out))
        if not ok:
            return False
        if not (bool(torch.isnan(buf[:_PAD]).all()) and bool(torch.isnan(buf[_PAD + M:]).all())):
            print(f"❌ {name} ({label}): the kernel wrote outside the output (into the NaN guard "
                  "band around it): mask the last token tile (m < M)"
                  + (" and the last column tile (k < K)" if buf.dim() == 2 else ""))
            return False
        after = (x, w, cos, sin, pos) + ((kin,) if kin is not None else ())
        if not all(torch.equal(a, b) for a, b in zip(after, before)):
            print(f"❌ {name} ({label}): the kernel changed one of its inputs")
            return False
        bad = torch.isnan(out)
        if bool(bad.any()):
            first = [int(i) for i in bad.nonzero()[0]]
            print(f"❌ {name} ({label}): {int(bad.sum())} of {out.numel()} output elements were "
                  f"not written (the output starts as NaN), first at {where(first)}")
            return False
        want = expected(case, inputs, kin)
        ok, _ = _compare(out, want, atol, rtol)
        if not ok:
            print(f"   (inputs drawn with seed={seed})")
            return check(f"{name} ({label})", out, want, atol=atol, rtol=rtol, hint=hint)
    wrong = structure(kernel) if structure is not None else None
    if wrong:
        print(f"❌ {name}: the results are right, but {wrong}")
        return False
    print(f"✅ {name}: correct on {len(CASES)} launches (partial token and K tiles, grouped-query "
          "heads, D = 32 and 64, positions in random order, free angles)")
    return True


def _check_forward(name: str, what: str, kernel, seed: Optional[int], hint: str,
                   structure: Optional[Callable] = None, programs: Optional[int] = None) -> bool:
    """Launch a forward kernel (the teaching kernel's signature) into a NaN qkv [M, H, D] inside
    NaN guard bands and compare it with the fp64 reference."""
    if not _ready(name, kernel, "out_ptr"):
        return False

    def make_output(gen, case, inputs):
        M, K, HQ, HK, D = case[:5]
        buf = torch.full((_PAD + M + _PAD + case[5], HQ + 2 * HK, D), float("nan"),
                         dtype=inputs[0].dtype, device=inputs[0].device)
        return None, buf, buf[_PAD:_PAD + M]

    def launch(kernel, case, inputs, kin, out):
        x, w, cos, sin, pos = inputs
        launch_forward(kernel, x, w, out, cos, sin, pos, *case[2:], programs=programs)

    def expected(case, inputs, kin):
        HQ, HK, D = case[2:5]
        return reference_qkv(*inputs, HQ, HK, D).to(inputs[0].dtype)

    def where(first):
        return f"[token, head, feature] = {first}"

    return _run_cases(name, what, kernel, seed, make_output, launch, expected, where, hint,
                      structure)


def check_epilogue_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's forward kernel (the teaching kernel's signature) and compare its
    qkv [M, H, D] with the fp64 reference. Prints ✅ or ❌ with the first failing case; never
    raises. `seed` fixes the inputs (default: fresh ones, the seed printed on a failure)."""
    return _check_forward(
        "QKV GEMM with RoPE in the epilogue", "your epilogue", kernel, seed,
        hint="for a q or k head (h < N_ROT), at each token's position p: "
             "q[j] = a cos - b sin and q[j + D/2] = b cos + a sin, with a = acc_a, b = acc_b "
             "and cos, sin = row p of the tables (p = positions[m], not m); a v head is stored "
             "as it is")


# a small launch of the forward's signature, compiled for sm_90 to count its matrix multiplies
_SPLIT_COMPILE = dict(M=20, K=48, H=4, N_ROT=3, D=32, BLOCK_M=16, BLOCK_K=16)


def _matrix_multiplies(kernel) -> Optional[str]:
    """None if `kernel`, compiled for sm_90 (offline, no GPU needed), issues exactly one matrix
    multiply (tt.dot) in its K loop; otherwise what is wrong. A kernel that cannot be compiled
    here (no compiler for sm_90 on this machine) is accepted on its results, with a note."""
    from ..load_schedule import schedule
    f32, i64 = torch.empty(16, dtype=torch.float32), torch.empty(16, dtype=torch.int64)
    args = dict(x_ptr=f32, w_ptr=f32, out_ptr=f32, cos_ptr=f32, sin_ptr=f32, pos_ptr=i64,
                **_SPLIT_COMPILE)
    try:
        dots = schedule(kernel, args, num_warps=4)["dots"]
    except Exception as exc:  # noqa: BLE001 -- the results were right: accept, and say so
        print(f"   (not checked: how many matrix multiplies your kernel issues; compiling it for "
              f"sm_90 here raised {exception_line(exc)})")
        return None
    if dots == 1:
        return None
    return (f"your kernel compiles to {dots} matrix multiplies a K step, where this exercise "
            f"asks for one: hold the head as ONE accumulator acc [BLOCK_M, D], filled by one "
            f"tl.dot a K step, and split it in the epilogue (tl.reshape, tl.permute, tl.split)")


def check_split_epilogue_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's forward kernel that holds each head as one accumulator [BLOCK_M, D]
    (the signature of the two-accumulator kernel) and compare its qkv [M, H, D] with the fp64
    reference, as check_epilogue_kernel does; where the results are right, compile it for sm_90
    (offline) and refuse it unless it issues exactly one matrix multiply a K step (a kernel with
    two accumulators computes the same numbers). Prints ✅ or ❌; never raises."""
    return _check_forward(
        "QKV GEMM with one accumulator, split in the epilogue", "your split", kernel, seed,
        hint="acc [BLOCK_M, D] holds feature j at column j and its partner j + D/2 at column "
             "j + D/2: tl.reshape to [BLOCK_M, 2, D/2] puts the two halves on axis 1; "
             "tl.permute to [BLOCK_M, D/2, 2] moves them last, where tl.split separates them; "
             "rotate, then tl.join and the inverse permute and reshape give [BLOCK_M, D] back",
        structure=_matrix_multiplies)


def check_persistent_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's persistent forward kernel (the teaching kernel's signature and a
    last constexpr PROGRAMS) on fewer programs than there are (token tile, head) tiles, once for
    each count in PERSISTENT_PROGRAMS, and compare its qkv [M, H, D] with the fp64 reference, as
    check_epilogue_kernel does. Prints ✅ or ❌; never raises."""
    name = "persistent QKV GEMM with RoPE in the epilogue"
    for programs in PERSISTENT_PROGRAMS:
        print(f"   launched on {programs} programs:")
        if not _check_forward(
                name, "your persistent kernel", kernel, seed,
                hint="each program walks the tiles tile = program_id, program_id + PROGRAMS, "
                     "...: every (token tile, head) tile once over all programs, each tile's "
                     "accumulators set to zero before its K loop; the epilogue as in exercise 1",
                programs=programs):
            return False
    return True


def _cos_sin_loads(kernel, seed: int = 0) -> Optional[str]:
    """None if the dX kernel, run by Triton's interpreter on the first case's shape (three q
    and k heads to rotate), loads no more elements of cos and of sin than once per program:
    each program's BLOCK_M rows of D/2 angles. Otherwise what is wrong (a kernel that loads
    them for every head loads them three times)."""
    from ..work_count import count_work, interpreted
    from .own_code import LibraryAnswer, library_barred

    M, K, HQ, HK, D, BLOCK_M, BLOCK_K = CASES[0]
    gen = torch.Generator().manual_seed(seed)
    x, w, cos, sin, pos = draw_inputs(gen, M, K, HQ, HK, D, device="cpu")
    g = torch.randn(M, HQ + 2 * HK, D, generator=gen)
    gx = torch.empty(M, K, dtype=w.dtype)
    try:
        with count_work(cos=cos, sin=sin) as work, library_barred("your prologue"):
            launch_dx(interpreted(kernel), g, w, gx, cos, sin, pos, HQ, HK, D, BLOCK_M, BLOCK_K)
    except LibraryAnswer as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
        return f"counting its loads in the interpreter raised {exception_line(exc)}"
    once = work.programs * BLOCK_M * (D // 2)        # every program reads its rows once
    cos_n, sin_n = work.loads["cos"], work.loads["sin"]
    if cos_n <= once and sin_n <= once:
        return None
    return (f"in the interpreter it loads {cos_n} elements of cos and {sin_n} of sin for "
            f"{work.programs} programs of {BLOCK_M} tokens x {D // 2} angles (M={M}, "
            f"{HQ + HK} q and k heads), where loading each program's rows once reads at most "
            f"{once} of each: load cos and sin once per program, before the loop over the "
            "heads, and reuse them for every q and k head")


def check_prologue_kernel(kernel, seed: Optional[int] = None) -> bool:
    """Launch the learner's dX kernel (the teaching kernel's signature) on a fresh gradient of
    q, k and v and compare dL/dx [M, K] with autograd through the fp64 reference; where the
    results are right, run it once more in Triton's interpreter and refuse it unless it loads
    cos and sin once per program (`_cos_sin_loads`; a kernel that loads them for every head
    computes the same numbers). Prints ✅ or ❌; never raises."""
    name = "dX GEMM with the inverse rotation in the prologue"
    if not _ready(name, kernel, "gx_ptr"):
        return False

    def make_output(gen, case, inputs):
        M, K, HQ, HK, D = case[:5]
        g = torch.randn(M, HQ + 2 * HK, D, generator=gen).to(inputs[0].device)
        buf = torch.full((_PAD + M + _PAD + case[5], K), float("nan"), dtype=inputs[1].dtype,
                         device=inputs[1].device)
        return g, buf, buf[_PAD:_PAD + M]

    def launch(kernel, case, inputs, g, out):
        x, w, cos, sin, pos = inputs
        launch_dx(kernel, g, w, out, cos, sin, pos, *case[2:])

    def expected(case, inputs, g):
        HQ, HK, D = case[2:5]
        return reference_dx(g, *inputs, HQ, HK, D).to(inputs[1].dtype)

    def where(first):
        return f"[token, hidden column] = {first}"

    return _run_cases(
        name, "your prologue", kernel, seed, make_output, launch, expected, where,
        hint="the forward rotated (a, b) by R(theta); the gradient goes back through "
             "R(theta)^T = R(-theta): dY_a = g_a cos + g_b sin, dY_b = g_b cos - g_a sin, for "
             "q and k heads only (h < N_ROT); v's gradient is dY as it is",
        structure=_cos_sin_loads)


def show_epilogue_solution() -> None:
    """Show the worked forward kernel (ropelib.course.kernels.qkv_teaching) folded away."""
    solution(qkv_teaching._qkv_rope_teaching_kernel.fn,
             title="Solution: the QKV GEMM with RoPE in its epilogue")


def show_split_epilogue_solution() -> None:
    """Show the worked one-accumulator forward kernel (ropelib.course.kernels.qkv_teaching)."""
    solution(qkv_teaching._qkv_rope_one_acc_teaching_kernel.fn,
             title="Solution: one accumulator, split into its halves in the epilogue")


def show_prologue_solution() -> None:
    """Show the worked dX kernel (ropelib.course.kernels.qkv_teaching) folded away."""
    solution(qkv_teaching._qkv_dx_teaching_kernel.fn,
             title="Solution: the dX GEMM with the inverse rotation in its prologue")
