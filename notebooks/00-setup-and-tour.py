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
# # 00 — Setup and a one-minute tour of `ropelib`
#
# `ropelib` teaches rotary position embedding (RoPE), from the RoFormer math to Triton kernels,
# and ships those kernels as a library. RoPE does little arithmetic for each byte it moves, so a
# kernel is judged against a plain copy of the same bytes. On large tensors ropelib comes close
# to a copy's speed (notebook 05). Small tensors cannot hide the fixed cost of a call, and
# ropelib's is larger than a copy's: on a decoding step its call takes 2.7 times as long as
# torch's copy of the same bytes, 13 µs more, nearly all of it on ropelib's own host and launch
# path (notebook 07 splits it). Section 3 counts the arithmetic per byte and reads both claims off the committed
# H200 measurements.
# Every notebook runs on a CUDA GPU (full sizes) and on a plain CPU, where Triton's
# *interpreter* executes the same kernels in Python (small sizes, chosen automatically).
#
# **After this notebook you will be able to**
#
# - tell what is installed (PyTorch, Triton, Transformer Engine, transformers) and whether the
#   kernels run compiled on a GPU or in the interpreter;
# - switch interpreter mode on (and off) the right way;
# - call `ropelib.apply_rope`, the `RotaryEmbedding` module and the Transformer Engine / Hugging
#   Face drop-ins, forward and backward;
# - say why a RoPE kernel is measured against a copy of the same bytes, read "% of a copy", and
#   work out a call's TB/s and TFLOP/s;
# - find your way through the other notebooks.
#
# **Time:** about 30 minutes to read and do the three exercises; the cells take seconds, on a
# GPU and in Triton's interpreter on a CPU alike.

# %% [markdown]
# Every notebook starts with this cell. It must run **before** `ropelib` is imported: Triton
# decides how to run a `@triton.jit` function when the module defining it is imported, and it
# reads `TRITON_INTERPRET` at that moment.

# %%
import os, torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before ropelib (and its @triton.jit)
import ropelib
device = ropelib.default_device()

# %% [markdown]
# ## 1. What is installed

# %%
import importlib.metadata
import platform
import subprocess
import sys


def version(*dists):
    """The installed version of the first distribution found, or None."""
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


GPU = device == "cuda"
info = {
    "python": platform.python_version(),
    "torch": torch.__version__,
    "triton": version("triton", "pytorch-triton"),
    "transformer_engine": version("transformer_engine", "transformer-engine",
                                  "transformer_engine_torch") or "not installed (optional)",
    "transformers": version("transformers") or "not installed (optional)",
    "ropelib": ropelib.__version__,
    "CUDA available": torch.cuda.is_available(),
    "GPU": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
    "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "unset"),
    "kernels run": ropelib.runtime.mode(),
    "notebook device": device,
}
width = max(map(len, info))
for key, value in info.items():
    print(f"{key:>{width}} : {value}")
assert ropelib.INTERPRET == (os.environ.get("TRITON_INTERPRET") == "1")
assert GPU == ropelib.on_gpu()

# %% [markdown]
# Transformer Engine and transformers are optional: notebooks that compare against them use the
# real package when it is there and say so when it is not (`ropelib.reference` carries faithful
# copies of the code paths we compare with, so nothing breaks).

# %% [markdown]
# ## 2. Interpreter mode: how to switch it on and off
#
# - **The interpreter on a machine without a GPU:** nothing to do; the first cell sets
#   `TRITON_INTERPRET=1`.
# - **The interpreter on a GPU machine** (to debug a kernel with `print`): start with
#   `TRITON_INTERPRET=1 jupyter lab`, or put `os.environ["TRITON_INTERPRET"] = "1"` at the top
#   of the first cell, then **restart the kernel**.
# - **Compiled kernels again:** remove the variable and **restart the kernel**.
#
# Setting the variable after `import ropelib` changes nothing — the kernels were already set up.
# In interpreter mode the tensors live on the CPU; ropelib refuses a CUDA tensor there, and a
# CPU tensor without the interpreter, with a `ValueError` that names the tensor and says what
# to do.
#
# The mode is decided per process, so the next cell starts a fresh Python process with the
# opposite setting, prints its mode and hands it a tensor on the device that mode refuses: a
# CUDA tensor on a GPU machine (the other process interprets), a CPU tensor on a machine
# without one (the other process does not). Each machine shows one of the two refusals:

# %%
env = dict(os.environ)
if env.get("TRITON_INTERPRET") == "1":
    env.pop("TRITON_INTERPRET")
else:
    env["TRITON_INTERPRET"] = "1"
flipped = """
import torch, ropelib
print(ropelib.runtime.mode())
refused = "cuda" if ropelib.INTERPRET else "cpu"     # the device this mode's kernels cannot use
x = torch.randn(4, 1, 2, 8, device=refused)          # [S, B, H, D]
try:
    ropelib.apply_rope(x, ropelib.frequencies.rope_freqs(4, 8, device=refused))
    print("no error")
except ValueError as e:
    print("ValueError:", e)
"""
other = subprocess.run([sys.executable, "-c", flipped], env=env, capture_output=True, text=True,
                       timeout=120)
