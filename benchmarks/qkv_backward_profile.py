"""The QKV projection's forward+backward taken apart kernel by kernel: fused (dY written, cuBLAS)
against the unfused pipeline (GPU).

`qkv_dy_probe.py` times the two forward+backwards whole; where the fused one is behind (the
H100's 8192-token row), this says in which kernels. Each provider's step (forward, then
`torch.autograd.backward` with the same output gradients) runs `--warmup` times, then `--steps`
times under `torch.profiler` (CPU and CUDA activity); every device kernel's time is summed by
name and divided by the steps. Printed per provider: the kernels, largest first, µs a step; their
sum (the device's busy time); and the wall-clock time a step takes without the profiler
(`triton.testing.do_bench`), so busy time over wall time says whether the device or the host
sets the step's time. Outputs and gradients are compared with the unfused pipeline's first.

`--forward`: forwards only (under no_grad), each provider's kernels: cuBLAS alone, ropelib's
Triton GEMM without its epilogue (the TMA main loop as the fused forward runs it, ROTATE off),
the fused forward and the unfused pipeline; what the epilogue costs the device, apart from the
host's time before the GEMM starts.

    python benchmarks/qkv_backward_profile.py [--tokens 8192 32768] [--qk-norm] [--forward]
                                              [--out CSV]                               # GPU
    TRITON_INTERPRET=1 python benchmarks/qkv_backward_profile.py --dry-run   # CPU: checks only
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qkv_dy_probe as probe  # noqa: E402  (it puts the checkout on sys.path)
import qkv_rope_bench as bench  # noqa: E402

import ropelib  # noqa: E402
from ropelib import runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course.nb09_device_time import kernel_us  # noqa: E402

# the providers compared (qkv_dy_probe.providers' names), the baseline last
WANTED = {False: ("fused, dY written, cuBLAS", "unfused"),
          True: ("fused, dY written, QK-norm", "unfused, QK-norm")}
# --forward: qkv_rope_bench.providers' names; the GEMMs alone have no norm (their rows serve both)
FORWARD = ("cublas", "triton_gemm", "fused", "unfused")


def kernel_times(step, steps: int) -> dict:
    """{kernel name: device µs a step} over `steps` profiled steps (after the caller's warm-up)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return {name: us / steps for name, us in kernel_us(prof).items()}


def short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, checks only (CPU)")
    ap.add_argument("--qk-norm", action="store_true", help="the QK-norm case instead")
    ap.add_argument("--forward", action="store_true", help="forwards only (no_grad)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None, help="CSV: tokens, provider, kernel, us_per_step")
    a = ap.parse_args(argv)
    device = runtime.default_device()
    if not a.dry_run and device != "cuda":
        raise SystemExit("profiling needs a CUDA GPU; use --dry-run on the CPU")
    sizes = ([(16, 32, 2, 1, 16)] if a.dry_run
             else [(t, 4096, 32, 8, 128) for t in a.tokens])
    rows = []
    for tokens, hidden, HQ, HK, D in sizes:
        angles = ropelib.rope_angles(D, base=500000.0, device=device)
        freqs = ropelib.rope_freqs(tokens, D, base=500000.0, device=device)
        args, grads = bench.inputs(tokens, hidden, HQ, HK, D, device)
        if a.forward:
            provs = dict(bench.providers(HQ, HK, D, angles, norm=False))
            if a.qk_norm:
                provs.update(bench.providers(HQ, HK, D, angles, norm=True))
            names = FORWARD
        else:
            provs = dict(probe.providers(HQ, HK, D, angles, freqs, a.qk_norm))
            names = WANTED[a.qk_norm]
        ref = bench._run_once(provs[names[-1]], args, grads, not a.forward, a.qk_norm)
        for name in names:
            got = bench._run_once(provs[name], args, grads, not a.forward, a.qk_norm)
            rel = bench._max_rel_diff(got, ref)
            rotates = name not in ("cublas", "triton_gemm")
            assert rel <= 2.0**-5 or not rotates, \
                f"{name} differs from the unfused pipeline ({rel:.3g})"
            leaves = bench._leaves(args, not a.forward, a.qk_norm)

            def step(fn=provs[name], leaves=leaves):
                if a.forward:
                    with torch.no_grad():
                        fn(*leaves)
                    return
                for t in leaves:
                    t.grad = None
                torch.autograd.backward(fn(*leaves), grads)
            if a.dry_run:
                step()
                print(f"{tokens:>6} {name}: checked (max rel diff {rel:.2e}); no GPU, not profiled")
                continue
            import triton.testing
            for _ in range(a.warmup):
                step()
            wall_ms = triton.testing.do_bench(step)
            kernels = kernel_times(step, a.steps)
            busy = sum(kernels.values())
            print(f"\n{tokens} tokens, {name}: wall {wall_ms * 1e3:8.1f} µs a step "
                  f"(do_bench), device busy {busy:8.1f} µs ({busy / (wall_ms * 1e3):.2f} of it)")
            for k, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"  {us:9.1f} µs  {short(k)}")
                rows.append(dict(tokens=tokens, qk_norm=a.qk_norm, provider=name, kernel=k,
                                 us_per_step=us, wall_us=wall_ms * 1e3))
    if a.out and rows:
        compare.write_csv(rows, a.out, compare.environment_meta(),
                          fields=["tokens", "qk_norm", "provider", "kernel", "us_per_step",
                                  "wall_us"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
