"""Transformer Engine's fused RoPE kernel under Nsight Compute: what its instructions are and what
its warps wait on, beside the batch-reusing grid it loses to and TE's grid written in Triton.

Notebook 04 measured (`mechanism-te-<gpu>.csv`) that TE's CUDA kernel moves the model's bytes,
fills nine-tenths of an SM's warp slots and asks for a copy's KiB per SM, yet takes about twice
a copy's time, executing more than twice the batch-reusing grid's warp instructions per element.
That says "instructions", not which ones. This probe profiles each launch once with the
instruction mix (thread instructions by kind, warp instructions per pipe: the XU pipe runs
float-int conversions and special functions), the global load and store instructions and the sectors they ask for (bytes per load
instruction say how wide a thread's loads are), and the warp states (where an average warp spent
its cycles between two instructions it issued: long_scoreboard = waiting on global memory,
math_pipe_throttle = a busy pipe, ...), all on one tensor, bf16 sbhd s=4096, b=8, h=32, d=128
(256 MiB), one fp32 angle table:

    0  te_fused          Transformer Engine's fused CUDA kernel (where TE is installed)
    1  sh_loop_b         the batch-reusing grid: (S, H) programs, a loop over the batch
    2  heads_all_one_b   TE's grid (S, B) written in Triton: a program per token and batch row
    3  heads_all_one_b_table   the same from fp32 cos/sin tables (no sin/cos evaluated)
    4  copy              a Triton load/store of the same bytes (`y.copy_(x)` is a memcpy ncu
                         does not profile)

The Triton variants are the kernels notebook 04's ablation times (benchmarks/mechanism.py's
variants). Every rotation is checked against the fp64 reference before profiling.

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/te_ncu.py --metrics)" \
        python3 benchmarks/te_ncu.py > te_ncu.csv

`--metrics` prints the metric list (with `--ncu PATH`, only the metrics that Nsight Compute
knows on this machine's GPU); `--check` runs the launches once without the profiler and checks
them (a GPU, or Triton's interpreter at a small size, where TE is absent).
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
import mechanism  # noqa: E402  (benchmarks/mechanism.py: its variants and copy)

VARIANTS = ("te_fused", "sh_loop_b", "heads_all_one_b", "heads_all_one_b_table", "copy")
METRICS = (*compare.WARP_STATE_METRICS, *compare.INSTRUCTION_MIX_METRICS,
           "smsp__sass_inst_executed_op_global_ld.sum", "smsp__sass_inst_executed_op_global_st.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
           "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")


def launches(device: str):
    """(label, call) for each variant above (TE's where installed) on one x, a call returning
    its output (TE's a tensor of its own, the others their buffer), and the check's inputs."""
    S, B, H, D = (4096, 8, 32, 128) if device == "cuda" else (6, 3, 4, 16)
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(S, B, H, D, generator=gen).to(device, dtype)
    freqs = compare.angles(S, D).to(device).view(S, 1, 1, D)
    by_name = {v.name: v for v in mechanism.variants(H)}
    calls = [(name, by_name[name].make(x, freqs, torch.empty_like(x)))
             for name in VARIANTS if name in by_name]       # te_fused where TE is installed
    return calls, (x, freqs)


def check(calls, inputs, device) -> str:
    """Each rotation agrees with the fp64 reference; the copy copies."""
    x, freqs = inputs
    want = ropelib.reference.rope_reference(x.double(), freqs)
    for label, call in calls:
        got = call().double()
        if label == "copy":
            assert torch.equal(got, x.double()), label
        else:
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=label)
    return (f"check: {', '.join(label for label, _ in calls)} agree "
            f"({device}, {tuple(x.shape)})")


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "te_ncu.py", launches,
                                check, METRICS)


if __name__ == "__main__":
    sys.exit(main())
