"""Why notebook 03's naive kernel slows down with more warps a program, under Nsight Compute.

The naive kernel runs one program per head row (S*B*H programs; at s=4096 b=8 h=32 d=128 a
million of them), each rotating 128 bf16 elements: a half of 64 pairs. Notebook 03 times it at
1, 2, 4 and 8 warps a program and finds 8 warps slower than 2, while an empty program and a
program that only moves its row (`benchmarks/program_cost.py`) keep their 1-warp time at every
warp count. This probe profiles each launch once, with the warp states (where an average warp
spent its cycles between two instructions it issued) and the instruction mix (thread
instructions by kind, warp instructions per pipe: the XU pipe runs float-int conversions and
special functions, one float-to-int per libdevice sin or cos), on one tensor, bf16 sbhd
s=4096, b=8, h=32, d=128 (256 MiB), one fp32 angle table:

    0-3  naive, 1 / 2 / 4 / 8 warps    `rope_naive(x, freqs, num_warps=w)`
    4-5  one row, 1 / 8 warps          each program loads its 256-byte row and stores it, no
                                       arithmetic (program_cost.py's kernel): the same grid
    6    copy                          a Triton load/store of x's bytes (mechanism.py's)

A tile of 64 pairs on 2, 4 or 8 warps (64, 128, 256 threads) holds fewer pairs than threads:
Triton's layout gives every thread an element anyway, so threads hold copies of the same pairs
and each copy evaluates its own sin and cos. The XU pipe's count (one float-to-int an angle,
beside the program id's divisions) says whether that happens.

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/naive_warps_ncu.py --metrics)" \
        python3 benchmarks/naive_warps_ncu.py > naive_warps_ncu.csv

`--metrics` prints the metric list (with `--ncu PATH`, only those Nsight Compute knows here);
`--check` runs the launches once without the profiler and checks them (a GPU, or Triton's
interpreter at a small size).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):   # ropelib without `pip install -e .`, and
    if str(_path) not in sys.path:          # mechanism.py however this file is loaded
        sys.path.insert(0, str(_path))
import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course.kernels.naive import rope_naive  # noqa: E402
import mechanism  # noqa: E402  (benchmarks/mechanism.py: its copy)
import program_cost  # noqa: E402  (benchmarks/program_cost.py: its one-row kernel)

WARPS = (1, 2, 4, 8)
METRICS = (*compare.WARP_STATE_METRICS, *compare.INSTRUCTION_MIX_METRICS,
           "smsp__sass_inst_executed_op_global_ld.sum", "smsp__sass_inst_executed_op_global_st.sum",
           "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "sm__ctas_launched.sum", "sm__maximum_warps_per_active_cycle_pct")


def launches(device: str):
    """(label, call) for each launch above on one x, a call returning its output, and the check's
    inputs."""
    S, B, H, D = (4096, 8, 32, 128) if device == "cuda" else (3, 2, 2, 16)
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(S, B, H, D, generator=gen).to(device, dtype)
    freqs = compare.angles(S, D).to(device).view(S, 1, 1, D)
    rows = x.reshape(-1, D)
    calls = []
    for w in WARPS:
        y = torch.empty_like(x)
        calls.append((f"naive, {w} warps",
                      lambda w=w, y=y: rope_naive(x, freqs, out=y, num_warps=w)))
    for w in (1, 8):
        y = torch.empty_like(rows)
        calls.append((f"one row, {w} warps",
                      lambda w=w, y=y: (program_cost._one_row_kernel[(rows.shape[0],)](
                          rows, y, D=D, num_warps=w), y)[1]))
    y = torch.empty_like(x)
    calls.append(("copy", lambda y=y: mechanism.copy_triton(x, y)))
    return calls, (x, freqs)


def check(calls, inputs, device) -> str:
    """Each rotation agrees with the fp64 reference; the row moves and the copy copy."""
    x, freqs = inputs
    want = ropelib.reference.rope_reference(x.double(), freqs)
    for label, call in calls:
        got = call()
        if label.startswith("naive"):
            torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2, msg=label)
        else:
            assert torch.equal(got.reshape(x.shape), x), label
    return f"check: {', '.join(label for label, _ in calls)} ({device}, {tuple(x.shape)})"


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "naive_warps_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
