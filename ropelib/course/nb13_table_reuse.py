"""Notebook 13, puzzle 9: what do the given kernel's repeated table loads cost, and why?

One kernel, puzzle 9's given kernel with the table's strides as arguments, is launched on two
layouts of the same cos/sin values: one table [S, HALF] shared by the batch (its B loads of a
row are the same bytes, which a cache can serve) and a table per batch entry [S, B, HALF] (the
same load instructions, each on bytes no other load touches, so each comes from DRAM). Beside
them, puzzle 9's worked solution, which loads each row once, at its timed tile and at
BLOCK_S=16 (the committed sweep's other tile). Each is timed against a device
copy of the bytes it touches, read from checked memory at a small shape (`touched`).
"""
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import triton
import triton.language as tl

from ropelib import runtime
from ropelib.course import puzzles as pz


@triton.jit
def _rope_table_rows_kernel(
    x_ptr,  # *fp32: x [S, B, 2 * HALF], contiguous
    cos_ptr,  # *fp32: cos table, row (s, b) at s * stride_ts + b * stride_tb
    sin_ptr,  # *fp32: sin table, the same layout as cos
    y_ptr,  # *fp32: y [S, B, 2 * HALF], contiguous
    S,  # positions
    B,  # batch entries per position (the program loops over them)
    stride_ts, stride_tb,  # table strides: (HALF, 0) one table, (B * HALF, HALF) one per entry
    HALF: tl.constexpr,  # pairs per row (a power of two here)
    BLOCK_S: tl.constexpr,  # positions per program
):
    # puzzle 9's given kernel, the table row found through strides: B loads of each row
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    j = tl.arange(0, HALF)
    live = (s < S)[:, None]
    for b in range(B):
        t = s[:, None] * stride_ts + b * stride_tb + j[None, :]
        c = tl.load(cos_ptr + t, mask=live, other=1.0)
        sn = tl.load(sin_ptr + t, mask=live, other=0.0)
        row = (s * B + b)[:, None] * (2 * HALF)
        x1 = tl.load(x_ptr + row + j[None, :], mask=live, other=0.0)
        x2 = tl.load(x_ptr + row + HALF + j[None, :], mask=live, other=0.0)
        tl.store(y_ptr + row + j[None, :], x1 * c - x2 * sn, mask=live)
        tl.store(y_ptr + row + HALF + j[None, :], x2 * c + x1 * sn, mask=live)


SOLUTION, SOLUTION_16 = "puzzle 9's solution", "puzzle 9's solution, BLOCK_S=16"
ONE_TABLE, PER_ENTRY = "given kernel, one table", "given kernel, a table per entry"


@dataclass
class Launch:
    """One kernel on one layout: what to launch and which tensors it may read and write."""
    kernel: object
    grid: Tuple[int]
    args: tuple
    constexprs: Dict[str, int]
    inputs: Dict[str, torch.Tensor]
    y: torch.Tensor

    def __call__(self):
        self.kernel[self.grid](*self.args, **self.constexprs)

    def expected(self) -> torch.Tensor:
        """puzzle 9's spec in fp64, on the shared table's values."""
        half = self.constexprs["HALF"]
        S = self.y.shape[0]
        cos, sin = (self.inputs[n].reshape(S, -1, half)[:, 0].double() for n in ("cos", "sin"))
        return pz.spec_shared_table(self.inputs["x"].double(), cos, sin)


def launches(S: int, B: int, device, HALF: int = 64, BLOCK_S: int = 4,
             seed: int = 9) -> Dict[str, Launch]:
    """The four launches on x [S, B, 2 * HALF] (puzzle 9's timed case: S = 16384, B = 8,
    BLOCK_S = 4), each with its own y filled with NaN."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(S, B, 2 * HALF, generator=gen)
    ang = torch.rand(S, HALF, generator=gen, dtype=torch.float64) * 2 * math.pi
    cos, sin = ang.cos().float(), ang.sin().float()                        # [S, HALF]
    cos_b, sin_b = (t[:, None].expand(S, B, HALF).contiguous() for t in (cos, sin))  # [S, B, HALF]
    x, cos, sin, cos_b, sin_b = (t.to(device) for t in (x, cos, sin, cos_b, sin_b))
    grid, grid16 = (triton.cdiv(S, BLOCK_S),), (triton.cdiv(S, 16),)
    const, const16 = dict(HALF=HALF, BLOCK_S=BLOCK_S), dict(HALF=HALF, BLOCK_S=16)

    def y():
        return torch.full_like(x, float("nan"))                        # unwritten: NaN

    y0, y16, y1, y2 = y(), y(), y(), y()
    return {
        SOLUTION: Launch(pz.solution_shared_table_kernel, grid, (x, cos, sin, y0, S, B), const,
                         dict(x=x, cos=cos, sin=sin), y0),
        SOLUTION_16: Launch(pz.solution_shared_table_kernel, grid16, (x, cos, sin, y16, S, B),
                            const16, dict(x=x, cos=cos, sin=sin), y16),
        ONE_TABLE: Launch(_rope_table_rows_kernel, grid, (x, cos, sin, y1, S, B, HALF, 0), const,
                          dict(x=x, cos=cos, sin=sin), y1),
        PER_ENTRY: Launch(_rope_table_rows_kernel, grid,
                          (x, cos_b, sin_b, y2, S, B, B * HALF, HALF), const,
                          dict(x=x, cos=cos_b, sin=sin_b), y2),
    }


def run_checked(launch: Launch) -> pz.BoundsCheckedMemory:
    """The launch in the interpreter's checked memory (CPU tensors); its output must be the
    spec's and no lane may stray."""
    memory = pz.run_in_checked_memory(launch.kernel, launch.grid, *launch.args,
                                      inputs=launch.inputs, outputs={"y": launch.y},
                                      **launch.constexprs)
    assert not memory.faults, memory.fault_report()
    assert torch.allclose(launch.y.double(), launch.expected(), atol=1e-5, rtol=1e-5)
    return memory


