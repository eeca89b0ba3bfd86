"""The instruction mix of notebook 05's last ladder rungs and of ropelib's finished kernel, for
Nsight Compute: which kinds of instructions the finished kernel executes more of than rung 6
(`equal_halves`), whose sin/cos shortcut it shares.

At bf16 sbhd s = 4096, b = 8, h = 32, d = 128 (256 MiB) each kernel is launched once between
cudaProfilerStart/Stop, in this order:

    0  rung 4, `chunks`        (`tl.cos`/`tl.sin` for both halves)
    1  rung 5, `accurate`      (libdevice sin/cos for both halves: with Triton 3.6 the same code)
    2  rung 6, `equal_halves`  (libdevice sin/cos once per pair)
    3  ropelib.apply_rope with its route forced to the finished kernel

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/ladder_opcodes_ncu.py \
--metrics)" python3 benchmarks/ladder_opcodes_ncu.py > ladder_opcodes_ncu.csv

`--metrics` prints the metric list (thread instructions by kind: fp32 adds, multiplies and fmas,
integer, conversions, memory, control, bit operations, moves and the rest, and warp instructions
per pipe) instead of profiling. `--check` runs the four launches once without the profiler and
compares their outputs (a GPU, or Triton's interpreter at a small size).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ropelib  # noqa: E402
from ropelib.bench import compare, routes  # noqa: E402
from ropelib.course import ladder  # noqa: E402

RUNGS = ("chunks", "accurate", "equal_halves")
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "smsp__inst_executed.sum", "smsp__thread_inst_executed.sum",
           *compare.INSTRUCTION_MIX_METRICS,
           "launch__registers_per_thread", "launch__grid_size", "launch__block_size")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--metrics" in argv:
        print(",".join(METRICS))
        return 0
    device = "cuda" if torch.cuda.is_available() and not ropelib.runtime.INTERPRET else "cpu"
    S, B, H, D = (4096, 8, 32, 128) if device == "cuda" else (8, 2, 4, 16)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(S, B, H, D, generator=g).to(device, dtype)
    freqs = compare.angles(S, D, device=device)
    y = torch.empty_like(x)
    calls = [lambda rung=rung: ladder.rope_ladder(rung, x, freqs, out=y) for rung in RUNGS]
    calls.append(lambda: routes.through("finished",
                                        lambda: ropelib.apply_rope(x, freqs, layout="sbhd")))
    if "--check" in argv:
        want = ropelib.reference.rope_reference(x, freqs.view(S, D)).float()
        for name, call in zip((*RUNGS, "finished"), calls):
            got = call().float()
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        print(f"check: the four launches agree with the reference ({device}, {tuple(x.shape)})")
        return 0
    compare.profiled_launches(calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
