"""Notebook 10's two multi-axis kernels, profiled: angles per (token, head) against angles once
per token, at the size the notebook times them (T = 16384 tokens, Qwen2-VL-7B's 28 q and 4 k
heads of 128, bf16, BLOCK_T = 8), each launched once between cudaProfilerStart/Stop for
Nsight Compute:

    0  the per-head kernel, as notebook 10 defines it (its source is read from
       notebooks/10-multi-axis-rope.py, so the profile is of the kernel the learner sees)
    1  the once-per-token kernel (the exercise's worked solution)
    2  ropelib.apply_mrope_qk on the same tensors

    ncu --profile-from-start off --csv --metrics "$(python3 benchmarks/mrope_angles_ncu.py --metrics)" \
        python3 benchmarks/mrope_angles_ncu.py > mrope_angles_ncu.csv

(`bash benchmarks/gpu_run.sh mrope_angles-ncu` does that, with the GPU and versions in the CSV's
header.) The metrics are the warp-state set the other probes record
(`compare.WARP_STATE_METRICS`): time, elapsed and active cycles, grid, registers, warp
instructions, DRAM bytes, warps active, and where an average warp spent its cycles between two
instructions it issued, by stall reason. `--metrics` prints that list; `--check` runs the three
launches once without the profiler and compares their outputs (on a GPU; in Triton's
interpreter at a small size). Needs a GPU for the profile.
"""
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course.exercises import multi_axis as ex  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "10-multi-axis-rope.py"


def notebook_kernels():
    """notebook 10's `angles_cos_sin`, `rotate_head` and `mrope_per_head_kernel`, compiled from
    the notebook's own source (a module file of their own, as Triton reads a kernel's source)."""
    text = NOTEBOOK.read_text(encoding="utf-8")
    start = text.index("@triton.jit\ndef angles_cos_sin(")
    end = text.index("\n\n\n", text.index("def mrope_per_head_kernel("))
    source = "import triton\nimport triton.language as tl\n\n\n" + text[start:end] + "\n"
    path = Path(tempfile.mkdtemp()) / "notebook10_kernels.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("notebook10_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.mrope_per_head_kernel


def inputs(T, device):
    HQ, HK, D = 28, 4, 128
    freqs = ropelib.multi_axis_frequencies(D, [16, 24, 24], 1e6).to(device)
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(T, HQ, D, generator=g).to(device, dtype)
    k = torch.randn(T, HK, D, generator=g).to(device, dtype)
    pos = torch.randint(0, 256, (3, T), generator=g, dtype=torch.int32).to(device)
    return q, k, pos, freqs


def launches(device: str):
    """(label, call) for the three launches above, and the check's tolerance."""
    q, k, pos, freqs = inputs(16384 if device == "cuda" else 16, device)
    per_head = notebook_kernels()
    calls = [
        ("angles per (token, head)",
         lambda: ex.launch_mrope(per_head, q, k, pos, freqs, BLOCK_T=8)),
        ("angles once per token",
         lambda: ex.launch_mrope(ex.solution_mrope_kernel, q, k, pos, freqs, BLOCK_T=8)),
        ("ropelib.apply_mrope_qk", lambda: ropelib.apply_mrope_qk(q, k, pos, freqs, layout="thd")),
    ]
    tol = dict(atol=2e-2, rtol=2e-2) if q.dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    return calls, (q, tol)


def check(calls, extra, device) -> str:
    """The two notebook kernels agree with ropelib's."""
    q, tol = extra
    outs = [call() for _, call in calls]
    for got in outs[:2]:
        for a, b in zip(got, outs[2]):
            torch.testing.assert_close(a.float(), b.float(), **tol)
    return f"check: the three launches agree ({device}, T={q.shape[0]})"


def main(argv=None):
    return compare.profile_main(sys.argv[1:] if argv is None else argv, "mrope_angles_ncu.py",
                                launches, check)

if __name__ == "__main__":
    sys.exit(main())
