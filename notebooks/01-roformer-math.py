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
# - show numerically that the attention score $\langle R_m q, R_n k\rangle$ depends only on $m-n$,
#   and why a position vector *added* to $q$ and $k$ gives no such score;
# - read the frequency spectrum $\theta_j = b^{-2j/d}$ as wavelengths, and see what the
#   context-extension scalings (linear, NTK, Llama 3, YaRN) do to it;
# - reproduce the long-term decay of the paper's Figure 2 and say what it does not promise:
#   the expected score of independent zero-mean random $q, k$ is 0 at every distance;
# - turn the interleaved pairing (GPT-J, RoFormer) into the rotate-half pairing (GPT-NeoX,
#   Hugging Face's Llama, Transformer Engine) with a permutation.
#
# Nothing here needs a GPU: it is plain PyTorch in float64 plus ropelib's reference functions
# (only section 7 and the cell after the study-group questions use its angle tables, which are
# float32, as Transformer Engine's are), and one small Triton kernel that runs the elementwise
# form, compiled or in Triton's interpreter.
#
# **Time:** about an hour and a half: an hour to read sections 1 to 7 (section 6, the long-term
# decay, is the longest) and half an hour for the five exercises (exercise 5, a small masked
# Triton kernel, about 15 minutes of it). The study-group questions and the worked start on
# question 6 after them are optional. The cells run in well under half a minute on a CPU.

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
print("device:", device, "| figures saved to", "figures/" if FIGURES.name == "figures"
      else "a scratch folder")

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
q2 = torch.tensor([1.0, 0.25], dtype=f64)
fig, ax = plt.subplots(figsize=(4.2, 4.2))
for m in range(6):
    v = rot2(m * theta) @ q2
    ax.annotate("", xy=v.tolist(), xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color=plt.cm.viridis(m / 6), lw=2))
    ax.text(*(1.12 * v).tolist(), f"m={m}", ha="center", va="center", fontsize=9)
ax.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xlabel="$x_0$", ylabel="$x_1$",
       title=r"$R(m\theta)\,q$ for $\theta=0.5$: position as an angle")
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(FIGURES / "01-2d-rotation.png", dpi=120)
plt.show()

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
# Here $j$ counts from 0; the paper counts from 1 and writes $10000^{-2(i-1)/d}$, the same numbers.
# In the paper the pairs are neighbours, $(x_{2j}, x_{2j+1})$: the **interleaved** layout.
# A dense matrix-vector product would spend $d^2$ multiply-adds per token on a matrix that is
# almost all zeros; the rotation is applied elementwise instead, with $2d$ multiplies and $d$
# adds (eq. 34):
#
# $$
# R_m x = x \odot \cos(m\boldsymbol\theta)
#   + \mathrm{rotate\_pairs}(x) \odot \sin(m\boldsymbol\theta),
# \qquad \mathrm{rotate\_pairs}(x) = (-x_1, x_0, -x_3, x_2, \dots),
# $$
#
# where $\boldsymbol\theta = (\theta_0,\theta_0,\theta_1,\theta_1,\dots)$ holds one angle per
# feature. That is exactly `ropelib.reference.apply_rope_ref(..., interleaved=True)`. Code calls
# $\mathrm{rotate\_pairs}$ `rotate_half(x, interleaved=True)`: section 7 meets the other
# pairing, whose `rotate_half` swaps the two halves of $x$.
#
# A linear map's matrix is its action on the basis vectors: column $i$ of $R_m$ is $R_m e_i$.
# So we can *read* $R_m$ off the reference implementation and check that it is block-diagonal.

# %%
d = 8
inv = frequencies.inv_freq(d, dtype=f64)        # theta_j = 10000^(-2j/d): [1, 0.1, 0.01, 0.001]
print("theta_j =", inv.tolist())
assert torch.allclose(inv, torch.tensor([1, 0.1, 0.01, 0.001], dtype=f64), rtol=1e-12, atol=0)

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
ax.set(title=r"$R_3$ for $d=8$ (interleaved pairs)", xticks=range(d), yticks=range(d),
       xlabel=r"input feature $i$ (column $i$ is $R_3 e_i$)", ylabel="output feature")
fig.colorbar(im, ax=ax, fraction=0.046)
fig.tight_layout()
fig.savefig(FIGURES / "01-block-diagonal.png", dpi=120)
plt.show()

# %% [markdown]
# The four pairs turn at 1, 0.1, 0.01 and 0.001 radians per position (the $\theta_j$ printed
# above): each pair ten times slower than the one before, like the hands of a clock. In general
# $\theta_{j+1}/\theta_j = b^{-2/d}$ for every $j$, here $10000^{-1/4} = 0.1$: the speeds fall
# geometrically, by one factor per pair.

# %% [markdown]
# ## 3. The complex-number view
#
# Read pair $j$ as one complex number $z_j = x_{2j} + i\,x_{2j+1}$. A rotation by $\alpha$ is a
# multiplication by $e^{i\alpha} = \cos\alpha + i\sin\alpha$: multiplying out,
# $(x_0 + i x_1)(\cos\alpha + i\sin\alpha) = (x_0\cos\alpha - x_1\sin\alpha)
# + i\,(x_1\cos\alpha + x_0\sin\alpha)$, section 1's two rows. So RoPE is simply
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
forms_gap = (y_complex - y_real).abs().max().item()
norm_gap = (y_real.norm(dim=-1) - x.norm(dim=-1)).abs().max().item()   # rotations keep the norm
print(f"complex form vs elementwise form: largest difference {forms_gap:.1e}; "
      f"norms changed by at most {norm_gap:.1e}")
assert forms_gap < 1e-12 and norm_gap < 1e-12          # float64 round-off, nothing more

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
# using $R_m^\top = R_{-m}$ and that the angles add. In the last sum $q_j = q_{2j} + i\,q_{2j+1}$
# and $k_j = k_{2j} + i\,k_{2j+1}$ are the complex pairs of section 3, and it takes two steps.
# The dot product of two pairs is the real part of one complex number times the other's
# conjugate, $a_0 b_0 + a_1 b_1 = \mathrm{Re}\big((a_0 + i a_1)\,\overline{(b_0 + i b_1)}\big)$;
# and pair $j$ of $R_m q$ is $q_j e^{im\theta_j}$, of $R_n k$ is $k_j e^{in\theta_j}$, so
#
# $$
# \langle R_m q, R_n k\rangle = \mathrm{Re}\sum_j q_j e^{im\theta_j}\,
#   \overline{k_j e^{in\theta_j}}
# = \mathrm{Re}\sum_j q_j\,\overline{k_j}\, e^{i(m-n)\theta_j} .
# $$
#
# The absolute positions cancel: only the offset $n-m$ is left (RoFormer eq. 11–16).
#
# Check it on a grid of positions: the matrix of scores must be constant along every diagonal
# (a Toeplitz matrix). The cell prints the largest change along a diagonal and asserts that it
# is below $10^{-12}$: float64 round-off, not a real change.
#
# For contrast, the same cell gives $q$ and $k$ an *absolute* position code instead: the
# sinusoids of the original Transformer, $p_m = (\sin m\omega_0, \cos m\omega_0, \sin m\omega_1,
# \cos m\omega_1, \dots)$ with $\omega_j = 10000^{-2j/d}$ (the same numbers as RoPE's
# $\theta_j$, so both codes see the same frequencies), *added* to the vectors. Their score
# expands into four terms,
#
# $$
# \langle q + p_m,\ k + p_n\rangle
# = \underbrace{\langle q, k\rangle}_{\text{no position}}
# + \underbrace{\langle q, p_n\rangle}_{\text{depends on } n}
# + \underbrace{\langle p_m, k\rangle}_{\text{depends on } m}
# + \underbrace{\textstyle\sum_j \cos\big((m-n)\,\omega_j\big)}_{
# \langle p_m,\, p_n\rangle:\ m-n \text{ only}} ,
# $$
#
# and only the last is relative. The two cross terms, token against the *other* token's
# position, depend on $m$ and $n$ separately: the cell measures how far they move the score
# along a diagonal.
#
# This is a simplification. The Transformer adds $p_m$ to the token's embedding $x_m$ before
# the projections, so its cross terms read $\langle W_q x_m, W_k p_n\rangle$ and
# $\langle W_q p_m, W_k x_n\rangle$: they still depend on $m$ and $n$ separately, and even
# $\langle W_q p_m, W_k p_n\rangle$ depends on $m - n$ alone only for special $W_q^\top W_k$.
# Adding $p_m$ to $q$ and $k$ directly ($W_q = W_k = I$) is the kindest case for the absolute
# code, and it already fails.

