# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 13 — RoPE puzzles
#
# Eleven short puzzles, each a Triton kernel to write or to repair, and a capstone. After a
# warm-up, nine are built on a mistake RoPE code makes (where public code was reported with it,
# the puzzle names the report); puzzle 9 gives the right output and is about the loads it spends;
# the capstone, puzzle 12, needs four of the fixes at once. As in Triton-Puzzles, every puzzle
# runs on a CPU in Triton's interpreter beside a plain-PyTorch spec, and a check tells you at once
# whether you are right, and if not, what differs.
#
# **After this notebook you will be able to**
#
# - write RoPE kernels on a tile of rows per program, masked for short tiles and for head dims
#   that are not powers of two;
# - recognise nine RoPE bugs, and one pattern of wasted loads, by their symptoms;
# - read a picture of the elements a kernel loaded and stored;
# - keep angles in fp32 and offsets in int64 where needed, and honour a caller's strides;
# - tell a 16-bit table's own precision from a kernel's rounding, and round once;
# - combine those in the backward of a partial, interleaved RoPE on packed sequences.
#
# **How a check works.** It runs your kernel in the interpreter into an output filled with NaN,
# so an element you never write cannot pass. A **lane** (one element of a program's tile of
# offsets) that touches no tensor is reported and masked off, so a wrong kernel cannot crash the
# notebook. The output is compared with an fp64 spec. An answer that calls ropelib fails. A ❌
# line prints the call that redraws its inputs, such as `pz.check_partial(my_partial_kernel,
# seed=N)`. On a GPU a passing kernel of puzzles 2 to 12 is also timed against a device copy of
# the bytes a right answer moves (the ⏱ line, naming the GPU); each worked solution's ⏱ line is
# the time to aim for. A ⏱ line is one timing and can stray far from the same kernel's rounds
# in the table under the scoreboard; read that table before believing a slow one. Committed
# measurements the text quotes are from an NVIDIA H200.
#
# **Reading the pictures.** One panel per tensor, rows down, last dim across. Inputs: grey never
# loaded, light to dark blue loaded once to four or more times. Outputs: the colour of the program
# that stored the element, grey never stored, black stored by two or more programs (a race on a
# GPU).
#
# **How the puzzles are posed.** Puzzles 1, 2, 4, 8 and 12 you write from an empty body. The
# others hand you a nearly right kernel with the spec and the symptom, not the bug: let the ❌
# line and the picture lead you. `pz.hint(n)` says where to look, and names the mistake when the
# last check recognised it; `pz.hint(n, fix=True)` gives the fix in words, the last step before
# the worked solution. A "What was wrong" note under each worked solution explains the bug; read
# it after your ✅. 5, 7 and 11 need the most thought.
#
# **Time:** solving takes 2–4 hours. The notes under the worked solutions and the study
# questions take about an hour more, of which about 20 minutes are optional and marked so:
# where puzzle 9's repeated loads are served from, and the appendix on puzzles 5 and 9 against a
# copy. Every cell runs in about a minute on a CPU.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
import triton
import triton.language as tl

from ropelib import runtime
from ropelib.bench import compare
from ropelib.course import measured
from ropelib.course import puzzles as pz
from ropelib.course.exercises import solution

print(runtime.mode())
assert len(pz.PUZZLES) == 12                        # twelve, the last a capstone

# %% [markdown]
# ## 0. How the checks see memory
#
# The tool every check uses, on a kernel that is not RoPE: a copy of 10 elements in tiles of 4,
# with the classic bug — no mask, so the last tile runs 2 elements past the end.
# `pz.run_in_checked_memory` launches it in the interpreter with `x` as the only input and `y`
# the only output, and reports and masks off the stray lanes.

# %%
@triton.jit
def _copy_kernel(
    x_ptr,  # *fp32: x [N]
    y_ptr,  # *fp32: y [N]
    N,  # elements (unused: that is the bug)
    BLOCK: tl.constexpr,  # elements per program
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))    # no mask: the last tile runs past N


x = torch.arange(10.0)
y = torch.full((10,), float("nan"))
memory = pz.run_in_checked_memory(_copy_kernel, (3,), x, y, 10, BLOCK=4,
                                  inputs={"x": x}, outputs={"y": y})
print(memory.fault_report())
assert sum(len(f.lanes) for f in memory.faults) == 4   # 2 lanes of the load, 2 of the store
assert 2 * x.element_size() == 8                       # 2 fp32 lanes: 8 bytes past each tensor
assert torch.equal(y, x)                               # the stray lanes never touched memory
who = memory.storing_programs("y")                     # per element: the program that stored it
assert [int((who == p).sum()) for p in range(3)] == [4, 4, 2]
assert (memory.counts("x", "load") == 1).all()         # per element of x: how often it was loaded
pz.draw_accesses(memory, "copy without a mask: 3 programs of 4 lanes for 10 elements")

# %% [markdown]
# On a GPU the same kernel would read 8 bytes past `x` and write 8 bytes past `y`, into whatever
# tensor lies there, and no error would say so.
#
# The repair is a mask, `offs < N`, on the load and the store. Below, the repaired copy goes
# through a puzzle's check (`pz.check_copy`) to show a pass: the ✅ line lists the cases; the
# next gives, per tensor, its load or store instructions and the share of the bytes they moved
# that the kernel used (a GPU moves memory in 32-byte **sectors**); then the picture, and on a GPU
# the ⏱ line. This masked copy is the reference for a Triton kernel at copy speed.

# %%
@triton.jit
def _masked_copy_kernel(
    x_ptr,  # *fp32: x [N]
    y_ptr,  # *fp32: y [N]
    N,  # elements
    BLOCK: tl.constexpr,  # elements per program
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < N                                  # the last tile's lanes past N do nothing
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=live), mask=live)


passed = pz.check_copy(_masked_copy_kernel)
graded = pz.last_grade("copy")                       # what that check found
assert passed and graded.passed and graded.case == "x [200], BLOCK=64"
assert graded.sectors == {"x": (4, 1.0), "y": (4, 1.0)}   # 4 programs, every byte of each sector
copy_line = pz.check_time("copy")                    # its ⏱ line: None where nothing was timed
if runtime.on_gpu():
    assert copy_line is not None and 0.8 < copy_line.of_copy < 1.15   # a Triton copy: near 100 %

# %% [markdown]
# Each puzzle below has the same cells: what it is about, the spec (`pz.show_spec`), a kernel
# cell with its check, and the worked solution folded away. Edit the kernel cell and rerun it;
# the check never stops the notebook.

# %% [markdown]
# ## Puzzle 1 — rotate one row (write)
#
# The warm-up. One row of $D = 2H$ features, rotate-half pairing: feature $j$ with $j + H$,
# turned by $\theta_j$:
#
# $$
# \begin{aligned}
# y_j     &= x_j \cos\theta_j - x_{j+H} \sin\theta_j, \\
# y_{j+H} &= x_{j+H} \cos\theta_j + x_j \sin\theta_j,
# \end{aligned}
# \qquad 0 \le j < H .
# $$
#
# The grid is `(1,)`: one program, one row. $H$ is a power of two here, so `tl.arange(0, HALF)`
# covers a half. A loaded tile cannot be sliced: load the two halves as two tiles. **The check**
# runs three head dims and compares `y` with `spec_rotate_row`.

# %%
pz.show_spec("rotate_row")

# %%
@triton.jit
def my_rotate_row_kernel(
    x_ptr,  # *fp32: x [2 * HALF], one row
    theta_ptr,  # *fp32: angles [HALF], one per pair
    y_ptr,  # *fp32: y [2 * HALF]
    HALF: tl.constexpr,  # features per half (a power of two in this puzzle)
):
    ...  # your code: one program, grid (1,)


pz.check_rotate_row(my_rotate_row_kernel);

# %%
solution(pz.solution_rotate_row_kernel.fn, title="Solution: puzzle 1")

# %% [markdown]
# ## Puzzle 2 — interleaved pairs (write)
#
# RoPE has two pairings. GPT-J and RoFormer turn *adjacent* features, pair $j = (2j, 2j+1)$
# (interleaved); GPT-NeoX and Hugging Face's Llama turn feature $j$ with $j + H$ (rotate-half). A
# model run with the pairing it was not trained with gets wrong scores and no error. Checkpoint
# conversions switch pairing by permuting the rows of the q and k projections, so the right
# pairing depends on where the weights came from; and a fused kernel can ignore its pairing switch
# on one code path (vllm-project/vllm#49290).
#
# $$
# y_{2j} = x_{2j} \cos\theta_j - x_{2j+1} \sin\theta_j, \qquad
# y_{2j+1} = x_{2j+1} \cos\theta_j + x_{2j} \sin\theta_j .
# $$
#
# Write the kernel for GPT-J's pairing, on a tile of `BLOCK_ROWS` rows per program (grid
# `(cdiv(N_ROWS, BLOCK_ROWS),)`): mask off the rows of a short last tile. If yours pairs $j$ with
# $j + H$, the check fails and `pz.hint(2)` says so. A loaded tile cannot be indexed by feature:
# load the even and odd features as two tiles, or load whole rows and split the pairs in registers
# (`tl.reshape`, `tl.split`, `tl.join`).
#
# **The check** runs three sizes, most with a short last tile, and compares `y` with
# `spec_interleaved`.

# %%
pz.show_spec("interleaved")

