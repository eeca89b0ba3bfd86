"""Which warps of puzzle 5's kernel hold an angle on libdevice's long path (notebook 13).

Puzzle 5's worked solution evaluates sin and cos of fp32 angles position x inv_freq[j], one
per (row, pair) of a program's [BLOCK_ROWS, HALF] tile. libdevice's `sinf` and `cosf` reduce an
angle with |angle| < 105,615 in a few multiply-adds and branch to a long reduction (Payne-Hanek,
a loop over the bits of 2/pi) at |angle| >= 105,615 (the PTX: `setp.ltu.f32 ..., 0f47CE4780`
branches to the short path). The 32 threads of a warp issue together, so a warp in which one
thread branches to the long path runs it, and its other threads wait (SIMT divergence).

Which thread holds which angle is the layout the compiler chose for the tile: a `#ttg.blocked`
layout in the TTGIR, read here from the tile `math.sin` and `math.cos` take (`angle_layout`).
`holders(shape, fields)` places every element of the tile on (warp, lane, slot) from that
layout's four fields: a thread holds `sizePerThread` neighbouring elements, the lanes of a warp
tile `threadsPerWarp`, the warps `warpsPerCTA`, each index split over the axes fastest first in
`order`; a tile larger than that repeats it (more slots a thread), a smaller one wraps (an
element held by several threads). A thread's slot s is its s-th element: one compare with
105,615 (and one branch) in the machine code, for every lane of a warp at once.

`count(positions, inv_freq, block_rows=..., shape=..., fields=...)` computes the angles as the
kernel does (the fp32 position times the fp32 inv_freq, one rounding; rows past the end load
position 0), marks those on the long path, and counts over every program of the launch: rows,
threads, warps and (warp, slot) pairs that hold at least one, out of all of them. Nothing is run
on a GPU: what a long-path warp costs in time is not measured here.
"""
import collections
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from ropelib.course.nb03_layouts import blocked_layout

__all__ = ["LONG_PATH_FROM", "LongPathCount", "angle_layout", "holders", "count"]

LONG_PATH_FROM = 105615.0       # libdevice's sinf/cosf: the long reduction at |angle| >= this


def angle_layout(ttgir: str) -> Tuple[List[int], Dict[str, List[int]], str]:
    """(shape, fields, text) of the `#ttg.blocked` layout of the fp32 tile the TTGIR's first
    `math.sin` or `math.cos` takes: fields maps sizePerThread, threadsPerWarp, warpsPerCTA and
    order to their lists. Raises ValueError where there is no such op or the layout is not
    blocked."""
    m = re.search(r"math\.(?:sin|cos) %\S+ : tensor<([\dx]+)xf32, (#\w+)>", ttgir)
    if m is None:
        raise ValueError("no math.sin or math.cos on an fp32 tensor in this TTGIR")
    shape, name = m.groups()
    fields, text = blocked_layout(ttgir, name)
    return [int(n) for n in shape.split("x")], fields, text


def _split(index: int, sizes: List[int], order: List[int]) -> List[int]:
    """`index` as coordinates over `sizes`, the axes taken fastest first in `order`."""
    at = [0] * len(sizes)
    for axis in order:
        at[axis] = index % sizes[axis]
        index //= sizes[axis]
    return at


