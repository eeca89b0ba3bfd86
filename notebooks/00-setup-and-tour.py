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
# torch's copy of the same bytes, 13 µs more, most of it in ropelib's own Python layers on the
# host. Section 3 reads these numbers off the committed H200 measurements.
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
# section 6). The tour's tensors stay below that size (the appendix checks it).
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
# the shape grows it, not the positions passed as `start_positions` or `position_ids`, so a
# decoder sets `max_seq_len` to its KV cache's length: a position past the table can give a row
# of NaN rather than an error (notebook 02 shows when, under position offsets).

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
# ### What a call costs: bytes set the time of a large call, a fixed cost that of a small one
#
# For each element it rotates, the kernel multiplies twice and adds once,
# $y_j = x_j\cos\theta_{m,j} - x_{j+D/2}\sin\theta_{m,j}$: 3 FLOPs, not counting the sines and
# cosines (the appendix counts what the H200 really executes). It also reads the element and
# writes it back, 4 bytes in bf16, and reads the fp32 angle table, which every batch entry and
# head share. Its *arithmetic intensity*, FLOPs per byte, is therefore below one. A bf16 matrix
# multiply of two $n \times n$ matrices does $2n^3$ FLOPs on $3 \cdot 2n^2$ bytes, $n/3$ FLOPs
# per byte: over a thousand at $n = 4096$. A GPU that is fast enough for the matrix multiply
# waits on memory for RoPE, so the fair yardstick for a RoPE kernel is a copy of the same bytes,
# and "% of a copy" is the copy's time over the kernel's (0.99 of a copy is 99 %).
#
# Here is the yardstick as a Triton kernel, checked against torch's copy. Edit it and rerun
# (notebook 03 explains programs, offsets and masks):

# %%
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # this program's elements
    mask = offs < n                                          # the last program runs past n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


x_copy = torch.empty_like(x)
copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, x_copy, x.numel(), BLOCK=1024)
assert torch.equal(x_copy, torch.empty_like(x).copy_(x))
print(f"copy_kernel: {x.numel():,} elements, {triton.cdiv(x.numel(), 1024)} programs, "
      "equal to torch's copy_")

# %% [markdown]
# The next cell computes RoPE's intensity for the tour's `x`, then reads the committed H200 run
# of the floor suite (`benchmarks/results/floor-nvidia-h200.csv`): a forward pass over 1 GiB of
# `x`, timed on the device, and the forward of one decoding step (1 token × 64 sequences × 32
# heads × 128 features), timed on the host's clock as an eager call is, and again replayed from
# a CUDA graph. These are one H200's numbers, not your machine's: notebook 07 measures them live.

# %%
import math
import re

import matplotlib.pyplot as plt

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

