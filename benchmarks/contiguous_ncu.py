"""Why notebook 06's `g_sum.contiguous()` writes its bytes slower than a copy moves them, under
Nsight Compute.

Notebook 06 times the gradient of `loss = y.sum()`, a stride-0 tensor (one fp32 cell expanded
to [S, B, H, D]), two ways: read as it is by the RoPE kernel, and made contiguous first. The
`.contiguous()` alone writes N fp32 elements and reads one cell, yet on an H200 it ran at 0.40 of
the GB/s of a plain copy of the same N elements, which reads and writes them. That plain copy
(`buf.copy_(g_c)`, both contiguous, one dtype) is a device-to-device cudaMemcpy, not a kernel,
so Nsight Compute has nothing of it to profile; a fill is the yardstick for writing alone. This
probe profiles, on the notebook's shape (s=4096, b=8, h=32, d=128, fp32, N = 2^27):

    0  expand -> contiguous   `g_sum.contiguous()`: PyTorch's copy from a stride-0 source
    1  fill                   `buf.fill_(1.0)`: the same N elements written, nothing read

with the warp states and, for the stores, the instructions, requests and sectors that say how
many bytes each thread writes per store instruction (the vector width): bytes written by the
kernel / (store instructions executed x 32 threads).

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/contiguous_ncu.py --metrics)" \
        python3 benchmarks/contiguous_ncu.py > contiguous_ncu.csv

`--metrics` prints the metric list (with `--ncu PATH`, only those Nsight Compute knows here);
`--check` runs the launches once without the profiler and checks them (a GPU, or the CPU).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:               # ropelib without `pip install -e .`
    sys.path.insert(0, str(ROOT))
from ropelib.bench import compare  # noqa: E402

SHAPE = (4096, 8, 32, 128)                  # notebook 06's timing cell: S, B, H, D
METRICS = (*compare.WARP_STATE_METRICS,
           "smsp__sass_inst_executed_op_global_st.sum",
           "smsp__sass_inst_executed_op_global_ld.sum",
           "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
           "smsp__sass_thread_inst_executed.sum")


def launches(device: str):
    """(label, call) for each launch above; each call returns the tensor it wrote."""
    shape = SHAPE if device == "cuda" else (3, 2, 2, 16)
    g_sum = torch.ones((), device=device).expand(*shape)     # dL/dy of loss = y.sum()
    buf = torch.empty(shape, device=device)
    calls = [("expand -> contiguous", lambda: g_sum.contiguous()),
             ("fill", lambda: buf.fill_(1.0))]
    return calls, (g_sum,)


def check(calls, inputs, device) -> str:
    """Every launch leaves N ones, contiguous."""
    (g_sum,) = inputs
    for label, call in calls:
        got = call()
        assert got.is_contiguous() and got.shape == g_sum.shape, label
        assert torch.equal(got, torch.ones_like(got)), label
    return f"check: {', '.join(label for label, _ in calls)} ({device}, {tuple(g_sum.shape)})"


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "contiguous_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
