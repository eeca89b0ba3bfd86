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
# # 04 — The batch-reusing grid kernel
#
# The naive kernel of notebook 03 is correct, but it does the same work over and over: every
# row of the batch at position $s$ — and every head — loads the same angles and computes the
# same cos/sin. This notebook changes one thing, the **grid**, so that each program computes
# cos/sin once and reuses them for the whole batch. It is the kernel an earlier study project
# built and benchmarked (its story is retold below), and the second of ropelib's three
# generations.
#
# **After this notebook you will be able to**
#
# - find the work a grid makes programs repeat, and remove it by choosing another grid;
# - write a program that loops over the batch and reuses values it loaded once;
# - build a bytes-moved model of a memory-bound kernel, and turn a time into GB/s and into a
#   percentage of what a plain device copy reaches;
# - read the GB/s comparison of the three generations, and say what the finished kernel does
#   beyond the batch-reusing grid.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

from ropelib import compare, reference, runtime
from ropelib.exercises import kernels as ex
from ropelib.exercises import solution
from ropelib.kernels import batch_reuse, naive
from ropelib.kernels.batch_reuse import _rope_batch_reuse_kernel, batch_reuse_grid, rope_batch_reuse
from ropelib.kernels.naive import naive_grid, rope_naive

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "ropelib").is_dir())
FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
sys.path.insert(0, str(ROOT / "benchmarks"))
import generations  # benchmarks/generations.py: the measurement and the figure  # noqa: E402

GPU = runtime.on_gpu()
print(runtime.mode())
S, B, H, D = (4096, 8, 32, 128) if GPU else (6, 4, 2, 64)
print(f"x: [S={S}, B={B}, H={H}, D={D}] on {device}")

# %% [markdown]
# ## 1. What the naive grid repeats
#
# The naive grid has one program per row, $S \cdot B \cdot H$ programs. All $B \cdot H$
# programs of one position $s$ need the same $D$ angles, so between them they
#
# - load the position's angles $B \cdot H$ times instead of once, and
# - evaluate the same $D$ cosines and $D$ sines $B \cdot H$ times.
#
# The angle loads mostly hit the L2 cache (the whole table of the reference case,
# $16384 \times 128$ fp32 angles, is 8 MiB; an H100 has 50 MiB of L2), so they cost
# instructions and cache bandwidth rather than DRAM bytes. The other cost is the number of
# programs: each naive program moves only one row — 512 bytes for $D = 128$ in bf16 — and a
# GPU pays a fixed price to start every program. Here is the bill for the reference case:

# %%
Sr, Br, Hr, Dr = 16384, 8, 32, 128            # the reference case, bf16
x_bytes = Sr * Br * Hr * Dr * 2
GiB = 2 ** 30
bill = {
    "naive": (naive_grid(Sr, Br, Hr)[0], naive.angle_bytes_requested(Sr, Br, Hr, Dr)),
    "batch-reuse": (batch_reuse_grid(Sr, Hr)[0] * batch_reuse_grid(Sr, Hr)[1],
                    batch_reuse.angle_bytes_requested(Sr, Br, Hr, Dr)),
}
print(f"x and y: {x_bytes / GiB:.0f} GiB each; the angle table itself: {Sr * Dr * 4 / 2**20:.0f} MiB")
print(f"{'generation':12} {'programs':>12} {'bytes/program':>14} {'angle bytes requested':>22} {'sin+cos evaluated':>18}")
for name, (programs, angle_bytes) in bill.items():
    print(f"{name:12} {programs:12,} {2 * x_bytes // programs:14,} {angle_bytes / GiB:19.2f} GiB "
          f"{2 * programs * Dr:18,}")
assert bill["naive"][1] == Br * bill["batch-reuse"][1]   # B times fewer angle loads

