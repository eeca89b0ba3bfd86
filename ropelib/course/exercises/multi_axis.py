"""Exercises of notebook 10 (multi-axis RoPE): the axis of each frequency pair, the positions of
an image grid after text, and a multi-axis RoPE kernel that forms each token's angles once.

Each `check_...` runs the learner's answer with ropelib's own answers barred (`own_code`: the
product's modules, ropelib.mrope's `axis_of_pairs` and `grid_positions` among them, and the
teaching kernels) and compares it with what ropelib computes, never with a hard-coded answer;
`solution_...` are the worked answers the notebook shows folded away
(tests/test_exercises_multi_axis.py checks that they pass and that library answers fail).

The kernel exercise (`check_mrope_kernel`) takes the learner's @triton.jit *kernel*. The check
allocates the outputs itself (NaN, inside NaN guard bands), launches the kernel with the
signature below on fresh inputs through Triton's interpreter on the CPU, barred from ropelib
and with its sines and cosines counted (`ropelib.course.work_count`), and compares q and k
with `ropelib.apply_mrope_qk`; on a GPU it then also runs the compiled kernel there. It passes
when the values match and the kernel evaluates at most two sines and cosines together per
(token, pair), one of each: angles formed twice would cost 4, formed per head twice the head
count. The launch is `launch_mrope`'s, or that of the launcher passed as `launch=` (notebook 10
defines its own, of the same signature, in a cell the learner reads).

    q_ptr, k_ptr,            # q [T, HQ, D] and k [T, HK, D]: T tokens, contiguous
    q_out_ptr, k_out_ptr,    # the rotated q and k, same shapes, contiguous
    pos_ptr,                 # positions [N_AXES, T], int32, contiguous
    inv_freq_ptr,            # [D // 2] fp32: the inverse frequency of pair j
    axis_ptr,                # [D // 2] int32: the axis pair j follows
    T,                       # tokens
    HQ: tl.constexpr,        # heads of q
    HK: tl.constexpr,        # heads of k
    D: tl.constexpr,         # head dim, a power of two, all rotated: pair j is (j, j + D/2)
    N_AXES: tl.constexpr,    # position axes (3 for M-RoPE: time, row, column)
    BLOCK_T: tl.constexpr,   # tokens per program; the grid is (cdiv(T, BLOCK_T),)

The heads exercise (`check_mrope_heads_kernel`, notebook 10's appendix C) takes a kernel of the
same signature plus `HPS: tl.constexpr` (heads rotated per loop step, a power of two; a step
past the last head is masked) and checks it the same way at HPS = 1, 2 and 4, at the cases'
tiles and at 1 token a program.
"""
from contextlib import nullcontext
from functools import partial
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from ... import mrope, runtime
from ..work_count import WorkCount, count_work, interpreted
from . import _compare, check, guard_band_writes, guarded_view, kernel_answer
from .own_code import (check_cases, fresh_generator, fresh_seed, installed_modules, launch_on,
                       listed_as_tensor)

__all__ = ["check_axis_of_pairs", "solution_axis_of_pairs", "check_text_then_image",
           "solution_text_then_image", "check_mrope_kernel", "solution_mrope_kernel",
           "check_mrope_heads_kernel", "solution_mrope_heads_kernel", "launch_mrope",
           "count_mrope", "KERNEL_CASES", "HEADS_PER_STEP_CHECKED"]


# --- 1. which axis does frequency pair j follow? ---------------------------------------------

