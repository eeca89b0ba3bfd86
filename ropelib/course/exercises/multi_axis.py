"""Exercises of notebook 10 (multi-axis RoPE): the axis of each frequency pair, and the
positions of an image grid after text.

Each `check_...` calls the learner's function on several cases and compares it with what
ropelib.mrope computes (never a hard-coded answer); `solution_...` are the worked answers the
notebook shows folded away (tests/test_mrope.py checks that they pass).
"""
from typing import Callable

import torch

from ... import mrope
from . import _compare, call_answer, check


def _cases(name: str, fn: Callable, cases, hint: str) -> bool:
    answer = expected = None
    for label, args, expected in cases:
        ok, answer = call_answer(f"{name} ({label})", fn, *args)
        if not ok:
            return False
        if isinstance(answer, (list, tuple)):
            answer = torch.as_tensor(answer)
        same, _ = _compare(answer, expected, None, None)
        if not same:
            return check(f"{name} ({label})", answer, expected, hint=hint)
    return check(name, answer, expected, hint=hint)


# --- 1. which axis does frequency pair j follow? ---------------------------------------------

def check_axis_of_pairs(fn: Callable) -> bool:
    """fn(section, interleaved) -> [sum(section)] ints: the axis of each frequency pair, with
    contiguous sections (Qwen2-VL) or Qwen3-VL's round-robin rule (interleaved=True)."""
    cases = [(f"{s}, interleaved={i}", (list(s), i),
              mrope.axis_of_pairs(s, "mrope_interleaved" if i else "mrope").long())
             for s, i in (([16, 24, 24], False), ([2, 3, 3], False), ([24, 20, 20], True),
                          ([3, 3, 2], True), ([8, 8], False))]
    return _cases("axis of each pair", fn, cases,
                  hint="contiguous: section[0] zeros, then section[1] ones, ...; interleaved: "
                       "start all 0, then pair j takes axis a >= 1 when j % n == a and "
                       "j < n * section[a]")


def solution_axis_of_pairs(section, interleaved):
    n, half = len(section), sum(section)
    if not interleaved:
        return torch.repeat_interleave(torch.arange(n), torch.tensor(section))
    axis = torch.zeros(half, dtype=torch.long)
    j = torch.arange(half)
    for a in range(1, n):
        axis[(j % n == a) & (j < n * section[a])] = a
    return axis


# --- 2. the positions of text, then an image --------------------------------------------------

def _text_then_image(n_text: int, h: int, w: int) -> torch.Tensor:
    text = torch.arange(n_text).expand(3, n_text)
    image = mrope.grid_positions(1, h, w, start=n_text)
    after = int(image.max()) + 1
    return torch.cat([text, image, torch.tensor([[after]] * 3)], 1)


def check_text_then_image(fn: Callable) -> bool:
    """fn(n_text, h, w) -> [3, n_text + h*w + 1] positions (time, row, column): n_text text
    tokens, one image of h x w patches in raster order, then one more text token."""
    cases = [(f"n_text={n}, {h}x{w}", (n, h, w), _text_then_image(n, h, w))
             for n, h, w in ((3, 2, 2), (0, 1, 4), (5, 3, 2), (1, 4, 4))]
    return _cases("text-then-image positions", fn, cases,
                  hint="text token i: (i, i, i); the image starts every axis at n_text and adds "
                       "its row to axis 1, its column to axis 2; the next text token continues "
                       "at one past the largest position used so far")


def solution_text_then_image(n_text, h, w):
    text = torch.arange(n_text).expand(3, n_text)
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack([torch.zeros(h * w, dtype=torch.long), rows.reshape(-1),
                         cols.reshape(-1)]) + n_text
    nxt = int(image.max()) + 1
    return torch.cat([text, image, torch.full((3, 1), nxt)], 1)
