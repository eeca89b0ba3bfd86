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
# # 07 — Debugging the `allclose` that failed
#
# An earlier RoPE-in-Triton project wrote a Triton RoPE after Unsloth's kernel and
# checked it against Transformer Engine's fused RoPE with
#
# ```python
# assert torch.allclose(tokens_te, tokens_triton)
# ```
#
# The assert failed — although the first ten printed values of both tensors were identical
# (0.6490, 2.5151, 0.0706, …). The cause was never found. In this notebook we reproduce the
# failure and then find, one by one, everything that can make such a check fail, with the
# tools that find it: an error map over position × feature, the location of the largest
# difference, errors in ulps, and tolerances that fit the dtype.
#
# **After this notebook you will be able to**
#
# - say why the first printed values of a RoPE output prove nothing;
# - choose `allclose` tolerances from the dtype, and measure errors in ulps against fp64;
# - tell which precision choices cost accuracy: where sin/cos come from (a table in the input
#   dtype, an fp32 table, or computed in the kernel), the dtype of the math, fused multiply-add;
# - recognise six layout traps: sbhd vs bshd position indexing, TE's duplicated `[s,1,1,d]`
#   angles vs an `[s, d/2]` table, interleaved vs rotate-half pairs, partial rotary, table
#   margins and an in-place kernel that rotates a tensor twice;
# - write the comparison that passes for the right reasons.
#
# **What runs here.** The Triton side is a small teaching kernel in `ropelib.debug`, *the
# reproduction* — not ropelib's kernel — with one switch per cause. The TE side is the real TE
# fused kernel when Transformer Engine is installed on a GPU; otherwise
# `ropelib.reference.te_fused_emulation`, which computes what TE's CUDA kernel computes (fp32
# sin/cos of fp32 angles, fp32 multiply-add, one rounding) and is labelled **TE emulation**.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
import dataclasses
import inspect
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import HTML, display

from ropelib import debug, runtime, widgets
from ropelib.debug import FIXED, REPRO, Causes

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "ropelib").is_dir())
FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
GPU = runtime.on_gpu()
SC = (debug.Scenario(seq_len=512, batch=2, heads=8, head_dim=128) if GPU
      else debug.Scenario(seq_len=32, batch=2, heads=2, head_dim=32))
print(runtime.mode(), "| TE side:", debug.te_label(device), "|", SC)

# %% [markdown]
# ## 1. The failure, reproduced
#
# `tokens` is a bf16 tensor in TE's default `sbhd` layout, $[S, B, H, D]$. The learner's
# wrapper `apply_rotary_pos_emb_triton` builds a cos/sin table from TE's angles and launches the
# Unsloth-style kernel; then TE rotates the same tokens. The reproduction kernel carries what
# Unsloth's kernel inherits from Hugging Face: a cos/sin table **precomputed in the model's
# dtype**, and the multiply-add done **in that dtype** (`Q1 = tl.load(...).to(sin1.dtype)`).

# %%
print(inspect.getsource(debug._rope_unsloth_repro_kernel.fn))

# %%
res = debug.reproduce(SC, REPRO, device=device)
tokens_te, tokens_triton = res.tokens_te, res.tokens_triton
print(res.te_label, tokens_te.flatten()[:10])
print("Triton     ", tokens_triton.flatten()[:10])
try:
    assert torch.allclose(tokens_te, tokens_triton)
    print("allclose passed")
except AssertionError:
    print("AssertionError: torch.allclose(tokens_te, tokens_triton) is False")

d = debug.diagnose(res)
assert d["first_ten_equal"] and not d["allclose"]   # the reported failure, reproduced

# %% [markdown]
# ## 2. Position 0 proves nothing — look where the differences are
#
# `tokens.flatten()[:10]` are the first features of token 0 (sbhd: position 0, batch 0,
# head 0). At position $s = 0$ every angle is $\theta = s\,\omega_j = 0$, so
# $\cos\theta = 1$, $\sin\theta = 0$ and
#
# $$ y_j = x_j \cdot 1 - x_{j+D/2} \cdot 0 = x_j \quad\text{exactly, in any precision.} $$
#
# Any RoPE — right, wrong, bf16 or fp64 — returns its input at position 0. The values to print
# are the ones where the two tensors differ most: an **error map** (max over batch and heads of
# $|a - b|$, per position and feature) and its **argmax**.

# %%
pos0 = slice(0, 1)
assert torch.equal(tokens_te[pos0], tokens_triton[pos0])           # position 0: identical
assert torch.equal(tokens_te[pos0], res.x[pos0])                   # ... and equal to the input
emap = debug.error_map(tokens_te, tokens_triton, res.layout)
loc = d["argmax"]
print(f"largest difference {loc['abs_diff']:.4g} at position {loc['position']}, batch "
      f"{loc['batch']}, head {loc['head']}, dim {loc['dim']}: {res.te_label} {loc['a']:.5g} "
      f"vs Triton {loc['b']:.5g}; {d['n_mismatched']} of {d['numel']} elements fail allclose")