# %%
P = 48
d = 64
inv64 = frequencies.inv_freq(d, dtype=f64)
q, k = torch.randn(d, dtype=f64), torch.randn(d, dtype=f64)

def rope_at(v, pos):
    """Rotate one vector v [d] to each position in pos: [len(pos), d] (interleaved pairs)."""
    ang = (pos.to(f64)[:, None] * inv64).repeat_interleave(2, dim=-1)
    return reference.apply_rope_ref(v.expand(len(pos), -1), ang.cos(), ang.sin(), interleaved=True)

def diagonal_change(M):
    """The largest change of M along any of its diagonals: 0 for a Toeplitz matrix."""
    n = M.shape[0]
    return max((M.diagonal(o) - M.diagonal(o)[0]).abs().max().item() for o in range(-n + 1, n))

pos = torch.arange(P)
scores = rope_at(q, pos) @ rope_at(k, pos).T               # scores[m, n] = <R_m q, R_n k>
worst = diagonal_change(scores)
print(f"RoPE: largest change along a diagonal: {worst:.2e}")
assert worst < 1e-12

# g(n - m) from one rotation only:
g = torch.stack([q @ rope_at(k, torch.tensor([o]))[0] for o in range(-P + 1, P)])
assert torch.allclose(torch.stack([scores[m, n] for m, n in [(0, 5), (40, 45), (7, 0), (47, 40)]]),
                      g[torch.tensor([5, 5, -7, -7]) + P - 1])

# The absolute code: sinusoids added to the same q and k
def sinusoids(pos):
    """p_m = (sin m w_0, cos m w_0, sin m w_1, ...) for each m in pos: [len(pos), d]."""
    ang = pos.to(f64)[:, None] * inv64                                 # [P, d/2]: m * w_j
    return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)     # [P, d]

p_abs = sinusoids(pos)
scores_abs = (q + p_abs) @ (k + p_abs).T                   # <q + p_m, k + p_n>
pos_with_pos = p_abs @ p_abs.T                             # <p_m, p_n> alone
worst_abs, worst_pos = diagonal_change(scores_abs), diagonal_change(pos_with_pos)
print(f"added sinusoids: largest change along a diagonal: {worst_abs:.2f} "
      f"(the scores' own spread: {scores_abs.std().item():.2f}); "
      f"of <p_m, p_n> alone: {worst_pos:.2e}")
assert worst_pos < 1e-12                                   # position against position: m - n only
assert torch.allclose(pos_with_pos.diagonal(), torch.full((P,), d / 2, dtype=f64))   # d/2 at m = n
assert worst_abs > scores_abs.std().item()                 # the cross terms: m and n separately

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
vmax = max(scores.abs().max().item(), scores_abs.abs().max().item())   # one colour scale
for ax, M, title in ((ax1, scores, r"RoPE: $\langle R_m q, R_n k\rangle$"),
                     (ax2, scores_abs, r"added sinusoids: $\langle q + p_m, k + p_n\rangle$")):
    im = ax.imshow(M, cmap="RdBu", vmin=-vmax, vmax=vmax)
    ax.set(title=title, xlabel="key position n", ylabel="query position m")
    fig.colorbar(im, ax=ax, fraction=0.046)
fig.suptitle(f"Scores of one (q, k), d = {d}, at every pair of positions (one colour scale)")
fig.tight_layout()
fig.savefig(FIGURES / "01-relative-scores.png", dpi=120)
plt.show()

# %% [markdown]
# Left, RoPE: every diagonal holds one value. Right, the same $q$ and $k$ with added sinusoids:
# the main diagonal still stands out, since $\langle p_m, p_n\rangle$ is largest at $m = n$
# (where it is $d/2$), but the scores change along the diagonals, the largest change exceeding
# the scores' own spread (both printed above): the cross terms. A learned absolute vector per
# position has the same cross terms, and its $\langle p_m, p_n\rangle$ need not be relative
# either.

