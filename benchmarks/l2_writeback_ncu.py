"""Where the bytes a kernel writes and Nsight Compute does not count go: still dirty in L2 when the
kernel ends, written back to DRAM during the next kernel.

Notebooks 04 (A.5) and 10 profile kernels whose DRAM writes fall short of the bytes they store by
less than the L2 holds (a copy of 256 MiB: 23.6 MiB short on an H200). The hypothesis: L2 is a
write-back cache, so the last lines a kernel stores are still in L2, dirty, when the kernel ends
and the profiler stops counting; they reach DRAM later, when other traffic evicts them. This probe
tests it: each writing kernel runs between two read-only sweeps (a sum over a 1 GiB buffer,
many times the L2), profiled in one pass with `--cache-control none`, so Nsight Compute neither
flushes nor invalidates L2 between kernels:

    sweep   (evicts what came before; its own writes: a few bytes)
    copy of N bytes (a Triton load/store, y = x)      <- counted: N - d written to DRAM
    sweep   (evicts the copy's dirty lines)           <- counted: d written to DRAM?

If the hypothesis holds, the sweep after a writing kernel writes to DRAM what that kernel's count
missed, and the two together are the bytes it stored. The writing kernels: the copy at 16, 64
and 256 MiB (below, near and far above the L2's size), and ropelib's finished kernel on notebook
04's shape (bf16 sbhd s=4096, b=8, h=32, d=128: 256 MiB of y).

    ncu --profile-from-start off --cache-control none --csv \\
        --metrics "$(python3 benchmarks/l2_writeback_ncu.py --metrics)" \\
        python3 benchmarks/l2_writeback_ncu.py > l2_writeback_ncu.csv

`--metrics` prints the metric list; `--check` runs the launches once without the profiler and
checks them (a GPU, or the CPU through Triton's interpreter, with small sizes).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:               # ropelib without `pip install -e .`; mechanism.py
        sys.path.insert(0, str(p))
import ropelib  # noqa: E402
from ropelib import reference  # noqa: E402
from mechanism import copy_triton  # noqa: E402  (notebook 04's copy: a Triton load/store)
from ropelib.bench import compare, routes  # noqa: E402
from ropelib.course import measured  # noqa: E402

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
MIB = 2**20
# (kernel, MiB of y) in launch order, as ropelib.course.measured.l2_writeback reads them back:
# the copy below, near and far above the L2's size (the H100's 50 MiB, the H200's 60)
WRITERS = measured.L2_WRITEBACK_WRITERS
COPY_MIB = tuple(mib for name, mib in WRITERS if name == "copy")
ROPE_SHAPE = (4096, 8, 32, 128)              # notebook 04's A.4/A.5 profile: bf16 sbhd
SWEEP_BYTES = 2**30                          # the read-only sweep: fp32, 1 GiB


def launches(device: str):
    """(label, call) in launch order: a sweep, then each writing kernel followed by a sweep.
    A writing kernel's label names the bytes it stores ("copy 16 MiB", "ropelib 256 MiB")."""
    gpu = device == "cuda"
    scale = 1 if gpu else 2**-14              # the interpreter: 1 KiB for 16 MiB
    sweep_buf = torch.ones(int(SWEEP_BYTES * scale) // 4, device=device)
    sweep_out = torch.empty((), device=device)

    def sweep():
        return torch.sum(sweep_buf, dim=0, out=sweep_out)
    calls = [("sweep", sweep)]
    extra = {"sweep": sweep_buf, "writes": {}}
    for mib in COPY_MIB:
        n = int(mib * MIB * scale) // 2                             # bf16 elements
        x = torch.randn(n, device=device, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        label = f"copy {mib} MiB"
        calls += [(label, lambda x=x, y=y: copy_triton(x, y)), ("sweep", sweep)]
        extra["writes"][label] = (x, y)
    shape = ROPE_SHAPE if gpu else (16, 2, 2, 16)
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    assert not gpu or (WRITERS[-1] == ("ropelib", x.numel() * 2 // MIB))
    freqs = ropelib.rope_freqs(shape[0], shape[-1], device=device)
    label = f"ropelib {x.numel() * 2 // MIB} MiB" if gpu else "ropelib"
    calls += [(label, lambda: routes.through(      # one kernel: the finished one (as notebook 04)
        "finished", lambda: ropelib.apply_rope(x, freqs, layout="sbhd"))), ("sweep", sweep)]
    extra["writes"][label] = (x, freqs)
    return calls, extra


def check(calls, extra, device) -> str:
    """Each copy leaves y equal to x, ropelib's launch the reference rotation; the sweep sums
    its ones."""
    for label, call in calls:
        got = call()
        if label == "sweep":
            assert got.item() == extra["sweep"].numel(), got
        elif label.startswith("copy"):
            x, y = extra["writes"][label]
            assert torch.equal(x, y), label
        else:
            x, freqs = extra["writes"][label]
            want = reference.rope_reference(x, freqs)
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    return f"check: {len(calls)} launches ({device}): " + ", ".join(label for label, _ in calls)


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "l2_writeback_ncu.py",
                                launches, check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
