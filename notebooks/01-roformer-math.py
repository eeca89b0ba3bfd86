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
# # 01 — The RoFormer math: rotations that encode relative position
#
# Rotary position embedding (RoPE) comes from *RoFormer* (Su et al., 2021,
# [arXiv:2104.09864](https://arxiv.org/abs/2104.09864)). Instead of *adding* a position vector
# to a token, it *rotates* the query and key vectors by an angle proportional to the position.
# Everything the kernels in later notebooks do follows from the few lines of algebra here.
#
# **After this notebook you will be able to**
#
# - write the 2-D rotation and RoPE's block-diagonal rotation matrix $R_m$, and apply them;
# - read RoPE as a multiplication by $e^{i m\theta_j}$ of complex numbers;
# - show numerically that the attention score $\langle R_m q, R_n k\rangle$ depends only on $m-n$;
# - read the frequency spectrum $\theta_j = b^{-2j/d}$ as wavelengths, and see what the
#   context-extension scalings (linear, NTK, Llama 3, YaRN) do to it;
# - reproduce the long-term decay of the paper's Figure 2;
# - turn the interleaved pairing (GPT-J, RoFormer) into the rotate-half pairing (GPT-NeoX,
#   Llama, Transformer Engine) with a permutation.
#
# Nothing here needs a GPU: it is plain PyTorch in float64.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from ropelib import frequencies, reference
from ropelib.frequencies import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling

FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
torch.manual_seed(0)
f64 = torch.float64
print("device:", device, "| figures go to", FIGURES)

# %% [markdown]
# ## 1. A rotation in the plane
#
# A vector $(x_0, x_1)$ rotated by the angle $\alpha$ is
#
# $$
# R(\alpha)\begin{pmatrix}x_0\\x_1\end{pmatrix}
# = \begin{pmatrix}\cos\alpha & -\sin\alpha\\ \sin\alpha & \cos\alpha\end{pmatrix}
#   \begin{pmatrix}x_0\\x_1\end{pmatrix}
# = \begin{pmatrix}x_0\cos\alpha - x_1\sin\alpha\\ x_1\cos\alpha + x_0\sin\alpha\end{pmatrix}.
# $$
#
# Three facts carry the whole method: a rotation keeps lengths ($R^\top R = I$), rotations in
# the same plane add their angles ($R(\alpha)R(\beta) = R(\alpha+\beta)$), and so the transpose
# undoes one ($R(\alpha)^\top = R(-\alpha)$).
#
# RoPE rotates a token at position $m$ by $\alpha = m\theta$: position becomes an angle.

# %%
def rot2(alpha):
    """The 2x2 rotation matrix R(alpha), float64."""
    a = torch.as_tensor(alpha, dtype=f64)
    return torch.stack([torch.stack([a.cos(), -a.sin()]), torch.stack([a.sin(), a.cos()])])

a, b = 0.7, -2.1
assert torch.allclose(rot2(a).T @ rot2(a), torch.eye(2, dtype=f64))     # keeps lengths
assert torch.allclose(rot2(a) @ rot2(b), rot2(a + b))                  # angles add
assert torch.allclose(rot2(a).T, rot2(-a))                             # transpose = inverse

theta = 0.5
q = torch.tensor([1.0, 0.25], dtype=f64)
fig, ax = plt.subplots(figsize=(4.2, 4.2))
for m in range(6):
    v = rot2(m * theta) @ q
    ax.annotate("", xy=v.tolist(), xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color=plt.cm.viridis(m / 6), lw=2))
    ax.text(*(1.12 * v).tolist(), f"m={m}", ha="center", va="center", fontsize=9)
ax.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal",
       title=r"$R(m\theta)\,q$ for $\theta=0.5$: position as an angle")
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(FIGURES / "01-2d-rotation.png", dpi=120)
plt.show()

# %% [markdown]
# ![The same vector rotated by m·θ for positions m = 0..5](../figures/01-2d-rotation.png)

