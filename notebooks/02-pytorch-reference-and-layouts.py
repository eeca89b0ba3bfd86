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
# # 02 — The PyTorch reference, the layouts, and why unfused RoPE is slow
#
# Notebook 01 had one head and one sequence. Real models rotate tensors of
# `[sequence, batch, heads, head_dim]` in several memory layouts, with tables built two
# different ways, partial rotation, offsets for KV-cache decoding and context parallelism.
# `ropelib.reference` is the plain-PyTorch specification of all of it; every kernel is checked
# against it.
#
# **After this notebook you will be able to**
#
# - tell the `sbhd`, `bshd`, `bhsd` and `thd` layouts apart, write each one's strides and the
#   offset of an element, and view `sbhd` memory as `bshd` without a copy;
# - build Transformer Engine's angle table (`freqs`) and Hugging Face's cos/sin, and write HF's
#   rotary forward, `cos, sin` from `inv_freq` and `position_ids` (exercise 2);
# - use partial rotary (`rotary_percent`), position offsets (`start_positions`, `position_ids`)
#   and context-parallel positions (`cp_size`, `cp_rank`), also of a packed batch (exercise 1);
# - count the kernels and bytes of the unfused PyTorch version, and find where on a GPU it
#   loses more time to one fused kernel than its extra bytes account for (which kernels, and
#   what their loads look like; what the measurements leave open); write an eager
#   chain without two of those costs (exercise 4) and a Triton kernel that reads the
#   broadcast table once (exercise 5).
#
# **Time:** about two hours for the main path: an hour to read sections 1 to 6 (section 6, on
# speed, is half of it) and an hour for the five exercises (exercise 5, a Triton kernel, about
# 20 minutes of it). Optional, each marked where it starts: the end of section 6, which mimics
# PyTorch's slow kernel template trait by trait with four Triton kernels (about 15 minutes), and the
# appendix's two asides to section 6 (10 minutes). The cells run in under a minute on a CPU
# (Triton's interpreter; one cell compiles four kernels for sm_90, the architecture of the
# H100 and H200, which needs no GPU).

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
import importlib.util
from pathlib import Path

import matplotlib.pyplot as plt
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ropelib import frequencies, reference
from ropelib.bench.compare import error_metrics
from ropelib.course import kernel_bandwidth as kb
from ropelib.course.nb02_bf16_ties import near_bf16_tie
from ropelib.frequencies import rope_cos_sin, rope_freqs

FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "ropelib").is_dir())
GPU = device == "cuda"
# Small shapes in the interpreter (each kernel program is simulated in Python), real ones on a GPU.
S, B, H, D = (4096, 4, 32, 128) if GPU else (16, 2, 3, 32)
dtype = torch.bfloat16
torch.manual_seed(0)
print(f"{ropelib.runtime.mode()}  |  x: S={S}, B={B}, H={H}, D={D}, {dtype}")
# the committed GPU run of section 6, read before any cell runs; a GPU run writes its own table
# to LIVE_CSV (figures/ only with ROPELIB_WRITE_FIGURES=1), never over this file
KERNELS_CSV = ROOT / "figures" / "02-unfused-kernels.csv"
LIVE_CSV = FIGURES / "02-unfused-kernels-live.csv"
committed_rows, committed = kb.read_rows(KERNELS_CSV)
# how section 6 labels its printouts: LIVE (timed on this machine when the cell runs) or
# COMMITTED (the run kept in the file above, the one the text quotes)
LIVE = f"LIVE, timed now on this machine ({torch.cuda.get_device_name()})" if GPU else None
COMMITTED = (f"COMMITTED run, the one the text quotes ({KERNELS_CSV.relative_to(ROOT)}: "
             f"{committed['gpu']}, {committed['versions']})")

# %% [markdown]
# ## 1. The layouts
#
# | layout | shape | who uses it |
# |---|---|---|
# | `sbhd` | `[S, B, H, D]` | Megatron-LM, Transformer Engine's default |
# | `bshd` | `[B, S, H, D]` | flash-attention, most PyTorch code |
# | `bhsd` | `[B, H, S, D]` | Hugging Face's attention and `scaled_dot_product_attention` |
# | `thd`  | `[T, H, D]` + `cu_seqlens` | packed variable-length sequences, no padding |
#
# The rotation is the same in all of them. Notebook 01 wrote it for one head; with rotate-half
# pairing, a head's $R$ rotated features split into halves, feature $i < R/2$ pairs with
# $i + R/2$, and a token at position $m$ turns each pair by the angle $m\theta_i$, with
# $\theta_i = \mathrm{base}^{-2i/R}$:
#
# $$
# y_i = x_i\cos m\theta_i - x_{i+R/2}\sin m\theta_i, \qquad
# y_{i+R/2} = x_{i+R/2}\cos m\theta_i + x_i\sin m\theta_i .
# $$
#
# Every head of every token is rotated by the table row of its position; only the *addressing*
# differs between layouts. Element $(s, b, h, d)$ of a tensor with strides
# $(\sigma_s, \sigma_b, \sigma_h, \sigma_d)$ sits at offset
# $s\sigma_s + b\sigma_b + h\sigma_h + d\sigma_d$. In a contiguous tensor each stride is the product
# of the sizes after it, so the four layouts of this course place element $(s, b, h, d)$ (token
# $s$ of sequence $b$, head $h$, feature $d$) at
#
# | layout | shape | strides $(\sigma_s, \sigma_b, \sigma_h, \sigma_d)$ | offset of $(s,b,h,d)$ |
# |---|---|---|---|
# | `sbhd` | `[S, B, H, D]` | $(BHD,\ HD,\ D,\ 1)$ | $((sB + b)H + h)D + d$ |
# | `bshd` | `[B, S, H, D]` | $(HD,\ SHD,\ D,\ 1)$ | $((bS + s)H + h)D + d$ |
# | `bhsd` | `[B, H, S, D]` | $(D,\ HSD,\ SD,\ 1)$ | $((bH + h)S + s)D + d$ |
# | `thd` | `[T, H, D]` | $(HD,\ \text{none},\ D,\ 1)$ | $((c_b + s)H + h)D + d$ |
#
# where in `thd` sequence $b$ starts at row $c_b$ of the packed tensor (`cu_seqlens`, below).
# In every row $\sigma_d = 1$: a head's $D$ features are one contiguous run, which is what lets a
# kernel load a row, or its two halves, in wide accesses. The layouts differ only in where the
# tokens and the batch sit. (`ropelib.apply_rope` takes `sbhd`, `bshd` and `thd`; `bhsd`, HF's
# order, is what ropelib's Hugging Face drop-ins take.)
#
# A view changes the strides without moving a byte, so a tensor's layout name says the order
# of its dimensions, not its strides. `x_sbhd.transpose(0, 1)` is a `bshd` tensor with
# $(\sigma_s, \sigma_b) = (BHD, HD)$, `sbhd`'s strides, not the contiguous $(HD, SHD)$. HF's
# `[B, H, S, D]` query is a view too: `q_proj(x).view(B, S, H, D).transpose(1, 2)` has
# `bshd`'s strides $(HD, SHD, D, 1)$, not the `bhsd` row's. A kernel that takes strides reads
# such a view where it lies; one that assumes contiguous rows needs a `.contiguous()` copy
# first, which moves every byte once more. The cell prints both sets of strides
# (`(192, 96, 32, 1)` and `(96, 192, 32, 1)` for the CPU's $(S, B, H, D) = (16, 2, 3, 32)$, the
# GPU shape's on the page) and checks that the two calls give the same numbers.

# %%
freqs = rope_freqs(2 * S, D)                     # [2S, 1, 1, D] fp32 angles (longer than needed)
x_sbhd = torch.randn(S, B, H, D, device=device, dtype=dtype)
x_bshd = x_sbhd.transpose(0, 1)                  # a view: no bytes move
print("sbhd strides", x_sbhd.stride(), "| bshd view strides", x_bshd.stride(),
      "| same memory:", x_sbhd.data_ptr() == x_bshd.data_ptr())

y_sbhd = ropelib.apply_rope(x_sbhd, freqs.to(device), layout="sbhd")
y_bshd = ropelib.apply_rope(x_bshd, freqs.to(device), layout="bshd")
assert torch.equal(y_bshd, y_sbhd.transpose(0, 1))
ref = reference.rope_reference(x_sbhd, freqs.to(device), layout="sbhd")
torch.testing.assert_close(y_sbhd, ref)
print("sbhd and bshd agree; both match the fp64 reference")

# %% [markdown]
# In `thd` the sequences of a batch are concatenated along the token axis and
# `cu_seqlens` $= [c_0, c_1, \dots] = [0,\ l_0,\ l_0 + l_1, \dots]$ marks where each starts;
# positions restart at 0 in every sequence. Token $t$ of sequence $i$ ($c_i \le t < c_{i+1}$) is
# at position $p_t = t - c_i$. Packing avoids computing on padding.
#
# The cell prints the positions of the packed tokens on each side of every boundary between
# two sequences, and checks that the first token of every sequence is at position 0. The loop
# after it checks the rotation: each sequence, rotated alone from position 0, gives the same
# rows as the packed call.

# %%
lengths = [5, 11, 3] if not GPU else [1000, 3000, 96]
cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                          device=device)
T = int(cu_seqlens[-1])
x_thd = torch.randn(T, H, D, device=device, dtype=dtype)
y_thd = ropelib.apply_rope(x_thd, freqs.to(device), layout="thd", cu_seqlens=cu_seqlens)
p_thd = reference.positions("thd", 0, cu_seqlens=cu_seqlens.cpu())     # [T]
for c in cu_seqlens[1:-1].tolist():                  # each boundary: two tokens before, three after
    print(f"tokens {c - 2} to {c + 2}: positions {p_thd[c - 2:c + 3].tolist()}")
assert (p_thd[cu_seqlens[:-1].cpu().long()] == 0).all()     # every sequence starts at 0
seq_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # i of t
assert torch.equal(p_thd, torch.arange(T) - cu_seqlens.cpu().long()[seq_of])       # t - c_i
# the same as rotating each sequence on its own (as [s, 1, H, D] sbhd):
for i, part in enumerate(torch.split(x_thd, lengths)):
    alone = ropelib.apply_rope(part.unsqueeze(1), freqs.to(device)).squeeze(1)
    assert torch.equal(y_thd[cu_seqlens[i]:cu_seqlens[i + 1]], alone)
print(f"thd with cu_seqlens={cu_seqlens.tolist()} == each sequence rotated alone")

# %% [markdown]
# ## 2. Two table conventions: TE's angles vs HF's cos/sin
#
# Both encode, for every position $m$ and rotated feature $i$ ($0 \le i < R$), the angle
# $m\theta_{j(i)}$ of the pair it belongs to: $j(i) = i \bmod R/2$ for rotate-half,
# $j(i) = \lfloor i/2 \rfloor$ for the interleaved pairing.
#
# - **Transformer Engine** passes the *angles* `freqs [P, 1, 1, R]` in fp32: `cat(f, f)` for
#   rotate-half, each angle twice in a row (`f0 f0 f1 f1 ...`) for the interleaved pairing.
#   Its fused kernel computes $\sin$ and $\cos$ itself, in fp32.
# - **Hugging Face** computes `cos, sin` anew in every forward pass, from `position_ids`.
#   `*RotaryEmbedding.forward(x, position_ids)` multiplies the inverse frequencies by the
#   positions in fp32, takes the cosine and sine (times `attention_scaling`, which some
#   context-extension methods such as YaRN set), and casts them to the model's dtype:
#   `cos, sin [B, S, R]`. `apply_rotary_pos_emb`
#   only unsqueezes them to broadcast over heads (`unsqueeze_dim=1` for `[B, H, S, D]`) and
#   computes $y = x\cos + \mathrm{rotate\_half}(x)\sin$ in the model's dtype. (Older versions
#   kept a precomputed cache `[P, R]` and indexed it with `cos[position_ids]`.)
#
# `ropelib.frequencies` builds both. `rope_freqs` gives TE's table. `rope_cos_sin` gives HF's
# cos and sin as `[S, R]`: the rows HF computes for positions 0 to S-1 (or from `offset=`),
# computed in fp32 and rounded once to the dtype asked for. `ropelib.apply_rope` accepts either
# (`freqs=` or `cos=, sin=`).
#
# The difference that matters is precision. HF, its old cache and TE's unfused path all round
# $\cos$ and $\sin$ to the model's dtype *before* the multiply (8 significant bits in bf16),
# then do the multiply-adds in bf16 too. A fused kernel that reads fp32 angles and rounds once at
# the end is nearly as accurate as bf16 allows. The cell compares four outputs: ropelib's kernel
# on fp32 angles, ropelib on bf16 cos/sin (HF's table: the kernel reads it instead of computing
# sin and cos, and still does its math in fp32), TE's unfused path, and HF's own
# `apply_rotary_pos_emb` (transformers' where it is installed, else its formula op for op).

