"""The fused QKV forward at 3 and 4 pipeline stages, beside the bare Triton GEMM at the same
stages, the unfused pipeline and cuBLAS, in 9 shuffled rounds (one `do_bench` median per variant
a round), so the epilogue's cost and the stage count are read against the GPU's drift between
rounds rather than from one median each (what qkv_rope_bench.py and qkv_tiles.py print).
Llama-3-8B's projection (hidden 4096, 32/8 heads of 128, bf16), 8192 and 32768 tokens.

    python benchmarks/qkv_stages_ab.py      # GPU only: prints the table
"""
import os
import random
import statistics
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkv_rope_bench as bench  # noqa: E402  (it puts the checkout on sys.path)

import ropelib  # noqa: E402
from ropelib.kernels import qkv_gemm  # noqa: E402

HQ, HK, D, HIDDEN, ROUNDS = 32, 8, 128, 4096, 9


def main() -> None:
    angles = ropelib.rope_angles(D, base=500000.0, device="cuda")
    prov = dict(bench.providers(HQ, HK, D, angles, False))
    print(torch.cuda.get_device_name(), "GPU_TILES fwd:", qkv_gemm.GPU_TILES["fwd"])
    base = dict(qkv_gemm.GPU_TILES["fwd"])
    for tokens in (8192, 32768):
        args, _ = bench.inputs(tokens, HIDDEN, HQ, HK, D, "cuda")
        variants = {f"{name} stages={st}": (st, prov[name])
                    for st in (3, 4) for name in ("fused", "triton_gemm")}
        variants.update(unfused=(None, prov["unfused"]), cublas=(None, prov["cublas"]))
        res = {k: [] for k in variants}
        rng = random.Random(0)
        with torch.no_grad():
            for _ in range(ROUNDS):
                order = list(variants)
                rng.shuffle(order)
                for k in order:
                    st, fn = variants[k]
                    qkv_gemm.GPU_TILES["fwd"] = dict(base, num_stages=st) if st else dict(base)
                    ropelib.eager.SIGNATURES.clear()    # (the kept plans read the old table)
                    res[k].append(triton.testing.do_bench(lambda: fn(*args), warmup=10, rep=60))
        qkv_gemm.GPU_TILES["fwd"] = dict(base)
        ropelib.eager.SIGNATURES.clear()
        ref = res["unfused"]
        print(f"tokens {tokens}: median ms over {ROUNDS} rounds; per-round unfused/variant "
              "median (min-max)")
        for k, v in res.items():
            rat = [a / b for a, b in zip(ref, v)]
            print(f"  {k:22s} {statistics.median(v):7.3f}  {statistics.median(rat):.3f} "
                  f"({min(rat):.3f}-{max(rat):.3f})")


if __name__ == "__main__":
    main()