assert other.returncode == 0, other.stderr[-300:]
other_mode, refusal = other.stdout.strip().split("\n")
print("this kernel :", ropelib.runtime.mode())
print("other process (TRITON_INTERPRET flipped):", other_mode)
print("  handed a tensor it cannot run ->", refusal)
assert refusal.startswith("ValueError: x "), refusal  # the error names the argument, `x`
assert "TRITON_INTERPRET" in refusal                 # and says which setting to change

# %% [markdown]
# ## 3. The one-minute tour
#
# RoPE turns each pair of features of a query or key at position $m$ by an angle that grows
# with $m$. With the rotate-half pairing (GPT-NeoX, Llama, Transformer Engine) feature $j$ turns
# with feature $j + D/2$, for $j < D/2$:
#
# $$
# \begin{aligned}
# y_j &= x_j \cos\theta_{m,j} - x_{j+D/2} \sin\theta_{m,j}, \\
# y_{j+D/2} &= x_{j+D/2} \cos\theta_{m,j} + x_j \sin\theta_{m,j},
# \end{aligned}
# \qquad \theta_{m,j} = m\, b^{-2j/D},\ b = 10000 .
# $$
#
# RoPE therefore needs an **angle table** of the $\theta_{m,j}$ — `ropelib.frequencies` builds
# it the way Transformer Engine does, `[positions, 1, 1, rotary_dim]` in fp32, each angle
# written twice (for $j$ and $j + D/2$; the cell asserts it) — and the tensor to rotate, here in
# `sbhd` = `[seq, batch, heads, head_dim]`. Sizes are small in the interpreter (each kernel
# program is simulated in Python) and realistic on a GPU; change them, or the dtype, and rerun.

# %%
from ropelib import frequencies, reference

S, B, H, D = (2048, 4, 16, 128) if GPU else (12, 2, 4, 32)
dtype = torch.bfloat16
torch.manual_seed(0)