# %%
@triton.jit
def my_interleaved_kernel(
    x_ptr,  # *fp32: x [N_ROWS, 2 * HALF], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous, one per pair
    y_ptr,  # *fp32: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    ...  # your code: a tile of BLOCK_ROWS rows per program


pz.check_interleaved(my_interleaved_kernel);

# %%
solution(pz.solution_interleaved_kernel.fn, title="Solution: puzzle 2")
pz.time_solution("interleaved");

# %% [markdown]
# The kernel most of us write first loads the even and odd features with stride 2: each load and
# store then uses half of every sector it moves, as the cell below counts. The worked solution
# loads whole rows, at offsets `tl.arange(0, 2 * HALF)` the compiler can prove contiguous, and
# splits and joins the pairs in registers.
#
# Half of each sector is not half the speed, though the yardstick matters. The cell's last lines
# read notebook 03's H200 timings (section 5). Against contiguous pair tiles (its pattern c),
# stride-2 loads (b) took about the same time, mostly served by L1; stride-2 stores took more
# than twice the time; whole rows (d) less than a third. But (c) is itself slow: as Triton 3.6
# compiles it, each request uses a quarter of every sector it touches and the stores are laid out
# the same way, so L2 receives several times a copy's sectors (notebook 03 counts them) and (c)
# takes 3.3 times a copy's time, where whole rows run at a copy's speed. So stride-2 loads cost
# little next to (c), a slow pattern, not next to a copy.

# %%
@triton.jit
def _stride_two_copy_kernel(
    x_ptr,  # *fp32: x [2 * HALF], one row
    y_ptr,  # *fp32: y [2 * HALF]
    HALF: tl.constexpr,  # features per tile: the even ones, then the odd ones
):
    j = tl.arange(0, HALF)
    even, odd = tl.load(x_ptr + 2 * j), tl.load(x_ptr + 2 * j + 1)
    tl.store(y_ptr + 2 * j, even)
    tl.store(y_ptr + 2 * j + 1, odd)


x = torch.randn(128)
y = torch.full((128,), float("nan"))
memory = pz.run_in_checked_memory(_stride_two_copy_kernel, (1,), x, y, HALF=64,
                                  inputs={"x": x}, outputs={"y": y})
use = pz.sector_use(memory)           # tensor -> (instructions, share of the moved sectors' bytes)
print("; ".join(f"{name}: {n} instructions, {share:.0%} of the sectors' bytes used"
                for name, (n, share) in use.items()))
assert torch.equal(y, x) and not memory.faults
assert use == {"x": (2, 0.5), "y": (2, 0.5)}         # each instruction uses half of every sector

acc_meta, acc_rows = measured.load("access_counters")   # notebook 03: bf16 [262144, 128]
swap = {r["pattern"]: r for r in acc_rows if r["group"] == "pair swap"}
# notebook 03's (c), one contiguous [pairs, 2] tile; (b)'s stride-2 loads; (b)'s stride-2 stores
base, load2, store2 = (swap[k] for k in ("contiguous load, contiguous store",
                                         "stride-2 load, contiguous store",
                                         "contiguous load, stride-2 store"))
print(f"{acc_meta['gpu']} (notebook 03): stride-2 loads {load2['us'] / base['us']:.2f}x the "
      f"time of contiguous ones ({load2['l1_load_hit_pct']:.1f} % L1 hits); stride-2 stores "
      f"{store2['us'] / base['us']:.2f}x the time, "
      f"{store2['l2_write_sectors'] / base['l2_write_sectors']:.1f}x the L2 write sectors")
whole = swap["whole rows, reshape and split"]                     # notebook 03's (d)
copy_us = float(acc_meta["copy_us"])                              # a copy of the same bytes
print(f"  whole rows (d), this worked solution's pattern: {whole['us']:.1f} us against "
      f"(c)'s {base['us']:.1f} us and a copy's {copy_us:.1f} us ((c): {base['us'] / copy_us:.1f}x "
      f"the copy's time)")
assert abs(load2["us"] / base["us"] - 1) < 0.05                   # loads: little, next to (c)
assert round(base["us"] / copy_us, 1) == 3.3                      # (c) itself: slow
assert whole["us"] < 1.05 * copy_us                               # (d): a copy's speed
assert store2["us"] > 2 * base["us"] and store2["l2_write_sectors"] > 2 * base["l2_write_sectors"]
assert 3 * whole["us"] < base["us"] and acc_meta["gpu"] == "NVIDIA H200"   # under a third

# %% [markdown]
# ## Puzzle 3 — partial rotary (repair)
#
# Many models rotate only the first $R$ features of each head and pass the other $D - R$ through:
# GPT-NeoX a quarter of each head, GPT-J 64 of 256, Phi-2 32 of 80. With rotate-half, the halves
# are those of the *rotary* part, so feature $j$ pairs with $j + R/2$:
#
# $$
# y_j = x_j \cos\theta_j - x_{j+R/2}\sin\theta_j,\quad
# y_{j+R/2} = x_{j+R/2}\cos\theta_j + x_j \sin\theta_j \;\; (j < R/2), \qquad
# y_k = x_k \;\; (k \ge R).
# $$
#
# The kernel below is right for full rotary ($R = D$), the case its tests covered. Repair it so
# that every feature of `y` matches the spec. It has more than one mistake; one stays hidden while
# the output buffer starts as a copy of `x` (the check's starts as NaN). `BLOCK_PASS` is a
# power-of-two tile for the $D - R$ pass-through features.

# %%
pz.show_spec("partial")

# %%
@triton.jit
def my_partial_kernel(
    x_ptr,  # *fp32: x [N_ROWS, D], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, R // 2], contiguous
    y_ptr,  # *fp32: y [N_ROWS, D], contiguous
    N_ROWS,  # rows in x
    D: tl.constexpr,  # head dim
    R: tl.constexpr,  # rotary dim (R // 2 a power of two here); features R..D-1 pass through
    BLOCK_ROWS: tl.constexpr,  # rows per program
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = rows[:, None] < N_ROWS
    j = tl.arange(0, R // 2)
    theta = tl.load(theta_ptr + rows[:, None] * (R // 2) + j[None, :], mask=live, other=0.0)
    row_x = x_ptr + rows[:, None] * D
    row_y = y_ptr + rows[:, None] * D
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
    x2 = tl.load(row_x + D // 2 + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(row_y + D // 2 + j[None, :], x2 * c + x1 * s, mask=live)


pz.check_partial(my_partial_kernel);

# %%
solution(pz.solution_partial_kernel.fn, title="Solution: puzzle 3")
pz.time_solution("partial");

# %% [markdown]
# **What was wrong.** Two mistakes of kernels written for full rotary. The partner of feature $j$
# was taken at $j + D/2$, not $j + R/2$: in the ❌ line's case ($D = 64$, $R = 32$) the rotation
# read its partners from pass-through features 32-47 and wrote over them, and rotary features
# 16-31 were never written. And no pass-through feature was copied, so 48-63 were never written
# either: the mistake that hides while the output buffer holds `x`. The repair pairs $j$ with
# $j + R/2$ and copies the pass-through features from `x`.

# %% [markdown]
# ## Puzzle 4 — head dims 80, 96, 72 (write)
#
# `tl.arange(0, N)` needs a power of two, and head dims are not always one: 80 (Phi-2), 96
# (Phi-3-mini), 72. For head dim 80, a half of $H = 40$ features is loaded as a tile of
# `BLOCK_HALF` $= 64$ lanes, and the 24 lanes past $H$ must be masked off in *every* load and
# store. Write the kernel, a tile of `BLOCK_ROWS` rows per program as in puzzle 2, for any `HALF`.
#
# The bug behind it: rounding the tile up but masking only the rows. Each row's second half then
# reads and writes 24 features past its end, into the next row or past the tensor; where the next
# row belongs to another program, which store lands last changes from run to run on a GPU
# (sgl-project/sglang#35096).
#
# **The check** runs head dims 80, 96 and 72, and a power of two as a control, most with a short
# last tile, and reports wrong rows and stray lanes; an element stored by two programs is black.

# %%
pz.show_spec("odd_head_dim")
assert triton.next_power_of_2(80 // 2) == 64      # H = 40 in a tile of 64 lanes: 24 to mask off

# %%
@triton.jit
def my_odd_head_dim_kernel(
    x_ptr,  # *fp32: x [N_ROWS, 2 * HALF], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous
    y_ptr,  # *fp32: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # features per half: any size (80 / 2 = 40)
    BLOCK_ROWS: tl.constexpr,  # rows per program
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile a half is loaded in
):
    ...  # your code: a tile of BLOCK_ROWS rows per program


pz.check_odd_head_dim(my_odd_head_dim_kernel);

# %%
solution(pz.solution_odd_head_dim_kernel.fn, title="Solution: puzzle 4")
pz.time_solution("odd_head_dim");

# %% [markdown]
# ## Puzzle 5 — angles at position 100,000 (repair)
#
# The angle of pair $j$ at position $p$ is $\theta = p\,\omega_j$ with $\omega_j = 10000^{-j/H}$,
# so $\omega_0 = 1$: at position 100,000 it is 100,000 radians, and cos and sin need it to a few
# hundredths of a radian.
#
# A bf16 model ran with the kernel below: attention worked at short context and degraded, with no
# error, as the context grew. The caller hands the kernel a cached angle table, each row's integer
# position and the fp32 inverse frequencies. Repair the kernel so that it is right at every
# position up to 131,071.
#
# The check grades each pair's **angle error** at positions up to 131,071: the chord
# $c = |y - y_\text{spec}| / |x|$ turned into the angle it spans, $2 \arcsin(c / 2)$ radians (at
# most $\pi$, when $y$ points opposite $y_\text{spec}$). It allows 0.03 rad (`pz.ANGLE_TOL`); a
# panel plots the worst error per position.
#
# One trap: the interpreter does arithmetic on bf16 tiles on their raw bits, not their values. The
# cell below squares four bf16 values: on bf16 tiles not one comes out right. Convert each bf16
# tile to fp32 before computing with it, as the given kernel does.

# %%
from ropelib.course.work_count import interpreted


@triton.jit
def _bf16_square_kernel(
    x_ptr,  # *bf16: x [N]
    y_ptr,  # *bf16: y [2 * N]: x * x computed on bf16 tiles, then on fp32 tiles
    N: tl.constexpr,  # elements
):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(y_ptr + i, x * x)                                          # bf16 arithmetic
    tl.store(y_ptr + N + i, (x.to(tl.float32) * x.to(tl.float32)).to(tl.bfloat16))


x = torch.tensor([1.5, 3.0, -2.0, 0.5], dtype=torch.bfloat16)
y = torch.empty(8, dtype=torch.bfloat16)
interpreted(_bf16_square_kernel)[(1,)](x, y, N=4)            # Triton's interpreter, CPU tensors
for name, got in (("bf16 tiles", y[:4]), ("fp32 tiles", y[4:])):
    print(f"x = {x.tolist()}, x * x on {name}: " + ", ".join(f"{v:.3g}" for v in got.tolist()))
assert torch.equal(y[4:], x * x)                     # converted first: the squares
assert not torch.isclose(y[:4].float(), (x * x).float()).any()   # on bf16 tiles: none of them

# %%
pz.show_spec("long_context")
assert pz.ANGLE_TOL == 0.03                       # radians, the check's tolerance (the text)

# %%
@triton.jit
def my_long_context_kernel(
    x_ptr,  # *bf16: x [N_ROWS, 2 * HALF], contiguous
    freqs_ptr,  # *bf16: the caller's angle table [N_ROWS, HALF], rounded to bf16
    pos_ptr,  # *int32: position of each row [N_ROWS]
    inv_freq_ptr,  # *fp32: inverse frequencies [HALF]
    y_ptr,  # *bf16: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(freqs_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta.to(tl.float32)), tl.sin(theta.to(tl.float32))
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0).to(tl.float32)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(row_y + HALF + j[None, :], (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=live)


pz.check_long_context(my_long_context_kernel);

# %%
solution(pz.solution_long_context_kernel.fn, title="Solution: puzzle 5")
pz.time_solution("long_context");

# %% [markdown]
# **What was wrong.** The angle table was cached in bf16, which keeps 8 significant bits: near
# 100,000 its values are 512 apart (the cell below), so a stored angle can be off by 256 rad, any
# angle at all, and no kernel can get that back. The repair computes $\theta$ in fp32 from the
# positions and the inverse frequencies. (`model.to(torch.bfloat16)` also casts the
# inverse-frequency buffer: huggingface/transformers#25681, EleutherAI/gpt-neox#1003.)
#
# fp32 has a limit too. The cell below measures how far an fp32 angle can be from the exact
# one: 0.0039 rad ($2^{-8}$) below $2^{17}$, the positions the check uses, well inside its
# 0.03; 0.0312 rad below $2^{20}$, just past it; 0.5 rad below $2^{24}$. Notebook 10 (section 7)
# covers angles at long context and ropelib's exact alternative.

# %%
def gap(lo, hi, dtype):
    """The distance between neighbouring values of `dtype` from lo to hi: the integers lo..hi-1,
    rounded to dtype, land on values one such distance apart."""
    near = torch.arange(float(lo), float(hi), dtype=torch.float64).to(dtype).unique().double()
    (distance,) = near.diff().unique().tolist()
    return distance


bf16_gap = gap(99_000, 101_000, torch.bfloat16)
print(f"angles near 100,000 held in bf16: values {bf16_gap:.0f} apart, so off by up to "
      f"{bf16_gap / 2:.0f} rad")
assert bf16_gap == 512
for top in (2**17, 2**20, 2**24):
    theta = torch.linspace(top / 2, top, 1_000_001, dtype=torch.float64)    # angles, radians
    off = (theta.to(torch.float32).double() - theta).abs().max().item()
    print(f"angles in [2^{top.bit_length() - 2}, 2^{top.bit_length() - 1}): an fp32 angle is off "
          f"by up to {off:.4f} rad")
    assert abs(off - top * 2.0**-25) < 1e-3 * top * 2.0**-25   # half an fp32 spacing there

# %% [markdown]
# ## Puzzle 6 — position ids with strides (repair)
#
# Hugging Face models hand RoPE `position_ids [B, S]`, often not contiguous: one row expanded over
# the batch (`arange(S)[None].expand(B, -1)`, stride 0), or a slice of a larger tensor, as in
# generation with a left-padded batch.
#
# The kernel below passed its tests with contiguous ids and went wrong with expanded ones. Repair
# it for any `position_ids`, without a copy. The grid is `(B, cdiv(S, BLOCK_S))`: program
# $(b, t)$ rotates `BLOCK_S` tokens of sequence $b$, gathering their cos/sin rows by position.
#
# **The check's cases:** contiguous ids, one row expanded over the batch, every other row of a
# transposed tensor, and the last $S$ positions of a left-padded batch.

# %%
pz.show_spec("position_ids")

# %%
@triton.jit
def my_position_ids_kernel(
    x_ptr,  # *fp32: x [B, S, 2 * HALF], contiguous
    pos_ptr,  # *int64: position_ids [B, S], any strides (stride 0 over the batch included)
    cos_ptr,  # *fp32: cos table [P, HALF], contiguous
    sin_ptr,  # *fp32: sin table [P, HALF], contiguous
    y_ptr,  # *fp32: y [B, S, 2 * HALF], contiguous
    S,  # tokens per sequence
    stride_pb, stride_ps,  # position_ids strides, in elements
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_S: tl.constexpr,  # tokens per program
):
    b = tl.program_id(0)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    live_s = s < S
    pos = tl.load(pos_ptr + b * S + s, mask=live_s, other=0)  # position_ids[b, s]
    j = tl.arange(0, HALF)
    live = live_s[:, None]
    c = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row = (b * S + s)[:, None] * (2 * HALF)
    x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
    tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


pz.check_position_ids(my_position_ids_kernel);

# %%
solution(pz.solution_position_ids_kernel.fn, title="Solution: puzzle 6")
pz.time_solution("position_ids");

# %% [markdown]
# **What was wrong.** The kernel found position $(b, s)$ at `b * S + s`, as if `position_ids`
# were contiguous. On an expanded tensor, whose storage holds only $S$ elements, every batch entry
# after the first is read past its end; on a sliced one, the wrong elements are read. A wrapper
# could call `.contiguous()`, at the price of a copy on every call; the worked solution reads
# `pos_ptr + b * stride_pb + s * stride_ps`.

# %% [markdown]
# ## Puzzle 7 — offsets past $2^{31}$ (repair)
#
# Row 262,144 of a tensor with 8,192 elements per row (64 heads × 128 features) starts at element
# $2^{31}$. Long-context prefill and large KV caches pass that size, and Triton kernels with int32
# offsets go wrong there, silently or with an illegal memory access (reported, outside RoPE, as
# fla-org/flash-linear-attention#1080 and databricks/megablocks#185). Repair the kernel below for
# rows that start past $2^{31}$.
#
# The interpreter cannot allocate gigabytes, so the check hands your kernel an `x` whose rows are
# $2^{30} + 64$ elements apart and a `y` whose rows are 1,200,000,000 apart (row 2 of each starts
# past $2^{31}$); its memory holds only those rows and maps each address to the row it lands in.

# %%
pz.show_spec("int64_offsets")
assert 262_144 * (64 * 128) == 2**31              # the first row that starts at element 2^31
# the check's virtual row strides (the text): row 2 of x and of y starts past 2^31
assert (pz.VIRTUAL_STRIDE_X, pz.VIRTUAL_STRIDE_Y) == (2**30 + 64, 1_200_000_000)
assert min(2 * pz.VIRTUAL_STRIDE_X, 2 * pz.VIRTUAL_STRIDE_Y) > 2**31 > pz.VIRTUAL_STRIDE_Y

# %%
@triton.jit
def my_int64_offsets_kernel(
    x_ptr,  # *fp32: x [N_ROWS, 2 * HALF], rows stride_x elements apart
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous
    y_ptr,  # *fp32: y [N_ROWS, 2 * HALF], rows stride_y elements apart
    N_ROWS,  # rows in x
    stride_x,  # x's row stride, in elements (int32 when it fits)
    stride_y,  # y's row stride, in elements
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    theta = tl.load(theta_ptr + rows[:, None] * HALF + j[None, :], mask=live, other=0.0)
    row_x = x_ptr + rows[:, None] * stride_x
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0)
    c, s = tl.cos(theta), tl.sin(theta)
    row_y = y_ptr + rows[:, None] * stride_y
    tl.store(row_y + j[None, :], x1 * c - x2 * s, mask=live)
    tl.store(row_y + HALF + j[None, :], x2 * c + x1 * s, mask=live)


pz.check_int64_offsets(my_int64_offsets_kernel);

# %%
solution(pz.solution_int64_offsets_kernel.fn, title="Solution: puzzle 7")
pz.time_solution("int64_offsets");

# %% [markdown]
# **What was wrong.** `tl.program_id`, `tl.arange` and every integer argument below $2^{31}$ are
# int32 in Triton, and int32 arithmetic wraps silently. The given kernel multiplied two int32
# factors, `rows` and a stride: past $2^{31}$ the product wraps to a negative offset, as the ❌
# line shows. The worked solution makes `rows` int64 before any multiplication, the fix proposed
# in both reports.

# %% [markdown]
# ## Puzzle 8 — the backward's sign (write)
#
# RoPE is linear in $x$: each pair is multiplied by the rotation $J = R(\theta)$. The backward
# multiplies the incoming gradient by its transpose, the rotation by $-\theta$:
#
# $$
# \frac{\partial L}{\partial x} = J^\top \frac{\partial L}{\partial y}, \qquad
# J = \begin{pmatrix} \cos\theta & -\sin\theta \\ \sin\theta & \cos\theta \end{pmatrix}, \qquad
# J^\top = \begin{pmatrix} \cos\theta & \sin\theta \\ -\sin\theta & \cos\theta \end{pmatrix}
# = R(-\theta).
# $$
#
# A backward that reuses the forward kernel turns the gradient the wrong way and raises nothing;
# only a gradient check catches it. Write the backward kernel: from $\partial L/\partial y$ and
# the angles, $\partial L/\partial x$, a tile of `BLOCK_ROWS` rows per program. The check compares
# it with `torch.autograd` through the spec; if your kernel turns by $+\theta$, `pz.hint(8)` after
# the ❌ says so.

# %%
pz.show_spec("backward")

# %%
@triton.jit
def my_backward_kernel(
    dy_ptr,  # *fp32: dL/dy [N_ROWS, 2 * HALF], contiguous
    theta_ptr,  # *fp32: angles [N_ROWS, HALF], contiguous
    dx_ptr,  # *fp32: dL/dx [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in dL/dy
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    ...  # your code: a tile of BLOCK_ROWS rows per program


pz.check_backward(my_backward_kernel);

# %%
solution(pz.solution_backward_kernel.fn, title="Solution: puzzle 8")
pz.time_solution("backward");

# %% [markdown]
# ## Puzzle 9 — one table for the whole batch (repair)
#
# Every batch entry (and head) at position $s$ uses the same cos/sin row. This kernel has one
# program per tile of positions and loops over the batch. Its output is right; the check counts
# the table loads and wants each element loaded at most once. Repair the kernel so that it passes.
#
# The puzzle is about counting loads, not speed at this shape: the 8.4 MB tables fit a large
# cache, and the cells after the solution measure whether the repeats cost anything there.

# %%
pz.show_spec("shared_table")

# %%
@triton.jit
def my_shared_table_kernel(
    x_ptr,  # *fp32: x [S, B, 2 * HALF], contiguous
    cos_ptr,  # *fp32: cos table [S, HALF], contiguous
    sin_ptr,  # *fp32: sin table [S, HALF], contiguous
    y_ptr,  # *fp32: y [S, B, 2 * HALF], contiguous
    S,  # positions
    B,  # batch entries per position (the program loops over them)
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_S: tl.constexpr,  # positions per program
):
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    j = tl.arange(0, HALF)
    live = (s < S)[:, None]
    for b in range(B):
        c = tl.load(cos_ptr + s[:, None] * HALF + j[None, :], mask=live, other=1.0)
        sn = tl.load(sin_ptr + s[:, None] * HALF + j[None, :], mask=live, other=0.0)
        row = (s * B + b)[:, None] * (2 * HALF)
        x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
        x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
        tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
        tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


pz.check_shared_table(my_shared_table_kernel);

# %%
solution(pz.solution_shared_table_kernel.fn, title="Solution: puzzle 9")
pz.time_solution("shared_table");

# %% [markdown]
# **What was wrong.** The kernel loaded the cos and sin rows inside the loop over the batch: $B$
# loads of every table element where one would do. The rows depend on $s$ only, so the worked
# solution loads them once, before the loop.
#
# **What the repair saves.** The cell below runs both kernels in checked memory on the timed shape
# cut to 32 positions (8 programs) and counts, per input, the load instructions, the 32-byte
# sectors they request and the distinct sectors among those.

# %%
import math

from ropelib.course import access

S9, B9, HALF9, BLOCK9 = 32, 8, 64, 4                 # the timed case, cut to 32 positions
gen9 = torch.Generator().manual_seed(9)
x9 = torch.randn(S9, B9, 2 * HALF9, generator=gen9)
ang9 = torch.rand(S9, HALF9, generator=gen9) * 2 * math.pi
tables9 = {"cos": ang9.cos(), "sin": ang9.sin()}
programs9 = S9 // BLOCK9


def load_counts(kernel):
    """Per input: (load instructions, sectors they request, distinct sectors), in checked
    memory on the cut-down timed shape; the output checked against the spec."""
    y9 = torch.full_like(x9, float("nan"))
    memory = pz.run_in_checked_memory(kernel, (programs9,), x9, tables9["cos"], tables9["sin"],
                                      y9, S9, B9, HALF=HALF9, BLOCK_S=BLOCK9,
                                      inputs={"x": x9, **tables9}, outputs={"y": y9})
    want = pz.spec_shared_table(x9.double(), tables9["cos"].double(), tables9["sin"].double())
    assert not memory.faults and torch.allclose(y9.double(), want, atol=1e-5)
    return load_summary(memory)


def load_summary(memory):
    """Per input of a run in checked memory: (load instructions, sectors requested, distinct)."""
    out = {}
    for name in ("x", "cos", "sin"):
        s = access.summary([a for a, o in zip(memory.accesses, memory.owners) if o == name],
                           "load")
        out[name] = (s["instructions"], s["sectors moved"], s["distinct sectors"])
    return out


counts9 = {"the given kernel": load_counts(pz.given_shared_table_kernel),
           "the worked solution": load_counts(pz.solution_shared_table_kernel)}
total9 = {who: [sum(v[i] for v in c.values()) for i in range(3)] for who, c in counts9.items()}
for who, c in counts9.items():
    n, asked, distinct = total9[who]
    print(f"{who:20s} per program: {n // programs9} load instructions, {asked // programs9} "
          f"sectors requested; {distinct} distinct sectors in all (instructions, requested, "
          "distinct: " + "; ".join(f"{name} {k}, {m}, {d}" for name, (k, m, d) in c.items()) + ")")
(gi, gr, gd), (si, sr, sd) = total9.values()
print(f"the given kernel: {gi / si:.2f}x the load instructions, {gr / sr:.2f}x the sectors "
      f"requested, {gd / sd:.2f}x the distinct sectors")
given_c, solved_c = counts9.values()
assert given_c["x"] == solved_c["x"]                               # x: the same loads
assert given_c["cos"][0] == B9 * solved_c["cos"][0] == B9 * programs9   # B loads a table row
assert (gi // programs9, si // programs9) == (4 * B9, 2 + 2 * B9)  # 32 against 18
assert gd == sd                                                   # the same distinct bytes

# %% [markdown]
# The given kernel's extra loads touch no sector the worked solution does not: each repeat asks
# again for bytes its program loaded an iteration before. Served from a cache, they cost
# instructions and cache requests; from DRAM, about what copying their bytes costs.
#
# **Where the repeats are served from, measured** (optional). `nb13_table_reuse` runs the given
# kernel on one table for the batch and on a table per batch entry, where DRAM must serve every
# load; beside them, the worked solution at BLOCK_S=4 and 16. On a GPU the cell times them in
# alternating rounds, each against a copy of the bytes it touches, and prints what the repeats
# cost on one table, what the per-entry tables add, and what a copy of those added bytes takes.
# If the first is near zero and the second near the copy, a cache serves the repeats: time
# follows the distinct bytes touched, not the loads issued. That reading rests on times alone:
# the two layouts run the same machine code (the cell checks it) and differ only in whether the
# repeated loads hit bytes already loaded, but no counter of cache hits or DRAM bytes was read
# for the given kernel (the appendix profiles only the worked solution).

# %%
from ropelib.course import nb13_table_reuse as reuse

small9 = reuse.launches(S9, B9, "cpu")                # the shape above: 32 positions
bytes9 = {}                                           # per launch: bytes touched at S = 16384
for name, launch in small9.items():
    memory = reuse.run_checked(launch)                # the spec's output, no stray lane
    shares = reuse.touched(memory)                    # per tensor: the share of elements touched
    bytes9[name] = reuse.touched_bytes(launch, shares) * (16384 // S9)   # each tensor grows with S
    per_input = load_summary(memory)
    cos_loads = memory.counts("cos", "load")
    print(f"{name:32s} touches {', '.join(shares)}: {bytes9[name] / 1e6:.1f} MB at the timed "
          f"shape; cos: {cos_loads.size} elements, each loaded {int(cos_loads.max())}x")
    if name == reuse.ONE_TABLE:                       # the given kernel's very loads
        assert per_input == counts9["the given kernel"]
    if name == reuse.PER_ENTRY:                       # the same loads, each on bytes of its own
        assert [v[:2] for v in per_input.values()] == [
            v[:2] for v in counts9["the given kernel"].values()]
        assert (memory.counts("cos", "load") == 1).all()
sm90 = {layout: reuse.compiled_sm90(layout) for layout in (reuse.ONE_TABLE, reuse.PER_ENTRY)}
assert sm90[reuse.ONE_TABLE]["sass"] == sm90[reuse.PER_ENTRY]["sass"]   # the same machine code
print(f"sm_90, Triton {triton.__version__}: both layouts compile to the same "
      f"{sm90[reuse.ONE_TABLE]['instructions']} instructions")
extra9 = bytes9[reuse.PER_ENTRY] - bytes9[reuse.ONE_TABLE]
pz.stated([("bytes touched at the timed shape: one table; a table per entry; added, MB",
            "143; 201; 59", f"{bytes9[reuse.ONE_TABLE] / 1e6:.0f}; "
            f"{bytes9[reuse.PER_ENTRY] / 1e6:.0f}; {extra9 / 1e6:.0f}")])

timed9 = reuse.time_in_rounds(bytes9, B=B9)
if timed9 is not None:
    for name, t in timed9.items():
        print(pz.rounds_line(name, t) + f", copy of {t.nbytes / 1e6:.0f} MB")
    sol, one, per = (timed9[k] for k in (reuse.SOLUTION, reuse.ONE_TABLE, reuse.PER_ENTRY))
    on_one, added = one.us - sol.us, per.us - one.us
    copy_extra = per.copy_us - one.copy_us            # a copy of the 59 MB the per-entry tables add
    print(f"the repeats on one table cost {on_one:+.1f} us; a table per entry adds "
          f"{added:+.1f} us; a copy of the bytes it adds takes {copy_extra:.1f} us")
    assert added > copy_extra / 3 > on_one            # from DRAM they cost, from a cache far less
if runtime.on_gpu():
    assert timed9 is not None

# %% [markdown]
# ## Puzzle 10 — packed sequences (repair)
#
# Training on documents of different lengths, and serving many prompts at once, packs sequences
# one after another with no padding: the `thd` layout (tokens, heads, head dim) of
# flash-attention's variable-length ("varlen") functions and Transformer Engine. Here $x$ is
# `[TOTAL, 2 * HALF]`, and `cu_seqlens` (int32, one entry more than there are sequences) says
# where each sequence begins: sequence $i$ is rows $c_i \ldots c_{i+1} - 1$, with $c_0 = 0$ and
# $c_N = $ `TOTAL`. A sequence may be empty. Each sequence is its own text, so its positions
# start at 0:
#
# $$
# \text{pos}(r) = r - c_i \qquad \text{for } c_i \le r < c_{i+1} .
# $$
#
# The grid is `(N_SEQS, cdiv(longest sequence, BLOCK_T))`, as in flash-attention's rotary kernel:
# program $(i, b)$ rotates tokens $b \cdot$ `BLOCK_T` onwards of sequence $i$, so a shorter
# sequence's last programs have some or all tokens past its end. The kernel below has more than
# one mistake: repair it. The check's cases, in tiles of `BLOCK_T` = 4 tokens, have sequences of
# lengths 5, 1, 12 and 0 (a boundary mid-tile, one token, an empty one last), 4, 4 and 4 (every
# boundary on a tile's edge), and 7, 0, 2, 9
# and 3.

# %%
pz.show_spec("packed_sequences")
packed_cases = pz.PUZZLES["packed_sequences"].build(torch.Generator().manual_seed(0), "cpu")
print("the check's cases: " + "; ".join(case.label for case in packed_cases))
assert [case.label.split("lengths ")[1] for case in packed_cases] == [   # the text's lengths
    "[5, 1, 12, 0], BLOCK_T=4", "[4, 4, 4], BLOCK_T=4", "[7, 0, 2, 9, 3], BLOCK_T=4"]

# %%
@triton.jit
def my_packed_sequences_kernel(
    x_ptr,  # *fp32: x [TOTAL, 2 * HALF], the sequences packed one after another, contiguous
    cu_seqlens_ptr,  # *int32: cu_seqlens [N_SEQS + 1]: 0, then where each sequence ends
    cos_ptr,  # *fp32: cos table [P, HALF], contiguous (P >= the longest sequence)
    sin_ptr,  # *fp32: sin table [P, HALF], contiguous
    y_ptr,  # *fp32: y [TOTAL, 2 * HALF], contiguous
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_T: tl.constexpr,  # tokens per program
):
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    rows = start + tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # rows of x
    live = (rows <= end)[:, None]
    pos = rows
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :], mask=live, other=1.0)
    sn = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :], mask=live, other=0.0)
    x1 = tl.load(x_ptr + rows[:, None] * (2 * HALF) + j[None, :], mask=live, other=0.0)
    x2 = tl.load(x_ptr + rows[:, None] * (2 * HALF) + HALF + j[None, :], mask=live, other=0.0)
    tl.store(y_ptr + rows[:, None] * (2 * HALF) + j[None, :], x1 * c - x2 * sn, mask=live)
    tl.store(y_ptr + rows[:, None] * (2 * HALF) + HALF + j[None, :], x2 * c + x1 * sn,
             mask=live)


pz.check_packed_sequences(my_packed_sequences_kernel);

# %%
solution(pz.solution_packed_sequences_kernel.fn, title="Solution: puzzle 10")
pz.time_solution("packed_sequences");

# %% [markdown]
# **What was wrong.** Two mistakes of varlen RoPE kernels.
#
# - Each token was rotated at its row in the packed tensor, `pos = rows`: right for the first
#   sequence only, so a one-sequence test passes. The position is `rows - start`.
# - `cu_seqlens[i + 1]` was taken as the sequence's last row (`rows <= end`); it is one past it.
#   The tile that holds row `end` (the sequence's last tile, or the one after it where the length
#   is a multiple of `BLOCK_T`) loaded and stored one row too many: after the last sequence, a
#   row past the ends of `x` and `y` (the ❌ line's stray lanes); elsewhere the next sequence's
#   first row, stored by two programs in no fixed order (black).
#
# The worked solution masks with $t <$ `end - start`, so a program past the end loads and stores
# nothing.

# %% [markdown]
# ## Puzzle 11 — cos/sin cached in bf16 (repair)
#
# Hugging Face's rotary embeddings hand cos and sin to attention in the model's dtype
# (`cos.to(dtype=x.dtype)`): a bf16 model's RoPE reads a bf16 table. Unlike puzzle 5's bf16
# *angle*, a bf16 cos or sin costs little, and the same at every position: both lie in $[-1, 1]$,
# where bf16 values are at most $2^{-8}$ apart, so each is off by at most $2^{-9}$. The pair
# $(x_j, x_{j+H})$ is then turned by a matrix off by
# $\begin{pmatrix} \delta_c & -\delta_s \\ \delta_s & \delta_c \end{pmatrix}$, so it lands at
# most $\sqrt{\delta_c^2 + \delta_s^2} \le \sqrt 2 \cdot 2^{-9} \approx 0.0028$ of its length
# from where the fp32 table turns it.
#
# The kernel below reads such a table. Most of its outputs are within tolerance; some are many
# bf16 **ulps** off (an ulp, a unit in the last place, is the distance from a value to the next
# one the format can hold). Repair it.
#
# The check compares $y$ with an fp64 rotation by the *same* bf16 cos/sin values and allows one
# bf16 ulp per element: one rounding, to nearest as on a GPU or by truncation as in the
# interpreter (notebook 03, section 6.3). Under the ✅ it prints your largest error in ulps. As in
# puzzle 5, convert each bf16 tile to fp32 before computing with it.

# %%
pz.show_spec("bf16_table")

# %%
@triton.jit
def my_bf16_table_kernel(
    x_ptr,  # *bf16: x [N_ROWS, 2 * HALF], contiguous
    cos_ptr,  # *bf16: cos [N_ROWS, HALF], the row of each token's position, cached in bf16
    sin_ptr,  # *bf16: sin [N_ROWS, HALF], likewise
    y_ptr,  # *bf16: y [N_ROWS, 2 * HALF], contiguous
    N_ROWS,  # rows in x
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    j = tl.arange(0, HALF)
    live = rows[:, None] < N_ROWS
    tab = rows[:, None] * HALF + j[None, :]
    c = tl.load(cos_ptr + tab, mask=live, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + tab, mask=live, other=0.0).to(tl.float32)
    row_x = x_ptr + rows[:, None] * (2 * HALF)
    x1 = tl.load(row_x + j[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row_x + HALF + j[None, :], mask=live, other=0.0).to(tl.float32)
    bf16 = y_ptr.dtype.element_ty
    x1c, x2s = (x1 * c).to(bf16).to(tl.float32), (x2 * s).to(bf16).to(tl.float32)
    x2c, x1s = (x2 * c).to(bf16).to(tl.float32), (x1 * s).to(bf16).to(tl.float32)
    row_y = y_ptr + rows[:, None] * (2 * HALF)
    tl.store(row_y + j[None, :], (x1c - x2s).to(bf16), mask=live)
    tl.store(row_y + HALF + j[None, :], (x2c + x1s).to(bf16), mask=live)


pz.check_bf16_table(my_bf16_table_kernel);

# %%
solution(pz.solution_bf16_table_kernel.fn, title="Solution: puzzle 11")
pz.time_solution("bf16_table");

# %% [markdown]
# **What was wrong.** The kernel computed, bit for bit, eager PyTorch's bf16
# `q * cos + rotate_half(q) * sin`: each product rounded to bf16, then the sum again. Where the
# two products nearly cancel, their rounding errors are many ulps of the small result: the
# kernel's rounding, not the table, was the problem. The repair keeps the products and the sum in
# fp32 (a product of two bf16 values is exact there) and rounds once, in the store, as
# torch.compile's kernel does; the cell below reads that kernel.

# %%
import re

inductor = (measured.RESULTS / "inductor-rope-bf16-sbhd.txt").read_text()
body = inductor[inductor.index("@triton.jit"):]
loads, stores = re.findall(r"tl\.load\(.*", body), re.findall(r"tl\.store\(.*", body)
stored = re.search(r"tl\.store\(out_ptr0 \+ \(\w+\), (\w+)", body).group(1)
made = re.search(rf"^\s*{stored} = (.*)$", body, re.M).group(1)   # the line that makes it
print(f"torch.compile's kernel: {len(loads)} loads, each ending in .to(tl.float32); "
      f"{len(stores)} store: {stores[0].strip()}, where {stored} = {made}")
assert "'out_ptr0': '*bf16'" in inductor and "cc=90" in inductor   # bf16 output, sm_90
assert len(loads) == 5 and all(l.rstrip().endswith(".to(tl.float32)") for l in loads)
assert len(stores) == 1 and "tl.bfloat16" not in body        # no rounding before the store
assert re.fullmatch(r"tmp\d+ \+ tmp\d+", made)                 # the store takes the sum

# %% [markdown]
# The table's own cost needs no kernel. Below, with torch alone: a bf16 `x` with head dim 128,
# rotated exactly (in fp64) by an fp32 table, a bf16 table and a bf16 angle (puzzle 5's table),
# at positions 1, 1,000, 100,000 and 131,071, beside the fp32 table's rotation stored in bf16.
# Each error is the worst pair's distance from the fp32 table's rotation, over the pair's length.

# %%
import math

half = 64
inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
positions = torch.tensor([1, 1_000, 100_000, 131_071])
angle = positions.double()[:, None] * inv_freq.double()[None, :]       # exact (fp64)
x = torch.randn(len(positions), 2 * half, generator=torch.Generator().manual_seed(0))
x = x.to(torch.bfloat16)


def pair_error(y, ref):
    """Per row, the worst |y_pair - ref_pair| / |x_pair|."""
    d, xd = y - ref, x.double()
    return ((d[:, :half] ** 2 + d[:, half:] ** 2)
            / (xd[:, :half] ** 2 + xd[:, half:] ** 2)).sqrt().amax(dim=1)


fp32_table = pz.spec_bf16_table(x, angle.cos().float(), angle.sin().float())
cos16, sin16 = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
by_table16 = pair_error(pz.spec_bf16_table(x, cos16, sin16), fp32_table)
angle16 = angle.to(torch.bfloat16).double()
by_angle16 = pair_error(pz.spec_bf16_table(x, angle16.cos(), angle16.sin()), fp32_table)
stored16 = pair_error(fp32_table.to(torch.bfloat16).double(), fp32_table)
worst_value = max(float((cos16.double() - angle.cos()).abs().max()),
                  float((sin16.double() - angle.sin()).abs().max()))
print(f"worst bf16 cos or sin value: off by {worst_value:.5f} (2^-9 = {2**-9:.5f})")
for p, t, r, a in zip(positions.tolist(), by_table16.tolist(), stored16.tolist(),
                      by_angle16.tolist()):
    print(f"position {p:>7,}: bf16 cos/sin {t:.4f} |x|, y stored in bf16 {r:.4f} |x|, "
          f"bf16 angle {a:.4f} |x|")
assert worst_value <= 2**-9 and (by_table16 <= math.sqrt(2) * 2**-9).all()
assert (by_table16 <= stored16).all()             # the table costs no more than y's storage
assert by_angle16[2] > 100 * by_table16[2]        # at position 100,000 the angle is what breaks
assert by_angle16[0] < by_table16[0]              # at position 1 the bf16 angle is off by less,
assert by_angle16[1] > 1                          # by position 1,000 more than the pair's length

assert f"{math.sqrt(2) * 2**-9:.4f}" == "0.0028"  # the bound the text states

# %% [markdown]
# So the bf16 table stays within its bound at every position and costs no more than storing $y$
# in bf16, while a bf16 angle, better at position 1, turns a pair by more than its own length
# from position 1,000 on. A kernel that reads a bf16 cos/sin table has only to round once.

# %% [markdown]
# ## Puzzle 12 — capstone: the backward of packed, partial, interleaved RoPE (write)
#
# ChatGLM2 and ChatGLM3 turn only the first half of each head (64 of 128 features) and pair
# *adjacent* features (puzzles 2 and 3). Trained on packed documents, positions restart at each
# `cu_seqlens` entry (puzzle 10). And training runs RoPE's backward (puzzle 8). Write the
# backward: from $g = \partial L / \partial y$ of a row, its $\partial L / \partial x$, for the
# forward
#
# $$
# y_{2j} = x_{2j} \cos\theta_{p,j} - x_{2j+1} \sin\theta_{p,j}, \qquad
# y_{2j+1} = x_{2j+1} \cos\theta_{p,j} + x_{2j} \sin\theta_{p,j} \quad (j < R/2), \qquad
# y_d = x_d \quad (R \le d < D),
# $$
#
# where $p = r - c_i$ is the position of row $r$ of sequence $i$ and row $p$ of the cos and sin
# tables holds its $R/2$ values. The grid is puzzle 10's. $R/2$ is a power of two; $D$ need not be
# one (`BLOCK_D` is the power of two at or above it).
#
# **The check** compares $\partial L / \partial x$ with the forward's autograd (fp64), on puzzle
# 10's three sets of lengths, with $D = 24$, $R = 16$; $D = 80$, $R = 32$; and $D = 40$, $R = 8$.
# A row stored by two programs fails. On a GPU the ⏱ line times it at ChatGLM's head ($D = 128$,
# $R = 64$) on puzzle 10's timed sequences: a backward of the forward puzzle 10 times.

# %%
pz.show_spec("packed_partial_backward")
capstone_cases = pz.PUZZLES["packed_partial_backward"].build(torch.Generator().manual_seed(0),
                                                             "cpu")
print("the check's cases: " + "; ".join(case.label for case in capstone_cases))
assert [(c.constexprs["D"], c.constexprs["R"]) for c in capstone_cases] == [(24, 16), (80, 32),
                                                                             (40, 8)]
assert [c.label.split("lengths ")[1] for c in capstone_cases] == [
    c.label.split("lengths ")[1] for c in packed_cases]               # puzzle 10's lengths
big12, big10 = (pz.PUZZLES[k].big("meta") for k in ("packed_partial_backward", "packed_sequences"))
assert (big12.constexprs["D"], big12.constexprs["R"]) == (128, 64)    # the timed case: ChatGLM's
assert big12.out.shape == big10.out.shape and big12.grid == big10.grid   # puzzle 10's sequences

# %%
@triton.jit
def my_packed_partial_backward_kernel(
    dy_ptr,  # *fp32: dL/dy [TOTAL, D], the sequences packed one after another, contiguous
    cu_seqlens_ptr,  # *int32: cu_seqlens [N_SEQS + 1]: 0, then where each sequence ends
    cos_ptr,  # *fp32: cos table [P, R // 2], contiguous (P >= the longest sequence)
    sin_ptr,  # *fp32: sin table [P, R // 2], contiguous
    dx_ptr,  # *fp32: dL/dx [TOTAL, D], contiguous
    D: tl.constexpr,  # features per row (any even size)
    R: tl.constexpr,  # rotary features: the first R of each row (R // 2 a power of two)
    BLOCK_D: tl.constexpr,  # the power of two at or above D
    BLOCK_T: tl.constexpr,  # tokens per program
):
    ...  # your code: grid (N_SEQS, cdiv(longest sequence, BLOCK_T)), as in puzzle 10


pz.check_packed_partial_backward(my_packed_partial_backward_kernel);

# %%
solution(pz.solution_packed_partial_backward_kernel.fn, title="Solution: puzzle 12")
pz.time_solution("packed_partial_backward");

# %% [markdown]
# **What to notice.** Each part of the worked solution is an earlier puzzle's: the tokens and
# their mask puzzle 10's, the whole-row loads split into pairs puzzle 2's, the signs puzzle 8's,
# and the features past $R$, masked to $D$ as in puzzle 4, copied by a load and store of their
# own. Another right answer loads each feature's partner, `d ^ 1`, and reads table column
# `d // 2` with `other=1.0` for cos and `0.0` for sin past $R$, where the formula then copies.
# `pz.hint(12)` recognises one mistake from each earlier puzzle: the forward's sign, rotate-half
# pairs, the packed index as the position, and a tail left at 0.

# %% [markdown]
# ## Where you stand
#
# The checks remember what passed since this notebook's Jupyter kernel started:

# %%
pz.scoreboard();

# %% [markdown]
# And the eleven timed worked solutions (every puzzle's but the first, a single row) against a
# copy of the bytes a right answer reads and writes, timed in alternating rounds as under puzzle
# 9: each fraction at the median of its rounds, with its lowest and highest; solutions whose
# ranges overlap are not told apart. On a CPU the cell times nothing.

# %%
import inspect

timed = [p for p in pz.PUZZLES.values() if p.big is not None]
times = pz.solution_times()                        # the ⏱ lines under the worked solutions
rounds_all = pz.time_in_rounds({f"{p.number}. {p.title}": (p.key, p.solution) for p in timed})
if rounds_all is not None:
    print(f"the worked solutions on {next(iter(rounds_all.values())).gpu}, "
          f"{pz.COPY_ROUNDS} alternating rounds of do_bench medians\n")
    for name, t in rounds_all.items():
        print(pz.rounds_line(name, t))
    if copy_line is not None:
        print(f"\nsection 0's masked copy (one do_bench): {copy_line.of_copy:.0%} of a device copy")
    assert len(rounds_all) == len(timed)
    assert all(t.of_copy < 1.15 for t in rounds_all.values())   # none far beyond a copy
    # answer 5: puzzle 6 against the solutions expected at a copy's speed (all but 5 and 6)
    span = {p.number: (min(t.round_fractions), max(t.round_fractions))
            for p, t in zip(timed, rounds_all.values())}
    lo6, hi6 = span[6]
    level6 = [n for n, (lo, hi) in span.items() if n not in (5, 6) and lo <= hi6 and lo6 <= hi]
    print(f"puzzle 6: {lo6:.1%}-{hi6:.1%} of a copy; "
          + (f"its range overlaps those of puzzles {', '.join(map(str, level6))}: not told "
             "apart from them" if level6 else "below the range of every solution expected at "
             "a copy's speed: it falls short"))
if runtime.on_gpu():
    assert rounds_all is not None                  # every solution ran right and was timed
assert len(timed) == 11 and pz.PUZZLES["rotate_row"].big is None   # every puzzle but the first
body = inspect.getsource(pz.solution_long_context_kernel.fn).split("):", 1)[1]
assert "freqs_ptr" not in body                    # puzzle 5's solution never reads the table
big5 = pz.PUZZLES["long_context"].big("meta")     # shapes only: the bytes each fraction counts
handed5 = sum(t.numel() * t.element_size() for t in big5.args if isinstance(t, torch.Tensor))
moved5_bytes = sum(t.numel() * t.element_size() for t in [*big5.inputs.values(), big5.out])
print(f"puzzle 5's timed case: handed {handed5 / 1e6:.1f} MB, of which a right answer moves "
      f"{moved5_bytes / 1e6:.1f} MB (the angle table, {(handed5 - moved5_bytes) / 1e6:.1f} MB, "
      "is not read); its fraction counts the moved bytes")
assert [f"{b / 1e6:.1f}" for b in (handed5, moved5_bytes, handed5 - moved5_bytes)] == [
    "84.4", "67.6", "16.8"]

# %% [markdown]
# ## Questions for a study group
#
# 1. A power-of-two head dim would not have shown puzzle 4's bug. Which of the nine bugs would a
#    test with one small, contiguous, power-of-two, short-context input catch? Write down the
#    inputs a RoPE test suite needs.
# 2. In puzzle 5 the fix computes $\theta = p\,\omega_j$ in fp32. At which position is an fp32
#    angle as wrong as the bf16 angle was at position 1,000? What would you do for a context of
#    $2^{24}$ tokens?
# 3. Puzzle 7's check maps virtual addresses to real rows. What would it take to check int64
#    offsets on a real GPU, and at what cost in memory and time?
# 4. Puzzle 9 counts loads, not DRAM bytes. Estimate the DRAM bytes the repeated table loads cost
#    on a GPU with a 50 MB L2 at the timed size (`S = 16384`, `B = 8`, `HALF = 64`), and say why
#    the answer is not $B$ times the table.
# 5. Which of the eleven timed worked solutions would you expect to reach a copy's speed on a GPU,
#    and which to fall short, whatever their tile? (Puzzle 6 gathers table rows by position;
#    puzzle 2 can use stride-2 loads or whole rows.) Write your prediction down, then compare it
#    with the table under the scoreboard (`docs/executed/13-rope-puzzles.html` has one GPU's).
# 6. Puzzle 11's bf16 table moves a pair by at most $\sqrt 2 \cdot 2^{-9}$ of its length. How
#    large an error in a score $q \cdot k$ can that make for head dim 128, with q and k both
#    rotated by bf16 tables, against rounding $q$ and $k$ to bf16 at all?
# 7. The capstone's kernel takes $\partial L / \partial y$ of the keys of a model with
#    grouped-query attention, where each key head serves several query heads. Does the RoPE
#    backward of $k$ need to sum over the group? What changes to make it the forward?
#
# Short answers are in the last appendix.

# %% [markdown]
# ## Appendix: puzzles 5 and 9 against a copy
#
# Optional. `benchmarks/puzzle_fractions.py` timed the worked solutions of puzzles 5 and 9 on an
# H200 beside variants that change one thing, each against a device copy timed in the same run
# (puzzle 9 at six tiles: BLOCK_S and the number of **warps**, groups of 32 threads, per program).
# The cell prints that committed CSV, with the megabytes each row's copy moves, marking the tile
# the ⏱ lines time, beside this page's ⏱ lines.

# %%
import statistics

FRACTIONS = measured.RESULTS / "puzzle_fractions-nvidia-h200.csv"
runs9 = [FRACTIONS] + [measured.RESULTS / f"puzzle_fractions-nvidia-h200-20261130-run{k}.csv"
                       for k in (1, 2, 3)]
p9_runs = [[r for r in compare.read_csv(f) if r["puzzle"] == 9] for f in runs9]
own = {}                                                 # tile -> the kernel's us, run by run
for run in p9_runs:
    for r in run:
        own.setdefault((r["block"], r["num_warps"]), []).append(r["us"])
spread9 = max((max(v) - min(v)) / min(v) for v in own.values())   # the run-to-run spread
assert len(own) == 6 and all(len(v) == 4 for v in own.values())
assert {compare.read_meta(f)["gpu"] for f in runs9} == {"NVIDIA H200"}
tile9 = (pz.PUZZLES["shared_table"].big("meta").constexprs["BLOCK_S"], 4)   # the ⏱ lines' tile
fr_meta, fr_rows = compare.read_meta(FRACTIONS), compare.read_csv(FRACTIONS)
TIMED = " (the timed case)"
print(f"{fr_meta['gpu']}, median of do_bench, two rounds ({FRACTIONS.name})\n")
print(f"{'':3s}{'variant':54s}{'programs':>9s}{'registers':>10s}{'spills':>7s}{'us':>7s}"
      f"{'copy of MB':>11s}{'copy us':>8s}{'of copy':>8s}")
for r in fr_rows:
    print(f"{r['puzzle']:>2d} {r['variant']:54s}{r['programs']:>9,d}{r['registers']:>10d}"
          f"{r['spills']:>7d}{r['us']:>7.1f}{r['nbytes'] / 1e6:>11.1f}{r['copy_us']:>8.1f}"
          f"{r['of_copy']:>8.0%}")
p5 = [r for r in fr_rows if r["puzzle"] == 5]
timed5, low5, moved5 = (next(r for r in p5 if what in r["variant"])
                        for what in ("the timed case", "below 105,000", "bytes moved"))
p9 = [r for r in fr_rows if r["puzzle"] == 9]
slow_share = timed5["slow_rows"] / timed5["rows"]
print(f"\npuzzle 5: {timed5['slow_rows']:,} of {timed5['rows']:,} rows ({slow_share:.0%}) have "
      f"a pair whose angle is 105,615 radians or more")
band = 3 * spread9                                 # three run-to-run spreads
csv_range = {"long_context": [timed5["us"]], "shared_table": own[tile9]}
for key, committed in csv_range.items():
    lo, hi = min(committed), max(committed)
    live = times.get(key)
    said = f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
    print(f"puzzle {pz.PUZZLES[key].number}'s timed case: the CSV ({fr_meta['gpu']}) {said} us; "
          + (f"this page's ⏱ line ({live.gpu}) {live.us:.1f} us" if live
             else "no ⏱ line here (no GPU)"))
    if live is not None and "H200" in live.gpu:
        assert lo * (1 - band) <= live.us <= hi * (1 + band), (key, live.us, lo, hi)
# same kernel, same bytes, same registers: only the positions differ
assert timed5["nbytes"] == low5["nbytes"] and moved5["nbytes"] < timed5["nbytes"]
assert len({(r["registers"], r["spills"]) for r in p5}) == 1
assert len(p9) == 6 and len({r["nbytes"] for r in p9}) == 1
# the CSV marks, in each run, the one tile the ⏱ lines time
assert all([(r["block"], r["num_warps"]) for r in run if TIMED in r["variant"]] == [tile9]
           for run in p9_runs)
pz.stated([
    ("the tile the puzzle times", "BLOCK_S=4, 4 warps", f"BLOCK_S={tile9[0]}, {tile9[1]} warps"),
    ("p5, MB handed to the kernel; MB it moves", "84.4; 67.6",
     f"{timed5['nbytes'] / 1e6:.1f}; {moved5['nbytes'] / 1e6:.1f}"),
    ("p5, no long path; timed positions, us", "27.4; 32.4", f"{low5['us']:.1f}; {timed5['us']:.1f}"),
    ("p5, a copy of the bytes moved, us", "24.1", f"{moved5['copy_us']:.1f}"),
    ("p5, timed, of a copy of bytes moved", "74%", f"{moved5['of_copy']:.0%}"),
    ("p5, no long path, of a copy of bytes moved", "88%", f"{moved5['copy_us'] / low5['us']:.0%}"),
    ("p5, rows with a pair on the long path", "19%", f"{slow_share:.0%}"),
])

# %% [markdown]
# **Puzzle 5.** The kernel is handed 84.4 MB but moves 67.6 MB: it never reads the bf16 angle
# table. The table's first two puzzle-5 rows divide by a copy of all 84.4 MB, the third by a copy
# of the 67.6 MB moved (24.1 µs); the fractions here use the bytes moved. Same kernel, same
# bytes, only the positions changed: on the H200 it takes 27.4 µs with no angle at 105,615
# radians or more (88 % of that copy) and 32.4 µs with the timed positions (74 %). libdevice's
# `sinf` and `cosf` reduce an angle below 105,615 with a few multiply-adds and branch to a longer
# path above it; 19 % of the timed rows have a pair on it. The 32 threads of a warp issue
# together, so a warp in which one thread takes the long path likely waits for it; the cells
# after the next count those warps, but nothing here times the long path alone. The sm_90 machine
# code compares with 105,615 once per angle a thread holds:

# %%
from ropelib.course import load_schedule

bf16_, i32_, f32_ = (torch.empty(16, dtype=t) for t in (torch.bfloat16, torch.int32, torch.float32))
p5_code = load_schedule.schedule(
    pz.solution_long_context_kernel, dict(x_ptr=bf16_, freqs_ptr=bf16_, pos_ptr=i32_,
                                          inv_freq_ptr=f32_, y_ptr=bf16_, N_ROWS=1 << 17, HALF=64,
                                          BLOCK_ROWS=16), num_warps=4)
tests = [line for line in p5_code["sass"] if "105615" in line]
print(f"sm_90, Triton {triton.__version__}: {p5_code['instructions']} instructions; "
      f"{len(tests)} compare an angle with 105,615, e.g.\n  {tests[0]}")
angles_per_thread = 16 * 64 // (4 * 32)               # BLOCK_ROWS x HALF over 128 threads
assert len(tests) == angles_per_thread                # one per angle a thread holds

# %% [markdown]
# **Counting those warps.** Here a warp is 32 of a program's 128 threads, and a program computes
# a tile of 16 rows × 64 pairs: 1,024 angles, 8 a thread. A warp issues one instruction at a time
# for all its 32 threads (SIMT: single instruction, multiple threads). At the compare with
# 105,615 each thread decides for itself; when some threads of a warp branch to the long path and
# the others do not, the warp runs the long path with the others switched off, then goes on with
# all 32. The threads' paths **diverge**, and the warp takes as long as its slowest thread. So
# what the long path costs follows the warps that hold at least one angle on it, not the rows or
# the threads that do.
#
# Which thread holds which angle is the compiler's choice: the blocked layout of the angle tile in
# the TTGIR (notebook 05, section 4). The next cell reads it: `sizePerThread = [1, 8]`,
# `threadsPerWarp = [4, 8]`, `warpsPerCTA = [4, 1]`, so a thread holds 8 neighbouring pairs of
# one row, a warp 4 whole rows and the 4 warps the program's 16 rows. `nb13_long_path.count`
# places each of the launch's 8,388,608 angles on its program, warp, thread and slot (a thread's
# k-th angle, one of the 8 compares above), and counts, for the timed positions and for the
# variant below 105,000:
#
# - 6,365 of the 32,768 warps (19.4 %) hold an angle on the long path, against 25,457 of the
#   131,072 rows (19.4 %). The shares are the same: a row's position is its index, so a warp's 4
#   rows hold 4 consecutive positions, all below 105,615 or all at or above it, except in the one
#   warp that holds 105,612 to 105,615.
# - Only pairs 0 and 1 reach 105,615 (an angle is the position times $\omega_j \le 1$, which
#   falls with $j$), and both sit in the one thread that holds pairs 0-7 of the row: 25,457 of
#   the 1,048,576 threads (2.4 %), 4 of the 32 in each of those warps (1 in the warp across
#   105,615). Divergence lets 2.4 % of the threads hold up 19.4 % of the warps. From position
#   121,963 on pair 1 is on the long path too, so 2,278 of the warps run it twice: 8,643 times in
#   all.
# - Below 105,000: 0 warps.
#
# A simple model, not a measurement: if a warp with an angle on the long path costs as if all its
# threads took it, the extra time grows with the number of those warps. The H200 took 5.0 µs
# more with the timed positions (27.4 → 32.4 µs); over 6,365 warps that is 0.79 ns of the
# kernel's time each, or, with the 132 SMs working side by side, about 104 ns of one SM's time.
# The model takes the long path as the only difference (the two variants run the same code on the
# same bytes) and the SMs as sharing those warps evenly. What the long path itself takes, timed
# alone (a launch with every angle on it, or clock readings around the branch), needs a GPU and
# is still open.

# %%
from ropelib.course import nb13_long_path

case5 = pz.PUZZLES["long_context"].big("cpu")          # the timed case: positions 0 .. 131,071
_, _, pos5, inv5, _, n5 = case5.args
rows5 = case5.constexprs["BLOCK_ROWS"]
assert torch.equal(pos5, torch.arange(n5, dtype=torch.int32))   # a row's position: its index
shape5, fields5, blocked5 = nb13_long_path.angle_layout(p5_code["ttgir"])
# the launch the CSV timed and the cell above compiled: 16 rows a program, 4 warps
assert (rows5, 4) == (timed5["block"], timed5["num_warps"]) and shape5 == [rows5, 64]
held5 = nb13_long_path.holders(shape5, fields5)
assert sorted(at for *_, at in held5) == [(r, j) for r in range(16) for j in range(64)]  # once
print(f"the angle tile, {shape5[0]} x {shape5[1]} fp32: {blocked5}")
variants5 = {"timed positions": pos5, "positions below 105,000": (pos5 % 105000).to(torch.int32)}
counted5 = {name: nb13_long_path.count(p, inv5, block_rows=rows5, shape=shape5, fields=fields5)
            for name, p in variants5.items()}
print(f"\n{'holding an angle on the long path':34s}" + "".join(f"{n:>28s}" for n in counted5))
for what, label in (("rows", "rows"), ("angles", "angles"), ("threads", "threads"),
                    ("warps", "warps"), ("warp_slots", "(warp, slot): runs of it")):
    print(f"{label:34s}" + "".join(f"{f'{k:,} of {of:,} ({k / of:.1%})':>28s}"
                                   for k, of in (getattr(c, what) for c in counted5.values())))
t5, l5 = counted5.values()
lanes5 = t5.lanes_in_long_warps                       # threads on it: how many warps
print("threads on the long path in a warp that has any: "
      + ", ".join(f"{k} in {v:,} warp{'s' if v > 1 else ''}"
                  for k, v in sorted(lanes5.items(), reverse=True)))
angle5 = pos5.float()[:, None] * inv5[None, :]        # fp32, as the kernel computes it
on5 = angle5 >= nb13_long_path.LONG_PATH_FROM
extra5 = timed5["us"] - low5["us"]                    # the H200, same code and bytes
per_warp = extra5 * 1e3 / t5.warps[0]                 # ns of the kernel's time a warp
print(f"\nmodel (not a measurement): {extra5:.2f} us more over {t5.warps[0]:,} warps =\n"
      f"  {per_warp:.2f} ns of the kernel's time a warp; x {timed5['sms']} SMs = "
      f"{per_warp * timed5['sms']:.0f} ns of one SM's time")
assert t5.rows == (timed5["slow_rows"], timed5["rows"])     # the CSV's count of such rows
assert l5.warps[0] == l5.angles[0] == 0
assert set(on5.nonzero()[:, 1].tolist()) == {0, 1}    # only pairs 0 and 1 reach 105,615
rows_a_warp = fields5["threadsPerWarp"][0] * fields5["sizePerThread"][0]   # 4
across = 105615 // rows_a_warp * rows_a_warp          # the first row of the warp across 105,615


def of_all(pair):
    return f"{pair[0]:,} of {pair[1]:,} ({pair[0] / pair[1]:.1%})"


pz.stated([
    ("p5, warps holding a long-path angle", "6,365 of 32,768 (19.4%)", of_all(t5.warps)),
    ("p5, rows holding one", "25,457 of 131,072 (19.4%)", of_all(t5.rows)),
    ("p5, threads holding one", "25,457 of 1,048,576 (2.4%)", of_all(t5.threads)),
    ("p5, such threads in such a warp", "4; 1 in 1 warp",
     f"{max(lanes5)}; {min(lanes5)} in {lanes5[min(lanes5)]} warp"),
    ("p5, the warp across 105,615 holds positions", "105,612 to 105,615",
     f"{across:,} to {across + rows_a_warp - 1:,}"),
    ("p5, pair 1 on the long path from position", "121,963", f"{int(pos5[on5[:, 1]][0]):,}"),
    ("p5, warps running it twice; runs in all", "2,278; 8,643",
     f"{t5.warp_slots[0] - t5.warps[0]:,}; {t5.warp_slots[0]:,}"),
    ("p5, below 105,000: warps holding one", "0", f"{l5.warps[0]}"),
    ("p5, model: extra us; ns a warp; ns of an SM", "5.0; 0.79; 104",
     f"{extra5:.1f}; {per_warp:.2f}; {per_warp * timed5['sms']:.0f}"),
])

# %% [markdown]
# The positions account for the step from 27.4 to 32.4 µs; the gap from 24.1 to 27.4 µs is not
# taken apart here.
#
# **Puzzle 9.** On the H200 the six tiles' medians over the four committed runs span 41.5-43.3 µs,
# and BLOCK_S=4 on 4 warps was the fastest of six in every run. In the table they reach 87 %-94 %
# of a copy, but those fractions move with the copy: over the four runs each tile's own time moved
# by at most 1.7 %, the copy's by 6 %. In one Nsight Compute profile per tile (the next cell)
# every tile read $x$ and the tables from DRAM once (75.5 MB) and executed fewer instructions than
# PyTorch's `buf * 1`, the profile's copy stand-in. Under the profiler the six tiles took
# 35.0-36.7 µs and `buf * 1` took 33.4 µs, so the gap there is 1.6-3.3 µs; BLOCK_S=16 on 4 warps,
# profiled twice, took 35.3 and 36.5 µs, a change of over half the six tiles' range, so one
# profile per tile does not rank them. Neither the DRAM bytes nor the instruction counts explain
# that gap, and these profiles do not say what does.

# %%
def profile(path):
    """(the copy stand-in's metrics, {tile: metrics}) of one Nsight Compute CSV."""
    *tiles, copy = measured.ncu_kernels(path)          # tiles in the sweep's order, then buf * 1
    assert "elementwise" in copy["kernel"]
    assert {k["kernel"] for k in tiles} == {"solution_shared_table_kernel"}
    return copy["metrics"], {(16384 // int(k["metrics"]["launch__grid_size"]),
                              int(k["metrics"]["launch__block_size"]) // 32): k["metrics"]
                             for k in tiles}


NCU9 = measured.RESULTS / "puzzle9_ncu-nvidia-h200-20261130-0953.csv"
cm, prof9 = profile(NCU9)
_, again9 = profile(measured.RESULTS / "puzzle9_ncu-nvidia-h200-20261130-0930.csv")  # 2 tiles
x_bytes, tables = 16384 * 8 * 128 * 4, 2 * 16384 * 64 * 4     # x [S, B, 2 * HALF]; cos, sin
med = {t: statistics.median(v) for t, v in own.items()}        # timed: four runs' median, us
us_ncu = {t: m["gpu__time_duration.sum"] / 1e3 for t, m in prof9.items()}
print(f"{NCU9.name}, one launch each; the stand-in: "
      f"{cm['smsp__inst_executed.sum'] / 1e6:.2f} M instructions")
print(f"{'tile':12s}{'timed us':>9s}{'DRAM MB':>8s}{'inst M':>7s}{'profiled us':>12s}")
for t, m in sorted(prof9.items(), key=lambda kv: med[kv[0]]):
    print(f"{f'{t[0]}, {t[1]} warps':12s}{med[t]:9.1f}{m['dram__bytes_read.sum'] / 1e6:8.1f}"
          f"{m['smsp__inst_executed.sum'] / 1e6:7.2f}{us_ncu[t]:12.1f}")
copy_ncu = cm["gpu__time_duration.sum"] / 1e3                   # buf * 1 under the profiler
print(f"{'buf * 1':12s}{'':>9s}{cm['dram__bytes_read.sum'] / 1e6:8.1f}"
      f"{cm['smsp__inst_executed.sum'] / 1e6:7.2f}{copy_ncu:12.1f}")
twice = [again9[(16, 4)]["gpu__time_duration.sum"] / 1e3, us_ncu[(16, 4)]]
profiled = [min(us_ncu.values()), max(us_ncu.values())]
copies4 = [r["copy_us"] for f in runs9 for r in compare.read_csv(f) if r["puzzle"] == 9]
copy_band = max(copies4) / min(copies4) - 1              # the copy's spread, four committed runs
assert len(prof9) == 6 and sorted(again9) == [(4, 4), (16, 4)]
assert all(abs(m["dram__bytes_read.sum"] / (x_bytes + tables) - 1) < 0.001
           for m in prof9.values())                                     # x and tables once
assert all(m["smsp__inst_executed.sum"] < cm["smsp__inst_executed.sum"] for m in prof9.values())
assert copy_ncu < profiled[0]                  # under the profiler too, every tile trails buf * 1
assert max(twice) / min(twice) - 1 > (profiled[1] / profiled[0] - 1) / 2   # over half of it
fastest9 = [min(run, key=lambda r: r["us"]) for run in p9_runs]
assert all((r["block"], r["num_warps"]) == (4, 4) for r in fastest9)   # fastest in every run
pz.stated([
    ("six tiles' medians over four runs, us", "41.5-43.3",
     f"{min(med.values()):.1f}-{max(med.values()):.1f}"),
    ("six tiles, of a copy (the table)", "87%-94%",
     f"{min(r['of_copy'] for r in p9):.0%}-{max(r['of_copy'] for r in p9):.0%}"),
    ("each tile's own time moved by at most", "1.7%", f"{spread9:.1%}"),
    ("the copy's spread over the four runs", "6%", f"{copy_band:.0%}"),
    ("DRAM read, every tile, MB", "75.5", f"{(x_bytes + tables) / 1e6:.1f}"),
    ("six tiles profiled; buf * 1 profiled, us", "35.0-36.7; 33.4",
     f"{profiled[0]:.1f}-{profiled[1]:.1f}; {copy_ncu:.1f}"),
    ("the gap under the profiler, us", "1.6-3.3",
     f"{profiled[0] - copy_ncu:.1f}-{profiled[1] - copy_ncu:.1f}"),
    ("BLOCK_S=16 on 4 warps, profiled twice, us", "35.3, 36.5",
     f"{min(twice):.1f}, {max(twice):.1f}"),
])

# %% [markdown]
# ## Appendix: answers to the study questions
#
# **1.** Such an input catches two bugs, and only with the right test: the pairing (2) if the spec
# is the model's own pairing, and the backward's sign (8) if the test checks a gradient. The rest
# each need their own input: a rotary dim below the head dim and an output buffer that is not a
# copy of $x$ (3); a head dim that is not a power of two (4); positions past about a thousand (5);
# expanded or sliced position ids (6); rows past $2^{31}$ elements (7); a count of the loads (9);
# packed sequences with a boundary inside a tile and an empty one (10); bf16 inputs graded in ulps
# against an fp64 spec (11).
#
# **2.** bf16 values near 1,000 are 4 apart, so a bf16 angle there can be off by 2 rad; fp32
# values are 4 apart only from $2^{25}$ (about 33.6 million). Well before that, angles just below
# $2^{24}$ are off by up to 0.5 rad (puzzle 5's cell), and from $2^{24}$ fp32 no longer holds
# every integer position: for such contexts, reduce the angle exactly before the sine (notebook
# 10, section 7).
#
# **3.** On a GPU the addresses must exist. Either allocate a tensor past $2^{31}$ elements (the
# cell below gives its bytes, and on a GPU the time to move them), or map one small physical
# allocation at many virtual addresses (CUDA's virtual memory management): little memory, but
# more than a test suite usually sets up.
#
# **4.** The tables are $2 \times 16384 \times 64 \times 4$ bytes = 8.4 MB of fp32, of the timed
# 143 MB. They fit in a 50 MB L2, so the $B - 1$ repeats can be served from cache and DRAM reads
# the tables about once: extra load instructions and cache traffic, not $B$ times the table's DRAM
# bytes. Puzzle 9's last cell tests this on its GPU by time, not by a DRAM counter.
#
# **5.** *Prediction:* a kernel that moves each byte once, using every byte of each sector, should
# run at a copy's speed, and by that count every timed solution should, except two with reason to
# doubt: puzzle 5's sine takes a longer path at large angles, and puzzle 6 loads each table row
# $B = 8$ times. *Measured:* puzzle 5 reaches 74 % of a copy on the H200 (first appendix).
# Puzzle 6, by the rule under "Where you stand" (ranges that overlap are not told apart), falls
# short only if its range of rounds lies below the range of every solution expected at a copy's
# speed; a line under the table names the ranges it overlaps. In one H100 run its rounds overlapped
# those of puzzles 4<!--page: its range overlaps those of puzzles-->,
# 9<!--page: its range overlaps those of puzzles--> and
# 11<!--page: its range overlaps those of puzzles-->, so there the prediction failed: most likely
# its repeated loads hit in cache, as answer 4 reasons (not measured for puzzle 6). Your GPU's line
# says whether it holds there. *The rest:* the cell below shows each uses every byte of its rows'
# and tables' sectors, and puzzle 4's solution compiles to puzzle 2's load and store widths. Puzzle
# 10 reads about what it writes (66.2 MB against 64.1 MB), so a fraction above 100 % says only that
# the device copy falls a little short.
#
# **6.** Each pair of $q$ and of $k$ moves by at most $\varepsilon = \sqrt 2 \cdot 2^{-9}$ of its
# length, so by Cauchy–Schwarz the score moves by at most about
# $2\varepsilon\,|q|\,|k| = \sqrt 2 \cdot 2^{-8}\,|q|\,|k|$. Rounding an element to bf16 moves it
# by up to $2^{-8}$ of itself, bounding the score error by about $2 \cdot 2^{-8}\,|q|\,|k|$. The
# table's bound is $1/\sqrt 2$ of the rounding's. The cell below measures both at head dim 128:
# each far below its bound, the table's no larger than the rounding's.
#
# **7.** No. RoPE turns each key head once, before attention repeats it for its group; the
# backward of that repeat sums the group's gradients into one $\partial L / \partial y$ per key
# head, which the RoPE backward turns back as it is. The forward is the same kernel with the sine
# terms' signs flipped.

# %% [markdown]
# The numbers in those answers, computed (`gap` is from the cell after puzzle 5):

# %%
table_bytes = 2 * 16384 * 64 * 4                  # cos and sin, [S, HALF] fp32 each
timed_bytes = 2 * 16384 * 8 * 128 * 4 + table_bytes   # x and y, [S, B, 2 * HALF] fp32; tables
print(f"2. bf16 values near 1,000 are {gap(996, 1012, torch.bfloat16):.0f} apart")
fp32_gaps = []
for k in (24, 25):
    below, above = gap(2**k - 64, 2**k, torch.float32), gap(2**k, 2**k + 64, torch.float32)
    fp32_gaps += [below, above]
    print(f"   fp32 values just below 2^{k} = {2**k:,}: {below:.0f} apart; from it on: {above:.0f}")
big7 = 2 * (262_144 + 1) * 8192 * 4                # x and y, fp32, one row past 2^31 elements
print(f"3. x and y with one row past element 2^31: {big7 / 1e9:.1f} GB", end="")
if times.get("int64_offsets") is not None:       # at the copy rate puzzle 7's ⏱ line measured
    t7 = times["int64_offsets"]
    print(f"; at {t7.nbytes / t7.copy_us / 1e6:.2f} TB/s (its copy), "
          f"{big7 / (t7.nbytes / t7.copy_us) / 1e3:.1f} ms per pass", end="")
print(f"\n4. puzzle 9's timed case: tables {table_bytes / 1e6:.1f} MB "
      f"of {timed_bytes / 1e6:.0f} MB")
assert gap(996, 1012, torch.bfloat16) == 4
assert fp32_gaps == [1, 2, 2, 4]                  # every integer below 2^24; 4 apart from 2^25
assert f"{2**25 / 1e6:.1f}" == "33.6"
assert (f"{table_bytes / 1e6:.1f}", f"{timed_bytes / 1e6:.0f}") == ("8.4", "143")

# 5. every timed solution but 5 and 9, at its timed shape cut to 32 rows
counted = list(pz.SOLUTIONS_AT_TIMED_SHAPE)
assert set(counted) == {p.number for p in timed} - {5, 9}      # the others are taken apart above
print("5. per tensor: instructions, share of the moved sectors' bytes used, most loads of one "
      "element")
uses = {}
for n in counted:
    label, memory = pz.at_timed_shape(n, rows=32)
    uses[n] = pz.sector_use(memory)
    print(f"   puzzle {n}, {label}: " + "; ".join(
        f"{name} {k}, {share:.0%}" + (f", {int(memory.counts(name, 'load').max())}"
                                      if memory.region(name).kind == "in" else "")
        for name, (k, share) in uses[n].items()))
    assert not memory.faults
    if n == 6:
        assert all(int(memory.counts(t, "load").min()) == 8 for t in ("cos", "sin"))  # per entry
    if n == 10:                             # every input element loaded, every y element stored
        assert all((memory.counts(t, "load") >= 1).all()
                   for t in ("x", "cos", "sin", "cu_seqlens"))
        assert (memory.counts("y", "store") == 1).all()
whole = [n for n in counted                 # every byte of x, y and the tables' sectors used
         if all(share == 1.0 for name, (k, share) in uses[n].items() if name != "cu_seqlens")]
print(f"   every byte of their rows' and tables' sectors used: puzzles {whole} of {counted}")
assert {4, 6, 11} <= set(whole)
big10 = pz.PUZZLES["packed_sequences"].big("meta")   # puzzle 10's timed case: shapes, no memory
read10 = sum(t.numel() * t.element_size() for t in big10.inputs.values())
wrote10 = big10.out.numel() * big10.out.element_size()
print(f"   puzzle 10, {big10.label}: reads {read10 / 1e6:.1f} MB (x, the tables, cu_seqlens), "
      f"writes {wrote10 / 1e6:.1f} MB; a copy of the {(read10 + wrote10) / 1e6:.1f} MB reads "
      f"and writes {(read10 + wrote10) / 2e6:.1f} MB each")
assert [f"{b / 1e6:.1f}" for b in (read10, wrote10, read10 + wrote10)] == ["66.2", "64.1", "130.3"]


def compiled(key):
    """The worked solution of `key` compiled for sm_90 (4 warps) at its timed case's tile."""
    p, big = pz.PUZZLES[key], pz.PUZZLES[key].big("meta")
    args = {name: torch.empty(16, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
            for name, v in zip(p.solution.arg_names, big.args)}
    code = load_schedule.schedule(p.solution, dict(args, **big.constexprs), num_warps=4)
    return dict(loads=load_schedule.load_widths(code), stores=load_schedule.store_widths(code),
                registers=code["registers"], grid=math.prod(big.grid))


code5 = {n: compiled(k) for n, k in ((2, "interleaved"), (4, "odd_head_dim"))}
for n, c in code5.items():
    print(f"   puzzle {n}, sm_90, Triton {triton.__version__}: {{bytes: count}} of a thread's "
          f"loads {c['loads']}, stores {c['stores']}, {c['registers']} registers, {c['grid']:,} programs")
assert code5[4]["loads"] == code5[2]["loads"] and code5[4]["stores"] == code5[2]["stores"]
assert abs(code5[4]["registers"] - code5[2]["registers"]) <= 4    # about as many: within 4

# 6. the score q . k, head dim 128, with q and k rotated by a bf16 table or rounded to bf16
gen6 = torch.Generator().manual_seed(6)
q6, k6 = (torch.randn(4096, 2 * half, generator=gen6, dtype=torch.float64) for _ in range(2))
ang6 = torch.randint(0, 131_072, (4096, 1), generator=gen6).double() * inv_freq.double()


def rotated(v, c, s_):
    return torch.cat([v[:, :half] * c - v[:, half:] * s_, v[:, half:] * c + v[:, :half] * s_], 1)


def score_error(qr, kr, q_ref, k_ref):
    """Worst |qr . kr - q_ref . k_ref| over |q| |k|."""
    return float(((qr * kr).sum(1) - (q_ref * k_ref).sum(1)).abs().div(
        q6.norm(dim=1) * k6.norm(dim=1)).max())


c64, s64 = ang6.cos(), ang6.sin()
c16, s16 = c64.to(torch.bfloat16).double(), s64.to(torch.bfloat16).double()
q_ref, k_ref = rotated(q6, c64, s64), rotated(k6, c64, s64)
by_table = score_error(rotated(q6, c16, s16), rotated(k6, c16, s16), q_ref, k_ref)
by_round = score_error(q_ref.to(torch.bfloat16).double(), k_ref.to(torch.bfloat16).double(),
                       q_ref, k_ref)
eps = math.sqrt(2) * 2**-9                        # a pair moved by the bf16 table, of its length
unit16 = 2**-8                                    # an element moved by rounding to bf16, of itself
qk_ref = torch.cat([q_ref, k_ref])
per_element = float(((qk_ref.to(torch.bfloat16).double() - qk_ref).abs() / qk_ref.abs()).max())
print(f"6. q and k rounded to bf16: an element moves by up to {per_element:.4f} of itself "
      f"(2^-8 = {unit16:.4f})")
print(f"   worst score error over |q| |k|, 4,096 pairs of vectors: bf16 table {by_table:.5f} "
      f"(bound {2 * eps:.4f}); q and k rounded to bf16 {by_round:.5f} (bound {2 * unit16:.4f})")
assert 0.99 * unit16 < per_element <= unit16
assert by_table <= 2 * eps * 1.01 and by_round <= 2 * unit16 * 1.01
assert abs(2 * eps / (2 * unit16) - 1 / math.sqrt(2)) < 1e-12   # the table's bound: 1/sqrt 2 of it
assert by_table <= by_round                       # the table costs no more than the rounding