# %% [markdown]
# ## 2. The block-diagonal rotation matrix $R_m$
#
# A head has $d$ features. RoPE splits them into $d/2$ pairs and turns pair $j$ at its own
# speed $\theta_j$ (RoFormer eq. 13 and 15):
#
# $$
# R_m = \begin{pmatrix}
# R(m\theta_0) & & \\ & \ddots & \\ & & R(m\theta_{d/2-1})
# \end{pmatrix},
# \qquad \theta_j = b^{-2j/d},\ b = 10000 .
# $$
#
# In the paper the pairs are neighbours, $(x_{2j}, x_{2j+1})$: the **interleaved** layout.
# Multiplying by this sparse matrix would waste $d^2$ multiply-adds per token; the rotation is
# applied elementwise instead (eq. 34):
#
# $$
# R_m x = x \odot \cos(m\boldsymbol\theta) + \mathrm{rotate\_half}(x) \odot \sin(m\boldsymbol\theta),
# \qquad \mathrm{rotate\_half}(x) = (-x_1, x_0, -x_3, x_2, \dots),
# $$
#
# where $\boldsymbol\theta = (\theta_0,\theta_0,\theta_1,\theta_1,\dots)$ holds one angle per
# feature. That is exactly `ropelib.reference.apply_rope_ref(..., interleaved=True)`.
#
# A linear map's matrix is its action on the basis vectors: column $i$ of $R_m$ is $R_m e_i$.
# So we can *read* $R_m$ off the reference implementation and check that it is block-diagonal.

# %%
d = 8
inv = frequencies.inv_freq(d).double()          # theta_j = 10000^(-2j/d): [1, 0.1, 0.01, 0.001]
print("theta_j =", inv.tolist())

def R_from_reference(m, inv):
    """R_m read off the elementwise reference: column i is the RoPE of e_i."""
    ang = (m * inv).repeat_interleave(2)             # one angle per feature, pairwise
    eye = torch.eye(2 * inv.numel(), dtype=f64)      # rows are e_0 .. e_{d-1}
    return reference.apply_rope_ref(eye, ang.cos(), ang.sin(), interleaved=True).T

m = 3
R3 = R_from_reference(m, inv)
assert torch.allclose(R3, torch.block_diag(*[rot2(m * t) for t in inv]))   # block-diagonal
assert torch.allclose(R3.T @ R3, torch.eye(d, dtype=f64))                  # orthogonal
assert torch.allclose(R_from_reference(2, inv) @ R_from_reference(5, inv), R_from_reference(7, inv))

fig, ax = plt.subplots(figsize=(4.4, 4))
im = ax.imshow(R3, cmap="RdBu", vmin=-1, vmax=1)
ax.set(title=r"$R_3$ for $d=8$ (interleaved pairs)", xticks=range(d), yticks=range(d))
fig.colorbar(im, ax=ax, fraction=0.046)
fig.tight_layout()
fig.savefig(FIGURES / "01-block-diagonal.png", dpi=120)
plt.show()

# %% [markdown]
# ![R_3 is block-diagonal: four 2x2 rotations turning at 1, 0.1, 0.01 and 0.001 rad per position](../figures/01-block-diagonal.png)
#
# The first block turns a full radian per position, the last only a thousandth: the pairs act
# like the hands of a clock, from seconds to hours.

# %% [markdown]
# ## 3. The complex-number view
#
# Read pair $j$ as one complex number $z_j = x_{2j} + i\,x_{2j+1}$. A rotation by $\alpha$ is a
# multiplication by $e^{i\alpha}$, so RoPE is simply
#
# $$ z_j \;\mapsto\; z_j\, e^{i m\theta_j}. $$
#
# `ropelib.reference.rope_complex` does exactly this with `torch.polar`; it must agree with the
# elementwise form.

# %%
S = 16
x = torch.randn(S, d, dtype=f64)                       # S positions, one head
angles = torch.arange(S, dtype=f64)[:, None] * inv     # [S, d/2]: m * theta_j
y_complex = reference.rope_complex(x, angles)
rep = angles.repeat_interleave(2, dim=-1)              # [S, d]: one angle per feature
y_real = reference.apply_rope_ref(x, rep.cos(), rep.sin(), interleaved=True)
assert torch.allclose(y_complex, y_real)
assert torch.allclose(y_real.norm(dim=-1), x.norm(dim=-1))   # rotations keep the norm
print("complex form == elementwise form; norms kept:", True)

# %% [markdown]
# ## 4. The relative-position property
#
# The attention score between a query at position $m$ and a key at position $n$ is
#
# $$
# \langle R_m q, R_n k\rangle = q^\top R_m^\top R_n k = q^\top R_{n-m}\, k
# = \mathrm{Re}\sum_{j} q_j\, \overline{k_j}\, e^{-i(n-m)\theta_j} =: g(q, k, n-m),
# $$
#
# using $R_m^\top = R_{-m}$ and that the angles add. The absolute positions cancel: only the
# offset $n-m$ is left (RoFormer eq. 11–16). Check it on a grid of positions: the matrix of
# scores must be constant along every diagonal (a Toeplitz matrix).