fig, ax = plt.subplots(figsize=(6, 4))
debug.plot_heatmap(emap, ax=ax, title=f"|{res.te_label} - Triton|, reported failure (bf16)")
ax.plot([loc["dim"]], [loc["position"]], "c+", ms=14, mew=2)
fig.tight_layout()
fig.savefig(FIGURES / "07-heatmap-repro.png", dpi=110)
plt.show()
assert loc["position"] > 0 and emap[0].max() == 0

# %% [markdown]
# ![Error map of the reported failure: zero at position 0, differences everywhere else](../figures/07-heatmap-repro.png)
#
# Row 0 is black (no difference); every other position differs somewhere, by up to a few bf16
# steps. The differences are small — but how small is small?

# %% [markdown]
# ## 3. Tolerances that fit the dtype, and errors in ulps
#
# `torch.allclose(a, b)` checks elementwise
#
# $$ |a - b| \le \text{atol} + \text{rtol}\,|b|, \qquad \text{rtol} = 10^{-5},\
#    \text{atol} = 10^{-8} \text{ by default.} $$
#
# bf16 keeps 8 significant bits: neighbouring bf16 numbers are $2^{-8}$ to $2^{-7}$ apart
# relative to their size (fp16: 11 bits, fp32: 24). The default `rtol` asks bf16 for about 17
# bits — a difference of *one* rounding step fails it. Tolerances must come from the dtype
# (`ropelib.debug.tolerances`, the same values as `torch.testing.assert_close`):

# %%
for name in ("bf16", "fp16", "fp32"):
    print(f"{name}: {debug.tolerances(name)}   eps = {torch.finfo(debug.DTYPES[name]).eps:.3g}")

# %% [markdown]
# The sharper measure is the error in **ulps** (units in the last place): $|y - y^\star|$
# divided by the spacing of the output dtype at the exact value $y^\star$, computed in fp64.
# A correctly rounded result is within 0.5 ulp. Compare both sides with fp64, not only with
# each other:

# %%
fixed = debug.reproduce(SC, FIXED, device=device)
rows = []
for label, r in (("reported failure", res), ("all causes fixed", fixed)):
    dd, dt = debug.diagnose(r, "default"), debug.diagnose(r, "dtype")
    rows.append((label, dd["allclose"], dd["n_mismatched"], dt["allclose"], dt["n_mismatched"],
                 dd["te_max_ulp"], dd["triton_max_ulp"]))
display(HTML("<table><tr><th></th><th>allclose default</th><th>mismatches</th>"
             "<th>allclose dtype-aware</th><th>mismatches</th><th>TE max ulp vs fp64</th>"
             "<th>Triton max ulp vs fp64</th></tr>" +
             "".join("<tr>" + "".join(f"<td>{v:.3g}</td>" if isinstance(v, float) else
                                      f"<td>{v}</td>" for v in row) + "</tr>" for row in rows) +
             "</table>"))
fx = debug.diagnose(fixed, "dtype")
# one rounding of an fp32 result: 0.5 ulp, plus what fp32's own error shows near zero
assert fx["allclose"] and fx["triton_max_ulp"] <= 1.0 and fx["te_max_ulp"] <= 1.0
assert rows[0][6] > 4 * rows[1][6]     # the reported kernel is many ulps off fp64
print("fixed kernel vs TE, default tolerances:", "pass" if rows[1][1] else
      f"fail ({rows[1][2]} elements one bf16 step apart)")

# %% [markdown]
# Two lessons. The default tolerances are no test for bf16: two *correct* bf16 kernels pass
# them only when their fp32 intermediates round to the same bf16 value everywhere. Computed
# with slightly different sin/cos (TE's CUDA `sincosf`, Triton's `tl.cos`, a `torch.cos`
# table), a value near a rounding boundary lands on one side in one kernel and on the other
# side in the other — one bf16 step apart, and `allclose` fails. (Here the fixed kernel and the
# emulation use the same fp32 sin/cos and agree bit for bit; against the real TE on a GPU they
# need not.) And the reported kernel is worse than one step: it is many ulps from the exact
# result near outputs close to zero, where its rounded products cancel. The next section
# finds why.

