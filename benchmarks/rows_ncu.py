"""Notebook 03's exercise 5 under Nsight Compute: programs of 1, 2, 4 and 8 rows, the worked
kernel beside notebook 04's.

Exercise 5 gives the naive kernel ROWS consecutive rows a program. On the H200 its worked
solution (`ropelib.course.exercises.naive_kernel.solution_rope_rows`) took about twice the
predicted time at 4 rows and four times at 8, and 8 rows ran slower than 2, while notebook
04's kernel (`ropelib.course.kernels.ablation`, programs of 1-8 heads of one position) stayed
near the prediction. Both kernels hold a [rows, BLOCK_HALF] tile; the worked one evaluates the
sin and cos of every row of it, notebook 04's those of its one position, once. This probe
profiles each launch once at the ablation's shape, bf16 sbhd S=32768, B=1, H=32, D=128, with
the warps of the ablation's rows (1, 1, 2 and 1 for 1, 2, 4 and 8 rows):

    0-3  worked, 1 / 2 / 4 / 8 rows     `launch_rows(solution_rope_rows, ...)`
    4-7  notebook 04's, 1 / 2 / 4 / 8 heads of one position
    8    copy                           a Triton load/store of x's bytes (mechanism.py's)

with the warp states, the instruction mix (the XU pipe runs the conversions inside libdevice's
sin and cos) and the achieved occupancy.

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/rows_ncu.py --metrics)" \
        python3 benchmarks/rows_ncu.py > rows_ncu.csv      # or: bash benchmarks/gpu_run.sh rows-ncu

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
from ropelib.course.exercises import naive_kernel  # noqa: E402
from ropelib.course.kernels import ablation  # noqa: E402
import mechanism  # noqa: E402  (benchmarks/mechanism.py: its copy)

ROWS_WARPS = {1: 1, 2: 1, 4: 2, 8: 1}     # the ablation's warps for programs of that many rows
METRICS = (*compare.WARP_STATE_METRICS, *compare.INSTRUCTION_MIX_METRICS,
           "sm__ctas_launched.sum", "sm__maximum_warps_per_active_cycle_pct",
           "launch__occupancy_limit_registers")


def launches(device: str):
    """(label, call) for each launch above on one x, a call returning its output, and the check's
    inputs."""
    S, B, H, D = (32768, 1, 32, 128) if device == "cuda" else (4, 1, 8, 16)
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(S, B, H, D, generator=gen).to(device, dtype)
    freqs = compare.angles(S, D).to(device).view(S, D).contiguous()
    calls = []
    for rows, warps in ROWS_WARPS.items():
        y = torch.empty_like(x)
        calls.append((f"worked, {rows} rows", lambda rows=rows, warps=warps, y=y: (
            naive_kernel.launch_rows(naive_kernel.solution_rope_rows, x, freqs, y, rows,
                                     num_warps=warps), y)[1]))
    for rows, warps in ROWS_WARPS.items():
        y = torch.empty_like(x)
        calls.append((f"notebook 04, {rows} heads", lambda rows=rows, warps=warps, y=y: (
            ablation._rope_ablation_kernel[(S, H // rows, 1)](
                x, y, freqs, freqs, freqs, B, H, B, *x.stride()[:3], *y.stride()[:3],
                HALF=D // 2, BLOCK_HALF=D // 2, BLOCK_H=rows, UNROLL_B=0, TABLE=False,
                BF16_RTNE=False, num_warps=warps), y)[1]))
    y = torch.empty_like(x)
    calls.append(("copy", lambda y=y: mechanism.copy_triton(x, y)))
    return calls, (x, freqs)


def check(calls, inputs, device) -> str:
    """Each rotation agrees with the fp64 reference; the copy copies."""
    x, freqs = inputs
    want = ropelib.reference.rope_reference(x.double(), freqs.view(x.shape[0], 1, 1, -1))
    for label, call in calls:
        got = call()
        if label == "copy":
            assert torch.equal(got, x), label
        else:
            torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2, msg=label)
    return f"check: {', '.join(label for label, _ in calls)} ({device}, {tuple(x.shape)})"


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "rows_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