freqs = frequencies.rope_freqs(S, D, device=device)                 # [S, 1, 1, D] fp32 angles
assert torch.equal(freqs[..., : D // 2], freqs[..., D // 2 :])      # each angle twice: j, j + D/2
x = torch.randn(S, B, H, D, device=device, dtype=dtype)            # [S, B, H, D]

y = ropelib.apply_rope(x, freqs)                                    # the finished Triton kernel
torch.testing.assert_close(y, reference.rope_reference(x, freqs))   # fp64 reference, rounded once
print("apply_rope:", tuple(x.shape), x.dtype, "->", tuple(y.shape), y.dtype,
      "| matches the reference")

# %% [markdown]
# The same call covers the other layouts and features, by keyword: `layout="bshd"` or `"thd"`
# (with `cu_seqlens`), `interleaved=True`, a partial table (`rotary_percent < 1`),
# `start_positions` / `position_ids`, `cp_size` / `cp_rank`, a `cos=`/`sin=` cache instead of
# angles, and `inplace=True`. Notebook 02 goes through the layouts, the two kinds of table,
# partial rotary, position offsets and context parallelism, notebook 01 through the two
# pairings; `docs/API.md` describes every keyword.
#
# `apply_rope` chooses how to run each call. Most calls run the finished kernel of notebook 05.
# Large contiguous tensors, from 64 MiB of `x` on, take a two-pass route: a pre-pass writes a
# table of each token's cos and sine, then a flat pass rotates the whole tensor (notebook 05,
# section 6). The tour's tensors stay below that size (the last cell of this section prints
# both).
#
# It is differentiable. A rotation is orthogonal, $R(\theta)^{\top} = R(-\theta)$, so the
# backward of a rotation by $\theta$ is the rotation by $-\theta$ (notebook 06 derives it), and
# the same kernel computes it:

# %%
x.requires_grad_(True)
y = ropelib.apply_rope(x, freqs)
dy = torch.randn_like(y)
y.backward(dy)
dy_back = ropelib.apply_rope(dy, -freqs)                            # dy rotated by -theta
torch.testing.assert_close(x.grad, dy_back)
x.requires_grad_(False)
print(f"x.grad vs dy rotated by -theta: largest difference "
      f"{(x.grad.float() - dy_back.float()).abs().max().item():g}")

# %% [markdown]
# ### `RotaryEmbedding`: the module for a model
#
# It owns the angle table and rotates queries and keys in one launch (the cell counts it: the
# CUDA kernels a call runs on a GPU, the Triton launches in the interpreter); with grouped-query
# attention the key may have fewer heads than the query. Its default layout is `bshd`. The
# table covers `max_seq_len` positions and doubles when a longer sequence arrives: the cell
# starts it at half the tour's length and prints its length before and after the call. Only
# the shape grows it: positions passed as `start_positions` or `position_ids` are not read
# (that would wait for the GPU), so a decoder sets `max_seq_len` to its KV cache's length. A
# position past the table gives a row of NaN, not an error: the cell's last lines decode one
# token per sequence, sequence $b$ at position $b \cdot S$, from a table of $S$ positions.
# (Positions in CPU memory are checked by default and raise a `ValueError`;
# `ropelib.set_index_checks` chooses.)

# %%
from ropelib.course.counts import count_kernels, interpreted_launches

kv_heads = H // 2
q = torch.randn(B, S, H, D, device=device, dtype=dtype)            # [B, S, H, D]
k = torch.randn(B, S, kv_heads, D, device=device, dtype=dtype)     # [B, S, H_kv, D]
rope = ropelib.RotaryEmbedding(D, base=10000.0, layout="bshd", max_seq_len=S // 2).to(device)
length_before = rope.table_length()
q_rot, k_rot = rope(q, k)
torch.testing.assert_close(q_rot, ropelib.apply_rope(q, freqs, layout="bshd"))
torch.testing.assert_close(k_rot, ropelib.apply_rope(k, freqs, layout="bshd"))
print("RotaryEmbedding:", tuple(q_rot.shape), tuple(k_rot.shape),
      f"| table: {length_before} positions, then {rope.table_length()} for S = {S}")
assert length_before == S // 2 and rope.table_length() == S       # doubled to cover S

if GPU:                                           # one more call: the CUDA kernels it runs
    kernels = count_kernels(lambda: rope(q, k)).cuda
else:                                             # the Triton launches the interpreter runs
    with interpreted_launches() as kernels:
        rope(q, k)
print(f"one call, q and k: {len(kernels)} {'CUDA kernel' if GPU else 'Triton launch'} {kernels}")
assert len(kernels) == 1 and kernels[0].startswith("_rope"), kernels

starts = torch.arange(B, device=device) * S                       # sequence b at position b*S
with ropelib.set_index_checks("off"):                              # as a GPU's positions: unread
    q_far = rope(q[:, :1], start_positions=starts)                 # one token per sequence
nan_rows = q_far.isnan().flatten(1).all(dim=1).tolist()
print(f"table of {rope.table_length()} positions, starts {starts.tolist()}: "
      f"all-NaN rows {nan_rows}")
assert rope.table_length() == S and nan_rows == [False] + [True] * (B - 1)

# %% [markdown]
# ### Drop-ins: swap one import
#
# `ropelib.te.apply_rotary_pos_emb` has Transformer Engine 2.x's signature and defaults;
# `fused=True` runs ropelib's kernel, `fused=False` the plain PyTorch path.
# `ropelib.hf.apply_rotary_pos_emb` has Hugging Face's signature and semantics (queries and keys
# `[B, H, S, D]`, a cos/sin cache `[B, S, D]`), but computes in fp32 and rounds once, where
# Hugging Face's code rounds each multiply and the add to bf16; the cell measures that
# difference against transformers' own function where it is installed.

# %%
from ropelib import hf as rope_hf
from ropelib import te as rope_te
from ropelib.bench.compare import error_metrics

t = torch.randn(S, B, H, D, device=device, dtype=dtype)
fused = rope_te.apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=True)
unfused = rope_te.apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=False)
# fused=True: fp32 math, one rounding (what TE's CUDA kernel computes);
# fused=False: TE's PyTorch code, op for op (cos/sin and the products rounded to bf16)
torch.testing.assert_close(fused, reference.te_fused_emulation(t, freqs))
assert torch.equal(unfused, reference.te_unfused(t, freqs))
# unfused measured against fused, in bf16 ulps of the largest |value| of each head vector
gap = error_metrics(unfused, fused.double())
print(f"TE drop-in: fused vs unfused differ by up to {gap['max_abs_err']:g} in value, "
      f"{gap['max_head_ulp_err']:g} bf16 ulp(s) of the head's largest value, "
      f"{gap['max_ulp_err']:g} ulps of the value itself")
assert gap["max_head_ulp_err"] <= 2
assert gap["max_ulp_err"] > 10 * gap["max_head_ulp_err"]     # near zero, its own ulps are fine

cos, sin = frequencies.rope_cos_sin(S, D, dtype=dtype, device=device)      # [S, D] HF cache
q_bhsd, k_bhsd = q.transpose(1, 2), k.transpose(1, 2)                      # [B, H, S, D]
q_hf, k_hf = rope_hf.apply_rotary_pos_emb(q_bhsd, k_bhsd, cos[None], sin[None])
# HF's formula, q * cos + rotate_half(q) * sin, in fp32 and rounded once:
qf = q_bhsd.float()
expected_q = (qf * cos.float() + reference.rotate_half(qf) * sin.float()).to(dtype)
kf = k_bhsd.float()
expected_k = (kf * cos.float() + reference.rotate_half(kf) * sin.float()).to(dtype)
torch.testing.assert_close(q_hf, expected_q)
torch.testing.assert_close(k_hf, expected_k)
# Hugging Face's own code: the same formula, each multiply and the add rounded to bf16
hf_q = q_bhsd * cos + reference.rotate_half(q_bhsd) * sin
if version("transformers"):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
    assert torch.equal(hf_apply(q_bhsd, k_bhsd, cos[None], sin[None])[0], hf_q)
    hf_source = f"transformers {version('transformers')}"
else:
    hf_source = "HF's formula op for op (transformers is not installed)"
hf_gap = error_metrics(hf_q, q_hf.double())
hf_share = (hf_q != q_hf).float().mean().item()
print("HF drop-in:", tuple(q_hf.shape), tuple(k_hf.shape), f"| against {hf_source}: "
      f"{hf_share:.0%} of q's outputs differ, by up to {hf_gap['max_head_ulp_err']:g} bf16 "
      f"ulp(s) of the head's largest value")
assert 0 < hf_share < 1 and hf_gap["max_head_ulp_err"] <= 2

# %% [markdown]
# The two TE paths differ by at most two bf16 ulps, where an ulp is the gap between neighbouring
# bf16 numbers at the largest value of the head vector (the cell asserts the bound). That is the
# fair unit: an output near zero is what is left after $x_j\cos\theta - x_{j+D/2}\sin\theta$
# cancels values as large as the head's largest, so its own, much finer ulps overstate the
# error; counted in them, the same difference is more than ten times larger (printed last on the
# TE line, and asserted). Hugging Face's bf16 arithmetic and the HF drop-in differ within the
# same bound (the HF line, asserted). Notebook 08 shows how this difference makes
# `torch.allclose` fail between two correct implementations.

# %% [markdown]
# ### What a call costs: bytes, not arithmetic
#
# For each element it rotates, the kernel multiplies twice and adds once,
# $y_j = x_j\cos\theta_{m,j} - x_{j+D/2}\sin\theta_{m,j}$: 3 FLOPs. It also reads the element
# and writes it back, 4 bytes in bf16, and reads the fp32 angle table, which every batch entry
# and head share. (The sines and cosines are not in the 3 FLOPs. ropelib evaluates them with
# libdevice's `sinf`/`cosf`, polynomials on the same fp32 units, per token and pair in each
# program (a few copies across its threads, which notebook 05 counts), reused by the batch
# entries and heads the program covers; on large tensors a pre-pass evaluates them once per
# token and pair, one sine and cosine per $2BH$ elements. The cell reads both facts off the
# committed H200 data, and tags each line with the route that produced it.) Its *arithmetic intensity*, FLOPs per byte, is therefore below one. A
# bf16 matrix multiply of two $n \times n$ matrices does $2n^3$ FLOPs on $3 \cdot 2n^2$ bytes,
# $n/3$ FLOPs per byte: over a thousand at $n = 4096$. A GPU that is fast enough for the matrix
# multiply waits on memory for RoPE, so the fair yardstick for a RoPE kernel is the time a copy
# of the same bytes takes. "% of a copy" is the copy's time over the
# kernel's, a share of the copy's speed, in every notebook; some print it in percent, others
# (the cell below among them) as a fraction: 0.99 of a copy is 99 %.
#
# The cell computes RoPE's intensity for the tour's `x` and the matrix multiply's, reads the
# H200's profile by opcode of notebook 05's kernels (`ladder_opcodes_per_opcode-nvidia-h200.csv`:
# no `MUFU`, the special-function unit's instruction, in rungs 4 to 6, which evaluate sin/cos
# in every program; exactly one per warp in ropelib's finished kernel, the reciprocal that an
# integer division in its indexing starts from, not a sine or cosine), then reads the committed
# H200 run of the floor suite (`benchmarks/results/floor-nvidia-h200.csv`): a forward pass over
# 1 GiB, and the forward of one decoding step (1 token × 64 sequences × 32 heads × 128
# features), timed on the host's clock as an eager call is, and again replayed from a CUDA
# graph.

# %%
import math

import matplotlib.pyplot as plt

import csv
import re

from ropelib.bench import compare
from ropelib.bench import floor as floor_suite
from ropelib.bench.compare import bytes_moved
from ropelib.course import measured
from ropelib.kernels import tiles

x_bytes = x.numel() * x.element_size()
rope_flops = 3 * x.numel()                                      # 2 multiplies + 1 add a feature
rope_bytes = 2 * x_bytes + freqs.numel() * freqs.element_size()  # x in, y out, the table
n = 4096
gemm_intensity = 2 * n**3 / (3 * n * n * 2)                     # C = A @ B in bf16
print(f"RoPE of x {tuple(x.shape)}: {rope_flops / rope_bytes:.2f} FLOP/byte; "
      f"a {n}x{n} bf16 matmul: {gemm_intensity:.0f} FLOP/byte")
assert rope_flops / rope_bytes < 1 and gemm_intensity > 1000

print(f"two-pass route from {tiles.TWO_PASS_MIN_BYTES >> 20} MiB of x; "
      f"the tour's x: {x_bytes / 2**20:.2f} MiB (the finished kernel)")
assert tiles.TWO_PASS_MIN_BYTES == 64 << 20 and x_bytes < tiles.TWO_PASS_MIN_BYTES

OPCODES = measured.RESULTS / "ladder_opcodes_per_opcode-nvidia-h200.csv"
if OPCODES.is_file():        # warp instructions by opcode: rungs 4, 5, 6 of 05's ladder, ropelib
    ops = [k["instances"]["sass__inst_executed_per_opcode"] for k in measured.ncu_kernels(OPCODES)]
    fin = next(r for r in csv.DictReader(compare.ncu_table(OPCODES.read_text())) if r["ID"] == "3")
    size = lambda text: math.prod(int(v) for v in re.findall(r"\d+", text))   # noqa: E731
    warps = size(fin["Grid Size"]) * size(fin["Block Size"]) // 32    # the finished kernel's launch
    print("sin/cos on the H200 (05's opcode profile; the finished kernel forced at s=4096, b=8): "
          "MUFU " + " / ".join(f"{o.get('MUFU', 0):,.0f}" for o in ops) + ", FFMA "
          + " / ".join(f"{o['FFMA'] / 1e6:.1f} M" for o in ops)
          + f"; the finished kernel's launch: {warps:,} warps")
    assert len(ops) == 4 and all("MUFU" not in o for o in ops[:3])   # polynomials: fp32 units
    assert fin["Kernel Name"] == "_rope_kernel" and ops[3]["MUFU"] == warps   # one per warp

if measured.path("floor").is_file():
    floor_meta, _ = measured.load("floor")
    floor = measured.floor()
    configs = {case.name: case.config for case in floor_suite.rope_cases()}
    step_shape = configs["sbhd"]                   # the decoding step the text describes
    assert (step_shape.seq_len, step_shape.batch, step_shape.heads, step_shape.head_dim,
            step_shape.dtype) == (1, 64, 32, 128, "bf16")
    # label -> (the CSV's case, the suite's shape for it, the part of the run that measured it)
    rows = {"forward, 1 GiB of x": ("forward 1 GiB bf16 sbhd", configs["1 GiB bf16 sbhd"],
                                    "1 GiB bf16 sbhd"),
            "forward, one decoding step": ("decode host forward sbhd", configs["sbhd"],
                                           "decode sbhd"),
            "the same, CUDA graph replay": ("decode forward sbhd under CUDA graphs",
                                            configs["sbhd"], "decode sbhd")}
    print(f"measured on {measured.where(floor_meta)}:")
    for label, (case, config, part) in rows.items():
        copy, rope = floor[case]["copy"], floor[case]["ropelib"]
        print(f"  {label:27s} {bytes_moved(config) / 2**20:6.0f} MiB moved   "
              f"copy {copy['ms'] * 1e3:6.1f} µs   ropelib {rope['ms'] * 1e3:6.1f} µs   "
              f"= {rope['ratio_to_copy']:.2f} of a copy   "
              f"({measured.floor_run_date(floor_meta, part)[:16].replace('T', ' ')})")
    large, step = floor["forward 1 GiB bf16 sbhd"], floor["decode host forward sbhd"]
    graph = floor["decode forward sbhd under CUDA graphs"]
    x_mib = {c: configs[c].seq_len * configs[c].batch * configs[c].heads * configs[c].head_dim
             * 2 / 2**20 for c in ("1 GiB bf16 sbhd", "sbhd")}              # x alone, bf16
    print(f"  routes: the 1 GiB line's x ({x_mib['1 GiB bf16 sbhd']:.0f} MiB) is over "
          f"{tiles.TWO_PASS_MIN_BYTES >> 20} MiB: two-pass, a pre-pass then the flat pass; the "
          f"decoding step's ({x_mib['sbhd']:.1f} MiB): the finished kernel")
    assert x_mib["1 GiB bf16 sbhd"] * 2**20 >= tiles.TWO_PASS_MIN_BYTES > x_mib["sbhd"] * 2**20
    assert large["ropelib"]["ratio_to_copy"] > 0.95                 # within 5 % of a copy's speed
    assert step["copy"]["ms"] * 1e3 > 5                              # 1 MiB, yet microseconds
    assert step["ropelib"]["ratio_to_copy"] < 0.5                    # the fixed cost dominates
    # what the text below reads off these lines
    fewer = bytes_moved(configs["1 GiB bf16 sbhd"]) / bytes_moved(configs["sbhd"])
    assert 0.4 < large["copy"]["ms"] < 0.6                           # half a millisecond
    assert 1500 < fewer < 2500 and round(step["ropelib"]["ms"] / step["copy"]["ms"], 1) == 2.7
    assert round(step["ropelib"]["ratio_to_copy"], 2) == 0.37
    # memory-bound or not: the 1 GiB line's bytes per second against the H200's memory, and its
    # FLOPs per second against the H200's fp32 units. Peaks of the H200 SXM (the NVL board calls
    # itself "NVIDIA H200 NVL"): NVIDIA's 4.8 TB/s, and 132 SMs x 128 fp32 lanes x 2 FLOPs an
    # fma x 1.98 GHz boost
    assert floor_meta["gpu"] == "NVIDIA H200"
    HBM_TB_S, FP32_TFLOP_S = 4.8, 132 * 128 * 2 * 1.98e9 / 1e12
    big = configs["1 GiB bf16 sbhd"]
    big_bytes = bytes_moved(big)
    big_elements = big.seq_len * big.batch * big.heads * big.head_dim
    assert big_bytes == 2 * 2 * big_elements + big.seq_len * big.head_dim * 4   # x, y, table
    sin_cos_every = big_elements // (big.seq_len * big.head_dim // 2)   # elements per pair
    assert sin_cos_every == 2 * big.batch * big.heads == 512 and round(FP32_TFLOP_S) == 67
    tb_s = {p: big_bytes / (large[p]["ms"] * 1e-3) / 1e12 for p in ("copy", "ropelib")}
    rope_tflop_s = 3 * big_elements / (large["ropelib"]["ms"] * 1e-3) / 1e12
    print(f"  1 GiB line: copy {tb_s['copy']:.2f} TB/s, ropelib {tb_s['ropelib']:.2f} TB/s "
          f"({tb_s['ropelib'] / HBM_TB_S:.0%} of the H200's {HBM_TB_S} TB/s); ropelib's "
          f"arithmetic {rope_tflop_s:.1f} TFLOP/s ({rope_tflop_s / FP32_TFLOP_S:.0%} of "
          f"{FP32_TFLOP_S:.0f} fp32 TFLOP/s); its pre-pass: one sine and cosine per "
          f"{sin_cos_every} elements")
    assert all(0.85 < v / HBM_TB_S < 0.95 for v in tb_s.values())    # the memory: near its peak
    assert [round(v, 1) for v in tb_s.values()] == [4.3, 4.3]
    assert rope_tflop_s / FP32_TFLOP_S < 0.06                        # the arithmetic: idle
    step_stream_us = large["copy"]["ms"] * 1e3 / fewer   # the step's bytes at the 1 GiB line's rate
    print(f"  one decoding step's bytes streamed at the 1 GiB copy's rate: "
          f"{step_stream_us:.2f} µs")
    assert step_stream_us < 0.5
    # the same step replayed from a CUDA graph: the host's and the launch path's work gone
    host_us = {p: step[p]["ms"] * 1e3 for p in ("copy", "ropelib")}
    device_us = {p: graph[p]["ms"] * 1e3 for p in ("copy", "ropelib")}
    assert "calls captured per CUDA graph: 100" in floor_meta["graph_rows"]   # per replayed call
    assert round(device_us["copy"], 1) == 1.4 and round(device_us["ropelib"], 1) == 2.0
    assert all(device_us[p] < 0.25 * host_us[p] for p in host_us)   # most of a call: gone
    gap_host = host_us["ropelib"] - host_us["copy"]
    gap_device = device_us["ropelib"] - device_us["copy"]
    assert gap_device < 0.1 * gap_host                 # and most of ropelib's gap to the copy
    assert device_us["copy"] > 1                       # the device's share: over a microsecond
    print(f"  of ropelib's {gap_host:.1f} µs more than the copy eagerly, "
          f"{gap_device:.1f} µs are left under the graph")
    assert round(gap_host, 1) == 13.1 and round(gap_device, 1) == 0.5    # what the text reads
    # the launch against the 1 GiB call: the step's whole device time under the graph
    big_us = large["ropelib"]["ms"] * 1e3
    launch_share = device_us["ropelib"] / big_us
    print(f"  ropelib's step under the graph, {device_us['ropelib']:.1f} µs, against its 1 GiB "
          f"call's {big_us:.0f} µs: {launch_share:.1%}")
    assert round(big_us) == 506 and round(100 * launch_share, 1) == 0.4

    # the figure: the three lines' times, and the time their bytes need at the 1 GiB copy's rate
    labels = list(rows)
    copy_us = [floor[rows[lb][0]]["copy"]["ms"] * 1e3 for lb in labels]
    rope_us = [floor[rows[lb][0]]["ropelib"]["ms"] * 1e3 for lb in labels]
    bytes_us = [bytes_moved(rows[lb][1]) / (big_bytes / (large["copy"]["ms"] * 1e-3)) * 1e6
                for lb in labels]
    assert rope_us[0] == big_us and copy_us[2] == device_us["copy"]     # what the text reads
    assert rope_us[2] == device_us["ropelib"] and rope_us[1] == host_us["ropelib"]
    assert math.isclose(bytes_us[1], step_stream_us, rel_tol=1e-9)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    at = range(len(labels))
    ax.bar([i - 0.2 for i in at], copy_us, 0.4, label="copy of the same bytes", color="0.6")
    ax.bar([i + 0.2 for i in at], rope_us, 0.4, label="ropelib", color="C0")
    ax.scatter(at, bytes_us, marker="_", s=900, color="C3", zorder=3,
               label=f"the bytes alone, at {tb_s['copy']:.1f} TB/s")
    ax.set_yscale("log")
    ax.set_xticks(list(at), ["1 GiB of x, eager", "one decoding step, eager",
                             "the same step,\nCUDA graph replay"])
    ax.set_ylabel("time per call (µs, log scale)")
    ax.set_title(f"Bytes set the time of a large call, a fixed cost that of a small one\n"
                 f"{measured.where(floor_meta)}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(ropelib.runtime.figures_dir() / "00-cost-of-a-call.png", dpi=120)
    plt.show()
else:
    print("ropelib is installed without its benchmarks/results/ folder: nothing to read")

# %% [markdown]
# On 1 GiB the call runs within 5 % of a copy's speed (the printed ratio), and both are limited by
# memory, as the "1 GiB line" below the table shows: both move their bytes at 4.3 TB/s, between
# 85 % and 95 % of the 4.8 TB/s NVIDIA gives for the H200 SXM's memory, while RoPE's multiplies
# and adds keep the fp32 units below 6 % of their peak (67 TFLOP/s; the sines and cosines are left
# out, one of each per 512 elements in this route's pre-pass, printed). The figure shows it: on
# 1 GiB both bars sit on the time the bytes need; on a decoding step they stand far above it. At
# 1 GiB a launch hardly counts: a whole decoding step of ropelib, replayed from a CUDA graph (the
# third line), costs the device 2.0 µs, 0.4 % of the 506 µs its 1 GiB call takes (printed last).
# One decoding step moves about two thousand times fewer bytes, which at the 1 GiB line's rate
# would stream in under half a microsecond (printed); yet even the copy takes microseconds, and
# ropelib's call takes 2.7 times the copy's time: 0.37 of a copy.
#
# The third line says where that time goes. A CUDA graph records the launches once and replays
# them without the host's part of each call (Python, PyTorch's dispatcher, the launch code).
# Replayed so, 100 calls to a graph and the replay's time divided by 100, the same step takes
# 1.4 µs for the copy and 2.0 µs for ropelib. Most of an eager call's time is therefore work
# that a CUDA graph takes away (on the host and on the launch path). Of the 13.1 µs by which
# ropelib's eager call exceeds the copy's, 0.5 µs are left under the graph (the line before
# last): the rest is ropelib's own call path (its Python code and Triton's launcher), not a
# cost every kernel pays. No faster kernel removes it; a leaner launch path would. The
# device's share is still over a microsecond, more than the bytes need: a launch costs
# something there too.
# How the host's share splits between Python, the dispatcher and the launch is not measured
# here. Notebook 07 measures both regimes live, fits the fixed cost (section 6), splits it
# between host and device (section 7) and shows what CUDA graphs do to it.

# %% [markdown]
# ## 4. Where to go next
#
# - [00 — Setup and a one-minute tour of `ropelib`](00-setup-and-tour.ipynb) (this notebook): what
#   is installed, compiled or interpreter mode, the API in one minute.
# - [01 — The RoFormer math: rotations that encode relative position](01-roformer-math.ipynb): the
#   2-D rotation and $R_m$, the complex view, scores that depend only on $m - n$, the frequency
#   spectrum and the context-extension scalings, long-term decay, the two pairings.
# - [02 — The PyTorch reference, the layouts, and why unfused RoPE is slow](02-pytorch-reference-and-layouts.ipynb):
#   `sbhd` / `bshd` / `thd`, TE's angles vs HF's cos/sin cache, partial rotary, position offsets,
#   context-parallel positions, and the kernels and bytes of the unfused version.
# - [03 — A naive Triton kernel for RoPE](03-naive-triton-kernel.ipynb): programs and grids, masks
#   and strides, `BLOCK_SIZE` vs `num_warps`, the 32-byte sectors a launch touches, debugging in the
#   interpreter, checking against the reference.
# - [04 — The batch-reusing grid kernel](04-batch-reuse-grid-kernel.ipynb): a grid that gives
#   each program the whole batch, a bytes-moved model, GB/s and % of a copy, and an ablation
#   that asks which of the grid's savings is worth time.
# - [05 — The finished kernel, one idea at a time](05-finished-kernel.ipynb): a floor under the
#   tile from Little's law, a ladder of kernels up to ropelib's, the layout Triton gives a tile,
#   the two-pass route `apply_rope` takes on large tensors, load order in the SASS, three kernels
#   of your own.
# - [06 — The backward pass](06-backward-pass.ipynb): rotation by $-\theta$, one kernel for both
#   directions, `autograd.Function`, `gradcheck` in float64, stride-0 gradients.
# - [07 — Transformer Engine vs Triton, live](07-te-vs-triton-live.ipynb): every provider on the
#   same inputs, errors in ulps, % of a copy, the dashboard, the sweeps, fixed cost vs bandwidth,
#   your own copy-and-rotate kernel in the race.
# - [08 — Debugging the `allclose` that failed](08-debugging-allclose.ipynb): why two correct
#   kernels fail `torch.allclose`, tolerances and ulps, matching TE bit for bit, six layout traps.
# - [09 — ropelib inside a real model: training parity, speed, and drop-in use](09-rope-in-a-model.ipynb):
#   a small GPT trained with and without ropelib, tokens/s and RoPE's share of a step, decoding
#   with a KV cache, the Hugging Face and TE drop-ins.
# - [10 — Multi-axis RoPE: M-RoPE for images and video, 2-D and 3-D axial RoPE](10-multi-axis-rope.ipynb):
#   Qwen2-VL / Qwen3-VL sections, image and video positions, axial RoPE, a multi-axis kernel of
#   your own that forms each token's angles once.
# - [11 — RoPE at scale: context parallelism, and decoding with the fused cache write](11-rope-at-scale.ipynb):
#   the dual-chunk split, RoPE at global positions, two-process training, RoPE fused into the
#   KV-cache write (contiguous, paged, fp8) with the contiguous and paged kernels written by you,
#   and the kernels one decoding step launches.
# - [12 — RoPE in the QKV projection: a GEMM epilogue, and a prologue for the backward](12-rope-in-the-qkv-projection.ipynb):
#   what fusing can save at most, the epilogue and the backward's prologue written by you, the
#   shipped projection measured against cuBLAS followed by a RoPE pass, and a slow fused kernel
#   traced to its causes.
# - [13 — RoPE puzzles](13-rope-puzzles.ipynb): eleven short kernels to write or repair, checked
#   at once in the interpreter. After a warm-up, most are built on a kind of bug that RoPE code
#   has shipped with.

# %%
from pathlib import Path

notebooks = Path(ropelib.__file__).resolve().parents[1] / "notebooks"   # the checkout's copy
if (notebooks / "13-rope-puzzles.py").is_file():
    puzzles = (notebooks / "13-rope-puzzles.py").read_text(encoding="utf-8").count("# ## Puzzle ")
    assert puzzles == 11, puzzles                        # "eleven short kernels"
    print(f"notebook 13 has {puzzles} puzzles")
else:
    print("ropelib is installed without its notebooks/ folder: nothing to count")

# %% [markdown]
# ## Exercises
#
# Each check prints ✅ or ❌ at once and never stops the notebook. Replace the `...` and rerun.
# Solutions are folded below each exercise. (The `;` after a check only stops Jupyter from
# echoing its `True`/`False`.)
#
# **Exercise 1.** Section 3 judged the 1 GiB call by two rates. Write
# `my_rates(seq_len, batch, heads, head_dim, bytes_per_element, ms)` that returns
# `(tb_s, tflop_s)` for a RoPE forward of one `sbhd` tensor that took `ms` milliseconds: its
# bytes are `x` read and `y` written plus the fp32 angle table `[seq_len, head_dim]` read once,
# its FLOPs 3 an element. The check tries the committed H200 run's 1 GiB line and decoding
# step, and two calls drawn as it runs, with `ropelib.bench` (its bytes model is the answer)
# and the reader of the committed results barred. Then the share of the H200's 4.8 TB/s is one
# division: is the decoding step memory-bound? (Once your rates pass, the check prints it.)

# %%
from ropelib.course.exercises import basics, solution


def my_rates(seq_len, batch, heads, head_dim, bytes_per_element, ms):
    ...   # your code: (TB/s, TFLOP/s)


basics.check_call_rates(my_rates);

# %%
solution(basics.solution_call_rates)

# %% [markdown]
# **Exercise 2.** A model has `head_dim = 80` and `rotary_percent = 0.5` (partial rotary). How
# many features of each head does RoPE rotate? Write the rule that Transformer Engine and
# Hugging Face both follow, `my_rotary_dim(head_dim, rotary_percent)`. The check tries this model
# and five others (one where `head_dim * rotary_percent` is not a whole number, one drawn as the
# check runs), with ropelib barred (`frequencies.rotary_dim` is the answer, and so it is not one).

# %%
def my_rotary_dim(head_dim, rotary_percent):
    ...   # your code: an int


basics.check_rotary_dim(my_rotary_dim);

# %%
solution(basics.solution_rotary_dim)

# %% [markdown]
# **Exercise 3.** The tour listed `apply_rope`'s `interleaved=True` keyword and checked the
# Hugging Face drop-in against the formula `x * cos + rotate_half(x) * sin`. Write that formula
# yourself, in PyTorch, for what this call computes:
#
# ```python
# freqs = frequencies.rope_freqs(S, D, interleaved=True)      # [S, 1, 1, D]
# y = ropelib.apply_rope(x, freqs, layout="bshd", interleaved=True)
# ```
#
# `my_rope(x, freqs)` takes `x` in `bshd` = `[B, S, H, D]` and the table `[S, 1, 1, D]` (fp32
# angles, in `sbhd` order like every table) and returns the rotated `x` in `x`'s dtype, computed
# in fp32 and rounded once, as the kernel does (the TE drop-in's cell showed that rounding cos,
# sin and the products to bf16 gives other numbers). With the **interleaved** pairing (GPT-J
# style) the features that turn together are neighbours, $(x_0, x_1), (x_2, x_3), \dots$, so
# the table holds each angle twice ($\theta_0\, \theta_0\, \theta_1\, \theta_1 \dots$) and
# $\mathrm{rotate\_half}(x) = (-x_1, x_0, -x_3, x_2, \dots)$.
# The check tries `x` of shape `[2, 6, 4, 16]` and four others (one with `B == S`, one with a
# table that starts at position 3, one in bf16 with another base, one drawn as the check runs),
# with ropelib barred.

# %%
def my_rope(x, freqs):
    ...   # your code: x rotated, [B, S, H, D]


basics.check_interleaved_rope(my_rope);

# to see one case side by side with the kernel:
# x_ex = torch.randn(2, 6, 4, 16, device=device)                            # [B, S, H, D]
# freqs_ex = frequencies.rope_freqs(6, 16, interleaved=True, device=device)  # [S, 1, 1, D]
# torch.testing.assert_close(my_rope(x_ex, freqs_ex),
#                            ropelib.apply_rope(x_ex, freqs_ex, layout="bshd", interleaved=True))

# %%
solution(basics.solution_interleaved_rope)

# %% [markdown]
# ## Questions for a study group
#
# 1. The interpreter/compiled choice is made once per process, when `ropelib` is imported. What
#    would go wrong if a library let you switch it per call, and how would you organise a test
#    suite that must cover both modes?
# 2. The same `apply_rope` serves training (a whole sequence, with gradients) and decoding (one
#    token per sequence, `start_positions`). Which of the two would you optimise first for a
#    chat service, and for a pretraining run? What limits the speed in each?
# 3. The backward pass is the same kernel with $-\theta$. What does that let a training stack
#    skip that a general elementwise op would need (think of what autograd saves for the
#    backward), and is there a catch with `inplace=True`?
# 4. The TE drop-in's fused and unfused paths differ by bf16 rounding on the same input. If you
#    were moving a production model from one to the other, what evidence would convince you the
#    switch is safe: bitwise equality, `allclose`, matching loss curves? (Notebooks 08 and 09
#    come back to this.)
# 5. `ropelib` offers a function, a module and two drop-ins for one operation. Which would you
#    pick for a model you write yourself, for a Hugging Face checkpoint you fine-tune, and for a
#    Transformer Engine stack, and what does each choice tie you to?
# 6. Section 3 found one decoding step's RoPE taking 2.7 times as long as a copy of its
#    bytes, and its CUDA-graph line showed that most of both calls is work a graph removes,
#    which a faster kernel does not. A graph takes the host out; what does it cost a serving
#    stack to capture one, and what else could? Think of what else reads or writes the same
#    query and key bytes in the same step, so that RoPE could ride along with it (one launch
#    instead of two). Notebooks 07, 11 and 12 each try one answer; guess which before you open
#    them.
