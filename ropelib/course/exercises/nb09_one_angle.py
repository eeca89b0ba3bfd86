"""Notebook 09's exercise 4 (appendix A.5): exercise 3's kernel with one angle a pair.

The model's angle table is TE's cat(f, f): theta_{j + D/2} = theta_j, so one sine and one cosine
serve both members of a rotate-half pair, where exercise 3's worked kernel takes a sine and a
cosine for each. :func:`check_one_angle_kernel` asks two things of the learner's kernel: exercise
3's check (`in_a_model.check_model_rope_kernel`: the rotation, a small GPT trained with it,
ropelib's kernels and every worked solution barred), then, compiled for sm_90 as the notebook's
counts are (`offline_compile.compiled_code`, no GPU needed), at most one sine or cosine an element
in its Triton GPU IR (:func:`trig_per_element`).
"""
from __future__ import annotations

import math
import re

import torch

from ..offline_compile import compiled_code
from . import exception_line
from .in_a_model import check_model_rope_kernel

__all__ = ["check_one_angle_kernel", "trig_per_element"]

_NAME = "one angle a pair"
_TRIG = re.compile(r"= math\.(?:sin|cos) [^\n]*?: tensor<([\dx]+)xf32")
_SHAPE = (2, 16, 3, 64)          # (B, S, H, D) of the compiled q, a strided view of a QKV output
_ROWS, _WARPS = 4, 4


def trig_per_element(kernel, rows: int = _ROWS) -> float:
    """Sines and cosines per element of `kernel` (exercise 3's signature) in its Triton GPU IR,
    compiled for sm_90 on a bf16 q view of a QKV output at `rows` rows a program: the elements
    of every `math.sin` and `math.cos` over the ROWS x D elements a program rotates."""
    B, S, H, D = _SHAPE
    q = torch.empty(B, S, 3, H, D, dtype=torch.bfloat16)[:, :, 0]
    code = compiled_code(kernel, dict(
        x_ptr=q, y_ptr=torch.empty(1, dtype=torch.bfloat16), freqs_ptr=torch.empty(1),
        n_rows=B * S * H, S=S, H=H, stride_xb=q.stride(0), stride_xs=q.stride(1),
        stride_xh=q.stride(2), stride_xd=1, stride_fs=D, stride_fd=1, HALF=D // 2,
        BLOCK_HALF=D // 2, ROWS=rows), num_warps=_WARPS)
    trig = sum(math.prod(int(n) for n in shape.split("x"))
               for shape in _TRIG.findall(code["ttgir"]))
    return trig / (rows * D)


def check_one_angle_kernel(kernel, *, seed=None) -> bool:
    """Exercise 4: `kernel` passes exercise 3's check and compiles to at most one sine or cosine
    an element. Prints ✅ or ❌ (with why); never raises."""
    if not check_model_rope_kernel(kernel, seed=seed):
        print(f"❌ {_NAME}: the kernel must first pass exercise 3's check (the line above)")
        return False
    try:
        per_element = trig_per_element(kernel)
    except Exception as exc:  # noqa: BLE001 -- a checker must not stop the notebook
        print(f"❌ {_NAME}: the kernel did not compile for sm_90 ({exception_line(exc)})")
        return False
    if per_element <= 1:
        print(f"✅ {_NAME}: {per_element:g} sine or cosine an element in the compiled kernel "
              "(exercise 3's worked kernel: 2)")
        return True
    print(f"❌ {_NAME}: {per_element:g} sines and cosines an element in the compiled kernel; one "
          "angle a pair takes 1\n   hint: the table is TE's cat(f, f), theta_(j + D/2) = "
          "theta_j: load the first half of the row's angles once and rotate both halves with "
          "its cosine and sine")
    return False