# %%
P = 48
d = 64
inv64 = frequencies.inv_freq(d).double()
q, k = torch.randn(d, dtype=f64), torch.randn(d, dtype=f64)

def rope_at(v, pos):
    """Rotate one vector v [d] to each position in pos: [len(pos), d] (interleaved pairs)."""
    ang = (pos.to(f64)[:, None] * inv64).repeat_interleave(2, dim=-1)
    return reference.apply_rope_ref(v.expand(len(pos), -1), ang.cos(), ang.sin(), interleaved=True)

pos = torch.arange(P)
scores = rope_at(q, pos) @ rope_at(k, pos).T               # scores[m, n] = <R_m q, R_n k>
worst = max((scores.diagonal(o) - scores.diagonal(o)[0]).abs().max().item() for o in range(-P + 1, P))
print(f"largest change along a diagonal: {worst:.2e}")
assert worst < 1e-12

# g(n - m) from one rotation only:
g = torch.stack([q @ rope_at(k, torch.tensor([o]))[0] for o in range(-P + 1, P)])
assert torch.allclose(torch.stack([scores[m, n] for m, n in [(0, 5), (40, 45), (7, 0), (47, 40)]]),
                      g[torch.tensor([5, 5, -7, -7]) + P - 1])

fig, ax = plt.subplots(figsize=(4.4, 4))
im = ax.imshow(scores, cmap="RdBu")
ax.set(title=r"$\langle R_m q, R_n k\rangle$: constant along diagonals", xlabel="key position n",
       ylabel="query position m")
fig.colorbar(im, ax=ax, fraction=0.046)
fig.tight_layout()
fig.savefig(FIGURES / "01-relative-scores.png", dpi=120)
plt.show()

# %% [markdown]
# ![Scores for all (m, n): every diagonal holds one value](../figures/01-relative-scores.png)
#
# An *absolute* position code (added sinusoids, learned vectors) gives no such structure: the
# score would depend on $m$ and $n$ separately.

# %% [markdown]
# ## 5. The frequency spectrum — and what context-extension scalings do to it
#
# $\theta_j = b^{-2j/d}$ falls geometrically from $1$ to almost $b^{-1}$. Its wavelength
# $\lambda_j = 2\pi/\theta_j$ is the number of positions pair $j$ needs for a full turn: from
# $2\pi \approx 6.3$ tokens for $j = 0$ to $\approx 2\pi b$ for the last pair. Pairs whose
# wavelength exceeds the training context never complete a turn during training; those are the
# ones the context-extension methods of `ropelib.frequencies` change:
#
# | scaling | effect on $\theta_j$ |
# |---|---|
# | `LinearScaling(s)` | all divided by $s$ (positions squeezed) |
# | `NTKScaling(s)` | base $b \to b\,s^{d/(d-2)}$: highest frequency kept, lowest divided by $s$ |
# | `Llama3Scaling` | short wavelengths kept, long ones divided by $s$, a linear blend between |
# | `YaRNScaling` | the same idea with a ramp in $j$, plus an attention temperature on cos/sin |

# %%
d, base = 128, 500000.0
j = torch.arange(d // 2)
plain = frequencies.inv_freq(d, base).double()
wavelength = 2 * math.pi / plain
scalings = {
    "linear (s=8)": LinearScaling(8.0),
    "NTK-aware (s=8)": NTKScaling(8.0),
    "Llama 3.1 (s=8)": Llama3Scaling(),
    "YaRN (s=8, L0=8192)": YaRNScaling(8.0, 8192),
}
ratios = {name: frequencies.inv_freq(d, base, sc).double() / plain for name, sc in scalings.items()}

# What the formulas promise, checked:
assert torch.allclose(ratios["linear (s=8)"], torch.full_like(plain, 1 / 8))
assert ratios["NTK-aware (s=8)"][0] == 1 and abs(ratios["NTK-aware (s=8)"][-1] - 1 / 8) < 1e-5
short, long_ = wavelength < 8192 / 4, wavelength > 8192 / 1
assert torch.all(ratios["Llama 3.1 (s=8)"][short] == 1)
assert torch.allclose(ratios["Llama 3.1 (s=8)"][long_], torch.full_like(plain[long_], 1 / 8))

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for b_ in (10000.0, 500000.0):
    ax1.semilogy(j, 2 * math.pi / frequencies.inv_freq(d, b_).double(), label=f"base {b_:g}")
ax1.axhline(8192, color="gray", ls="--", lw=1)
ax1.text(1, 8192 * 1.3, "8192 tokens", color="gray", fontsize=8)
ax1.set(xlabel="pair j", ylabel=r"wavelength $2\pi/\theta_j$ (tokens)", title="RoPE spectrum, d = 128")
ax1.legend()
for name, r in ratios.items():
    ax2.plot(j, r, label=name)
ax2.set(xlabel="pair j", ylabel=r"$\theta'_j / \theta_j$", title="context-extension scalings (base 500000)")
ax2.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "01-frequency-spectrum.png", dpi=120)
plt.show()
print("wavelengths from", round(wavelength[0].item(), 2), "to", round(wavelength[-1].item()), "tokens")

