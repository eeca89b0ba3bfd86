"""Notebook 13's puzzle 9 under Nsight Compute: where its last tenth of a copy goes.

Puzzle 9's worked solution (one cos/sin table load per program, then a loop over the batch)
runs at about nine tenths of a device copy of the same bytes on an H200
(`puzzle_fractions.py`, four runs). This probe profiles, once each between cudaProfilerStart
and cudaProfilerStop and with the warp-state metrics of `compare.WARP_STATE_METRICS`:

    0-5  the solution at the six tiles of `puzzle_fractions.py`'s sweep, in its order: 16
         positions a program on 4 warps (the timed tile), then 4, 8 and 32 on 4 warps, 16 and
         32 on 8
    6    PyTorch's element-wise kernel (`buf * 1`) over a buffer of the same bytes, half read
         and half written, what the copy moves (`y.copy_(x)` is a memcpy, which ncu does not
         profile)

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/puzzle9_ncu.py --metrics)" \
        python3 benchmarks/puzzle9_ncu.py > puzzle9_ncu.csv

`--metrics` prints the metric list; `--check` runs the puzzle's own check on both tiles' output
(a GPU, or Triton's interpreter at the puzzle's first graded case).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ropelib.bench import compare  # noqa: E402
from ropelib.course import puzzles as pz  # noqa: E402

TILES = ((16, 4), (4, 4), (8, 4), (32, 4), (16, 8), (32, 8))   # (BLOCK_S, warps), the sweep's


def launches(device: str):
    """(label, call) for the profiled launches, and the reference output of the solution."""
    p = pz.PUZZLES["shared_table"]
    case = p.big(device) if device == "cuda" else \
        p.build(torch.Generator().manual_seed(0), device)[0]
    x, cos, sin, y, S, B = case.args
    calls = []
    for bs, warps in TILES:
        const = dict(case.constexprs, BLOCK_S=bs, num_warps=warps)
        grid = (-(-S // bs),)
        calls.append((f"solution, BLOCK_S={bs}, {warps} warps", lambda grid=grid, const=const:
                      pz.solution_shared_table_kernel[grid](*case.args, **const)))
    nbytes = sum(t.numel() * t.element_size() for t in (x, cos, sin, y))
    buf = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=device)
    calls.append(("buf * 1 (a copy's bytes)", lambda: buf * 1))
    return calls, y


def check(calls, y, device) -> str:
    """Every tile of the solution writes the same, non-zero output."""
    outs = []
    for label, call in calls[:-1]:
        y.zero_()
        call()
        outs.append(y.clone())
    assert all(torch.equal(outs[0], o) for o in outs[1:]), "the tiles disagree"
    assert bool(outs[0].abs().sum() > 0), "the solution wrote nothing"
    return (f"check: the six tiles of puzzle 9's solution give the same output ({device}, "
            f"{tuple(y.shape)})")


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "puzzle9_ncu.py",
                                launches, check)


if __name__ == "__main__":
    sys.exit(main())
