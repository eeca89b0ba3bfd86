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
# and ships those kernels as a library. The course builds one kernel three times: a naive one
# with a program for every row of the tensor (notebook 03), a grid whose programs reuse a
# token's angles over the whole batch (04), and the finished kernel that `ropelib.apply_rope`
# runs (05). Then it gives the kernel its backward (06), races it against Transformer Engine
# (07), debugs the comparisons that fail (08), and takes RoPE into a model (09), to images and
# video (10), to context parallelism and the KV cache (11) and into the QKV projection's matrix
# multiply (12); 13 is a set of puzzles.
#
# Every notebook runs on a CUDA GPU (full sizes) and on a plain CPU, where Triton's
# *interpreter* executes the same kernels in Python (small sizes, chosen automatically).
#
# **After this notebook you will be able to**
#
# - tell what is installed (PyTorch, Triton, Transformer Engine, transformers), whether it meets
#   ropelib's requirements, and whether the kernels run compiled on a GPU or in the interpreter;
# - switch interpreter mode on (and off) the right way;
# - call `ropelib.apply_rope` forward and backward, the `RotaryEmbedding` module, and the
#   Transformer Engine / Hugging Face drop-ins;
# - say why a RoPE kernel is measured against a copy of the same bytes, read "% of a copy", and
#   work out a call's TB/s and TFLOP/s;
# - say what separates the course's three kernels, which move the same bytes, and compute the
#   *program floor* that the number of programs puts under a kernel's time;
# - find your way through the other notebooks.
#
# **Time:** about an hour for the main path: sections 1 to 5 (about 40 minutes; sections 3 and
# 4 are most of it) and exercises 1 to 3 (about 20). Optional, each marked where it starts:
# "The floors, live" at the end of section 4 (its timings need a GPU) and exercise 4, a first
# Triton kernel of your own with a prediction to make before it is timed (about 30 minutes
# more; notebook 03 teaches what it uses). The cells take seconds on a GPU and under a minute
# in Triton's interpreter on a CPU.
#
# **Before you start.** This notebook runs in the environment that `README.md` sets up
# ("Set up and open the notebooks"): `conda env create -f environment.yml` on Linux with an
# NVIDIA driver (GPU PyTorch, Triton, Transformer Engine, JupyterLab, and ropelib with its
# `test` and `hf` extras), or `pip install -e ".[lab]"` in a Python virtual environment, where a
# machine without a GPU installs a CPU build of PyTorch first. Section 1 checks what you got.

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
import re
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


def release(v):
    """'2.13.0+cpu' -> (2, 13): a version's release, to compare with a floor."""
    return tuple(int(p) for p in re.match(r"(\d+)\.(\d+)", v).groups())


try:      # ropelib's floors, as pyproject.toml gives them to the installed package
    meta = importlib.metadata.metadata("ropelib")
    floors = {"python": meta["Requires-Python"].removeprefix(">=")}
    floors |= dict(r.split(">=") for r in importlib.metadata.requires("ropelib")
                   if r.startswith(("torch>=", "triton>=")))
except importlib.metadata.PackageNotFoundError:     # imported from a folder, not installed
    floors = {}
for name, floor in floors.items():      # (a Triton under another distribution's name: unread)
    assert info[name] is None or release(info[name]) >= release(floor), (
        f"ropelib needs {name} {floor} or newer, this environment has {info[name]}: "
        "README.md, 'Set up and open the notebooks'")
print("at or above ropelib's floors: " + (", ".join(f"{k} {v}" for k, v in floors.items())
                                          or "not checked (ropelib is not pip-installed)"))

# %% [markdown]
# What the lines should say, and what to do when they do not:
#
# - **`kernels run`**: `GPU (...)` on a machine with an NVIDIA GPU, `CPU, Triton interpreter`
#   on one without. `CUDA available : False` on a machine that has an NVIDIA GPU means a CPU
#   build of PyTorch (or no working driver: `nvidia-smi` tells): make the environment again with
#   one of README.md's GPU commands.
# - **The floors**: ropelib needs Python 3.10, PyTorch 2.6 and Triton 3.2 or newer (its
#   operators are `torch.library.triton_op`s, new in PyTorch 2.6, which is built with Triton
#   3.2). The cell reads them from the installed package's metadata, which `pyproject.toml`
#   wrote, and stops if one is not met.
# - **transformers** (optional): `pip install -e ".[hf]"` adds it (the conda environment has it).
# - **Transformer Engine** (optional, GPU only): the conda environment installs it
#   (`transformer-engine-torch`); with pip it builds from source on a CUDA machine,
#   `pip install --no-build-isolation "transformer_engine[pytorch]"`.
#
# Where a notebook compares with one of the two, it runs the real package when it is installed
# (TE also needs a GPU) and says so when it is not; `ropelib.reference` keeps faithful copies of
# the code paths compared with, so nothing breaks. This notebook times nothing of TE's: notebook
# 07 does, and lists TE as unavailable where it cannot run.

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
# Setting the variable after `import ropelib` changes nothing. Each mode has one device in
# ropelib: the GPU for compiled kernels, which cannot read a CPU tensor, and the CPU for the
# interpreter. Triton's interpreter itself accepts a CUDA tensor (it copies the tensor's storage
# to the CPU, runs the kernel there and copies the result back); keeping interpreter-mode
# tensors on the CPU is ropelib's own rule. ropelib refuses a tensor on the other mode's device
# with a `ValueError` that says what to do. The next cell starts a Python process with the
# opposite setting and hands it such a tensor. On a GPU machine that process runs the
# interpreter and is handed a CUDA tensor; on a machine without a GPU it has no device for
# compiled kernels at all, and its error says to set `TRITON_INTERPRET=1`:

# %%
env = dict(os.environ)
if env.get("TRITON_INTERPRET") == "1":
    env.pop("TRITON_INTERPRET")
else:
    env["TRITON_INTERPRET"] = "1"