# %% [markdown]
# ![Left: the wavelength of each pair. Right: how each scaling changes the frequencies](../figures/01-frequency-spectrum.png)

# %% [markdown]
# ## 6. Long-term decay (RoFormer §3.4.3, Figure 2)
#
# Write the score with complex pairs, $h_j = q_j \overline{k_j}$, and let
# $S_j = \sum_{i<j} e^{i(m-n)\theta_i}$ (so $S_0 = 0$). Summation by parts (Abel) gives
#
# $$
# \Big|\sum_{j=0}^{d/2-1} h_j e^{i(m-n)\theta_j}\Big|
# \le \Big(\max_j |h_{j+1} - h_j|\Big) \sum_{j=1}^{d/2} |S_j| .
# $$
#
# The paper plots the *relative upper bound* $\frac{1}{d/2}\sum_{j=1}^{d/2} |S_j|$ against
# the distance $m-n$ for $d = 128$, $b = 10000$: it decays, so far-apart tokens can interact
# less strongly — a sensible prior for language. At distance 0 every $S_j = j$, so the bound
# starts at exactly $(d/2+1)/2 = 32.5$. We also plot the score of the constant vector
# $q = k = \mathbf 1$, $\sum_j 2\cos((m-n)\theta_j)$, which follows the same trend.

# %%
d = 128
theta = frequencies.inv_freq(d, 10000.0).double()            # [64]
dist = torch.arange(0, 257, dtype=f64)                      # relative distance m - n
S_j = torch.cumsum(torch.exp(1j * dist[:, None] * theta[None, :]), dim=1)   # [257, 64]: S_1..S_{d/2}
bound = S_j.abs().mean(dim=1)                               # (1/(d/2)) sum_j |S_j|
ones_score = 2 * torch.cos(dist[:, None] * theta[None, :]).sum(dim=1) / (d / 2)

assert abs(bound[0].item() - (d / 2 + 1) / 2) < 1e-9         # 32.5 at distance 0
assert bound[200:].max() < 0.5 * bound[:20].mean()           # it decays
assert bound[100:].max() < bound[:10].min()

fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(dist, bound, label=r"relative upper bound $\frac{1}{d/2}\sum_j |S_j|$")
ax.plot(dist, ones_score * bound[0] / ones_score[0], lw=1, alpha=0.7,
        label=r"score of $q=k=\mathbf{1}$ (scaled to the same start)")
ax.set(xlabel="relative distance m − n", ylabel="relative upper bound",
       title="Long-term decay of RoPE (RoFormer Fig. 2), d = 128, b = 10000")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(FIGURES / "01-long-term-decay.png", dpi=120)
plt.show()
print("bound at 0, 50, 250:", [round(bound[i].item(), 2) for i in (0, 50, 250)])

# %% [markdown]
# ![The relative upper bound decays with distance, as in RoFormer's Figure 2](../figures/01-long-term-decay.png)

# %% [markdown]
# ## 7. Rotate-half vs interleaved: one rotation, two pairings
#
# GPT-NeoX, Llama and Transformer Engine do not pair neighbours. They pair feature $i$ with
# feature $i + d/2$ and use
#
# $$ \mathrm{rotate\_half}(x) = (-x_{d/2}, \dots, -x_{d-1},\ x_0, \dots, x_{d/2-1}), $$
#
# with the angle table `cat(f, f)` instead of `f0 f0 f1 f1 ...`. Both are the same rotation of
# the same pairs up to *where the features sit*: moving the even features to the first half
# and the odd ones to the second turns one pairing into the other. This is why a checkpoint
# trained with one convention can be converted to the other by permuting the rows of
# $W_q$ and $W_k$ (Hugging Face's Llama conversion script does exactly that) — and why mixing
# the two up silently gives a wrong model, not an error.
#
# The two angle tables from `ropelib.frequencies.rope_freqs`:

