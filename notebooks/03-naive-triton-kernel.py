# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 — A naive Triton kernel for RoPE
#
# Notebook 02 wrote RoPE in plain PyTorch and counted what it costs: several kernels, each
# reading and writing the whole tensor. Here we write the first *Triton* kernel that does it in
# one pass, in the simplest way that works: one program per row. It is slow on purpose — it is
# the baseline that notebook 04's batch-reusing grid and ropelib's finished kernel are measured
# against — but every idea in the faster kernels is already here.
#
# **After this notebook you will be able to**
#
# - say what a Triton *program* and a *grid* are, and choose the grid of a kernel;
# - tell `BLOCK_SIZE` (the tile of data a program works on) from `num_warps` (the threads that
#   work on it);
# - load a row whose length is not a power of two with power-of-two tiles and a mask;
# - load the two halves of a head separately, as rotate-half needs;
# - debug a kernel on the CPU in Triton's interpreter: print inside it, catch out-of-bounds
#   accesses, and know where the interpreter differs from a GPU;
# - check a kernel against the reference the way ropelib's tests do.
#
# Everything runs on a GPU, or on the CPU through Triton's interpreter (`TRITON_INTERPRET=1`),
# where sizes are chosen small automatically.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import triton
import triton.language as tl

from ropelib import reference, runtime
from ropelib.compare import error_metrics
from ropelib.exercises import kernels as ex
from ropelib.exercises import solution
from ropelib.kernels.naive import _rope_naive_kernel, half_tile, naive_grid, rope_naive

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "ropelib").is_dir())
FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
GPU = runtime.on_gpu()
print(runtime.mode())

# Full sizes on a GPU; on the CPU every program costs a few ms in the interpreter, so keep it tiny.
S, B, H, D = (4096, 4, 32, 128) if GPU else (6, 2, 2, 64)
print(f"x: [S={S}, B={B}, H={H}, D={D}] on {device}")

# %% [markdown]
# ## 1. The job
#
# The input is TE's `sbhd` layout, `x[s, b, h, :]` a row of `D` features, and the angle table
# `freqs[s, 0, 0, :]` holds one fp32 angle per feature. Rotate-half pairs feature $j$ with
# $j + D/2$; with $\theta_j$ the angle of feature $j$ at position $s$:
#
# $$
# \begin{aligned}
# y_j       &= x_j \cos\theta_j - x_{j+D/2}\,\sin\theta_j, \\
# y_{j+D/2} &= x_{j+D/2} \cos\theta_{j+D/2} + x_j \sin\theta_{j+D/2},
# \end{aligned}
# \qquad 0 \le j < D/2 .
# $$
#
# TE builds the table as `cat(f, f)`, so $\theta_{j+D/2} = \theta_j = s\cdot 10000^{-2j/D}$ and
# each pair is turned by one angle. The kernel follows the per-feature formula exactly, so it
# agrees with `ropelib.reference.rope_reference` for any table.