# %% [markdown]
# The naive kernel requests **2 GiB of angles** to rotate 1 GiB of data: twice the tensor
# itself, because the fp32 angles are twice the size of bf16 features. Sharing the angles
# across the batch divides that, the sin/cos work and the number of programs by $B$.
#
# ## 2. The (seq, head) grid
#
# Launch one program per **(position, head)** pair, grid $(S, H)$, and let each program loop
# over the batch. Its angles, cosines and sines are computed once, before the loop, and
# reused for all $B$ rows:
#
# ```
# for each program (s, h):              # grid (S, H)
#     cos1, sin1, cos2, sin2 = f(freqs[s])      # once
#     for b in 0 .. B-1:                        # B rows, same angles
#         y[s, b, h] = rotate(x[s, b, h], cos, sin)
# ```

# %%
def draw_grids(path):
    S_, B_, H_ = 3, 2, 3
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    cmap = plt.get_cmap("tab20")
    for ax, title, prog in (
            (axes[0], f"naive: grid (S·B·H,) = ({S_ * B_ * H_},)", lambda s, b, h: (s * B_ + b) * H_ + h),
            (axes[1], f"batch-reuse: grid (S, H) = ({S_}, {H_}), each loops over b",
             lambda s, b, h: s * H_ + h)):
        for s in range(S_):
            for b in range(B_):
                for h in range(H_):
                    col = b * H_ + h
                    p = prog(s, b, h)
                    ax.add_patch(plt.Rectangle((col, S_ - 1 - s), 1, 1, fc=cmap(p % 20), ec="k"))
                    ax.text(col + 0.5, S_ - 0.5 - s, str(p), ha="center", va="center")
        ax.set_xlim(0, B_ * H_), ax.set_ylim(0, S_)
        ax.set_xticks([i + 0.5 for i in range(B_ * H_)], [f"b{i // H_}h{i % H_}" for i in range(B_ * H_)])
        ax.set_yticks([S_ - 0.5 - s for s in range(S_)], [f"s={s}" for s in range(S_)])
        ax.set_title(title, fontsize=10)
    fig.suptitle("which program rotates each row x[s, b, h, :] (number = program id; same colour = same program)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.show()


draw_grids(FIGURES / "04-grids.png")

# %% [markdown]
# ![The naive grid and the (S, H) grid](../figures/04-grids.png)
#
# The kernel, `ropelib/kernels/batch_reuse.py`, as it is in ropelib:
#
# <!-- ropelib-source: ropelib.kernels.batch_reuse._rope_batch_reuse_kernel -->
# ```python
# @triton.jit
# def _rope_batch_reuse_kernel(
#     x_ptr,  # *x: input [S, B, H, D], any strides
#     y_ptr,  # *y: output [S, B, H, D], same dtype as x, last dim contiguous
#     freqs_ptr,  # *fp32: angles [P, D], P >= S (row s holds the D angles of position s)
#     B,  # batch size: the length of the loop each program runs
#     stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
#     stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
#     stride_fs, stride_fd,  # freqs strides, in elements
#     HALF: tl.constexpr,  # D // 2: features in each half (any size, 72/2 = 36 included)
#     BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile each half is loaded in
#     BACKWARD: tl.constexpr,  # False: y = R(theta) x; True: y = R(theta)^T x = R(-theta) x
#     COMPUTE_DTYPE: tl.constexpr,  # tl.float32 (tl.float64 for fp64 inputs)
#     BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
# ):
#     # One program = one (position, head) pair; int64 so offsets cannot overflow on huge tensors.
#     s = tl.program_id(0).to(tl.int64)
#     h = tl.program_id(1).to(tl.int64)
#
#     offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF] feature index within a half
#     mask = offs < HALF
#
#     # cos/sin of position s: computed once here, reused by every row of the batch below.
#     f_row = freqs_ptr + s * stride_fs
#     theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#     theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#     cos1 = tl.cos(theta1)
#     cos2 = tl.cos(theta2)
#     if BACKWARD:
#         # Transpose of [[c1, -s1], [s2, c2]]: swap and negate the sines (= rotation by -theta).
#         sin1 = -tl.sin(theta2)
#         sin2 = -tl.sin(theta1)
#     else:
#         sin1 = tl.sin(theta1)
#         sin2 = tl.sin(theta2)
#
#     x_base = x_ptr + s * stride_xs + h * stride_xh
#     y_base = y_ptr + s * stride_ys + h * stride_yh
#     # A runtime loop (not tl.static_range): B is not a constexpr, so one compiled kernel
#     # serves every batch size.
#     for b in range(0, B):
#         x_row = x_base + b * stride_xb
#         x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#         x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
#         y1 = x1 * cos1 - x2 * sin1
#         y2 = x2 * cos2 + x1 * sin2
#         y_row = y_base + b * stride_yb
#         tl.store(y_row + offs, round_to(y1, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
#         tl.store(y_row + HALF + offs, round_to(y2, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
# ```
#
# Compared with the naive kernel only the top and the loop changed: `tl.program_id(0)` and
# `tl.program_id(1)` are $s$ and $h$; cos/sin are computed before the loop; the body is the
# naive kernel's row, at `b * stride_xb`.
#
# **`range` vs `tl.static_range`.** The earlier project looped with `tl.static_range(B)`, which
# unrolls the loop at compile time: $B$ must then be a `tl.constexpr`, and every batch size
# compiles its own kernel; in exchange the compiler sees all iterations at once and can issue
# their loads together. ropelib's loop is a runtime `range(0, B)`: one compiled kernel serves
# every batch size, and the other programs running on the same multiprocessor hide the wait
# for each iteration's loads.

# %%
torch.manual_seed(0)
x = torch.randn(S, B, H, D, device=device, dtype=torch.bfloat16)
freqs = ex.te_angles(S, D, device=device)

y2 = rope_batch_reuse(x, freqs)
y1 = rope_naive(x, freqs)
m = compare.error_metrics(y2, reference.rope_reference(x, freqs))
print(f"batch-reuse vs fp64 reference: max ulp err {m['max_ulp_err']:.2f}; "
      f"bit-identical to the naive kernel: {torch.equal(y1, y2)}")
assert m["max_ulp_err"] <= 1.0
print(f"programs launched: naive {naive_grid(S, B, H)[0]:,}, batch-reuse "
      f"{batch_reuse_grid(S, H)[0] * batch_reuse_grid(S, H)[1]:,}")

# %% [markdown]
# ## 3. The story: a batch-reusing kernel on an RTX 2070 Super
#
# An earlier study project wrote exactly this kernel for TE's sbhd layout: grid
# `(seq_len, head_num)`, cos/sin loaded once per program, a `tl.static_range` loop over the
# batch loading the halves `x1`, `x2` and storing `x1·cos − x2·sin` and `x1·sin + x2·cos`. It
# was tested against Transformer Engine with TE's own test matrix and benchmarked on an RTX
# 2070 Super (448 GB/s peak), head dim 128, 64 heads, seq 256…3968. TE's CUDA kernel levelled
# off near 250 GB/s; the Triton kernel reached about 260 GB/s at batch 1, about 310 GB/s at
# batch 2 (+24 %), +36 % at batch 4 and +44 % at batch 8. The larger the batch, the more each
# program reuses its cos/sin, and the more its advantage grows. Its listed limits — no partial
# rotary, no transposed inputs, sbhd/bshd only — are what ropelib's finished kernel adds.
#
# Those are that project's numbers on that GPU. Section 5 measures ropelib's generations on
# yours, or shows the committed measurement from an H100/H200.
#
# ## 4. A bytes-moved model, GB/s and the copy floor
#
# RoPE does two multiplies and an add per element and moves every element twice: it is
# **memory-bound**, so its speed is measured in bytes per second, against the bandwidth the GPU
# can actually deliver. The model counts the bytes any correct kernel *must* move:
#
# $$ \text{bytes} = \underbrace{N e}_{\text{read } x} + \underbrace{N e}_{\text{write } y}
#    + \underbrace{4 S D}_{\text{fp32 angles, once}}, \qquad
#    \text{GB/s} = \frac{\text{bytes}}{t} , $$
#
# with $N = SBHD$ elements of $e$ bytes. Extra traffic a kernel causes (re-reading the table,
# say) is *not* counted: it shows up as a lower GB/s. The yardstick is a plain device copy
# `y.copy_(x)`, timed in the same run on the same tensors: it moves $2Ne$ bytes and nothing
# else can move them faster. So
#
# $$ \%\ \text{of copy} = 100 \cdot \frac{\text{GB/s}_{\text{kernel}}}{\text{GB/s}_{\text{copy}}} .$$
#
# `ropelib.compare.bytes_moved` is this model; `benchmarks/generations.py` times the copy and
# the three generations with `triton.testing.do_bench` (median of many runs, the L2 cache
# flushed between them).

# %%
cfg = compare.Config(Sr, Br, Hr, Dr, dtype="bf16")
print(f"reference case: {compare.bytes_moved(cfg) / GiB:.4f} GiB per forward "
      f"(x {x_bytes / GiB:.0f} GiB + y {x_bytes / GiB:.0f} GiB + angles {Sr * Dr * 4 / 2**20:.0f} MiB)")
for copy_gbps in (3000.0, 4000.0):  # what a copy reaches on an H100 / H200, roughly
    print(f"  at a copy speed of {copy_gbps:.0f} GB/s the floor is "
          f"{ex.solution_floor_ms(compare.bytes_moved(cfg), copy_gbps):.3f} ms")
assert compare.bytes_moved(cfg) == 2 * x_bytes + Sr * Dr * 4

# %% [markdown]
# ## 5. Measured: naive vs batch-reuse vs finished vs copy
#
# ### 5.1 Live, on this machine

# %%
if GPU:
    live_cases = [c for c in generations.cases() if c[0] in ("reference", "batch-1", "batch-4", "batch-16")]
    t0 = time.perf_counter()
    live_rows = generations.measure(live_cases, backward=False)
    print(f"(measured in {time.perf_counter() - t0:.0f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        live_csv = generations.write(live_rows, Path(tmp) / "live.csv")
        fig = generations.plot_generations(live_csv, None)
        plt.show()
    for r in live_rows:
        if r.get("available") and r.get("pct_of_copy") is not None:
            assert r["pct_of_copy"] < 110, "faster than a copy of the same bytes: the timing is wrong"
else:
    # The interpreter runs programs one by one in Python: wall-clock times measure Python, not
    # memory bandwidth. What it can show is how many programs each grid launches.
    for name, fn, grid in (("naive", rope_naive, naive_grid(S, B, H)),
                           ("batch-reuse", rope_batch_reuse, batch_reuse_grid(S, H))):
        t0 = time.perf_counter()
        fn(x, freqs)
        programs = grid[0] * (grid[1] if len(grid) > 1 else 1)
        print(f"{name:12}: {programs:3d} programs, {(time.perf_counter() - t0) * 1e3:6.0f} ms "
              "in the interpreter (meaningless as a speed)")
    print("No GPU here: the measurement below comes from the committed results.")

# %% [markdown]
# ### 5.2 Committed results from an H100/H200
#
# `python benchmarks/generations.py` on a GPU writes `benchmarks/results/generations.csv` (with
# the GPU's name, the driver, torch/Triton versions and the date in its header) and draws this
# figure from it; the cell below redraws it from the CSV, so it runs without a GPU:
#
# ![GB/s of the three generations and of a device copy](../figures/04-generations-gbps.png)

# %%
if generations.CSV_PATH.exists():
    meta = compare.read_meta(generations.CSV_PATH)
    rows = compare.read_csv(generations.CSV_PATH)
    generations.plot_generations(generations.CSV_PATH, generations.FIGURE_PATH)
    print(f"measured on {meta.get('gpu')} (driver {meta.get('driver')}), torch {meta.get('torch')}, "
          f"triton {meta.get('triton')}, {meta.get('date')}")
    assert meta.get("gpu") not in (None, "", "none"), "the committed CSV must come from a GPU"
    for r in rows:
        if r["case"] == generations.REFERENCE or r["group"] == "batch":
            print(f"{r['case']:10} " + generations.summary_line(r))
        if r.get("available") and r.get("pct_of_copy") is not None:
            assert r["pct_of_copy"] < 110, f"{r['case']}/{r['provider']}: faster than a copy?"
    ref = {r["provider"]: r for r in rows if r["case"] == generations.REFERENCE and r.get("available")}
    if "ropelib_naive" in ref and "ropelib_batch_reuse" in ref:
        gain = ref["ropelib_batch_reuse"]["fwd_gbps"] / ref["ropelib_naive"]["fwd_gbps"]
        print(f"reference case: batch-reuse moves data {gain:.2f}x as fast as naive")
else:
    print(f"{generations.CSV_PATH.relative_to(ROOT)} is not there yet: run "
          "`python benchmarks/generations.py` on a GPU to measure and draw it.")

# %% [markdown]
# How to read it: the dashed line (left) and the grey bar (right) are the copy, the ceiling. A
# generation's distance below it is the price of its design. The batch sweep on the left shows
# what reuse over the batch buys as $B$ grows, and the bars on the right are the 1 GiB
# reference case.
#
# ## 6. What the finished kernel does beyond the batch-reusing grid
#
# The (S, H) grid still has limits:
#
# - **cos/sin are reused across the batch, not across heads**: all $H$ programs of a position
#   still compute the same cosines and sines;
# - **one row per load**: each load is half a head ($D/2$ elements, 128 bytes in bf16 for
#   $D = 128$), so a program moves $B$ small pieces, one after another;
# - **the grid depends on the shape**: with $B = 1$ nothing is reused at all, and when $S \cdot H$
#   is small there are too few programs to fill the GPU;
# - only sbhd, rotate-half, full rotary, and positions $0 \ldots S-1$.
#
# ropelib's finished kernel (`ropelib/kernels/fused.py`, used by `ropelib.apply_rope`) gives
# each program a **tile** of positions × heads, computes cos/sin once per tile and reuses them
# across its heads *and* a chunk of the batch, loads contiguous runs of the head dim as wide
# vectors, and takes every layout through strides. Its header says how it is parallelised:

# %%
try:
    from ropelib.kernels import fused
    doc = fused.__doc__ or ""
    print(doc.split("The pairing")[0].strip())
except ImportError as exc:
    print(f"ropelib.kernels.fused is not importable here ({exc})")

# %% [markdown]
# ## Exercises
#
# **1.** How many bytes of fp32 angles do all programs of a generation load together?
# `my_angle_bytes(generation, S, B, H, D)` with `generation` `"naive"` or `"batch_reuse"`.

# %%
def my_angle_bytes(generation, S, B, H, D):
    ...  # your code


ex.check_angle_bytes(my_angle_bytes)
solution(ex.solution_angle_bytes)

# %% [markdown]
# **2.** A device copy reached `copy_gbps` GB/s. What is the fastest time, in ms, for a kernel
# that must move `nbytes` bytes?

# %%
def my_floor_ms(nbytes, copy_gbps):
    ...  # your code


ex.check_floor_ms(my_floor_ms)
solution(ex.solution_floor_ms)

# %% [markdown]
# **3.** A generation ran in `kernel_ms`, the copy of the same tensor in `copy_ms`. Return the
# generation's GB/s as a percentage of the copy's GB/s (the kernel's bytes include the fp32
# angles, the copy's do not).

# %%
def my_percent_of_copy(kernel_ms, copy_ms, S, B, H, D, dtype):
    ...  # your code


ex.check_percent_of_copy(my_percent_of_copy)
solution(ex.solution_percent_of_copy)
