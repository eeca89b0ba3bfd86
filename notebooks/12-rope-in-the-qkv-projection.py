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
# # 12 — RoPE in the QKV projection: a GEMM epilogue, and a prologue for the backward
#
# Every RoPE kernel of this course reads q and k and writes them back. Right before it, the
# attention block's QKV projection has just *written* q and k. This notebook removes that
# round trip: the projection's GEMM rotates its output tile while it is still in registers
# (an **epilogue**), and the backward GEMMs undo the rotation as they load the gradient (a
# **prologue**). Then it reads what that is worth, from measurements: ropelib's first fused
# kernel was correct and *slower* than the unfused pipeline (cuBLAS, then a RoPE pass); the
# measurements said why, and the projection it ships now — a TMA main loop under the same
# epilogue, and a backward that writes $dY$ once — runs level with that pipeline in the forward
# and faster forward+backward at 8192 tokens on an H200.
#
# **After this notebook you will be able to**
#
# - count the bytes a separate RoPE pass moves and say why it can only approach the copy floor,
#   and what fusing it into the GEMM can save at most;
# - explain what a GEMM epilogue is, and why rotate-half forces the output tile to cover a whole
#   head (features $j$ and $j + D/2$ are far apart in the weight's rows);
# - write the epilogue of a small Triton QKV GEMM (one program per token tile and head, the
#   head's two halves side by side), split one accumulator into those halves, and write the
#   prologue of its dX GEMM ($R(-\theta)$ on load);
# - read the measured numbers: the GEMM's main loop against cuBLAS, what the epilogue costs, and
#   what the backward's prologue costs when every column block repeats it;
# - read a compiled kernel's registers, spills and shared memory, and derive from them how many
#   of its programs one SM can hold.
#
# **Time:** about an hour to read (section 7, the measurements, is half of it) and about an
# hour for the three kernel exercises (1, 1b and 2); the cells run in about 10 s on a CPU (Triton's interpreter,
# small shapes).

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit) is imported
import ropelib
device = ropelib.default_device()

# %%
import datetime
import re
from pathlib import Path

import matplotlib.pyplot as plt
import torch.nn.functional as F
import triton
import triton.language as tl

from ropelib.bench import compare
from ropelib.course.counts import programs_per_sm
from ropelib.course.exercises import qkv_epilogue as ex
from ropelib.course.kernels import qkv_teaching
from ropelib.kernels import qkv_gemm

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "ropelib").is_dir())
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ropelib.runtime.figures_dir()   # a scratch folder (ROPELIB_WRITE_FIGURES=1: figures/)
torch.manual_seed(0)
print(ropelib.runtime.mode(), "| device:", device, "| figures go to", FIGURES)

# %% [markdown]
# ## 1. What a separate RoPE pass costs, and what fusing it can save
#
# The attention block starts with one projection of the hidden states $X \in \mathbb{R}^{M
# \times K}$ ($M$ tokens, hidden size $K$) by the fused weight $W \in \mathbb{R}^{N \times K}$,
# $N = (H_Q + 2H_K)\,D$: $Y = X W^{\top}$, split into $H_Q$ query heads and $H_K$ key and
# value heads of $D$ features. Then RoPE rotates q and k. As two kernels:
#
# - the **GEMM** does $2MNK$ floating-point operations and moves
#   $b\,(MK + NK + MN)$ bytes ($b$ bytes per element). At the benchmark's shape (Llama-3-8B's
#   projection) that is thousands of operations per byte moved, far more than the GPU's
#   operations per byte of memory traffic (both printed below, the second as cuBLAS's
#   measured FLOP/s over the copy's bytes/s): the GEMM is **compute-bound**, its time set by
#   the tensor cores;
# - the **RoPE pass** does a few operations per element and moves
#   $$\text{bytes}_{\text{RoPE}} = 2 \cdot M\,(H_Q + H_K)\,D \cdot b$$
#   — it reads q and k and writes them back (with table-free angles, nothing else of note).
#   That is exactly a copy of q and k, so the time a device copy of the same bytes takes from
#   DRAM is the **copy floor**. A well-written RoPE kernel gets close to it; it could come in
#   under it only if part of its bytes need not go to DRAM, as when q and k are small enough to
#   stay in the L2 cache after the GEMM that wrote them. At the shapes measured here they are not
#   (printed below).
#
# The backward has the same shape: the RoPE backward reads $\partial L/\partial q$ and
# $\partial L/\partial k$ and writes the un-rotated gradients (another copy's worth), then the
# two backward GEMMs ($dX = dY\,W$, $dW = dY^{\top} X$) run.
#
# So the most a fusion can save is the RoPE pass itself: in the forward, the unfused pipeline's
# time minus the GEMM's, and the same again in the backward. The next cell reads the
# measurements (`benchmarks/results/qkv_rope-<gpu>.csv`, from `benchmarks/qkv_rope_bench.py`:
# cuBLAS `F.linear` alone, and cuBLAS followed by ropelib's RoPE) and the copy each GPU measured
# in the floor suite (`floor-<gpu>.csv`), and prints, per GPU and token count, the RoPE pass's
# measured cost, its copy floor, the spread of the two timings it is the difference of, and the
# share of the unfused pipeline that a fusion could save at most. The assertions under it hold
# what this section says.

# %%
GPUS = {"nvidia-h100-80gb-hbm3": "H100", "nvidia-h200": "H200"}
QKV = {slug: compare.read_csv(RESULTS / f"qkv_rope-{slug}.csv") for slug in GPUS}
META = {slug: compare.read_meta(RESULTS / f"qkv_rope-{slug}.csv") for slug in GPUS}


def measured(slug, provider, pass_, tokens, qk_norm=False):
    """The one row of qkv_rope-<slug>.csv for this provider, pass and token count."""
    rows = [r for r in QKV[slug] if r["provider"] == provider and r["pass"] == pass_
            and r["tokens"] == tokens and r["qk_norm"] == qk_norm]
    assert len(rows) == 1, (slug, provider, pass_, tokens, qk_norm, len(rows))
    return rows[0]


def copy_gbps(slug):
    """GB/s of the floor suite's device copy of 1 GiB of bf16 (read 1 GiB, write 1 GiB)."""
    path = RESULTS / f"floor-{slug}.csv"
    (row,) = [r for r in compare.read_csv(path)
              if r["case"] == "forward 1 GiB bf16 sbhd" and r["provider"] == "copy"]
    return 2 * 2**30 / (row["ms"] * 1e-3) / 1e9


TOKENS = sorted({r["tokens"] for r in QKV["nvidia-h100-80gb-hbm3"]})
L2_MIB = 50         # the L2 cache of an H100 and of an H200 (the GPUs' specification), in MiB
bound, qk_mib = {}, {}
for slug, gpu in GPUS.items():
    bw = copy_gbps(slug)
    copied_on = compare.read_meta(RESULTS / f"floor-{slug}.csv")["date"]
    print(f"{META[slug]['gpu']}: device copy {bw:,.0f} GB/s (floor-{slug}.csv, {copied_on[:16]}; "
          f"qkv_rope-{slug}.csv ran {META[slug]['date'][:16]})")
    assert copied_on != META[slug]["date"]                   # separate runs (both dates printed)
    for tokens in TOKENS:
        r = measured(slug, "cublas", "fwd", tokens)
        M, HQ, HK, D, K = r["tokens"], r["HQ"], r["HK"], r["D"], r["hidden"]
        b = 2                                                  # bf16
        qk_mib[tokens] = M * (HQ + HK) * D * b / 2**20         # q and k together
        rope_bytes = 2 * M * (HQ + HK) * D * b
        floor_ms = rope_bytes / (bw * 1e9) * 1e3
        for pass_, copies in (("fwd", 1), ("fwd+bwd", 2)):
            cublas = measured(slug, "cublas", pass_, tokens)
            unfused = measured(slug, "unfused", pass_, tokens)
            rope = unfused["ms"] - cublas["ms"]
            spreads = [t["p80"] - t["p20"] for t in (cublas, unfused)]   # p20 to p80 of each
            bound[slug, tokens, pass_] = dict(rope=rope, floor=copies * floor_ms,
                                              share=rope / unfused["ms"], spread=sum(spreads))
            print(f"  {tokens:>6} tokens {pass_:<8} cuBLAS {cublas['ms']:6.3f} ms, + RoPE "
                  f"{unfused['ms']:6.3f} ms (p20-p80 spreads {spreads[0]:.3f} and {spreads[1]:.3f}"
                  f" ms): the RoPE pass{'es' if copies == 2 else ''} {rope:.3f} ms (copy floor "
                  f"of {copies} x {rope_bytes / 1e6:.0f} MB: {copies * floor_ms:.3f} ms), "
                  f"{rope / unfused['ms']:.1%} of the pipeline")
    N = (HQ + 2 * HK) * D
    intensity = 2 * M * N * K / (b * (M * K + N * K + M * N))
    balance = measured(slug, "cublas", "fwd", tokens)["tflops"] * 1e12 / (bw * 1e9)
    print(f"  the GEMM at {M} tokens: {intensity:,.0f} FLOP per byte moved; the GPU: "
          f"{balance:,.0f} (cuBLAS's FLOP/s over the copy's bytes/s)")
    assert intensity > 1000 and intensity > 3 * balance      # compute-bound

print("q and k together: " + ", ".join(f"{qk_mib[t]:.0f} MiB at {t} tokens" for t in TOKENS)
      + f"; the L2 cache: {L2_MIB} MiB")
assert min(qk_mib.values()) > L2_MIB                      # q and k never fit in the L2 here
assert [round(qk_mib[t]) for t in TOKENS] == [80, 320]

# what the prose says: a fusion can save at most a small share of the pipeline (the RoPE pass),
# and forward the pass costs about its copy floor on both GPUs at both token counts
for (slug, tokens, pass_), v in bound.items():
    assert 0 < v["share"] < 0.15, (slug, tokens, pass_, v)
fwd_over_floor = [v["rope"] / v["floor"] for (_, _, pass_), v in bound.items() if pass_ == "fwd"]
assert (round(min(fwd_over_floor), 2), round(max(fwd_over_floor), 2)) == (0.97, 1.26)
# the differences of two medians that came out under their copy floor: each shortfall is smaller
# than the p20-p80 spreads of the two timings together, so the medians cannot resolve it
under = sorted(k for k, v in bound.items() if v["rope"] < v["floor"])
for key in under:
    v = bound[key]
    print(f"under the floor: {GPUS[key[0]]} {key[1]} tokens {key[2]}: {v['rope']:.3f} ms against "
          f"{v['floor']:.3f}, short by {v['floor'] - v['rope']:.4f} ms; the two spreads together "
          f"{v['spread']:.4f} ms")
    assert v["floor"] - v["rope"] < v["spread"], (key, v)
assert under == [("nvidia-h200", 8192, "fwd"), ("nvidia-h200", 8192, "fwd+bwd")]
pipelines = [measured(slug, "unfused", "fwd+bwd", t)["ms"] for slug in GPUS for t in TOKENS]
assert (round(min(pipelines)), round(max(pipelines))) == (2, 8)    # "a pipeline of 2 to 8 ms"
assert max(v["share"] for (_, _, pass_), v in bound.items() if pass_ == "fwd+bwd") < 0.07

# %% [markdown]
# Read the printout as a bound. Forward, the RoPE pass after cuBLAS costs about a copy of q and
# k: from 0.97 to 1.26 times the copy floor, on both GPUs at both token counts. The copy and
# the benchmark are separate runs (both dates printed). Each cost is the
# difference of two medians timed separately, and each timing has a spread of its own (the
# CSV's `p20` and `p80` columns, printed). Two differences came out under the floor, both on
# the H200 at 8192 tokens: forward, and forward+backward. Each shortfall is smaller than the
# p20–p80 spreads of its two timings together (asserted): the two medians cannot tell a RoPE
# pass under the floor from one at it. Nor are these the cases the copy floor leaves
# room for: q and k are 80 MiB at 8192 tokens and 320 MiB at 32768, and do not fit in the
# 50 MiB of an H100's or an H200's L2 cache. In forward+backward the two RoPE passes are under
# 7 % of a pipeline of 2 to 8 ms. Either way the RoPE pass is a small share of the pipeline
# (under 15 % on both GPUs, forward and forward+backward): that share, and no more, is what
# fusing RoPE into the projection can win. It is worth having — it is a whole pass over q and
# k, every layer, every step — but only if the fused GEMM is as fast as cuBLAS.
#
# ## 2. What a GEMM epilogue is
#
# A tiled GEMM gives each program one output tile $Y[m_0{:}m_0{+}B_M,\; n_0{:}n_0{+}B_N]$. It
# loops over $K$ in steps of $B_K$, loads a tile of $X$ and a tile of $W$, and accumulates
# their product in an fp32 accumulator that lives in registers the whole time:
#
# $$\text{acc} \mathrel{+}= X[m_0{:}m_0{+}B_M,\; k{:}k{+}B_K]\;
#   W[n_0{:}n_0{+}B_N,\; k{:}k{+}B_K]^{\top}.$$
#
# After the loop the tile is finished, and before it is stored the program may do anything
# elementwise with it: add the bias, apply an activation, scale, cast. That is the **epilogue**.
# It costs instructions and registers, but no extra memory traffic — the tile is stored once,
# as it would have been anyway. RoPE is elementwise *per pair*: output feature $j$ of a head
# needs the feature $j + D/2$ of the same head and token (rotate-half), and the angles of the
# token's position:
#
# $$q_j = a_j \cos\theta_{p,j} - b_j \sin\theta_{p,j}, \qquad
#   q_{j+D/2} = b_j \cos\theta_{p,j} + a_j \sin\theta_{p,j}, \qquad
#   a_j = y_j,\; b_j = y_{j + D/2}.$$
#
# ## 3. The output tile must cover a head
#
# A GEMM usually tiles $N$ in blocks of 64 or 128 columns with no regard for heads. With
# rotate-half, the partner of column $hD + j$ is column $hD + j + D/2$: a tile narrower than a
# head, or one that straddles two heads, does not hold both members of a pair. Three ways out:
#
# - **one whole head per program** ($B_N = D$), so both members are in the tile. ropelib does
#   this. The head can be held as **one accumulator** $[B_M, D]$ (one MMA per K step, like any
#   GEMM tile), split into its two halves in the epilogue (`tl.reshape`, `tl.permute`,
#   `tl.split`), or as **two accumulators**, `acc_a` from the weight rows $hD + j$ and `acc_b`
#   from the rows $hD + D/2 + j$, $j < D/2$ (two MMAs of width $D/2$, each reading the $X$ tile
#   from shared memory). Either way the two members of every pair end up at the same row and
#   column of two tiles of the same register layout, and the rotation is elementwise between
#   them. The split may move the accumulator between register layouts: whether that costs more
#   than the second read of $X$ is a question for a measurement (below);
# - **permute the weight's rows** once so that pairs are adjacent: then ropelib would own a
#   reordered copy of the caller's `nn.Linear` weight and hand its gradient back in that order.
#
# `benchmarks/qkv_mainloop_probe.py` answered it on an H200 (`qkv_mainloop-nvidia-h200.csv`), on
# a probe kernel with TMA loads (Llama-3-8B's projection, 8192 and 32768 tokens, each head
# rotated from a cos/sin table), at four tiles; at three of them it also timed the same GEMM with
# no epilogue (the bare GEMM). The next cell prints every pair. How much one accumulator saves
# depends on the tile: two accumulators take 4 to 30 % longer in seven of the eight cases (tile
# and token count), 30 % at 128/64 with 8 warps and 3 stages, 8 and 10 % at ropelib's forward
# tile (the same with 4 stages, `GPU_TILES["fwd"]`); only at the 4-warp tile 64/64 with 32768
# tokens do they take less, 5 %. At ropelib's tile one accumulator is never the slower.
# Against the bare GEMM, the one-accumulator rotating kernel ranges from 17 % faster to 5 %
# slower, and at 4 stages the bare GEMM is itself 19 to 23 % slower than at 3: what the tile
# changes on its own is larger than anything the epilogue adds, so the probe measures no cost
# of the epilogue. So ropelib holds the head as one accumulator whenever every feature is
# rotated and $D/2$ is a power of two, and falls back to gathered accumulators (three, with the
# pass-through features) for partial rotary. The header of `ropelib/kernels/qkv_gemm.py`
# (printed below) shows the layouts and quotes the same ranges. A whole head in one program
# also gives QK-norm's RMS statistics (one per token and head) for free.