# %%
torch.manual_seed(0)
x = torch.randn(S, B, H, D, device=device, dtype=torch.bfloat16)
freqs = ex.te_angles(S, D, device=device)               # [S, 1, 1, D] fp32, cat(f, f)
assert torch.equal(freqs[..., : D // 2], freqs[..., D // 2:])
y_ref = reference.rope_reference(x, freqs)              # fp64 math, one rounding to bf16
print(freqs.shape, freqs.dtype, "->", y_ref.shape, y_ref.dtype)

# %% [markdown]
# ## 2. Programs and grids
#
# A Triton kernel is written for **one program**: a function that works on whole tiles of data
# (vectors of a compile-time size), not on one element like a CUDA thread. Launching it as
# `kernel[grid](...)` starts one program per point of the grid, and `tl.program_id(axis)` tells
# a program where it is. On a GPU a program runs as one thread block on one streaming
# multiprocessor, and the compiler spreads its tiles over the block's threads; in the
# interpreter the programs run one after another as Python.
#
# The naive choice: **one program per row** `x[s, b, h, :]`, all on one grid axis,
# so the grid has $S \cdot B \cdot H$ programs. Program `row` splits its id into
# $(s, b, h)$ with $h$ moving fastest, the order the rows of a contiguous sbhd tensor lie in
# memory:
#
# $$ s = \lfloor \text{row} / (BH) \rfloor, \quad b = \lfloor \text{row} / H \rfloor \bmod B,
#    \quad h = \text{row} \bmod H . $$

# %%
grid = naive_grid(S, B, H)
print(f"grid = {grid}: {grid[0]:,} programs, each rotating one row of {D} features")

rows = torch.arange(grid[0])
s_idx, b_idx, h_idx = rows // (B * H), (rows // H) % B, rows % H
# every row exactly once, and in memory order: row r starts at element r * D of a contiguous x
assert torch.equal((s_idx * B + b_idx) * H + h_idx, rows)
xc = x.contiguous()
assert torch.equal(s_idx * xc.stride(0) + b_idx * xc.stride(1) + h_idx * xc.stride(2), rows * D)

# %% [markdown]
# The figure shows it for a toy tensor: each cell is one program, labelled with its id. On the
# right, the tile one program loads for a head of $D = 72$ (next section).

# %%
def draw_grid_and_masks(path):
    S_, B_, H_ = 4, 2, 3
    fig, (a, m) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1, 1.6]})
    colors = plt.get_cmap("Pastel1")
    for s in range(S_):
        for b in range(B_):
            for h in range(H_):
                col = b * H_ + h
                a.add_patch(plt.Rectangle((col, S_ - 1 - s), 1, 1, fc=colors(b), ec="k"))
                a.text(col + 0.5, S_ - 0.5 - s, str((s * B_ + b) * H_ + h), ha="center", va="center")
    a.set_xlim(0, B_ * H_), a.set_ylim(0, S_)
    a.set_xticks([i + 0.5 for i in range(B_ * H_)], [f"b{i // H_}h{i % H_}" for i in range(B_ * H_)])
    a.set_yticks([S_ - 0.5 - s for s in range(S_)], [f"s={s}" for s in range(S_)])
    a.set_title(f"naive grid: one program per row\n(S={S_}, B={B_}, H={H_}: {S_ * B_ * H_} programs)")
    half, block = half_tile(72)
    for r, name in enumerate(("x1 = x[..., :36]", "x2 = x[..., 36:]")):
        for lane in range(block):
            live = lane < half
            m.add_patch(plt.Rectangle((lane, 1 - r), 1, 0.8, fc="tab:blue" if live else "0.85",
                                      ec="w", lw=0.3))
        m.text(-1, 1.4 - r, name, ha="right", va="center", fontsize=9)
    m.set_xlim(-14, block), m.set_ylim(-0.2, 2)
    m.set_xticks([0, half, block], ["0", f"HALF={half}", f"BLOCK_HALF={block}"])
    m.set_yticks([])
    m.set_title(f"D = 72: each half is a tile of {block} lanes, {block - half} masked off (grey)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.show()


draw_grid_and_masks(FIGURES / "03-grid-and-masks.png")

# %% [markdown]
# ![The naive grid and the masked tiles of a D = 72 head](../figures/03-grid-and-masks.png)

# %% [markdown]
# ## 3. The kernel
#
# This is `ropelib/kernels/naive.py`'s kernel, shown as it is in ropelib (a test checks that
# this copy is the code that runs):
#
# <!-- ropelib-source: ropelib.kernels.naive._rope_naive_kernel -->
# ```python
# @triton.jit
# def _rope_naive_kernel(
#     x_ptr,  # *x: input [S, B, H, D], any strides
#     y_ptr,  # *y: output [S, B, H, D], same dtype as x, last dim contiguous
#     freqs_ptr,  # *fp32: angles [P, D], P >= S (row s holds the D angles of position s)
#     B,  # batch size: splits the program id into (s, b, h)
#     H,  # number of heads
#     stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
#     stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
#     stride_fs, stride_fd,  # freqs strides, in elements
#     HALF: tl.constexpr,  # D // 2: features in each half (any size, 72/2 = 36 included)
#     BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile each half is loaded in
#     BACKWARD: tl.constexpr,  # False: y = R(theta) x; True: y = R(theta)^T x = R(-theta) x
#     COMPUTE_DTYPE: tl.constexpr,  # tl.float32 (tl.float64 for fp64 inputs)
#     BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
# ):
#     # One program = one row x[s, b, h, :]. int64 so row offsets cannot overflow on huge tensors.
#     row = tl.program_id(0).to(tl.int64)
#     s = row // (B * H)
#     b = (row // H) % B
#     h = row % H
#
#     # Tiles are powers of two; the mask switches off the lanes past HALF (e.g. 36 of 64).
#     offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF] feature index within a half
#     mask = offs < HALF
#
#     # Angles of position s for both halves, then cos/sin in COMPUTE_DTYPE (fp32 math).
#     f_row = freqs_ptr + s * stride_fs
#     theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#     theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#     cos1 = tl.cos(theta1)
#     cos2 = tl.cos(theta2)
#     if BACKWARD:
#         # The transpose of [[c1, -s1], [s2, c2]] is [[c1, s2], [-s1, c2]]: swap and negate the
#         # sines. With TE's cat(f, f) table s1 == s2, so this is the rotation by -theta.
#         sin1 = -tl.sin(theta2)
#         sin2 = -tl.sin(theta1)
#     else:
#         sin1 = tl.sin(theta1)
#         sin2 = tl.sin(theta2)
#
#     # A loaded tile cannot be sliced, so the two halves are loaded as two tiles.
#     x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
#     x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#     x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#
#     # rotate-half: y = x * cos + [-x2, x1] * sin, in COMPUTE_DTYPE, rounded once on the store.
#     y1 = x1 * cos1 - x2 * sin1
#     y2 = x2 * cos2 + x1 * sin2
#     y_row = y_ptr + s * stride_ys + b * stride_yb + h * stride_yh
#     tl.store(y_row + offs, round_to(y1, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
#     tl.store(y_row + HALF + offs, round_to(y2, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
# ```
#
# Read it top to bottom:
#
# - **where am I:** the program id becomes $(s, b, h)$, as int64 so that offsets of tensors
#   beyond $2^{31}$ elements cannot overflow;
# - **the tile:** `offs = tl.arange(0, BLOCK_HALF)` and `mask = offs < HALF` (section 5);
# - **the angles:** both halves' angles of position $s$, then `tl.cos`/`tl.sin` in fp32 (fp64
#   when x is fp64, so that `gradcheck` works in notebook 05) — computed in the kernel, so no
#   cos/sin table is ever written to memory;
# - **the data:** the two halves as two loads (section 6), converted to fp32;
# - **the math:** the two formulas of section 1, in fp32, and **one rounding** to the output
#   dtype at the store (`round_to`, section 7.3 says why it is not just `.to`);
# - **`BACKWARD`:** a compile-time switch for the gradient (notebook 05). Constexpr arguments are
#   baked into the compiled code: each value gets its own specialised kernel.
#
# Pointers are plain addresses plus offsets in *elements*, so the kernel takes every stride and
# reads any view (a transposed bshd tensor, a stride-0 expand) without a copy. The launcher
# validates the inputs, allocates a contiguous output and picks the constexprs:
#
# <!-- ropelib-source: ropelib.kernels.naive.rope_naive -->
# ```python
# def rope_naive(x: torch.Tensor, freqs: torch.Tensor, *, backward: bool = False,
#                out: Optional[torch.Tensor] = None, num_warps: Optional[int] = None) -> torch.Tensor:
#     """Rotate x by the angles in freqs with the naive kernel (one program per row).
#
#     Args:
#         x: [S, B, H, D] (sbhd), fp16/bf16/fp32/fp64, any strides; D even, <= 512.
#         freqs: fp32 angles [P, 1, 1, D] or [P, D], P >= S (TE's convention, cat(f, f)).
#         backward: rotate by -theta (the transpose), i.e. turn grad_y into grad_x.
#         out: optional contiguous [S, B, H, D] tensor of x's dtype to write into (`out=x`
#             rotates a contiguous x in place); by default a new contiguous tensor.
#         num_warps: warps per program (32 threads each); by default from the tile size.
#     Returns:
#         The rotated tensor (out if given), dtype of x; math in fp32 (fp64 for fp64 x), one rounding.
#     """
#     f2 = _check_inputs(x, freqs, out, "rope_naive")
#     y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
#     if x.numel() == 0:
#         return y
#     S, B, H, D = x.shape
#     half, block_half, compute = _launch_params(x)
#     _rope_naive_kernel[naive_grid(S, B, H)](
#         x, y, f2, B, H,
#         x.stride(0), x.stride(1), x.stride(2), x.stride(3),
#         y.stride(0), y.stride(1), y.stride(2),
#         f2.stride(0), f2.stride(1),
#         HALF=half, BLOCK_HALF=block_half, BACKWARD=bool(backward), COMPUTE_DTYPE=compute,
#         BF16_RTNE=BF16_RTNE,
#         num_warps=num_warps or default_num_warps(block_half),
#     )
#     return y
# ```

# %%
y = rope_naive(x, freqs)
err = error_metrics(y, reference.rope_reference(x, freqs, compute_dtype=torch.float64))
print(f"naive kernel vs fp64 reference (bf16 output): max abs err {err['max_abs_err']:.2e}, "
      f"max ulp err {err['max_ulp_err']:.2f}")
assert err["max_ulp_err"] <= 1.0          # at most one unit in the last place of bf16

# %% [markdown]
# ## 4. `BLOCK_SIZE` vs `num_warps`
#
# Two numbers are easy to mix up:
#
# - **`BLOCK_SIZE`** (here `BLOCK_HALF`) is the *tile*: how many elements one program holds in
#   one vector. It is a property of the data, a `tl.constexpr`, and a power of two. It is **not**
#   CUDA's threads per block.
# - **`num_warps`** is how many warps of 32 threads run one program (default 4, i.e. 128
#   threads). It is a launch option; the compiler spreads the tile over those threads.
#
# For $D = 128$ each half is a tile of 64 elements. With 1 warp each thread holds 2 of them;
# with 4 warps, 128 threads share 64 elements, so half the threads hold copies and do no
# useful work. The result cannot depend on it; only the speed can. `rope_naive` picks one warp
# per 128 elements of a half (`default_num_warps`), and takes `num_warps=` to try others.

# %%
results = {nw: rope_naive(x, freqs, num_warps=nw) for nw in (1, 2, 4, 8)}
for nw, out in results.items():
    assert torch.equal(out, results[1]), f"num_warps={nw} changed the result"
print("num_warps 1, 2, 4, 8: bit-identical results")

if GPU:
    from triton.testing import do_bench
    nbytes = 2 * x.numel() * x.element_size()
    for nw in (1, 2, 4, 8):
        ms = do_bench(lambda: rope_naive(x, freqs, num_warps=nw))
        print(f"num_warps={nw}: {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:7.0f} GB/s (x read + y written)")
else:
    print("(timings need a GPU: in the interpreter, programs run one by one in Python)")

# %% [markdown]
# ## 5. Masks and power-of-two tiles
#
# `tl.arange(0, N)` only exists for a power of two $N$: register tiles are laid out over threads
# in powers of two. Asking for 36 lanes fails at compile time (or, in the interpreter, when the
# line runs):

# %%
@triton.jit
def _arange_36_kernel(out_ptr):  # out_ptr: *int32 [64]
    offs = tl.arange(0, 36)
    tl.store(out_ptr + offs, offs)


try:
    _arange_36_kernel[(1,)](torch.zeros(64, dtype=torch.int32, device=device))
    raise AssertionError("tl.arange(0, 36) should have been refused")
except Exception as exc:  # CompilationError on a GPU, InterpreterError in the interpreter
    message = str(exc)
    assert "power of 2" in message
    print(type(exc).__name__, "->", next(l for l in message.splitlines() if "power of 2" in l).strip())

# %% [markdown]
# So a half of $D/2$ features is loaded as a tile of the next power of two, and a **mask**
# switches off the lanes past the end: `tl.load(ptr + offs, mask=offs < HALF, other=0.0)`
# neither reads the masked lanes (they get `other`) nor does the masked `tl.store` write them.
# Head dims used in practice — 72, 80, 96 — all need it; 64 and 128 do not, and the mask then
# costs nothing. The kernel is right for each:

# %%
Dims = (64, 72, 80, 96, 128)
for d in Dims:
    xs = torch.randn(min(S, 64), B, H, d, device=device, dtype=torch.bfloat16)
    fs = ex.te_angles(xs.shape[0], d, device=device)
    half, block = half_tile(d)
    m = error_metrics(rope_naive(xs, fs), reference.rope_reference(xs, fs))
    print(f"D={d:4d}: HALF={half:3d} in a tile of {block:3d} ({block - half:2d} masked)  "
          f"max ulp err {m['max_ulp_err']:.2f}")
    assert m["max_ulp_err"] <= 1.0

# %% [markdown]
# ## 6. Loading the two halves separately
#
# In NumPy one would load the row and slice it, `x1, x2 = row[:HALF], row[HALF:]`. A Triton tile
# is a value in registers spread over threads, not an array in memory: it cannot be sliced
# after it is loaded. So the kernel loads the two halves **as two tiles** from two offset
# vectors, `offs` and `offs + HALF`. Each load is a contiguous run of memory, so the threads'
# accesses coalesce, and together they read exactly the row's bytes once. The rotated halves
# are stored the same way.
#
# (For the interleaved form, pairs $(2j, 2j+1)$, the offsets are `2*offs` and `2*offs + 1`:
# exercise 4. Faster kernels load one contiguous tile of shape `[BLOCK, 2]` and split it with
# `tl.split`, which keeps 16-byte vector loads; the finished kernel does that.)

# %% [markdown]
# ## 7. Debugging in the interpreter
#
# With `TRITON_INTERPRET=1` a kernel runs as ordinary Python on NumPy arrays. That makes three
# things possible that a GPU does not offer so easily.
#
# ### 7.1 Print inside the kernel
#
# `tl.device_print` works everywhere (on a GPU its output goes to the terminal that started
# Jupyter, not to the notebook); in the interpreter plain `print` works too and shows whole
# tiles. Here is the naive kernel's index math for two programs of a $D = 72$ row:

# %%
@triton.jit
def _peek_kernel(B, H, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    s = row // (B * H)
    b = (row // H) % B
    h = row % H
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    tl.device_print("row", row)                  # on a GPU too
    print("s, b, h =", s, b, h)                  # the interpreter only: plain Python
    print("lanes on:", tl.sum(mask.to(tl.int32)), "of", BLOCK_HALF, "| second half offsets end at",
          tl.max(tl.where(mask, offs + HALF, 0)))


if runtime.INTERPRET:
    half, block = half_tile(72)
    _peek_kernel[(2,)](2, 3, HALF=half, BLOCK_HALF=block)
else:
    print("plain print() inside a kernel needs the interpreter: set TRITON_INTERPRET=1 before "
          "importing ropelib (its output would go to the terminal on a GPU)")

# %% [markdown]
# ### 7.2 Catch out-of-bounds accesses
#
# A GPU does not complain when a kernel writes past the end of a row: it overwrites the next
# row, or memory that is not yours. The interpreter does not check either — an unmasked access
# past the end of a tensor reads or corrupts the Python process's memory. Two tools catch it.
#
# Below is a toy kernel that rotates rows of a contiguous `[ROWS, D]` tensor (position = row)
# with one bug switch: `MASK_STORES=False` forgets the masks on the stores, the most common
# mistake with non-power-of-two rows. For $D = 72$ the second half's store then writes lanes
# 36…63 of `offs + HALF`, i.e. elements 72…99: the first 28 elements of the *next* row.
#
# **Tool 1: `assert` in the kernel.** The interpreter runs a Python `assert` in a `@triton.jit`
# function as the plain Python statement it is, so it is always checked. On a GPU, Triton
# compiles the same line to `tl.device_assert`, which is only active when the kernel is compiled
# with `TRITON_DEBUG=1`. (An explicit `tl.device_assert` call is the other way round: the
# interpreter of Triton 3.9 skips it.) The assert must come *before* the access it guards.

# %%
@triton.jit
def _rope_rows_debug_kernel(
    x_ptr,  # *x: [ROWS, 2 * HALF], contiguous
    y_ptr,  # *y: [ROWS, 2 * HALF], contiguous
    freqs_ptr,  # *fp32: [ROWS, 2 * HALF] angles, contiguous
    HALF: tl.constexpr,  # features per half
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    MASK_STORES: tl.constexpr,  # False: the bug, stores write every lane of the tile
    CHECK: tl.constexpr,  # True: assert that every stored offset stays inside the row
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    base = row * 2 * HALF
    t1 = tl.load(freqs_ptr + base + offs, mask=mask, other=0.0)
    t2 = tl.load(freqs_ptr + base + HALF + offs, mask=mask, other=0.0)
    x1 = tl.load(x_ptr + base + offs, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + base + HALF + offs, mask=mask, other=0.0)
    y1 = x1 * tl.cos(t1) - x2 * tl.sin(t1)
    y2 = x2 * tl.cos(t2) + x1 * tl.sin(t2)
    store_mask = mask if MASK_STORES else offs < BLOCK_HALF
    if CHECK:
        last = tl.max(tl.where(store_mask, HALF + offs, 0))
        assert last < 2 * HALF, "store past the end of the row"
    tl.store(y_ptr + base + offs, y1, mask=store_mask)
    tl.store(y_ptr + base + HALF + offs, y2, mask=store_mask)


ROWS, D72 = 4, 72
half, block = half_tile(D72)
xr = torch.randn(ROWS, D72, device=device)
fr = torch.rand(ROWS, D72, device=device) * 6
ref_rows = reference.rope_reference(xr.view(ROWS, 1, 1, D72), fr).view(ROWS, D72)

if runtime.INTERPRET:
    try:
        _rope_rows_debug_kernel[(ROWS,)](xr, torch.empty_like(xr), fr, HALF=half, BLOCK_HALF=block,
                                     MASK_STORES=False, CHECK=True)
        raise AssertionError("the bounds assert should have fired")
    except Exception as exc:
        assert "store past the end of the row" in str(exc)
        print("caught:", type(exc).__name__, "-", str(exc).strip().splitlines()[-1][:120])

# %% [markdown]
# **Tool 2: guard bands** work on a GPU as well and need no change to the kernel: put the
# output inside a larger buffer filled with NaN, run the kernel on the middle, then check that
# the bands around it are still NaN — and that no NaN is left inside (an element never
# written). The bands must be at least as wide as the largest overshoot, so the buggy kernel
# stays inside memory we own.

# %%
def guarded_empty(shape, pad, **kw):
    """(buffer, view): `view` of `shape` in the middle of a NaN-filled buffer with `pad` on each side."""
    n = torch.Size(shape).numel()
    buf = torch.full((pad + n + pad,), float("nan"), **kw)
    return buf, buf[pad:pad + n].view(shape)


def guard_report(buf, view, pad):
    before, after = buf[:pad], buf[-pad:]
    return {"written before": int((~before.isnan()).sum()), "written after": int((~after.isnan()).sum()),
            "never written": int(view.isnan().sum())}


pad = 2 * block
for mask_stores in (True, False):
    buf, y_rows = guarded_empty((ROWS, D72), pad, device=device)
    _rope_rows_debug_kernel[(ROWS,)](xr, y_rows, fr, HALF=half, BLOCK_HALF=block,
                                 MASK_STORES=mask_stores, CHECK=False)
    report = guard_report(buf, y_rows, pad)
    print(f"MASK_STORES={mask_stores!s:5}: {report}, output matches reference: "
          f"{torch.allclose(y_rows, ref_rows, atol=1e-5)}")
    if mask_stores:
        assert report == {"written before": 0, "written after": 0, "never written": 0}
    else:
        assert report["written after"] == block - half   # the last row spills 28 elements

# %% [markdown]
# Look at the buggy run's output: on the CPU it can even *match* the reference, because the
# interpreter runs the programs in order and each row's own store overwrites the garbage its
# neighbour spilled into it. Only the last row's spill, into the guard band, gives it away. On a
# GPU the programs run in parallel in no fixed order, and the same bug corrupts rows now and
# then — the kind of bug that passes a test once and fails in training. Poisoned outputs and
# guard bands are why ropelib's tests catch it every time.
#
# ### 7.3 Where the interpreter differs from a GPU
#
# The interpreter is a model of the GPU, not the GPU. One difference matters for RoPE: it casts
# fp32 to bf16 by **truncation**, while a GPU (and `torch`) rounds to nearest even. A kernel
# that ends in `.to(tl.bfloat16)` is then off by one unit in the last place in about half of its
# outputs on the CPU, and right on a GPU:

# %%
@triton.jit
def _cast_kernel(x_ptr, y_ptr, N: tl.constexpr):  # x: *fp32 [N] -> y: *bf16 [N]
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(y_ptr.dtype.element_ty))


xs = torch.randn(1024, device=device)
ys = torch.empty(1024, device=device, dtype=torch.bfloat16)
_cast_kernel[(1,)](xs, ys, N=1024)
differ = (ys != xs.to(torch.bfloat16)).float().mean().item()
print(f"fp32 -> bf16 with .to(): {differ:.0%} of values differ from torch's rounding")
assert (differ > 0.3) if runtime.INTERPRET else (differ == 0.0)

# %% [markdown]
# ropelib's kernels store through `round_to` (in `ropelib/kernels/common.py`), which rounds
# to nearest even by hand in the interpreter and is a plain cast on a GPU, so both give the same
# bits. The lesson generalises: when the interpreter and the GPU disagree in the last bit, check
# the casts first.

# %% [markdown]
# ## 8. Correctness, the way ropelib's tests check it
#
# `tests/test_kernels_teaching.py` checks the kernel like this, and so should every kernel you
# write:
#
# 1. fresh random inputs, against an fp64 reference rounded **once** to the output dtype;
# 2. dtype-aware tolerances: at most one unit in the last place for bf16/fp16;
# 3. the output buffer **poisoned** with NaN first, so an element the kernel forgets stays NaN;
# 4. the input unchanged afterwards;
# 5. awkward shapes: non-power-of-two halves, non-contiguous views, a table longer than the
#    sequence.

# %%
def check_kernel(kernel, x, freqs):
    x_before = x.clone()
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)    # poisoned
    y = kernel(x, freqs, out=out)
    assert not y.isnan().any(), "an output element was never written"
    assert torch.equal(x, x_before), "the kernel modified its input"
    return error_metrics(y, reference.rope_reference(x, freqs))


s_, b_, h_ = min(S, 64), B, H
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for d, view in ((64, "contiguous"), (80, "bshd transposed"), (96, "margin 10")):
        if view == "bshd transposed":    # a [B, S, H, D] tensor seen as sbhd, no copy
            xs = torch.randn(b_, s_, h_, d, device=device).to(dtype).transpose(0, 1)
        else:
            xs = torch.randn(s_, b_, h_, d, device=device).to(dtype)
        fs = ex.te_angles(s_ + (10 if view == "margin 10" else 0), d, device=device)
        m = check_kernel(rope_naive, xs, fs)
        # ulps of fp32 mean little near zero (an fp32 ulp of 1e-9 is tiny): report abs error there
        ulps = "" if dtype == torch.float32 else f"  max ulp err {m['max_ulp_err']:.2f}"
        print(f"{str(dtype):15} D={d:3} {view:16} max abs err {m['max_abs_err']:.1e}{ulps}")
        if dtype == torch.float32:
            assert m["max_abs_err"] < 1e-5
        else:
            assert m["max_ulp_err"] <= 1.0

# %% [markdown]
# The kernel is correct. Notebook 04 asks whether it is *fast*: it launches one program per row
# and re-reads and re-computes the same cos/sin for every batch entry and head. That is the
# first thing the next generation fixes.
#
# ## Exercises
#
# Each cell checks your answer at once (✅ or ❌). The solutions are folded below each cell.
#
# **1.** Return the naive kernel's launch grid for `x [S, B, H, D]` (a tuple).

# %%
def my_naive_grid(S, B, H):
    ...  # your code


ex.check_naive_grid(my_naive_grid)
solution(ex.solution_naive_grid)

# %% [markdown]
# **2.** For a head dim `D`, return `(HALF, BLOCK_HALF, masked)`: features per half, the tile
# each half is loaded in, and how many lanes of that tile the mask switches off.

# %%
def my_half_tile(D):
    ...  # your code


ex.check_half_tile(my_half_tile)
solution(ex.solution_half_tile)

# %% [markdown]
# **3.** Program `row` of the naive grid rotates which row `(s, b, h)` of `x [S, B, H, D]`?

# %%
def my_row_index(row, S, B, H):
    ...  # your code


ex.check_row_index(my_row_index)
solution(ex.solution_row_index)

# %% [markdown]
# **4.** Write a naive kernel for the **interleaved** form (GPT-J, RoFormer): pair $j$ is
# $(2j, 2j+1)$ and TE's interleaved table repeats each angle twice (`f0 f0 f1 f1 …`).
# `my_rope_interleaved(x, freqs)` takes sbhd `x [S, B, H, D]` (any strides) and
# `freqs [P, 1, 1, D]` and returns a new tensor. Start from the naive kernel: what changes is
# only which offsets you load and store.

# %%
def my_rope_interleaved(x, freqs):
    ...  # your code: a @triton.jit kernel and its launcher


ex.check_rope_interleaved(my_rope_interleaved)
solution(ex.solution_rope_interleaved)
solution(ex._rope_interleaved_solution_kernel.fn, title="Solution: the kernel")
