"""Where notebook 05's ladder rungs spend their cycles, under Nsight Compute.

benchmarks/ladder.py times every rung; benchmarks/mechanism.py counts their bytes and
instructions. Neither says why some steps cost what they do: at b = 1 the tile of tokens loses
six points of a copy on the heads rung's grid and warps, the chunks rung three at b = 8 with the
same bytes and instructions, and the equal-halves shortcut gains five with a quarter fewer
instructions at an SM throughput far from its peak. This probe profiles each rung once with the
warp states (where an average warp spent its cycles between two instructions it issued: waiting
on memory, `long_scoreboard`; on a barrier; on the sin/cos unit, ...), the achieved occupancy,
the L1 and L2 traffic and the XU pipe's instructions (one float-to-int a libdevice sin or cos), at two of the ladder's sizes,
bf16 sbhd with one fp32 angle table:

    s4096-b8    s = 4096,  b = 8, h = 32, d = 128 (256 MiB)
    s32768-b1   s = 32768, b = 1, h = 32, d = 128 (the same bytes, no batch to loop over)

and at each: a Triton copy of x's bytes (mechanism.py's), the seven rungs (`batch_reuse` to
`equal_halves`, ropelib.course.ladder), and `ropelib.apply_rope` with its route forced to the
finished kernel, 18 launches in that order.

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/ladder_stalls_ncu.py --metrics)" \
        python3 benchmarks/ladder_stalls_ncu.py > ladder_stalls_ncu.csv

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
from ropelib.bench import compare, routes  # noqa: E402
from ropelib.course import ladder  # noqa: E402
import mechanism  # noqa: E402  (benchmarks/mechanism.py: its copy)

CASES = (("s4096-b8", 4096, 8), ("s32768-b1", 32768, 1))
METRICS = (*compare.WARP_STATE_METRICS,
           "sm__maximum_warps_per_active_cycle_pct",
           "smsp__inst_executed_pipe_xu.sum",
           "smsp__sass_inst_executed_op_global_ld.sum",
           "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sector_op_read_hit_rate.pct",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed")


def launches(device: str):
    """(label, call) for each launch above, a call returning its output; and the check's
    inputs per case."""
    H, D = (32, 128) if device == "cuda" else (3, 16)
    cases = CASES if device == "cuda" else (("s5-b3", 5, 3), ("s7-b1", 7, 1))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    calls, inputs = [], {}
    for case, S, B in cases:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(S, B, H, D, generator=gen).to(device, dtype)
        freqs = compare.angles(S, D).to(device).view(S, 1, 1, D)
        inputs[case] = (x, freqs)
        y = torch.empty_like(x)
        calls.append((f"{case} copy", lambda x=x, y=y: mechanism.copy_triton(x, y)))
        for rung in ladder.NAMES:
            calls.append((f"{case} {rung}",
                          lambda rung=rung, x=x, f=freqs, y=y: ladder.rope_ladder(rung, x, f,
                                                                                  out=y)))
        calls.append((f"{case} finished", lambda x=x, f=freqs: routes.through(
            "finished", lambda: ropelib.apply_rope(x, f, layout="sbhd"))))
    return calls, inputs


def check(calls, inputs, device) -> str:
    """Every rotation agrees with the fp64 reference; the copies copy."""
    for label, call in calls:
        case = label.split()[0]
        x, freqs = inputs[case]
        got = call()
        if label.endswith(" copy"):
            assert torch.equal(got, x), label
        else:
            want = ropelib.reference.rope_reference(x.double(), freqs)
            torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2, msg=label)
    return (f"check: {len(calls)} launches agree ({device}: "
            + ", ".join(f"{case} {tuple(x.shape)}" for case, (x, _) in inputs.items()) + ")")


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "ladder_stalls_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
