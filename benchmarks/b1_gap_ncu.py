"""Batch 1 under Nsight Compute: what the kernel torch.compile makes of Hugging Face's formula
does with 128 MiB of q that ropelib's flat pass does not.

At s16384 b1 h32 d128 bf16 the floor's forward rows put torch.compile's kernel at about 0.98 of
a copy and ropelib's eager call (the flat pass reading the rows it kept, half of them where
every pair's members are equal) at about 0.96; both read 512 bytes of table a token beside
16 KiB of q moved, so bytes alone do not separate them. This probe profiles one launch of each,
in sbhd and bshd, with the warp states, occupancy, DRAM and L2 traffic, and the same bytes moved
by PyTorch's element-wise kernel (`x * 1`; `y.copy_(x)` is a memcpy, which ncu does not profile):

    0  <layout> ropelib         `ropelib.apply_rope(x, freqs)`, its rows kept by earlier calls
    1  <layout> torch.compile   `x * cos + rotate_half(x) * sin`, bf16 tables, as the floor's
                                torch.compile provider compiles it
    2  <layout> x * 1           the copy's traffic

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/b1_gap_ncu.py --metrics)" \
        python3 benchmarks/b1_gap_ncu.py > b1_gap_ncu.csv

`--metrics` prints the metric list; `--check` runs the launches once without the profiler and
compares the rotations with the fp64 reference (a GPU, or Triton's interpreter at a small size
without the torch.compile launch).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402

METRICS = (*compare.WARP_STATE_METRICS,
           "sm__maximum_warps_per_active_cycle_pct",
           "launch__waves_per_multiprocessor",
           "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sector_op_read_hit_rate.pct",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "smsp__sass_inst_executed_op_global_ld.sum",
           "smsp__sass_inst_executed_op_global_st.sum")


def launches(device: str):
    """(label, call) for each launch listed above, per layout, and the check's inputs."""
    gpu = device == "cuda"
    calls, inputs = [], {}
    for layout in ("sbhd", "bshd"):
        config = compare.Config(seq_len=16384 if gpu else 9, batch=1, heads=32 if gpu else 2,
                                head_dim=128 if gpu else 16, dtype="bf16" if gpu else "fp32",
                                layout=layout)
        case = compare.make_case(config, device=device)
        x, freqs = case.x, case.freqs
        inputs[layout] = (x, freqs)
        calls.append((f"{layout} ropelib",
                      lambda x=x, f=freqs, lay=layout: ropelib.apply_rope(x, f, layout=lay)))
        if gpu:
            core, extra = compare._hf_formula_core(case)
            fn = torch.compile(core, dynamic=False)
            calls.append((f"{layout} torch.compile", lambda fn=fn, x=x, e=extra: fn(x, None, *e)))
        calls.append((f"{layout} x * 1", lambda x=x: x * 1))
    return calls, inputs


def check(calls, inputs, device) -> str:
    """The rotations agree with the fp64 reference."""
    for label, call in calls:
        layout = label.split()[0]
        x, freqs = inputs[layout]
        if label.endswith("x * 1"):
            assert torch.equal(call(), x), label
            continue
        want = ropelib.reference.rope_reference(x.double(), freqs, layout=layout)
        torch.testing.assert_close(call().double(), want, atol=2e-2, rtol=2e-2, msg=label)
    return (f"check: {len(calls)} launches agree ({device}: "
            + ", ".join(f"{lay} {tuple(x.shape)}" for lay, (x, _) in inputs.items()) + ")")


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "b1_gap_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