def holders(shape: List[int], fields: Dict[str, List[int]]) -> List[Tuple[int, int, int, tuple]]:
    """[(warp, lane, slot, element index)] of every element every thread of one program holds
    in a blocked layout (see the module docstring), for a tile of power-of-two `shape`."""
    spt, tpw, wpc, order = (fields[k] for k in ("sizePerThread", "threadsPerWarp",
                                                "warpsPerCTA", "order"))
    rank = len(shape)
    assert all(len(f) == rank for f in (spt, tpw, wpc, order)), (shape, fields)
    assert all(n > 0 and n & (n - 1) == 0 for n in shape), f"not powers of two: {shape}"
    tile = [spt[d] * tpw[d] * wpc[d] for d in range(rank)]
    reps = [max(1, shape[d] // tile[d]) for d in range(rank)]
    out = []
    for warp in range(math.prod(wpc)):
        w_at = _split(warp, wpc, order)
        for lane in range(math.prod(tpw)):
            l_at = _split(lane, tpw, order)
            base = [w_at[d] * spt[d] * tpw[d] + l_at[d] * spt[d] for d in range(rank)]
            slot = 0
            for r in range(math.prod(reps)):        # repetitions of the layout's tile
                r_at = _split(r, reps, order)
                for k in range(math.prod(spt)):     # a thread's neighbouring elements
                    k_at = _split(k, spt, order)
                    at = tuple((r_at[d] * tile[d] + base[d] + k_at[d]) % shape[d]
                               for d in range(rank))
                    out.append((warp, lane, slot, at))
                    slot += 1
    return out


@dataclass
class LongPathCount:
    """What `count` found over one launch; each pair is (holding a long-path angle, all)."""
    programs: int
    rows: Tuple[int, int]          # real rows (past the end not counted)
    angles: Tuple[int, int]        # real (row, pair) angles
    threads: Tuple[int, int]       # every thread launched
    warps: Tuple[int, int]         # every warp launched
    warp_slots: Tuple[int, int]    # (warp, slot): a compare the warp runs, all its lanes at once
    lanes_in_long_warps: Dict[int, int] = field(default_factory=dict)  # lanes long: warps


def count(positions: torch.Tensor, inv_freq: torch.Tensor, *, block_rows: int,
          shape: List[int], fields: Dict[str, List[int]],
          threshold: float = LONG_PATH_FROM) -> LongPathCount:
    """Count the long-path angles of puzzle 5's launch over `positions` [N] (ints) with
    `inv_freq` [HALF] (fp32), `block_rows` rows a program, by the thread, warp and (warp, slot)
    that holds them in the layout `fields` of the [block_rows, HALF] angle tile `shape`."""
    n, half = positions.numel(), inv_freq.numel()
    assert list(shape) == [block_rows, half], (shape, block_rows, half)
    programs = -(-n // block_rows)
    pos = torch.zeros(programs * block_rows, dtype=torch.float32)
    pos[:n] = positions.cpu().to(torch.float32)          # rows past the end load position 0
    angle = pos[:, None] * inv_freq.cpu().to(torch.float32)[None, :]   # fp32, one rounding
    long = (angle.abs() >= threshold).view(programs, block_rows, half)

    held = holders(list(shape), fields)
    warp, lane, slot = (torch.tensor([h[i] for h in held]) for i in range(3))
    row, pair = (torch.tensor([h[3][i] for h in held]) for i in range(2))
    n_warps, n_lanes = int(warp.max()) + 1, int(lane.max()) + 1
    n_slots = int(slot.max()) + 1
    on = long[:, row, pair].to(torch.int32)              # [programs, held elements]

    def holding(ids: torch.Tensor, n_ids: int) -> torch.Tensor:
        """[programs, n_ids]: long-path elements each id (a warp, thread, ...) holds."""
        return torch.zeros(programs, n_ids, dtype=torch.int32).index_add_(1, ids, on)

    by_warp = holding(warp, n_warps)
    by_thread = holding(warp * n_lanes + lane, n_warps * n_lanes)
    by_slot = holding(warp * n_slots + slot, n_warps * n_slots)
    lanes = (by_thread > 0).view(programs, n_warps, n_lanes).sum(-1)[by_warp > 0]
    return LongPathCount(
        programs=programs,
        rows=(int(long.view(-1, half)[:n].any(1).sum()), n),
        angles=(int(long.view(-1, half)[:n].sum()), n * half),
        threads=(int((by_thread > 0).sum()), programs * n_warps * n_lanes),
        warps=(int((by_warp > 0).sum()), programs * n_warps),
        warp_slots=(int((by_slot > 0).sum()), programs * n_warps * n_slots),
        lanes_in_long_warps=dict(sorted(collections.Counter(lanes.tolist()).items())))
