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
# # 06 — The backward pass
#
# Training needs the gradient of RoPE: given $\partial L/\partial y$ for the rotated queries and
# keys, produce $\partial L/\partial x$. This notebook derives it (with the angle table of
# NVIDIA's Transformer Engine, TE, it is the rotation by $-\theta$), wires a kernel into
# PyTorch's autograd, and checks it against autograd, finite differences and stride-0 inputs.
#
# **After this notebook you will be able to**
#
# - derive RoPE's backward (the transpose of the Jacobian: swap and negate the sines) and serve
#   both directions with one kernel and one compile-time flag;
# - write the backward kernel, its launcher and its `torch.autograd.Function` yourself, saving
#   only the angles in `ctx`, and derive the backward of interleaved pairs;
# - verify a backward against a reference's autograd, with `gradcheck` in float64, and on
#   stride-0 gradients;
# - show that the backward moves the forward's bytes, and time it beside a copy of those bytes.
#
# **Time:** about two hours for the core: sections 1 to 5 take about 50 minutes, the five
# exercises about 70 (the backward kernel of exercise 2 and the interleaved kernel of exercise 5
# about 20 each). The parts marked *a second reading* take about 30 minutes more. The cells also
# run on a CPU, through Triton's interpreter.
#
# **Numbers.** The text's numbers come from committed runs (`benchmarks/results/`: an NVIDIA
# H200, and an H100 in sections 2.1 and 3.1), which the cells read and assert. Live timings
# print the GPU they ran on. Where the text quotes a live number, it says so and names its run:
# the H100 run saved as the executed copy in `docs/executed/`; yours will differ.
#
# **How to read it.** The core is sections 1 to 5 and the exercises. "What four warps change"
# (section 2.1), section 3.1 and appendix A, each marked *a second reading*, can wait.
#
# **Where it sits.** The yardstick is the autograd of `ropelib.reference` (notebook 02); section
# 2 runs notebook 04's kernel both ways; section 6 prints the formulas of notebook 05's.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib's @triton.jit is imported
import ropelib
device = ropelib.default_device()

# %%
import matplotlib.pyplot as plt

import triton
import triton.language as tl

from ropelib import reference, runtime
from ropelib.bench import compare
from ropelib.course import access, measured   # access: loads and stores, recorded
from ropelib.course.exercises import backward_kernel
from ropelib.course.exercises import kernels as ex
from ropelib.course.exercises import solution
from ropelib.course.kernels.batch_reuse import rope_batch_reuse   # ropelib's launcher of it
from ropelib.course.kernels.naive import default_num_warps   # the warps that launcher picks
from ropelib.kernels.common import BF16_RTNE, round_to              # used by section 2's kernel

FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
GPU = runtime.on_gpu()
print(runtime.mode())
S, B, H, D = (4096, 8, 32, 128) if GPU else (4, 3, 2, 16)
print(f"x: [S={S}, B={B}, H={H}, D={D}] on {device}")

# %% [markdown]
# ## 1. The derivation
#
# Take one pair of features $(x_a, x_b)$ turned by the angle $\theta$:
#
# $$
# y = R(\theta)\,x, \qquad
# R(\theta) = \begin{pmatrix} \cos\theta & -\sin\theta \\ \sin\theta & \cos\theta \end{pmatrix}.
# $$
#
# RoPE is linear in $x$, with the Jacobian $J = \partial y/\partial x = R(\theta)$. For a scalar
# loss $L$ the chain rule,
# $\dfrac{\partial L}{\partial x_i} = \sum_k \dfrac{\partial L}{\partial y_k}\dfrac{\partial y_k}{\partial x_i}$,
# gives
#
# $$ \frac{\partial L}{\partial x} = J^{\top} \frac{\partial L}{\partial y} = R(\theta)^{\top}\,
#    \frac{\partial L}{\partial y}. $$
#
# Why the transpose: $x_i$ reaches the loss through every $y_k$ it feeds, with the weight
# $J_{ki}$, so its gradient collects column $i$ of $J$, which is row $i$ of $J^{\top}$.
#
# Since $\cos$ is even and $\sin$ is odd,
#
# $$
# R(\theta)^{\top}
# = \begin{pmatrix} \cos\theta & \sin\theta \\ -\sin\theta & \cos\theta \end{pmatrix}
# = \begin{pmatrix} \cos(-\theta) & -\sin(-\theta) \\ \sin(-\theta) & \cos(-\theta) \end{pmatrix}
# = R(-\theta).
# $$
#
# A head holds $D/2$ pairs, each with its own angle $\theta_k$. The rotate-half pairing
# (GPT-NeoX's and TE's, notebook 01 section 7) pairs feature $j$ with $j + D/2$; a permutation $P$
# that puts each pair side by side makes the Jacobian block-diagonal,
# $J = P^{\top} \operatorname{diag}(R_k)\, P$ with $R_k = R(\theta_k)$. Transposing reverses the
# product and transposes each block:
#
# $$ J^{\top} = P^{\top} \operatorname{diag}(R_k^{\top})\, P
#    = P^{\top} \operatorname{diag}\big(R(-\theta_k)\big)\, P. $$
#
# So **the backward of RoPE is RoPE with the angles negated**: the same kernel, rotating
# $\partial L/\partial y$ by $-\theta$. Turning by $\theta$ and then by $-\theta$ turns by
# nothing, $R(-\theta)\,R(\theta) = R(0) = I$, so the transpose is also the inverse:
#
# $$ R(\theta)^{\top} = R(\theta)^{-1} = R(-\theta). $$
#
# Rotations are orthogonal ($R^{\top}R = I$): the backward undoes the forward and keeps gradient
# norms, $\lVert R^{\top} g \rVert = \lVert g \rVert$.
#
# One detail. TE's table holds an angle per *feature*, built as `cat(f, f)`: the $D/2$ pair
# angles $f$ once for each half. A rotate-half pair reads $\theta_a$ (feature $j$) and
# $\theta_b$ (feature $j+D/2$); write $c_a = \cos\theta_a$, $s_a = \sin\theta_a$ and the same
# for $b$. The forward is $y_a = x_a c_a - x_b s_a$, $y_b = x_b c_b + x_a s_b$, so its block is
# $\begin{pmatrix} c_a & -s_a \\ s_b & c_b \end{pmatrix}$ and its transpose
# $\begin{pmatrix} c_a & s_b \\ -s_a & c_b \end{pmatrix}$ **swaps the two sines and negates
# them**. Written out, with $\bar y = \partial L/\partial y$,
#
# $$ \frac{\partial L}{\partial x_a} = \bar y_a\, c_a + \bar y_b\, s_b, \qquad
#    \frac{\partial L}{\partial x_b} = \bar y_b\, c_b - \bar y_a\, s_a. $$
#
# These are the forward's two lines, read with $\bar y$ for $x$ and $(s_a, s_b)$ replaced by
# $(-s_b, -s_a)$, which is what the
# `if BACKWARD:` branch of section 2's kernel does (`sin1 = -tl.sin(theta2)`,
# `sin2 = -tl.sin(theta1)`). With `cat(f, f)`, $\theta_a = \theta_b$ and that is $R(-\theta)$;
# ropelib's kernels do the swap, so they are the exact transpose for any table.
#
# When the halves differ, the block's determinant is $c_a c_b + s_a s_b = \cos(\theta_a -
# \theta_b)$, not 1 in general: the block is no rotation, its transpose (still the backward) is
# not its inverse, and gradient norms can change.
#
# The next cell checks this on the reference's $D \times D$ Jacobian, for TE's table and for one
# whose halves differ (the second False is the point), prints the range of
# $\lVert J^{\top} g \rVert / \lVert g \rVert$ for both, and reads notebook 04's kernel's
# backward off as a matrix (ropelib's copy, `rope_batch_reuse`: section 2's editable copy comes
# later).

# %%
def jacobian(freqs_row):
    """J [D, D] = d y / d x of the reference RoPE of one row, at the angles freqs_row [D]."""
    Dj = freqs_row.numel()
    f = freqs_row.view(1, 1, 1, Dj).float()
    return torch.autograd.functional.jacobian(
        lambda v: reference.rope_reference(v.view(1, 1, 1, Dj), f).view(Dj),
        torch.zeros(Dj, dtype=torch.float64))


f_pair = torch.tensor([0.5, 1.0, 1.5, 2.2])               # one angle per pair, large enough to see
theta = torch.cat([f_pair, f_pair])                        # D = 8, TE's cat(f, f)
J, J_neg = jacobian(theta), jacobian(-theta)
assert torch.allclose(J.T, J_neg, atol=1e-12)                   # R(theta)^T = R(-theta)
assert torch.allclose(J.T @ J, torch.eye(8, dtype=torch.float64), atol=1e-12)   # orthogonal

torch.manual_seed(0)
theta_any = torch.randn(8) * 3                                  # halves differ: not TE's table
J_any = jacobian(theta_any)
print("J^T == J(-theta) for TE's table:", torch.allclose(J.T, J_neg, atol=1e-12))
print("J^T == J(-theta) for a per-feature table with different halves:",
      torch.allclose(J_any.T, jacobian(-theta_any), atol=1e-12))
# (False is the point: with halves that differ, only the swap of the sines gives the transpose)
assert not torch.allclose(J_any.T, jacobian(-theta_any), atol=1e-12)
# ||J^T g|| / ||g|| over all g: from the smallest to the largest singular value of J^T
sv_te, sv_any = torch.linalg.svdvals(J.T), torch.linalg.svdvals(J_any.T)
g_top = torch.linalg.svd(J_any.T).Vh[0]                  # the g whose norm the backward grows most
ratio = ((J_any.T @ g_top).norm() / g_top.norm()).item()
print(f"||J^T g|| / ||g||: TE's table {sv_te.min():.6f} to {sv_te.max():.6f} for every g; "
      f"halves differ {sv_any.min():.3f} to {sv_any.max():.3f} ({ratio:.3f} for its top g)")
assert torch.allclose(sv_te, torch.ones(8, dtype=torch.float64), atol=1e-12)   # norms kept
assert abs(ratio - 1) > 1e-2                                   # norms not kept: the halves differ

# The kernel's backward as a matrix: rotate each basis vector e_i (one row per position, all
# positions with the same angles) and read off the columns.
E = torch.eye(8, dtype=torch.float64, device=device).view(8, 1, 1, 8)
table = theta_any.to(device).view(1, 8).expand(8, 8)     # stride 0: every row the same angles
M_kernel = rope_batch_reuse(E, table, backward=True).view(8, 8).T.cpu()
assert torch.allclose(M_kernel, J_any.T, atol=1e-6)             # the exact transpose, any table
print("the kernel's backward == J^T, also for that table (it swaps and negates the sines)")


def draw_jacobians(path):
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
    for ax, M, title in ((axes[0], J, r"$J = \partial y / \partial x$ at $\theta$"),
                         (axes[1], J.T, r"$J^\top$ (the backward)"),
                         (axes[2], J_neg, r"$J$ at $-\theta$")):
        im = ax.imshow(M.numpy(), cmap="RdBu", vmin=-1, vmax=1)
        ax.set_title(title)
        ax.set_xticks(range(8)), ax.set_yticks(range(8))
    fig.suptitle("RoPE of one position, D = 8, rotate-half: "
                 "the transpose equals the rotation by -theta",
                 fontsize=10)
    fig.tight_layout()
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="entry (red < 0 < blue)")
    fig.savefig(path, dpi=110)
    plt.show()


draw_jacobians(FIGURES / "06-jacobian.png")