flipped = """
import torch, ropelib
print(ropelib.runtime.mode())
refused = "cuda" if ropelib.INTERPRET else "cpu"     # the device ropelib refuses in this mode
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
# RoPE turns each pair of features of a query or key head ($D$ features) at position $m$ by an
# angle that grows with $m$. With the rotate-half pairing (GPT-NeoX, Llama, Transformer Engine)
# feature $j$ turns with feature $j + D/2$, for $j < D/2$, and the base $b$ sets how fast the
# angles fall from pair to pair:
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
# `sbhd` = `[seq, batch, heads, head_dim]`. Sizes are small in the interpreter (it executes the
# kernels in Python) and realistic on a GPU; change them, or the dtype, and rerun.
#
# `ropelib.apply_rope(x, freqs)` returns the rotated `x`. Which kernel it launches depends above
# all on the size: below 64 MiB, one launch of notebook 05's finished kernel, `_rope_kernel`; from
# 64 MiB on, a contiguous tensor rotated into a new output (not `inplace`), with an angle table
# small beside it, takes the *two-pass route*: a pre-pass that writes each token's cosine and
# sine, then a *flat pass* over the elements (notebook 05, section 6, which shows the route of
# each size). The cell checks the
# result against `ropelib.reference.rope_reference`, plain PyTorch computed in fp64 and rounded
# once to `x`'s dtype, and prints which kernel ran: the CUDA kernels of one more call on a GPU,
# the Triton launches in the interpreter.

# %%
from ropelib import frequencies, reference
from ropelib.course.counts import count_kernels, interpreted_launches
from ropelib.kernels import tiles

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

# which kernel ran: the CUDA kernels of one more call on a GPU, the Triton launches in the
# interpreter (a tensor of 64 MiB or more would take the two-pass route instead)
x_bytes = x.numel() * x.element_size()
if GPU:
    ran = count_kernels(lambda: ropelib.apply_rope(x, freqs)).cuda
else:
    with interpreted_launches() as ran:
        ropelib.apply_rope(x, freqs)
print(f"x is {x_bytes / 2**20:.2f} MiB, below the two-pass route's "
      f"{tiles.TWO_PASS_MIN_BYTES >> 20} MiB: one launch of {ran}")
assert tiles.TWO_PASS_MIN_BYTES == 64 * 2**20                       # "from 64 MiB on"
assert x_bytes < tiles.TWO_PASS_MIN_BYTES and ran == ["_rope_kernel"], ran

# %% [markdown]
# Keywords cover the rest: `layout="bshd"` or `"thd"` (with `cu_seqlens`), `interleaved=True`,
# `rotary_percent < 1`, `start_positions` / `position_ids`, `cp_size` / `cp_rank`, a
# `cos=`/`sin=` cache, `inplace=True` (notebooks 01 and 02 teach most of them; `docs/API.md`
# lists every one).
#
# It is differentiable. RoPE is linear in $x$: $y = R(\theta)\,x$, with $R(\theta)$ made of the
# $2 \times 2$ rotations above. So autograd's backward turns the gradient of the output,
# $\partial L/\partial y$ (`dy` below), into
# $\partial L/\partial x = R(\theta)^{\top}\,\partial L/\partial y$, and a rotation is
# orthogonal, $R(\theta)^{\top} = R(-\theta)$: the backward is the rotation by $-\theta$, and
# the same kernel computes it (notebook 06 derives this). The cell sets `x.grad` beside `dy`
# rotated by $-\theta$; a largest difference of 0 means the same bits:

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
# It owns the angle table and rotates queries and keys in one launch; the key may have fewer
# heads (grouped-query attention); the default layout is `bshd`. The table doubles when a longer
# sequence arrives, but only the shape grows it, not `start_positions` or `position_ids`: a
# decoder sets `max_seq_len` to its KV cache's length. A position past the table raises a
# `ValueError` where ropelib can check it without waiting for the GPU, and otherwise gives a row
# of NaN (notebook 02, section 4).

# %%
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
# `fused=True` runs ropelib's kernel, `fused=False` the plain PyTorch path, both checked against
# `ropelib.reference`'s copies of TE's two paths. The line "TE itself" runs Transformer Engine
# (installed, on a GPU) against each path. Differences are counted in **ulps** (units in the last
# place): one ulp is the gap between two neighbouring bf16 numbers, here taken at the head
# vector's largest absolute value, so an error of 1 ulp is one step of the last bit of the
# vector's largest element. `ropelib.hf.apply_rotary_pos_emb`
# has Hugging Face's signature (queries and keys `[B, H, S, D]`, a cos/sin cache `[B, S, D]`) and
# formula, $x\cos + \mathrm{rotate\_half}(x)\sin$, in fp32 and rounded once; where transformers is
# installed the cell checks it against its Llama function.

# %%
from ropelib import hf as rope_hf
from ropelib import te as rope_te
from ropelib.bench.compare import error_metrics, try_import

t = torch.randn(S, B, H, D, device=device, dtype=dtype)
fused = rope_te.apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=True)
unfused = rope_te.apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=False)
# fused=True: fp32 math, one rounding (what TE's CUDA kernel computes);
# fused=False: TE's PyTorch code, op for op (cos/sin and the products rounded to bf16)
torch.testing.assert_close(fused, reference.te_fused_emulation(t, freqs))
assert torch.equal(unfused, reference.te_unfused(t, freqs))

cos, sin = frequencies.rope_cos_sin(S, D, dtype=dtype, device=device)      # [S, D] HF cache
q_bhsd, k_bhsd = q.transpose(1, 2), k.transpose(1, 2)                      # [B, H, S, D]
q_hf, k_hf = rope_hf.apply_rotary_pos_emb(q_bhsd, k_bhsd, cos[None], sin[None])
for inp, out in ((q_bhsd, q_hf), (k_bhsd, k_hf)):     # HF's formula in fp32, rounded once
    xf = inp.float()
    torch.testing.assert_close(
        out, (xf * cos.float() + reference.rotate_half(xf) * sin.float()).to(dtype))
hf_q = q_bhsd * cos + reference.rotate_half(q_bhsd) * sin    # HF's code: every op rounds to bf16
if version("transformers"):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
    assert torch.equal(hf_apply(q_bhsd, k_bhsd, cos[None], sin[None])[0], hf_q)
    hf_source = f"transformers {version('transformers')}"
else:
    hf_source = "HF's formula op for op (transformers is not installed)"

# an ulp here: the gap between neighbouring bf16 numbers at the head vector's largest |value|
gap, hf_gap = error_metrics(unfused, fused.double()), error_metrics(hf_q, q_hf.double())
hf_share = (hf_q != q_hf).float().mean().item()
print(f"ropelib.te drop-in: fused=True and fused=False differ by up to "
      f"{gap['max_head_ulp_err']:g} bf16 ulp(s)")
print(f"HF drop-in: {tuple(q_hf.shape)} {tuple(k_hf.shape)} | against {hf_source}: "
      f"{hf_share:.0%} of q's outputs differ, by up to {hf_gap['max_head_ulp_err']:g} ulp(s)")
assert 0 < gap["max_head_ulp_err"] <= 2
assert 0 < hf_share < 1 and hf_gap["max_head_ulp_err"] <= 2

te_rope, _ = try_import("transformer_engine.pytorch.attention.rope")   # TE itself
if te_rope is not None and GPU:
    te_ulps = {}
    for f in (True, False):                           # the drop-in's path against TE's own
        mine = rope_te.apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=f)
        theirs = te_rope.apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=f)
        te_ulps[f] = error_metrics(mine, theirs.double())["max_head_ulp_err"]
    print(f"TE itself ({info['transformer_engine']}): the drop-in against "
          f"TE's own paths, up to {te_ulps[True]:g} ulp(s) fused, {te_ulps[False]:g} unfused")
    assert max(te_ulps.values()) <= 2, te_ulps
else:
    print("TE itself: did not run here (" + ("not installed" if te_rope is None else "no GPU")
          + "): the lines above compare ropelib's code only")

# %% [markdown]
# The two paths differ in the last bits: `fused=False` rounds cos, sin and each product to bf16,
# `fused=True` rounds once at the end (the cell asserts at most 2 ulps). Hugging Face's code, which
# also rounds every op to bf16, differs from ropelib's one rounding in a share of the outputs, by at
# most 2 ulps. On the H100 run on this notebook's page in `docs/executed/` (Transformer Engine
# installed) the paths differed by up to 2<!--page: fused=True and fused=False differ-->
# ulps, 32<!--page: of q's outputs differ--> % of the HF outputs by up to
# 1<!--page: of q's outputs differ--> ulp, and the drop-in matched TE's own fused and unfused paths
# at 0<!--page: the drop-in against TE's own paths--> ulps. Notebook 08 shows why such a difference
# fails `torch.allclose` between two correct implementations, and which unit to measure it in.

# %% [markdown]
# ### What a call costs: bytes set the time of a large call, a fixed cost that of a small one
#
# A kernel's *arithmetic intensity* is its FLOPs per byte moved to and from memory. For each
# element RoPE multiplies twice and adds once (3 FLOPs, the sines and cosines aside) and moves 4
# bytes in bf16 (`x` read, `y` written), plus the fp32 angle table that every batch entry and
# head share: under one FLOP per byte. A bf16 matrix multiply of two $n \times n$ matrices does
# $2n^3$ FLOPs on $3 \cdot 2n^2$ bytes (reads $A$ and $B$, writes $C$, 2 bytes an element),
# $n/3$ per byte. A GPU fast enough for the matrix multiply waits on memory for RoPE, so a RoPE
# kernel's yardstick is a copy of the same bytes, and "% of a copy" is the copy's time over the
# kernel's (100 % is as fast as the copy).
#
# Here is the copy as a Triton kernel (notebook 03 teaches programs, offsets and masks
# properly). A `@triton.jit` function is launched on a *grid* of *programs*,
# `kernel[(P,)](args...)`, each program one instance of the function; `tl.program_id(0)` says which one it is. Program $p$ takes the
# `BLOCK` elements from $p \cdot$ `BLOCK` on: `tl.arange(0, BLOCK)` is the vector
# $0, 1, \dots, \text{BLOCK} - 1$, so `offs` holds their indices. The last program runs past
# the $n$ elements, and `mask` switches those lanes off in `tl.load` and `tl.store`, which read
# and write all the unmasked elements at once. `BLOCK` is a `tl.constexpr`: a compile-time
# constant, and a power of two, as `tl.arange` needs.

# %%
import triton
import triton.language as tl


@triton.jit
def copy_kernel(
    x_ptr,  # *x: input, n elements, contiguous
    y_ptr,  # *y: output, n elements, contiguous
    n,  # elements to copy
    BLOCK: tl.constexpr,  # elements a program copies, a power of two
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # this program's elements
    mask = offs < n                                          # the last program runs past n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


x_copy = torch.empty_like(x)
copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, x_copy, x.numel(), BLOCK=1024)
assert torch.equal(x_copy, torch.empty_like(x).copy_(x))
print(f"copy_kernel: {x.numel():,} elements, {triton.cdiv(x.numel(), 1024)} programs, "
      "equal to torch's copy_")

# %%
import math

import matplotlib.pyplot as plt

from ropelib.bench import floor as floor_suite
from ropelib.bench.compare import bytes_moved
from ropelib.course import measured

rope_flops = 3 * x.numel()                                      # 2 multiplies + 1 add a feature
rope_bytes = 2 * x_bytes + freqs.numel() * freqs.element_size()  # x in, y out, the table
n = 4096
gemm_intensity = 2 * n**3 / (3 * n * n * 2)                     # C = A @ B in bf16
print(f"RoPE of x {tuple(x.shape)}: {rope_flops / rope_bytes:.2f} FLOP/byte; "
      f"a {n}x{n} bf16 matmul: {gemm_intensity:.0f} FLOP/byte")
assert rope_flops / rope_bytes < 1 and gemm_intensity > 1000

# %% [markdown]
# How close does a RoPE call come to the copy? Three clocks answer differently. *Device time* is
# the time the GPU spends on the call, read from CUDA events recorded before and after it
# (`triton.testing.do_bench`). *Host time* is the time of the Python call on the CPU (the
# *host*), which issues each kernel: in an *eager* program, PyTorch's default, every call goes
# through Python and the host's side of each launch, here timed over calls issued back to back.
# A *CUDA graph* records a call's kernel launches once and replays them with one host call, so
# its time per replayed call leaves the host out.
#
# The next cell reads the committed H200 run of the floor suite
# (`benchmarks/results/floor-nvidia-h200.csv`) at two sizes: a forward pass over 1 GiB of `x`, in
# device time, and one decoding step (1 token × 64 sequences × 32 heads × 128 features), in host
# time and replayed from a CUDA graph. Each line gives the bytes the call moves (the MiB column:
# `x` read, `y` written, the table), the copy's time, ropelib's, and their ratio, "of a copy":
# the copy's time over ropelib's, so 1.00 is as fast as the copy and 0.50 twice as slow. They are
# one H200's numbers (notebook 07 measures them live).

# %%
# NVIDIA's datasheet figures for memory bandwidth (TB/s), looked up by a fragment of the GPU's
# name (measured.PEAK_TB_S: the H200 4.8, the H100 SXM 3.35); None for a GPU not in the list
peak_tb_s = measured.peak_tb_s
assert peak_tb_s("NVIDIA H100 80GB HBM3") == 3.35 and peak_tb_s("NVIDIA L4") is None
FLOOR = measured.path("floor").is_file()
if FLOOR:
    floor_meta, _ = measured.load("floor")
    floor = measured.floor()
    assert floor_meta["gpu"] == "NVIDIA H200"
    HBM_TB_S = peak_tb_s(floor_meta["gpu"])      # the measured GPU's: the H200 SXM's 4.8 TB/s
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
    # the decoding step, eager (host clock) and replayed from a CUDA graph (per replayed call)
    host_us = {p: step[p]["ms"] * 1e3 for p in ("copy", "ropelib")}
    device_us = {p: graph[p]["ms"] * 1e3 for p in ("copy", "ropelib")}
    gap_host = host_us["ropelib"] - host_us["copy"]
    gap_device = device_us["ropelib"] - device_us["copy"]
    print(f"  the decoding step: ropelib's eager call takes {gap_host:.1f} µs more than the "
          f"copy's; replayed, {gap_device:.1f} µs more ({gap_device / gap_host:.0%} of it)")
    # the 1 GiB call (apply_rope's two-pass route) runs at the copy's rate ...
    assert large["ropelib"]["ratio_to_copy"] > 0.95                 # within 5 % of a copy
    assert [round(v, 1) for v in tb_s.values()] == [4.3, 4.3]
    assert round(100 * tb_s["ropelib"] / HBM_TB_S) == 89
    assert big_bytes / 2 > tiles.TWO_PASS_MIN_BYTES > bytes_moved(configs["sbhd"])
    # ... the decoding step (the finished kernel) is a fixed cost, most of it the host's
    assert 1500 < fewer < 2500 and step_spec_us < 0.25
    assert "calls captured per CUDA graph: 100" in floor_meta["graph_rows"]
    assert round(host_us["copy"], 1) == 7.6
    assert round(host_us["ropelib"] / host_us["copy"], 1) == 2.7
    assert round(step["ropelib"]["ratio_to_copy"], 2) == 0.37
    assert round(device_us["copy"], 1) == 1.4 and round(device_us["ropelib"], 1) == 2.0
    assert round(gap_host, 1) == 13.1 and round(gap_device, 1) == 0.5
else:
    print("ropelib is installed without its benchmarks/results/ folder: nothing to read")

# %% [markdown]
# The figure sets each line's two times beside the time its bytes alone need at the H200's
# 4.8 TB/s (the red marks):

# %%
if FLOOR:
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

# %% [markdown]
# On 1 GiB (`apply_rope`'s two-pass route) the bytes set the time: ropelib runs at the copy's
# 4.3 TB/s, 89 % of the H200's 4.8 TB/s. The floor suite timed it by calling `apply_rope` again
# and again on the same tensors and table, so ropelib kept the pre-pass's cosine and sine rows
# from the first call and each timed call ran the flat pass alone: what a model's layers get when
# they share one table. A new table every call adds the pre-pass each time (notebook 05, section
# 6 measures its share).
#
# A decoding step is the opposite case. Its bytes would need under a quarter of a µs at 4.8 TB/s,
# yet the copy's eager call takes 7.6 µs and ropelib's 13.1 µs more (0.37 of a copy): a fixed cost
# per call sets the time, not the bytes. Where do ropelib's extra 13.1 µs go? Replayed from a CUDA
# graph, which leaves the host out, only 0.5 µs of them remain, so the rest is the host's side of
# the call. That is inferred by subtraction; on a GPU the next cell
# times the host itself, issuing 300 of each call without waiting for the GPU, beside the same
# calls replayed from a graph. Where the host's gap is many times the replay's, the host is what
# separates the two calls. Notebook 07 (optional part A) takes the host's part apart.

# %%
import time

from ropelib.bench.suite import graph_replay_ms

step_x = torch.randn(1, 64 if GPU else 2, 32, 128, device=device,
                     dtype=torch.bfloat16)                             # [S, B, H, D], one token
step_freqs = frequencies.rope_freqs(1, 128, device=device)            # [1, 1, 1, D]
step_y = torch.empty_like(step_x)
step_calls = {"copy": lambda: step_y.copy_(step_x),
              "ropelib": lambda: ropelib.apply_rope(step_x, step_freqs)}
torch.testing.assert_close(step_calls["ropelib"](), reference.rope_reference(step_x, step_freqs))
assert torch.equal(step_calls["copy"](), step_x)
if GPU:
    issue_us, replay_us = {}, {}
    for name, call in step_calls.items():
        runs = []
        for _ in range(5):                       # the best of 5 runs of 300 calls
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(300):
                call()
            runs.append((time.perf_counter() - t0) / 300 * 1e6)    # before the GPU catches up
        torch.cuda.synchronize()
        issue_us[name] = min(runs)
        replay_us[name] = graph_replay_ms(call, 100, device)[0] * 1e3   # the GPU's time a call
    issue_gap = issue_us["ropelib"] - issue_us["copy"]
    print(f"decoding step {tuple(step_x.shape)} on {info['GPU']}, µs a call:")
    for name in step_calls:
        print(f"  {name:8s} host, no sync {issue_us[name]:6.1f}   "
              f"graph replay {replay_us[name]:5.1f}")
    replay_gap = replay_us["ropelib"] - replay_us["copy"]
    print(f"  ropelib - copy: host {issue_gap:.1f}, replay {replay_gap:.1f}")
    assert issue_us["ropelib"] > 2 * replay_us["ropelib"], (issue_us, replay_us)  # host-bound
    assert issue_gap > 2 * max(replay_gap, 0.1), (issue_gap, replay_gap)   # the host separates
else:
    print(f"the decoding step's two calls ran on {tuple(step_x.shape)} and are right; timing "
          "the host's issuing against a CUDA graph's replay needs a GPU")

# %% [markdown]
# On the H100 run on this notebook's page in `docs/executed/`, the host issued ropelib's call in
# 21.4<!--page: ropelib host, no sync--> µs and the copy's in 9.5<!--page: copy host, no sync--> µs,
# a gap of 11.9<!--page: ropelib - copy: host--> µs, against 0.8<!--page: ropelib - copy: host--> µs
# between their replays: there too the host, not the kernel, separates the two calls. Even the
# copy's 9.5<!--page: copy host, no sync--> µs on the host is about eight times its
# 1.2<!--page: copy host, no sync--> µs replay: at a decoding step's size an eager call is mostly
# the host's work, whichever kernel it launches.

# %% [markdown]
# ## 4. What the course builds: three kernels, the same bytes
#
# Notebooks 03 to 05 write the same rotation three times, and each differs from the last in how
# the work is split into *programs*, the instances of a kernel that the GPU runs in parallel.
# Each program runs on one of the GPU's *streaming multiprocessors* (SMs: 132<!--page: empty
# programs on NVIDIA H100--> on an H100 SXM and on an H200), as one or more *warps*, groups of 32 threads that execute each instruction
# together:
#
# | notebook | kernel | one program handles | programs for `x` of $[S, B, H, D]$ |
# |---|---|---|---|
# | 03 | naive | one row of $D$ features: a token, a batch entry, a head | $S \cdot B \cdot H$ |
# | 04 | batch-reusing grid | a token and a head, looping over the batch | $S \cdot H$ |
# | 05 | finished | a tile of tokens × heads, looping over the batch | a few thousand, below |
#
# The cell runs the three and both copies on the tour's `x` and checks each; on a GPU it times
# all five with `triton.testing.do_bench` (the median of many launches, the L2 cache cleared
# before each; `return_mode="median"`, since its default is the mean), as % of torch's copy and
# in TB/s, and sets the copy's TB/s against
# NVIDIA's figure for the GPU it runs on. It calls
# the 03 and 04 kernels through their launchers in `ropelib.course.kernels`, `rope_naive` and
# `rope_batch_reuse`; notebook 03 writes the first in section 3 (3.4 is the version in
# ropelib), notebook 04 the second in section 2 (2.1 a first version, 2.3 ropelib's).

# %%
from ropelib.course.kernels.batch_reuse import batch_reuse_grid, rope_batch_reuse
from ropelib.course.kernels.naive import naive_grid, rope_naive


def copy_with_kernel():
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, x_copy, x.numel(), BLOCK=1024)
    return x_copy


expected = reference.rope_reference(x, freqs)
programs = {"03 naive": math.prod(naive_grid(S, B, H)),
            "04 batch-reusing grid": math.prod(batch_reuse_grid(S, H))}
launches = {"torch copy_": lambda: x_copy.copy_(x), "copy_kernel": copy_with_kernel,
            "03 naive": lambda: rope_naive(x, freqs),
            "04 batch-reusing grid": lambda: rope_batch_reuse(x, freqs),
            "05 finished (apply_rope)": lambda: ropelib.apply_rope(x, freqs)}
for name, launch in launches.items():           # each runs once here, compiled or interpreted
    out = launch()
    if "copy" in name:
        assert torch.equal(out, x), name
    else:
        torch.testing.assert_close(out, expected)
    print(f"{name:25s} " + ("equals x" if "copy" in name else "matches the reference")
          + (f"; {programs[name]:,} programs" if name in programs else ""))
moves = {name: 2 * x_bytes if "copy" in name else rope_bytes for name in launches}  # bytes
peak = peak_tb_s(info["GPU"]) if GPU else None
if GPU:                                         # do_bench: the median of many launches, in ms
    ms = {name: triton.testing.do_bench(launch, return_mode="median")
          for name, launch in launches.items()}
    print(f"do_bench on {info['GPU']}, x {tuple(x.shape)} {x.dtype}:")
    for name, t in ms.items():
        print(f"  {name:25s} {t * 1e3:8.1f} µs  {100 * ms['torch copy_'] / t:4.0f} % of a copy  "
              f"{moves[name] / (t * 1e-3) / 1e12:5.2f} TB/s")
    copy_tb_s = moves["torch copy_"] / (ms["torch copy_"] * 1e-3) / 1e12
    print(f"the copy reaches {copy_tb_s / peak:.0%} of this GPU's {peak} TB/s (NVIDIA's figure)"
          if peak else f"{info['GPU']} is not in peak_tb_s's list: the copy's {copy_tb_s:.2f} "
          "TB/s is the ceiling here")
else:
    print("timing needs a GPU: each launch's µs, % of a copy and TB/s, then the copy's share "
          "of the GPU's memory bandwidth (peak_tb_s)")

# %% [markdown]
# Those shares are one run on your GPU at the tour's 32<!--page: below the two-pass route's--> MiB,
# a small shape: with $B = 4$ each program of the batch-reusing grid loops over just four rows, one
# after another. On the H100 run on this notebook's page in `docs/executed/` the copy ran at
# 2.38<!--page: torch copy_--> TB/s, 71<!--page: the copy reaches--> % of the H100's 3.35<!--page: the copy reaches--> TB/s, and the
# three came in the course's order: the naive kernel at 33<!--page: 03 naive--> % of a copy, the
# batch-reusing grid at 78<!--page: 04 batch-reusing grid--> %, the finished kernel at
# 86<!--page: 05 finished (apply_rope)--> %. At so small a shape another GPU or run can order them
# otherwise; read your own lines. The floors at the end of this section set the grid's program
# starts beside its time on your GPU; what else takes that time is notebook 04's question (its
# exercise 3 finds, on the committed H200 sweep, that from $b = 4$ on neither the grid's programs
# nor its bytes bound its time), and this notebook does not settle it.
#
# At the size notebooks 03 to 05 measure, committed data settle the order. The next cell
# reads a committed H200 profile at $[4096, 8, 32, 128]$ (256 MiB), where the naive kernel is the
# slowest of the three and the finished kernel the fastest. Why is the naive kernel the slowest
# there, when it moves the same bytes? Each kernel ran once under *Nsight Compute*, NVIDIA's
# kernel profiler (`benchmarks/results/mechanism-nvidia-h200.csv`; notebooks 03 to 05 read its
# other columns).
# Two columns matter here:
#
# - **DRAM / model**: the bytes the GPU's main memory (DRAM) moved, over the bytes RoPE must
#   move.
# - **program floor**: starting and retiring programs takes the GPU time even when they do
#   nothing. The H200 ran $P_0 = 1{,}048{,}576$ empty one-warp programs on its 132 SMs
#   (`program_cost-nvidia-h200.csv`) in a time $t_0$: with the SMs sharing them evenly, each
#   program took $c = t_0 \times 132 / P_0 = 79.8$ ns of an SM's time (the cell's last line
#   prints $t_0$ and $c$). A kernel of $P$ programs then has the program floor
#
#   $$ T_{\text{floor}} = \frac{P}{\text{SMs}} \times c , $$
#
#   with $c$ taken from empty programs of as many warps as the kernel's (the CSV has 1, 2, 4 and
#   8): a time it cannot beat however little each program does. Exercise 2 works it out;
#   notebook 03 (section 4.3) measures it, and finds in 4.4 that the limit is the GPU's rate of
#   starting programs, shared by its SMs, not a cost each SM pays.
#
# The table's other columns: the time of the one launch, the copy's time over it ("% of
# copy"), the programs and the warps each program runs as, and "thread inst / element", the
# instructions all of the launch's threads executed, per element of $x$ (notebooks 04 and 05
# take it apart).
#
# The fifth row is the flat pass of the two-pass route `apply_rope` takes at this size, profiled
# with the pre-pass's rows kept from the warm-up call (as the CSV's description says and the cell
# asserts): the whole of a call that reuses its table, without the pre-pass a first call adds.

# %%
MECHANISM = measured.path("mechanism").is_file() and measured.path("program_cost").is_file()
if MECHANISM:
    mech_meta, _ = measured.load("mechanism")
    mech = measured.mechanism()                    # case s4096-b8
    cost_meta, cost_rows = measured.load("program_cost")
    assert mech_meta["gpu"] == cost_meta["gpu"] == "NVIDIA H200"
    variants = {"copy": "copy", "naive": "03 naive", "batch_reuse": "04 batch-reusing grid",
                "ropelib": "05 finished kernel", "ropelib_planned": "05 two-pass, flat pass"}
    table_rows = [dict(mech[k], name=name, pct=100 * mech["copy"]["us"] / mech[k]["us"])
                  for k, name in variants.items()]
    # program floor, from the CSV's cost of an empty program of as many warps (exercise 2)
    empty_ns = {r["num_warps"]: r["ns_per_program_per_sm"] for r in cost_rows
                if r["kernel"] == "empty"}
    assert sorted(empty_ns) == [1, 2, 4, 8]                 # "the CSV has 1, 2, 4 and 8"
    for r in table_rows:
        r["floor_us"] = r["programs"] / r["sm_count"] * empty_ns[r["num_warps"]] / 1e3
    print(f"x [4096, 8, 32, 128] bf16, one launch under Nsight Compute: "
          f"{measured.where(mech_meta)}")
    print(measured.table(table_rows, [
        ("kernel", "name", ""), ("µs", "us", ".1f"), ("% of copy", "pct", ".0f"),
        ("DRAM / model", "ncu_dram_bytes_over_model", ".2f"), ("programs", "programs", ",d"),
        ("warps each", "num_warps", "d"), ("program floor µs", "floor_us", ".1f"),
        ("thread inst / element", "ncu_thread_inst_per_element", ".1f")]))
    # do_bench, one warp a program: programs that do nothing, and programs that each move a row
    empty, one_row = (next(r for r in cost_rows if r["kernel"] == k and r["num_warps"] == 1)
                      for k in ("empty", "one row"))
    print(f"{empty['programs']:,} one-warp programs ({cost_meta['gpu']}, do_bench): "
          f"{empty['us']:.1f} µs doing nothing, {one_row['us']:.1f} µs each moving a row; "
          f"{empty_ns[1]:.1f} ns of an SM's time a program")
    naive_m, reuse_m, finished_m = table_rows[1:4]
    assert "its flat pass, the rows kept" in mech["ropelib_planned"]["description"]
    shape = (naive_m["seq_len"], naive_m["batch"], naive_m["heads"], naive_m["head_dim"])
    assert shape == (4096, 8, 32, 128) and naive_m["dtype"] == "bf16"
    assert naive_m["elements"] * 2 == 256 * 2**20                # "(256 MiB)" of bf16 x
    assert naive_m["us"] > reuse_m["us"] > finished_m["us"]   # at this size: slowest first
    # the same bytes for all five: DRAM reads are the model's (x, the table), the writes (y)
    # come out a little under it, the copy's included
    for r in table_rows:
        model_reads = r["model_bytes"] - r["elements"] * 2                # all but y
        assert 0.99 < r["ncu_dram_read_bytes"] / model_reads < 1.03, r["name"]
        assert 0.9 < r["ncu_dram_write_bytes"] / (r["elements"] * 2) < 0.94, r["name"]
        assert 0.95 < r["ncu_dram_bytes_over_model"] < 0.98, r["name"]
    # other programs: a row each, a (token, head) each, a few thousand tiles
    assert naive_m["programs"] == 4096 * 8 * 32 == empty["programs"]
    assert naive_m["sm_count"] == 132 and round(empty_ns[1], 1) == 79.8
    # the programs explain the naive row, and no other: the grid's floor is under half its time
    assert abs(naive_m["us"] / naive_m["floor_us"] - 1) < 0.01
    assert all(r["floor_us"] < 0.65 * r["us"] for r in table_rows if r is not naive_m)
    assert reuse_m["floor_us"] < reuse_m["us"] / 2
    # the writes come out short by less than the H200's L2 holds (60 MiB, as Nsight Compute
    # reports the device: notebook 04, section 1)
    assert all(0 < r["elements"] * 2 - r["ncu_dram_write_bytes"] < 60 * 2**20 for r in table_rows)

# %% [markdown]
# The figure sets the five side by side: the time of each launch against the copy's and
# against its program floor (the red marks), and how many programs each starts.

# %%
if MECHANISM:
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    drawn = table_rows[::-1]                       # the copy on top
    names = [r["name"] for r in drawn]
    colors = [{"copy": "0.6", "ropelib": "C1", "ropelib_planned": "C2"}.get(r["variant"], "C0")
              for r in drawn]
    ax_t.barh(names, [r["us"] for r in drawn], color=colors)
    for i, r in enumerate(drawn):
        ax_t.text(r["us"] + 12, i, f"{r['pct']:.0f} % of a copy", va="center", fontsize=8)
    ax_t.scatter([r["floor_us"] for r in drawn], range(len(drawn)), marker="|", s=400,
                 color="C3", zorder=3, label="program floor (from do_bench's empty programs)")
    ax_t.set_xlim(0, 1.3 * max(r["us"] for r in table_rows))
    ax_t.set_xlabel("one launch under Nsight Compute (µs)")
    ax_t.legend(fontsize=8, loc="upper right")
    ax_p.barh(names, [r["programs"] for r in drawn], color=colors)
    for i, r in enumerate(drawn):
        warps = f"{r['num_warps']} warp" + "s" * (r["num_warps"] > 1)
        ax_p.text(r["programs"] * 1.15, i, f"{r['programs']:,} × {warps}", va="center", fontsize=8)
    ax_p.set_xscale("log")
    ax_p.set_xlim(1e3, 2e7)
    ax_p.set_xlabel("programs launched (log scale)")
    for ax in (ax_t, ax_p):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("The same bytes, other programs: the course's kernels on x [4096, 8, 32, 128] "
                 f"bf16\n{measured.where(mech_meta)}, Nsight Compute", fontsize=9)
    fig.tight_layout()
    fig.savefig(ropelib.runtime.figures_dir() / "00-three-kernels.png", dpi=120)
    plt.show()

# %% [markdown]
# All five move the same bytes ("DRAM / model" a little under 1: the writes come out short,
# likely lines of `y` still in the L2 cache, the on-chip cache between the SMs and DRAM, when
# counting stops; notebook 04, appendix A.5). What
# sets the naive kernel apart is its programs: its time equals its program floor, so on this
# H200 it takes as long as a million programs that do nothing. Every other row's floor is
# under two thirds of its time.
#
# **The floors, live (optional; its timings need a GPU).** The next cell times that empty kernel
# on your GPU at each row's grid and at the tour's two grids; "live / model" near 1 means the cost
# a program holds there too, and the last column is the floor's share of the tour kernel's own
# time. Notebook 03 (section 4) takes this apart.

# %%
@triton.jit
def empty_kernel(x_ptr):   # the kernel benchmarks/program_cost.py timed for the model; x_ptr
    pass                   # unused: each program starts and retires, nothing else


if MECHANISM:
    from ropelib.course.kernels.naive import default_num_warps, half_tile

    tour_warps = default_num_warps(half_tile(D)[1])      # the naive and grid kernels' warps
    assert B < naive_m["batch"]                            # fewer rows a grid program than there
    grids = {r["name"]: (r["programs"], r["num_warps"]) for r in table_rows}
    grids |= {f"tour: {name}": (n, tour_warps) for name, n in programs.items()}
    poisoned = torch.full((64,), float("nan"), device=device)
    for n, warps in set(grids.values()):      # each grid once; on a CPU a few programs of it
        empty_kernel[(n if GPU else min(n, 4),)](poisoned, num_warps=warps)
    assert poisoned.isnan().all(), "the empty kernel wrote something"
    sms = torch.cuda.get_device_properties(device).multi_processor_count if GPU else 132
    model = {g: g[0] / sms * empty_ns[g[1]] / 1e3 for g in grids.values()}   # µs
    if GPU:
        live = {g: triton.testing.do_bench(
                    lambda: empty_kernel[(g[0],)](poisoned, num_warps=g[1]),
                    return_mode="median") * 1e3           # as the committed run's medians
                for g in set(grids.values())}
        print(f"empty programs on {info['GPU']} ({sms} SMs), do_bench medians; the model from "
              f"{cost_meta['gpu']}'s {empty_ns[1]:.1f} ns a program")
        print(f"  {'launch':27s} {'programs':>10s} warps  model µs  live µs  live / model"
              "  share of the kernel's live time")
        for name, g in grids.items():
            tour = name.startswith("tour: ")              # a tour kernel, timed in ms above
            share = f"{100 * live[g] / (ms[name[6:]] * 1e3):5.0f} %" if tour else ""
            print(f"  {name:27s} {g[0]:>10,} {g[1]:5d} {model[g]:9.1f} {live[g]:8.1f} "
                  f"{live[g] / model[g]:12.2f}  {share}")
        one_warp = sorted((g for g in live if g[1] == 1), key=lambda g: g[0])
        assert len(one_warp) >= 2 and live[one_warp[-1]] > live[one_warp[0]], live  # more, longer
        if (1 << 20, 1) in live and (1 << 17, 1) in live:        # 8 times the programs
            assert live[1 << 20, 1] > 4 * live[1 << 17, 1], live
        for g in live:
            if model[g] >= 20:
                assert 1 / 3 < live[g] / model[g] < 3, (g, live[g], model[g])
        for name in programs:                      # no kernel runs faster than its programs
            assert ms[name] * 1e3 > 0.8 * live[grids[f"tour: {name}"]], name
    else:
        print(f"the empty kernel ran at {len(set(grids.values()))} grids, a few programs each, "
              "and wrote nothing; timing its programs needs a GPU. The model it would be set "
              f"beside ({sms} SMs, µs):")
        for name, g in grids.items():
            print(f"  {name:27s} {g[0]:>10,} programs x {g[1]} warps: {model[g]:7.1f}")

# %% [markdown]
# Read "live / model" row by row. Where it prints near 1, your GPU starts a program at about the
# H200's cost, and the model holds there. Where it prints well above 1 at a grid of a few
# thousand programs (the finished kernel's), something the model leaves out takes most of that
# time, most likely the launch's own fixed cost (this notebook does not time a launch on its
# own); it says nothing about the cost a program. In the last column, a
# share near 100 % means the tour kernel's time is its programs starting, as the naive kernel's
# is on the H200. A lower share, such as the batch-reusing grid's at $B = 4$, is the part of
# the time that starting programs takes, and says nothing about what the rest is.
#
# On the H100 run on this notebook's page in `docs/executed/`, "live / model" is
# 1.00<!--page: 03 naive--> to 1.18<!--page: tour: 04 batch-reusing grid--> for every grid of
# 32,768<!--page: tour: 04 batch-reusing grid--> programs or more, so the H200's
# 79.8<!--page: ns of an SM's time a program--> ns a program holds on that H100, and
# 2.73<!--page: 05 finished kernel--> for the finished kernel's 4,096<!--page: 05 finished kernel-->
# programs. The tour's naive kernel spends 99<!--page: tour: 03 naive--> % of its time starting
# programs, the batch-reusing grid 64<!--page: tour: 04 batch-reusing grid--> %. Notebook 04
# (sections 2 and 5.3) sets the grid against three floors; notebook 05 climbs to the finished kernel
# one change at a time.

# %% [markdown]
# ## 5. Where to go next
#
# The notebooks are in teaching order, each building on the ones before it. Three shorter routes
# through them: to **write kernels**, 01, then 03 → 04 → 05 → 06, then the puzzles of 13; to
# **use ropelib in a model**, 02 → 09, then 10, 11 or 12 as your model needs; to **compare
# with Transformer Engine**, 07 → 08.
#
# - [00 — Setup and a one-minute tour of `ropelib`](00-setup-and-tour.ipynb) (this notebook): what
#   is installed, compiled or interpreter mode, the API in one minute, a copy as the yardstick,
#   the course's three kernels side by side.
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
#   the two-pass route `apply_rope` takes on large tensors, load order in the SASS, a 3-D tile
#   kernel and a flat pass of your own (and two optional kernels that take them further).
# - [06 — The backward pass](06-backward-pass.ipynb): rotation by $-\theta$, one kernel for both
#   directions, `autograd.Function`, `gradcheck` in float64, stride-0 gradients, and the
#   backward kernel, its launcher and its `autograd.Function` written by you.
# - [07 — Transformer Engine vs Triton, live](07-te-vs-triton-live.ipynb): every provider on the
#   same inputs, errors in ulps, % of a copy, the dashboard, the sweeps, fixed cost vs bandwidth,
#   your own copy-and-rotate kernel in the race.
# - [08 — Debugging the `allclose` that failed](08-debugging-allclose.ipynb): why two correct
#   kernels fail `torch.allclose`, tolerances and ulps, matching TE bit for bit, six layout traps.
# - [09 — ropelib inside a real model: training parity, speed, and drop-in use](09-rope-in-a-model.ipynb):
#   a small GPT trained with and without ropelib, tokens/s and RoPE's share of a step, decoding
#   with a KV cache, the Hugging Face and TE drop-ins, and a RoPE kernel of your own trained
#   inside the model.
# - [10 — Multi-axis RoPE: M-RoPE for images and video, 2-D and 3-D axial RoPE](10-multi-axis-rope.ipynb):
#   Qwen2-VL / Qwen3-VL sections, image and video positions, axial RoPE, a multi-axis kernel of
#   your own that forms each token's angles once.
# - [11 — RoPE at scale: context parallelism, and decoding with the fused cache write](11-rope-at-scale.ipynb):
#   the dual-chunk split, RoPE at global positions (a rank's shard rotated in your own kernel),
#   two-process training, RoPE fused into the KV-cache write (contiguous, paged, fp8) with the
#   contiguous and paged kernels written by you, and the kernels one decoding step launches.
# - [12 — RoPE in the QKV projection: a GEMM epilogue, and a prologue for the backward](12-rope-in-the-qkv-projection.ipynb):
#   what fusing can save at most, the epilogue and the backward's prologue written by you, the
#   shipped projection measured against cuBLAS followed by a RoPE pass, and a slow fused kernel
#   traced to its causes.
# - [13 — RoPE puzzles](13-rope-puzzles.ipynb): twelve short kernels to write or repair, checked
#   at once in the interpreter. After a warm-up, nine are built on a mistake RoPE code makes (the
#   puzzle names the public report where there is one), one on loads a kernel wastes; the last,
#   a capstone, needs four of the fixes at once.

# %%
from pathlib import Path

notebooks = Path(ropelib.__file__).resolve().parents[1] / "notebooks"   # the checkout's copy
if (notebooks / "13-rope-puzzles.py").is_file():
    puzzles = (notebooks / "13-rope-puzzles.py").read_text(encoding="utf-8").count("# ## Puzzle ")
    assert puzzles == 12, puzzles                        # "twelve short kernels"
    print(f"notebook 13 has {puzzles} puzzles")
else:
    print("ropelib is installed without its notebooks/ folder: nothing to count")

# %% [markdown]
# ## Exercises
#
# Each check prints ✅ or ❌ and never stops the notebook. Replace the `...` and rerun; solutions
# are folded below each exercise. Each check bars ropelib's own answers.
#
# **Exercise 1.** Section 3 judged the 1 GiB call by its bytes per second. Write
# `my_rates(seq_len, batch, heads, head_dim, bytes_per_element, ms)` that returns
# `(tb_s, tflop_s)` for a RoPE forward of one `sbhd` tensor that took `ms` milliseconds: its
# bytes are `x` read and `y` written plus the fp32 angle table `[seq_len, head_dim]` read once,
# its FLOPs 3 an element. The check tries the committed H200 run's 1 GiB line and decoding
# step, and two calls drawn as it runs. Once your rates pass it prints the share of the H200's
# 4.8 TB/s: is the decoding step memory-bound?

# %%
from ropelib.course.exercises import basics, solution


def my_rates(seq_len, batch, heads, head_dim, bytes_per_element, ms):
    ...   # your code: (TB/s, TFLOP/s)


basics.check_call_rates(my_rates);

# %%
solution(basics.solution_call_rates)

# %% [markdown]
# **Exercise 2.** Section 4's table gives each kernel a program floor. Write
# `my_program_floor_us(programs, sms, empty_programs, empty_us)`: the program floor in µs of a
# kernel of `programs` programs on a GPU of `sms` SMs, where a kernel of `empty_programs`
# programs that do nothing took `empty_us` µs. The check tries section 4's five rows and two
# GPUs drawn as it runs; once yours passes it prints each row's floor against its time.

# %%
from ropelib.course.exercises import nb00_program_floor


def my_program_floor_us(programs, sms, empty_programs, empty_us):
    ...   # your code: µs


nb00_program_floor.check_program_floor(my_program_floor_us);

# %%
solution(nb00_program_floor.solution_program_floor_us)

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
# in fp32 and rounded once, as the kernel does. With the **interleaved** pairing (GPT-J
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

# %%
solution(basics.solution_interleaved_rope)

# %% [markdown]
# **Exercise 4 (optional: about 30 minutes, a first kernel of your own).** `copy_kernel` starts
# one program per `BLOCK` elements, so its program floor grows with `n`. Write
# `my_strided_copy_kernel`, a copy on a fixed grid: launched on `P` programs, program `p` copies
# blocks `p, p + P, p + 2P, ...` of `BLOCK` elements until the `n` are done (`tl.num_programs(0)`
# is `P`). The check runs yours in the interpreter on grids far smaller than the blocks, one with
# `n` drawn as it runs, into a `y` that starts as NaN, and counts the elements of `x` it reads,
# with the notebook's own kernels and ropelib's barred.
#
# Then predict, before anything is timed: `my_max_saving_us(n, BLOCK, programs, sms,
# empty_programs, empty_us)`, the most µs a fixed grid of `programs` programs can save against
# `copy_kernel`, the difference of their program floors (exercise 2's function does the work).
# The check draws cases as it runs. The cell after the solutions feeds yours the committed H200
# empty run of 4 warps (Triton's default) and, on a GPU, times your kernel (the worked one until
# yours passes) at 1, 4 and 16 programs an SM against `copy_kernel`, each saving beside your
# prediction.
#
# The floors bound what a fixed grid can save, but a small grid can also lose. In the worked
# kernel's machine code for sm_90 (the H100's and H200's architecture; the cell compiles it on
# the CPU and asserts this) each pass of the loop issues one load of its block, then the store of
# it, then loops: a program has one block, 2 KiB of bf16, of loads in flight. To read as fast as
# `copy_kernel`, an SM needs, by Little's law (notebook 05, section 2),
#
# $$ \text{bytes in flight per SM} = \frac{\text{the copy kernel's read rate}}{\text{SMs}}
#    \times \text{the latency its loads see}. $$
#
# The only committed latency is the H200's (`memory_latency-nvidia-h200.csv`), so on any other
# GPU the needs the cell prints are estimates. It prints two:
#
# - at DRAM's **idle** latency: a **lower bound**. DRAM answers no load sooner, so a grid below
#   it is slower than `copy_kernel` (the cell asserts it), its saving negative whatever the
#   floors allow;
# - at DRAM's **busy** latency (measured beside a copy): the **working estimate**. A grid that
#   reads at the copy's rate is itself a copy at full speed, so its loads wait as a busy DRAM's
#   do, and that longer latency is the one it must cover.
#
# The cell times three grids, not a sweep, so it cannot say exactly where between the two
# figures the need of your GPU lies.
#
# Read the printed rows that way: set each grid's KiB in flight beside the two needs, and its saving
# beside the most the floors allow. A grid below the idle need prints a clearly negative saving. A
# grid between the two needs is short of the working estimate, and a clearly negative saving there
# is what that estimate predicts. A grid above both needs that prints a saving near 0, far under the
# floors' bound, keeps enough in flight but wins nothing: the bytes, not the programs, set the
# copy's time at this size. The H100 run on this notebook's page in `docs/executed/` (needs of
# 3.1<!--page: Little's law--> KiB idle and 11.1<!--page: Little's law--> KiB busy, from the H200's
# latencies) shows all three: 2<!--page: KiB in flight--> KiB in flight at
# 1<!--page: KiB in flight--> program an SM, a saving of -44.1<!--page: KiB in flight--> µs;
# 8<!--page: KiB in flight--> KiB at 4<!--page: KiB in flight-->, -6.5<!--page: KiB in flight--> µs;
# 32<!--page: KiB in flight--> KiB at 16<!--page: KiB in flight-->, 0.0<!--page: KiB in flight--> µs
# where the floors allowed 8.6<!--page: KiB in flight-->.

# %%
from ropelib.course.exercises import nb00_strided_copy


@triton.jit
def my_strided_copy_kernel(
    x_ptr,  # *x: input, n elements, contiguous
    y_ptr,  # *y: output, n elements, contiguous
    n,  # elements to copy
    BLOCK: tl.constexpr,  # elements a program copies at a time, a power of two
):
    # launched on grid (P,), any P >= 1: program p copies blocks p, p + P, p + 2P, ...
    pass  # your code


def my_max_saving_us(n, BLOCK, programs, sms, empty_programs, empty_us):
    ...   # your code: µs


strided_ok = nb00_strided_copy.check_strided_copy(my_strided_copy_kernel)
saving_ok = nb00_strided_copy.check_max_saving(my_max_saving_us)

# %%
nb00_strided_copy.show_strided_copy_solution()
solution(nb00_strided_copy.solution_max_saving_us)

# %%
sms = torch.cuda.get_device_properties(device).multi_processor_count if GPU else 132
fixed = my_strided_copy_kernel if strided_ok else nb00_strided_copy.solution_strided_copy_kernel
whose = "yours" if strided_ok else "the worked kernel"
predict = my_max_saving_us if saving_ok else nb00_strided_copy.solution_max_saving_us
empty4 = next((r for r in cost_rows if r["kernel"] == "empty" and r["num_warps"] == 4),
              None) if MECHANISM else None
y_fixed, fixed_us = torch.empty_like(x), {}
for per_sm in (1, 4, 16):                      # the interpreter: 1, 4 and 16 programs
    def launch_fixed(grid=per_sm * sms if GPU else per_sm):
        fixed[(grid,)](x, y_fixed, x.numel(), BLOCK=1024)

    y_fixed.fill_(float("nan"))
    launch_fixed()
    assert torch.equal(y_fixed, x), per_sm
    if GPU:
        fixed_us[per_sm] = triton.testing.do_bench(launch_fixed) * 1e3
n_gpu = x.numel() if GPU else 2048 * 4 * 16 * 128      # the tour's x on a GPU
predicted = {per_sm: predict(n_gpu, 1024, per_sm * sms, sms, empty4["programs"], empty4["us"])
             for per_sm in (1, 4, 16)} if empty4 else {}
label = "your prediction" if saving_ok else "the worked prediction, until yours passes"
# the worked kernel for sm_90 (4 warps, Triton's default): one load, then one store, a pass
from ropelib.course import nb04_load_order
stand_in = torch.empty(16, dtype=x.dtype)           # on the CPU: only the dtype matters
order4 = nb04_load_order.load_order(
    nb00_strided_copy.solution_strided_copy_kernel,
    dict(x_ptr=stand_in, y_ptr=stand_in, n=x.numel(), BLOCK=1024), num_warps=4,
    x_bytes_per_thread=16)
print(f"the worked kernel, sm_90 (Triton {order4['triton']}): loads and stores in the machine "
      f"code {nb04_load_order.runs(order4['seq'])}; a program has "
      f"{4 * order4['in_flight'] // 1024} KiB of x asked for before its store")
assert order4["seq"] == "LS" and 4 * order4["in_flight"] == 1024 * x.element_size()
in_flight_kib = {per_sm: per_sm * 1024 * x.element_size() / 1024 for per_sm in (1, 4, 16)}
lat_meta, lat_rows = (measured.load("memory_latency")    # notebook 05, section 2
                      if measured.path("memory_latency").is_file() else ({}, []))
dram_ns = {r["condition"]: r["ns_per_load"] for r in lat_rows
           if r["measure"] == "latency" and r["footprint_bytes"] == 2**30}
lat_text = (f"{lat_meta['gpu']}'s DRAM latency, {dram_ns['idle']:.0f} ns idle and "
            f"{dram_ns['loaded']:.0f} ns busy" if dram_ns else "no committed latency")
if GPU:
    copy_us = triton.testing.do_bench(copy_with_kernel) * 1e3
    w_read = x_bytes / (copy_us * 1e-6)                   # copy_kernel's reads, bytes a second
    need_kib = {c: w_read / sms * ns * 1e-9 / 1024 for c, ns in dram_ns.items()}  # Little's law
    print(f"x {tuple(x.shape)} on {info['GPU']}, do_bench: copy_kernel, "
          f"{triton.cdiv(x.numel(), 1024):,} programs, {copy_us:.1f} µs, reading "
          f"{w_read / 1e12:.2f} TB/s" + (f"; Little's law with {lat_text}: an SM needs "
          f"{need_kib['idle']:.1f} KiB of loads in flight idle, {need_kib['loaded']:.1f} busy"
                                        if need_kib else ""))
    for per_sm, us in fixed_us.items():
        print(f"  {whose}, {per_sm * sms:5,} programs ({per_sm:2d} an SM, "
              f"{in_flight_kib[per_sm]:4.0f} KiB in flight): {us:6.1f} µs, saving "
              f"{copy_us - us:5.1f} µs" + (f"; at most {predicted[per_sm]:.1f} µs ({label})"
                                           if predicted else ""))
        if predicted:                  # the floors bound the saving (H200's cost a program)
            assert copy_us - us < 1.5 * predicted[per_sm] + 1.0, (per_sm, us, copy_us)
    if need_kib and in_flight_kib[1] < need_kib["idle"]:   # too few to read at the copy's rate
        assert fixed_us[1] > copy_us, (fixed_us, copy_us)
else:
    print(f"the fixed-grid copy ({whose}) ran on 1, 4 and 16 programs and is right. On a GPU "
          f"this cell times it on {sms}, {4 * sms} and {16 * sms} programs against copy_kernel, "
          "sets each saving beside the most it can be"
          + (f" ({label}: " + ", ".join(f"{v:.1f} µs at {k * sms:,} programs"
                                          for k, v in predicted.items()) + ")"
             if predicted else "")
          + " and each grid's KiB of loads in flight an SM ("
          + ", ".join(f"{v:.0f}" for v in in_flight_kib.values())
          + f") beside what Little's law asks at copy_kernel's read rate ({lat_text})")

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
# 4. The TE drop-in's fused and unfused paths differ by bf16 rounding. Moving a production
#    model from one to the other, what evidence would convince you the switch is safe: bitwise
#    equality, `allclose`, matching loss curves? (Notebooks 08 and 09 come back to this.)
# 5. Most of a decoding step's RoPE call is work a CUDA graph removes and a faster kernel does
#    not (section 3). What does capturing a graph cost a serving stack, and what else could
#    take the host out? Think of what else reads or writes the same query and key bytes in the
#    same step, so that RoPE could ride along (one launch instead of two). Notebooks 07, 11 and
#    12 each try one answer; guess which before you open them.