# %%
probe_csv = RESULTS / "qkv_mainloop-nvidia-h200.csv"
probe = {(r["tokens"], r["variant"]): r["ms"] for r in compare.read_csv(probe_csv) if r.get("ms")}
TILE = ("BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
fwd_tile = tuple(qkv_gemm.GPU_TILES["fwd"][k] for k in TILE)        # ropelib's forward tile
head_d = measured("nvidia-h200", "cublas", "fwd", min(TOKENS))["D"]   # the probe's shape too


def probe_tile(variant):
    """'fused 1 acc table (128, 64, 8, 8, 3)' -> (128, 64, 8, 8, 3)."""
    return tuple(int(v) for v in re.search(r"\((.*)\)", variant)[1].split(","))


probe_tiles = sorted({probe_tile(v) for _, v in probe if v.startswith("fused 1 acc table")})
two_over_one, one_over_bare, bare_ms = {}, {}, {}
print(f"{compare.read_meta(probe_csv)['gpu']} ({probe_csv.name}), rotating from a cos/sin table; "
      f"tile BLOCK_M/BLOCK_K/GROUP_M/warps/stages, BLOCK_N = D = {head_d}")
for tile in probe_tiles:
    bm, bk, group, warps, stages = tile
    for tokens in sorted({t for t, _ in probe}):
        one = probe[tokens, f"fused 1 acc table {tile}"]
        two = probe[tokens, f"fused 2 acc table {tile}"]
        two_over_one[tile, tokens] = two / one - 1
        line = (f"  {'/'.join(map(str, tile)):<13} {tokens:>6} tokens: one accumulator {one:.3f} ms,"
                f" two {two:.3f} ms ({two / one - 1:+.1%})")
        bare = probe.get((tokens, f"descriptors {(bm, head_d, bk, group, warps, stages)}"))
        if bare is not None:                       # the same GEMM with no epilogue
            bare_ms[tile, tokens] = bare
            one_over_bare[tile, tokens] = one / bare - 1
            line += f"; the bare GEMM {bare:.3f} ms (one accumulator {one / bare - 1:+.1%})"
        print(line + ("   <- ropelib's forward tile" if tile == fwd_tile else ""))

# what the prose says: two accumulators are slower in seven of the eight cases, by 4 to 30 %,
# at ropelib's tile by 8 and 10 %; faster (by 5 %) only at 64/64/8/4/4 with 32768 tokens
assert len(two_over_one) == 8 and fwd_tile in probe_tiles
slower = {key: v for key, v in two_over_one.items() if v > 0}
assert set(two_over_one) - set(slower) == {((64, 64, 8, 4, 4), 32768)}
assert (round(min(slower.values()), 2), round(max(slower.values()), 2)) == (0.04, 0.30)
assert max(slower, key=slower.get)[0] == (128, 64, 8, 8, 3)
assert round(two_over_one[(64, 64, 8, 4, 4), 32768], 2) == -0.05
assert [round(two_over_one[fwd_tile, t], 2) for t in (8192, 32768)] == [0.08, 0.10]
# against the bare GEMM: from 17 % faster (at ropelib's 4-stage tile) to 5 % slower; the bare
# GEMM at 4 stages 19 to 23 % slower than at 3
assert len(one_over_bare) == 6
assert [round(f(one_over_bare.values()), 2) for f in (min, max)] == [-0.17, 0.05]
assert min(one_over_bare, key=one_over_bare.get)[0] == fwd_tile
stages_cost = [bare_ms[fwd_tile, t] / bare_ms[(128, 64, 8, 8, 3), t] - 1 for t in (8192, 32768)]
assert (round(min(stages_cost), 2), round(max(stages_cost), 2)) == (0.19, 0.23)
assert max(one_over_bare.values()) < min(stages_cost)    # the tile alone changes more
# the 3-stage tile at 8192 tokens, which the kernel's header also names
assert abs(one_over_bare[(128, 64, 8, 8, 3), 8192]) < 0.002
assert round(two_over_one[(128, 64, 8, 8, 3), 8192], 2) == 0.30
assert "17 % faster to 5 % slower" in " ".join(qkv_gemm.__doc__.split())

# %%
header = qkv_gemm.__doc__
start = header.index("How a tile covers a head")
print(header[start:header.index("How it is parallelised")])

# %% [markdown]
# Two accumulators, or one split in two, are just a different grouping of the same products.
# For one head of a
# tiny projection, `acc_a` is $X$ times the rows $hD + j$ of $W$, and it equals the first half
# of that head's columns of $XW^{\top}$:

# %%
M_, K_, HQ_, HK_, D_ = 6, 16, 2, 1, 8
x_small = torch.randn(M_, K_)
w_small = torch.randn((HQ_ + 2 * HK_) * D_, K_)
h = 1                                                   # the second query head
rows_a = h * D_ + torch.arange(D_ // 2)                 # features j
rows_b = rows_a + D_ // 2                               # features j + D/2
print("weight rows of acc_a:", rows_a.tolist(), "| of acc_b:", rows_b.tolist())
acc_a, acc_b = x_small @ w_small[rows_a].T, x_small @ w_small[rows_b].T
y_head = (x_small @ w_small.T)[:, h * D_:(h + 1) * D_]
assert torch.allclose(torch.cat((acc_a, acc_b), dim=1), y_head, atol=1e-5)
print("cat(acc_a, acc_b) == head", h, "of x @ W^T:", True)

# %% [markdown]
# ## 4. Exercise 1: the epilogue
#
# The kernel below is a complete QKV GEMM except for its epilogue. One program per (tile of
# `BLOCK_M` tokens, head): grid $(\lceil M / B_M \rceil,\; H)$ with $H = H_Q + 2H_K$ heads in
# the weight's order (q's, then k's, then v's). The K loop fills `acc_a` and `acc_b` as above;
# the output `qkv` is $[M, H, D]$.
#
# **Write the epilogue** where it says `# your epilogue`: for a q or k head (`h < N_ROT`,
# $N_{\text{rot}} = H_Q + H_K$), load each token's position from `pos_ptr`, that position's row
# of `cos_ptr` and `sin_ptr` ($[P, D/2]$, one angle per pair), and rotate `acc_a`, `acc_b` with
# the formula of section 2; a v head is stored as it is. Mind the rows past $M$ in the last
# token tile.
#
# The check launches your kernel itself on inputs it draws fresh — token counts that are not a
# multiple of `BLOCK_M`, hidden sizes that are not a multiple of `BLOCK_K`, grouped-query heads,
# $D$ = 32 and 64, positions in random order, angles that differ in every feature — into an
# output it fills with NaN first, with NaN guard bands around it, and compares with a float64
# PyTorch reference. It runs your kernel with ropelib's own kernels barred: a kernel that is, or
# calls, one of ropelib's is refused.

# %%
@triton.jit
def my_qkv_rope_kernel(
    x_ptr,  # *x: input [M, K], contiguous (M tokens, K the hidden size)
    w_ptr,  # *weight: [N, K], contiguous, N = H D: q's heads' rows, then k's, then v's
    out_ptr,  # *qkv: output [M, H, D], contiguous, same dtype as x
    cos_ptr, sin_ptr,  # *fp32: [P, D // 2] each, cos and sin of position p's angles
    pos_ptr,  # *int64: [M], each token's position (its row of cos and sin)
    M, K,  # tokens, hidden size
    H,  # heads of q, k and v together: HQ + 2 HK
    N_ROT,  # HQ + HK: heads h < N_ROT are q's and k's (rotated), the others v's
    D: tl.constexpr,  # head dim (a power of two, D // 2 >= 16)
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16)
    BLOCK_K: tl.constexpr,  # hidden columns per step of the K loop (>= 16)
):
    # grid (cdiv(M, BLOCK_M), H): one program per (tile of tokens, head)
    HALF: tl.constexpr = D // 2
    h = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M] tokens
    m_ok = m < M
    j = tl.arange(0, HALF)                                    # [HALF] pair index
    kk = tl.arange(0, BLOCK_K)
    rows_a = h * D + j               # weight rows of features j and j + D/2 of head h
    acc_a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)       # features j
    acc_b = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)       # features j + D/2
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        x = tl.load(x_ptr + m[:, None] * K + (k0 + kk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)          # [BLOCK_M, BLOCK_K]
        w = w_ptr + rows_a[None, :] * K + (k0 + kk)[:, None]                # W^T [BLOCK_K, HALF]
        w_a = tl.load(w, mask=k_ok[:, None], other=0.0)
        w_b = tl.load(w + HALF * K, mask=k_ok[:, None], other=0.0)
        acc_a = tl.dot(x, w_a, acc_a)
        acc_b = tl.dot(x, w_b, acc_b)
    # --- the epilogue: head h's [BLOCK_M, D] tile is in registers, fp32 ---
    if h < N_ROT:                    # a q or k head: rotate each token by its position's angles
        pass  # your epilogue
    out = out_ptr + (m[:, None] * H + h) * D + j[None, :]
    tl.store(out, acc_a.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])
    tl.store(out + HALF, acc_b.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


epilogue_ok = ex.check_epilogue_kernel(my_qkv_rope_kernel)

# %%
ex.show_epilogue_solution()

# %% [markdown]
# The worked kernel is `ropelib.course.kernels.qkv_teaching` (the solution above). Against
# ropelib's finished `qkv_rope_linear` — the same projection, with the angles of a real RoPE
# table and positions that are not the token index:

# %%
M_, K_, HQ_, HK_, D_ = 40, 64, 4, 2, 32
P_ = 64
freqs_ = ropelib.rope_freqs(P_, D_, device=device).view(P_, D_)      # cat(f, f): [P, D]
cos_, sin_ = freqs_[:, :D_ // 2].cos(), freqs_[:, :D_ // 2].sin()    # one angle per pair
pos_ = torch.randperm(P_, device=device)[:M_]
x_ = torch.randn(M_, K_, device=device, requires_grad=True)
w_ = torch.randn((HQ_ + 2 * HK_) * D_, K_, device=device) / K_ ** 0.5

q_lib, k_lib, v_lib = ropelib.qkv_rope_linear(x_[None], w_, n_heads=HQ_, n_kv_heads=HK_,
                                              head_dim=D_, freqs=freqs_,
                                              position_ids=pos_[None])
q_t, k_t, v_t = qkv_teaching.qkv_rope_teaching(x_.detach(), w_, cos_, sin_, pos_, n_heads=HQ_,
                                               n_kv_heads=HK_, head_dim=D_)
tol = dict(atol=1e-4, rtol=1e-4) if ropelib.runtime.INTERPRET else dict(atol=2e-2, rtol=2e-2)
for name, mine, lib in (("q", q_t, q_lib[0]), ("k", k_t, k_lib[0]), ("v", v_t, v_lib[0])):
    torch.testing.assert_close(mine, lib, **tol)
    print(f"{name} {tuple(mine.shape)}: teaching kernel vs qkv_rope_linear, max |diff| "
          f"{(mine - lib).abs().max().item():.1e}")

# %% [markdown]
# ### Exercise 1b: one accumulator, split in the epilogue
#
# When every feature is rotated and $D/2$ is a power of two, ropelib's forward does not hold a
# head as two accumulators. It holds it as **one**, `acc` $[B_M, D]$, filled by one `tl.dot` a
# K step, as any GEMM tile is: column $d$ of the
# tile is feature $d$ of the head, so feature $j$ and its partner $j + D/2$ are $D/2$ columns
# apart in the same tensor. The rotation needs them side by side. Triton has no "take these
# columns" for a tensor in registers, but it can re-view one:
#
# - `tl.reshape(acc, (BLOCK_M, 2, HALF))` reads the row as two halves, axis 1 saying which;
# - `tl.permute(..., (0, 2, 1))` moves that axis last: $[B_M, D/2, 2]$;
# - `tl.split(...)` splits a last axis of size 2 into two tensors, $a$ and $b$ $[B_M, D/2]$;
# - and `tl.join(ya, yb)` (a new last axis of size 2), the inverse permute and reshape put
#   the rotated head back as $[B_M, D]$.
#
# **Write the split** where it says `# your split`: the kernel below is the same GEMM with one
# accumulator, its cos and sin already loaded for the q and k heads; leave `acc` holding the
# rotated head, which the last line stores. The check is exercise 1's (fresh inputs, NaN
# output inside NaN guard bands, ropelib's kernels barred).

# %%
@triton.jit
def my_qkv_rope_one_acc_kernel(
    x_ptr,  # *x: input [M, K], contiguous (M tokens, K the hidden size)
    w_ptr,  # *weight: [N, K], contiguous, N = H D: q's heads' rows, then k's, then v's
    out_ptr,  # *qkv: output [M, H, D], contiguous, same dtype as x
    cos_ptr, sin_ptr,  # *fp32: [P, D // 2] each, cos and sin of position p's angles
    pos_ptr,  # *int64: [M], each token's position (its row of cos and sin)
    M, K,  # tokens, hidden size
    H,  # heads of q, k and v together: HQ + 2 HK
    N_ROT,  # HQ + HK: heads h < N_ROT are q's and k's (rotated), the others v's
    D: tl.constexpr,  # head dim (a power of two, D // 2 >= 16)
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16)
    BLOCK_K: tl.constexpr,  # hidden columns per step of the K loop (>= 16)
):
    # grid (cdiv(M, BLOCK_M), H): one program per (tile of tokens, head), the head held as ONE
    # accumulator [BLOCK_M, D] (one tl.dot a K step, as ropelib's forward holds it)
    HALF: tl.constexpr = D // 2
    h = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M] tokens
    m_ok = m < M
    d = tl.arange(0, D)                                       # [D] the head's features
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        x = tl.load(x_ptr + m[:, None] * K + (k0 + kk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)          # [BLOCK_M, BLOCK_K]
        w = tl.load(w_ptr + (h * D + d)[None, :] * K + (k0 + kk)[:, None],
                    mask=k_ok[:, None], other=0.0)                          # W^T [BLOCK_K, D]
        acc = tl.dot(x, w, acc)
    # --- the epilogue: split the head into its halves, rotate, put it back together ---
    if h < N_ROT:
        j = tl.arange(0, HALF)
        p = tl.load(pos_ptr + m, mask=m_ok, other=0)
        cs = p[:, None] * HALF + j[None, :]
        c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)
        s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)
        pass  # your split
    tl.store(out_ptr + (m[:, None] * H + h) * D + d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None])


split_ok = ex.check_split_epilogue_kernel(my_qkv_rope_one_acc_kernel)

# %%
ex.show_split_epilogue_solution()

# %% [markdown]
# Both kernels compute the same numbers; what differs is the work the compiled code does, and
# that needs no GPU to see. `load_schedule.schedule` compiles a kernel for an sm_90 GPU (an
# H100 or H200) on this machine, with the Triton you have, and reads what the compiler made of
# it: the matrix multiplies in each step of the K loop, how many tensors it moves from one
# register layout to another (`ttg.convert_layout`, through shared memory or warp shuffles)
# and their bytes, the registers a thread holds, the shared memory a program asks for. Your
# two kernels (or the worked ones, where a check did not pass), at ropelib's forward
# `BLOCK_M`, `BLOCK_K`, warps and pipeline stages for Llama-3-8B's projection:

# %%
from ropelib.course import load_schedule

two_acc_kernel = my_qkv_rope_kernel if epilogue_ok else qkv_teaching._qkv_rope_teaching_kernel
one_acc_kernel = (my_qkv_rope_one_acc_kernel if split_ok
                  else qkv_teaching._qkv_rope_one_acc_teaching_kernel)
fwd_tiles = qkv_gemm.GPU_TILES["fwd"]
bf16_, f32_, i64_ = (torch.empty(16, dtype=t) for t in (torch.bfloat16, torch.float32, torch.int64))
tile_args = dict(x_ptr=bf16_, w_ptr=bf16_, out_ptr=bf16_, cos_ptr=f32_, sin_ptr=f32_,
                 pos_ptr=i64_, M=8192, K=4096, H=48, N_ROT=40, D=128,
                 BLOCK_M=fwd_tiles["BLOCK_M"], BLOCK_K=fwd_tiles["BLOCK_K"])