# %% [markdown]
# The printed lines: for TE's table $J^{\top} = J(-\theta)$ and the backward keeps every
# gradient's norm (the ratio is 1 for every $g$). For the table whose halves differ
# $J^{\top} \ne J(-\theta)$, and the backward scales a gradient's norm by anything from 0.016 to
# 1.414. That range follows from the block: the squares of its two singular values sum to
# $c_a^2 + s_a^2 + s_b^2 + c_b^2 = 2$ and multiply to its squared determinant,
# $\cos^2(\theta_a - \theta_b)$, so a pair whose two angles differ by nearly $\pi/2$ nearly
# doubles one direction's squared norm and nearly erases the other's. The kernel's backward is
# still $J^{\top}$ for that table, because it swaps the sines.
#
# The figure (change `f_pair` and rerun to see others): the diagonal holds the cosines; each
# pair $(j, j+4)$ puts $-\sin$ above (red) and $+\sin$ below (blue) in $J$, and the other way
# round in $J^{\top}$, which is $J$ at $-\theta$.
#
# ## 2. One kernel for both directions
#
# Notebook 04's batch-reusing kernel already has the backward in it, behind the flag `BACKWARD`,
# a `tl.constexpr` (fixed when Triton compiles the kernel). The next cell is that kernel,
# character for character (a test checks it). The checks, timings and compiles after it launch
# *this* copy, through `rope_cell`; a few lines run ropelib's copy (`rope_batch_reuse`, the same
# source as long as you have not edited the cell) and say so: edit 3's column and the
# bit-for-bit line of the check below, section 3.1's live step (timed through its benchmark
# provider), section 4's `gradcheck` of `ropelib.apply_rope` (notebook 05's kernel) and
# section 5's refused `out=`. The committed runs are GPU runs of ropelib's kernels (section 2.1
# says which).
#
# The cell is there to be changed. Three edits to the `if BACKWARD:` branch, each a bug a real
# backward has had:
#
# 1. negate the sines without swapping them (`sin1 = -tl.sin(theta1)`, `sin2 = -tl.sin(theta2)`);
# 2. delete the branch and keep the two lines of its `else`: the backward uses the forward's sines;
# 3. swap the sines without negating them.
#
# Before the check runs, predict which rows of its table each edit turns ✗, and write that
# into `my_prediction`, in the cell just before the check (which lists the rows). The table sets
# the cell's kernel beside the three wrong backwards (edit 1 is the forward at $-\theta$, edit 2
# the forward at $\theta$, edit 3 ropelib's backward at $-\theta$, the cosines being even) and
# names the one your kernel matches; the check prints your prediction beside it. To see an edit
# in your kernel's own column, make it and rerun the kernel's cell and the check; undo the edit
# to go on. The last line compares bits with ropelib's kernel; a correct rewrite that orders the
# arithmetic differently can fail it alone.