HBM_TB_S = 4.8                    # NVIDIA's figure for the H200 SXM's memory
PIECES = measured.RESULTS / "launch_pieces-nvidia-h200-20261204-2140.log"
if measured.path("floor").is_file():
    floor_meta, _ = measured.load("floor")
    floor = measured.floor()
    assert floor_meta["gpu"] == "NVIDIA H200"
    configs = {case.name: case.config for case in floor_suite.rope_cases()}
    step_shape = configs["sbhd"]                   # the decoding step the text describes
    assert (step_shape.seq_len, step_shape.batch, step_shape.heads, step_shape.head_dim,
            step_shape.dtype) == (1, 64, 32, 128, "bf16")
    # label -> (the CSV's case, the suite's shape for it, the part of the run that measured it)
    rows = {"1 GiB of x, device time": ("forward 1 GiB bf16 sbhd", configs["1 GiB bf16 sbhd"],
                                        "1 GiB bf16 sbhd"),
            "one decoding step, eager, host time": ("decode host forward sbhd", configs["sbhd"],
                                                    "decode sbhd"),
            "the same step, CUDA graph replay": ("decode forward sbhd under CUDA graphs",
                                                 configs["sbhd"], "decode sbhd")}
    print(f"measured on {measured.where(floor_meta)}:")
    for label, (case, config, part) in rows.items():
        copy, rope = floor[case]["copy"], floor[case]["ropelib"]
        print(f"  {label:36s} {bytes_moved(config) / 2**20:6.0f} MiB   "
              f"copy {copy['ms'] * 1e3:6.1f} µs   ropelib {rope['ms'] * 1e3:6.1f} µs   "
              f"= {rope['ratio_to_copy']:.2f} of a copy   "
              f"({measured.floor_run_date(floor_meta, part)[:16].replace('T', ' ')})")
    large, step = floor["forward 1 GiB bf16 sbhd"], floor["decode host forward sbhd"]
    graph = floor["decode forward sbhd under CUDA graphs"]
    big_bytes = bytes_moved(configs["1 GiB bf16 sbhd"])
    fewer = big_bytes / bytes_moved(configs["sbhd"])
    tb_s = {p: big_bytes / (large[p]["ms"] * 1e-3) / 1e12 for p in ("copy", "ropelib")}
    step_spec_us = bytes_moved(configs["sbhd"]) / (HBM_TB_S * 1e12) * 1e6
    print(f"  1 GiB: copy {tb_s['copy']:.2f} TB/s, ropelib {tb_s['ropelib']:.2f} TB/s "
          f"({tb_s['ropelib'] / HBM_TB_S:.0%} of {HBM_TB_S} TB/s); a decoding step's bytes, "
          f"{fewer:,.0f} times fewer, need {step_spec_us:.2f} µs at {HBM_TB_S} TB/s")
    assert large["ropelib"]["ratio_to_copy"] > 0.95                 # within 5 % of a copy
    assert [round(v, 1) for v in tb_s.values()] == [4.3, 4.3]
    assert round(100 * tb_s["ropelib"] / HBM_TB_S) == 89
    assert 1500 < fewer < 2500 and step_spec_us < 0.25
    # the decoding step, eager (host clock) and replayed from a CUDA graph (per replayed call)
    host_us = {p: step[p]["ms"] * 1e3 for p in ("copy", "ropelib")}
    device_us = {p: graph[p]["ms"] * 1e3 for p in ("copy", "ropelib")}
    assert "calls captured per CUDA graph: 100" in floor_meta["graph_rows"]
    assert round(host_us["copy"], 1) == 7.6
    assert round(host_us["ropelib"] / host_us["copy"], 1) == 2.7
    assert round(step["ropelib"]["ratio_to_copy"], 2) == 0.37
    assert round(device_us["copy"], 1) == 1.4 and round(device_us["ropelib"], 1) == 2.0
    gap_host = host_us["ropelib"] - host_us["copy"]
    gap_device = device_us["ropelib"] - device_us["copy"]
    assert round(gap_host, 1) == 13.1 and round(gap_device, 1) == 0.5
    # where ropelib's eager call goes on the host: a later run timed the pieces of its call path
    if PIECES.is_file():
        best = {m[1]: float(m[2]) for m in re.finditer(r"^(\S.*?)\s{2,}([\d.]+)\s+[\d.]+$",
                                                        PIECES.read_text(), re.M)}
        launch = best["finished kernel, Triton's C launcher"]       # the launch itself
        wrapper = best["finished kernel, EagerLaunch"] - launch     # ropelib's launch wrapper
        python = host_us["ropelib"] - best["finished kernel, EagerLaunch"]   # ropelib's Python
        print(f"  ropelib's eager call, {host_us['ropelib']:.1f} µs on the host: the launch "
              f"{launch:.1f} µs (torch's whole copy call: {host_us['copy']:.1f}), its launch "
              f"wrapper {wrapper:.1f} µs, its Python before that {python:.1f} µs\n"
              f"    (pieces: best of runs, {measured.committed_when(PIECES)[1]}; the call: "
              f"{measured.floor_run_date(floor_meta, 'decode sbhd')[:10]}; subtracted across "
              f"the two runs)")
        assert abs(launch - host_us["copy"]) < 1.5          # about a whole copy call
        assert 2.5 < wrapper < 5 and 7 < python < 11         # ropelib's own layers: most of it
        assert wrapper + python > 0.8 * gap_host

    # the figure: the three lines' times, and the time their bytes need at the memory's 4.8 TB/s
    labels = list(rows)
    copy_us = [floor[rows[lb][0]]["copy"]["ms"] * 1e3 for lb in labels]
    rope_us = [floor[rows[lb][0]]["ropelib"]["ms"] * 1e3 for lb in labels]
    bytes_us = [bytes_moved(rows[lb][1]) / (HBM_TB_S * 1e12) * 1e6 for lb in labels]
    assert copy_us[1] == host_us["copy"] and rope_us[2] == device_us["ropelib"]
    assert all(1 < t / bytes_us[0] < 1.2 for t in (copy_us[0], rope_us[0]))   # just above
    fig, ax = plt.subplots(figsize=(8, 3.8))
    at = range(len(labels))
    ax.bar([i - 0.2 for i in at], copy_us, 0.4, label="copy of the same bytes", color="0.6")
    ax.bar([i + 0.2 for i in at], rope_us, 0.4, label="ropelib", color="C0")
    ax.scatter(at, bytes_us, marker="_", s=900, color="C3", zorder=3,
               label=f"the bytes alone, at the memory's {HBM_TB_S} TB/s")
    ax.set_yscale("log")
    ax.set_xticks(list(at), [lb.replace(", ", ",\n", 1) for lb in labels])
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
# On 1 GiB ropelib runs within 5 % of a copy's speed, and both move their bytes at 4.3 TB/s,
# 89 % of the 4.8 TB/s NVIDIA gives for the H200 SXM's memory: the bytes set the time (in the
# figure both bars stand just above the red line). A decoding step's bytes would need under a
# quarter of a microsecond, yet the copy takes 7.6 µs and ropelib 2.7 times as long, 0.37 of a
# copy. Replayed from a CUDA graph, which drops the host's part of each call, the step costs
# 1.4 µs (copy) and 2.0 µs (ropelib): of ropelib's 13.1 µs extra, 0.5 µs are left. The rest is
# host work, and not the launch: the last printed line splits ropelib's eager call into the
# launch itself, about as long as torch's whole copy call, and ropelib's own Python layers (its
# launch wrapper and the code before it), which make up most of the extra. No faster kernel
# removes them; a leaner call path or a CUDA graph does. Notebook 07 measures both regimes live.

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
# **Exercise 1.** Section 3 judged the 1 GiB call by its bytes per second. Write
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