# %% [markdown]
# ## 5. The frequency spectrum — and what context-extension scalings do to it
#
# $\theta_j = b^{-2j/d}$ falls geometrically from $1$ to $b^{-(d-2)/d}$, just above $b^{-1}$.
# The wavelength $\lambda_j = 2\pi/\theta_j$ is the number of positions pair $j$ needs for a
# full turn. It runs from $2\pi \approx 6.3$ tokens for $j = 0$ to
# $2\pi b^{(d-2)/d} = 2\pi b \cdot b^{-2/d}$ for the last pair, growing by the same factor
# $b^{2/d}$ from each pair to the next: the wavelengths are spaced evenly on a log scale, so
# every range of distances, from neighbouring tokens to about $2\pi b$, has pairs whose angle
# moves by a useful fraction of a turn over it. These are the frequencies of the original
# Transformer's sinusoids, whose wavelengths, in its words, "form a geometric progression from
# $2\pi$ to $10000 \cdot 2\pi$" (Vaswani et al., 2017, section 3.5; the last one falls short of
# $2\pi b$ by the factor $b^{-2/d}$, as below); RoFormer keeps them.
#
# The cell below uses Llama 3's sizes, $d = 128$ and $b = 500000$, not the paper's $b = 10000$.
# There $b^{-2/d}$ is about 0.81, so the longest wavelength is about a fifth short of $2\pi b$
# (the cell prints and checks both).
#
# Pairs whose wavelength exceeds the training context $L_0$ never complete a turn during
# training: with $L_0 = 8192$ that is 29 of Llama 3's 64 pairs, against 14 of 64 at
# $b = 10000$ (the cell counts both). A longer context shows them angles they never saw, so the
# context-extension methods of `ropelib.frequencies` slow pairs down ($s = 8$ in the cell).
# Linear scaling slows every pair. Llama 3.1 keeps its 29 fastest pairs ($\lambda_j < L_0/4$)
# as they are, divides the 29 slowest (exactly those that never turn within $L_0$) by 8, and
# blends the 6 between; YaRN does the same with another ramp. "NTK-aware" scaling (named after
# neural tangent kernel theory, by which a network hardly recovers high frequencies its inputs
# have lost: hence, keep the fast pairs) only raises the base. That keeps the fastest pair
# exactly but slows every other one: of the 29 pairs Llama 3.1 keeps, NTK slows 7 by 2× or
# more, and the slowest of them (a wavelength near 2000 tokens) by 2.5×. The cell checks all
# of this:
#
# | scaling | effect on $\theta_j$ |
# |---|---|
# | `LinearScaling(s)` | all divided by $s$ (positions squeezed) |
# | `NTKScaling(s)` | base $b \to b\,s^{d/(d-2)}$: highest frequency kept, lowest divided by $s$ |
# | `Llama3Scaling` | $\lambda_j < L_0/4$ kept, $\lambda_j > L_0$ divided by $s$, a linear blend in $1/\lambda_j$ between (Llama 3.1: $s = 8$, $L_0 = 8192$) |
# | `YaRNScaling` | the same idea with a ramp in $j$, plus an attention temperature in cos/sin |
#
# YaRN's ramp blends each pair between kept and divided by $s$,
#
# $$
# \theta'_j = (1-\rho_j)\,\theta_j + \rho_j\,\theta_j/s, \qquad
# \rho_j = \mathrm{clamp}\Big(\frac{j - j_{\text{lo}}}{j_{\text{hi}} - j_{\text{lo}}},\ 0,\ 1\Big),
# $$
#
# where $j_{\text{lo}}$ and $j_{\text{hi}}$ are the pairs that turn $\beta_{\text{fast}} = 32$
# and $\beta_{\text{slow}} = 1$ times within $L_0$ (rounded down and up): a ramp linear in $j$
# where Llama 3.1's is linear in $1/\lambda_j$. Its **attention temperature** $t$ divides the
# logits, $\mathrm{softmax}\big(q^\top k/(t\sqrt d)\big)$, with $\sqrt{1/t} = 0.1\ln s + 1$
# (so $t < 1$ for $s > 1$). The tables carry it: both $\cos$ and $\sin$ are multiplied by
# $a = \sqrt{1/t}$ (`attention_scaling`, the number the cell prints). Queries and keys are both
# rotated with those tables, so every logit is multiplied by $a^2 = 1/t$:
# $\langle aR_m q, aR_n k\rangle = a^2\langle R_m q, R_n k\rangle$, a sharper softmax that
# offsets the flatter attention over a longer context.

# %%
d, base = 128, 500000.0
j = torch.arange(d // 2)
plain = frequencies.inv_freq(d, base, dtype=f64)
wavelength = 2 * math.pi / plain
scalings = {
    "linear (s=8)": LinearScaling(8.0),
    "NTK-aware (s=8)": NTKScaling(8.0),
    "Llama 3.1 (s=8)": Llama3Scaling(),
    "YaRN (s=8, L0=8192)": YaRNScaling(8.0, 8192),
}
ratios = {name: frequencies.inv_freq(d, base, sc, dtype=f64) / plain
          for name, sc in scalings.items()}

# What the formulas promise, checked:
assert torch.allclose(ratios["linear (s=8)"], torch.full_like(plain, 1 / 8))
assert ratios["NTK-aware (s=8)"][0] == 1 and abs(ratios["NTK-aware (s=8)"][-1] - 1 / 8) < 1e-5
ntk_plain = frequencies.inv_freq(d, base * 8 ** (d / (d - 2)), dtype=f64)   # b -> b s^(d/(d-2))
assert torch.allclose(ratios["NTK-aware (s=8)"], ntk_plain / plain)         # NTK: only the base
llama = scalings["Llama 3.1 (s=8)"]
L0 = llama.original_max_position_embeddings                   # the trained context, 8192
short = wavelength < L0 / llama.high_freq_factor              # lambda < L0 / 4: kept
long_ = wavelength > L0 / llama.low_freq_factor               # lambda > L0: divided by s
assert (L0, llama.high_freq_factor, llama.low_freq_factor, llama.factor) == (8192, 4, 1, 8)
assert torch.all(ratios["Llama 3.1 (s=8)"][short] == 1)
assert torch.allclose(ratios["Llama 3.1 (s=8)"][long_], torch.full_like(plain[long_], 1 / 8))
blend = (L0 / wavelength - llama.low_freq_factor) / (llama.high_freq_factor - llama.low_freq_factor)
between = ~short & ~long_                                     # the blend, linear in 1/lambda_j
assert torch.allclose(ratios["Llama 3.1 (s=8)"][between], ((1 - blend) / 8 + blend)[between])
yarn = ratios["YaRN (s=8, L0=8192)"]      # fast pairs kept, slow pairs / 8, a ramp between
assert yarn[0] == 1 and abs(yarn[-1] - 1 / 8) < 1e-6 and bool((yarn[1:] <= yarn[:-1]).all())
# the ramp as the text states it: pair j turns L0 theta_j / (2 pi) times within L0, so the pair
# that turns r times is j(r) = (d/2) log_b(L0 / (2 pi r)); j_lo at beta_fast = 32 rounded down,
# j_hi at beta_slow = 1 rounded up
yarn_sc = scalings["YaRN (s=8, L0=8192)"]
assert (yarn_sc.beta_fast, yarn_sc.beta_slow, yarn_sc.original_max_position_embeddings,
        yarn_sc.factor) == (32, 1, L0, 8)
j_turning = {r: d / 2 * math.log(L0 / (2 * math.pi * r)) / math.log(base) for r in (32, 1)}
j_lo, j_hi = math.floor(j_turning[32]), math.ceil(j_turning[1])
rho = ((j.to(f64) - j_lo) / (j_hi - j_lo)).clamp(0, 1)
assert torch.allclose(yarn, (1 - rho) + rho / 8, rtol=0, atol=1e-12), (j_lo, j_hi)
print(f"YaRN's ramp runs from pair {j_lo} (kept) to pair {j_hi} (divided by 8)")
temperature = scalings["YaRN (s=8, L0=8192)"].attention_scaling   # cos and sin scaled by it
print(f"YaRN's attention temperature on cos/sin: {temperature:.4f} = 0.1 ln 8 + 1")
assert abs(temperature - (0.1 * math.log(8) + 1)) < 1e-12

# Pairs that never complete a turn within the trained context, at both bases:
never_turn = {b_: int((2 * math.pi / frequencies.inv_freq(d, b_, dtype=f64) > L0).sum())
              for b_ in (10000.0, base)}
print(f"pairs (of {d // 2}) with a wavelength over L0 = {L0}: "
      + ", ".join(f"{n} at base {b_:g}" for b_, n in never_turn.items()))
print(f"Llama 3.1 keeps {int(short.sum())} pairs, divides {int(long_.sum())} by 8 "
      f"and blends {d // 2 - int(short.sum()) - int(long_.sum())}")
assert never_turn == {10000.0: 14, base: 29} and int(long_.sum()) == 29
ntk_kept = ratios["NTK-aware (s=8)"][short]                  # NTK on the pairs Llama 3.1 keeps
print(f"NTK slows {int((ntk_kept < 0.5).sum())} of those {int(short.sum())} pairs 2x or more; "
      f"the last (wavelength {wavelength[short][-1].item():.0f} tokens) {1 / ntk_kept.min().item():.1f}x")
assert int((ntk_kept < 0.5).sum()) == 7 and round(1 / ntk_kept.min().item(), 1) == 2.5
assert round(wavelength[short][-1].item(), -3) == 2000 and bool((yarn[:10] == 1).all())

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for b_ in (10000.0, 500000.0):
    ax1.semilogy(j, 2 * math.pi / frequencies.inv_freq(d, b_, dtype=f64), label=f"base {b_:g}")
ax1.axhline(8192, color="gray", ls="--", lw=1)
ax1.text(1, 8192 * 1.3, "8192 tokens", color="gray", fontsize=8)
ax1.set(xlabel="pair j", ylabel=r"wavelength $2\pi/\theta_j$ (tokens)",
        title="RoPE spectrum, d = 128")
ax1.legend()
for name, r in ratios.items():
    ax2.plot(j, r, label=name)
ax2.set(xlabel="pair j", ylabel=r"$\theta'_j / \theta_j$",
        title="context-extension scalings (base 500000)")
ax2.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "01-frequency-spectrum.png", dpi=120)
plt.show()
print("wavelengths from", round(wavelength[0].item(), 2), "to", round(wavelength[-1].item()),
      "tokens")