# %%
# ropelib-source: ropelib.course.kernels.batch_reuse._rope_batch_reuse_kernel
@triton.jit
def _rope_batch_reuse_kernel(
    x_ptr,  # *x: input [S, B, H, D], any strides
    y_ptr,  # *y: output [S, B, H, D], same dtype as x, last dim contiguous
    freqs_ptr,  # *fp32: angles [P, D], P >= S (row s holds the D angles of position s)
    B,  # batch size: the length of the loop each program runs
    stride_xs, stride_xb, stride_xh, stride_xd,  # x strides, in elements
    stride_ys, stride_yb, stride_yh,  # y strides, in elements (stride_yd == 1)
    stride_fs, stride_fd,  # freqs strides, in elements
    HALF: tl.constexpr,  # D // 2: features in each half (any size, 72/2 = 36 included)
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF: the tile each half is loaded in
    BACKWARD: tl.constexpr,  # False: y = R(theta) x; True: y = R(theta)^T x = R(-theta) x
    COMPUTE_DTYPE: tl.constexpr,  # tl.float32 (tl.float64 for fp64 inputs)
    BF16_RTNE: tl.constexpr,  # round bf16 to nearest even by hand (the interpreter truncates)
):
    # One program = one (position, head) pair; int64 so offsets cannot overflow on huge tensors.
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)

    offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF] feature index within a half
    mask = offs < HALF

    # cos/sin of position s: computed once here, reused by every row of the batch below.
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    cos1 = tl.cos(theta1)
    cos2 = tl.cos(theta2)
    if BACKWARD:
        # Transpose of [[c1, -s1], [s2, c2]]: swap and negate the sines (= rotation by -theta).
        sin1 = -tl.sin(theta2)
        sin2 = -tl.sin(theta1)
    else:
        sin1 = tl.sin(theta1)
        sin2 = tl.sin(theta2)

    x_base = x_ptr + s * stride_xs + h * stride_xh
    y_base = y_ptr + s * stride_ys + h * stride_yh
    # A runtime loop (not tl.static_range): B is not a constexpr, so one compiled kernel
    # serves every batch size, except that Triton specializes an integer argument equal to 1
    # (compiled as a constant) or divisible by 16: B = 1 and a B that 16 divides get builds of
    # their own.
    for b in range(0, B):
        x_row = x_base + b * stride_xb
        x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
        y_row = y_base + b * stride_yb
        tl.store(y_row + offs, round_to(y1, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)
        tl.store(y_row + HALF + offs, round_to(y2, y_ptr.dtype.element_ty, BF16_RTNE), mask=mask)

# %% [markdown]
# `BACKWARD` only changes which sines the program computes; the loads, the loop and the stores
# are the same lines, so the backward moves the forward's bytes. Triton compiles one kernel for
# each value of the flag, so the `if` costs nothing at run time.
#
# The launcher below is yours to change too. It launches one program per (token, head) on the
# grid $(S, H)$ and passes every stride, so any view of $x$ is read as it is.
# `COMPUTE_DTYPE` is fp64 for fp64 inputs (section 4's `gradcheck` needs it); `BF16_RTNE` rounds
# bf16 to nearest even by hand, since the interpreter truncates. `num_warps` defaults to
# ropelib's choice, one warp per 128 elements of a half (one at $D = 128$); section 2.1 times it
# against Triton's default of four.

# %%
def rope_cell(x, freqs, *, backward=False, num_warps=None):
    """Launch the kernel of the cell above: x [S, B, H, D] (any strides), fp32 angles freqs
    [P, 1, 1, D] or [P, D] (P >= S); returns a new contiguous tensor of x's dtype. num_warps:
    warps per program (None: one per 128 elements of a half, as ropelib's launcher picks;
    the interpreter ignores it)."""
    S, B, H, D = x.shape
    if num_warps is None:                                     # 1 at D = 128 (section 2.1)
        num_warps = max(1, min(8, triton.next_power_of_2(D // 2) // 128))
    f2 = freqs.reshape(freqs.shape[0], D)                     # [P, D], a view when it can be
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rope_batch_reuse_kernel[(S, H)](                         # one program per (token, head)
        x, y, f2, B,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        y.stride(0), y.stride(1), y.stride(2),
        f2.stride(0), f2.stride(1),
        HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2),
        BACKWARD=backward,
        COMPUTE_DTYPE=tl.float64 if x.dtype == torch.float64 else tl.float32,
        BF16_RTNE=BF16_RTNE, num_warps=num_warps)
    return y

# %% [markdown]
# The check runs the four backwards through three tests from section 1, the rows of its table,
# and prints the largest error of each (✓: within `atol = rtol = 1e-5` of the fp64 reference):
#
# 1. the reference's autograd, on TE's table;
# 2. the same on a table whose halves differ, where only the swap gives the transpose;
# 3. $R^{\top}R = I$ on TE's table: the backward undoes the forward.
#
# Write your prediction into the next cell before you run the check: for each edit, the set of
# rows it turns ✗. The check prints it beside the table, edit by edit; left at `None`, it prints
# the table alone, and the notebook runs on either way.
#
# On a GPU the check also times the cell's kernel forward and backward in fp32 and prints their
# ratio, which the same bytes predict to be 1.

# %%
# Your prediction: edit (1, 2, 3, as numbered above the kernel) -> the set of rows (1, 2, 3, as
# numbered above) it turns ✗, set() for none; the format only: {1: {1, 3}, 2: set(), 3: {2}}
my_prediction = None   # fill in before you run the next cell

# %%
torch.manual_seed(0)
freqs = ex.te_angles(S, D, device=device)             # TE's table: cat(f, f)
f_any = torch.rand(S, D, device=device) * 6 - 3        # the two halves differ: the swap matters
x = torch.randn(S, B, H, D, device=device)
g = torch.randn(S, B, H, D, device=device)             # stands for dL/dy
x64 = x.double().requires_grad_()
(gx_ref,) = torch.autograd.grad(reference.rope_reference(x64, freqs), x64, g.double())
(gx_any,) = torch.autograd.grad(reference.rope_reference(x64, f_any), x64, g.double())

backwards = {                                          # g, table -> dL/dx
    "the cell's kernel": lambda t, f: rope_cell(t, f, backward=True),
    "edit 1: negate only": lambda t, f: rope_cell(t, -f),   # both sines negated, not swapped
    "edit 2: forward's sines": lambda t, f: rope_cell(t, f),
    "edit 3: swap only": lambda t, f: rope_batch_reuse(t, -f, backward=True),   # ropelib's
}
tests = {                                              # backward -> (got, want)
    "= autograd, TE's table": lambda bw: (bw(g, freqs), gx_ref.float()),
    "= autograd, halves differ": lambda bw: (bw(g, f_any), gx_any.float()),
    "R^T R x = x, TE's table": lambda bw: (bw(rope_cell(x, freqs), freqs), x),
}
err, passed = {}, {}
for t, test in tests.items():
    for b, bw in backwards.items():
        got, want = test(bw)
        err[t, b] = (got - want).abs().max().item()
        passed[t, b] = torch.allclose(got, want, atol=1e-5, rtol=1e-5)
edits = list(backwards)[1:]                            # edits 1, 2, 3, in order
failed = {i: {r for r, t in enumerate(tests, 1) if not passed[t, b]}   # edit -> rows it fails
          for i, b in enumerate(edits, 1)}


def predicted_rows(v):
    """One edit's predicted rows as a set of 1, 2, 3 (an int stands for one row), else None."""
    try:
        v = {v} if isinstance(v, int) else set(v)
    except TypeError:
        return None
    return v if v <= {1, 2, 3} else None


guess = ({i: predicted_rows(my_prediction.get(i)) for i in failed}
         if isinstance(my_prediction, dict) else None)
if my_prediction is None:
    print("no prediction written (my_prediction is None): the table below is the answer")
elif guess is None or None in guess.values():
    print("my_prediction should map each edit 1, 2, 3 to the set of rows 1, 2, 3 it turns ✗ "
          f"(set() for none), not {my_prediction!r}: the table below is the answer")
else:
    print("your prediction beside the table: the rows each edit turns ✗")
    for i, b in enumerate(edits, 1):
        you, table_rows = (", ".join(map(str, sorted(r))) or "none" for r in (guess[i], failed[i]))
        print(f"  {b:25s} you: {you:9s} the table: {table_rows:9s} "
              + ("✓ right" if guess[i] == failed[i] else "✗ not what you predicted"))
    print(f"{sum(guess[i] == failed[i] for i in failed)} of 3 edits predicted right")
print(f"{'largest error':30s}" + "".join(f"{b:>25s}" for b in backwards))
for r, t in enumerate(tests, 1):
    print(f"{r}. {t}".ljust(30) + "".join(f"{'✓' if passed[t, b] else '✗'} {err[t, b]:9.2e}"
                                          .rjust(25) for b in backwards))
column = {b: [passed[t, b] for t in tests] for b in backwards}
mine = column["the cell's kernel"]
like = [b for b in list(backwards)[1:] if all(       # the same numbers as an edit, both tables
    torch.allclose(rope_cell(g, f, backward=True), backwards[b](g, f), atol=1e-5, rtol=1e-5)
    for f in (freqs, f_any))]
print("the cell's kernel:", "correct" if all(mine) else
      "wrong, " + (f"the same numbers as {like[0]}" if like else "and like neither edit"))
assert column["edit 1: negate only"] == [True, False, True], "TE's table hides edit 1"
assert column["edit 2: forward's sines"] == [False, False, False]
assert column["edit 3: swap only"] == [False, False, False]   # on TE's table: edit 2's numbers
assert all(mine), "the cell's backward fails a row of the table above"
gx = rope_cell(g, freqs, backward=True)
assert torch.equal(gx, rope_batch_reuse(g, freqs, backward=True))    # = ropelib's, bit for bit
print("and bit for bit ropelib's backward")
# rope_cell's default warps are the ones ropelib's launcher picks, for every head size
assert all(max(1, min(8, bh // 128)) == default_num_warps(bh) for bh in (8, 64, 128, 256, 2048))

if GPU:
    from triton.testing import do_bench
    fwd_ms = do_bench(lambda: rope_cell(x, freqs))
    bwd_ms = do_bench(lambda: rope_cell(g, freqs, backward=True))
    print(f"{torch.cuda.get_device_name()}, fp32, default warps: forward {fwd_ms * 1e3:.1f} µs, "
          f"backward {bwd_ms * 1e3:.1f} µs = {bwd_ms / fwd_ms:.2f}x the forward "
          "(same loads and stores, same kernel)")
    assert 0.9 < bwd_ms / fwd_ms < 1.1, "the same bytes should take the forward's time"

# %% [markdown]
# Read the table by column. Only edit 1 passes a row: on TE's table its sines are equal, so swapping
# them changes nothing and negating alone is right; the table whose halves differ is the one row
# that catches it. Edits 2 and 3 fail every row: on TE's table both compute the forward, the
# rotation by $+\theta$, so they rotate the gradient the wrong way. On a GPU the cell's last line
# times the kernel both ways in fp32: the H100 run on this notebook's page printed
# 393.5<!--page: fp32, default warps: forward--> µs forward and
# 393.3<!--page: fp32, default warps: forward--> µs backward, a ratio of
# 1.00<!--page: fp32, default warps: forward-->, as the shared loads and stores predict.

# %% [markdown]
# ### 2.1 How fast: beside a copy, at one warp or four
#
# The backward reads $\partial L/\partial y$ and writes $\partial L/\partial x$: a copy's bytes,
# plus $S \times D$ fp32 angles ($2/(BH)$ of the gradient's bytes in bf16). A copy is its floor.
#
# The next cell counts those bytes on small bf16 CPU tensors: `ropelib.course.access` (notebook
# 03, section 5) runs section 2's kernel in the interpreter and records every address each
# `tl.load` and `tl.store` touches. Per tensor it prints the instructions, the bytes they move,
# and the distinct bytes among those (the least DRAM must supply).

# %%
def recorded_bytes(t, table, *, backward):
    """{tensor: (instructions, bytes moved, distinct bytes)} of one launch of section 2's kernel
    on the CPU tensor t [S, B, H, D] with the angles table [P, 1, 1, D], in the interpreter."""
    Sr, Br, Hr, Dr = t.shape
    f2, out = table.reshape(table.shape[0], Dr), torch.empty(t.shape, dtype=t.dtype)
    log = access.record(_rope_batch_reuse_kernel, (Sr, Hr), t, out, f2, Br, *t.stride(),
                        *out.stride()[:3], *f2.stride(), HALF=Dr // 2,
                        BLOCK_HALF=triton.next_power_of_2(Dr // 2), BACKWARD=backward,
                        COMPUTE_DTYPE=tl.float32, BF16_RTNE=BF16_RTNE)
    counts = {}
    for name, accesses in access.by_tensor(log, {"in": t, "angles": f2, "out": out}).items():
        lanes = [a.addresses for a in accesses]
        size = accesses[0].itemsize
        counts[name] = (len(accesses), sum(a.size for a in lanes) * size,
                        len(set().union(*(a.tolist() for a in lanes))) * size)
    return counts


shape_r = (4, 3, 2, 16)                                    # S, B, H, D: small, on the CPU
table_r = ex.te_angles(shape_r[0], shape_r[3], device="cpu")
traffic = {"forward (x -> y)": recorded_bytes(torch.randn(shape_r, dtype=torch.bfloat16),
                                              table_r, backward=False),
           "backward (dL/dy -> dL/dx)": recorded_bytes(torch.randn(shape_r, dtype=torch.bfloat16),
                                                       table_r, backward=True)}
n_r = torch.Size(shape_r).numel()
print(f"recorded in the interpreter: bf16 [{', '.join(map(str, shape_r))}], {n_r} elements, "
      f"grid (S, H) = {shape_r[0] * shape_r[2]} programs; instructions / bytes moved / distinct")
print(f"{'':26s}" + "".join(f"{h:>22s}" for h in ("loads of the input", "loads of the angles",
                                                   "stores of the output")))
for name, c in traffic.items():
    print(f"{name:26s}" + "".join(f"{'%d / %d / %d' % c[k]:>22s}" for k in ("in", "angles", "out")))
fwd_c, bwd_c = traffic.values()
assert fwd_c == bwd_c, "the backward moves the forward's bytes, instruction for instruction"
assert fwd_c["in"][1:] == fwd_c["out"][1:] == (2 * n_r, 2 * n_r), "a copy's: 2N read, 2N written"
S_r, B_r, H_r, D_r = shape_r
assert fwd_c["angles"][2] == S_r * D_r * 4, "S x D fp32 angles, distinct"
assert fwd_c["angles"][1] == H_r * fwd_c["angles"][2], "each of the H programs of a row reads them"

# %% [markdown]
# Beside a copy's $2N + 2N$ bytes the only extra is the angles: the $H$ programs of a position
# each load its row, and only $S \times D \times 4$ bytes of them are distinct (the rest can come
# from the L2 cache).
#
# How close to that floor does the kernel come? The next cell first prints committed runs at
# this notebook's GPU shape, $[4096, 8, 32, 128]$ in bf16 (`ropelib_batch_reuse` is section 2's
# kernel at one warp): copy time / kernel time is 0.80 on the H100, 0.71 on the H200. It also
# prints the H200's committed timing of the forward at four warps against one
# (`benchmarks/results/ablation-nvidia-h200.csv`, `do_bench` medians): 1.59 times the time. That
# timing is not of this cell's source but of notebook 04's ablation kernel set up as this kernel
# (`sh_loop_b_w4` and `sh_loop_b_w1`: the grid $(S, H)$, one head a program, the loop over the
# batch, cos/sin computed once a program), a source of its own with the same loads and stores.
#
# On a GPU it then times a copy of $\partial L/\partial y$ and the kernel forward and backward at
# `num_warps=4` (Triton's default) and `num_warps=1` (`rope_cell`'s). It asserts that the
# backward takes the forward's time and that nothing beats the copy by more than 2 %, and on an
# H100 or H200 (compute capability 9.0) that one warp beats four.

# %%
frac_committed = {}      # GPU: (forward, forward+backward) of ropelib_batch_reuse, of a copy
for gpu in ("nvidia-h100-80gb-hbm3", measured.GPU):
    gen_meta_w, gen_rows_w = measured.load("generations", gpu)
    r = next(r for r in gen_rows_w if r["provider"] == "ropelib_batch_reuse"
             and r["case"] == "batch-8")
    assert (r["seq_len"], r["batch"], r["heads"], r["head_dim"], r["dtype"]) == \
        (4096, 8, 32, 128, "bf16"), "this page's shape"
    frac_committed[gen_meta_w["gpu"]] = (r["ratio_fwd"], r["ratio_fwdbwd"])
    print(f"{measured.where(gen_meta_w)}, one warp: forward {r['ratio_fwd']:.2f} of a copy, "
          f"forward+backward {r['ratio_fwdbwd']:.2f}")
assert {g_: [round(v, 2) for v in fr] for g_, fr in frac_committed.items()} == {
    "NVIDIA H100 80GB HBM3": [0.80, 0.80], "NVIDIA H200": [0.71, 0.71]}, "the text's 0.80, 0.71"
assert default_num_warps(triton.next_power_of_2(128 // 2)) == 1, "ropelib_batch_reuse: one warp"
# the H200's committed timing of this kernel's forward at four warps and at one (the variants
# section 2.1's profile names sh_loop_b_w4 and sh_loop_b_w1), at this page's shape
abl_meta, _ = measured.load("ablation")
abl = measured.timings("ablation", "s4096-b8")
w4_over_w1_h200 = abl["sh_loop_b_w4"]["ms"] / abl["sh_loop_b_w1"]["ms"]
print(f"{measured.where(abl_meta)}: four warps a program, the forward in "
      f"{w4_over_w1_h200:.2f}x the one-warp time")
assert abl_meta["gpu"] == "NVIDIA H200" and round(w4_over_w1_h200, 2) == 1.59, "the text's 1.59x"

if GPU:
    from triton.testing import do_bench
    x_bf, g_bf = x.to(torch.bfloat16), g.to(torch.bfloat16)      # [S, B, H, D] bf16
    for t_ in (x_bf, g_bf):                                       # the warps change no result
        torch.testing.assert_close(rope_cell(t_, freqs, num_warps=4), rope_cell(t_, freqs))
    copy_out = torch.empty_like(g_bf)
    timed = {"copy of dL/dy": lambda: copy_out.copy_(g_bf)}
    for w in (4, 1):
        timed[f"forward, num_warps={w}"] = lambda w=w: rope_cell(x_bf, freqs, num_warps=w)
        timed[f"backward, num_warps={w}"] = (
            lambda w=w: rope_cell(g_bf, freqs, backward=True, num_warps=w))
    ms = {name: do_bench(fn, quantiles=[0.5, 0.2, 0.8]) for name, fn in timed.items()}
    copy_ms = ms["copy of dL/dy"][0]
    grad_mib, angle_mib = g_bf.numel() * g_bf.element_size() / 2**20, S * D * 4 / 2**20
    print(f"{torch.cuda.get_device_name()}, dL/dy [{S}, {B}, {H}, {D}] bf16: {grad_mib:.0f} MiB "
          f"read and {grad_mib:.0f} MiB written, beside {angle_mib:.0f} MiB of fp32 angles")
    for name, (med, lo, hi) in ms.items():
        print(f"  {name:24s} {med * 1e3:8.1f} µs (p20-p80 {lo * 1e3:.1f}-{hi * 1e3:.1f})  "
              f"{copy_ms / med:.2f} of a copy")
    for w in (4, 1):
        bwd_x = ms[f"backward, num_warps={w}"][0] / ms[f"forward, num_warps={w}"][0]
        print(f"num_warps={w}: the backward takes {bwd_x:.2f}x the forward's time")
        assert 0.9 < bwd_x < 1.1, "the same bytes should take the forward's time"
    assert all(copy_ms < 1.02 * med for med, _, _ in ms.values()), "a copy is the floor"
    w4_ms, w1_ms = ms["forward, num_warps=4"][0], ms["forward, num_warps=1"][0]
    print(f"four warps a program: the forward in {w4_ms / w1_ms:.2f}x the one-warp time "
          f"(the H200's committed timing: {w4_over_w1_h200:.2f}x)")
    if torch.cuda.get_device_capability() == (9, 0):   # H100, H200: the code profiled below
        assert w1_ms < w4_ms, "one warp per program: the faster launch on sm_90"
else:
    print("timed on a GPU only (the interpreter runs one program after another in Python)")

# %% [markdown]
# **What four warps change** (*a second reading*). `benchmarks/mechanism.py` profiled the
# forward on the H200 with Nsight Compute (NVIDIA's kernel profiler) at one and four warps, as
# the two ablation variants timed above, beside a Triton kernel copying the same bytes, and
# counted the global loads and stores in their PTX (the assembly-like code Triton emits) by
# width. The same profile holds ropelib's copy of section 2's kernel at its one warp
# (`batch_reuse`): 179.1 µs against the variant's 178.5, 0.51 warp instructions an element
# against 0.49, 48 % occupancy both, the same loads and stores. At four warps only the variant
# was profiled. At four warps each element and each cos/sin value of a 64-pair half is held by 2
# of the 128 threads (notebook 04, appendix A.1).

# %%
prof = measured.mechanism("s4096-b8")
mech_meta, _ = measured.load("mechanism")
assert mech_meta["gpu"] == "NVIDIA H200", "the text's H200 profile"
copy_row, w1_row, w4_row = prof["copy"], prof["sh_loop_b_w1"], prof["sh_loop_b_w4"]
profiled = {"copy": copy_row, "RoPE, 1 warp": w1_row, "RoPE, 4 warps": w4_row}
print(f"{measured.path('mechanism').name}: {measured.where(mech_meta)}")
print(f"Nsight Compute, {w1_row['dtype']} [{w1_row['seq_len']}, {w1_row['batch']}, "
      f"{w1_row['heads']}, {w1_row['head_dim']}]:")
print(f"{'':13} {'time (µs)':>10} {'warp instr / element':>21} "
      f"{'thread instr / element':>23} {'achieved occupancy':>19} {'DRAM bytes / model':>19} "
      f"{'SM throughput':>14} {'DRAM throughput':>16}")
for label, r in profiled.items():
    print(f"{label:13} {r['us']:10.1f} {r['ncu_warp_inst_per_element']:21.3f} "
          f"{r['ncu_thread_inst_per_element']:23.1f} {r['ncu_achieved_occupancy_pct']:18.0f}% "
          f"{r['ncu_dram_bytes_over_model']:19.3f} {r['ncu_sm_throughput_pct']:13.0f}% "
          f"{r['ncu_dram_throughput_pct']:15.0f}%")
print("compiled code:")
print(f"{'':13} {'registers':>10} {'resident programs / SM':>23} {'capped by':>16}   "
      "PTX global loads (ld) and stores (st), by vector.word size")
for label, r in profiled.items():
    print(f"{label:13} {r['registers']:10d} {r['occ_blocks_per_sm']:23d} "
          f"{r['occ_limiter']:>16}   {r['ptx_access_detail']}")
# per program: one head, B rows of D elements; a thread's share of its instructions
per_thread = {int(r["num_warps"]): r["ncu_thread_inst_per_element"] * r["batch"]
              * r["head_dim"] / (32 * r["num_warps"]) for r in (w1_row, w4_row)}
inst_x = w4_row["ncu_thread_inst_per_element"] / w1_row["ncu_thread_inst_per_element"]
time_x = w4_row["us"] / w1_row["us"]
print(f"instructions a thread executes per program: {per_thread[1]:.0f} at one warp, "
      f"{per_thread[4]:.0f} at four ({per_thread[4] / per_thread[1]:.2f} of them)")
print(f"four warps: 4x the threads at {per_thread[4] / per_thread[1]:.2f} of the instructions "
      f"each = {inst_x:.2f}x the instructions per element, {time_x:.2f}x the time")
sm_x = w4_row["ncu_sm_throughput_pct"] / w1_row["ncu_sm_throughput_pct"]
print(f"instructions per microsecond: {inst_x / time_x:.2f}x at four warps; "
      f"SM throughput: {sm_x:.2f}x")
print(f"one warp: {copy_row['us'] / w1_row['us']:.2f} of the copy's speed under the profiler")
assert (w1_row["seq_len"], w1_row["batch"], w1_row["heads"], w1_row["head_dim"]) == \
    (4096, 8, 32, 128)
assert abs(w4_row["ncu_dram_bytes_over_model"] / w1_row["ncu_dram_bytes_over_model"] - 1) < 0.01
assert round(inst_x, 2) == 2.85, "the text's 2.85x the instructions per element"
assert round(time_x, 2) == 1.62, "the text's 1.62x the time at four warps"
assert [round(r["ncu_warp_inst_per_element"], 2) for r in (w1_row, w4_row)] == [0.49, 1.39]
assert [round(r["ncu_achieved_occupancy_pct"]) for r in (w1_row, w4_row)] == [48, 96]
assert [r["occ_theoretical_pct"] for r in (w1_row, w4_row)] == [50, 100]
assert [r["occ_blocks_per_sm"] for r in (w1_row, w4_row)] == [32, 16]
# one-warp programs: 32 resident = 50 % of the warp slots, so an SM holds 64 warps
assert w1_row["occ_blocks_per_sm"] * 100 / w1_row["occ_theoretical_pct"] == 64, \
    "the text's 64 warp slots of an SM"
assert [r["occ_limiter"] for r in (w1_row, w4_row)] == ["blocks", "registers+warps"]
assert [r["registers"] for r in (w1_row, w4_row)] == [36, 27]
assert [r["ptx_access_detail"] for r in (w1_row, w4_row)] == [
    "ld.v1.b32=2 ld.v2.b32=2 st.v1.b32=2",          # x, y: two bf16 a word; angles: 2 words
    "ld.v1.b16=2 ld.v1.b32=2 st.v1.b16=2"]          # x, y: one bf16; angles: one word
assert [round(per_thread[w]) for w in (1, 4)] == [499, 356]
assert round(per_thread[4] / per_thread[1], 2) == 0.71
assert [round(r["ncu_sm_throughput_pct"]) for r in (w1_row, w4_row)] == [36, 63]
assert [round(r["ncu_dram_throughput_pct"]) for r in (w1_row, w4_row)] == [61, 38]
assert (round(inst_x / time_x, 2), round(sm_x, 2)) == (1.76, 1.74), "the text's 1.76x and 1.74x"
# the copy beside the one-warp kernel: the text's 0.70, 0.065 against 0.487, 16 bytes, 85 %, 61 %
assert round(copy_row["us"] / w1_row["us"], 2) == 0.70
assert [f"{r['ncu_warp_inst_per_element']:.3f}" for r in (copy_row, w1_row)] == ["0.065", "0.487"]
assert copy_row["ptx_access_detail"] == "ld.v4.b32=2 st.v4.b32=2"     # 16 bytes an instruction
assert [round(r[k]) for r in (copy_row, w1_row) for k in
        ("ncu_achieved_occupancy_pct", "ncu_dram_throughput_pct")] == [85, 85, 48, 61]
# notebook 05's two readings of this kernel: on two warps (its A.1) 94 % of the slots filled and
# no faster; its section 2's bound on the bytes in flight an SM, above the need
w2_row, need = prof["sh_loop_b_w2"], measured.loads_in_flight_need()
assert round(w2_row["ncu_achieved_occupancy_pct"]) == 94, "the text's 94 %"
assert [f"{r['us']:.1f}" for r in (w2_row, w1_row)] == ["178.1", "178.5"], "the text's µs"
assert [round(v, 1) for v in (w1_row["x_kib_per_sm"], need["kib_per_sm"])] == [7.7, 5.6]
assert w1_row["x_kib_per_sm"] > need["kib_per_sm"], "a bound above the need"

# %% [markdown]
# The profile is the H200 forward's, but the code is both GPUs': an H100 and an H200 both run
# what Triton compiles for sm_90. The next cell compiles section 2's kernel, the cell's copy (with
# your edits, if any), *backward* for sm_90 here (no GPU needed) and asserts that its loads and
# stores are the profile's.

# %%
# section 2's kernel (the cell's), backward, compiled for sm_90 here (nb06_compiled.py)
from ropelib.course import nb06_compiled   # noqa: E402
for w, row in ((1, w1_row), (4, w4_row)):
    here = nb06_compiled.global_accesses(w, backward=True, kernel=_rope_batch_reuse_kernel)
    print(f"backward, num_warps={w}, sm_90: {here:38} the profiled forward: "
          f"{row['ptx_access_detail']}")
    assert here == row["ptx_access_detail"], (w, here)

# %% [markdown]
# So the loads and stores are the same in both directions, on both GPUs, and in the ablation
# variants; the executed counts, times and throughputs are those of the variants' H200 forward.
# The PTX column reads (a bf16 is 16 bits,
# an angle 32):
#
# | a thread's global accesses | one warp: 2 elements of each half | four warps: 1 element of each half |
# |---|---|---|
# | $x$ in, $y$ out | a 32-bit word of two bf16 (`ld.v1.b32`, `st.v1.b32`) | one bf16 (`ld.v1.b16`, `st.v1.b16`) |
# | angles | two, as one 2-word vector (`ld.v2.b32`) | one (`ld.v1.b32`) |
#
# - **Instructions per element.** At four warps each element costs a load and a store of its
#   own on both threads that hold it: four times the threads, each executing 0.71 of the
#   one-warp thread's instructions, make 2.85 times the instructions per element.
# - **Occupancy** (the share of an SM's warp slots filled): 48 % at one warp, capped by the limit
#   of 32 programs an SM (`blocks`), 96 % at four.
# - **Time.** The occupancy does not pay for the instructions: on the H200 four warps take 1.62
#   times the one-warp time under the profiler, which locks the clocks, and 1.59 times in its
#   committed `do_bench` timing; the kernel moves from memory to instructions (the throughput
#   columns). The live timing cell above prints its GPU's ratio beside the committed 1.59 (the H100
#   run on this notebook's page printed 1.44<!--page: four warps a program-->, with one warp at
#   0.80<!--page: one warp: forward--> of a copy, the committed H100 figure). The live ratio is
#   section 2's kernel's, the committed one the ablation variants': their loads and stores are the
#   same, the rest of their code is not. So a different ratio can come from the GPU that runs it,
#   from the run, or from the two sources: one live timing does not tell these apart, and which
#   of a GPU's parts would make a difference, this profile cannot say.
#
# **Why one warp stays short of a copy.** Under the profiler it runs at 0.70 of the copy's speed.
# The copy moves 16 bytes an instruction against 4, fills 85 % of the warp slots against 48 %,
# and keeps DRAM at 85 % of its peak against 61 %; the profile cannot say which of these costs
# the time. Notebook 05 adds two readings, neither an answer. The same variant on two warps
# (`sh_loop_b_w2`) fills 94 % of the slots and is no faster, 178.1 µs against 178.5 under the
# same profile (its appendix A.1 sets the 178.1 beside `batch_reuse`'s 179.1): filling the slots
# does not close the gap by itself, though two warps also halve each thread's accesses. Its
# section 2 bounds the bytes this kernel keeps in flight per SM from above, at 7.7 KiB, over the
# 5.6 KiB a full-speed read needs; by that section's own rule a bound above the need proves
# nothing. Why one warp stays short of a copy, the course leaves open.

# %% [markdown]
# ## 3. A `torch.autograd.Function`
#
# Autograd needs two things from a custom op: a `forward` that computes the output and saves
# what the backward will need, and a `backward` that turns the gradient of the output into one
# gradient per input of `forward`.
#
# **What to save in `ctx`.** The backward is $R(\theta)^{\top}\,\partial L/\partial y$: it needs
# the angles and nothing else.
#
# - **not `x`**: RoPE is linear in $x$, so the Jacobian does not depend on it; saving `x` would
#   keep a query or key tensor per layer alive until the backward, for nothing;
# - **not cos/sin**: the kernel recomputes them once per (position, head) program and reuses them
#   over the batch (notebook 04). Question 3 asks what saving them would cost;
# - **`freqs`, with `ctx.save_for_backward`**: a reference to the small, shared table, not a
#   copy. Unlike `ctx.freqs = freqs`, it raises an error if the table is changed in place before
#   the backward, never makes a reference cycle, and saved-tensor hooks apply to it.
#
# `backward` returns `None` for `freqs`: the angles are not trained.

# %%
class RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, freqs):
        ctx.save_for_backward(freqs)            # the angles only: the backward is linear in dL/dy
        return rope_cell(x, freqs)              # section 2's kernel

    @staticmethod
    def backward(ctx, grad_y):
        (freqs,) = ctx.saved_tensors
        # any strides, stride 0 included: no .contiguous() copy (section 5)
        return rope_cell(grad_y, freqs, backward=True), None


xq = x.clone().requires_grad_()
y = RopeFunction.apply(xq, freqs)
saved = y.grad_fn.saved_tensors
print("saved for backward:", [tuple(t.shape) for t in saved], "— the angle table only")
assert len(saved) == 1 and saved[0].data_ptr() == freqs.data_ptr()

y.backward(g)
torch.testing.assert_close(xq.grad, gx_ref.float(), atol=1e-5, rtol=1e-5)
for dtype in (torch.float16, torch.bfloat16):        # dtype-aware: one rounding of the fp32 result
    xd, gd = x.to(dtype).requires_grad_(), g.to(dtype)
    RopeFunction.apply(xd, freqs).backward(gd)
    (want,) = torch.autograd.grad(reference.rope_reference(x64, freqs), x64, gd.double())
    torch.testing.assert_close(xd.grad, want.to(dtype))   # torch's default tolerances for dtype
print("gradients match the reference's autograd in fp32, fp16 and bf16")

# %% [markdown]
# ### 3.1 What one training step costs (*a second reading*)
#
# A step runs the forward and then the backward: two kernels moving the same bytes, so twice the
# forward's time. A committed H200 run (`benchmarks/results/generations-nvidia-h200.csv`) timed
# the step (`torch.autograd.grad` through such a Function) and the forward alone with
# `do_bench`, in bf16, for the kernels of notebooks 03 (`ropelib_naive`), 04
# (`ropelib_batch_reuse`, section 2's at one warp) and 05 (`ropelib`). The cell prints step /
# forward per batch ($s = 4096$, $h = 32$, $d = 128$); the next one draws both times.

# %%
gen_meta, gen_rows = measured.load("generations")
assert gen_meta["gpu"] == "NVIDIA H200", "the text's committed H200 run"
STEP_KERNELS = ("ropelib_naive", "ropelib_batch_reuse", "ropelib")
sweep = {(r["provider"], r["batch"]): r for r in gen_rows
         if r["group"] == "batch" and r["provider"] in STEP_KERNELS and r.get("fwdbwd_ms")}
batches = sorted({b_ for _, b_ in sweep})
ratio = {k: r["fwdbwd_ms"] / r["fwd_ms"] for k, r in sweep.items()}
print(f"{measured.where(gen_meta)}: bf16 sbhd s=4096, h=32, d=128; forward+backward step / "
      "forward")
print(f"{'kernel':20}" + "".join(f"{'b=' + str(b_):>8}" for b_ in batches))
for k in STEP_KERNELS:
    print(f"{k:20}" + "".join(f"{ratio[(k, b_)]:8.2f}" for b_ in batches))
gen = next(r for r in gen_rows if r["provider"] == "ropelib_batch_reuse"
           and r["case"] == "reference")
n_x = gen["seq_len"] * gen["batch"] * gen["heads"] * gen["head_dim"] * 2      # bf16 bytes of x
print(f"reference case [{gen['seq_len']}, {gen['batch']}, {gen['heads']}, {gen['head_dim']}] "
      f"({n_x / 2**30:.0f} GiB), ropelib_batch_reuse: {gen['fwdbwd_ms'] / gen['fwd_ms']:.2f}")
assert n_x == 2**30 and gen["dtype"] == "bf16"
assert f"{gen['fwdbwd_ms'] / gen['fwd_ms']:.2f}" == "2.00"   # the backward: the forward's time
large = [v for (k, b_), v in ratio.items() if b_ >= 4]
assert batches == [1, 2, 4, 8, 16] and len(large) == 9
assert round(min(large), 2) == 1.97, "the text's 1.97 forwards a step, from batch 4 up"
assert round(max(large), 2) == 2.01, "the text's 2.01 forwards a step, from batch 4 up"
# not monotonic: the batch-reusing kernel's step at batch 1 takes longer than at batch 4
br1, br2, br4 = (sweep[("ropelib_batch_reuse", b_)] for b_ in (1, 2, 4))
print(f"ropelib_batch_reuse step: batch 1 {br1['fwdbwd_ms'] * 1e3:.0f} µs, batch 4 "
      f"{br4['fwdbwd_ms'] * 1e3:.0f} µs (4x the bytes); forward: batch 1 "
      f"{br1['fwd_ms'] * 1e3:.1f} µs, batch 2 {br2['fwd_ms'] * 1e3:.1f} µs (2x the bytes)")
assert round(br1["fwdbwd_ms"] * 1e3) == 427, "the text's 427 µs step at batch 1"
assert round(br4["fwdbwd_ms"] * 1e3) == 207, "the text's 207 µs step at batch 4"
assert round(br1["fwd_ms"] * 1e3, 1) == 84.6, "the text's 84.6 µs forward at batch 1"
assert round(br2["fwd_ms"] * 1e3, 1) == 84.7, "the text's 84.7 µs forward at batch 2"
# the batch-1 forward against the cost of starting its programs (notebook 03, section 4): an
# empty kernel of a million one-warp programs on the same GPU, per program and SM
cost_meta, cost_rows = measured.load("program_cost")
assert cost_meta["gpu"] == gen_meta["gpu"], "the cost per program: measured on the same GPU"
empty = next(r for r in cost_rows if r["kernel"] == "empty" and r["num_warps"] == 1)
programs = br1["seq_len"] * br1["heads"]                              # the grid (S, H)
start_us = programs * empty["ns_per_program_per_sm"] / empty["sms"] / 1e3
print(f"batch 1: {programs:,} programs x {empty['ns_per_program_per_sm']:.1f} ns / "
      f"{empty['sms']} SMs = {start_us:.1f} µs just to start them: "
      f"{start_us / (br1['fwd_ms'] * 1e3):.2f} of the forward's {br1['fwd_ms'] * 1e3:.1f} µs")
assert programs == 131_072, "the text's 131,072 programs at batch 1"
assert round(start_us, 1) == 79.2, "the text's 79.2 µs to start them"
assert round(start_us / (br1["fwd_ms"] * 1e3), 2) == 0.94

# %% [markdown]
# From batch 4 up the step takes 1.97 to 2.01 forwards, as the bytes predict. Below, it does
# not: at batches 1 and 2 it takes 2.67 to 6.62 forwards, and the batch-reusing kernel's step
# takes 427 µs at batch 1 against 207 µs at batch 4, with a quarter of the bytes. Its batch-1
# forward looks set by its programs, not its bytes: twice the bytes at batch 2 take the same
# 84.7 µs, and at the rate an empty kernel's one-warp programs start on the same GPU (notebook
# 03, section 4.3) its 131,072 programs take 79.2 µs of the forward's 84.6 µs just to start. That
# rate is an empty kernel's, timed apart: an estimate, not a measurement of this forward
# (notebook 04, appendix A.6, times both side by side on a GPU).
#
# Why a small-batch step takes more than two forwards, the sweep does not say. One possibility,
# which the sweep does not test: `do_bench` times between CUDA events around a call, so when the
# host takes longer to *enqueue* a step (to issue its kernels: autograd's Python, its device
# thread, the launches) than the GPU takes to run it, the wait can be timed too. Autograd runs
# the backward of CUDA tensors on a worker thread of its own, its *device thread*;
# `torch.autograd.set_multithreading_enabled(False)` turns it off, and the backward then runs on
# the calling thread.
#
# The committed host times are at another shape ($s = 1$, $b = 64$), from
# `benchmarks/autograd_host_probe.py`: each the best of 7 rounds of 200 calls back to back, with
# the device thread on and off. Three rows: ropelib's forward+backward; the same with its kernel
# launches removed (its own Python only); and a trivial `autograd.Function` (`empty_like` both
# ways, none of ropelib's code). Two H200 runs 44 minutes apart put ropelib's forward+backward at
# 125.7 and 184.7 µs, half again apart, and the trivial Function at 71.8 and 99.1. Two H100 runs
# of 2026-12-07 put them at 161.0 and 91.3 µs, and 88.1 and 57.8 (the first with Transformer
# Engine installed, the second without). So the host's cost differs between hosts and runs, on
# the same trivial Function by 1.4 times between the two H200 runs and 1.5 times between the
# two H100 runs; these runs do not say why. The next cell draws the H200 runs (the sweep's GPU)
# as a band: a best-of-rounds figure of those runs, for scale, not a measurement of these steps.

# %%
def autograd_host_log(path):
    """(header line, {variant: (host µs with autograd's device thread on, off)}) of a
    benchmarks/autograd_host_probe.py log: its markdown table, one row per variant."""
    compare.note_read(path)
    lines = path.read_text().splitlines()
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[1][:1].isdigit():
            rows[cells[0]] = (float(cells[1]), float(cells[2]))
    return next(l for l in lines if l.startswith("# NVIDIA")), rows


host = {}
for hhmm in ("1352", "1436"):
    head, host[hhmm] = autograd_host_log(
        measured.RESULTS / f"autograd_host-nvidia-h200-20261130-{hhmm}.log")
    assert head.startswith("# NVIDIA H200,") and "best of 7 rounds of 200 calls" in head
print(f"{head[2:].split(';')[0]}, 2026-11-30 13:52 and 14:36 UTC; host µs per forward+backward, "
      "s=1 b=64 h=32 d=128 bf16 (device thread on / off)")
HOST_ROWS = {"trivial Function: forward+backward": "a trivial autograd.Function",
             "ropelib: forward+backward, launches removed": "ropelib, launches removed",
             "ropelib: forward+backward": "ropelib"}
for key, label in HOST_ROWS.items():
    print(f"  {label:28s}" + "".join(f"{hhmm[:2]}:{hhmm[2:]} {on:6.1f} / {off:5.1f}    "
                                     for hhmm, (on, off) in ((h, host[h][key]) for h in host)))
late = host["1436"]
assert late["ropelib: forward+backward"] == (184.7, 89.8), "the text's 184.7 and 89.8 µs"
assert late["trivial Function: forward+backward"] == (99.1, 46.2), "the text's 99.1 and 46.2 µs"
assert late["ropelib: forward+backward, launches removed"][0] == 159.1, "the text's 159.1 µs"
assert host["1352"]["ropelib: forward+backward"][0] == 125.7, "the text's 125.7 µs"
host_lo, host_hi = (host[h]["ropelib: forward+backward"][0] for h in ("1352", "1436"))
# the same probe on two H100 hosts, 2026-12-07 (08:20 and 09:26 UTC)
host_h100 = {}
for hhmm in ("0820", "0926"):
    head_h100, host_h100[hhmm] = autograd_host_log(
        measured.RESULTS / f"autograd_host-nvidia-h100-80gb-hbm3-20261207-{hhmm}.log")
    assert head_h100.startswith("# NVIDIA H100 80GB HBM3,"), head_h100
    assert "best of 7 rounds of 200 calls" in head_h100
    assert ("TE installed" if hhmm == "0820" else "TE not installed") in head_h100
print(f"{head_h100[2:].split(',')[0]}, 2026-12-07 08:20 (TE installed) and 09:26 (not) UTC; "
      "the same probe and shape")
for key, label in HOST_ROWS.items():
    print(f"  {label:28s}" + "".join(f"{hhmm[:2]}:{hhmm[2:]} {on:6.1f} / {off:5.1f}    "
                                     for hhmm, (on, off) in ((h, host_h100[h][key])
                                                             for h in host_h100)))
assert [host_h100[h]["ropelib: forward+backward"][0] for h in ("0820", "0926")] == [161.0, 91.3]
trivial_h100 = [host_h100[h]["trivial Function: forward+backward"][0] for h in ("0820", "0926")]
assert trivial_h100 == [88.1, 57.8] and round(trivial_h100[0] / trivial_h100[1], 1) == 1.5
fin1 = sweep[("ropelib", 1)]                         # the finished kernel's step at batch 1
print(f"the sweep, ropelib at batch 1: step {fin1['fwdbwd_ms'] * 1e3:.1f} µs, two forwards "
      f"{2 * fin1['fwd_ms'] * 1e3:.1f} µs; the H200 probe's host time of its step: "
      f"{host_lo:.1f} to {host_hi:.1f} µs")
assert (round(fin1["fwdbwd_ms"] * 1e3, 1), round(fin1["fwd_ms"] * 1e3, 1)) == (147.6, 22.3)
assert host_lo < fin1["fwdbwd_ms"] * 1e3 < host_hi, "the step lies inside the host's band"
assert round(sweep[("ropelib", 2)]["fwdbwd_ms"] * 1e3, 1) == 218.4, "the text's 218.4 µs"
assert round(2 * fin1["fwd_ms"] * 1e3, 1) == 44.6, "the text's 44.6 µs of device work"
assert round(host_hi / host_lo, 1) == 1.5, "the two runs: half again"
trivial_on, trivial_off = late["trivial Function: forward+backward"]
assert round((trivial_on - trivial_off) / trivial_on, 1) == 0.5, "about half: the thread"
teach = [sweep[(k, b_)] for k in STEP_KERNELS[:2] for b_ in (1, 2)]   # the teaching kernels
assert [round(min(r["fwdbwd_ms"] for r in teach) * 1e3),
        round(max(r["fwdbwd_ms"] for r in teach) * 1e3)] == [224, 486], "the text's 224 to 486"
assert all(r["fwdbwd_ms"] * 1e3 > max(host_hi, 2 * r["fwd_ms"] * 1e3) for r in teach)

fig, ax = plt.subplots(figsize=(10, 4.2))
ax.axhspan(host_lo, host_hi, color="grey", alpha=0.2,
           label="host time of ropelib's forward+backward\n(probe at s=1 b=64, two H200 runs,\n"
                 "best of rounds)")
for k, colour in zip(STEP_KERNELS, ("tab:orange", "tab:blue", "tab:green")):
    fwd_us = [sweep[(k, b_)]["fwd_ms"] * 1e3 for b_ in batches]
    ax.plot(batches, fwd_us, "o--", color=colour, label=f"{k}: forward")
    ax.plot(batches, [sweep[(k, b_)]["fwdbwd_ms"] * 1e3 for b_ in batches], "s-", color=colour,
            label=f"{k}: forward + backward step")
    ax.plot(batches, [2 * u for u in fwd_us], ":", color=colour, alpha=0.6,
            label=f"{k}: 2 x forward (the bytes' prediction)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xticks(batches, [str(b_) for b_ in batches])
ax.set_xlabel("batch (s=4096, h=32, d=128, bf16)")
ax.set_ylabel("time, µs (do_bench median)")
ax.set_title(f"{gen_meta['gpu']}, {gen_meta['date'][:10]}: a step against two forwards",
             fontsize=9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()
fig.savefig(FIGURES / "06-step-vs-forward.png", dpi=110)
plt.show()

# %% [markdown]
# The band is drawn for scale only: its host times were measured at another shape, so where a
# step of these kernels falls against it says nothing of what fills that step. The curves
# themselves show the finished kernel's batch-1 step at 147.6 µs against 44.6 µs of device work
# (two forwards), and the teaching kernels' steps at batches 1 and 2 at 224 to 486 µs.
#
# On a GPU the next cell times the `ropelib_batch_reuse` step at batch 1 (the benchmark's
# provider: ropelib's copy of section 2's kernel, the cell's source as long as you have not edited
# it; a test keeps the two equal) from both sides. The
# device's: the whole call (`do_bench`), its kernels alone (`torch.profiler`), and the step
# replayed from a CUDA graph (launches the GPU replays without the host). The host's: 50 steps
# enqueued back to back without synchronising, so the clock sees the host enqueue the work;
# then again with autograd's device thread off.

# %%
import statistics, time
from ropelib.bench import suite
from ropelib.course import launch_queue, nb09_device_time


def host_phases(forward, leaves, grads, calls):
    """Host µs of `calls` steps enqueued back to back: the medians of the forward call and of
    torch.autograd.grad, the loop's time per step before the final synchronisation (enqueue)
    and after it (wall)."""
    sync = torch.cuda.synchronize if GPU else (lambda: None)
    fwd, bwd = [], []
    sync()
    t_start = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        out = compare.output_tuple(forward())
        t1 = time.perf_counter()
        torch.autograd.grad(out, leaves, grads)
        fwd.append(t1 - t0), bwd.append(time.perf_counter() - t1)
    t_enqueued = time.perf_counter()
    sync()
    t_done = time.perf_counter()
    return {"forward": statistics.median(fwd) * 1e6, "backward": statistics.median(bwd) * 1e6,
            "enqueue": (t_enqueued - t_start) / calls * 1e6,
            "wall": (t_done - t_start) / calls * 1e6}


cfg = (compare.Config(br1["seq_len"], br1["batch"], br1["heads"], br1["head_dim"], br1["dtype"])
       if GPU else compare.Config(4, 1, 2, 16, "bf16"))     # the committed batch-1 row, or tiny
case = compare.make_case(cfg, device)
prov = next(p for p in compare.providers() if p.name == "ropelib_batch_reuse")
gcase, leaves, grads = compare.fwdbwd_inputs(case, fill=0.5)   # no random draws (capture)
calls = {"forward": lambda: prov.fn(case),
         "step": compare.fwdbwd_step(lambda: prov.fn(gcase), leaves, grads)}
assert torch.equal(calls["forward"](), rope_batch_reuse(case.x, case.freqs))
assert torch.equal(calls["step"]()[0], rope_batch_reuse(grads[0], case.freqs, backward=True))


def measure_host():
    return host_phases(lambda: prov.fn(gcase), leaves, grads, 50 if GPU else 2)


host_us = measure_host()                                 # before the profiler runs in this process
host_1t = launch_queue.one_thread(lambda _: measure_host())(None)   # autograd's thread off
if GPU:
    whole = {k: compare.time_ms(f, device)[0] * 1e3 for k, f in calls.items()}
    # the kernels' own device time, each call after the same L2 flush as do_bench's
    busy = {k: nb09_device_time.device_ms_or_none(f, device) for k, f in calls.items()}
    busy = None if None in busy.values() else {k: ms * 1e3 for k, ms in busy.items()}
    # 20 calls replayed from one CUDA graph, back to back, without do_bench's cache flush, so
    # some bytes may come from L2; the replay also spans the device's gaps between kernels
    try:
        replayed = {k: suite.graph_replay_ms(f, 20, device)[0] * 1e3 for k, f in calls.items()}
    except RuntimeError as err:          # a build where this route cannot be captured
        replayed = None
        print(f"not captured in a CUDA graph here ({str(err)[:150]})")
assert 0 < host_us["enqueue"] <= host_us["wall"] and min(host_1t.values()) > 0
if GPU:
    print(f"{torch.cuda.get_device_name()}, live, ropelib_batch_reuse, bf16 "
          f"[{cfg.seq_len}, {cfg.batch}, {cfg.heads}, {cfg.head_dim}], µs:")
    for k in calls:
        print(f"  {k:8s} whole call (do_bench) {whole[k]:7.1f}"
              + (f" | its kernels (profiler) {busy[k]:7.1f}" if busy else "")
              + (f" | replayed (graph) {replayed[k]:7.1f}" if replayed else ""))
    print(f"  host, per step back to back: forward call {host_us['forward']:.1f}, autograd.grad "
          f"{host_us['backward']:.1f} ({host_1t['backward']:.1f} with the device thread off); "
          f"enqueued in {host_us['enqueue']:.1f}, done in {host_us['wall']:.1f} (wall)")
    for k in (calls if busy else ()):   # kernels fit inside the events around them (5 %: timers)
        assert busy[k] <= 1.05 * whole[k], f"{k}: kernels {busy[k]:.1f} > whole {whole[k]:.1f}"
    if busy:
        idle = {k: whole[k] - busy[k] for k in calls}   # the device waiting inside the events
        print(f"  step kernels = {busy['step'] / busy['forward']:.2f}x the forward's (the bytes "
              f"predict 2); device idle inside do_bench's events: step {idle['step']:.1f} "
              f"({idle['step'] / whole['step']:.0%}), forward {idle['forward']:.1f} "
              f"({idle['forward'] / whole['forward']:.0%})")
    excess = whole["step"] - 2 * whole["forward"]      # the step beyond two forwards' time
    if excess <= 0.1 * 2 * whole["forward"]:
        print(f"  step = {whole['step'] / whole['forward']:.2f} forwards (do_bench): within 10 % "
              "of two, so do_bench did not see the host")
    elif busy:
        host_share = (idle["step"] - 2 * idle["forward"]) / excess
        print(f"  step = {whole['step'] / whole['forward']:.2f} forwards; the device idle inside "
              f"the events accounts for {host_share:.2f} of the {excess:.1f} µs beyond two: "
              + ("above one half, the host fills it" if host_share > 0.5 else
                 "under one half, the device's own work does"))
    if replayed:
        device_x = replayed["step"] / replayed["forward"]
        # the step's kernels after a flush (the profiler's sum) against the replayed step
        kernels_vs_replay = busy["step"] - replayed["step"] if busy else None
        print(f"  replayed step = {device_x:.2f}x the replayed forward"
              + (f"; the step's kernels (profiler, after a flush) take "
                 f"{abs(kernels_vs_replay):.1f} µs "
                 f"{'more' if kernels_vs_replay >= 0 else 'less'} than the replayed step"
                 if busy else ""))
        assert 1.9 < device_x < 2.1, "on the device, a step should be two forwards' work"
        # the reading below the cell: the host's enqueue per step against the device's work
        print(f"  a loop of steps: enqueued in {host_us['enqueue']:.1f} µs a step against a "
              f"replayed step of {replayed['step']:.1f}: "
              + (f"the enqueue is the longer, so the loop waits on the host (done in "
                 f"{host_us['wall']:.1f})" if host_us["enqueue"] > replayed["step"] else
                 "the replayed step is the longer, so the device sets the pace"))
else:
    print(f"interpreter, bf16 [{cfg.seq_len}, {cfg.batch}, {cfg.heads}, {cfg.head_dim}]: the "
          "forward and the step match ropelib's launcher; the whole call, the replay and the "
          "host's phases are timed on a GPU only")

# %% [markdown]
# **How to read it.** The replayed step is the device's work alone; *enqueued in* is the host's
# time per step. Where the enqueue is the longer, a loop of steps waits on the host: its *done
# in* (wall) follows the enqueue, and the device idles for the difference. Where it is the
# shorter, the device sets the pace. The cell's last line, `a loop of steps`, applies this
# reading wherever the step could be replayed from a graph.
#
# `do_bench` need not show that wait: the *memset* (a 256 MiB buffer zeroed) that flushes the L2
# cache before each call can let the host get ahead (notebook 07, A.4). So *do_bench did not see
# the host* on the `step =` line says nothing of a loop of steps; the `a loop of steps` line
# does. Where the step exceeds two forwards by more than 10 %, the `step =` line prints the share
# of the excess the device sat idle inside the events; above one half, the host fills it.
#
# The `replayed step =` line also sets the step's kernels (the profiler's sum of their
# durations, each call after a flush) beside the replayed step, and says by how many µs they
# take more or less than it. Either can be the longer: the replay skips the flush, so some of its
# bytes may come from L2, but it also spans the device's gaps between the step's kernels, which
# the profiler's sum leaves out.
#
# The cell's host times are this process's, on this host, measured before its profiler runs;
# they are not the probe's best of rounds and may be far higher than the band above.
#
# The cell reads its own GPU on the day it runs. The H100 run on this notebook's page found a loop
# of its steps host-bound, though `do_bench` did not show it. On the device the step was two
# forwards' work: its kernels took 160.6<!--page: its kernels (profiler)--> µs
# (2.00<!--page: step kernels =--> times the forward's) and its replay
# 161.7<!--page: replayed (graph)--> µs (2.00<!--page: replayed step =--> times), the replay the
# longer. `do_bench` timed the whole call at 166.2<!--page: step whole call (do_bench)--> µs,
# 1.96<!--page: step =--> forwards, with the device idle for
# 3<!--page: device idle inside do_bench's events--> % of it: within 10 % of two, so the `step =`
# line found no host in it. Yet a loop of steps was enqueued at 268.1<!--page: a loop of steps--> µs
# a step, longer than the 161.7<!--page: a loop of steps--> µs replay, so the loop waited on the
# host (done in 269.5<!--page: a loop of steps--> µs). So at this shape the host's enqueue outlasted
# the device's work, as the hypothesis for the committed H200 step of 427 µs needs, but this run's
# `do_bench` did not time the wait, which the hypothesis supposes its 427 µs includes: the run
# neither confirms nor refutes it, and no host time was measured beside the H200 run.

# %% [markdown]
# ## 4. `gradcheck` in float64
#
# `torch.autograd.gradcheck` compares the backward with finite differences,
# $\big(f(x + \varepsilon e_i) - f(x - \varepsilon e_i)\big) / 2\varepsilon$, for every input
# element $i$: two forward calls per element, so keep the shapes tiny.
#
# Why float64: with $\varepsilon = 10^{-6}$ two outputs differ by $2\varepsilon$ times an entry of
# $J$, a change in the sixth decimal place of numbers near 1. fp32 rounds an output $y$ by up to
# $2^{-24}|y| \approx 6 \times 10^{-8}\,|y|$; two such roundings, divided by $2\varepsilon$, move
# the finite difference by up to $2 \cdot 6 \times 10^{-8}\,|y| / (2 \times 10^{-6}) \approx
# 0.06\,|y|$, and rounding $x \pm \varepsilon$ itself adds errors of the same order: percents, far
# beyond gradcheck's relative 0.1 % (`rtol=1e-3`). The cell's last line measures it (up to
# 0.0748<!--page: finite differences--> on the H100 run on this notebook's page). So ropelib's
# kernels compute in fp64 when given fp64 (`COMPUTE_DTYPE`).
#
# The cell runs gradcheck on the cell's kernel and on `ropelib.apply_rope`, then on the same op
# computed in fp32, which fails. `ropelib.apply_rope` is also checked on a table whose halves
# differ: on TE's table a backward that negates the sines without swapping them is right, so only
# the second table can catch a missing swap.

# %%
x_small = torch.randn(3, 2, 1, 8, device=device, dtype=torch.float64, requires_grad=True)
f_small = ex.te_angles(3, 8, device=device)
assert torch.autograd.gradcheck(RopeFunction.apply, (x_small, f_small), eps=1e-6, atol=1e-8)
print("gradcheck (float64): passed")

# the finished kernel of notebook 05, through ropelib's autograd
assert torch.autograd.gradcheck(lambda t: ropelib.apply_rope(t, f_small, layout="sbhd"),
                                (x_small,), eps=1e-6, atol=1e-8)
print("gradcheck of ropelib.apply_rope (the finished kernel), TE's table: passed")
f_halves = torch.rand(3, 1, 1, 8, device=device) * 6 - 3      # per feature: the halves differ
assert torch.autograd.gradcheck(lambda t: ropelib.apply_rope(t, f_halves, layout="sbhd"),
                                (x_small,), eps=1e-6, atol=1e-8)
print("gradcheck of ropelib.apply_rope, a table whose two halves differ: passed")

# Could that second gradcheck fail? A backward that negated the sines without swapping them
# would be the forward at -theta: the matrix J(-theta) where J(theta)^T belongs. gradcheck
# compares the transpose of the backward's matrix with its finite differences (~ J(theta)),
# entry by entry; the reference's autograd measures that gap on both tables.
def full_jacobian(f):
    """[N, N] d y / d x of the reference at the angles f, N = x_small.numel()."""
    return torch.autograd.functional.jacobian(
        lambda v: reference.rope_reference(v.view_as(x_small), f).flatten(),
        x_small.detach().flatten())


negate_only_err = {}
for name, f in (("TE's table", f_small), ("halves differ", f_halves)):
    negate_only_err[name] = (full_jacobian(-f).T - full_jacobian(f)).abs().max().item()
    print(f"  negated, unswapped sines: the backward's entries up to {negate_only_err[name]:.2e} "
          f"away from J's, {name}")
assert negate_only_err["TE's table"] < 1e-12     # TE's table cannot tell the two apart
# entries of J are at most 1 in size and gradcheck allows 1e-8 + 1e-3 x |entry|: caught
assert negate_only_err["halves differ"] > 1e-2


class RopeInFp32(torch.autograd.Function):
    """The same op computed in fp32 and cast back: what gradcheck sees from an fp32-only kernel."""

    @staticmethod
    def forward(ctx, x, freqs):
        ctx.save_for_backward(freqs)
        return rope_cell(x.float(), freqs).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        (freqs,) = ctx.saved_tensors
        return rope_cell(grad_y.float(), freqs, backward=True).to(grad_y.dtype), None


fp32_ok = torch.autograd.gradcheck(RopeInFp32.apply, (x_small, f_small), eps=1e-6, atol=1e-8,
                                   raise_exception=False)
print("gradcheck of the same op computed in fp32:", "passed" if fp32_ok else "FAILED (as expected)")
assert not fp32_ok


def finite_differences(x0, eps=1e-6):
    """[N, N]: column i is (f(x0 + eps e_i) - f(x0 - eps e_i)) / (2 eps), f = section 2's
    forward at the angles f_small, N = x0.numel(); computed in x0's dtype."""
    steps = torch.eye(x0.numel(), dtype=x0.dtype, device=x0.device) * eps
    return torch.stack([((rope_cell(x0 + e.view_as(x0), f_small)
                          - rope_cell(x0 - e.view_as(x0), f_small)) / (2 * eps)).flatten()
                        for e in steps], dim=1)


fd64 = finite_differences(x_small.detach())
fd32 = finite_differences(x_small.detach().float()).double()
fd_err = (fd32 - fd64).abs().max().item()
print(f"finite differences with eps = 1e-6 in fp32: up to {fd_err:.4f} away from fp64's, "
      "where no entry of J exceeds 1 in size")
assert fd_err > 1e-2       # percent-level: ten times gradcheck's rtol=1e-3, at the least

# %% [markdown]
# ## 5. Stride-0 tensors from `sum` and `expand`
#
# Autograd does not promise a contiguous $\partial L/\partial y$, and a caller does not promise a
# contiguous $x$. Two everyday cases hand a RoPE kernel a tensor whose elements **overlap** in
# memory (stride 0):
#
# - `loss = y.sum()` hands the **backward** `torch.ones(()).expand(y.shape)`: a single 1, every
#   stride 0. TE's tests call this the "overlapping" loss;
# - `expand` hands the **forward** a stride-0 $x$ (the same query for every beam, say); autograd
#   then sums the backward's $B$ slices back into the un-expanded tensor.
#
# A kernel that assumes contiguity (offsets `row * D`) reads past the end of a one-element
# buffer. Section 2's kernel takes every stride, so it reads the stride-0 tensor as it is, with
# no `.contiguous()` copy. What a backward must never do is write **into** such a tensor: all its
# elements are one memory cell. `rope_cell` always allocates its output; ropelib's launchers
# refuse a non-contiguous `out=`:

# %%
seen = []


class RopeFunctionSpy(RopeFunction):
    @staticmethod
    def backward(ctx, grad_y):
        seen.append(grad_y.stride())
        return RopeFunction.backward(ctx, grad_y)


xq = x.clone().requires_grad_()
RopeFunctionSpy.apply(xq, freqs).sum().backward()
print("strides of dL/dy for loss = y.sum():", seen[-1])
assert all(st == 0 for st in seen[-1])
ones = torch.ones(S, B, H, D, device=device, dtype=torch.float64)
x64 = x.double().requires_grad_()
(g_sum_ref,) = torch.autograd.grad(reference.rope_reference(x64, freqs), x64, ones)
torch.testing.assert_close(xq.grad, g_sum_ref.float(), atol=1e-5, rtol=1e-5)

try:
    g0 = torch.ones((), device=device).expand(S, B, H, D)
    rope_batch_reuse(g0, freqs, backward=True, out=g0)
    raise AssertionError("writing into a stride-0 tensor must be refused")
except ValueError as exc:
    print("refused:", exc)

# the same query for every batch entry: x_base [S, 1, H, D] expanded to [S, B, H, D]
x_base = torch.randn(S, 1, H, D, device=device, requires_grad=True)
x_exp = x_base.expand(S, B, H, D)
assert x_exp.stride(1) == 0
y_exp = RopeFunction.apply(x_exp, freqs)
torch.testing.assert_close(y_exp, reference.rope_reference(x_exp.detach(), freqs),
                           atol=1e-5, rtol=1e-5)
y_exp.backward(g)
# autograd sums the B gradients: dL/dx_base = sum_b R^T g[:, b]
torch.testing.assert_close(x_base.grad, gx_ref.float().sum(dim=1, keepdim=True),
                           atol=1e-4, rtol=1e-5)
print("expanded input: forward reads stride 0, backward's gradients summed over the batch")

# %% [markdown]
# How much does reading the stride-0 gradient as it is save? The kernel reads one 4-byte cell for
# all $N$ elements and writes $N$ fp32 elements: $4N$ bytes. With `.contiguous()` first, the copy
# writes $4N$ bytes and the kernel reads them back before writing its own $4N$: three times the
# traffic, so 3x the time at the same GB/s.
#
# The next cell checks the parts in the interpreter (section 2.1's small shape, fp32): the
# loads of $\partial L/\partial y$ move $4N$ bytes either way, but hit 4 distinct bytes as it is
# and $4N$ after the copy.
#
# On a GPU it then times, through `rope_cell` (the cell's kernel at ropelib's one warp), the kernel
# on `g_sum` as it is, `.contiguous()` then the kernel, and that path's two pieces apart. It
# prints each call's GB/s under the model's bytes and the copy's cost as a multiple of the as-is
# time, and names the pieces more than 5 % below the as-is kernel's GB/s: those push the
# multiple above 3 (appendix A profiles `g_sum.contiguous()`).

# %%
g_sum = torch.ones((), device=device).expand(S, B, H, D)     # dL/dy of loss = y.sum()
g_c = g_sum.contiguous()                                      # made once, outside any timing
n = g_sum.numel()
print(f"g_sum: {n:,} fp32 elements in {g_sum.untyped_storage().nbytes()} bytes of memory; "
      f"g_sum.contiguous(): {g_c.untyped_storage().nbytes():,} bytes")
assert g_sum.untyped_storage().nbytes() == 4 and g_c.untyped_storage().nbytes() == 4 * n

g_sum_r = torch.ones(()).expand(shape_r)                      # section 2.1's small shape, fp32
seen_r = {"g_sum as it is": recorded_bytes(g_sum_r, table_r, backward=True),
          "g_sum.contiguous()": recorded_bytes(g_sum_r.contiguous(), table_r, backward=True)}
print(f"recorded in the interpreter, fp32 [{', '.join(map(str, shape_r))}] ({n_r} elements):")
for name, c in seen_r.items():
    print(f"  kernel on {name:19s} loads of dL/dy: {c['in'][1]:5d} bytes moved, "
          f"{c['in'][2]:5d} distinct | stores: {c['out'][2]:5d} bytes")
assert seen_r["g_sum as it is"]["in"][1:] == (4 * n_r, 4), "4N bytes read from one 4-byte cell"
assert seen_r["g_sum.contiguous()"]["in"][1:] == (4 * n_r, 4 * n_r)
assert seen_r["g_sum as it is"]["out"] == seen_r["g_sum.contiguous()"]["out"]

calls5 = {  # name: (the call a GPU times, the bytes it moves by the model)
    "read as it is": (lambda: rope_cell(g_sum, freqs, backward=True), 4 * n),
    ".contiguous() first": (lambda: rope_cell(g_sum.contiguous(), freqs, backward=True), 12 * n),
    "g_sum.contiguous() alone": (lambda: g_sum.contiguous(), 4 * n),
    "kernel on contiguous dL/dy": (lambda: rope_cell(g_c, freqs, backward=True), 8 * n),
}
grads5 = {name: call() for name, (call, _) in calls5.items() if name != "g_sum.contiguous() alone"}
for t_ in (rope_batch_reuse(g_sum, freqs, backward=True), *grads5.values()):   # ropelib's too
    torch.testing.assert_close(t_, grads5["read as it is"], atol=1e-6, rtol=1e-6)
assert torch.equal(calls5["g_sum.contiguous() alone"][0](), g_c)
assert default_num_warps(triton.next_power_of_2(D // 2)) == 1, "ropelib's launch: one warp"
del grads5
print("the same gradient on every path, and from ropelib's copy of the kernel")

if GPU:
    from triton.testing import do_bench
    ms5 = {name: do_bench(call) for name, (call, _) in calls5.items()}
    gbps5 = {name: nbytes / ms5[name] / 1e6 for name, (_, nbytes) in calls5.items()}
    print(f"{torch.cuda.get_device_name()}, N = {n:,} fp32 elements, the cell's kernel "
          f"(num_warps={default_num_warps(triton.next_power_of_2(D // 2))})")
    for name, (_, nbytes) in calls5.items():
        print(f"  {name:27s} {ms5[name] * 1e3:7.1f} µs for {nbytes / 1e6:5.0f} MB -> "
              f"{gbps5[name]:5.0f} GB/s, {gbps5[name] / gbps5['read as it is']:.2f} of the "
              "as-is kernel's")
    copy_x = ms5[".contiguous() first"] / ms5["read as it is"]
    pieces = ms5["g_sum.contiguous() alone"] + ms5["kernel on contiguous dL/dy"]
    print(f"  the copy costs {copy_x:.2f}x the time (the byte model: 3x); its two pieces take "
          f"{pieces * 1e3:.1f} µs together")
    slow = [name for name in ("g_sum.contiguous() alone", "kernel on contiguous dL/dy")
            if gbps5[name] < 0.95 * gbps5["read as it is"]]          # a margin for noise
    print("  pieces more than 5 % below the as-is kernel's GB/s:", ", ".join(slow) or "neither")
    assert copy_x > 2.5, "the copy adds two passes over N"
    assert abs(pieces - ms5[".contiguous() first"]) < 0.1 * ms5[".contiguous() first"], \
        "the two pieces should account for the copied path"
else:
    print("timed on a GPU only (the interpreter's times say nothing of memory traffic)")

# %% [markdown]
# On the H100 run on this notebook's page the copied path took 3.66<!--page: the copy costs--> times
# the as-is time, more than the byte model's 3<!--page: the byte model-->. The kernel on a
# contiguous $\partial L/\partial y$ ran at 0.99<!--page: kernel on contiguous dL/dy--> of the as-is
# kernel's GB/s, but `g_sum.contiguous()` alone at 0.61<!--page: g_sum.contiguous() alone-->: the
# copy itself is the slow piece, and appendix A sets it beside a fill of the same bytes on the H200.

# %% [markdown]
# ## 6. Summary, and the finished kernel
#
# - The backward of RoPE is the transpose of its Jacobian: swap and negate the sines. With TE's
#   `cat(f, f)` table that is the rotation by $-\theta$, which undoes the forward; with halves
#   that differ the block is no rotation and its transpose is not its inverse. The backward is
#   linear, so it needs only the angles: save `freqs`, never `x`.
# - One kernel serves both directions: a `tl.constexpr` flag swaps and negates the sines;
#   everything else, the bytes moved included, is shared.
# - Check a backward three ways: against a plain PyTorch reference's autograd, with `gradcheck`
#   in float64, and with stride-0 tensors (the gradient of `y.sum()`, an input built with
#   `expand`).
# - A training step is two forwards of device work: from batch 4 up the committed H200 steps take
#   1.97 to 2.01 forwards. Below, a step through autograd took longer; section 3.1's live cell times
#   host and device on its GPU (on the H100 run on this notebook's page, a batch-1 step's kernels
#   took 2.00<!--page: step kernels =--> forwards' time and `do_bench` timed the step at
#   1.96<!--page: step =--> forwards, yet the host's enqueue set the pace of a loop of steps).
# - One warp a program beats four at $D = 128$: with four, each element sits on two threads with
#   loads and stores of its own, 2.85 times the instructions for the same bytes in 1.62 times the
#   H200's time under the profiler (1.59 timed), profiled and timed as notebook 04's ablation
#   variants of this kernel. One warp still reaches only 0.71 of a copy on the H200 (0.80 on the
#   H100).
#
# ropelib's finished kernel (notebook 05) serves both directions the same way; the cell below
# prints the paragraph of its header that states section 1's formulas.

# %%
from ropelib.kernels import fused

doc = fused.__doc__ or ""
start = doc.find("Forward rotates by +theta")
assert start >= 0, "the kernel header no longer states its forward/backward formulas"
# that paragraph, its two formulas and the sentence after them: three paragraphs
excerpt = "\n\n".join(doc[start:].split("\n\n")[:3])
assert "backward  g_a = y_a c_a + y_b s_b      g_b = y_b c_b - y_a s_a" in excerpt
assert " ".join(excerpt.split()).endswith("one kernel, one constexpr.")
print(excerpt)

# %% [markdown]
# ## Exercises
#
# Each check prints ✅ or ❌ and never stops the notebook. Replace the `...` (or the `pass`) and
# rerun the cell; the solution is folded away in the cell after each exercise. The checks refuse
# an answer that calls `ropelib.apply_rope`, `ropelib.reference`, a teaching kernel where the
# exercise asks for yours, ropelib's `@triton.jit` helpers (`round_to` too: store with
# `.to(y_ptr.dtype.element_ty)`) or a worked solution, even when its numbers are right.
#
# **1.** For one pair rotated by `theta`, return the $2\times 2$ matrix $M$ with
# $\partial L/\partial x = M\,\partial L/\partial y$.

# %%
def my_backward_matrix(theta):
    ...  # your code: a torch tensor [2, 2]


ex.check_backward_matrix(my_backward_matrix);

# %%
solution(ex.solution_backward_matrix)

# %% [markdown]
# **2. The backward kernel.** Write it from a blank `@triton.jit`. The signature is notebook 04's
# exercise 4, renamed for gradients, with partial rotary: only the first $R \le D$ features of a
# head rotate, and the table holds $R$ angles a position. The kernel runs on the grid $(S, H)$,
# each program looping over the batch, and writes
# $\partial L/\partial x = R(\theta)^{\top}\,\partial L/\partial y$ for the rotated features;
# features $R \ldots D-1$ pass their gradient through unchanged.
#
# The check launches your kernel on fresh gradients (TE's table and one whose halves differ,
# stride 0, non-contiguous, partial rotary, fp16) into an output filled with NaN, and compares
# with the autograd of `ropelib.reference`.

# %%
@triton.jit
def my_backward_kernel(
    gy_ptr,  # *dL/dy: input [S, B, H, D], any strides (stride 0 included)
    gx_ptr,  # *dL/dx: output [S, B, H, D], contiguous, same dtype as dL/dy
    freqs_ptr,  # *fp32: angles [S, R], contiguous; R = 2 * ROT_HALF <= D
    B,  # batch size: each program loops over it
    stride_gs, stride_gb, stride_gh, stride_gd,  # dL/dy strides, in elements
    stride_xs, stride_xb, stride_xh,  # dL/dx strides, in elements (last one == 1)
    D,  # head dim: gradients of features R..D-1 pass through unchanged
    ROT_HALF: tl.constexpr,  # R // 2: features in each rotated half
    BLOCK_HALF: tl.constexpr,  # next power of two >= ROT_HALF
    BLOCK_PASS: tl.constexpr,  # next power of two >= D - R (1 when R == D)
):
    # launched on grid (S, H), as notebook 04's kernel: dL/dx = R(theta)^T dL/dy
    pass  # your code


backward_kernel.check_backward_kernel(my_backward_kernel);

# %%
backward_kernel.show_solution()

# %% [markdown]
# **3. Its launcher.** Write `my_rope_backward(grad_y, freqs)`: take `grad_y [S, B, H, D]` (any
# strides) and TE's table `freqs [P, 1, 1, R]` ($P \ge S$), allocate a contiguous `grad_x`,
# launch `my_backward_kernel` into it on the grid $(S, H)$ and return it. The kernel reads the
# angles as a contiguous fp32 `[S, R]`: hand it the table's first $S$ rows in that shape.
#
# The check calls your function on fresh gradients (one stride 0, one with rotary dim 16 of 24
# and a table longer than the sequence) and requires that the `grad_x` it returns is what
# `my_backward_kernel` wrote. `ropelib.apply_rope(grad_y, -freqs)`, `rope_batch_reuse(grad_y,
# freqs, backward=True)` and `rope_cell` compute the right numbers but are not your kernel, so
# the check refuses them (for `rope_cell` its message names `round_to`, the ropelib helper
# section 2's kernel calls).

# %%
def my_rope_backward(grad_y, freqs):
    ...  # your code


launcher_ok = ex.check_rope_backward(my_rope_backward, kernel=my_backward_kernel)

# %%
solution(ex.solution_rope_backward)

# %% [markdown]
# **Time it.** On a GPU the next cell times your launcher (the worked one until exercise 3's check
# passes) as section 2.1 did: beside a copy of $\partial L/\partial y$ and section 2's backward at
# four warps and at one, in bf16. The worked launcher runs at Triton's default of four warps:
# compare it with the four-warp line; if yours takes clearly longer, compare your loads and grid
# with section 2's kernel. Then launch yours with `num_warps=1` and compare with the one-warp line.
# (On the H100 run on this notebook's page the worked launcher took
# 329.5<!--page: backward (worked, num_warps=4)--> µs,
# 0.55<!--page: backward (worked, num_warps=4)--> of a copy, beside
# 326.9<!--page: backward (section 2's, num_warps=4)--> µs for section 2's kernel at four warps and
# 226.6<!--page: backward (section 2's, num_warps=1)--> µs at one.)

# %%
backward_timed = my_rope_backward if launcher_ok else ex.solution_rope_backward
print("backward timed:", "yours" if launcher_ok else "the worked one, until yours passes")
if GPU:
    from triton.testing import do_bench
    g_bf = g.to(torch.bfloat16)                                   # [S, B, H, D] bf16
    torch.testing.assert_close(backward_timed(g_bf, freqs), rope_cell(g_bf, freqs, backward=True))
    copy_out = torch.empty_like(g_bf)
    bwd = "backward (" + ("yours" if launcher_ok else "worked, num_warps=4") + ")"
    timed = {"copy of dL/dy": lambda: copy_out.copy_(g_bf),
             bwd: lambda: backward_timed(g_bf, freqs)}
    for w in (4, 1):
        timed[f"backward (section 2's, num_warps={w})"] = (
            lambda w=w: rope_cell(g_bf, freqs, backward=True, num_warps=w))
    ms = {name: do_bench(fn, quantiles=[0.5, 0.2, 0.8]) for name, fn in timed.items()}
    copy_ms = ms["copy of dL/dy"][0]
    print(f"{torch.cuda.get_device_name()}, dL/dy [{S}, {B}, {H}, {D}] bf16")
    for name, (med, lo, hi) in ms.items():
        print(f"  {name:35s} {med * 1e3:8.1f} µs (p20-p80 {lo * 1e3:.1f}-{hi * 1e3:.1f})  "
              f"{copy_ms / med:.2f} of a copy")
    assert all(copy_ms < 1.02 * med for med, _, _ in ms.values()), "a copy is the floor"
else:
    print("timed on a GPU only (the interpreter runs one program after another in Python)")

# %% [markdown]
# **4. The autograd Function.** Write `MyRope`, a `torch.autograd.Function` with
# `forward(ctx, x, freqs)` and `backward(ctx, grad_y)`, on your launcher of exercise 3. The
# backward is your launcher at `freqs`. The forward can be the same launcher at `-freqs`: your
# kernel computes $R(-\theta)^{\top} = R(\theta)$ there. That holds for TE's `cat(f, f)` table,
# which this notebook's `freqs` is; for halves that differ the transpose also swaps the sines
# (section 1), so the backward at `-freqs` is not the forward at `freqs`.
#
# The check compares $y$ and $\partial L/\partial x$ with the reference (also for `y.sum()`),
# refuses ropelib's kernels and `rope_cell` in both directions (the backward must launch
# `my_backward_kernel`), and checks that once `forward` has returned your Function keeps `freqs`
# and nothing else (not `x`, nor `-freqs`, nor cos/sin tables).

# %%
class MyRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, freqs):
        ...  # your code

    @staticmethod
    def backward(ctx, grad_y):
        ...  # your code


ex.check_rope_function(MyRope, kernel=my_backward_kernel);

# %%
solution(ex.SolutionRopeFunction)

# %% [markdown]
# **5. The backward for interleaved pairs.** GPT-J and RoFormer pair features $2j$ and $2j+1$
# (notebook 01), and a per-feature table gives each its own angle, $\theta_a$ for $2j$ and
# $\theta_b$ for $2j+1$:
# $y_{2j} = x_{2j}\cos\theta_a - x_{2j+1}\sin\theta_a$,
# $y_{2j+1} = x_{2j+1}\cos\theta_b + x_{2j}\sin\theta_b$. Derive its backward as section 1 did,
# and write it as a kernel on the grid $(S, H)$ that evaluates cos/sin once a program.
#
# The check launches your kernel in the interpreter on fresh gradients into an output filled with
# NaN, with the two angles of a pair equal and different, in fp32 and fp16. It compares with the
# autograd of `ropelib.reference` (`interleaved=True`) and counts the sines and cosines your
# kernel evaluates.

# %%
from ropelib.course.exercises import nb06_interleaved


@triton.jit
def my_interleaved_backward_kernel(
    gy_ptr,  # *dL/dy: input [S, B, H, D], contiguous
    gx_ptr,  # *dL/dx: output [S, B, H, D], contiguous, same dtype as dL/dy
    freqs_ptr,  # *fp32: angles [S, D], contiguous, one per feature (pair j: features 2j, 2j+1)
    B, H,  # batch size, heads
    HALF: tl.constexpr,  # D // 2: pairs in a head, a power of two
):
    # launched on grid (S, H): program (s, h) writes dL/dx[s, b, h, :] for every b
    pass  # your code


nb06_interleaved.check_interleaved_backward(my_interleaved_backward_kernel);

# %%
nb06_interleaved.show_interleaved_solution()

# %% [markdown]
# ## Questions for discussion
#
# 1. In section 3.1's committed H200 run the batch-reusing kernel's step takes 427 µs at batch 1
#    and 207 µs at batch 4, with four times the bytes. What does the host do in a step through
#    autograd that it does not do in a forward? On a GPU where the host explains such a step,
#    what would the live cell's enqueue and replayed step show, and why can `do_bench` still
#    report two forwards there?
# 2. With TE's `cat(f, f)` table, "negate the sines" and "swap and negate the sines" give the
#    same results. Why did ropelib keep the swap? What would break, and where would you notice?
# 3. `ctx.save_for_backward(freqs)` keeps a reference to a table shared by every layer. What
#    would `ctx.save_for_backward(cos, sin)` cost instead, in memory and in bytes moved by the
#    backward?
# 4. `gradcheck` fails for the same op computed in fp32. What does that say about testing a bf16
#    kernel's backward — which tolerance, against which reference?
# 5. A stride-0 `grad_y` is read as it is. Could the backward exploit that all its rows are
#    equal? Would it be worth a special case?

# %% [markdown]
# ## Appendix A. How `g_sum.contiguous()` differs from a fill (*a second reading*)
#
# The cell reads a committed H200 Nsight Compute profile of `g_sum.contiguous()` beside
# `buf.fill_(1.0)`, which writes the same bytes. Both put 509 MB into DRAM, but the copy stores 4
# bytes a thread per store against the fill's 16, executes 11.5 times its warp instructions,
# keeps 24 % of the warps resident against 88 %, and takes 2.75 times its time. These differences
# come together; which of them costs the time, the profile does not isolate. For a RoPE backward
# the remedy is section 5's either way: read the stride-0 gradient as it is.

# %%
ct_csv = measured.path("contiguous_ncu")
ct_meta = compare.read_meta(ct_csv)
assert ct_meta["gpu"] == "NVIDIA H200", "the text's H200 profile"
ct = dict(zip(("g_sum.contiguous()", "buf.fill_(1.0)"), measured.ncu_kernels(ct_csv)))
n_bytes_ct = 4 * 4096 * 8 * 32 * 128                               # 4N: what each kernel writes
ct_row = {}
for label, k in ct.items():
    m = k["metrics"]
    ct_row[label] = {"MB to DRAM": m["dram__bytes_write.sum"] / 1e6,
                     "µs": m["gpu__time_duration.sum"] / 1e3,
                     "B/thread/store": n_bytes_ct / (m["smsp__sass_inst_executed_op_global_st.sum"]
                                                     * 32),
                     "warp instr. M": m["smsp__inst_executed.sum"] / 1e6,
                     "warps resident %": m["sm__warps_active.avg.pct_of_peak_sustained_active"]}
print(f"{ct_csv.name}: {measured.where(ct_meta)}")
print(f"{'':20s}" + "".join(f"{c:>18s}" for c in ct_row["buf.fill_(1.0)"]))
for label, r in ct_row.items():
    print(f"{label:20s}" + "".join(f"{v:18.1f}" for v in r.values()))
con, fil = ct_row["g_sum.contiguous()"], ct_row["buf.fill_(1.0)"]
assert "elementwise_kernel<128, 2" in ct["g_sum.contiguous()"]["kernel"]
assert ct["buf.fill_(1.0)"]["kernel"].startswith("void vectorized_elementwise_kernel<4")
assert round(con["MB to DRAM"]) == 509, "the text's 509 MB"
assert abs(con["MB to DRAM"] - fil["MB to DRAM"]) < 1, "the same bytes reach DRAM"
assert (con["B/thread/store"], fil["B/thread/store"]) == (4, 16), "the text's 4 and 16 bytes"
assert round(con["warp instr. M"] / fil["warp instr. M"], 1) == 11.5, "the text's 11.5x"
assert [round(r["warps resident %"]) for r in (con, fil)] == [24, 88], "the text's 24 and 88 %"
assert round(con["µs"] / fil["µs"], 2) == 2.75, "the text's 2.75x the fill's time"
