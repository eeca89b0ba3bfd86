"""The QKV projection's forward kernel (kernels/qkv_gemm.py) compiled for an sm_90 GPU on this
machine, no GPU needed: its MMA instructions, registers per thread and stack (spills), at the
GPU's tiles for Llama-3-8B's projection (hidden 4096, 32/8 heads of 128, bf16, 8192 tokens),
reading every token's cos and s' rows (what qkv_rope_linear's pre-pass writes).

    python benchmarks/qkv_sass_probe.py                 # this checkout's kernel
    python benchmarks/qkv_sass_probe.py --root DIR      # a variant: DIR holds another ropelib/
    python benchmarks/qkv_sass_probe.py --tma           # the persistent TMA forward (what a
                                                        # Hopper GPU runs): its epilogues from
                                                        # table-free angles, without and with
                                                        # QK-norm (inference, and training,
                                                        # which saves the norm's input), beside
                                                        # the same GEMM with no epilogue

The TMA rows count SASS instructions as compiled (static: each appears once in the code, both
sides of a branch counted, so q's and k's epilogues both), by opcode.

Run without TRITON_INTERPRET. Compiles with ropelib.course.offline_compile (Triton's own
compiler, the JIT's specialisation) and reads the cubin with Triton's bundled nvdisasm and
cuobjdump (tests/gpu_compile_check.machine_code).
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=HERE, help="folder holding the ropelib/ to compile")
    ap.add_argument("--tma", action="store_true",
                    help="the persistent TMA forward's epilogues (angles; QK-norm off and on)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("run without TRITON_INTERPRET=1 (the interpreter compiles nothing)")
    sys.path.insert(0, os.path.abspath(args.root))
    sys.path.insert(0, os.path.join(HERE, "tests"))
    import torch
    import triton
    import gpu_compile_check as G
    from ropelib.course.offline_compile import compile_for_cuda
    from ropelib.kernels import qkv_gemm as QG
    from ropelib.kernels.planning import pointer_dtypes

    S, B, HQ, HK, D, K = 4096, 2, 32, 8, 128, 4096
    N, M, bf = (HQ + 2 * HK) * D, S * B, torch.bfloat16
    x, w = torch.empty(M, K, dtype=bf), torch.empty(N, K, dtype=bf)
    outs = [torch.empty(M, h * D, dtype=bf) for h in (HQ, HK, HK)]
    if args.tma:
        return tma_epilogues(G, compile_for_cuda, QG, pointer_dtypes, x, w, outs,
                             S=S, B=B, HQ=HQ, HK=HK, D=D, K=K)
    ptrs = QG.pointers("fwd", x_ptr=x, w_ptr=w, q_ptr=outs[0], k_ptr=outs[1], v_ptr=outs[2],
                       cos_ptr=torch.empty(M, D), sin_ptr=torch.empty(M, D))
    planned = QG.plan("fwd", S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=D, P=8192, ids=None,
                      cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                      device=torch.device("cuda"), dtypes=pointer_dtypes(ptrs))
    compiled = compile_for_cuda(planned.launcher.kernel, dict(zip(QG.FWD_POINTERS, ptrs),
                                                              **planned.args),
                                **planned.options())
    sass, regs, stack = G.machine_code(compiled)
    shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)",
                                   compiled.asm["ptx"])))
    tiles = {k: planned.args[k] for k in ("BLOCK_M", "BLOCK_K")}
    print(f"triton {triton.__version__}, sm_90, tiles {tiles}, {planned.num_warps} warps: "
          f"MMA {', '.join(shapes)} x {sum('HGMMA' in line for line in sass.splitlines())} "
          f"in the code, {regs} registers, stack {stack} bytes, "
          f"shared {compiled.metadata.shared} bytes")
    return 0


OPCODES = ("HGMMA", "LDG", "STG", "STS", "LDS", "LDSM", "BAR", "SHFL", "MUFU", "FFMA", "FMUL",
           "FADD", "F2FP", "STL", "LDL")


def opcode_counts(sass: str) -> dict:
    """{opcode: instructions} of nvdisasm's listing (predicated ones included)."""
    import collections
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(2)] += 1
    return ops


def tma_epilogues(G, compile_for_cuda, QG, pointer_dtypes, x, w, outs, *, S, B, HQ, HK, D, K):
    """The TMA forward compiled as a Hopper GPU with 132 SMs would launch it, four ways."""
    import torch
    import triton
    QG.has_tma = lambda device: True            # this machine has no GPU to ask
    QG._programs = lambda device: 132
    M = S * B
    nw = torch.empty(D, dtype=torch.float32)
    print(f"triton {triton.__version__}, sm_90, the TMA forward (static SASS counts)")
    print(f"{'epilogue':30s} {'regs':>4s} {'stack':>5s} {'all':>5s} "
          + " ".join(f"{k:>5s}" for k in OPCODES))
    for name, rotate, norm, train in (("none (the bare GEMM)", False, False, False),
                                      ("angles", True, False, False),
                                      ("angles + QK-norm, inference", True, True, False),
                                      ("angles + QK-norm, training", True, True, True)):
        given = dict(x_ptr=x, w_ptr=w, q_ptr=outs[0], k_ptr=outs[1], v_ptr=outs[2],
                     cos_ptr=torch.empty(M, D), sin_ptr=torch.empty(M, D))
        if norm:
            given.update(norm_q_ptr=nw, norm_k_ptr=nw)
        if train:           # the norm's saved input and statistics
            given.update(rstd_ptr=torch.empty(M, HQ + HK),
                         pre_ptr=torch.empty(M, (HQ + HK) * D, dtype=x.dtype))
        ptrs = QG.pointers("fwd", **given)
        planned = QG.plan("fwd", S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=D, P=M, ids=None,
                          cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                          device=torch.device("cuda"), dtypes=pointer_dtypes(ptrs),
                          rotate=rotate, shared_angle=True)
        assert planned.launcher is QG.FWD_TMA, "the TMA forward was not planned"
        compiled = compile_for_cuda(planned.launcher.kernel,
                                    dict(zip(QG.FWD_POINTERS, ptrs), **planned.args),
                                    **planned.options())
        sass, regs, stack = G.machine_code(compiled)
        ops = opcode_counts(sass)
        print(f"{name:30s} {regs:>4s} {stack:>5s} {sum(ops.values()):5d} "
              + " ".join(f"{ops[k]:5d}" for k in OPCODES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