# %% [markdown]
# ## Appendix: reading the committed H200 run
#
# Section 3's two lines ran different code. `apply_rope` sends `x` from 64 MiB on down the
# two-pass route, so the 1 GiB line is two-pass and the decoding step (like the tour's `x`) the
# finished kernel; the first lines below check it.
#
# What did the H200 execute? Notebook 05's profile by opcode
# (`ladder_opcodes_per_opcode-nvidia-h200.csv`) counts the warp instructions of rungs 4 to 6 of
# its ladder and of ropelib's finished kernel, at the shape the profile's header names. No rung
# executes `MUFU`, the special-function unit's instruction: the sines and cosines are
# polynomials on the fp32 units. The finished kernel executes one `MUFU` per warp, which these
# counts alone do not explain. Per element it executes about ten thread instructions (if every
# lane of each warp works: the profile counts warp instructions), among them 2.4 `FFMA` and 0.7
# `FMUL` — about 5.6 fp32 FLOPs, not the model's 3, because the sine and cosine polynomials are
# in them — and 2.2 `IMAD` of indexing. Each of an SM's four schedulers issues at most one warp
# instruction a cycle, so at 1.98 GHz the H200's 132 SMs need about 40 µs to issue them all,
# while the kernel's bytes at the 1 GiB copy's 4.3 TB/s take about 126 µs: the schedulers are
# about one third busy, and memory sets the time. (The profile is of the finished kernel forced
# at this shape; the 1 GiB line ran the two-pass route.) Last, a launch against a large call:
# ropelib's whole decoding step, replayed from a CUDA graph, costs the device 0.4 % of its
# 1 GiB call.

# %%
OPCODES = measured.RESULTS / "ladder_opcodes_per_opcode-nvidia-h200.csv"
print(f"two-pass route from {tiles.TWO_PASS_MIN_BYTES >> 20} MiB of x; "
      f"the tour's x: {x_bytes / 2**20:.2f} MiB (the finished kernel)")
assert tiles.TWO_PASS_MIN_BYTES == 64 << 20 and x_bytes < tiles.TWO_PASS_MIN_BYTES

