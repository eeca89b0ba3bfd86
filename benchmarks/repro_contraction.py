"""Why notebook 08's reported-failure row counts 320,601 on a GPU and 374,724 in the interpreter.

    python3 benchmarks/repro_contraction.py      # on a GPU; reads benchmarks/results/te-bits-*.pt
                                                 # writes benchmarks/results/repro_contraction-<gpu>.json

The reproduction kernel (`ropelib.course.debug._rope_unsloth_repro_kernel`, its "math in the
input dtype" branch) rounds each product to bf16 before the sum, as its source says:

    y1 = rn(x1 c) - rn(x2 s)        y2 = rn(x2 c) + rn(x1 s)        (rn: round to bf16)

It is launched on the GPU size of notebook 08 (bf16, S=512 B=2 H=8 D=128; TE's output from the
committed te-bits file) with Triton's floating-point fusion on (the default) and off. The same
lines are emulated in float64 PyTorch with each product rounded or left exact, in each output
half independently (4 x 4 ways; `ropelib.course.debug.contraction_emulations`), and the script
records, for each launch, the elements that differ from TE's output, which emulations equal the
kernel's output bit for bit, and the floating-point multiplies, adds and fmas of its PTX and
SASS (`debug.float_instructions`).
"""
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ropelib.bench.compare import gpu_slug  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.course.offline_compile import cuobjdump  # noqa: E402


def main():
    if not torch.cuda.is_available():
        sys.exit("needs a GPU: the question is what the GPU's compiler makes of the kernel")
    root = Path(__file__).resolve().parents[1]
    case = debug.te_bits_case(debug.load_te_bits(debug.te_bits_file(root)), "nb_gpu")
    S, B, H, D = case.x.shape                                        # sbhd
    half = case.angles.shape[1]
    cos = torch.cos(case.angles.cuda()).to(torch.bfloat16)          # [S, half] in x's dtype
    sin = torch.sin(case.angles.cuda()).to(torch.bfloat16)
    emulated = {f"y1 {w1} | y2 {w2}": y for (w1, w2), y in
                debug.contraction_emulations(case.x, cos.cpu(), sin.cpu()).items()}
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "case": "nb_gpu (bf16, S=512 B=2 H=8 D=128)", "numel": case.x.numel(),
           "file_row": case.rows["debug:REPRO"]["n_differ"],
           "gpu_cos_sin_equal_cpu": all(torch.equal(t.cpu(), f(case.angles).to(torch.bfloat16))
                                        for t, f in ((cos, torch.cos), (sin, torch.sin))),
           "emulations": {k: int(debug.bits_differ(y, case.te).sum()) for k, y in emulated.items()},
           "kernel": {}}
    for fusion in (True, False):
        rows = case.x.cuda().transpose(0, 1).contiguous().view(B * S, H, D)   # bshd rows b*S + s
        compiled = debug._rope_unsloth_repro_kernel[(rows.shape[0], H)](
            rows, cos, sin, rows.stride(0), rows.stride(1), cos.stride(0), S, HALF=half,
            BLOCK_HALF=triton.next_power_of_2(half), FROM_ANGLES=False, COMPUTE_FP32=False,
            USE_FMA=False, BF16_RTNE=False, enable_fp_fusion=fusion)
        y = rows.view(B, S, H, D).transpose(0, 1).cpu()
        out["kernel"][f"enable_fp_fusion={fusion}"] = {
            "n_differ": int(debug.bits_differ(y, case.te).sum()),
            "equals_emulations": [k for k, e in emulated.items() if torch.equal(y.view(torch.int16),
                                                                              e.view(torch.int16))],
            **debug.float_instructions(compiled.asm["ptx"],
                                       cuobjdump(compiled.asm["cubin"], "-sass"))}
    path = root / "benchmarks" / "results" / f"repro_contraction-{gpu_slug()}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    print(f"wrote {path.relative_to(root)}")


if __name__ == "__main__":
    main()