assert round(wavelength[0].item(), 1) == 6.3          # 2 pi: the text's "about 6.3 tokens"
factor = base ** (-2 / d)                # b^(-2/d): the last wavelength over 2*pi*b
print(f"the longest wavelength is 2*pi*b times {factor:.3f}, {1 - factor:.0%} short of 2*pi*b")
assert math.isclose(wavelength[-1].item(), 2 * math.pi * base * factor, rel_tol=1e-5)
assert round(factor, 2) == 0.81 and abs((1 - factor) - 1 / 5) < 0.02

# %% [markdown]
# Left: the wavelength of each pair; the pairs above the dashed line never finish a turn in
# 8192 tokens. Right: each scaling's $\theta'_j/\theta_j$. Linear is flat at $1/8$; NTK starts
# at 1 and falls geometrically to $1/8$; Llama 3.1 keeps the fast pairs, divides the slow ones
# by 8 and blends between; YaRN does the same with its ramp in $j$.

# %% [markdown]
# ## 6. Long-term decay (RoFormer §3.4.3, Figure 2) — and what it does *not* say
#
# Write the score of section 4 with complex pairs. Let $h_j = q_j \overline{k_j}$ for
# $j = 0, \dots, d/2-1$ and $\Delta = m - n$, so that the score is
# $\mathrm{Re}\sum_{j=0}^{d/2-1} h_j e^{i\Delta\theta_j}$. Define the partial sums
#
# $$
# S_j = \sum_{l=0}^{j-1} e^{i\Delta\theta_l}, \qquad j = 0, 1, \dots, d/2,
# \qquad\text{so}\qquad S_0 = 0, \quad e^{i\Delta\theta_j} = S_{j+1} - S_j ,
# $$
#
# and **set $h_{d/2} = 0$** (there is no pair $d/2$; setting it to zero folds the boundary term
# into the sum). Summation by parts (the Abel transformation) then reads
#
# $$
# \sum_{j=0}^{d/2-1} h_j \,(S_{j+1} - S_j)
# = \sum_{j=1}^{d/2} h_{j-1} S_j - \sum_{j=0}^{d/2-1} h_j S_j
# = -\sum_{j=0}^{d/2-1} S_{j+1}\,(h_{j+1} - h_j),
# $$
#
# where the two boundary terms that the reindexing leaves over, $h_0 S_0$ and
# $h_{d/2} S_{d/2}$, vanish because $S_0 = 0$ and $h_{d/2} = 0$. The triangle inequality gives
# RoFormer's bound
#
# $$
# \big|\langle R_m q, R_n k\rangle\big|
# \le \Big|\sum_{j=0}^{d/2-1} h_j e^{i\Delta\theta_j}\Big|
# \le \sum_{j=0}^{d/2-1} |S_{j+1}|\,|h_{j+1} - h_j|
# \le \Big(\max_{0 \le j < d/2} |h_{j+1} - h_j|\Big) \sum_{j=1}^{d/2} |S_j| .
# $$
#
# (Because $h_{d/2} = 0$, the last difference is $|h_{d/2-1}|$ itself: the maximum runs over
# the steps between neighbouring pairs *and* the size of the last pair.)
#
# The bound is a product. The first factor depends on $q$ and $k$; the second depends only on
# the distance and the frequencies. The paper plots the second, as the *relative upper bound*
# $\frac{1}{d/2}\sum_{j=1}^{d/2} |S_j|$, against $\Delta$ for $d = 128$, $b = 10000$. At
# distance 0 every $S_j = j$, so it starts at exactly $(d/2+1)/2 = 32.5$, and it decays. We also
# plot the score of the constant vector $q = k = \mathbf 1$: every $h_j = (1+i)(1-i) = 2$, so
# the score is $\sum_j 2\cos(\Delta\theta_j)$, and it falls with distance too.
#
# **What the decay is not.** It is a property of the *bound*, and the bound is loose (the
# cells below print by how much). Vectors whose $h_j$ are positive and spread over the fast
# pairs as well as the slow ones, like $q = k = \mathbf 1$, have scores that decay too: at
# $\Delta = 0$ every term adds, further away the fast pairs' terms cancel. Other pairs
# $(q, k)$ need not. The expected score is
#
# $$
# \mathbb E\,\langle R_m q, R_n k\rangle = \mathrm{Re}\sum_{j} \mathbb E[h_j]\, e^{i\Delta\theta_j},
# $$
#
# so only the correlation between $q$ and $k$ shapes how the score varies with distance on
# average:
#
# - **$q$, $k$ independent with zero mean**:
#   $\mathbb E[h_j] = \mathbb E[q_j]\,\overline{\mathbb E[k_j]} = 0$, so the expected score is
#   **0 at every distance**, near or far. With i.i.d. $\mathcal N(0,1)$ entries the spread does
#   not shrink either: $R_{n-m}$ is orthogonal, so
#   $\mathbb E\,(q^\top R_{n-m} k)^2 = \mathrm{tr}(R_{n-m} R_{n-m}^\top) = d$ at every distance.
# - **$k = q$** (a query meeting a key that points the same way):
#   $\mathbb E[h_j] = \mathbb E|q_j|^2 = 2$ for $\mathcal N(0,1)$ entries, so the expected score
#   is exactly the curve $\sum_j 2\cos(\Delta\theta_j)$ of $q = k = \mathbf 1$, and *that* decays.
#
# So the long-term decay is a prior built into the construction: on average, a query and a key
# that point the same way score less the further apart they are. It is not a rule that far
# tokens interact less: a trained model chooses its $q$ and $k$ and can give a high score at any
# distance, for instance by putting its weight on the slowest pair, which hardly turns over a
# training context. The three cells below check this: the bound, random pairs $(q, k)$ at
# distances 0 to 256, and where the weight sits.

