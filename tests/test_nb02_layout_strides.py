"""Notebook 02, section 1: the table of layouts, their contiguous strides and the offset of
element (s, b, h, d), held against PyTorch's own strides; the views the text names (a `bshd`
view of `sbhd` memory, HF's `[B, H, S, D]` query as a view of `bshd` memory) and the strides the
text quotes for the CPU's shape."""
from pathlib import Path

import pytest
import torch

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02-pytorch-reference-and-layouts.py"

# the table's rows: (s, b, h, d) -> the dimension order of the tensor, strides, offset
SHAPES = {"sbhd": lambda S, B, H, D: (S, B, H, D), "bshd": lambda S, B, H, D: (B, S, H, D),
          "bhsd": lambda S, B, H, D: (B, H, S, D)}
STRIDES = {"sbhd": lambda S, B, H, D: (B * H * D, H * D, D, 1),       # (sigma_s, b, h, d)
           "bshd": lambda S, B, H, D: (H * D, S * H * D, D, 1),
           "bhsd": lambda S, B, H, D: (D, H * S * D, S * D, 1)}
OFFSET = {"sbhd": lambda s, b, h, d, S, B, H, D: ((s * B + b) * H + h) * D + d,
          "bshd": lambda s, b, h, d, S, B, H, D: ((b * S + s) * H + h) * D + d,
          "bhsd": lambda s, b, h, d, S, B, H, D: ((b * H + h) * S + s) * D + d}
ORDER = {"sbhd": (0, 1, 2, 3), "bshd": (1, 0, 2, 3), "bhsd": (2, 0, 1, 3)}   # tensor dim of s,b,h,d


@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("S, B, H, D", [(16, 2, 3, 32), (5, 3, 7, 8), (4096, 4, 32, 128)])
def test_each_layouts_strides_and_offsets(layout, S, B, H, D):
    x = torch.empty(SHAPES[layout](S, B, H, D), device="meta")
    by_sbhd = tuple(x.stride()[ORDER[layout][i]] for i in range(4))   # (sigma_s, b, h, d)
    assert by_sbhd == STRIDES[layout](S, B, H, D)
    if S * B * H * D <= 10_000:
        flat = torch.arange(S * B * H * D).view(SHAPES[layout](S, B, H, D))
        for s, b, h, d in [(0, 0, 0, 0), (S - 1, B - 1, H - 1, D - 1), (S // 2, B - 1, 1 % H, 3)]:
            idx = [None] * 4
            for v, dim in zip((s, b, h, d), ORDER[layout]):
                idx[dim] = v
            assert flat[tuple(idx)] == OFFSET[layout](s, b, h, d, S, B, H, D)
            assert flat[tuple(idx)] == sum(i * st for i, st in zip((s, b, h, d), by_sbhd))


def test_thd_offset_is_its_packed_row():
    H, D, lengths = 3, 8, [5, 11, 3]
    cu = [0, 5, 16, 19]
    flat = torch.arange(sum(lengths) * H * D).view(sum(lengths), H, D)
    assert flat.stride() == (H * D, D, 1)
    for b, n in enumerate(lengths):
        for s in (0, n - 1):
            assert flat[cu[b] + s, 2, 7] == ((cu[b] + s) * H + 2) * D + 7


def test_the_views_the_text_names_and_the_strides_it_quotes():
    S, B, H, D = 16, 2, 3, 32                          # the notebook's CPU shape
    x_sbhd = torch.empty(S, B, H, D)
    x_bshd = x_sbhd.transpose(0, 1)                    # sbhd's strides, in bshd's order
    assert x_sbhd.stride() == (192, 96, 32, 1) and x_bshd.stride() == (96, 192, 32, 1)
    assert (x_bshd.stride(1), x_bshd.stride(0)) == (B * H * D, H * D)
    assert (x_bshd.stride(1), x_bshd.stride(0)) != (STRIDES["bshd"](S, B, H, D)[:2])
    # HF: q_proj(x).view(B, S, H, D).transpose(1, 2) -> [B, H, S, D] with bshd's strides
    q = torch.empty(B, S, H * D).view(B, S, H, D).transpose(1, 2)
    assert q.shape == (B, H, S, D) and not q.is_contiguous()
    assert (q.stride(2), q.stride(0), q.stride(1), q.stride(3)) == STRIDES["bshd"](S, B, H, D)
    text = NOTEBOOK.read_text(encoding="utf-8")
    for quoted in ("(192, 96, 32, 1)", "(96, 192, 32, 1)", "$(S, B, H, D) = (16, 2, 3, 32)$"):
        assert quoted in text, quoted
    # the notebook's CPU shape is the one quoted
    assert "S, B, H, D = (4096, 4, 32, 128) if GPU else (16, 2, 3, 32)" in text
