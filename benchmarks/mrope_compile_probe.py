"""Why torch.compile's multi-axis forward is slower than its own forward+backward (GPU).

Notebook 10's floor rows (Qwen2-VL's text attention, q [4, 8192, 28, 128] and k [4, 8192, 4,
128] bf16) time transformers' `Qwen2VLRotaryEmbedding` + `apply_rotary_pos_emb` compiled by
torch.compile (fullgraph) at 0.084 of a copy's speed forward and 0.414 forward+backward: the
forward alone takes longer than forward and backward. The two are compiled separately (inputs
that do not require grad and inputs that do). This probe compiles each the same way, reads the
Triton code Inductor generates (`run_and_get_code`) and counts, per generated kernel, the
elements it covers (its x and y numels) and the sines and cosines in its body: the sin/cos evaluations a
call executes are their product. It then times both calls (`do_bench`) and lists their
kernels' device times under torch.profiler.

    python benchmarks/mrope_compile_probe.py [--tiny]      # --tiny: small shapes (a CPU check)

Prints a table; with $OUT set, writes Inductor's code of each call there. The H200 run:
benchmarks/results/mrope_compile-nvidia-h200-20261204-1911/ (its log counted the elements
from xnumel alone, before its y axis was counted: its evaluations line is too low; the code
files there are what `ropelib.course.counts.inductor_sin_cos` reads).
"""
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from ropelib.bench import multi_axis as M  # noqa: E402
from ropelib.course.counts import inductor_sin_cos  # noqa: E402


def replica(section, freqs):
    """transformers 4.x's Qwen2-VL text RoPE in plain PyTorch (where transformers is absent),
    from multi_axis's own pieces: every axis's cos/sin table built in the call, each feature's
    axis picked, x * cos + rotate_half(x) * sin, on [B, H, S, D] views as transformers has."""
    def fn(q, k, positions):                      # q, k [B, S, H, D]; positions [3, B, S]
        cos, sin = M.materialised_tables(positions, freqs, q.dtype)
        qe, ke = M.multimodal_rotary_4x(q.transpose(1, 2), k.transpose(1, 2), cos, sin, section)
        return qe.transpose(1, 2), ke.transpose(1, 2)
    return fn


def main():
    tiny = "--tiny" in sys.argv
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape, freqs, positions, q, k, gq, gk = M.case_inputs("mrope", tiny, device)
    try:
        fn, note = M.hf_function("mrope", shape["D"], shape["section"], shape["base"], freqs,
                                 device)
    except Exception as e:  # noqa: BLE001  (transformers absent: its formula in PyTorch)
        fn, note = replica(shape["section"], freqs), f"PyTorch replica ({type(e).__name__})"
    B, S, HQ, HK, D = (shape[n] for n in ("B", "S", "HQ", "HK", "D"))
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}; {note}; q [{B}, {S}, {HQ}, {D}], "
          f"k [{B}, {S}, {HK}, {D}] bf16")
    print(f"elements of q and k: {B * S * (HQ + HK) * D:,}; (token, feature) pairs: "
          f"{B * S * D:,}")
    from torch._inductor.utils import run_and_get_code
    summary = {}
    for mode in ("forward", "forward+backward"):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True)
        grad = mode != "forward"
        leaves = [x.detach().requires_grad_(grad) for x in (q, k)]
        if grad:
            def call(leaves=leaves):
                return torch.autograd.grad(compiled(*leaves, positions), leaves, (gq, gk))
        else:
            def call(leaves=leaves):
                return compiled(*leaves, positions)
        _, codes = run_and_get_code(call)
        if os.environ.get("OUT"):               # the generated code itself, to read
            Path(os.environ["OUT"], f"mrope_compile_{mode.replace('+', '_')}.py").write_text(
                "\n\n# ----\n\n".join(codes))
        kernels = [k for code in codes for k in inductor_sin_cos(code)]
        evals = sum(n * c for _, n, c in kernels)
        print(f"\n{mode}: {len(kernels)} Triton kernels")
        for name, n, c in kernels:
            print(f"  {name[:60]:60s} xnumel {n:>12,}  sin/cos calls {c}  evaluations {n * c:,}")
        print(f"  sin/cos evaluations a call: {evals:,}")
        ms = None
        if device == "cuda":
            import triton
            ms = triton.testing.do_bench(call, warmup=50, rep=400)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
                print(f"  profiled: {e.key[:60]:60s} {e.device_time_total / 5:9.1f} us a call")
            print(f"  do_bench median: {ms:.3f} ms")
        summary[mode] = (len(kernels), evals, ms)
    print("\nmode               kernels   sin/cos evaluations   ms")
    for mode, (n, evals, ms) in summary.items():
        print(f"{mode:18s} {n:7d} {evals:21,d}   {'' if ms is None else f'{ms:.3f}'}")


if __name__ == "__main__":
    main()
