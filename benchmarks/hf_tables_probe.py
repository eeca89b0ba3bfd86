"""Hugging Face's [B, S, D] cos/sin tables (one row per token and batch entry, bf16) through
`ropelib.hf.apply_rotary_pos_emb`, heads of 128: 28 q / 4 kv at b4 s8192 (268 MB of q and k)
and b4 s2048 (67 MB), 32 / 1 at b4 s8192 (k of one head, contiguous both ways): q and k as
transformers' [B, H, S, D] views of bshd projections ("bshd-memory") and as contiguous
[B, H, S, D] tensors ("bhsd"); the finished kernel forced
against the route planned ("auto"), Liger's LigerRopeFunction forward on copies, and a copy of
q and k; forward and forward+backward, medians of 3 rounds of triton.testing.do_bench, as
ratios to the copy. Needs a GPU (Liger optional: benchmarks/gpu_wheels.sh).

    python3 benchmarks/hf_tables_probe.py > hf_tables.log
"""
import statistics as st

import torch
import triton.testing as tt

import ropelib
import ropelib.hf
from ropelib.bench.routes import forced
try:
    from liger_kernel.ops.rope import LigerRopeFunction
except Exception:  # noqa: BLE001 -- not installed: its row is left out
    LigerRopeFunction = None


def hf_tables(B: int, S: int, D: int, dev: str = "cuda"):
    """cos, sin [B, S, D] bf16 as transformers materialises them: each batch entry's positions
    start at its own offset below 64 (seeded), so every row is the entry's own."""
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = (torch.arange(S)[None] + torch.randint(0, 64, (B, 1), generator=g)).to(dev)
    cos_t, sin_t = ropelib.rope_cos_sin(S + 64, D, dtype=torch.bfloat16, device=dev)
    return cos_t[ids], sin_t[ids]


def main():
    dev = "cuda"

    for B, S, HQ, HK in ((4, 8192, 28, 4), (4, 2048, 28, 4), (4, 8192, 32, 1)):
        D = 128
        cos, sin = hf_tables(B, S, D, dev)                          # [B, S, D]
        for mem in ("bshd-memory", "bhsd"):
            if mem == "bshd-memory":
                q = torch.randn(B, S, HQ, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
                k = torch.randn(B, S, HK, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
            else:
                q = torch.randn(B, HQ, S, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn(B, HK, S, D, device=dev, dtype=torch.bfloat16)
            gq, gk = torch.randn_like(q), torch.randn_like(k)
            ql, kl = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
            def f():
                ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
            def fb():
                torch.autograd.backward(ropelib.hf.apply_rotary_pos_emb(ql, kl, cos, sin), (gq, gk))
            def cf():
                q.clone(); k.clone()
            def cfb():
                torch.autograd.backward((ql.clone(), kl.clone()), (gq, gk))
            res = {}
            for rnd in range(3):
                res.setdefault("copy fwd", []).append(tt.do_bench(cf))
                res.setdefault("copy fwd+bwd", []).append(tt.do_bench(cfb, grad_to_none=[ql, kl]))
                for route in ("finished", "auto"):
                    with forced(route):
                        res.setdefault(f"{route} fwd", []).append(tt.do_bench(f))
                        res.setdefault(f"{route} fwd+bwd", []).append(
                            tt.do_bench(fb, grad_to_none=[ql, kl]))
                if LigerRopeFunction is not None:
                    q2, k2 = q.clone(), k.clone()
                    res.setdefault("liger fwd", []).append(
                        tt.do_bench(lambda: LigerRopeFunction.apply(q2, k2, cos, sin)))
            cfw, cfbw = st.median(res["copy fwd"]), st.median(res["copy fwd+bwd"])
            for n, v in res.items():
                c = cfbw if "bwd" in n else cfw
                print(f"B{B} S{S} {HQ}/{HK} {mem:12} {n:18} {st.median(v)*1e3:8.1f} us  "
                      f"ratio {c/st.median(v):.3f}")


if __name__ == "__main__":
    main()
