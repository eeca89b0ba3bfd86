"""Decode under Nsight Compute: what ropelib's kernel waits on at decode size, beside the kernel
torch.compile makes of Hugging Face's formula.

Under CUDA-graph replay the floor's decode rows (bf16 sbhd s=1, b=64, h=32, d=128: 2 MiB read,
2 MiB written) put ropelib at about 0.70 of a copy and torch.compile's kernel at about 0.86; a
cos/sin table instead of angles brought ropelib to about 0.80 (`decode_tiles.py`). At that size
a kernel is a chain of waits, not a stream of bytes: this probe profiles each launch once and
records, besides time, grid, registers and warp instructions, where an average warp spent its
cycles between two instructions it issued (Nsight Compute's warp-state ratios: waiting on global
memory = long_scoreboard, on a barrier, on a fixed-latency result = wait, on the XU or shared
memory = short_scoreboard, ...).

Launched once each between cudaProfilerStart/Stop, in this order, on the same x:

    0  ropelib, angles     `ropelib.apply_rope(x, freqs)`: sin/cos evaluated in the kernel
    1  ropelib, cos/sin    `ropelib.apply_rope(x, cos=cos, sin=sin)`: an fp32 table read
    2  torch.compile       Hugging Face's `x * cos + rotate_half(x) * sin`, bf16 tables, as the
                           floor's torch.compile provider compiles it
    3  x * 1               PyTorch's element-wise kernel over the same bytes (a copy's traffic;
                           `y.copy_(x)` is a memcpy, which ncu does not profile)

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/decode_ncu.py --metrics)" \
        python3 benchmarks/decode_ncu.py > decode_ncu.csv

`--metrics` prints the metric list instead of profiling; `--check` runs the launches once
without the profiler and compares the three rotations with the fp64 reference (a GPU, or
Triton's interpreter at a small size without the torch.compile launch).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402


def launches(device: str):
    """(label, call) for each launch listed above on one decode-size x (torch.compile's on a GPU
    only), and the check's inputs (x and its angles)."""
    gpu = device == "cuda"
    config = compare.Config(seq_len=1, batch=64 if gpu else 2, heads=32 if gpu else 2,
                            head_dim=128 if gpu else 16, dtype="bf16" if gpu else "fp32")
    case = compare.make_case(config, device=device)
    x, freqs = case.x, case.freqs
    table = freqs[:, 0, 0, :]                                         # [P, D] fp32 angles
    cos, sin = torch.cos(table), torch.sin(table)
    calls = [("ropelib, angles", lambda: ropelib.apply_rope(x, freqs)),
             ("ropelib, cos/sin", lambda: ropelib.apply_rope(x, cos=cos, sin=sin))]
    if gpu:
        core, extra = compare._hf_formula_core(case)
        fn = torch.compile(core, dynamic=False)
        calls.append(("torch.compile", lambda: fn(x, None, *extra)))
    calls.append(("x * 1", lambda: x * 1))
    return calls, (x, freqs)


def check(calls, inputs, device) -> str:
    """The rotations agree with the fp64 reference."""
    x, freqs = inputs
    want = ropelib.reference.rope_reference(x.double(), freqs)
    rotations = [(label, call) for label, call in calls if label != "x * 1"]
    for label, call in rotations:
        torch.testing.assert_close(call().double(), want, atol=2e-2, rtol=2e-2)
    return (f"check: {', '.join(label for label, _ in rotations)} agree with the reference "
            f"({device}, {tuple(x.shape)})")


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "decode_ncu.py",
                                launches, check)


if __name__ == "__main__":
    sys.exit(main())