def check_axis_of_pairs(fn: Callable) -> bool:
    """fn(section, interleaved) -> [sum(section)] ints: the axis of each frequency pair, with
    contiguous sections (Qwen2-VL) or Qwen3-VL's round-robin rule (interleaved=True). Your own
    code: ropelib.mrope's axis_of_pairs and multi_axis_frequencies are barred, and so is the
    worked solution."""
    seed, g = fresh_generator()     # and sections drawn now: a table made beforehand fails
    k, extra = int(torch.randint(1, 65, (), generator=g)), int(torch.randint(0, 33, (),
                                                                             generator=g))
    drawn = [([int(v) for v in torch.randint(1, 25, (3,), generator=g)], False),
             ([k + extra, k, k], True)]        # (round-robin: no later axis longer than the first)
    cases = [(f"{s}, interleaved={i}" + (f" (drawn with seed {seed})" if n >= 5 else ""),
              (list(s), i), mrope.axis_of_pairs(s, "mrope_interleaved" if i else "mrope").long())
             for n, (s, i) in enumerate((([16, 24, 24], False), ([2, 3, 3], False),
                                         ([24, 20, 20], True), ([3, 3, 2], True),
                                         ([8, 8], False), *drawn))]
    return check_cases("axis of each pair", "the axis of each pair worked out by your code", fn,
                       cases,
                       post=listed_as_tensor,
                       hint="contiguous: section[0] zeros, then section[1] ones, ...; interleaved: "
                            "start all 0, then pair j takes axis a >= 1 when j % n == a and "
                            "j < n * section[a]")


def solution_axis_of_pairs(section, interleaved):
    n, half = len(section), sum(section)
    if not interleaved:
        return torch.repeat_interleave(torch.arange(n), torch.tensor(section))
    axis = torch.zeros(half, dtype=torch.long)
    j = torch.arange(half)
    for a in range(1, n):
        axis[(j % n == a) & (j < n * section[a])] = a
    return axis


# --- 2. the positions of text, then an image --------------------------------------------------

def _text_then_image(n_text: int, h: int, w: int) -> torch.Tensor:
    text = torch.arange(n_text).expand(3, n_text)
    image = mrope.grid_positions(1, h, w, start=n_text)
    after = int(image.max()) + 1
    return torch.cat([text, image, torch.tensor([[after]] * 3)], 1)


