"""QK-RMSNorm + RoPE forward+backward at two shapes of the same bytes, under Nsight Compute.

`fwdbwd_probe.py --qk-norm` replayed `ropelib.qk_norm_rope`'s forward+backward from a CUDA graph
on an H200 at 0.722 of two copies for bshd b8 s4096 (32 q and 8 k heads of 128, bf16, the
floor's case) and at 0.609 for b2 s16384, the same q and k bytes. This probe profiles every
kernel of one forward+backward at each shape (the cos/sin table of the floor's provider, the
gradients of q, k and both norm weights handed back), so that their times, DRAM bytes, L2 hit
rates, grids and occupancy can be set side by side:

    0   b8 s4096:  the kernels of one forward+backward, in launch order
    1   b2 s16384: the same

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/qk_norm_ncu.py --metrics)" \
        python3 benchmarks/qk_norm_ncu.py > qk_norm_ncu.csv

`--metrics` prints the metric list (with `--ncu PATH`, only those Nsight Compute knows here);
`--check` runs each forward+backward once without the profiler and checks it against the fp64
reference (a GPU, or Triton's interpreter at a small size).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ropelib.bench import compare  # noqa: E402
from ropelib.bench import qk_norm_rope as qn  # noqa: E402

SHAPES = ((8, 4096), (2, 16384))
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "lts__t_sector_op_read_hit_rate.pct", "lts__t_sectors_srcunit_tex_op_read.sum",
           "lts__t_sectors_srcunit_tex_op_write.sum",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
           "smsp__issue_active.avg.per_cycle_active",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
           "launch__grid_size", "launch__block_size", "launch__registers_per_thread")


def launches(device: str):
    """(label, call) per shape: one forward+backward, its gradients handed back; and the
    check's inputs."""
    shapes = SHAPES if device == "cuda" else ((2, 8), (1, 16))
    HQ, HK, D = (32, 8, 128) if device == "cuda" else (4, 2, 16)
    calls, extra = [], {}
    for B, S in shapes:
        args, grads = qn.inputs(B, S, HQ, HK, D, torch.bfloat16, device)
        label = f"b{B} s{S}"
        extra[label] = (args, grads)
        calls.append((label, qn._step(qn.norm_rope_ropelib, args, grads, True)))
    return calls, extra


def check(calls, extra, device) -> str:
    """Each forward+backward's gradients agree with the fp64 reference's."""
    for label, call in calls:
        args, grads = extra[label]
        _, want = qn.reference(args, grads)
        got = call()
        assert qn.max_abs_err(got, want) <= qn.MAX_ABS_ERR, label
    return f"check: {', '.join(label for label, _ in calls)} agree ({device})"


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "qk_norm_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