# %%
f_tab = rope_freqs(S, D).to(device)                               # [S, 1, 1, D] fp32
cos_bf16, sin_bf16 = rope_cos_sin(S, D, dtype=dtype, device=device)  # [S, D] bf16
print("freqs", tuple(f_tab.shape), f_tab.dtype, "| cos/sin", tuple(cos_bf16.shape), cos_bf16.dtype)
# row m = 1 holds the theta_j themselves: base^(-2j/R), laid out as j(i) above says
theta = f_tab[1, 0, 0].cpu()
j = torch.arange(D)
assert torch.allclose(theta, 10000.0 ** (-2 * (j % (D // 2)) / D))                 # rotate-half
assert torch.equal(rope_freqs(2, D, interleaved=True)[1, 0, 0], theta[:D // 2][j // 2])  # pairs
assert torch.equal(f_tab.cpu(), torch.arange(S).view(S, 1, 1, 1) * theta)   # row m: m * theta

# the correctly rounded answer: computed in fp64, rounded once to bf16
exact = reference.rope_reference(x_sbhd, f_tab, compute_dtype=torch.float64)
outputs = {
    "fused, fp32 angles (ropelib)": ropelib.apply_rope(x_sbhd, f_tab),
    "fused, bf16 cos/sin": ropelib.apply_rope(x_sbhd, cos=cos_bf16, sin=sin_bf16),
    "TE unfused (math in bf16)": reference.te_unfused(x_sbhd, f_tab),
    # HF's code: x * cos + rotate_half(x) * sin, every op in bf16, cos/sin broadcast over b, h
    "HF's code (math in bf16)": (x_sbhd * cos_bf16[:, None, None]
                                 + reference.rotate_half(x_sbhd) * sin_bf16[:, None, None]),
}
if importlib.util.find_spec("transformers"):            # the installed function, on [B, H, S, D]
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
    x_bhsd = x_sbhd.permute(1, 2, 0, 3)
    hf_y = hf_apply(x_bhsd, x_bhsd, cos_bf16[None], sin_bf16[None])[0].permute(2, 0, 1, 3)
    assert torch.equal(hf_y, outputs["HF's code (math in bf16)"])
print(f"{'':30s} {'max |error|':>11s} {'max ulps':>9s} {'outputs off':>12s}   "
      f"(against the correctly rounded y, {exact.numel():,} outputs)")
off, ulps = {}, {}
for name, y in outputs.items():
    ulps[name] = error_metrics(y, exact.double())["max_ulp_err"]   # bf16 ulps (see the text)
    off[name] = (y != exact).double().mean().item()                # not the correctly rounded y
    print(f"{name:30s} {(y.double() - exact.double()).abs().max().item():11.4f} "
          f"{ulps[name]:9g} {off[name]:12.3%}")
ours, table, unfused, hf_code = outputs                  # the four names, in order
assert ulps[ours] <= 1 and off[ours] < 1e-3              # one rounding: at most one step, rarely
assert off[table] > 0.1 and ulps[table] >= 10             # cos and sin rounded first
assert off[ours] < off[table] < off[unfused] and ulps[ours] < ulps[table] < ulps[unfused]
assert off[table] < off[hf_code] and ulps[table] < ulps[hf_code]     # HF sits with TE unfused
assert torch.equal(outputs[hf_code], outputs[unfused])  # the same bf16 ops on the same cos/sin
share = min(off[table], off[unfused])          # the smaller share of the two bf16-table lines
print(f"the two bf16-table lines miss {off[table]:.0%} and {off[unfused]:.0%} of the outputs "
      f"({'this GPU' if GPU else 'the interpreter'}'s x: {S}x{B}x{H}x{D})")
assert share > (0.25 if GPU else 0.1)           # a GPU's x: a quarter or more; the small x here

# %% [markdown]
# Each line is measured against the correctly rounded $y$: its largest absolute error, its
# largest error in **ulps** (the gap between neighbouring bf16 numbers at each value), and the
# share of its outputs that are not the correctly rounded value. The first alone says little:
# it sits at the largest outputs, where one bf16 step is already 1/64 or 1/32 (values from 2
# to 8).
#
# ropelib rounds its fp32 result once, so it is off by at most one ulp, and only where the
# exact value lies almost halfway between two bf16 numbers. (Near zero, where
# $x_a\cos - x_b\sin$ cancels, fp32's own error decides the last bits, so
# `ropelib.bench.compare.error_metrics` measures values below a thousandth of the largest in
# the ulp at that floor.) The other lines round $\cos$ and $\sin$ to bf16 first, an error of up
# to $2^{-9}$ that the multiply carries into every output as a share of $x$, not of the small
# output: hence `max ulps` far above one, and a share of outputs off that depends on the shape
# (the cell's last line). TE's unfused path and HF's code also round every product and sum to
# bf16; doing the same ops on the same cos and sin, they agree bit for bit. Notebook 08 shows
# how this difference makes an innocent `torch.allclose(te_out, triton_out)` fail.
#
# ## 3. Partial rotary
#
# Some models rotate only the first $R < D$ features of each head and pass the rest through:
# GPT-NeoX/Pythia (`rotary_pct=0.25`), Phi-2 (`partial_rotary_factor=0.4`), ChatGLM. Both TE
# and HF compute $R$ = `int(head_dim * rotary_percent)`; the table simply has $R$ columns.

# %%
R = frequencies.rotary_dim(D, 0.5)
f_half = rope_freqs(S, D, rotary_percent=0.5).to(device)            # [S, 1, 1, R]
y = ropelib.apply_rope(x_sbhd, f_half)
assert f_half.shape[-1] == R == D // 2
assert torch.equal(y[..., R:], x_sbhd[..., R:])                       # passed through, bit for bit
assert torch.equal(y[..., :R], ropelib.apply_rope(x_sbhd[..., :R], f_half))
print(f"rotary_percent=0.5: features 0..{R - 1} rotated, {R}..{D - 1} untouched")

# %% [markdown]
# ## 4. Position offsets: `start_positions`, `position_ids`, `offset`
#
# During generation with a KV cache, each step feeds *one* new token per sequence, and each
# sequence of the batch may be at a different length. Its position is the number of tokens
# already cached. TE's `start_positions[b]` adds an offset per sequence; HF passes explicit
# `position_ids`. Either way, the new token must get exactly the rotation it would have had in
# a full forward pass.
#
# The cell checks that against a full pass, first with every sequence at the same length, then
# at different lengths (a longer prompt holds each sequence's new token at the position that
# sequence has reached), and prints the positions used. HF's `position_ids` give the same bits
# as `start_positions`: the kernel differs only in how it finds a token's table row, and from
# that row on the same fp32 angles go through the same operations (each output one `tl.fma`,
# so the compiler cannot contract the two variants differently).

# %%
L = S                                                       # prompt length
full = torch.randn(L + 1, B, H, D, device=device, dtype=dtype)
y_full = ropelib.apply_rope(full, freqs.to(device))         # prefill of L+1 tokens

step = full[L:]                                             # [1, B, H, D]: the next token
start = torch.full((B,), L, device=device, dtype=torch.int32)
y_step = ropelib.apply_rope(step, freqs.to(device), start_positions=start)
assert torch.equal(y_step, y_full[L:])

# sequences at different lengths: positions L-3, L-1, ... per batch entry
start = torch.tensor([L - 3 + 2 * b for b in range(B)], device=device, dtype=torch.int32)
y_step = ropelib.apply_rope(step, freqs.to(device), start_positions=start)
# a full pass over a longer prompt: row start[b] of batch entry b holds that entry's new token
full_long = torch.randn(int(start.max()) + 1, B, H, D, device=device, dtype=dtype)
for b, s in enumerate(start.tolist()):
    full_long[s, b] = step[0, b]
y_long = ropelib.apply_rope(full_long, freqs.to(device))
for b, s in enumerate(start.tolist()):
    assert torch.equal(y_step[0, b], y_long[s, b])
pos_ids = start.view(B, 1).long()                           # HF style: explicit [B, S] positions
assert torch.equal(y_step, ropelib.apply_rope(step, freqs.to(device), position_ids=pos_ids))
used = reference.positions("sbhd", 1, B, start_positions=start.cpu()).flatten()
print("positions used:", used.tolist())
assert used.tolist() == [L - 3 + 2 * b for b in range(B)]

# a table that starts at a position: rope_freqs(..., offset=o) == rope_freqs(...)[o:]
assert torch.equal(rope_freqs(8, D, offset=5), rope_freqs(13, D)[5:])

# %% [markdown]
# The table must cover the largest position used: with `start_positions` TE requires
# `max(start_positions) + S * cp_size <= P`. ropelib checks this where it can read the positions
# without waiting for the GPU: index tensors in CPU memory, or every call after
# `ropelib.set_index_checks("on")` (one synchronisation a call). It then raises the
# `ValueError` the cell prints. Unchecked (GPU index tensors by default, every call after
# `set_index_checks("off")`, always under `torch.compile`), a position past the table gives NaN
# rows, never another row's angles.

# %%
past = torch.full((B,), L, device=device, dtype=torch.int32)    # position L: the table has L rows
short = freqs[:L].to(device)
with ropelib.set_index_checks("on"):
    try:
        ropelib.apply_rope(step, short, start_positions=past)
        raise AssertionError("a position past the table went through")
    except ValueError as e:
        print("ValueError:", e)
        assert "start_positions" in str(e) and f"table of {L} rows" in str(e)
with ropelib.set_index_checks("off"):
    y_past = ropelib.apply_rope(step, short, start_positions=past)
print("unchecked: every output NaN:", bool(y_past.isnan().all()))
assert y_past.isnan().all()

# %% [markdown]
# ## 5. Context parallelism: which positions does a rank hold?
#
# With context parallelism (CP) the sequence is split over `cp_size` GPUs. A plain split would
# be unfair under a causal mask: the rank with the last tokens attends to everything, the first
# to almost nothing. TE therefore cuts the sequence into $2\,\mathrm{cp\_size}$ chunks and gives
# rank $r$ chunks $r$ and $2\,\mathrm{cp\_size}-1-r$ (dual-chunk). Each rank holds
# `S_local = 2 * chunk` tokens and must rotate them by their *global* positions.
#
# Why the sums of work even out: under a causal mask the token at position $p$ attends to $p + 1$
# tokens. With $N$ = `cp_size` and chunks of $c$ tokens, chunk $k$ holds positions $kc$ to
# $(k+1)c - 1$, so its work is
#
# $$
# W_k = \sum_{p=kc}^{(k+1)c-1} (p + 1) = c^2 k + \frac{c(c+1)}{2},
# \qquad
# W_r + W_{2N-1-r} = c^2 (2N - 1) + c(c+1),
# $$
#
# the same for every rank $r$. A plain split into $N$ pieces of $2c$ tokens gives rank $r$ the
# work $4c^2 r + c(2c+1)$, which grows with $r$. The cell prints both.

# %%
cp_size, S_local = 4, 8
global_len = cp_size * S_local
pos = {r: reference.positions("sbhd", S_local, 1, cp_size=cp_size, cp_rank=r)[0]
       for r in range(cp_size)}
for r, p in pos.items():
    print(f"rank {r}: {p.tolist()}")
chunk = S_local // 2                             # 2 * cp_size chunks of this many tokens
for r, p in pos.items():                         # rank r: chunk r, then chunk 2 * cp_size - 1 - r
    mirror = 2 * cp_size - 1 - r
    assert torch.equal(p, torch.cat([torch.arange(r * chunk, (r + 1) * chunk),
                                     torch.arange(mirror * chunk, (mirror + 1) * chunk)]))
# causal attention work of a token ~ its position + 1: every rank gets the same total
work = [int((p + 1).sum()) for p in pos.values()]
assert work == [chunk**2 * (2 * cp_size - 1) + chunk * (chunk + 1)] * cp_size, work
plain = [int((torch.arange(r * S_local, (r + 1) * S_local) + 1).sum()) for r in range(cp_size)]
assert plain == [4 * chunk**2 * r + chunk * (2 * chunk + 1) for r in range(cp_size)], plain
print("causal work per rank, dual-chunk:", work, "| a plain split:", plain)

fig, ax = plt.subplots(figsize=(9, 1.8))
colors = plt.cm.tab10.colors
for r, p in pos.items():
    ax.bar(p.numpy(), 1, width=1.0, color=colors[r], edgecolor="white", label=f"rank {r}")
ax.set(xlabel="global position", yticks=[], xlim=(-0.5, global_len - 0.5),
       title=f"Dual-chunk context parallel: {global_len} tokens over cp_size={cp_size}")
ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
fig.tight_layout()
fig.savefig(FIGURES / "02-context-parallel.png", dpi=120)
plt.show()

# %% [markdown]
# Each rank holds one chunk from the front and its mirror from the back.
#
# Rotating a rank's local tokens with `cp_size, cp_rank` must give the same rows as rotating the
# whole sequence and then picking that rank's positions:

# %%
x_global = torch.randn(global_len, B, H, D, device=device, dtype=dtype)
f_global = rope_freqs(global_len, D).to(device)
y_global = ropelib.apply_rope(x_global, f_global)
for r, p in pos.items():
    x_local = x_global[p.to(device)]                     # the tokens rank r holds, in its order
    y_local = ropelib.apply_rope(x_local, f_global, cp_size=cp_size, cp_rank=r)
    assert torch.equal(y_local, y_global[p.to(device)])
print("each rank's local rotation == the global rotation at its positions")

# %% [markdown]
# ## 6. Why the unfused version is slow
#
# The question of this section: how much slower is TE's plain-PyTorch path than one fused
# kernel, and where does the time go? It answers in three steps: count the bytes (any
# machine), time the whole chain against the fused kernel and a copy (a GPU), then time each
# kernel of the chain and read the loads under hardware counters.
#
# RoPE does little arithmetic: two multiplies and an add for each output, besides the sine and
# cosine of its angle. A GPU can do far more arithmetic in the time it takes to move a byte, so
# RoPE is **memory-bound**: its speed is set by the bytes it moves, and the floor is reading $x$
# once and writing $y$ once (plus a small table). The cell below puts numbers on that claim:
# RoPE's arithmetic intensity (operations per byte moved) beside the GPU's, and the time of
# `ropelib.apply_rope` beside a device copy of the same bytes, which does no arithmetic at all,
# from the committed runs on an H200 and an H100 (`benchmarks/results/floor-*.csv`, timed with
# `triton.testing.do_bench`, which reports the median time of many calls). At this
# size `apply_rope` takes its default route, two passes (a small kernel for the angle rows,
# then a flat rotation kernel; notebook 05).

# %%
from ropelib.bench import compare, floor as floor_suite
from ropelib.course import measured

# per output element (bf16): y_a = x_a c_a - x_b s_a is a multiply and a fused multiply-add,
# 3 floating-point operations (an fma counts 2), for 2 bytes read and 2 written
flop_per_elem, bytes_per_elem = 3, 2 + 2
intensity = flop_per_elem / bytes_per_elem
fp32_flops = 67e12      # NVIDIA's H100 SXM and H200 SXM datasheets alike: FP32, not measured here
case_1g = "forward 1 GiB bf16 sbhd"
x_1g = 1 << 30                                   # the bytes of x in that case
config_1g = {c.name: c.config for c in floor_suite.rope_cases()}["1 GiB bf16 sbhd"]
moved_1g = compare.bytes_moved(config_1g)        # x read, y written, the fp32 table read
assert moved_1g == 2 * x_1g + config_1g.seq_len * config_1g.head_dim * 4
print(f"RoPE: {intensity:.2f} FLOP per byte of x and y moved (the small table left out)")
print(f"{case_1g}, committed floor runs (do_bench); FP32 rate {fp32_flops / 1e12:.0f} TFLOP/s "
      "from the datasheet")
print(f"  {'GPU':22s} copy TB/s  balance FLOP/byte  ropelib ms  copy ms  of a copy  "
      "ropelib TFLOP/s  of FP32 rate")
ridge_of = {}
for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
    if not measured.path("floor", gpu).is_file():
        continue
    meta, runs = measured.load("floor", gpu)[0], measured.floor(gpu)
    copy_ms, rope_ms = (float(runs[case_1g][p]["ms"]) for p in ("copy", "ropelib"))
    copy_bw = moved_1g / (copy_ms * 1e-3)        # bytes per second, as notebook 00 counts them
    ridge = fp32_flops / copy_bw                 # operations per byte where the two balance
    rope_flops = flop_per_elem * (x_1g // 2) / (rope_ms * 1e-3)
    print(f"  {meta['gpu']:22s} {copy_bw / 1e12:9.2f} {ridge:18.1f} {rope_ms:11.4f} "
          f"{copy_ms:8.4f} {copy_ms / rope_ms:10.3f} {rope_flops / 1e12:16.2f} "
          f"{100 * rope_flops / fp32_flops:11.1f} %")
    assert ridge / intensity > 15                # far on the memory side
    assert copy_ms / rope_ms > 0.95              # the arithmetic adds (almost) no time
    assert rope_flops / fp32_flops < 0.05
    ridge_of[meta["gpu"]] = ridge
fl_meta, fl = measured.load("floor")[0], measured.floor()     # the H200's, used below
assert "H200" in fl_meta["gpu"] and intensity == 0.75 and round(ridge_of["NVIDIA H200"]) == 16
assert round(ridge_of.get("NVIDIA H100 80GB HBM3", 22)) == 22

# %% [markdown]
# RoPE does 0.75 operations per byte it moves; the H200 balances its arithmetic and its memory
# near 16, the H100, whose memory is slower, near 22 (the copy's measured bandwidth against the
# datasheet's FP32 rate, which this course does not measure). The measurement that settles it:
# on both GPUs ropelib's two-pass route takes the time of a copy of the same bytes, which does
# no arithmetic, while using a few percent of the arithmetic rate. So every byte counts, and the
# arithmetic is free. (The single fused kernel that the rest of this section forces, to hold
# one kernel against the chain, is a little slower: the end of "Each kernel against a copy"
# measures both routes against a copy.)
#
# TE's plain-PyTorch path (`apply_rotary_pos_emb(..., fused=False)`) is the code below, for
# `sbhd` and rotate-half. `ropelib.reference.te_unfused` keeps it line for line; the cell writes
# it out and checks it against that function bit for bit. It is a handful of lines of tensor
# code, but each ATen operation in them (ATen is PyTorch's library of tensor operators, the
# C++ code under every `torch.*` call) is a separate kernel that reads its inputs from memory
# and writes a temporary back: the line `(t * cos_) + (rotate_half(t) * sin_)` alone is five of
# them. The comments number the operations in the order they run; the count below prints the
# same numbers.

# %%
def rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)               # two views of x: no bytes move
    return torch.cat((-x2, x1), dim=-1)              # 5: neg, 6: cat


def te_unfused_sbhd(t, freqs):
    cos_ = torch.cos(freqs).to(t.dtype)              # 0: cos, 1: _to_copy (fp32 -> bf16)
    sin_ = torch.sin(freqs).to(t.dtype)              # 2: sin, 3: _to_copy
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]   # the rotated part and the rest: views
    t = (t * cos_) + (rotate_half(t) * sin_)         # 4: mul, 5-6 above, 7: mul, 8: add
    return torch.cat((t, t_pass), dim=-1)            # 9: cat (t_pass is empty here)


x_small, f_small = x_sbhd[:8], rope_freqs(8, D).to(device)
assert torch.equal(te_unfused_sbhd(x_small, f_small), reference.te_unfused(x_small, f_small))
print("te_unfused_sbhd == ropelib.reference.te_unfused, bit for bit")

# %% [markdown]
# A `TorchDispatchMode` sees every ATen operation that actually runs; `CountTraffic` records
# the bytes each reads and writes. Each op's schema says which outputs are views
# (`transpose(Tensor(a) self) -> Tensor(a)`: no bytes move, skipped) and which arguments it
# writes (`Tensor(a!)`: in place or `out=`). The count works the same on the CPU and on a GPU.
#
# The floor it is held against is one fused kernel: read $x$ once, write $y$ once, read the
# fp32 table once. With $e$ bytes per element of $x$ and a table of $S \times R$ angles,
#
# $$
# \text{bytes}_{\text{fused}} = 2\,SBHD\,e + 4\,SR
# = SBHD\,e\left(2 + \frac{4R}{BHD\,e}\right),
# $$
#
# which for bf16 ($e = 2$) and full rotation ($R = D$) is $2 + 2/(BH)$ times the bytes of $x$.

# %%
class CountTraffic(TorchDispatchMode):
    """Record (op, bytes read, bytes written) for every ATen op that is not a view.

    The op's schema says how its tensors share memory: a return marked `Tensor(a)` is a view of
    an argument (no bytes move); an argument marked `Tensor(a!)` is one the op writes, in place
    (`mul_`: read and written) or through `out=` (written only)."""

    OVERWRITES = ("copy_", "fill_", "zero_")     # in-place ops that write without reading first

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema, name = func._schema, func.overloadpacket.__name__
        aliases = [r.alias_info for r in schema.returns]
        if aliases and all(a is not None and not a.is_write for a in aliases):
            return out                                        # a view: no bytes move
        tensors = lambda v: [t for t in tree_leaves(v) if isinstance(t, torch.Tensor)]  # noqa: E731
        read, written = [], []
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            writes = arg.alias_info is not None and arg.alias_info.is_write
            if writes:                                        # in place, or out=
                written += tensors(value)
            if not (writes and (arg.is_out or name in self.OVERWRITES)):
                read += tensors(value)
        returned = out if len(schema.returns) > 1 else (out,)
        for ret, value in zip(schema.returns, returned):
            if ret.alias_info is None:                        # a tensor the op made
                written += tensors(value)
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        self.ops.append((name, nbytes(read), nbytes(written)))
        return out


# A fixed shape for the count (plain PyTorch, so it runs anywhere; in units of x the count
# depends on B and H only):
Sc, Bc, Hc, Dc = 128, 2, 16, 128
xc = torch.randn(Sc, Bc, Hc, Dc, dtype=dtype, generator=torch.Generator().manual_seed(0))
fc = rope_freqs(Sc, Dc)
with CountTraffic() as fwd:
    yc = reference.te_unfused(xc, fc)
x_bytes = xc.numel() * xc.element_size()
print(f" # {'op':10s} {'read':>10s} {'written':>10s}   (in units of x = {x_bytes / 2**20:.0f} MiB)")
for i, (name, r, w) in enumerate(fwd.ops):
    print(f"{i:2d} {name:10s} {r / x_bytes:10.2f} {w / x_bytes:10.2f}")
unfused_bytes = sum(r + w for _, r, w in fwd.ops)
floor_bytes = 2 * x_bytes + fc.numel() * 4
print(f"\n{len(fwd.ops)} ATen ops, {unfused_bytes / x_bytes:.1f}x the bytes of x; "
      f"a fused kernel: 1 kernel, {floor_bytes / x_bytes:.2f}x  ->  "
      f"{unfused_bytes / floor_bytes:.1f}x more traffic")
# the ops numbered in te_unfused_sbhd, in that order; the floor as the formula above gives it
assert [n for n, _, _ in fwd.ops] == ["cos", "_to_copy", "sin", "_to_copy", "mul", "neg", "cat",
                                      "mul", "add", "cat"]
assert floor_bytes / x_bytes == 2 + 2 / (Bc * Hc)
# without the table: the chain's ops on x (4 to 9) move 12 x, besides the bf16 table the
# multiplies read; the fused kernel 2 x
assert sum(r + w for _, r, w in fwd.ops[4:]) == 12 * x_bytes + 2 * fc.numel() * 2
# the numbers the text quotes (they follow from the shapes alone)
assert len(fwd.ops) == 10 and unfused_bytes > 5 * floor_bytes
assert (round(unfused_bytes / x_bytes, 1), round(floor_bytes / x_bytes, 2),
        round(unfused_bytes / floor_bytes, 1)) == (12.5, 2.06, 6.1)

# %% [markdown]
# The backward pass through autograd repeats the pattern (the gradient of each multiply is
# another multiply, of the `cat` a split and a copy, ...):

# %%
xg = xc.clone().requires_grad_()
yg = reference.te_unfused(xg, fc)
dy = torch.randn_like(yg)
with CountTraffic() as bwd:
    yg.backward(dy)
bwd_bytes = sum(r + w for _, r, w in bwd.ops)
print(f"backward: {len(bwd.ops)} ATen ops ({', '.join(n for n, _, _ in bwd.ops)}), "
      f"{bwd_bytes / x_bytes:.1f}x the bytes of x (a fused backward: {floor_bytes / x_bytes:.2f}x)")
assert len(bwd.ops) == 7 and round(bwd_bytes / x_bytes, 1) == 14.1

fig, ax = plt.subplots(figsize=(8, 3.4))
labels = [f"{i}: {n}" for i, (n, _, _) in enumerate(fwd.ops)]
ax.bar(labels, [r / x_bytes for _, r, _ in fwd.ops], label="read")
ax.bar(labels, [w / x_bytes for _, _, w in fwd.ops], bottom=[r / x_bytes for _, r, _ in fwd.ops],
       label="written")
ax.axhline(floor_bytes / x_bytes, color="k", ls="--", lw=1)
ax.text(len(labels) - 0.5, floor_bytes / x_bytes + 0.08, "one fused kernel, in total",
        ha="right", fontsize=8)
ax.set(ylabel="bytes / bytes of x",
       title=f"TE unfused forward: {len(fwd.ops)} ATen ops, "
             f"{unfused_bytes / floor_bytes:.1f}x the traffic of one fused kernel")
ax.tick_params(axis="x", rotation=45, labelsize=8)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "02-unfused-traffic.png", dpi=120)
plt.show()

# %% [markdown]
# The unfused forward moves 6.1 times a fused kernel's bytes, and the backward through autograd
# 14.1 times the bytes of $x$ against a fused backward's 2.06: each op writes a temporary that
# the next one reads back, where a fused kernel keeps it in registers. These are ATen ops
# counted at dispatch, not a profile: on a GPU one op can launch more than one kernel (the
# profiler below counts those).
#
# Part of this traffic comes from TE's partial-rotary code, which runs even when every feature
# turns. It splits $x$ into the rotated part `t` and the passed-through part `t_pass`, here
# empty. In the forward, the last `cat((t, t_pass))` copies all of `t` only to join it with
# nothing. In the backward, the gradient of the empty `t_pass` slice is `slice_backward`: a
# tensor of zeros the size of $x$, which the last `add` sums into the gradient of `t`.
#
# The next cell measures that share. It counts the same rotation with the split left out (valid
# only when every feature turns) and checks that it gives the same bits. That holds on any CPU
# for this table, not for every table: all the chain's ops but `cos` and `sin` are correctly
# rounded, but a math library may return either fp32 neighbour of an exact cosine, and where
# one of them lies on a bf16 rounding tie, two code paths (another vector width, another split
# of a parallel loop) can round that table entry, and every output that reads it, apart. The
# cell asserts that no angle of this table comes within 3 fp32 ulps of a tie and prints how
# many of a table four times as long do. Edit the function and rerun the cell to count your
# own variant; the asserts at the end check the numbers of the version given here.

# %%
def te_unfused_all_rotated(t, freqs):
    """TE's path without the partial-rotary split and its final cat: every feature turns."""
    cos_ = torch.cos(freqs).to(t.dtype)
    sin_ = torch.sin(freqs).to(t.dtype)
    return (t * cos_) + (rotate_half(t) * sin_)


assert not near_bf16_tie(fc).any()     # so any CPU rounds the bf16 cos/sin tables alike
print(f"angles whose cos or sin lies within 3 fp32 ulps of a bf16 tie: none of {Sc} rows here, "
      f"{int(near_bf16_tie(rope_freqs(4 * Sc, Dc)).sum())} of {4 * Sc} rows")
assert torch.equal(te_unfused_all_rotated(xc, fc), yc)
with CountTraffic() as lean_fwd:
    te_unfused_all_rotated(xc, fc)
xg_lean = xc.clone().requires_grad_()
y_lean = te_unfused_all_rotated(xg_lean, fc)
with CountTraffic() as lean_bwd:
    y_lean.backward(dy)
lean_fwd_bytes = sum(r + w for _, r, w in lean_fwd.ops)
lean_bwd_bytes = sum(r + w for _, r, w in lean_bwd.ops)
for what, full_c, full_b, lean_c, lean_b in [
        ("forward", fwd, unfused_bytes, lean_fwd, lean_fwd_bytes),
        ("backward", bwd, bwd_bytes, lean_bwd, lean_bwd_bytes)]:
    print(f"{what:8s}  TE's code: {len(full_c.ops)} ops, {full_b / x_bytes:5.2f}x the bytes of x"
          f"  |  without the split: {len(lean_c.ops)} ops, {lean_b / x_bytes:5.2f}x")
assert (unfused_bytes - lean_fwd_bytes) / x_bytes == 2       # the last cat: read x, write x
assert (bwd_bytes - lean_bwd_bytes) / x_bytes == 4           # zeros written, then added: 1 + 3
assert [n for n, _, _ in bwd.ops if n not in [m for m, _, _ in lean_bwd.ops]] == ["slice_backward"]
# the share of each direction's excess over the fused floor that the split costs
share_fwd = (unfused_bytes - lean_fwd_bytes) / (unfused_bytes - floor_bytes)
share_bwd = (bwd_bytes - lean_bwd_bytes) / (bwd_bytes - floor_bytes)
print(f"the split's share of the bytes beyond the fused floor: forward {share_fwd:.0%}, "
      f"backward {share_bwd:.0%}")
assert [round(v / x_bytes, 2) for v in (unfused_bytes, lean_fwd_bytes, bwd_bytes, lean_bwd_bytes)] \
    == [12.5, 10.5, 14.06, 10.06]
assert (round(share_fwd, 2), round(share_bwd, 2)) == (0.19, 0.33)

# %% [markdown]
# The last `cat` costs a fifth of the forward's bytes beyond the fused floor; the backward's
# tensor of zeros and the `add` that sums it cost a third of the backward's. The rest is the
# chain itself: one temporary written and read back per operation.
#
# ### The profiler's view
#
# `torch.profiler` lists the same operations. On the CPU it shows the ATen ops; on a GPU,
# with CUDA activity, it lists the actual kernels launched — one per op for the unfused path,
# a single Triton kernel for `ropelib.apply_rope`.
#
# One thing is set aside here. For a large tensor on a GPU (this section's `x` is 128 MiB),
# `apply_rope` normally plans two passes — a small kernel that prepares the angle rows, then a
# flat kernel that rotates — which notebook 05 explains and measures. This section wants one
# kernel against the chain, so its cells force the single-kernel route (`forced("finished")`
# from `ropelib.bench.routes`): ropelib's finished kernel, `_rope_kernel`, reading the fp32
# table itself.

# %%
from collections import Counter

from torch.profiler import ProfilerActivity, profile

from ropelib.bench.routes import forced   # one kernel for apply_rope, at every size
from ropelib.course import counts    # the profile filters notebook 11 counts a decode step with

activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU else [])
# an input that needs gradients, as in training: ropelib then runs as one autograd function
xp = torch.randn(S, B, H, D, device=device, dtype=dtype, requires_grad=True)
fp = rope_freqs(S, D).to(device)
launched, events_of = {}, {}
null, saved_fd2 = os.open(os.devnull, os.O_WRONLY), os.dup(2)
with forced("finished"):                                         # the single-kernel route
    reference.te_unfused(xp, fp), ropelib.apply_rope(xp, fp)      # warm up (compile, caches)
    for name, fn in {"TE unfused": lambda: reference.te_unfused(xp, fp),
                     "ropelib.apply_rope": lambda: ropelib.apply_rope(xp, fp)}.items():
        os.dup2(null, 2)       # a CPU build's profiler logs "USDT: ... profiler_start" there
        try:
            with profile(activities=activities, acc_events=True) as prof:
                fn()
                if GPU:
                    torch.cuda.synchronize()
        finally:
            os.dup2(saved_fd2, 2)
        events_of[name] = prof.events()
os.close(null), os.close(saved_fd2)
for name, events in events_of.items():
    if GPU:   # the kernels the GPU actually ran
        what = "GPU kernels"
        ops = counts.gpu_kernels(events)                 # memory copies and sets left out
    else:     # the top-level operations the CPU ran, views left out
        what = "top-level ops (views left out)"
        ops = [e.name for e in events if e.cpu_parent is None and e.name not in counts.VIEW_OPS]
    launched[name] = Counter(ops)
    print(f"{name}: {len(ops)} {what}")
    for op, n in launched[name].items():
        print(f"    {n} x {op[:100]}")
n_unfused, n_fused = (sum(launched[k].values()) for k in ("TE unfused", "ropelib.apply_rope"))
assert n_unfused >= 8 and n_fused < n_unfused
if GPU:         # one kernel per counted op for the chain, ropelib's finished kernel for ropelib
    assert n_unfused == len(fwd.ops) and n_fused == 1
    assert xp.numel() * xp.element_size() == 128 << 20     # the 128 MiB the text names
    assert "_rope_kernel" in next(iter(launched["ropelib.apply_rope"])), launched
else:           # one autograd node: ropelib's Rotate
    assert list(launched["ropelib.apply_rope"]) == ["Rotate"]

# %% [markdown]
# On the CPU, `ropelib.apply_rope` shows up as one autograd function (`Rotate`): its Triton
# kernel runs as Python inside the interpreter, invisible to the profiler.
#
# On a GPU the next cell times both against a copy of the same bytes, the yardstick for a
# kernel that reads and writes each byte once. A contiguous `copy_` runs as a device-to-device
# memory copy ("Memcpy DtoD" in a profile), not as a kernel, so beside it the cell times
# `copy_kernel`, a Triton kernel that loads and stores one tile of 1,024 elements a program:
# their ratio (printed, asserted only within 2×) says whether a kernel can reach the yardstick
# on your GPU. Timings are headed `LIVE` (measured now, on your GPU) or `COMMITTED` (one H200
# run kept in `figures/02-unfused-kernels.csv`, named with its GPU and versions); the text
# quotes the committed run only. A GPU run writes its own table to
# `02-unfused-kernels-live.csv` in the scratch folder (in `figures/` with
# `ROPELIB_WRITE_FIGURES=1`), never over the committed file: making a run the committed one is
# a rename by hand, after which the numbers the text asserts must be updated. On a CPU the
# cell runs `copy_kernel` once in the interpreter and times nothing.

# %%
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):   # one tile of BLOCK elements a program
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n                                        # the last tile runs past n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


xd = xp.detach()   # forward only: no autograd graph recorded while timing
y_buf, y_tile = torch.empty_like(xd), torch.full_like(xd, float("nan"))


def tile_copy():   # x as a flat contiguous run of elements, 1,024 a program
    copy_kernel[(triton.cdiv(xd.numel(), 1024),)](xd, y_tile, xd.numel(), BLOCK=1024)


tile_copy()                          # compiled on a GPU, interpreted on a CPU
assert torch.equal(y_tile, xd)       # every element written, unchanged
if GPU:
    with CountTraffic() as counted:              # each op's bytes, on the tensors timed here
        reference.te_unfused(xd, fp)
    timed_unfused_bytes = sum(r + w for _, r, w in counted.ops)
    moved = 2 * xd.numel() * xd.element_size() + fp.numel() * 4     # the fused kernel's bytes
    t_unfused = triton.testing.do_bench(lambda: reference.te_unfused(xd, fp))
    with forced("finished"):                     # one kernel, as in the profile above
        t_fused = triton.testing.do_bench(lambda: ropelib.apply_rope(xd, fp))
    t_copy = triton.testing.do_bench(lambda: y_buf.copy_(xd))
    t_tile = triton.testing.do_bench(tile_copy)
    print(f"{LIVE}:")
    for name, t in [("copy_ (floor)", t_copy), ("copy_kernel (Triton)", t_tile),
                    ("ropelib.apply_rope", t_fused), ("TE unfused", t_unfused)]:
        print(f"  {name:20s} {t * 1e3:8.1f} us   {moved / t / 1e6:7.0f} GB/s of useful traffic")
    print(f"  copy_kernel / copy_: {t_tile / t_copy:.2f}x; unfused / fused: "
          f"{t_unfused / t_fused:.1f}x")
    assert 0.5 < t_tile / t_copy < 2                   # a kernel's copy, near the runtime's
    print(f"  their bytes (counted on these tensors, x {tuple(xd.shape)}): "
          f"{timed_unfused_bytes / moved:.1f}x "
          f"(section 6's smaller x: {unfused_bytes / floor_bytes:.1f}x)")
    assert t_unfused / t_fused > timed_unfused_bytes / moved
    assert abs(timed_unfused_bytes / moved / (unfused_bytes / floor_bytes) - 1) < 0.05
else:
    print("LIVE: none here (the interpreter simulates the kernels: their times mean nothing); "
          f"copy_kernel copied x {tuple(xd.shape)} exactly, timing it needs a GPU")
# the committed run (read before any cell ran; a GPU run writes its own table elsewhere)
c_time_ratio = committed["unfused_us"] / committed["fused_us"]
c_bytes_ratio = sum(r.nbytes for r in committed_rows) / committed["fused_bytes"]
print(f"\n{COMMITTED}:")
print(f"  TE unfused {committed['unfused_us']:.0f} us, "
      f"ropelib.apply_rope {committed['fused_us']:.1f} us -> unfused / fused "
      f"{c_time_ratio:.1f}x; their bytes {c_bytes_ratio:.2f}x")
assert (round(c_time_ratio, 1), round(c_bytes_ratio, 2)) == (11.3, 6.02)
assert round(c_time_ratio / c_bytes_ratio, 1) == 1.9

# %% [markdown]
# If every kernel of the chain streamed its bytes as fast as the fused one, the time ratio
# would equal the bytes ratio. That ratio hardly depends on the shape: leaving out the small
# table, the chain moves 12 times the bytes of $x$ and the fused kernel 2, so it tends to 6 as
# $BH$ grows (6.1 for the smaller `x` above, 6.02 in the committed run). The time ratio is
# larger: in the committed H200 run the chain takes 11.3 times as long as ropelib's one kernel,
# 1.9 times the bytes ratio. A GPU's `LIVE` block prints its own pair of ratios, and the cell
# asserts that the time ratio is the larger.
#
# ### Each kernel against a copy
#
# Where does the rest go? The next cell profiles five forward passes of the chain, a copy of
# `x` and `ropelib.apply_rope` under one clock (CUDA activity in `torch.profiler`) and gives
# each kernel's mean device time, its op's counted bytes, its GB/s and that as a fraction of
# the copy's (`ropelib.course.kernel_bandwidth` does the matching). Without a GPU it prints the
# committed run's table. Its last lines split the timed ratio into a product of measured
# factors (`ratio_split`): launch gaps, the kernels' shortfall against the copy's bandwidth, the
# bytes, and two factors of the fused call's own clock. The product is the timed ratio exactly;
# what to read is which factors are far from 1.


# %%
def ratio_split(unfused_us, fused_us, rows, fused_bytes, copy_gbps, fused_device_us):
    """unfused_us / fused_us (both do_bench) as a product of measured factors. With the fused
    kernel's device time, the kernel is held against the copy by the same clock, and do_bench's
    share of the fused call is a factor of its own."""
    factors = kb.ratio_factors(unfused_us, fused_device_us, rows, fused_bytes, copy_gbps)
    factors["the fused kernel's device time over do_bench's time"] = fused_device_us / fused_us
    return factors


if GPU:

    repeats = 5

    def kernels_of(fn, skip=kb.SKIPPED):
        """(name, us) of the GPU kernels of `repeats` calls of fn, after a warm-up."""
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        with profile(activities=activities, acc_events=True) as prof:
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
        return kb.device_kernels(prof.events(), skip=skip)

    # a contiguous copy_ runs as a "Memcpy DtoD" on the GPU: keep it
    copies = kernels_of(lambda: y_buf.copy_(xd), skip=("Memset",))
    copy_us = kb.mean_us(copies, repeats, "copy of x")
    copy_gbps = kb.gbps(2 * xd.numel() * xd.element_size(), copy_us)
    # the fused kernel, timed as the copy is (device time), beside do_bench's time of its call
    with forced("finished"):                     # the single-kernel route, as timed above
        fused_device_us = kb.mean_us(kernels_of(lambda: ropelib.apply_rope(xd, fp)), repeats,
                                     "ropelib.apply_rope")
    rows = kb.kernel_table(kernels_of(lambda: reference.te_unfused(xd, fp)), counted.ops,
                           repeats, copy_gbps)
    kb.write_rows(LIVE_CSV, rows, copy_gbps=copy_gbps,
                  unfused_us=t_unfused * 1e3, fused_us=t_fused * 1e3, fused_bytes=moved,
                  fused_device_us=fused_device_us,
                  repeats=repeats, gpu=torch.cuda.get_device_name(),
                  versions=f"torch {torch.__version__}, triton {triton.__version__}")
    where = LIVE
    first = (f"device time: copy of x {copy_us:.1f} us, ropelib.apply_rope "
             f"{fused_device_us:.1f} us (do_bench: {t_copy * 1e3:.1f} and {t_fused * 1e3:.1f} us)"
             f"; this run's table: {LIVE_CSV}")
else:
    # no GPU profiler here: the committed GPU run's table, kept in figures/
    rows, kept = committed_rows, committed
    copy_gbps, moved = kept["copy_gbps"], kept["fused_bytes"]
    t_unfused, t_fused = kept["unfused_us"] / 1e3, kept["fused_us"] / 1e3
    fused_device_us = float(kept["fused_device_us"])     # the fused kernel, profiled as well
    where = COMMITTED
    first = "(no GPU here: nothing in this cell is timed live)"
    repeats = int(kept["repeats"])
print(f"{where}:\n{first}\n\nthe unfused forward, device time per kernel "
      f"(mean of {repeats} passes)\n")
print(kb.format_table(rows, copy_gbps))
kernel_us, at_copy_us = sum(r.us for r in rows), kb.us_at_copy_speed(rows, copy_gbps)
print(f"\nthe {len(rows)} kernels take {kernel_us:.0f} us; their bytes at the copy's GB/s "
      f"would take {at_copy_us:.0f} us")
assert kernel_us > at_copy_us
# the same rows summed by kernel kind: the template each kernel's name shows
kinds = kb.by_kind(rows, copy_gbps)
print("\nby kind of kernel (kernels: their numbers in the table above)\n")
print(kb.format_kinds(kinds))
plain = [k for k in (kb.NOT_VECTORIZED, kb.CAT_NOT_VECTORIZED) if k in kinds]
vectorized = [k for k in (kb.VECTORIZED, kb.CAT_VECTORIZED) if k in kinds]
plain_over_us = sum(kinds[k].over_copy_us for k in plain)
print(f"\nnot vectorized: {sum(len(kinds[k].rows) for k in plain)} kernels, "
      f"{plain_over_us:.0f} of the {kernel_us - at_copy_us:.0f} us the chain's kernels take "
      f"beyond the copy's speed ({plain_over_us / (kernel_us - at_copy_us):.0%})")
# which op ran as which kind, as the text below says
assert kinds[kb.NOT_VECTORIZED].ops == ["mul", "neg", "mul"]
assert kinds[kb.CAT_NOT_VECTORIZED].ops == ["cat"] and kinds[kb.CAT_VECTORIZED].ops == ["cat"]
assert "add" in kinds[kb.VECTORIZED].ops
# the template, not the op, sets the speed: every vectorized kind near a copy, every other one
# under three quarters of the slowest vectorized kind, and the time beyond the copy's speed theirs
assert all(kinds[k].of_copy > 0.8 for k in vectorized)
assert max(kinds[k].of_copy for k in plain) < 0.75 * min(kinds[k].of_copy for k in vectorized)
assert plain_over_us > 0.9 * (kernel_us - at_copy_us)
# the unfused/fused ratio as a product of measured factors (exact by construction)
factors = ratio_split(t_unfused * 1e3, t_fused * 1e3, rows, moved, copy_gbps, fused_device_us)
print(f"\nunfused / fused, factor by factor ({'LIVE' if GPU else 'COMMITTED run'}):")
for what, f in factors.items():
    print(f"  {f:6.2f}x  {what}")
product = 1.0
for f in factors.values():
    product *= f
print(f"  {product:6.2f}x  = unfused / fused, timed: {t_unfused / t_fused:.2f}x")
# the bytes and the kernels' own bandwidth make the gap; launches between them do not
assert factors["bytes, unfused over fused"] > 3
assert factors["kernels below the copy's bandwidth"] > 1.3
assert factors["time outside the kernels (launch gaps)"] < 1.1
# the fused kernel near a copy, both in device time
assert factors["the fused kernel against a copy"] > 0.8
assert factors["the fused kernel's device time over do_bench's time"] > 0.8

# %%
# the table above as a figure: each kernel's device time, split into the time its bytes would
# take at the copy's GB/s and the time beyond it
source = (f"{torch.cuda.get_device_name()}, LIVE" if GPU
          else f"{committed['gpu']}, {committed['versions']}, COMMITTED run: {KERNELS_CSV.name}")
# (a kernel faster than the copy, such as the add, is all grey: its own time, nothing beyond)
at_copy = [min(r.nbytes / copy_gbps / 1e3, r.us) for r in rows]
beyond = [r.us - a for r, a in zip(rows, at_copy)]
plain_kinds = (kb.NOT_VECTORIZED, kb.CAT_NOT_VECTORIZED)
fig, ax = plt.subplots(figsize=(8, 3.4))
names = [f"{i}: {r.op}" for i, r in enumerate(rows)]
ax.barh(names, at_copy, color="0.7")
ax.barh(names, beyond, left=at_copy,
        color=["tab:red" if r.kind in plain_kinds else "tab:blue" for r in rows])
ax.invert_yaxis()
ax.set_xlabel("device time per call (us)")
ax.set_title(f"TE unfused forward, kernel by kernel\n{source}", fontsize=10)
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("0.7", "tab:red", "tab:blue")],
          labels=["its bytes at the copy's GB/s", "beyond: not vectorized",
                  "beyond: vectorized"], fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(FIGURES / "02-unfused-kernel-time.png", dpi=120)
plt.show()

# %% [markdown]
# Grey is the time each kernel's bytes would take at the copy's bandwidth (for the `add`, which
# beats the copy, its whole time); colour is the rest. The red bars, the kernels PyTorch did not
# vectorize, hold nearly all of it (the `not vectorized` line above).

# %%
# the committed H200 run (read before any cell ran): the numbers the text below quotes
c_copy = committed["copy_gbps"]
c_big = max(r.nbytes for r in committed_rows) / 4
c_on_x = [i for i, r in enumerate(committed_rows) if r.nbytes >= c_big]
c_table_us = [r.us for i, r in enumerate(committed_rows) if i not in c_on_x]
c_slow = [i for i, r in kb.below(committed_rows, 0.5) if i in c_on_x]
c_kinds = kb.by_kind(committed_rows, c_copy)
c_over = sum(r.us for r in committed_rows) - kb.us_at_copy_speed(committed_rows, c_copy)
c_plain_over = sum(c_kinds[k].over_copy_us for k in (kb.NOT_VECTORIZED, kb.CAT_NOT_VECTORIZED))
c_factors = ratio_split(committed["unfused_us"], committed["fused_us"], committed_rows,
                        committed["fused_bytes"], c_copy, float(committed["fused_device_us"]))
print(f"{COMMITTED}:")
print(f"  kernels {c_on_x[0]}-{c_on_x[-1]} at "
      + "/".join(f"{100 * committed_rows[i].of_copy:.0f}" for i in c_on_x)
      + f" % of a copy, table kernels {min(c_table_us):.1f}-{max(c_table_us):.1f} us; "
      f"{c_over:.0f} us beyond the copy's speed, {c_plain_over:.0f} not vectorized; factors "
      + " * ".join(f"{f:.2f}" for f in c_factors.values()))
assert c_slow == [4, 5, 6, 7] and c_on_x == [4, 5, 6, 7, 8, 9]
assert (round(min(c_table_us), 1), round(max(c_table_us), 1)) == (1.5, 2.8)
assert [round(100 * committed_rows[i].of_copy) for i in c_on_x] == [35, 39, 24, 35, 103, 97]
assert (round(c_over), round(c_plain_over)) == (498, 494)
assert [round(f, 2) for f in c_factors.values()] == [1.00, 2.29, 6.02, 0.87, 0.94]
# 128 MiB of x on one clock, do_bench's: the single kernel of this run against apply_rope's
# default (two-pass) route and a copy in the committed floor run (same GPU and versions)
assert committed["gpu"] == fl_meta["gpu"]
assert committed["versions"] == f"torch {fl_meta['torch']}, triton {fl_meta['triton']}"
fl_128 = fl["forward 128 MiB bf16 sbhd"]
fl_copy_us, two_pass_us = (float(fl_128[p]["ms"]) * 1e3 for p in ("copy", "ropelib"))
single, two_pass = fl_copy_us / committed["fused_us"], float(fl_128["ropelib"]["ratio_to_copy"])
print(f"  do_bench, 128 MiB of x: the single kernel {committed['fused_us']:.1f} us; floor run: "
      f"the default two-pass route {two_pass_us:.1f} us, a copy {fl_copy_us:.1f} us -> "
      f"{single:.2f} against {two_pass:.2f} of a copy")
assert [round(v, 1) for v in (committed["fused_us"], two_pass_us, fl_copy_us)] == [78.6, 71.3, 67.5]
assert (round(single, 2), round(two_pass, 2)) == (0.86, 0.95)

# %% [markdown]
# The table shows what the bytes alone do not. The numbers below are the committed H200 run's
# (the last cell's line). In it 4 of the 6 kernels on $x$ (the two multiplies, the `neg` and
# the first `cat`) stream at 24% to 39% of the copy's bandwidth (the table's own `cos`, `sin`
# and casts, 1.5 to 2.8 µs each on a small tensor, are left out of that count). Its factors
# answer "where does the rest go?": the chain moves 6.02 times the fused kernel's bytes, its
# kernels take 2.29 times what those bytes would take at the copy's speed, and the gaps between
# kernels add nothing visible (1.00). The last two factors and the last printed line are about
# the fused call's own speed, clock and route, not the chain: notebook 05 builds the single
# kernel and the two-pass route, notebook 07 (its optional part A) the fixed cost of a call.
#
# A live table is its GPU's own: the bytes factor stays 6.02 (it counts, it does not time), the
# percentages and the shortfall factor change. Compare GPUs by the `by kind` table and the
# `not vectorized` line: which kinds run near a copy, which well below, and what share of the
# time beyond the copy's speed the non-vectorized ones hold.
#
# Which kernels fall short, and why? The by-kind table sums the kernels by the PyTorch template
# each was launched from, as its name shows in the profiler listing above. The slow ones are the
# **non-vectorized** ones: `elementwise_kernel<128, 4>` for the two multiplies and the `neg`,
# and the plain `CatArrayBatchedCopy` for the first `cat`. Each has an operand that is not
# contiguous: the multiplies read the cos/sin table broadcast over batch and heads (a stride of
# 0), `neg` and the first `cat` a strided half of `x` (`torch.chunk` of the last dimension).
# PyTorch picks its vectorized template, where each thread loads several neighbouring elements
# at once, only when every operand is contiguous; otherwise each thread handles one element at
# a time, at an offset computed from the strides (`gpu_kernel_impl` in PyTorch's
# `CUDALoops.cuh`). That rule is read from PyTorch's source and the kernels' names; the counters
# below measure the loads themselves, and the cell after them makes the table contiguous and
# watches the template change. Of the 498 µs the chain's kernels take beyond the copy's speed
# in the committed run, 494 µs are the non-vectorized kernels'.
#
# The `add` of two contiguous temporaries and the second `cat` run vectorized, at 103% and 97%
# of the copy's GB/s in the committed run. (`cos`, `sin` and their casts are vectorized too, on
# the small table.) An `add` above 100 % is not a kernel outrunning the memory: the yardstick
# is a `copy_`, which the GPU runs as a device-to-device memory copy, not an element-wise
# kernel (the `LIVE` block above sets a Triton copy kernel beside it), and it is not the
# memory's peak. The appendix sets a few element-wise streams beside it.
#
# The kind is read from a name; the loads themselves take hardware counters. The next cell
# reads the same chain under Nsight Compute, NVIDIA's kernel profiler, on an H200
# (`benchmarks/access_counters.py`, one call at this notebook's GPU shape).
#
# For each kernel it counts the global load **requests** (one per warp instruction) and the
# 32-byte sectors they asked for. When a warp's 32 lanes load neighbouring elements, $b$ bytes
# each, one request covers $32 b$ bytes, that is $b$ sectors: sectors per request is the bytes
# each lane loads at once.

# %%
acc_meta, acc_rows = measured.load("access_counters")
chain = [dict(r, kind=kb.kernel_kind(r["pattern"]),
              per_request=r["l1_load_sectors"] / r["l1_load_requests"])
         for r in acc_rows if r["group"] == "reference"]
print(f"Nsight Compute on {measured.where(acc_meta)}: the unfused chain, one call")
big = [r for r in chain if r["dram_read_bytes"] > 32e6]       # the kernels on x, not the table
print(f"{'kernel':48s} {'kind':28s} {'us':>6s} {'load requests':>14s} {'sectors/request':>16s}")
for r in big:
    print(f"{kb.short_name(r['pattern'], 46):48s} {r['kind']:28s} {r['duration_ns'] / 1e3:6.1f} "
          f"{r['l1_load_requests']:14,.0f} {r['per_request']:16.0f}")
print(f"({len(chain) - len(big)} kernels that touch only the cos/sin table, "
      f"{sum(r['duration_ns'] for r in chain if r not in big) / 1e3:.0f} us in all, left out)")
one_wide = [r for r in big if r["kind"] in (kb.NOT_VECTORIZED, kb.CAT_NOT_VECTORIZED)]
eight_wide = [r for r in big if r["kind"] in (kb.VECTORIZED, kb.CAT_VECTORIZED)]
# one bf16 element a lane (2 bytes: 2 sectors a request) against 8 (16 bytes: 16 sectors)
assert len(one_wide) == 4 and all(r["per_request"] == 2 for r in one_wide)
assert len(eight_wide) == 2 and all(r["per_request"] == 16 for r in eight_wide)
mul = next(r for r in one_wide if "MulFunctor" in r["pattern"])
add = next(r for r in eight_wide if "add" in r["pattern"])
print(f"\none multiply against the add: {mul['l1_load_sectors']:,.0f} against "
      f"{add['l1_load_sectors']:,.0f} sectors asked for, in {mul['l1_load_requests']:,.0f} "
      f"against {add['l1_load_requests']:,.0f} load requests "
      f"({mul['l1_load_requests'] / add['l1_load_requests']:.0f}x)")
assert mul["l1_load_sectors"] == add["l1_load_sectors"] == 8_388_608
assert mul["l1_load_requests"] == 8 * add["l1_load_requests"]

# %% [markdown]
# The counters confirm what the names said. Every kernel of the chain that is not vectorized
# asks for 2 sectors a request: each lane loads one bf16 element. The vectorized `add` and `cat`
# ask for 16: each lane loads 8 elements, 16 bytes, in one instruction. A multiply and the add
# ask for the same 8,388,608 sectors (two operands of $x$'s size each; the multiply's second one
# is the broadcast table), and the multiply takes eight times the load requests to do it; it
# streams at 35% of the copy's GB/s in the committed run, the add at 103%.
#
# Two cautions. The counters show how the loads are issued, not that issuing them so costs the
# time: the non-vectorized path also computes each element's offset from the strides and takes
# a thread's elements in turn, and these counters cannot separate either from the narrower
# loads (the last cells of this section take the three apart in a Triton kernel of their own,
# not in PyTorch's). And Nsight Compute replays each kernel under its own measurement, so its
# durations are not the profiler's (the appendix sets the two side by side): compare its
# counts, not its times.
#
# One more timing answers a question the counters leave aside: is it the broadcast operand
# that costs the time? On a GPU the next cell times the chain's first multiply, `x * cos`, with
# the table broadcast over batch and heads, as in the chain, and with the same table expanded
# to the shape of $x$ and made contiguous: the same operation on the same values, the second
# moving more bytes (its table is as large as $x$).

# %%
# x * cos two ways: the table [S, 1, 1, D] broadcast (stride 0 over B and H), and the same
# table expanded to x's shape and copied into contiguous memory
if GPU:
    cos_b = torch.cos(fp).to(xd.dtype)
    cos_full = cos_b.expand_as(xd).contiguous()
    assert torch.equal(xd * cos_b, xd * cos_full)
    x_nbytes = xd.numel() * xd.element_size()
    same_mul = {}
    for label, table, nbytes in [
            ("table broadcast", cos_b, 2 * x_nbytes + cos_b.numel() * cos_b.element_size()),
            ("table expanded, contiguous", cos_full, 3 * x_nbytes)]:
        ks = kernels_of(lambda t=table: xd * t)
        us = kb.mean_us(ks, repeats, label)
        same_mul[label] = (kb.kernel_kind(ks[0][0]), us, kb.gbps(nbytes, us) / copy_gbps)
    print(f"{LIVE}: x * cos, device time (mean of {repeats} calls)")
    for label, (kind, us, of_copy) in same_mul.items():
        print(f"  {label:28s} {kind:28s} {us:7.1f} us   {of_copy:5.0%} of the copy's GB/s")
    (kind_b, us_b, of_b), (kind_c, us_c, of_c) = same_mul.values()
    assert kind_b == kb.NOT_VECTORIZED and kind_c == kb.VECTORIZED
    assert us_c < us_b and of_c > of_b        # directions only: the margins vary by GPU
    del cos_full
else:
    print("LIVE: none here (a GPU times the two multiplies; the interpreter's times mean nothing)")

# %% [markdown]
# On a GPU the contiguous multiply runs from the vectorized template and finishes sooner than
# the broadcast one, although it moves half as many bytes again (on the H100 run printed on this
# notebook's page, 132.4<!--page: table expanded, contiguous--> µs against
# 190.1<!--page: table broadcast--> µs). So the broadcast operand is what sends the multiply down
# the slow template: the same values, the same op, and only the operand's strides differ.
#
# **Optional, a second reading (about 15 minutes), up to "What to take from section 6".** Which
# part of that template costs the time? It differs from the vectorized one in three ways at once:
# each lane loads one element at a time; each operand's offset is formed from sizes and strides;
# and a thread runs its 4 elements in turn (`elementwise_kernel` in PyTorch's `CUDALoops.cuh`:
# load, multiply, store, then the next element; PyTorch's variant that loads all of a thread's
# elements before it stores any is built for ROCm only). That third trait suggests a
# hypothesis, not measured on PyTorch's kernel here: a compiler that cannot prove a store leaves
# the next element's operands alone must keep the next loads behind it, so each thread would
# have one element's loads in flight at a time.
#
# The next cells take the three apart with one Triton kernel for the contiguous `x * cos`,
# `_mul_kernel`, in four modes (its constexpr `MODE`), each launched by `launch_mul` at that
# template's launch shape (128 threads, 4 elements each). The four move the same bytes and differ
# only in how they form their addresses `at`:
#
# - `MODE == 0`, wide: `at = offs`, a run the compiler proves contiguous, so a lane's 4
#   neighbouring elements go in one 8-byte access;
# - `MODE == 1`, one element a lane: `at = offs * one`, where `one == 1` arrives at run time
#   (`do_not_specialize` keeps the JIT from making it a constant), so the compiler cannot see
#   through it: one 2-byte access an element, a warp on 32 neighbouring elements (the 2 sectors
#   a request counted above);
# - `MODE == 2`, that by / and %: `at = (offs // row) * row_stride + (offs % row) * one`, the
#   same offsets through a division and a remainder by the row length (dearer than the multiply
#   PyTorch divides by);
# - `MODE == 3`, one in flight: the `else` branch. A lane takes its 4 elements in turn
#   (`for i in tl.static_range(4)`, `BLOCK // 4` apart, as PyTorch's thread steps), each
#   address `at = offs * one + wait`, and after each element
#   `wait = x.to(tl.int32, bitcast=True) * zero` (`zero == 0` at run time): the next address
#   waits on the last element's loaded value, so a lane has one element's loads in flight at a
#   time.
#
# Edit a mode's lines and rerun the cells from there on: the checks below say what your version
# compiles to. The cell after the launcher compiles each mode for sm_90 here and asserts those
# accesses, and their order, in its PTX (the virtual assembly Triton emits before the GPU's own
# machine code), checks all four in the interpreter, and on a GPU prints each one's GB/s as a
# share of the wide kernel's, beside PyTorch's two multiplies. A line that falls toward PyTorch's
# broadcast multiply while the others stay near the wide kernel names a trait that costs speed,
# and how far it falls says how much of PyTorch's shortfall it can account for; where none falls,
# none of the three explains the template alone.

# %%
# ropelib-source: ropelib.course.nb02_narrow_loads._mul_kernel
@triton.jit(do_not_specialize=["one", "zero", "row", "row_stride"])
def _mul_kernel(x_ptr, c_ptr, y_ptr, n, one, zero, row, row_stride, BLOCK: tl.constexpr,
                MODE: tl.constexpr):
    if MODE < 3:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if MODE == 0:
            at = offs                               # provably contiguous: vector accesses
        elif MODE == 1:
            at = offs * one                         # one == 1, unknown to the compiler
        else:                                       # offs again (row_stride == row), by a
            at = (offs // row) * row_stride + (offs % row) * one    # division and a remainder
        x = tl.load(x_ptr + at, mask=mask).to(tl.float32)   # in fp32, rounded once, as PyTorch
        y = (x * tl.load(c_ptr + at, mask=mask).to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + at, y, mask=mask)
    else:              # a lane's 4 elements in turn, BLOCK // 4 apart, as PyTorch's thread steps
        lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK // 4)
        wait = tl.zeros([BLOCK // 4], dtype=tl.int32)
        for i in tl.static_range(4):
            offs = lane + i * (BLOCK // 4)
            mask = offs < n
            at = offs * one + wait                  # waits for the last element's values
            x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
            y = (x * tl.load(c_ptr + at, mask=mask, other=0.0).to(tl.float32))
            tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)
            wait = x.to(tl.int32, bitcast=True) * zero      # 0, known only at run time


# %%
MUL_MODES = {"wide": 0, "one element a lane": 1, "one element a lane, by / and %": 2,
             "one element a lane, one in flight": 3}               # name -> the kernel's MODE
MUL_BLOCK, MUL_WARPS = 512, 4      # PyTorch's elementwise_kernel<128, 4>: 128 threads, 4 elements


def launch_mul(kernel, x, c, out, mode):
    """out = x * c (contiguous tensors of one shape) by `kernel` in `mode` (a key of MUL_MODES)."""
    assert x.is_contiguous() and c.is_contiguous() and out.is_contiguous()
    assert x.shape == c.shape == out.shape
    n, row = x.numel(), x.shape[-1]    # row == row_stride: MODE 2's offsets are offs again
    # grid: one program per MUL_BLOCK elements; MUL_WARPS warps, so 4 elements a thread
    kernel[(triton.cdiv(n, MUL_BLOCK),)](x, c, out, n, 1, 0, row, row,   # one = 1, zero = 0
                                         BLOCK=MUL_BLOCK, MODE=MUL_MODES[mode],
                                         num_warps=MUL_WARPS)
    return out


# %%
from ropelib.course import nb02_narrow_loads as narrow   # reads the compiled code

code = narrow.access_code(xd.dtype, _mul_kernel, modes=MUL_MODES, block=MUL_BLOCK,
                          num_warps=MUL_WARPS)  # compiled for sm_90 here: no GPU needed
for name, c in code.items():
    print(f"{name:34s} PTX: {c['per_thread']} element(s) a thread in a run; loads "
          f"{dict(c['loads'])}, stores {dict(c['stores'])}, div/rem {c['divisions']}; "
          f"in order {c['order']}")
wide, one_lane, by_div, in_turn = code.values()
assert MUL_WARPS * 32 == 128 and MUL_BLOCK // 128 == 4    # PyTorch's template's shape
assert wide["per_thread"] == 4 and set(wide["loads"]) == {"ld.global.v2.b32"}     # 8 bytes
assert one_lane["per_thread"] == by_div["per_thread"] == in_turn["per_thread"] == 1  # 2 bytes
assert set(one_lane["loads"]) == set(by_div["loads"]) == set(in_turn["loads"]) == {"ld.global.b16"}
assert wide["divisions"] == one_lane["divisions"] == in_turn["divisions"] == 0 < by_div["divisions"]
assert one_lane["order"] == "L" * 8 + "S" * 4 and in_turn["order"] == "LLS" * 4  # L load, S store
cos_c = torch.cos(fp).to(xd.dtype).expand_as(xd).contiguous()    # the table at x's shape
y_mul = torch.empty_like(xd)
for name in MUL_MODES:                          # compiled on a GPU, interpreted on a CPU
    y_mul.fill_(float("nan"))
    torch.testing.assert_close(launch_mul(_mul_kernel, xd, cos_c, y_mul, name), xd * cos_c)
if GPU:
    mul_bytes = 3 * xd.numel() * xd.element_size()           # x and the table read, y written
    of_copy = {f"PyTorch, {label}": share for label, (_, _, share) in same_mul.items()}  # above
    for name in MUL_MODES:
        us = kb.mean_us(kernels_of(lambda m=name: launch_mul(_mul_kernel, xd, cos_c, y_mul, m)),
                        repeats, name)
        of_copy[f"Triton, {name}"] = kb.gbps(mul_bytes, us) / copy_gbps
    print(f"{LIVE}: x * cos, device time (mean of {repeats} calls), GB/s as a share of")
    for label, share in of_copy.items():
        print(f"  {label:42s} the copy's {share:5.0%}   the wide kernel's "
              f"{share / of_copy['Triton, wide']:5.0%}")
else:
    print("LIVE: none here (the four kernels ran in the interpreter and are right; timing "
          "them needs a GPU)")
del cos_c, y_mul

# %% [markdown]
# What to take from section 6: in the committed H200 run the unfused chain takes 11.3 times as long
# as one fused call because it moves 6.02 times the bytes *and* its kernels stream them at 1/2.29 of
# a copy's speed, the shortfall in the kernels PyTorch did not vectorize, each with an operand that
# is not contiguous (a broadcast table, a strided half). A live run prints its own GPU's factors:
# the bytes factor is fixed, the shortfall factor is the GPU's, and the four Triton lines say which
# of the slow template's three traits costs a Triton kernel speed there. Where the one-element and
# the division kernels stay near the wide kernel and only the one-in-flight kernel falls, the narrow
# loads and the index arithmetic cost a Triton kernel little and one element in flight at a time
# costs it speed: that fits the hypothesis about PyTorch's loop without proving it, since PyTorch's
# own kernel is not taken apart here. Where the one-in-flight kernel stays well above PyTorch's
# broadcast multiply (as it did in the one H100 run printed on this notebook's page in
# `docs/executed/`, at 76<!--page: Triton, one element a lane, one in flight--> % of the copy's GB/s
# against the multiply's 47<!--page: PyTorch, table broadcast--> %; no committed file holds it), the
# mimic leaves part of the gap unexplained: whatever takes PyTorch's multiply further down is not
# found here. A fused kernel removes the extra bytes: one read, one write. ropelib's single kernel
# streams them at 0.87 of a copy's speed in device time in the committed run (the fourth factor);
# notebooks 03 to 05 build what makes a kernel stream that fast, and notebook 07 measures the fixed
# cost of a call.

# %% [markdown]
# ## Exercises
#
# Replace each `...` (in exercise 5, the `pass`), run the cell, and read the ✅ / ❌ line.
# Solutions are folded below. (The `;` after a check only stops Jupyter from echoing its
# `True`/`False`.)
#
# Each exercise is answered with a function (exercise 5 with a Triton kernel), even where the
# answer is a list or a number: the check tries it on several inputs and runs it with `ropelib`
# barred. A function that calls
# `ropelib.reference` (as the sections above do), `ropelib.frequencies`, the benchmarks' bytes
# model or a worked solution is refused, even when its numbers are right. Plain PyTorch is
# yours to use.
#
# **Exercise 1 — context-parallel positions of a packed batch.** (a) First put section 5's
# rule in a function: `rank_positions(local_len, cp_size, cp_rank)` returns the global positions
# of the `local_len` tokens rank `cp_rank` holds of one sequence, in its local order (16 tokens
# over `cp_size=2`: which does rank 1 hold?).
#
# (b) The exercise proper: a packed `thd` batch. TE splits it sequence by sequence. Given the
# global `cu_seqlens` (every length a multiple of $2\,\mathrm{cp\_size}$), each sequence is
# cut into $2\,\mathrm{cp\_size}$ chunks of its own, rank $r$ keeps chunks $r$ and
# $2\,\mathrm{cp\_size}-1-r$ of every sequence, packed one sequence after another, and
# positions restart at 0 in each sequence. With `cp_size=1` nothing is split: the one rank
# holds every sequence whole, of any length, odd ones included (the check tries that too).
# Write `thd_rank_positions(cu_seqlens, cp_size, cp_rank)`: the positions of the rank's packed
# tokens, in its local order. Your `rank_positions` may help. The check compares with
# ropelib's reference on several batches and one drawn when it runs.

# %%
from ropelib.course.exercises import basics, layouts, solution


def rank_positions(local_len, cp_size, cp_rank):
    ...   # your code: a list of local_len ints


def thd_rank_positions(cu_seqlens, cp_size, cp_rank):
    ...   # your code: a list of cu_seqlens[-1] // cp_size ints


basics.check_cp_positions(rank_positions)
layouts.check_thd_cp_positions(thd_rank_positions);

# %%
solution(basics.solution_cp_positions)
solution(layouts.solution_thd_cp_positions)

# %% [markdown]
# **Exercise 2 — HF's rotary forward.** Section 2 described what
# `*RotaryEmbedding.forward(x, position_ids)` computes. Write it:
# `hf_cos_sin(inv_freq, position_ids, attention_scaling, dtype)` takes the inverse frequencies
# `[R/2]` (fp32), the positions `[B, S]` (int64), the scaling and the model's dtype, and returns
# `cos, sin`, each `[B, S, R]` in that dtype, rotate-half layout, computed in fp32 and rounded
# once. The check tries bf16, fp16 and fp32 outputs and positions up to $10^5$, where angles
# computed in another precision, or cos and sin rounded before the scaling, no longer match;
# it refuses transformers' own rotary modules. Then give `ropelib.apply_rope` your bf16 `cos[0],
# sin[0]` for section 2's `x_sbhd` (positions `torch.arange(S)`): which line of section 2's
# table does it reproduce? (Once your cos and sin pass, the cell prints it.)

# %%
def hf_cos_sin(inv_freq, position_ids, attention_scaling, dtype):
    ...   # your code: return (cos, sin)


if layouts.check_hf_cos_sin(hf_cos_sin):     # passed: the last question, with your cos and sin
    line, same = layouts.table_line_of(hf_cos_sin, x_sbhd, outputs)
    print(f"apply_rope on your bf16 cos[0], sin[0]: {same:.1%} of the outputs equal the line "
          f"'{line}' of section 2's table")

# %%
solution(layouts.solution_hf_cos_sin)

# %% [markdown]
# **Exercise 3 — the bandwidth floor of q and k.** Section 6 counted the floor for one tensor
# with every feature rotated. A model's attention rotates q and k, in one launch: q of shape
# `[S, B, Hq, D] = [4096, 2, 32, 128]` and k with `Hk = 8` heads (grouped-query attention), in
# bf16, reading the fp32 angle table once for both. With partial rotary only the first
# $R$ = `int(D * rotary_percent)` features turn (section 3); a kernel that writes
# fresh outputs still copies the rest through. How many bytes must it move at least? (This is
# the model `ropelib.bench.compare` uses for GB/s.) Write
# `bytes_moved(seq_len, batch, q_heads, kv_heads, head_dim, rotary_percent=1.0,
# bytes_per_element=2)` for any shape and element size (2 bytes for bf16 and fp16, 4 for fp32);
# the check tries this shape and others, some with partial rotary.

# %%
def bytes_moved(seq_len, batch, q_heads, kv_heads, head_dim, rotary_percent=1.0,
                bytes_per_element=2):
    ...   # your code: an int


basics.check_bytes_moved(bytes_moved);

# %%
solution(basics.solution_bytes_moved)

# %% [markdown]
# **Exercise 4 — an eager chain without the broadcast table or the split.** Section 6 found two
# costs in TE's chain that plain PyTorch can avoid: its two multiplies read the cos/sin table
# broadcast over batch and heads, which sends them down PyTorch's non-vectorized template, and
# its partial-rotary split ends in a `cat` that copies the whole output again. Write
# `lean_chain(t, freqs)`: the same rotation (`sbhd`, rotate-half, every feature turned;
# `freqs` is `[S, 1, 1, D]` fp32) in plain PyTorch, with the cos and sin tables made
# contiguous at `t`'s shape, in `t`'s dtype, before any multiply, and no split. The check wants
# TE's chain's bits exactly, on several shapes and one drawn when it runs; it then records your
# ops at dispatch as `CountTraffic` does, refuses an arithmetic op on `t`-sized tensors that
# reads a broadcast operand, and holds the bytes to the budget it prints (in units of `t`'s
# bytes, plus the small table's).
#
# Your chain moves *more* bytes than TE's: the two tables are written at `t`'s size. Whether
# the vectorized multiplies repay that is a question for a GPU: once your chain passes, the cell
# times it there with `do_bench` beside TE's chain and the single fused kernel (live; nothing
# is timed in the interpreter). The `neg` and the first `cat` of `rotate_half` still read
# strided halves of `t`: can you think of a way to avoid those in plain PyTorch, and what
# would it cost in bytes?

# %%
from ropelib.course.exercises import nb02_lean_chain


def lean_chain(t, freqs):
    ...   # your code: return the rotated t


if nb02_lean_chain.check_lean_chain(lean_chain) and GPU:    # passed: timed on this GPU
    t_lean = triton.testing.do_bench(lambda: lean_chain(xd, fp))
    print(f"{LIVE}: x {tuple(xd.shape)}: TE's chain {t_unfused * 1e3:.0f} us, yours "
          f"{t_lean * 1e3:.0f} us, ropelib's single kernel {t_fused * 1e3:.1f} us")

# %%
solution(nb02_lean_chain.solution_lean_chain)

# %% [markdown]
# **Exercise 5 — the broadcast multiply, in your own kernel.** The chain's `x * cos` is slow
# because its table is broadcast over batch and heads; exercise 4 paid bytes to make it
# contiguous. A kernel that knows the layout pays neither: program `s` loads table row `s`
# once and multiplies each of token `s`'s $N = BH$ rows by it, `ROWS` rows a tile, every load
# and store a contiguous run. Write `my_table_mul_kernel` ($x$ seen as `[S, N, D]`, the table as
# `[S, D]`). The check runs it in the interpreter on several shapes and one drawn when it runs,
# wants `x * c` bit for bit (in fp32), and counts the loads: each element of $x$ once, each
# table row once. Once it passes on a GPU, the cell times it on section 6's $x$ and prints its
# share of the copy's GB/s beside PyTorch's two multiplies: does a broadcast operand still cost
# anything once the kernel reads it wide?

# %%
from ropelib.course.exercises import nb02_table_mul


@triton.jit
def my_table_mul_kernel(
    x_ptr,  # *x: [S, N, D] contiguous (N = B * H rows of one token)
    c_ptr,  # *c: [S, D] contiguous, the table: row s multiplies every row of token s
    y_ptr,  # *y: [S, N, D] contiguous, y = x * c
    N,  # rows of a token
    D: tl.constexpr,  # features of a row, a power of two
    ROWS: tl.constexpr,  # rows a tile, a power of two
):
    # launched on grid (S,): program s computes token s's N rows, ROWS at a time
    pass  # your code


if nb02_table_mul.check_table_mul(my_table_mul_kernel) and GPU:    # passed: timed on this GPU
    x3, c2, y3 = xd.view(S, B * H, D), cos_b.view(S, D), torch.empty_like(xd).view(S, B * H, D)
    torch.testing.assert_close(nb02_table_mul.launch(my_table_mul_kernel, x3, c2, 16),
                               x3 * c2[:, None])
    us = kb.mean_us(kernels_of(lambda: my_table_mul_kernel[(S,)](x3, c2, y3, B * H, D=D,
                                                                 ROWS=16)), repeats, "yours")
    share = kb.gbps(2 * x_nbytes + c2.numel() * c2.element_size(), us) / copy_gbps
    print(f"{LIVE}: x * cos, share of the copy's GB/s: yours {share:.0%}, PyTorch's "
          + ", ".join(f"{label} {of_copy:.0%}" for label, (_, _, of_copy) in same_mul.items()))

# %%
nb02_table_mul.show_table_mul_solution()

# %% [markdown]
# ## Questions for a study group
#
# 1. You are writing the KV cache of a decoder. Which layout would you store the keys in
#    (`sbhd`, `bshd`, HF's `[B, H, S, D]`, or pages of a fixed number of tokens), and would you
#    store them rotated or unrotated? Think of appending one token per step, of attention
#    reading every cached key, and of what happens when the positions change afterwards (a
#    sliding window that evicts old tokens, a context extension applied to a running model).
# 2. Section 2's bf16 cos/sin table errs by up to $2^{-9}$ in each value, whatever the
#    position. Two pairs of tokens with the same distance $m - n$ therefore no longer turn by
#    exactly the same relative angle. How much can the score $q_m^\top k_n$ differ between two
#    such pairs, and would a model trained with that table notice being served with fp32 angles
#    (or the reverse)?
# 3. Dual-chunk context parallelism evens out causal attention work. Does it still help with
#    sliding-window attention, or with packed `thd` batches of many short documents? What would
#    you split on instead?
# 4. `torch.compile` can fuse the five lines of the unfused path into one kernel. What would a
#    hand-written kernel still do better, or differently: the angle table, the backward,
#    strided inputs, in-place updates, queries and keys in one launch?
# 5. Packing into `thd` avoids computing on padding. When is padding the better choice anyway?


# %% [markdown]
# ## Appendix (optional): two asides to section 6
#
# **The `add` against the copy.** Section 6's committed table has the vectorized `add` at 103%
# of the copy's GB/s. Both are counted bytes over time, but the two move different mixes: for
# each element of $x$ the `add` reads two tensors and writes one (asserted below), the copy
# reads one and writes one. On a GPU the next cell times four streams over contiguous tensors
# the size of $x$ that read 0, 1, 2 and 3 tensors for each one they write (`fill_`, the copy,
# `add`, `addcmul`), each with `do_bench`, and prints each one's GB/s.

# %%
add_row = next(r for r in committed_rows if r.op == "add")
cat_v = next(r for r in committed_rows if r.kind == kb.CAT_VECTORIZED)
x_committed = cat_v.nbytes // 2       # the second cat reads x's two halves and writes x
c_copy_us = 2 * x_committed / committed["copy_gbps"] / 1e3
print(f"{COMMITTED}:\n  the add moves {add_row.nbytes / x_committed:.0f} tensors the size of x "
      f"(reads 2, writes 1) in {add_row.us:.1f} us, the copy 2 (reads 1, writes 1) in "
      f"{c_copy_us:.1f} us: {add_row.gbps:.0f} against {committed['copy_gbps']:.0f} GB/s "
      f"({add_row.of_copy:.2f} of the copy's)")
assert add_row.nbytes == 3 * x_committed and round(add_row.of_copy, 2) == 1.03
if GPU:
    a_, b_, c_, out_ = (torch.randn_like(xd) for _ in range(4))
    streams = {"fill_": (lambda: out_.fill_(1.0), 0), "copy": (lambda: out_.copy_(a_), 1),
               "add": (lambda: torch.add(a_, b_, out=out_), 2),
               "addcmul": (lambda: torch.addcmul(a_, b_, c_, out=out_), 3)}
    n_x = xd.numel() * xd.element_size()
    by_reads = {name: (reads + 1) * n_x / (triton.testing.do_bench(fn) * 1e-3) / 1e9
                for name, (fn, reads) in streams.items()}
    print(f"{LIVE}: tensors of {n_x / 2**20:.0f} MiB, {xd.dtype}")
    for name, (_, reads) in streams.items():
        print(f"  {name:8s} reads {reads} for 1 written ({reads / (reads + 1):4.0%} of its bytes "
              f"read): {by_reads[name]:6.0f} GB/s = {by_reads[name] / by_reads['copy']:.3f} "
              "of the copy's")
    ranked = list(by_reads.values())
    rises = all(u < v for u, v in zip(ranked, ranked[1:]))
    print("  GB/s " + ("rises with the share of reads, at every step" if rises else
                       "does not rise at every step with the share of reads")
          + f"; the add against the copy here: {by_reads['add'] / by_reads['copy']:.3f}")
    assert by_reads["add"] > 0.8 * by_reads["copy"]          # vectorized: near a copy, as above
    del a_, b_, c_, out_
else:
    print("(no GPU here: the four streams are timed on a GPU only)")

# %% [markdown]
# Where the GB/s rises with the share of reads, the `add`'s lead over the copy goes with what it
# moves; where it does not (`fill_`, which reads nothing, beating the copy too), the copy is
# simply not the fastest stream on that GPU. Either way an `add` a few percent over the copy
# streams as fast as a contiguous kernel can: "near a copy", all that section 6 needs.
#
# **Nsight Compute's clock against the profiler's.** Nsight Compute replays each kernel under
# its own measurement. The cell below divides its durations for the six kernels on $x$ by the
# committed profiler run's: the non-vectorized kernels take longer under it, the two vectorized
# ones about as long. Its counts, not its times, are what section 6 uses.

# %%
# Nsight Compute's durations against the committed profiler run's, kernel for kernel
c_x_rows = [committed_rows[i] for i in c_on_x]              # the same six kernels, in order
assert [r.op for r in c_x_rows] == ["mul", "neg", "cat", "mul", "add", "cat"]
under_ncu = [r["duration_ns"] / 1e3 / c.us for r, c in zip(big, c_x_rows)]
print("duration under Nsight Compute / under the profiler: "
      + ", ".join(f"{c.op} {q:.2f}" for c, q in zip(c_x_rows, under_ncu)))
assert all(q > 1.05 for r, q in zip(big, under_ncu) if r in one_wide)     # longer
assert all(abs(q - 1) < 0.05 for r, q in zip(big, under_ncu) if r in eight_wide)  # about as long