# %%
d = 8
print("rotate-half table:", frequencies.rope_freqs(2, d)[1, 0, 0].tolist())
print("interleaved table:", frequencies.rope_freqs(2, d, interleaved=True)[1, 0, 0].tolist())

# %% [markdown]
# Now the permutation. `perm` lists, for each slot of the rotate-half vector, which interleaved
# feature goes there; `argsort(perm)` puts the features back.

# %%
perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])    # [0, 2, 4, 6, 1, 3, 5, 7]
inverse = torch.argsort(perm)
x = torch.randn(5, 2, 3, d, dtype=f64)                              # [S, B, H, d] (sbhd)
f_half = frequencies.rope_freqs(5, d).double()
f_inter = frequencies.rope_freqs(5, d, interleaved=True).double()

y_inter = reference.rope_reference(x, f_inter, interleaved=True)
y_half_of_permuted = reference.rope_reference(x[..., perm], f_half, interleaved=False)
assert torch.allclose(y_inter, y_half_of_permuted[..., inverse])
print("interleaved RoPE(x) == rotate-half RoPE(x[..., perm])[..., argsort(perm)]")

# %% [markdown]
# As matrices: with the permutation matrix $P$ ($Px = x_{[\mathrm{perm}]}$),
# $R^{\text{interleaved}}_m = P^\top R^{\text{half}}_m P$. The scores do not care either way:
# $\langle P^\top R P q, P^\top R P k\rangle = \langle R\,Pq, R\,Pk\rangle$, so a model trained
# in one pairing works in the other once its $q$ and $k$ features are permuted.

# %% [markdown]
# ## Exercises
#
# Each cell checks your answer at once (✅ or ❌) and never stops the notebook. Replace the
# `...` and rerun the cell. The solutions are folded away below each exercise. (The `;` after a
# check only stops Jupyter from echoing its `True`/`False`.)
#
# **Exercise 1 — the rotation matrix.** Write `rotation_matrix(m, inv_freq)` that returns the
# $[d, d]$ block-diagonal $R_m$ for the interleaved pairing ($d = 2\cdot$`len(inv_freq)`),
# building the $2\times2$ blocks yourself (no `torch.block_diag`, no `ropelib`).

# %%
from ropelib.exercises import solution
from ropelib.exercises import basics


def rotation_matrix(m, inv_freq):
    ...   # your code: a [d, d] float64 tensor


basics.check_rotation_matrix(rotation_matrix);

# %%
solution(basics.solution_rotation_matrix)

# %% [markdown]
# **Exercise 2 — the relative angle.** $R_m^\top R_n$ is again block-diagonal. Write
# `relative_angle(m, n, inv_freq)` returning the $d/2$ angles of its blocks (any angle that is
# equal modulo $2\pi$ counts).

# %%
def relative_angle(m, n, inv_freq):
    ...   # your code: a [d/2] tensor of angles


basics.check_relative_angle(relative_angle);

# %%
solution(basics.solution_relative_angle)

# %% [markdown]
# **Exercise 3 — rotate_half.** Implement both pairings of `rotate_half(x, interleaved)`:
# $[x_1, x_2] \to [-x_2, x_1]$ on halves, and $(x_0, x_1, x_2, x_3, \dots) \to
# (-x_1, x_0, -x_3, x_2, \dots)$ on neighbours.

# %%
def rotate_half(x, interleaved=False):
    ...   # your code


basics.check_rotate_half(rotate_half);

# %%
solution(basics.solution_rotate_half)

# %% [markdown]
# **Exercise 4 — the way back.** Section 7 turned interleaved into rotate-half. Give the
# permutation for the other direction, for $d = 8$: `perm` such that
# rotate-half RoPE$(x)$ = interleaved RoPE$(x[\dots, \mathrm{perm}])[\dots, \mathrm{argsort(perm)}]$.

# %%
perm_back = ...   # your answer: a list of 8 ints

basics.check_interleave_permutation(perm_back, 8, to="interleaved");

# %%
solution(basics.solution_interleave_permutation)