built = {label: load_schedule.schedule(kern, tile_args, num_warps=fwd_tiles["num_warps"],
                                       num_stages=fwd_tiles["num_stages"])
         for label, kern in (("two accumulators", two_acc_kernel),
                             ("one accumulator, split", one_acc_kernel))}
print(f"sm_90, Triton {triton.__version__}, BLOCK_M={tile_args['BLOCK_M']} "
      f"BLOCK_K={tile_args['BLOCK_K']} D=128, {fwd_tiles['num_warps']} warps, "
      f"{fwd_tiles['num_stages']} stages")
print(f"{'':24s}{'MMAs a K step':>14s}{'conversions':>12s}{'converted':>11s}{'registers':>10s}"
      f"{'shared':>9s}")
for label, b in built.items():
    print(f"{label:24s}{b['dots']:>14d}{b['layout_conversions']:>12d}"
          f"{b['converted_bytes'] / 1024:>8.0f} KiB{b['registers']:>10d}"
          f"{b['shared'] / 1024:>6.0f} KiB")
two, one = built.values()
x_reread = tile_args["BLOCK_M"] * tile_args["K"] * 2      # the X tile again, every K step (bf16)
print(f"the second MMA reads each step's X tile from shared memory again: "
      f"{tile_args['BLOCK_M']} x {tile_args['K']} x 2 bytes = {x_reread / 1024:.0f} KiB a program; "
      f"the split moves {(one['converted_bytes'] - two['converted_bytes']) / 1024:.0f} KiB more "
      f"between layouts, once")
assert two["dots"] == 2 and one["dots"] == 1
assert one["layout_conversions"] >= 1 and one["converted_bytes"] > two["converted_bytes"]
assert one["converted_bytes"] - two["converted_bytes"] < x_reread / 4

# %% [markdown]
# The two builds trade one cost for another. Two accumulators issue two MMAs of width $D/2$ a
# K step, and each reads the step's $X$ tile from shared memory, so $X$ is read twice: over
# $K = 4096$ that is a megabyte a program more (derived from the tile's sizes, not counted by a
# profiler). One accumulator issues one MMA of width $D$; its epilogue pays for the split
# instead: the compiler moves the accumulator's halves and the joined result between register
# layouts, once per program, 64 KiB more than the two-accumulator kernel converts (it converts
# cos and sin to the accumulators' layout, and both kernels convert their output for the
# store). Once per program against once per K step fits section 3's measurement, where one
# accumulator was never the slower at ropelib's tile; the counts alone cannot say it is the
# whole cause (section 3 also has a tile where two accumulators were 5 % faster).

# %% [markdown]
# ## 5. The backward's prologue: undo the rotation while loading $dY$
#
# Write the forward per q or k head and token as $q = R(\theta)\,u$, $u$ the head's slice of
# $Y = XW^{\top}$. A rotation's transpose is its inverse, so the gradient that flows back into
# the projection is
#
# $$\frac{\partial L}{\partial u} = R(\theta)^{\top} \frac{\partial L}{\partial q}
#   = R(-\theta)\, g: \qquad
#   dY_{a} = g_a \cos\theta + g_b \sin\theta, \quad
#   dY_{b} = g_b \cos\theta - g_a \sin\theta,$$
#
# with $v$'s gradient passing through. The backward GEMMs then need $dY$:
# $dX = dY\,W$ and $dW = dY^{\top} X$. The unfused pipeline runs the RoPE backward as a pass
# (reads $g$, writes $dY$: a copy's worth again) and the GEMMs read $dY$. Fused, each backward
# GEMM forms the $dY$ tile it needs **as it loads it** — the prologue — and $dY$ is never
# written.
#
# The price is in *how often* it is formed. A dX program owns $B_M$ tokens and $B_K$ hidden
# columns and loops over every head; the $dY$ tile of a (token tile, head) is needed by all
# $K / B_K$ column blocks, so every one of them loads $g$, its cosines and sines, and rotates
# it. dW does the same across its column blocks. Written once, $dY$ would be formed once; fused,
# $K / B_K$ times (32 times for $K = 4096$, $B_K = 128$). Section 7 shows what that costs.
#
# ## 6. Exercise 2: the prologue of the dX GEMM
#
# The kernel below is the dX GEMM: one program per ($B_M$ tokens, $B_K$ hidden columns), grid
# $(\lceil M/B_M \rceil, \lceil K/B_K \rceil)$, looping over the $H$ heads, each head's
# gradient tile loaded as two halves `g_a`, `g_b` and multiplied into the weight's rows of that
# head. **Write** (1) the loads of this program's tokens' cosines and sines, once per program —
# every head of a token has the same angles — and (2) the prologue: for a q or k head,
# `g_a, g_b` become $dY_a, dY_b$ before they meet the weight. The check compares with autograd
# through the float64 reference (which never uses the inverse-rotation formula).

# %%
@triton.jit
def my_qkv_dx_kernel(
    g_ptr,  # *dL/dqkv: [M, H, D], contiguous: gradients of the rotated q and k, and of v
    w_ptr,  # *weight: [N, K], contiguous, N = H D (as in the forward)
    gx_ptr,  # *dL/dx: output [M, K], contiguous, same dtype as the weight
    cos_ptr, sin_ptr,  # *fp32: [P, D // 2] each, cos and sin of position p's angles
    pos_ptr,  # *int64: [M], each token's position
    M, K,  # tokens, hidden size
    H,  # heads of q, k and v together: HQ + 2 HK
    N_ROT,  # HQ + HK: heads h < N_ROT are q's and k's (rotated in the forward)
    D: tl.constexpr,  # head dim (a power of two, D // 2 >= 16)
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16)
    BLOCK_K: tl.constexpr,  # hidden columns per program (>= 16)
):
    # grid (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K)): dX tile = sum over heads h of dY_h @ W_h
    HALF: tl.constexpr = D // 2
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M] tokens
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)  # [BLOCK_K] hidden columns
    m_ok = m < M
    k_ok = kk < K
    j = tl.arange(0, HALF)
    # your code: this program's tokens' cos and sin [BLOCK_M, HALF], once for every head
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for h in range(0, H):
        g = g_ptr + (m[:, None] * H + h) * D + j[None, :]
        g_a = tl.load(g, mask=m_ok[:, None], other=0.0).to(tl.float32)          # [BLOCK_M, HALF]
        g_b = tl.load(g + HALF, mask=m_ok[:, None], other=0.0).to(tl.float32)
        # --- the prologue: dY = R(-theta) g for a q or k head, formed in registers ---
        if h < N_ROT:
            pass  # your prologue
        w = w_ptr + (h * D + j)[:, None] * K + kk[None, :]                     # W_h [HALF, BLOCK_K]
        w_a = tl.load(w, mask=k_ok[None, :], other=0.0)
        w_b = tl.load(w + HALF * K, mask=k_ok[None, :], other=0.0)
        acc = tl.dot(g_a.to(w_a.dtype), w_a, acc)
        acc = tl.dot(g_b.to(w_b.dtype), w_b, acc)
    tl.store(gx_ptr + m[:, None] * K + kk[None, :], acc.to(gx_ptr.dtype.element_ty),
             mask=m_ok[:, None] & k_ok[None, :])


prologue_ok = ex.check_prologue_kernel(my_qkv_dx_kernel)

# %%
ex.show_prologue_solution()

# %% [markdown]
# The worked dX kernel against the gradient autograd computes through `qkv_rope_linear`
# (whose backward runs ropelib's dX and dW kernels, each with this prologue):

# %%
g_ = torch.randn(M_, HQ_ + 2 * HK_, D_, device=device)
(gx_lib,) = torch.autograd.grad((q_lib, k_lib, v_lib), x_,
                                tuple(t[None] for t in g_.split((HQ_, HK_, HK_), dim=1)))
gx_t = qkv_teaching.qkv_dx_teaching(g_, w_, cos_, sin_, pos_, n_heads=HQ_, n_kv_heads=HK_,
                                    head_dim=D_)
torch.testing.assert_close(gx_t, gx_lib, **tol)
print(f"dL/dx {tuple(gx_t.shape)}: teaching dX kernel vs autograd of qkv_rope_linear, max |diff| "
      f"{(gx_t - gx_lib).abs().max().item():.1e}")

# %% [markdown]
# ## 7. The measured result
#
# `benchmarks/qkv_rope_bench.py` times four ways to compute rotated q, k and v for
# Llama-3-8B's projection (bf16, one sequence), forward and forward+backward: cuBLAS `F.linear`
# alone (no rotation: the target), cuBLAS then ropelib's RoPE (**unfused**), ropelib's Triton
# GEMM *without* its epilogue and prologues (the same kernels with `ROTATE=False`: what the
# main loop costs on its own), and the **fused** `qkv_rope_linear`. The figure puts each
# provider's time over cuBLAS's, one row per GPU, and the title of each panel names the CSV it
# reads, the date in its header and the kernels it measured. The two rows are not of the same
# kernels. The H100's (`qkv_rope-nvidia-h100-80gb-hbm3.csv`, 2026-11-25) measured an earlier
# forward kernel, a dX tile of 128/128 with 8 warps where ropelib's `GPU_TILES` has 64/64 with
# 4, and dW at 32 rows by 128 columns on 4 warps, the tile the sweeps chose, where ropelib's dW
# has since taken 64 rows by 256 columns on 8 warps (a cell further down reads the measurement
# that chose it). The H200's (`qkv_rope-nvidia-h200.csv`, 2026-11-30) measured ropelib's
# forward kernel and all of its tiles: dX at 64/64, dW at 64/256, and with QK-norm dX at a tile
# of its own (`GPU_TILES["dx_norm"]`, 32/128 on 4 warps). The table under the figure prints the
# milliseconds. The ratios separate three effects:
#
# - **Triton GEMM / cuBLAS**: the main loop alone. Until it reaches cuBLAS, the fused forward
#   cannot beat the unfused pipeline, whatever the epilogue costs: the main loop's excess over
#   cuBLAS is larger than the whole RoPE pass that section 1 bounds the gain by (asserted);
# - **fused / Triton GEMM, forward**: the epilogue — loading each token's cos and sin (rows a
#   small pre-pass writes, the same pre-pass as `apply_rope`'s two-pass route), the rotation,
#   and the registers they need. Only the H200's benchmark ran this forward; the H100's
#   benchmark and both tile sweeps (`qkv_tiles-<gpu>.csv`, 2026-11-25) ran an earlier one, with
#   two accumulators a head and sin and cos evaluated in its epilogue (the dates are printed
#   under the table). At the benchmark's forward tile the sweeps' rotating kernel held 254
#   registers a thread, nearly all of the 255 a thread may have; compiled for sm_90, ropelib's
#   forward kernel holds 226 (both bare: 114);
# - **fused / Triton GEMM, forward+backward**: mostly the backward's prologue, re-formed by every
#   column block (section 5). Runs of the dX and dW kernels alone time them with and without it
#   at the tiles the benchmark ran: for the H100 its tile sweep (`qkv_tiles-<gpu>.csv`); for the
#   H200, whose benchmark ran a dW tile the sweep did not have and ropelib's dX, which reads the
#   pre-pass's cos and sin rows (the sweep timed an earlier dX), a run of ropelib's dX and dW at
#   those tiles on 2026-11-29, the day before its benchmark
#   (`qkv_tiles_chosen-nvidia-h200-20261129-1914.csv`). The same two kernels, timed alone again
#   on the H200 just before the benchmark (`qkv-backward-nvidia-h200-20261130-1414.log`), took
#   the same times to within about 1 %, with the same registers and spills.
#
# The assertions under the table hold each of these statements for both GPUs and both token
# counts: the bare Triton GEMM is slower than cuBLAS, the epilogue adds time, the fused pipeline
# is slower than the unfused one forward and more than twice as slow forward+backward, the
# rotating kernels need far more registers (dX and dW near the limit of 255, ropelib's forward
# kernel at 226, as compiled for sm_90), dW takes more than twice as long with its prologue,
# and, at 8192 tokens (where the kernels were timed alone), the prologues' extra time in dX and
# dW is over half of the gap between the fused and the unfused forward+backward (81 % on the
# H100; 62 % on the H200, from the kernel timings of the day before its benchmark, which the
# run just before it repeats) and most of what the fused pipeline adds to the bare GEMMs. Last,
# for the H200, the cell sets ropelib's fused forward against its own bare GEMM and against the
# probe's rotating kernel of section 3 at the same tile (part 2 of "Why it is slower" reads it).

# %%
PROVIDERS = (("cublas", "cuBLAS alone"), ("unfused", "cuBLAS + RoPE (unfused)"),
             ("triton_gemm", "Triton GEMM, no epilogue"), ("fused", "fused qkv_rope_linear"))
COLORS = dict(cublas="tab:gray", unfused="tab:blue", triton_gemm="tab:orange", fused="tab:red")


def tile_key(tiles_column, kernel):
    """'fwd:128/64/8/8/4 dx:...' -> (BLOCK_M, BLOCK_K, GROUP_M, num_warps, num_stages) of kernel."""
    found = dict(part.split(":") for part in tiles_column.split())
    return tuple(int(v) for v in found[kernel].split("/"))


SWEPT_ON = {slug: compare.read_meta(RESULTS / f"qkv_tiles-{slug}.csv")["date"] for slug in GPUS}


def tiles_ran(slug):
    """{kernel: tile} of the tiles column of qkv_rope-<slug>.csv (the same in every row)."""
    (column,) = {r["tiles"] for r in QKV[slug]}
    return {kernel: tile_key(column, kernel) for kernel in dict(part.split(":") for part in column.split())}


def kernels_measured(slug):
    """Which forward and tiles qkv_rope-<slug>.csv measured: a benchmark no later than the tile
    sweeps ran their (earlier) forward; its tiles against ropelib's GPU_TILES."""
    forward = ("an earlier forward" if META[slug]["date"] <= max(SWEPT_ON.values())
               else "ropelib's forward")
    names = dict(fwd="forward", dx="dX", dw="dW", dx_norm="dX with QK-norm")
    other = [f"{names[kernel]} tile {'/'.join(map(str, tile))}"
             for kernel, tile in tiles_ran(slug).items()
             if tile != tuple(qkv_gemm.GPU_TILES[kernel][k] for k in TILE)]
    return forward + (", an earlier " + ", ".join(other) if other else " and tiles")


KERNELS = {slug: kernels_measured(slug) for slug in GPUS}
for slug in GPUS:
    print(f"{META[slug]['gpu']}: qkv_rope-{slug}.csv ({META[slug]['date'][:10]}): {KERNELS[slug]}")
# what the prose says: the two rows are of different kernels; the H200's ran every tile of
# GPU_TILES, with QK-norm dX's own; the H100's had no tile of its own for dX with QK-norm
assert KERNELS == {"nvidia-h100-80gb-hbm3": "an earlier forward, an earlier dX tile 128/128/8/8/3, "
                                            "dW tile 32/128/8/4/4",
                   "nvidia-h200": "ropelib's forward and tiles"}
assert set(tiles_ran("nvidia-h200")) == set(qkv_gemm.GPU_TILES) == {"fwd", "dx", "dw", "dx_norm"}
assert set(tiles_ran("nvidia-h100-80gb-hbm3")) == {"fwd", "dx", "dw"}
assert [tuple(qkv_gemm.GPU_TILES[kernel][k] for k in TILE) for kernel in ("dx", "dw", "dx_norm")] \
    == [(64, 64, 8, 4, 3), (64, 256, 8, 8, 2), (32, 128, 8, 4, 3)]
assert {slug: m["date"][:10] for slug, m in META.items()} == {
    "nvidia-h100-80gb-hbm3": "2026-11-25", "nvidia-h200": "2026-11-30"}
assert {d[:10] for d in SWEPT_ON.values()} == {"2026-11-25"}