def touched(memory: pz.BoundsCheckedMemory) -> Dict[str, float]:
    """Per tensor: the share of its elements the kernel loaded (inputs) or stored (y)."""
    return {r.name: float((memory.counts(r.name, "load" if r.kind == "in" else "store") > 0)
                          .mean()) for r in memory.regions}


def touched_bytes(launch: Launch, shares: Dict[str, float]) -> int:
    """The bytes of the tensors of `launch` that checked memory found touched, every element."""
    assert all(v == 1.0 for v in shares.values()), shares
    tensors = dict(launch.inputs, y=launch.y)
    return sum(tensors[n].numel() * tensors[n].element_size() for n in shares)


def compiled_sm90(layout: str, S: int = 16384, B: int = 8, HALF: int = 64,
                  BLOCK_S: int = 4) -> dict:
    """The kernel compiled for sm_90 (4 warps) with the strides of `layout` (ONE_TABLE or
    PER_ENTRY), as `load_schedule.schedule` reads it; no GPU needed."""
    from ropelib.course import load_schedule

    stride_ts, stride_tb = {ONE_TABLE: (HALF, 0), PER_ENTRY: (B * HALF, HALF)}[layout]
    f32 = torch.empty(16)
    return load_schedule.schedule(
        _rope_table_rows_kernel, dict(x_ptr=f32, cos_ptr=f32, sin_ptr=f32, y_ptr=f32, S=S, B=B,
                                      stride_ts=stride_ts, stride_tb=stride_tb, HALF=HALF,
                                      BLOCK_S=BLOCK_S), num_warps=4)


def time_in_rounds(nbytes: Dict[str, int], S: int = 16384, B: int = 8, device="cuda",
                   rounds: int = pz.COPY_ROUNDS) -> Optional[Dict[str, pz.Timing]]:
    """On a GPU: the four launches at x [S, B, 128], each checked against the spec, then timed
    in `rounds` alternating rounds with a device copy of each byte size (`nbytes[name]`: the
    bytes it touches), each a do_bench median. On the CPU: say so and return None."""
    if not runtime.on_gpu():
        print(f"   ⏱ not timed: needs a GPU (it would time the four launches at x [{S}, {B}, "
              "128] in alternating rounds, each against a copy of the bytes it touches)")
        return None
    from triton.testing import do_bench

    runs = launches(S, B, device)
    for name, launch in runs.items():                   # compiled, right, and warm
        launch()
        assert torch.allclose(launch.y.double(), launch.expected(), atol=1e-5, rtol=1e-5), name
    copies = {n: pz.copy_of(n, device) for n in sorted(set(nbytes.values()))}
    timers = {("kernel", k): r for k, r in runs.items()}
    timers.update({("copy", n): c for n, c in copies.items()})
    for run in copies.values():
        run()
    torch.cuda.synchronize()
    us: Dict[tuple, List[float]] = {what: [] for what in timers}
    for _ in range(rounds):
        for what, run in timers.items():
            us[what].append(do_bench(run, quantiles=[0.5, 0.2, 0.8])[0] * 1e3)
    gpu = torch.cuda.get_device_name()
    out = {}
    for name, launch in runs.items():
        mine, copy = us[("kernel", name)], us[("copy", nbytes[name])]
        out[name] = pz.Timing(gpu, f"x {list(launch.y.shape)} fp32", float(np.median(mine)),
                              float(np.median(copy)), nbytes[name],
                              max(copy) / min(copy) - 1, tuple(mine), tuple(copy))
    return out