def transformers_rope_index() -> tuple:
    """transformers' own position numbering of Qwen2-VL's family (each model class's
    `get_rope_index`), where transformers is installed: the same answer from a library."""
    found = []
    for module in installed_modules(f"transformers.models.{name}.modeling_{name}"
                                    for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")):
        found += [vars(cls)["get_rope_index"] for cls in vars(module).values()
                  if isinstance(cls, type) and "get_rope_index" in vars(cls)]
    return tuple(found)


def check_text_then_image(fn: Callable) -> bool:
    """fn(n_text, h, w) -> [3, n_text + h*w + 1] positions (time, row, column): n_text text
    tokens, one image of h x w patches in raster order, then one more text token. Your own
    code: ropelib.mrope.grid_positions, transformers' get_rope_index and the worked solution
    are barred."""
    seed, g = fresh_generator()     # and a prompt drawn now: a table made beforehand fails
    drawn = (int(torch.randint(0, 200, (), generator=g)),
             *(int(v) for v in torch.randint(1, 33, (2,), generator=g)))
    cases = [(f"n_text={n}, {h}x{w}" + (f" (drawn with seed {seed})" if c == 4 else ""),
              (n, h, w), _text_then_image(n, h, w))
             for c, (n, h, w) in enumerate(((3, 2, 2), (0, 1, 4), (5, 3, 2), (1, 4, 4), drawn))]
    return check_cases("text-then-image positions", "the positions built by your code", fn, cases,
                       post=listed_as_tensor, bar=transformers_rope_index(),
                       hint="text token i: (i, i, i); the image starts every axis at n_text and "
                            "adds its row to axis 1, its column to axis 2; the next text token "
                            "continues at one past the largest position used so far")


def solution_text_then_image(n_text, h, w):
    text = torch.arange(n_text).expand(3, n_text)
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack([torch.zeros(h * w, dtype=torch.long), rows.reshape(-1),
                         cols.reshape(-1)]) + n_text
    nxt = int(image.max()) + 1
    return torch.cat([text, image, torch.full((3, 1), nxt)], 1)


# --- 3. the kernel: every token's angles once, then all its heads ----------------------------

# (T, HQ, HK, D, section, style, dtype, BLOCK_T): a masked last tile, an odd head count, two
# axes, interleaved sections, bf16
KERNEL_CASES = (
    (7, 4, 2, 16, (2, 3, 3), "mrope", torch.float32, 4),
    (6, 3, 1, 16, (3, 3, 2), "mrope_interleaved", torch.float32, 2),
    (5, 2, 2, 8, (2, 2), "axial", torch.bfloat16, 4),
)


def launch_mrope(kernel, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 freqs: "mrope.AxisFrequencies", BLOCK_T: int, out=None, num_warps: int = 4,
                 HPS: "Optional[int]" = None):
    """Launch a kernel of the multi-axis exercises' signature: q [T, HQ, D], k [T, HK, D]
    contiguous, positions [N_AXES, T] int32 contiguous; freqs has inv_freq and axis [D // 2];
    `HPS` (heads per loop step) only for a kernel of the heads exercise. Returns (q_out, k_out)
    (`out`, if given)."""
    T, HQ, D = q.shape
    q_out, k_out = out if out is not None else (torch.empty_like(q), torch.empty_like(k))
    heads = {} if HPS is None else {"HPS": HPS}
    # grid: one program per tile of BLOCK_T tokens; each loops over the heads of q, then of k
    kernel[(triton.cdiv(T, BLOCK_T),)](
        q, k, q_out, k_out, positions, freqs.inv_freq, freqs.axis, T,
        HQ=HQ, HK=k.shape[1], D=D, N_AXES=positions.shape[0], BLOCK_T=BLOCK_T,
        num_warps=num_warps, **heads)
    return q_out, k_out


def _guarded(shape, dtype, device):
    """(buffer, view): a NaN view in the middle of a NaN buffer, so a store outside the view
    lands in memory the check owns and shows up."""
    pad = 64 + 4 * shape[-1]
    return (*guarded_view(shape, pad, dtype=dtype, device=device), pad)


def _kernel_inputs(case, gen):
    T, HQ, HK, D, section, style, dtype, _ = case
    q = torch.randn(T, HQ, D, generator=gen).to(dtype)
    k = torch.randn(T, HK, D, generator=gen).to(dtype)
    positions = torch.randint(0, 64, (len(section), T), generator=gen, dtype=torch.int32)
    base = float(torch.randint(100, 20000, (), generator=gen))
    freqs = mrope.multi_axis_frequencies(D, list(section), base, style=style)
    return q, k, positions, freqs


def count_mrope(kernel, q, k, positions, freqs, BLOCK_T: int,
                launch: Callable = launch_mrope) -> WorkCount:
    """Run a kernel of this module's signature in Triton's interpreter on CPU tensors and count
    its programs, sines, cosines and loads (of q, k, positions, inv_freq, axis). `launch` is the
    launcher, launch_mrope's signature (a notebook passes its own)."""
    with count_work(q=q, k=k, positions=positions, inv_freq=freqs.inv_freq,
                    axis=freqs.axis) as work:
        launch(interpreted(kernel), q, k, positions, freqs, BLOCK_T)
    return work


def _compare_outputs(name, label, got, want, bufs, tol) -> bool:
    for which, y, w, (buf, pad) in zip(("q", "k"), got, want, bufs):
        outside = guard_band_writes(buf, pad)
        if outside:
            print(f"❌ {name} ({label}): the kernel stored {outside} elements outside {which}_out "
                  "(a store without its mask, or a wrong row offset)")
            return False
        if bool(y.isnan().any()):
            where = tuple(int(i) for i in y.isnan().nonzero()[0])
            print(f"❌ {name} ({label}): {int(y.isnan().sum())} elements of {which}_out were "
                  f"never written (first at [token, head, feature] = {where})")
            return False
        same, _ = _compare(y, w, *tol)
        if not same:
            return check(f"{name} ({label}): {which}_out", y, w, atol=tol[0], rtol=tol[1],
                         hint="pair j turns by positions[axis[j], t] * inv_freq[j]; rotate-half "
                              "pairs features j and j + D/2")
    return True


def check_mrope_kernel(kernel, *, seed: Optional[int] = None,
                       launch: Callable = launch_mrope) -> bool:
    """Launch the learner's multi-axis RoPE kernel (the signature in this module's docstring)
    on fresh inputs with `launch` (launch_mrope's signature: a notebook passes its own);
    compare with ropelib.apply_mrope_qk and count its sines and cosines.

    Returns True when every case matches and the kernel forms each token's angles once (at
    most 2 sines and cosines together per (token, pair) over the tokens its programs cover).
    """
    name = "multi-axis RoPE kernel"
    if not kernel_answer(name, kernel, "the outputs it allocated"):
        return False
    launches = [(case, case[-1], {}) for case in KERNEL_CASES]
    ok, counts = _check_launches(name, kernel, launches, seed, launch)
    if not ok:
        return False
    gpu = " and compiled on the GPU" if runtime.on_gpu() else ""
    print(f"✅ {name}: correct on {len(KERNEL_CASES)} launches in the interpreter{gpu} (M-RoPE, "
          f"interleaved, 2-D axial; a masked tile; fp32 and bf16), with "
          f"{_pairs(max(counts) / 2)} per (token, pair) whatever the head count")
    return True


def _check_launches(name, kernel, launches, seed, launch=launch_mrope):
    """Run `kernel` through `launch` at each (case, BLOCK_T, extra launch arguments) on fresh
    inputs, in the interpreter (and compiled, on a GPU); compare with ropelib and count its
    sines and cosines.
    Returns (passed, sines plus cosines per (token, pair) of each launch)."""
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    on_gpu = runtime.on_gpu()
    counts = []
    for case, BLOCK_T, extra in launches:
        T, HQ, HK, D, section, style, dtype, _ = case
        label = (f"T={T}, {HQ} q and {HK} k heads, D={D}, {style} {list(section)}, "
                 f"{str(dtype).replace('torch.', '')}"
                 + "".join(f", {k}={v}" for k, v in {"BLOCK_T": BLOCK_T, **extra}.items()
                           if extra))
        # (atol, rtol); fp32 leaves room for multiply-adds in another order, or fused
        tol = (3e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.6e-2)
        q, k, positions, freqs = _kernel_inputs(case, gen)
        ref = "cuda" if on_gpu else "cpu"       # where ropelib's kernel runs
        want = mrope.apply_mrope_qk(q.to(ref), k.to(ref), positions.to(ref), freqs.to(ref),
                                    layout="thd")
        for device in ("cpu", "cuda") if on_gpu else ("cpu",):
            args = [t.to(device, copy=True) for t in (q, k, positions)]
            f = freqs.to(device)
            qb, q_out, q_pad = _guarded(q.shape, dtype, device)
            kb, k_out, k_pad = _guarded(k.shape, dtype, device)
            where = "interpreter" if device == "cpu" else "compiled on the GPU"
            lbl = f"{label}, {where}"
            # your own code (on the CPU: ropelib barred, sines and cosines counted)
            counting = count_work(q=args[0]) if device == "cpu" else nullcontext()
            with counting as counted:
                ok = launch_on(device, name, lbl, partial(launch, out=(q_out, k_out), **extra),
                               kernel, *args, f, BLOCK_T)
            if not ok:
                return False, counts
            if device == "cpu":
                work = counted
            if not _compare_outputs(name, lbl, (q_out, k_out), [w.to(device) for w in want],
                                    ((qb, q_pad), (kb, k_pad)), tol):
                return False, counts
        if "HPS" in extra and not _one_step_first(name, label, work, extra["HPS"], HQ, D,
                                                  min(BLOCK_T, T)):
            return False, counts
        covered = work.programs * BLOCK_T * (D // 2)     # (token, pair) slots of its programs
        # one sine plus one cosine per (token, pair) is 2 (a cosine taken as sin(theta + pi/2)
        # too); angles formed twice, or once per head, are 4 or more
        per_slot = (work.sin + work.cos) / covered
        if per_slot > 2:
            print(f"❌ {name} ({label}): right values, but {work.sin} sines and {work.cos} "
                  f"cosines for {work.programs} programs x {BLOCK_T} tokens x {D // 2} pairs: "
                  f"{_pairs(per_slot / 2)} per (token, pair) with {HQ + HK} heads. Form the "
                  "angles once per token, before the loops over the heads, and reuse them for "
                  "every head of q and of k")
            return False, counts
        counts.append(per_slot)
    return True, counts


HEADS_PER_STEP_CHECKED = (1, 2, 4)


def _one_step_first(name, label, work, hps, HQ, D, tokens) -> bool:
    """The first program's first step rotates min(HPS, HQ) heads of q at once: it loads that many
    heads of its tokens before it stores anything."""
    first = work.loads_before_store.get("q", [0])[0]
    want = min(hps, HQ) * D * tokens
    if first == want:
        return True
    print(f"❌ {name} ({label}, HPS={hps}): right values, but the first program loaded {first} "
          f"elements of q before its first store, not {want} ({min(hps, HQ)} head(s) x {D} "
          f"features x {tokens} token(s)). Rotate HPS heads per loop step, as one "
          "[BLOCK_T, HPS, D // 2] tile of each half, loaded before it is stored")
    return False


def check_mrope_heads_kernel(kernel, *, seed: Optional[int] = None,
                             launch: Callable = launch_mrope) -> bool:
    """The heads exercise: a kernel of this module's signature plus `HPS: tl.constexpr`, the
    heads it rotates per loop step. Launched at HPS = 1, 2 and 4 (steps past the last head
    masked: the cases have 1 to 4 heads), at each case's tile and at 1 token a program, as
    check_mrope_kernel launches (through `launch`, launch_mrope's signature): values against
    ropelib.apply_mrope_qk, angles once per token."""
    name = "multi-axis RoPE kernel, heads per step"
    if not kernel_answer(name, kernel, "the outputs it allocated"):
        return False
    if "HPS" not in kernel.arg_names:
        print(f"❌ {name}: the kernel has no HPS parameter; add `HPS: tl.constexpr` (heads "
              "rotated per loop step) after BLOCK_T")
        return False
    launches = [(case, block_t, {"HPS": hps}) for hps in HEADS_PER_STEP_CHECKED
                for case in KERNEL_CASES for block_t in sorted({case[-1], 1})]
    ok, counts = _check_launches(name, kernel, launches, seed, launch)
    if not ok:
        return False
    gpu = " and compiled on the GPU" if runtime.on_gpu() else ""
    print(f"✅ {name}: correct on {len(launches)} launches in the interpreter{gpu} (HPS = "
          f"{', '.join(map(str, HEADS_PER_STEP_CHECKED))}; tiles of 1 token and more), with "
          f"{_pairs(max(counts) / 2)} per (token, pair)")
    return True


def _pairs(n: float) -> str:
    return f"{n:g} sine-cosine pair" + ("" if n == 1 else "s")


@triton.jit
def solution_mrope_kernel(
    q_ptr, k_ptr,  # q [T, HQ, D] and k [T, HK, D]: T tokens, contiguous
    q_out_ptr, k_out_ptr,  # the rotated q and k, same shapes, contiguous
    pos_ptr,  # positions [N_AXES, T], int32, contiguous
    inv_freq_ptr,  # [D // 2] fp32: the inverse frequency of pair j
    axis_ptr,  # [D // 2] int32: the axis pair j follows
    T,  # tokens
    HQ: tl.constexpr,  # heads of q
    HK: tl.constexpr,  # heads of k
    D: tl.constexpr,  # head dim, a power of two, all rotated: pair j is (j, j + D/2)
    N_AXES: tl.constexpr,  # position axes (3 for M-RoPE: time, row, column)
    BLOCK_T: tl.constexpr,  # tokens per program
):
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T] this program's tokens
    live = (t < T)[:, None]  # [BLOCK_T, 1]
    j = tl.arange(0, HALF)  # [HALF] pairs
    inv = tl.load(inv_freq_ptr + j)
    ax = tl.load(axis_ptr + j)
    # each pair's position is the one of its axis: [BLOCK_T, HALF]
    p = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
    for a in tl.static_range(N_AXES):
        p_a = tl.load(pos_ptr + a * T + t, mask=t < T, other=0).to(tl.float32)  # [BLOCK_T]
        p = tl.where(ax[None, :] == a, p_a[:, None], p)
    theta = p * inv[None, :]
    c = tl.cos(theta)  # once per token: every head below reuses them
    s = tl.sin(theta)
    for h in range(HQ):
        row = (t[:, None] * HQ + h) * D  # [BLOCK_T, 1]: where head h of each token starts
        x1 = tl.load(q_ptr + row + j[None, :], mask=live).to(tl.float32)
        x2 = tl.load(q_ptr + row + HALF + j[None, :], mask=live).to(tl.float32)
        tl.store(q_out_ptr + row + j[None, :], x1 * c - x2 * s, mask=live)
        tl.store(q_out_ptr + row + HALF + j[None, :], x2 * c + x1 * s, mask=live)
    for h in range(HK):
        row = (t[:, None] * HK + h) * D
        x1 = tl.load(k_ptr + row + j[None, :], mask=live).to(tl.float32)
        x2 = tl.load(k_ptr + row + HALF + j[None, :], mask=live).to(tl.float32)
        tl.store(k_out_ptr + row + j[None, :], x1 * c - x2 * s, mask=live)
        tl.store(k_out_ptr + row + HALF + j[None, :], x2 * c + x1 * s, mask=live)


@triton.jit
def solution_mrope_heads_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,  # as above
    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
    BLOCK_T: tl.constexpr,  # tokens per program
    HPS: tl.constexpr,  # heads rotated per loop step, a power of two
):
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T] this program's tokens
    j = tl.arange(0, HALF)  # [HALF] pairs
    inv = tl.load(inv_freq_ptr + j)
    ax = tl.load(axis_ptr + j)
    p = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
    for a in tl.static_range(N_AXES):
        p_a = tl.load(pos_ptr + a * T + t, mask=t < T, other=0).to(tl.float32)  # [BLOCK_T]
        p = tl.where(ax[None, :] == a, p_a[:, None], p)
    theta = p * inv[None, :]
    c = tl.cos(theta)[:, None, :]  # [BLOCK_T, 1, HALF]: once per token, for every head
    s = tl.sin(theta)[:, None, :]
    g = tl.arange(0, HPS)  # [HPS] the heads of one step
    jj = j[None, None, :]
    for h0 in range(0, HQ, HPS):
        hh = h0 + g
        live = (t < T)[:, None, None] & (hh < HQ)[None, :, None]  # [BLOCK_T, HPS, 1]
        row = (t[:, None, None] * HQ + hh[None, :, None]) * D  # [BLOCK_T, HPS, 1]
        x1 = tl.load(q_ptr + row + jj, mask=live).to(tl.float32)
        x2 = tl.load(q_ptr + row + HALF + jj, mask=live).to(tl.float32)
        tl.store(q_out_ptr + row + jj, x1 * c - x2 * s, mask=live)
        tl.store(q_out_ptr + row + HALF + jj, x2 * c + x1 * s, mask=live)
    for h0 in range(0, HK, HPS):
        hh = h0 + g
        live = (t < T)[:, None, None] & (hh < HK)[None, :, None]
        row = (t[:, None, None] * HK + hh[None, :, None]) * D
        x1 = tl.load(k_ptr + row + jj, mask=live).to(tl.float32)
        x2 = tl.load(k_ptr + row + HALF + jj, mask=live).to(tl.float32)
        tl.store(k_out_ptr + row + jj, x1 * c - x2 * s, mask=live)
        tl.store(k_out_ptr + row + HALF + jj, x2 * c + x1 * s, mask=live)