# %% [markdown]
# ## 4. Where sin/cos come from, the dtype of the math, and FMA
#
# The rotation of a pair is $y_1 = x_1 c - x_2 s$, $y_2 = x_2 c + x_1 s$. Each variant below
# changes one thing on the fixed kernel:
#
# - **table in the input dtype**: $c, s$ rounded to bf16 before use, an error of up to
#   $2^{-9}$ relative in each — and the two products can cancel, so the *output's* relative
#   error near zero is much larger;
# - **math in the input dtype**: each product rounded to bf16 before the subtraction;
# - **fp32 table** (precomputed with `torch.cos` in fp32) vs **sin/cos in the kernel** from
#   fp32 angles, as TE's kernel does: both fine, they may differ in the last fp32 bit;
# - **fused multiply-add** $\mathrm{fma}(x_1, c, -x_2 s)$ rounds once instead of twice. A GPU
#   compiler contracts `a*b + c` into an FMA on its own; the interpreter (NumPy) does not, so
#   the order of operations can change the last fp32 bit — invisible after rounding to bf16.

# %%
variants = {
    "table bf16, math bf16 (reported)": REPRO,
    "table bf16, math fp32": Causes(table_in_input_dtype=True, math_in_input_dtype=False),
    "table fp32, math fp32": Causes(table_in_input_dtype=False, math_in_input_dtype=False),
    "sin/cos in kernel, fp32 (fixed)": FIXED,
    "sin/cos in kernel + FMA": dataclasses.replace(FIXED, fma=True),
}
prec = {}
for label, causes in variants.items():
    dg = debug.diagnose(debug.reproduce(SC, causes, device=device), "dtype")
    prec[label] = dg
    print(f"{label:34s} max ulp vs fp64 {dg['triton_max_ulp']:8.3g}   max |TE - Triton| "
          f"{dg['max_abs_diff']:.3g}   dtype-aware allclose vs TE: {dg['allclose']}")
fig, ax = plt.subplots(figsize=(7, 3))
ax.barh(list(prec), [v["triton_max_ulp"] for v in prec.values()], color="tab:purple")
ax.set_xscale("log")
ax.set_xlabel("max error vs fp64 (bf16 ulps, log scale)")
ax.axvline(0.5, color="gray", ls=":")
ax.invert_yaxis()
fig.tight_layout()
fig.savefig(FIGURES / "07-precision.png", dpi=110)
plt.show()
assert prec["sin/cos in kernel, fp32 (fixed)"]["triton_max_ulp"] <= 1.0
assert prec["table fp32, math fp32"]["triton_max_ulp"] <= 1.0
assert prec["table bf16, math bf16 (reported)"]["triton_max_ulp"] > 4
assert prec["table bf16, math fp32"]["triton_max_ulp"] > 1.0

# %% [markdown]
# ![Max error vs fp64 per precision variant](../figures/07-precision.png)
#
# The rule for precision: keep the table in fp32 (or compute sin/cos from fp32 angles), do the
# math in fp32, round once on the store — what TE's fused kernel and ropelib's kernel do.

# %% [markdown]
# ## 5. Six layout traps — all invisible at position 0
#
# Each trap below is switched on, alone, on top of the fixed kernel. None of them changes the
# first ten printed values; each shows up at once in the error map.
#
# - **sbhd vs bshd indexing.** Unsloth's kernel flattens a *bshd* tensor into rows
#   $r = bS + s$ and takes the position as $r \bmod S = s$. Fed an sbhd tensor, rows are
#   $r = sB + b$ and $r \bmod S = (sB + b) \bmod S \ne s$.
# - **TE's duplicated angles.** TE's `freqs` is $[S, 1, 1, D]$ holding `cat(f, f)`: each row has
#   every angle twice. `freqs.view(-1, D // 2)` looks like an $[S, D/2]$ table but its row $p$
#   is `f[p // 2]`: position $p$ gets the angles of $\lfloor p/2 \rfloor$. The right table is
#   `freqs[:, 0, 0, :D // 2]`.
# - **interleaved vs rotate-half.** The model pairs $(2j, 2j+1)$ (GPT-J; TE `interleaved=True`)
#   while the kernel pairs $(j, j + D/2)$.
# - **partial rotary.** The model rotates only the first $R = 0.5\,D$ features with
#   frequencies $\omega_j = 10000^{-2j/R}$; the kernel rotates all $D$ with $10000^{-2j/D}$.
# - **table margins.** The table has $P = S + m$ rows (TE's tests use a margin); a kernel that
#   takes the modulus from the table, $r \bmod P$, is right for batch 0 and shifted by
#   $bm$ positions for batch $b$.
# - **in-place double rotation.** Unsloth's kernel rotates $Q$ in place. Run it first and TE
#   then rotates the already rotated tokens: TE's output is the one that is wrong, by $2\theta$.

# %%
traps = ["sbhd_row_indexing", "te_freqs_reshaped", "interleaved_mismatch",
         "partial_rotary_ignored", "table_margin", "inplace_double_rotation"]
fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
summary = []
for ax, trap in zip(axes.flat, traps):
    sc = dataclasses.replace(SC, layout="bshd") if trap == "table_margin" else SC
    r = debug.reproduce(sc, dataclasses.replace(FIXED, **{trap: True}), device=device)
    dg = debug.diagnose(r, "dtype")
    debug.plot_heatmap(debug.error_map(r.tokens_te, r.tokens_triton, r.layout), ax=ax,
                       title=f"{trap} ({sc.layout})")
    summary.append((trap, dg["first_ten_equal"], dg["allclose"], dg["max_abs_diff"],
                    dg["argmax"]["position"], dg["argmax"]["batch"], dg["te_matches_fp64"],
                    dg["triton_matches_fp64"]))
    assert dg["first_ten_equal"] and not dg["allclose"], trap
fig.tight_layout()
fig.savefig(FIGURES / "07-layout-traps.png", dpi=100)
plt.show()
display(HTML("<table><tr><th>trap</th><th>first ten equal</th><th>allclose (dtype-aware)</th>"
             "<th>max diff</th><th>at position</th><th>batch</th><th>TE ≈ fp64</th>"
             "<th>Triton ≈ fp64</th></tr>" +
             "".join("<tr>" + "".join(f"<td>{v:.3g}</td>" if isinstance(v, float) else
                                      f"<td>{v}</td>" for v in row) + "</tr>"
                     for row in summary) + "</table>"))
by_trap = {row[0]: row for row in summary}
assert by_trap["inplace_double_rotation"][6:] == (False, True)   # TE is the wrong one here
assert all(row[6:] == (True, False) for t, row in by_trap.items() if t != "inplace_double_rotation")

# %% [markdown]
# ![Error maps of the six layout traps](../figures/07-layout-traps.png)
#
# The patterns tell the traps apart: the sbhd indexing error and the margin error depend on the
# batch (batch 0 of the margin trap is right, and row 0 of the sbhd map is lit by batch 1),
# the duplicated-angle table is right at position 0 only, partial rotary differs in every
# feature (other frequencies in the first half, and the kernel rotates the pass-through half),
# and the double rotation makes TE wrong — comparing with fp64 says which side to blame.

# %% [markdown]
# ## 6. Try it: toggle the causes
#
# Each checkbox switches one cause on. Watch `allclose`, the largest difference and where it is,
# and the error map. "the reported failure" and "all causes fixed" reset the boxes; the
# tolerance buttons switch between `allclose`'s defaults and dtype-aware tolerances.

# %%
panel = widgets.TogglePanel(SC, device=device)
panel

# %%
# The same panel driven from code (what the checkboxes do):
panel.set_causes(FIXED)
panel.tolerance.value = "dtype"
assert panel.diagnosis["allclose"]
panel.checkboxes["te_freqs_reshaped"].value = True
assert not panel.diagnosis["allclose"] and panel.diagnosis["first_ten_equal"]
panel.checkboxes["te_freqs_reshaped"].value = False
assert panel.diagnosis["allclose"]

# %% [markdown]
# ## 7. The rule, and the comparison that passes
#
# 1. **Compare against a higher-precision reference**, not only kernel against kernel:
#    `ropelib.reference.rope_reference` in fp64 tells which side is wrong.
# 2. **Use tolerances from the dtype** (`debug.tolerances`, `torch.testing.assert_close`'s
#    defaults) and report errors in ulps.
# 3. **Look away from position 0**: print the values at the argmax of the difference, test
#    with batch > 1, a table longer than the sequence, partial rotary and both pairings.
# 4. **Give each call fresh inputs** (or clone): an in-place kernel rotates shared tensors.
#
# With every cause fixed:

# %%
tol = debug.tolerances(fixed.tokens_te.dtype)
exact = fixed.reference                                      # fp64, never rounded
assert torch.allclose(fixed.tokens_triton.double(), exact, **tol)
assert torch.allclose(fixed.tokens_te.double(), exact, **tol)
assert torch.allclose(fixed.tokens_te, fixed.tokens_triton, **tol)
far = slice(SC.seq_len // 2, None)                           # positions far from 0
assert torch.allclose(fixed.tokens_te[far], fixed.tokens_triton[far], **tol)
ulps = debug.ulp_error(fixed.tokens_triton, exact)
print(f"fixed: allclose with {tol} passes; max error {float(ulps.max()):.3g} ulp, "
      f"mean {float(ulps.mean()):.3g} ulp vs fp64")

# %% [markdown]
# ## What we found
#
# The reported check compared a bf16 kernel with a bf16 kernel at `allclose`'s fp32-sized
# default tolerances and printed the one place where every RoPE agrees. The reproduction fails
# for the reasons Unsloth's design carries (a bf16 cos/sin table and bf16 products: many ulps
# near zero), and a correct bf16 kernel can still fail those tolerances by one rounding step.
# Six layout traps would have failed the same check in the same silent way. The fix is the
# comparison itself: fp64 reference, dtype-aware tolerances, errors in ulps, and a look at the
# argmax instead of the first ten values.