def draw_measured(path):
    fig, axes = plt.subplots(len(GPUS), 2, figsize=(11, 3.6 * len(GPUS)), sharey=True)
    for row, slug in enumerate(GPUS):
        for col, pass_ in enumerate(("fwd", "fwd+bwd")):
            ax = axes[row][col]
            width = 0.8 / len(PROVIDERS)
            for i, (prov, label) in enumerate(PROVIDERS):
                ratios = [measured(slug, prov, pass_, t)["ms"] / measured(slug, "cublas", pass_, t)["ms"]
                          for t in TOKENS]
                xs = [k + (i - (len(PROVIDERS) - 1) / 2) * width for k in range(len(TOKENS))]
                bars = ax.bar(xs, ratios, width, color=COLORS[prov], label=label)
                for bar, t in zip(bars, TOKENS):
                    ax.annotate(f"{measured(slug, prov, pass_, t)['ms']:.2f}",
                                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
            ax.axhline(1.0, color="k", lw=0.6)
            ax.set_xticks(range(len(TOKENS)), [f"{t} tokens" for t in TOKENS])
            ax.set_title(f"{META[slug]['gpu']}: {'forward' if pass_ == 'fwd' else 'forward + backward'}"
                         f"\nqkv_rope-{slug}.csv ({META[slug]['date'][:10]}):\n{KERNELS[slug]}",
                         fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        axes[row][0].set_ylabel("time / cuBLAS alone (labels: ms)")
    axes[0][0].legend(fontsize=8, loc="upper left")
    r = measured(slug, "fused", "fwd", TOKENS[0])
    fig.suptitle(f"RoPE in the QKV projection: hidden {r['hidden']}, {r['HQ']}/{r['HK']} heads "
                 f"of {r['D']}, {r['dtype']}, no QK-norm (the two GPUs' rows measured different "
                 f"kernels)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.show()


draw_measured(FIGURES / "12-qkv-projection-measured.png")

# %% [markdown]
# ![Time over cuBLAS's per provider, forward and forward+backward, on an H100 (an earlier forward and dX tile) and an H200 (ropelib's forward and tiles)](../figures/12-qkv-projection-measured.png)

# %%
# where each kernel of a benchmark was timed alone, bare and rotating, at the benchmark's tile:
# the GPU's tile sweep, and for the H200's dX and dW (a dW tile the sweep did not have, and a dX
# that reads cos and sin rows) a run of ropelib's dX and dW at those tiles
CHOSEN = RESULTS / "qkv_tiles_chosen-nvidia-h200-20261129-1914.csv"
TILE_RUNS = {slug: dict(fwd=RESULTS / f"qkv_tiles-{slug}.csv", dx=RESULTS / f"qkv_tiles-{slug}.csv",
                        dw=RESULTS / f"qkv_tiles-{slug}.csv") for slug in GPUS}
TILE_RUNS["nvidia-h200"].update(dx=CHOSEN, dw=CHOSEN)


def tile_rows(slug, kernel, key):
    """{rotate: row} of the run in TILE_RUNS that timed this kernel of slug's at its tile."""
    rows = [r for r in compare.read_csv(TILE_RUNS[slug][kernel])
            if r["kernel"] == kernel and (r["BLOCK_M"], r["BLOCK_K"], r["GROUP_M"],
                                           r["num_warps"], r["num_stages"]) == key]
    return {r["rotate"]: r for r in rows}


# ropelib's forward kernel, compiled for sm_90 on a CPU (the next subsection reads the whole table)
SM90_ROWS = compare.read_csv(ROOT / "figures" / "12-qkv-tiles-sm90.csv")
# the H200's benchmark ran after both tile sweeps and after the H100's benchmark: it alone ran
# ropelib's forward kernel (cos and sin read from rows); the others ran the earlier one
assert META["nvidia-h200"]["date"] > max(max(SWEPT_ON.values()), META["nvidia-h100-80gb-hbm3"]["date"])
prologue_share = {}     # slug -> the prologues' extra time over (fused - unfused, fused - bare)
for slug in GPUS:
    tiles = measured(slug, "fused", "fwd", max(TOKENS))["tiles"]
    print(f"{META[slug]['gpu']} ({META[slug]['date']}, torch {META[slug]['torch']}, "
          f"triton {META[slug]['triton']}; tiles {tiles}; its tile sweep ran {SWEPT_ON[slug]})")
    for tokens in TOKENS:
        ms = {(p, s): measured(slug, p, s, tokens)["ms"] for p, _ in PROVIDERS
              for s in ("fwd", "fwd+bwd")}
        for s in ("fwd", "fwd+bwd"):
            print(f"  {tokens:>6} {s:<8} " + "  ".join(f"{p} {ms[p, s]:6.3f}" for p, _ in PROVIDERS)
                  + f" ms | Triton GEMM / cuBLAS {ms['triton_gemm', s] / ms['cublas', s]:.2f}, "
                  f"fused / Triton GEMM {ms['fused', s] / ms['triton_gemm', s]:.2f}, "
                  f"fused / unfused {ms['fused', s] / ms['unfused', s]:.2f}")
            assert ms["triton_gemm", s] > ms["cublas", s]          # the main loop trails cuBLAS
            assert ms["triton_gemm", s] - ms["cublas", s] > ms["unfused", s] - ms["cublas", s]
            assert ms["fused", s] > ms["triton_gemm", s]           # the epilogue/prologue cost
            assert ms["fused", s] > ms["unfused", s]               # fused is slower
        assert ms["fused", "fwd+bwd"] > 2 * ms["unfused", "fwd+bwd"]   # several times, with bwd
    for kernel in ("fwd", "dx", "dw"):
        key = tile_key(tiles, kernel)
        t = tile_rows(slug, kernel, key)
        run = compare.read_meta(TILE_RUNS[slug][kernel])
        print(f"  {kernel} alone at {'/'.join(map(str, key))}: {t[False]['ms']:.2f} ms bare, "
              f"{t[True]['ms']:.2f} ms rotating ({t[True]['ms'] / t[False]['ms']:.2f}x); registers "
              f"per thread {t[False]['n_regs']} -> {t[True]['n_regs']} "
              f"({TILE_RUNS[slug][kernel].name}, {run['date'][:10]})")
        assert t[True]["ms"] > t[False]["ms"]
        assert t[True]["n_regs"] >= 250 > 200 > t[False]["n_regs"]     # near the 255 limit
        if kernel == "fwd":                       # the sweep's forward against ropelib's
            now = {r["rotate"]: r["n_regs"] for r in SM90_ROWS if r["kernel"] == "fwd"
                   and tuple(r[k] for k in ("BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps",
                                            "num_stages")) == key}
            print(f"    ropelib's forward compiled for sm_90 at this tile: registers per thread "
                  f"{now[False]} -> {now[True]}")
            assert (t[False]["n_regs"], t[True]["n_regs"]) == (114, 254)
            assert (now[False], now[True]) == (114, 226)
    dw = tile_rows(slug, "dw", tile_key(tiles, "dw"))
    dx = tile_rows(slug, "dx", tile_key(tiles, "dx"))
    assert dw[True]["ms"] > 2 * dw[False]["ms"]                         # the re-formed dY
    runs = {compare.read_meta(TILE_RUNS[slug][k])["case"] for k in ("dx", "dw")}
    (swept,) = {int(re.match(r"t(\d+)", case)[1]) for case in runs}
    prologues = (dw[True]["ms"] - dw[False]["ms"]) + (dx[True]["ms"] - dx[False]["ms"])
    gap = measured(slug, "fused", "fwd+bwd", swept)["ms"] - measured(slug, "unfused", "fwd+bwd", swept)["ms"]
    bare_gap = (measured(slug, "fused", "fwd+bwd", swept)["ms"]
                - measured(slug, "triton_gemm", "fwd+bwd", swept)["ms"])
    prologue_share[slug] = (prologues / gap, prologues / bare_gap)
    print(f"  at {swept} tokens the prologues add {prologues:.2f} ms to dX and dW; the fused "
          f"forward+backward trails the unfused one by {gap:.2f} ms ({prologues / gap:.0%}) and "
          f"its bare GEMMs by {bare_gap:.2f} ms ({prologues / bare_gap:.0%})")
# what the prose says: the prologues are over half of the gap to the unfused pipeline (81 % and
# 62 %) and most of what the fused pipeline adds to the bare GEMMs; the H200's kernel timings
# ran the day before its benchmark
assert {GPUS[slug]: round(v[0], 2) for slug, v in prologue_share.items()} == {"H100": 0.81, "H200": 0.62}
assert all(0.5 < gap_share < bare_share for gap_share, bare_share in prologue_share.values())
assert compare.read_meta(CHOSEN)["date"][:10] == "2026-11-29"
day = {f: datetime.date.fromisoformat(compare.read_meta(f)["date"][:10])
       for f in (CHOSEN, RESULTS / "qkv_rope-nvidia-h200.csv")}
assert (day[RESULTS / "qkv_rope-nvidia-h200.csv"] - day[CHOSEN]).days == 1     # "the day before"
assert compare.read_meta(CHOSEN)["gpu"] == META["nvidia-h200"]["gpu"]
# the same dX and dW timed alone again on the H200 just before the benchmark (the log's name
# gives its minute): the same times as CHOSEN to within about 1 %, the same registers and spills
AGAIN = RESULTS / "qkv-backward-nvidia-h200-20261130-1414.log"
again_at = datetime.datetime.strptime(AGAIN.stem[-13:], "%Y%m%d-%H%M")
bench_at = datetime.datetime.fromisoformat(META["nvidia-h200"]["date"].rstrip("Z"))
assert AGAIN.read_text().startswith(f"GPU ({META['nvidia-h200']['gpu']})")
assert datetime.timedelta(0) < bench_at - again_at < datetime.timedelta(minutes=5)
again = {}
for line in AGAIN.read_text().splitlines():
    hit = re.match(r"(dx|dw)\s+\(([\d, ]+)\) rotate=(True|False)\s+([\d.]+) ms"
                   r".* regs (\d+) spills (\d+)$", line)
    if hit:
        kernel, tile, rot = hit[1], tuple(int(v) for v in hit[2].split(",")), hit[3] == "True"
        again[kernel, tile, rot] = (float(hit[4]), int(hit[5]), int(hit[6]))
apart = []
for kernel in ("dx", "dw"):
    tile = tile_key(measured("nvidia-h200", "fused", "fwd", max(TOKENS))["tiles"], kernel)
    for rot, r in tile_rows("nvidia-h200", kernel, tile).items():
        ms, regs, spills = again[kernel, tile, rot]
        print(f"  {kernel} {'/'.join(map(str, tile))} {'rotating' if rot else 'bare'}: "
              f"{r['ms']:.3f} ms ({CHOSEN.name}), {ms:.3f} ms ({AGAIN.name}); registers "
              f"{r['n_regs']} and {regs}, spilled words {r['n_spills']} and {spills}")
        assert (regs, spills) == (r["n_regs"], r["n_spills"])
        apart.append(abs(ms / r["ms"] - 1))
assert len(apart) == 4 and round(max(apart), 2) <= 0.01            # "to within about 1 %"

# the H200: ropelib's fused forward against its own bare GEMM (qkv_rope-nvidia-h200.csv), and the
# probe's one-accumulator rotating kernel of section 3 at ropelib's forward tile
# (qkv_mainloop-nvidia-h200.csv: a separate run, with its own cuBLAS timing)
epilogue, probe_vs_bare, cublas_runs = {}, {}, {}
for tokens in TOKENS:
    fused_ms, bare_ms_h200 = (measured("nvidia-h200", p, "fwd", tokens)["ms"]
                              for p in ("fused", "triton_gemm"))
    rotating = probe[tokens, f"fused 1 acc table {fwd_tile}"]
    cublas_runs[tokens] = (measured("nvidia-h200", "cublas", "fwd", tokens)["ms"],
                           probe[tokens, "cublas"])
    epilogue[tokens] = fused_ms / bare_ms_h200 - 1
    probe_vs_bare[tokens] = rotating / bare_ms_h200 - 1
    print(f"H200 {tokens:>6} tokens, forward tile {'/'.join(map(str, fwd_tile))}: ropelib's fused "
          f"{fused_ms:.3f} ms, its bare GEMM {bare_ms_h200:.3f} ms (fused {epilogue[tokens]:+.1%}); "
          f"the probe's rotating kernel {rotating:.3f} ms ({probe_vs_bare[tokens]:+.1%} against "
          f"ropelib's bare GEMM); cuBLAS {cublas_runs[tokens][0]:.3f} ms in the qkv_rope file, "
          f"{cublas_runs[tokens][1]:.3f} in the qkv_mainloop one")
# what part 2 of "Why it is slower" says: ropelib's epilogue costs 17 % and 8 %; the probe's
# rotating kernel is within 2 % of ropelib's bare GEMM at 8192 tokens, less than the 4 % by
# which the two files' cuBLAS timings differ there, and 7 % faster at 32768 (cuBLAS: 3 %)
assert [round(epilogue[t], 2) for t in TOKENS] == [0.17, 0.08]
assert [round(measured("nvidia-h200", p, "fwd", 8192)["ms"], 3) for p in ("fused", "triton_gemm")] \
    == [0.780, 0.669] and round(probe[8192, f"fused 1 acc table {fwd_tile}"], 3) == 0.680
assert round(probe_vs_bare[8192], 2) == 0.02 and round(probe_vs_bare[32768], 2) == -0.07
assert [round(a / b - 1, 2) for a, b in cublas_runs.values()] == [0.04, 0.03]
assert abs(probe_vs_bare[8192]) < cublas_runs[8192][0] / cublas_runs[8192][1] - 1

# %% [markdown]
# ### Registers, spills and how many programs an SM holds
#
# Registers per thread say how full each thread is. What that costs depends on
# two more numbers. Does the kernel **spill**? Values that no longer fit in registers go to
# *local memory*, a per-thread stack behind the caches, with a store and a load for every
# round trip. And how many **programs fit on one SM** at once? An SM hides one program's waits
# on memory by running another program's warps meanwhile, so fewer resident programs leave it
# less to switch to.
#
# `figures/12-qkv-tiles-sm90.csv` answers both for every tile of the sweep and every tile
# ropelib ships for this problem (its `swept` and `shipped` columns: the sweep had neither dW's
# 64/256 on 8 warps nor dX's tile with QK-norm, 32/128 on 4 warps, the `dx_norm` rows), bare
# and rotating.
# The kernels were compiled for sm_90 (H100, H200) on a CPU, with the Triton version of the GPU
# runs, by `python -m ropelib.course.counts --out figures/12-qkv-tiles-sm90.csv`, from ropelib's
# kernels (the CSV's header names the version of ropelib it compiled). dW and the bare dX there
# are the kernels the GPU sweeps ran; the rotating dX is not. ropelib's dX has since moved to
# the forward's way of getting cos and sin: it reads the pre-pass's rows, once per program,
# where it evaluated them (dW still evaluates them). ropelib's forward differs from the one the
# sweeps ran in two ways — a head in one
# accumulator (section 3), and cos and sin read from a pre-pass's rows — and the tile sweeps in
# `qkv_tiles-<gpu>.csv` were measured with that earlier forward (their headers' dates, printed
# under section 7's table). Triton's
# compiler and ptxas run without a GPU; the registers and the stack per thread are read from
# the cubin, and the shared memory per program from Triton's metadata. From these,
# `programs_per_sm` **derives** how many programs one SM can hold. An sm_90 SM has 65,536
# registers in four sub-partitions of 16,384, handed to each warp in units of 256 (255
# registers per thread take 8,192 per warp, so two such warps fit in a sub-partition). It has
# 228 KiB of shared memory (1 KiB of it reserved per program), 2,048 threads and
# room for 32 programs. The tightest of the four limits decides. This is an upper bound
# worked out from the resources, not the achieved occupancy a profiler (Nsight Compute)
# measures while the kernel runs.

# %%
SM90_CSV = ROOT / "figures" / "12-qkv-tiles-sm90.csv"
TILE = ("BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def by_tile(rows):
    """{(kernel, tile, rotate): row}: tile = (BLOCK_M, BLOCK_K, GROUP_M, warps, stages)."""
    return {(r["kernel"], tuple(r[k] for k in TILE), r["rotate"]): r for r in rows}


sm90 = compare.read_meta(SM90_CSV)
table = by_tile(compare.read_csv(SM90_CSV))      # the sweep's tiles and the tiles ropelib ships
compiled = {key: r for key, r in table.items() if r["swept"]}       # the sweep's
swept = {slug: by_tile(compare.read_csv(RESULTS / f"qkv_tiles-{slug}.csv")) for slug in GPUS}
ran_on = {slug: compare.read_meta(RESULTS / f"qkv_tiles-{slug}.csv")["triton"] for slug in GPUS}
print(f"{SM90_CSV.name}: Triton {sm90['triton']} for sm_90 on a CPU ({sm90['date'][:10]}, "
      f"{sm90['kernels']}); the GPU sweeps ran Triton {', '.join(sorted(set(ran_on.values())))}")
assert set(ran_on.values()) == {sm90["triton"]} and "sm_90" in sm90["target"]
# the tiles ropelib ships for bf16 heads of 128, read from its tile table ("dx_norm": dX with
# QK-norm): the table has each of them, and no other tile the sweep lacks
shipped = {(kernel, tuple(t[k] for k in TILE)) for kernel, t in qkv_gemm.GPU_TILES.items()}
assert {key[:2] for key, r in table.items() if r["shipped"]} == shipped
assert {key[:2] for key in table} == {key[:2] for key in compiled} | shipped

benchmark = {}      # (kernel, tile) -> the GPUs whose benchmark ran it
for slug in GPUS:
    for kernel, tile in tiles_ran(slug).items():
        benchmark.setdefault((kernel, tile), []).append(GPUS[slug])


def resources(r):
    limits = r["limited_by"].replace("+", ", ")
    return (f"{r['n_regs']:>3} {r['stack']:>5} B {r['shared'] // 1024:>4} KiB "
            f"{r['programs_per_sm']:>2} ({limits})")


def reported(r):
    """(registers, stack bytes per thread) a GPU sweep reported for a tile, None where it
    refused the tile (Triton's n_spills: 4-byte words of local memory, so stack / 4)."""
    return None if r["n_regs"] is None else (r["n_regs"], 4 * r["n_spills"])


h100, h200 = (swept[slug] for slug in GPUS)
print(" " * 32 + "registers, stack per thread | shared memory per program | programs per SM")
for kernel, tile, rotate in table:
    if rotate:
        continue
    mark = f"  <- the benchmark, {' and '.join(benchmark[kernel, tile])}" \
        if (kernel, tile) in benchmark else ""
    if not table[kernel, tile, rotate]["swept"]:
        mark += " (not in the sweep)"
    for rot, label in ((False, f"{kernel:>7} {'/'.join(map(str, tile)):<15} bare     "),
                       (True, f"{'':<23} rotating ")):
        c = table[kernel, tile, rot]
        then = reported(h200[kernel, tile, rot]) if c["swept"] else None
        was = f"  [the sweeps: {then[0]}, {then[1]} B]" \
            if then not in (None, (c["n_regs"], c["stack"])) else ""
        print(label + resources(c) + was + (mark if rot else ""))

# the compile here against the GPU sweeps: both sweeps report the same registers and spills for
# every tile; every tile the GPUs refused needs more shared memory than a program may have
# (227 KiB); for dW and the bare dX the compile gives what the sweeps reported, for the forward
# and the rotating dX (ropelib's reads cos and sin rows, the sweeps' evaluated them) it does not
for slug, rows in swept.items():
    assert set(rows) == set(compiled), slug
    ran = [key for key, r in rows.items() if r["n_regs"] is not None]
    for key, r in rows.items():
        c = compiled[key]
        if key in ran:
            assert c["programs_per_sm"] >= 1, (slug, key)
        else:
            assert "shared memory" in r["reason"] and c["programs_per_sm"] == 0, (slug, key)
            assert c["shared"] > 227 * 1024, (slug, key)
    assert (len(ran), len(rows) - len(ran)) == (39, 7), slug
assert all(reported(h100[key]) == reported(h200[key]) for key in compiled)
differs = {key for key in compiled
           if reported(h200[key]) not in (None, (compiled[key]["n_regs"], compiled[key]["stack"]))}
assert {(kernel, rotate) for kernel, _, rotate in differs} == {("fwd", False), ("fwd", True),
                                                                ("dx", True)}
fwd_rot = [key for key in compiled if key[0] == "fwd" and key[2]]
assert set(fwd_rot) <= differs                                   # every rotating forward tile
dx_rot = [key for key in compiled if key[0] == "dx" and key[2] and reported(h200[key])]
assert set(dx_rot) <= differs and len(dx_rot) == 6               # every rotating dX that ran
bare_moved = [abs(compiled[key]["n_regs"] - h200[key]["n_regs"]) for key in differs if not key[2]]
assert len(bare_moved) == 2 and max(bare_moved) <= 6            # two bare ones, a few registers

# ropelib's dX and dW as they are now, timed alone on the H200 after the sweeps (section 7's
# CHOSEN and the other chosen-tile runs; -qk-norm: with QK-norm, the table's "dx_norm"): at
# every tile the table has, the registers and spills the compile gives
later_runs = sorted(RESULTS.glob("qkv_tiles_chosen-nvidia-h200-*.csv"))
checked = {}
for path in later_runs:
    norm = "-qk-norm" in path.name
    assert ("with QK-norm" in compare.read_meta(path)["case"]) == norm, path.name
    for key, r in by_tile(compare.read_csv(path)).items():
        key = (key[0] + ("_norm" if norm else ""), *key[1:])
        if key in table and r["n_regs"] is not None:
            assert reported(r) == (table[key]["n_regs"], table[key]["stack"]), (path.name, key)
            checked.setdefault(key, []).append(path.name)
print(f"the compile against {len(later_runs)} later H200 runs of ropelib's dX and dW: "
      f"{len(checked)} rows of the table, the same registers and spills")
assert {key[:2] for key in checked} >= {key for key in shipped if key[0] != "fwd"}
assert len(checked) == 10 and all(key[0] != "fwd" for key in checked)
# the rotating dX they ran at tiles of the sweep is where the sweeps' figures differ
assert all(key in differs for key in checked if key[0] == "dx" and key[2])

# ropelib's rotating forward: its registers follow the tokens each warp holds, BLOCK_M / warps
head_dim = measured("nvidia-h200", "fused", "fwd", max(TOKENS))["D"]
now_by_rows, then_by_rows = {}, {}
for key in fwd_rot:
    rows_per_warp = key[1][0] // key[1][3]
    now_by_rows.setdefault(rows_per_warp, set()).add((compiled[key]["n_regs"], compiled[key]["stack"]))
    then_by_rows.setdefault(rows_per_warp, set()).add(reported(h200[key]))
for n in sorted(now_by_rows):
    print(f"rotating forward, {n:>2} tokens a warp: ropelib's (registers, stack) {sorted(now_by_rows[n])}, "
          f"the sweeps {sorted(then_by_rows[n])}; the fp32 accumulator alone {n * head_dim // 32} "
          f"registers a thread")
assert now_by_rows == {8: {(127, 0)}, 16: {(226, 0)}, 32: {(255, 1056)}}
assert then_by_rows == {8: {(145, 0)}, 16: {(254, 0)}, 32: {(255, 528), (255, 536)}}
bench_fwd = [tile for kernel, tile in benchmark if kernel == "fwd"]
assert bench_fwd == [(128, 64, 8, 8, 4)] and bench_fwd[0][0] // bench_fwd[0][3] == 16
# the fp32 accumulator of the benchmark's forward tile, B_M D / (32 warps) registers a thread:
# 64, within the registers the compile gives its bare and its rotating kernel
acc_regs = bench_fwd[0][0] * head_dim // (32 * bench_fwd[0][3])
assert acc_regs == 64
assert acc_regs < compiled["fwd", bench_fwd[0], False]["n_regs"] < compiled["fwd", bench_fwd[0], True]["n_regs"]

# fewer registers, more programs? Two 8-warp programs need 4 warps in each sub-partition
two_8warp = max(n for n in range(1, 256) if programs_per_sm(n, 8, 0).limits["registers"] >= 2)
print(f"two 8-warp programs fit an SM's registers at {two_8warp} registers a thread or fewer")
assert two_8warp == 16384 // 4 // 32 == 128
by_registers = {key[1]: tuple(programs_per_sm(regs, key[1][3], 0).limits["registers"]
                              for regs in (h200[key]["n_regs"], compiled[key]["n_regs"]))
                for key in fwd_rot}
assert [t for t, (then, now) in by_registers.items() if then != now] == [(64, 64, 8, 8, 4)]
assert by_registers[64, 64, 8, 8, 4] == (1, 2)
eight = {(kernel, tile): c for (kernel, tile, rotate), c in table.items()
         if rotate and tile[3] == 8}
assert all(c["programs_per_sm"] <= 1 for c in eight.values() if c["n_regs"] > two_8warp)
assert [kt for kt, c in eight.items() if c["n_regs"] <= two_8warp] == [("fwd", (64, 64, 8, 8, 4))]
assert compiled["fwd", (64, 64, 8, 8, 4), True]["n_regs"] == 127
assert all(c["programs_per_sm"] <= 2 for (_, tile, rotate), c in table.items()
           if rotate and tile[3] == 4)                            # 4 warps: two at most

# the spills: rotating kernels only, all at 255 registers; none at the shipped tiles the sweep
# lacks; the sweeps' earlier dX spilled at fewer of the tiles the GPUs ran
spilling = [key for key, c in table.items() if c["stack"]]
assert all(rotate for _, _, rotate in spilling) and len(spilling) == 9
assert all(table[key]["n_regs"] == 255 and table[key]["swept"] for key in spilling)
assert len([key for key in spilling if h200[key]["n_regs"] is not None]) == 8
assert (min(table[k]["stack"] for k in spilling), max(table[k]["stack"] for k in spilling)) \
    == (48, 1248)
dx_spills = {key[1]: (reported(h200[key])[1] if reported(h200[key]) else None, compiled[key]["stack"])
             for key in compiled if key[0] == "dx" and key[2]}
print("rotating dX, stack bytes a thread (the sweeps' dX, ropelib's): "
      + ", ".join(f"{'/'.join(map(str, t))} {'refused' if then is None else then}, {now}"
                  for t, (then, now) in dx_spills.items()))
assert sum(1 for then, _ in dx_spills.values() if then) == 3
assert sum(1 for then, now in dx_spills.values() if now and then is not None) == 5

# the benchmark's forward tile: the rotating forward both sweeps timed fastest (of that forward)
for slug in GPUS:
    timed = {key[1]: r["ms"] for key, r in swept[slug].items() if key[0] == "fwd" and key[2]}
    assert min(timed, key=timed.get) == bench_fwd[0], slug
assert bench_fwd[0] == tuple(qkv_gemm.GPU_TILES["fwd"][k] for k in TILE)
# every benchmark's tiles are in the table; the H200's dW and dX with QK-norm only as shipped
assert all((*key, False) in table for key in benchmark)
assert [key for key in benchmark if not table[(*key, False)]["swept"]] == [
    ("dw", (64, 256, 8, 8, 2)), ("dx_norm", (32, 128, 8, 4, 3))]
assert benchmark["dw", (64, 256, 8, 8, 2)] == benchmark["dx_norm", (32, 128, 8, 4, 3)] == ["H200"]
programs = {key: tuple(table[(*key, rot)]["programs_per_sm"] for rot in (False, True))
            for key in benchmark}
assert programs == {("fwd", (128, 64, 8, 8, 4)): (1, 1), ("dx", (128, 128, 8, 8, 3)): (1, 1),
                    ("dw", (32, 128, 8, 4, 4)): (1, 2), ("dx", (64, 64, 8, 4, 3)): (2, 2),
                    ("dw", (64, 256, 8, 8, 2)): (1, 1), ("dx_norm", (32, 128, 8, 4, 3)): (2, 2)}, programs
assert all("shared memory" in table[(*key, False)]["limited_by"] for key in benchmark)
spills_at_benchmark = [key for key in benchmark if table[(*key, True)]["stack"]]
assert spills_at_benchmark == [("dx", (128, 128, 8, 8, 3)), ("dx", (64, 64, 8, 4, 3))]
# the H100's dX tile: the earlier dX it ran spilled 80 bytes, ropelib's 48; the H200's: the
# earlier dX (the sweeps) spilled nothing, ropelib's (which the H200's benchmark ran) 56
assert [(reported(h200["dx", t, True])[1], table["dx", t, True]["stack"])
        for t in ((128, 128, 8, 8, 3), (64, 64, 8, 4, 3))] == [(80, 48), (0, 56)]
assert (compiled["fwd", (128, 64, 8, 8, 3), False]["programs_per_sm"],
        compiled["fwd", (128, 64, 8, 8, 3), True]["programs_per_sm"]) == (2, 1)
assert (compiled["fwd", (128, 64, 8, 8, 4), False]["shared"],
        compiled["fwd", (128, 64, 8, 8, 3), False]["shared"]) == (128 * 1024, 96 * 1024)
assert (compiled["dw", (32, 128, 8, 4, 4), False]["shared"],
        compiled["dw", (32, 128, 8, 4, 4), True]["shared"]) == (128 * 1024, 64 * 1024)
assert (table["dw", (64, 256, 8, 8, 2), False]["shared"],
        table["dw", (64, 256, 8, 8, 2), True]["shared"]) == (192 * 1024, 96 * 1024)

# the H200's dX and dW as its GPU run reported them (section 7's CHOSEN): what the compile here
# gives, and the programs per SM those registers allow
print(f"the H200's dX and dW as {CHOSEN.name} ({compare.read_meta(CHOSEN)['date'][:10]}) reported them:")
later = {}
for kernel in ("dx", "dw"):
    tile = tile_key(measured("nvidia-h200", "fused", "fwd", max(TOKENS))["tiles"], kernel)
    for rot, r in sorted(tile_rows("nvidia-h200", kernel, tile).items()):
        allow = programs_per_sm(r["n_regs"], tile[3], 0).limits["registers"]
        assert r["ms"] > 0                                     # it ran: at least one fits
        assert reported(r) == (table[kernel, tile, rot]["n_regs"], table[kernel, tile, rot]["stack"])
        later[kernel, rot] = (r["n_regs"], 4 * r["n_spills"], allow)
        print(f"{kernel:>3} {'/'.join(map(str, tile)):<15} {'rotating' if rot else 'bare    '} "
              f"{r['n_regs']:>3} {4 * r['n_spills']:>5} B   registers allow {allow} "
              f"program{'s' if allow > 1 else ''} per SM")
assert later == {("dx", False): (124, 0, 4), ("dx", True): (255, 56, 2),
                 ("dw", False): (174, 0, 1), ("dw", True): (255, 0, 1)}, later
# ropelib's dX spills at the H200's tile where the earlier one does not, and its registers
# allow as many programs as the bare dX holds
assert reported(h200["dx", (64, 64, 8, 4, 3), True]) == (255, 0)
assert later["dx", True][2] == programs["dx", (64, 64, 8, 4, 3)][0] == 2

# %% [markdown]
# What the columns show:
#
# - **The compile here matches the GPU runs where the kernel is the same.** The two sweeps
#   report the same registers and spills for every tile (39 ran on each GPU; Triton's
#   `n_spills` counts 4-byte words, stack / 4), and for dW and the bare dX the compile here
#   gives exactly those. The 7 tiles the GPUs refused ("out of resource: shared memory") are
#   exactly those that need more than the 227 KiB a program may have: 0 programs per SM. The
#   H200 timed ropelib's dX and dW again after the sweeps, at the tiles then chosen (section
#   7's runs, with and without QK-norm): at the 10 rows of the table those runs have, the
#   shipped dW and dX-with-QK-norm tiles among them, the compile gives what they reported.
# - **The forward is not the kernel the sweeps ran.** Every rotating forward tile compiles
#   differently from what the sweeps report (the table prints the sweeps' figures in brackets),
#   and two bare ones by a few registers. The rotating forward's registers follow the tokens
#   each warp holds, $B_M$ / warps: 127 a thread at 8 tokens a warp (the sweeps: 145), 226 at 16
#   (the sweeps: 254), and at 32 all 255 with 1,056 bytes of stack (the sweeps: 528 and 536).
#   The fp32 accumulator alone takes $B_M D / (32 \cdot \text{warps})$ registers a thread, 64 at
#   16 tokens a warp, the benchmark's forward tile; the halves split out of it, the cos and sin
#   rows and the rotation come on top.
# - **Nor is the rotating dX.** ropelib's, which reads cos and sin rows, compiles differently
#   from the sweeps' at every tile the GPUs ran: at 64/128 on 8 warps it holds 255 registers
#   where the sweeps' held 219, and elsewhere both hold 255 but spill differently (the brackets):
#   the sweeps' spilled at 3 of those 6 tiles, ropelib's at 5, more at some and less at others.
# - **Only rotating kernels spill**, 9 tiles (8 of them ran), all at 255 registers, from 48 to
#   1,248 bytes per thread; the tiles ropelib ships that the sweep lacks spill nothing. Of the
#   benchmarks' tiles, ropelib's dX spills at both GPUs' dX tiles: 48 bytes at the H100's
#   (128/128, 8 warps; the earlier dX the H100 ran spilled 80, 20 words) and 56 bytes (14
#   words) at the H200's, where the earlier dX spilled nothing; dW at 64/256 on 8 warps holds
#   255 and spills nothing, and so does dX with QK-norm at 32/128 on 4 warps. The H200's
#   benchmark ran ropelib's dX and that dW, and their GPU run (printed under the table)
#   reported these registers and spills.
# - **Fewer registers give more programs only past a threshold.** Two 8-warp programs need 4
#   warps in each of the SM's four sub-partitions of 16,384 registers: 16,384 / 4 / 32 = 128
#   registers a thread at most. Above that a rotating 8-warp program has the SM to itself, and
#   every rotating 8-warp tile is above it but the forward's 64/64 one (127). So the fall from
#   254 to 226 changed the programs that the registers allow at no tile; only the 64/64 8-warp
#   tile, 145 to 127, went from 1 to 2. Rotating 4-warp programs fit two at most.
# - **At the benchmark's tiles the epilogue and the prologue cost no resident programs.** The
#   pairs are (bare, rotating): the forward holds (1, 1), because the bare kernel's four
#   stages, 128 KiB of shared memory, already leave room for only one; at three stages, 96 KiB,
#   it is (2, 1). dX holds (2, 2) at the H200's tile and (1, 1) at the H100's: at the H200's
#   tile the 255 registers of ropelib's dX that reads rows still allow two programs, as many as
#   the bare dX holds. dW holds (1, 2) at the H100's tile: the rotating dW stages 64 KiB of
#   shared memory where the bare one stages 128 KiB. At the H200's, 64/256 on 8 warps, it is
#   (1, 1): 174 registers bare and 255 rotating allow one 8-warp program each (so does the
#   bare one's 192 KiB of shared memory; the rotating one's 96 KiB would allow two). dX with
#   QK-norm, 32/128 on 4 warps, holds (2, 2). As far as these resources go, fewer
#   resident programs cannot be what makes the rotating kernels slower at those tiles.
#   Confirming what does, and the occupancy actually achieved, takes a profiler on the GPU.
# - **The benchmark's forward tile**, 128/64 with 8 warps and 4 stages, is the rotating forward
#   tile both sweeps timed fastest — for the earlier forward. At this tile ropelib's forward
#   kernel holds fewer registers (226 against 254) but the same programs per SM (1); which tile
#   is fastest for it, only a sweep on the GPU can tell.

# %% [markdown]
# With QK-norm (Qwen3's per-head RMS norm before the rotation, in the same epilogue) the fused
# pipeline is slower than the unfused one too, and forward+backward, where the norm's backward
# joins the prologue, by more than without it. Forward it takes 1.3 to 1.4 times the unfused
# time, on both GPUs at both token counts. Forward+backward on the H200
# (`qkv_rope-nvidia-h200.csv`) it takes 4.2 and 4.1 times the unfused time (8.22 against
# 1.96 ms at 8192 tokens, 32.83 against 7.93 ms at 32768), where without QK-norm it takes 2.8
# and 2.6 times. Not every configuration ran on every GPU: a row that did not says why (the
# `reason` column). On the H100 the fused backward with QK-norm ran out of shared memory with
# the dX tile of that run (the `tiles` printed above). ropelib's dX with QK-norm now has a tile
# of its own, `GPU_TILES["dx_norm"]` (32/128 on 4 warps), and the H200 ran it.
#
# The kernels timed alone on the H200 at 8192 tokens, on 2026-11-29, the day before its
# benchmark (`qkv_tiles_chosen-nvidia-h200-20261129-1930-qk-norm.csv` and `-1942-qk-norm.csv`;
# `-1914.csv` without the norm, whose times the run just before the benchmark repeats), show
# where the norm's backward goes. At the plain dX tile, 64/64, dX with the norm spills 60 words
# a thread and takes 8.01 ms; at its own tile it spills nothing and takes 2.49 ms, against 1.74
# for dX without the norm. dW with the norm, at ropelib's dW tile, spills 64 words and takes
# 5.05 ms against 2.74 without it: the larger part of what the norm adds to the backward (all
# asserted below).

# %%
norm_ratio = {}     # (gpu, tokens, pass) -> fused / unfused with QK-norm, where both ran
for slug in GPUS:
    for r in QKV[slug]:
        if r["qk_norm"] and r["provider"] in ("fused", "unfused"):
            what = f"{r['ms']:7.3f} ms" if r["available"] else f"did not run: {r['reason'][:80]}"
            print(f"{GPUS[slug]} {r['tokens']:>6} tokens QK-norm {r['provider']:<8} {r['pass']:<8} {what}")
    for tokens in TOKENS:
        for s in ("fwd", "fwd+bwd"):
            fu, un = (measured(slug, p, s, tokens, qk_norm=True) for p in ("fused", "unfused"))
            if fu["available"] and un["available"]:
                norm_ratio[slug, tokens, s] = fu["ms"] / un["ms"]
                print(f"  {GPUS[slug]} {tokens:>6} tokens {s:<8} fused / unfused with QK-norm "
                      f"{fu['ms'] / un['ms']:.2f}")
            elif not fu["available"]:
                # the H100's ran its dX tile (no tile of its own with the norm) and did not fit
                assert "shared memory" in fu["reason"] and "dx_norm" not in fu["tiles"]
                assert tile_key(fu["tiles"], "dx") != tuple(qkv_gemm.GPU_TILES["dx"][k] for k in TILE)
                h200_run = measured("nvidia-h200", "fused", s, tokens, True)
                assert h200_run["available"] and tile_key(h200_run["tiles"], "dx_norm") \
                    == tuple(qkv_gemm.GPU_TILES["dx_norm"][k] for k in TILE) == (32, 128, 8, 4, 3)
# what the prose says: forward 1.3 to 1.4 times on both GPUs; forward+backward (the H200 alone)
# 4.2 and 4.1 times, where without QK-norm it is 2.8 and 2.6 times
forward = [v for (_, _, s), v in norm_ratio.items() if s == "fwd"]
assert len(forward) == 4 and (round(min(forward), 1), round(max(forward), 1)) == (1.3, 1.4)
assert min(norm_ratio.values()) > 1                       # slower wherever both ran
both = {(slug, t): v for (slug, t, s), v in norm_ratio.items() if s == "fwd+bwd"}
assert set(both) == {("nvidia-h200", t) for t in TOKENS}
assert [round(both["nvidia-h200", t], 1) for t in TOKENS] == [4.2, 4.1], both
assert [(round(measured("nvidia-h200", p, "fwd+bwd", t, True)["ms"], 2)) for t in TOKENS
        for p in ("fused", "unfused")] == [8.22, 1.96, 32.83, 7.93]
plain = [measured("nvidia-h200", "fused", "fwd+bwd", t)["ms"]
         / measured("nvidia-h200", "unfused", "fwd+bwd", t)["ms"] for t in TOKENS]
assert [round(v, 1) for v in plain] == [2.8, 2.6]
assert min(both.values()) > max(plain)                    # "by more than without it"

# the norm's backward in dX and dW, timed alone on the H200 (8192 tokens, 2026-11-29)
NORM_RUNS = [RESULTS / f"qkv_tiles_chosen-nvidia-h200-20261129-{t}-qk-norm.csv" for t in (1930, 1942)]
alone = {}          # (kernel, tile, norm) -> the rotating kernel's rows
for path, norm in [(CHOSEN, False)] + [(path, True) for path in NORM_RUNS]:
    meta = compare.read_meta(path)
    assert meta["case"].startswith("t8192") and ("with QK-norm" in meta["case"]) == norm
    assert meta["date"][:10] == "2026-11-29", path
    for r in compare.read_csv(path):
        if r["rotate"]:
            alone.setdefault((r["kernel"], tuple(r[k] for k in TILE), norm), []).append(r)
dx_tile, dw_tile, dx_norm_tile = (tuple(qkv_gemm.GPU_TILES[k][f] for f in TILE)
                                  for k in ("dx", "dw", "dx_norm"))
for kernel, tile, norm in (("dx", dx_tile, False), ("dx", dx_tile, True), ("dx", dx_norm_tile, True),
                           ("dw", dw_tile, False), ("dw", dw_tile, True)):
    (r,) = alone[kernel, tile, norm]                          # each of these timed once
    alone[kernel, tile, norm] = r
    print(f"{kernel} at {'/'.join(map(str, tile)):<13} {'with' if norm else 'without'} the norm: "
          f"{r['ms']:.2f} ms, {r['n_regs']} registers, {r['n_spills']} words spilled")
assert [(round(alone[k]["ms"], 2), alone[k]["n_spills"]) for k in (
    ("dx", dx_tile, True), ("dx", dx_norm_tile, True), ("dx", dx_tile, False),
    ("dw", dw_tile, True), ("dw", dw_tile, False))] == [(8.01, 60), (2.49, 0), (1.74, 14),
                                                        (5.05, 64), (2.74, 0)]
norm_adds = {"dx": alone["dx", dx_norm_tile, True]["ms"] - alone["dx", dx_tile, False]["ms"],
             "dw": alone["dw", dw_tile, True]["ms"] - alone["dw", dw_tile, False]["ms"]}
assert norm_adds["dw"] > norm_adds["dx"]                  # "the larger part" is dW's

# %% [markdown]
# **Why it is slower, in three parts.**
#
# 1. *The main loop.* The fused kernel is a Triton `tl.dot` loop; cuBLAS's Hopper GEMMs are
#    faster at this shape (the first ratio printed above). Section 1 bounds what fusion can save
#    by the RoPE pass, a small share of the pipeline; the main loop trails cuBLAS by more than
#    that, so the fused kernel loses before the epilogue does anything.
# 2. *The epilogue.* On the H200 (`qkv_rope-nvidia-h200.csv`) ropelib's fused forward takes
#    17 % longer than its own bare GEMM at 8192 tokens (0.780 against 0.669 ms) and 8 % longer
#    at 32768. The epilogue adds the loads of each token's cos and sin row and the rotation, and
#    about doubles the registers a thread holds (at the benchmark's forward tile 114 bare, 226
#    rotating; 254 in the earlier forward that evaluated sin and cos itself), though at the
#    benchmark's tiles without costing resident programs (the table above). The probe of
#    section 3 (`qkv_mainloop-nvidia-h200.csv`) has an epilogue too: it reads a cos/sin table,
#    in the same tile, and costs nothing the probe can measure. At 8192 tokens its rotating
#    kernel (0.680 ms) is within 2 % of ropelib's bare GEMM, less than the 4 % by which the two
#    files' cuBLAS timings differ (they are separate runs); at 32768 it is 7 % faster (cuBLAS:
#    3 % apart). What makes ropelib's forward slower than the probe's, a profile of both says
#    (the cell after the next).
# 3. *The backward's prologue.* Each of the $K / B_K$ column blocks of dX and dW re-forms the
#    $dY$ tiles it needs: gradient loads, cosines and sines, the rotation. dW at each
#    benchmark's tile runs more than twice as long with the prologue as without it, and the
#    prologues' extra time is over half of the forward+backward gap, 81 % on the H100 and 62 %
#    on the H200 (both printed above). Writing $dY$ once (one pass — the one the unfused
#    pipeline makes anyway), reading each token's angles from rows computed once (as ropelib's
#    forward does, and now its dX), or giving each dW program more columns would each cut the
#    repetition. The last was measured (the cell below, on the H200): dW with 256 columns a
#    program on 8 warps re-forms each $dY$ tile half as often, and its prologue's extra time
#    falls to less than half; the rotating kernel is still about twice the bare one. ropelib's
#    dW now takes that tile, and the H200's benchmark in the figure ran it: there the fused
#    forward+backward takes 5.19 ms at 8192 tokens, still well behind the unfused pipeline's
#    1.88. The H100's benchmark ran the narrow tile.
#
# %%
chosen = {(r["kernel"], tuple(r[k] for k in TILE), r["rotate"]): r for r in compare.read_csv(CHOSEN)}
print(f"dW at chosen tiles, {compare.read_meta(CHOSEN)['case']} "
      f"({compare.read_meta(CHOSEN)['gpu']}, {compare.read_meta(CHOSEN)['date'][:10]}):")
for tile in sorted({t for k, t, _ in chosen if k == "dw"}):
    bare, rot = chosen["dw", tile, False], chosen["dw", tile, True]
    print(f"  {'/'.join(map(str, tile)):>14}: {bare['ms']:.2f} ms bare, {rot['ms']:.2f} ms rotating "
          f"(prologue {rot['ms'] - bare['ms']:.2f} ms), {rot['n_regs']} registers, "
          f"{rot['n_spills']} spilled")
narrow, wide = (32, 128, 8, 4, 4), tuple(qkv_gemm.GPU_TILES["dw"][k] for k in TILE)
assert wide == (64, 256, 8, 8, 2)
assert [tiles_ran(slug)["dw"] for slug in GPUS] == [narrow, wide]   # the H100's, the H200's
extra = {t: chosen["dw", t, True]["ms"] - chosen["dw", t, False]["ms"] for t in (narrow, wide)}
assert extra[wide] < 0.5 * extra[narrow]                       # "less than half"
assert chosen["dw", wide, True]["ms"] > 2 * chosen["dw", wide, False]["ms"]   # "about twice"
assert min((r["ms"], t) for (k, t, rot), r in chosen.items() if k == "dw" and rot)[1] == wide
end_to_end = {p: measured("nvidia-h200", p, "fwd+bwd", 8192)["ms"] for p in ("fused", "unfused")}
print(f"the H200's benchmark (dW at {'/'.join(map(str, wide))}, {META['nvidia-h200']['date'][:10]}): "
      f"fused forward+backward {end_to_end['fused']:.2f} ms at 8192 tokens, the unfused pipeline "
      f"{end_to_end['unfused']:.2f} ms")
assert (round(end_to_end["fused"], 2), round(end_to_end["unfused"], 2)) == (5.19, 1.88)   # the text

# %% [markdown]
# **What the main loop waits on.** `benchmarks/qkv_forward_ncu_probe.py` ran each forward once
# under Nsight Compute (8192 tokens, the benchmark's tiles; `qkv_forward_ncu-nvidia-h200.csv`).
# The profiler fixes the clocks (the SMs ran at about 1.3 GHz), so every time below is longer
# than `do_bench`'s; compare them with each other only. Three things could make ropelib's
# forward slower than the probe's rotating kernel: fewer resident warps, more instructions, or
# longer waits between them. The profile separates them:
#
# - **Resident warps: the same.** Every Triton kernel here runs one 8-warp program per SM
#   (shared memory: four stages of tiles), achieved occupancy 12.4–12.5 %.
# - **Instructions: about the same.** ropelib's fused forward executes 145 M warp instructions,
#   the probe's 152 M.
# - **Waits: not the same.** A warp of ropelib's kernels waits 8.2 cycles between two issued
#   instructions, a warp of the probe's 6.4. Split by stall reason, ropelib's kernels spend
#   2.2–2.3 of those cycles on *dispatch* stalls and 0.4 on *LG throttle* (the queue of
#   global-memory instructions is full), where the probe's spend 0.16 and 0.00. Its waits are
#   at barriers instead (1.9 against 0.4).
#
# The difference is in how the tiles arrive. ropelib's main loop loads x and W with pointer
# loads: every thread computes addresses and issues its own asynchronous copies into shared
# memory, a stream of global-memory instructions that fills the queue. The probe's loads them
# with TMA: one instruction asks the copy engine for a whole tile, and the warps wait on a
# barrier until it has arrived. ropelib's bare GEMM, without the epilogue, shows the same waits
# (2.3 and 0.4 cycles), so the main loop, not the epilogue, is where those waits come from and
# the larger part of the forward's gap to the probe (the table below has both kernels' times).
# One caution the profile also shows: the probe's own bare TMA GEMM, at the same tile, was the
# slowest of the Triton kernels (4.85 cycles of barrier waits per instruction), so TMA alone is
# not a guarantee; how the stores and the barriers line up matters too.

# %%
NCU = RESULTS / "qkv_forward_ncu-nvidia-h200.csv"
ncu_meta = compare.read_meta(NCU)
prof = {}
for r in compare.read_csv(NCU):     # numbers only ("1,234.5"); the words (policies) are left out
    value = str(r["value"]).replace(",", "")
    if re.fullmatch(r"-?[0-9.]+(e[-+]?[0-9]+)?", value):
        prof.setdefault(r["call"], {})[r["metric"]] = float(value)
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
print(f"under Nsight Compute ({ncu_meta['gpu']}, {ncu_meta['date'][:10]}; {ncu_meta['case']})")
print(f"{'kernel':30} {'us':>6} {'regs':>5} {'occup.%':>8} {'M instr':>8} {'cyc/instr':>9} "
      f"{'dispatch':>8} {'LG':>5} {'barrier':>8}")
for call, m in prof.items():
    if "pre-pass" in call:
        continue
    print(f"{call:30} {m['Duration'] / 1e3:6.0f} {m['Registers Per Thread']:5.0f} "
          f"{m['Achieved Occupancy']:8.1f} {m['smsp__inst_executed.sum'] / 1e6:8.0f} "
          f"{m['Warp Cycles Per Issued Instruction']:9.2f} {m[STALL.format('dispatch_stall')]:8.2f} "
          f"{m[STALL.format('lg_throttle')]:5.2f} {m[STALL.format('barrier')]:8.2f}")
ours, probe = prof["product_fused"], prof["probe_fused"]
triton_kernels = ("product_bare", "product_fused", "probe_bare", "probe_fused")
# the text: one 8-warp program per SM for every Triton kernel, 12.4-12.5 % achieved
assert all(round(prof[c]["Achieved Occupancy"], 1) in (12.4, 12.5) for c in triton_kernels)
assert all(prof[c]["Theoretical Occupancy"] == 12.5 for c in triton_kernels)
# about the same instructions: 145 M and 152 M
assert (round(ours["smsp__inst_executed.sum"] / 1e6), round(probe["smsp__inst_executed.sum"] / 1e6)) == (145, 152)
# the waits: 8.2 against 6.4 cycles per issued instruction
assert (round(ours["Warp Cycles Per Issued Instruction"], 1), round(probe["Warp Cycles Per Issued Instruction"], 1)) == (8.2, 6.4)
for c in ("product_bare", "product_fused"):     # ropelib's: dispatch 2.2-2.3, LG 0.4
    assert 2.15 <= prof[c][STALL.format("dispatch_stall")] < 2.35
    assert round(prof[c][STALL.format("lg_throttle")], 1) == 0.4
assert round(probe[STALL.format("dispatch_stall")], 2) == 0.16 and probe[STALL.format("lg_throttle")] < 0.005
assert (round(probe[STALL.format("barrier")], 1), round(ours[STALL.format("barrier")], 1)) == (1.9, 0.4)
assert round(prof["probe_bare"][STALL.format("barrier")], 2) == 4.85
assert max(triton_kernels, key=lambda c: prof[c]["Duration"]) == "probe_bare"   # the slowest

# %% [markdown]
# The idea is sound — it removes a pass whose cost section 1 measured — but it pays off only
# with a main loop as fast as cuBLAS's and a backward that forms $dY$ about once.
#
# ### Writing $dY$ once
#
# Part 3's first remedy is the one the unfused pipeline uses: rotate the gradients of q and k
# back once (ropelib's RoPE, run backward), write $dY$, and hand $dX = dY\,W$ and
# $dW = dY^\top x$ to cuBLAS. `qkv_rope_linear(..., backward="dy")` does that (with QK-norm,
# `qk_norm_rope`'s backward undoes the norm as well; the forward is the same either way).
# `benchmarks/qkv_dy_probe.py` timed it, without the norm, on the H200 beside the
# prologues, beside the same $dY$ handed to ropelib's own dX and dW kernels without their
# rotation, and beside the unfused pipeline: forward+backward, the benchmark's case, each
# provider first checked against the unfused one.

# %%
DY_RUN = RESULTS / "qkv_dy_probe-nvidia-h200-20261130-1437.log"
dy_ms, dy_diff = {}, {}
for line in DY_RUN.read_text().splitlines():
    hit = re.match(r"\s*(\d+) (.+?)\s+([\d.]+)\s+([\d.e+-]+)$", line)
    if hit:
        dy_ms[int(hit[1]), hit[2]] = float(hit[3])
        dy_diff[int(hit[1]), hit[2]] = float(hit[4])
WAYS = ("fused, prologues", "fused, dY written, cuBLAS", "fused, dY written, Triton", "unfused")
print(f"{DY_RUN.name}: forward+backward ms (H200, Llama-3-8B's projection, bf16, no QK-norm)")
print(f"{'tokens':>7} " + " ".join(f"{w:>26}" for w in WAYS))
for tokens in TOKENS:
    print(f"{tokens:>7} " + " ".join(f"{dy_ms[tokens, w]:26.3f}" for w in WAYS))
assert set(dy_ms) == {(t, w) for t in TOKENS for w in WAYS}
assert max(dy_diff.values()) <= 2.0**-5                # every provider agreed with the unfused
for tokens in TOKENS:
    prologues, dy, dy_triton, unfused_ms = (dy_ms[tokens, w] for w in WAYS)
    print(f"  {tokens:>6} tokens: the prologues {prologues - dy_triton:.2f} ms over dY written at "
          f"the same GEMMs; backward='dy' {prologues / dy:.1f}x faster than the prologues, "
          f"{dy / unfused_ms - 1:.0%} behind the unfused pipeline")
# what the text says: 1.05 and 3.91 ms; 2.6 and 2.4 times; 6 % behind at both token counts
assert [round(dy_ms[t, WAYS[0]] - dy_ms[t, WAYS[2]], 2) for t in TOKENS] == [1.05, 3.91]
assert [round(dy_ms[t, WAYS[0]] / dy_ms[t, WAYS[1]], 1) for t in TOKENS] == [2.6, 2.4]
assert [round(dy_ms[t, WAYS[1]] / dy_ms[t, WAYS[3]] - 1, 2) for t in TOKENS] == [0.06, 0.06]

# %% [markdown]
# Writing $dY$ is one pass over q's and k's gradients, the pass the unfused pipeline's RoPE
# backward makes; re-forming it in every column block costs far more. At the same Triton GEMMs
# the prologues took 1.05 ms longer than writing $dY$ at 8192 tokens and 3.91 ms at 32768. With
# cuBLAS's GEMMs the fused projection's forward+backward is 2.6 and 2.4 times faster than with
# its prologues, and 6 % behind the unfused pipeline at both token counts: what remains is the
# forward, its main loop and its epilogue (parts 1 and 2; this run had the pointer-loaded
# forward, and the end of this section measures the two together again). Keeping $dY$ out of
# memory is what the prologue design buys; at these shapes the measurement says it is not
# worth its price, and `backward="dy"` is now the default.

# %% [markdown]
# ### A main loop as fast as cuBLAS's
#
# What remains is the forward: part 1's main loop and part 2's epilogue. The profile above
# pointed at how the tiles arrive. `benchmarks/qkv_mainloop_probe.py` took the probe's kernel
# three steps further on the H200, and timed each step in **rounds**: every variant once a
# round, in the same order, seven rounds, and a variant's number is the median of its ratio
# to cuBLAS's time in the same round (above 1 is faster than cuBLAS). Single timings of these
# kernels moved from one run to the next by more than the differences between the variants;
# rounds put every variant under the same conditions. The steps:
#
# - **a persistent grid**: one program per SM (132 on the H200) walks the tiles in grouped
#   order, instead of one short-lived program per tile that fills and drains its pipeline;
# - **TMA** loads and stores (the profile above: pointer loads fill the queue of
#   global-memory instructions);
# - **two heads a tile**, an accumulator of $[128, 2D]$: both heads belong to the same tokens,
#   so they share one load of those tokens' cos and sin. A tile of 256 tokens and one head
#   holds as many accumulator registers but loads cos and sin again for every head.
#
# The next cell prints four runs side by side (files `qkv_mainloop_rounds-nvidia-h200-*.csv`,
# named by the time they ran) and asserts what this paragraph says. The persistent TMA GEMM
# alone runs at 0.96 to 0.99 of cuBLAS's speed. The fused candidate on it, with two heads a
# tile and a cos/sin table, was ahead of the unfused pipeline in 7 of the 8 (run, token count)
# pairs, by 0.4 to 7 %, and behind in one by 1 %: it **reaches** the unfused pipeline, within
# the spread of the rounds. Each step is needed: with pointer loads, or with one head a tile,
# the same epilogue trails the unfused pipeline.
#
# Two conditions come with that result. The candidate reads one cos and one sin per pair of
# features; ropelib's pre-pass rows give each member of a pair its own (four tiles of
# $[128, D/2]$ fp32 instead of two), and with four the kernel runs out of registers (255 a
# thread and 80 bytes spilled, compiled for sm_90) and falls behind the unfused pipeline. And
# its table was made once, outside the timed call, as a model makes one table for all its
# layers; made in every call, the candidate is level with the unfused pipeline at 32768 tokens
# and behind at 8192.
#
# Since these runs, `qkv_rope_linear` runs its forward on this main loop wherever a GPU has
# TMA and both head counts are even: two heads a tile, the descriptors made inside the kernel
# from its pointers, so it launches the way every ropelib kernel does (eagerly, under
# `torch.compile`, in CUDA graphs). Reading ropelib's four cos/sin tiles it held 255
# registers and spilled, like the four-tile row above, and on the H200 it ran about a fifth
# faster than the forward it replaced, still behind the unfused pipeline
# (`benchmarks/qkv_forward_ab.py`; that file is read in the next part, whose cell checks
# both). With table-free angles, whose pairs share one angle, it
# now reads one cos and one sin tile, as the candidate does. Everything else this section measured is that earlier,
# pointer-loaded forward, which still serves odd head counts, partial rotary and GPUs without
# TMA; without its epilogue it runs at about three quarters of cuBLAS's speed (the last row).
# The candidate's numbers above are what the shipped forward can still gain.

# %%
ROUNDS_RUNS = ["2204", "2207", "2221", "2229"]       # the runs of seven rounds, by their time
rounds = {}
for run in ROUNDS_RUNS:
    path = RESULTS / f"qkv_mainloop_rounds-nvidia-h200-20261130-{run}.csv"
    for r in compare.read_csv(path):
        if r.get("ms"):
            rounds[run, r["tokens"], r["variant"]] = r["cublas_ms_over_ms"]
assert {compare.read_meta(RESULTS / f"qkv_mainloop_rounds-nvidia-h200-20261130-{run}.csv")["gpu"]
        for run in ROUNDS_RUNS} == {"NVIDIA H200"}
TWO = "fused persistent 2 heads table (128, 64, 8, 8, 3)"
SHOWN = {
    "unfused (cuBLAS + ropelib RoPE)": "cuBLAS, then ropelib's RoPE (unfused)",
    "unfused, bf16 cos/sin table": "the same from a bf16 cos/sin table made once",
    "persistent (128, 256, 64, 8, 8, 3)": "persistent TMA GEMM, 128 x 256, no epilogue",
    TWO: "fused: persistent, TMA, two heads a tile",
    "fused persistent 2 heads table made in the call (128, 64, 8, 8, 3)":
        "  the same, its cos/sin table made in the call",
    "fused persistent table (256, 64, 8, 8, 3)": "fused: persistent, TMA, one head, 256 tokens",
    "fused persistent pointers 2 head(s) table (128, 64, 8, 8, 3)":
        "fused: persistent, two heads, pointer loads",
    "fused persistent 2 heads product rows (128, 64, 8, 8, 3)":
        "fused, two heads, ropelib's four cos/sin tiles",
    "fused persistent 2 heads product rows one per pair (128, 64, 8, 8, 3)":
        "fused, two heads, one cos and one sin a pair",
    "product": "ropelib's forward GEMM, no epilogue",
}
print("of cuBLAS's speed, median of 7 rounds (H200, Llama-3-8B's projection, bf16); "
      "8192 / 32768 tokens")
print(f"{'':48}" + "".join(f"{'run ' + str(i + 1):>15}" for i in range(len(ROUNDS_RUNS))))
for variant, label in SHOWN.items():
    cells = [(f"{rounds[run, 8192, variant]:.3f} / {rounds[run, 32768, variant]:.3f}"
              if (run, 8192, variant) in rounds else "") for run in ROUNDS_RUNS]
    print(f"{label:48}" + "".join(f"{c:>15}" for c in cells))

pairs = [(run, t) for run in ROUNDS_RUNS for t in TOKENS if (run, t, TWO) in rounds]
lead = {(run, t): rounds[run, t, TWO] / rounds[run, t, "unfused (cuBLAS + ropelib RoPE)"] - 1
        for run, t in pairs}
# the text: ahead of the unfused pipeline in 7 of 8 pairs, by 0.4-7 %, behind in one by 1 %
assert len(lead) == 8 and sum(v > 0 for v in lead.values()) == 7
assert (round(min(v for v in lead.values() if v > 0), 3), round(max(lead.values()), 2)) == (0.004, 0.07)
assert round(min(lead.values()), 2) == -0.01 and min(lead, key=lead.get) == ("2229", 32768)
bare = [rounds[run, t, "persistent (128, 256, 64, 8, 8, 3)"] for run in ROUNDS_RUNS for t in TOKENS]
assert (round(min(bare), 2), round(max(bare), 2)) == (0.96, 0.99)   # "0.96 to 0.99"
for t in TOKENS:            # pointer loads trail the unfused pipeline; one head trails two
    assert rounds["2207", t, "fused persistent pointers 2 head(s) table (128, 64, 8, 8, 3)"] \
        < rounds["2207", t, "unfused (cuBLAS + ropelib RoPE)"] < rounds["2207", t, TWO]
    assert rounds["2204", t, "fused persistent table (256, 64, 8, 8, 3)"] < rounds["2204", t, TWO]
    four = rounds["2221", t, "fused persistent 2 heads product rows (128, 64, 8, 8, 3)"]
    two = rounds["2221", t, "fused persistent 2 heads product rows one per pair (128, 64, 8, 8, 3)"]
    assert four < two and four < rounds["2221", t, "unfused (cuBLAS + ropelib RoPE)"]
# ropelib's own forward GEMM, without its epilogue: about three quarters of cuBLAS's speed
product = [rounds[run, t, "product"] for run in ("2207", "2221") for t in TOKENS]
assert (round(min(product), 2), round(max(product), 2)) == (0.73, 0.77)
# with the table made in every call: behind at 8192 tokens, level at 32768
made = "fused persistent 2 heads table made in the call (128, 64, 8, 8, 3)"
assert rounds["2229", 8192, made] < rounds["2229", 8192, "unfused (cuBLAS + ropelib RoPE)"]
assert abs(rounds["2229", 32768, made] - rounds["2229", 32768, "unfused (cuBLAS + ropelib RoPE)"]) < 0.002


# %% [markdown]
# ### Where the shipped projection stands
#
# Most of this section measured a forward that no longer runs on Hopper and a backward that is
# no longer the default. `qkv_rope_linear` now runs its forward on the persistent TMA main loop
# above, and its backward writes $dY$ once (`backward="dy"`, the default; `backward="prologue"`
# keeps section 5's design). Three files measured what a user gets on the H200, in rounds as
# above (seven; a number is the median of the rounds' ratios, their range beside it):
#
# - `qkv_forward_ab-nvidia-h200-20261201-0147.csv`, the forward alone, of cuBLAS's speed;
# - `qkv_dy_rounds-nvidia-h200-20261201-0132.csv` and `qkv_dy_rounds_qk_norm-…-0133.csv`,
#   forward+backward, of the unfused pipeline's speed (cuBLAS, then ropelib's RoPE, or
#   `qk_norm_rope` with QK-norm, autograd through both; the same table-free angles).
#
# From table-free angles the forward runs at 0.91 and 0.97 of cuBLAS's speed (8192 and 32768
# tokens), from an angle table at 0.92 and 0.97: level with the unfused pipeline's 0.92 at 8192
# tokens and ahead of its 0.95 at 32768. The epilogue reads one cos and one sin tile for both
# heads, as the probe's candidate did. An angle table may give a pair's two members different
# angles, so the pre-pass that writes the rows also flags whether any pair's members differ,
# and the epilogue branches on that flag: where they do, it reads each member's own cos and
# sin just before rotating and storing that member, so either branch holds two tiles of the
# rows at a time (holding four at once, that branch had spilled 232 bytes a thread, compiled
# for sm_90, and slowed the table's forward to 0.89 and 0.94 in an earlier run). Reading each
# member's own rows costs that branch 5 to 6 % (the rows "each member's rows in turn" below).
#
# Forward+backward, the fused projection is faster than the unfused pipeline at 8192 tokens, in
# every round (1.05 of its speed, 1.01 to 1.12), and level at 32768 (0.99, between 0.96 and
# 1.03). With QK-norm it is behind at 8192 (0.91) and ahead at 32768 (1.03). The prologues ran
# at 0.39 of the unfused speed (0.25 with QK-norm) in the same rounds. So the fusion
# pays on Hopper now that its forward and its backward each match the unfused pipeline's
# kernels: by a few per cent at 8192 tokens, not measurably at 32768, and not yet with QK-norm
# at 8192.

# %%
FWD_AB = RESULTS / "qkv_forward_ab-nvidia-h200-20261201-0147.csv"
DY_ROUNDS = [RESULTS / "qkv_dy_rounds-nvidia-h200-20261201-0132.csv",
             RESULTS / "qkv_dy_rounds_qk_norm-nvidia-h200-20261201-0133.csv"]
for path in (FWD_AB, *DY_ROUNDS):
    assert compare.read_meta(path)["gpu"] == "NVIDIA H200"
fwd = {(r["tokens"], r["qk_norm"], r["variant"]): r for r in compare.read_csv(FWD_AB)}
# the TMA forward as first shipped (ropelib's four cos/sin tiles) against the pointer-loaded
# forward it replaced: about a fifth faster, at both token counts, and still behind the
# unfused pipeline
assert [round(fwd[t, False, "TMA, four row tiles"]["cublas_ms_over_ms"]
              / fwd[t, False, "pointer kernel"]["cublas_ms_over_ms"], 1) for t in TOKENS] == [1.2, 1.2]
assert all(fwd[t, False, "TMA, four row tiles"]["cublas_ms_over_ms"]
           < fwd[t, False, "unfused"]["cublas_ms_over_ms"] for t in TOKENS)
dy = {(r["tokens"], r["qk_norm"], r["provider"]): r
      for path in DY_ROUNDS for r in compare.read_csv(path)}


def spread(row, key):
    return f"{row[key]:.3f} ({row['low']:.3f}-{row['high']:.3f})"


FORWARDS = {"unfused": "cuBLAS, then ropelib's RoPE", "TMA, two heads": "fused, angles",
            "table, flag": "fused, an angle table",
            "table, four tiles": "  the same, each member's rows in turn",
            "TMA, four row tiles": "fused, as first shipped (four tiles)",
            "pointer kernel": "fused, pointer loads"}
print(f"{FWD_AB.name}: the forward, of cuBLAS's speed, median of 7 rounds (range)")
print(f"{'':40}" + "".join(f"{t:>22}" for t in TOKENS))
for norm in (False, True):
    for variant, label in FORWARDS.items():
        print(f"{label + (' + QK-norm' if norm else ''):40}"
              + "".join(f"{spread(fwd[t, norm, variant], 'cublas_ms_over_ms'):>22}"
                        for t in TOKENS))
WAYS = ["fused, dY written, cuBLAS", "fused, prologues", "fused, dY written, QK-norm",
        "fused, prologues, QK-norm"]
print(f"\nforward+backward, of the unfused pipeline's speed, median of 7 rounds (range)")
for way in WAYS:
    norm = "QK-norm" in way
    print(f"{way:40}" + "".join(f"{spread(dy[t, norm, way], 'unfused_ms_over_ms'):>22}"
                                for t in TOKENS))


def of_cublas(norm, variant):
    return [round(fwd[t, norm, variant]["cublas_ms_over_ms"], 2) for t in TOKENS]


def of_unfused(way):
    return [round(dy[t, "QK-norm" in way, way]["unfused_ms_over_ms"], 2) for t in TOKENS]


# what the text says: the forward, from angles or a table, level with the unfused pipeline
# at 8192 tokens and ahead at 32768; each member's own rows 5 % slower than one tile a pair
assert of_cublas(False, "TMA, two heads") == [0.91, 0.97]
assert of_cublas(False, "table, flag") == [0.92, 0.97]
assert of_cublas(False, "unfused") == [0.92, 0.95]
four = [fwd[t, False, "table, four tiles"]["cublas_ms_over_ms"]
        / fwd[t, False, "table, flag"]["cublas_ms_over_ms"] for t in TOKENS]
assert [round(1 - r, 2) for r in four] == [0.05, 0.06]
# forward+backward: ahead at 8192 in every round, level at 32768; with QK-norm behind, then ahead
plain = dy[8192, False, WAYS[0]]
assert of_unfused(WAYS[0]) == [1.05, 0.99] and plain["low"] > 1
assert dy[32768, False, WAYS[0]]["low"] < 1 < dy[32768, False, WAYS[0]]["high"]
assert of_unfused(WAYS[2]) == [0.91, 1.03]
assert of_unfused(WAYS[1]) == [0.39, 0.39] and of_unfused(WAYS[3]) == [0.25, 0.25]
assert max(r["max_rel_diff"] for r in dy.values()) <= 2.0**-5   # all agreed with the unfused

# %% [markdown]
# ## 8. On a GPU: your kernel, live
#
# On a GPU the next cell times your epilogue kernel (the worked one if your check did not pass)
# at the benchmark's shape, against cuBLAS alone, cuBLAS + ropelib's RoPE, and `qkv_rope_linear`
# — all with `triton.testing.do_bench`, in bf16. It checks that your kernel's q, k and v equal
# `qkv_rope_linear`'s within bf16's rounding (absolute 0.1, relative 0.05). On an H100 or an
# H200, the GPUs of section 7, `qkv_rope_linear` runs the TMA forward, here from an angle
# table, which section 7's last measurement put level with cuBLAS + RoPE at this shape (0.92
# of cuBLAS's speed, both), where the pointer-loaded forward section 7 measured first was more
# than a fifth behind (25 % on the H200, 32 % on the H100; the H100's bare
# Triton GEMM alone, with no epilogue at all, was already a fifth slower than cuBLAS + RoPE).
# The cell times the two in five rounds and asserts that the median of their ratio is below
# 1.15: the bound is wide because one live timing moves by several per cent (the H200's two
# timings of cuBLAS at this shape in separate runs, `qkv_rope-nvidia-h200.csv` and
# `qkv_mainloop-nvidia-h200.csv`, differ by 4 %), and the old forward would fail it. On
# another GPU the cell only prints. On a CPU it says so and times nothing: the interpreter's
# times say nothing about a GPU.
#
# The last line reads your kernel against the three others. Its ratio to cuBLAS alone is the
# whole price of your GEMM and your epilogue together: the teaching launch uses fixed 64 × 64
# tiles and Triton's default pipelining, where `qkv_rope_linear` uses tiles measured per shape
# (`benchmarks/qkv_tiles.py`) and cuBLAS its own kernels, so most of the gap to them is the
# main loop, not the epilogue you wrote (section 7 separates the two with `triton_gemm`, the
# same Triton GEMM without a rotation). Its ratio to `qkv_rope_linear` is what those tiles are
# worth. Change the tiles in `teaching()` (`64, 64`: the rows and the hidden-size step of a
# program) and rerun to see how much.

# %%
# section 7's first measurement (the pointer-loaded forward), fused / unfused at this shape
section7 = {GPUS[slug]: measured(slug, "fused", "fwd", min(TOKENS))["ms"]
            / measured(slug, "unfused", "fwd", min(TOKENS))["ms"] for slug in GPUS}
print("section 7's fused / unfused forward at", min(TOKENS), "tokens:",
      ", ".join(f"{gpu} {ratio:.2f}" for gpu, ratio in section7.items()))
assert min(section7.values()) > 1.2                   # more than a fifth, on both GPUs
assert {gpu: round(v - 1, 2) for gpu, v in section7.items()} == {"H100": 0.32, "H200": 0.25}
# the H200's two cuBLAS timings at this shape (section 7's cell): 4 % apart, under a third of 25 %
cublas_apart = cublas_runs[min(TOKENS)][0] / cublas_runs[min(TOKENS)][1] - 1
assert round(cublas_apart, 2) == 0.04 and min(section7.values()) - 1 > 3 * cublas_apart
# the TMA forward from an angle table, section 7's last measurement: level (0.92, both)
behind = (fwd[min(TOKENS), False, "unfused"]["cublas_ms_over_ms"]
          / fwd[min(TOKENS), False, "table, flag"]["cublas_ms_over_ms"] - 1)
assert abs(behind) < 0.005 and 1 + behind < 1.15 < min(section7.values())
assert (measured("nvidia-h100-80gb-hbm3", "triton_gemm", "fwd", min(TOKENS))["ms"]
        > 1.2 * measured("nvidia-h100-80gb-hbm3", "unfused", "fwd", min(TOKENS))["ms"])
if torch.cuda.is_available():
    from triton.testing import do_bench

    r = measured("nvidia-h100-80gb-hbm3", "cublas", "fwd", min(TOKENS))   # the benchmark's shape
    M, K, HQ, HK, D = r["tokens"], r["hidden"], r["HQ"], r["HK"], r["D"]
    H = HQ + 2 * HK
    xg = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    wg = (torch.randn(H * D, K, device=device) / K ** 0.5).to(torch.bfloat16)
    freqs_g = ropelib.rope_freqs(M, D, base=500000.0, device=device)      # [M, 1, 1, D]
    cos_g = freqs_g.view(M, D)[:, :D // 2].cos().contiguous()
    sin_g = freqs_g.view(M, D)[:, :D // 2].sin().contiguous()
    pos_g = torch.arange(M, device=device)
    out_g = torch.empty(M, H, D, device=device, dtype=torch.bfloat16)
    kernel = my_qkv_rope_kernel if epilogue_ok else qkv_teaching._qkv_rope_teaching_kernel

    def teaching():
        ex.launch_forward(kernel, xg, wg, out_g, cos_g, sin_g, pos_g, HQ, HK, D, 64, 64)

    def cublas():
        return F.linear(xg, wg)

    def unfused():
        q, k, v = F.linear(xg, wg).view(1, M, H, D).split((HQ, HK, HK), dim=2)
        return ropelib.apply_rope_qk(q, k, freqs_g, layout="bshd")

    def fused():
        return ropelib.qkv_rope_linear(xg[None], wg, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                       freqs=freqs_g)

    teaching()
    q_f, k_f, v_f = fused()
    for name, mine, lib in (("q", out_g[:, :HQ], q_f[0]), ("k", out_g[:, HQ:HQ + HK], k_f[0]),
                            ("v", out_g[:, HQ + HK:], v_f[0])):
        torch.testing.assert_close(mine.float(), lib.float(), atol=0.1, rtol=0.05)
    which = "your kernel" if epilogue_ok else "the worked kernel"
    live = {}
    for name, fn in ((f"{which} (teaching GEMM + epilogue)", teaching), ("cuBLAS alone", cublas),
                     ("cuBLAS + ropelib RoPE (unfused)", unfused), ("qkv_rope_linear (fused)", fused)):
        ms = do_bench(fn, quantiles=[0.5, 0.2, 0.8])
        live[fn.__name__] = ms[0]
        print(f"{name:<40} {ms[0]:.3f} ms (p20 {ms[1]:.3f}, p80 {ms[2]:.3f})")
    gpu = torch.cuda.get_device_name()
    # one timing each moves by several per cent: the fused / unfused ratio in five rounds,
    # each timing the two one after the other, and its median
    ratios = sorted(do_bench(fused) / do_bench(unfused) for _ in range(5))
    print(f"fused / unfused here ({gpu}): {ratios[2]:.2f} (five rounds: "
          + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    # reading your kernel's line: its GEMM against cuBLAS's, and its epilogue against ropelib's
    print(f"{which} / cuBLAS alone: {live['teaching'] / live['cublas']:.2f}; "
          f"/ qkv_rope_linear: {live['teaching'] / live['fused']:.2f}; "
          f"/ cuBLAS + RoPE: {live['teaching'] / live['unfused']:.2f}")
    if torch.cuda.get_device_capability() == (9, 0) and any(g in gpu for g in ("H100", "H200")):
        assert ratios[2] < 1.15, ratios         # the TMA forward (see above)
else:
    print("No GPU here: section 7's measurements stand in for a live timing "
          "(the interpreter's times say nothing about a GPU).")

# %% [markdown]
# ## Summary
#
# - A RoPE pass after the projection reads q and k and writes them back: a copy's worth of
#   bytes, so it can only approach the copy floor. Fusing it into the projection saves that pass
#   and nothing more — measured, a small share of the pipeline.
# - A GEMM epilogue works on the finished output tile in registers before its one store. RoPE
#   needs both members of each pair in the tile: ropelib gives each program one whole head, as
#   one accumulator split into its halves in the epilogue (with partial rotary, accumulators
#   gathered from the weight rows $j$ and $j + D/2$), so the rotation is elementwise between
#   them. In a probe kernel on an H200 two accumulators take 4 to 30 % longer than one in seven
#   of eight cases and never less at ropelib's tile, and the epilogue costs nothing the probe
#   can measure.
# - The backward can apply $R(-\theta)$ in the prologue of the dX and dW GEMMs, so the gradient
#   of the projection is never written — but then every column block re-forms it, and the
#   forward+backward ran at 0.39 of the unfused pipeline's speed. Writing $dY$ once (one RoPE
#   pass backward) and handing dX and dW to cuBLAS is `qkv_rope_linear`'s default.
# - First measured on an H100 and an H200, ropelib's fused projection was correct and slower
#   than cuBLAS + RoPE: its pointer-loaded main loop trailed cuBLAS, its epilogue cost
#   registers and, on the H200, 8 to 17 % of its bare GEMM's time, and the backward's repeated
#   prologue was over half of the forward+backward gap. Profiled, that main loop waited more
#   cycles per instruction than the probe's TMA loop (dispatch stalls and a full queue of
#   global loads, from the pointer loads every thread issues).
# - On a persistent TMA main loop, two heads a tile reading one cos and one sin tile a pair,
#   the forward runs level with cuBLAS + RoPE on the H200 (from table-free angles or a
#   table), and with
#   $dY$ written once the forward+backward is faster than the unfused pipeline at 8192 tokens
#   (1.05 of its speed) and level at 32768 (0.99); with QK-norm 0.91 and 1.03.
# - Compiled for sm_90, only the rotating kernels spill (9 of the sweep's tiles, at 255
#   registers). Reading cos and sin rows took the forward's benchmark tile from 254 registers a
#   thread to 226, but two 8-warp programs share an SM only at 128 or fewer, so it still fills
#   an SM's register file alone. At the tiles the benchmarks ran, the rotating kernels hold as
#   many programs per SM as the bare ones or more, as far as the compile and the GPU runs'
#   registers tell: shared memory (for the H200's 8-warp dW, the registers) already limited
#   the bare ones. Where the TMA forward does not apply (GPUs without TMA, odd head counts,
#   partial rotary) the pointer-loaded forward serves, and `F.linear` then `apply_rope_qk` is
#   faster.
# - In a whole model it trains the same: notebook 09's GPT with `rope="ropelib_qkv"` (its
#   attention's `qkv` weights through `qkv_rope_linear`) follows the loss curve of projection
#   then RoPE from the same seed.
#
# ## Questions for a study group
#
# 1. Section 1 bounds the gain by the RoPE pass. With QK-norm the unfused pipeline's second
#    pass also norms; does the bound change? Count its bytes.
# 2. With partial rotary the kernel gathers two or three accumulators, each reading the $X$ tile
#    from shared memory in every K step. Sketch
#    the permuted-weight alternative: what would `QKVRoPE.from_linear` have to store, and what
#    would the optimizer see?
# 3. The dW kernel re-forms $dY$ for each of $K/B_K$ column blocks. What is the least extra
#    memory traffic that forms it once, and how does it compare with the traffic the fusion
#    saved in the forward?
# 4. Interleaved pairs $(2j, 2j+1)$ sit next to each other in a column tile. Would an
#    interleaved model need one head per program? What would the store look like?
