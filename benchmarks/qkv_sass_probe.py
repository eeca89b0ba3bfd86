"""The QKV projection's forward kernel (kernels/qkv_gemm.py) compiled for an sm_90 GPU on this
machine, no GPU needed: its MMA instructions, registers per thread and stack (spills), at the
GPU's tiles for Llama-3-8B's projection (hidden 4096, 32/8 heads of 128, bf16, 8192 tokens).

    python benchmarks/qkv_sass_probe.py                 # this checkout's kernel
    python benchmarks/qkv_sass_probe.py --root DIR      # a variant: DIR holds another ropelib/
    python benchmarks/qkv_sass_probe.py --cos-sin       # given a cos and a sin table

Run without TRITON_INTERPRET. Uses tests/gpu_compile_check.compile_for_gpu (Triton's own
compiler, the JIT's specialisation) and Triton's bundled nvdisasm and cuobjdump.
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=HERE, help="folder holding the ropelib/ to compile")
    ap.add_argument("--cos-sin", action="store_true",
                    help="a cos and a sin table [P, D] instead of an angle table")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("run without TRITON_INTERPRET=1 (the interpreter compiles nothing)")
    sys.path.insert(0, os.path.abspath(args.root))
    sys.path.insert(0, os.path.join(HERE, "tests"))
    import torch
    import triton
    import gpu_compile_check as G
    from ropelib.kernels import qkv_gemm as QG
    from ropelib.kernels.planning import pointer_dtypes

    S, B, HQ, HK, D, K = 4096, 2, 32, 8, 128, 4096
    N, M, bf = (HQ + 2 * HK) * D, S * B, torch.bfloat16
    x, w = torch.empty(M, K, dtype=bf), torch.empty(N, K, dtype=bf)
    outs = [torch.empty(M, h * D, dtype=bf) for h in (HQ, HK, HK)]
    sin = torch.empty(8192, D) if args.cos_sin else None
    ptrs = (x, w, None, *outs, torch.empty(8192, D), sin, None, None, None, None, None, None)
    planned = QG.plan("fwd", S=S, B=B, K=K, HQ=HQ, HK=HK, D=D, R=D, P=8192, ids=None,
                      cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                      device=torch.device("cuda"), dtypes=pointer_dtypes(ptrs))
    kept = {}
    compile_ = triton.compile

    def keep(*a, **kw):
        kept["c"] = compile_(*a, **kw)
        return kept["c"]
    G.triton.compile = keep
    G.compile_for_gpu("qkv-fwd", planned.launcher.kernel, QG.FWD_POINTERS, planned, ptrs)
    compiled = kept["c"]
    sass, regs, stack = G.machine_code(compiled)
    shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)",
                                   compiled.asm["ptx"])))
    tiles = {k: planned.args[k] for k in ("BLOCK_M", "BLOCK_K")}
    print(f"triton {triton.__version__}, sm_90, tiles {tiles}, {planned.num_warps} warps: "
          f"MMA {', '.join(shapes)} x {sum('HGMMA' in line for line in sass.splitlines())} "
          f"in the code, {regs} registers, stack {stack} bytes, "
          f"shared {compiled.metadata.shared} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