# %%
d = 128
theta128 = frequencies.inv_freq(d, 10000.0, dtype=f64)      # [64]
dist = torch.arange(0, 257, dtype=f64)                      # relative distance m - n
phase = torch.exp(1j * dist[:, None] * theta128[None, :])   # [257, 64]: e^{i (m-n) theta_j}
S_j = torch.cumsum(phase, dim=1)                            # [257, 64]: S_1 .. S_{d/2}
bound = S_j.abs().mean(dim=1)                               # (1/(d/2)) sum_j |S_j|
ones_score = 2 * torch.cos(dist[:, None] * theta128[None, :]).sum(dim=1)   # q = k = 1

assert abs(bound[0].item() - (d / 2 + 1) / 2) < 1e-9         # 32.5 at distance 0
assert bound[200:].max() < 0.5 * bound[:20].mean()           # it decays
assert bound[100:].max() < bound[:10].min()
print(f"the relative upper bound: {bound[0].item():.1f} at distance 0, "
      f"{bound[250].item():.2f} at 250")

# %% [markdown]
# Random pairs: 4096 queries and keys with $\mathcal N(0,1)$ entries, read as complex pairs,
# independent ($h_j = q_j\overline{k_j}$) and equal ($k = q$), scored at every distance.

# %%
# Random pairs, N(0, 1) entries, as complex pairs z_j = x_{2j} + i x_{2j+1}:
N = 4096
gen = torch.Generator().manual_seed(0)
def pairs(v):
    return torch.complex(v[..., 0::2], v[..., 1::2])         # [N, d] -> [N, d/2]
qs = torch.randn(N, d, dtype=f64, generator=gen)             # N queries
ks = torch.randn(N, d, dtype=f64, generator=gen)             # N keys
h_indep = pairs(qs) * pairs(ks).conj()                      # [N, 64]: k independent of q
h_same = pairs(qs) * pairs(qs).conj()                       # [N, 64]: k = q
score_indep = (h_indep @ phase.T).real                      # [N, 257]: the score at each distance
score_same = (h_same @ phase.T).real

# The scores are the RoPE scores of section 4 (a spot check at distance 37):
m_, n_ = 40, 3
ang = lambda p: (p * theta128).repeat_interleave(2)
rot = lambda v, p: reference.apply_rope_ref(v, ang(p).cos(), ang(p).sin(), interleaved=True)
assert torch.allclose((rot(qs[:5], m_) * rot(ks[:5], n_)).sum(-1), score_indep[:5, m_ - n_])

# Summation by parts with h_{d/2} = 0, and the bound, for every pair and distance:
dh = torch.diff(h_indep, dim=1, append=torch.zeros(N, 1, dtype=h_indep.dtype))   # h_{j+1} - h_j
assert torch.allclose(h_indep @ phase.T, -(dh @ S_j.T))
upper = dh.abs().max(dim=1).values[:, None] * S_j.abs().sum(dim=1)[None, :]      # [N, 257]
assert torch.all(score_indep.abs() <= upper)

# Independent pairs: mean 0 and spread sqrt(d) at every distance (within sampling error).
mean_indep, std_indep = score_indep.mean(dim=0), score_indep.std(dim=0)
assert torch.all(mean_indep.abs() < 4 * std_indep / math.sqrt(N))
assert torch.all((std_indep / math.sqrt(d) - 1).abs() < 0.1)
# Equal pairs: the mean follows the decaying curve of q = k = 1.
mean_same, std_same = score_same.mean(dim=0), score_same.std(dim=0)
assert torch.all((mean_same - ones_score).abs() < 4 * std_same / math.sqrt(N))
assert ones_score[200:].abs().max() < 0.5 * ones_score[0]

print(f"{'m - n':>6} {'bound':>7} {'q=k=1':>7} {'mean, k=q':>10} {'mean, indep.':>13} "
      f"{'std, indep.':>12} {'bound / |score|':>16}")
for i in (0, 10, 50, 100, 250):
    ratio = (upper[:, i] / score_indep[:, i].abs()).median().item()
    print(f"{i:6d} {bound[i].item():7.2f} {ones_score[i].item():7.1f} {mean_same[i].item():10.1f} "
          f"{mean_indep[i].item():13.2f} {std_indep[i].item():12.1f} {ratio:16.0f}")
print(f"(N = {N} random pairs; sqrt(d) = {math.sqrt(d):.1f}; "
      "the last column is the median over pairs)")
falls = [bound[0].item() / bound[250].item(), ones_score[0].item() / ones_score[250].abs().item()]
print(f"from distance 0 to 250 the bound falls {falls[0]:.1f}x, the k = q curve {falls[1]:.1f}x")
bound_over_score = [(upper[:, i] / score_indep[:, i].abs()).median().item()
                    for i in (0, 10, 50, 100, 250)]
assert [round(f, 1) for f in falls] == [5.0, 3.3], falls
assert 100 <= min(bound_over_score) and max(bound_over_score) < 10_000, bound_over_score
# q = k = 1: max |h_{j+1} - h_j| = 2 (only the last step, h_{d/2} - h_{d/2-1}, is not 0)
ones_over_score = (2 * S_j.abs().sum(dim=1) / ones_score.abs()).min().item()
print(f"q = k = 1: the bound 2 sum_j |S_j| is at least {ones_over_score:.1f} times the score "
      "at every distance 0..256")
assert ones_over_score > 18

# %% [markdown]
# Where the weight sits. Three profiles $h_j$, real and positive, of about the same score at
# distance 0: all pairs alike ($q = k = \mathbf 1$), falling with $j$ (weight on the fast
# pairs), and all on the slowest pair ($q = k$ with only pair 63 nonzero).

# %%
slowest_turns = 8192 * theta128[-1].item() / (2 * math.pi)      # turns of the slowest pair
print(f"the slowest pair turns {slowest_turns:.2f} of a full turn over 8192 tokens")
assert slowest_turns < 1 / 6
def profile_score(h, at):
    """Re sum_j h_j e^{i at theta_j} for a real h [64], at every distance of `at`."""
    return (h * torch.cos(at[:, None] * theta128)).sum(dim=1)
