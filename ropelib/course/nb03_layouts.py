"""Which bytes one warp's load touches, read from a compiled kernel (notebook 03, section 5).

Notebook 03 compiles its pair swap for sm_90 (`offline_compile.compiled_code`, no GPU needed) in
two forms: (c), a `[ROWS, D/2, 2]` tile of pairs, and (d), whole rows reshaped in registers. From
the TTGIR it reads the `#ttg.blocked` layout of the tile the `tt.load` reads (`load_layout`),
from the PTX the width of the load instruction (`lane_bytes`), and from the two it works out the
rows, the bytes of each row and the 32-byte sectors one warp's load instruction touches
(`one_warp_load`), to set beside the H200's counters. `pair_swap_layouts` does all three for
compiled code of both forms.
"""
import collections
import re
from typing import Dict, List, Tuple

__all__ = ["blocked_layout", "load_layout", "lane_bytes", "one_warp_load", "pair_swap_layouts"]


def load_layout(ttgir: str) -> Tuple[List[int], Dict[str, List[int]], str]:
    """(shape, fields, text) of the #ttg.blocked layout of the bf16 tile the first tt.load reads:
    fields maps sizePerThread, threadsPerWarp, warpsPerCTA and order to their lists."""
    load = r"tt\.load .* : tensor<([\dx]+)x!tt\.ptr<bf16>, (#\w+)>"
    shape, name = re.search(load, ttgir).groups()
    fields, text = blocked_layout(ttgir, name)
    return [int(n) for n in shape.split("x")], fields, text


def blocked_layout(ttgir: str, name: str) -> Tuple[Dict[str, List[int]], str]:
    """(fields, text) of the TTGIR's layout `name` (e.g. "#blocked1"): fields maps
    sizePerThread, threadsPerWarp, warpsPerCTA and order to their lists. Raises ValueError where
    `name` is not a #ttg.blocked layout."""
    text = re.search(rf"^{name} = (#ttg\.blocked<\{{[^}}]*\}}>)", ttgir, re.M)
    if text is None:
        raise ValueError(f"the layout {name} is not a #ttg.blocked layout")
    fields = {k: [int(v) for v in vals.split(",")]
              for k, vals in re.findall(r"(\w+) = \[([\d, ]*)\]", text[1])}
    return fields, text[1]


def lane_bytes(op: str) -> int:
    """Bytes one lane moves in a PTX access: ld.global.b32 4, ld.global.v4.b32 16."""
    vec = re.search(r"\.v(\d+)\.", op)
    return (int(vec[1]) if vec else 1) * int(re.search(r"\.b(\d+)", op)[1]) // 8


def one_warp_load(shape: List[int], L: Dict[str, List[int]], nbytes: int, D: int = 128,
                  elem: int = 2) -> Tuple[int, int, int]:
    """(rows, bytes of each row, sectors) of one warp's load instruction: lane t sits at the
    coordinates its index gives over threadsPerWarp (the axes taken in `order`, fastest first),
    times sizePerThread, and loads nbytes from there; a row of x is D elements of elem bytes, the
    tile [rows, D] or [rows, D/2, 2]."""
    starts = []
    for lane in range(32):
        at, rest = [0] * len(shape), lane
        for axis in L["order"]:
            at[axis] = rest % L["threadsPerWarp"][axis] * L["sizePerThread"][axis] % shape[axis]
            rest //= L["threadsPerWarp"][axis]
        in_row = 2 * at[1] + at[2] if len(shape) == 3 else at[1]
        starts.append((at[0], (at[0] * D + in_row) * elem))
    used = {(r, a + k) for r, a in starts for k in range(nbytes)}
    rows = {r for r, _ in used}
    return len(rows), len(used) // len(rows), len({a // 32 for _, a in used})


def pair_swap_layouts(built: Dict[str, dict]) -> Dict[str, dict]:
    """For each form ("c", "d") of `built` (compiled_code's dicts): the load tile's shape, its
    layout's fields and text, the PTX's global load/store ops (a Counter), the load op and how
    many a program runs, and one warp's load (rows, bytes a row, sectors)."""
    out = {}
    for name in ("c", "d"):
        shape, L, text = load_layout(built[name]["ttgir"])
        ops = collections.Counter(re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*", built[name]["ptx"]))
        (ld, n_ld), = [(op, n) for op, n in ops.items() if op.startswith("ld")]
        rows, per_row, sectors = one_warp_load(shape, L, lane_bytes(ld))
        out[name] = dict(shape=shape, L=L, text=text, ops=ops, ld=ld, n_ld=n_ld, rows=rows,
                         per_row=per_row, sectors=sectors)
    return out