if measured.path("floor").is_file():
    x_bytes_of = {c: configs[c].seq_len * configs[c].batch * configs[c].heads
                  * configs[c].head_dim * 2 for c in ("1 GiB bf16 sbhd", "sbhd")}   # bf16 x
    print(f"the 1 GiB line's x: {x_bytes_of['1 GiB bf16 sbhd'] / 2**20:.0f} MiB (two-pass); "
          f"the decoding step's: {x_bytes_of['sbhd'] / 2**20:.1f} MiB (the finished kernel)")
    assert x_bytes_of["1 GiB bf16 sbhd"] >= tiles.TWO_PASS_MIN_BYTES > x_bytes_of["sbhd"]
    big_us = large["ropelib"]["ms"] * 1e3
    print(f"ropelib's decoding step under a CUDA graph: {device_us['ropelib']:.1f} µs, "
          f"{device_us['ropelib'] / big_us:.1%} of its 1 GiB call's {big_us:.0f} µs")
    assert round(100 * device_us["ropelib"] / big_us, 1) == 0.4

if OPCODES.is_file() and measured.path("floor").is_file():   # 05's rungs 4-6, ropelib
    import csv
    from ropelib.bench import compare
    text = OPCODES.read_text()
    profiled = measured.ncu_kernels(OPCODES)
    ops = [k["instances"]["sass__inst_executed_per_opcode"] for k in profiled]
    launch_row = next(r for r in csv.DictReader(compare.ncu_table(text)) if r["ID"] == "3")
    size = lambda dims: math.prod(int(v) for v in re.findall(r"\d+", dims))   # noqa: E731
    warps = size(launch_row["Grid Size"]) * size(launch_row["Block Size"]) // 32
    shape = dict(re.findall(r"\b([sbhd])=(\d+)", re.search(r"^# what: (.*)$", text, re.M)[1]))
    elements = math.prod(int(shape[k]) for k in "sbhd")
    fin, fin_all = ops[3], profiled[3]["metrics"]["sass__inst_executed_per_opcode"]
    per_element = {op: fin.get(op, 0) * 32 / elements for op in ("FFMA", "FMUL", "FADD", "IMAD")}
    flops = 2 * per_element["FFMA"] + per_element["FMUL"] + per_element["FADD"]  # an FMA: 2
    issue_us = fin_all / (132 * 4 * 1.98e9) * 1e6     # 132 SMs x 4 schedulers x 1.98 GHz
    fin_bytes = 2 * 2 * elements + int(shape["s"]) * int(shape["d"]) * 4   # x, y, table
    memory_us = fin_bytes / (tb_s["copy"] * 1e12) * 1e6
    print(f"the profile (s={shape['s']}, b={shape['b']}, h={shape['h']}, d={shape['d']}): MUFU "
          + " / ".join(f"{o.get('MUFU', 0):,.0f}" for o in ops[:3])
          + f" in rungs 4-6, {fin['MUFU']:,.0f} in {profiled[3]['kernel']} ({warps:,} warps)")
    print(f"{profiled[3]['kernel']} per element: {fin_all * 32 / elements:.1f} thread "
          "instructions, " + ", ".join(f"{op} {v:.2f}" for op, v in per_element.items())
          + f" -> {flops:.1f} fp32 FLOPs")
    print(f"issue slots: {issue_us:.0f} µs; its {fin_bytes / 1e6:.0f} MB at "
          f"{tb_s['copy']:.2f} TB/s: {memory_us:.0f} µs -> schedulers "
          f"{issue_us / memory_us:.0%} busy")
    assert profiled[3]["kernel"] == launch_row["Kernel Name"] == "_rope_kernel" and len(ops) == 4
    assert all("MUFU" not in o for o in ops[:3]) and fin["MUFU"] == warps   # one per warp
    assert 9.5 < fin_all * 32 / elements < 10.5 and round(per_element["FFMA"], 1) == 2.4
    assert round(per_element["FMUL"], 1) == 0.7 and round(per_element["IMAD"], 1) == 2.2
    assert round(flops, 1) == 5.6 and 35 < issue_us < 45 and 120 < memory_us < 132
    assert 0.25 < issue_us / memory_us < 0.4                               # about one third