falling_score = profile_score(4 * (1 - torch.arange(d // 2, dtype=f64) / (d // 2)), dist)
far = torch.arange(0, 8193, dtype=f64)
slowest_only = profile_score(torch.zeros(d // 2, dtype=f64).index_fill(0, torch.tensor([63]), d),
                             far)
kept = {name: (sc[128:].abs().max() / sc[0]).item()
        for name, sc in (("q = k = 1", ones_score), ("h_j falling", falling_score))}
print("largest |score| at distance 128..256, as a share of the score at 0: "
      + ", ".join(f"{name} {v:.0%}" for name, v in kept.items())
      + f"; q = k on the slowest pair keeps at least {(slowest_only.min() / slowest_only[0]):.0%}"
      " of its score up to distance 8192")
assert all(v < 0.5 for v in kept.values())                 # spread over the pairs: decays 2x
assert slowest_only.min() > 0.5 * slowest_only[0]          # the slowest pair: more than half

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
ax1.plot(dist, bound, label=r"relative upper bound $\frac{1}{d/2}\sum_j |S_j|$")
ax1.plot(dist, ones_score * bound[0] / ones_score[0], lw=1, alpha=0.7,
         label=r"score of $q=k=\mathbf{1}$ (scaled to the same start)")
ax1.set(xlabel="relative distance m − n", ylabel="relative upper bound",
        title="The bound decays (RoFormer Fig. 2), d = 128, b = 10000")
ax1.legend(fontsize=8)
ax1.grid(alpha=0.3)
ax2.fill_between(dist, mean_indep - std_indep, mean_indep + std_indep, color="C2", alpha=0.2,
                 label=r"$q, k$ independent: mean $\pm$ one std")
ax2.plot(dist, mean_indep, color="C2", lw=1.2, label=r"$q, k$ independent: mean score")
ax2.plot(dist, mean_same, color="C1", lw=1.2, label=r"$k = q$: mean score")
ax2.plot(dist, ones_score, color="k", lw=0.8, ls="--", label=r"$\sum_j 2\cos((m-n)\theta_j)$")
ax2.plot(dist, slowest_only[:257], color="C3", lw=1.2, ls=":",
         label=r"$q = k$ on the slowest pair only (same score at 0)")
ax2.axhline(0, color="gray", lw=0.5)
ax2.set(xlabel="relative distance m − n", ylabel=r"score $\langle R_m q, R_n k\rangle$",
        title=f"Scores by distance: mean of {N} random pairs, and fixed profiles")
ax2.legend(fontsize=8, loc="upper right", bbox_to_anchor=(1, 0.93))
ax2.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(FIGURES / "01-long-term-decay.png", dpi=120)
plt.show()

# %% [markdown]
# Left: the bound decays, as in RoFormer's Figure 2. Right: independent $q, k$ score zero on
# average at every distance, with a spread that does not shrink; $k = q$ decays, more slowly
# than the bound; $q = k$ on the slowest pair alone (dotted) stays level.

# %% [markdown]
# ## 7. Rotate-half vs interleaved: one rotation, two pairings
#
# Meta's original Llama code pairs neighbours, as the paper does. GPT-NeoX, Hugging Face's Llama
# port and Transformer Engine (by default) do not. They pair feature $i$ with feature $i + d/2$
# and use
#
# $$ \mathrm{rotate\_half}(x) = (-x_{d/2}, \dots, -x_{d-1},\ x_0, \dots, x_{d/2-1}), $$
#
# with the angle table `cat(f, f)` instead of `f0 f0 f1 f1 ...`. Both are the same rotation of
# the same pairs up to *where the features sit*: moving the even features to the first half
# and the odd ones to the second turns one pairing into the other. This is why a checkpoint
# trained with one convention can be converted to the other by permuting the rows of
# $W_q$ and $W_k$ (Hugging Face's conversion script for Meta's Llama checkpoints does exactly
# that) — and why mixing the two up silently gives a wrong model, not an error.
#
# The two angle tables from `ropelib.frequencies.rope_freqs`:

# %%
d = 8
# the tables are float32 (as Transformer Engine's): printed to 6 digits, position 1's angles
print("rotate-half table:", [round(v, 6) for v in frequencies.rope_freqs(2, d)[1, 0, 0].tolist()])
print("interleaved table:",
      [round(v, 6) for v in frequencies.rope_freqs(2, d, interleaved=True)[1, 0, 0].tolist()])

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
# Why it works, as matrices. Let $P$ be the permutation matrix of `perm`
# ($Px = x_{[\mathrm{perm}]}$). Then $z = Px$ holds $x_{2j}$ in slot $j$ and $x_{2j+1}$ in slot
# $j + d/2$, and the table `cat(f, f)` gives both slots the angle $m\theta_j$. Rotate-half turns
# the slots $(j, j + d/2)$ together, so for $j < d/2$
#
# $$
# (R^{\text{half}}_m z)_j = z_j\cos m\theta_j - z_{j+d/2}\sin m\theta_j
# = x_{2j}\cos m\theta_j - x_{2j+1}\sin m\theta_j = (R^{\text{interleaved}}_m x)_{2j},
# $$
#
# and slot $j + d/2$ gives $(R^{\text{interleaved}}_m x)_{2j+1}$ the same way. That is
# $R^{\text{half}}_m P x = P R^{\text{interleaved}}_m x$ for every $x$; a permutation matrix is
# orthogonal ($P^{-1} = P^\top$), so $R^{\text{interleaved}}_m = P^\top R^{\text{half}}_m P$:
# the cell above, `[..., argsort(perm)]` being $P^\top$. The scores agree:
# $\langle P^\top R P q, P^\top R P k\rangle = \langle R\,Pq, R\,Pk\rangle$. That is the
# checkpoint conversion above, done on $q$ and $k$. Done on the weights, $Pq = (PW_q)\,x$: permute
# the rows of $W_q$ and $W_k$, head by head. Hugging Face's
# [`convert_llama_weights_to_hf.py`](https://github.com/huggingface/transformers/blob/v4.40.0/src/transformers/models/llama/convert_llama_weights_to_hf.py)
# does it with a one-line `permute`; the cell below copies that line, checks it is `perm` for one
# head, and compares the scores of one head's projections three ways: as trained (interleaved),
# converted (rows permuted, rotate-half), and loaded with the wrong pairing and no permutation.

# %%
hidden, tokens = 16, 5
W_q, W_k = torch.randn(d, hidden, dtype=f64), torch.randn(d, hidden, dtype=f64)   # one head
xs = torch.randn(tokens, hidden, dtype=f64)                # the hidden states of 5 tokens

def head_scores(Wq, Wk, interleaved):
    """<RoPE(W_q x_m), RoPE(W_k x_n)> for every pair of the 5 tokens: [tokens, tokens]."""
    f = frequencies.rope_freqs(tokens, d, interleaved=interleaved).double()
    rope = lambda W: reference.rope_reference((xs @ W.T)[:, None, None, :], f,
                                              interleaved=interleaved)[:, 0, 0]
    return rope(Wq) @ rope(Wk).T

def hf_permute(w, n_heads, dim1, dim2):    # Hugging Face's conversion script, its one line
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)

assert torch.equal(hf_permute(W_q, 1, d, hidden), W_q[perm])           # = perm, for one head
trained = head_scores(W_q, W_k, interleaved=True)
converted = head_scores(W_q[perm], W_k[perm], interleaved=False)
wrong = head_scores(W_q, W_k, interleaved=False)            # runs without an error
print(f"largest score change: converted {(converted - trained).abs().max().item():.1e}, "
      f"wrong pairing {(wrong - trained).abs().max().item():.2f} "
      f"(the scores' own spread: {trained.std().item():.2f})")
assert torch.allclose(converted, trained)
assert (wrong - trained).abs().max() > trained.std()

# %% [markdown]
# ### The elementwise form as a Triton kernel
#
# Both pairings fit one kernel: $y = x \odot \cos\boldsymbol\theta + \mathrm{sign} \odot
# x_{[\mathrm{partner}]} \odot \sin\boldsymbol\theta$, where feature $i$'s partner is $i \oplus 1$
# for neighbours and $i + d/2 \bmod d$ for halves, and the sign is $-1$ on the first member of a
# pair. One program rotates one position's $d$ features; `INTERLEAVED` is a compile-time
# constant, so each pairing compiles to its own code. It runs compiled on a GPU and in Triton's
# interpreter on a CPU; the cell checks it against section 2's $R_m x$ and section 7's
# permutation. `D` must be a power of two: `tl.arange(0, D)` has no other sizes, and the cell
# shows $D = 80$ refused (notebook 03, section 3.2, loads a power-of-two tile and masks the
# lanes past the end; exercise 5 asks you to do it here). Try a change: pair feature $i$ with
# $i \oplus 2$, or drop the minus sign on `first`, and rerun; the asserts catch both. Later
# notebooks grow this kernel into the library's.

# %%
import triton
import triton.language as tl


@triton.jit
def rope_rows_kernel(x_ptr, ang_ptr, y_ptr, D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """y[m] = x[m] * cos(ang[m]) + sign * x[m, partner] * sin(ang[m]) for the position m of this
    program; x, ang, y are contiguous [S, D] float32, ang one angle per feature."""
    m = tl.program_id(0)
    i = tl.arange(0, D)                                    # the features of position m
    if INTERLEAVED:
        partner, first = i ^ 1, i % 2 == 0                 # pairs (2j, 2j + 1)
    else:
        partner, first = (i + D // 2) % D, i < D // 2      # pairs (j, j + D/2)
    x = tl.load(x_ptr + m * D + i)
    x_partner = tl.load(x_ptr + m * D + partner)
    a = tl.load(ang_ptr + m * D + i)
    rotated = tl.where(first, -x_partner, x_partner)       # rotate_half(x), either pairing
    tl.store(y_ptr + m * D + i, x * tl.cos(a) + rotated * tl.sin(a))


def rope_rows(x, angles, interleaved):
    y = torch.empty_like(x)
    rope_rows_kernel[(x.shape[0],)](x, angles, y, D=x.shape[1], INTERLEAVED=interleaved)
    return y


S_k = 6
x_k = torch.randn(S_k, d, dtype=f64)                               # S_k positions, one head
inv8 = frequencies.inv_freq(d, dtype=f64)
ang_inter = (torch.arange(S_k, dtype=f64)[:, None] * inv8).repeat_interleave(2, dim=-1)
ang_half = ang_inter[:, perm]                                      # cat(f, f): the same angles
on_dev = lambda t: t.to(device=device, dtype=torch.float32).contiguous()
y_inter_k = rope_rows(on_dev(x_k), on_dev(ang_inter), interleaved=True).cpu().double()
want = torch.stack([R_from_reference(m_, inv8) @ x_k[m_] for m_ in range(S_k)])   # R_m x
y_half_k = rope_rows(on_dev(x_k[:, perm]), on_dev(ang_half), interleaved=False).cpu().double()
print(f"Triton kernel ({ropelib.runtime.mode()}): interleaved vs R_m x "
      f"{(y_inter_k - want).abs().max().item():.1e}; rotate-half of x[perm], put back, vs "
      f"interleaved {(y_half_k[:, inverse] - y_inter_k).abs().max().item():.1e}")
assert torch.allclose(y_inter_k, want, atol=1e-5, rtol=0)          # float32 in the kernel
assert torch.allclose(y_half_k[:, inverse], y_inter_k, atol=1e-6, rtol=0)
try:                                                               # a head dim of 80
    rope_rows(on_dev(torch.randn(2, 80)), on_dev(torch.zeros(2, 80)), interleaved=True)
    raise AssertionError("D = 80 should have been refused")
except Exception as exc:   # CompilationError on a GPU, InterpreterError in the interpreter
    assert "power of 2" in str(exc)
    print("D = 80:", type(exc).__name__, "->",
          next(l for l in str(exc).splitlines() if "power of 2" in l).strip())

# %% [markdown]
# ## Exercises
#
# Replace the `...`, rerun the cell and read its ✅ or ❌ line; a wrong answer never stops the
# notebook. The solutions are folded away below each exercise. (The `;` after a check only
# stops Jupyter from echoing its `True`/`False`.)
#
# The checks want your own formulas. They run your function with ropelib's RoPE code barred
# (`ropelib.reference`, as `R_from_reference` above uses it, `ropelib.frequencies`, the course's
# helpers and the worked solutions), and other libraries' RoPE functions too (transformers',
# Transformer Engine's, flash-attn's), so calling one fails even when the numbers are right;
# plain PyTorch is yours. They also try sizes, bases and inputs other than this notebook's, some
# drawn anew on every run, so the function must work from its arguments. Their messages call
# the size $R$ (the rotary dim, here all of $d$): "R=8, base=10000, m=0" is $d = 8$,
# $b = 10000$, position 0.
#
# **Exercise 1 — the rotation matrix.** Write `rotation_matrix(m, inv_freq)` that returns the
# $[d, d]$ block-diagonal $R_m$ for the interleaved pairing ($d = 2\cdot$`len(inv_freq)`),
# building the $2\times2$ blocks yourself: no `torch.block_diag`, whichever way it is called
# (nor SciPy's); the check refuses them. `inv_freq` is float64; compute in float64 too.

# %%
from ropelib.course.exercises import solution
from ropelib.course.exercises import basics


def rotation_matrix(m, inv_freq):
    ...   # your code: a [d, d] float64 tensor


basics.check_rotation_matrix(rotation_matrix);

# %%
solution(basics.solution_rotation_matrix)

# %% [markdown]
# **Exercise 2 — the score from complex pairs.** Section 4 wrote the score of a query at
# position $m$ and a key at position $n$ as
# $g(q, k, n-m) = \mathrm{Re}\sum_j q_j\, \overline{k_j}\, e^{-i(n-m)\theta_j}$, with the pairs
# read as complex numbers, $q_j = q_{2j} + i\,q_{2j+1}$ and $k_j = k_{2j} + i\,k_{2j+1}$. Write
# `relative_score(q, k, offset, inv_freq)` that computes this sum, `offset` being $n - m$:
# `q` and `k` are float64 vectors of $d$ features, the result is one number. Work with the
# complex pairs, not with rotation matrices: the check compares your number with the rotated dot
# product $(R_m q)^\top (R_n k)$ for several $m$ and $n$, $n < m$ (a negative offset) among
# them. It refuses an answer that calls a named rotation: ropelib and the course's RoPE helpers,
# the rotations this notebook defines (`rot2`, `R_from_reference`, `rope_at`, your
# `rotation_matrix` of exercise 1), PyTorch's and SciPy's `block_diag`, and library RoPE
# functions such as transformers'. It does not see a $2 \times 2$ rotation built inline, so
# keeping to complex pairs is up to you. Which pair is conjugated and the sign of the offset
# are where it goes wrong: a wrong sign still gives the right score at $m = n$, which is why
# the check tries $n < m$ and $n > m$.

# %%
def relative_score(q, k, offset, inv_freq):
    ...   # your code: one number, Re sum_j q_j conj(k_j) e^{-i offset theta_j}


basics.check_relative_score(relative_score);

# %%
solution(basics.solution_relative_score)

# %% [markdown]
# **Exercise 3 — rotate_half.** Implement both pairings of `rotate_half(x, interleaved)`:
# on halves $u = (x_0, \dots, x_{d/2-1})$ and $v = (x_{d/2}, \dots, x_{d-1})$,
# $[u, v] \to [-v, u]$; on neighbours, $(x_0, x_1, x_2, x_3, \dots) \to
# (-x_1, x_0, -x_3, x_2, \dots)$.

# %%
def rotate_half(x, interleaved=False):
    ...   # your code


basics.check_rotate_half(rotate_half);

# %%
solution(basics.solution_rotate_half)

# %% [markdown]
# **Exercise 4 — the way back.** Section 7 turned interleaved into rotate-half. Write
# `perm_back(d)` that returns the permutation for the other direction, for any even $d$: the
# `perm` such that rotate-half RoPE$(x)$ =
# interleaved RoPE$(x[\dots, \mathrm{perm}])[\dots, \mathrm{argsort(perm)}]$.
# The check tries $d = 8$ and other sizes, applying both RoPEs to random inputs with your
# permutation.

# %%
def perm_back(d):
    ...   # your code: a list of d ints


basics.check_interleave_permutation(perm_back, to="interleaved");

# %% [markdown]
# The worked solution below serves both directions with one function:
# `solution_interleave_permutation(d, to="rotate_half")` is section 7's permutation and
# `solution_interleave_permutation(d, to="interleaved")` is `perm_back(d)`.

# %%
solution(basics.solution_interleave_permutation)

# %% [markdown]
# **Exercise 5 — the angle in the kernel, for any head dim.** `rope_rows_kernel` reads one
# angle per feature from an $[S, D]$ table. Write `my_angle_kernel` (interleaved pairs only)
# that reads just the $D/2$ frequencies $\theta_j$ (`inv_ptr`, float32) and forms each angle
# itself: program $m$ rotates row $m$ of `x` to position `start` $+\,m$, by the angle
# $(\text{start} + m)\,\theta_j$ on pair $j$. It must also take a head dim that is not a power
# of two, such as $D = 80$, refused above: the check passes `BLOCK = triton.next_power_of_2(D)`,
# so load a tile of `BLOCK` lanes and switch off the lanes $i \ge D$ with a mask, in every load
# and in the store. The check launches one program per row on $D = 8$, $80$ and $6$, with $x$,
# the base and `start` drawn when it runs, and compares with $R_m x$ computed in float64. It
# fills the output with NaN inside guard bands, so an element never written or a store past the
# row shows, and it refuses a kernel that launches or calls ropelib's kernels or this notebook's
# `rope_rows_kernel`. Keep the `my_` name: the check bars the notebook's other kernels.

# %%
from ropelib.course.exercises import nb01_angle_kernel


@triton.jit
def my_angle_kernel(x_ptr, inv_ptr, y_ptr, start, D: tl.constexpr, BLOCK: tl.constexpr):
    """y[m] = R_{start+m} x[m]: x, y [S, D] float32, contiguous; inv [D/2] float32."""
    ...   # your code


nb01_angle_kernel.check_angle_kernel(my_angle_kernel);

# %%
solution(nb01_angle_kernel.solution_angle_kernel.fn,
         title="Solution: the angle in the kernel, a masked tile")

# %% [markdown]
# ## Questions for a study group
#
# 1. Independent random $q$ and $k$ score 0 on average at every distance, so the long-term
#    decay only matters if training makes $\mathbb E[q_j \overline{k_j}]$ large and smooth across
#    the pairs $j$. Given the $q$ and $k$ of a trained model, how would you find out whether a
#    head uses the decay, ignores it, or works against it?
# 2. The scores depend only on $n - m$, yet causal language models with RoPE and no other
#    position signal can tell how far into a text a token is. Where can that information come
#    from?
# 3. The slowest pairs barely turn over a whole training context, so they behave almost like
#    unrotated features. What could a model use them for, and what happens to them, and to the
#    fastest pairs, under linear scaling versus NTK or YaRN when the context is made longer?
# 4. Interleaved and rotate-half pairings give the same scores once $W_q$ and $W_k$ are
#    permuted. Why does the choice still matter to a kernel author, and what would you expect
#    to see if a checkpoint were loaded with the wrong pairing and no permutation?
# 5. RoPE rotates queries and keys but not values. What would change if the values were rotated
#    by their position too, and how could the output be made to depend on relative positions
#    only again?
# 6. The angle tables are float32, as Transformer Engine's are, and hold $m\theta_j$ itself. At
#    $m = 500\,000$, how far apart are neighbouring float32 numbers near $m\theta_0$, and what
#    does that do to the fastest pair's rotation? Which pairs are safe, and what would you change:
#    compute $m\theta_j$ in float64, reduce it modulo $2\pi$ first, or build the table from
#    $\cos$ and $\sin$ of smaller steps? (Notebook 08, section 3b, shows what one ulp, one unit
#    in the last place or the gap between neighbouring floats, of a sine or cosine does to the
#    output.)
#
# **A start on question 6 (optional).** The cell below builds row $m = 500\,000$ of the float32
# angle table ($d = 128$, $b = 10000$) and compares it with $m\theta_j$ in float64. Near
# $m\theta_0$ the float32 numbers are $2^{-5}$ rad apart, and no angle of the row is larger, so
# rounding the product alone costs at most half that spacing. Pair 0 comes out exact
# ($\theta_0 = 1$, and $500\,000$ is a float32 number). The largest error, at pair 1, is more than
# half the spacing (both printed): $\theta_j$ is itself rounded to float32 before the multiply,
# and $m$ scales that error up. A fast pair's output is then off by about as much relative to its
# length, far beyond float32's own relative precision, $2^{-24}$. The error shrinks with
# $m\theta_j$, so the slow pairs are safe (the cell prints from which pair on). Reducing the
# float32 angle modulo $2\pi$ afterwards cannot help (the error is already in it); forming
# $m\theta_j$ in float64, or in exact fixed point as `ropelib.rope_angles` does, and reducing
# before rounding to float32 does. Notebook 10, section 7, measures `rope_angles`' angles, a
# float32 angle table like this one and a bf16 cos/sin cache against float64 (integer and
# float64 arithmetic: the same numbers on any machine).

# %%
m_far, d_far = 500_000, 128
ang32 = frequencies.rope_freqs(1, d_far, offset=m_far)[0, 0, 0, : d_far // 2].double()
err = (ang32 - m_far * frequencies.inv_freq(d_far, dtype=f64)).abs()   # [64], radians
a32 = torch.tensor(float(m_far), dtype=torch.float32)
spacing = (torch.nextafter(a32, torch.tensor(math.inf)) - a32).item()
last_bad = int((err > 1e-3).nonzero().max())
print(f"float32 spacing near m*theta_0 = {m_far}: {spacing} rad; largest angle error "
      f"{err.max().item():.3f} rad (pair {int(err.argmax())}); every pair after pair "
      f"{last_bad} is within 1e-3 rad")
assert spacing == 2 ** -5 and spacing / 2 < err.max().item() < spacing   # more than half of it
assert err[0] == 0 and int(err.argmax()) == 1          # pair 0 exact, the largest error at pair 1
assert bool((err[last_bad + 1:] < 1e-3).all()) and last_bad < d_far // 2 - 1
