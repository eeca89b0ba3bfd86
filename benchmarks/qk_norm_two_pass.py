"""Does QK-RMSNorm + RoPE gain from the two-pass route (kernels/qk_norm_rope.py, plan_rows: the
cos/sin pre-pass, then a rows pass with no batch loop)? Times `ropelib.qk_norm_rope` forward,
and forward+backward, with the route off (the one kernel, today's default) and on
(tiles.QK_NORM_TWO_PASS), each beside a device copy of q and k in the same run (two copies for
forward+backward), and checks the two agree. Decides tiles.QK_NORM_TWO_PASS.

    python benchmarks/qk_norm_two_pass.py [--out DIR]      # a GPU; writes qk_norm_two_pass-<gpu>.csv

Cases: the floor suite's Qwen3-sized block (bshd b8 s4096, 32/8 heads of 128, bf16) with angles
and with a cos/sin table, and a 1 GiB one.
"""
import argparse
import os

import torch
import triton

import ropelib
from ropelib import eager
from ropelib.bench import compare
from ropelib.kernels import tiles

CASES = [  # name, B, S, HQ, HK, table
    ("bshd b8 s4096 32/8 heads, angles", 8, 4096, 32, 8, "angles"),
    ("bshd b8 s4096 32/8 heads, cos/sin", 8, 4096, 32, 8, "cos/sin"),
    ("bshd b8 s16384 32/8 heads, angles", 8, 16384, 32, 8, "angles"),
]


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpu = compare.gpu_slug()
    rows = []
    for name, B, S, HQ, HK, kind in CASES:
        q = torch.randn(B, S, HQ, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, HK, 128, device="cuda", dtype=torch.bfloat16)
        w_q, w_k = (1 + 0.1 * torch.randn(128, device="cuda") for _ in range(2))
        table = dict(freqs=ropelib.rope_freqs(S, 128, device="cuda")) if kind == "angles" else \
            dict(zip(("cos", "sin"), ropelib.rope_cos_sin(S, 128, device="cuda")))
        qc, kc = torch.empty_like(q), torch.empty_like(k)
        copy = ms(lambda: (qc.copy_(q), kc.copy_(k)))
        qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        outs = {}
        for route in (False, True):
            tiles.QK_NORM_TWO_PASS = route
            eager.SIGNATURES.clear()
            fwd = lambda: ropelib.qk_norm_rope(q, k, w_q, w_k, **table)  # noqa: E731

            def both():
                out = ropelib.qk_norm_rope(qg, kg, w_q, w_k, **table)
                return torch.autograd.grad(out, (qg, kg), (gq, gk))
            outs[route] = fwd() + both()
            for pas, fn, copies in (("forward", fwd, 1), ("fwd+bwd", both, 2)):
                t = ms(fn)
                rows.append((name, pas, "two-pass" if route else "one kernel", t,
                             copies * copy / t))
        tiles.QK_NORM_TWO_PASS = False
        eager.SIGNATURES.clear()
        for a, b in zip(outs[False], outs[True]):
            torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=2**-7)
        for _, pas, prov, t, r in rows[-4:]:
            print(f"{name:38s} {pas:8s} {prov:12s} {t:8.4f} ms {r:6.3f} of a copy", flush=True)
        q = k = qc = kc = qg = kg = gq = gk = None
        torch.cuda.empty_cache()
    fields = ["case", "pass", "provider", "ms", "ratio_to_copy"]
    path = compare.write_csv(
        [dict(zip(fields, (c, pas, p, f"{t:.5f}", f"{r:.4f}"))) for c, pas, p, t, r in rows],
        os.path.join(args.out, f"qk_norm_two_pass-{gpu}.csv"), meta=compare.environment_meta(),
        fields=fields)
    print("wrote", path)


if __name__ == "__main__":
    main()
