"""Why notebook 08's reported-failure row counts 320,601 on a GPU and 374,724 in the interpreter.

    python3 benchmarks/repro_contraction.py      # on a GPU; reads benchmarks/results/te-bits-*.pt

The reproduction kernel (`ropelib.course.debug._rope_unsloth_repro_kernel`, its "math in the
input dtype" branch) rounds each product to bf16 before the sum, as its source says. It is
launched here on the GPU size of notebook 08 (bf16, S=512 B=2 H=8 D=128, TE's output from the
committed te-bits file) with Triton's floating-point fusion on (the default) and off, and the
same math is written four ways in float64 PyTorch (every product rounded, either product left
unrounded, both): elements whose bits differ from TE's output, printed one line each.
"""
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ropelib.course import debug  # noqa: E402


def main():
    if not torch.cuda.is_available():
        sys.exit("needs a GPU: the question is what the GPU's compiler makes of the kernel")
    root = Path(__file__).resolve().parents[1]
    case = debug.te_bits_case(debug.load_te_bits(debug.te_bits_file(root)), "nb_gpu")
    S, B, H, D = case.x.shape                                        # sbhd
    half = case.angles.shape[1]
    differ = lambda y: int(debug.bits_differ(y.cpu(), case.te).sum())  # noqa: E731
    cos = torch.cos(case.angles.cuda()).to(torch.bfloat16)          # [S, half] in x's dtype
    sin = torch.sin(case.angles.cuda()).to(torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}; the file's row: "
          f"{case.rows['debug:REPRO']['n_differ']}")
    for fusion in (True, False):
        rows = case.x.cuda().transpose(0, 1).contiguous().view(B * S, H, D)   # bshd rows b*S + s
        debug._rope_unsloth_repro_kernel[(rows.shape[0], H)](
            rows, cos, sin, rows.stride(0), rows.stride(1), cos.stride(0), S, HALF=half,
            BLOCK_HALF=triton.next_power_of_2(half), FROM_ANGLES=False, COMPUTE_FP32=False,
            USE_FMA=False, BF16_RTNE=False, enable_fp_fusion=fusion)
        print(f"kernel, enable_fp_fusion={fusion}: "
              f"{differ(rows.view(B, S, H, D).transpose(0, 1))}")
    x = case.x.cuda().double()
    x1, x2 = x[..., :half], x[..., half:]
    c, s = (t.double()[:, None, None, :] for t in (cos, sin))
    r = lambda v: v.to(torch.bfloat16).double()  # noqa: E731
    for name, y1, y2 in (("every product rounded", r(x1 * c) - r(x2 * s), r(x2 * c) + r(x1 * s)),
                         ("x*cos unrounded", x1 * c - r(x2 * s), x2 * c + r(x1 * s)),
                         ("rotated*sin unrounded", r(x1 * c) - x2 * s, r(x2 * c) + x1 * s),
                         ("no product rounded", x1 * c - x2 * s, x2 * c + x1 * s)):
        print(f"PyTorch float64, {name}: {differ(torch.cat((y1, y2), -1).to(torch.bfloat16))}")


if __name__ == "__main__":
    main()
