"""Packed sequences (thd), 256 MiB: forward, backward alone and forward+backward against a copy,
bf16 and fp32, to find where a thd forward+backward loses time.

    python benchmarks/thd_probe.py
"""
import torch
import triton.testing

import ropelib
from ropelib.bench.compare import Config, make_case


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def main():
    print(torch.cuda.get_device_name())
    for dtype, seq in (("bf16", 4096), ("fp32", 2048)):
        for interleaved in (False, True):
            c = make_case(Config(seq_len=seq, batch=8, heads=32, head_dim=128, dtype=dtype,
                                 layout="thd", interleaved=interleaved), "cuda")
            x, f, cu = c.x, c.freqs, c.cu_seqlens
            y = torch.empty_like(x)
            copy = ms(lambda: y.copy_(x))
            fwd = ms(lambda: ropelib.apply_rope(x, f, layout="thd", cu_seqlens=cu,
                                                interleaved=interleaved))
            xg = x.clone().requires_grad_(True)
            g = torch.randn_like(x)
            out = ropelib.apply_rope(xg, f, layout="thd", cu_seqlens=cu, interleaved=interleaved)
            bwd = ms(lambda: torch.autograd.grad(out, xg, g, retain_graph=True))

            def fwdbwd():
                o = ropelib.apply_rope(xg, f, layout="thd", cu_seqlens=cu,
                                       interleaved=interleaved)
                torch.autograd.grad(o, xg, g)
            both = ms(fwdbwd)
            print(f"{dtype} interleaved={interleaved}: copy {copy:.3f} ms, fwd {fwd:.3f} "
                  f"({copy / fwd:.3f}), bwd alone {bwd:.3f} ({copy / bwd:.3f}), fwd+bwd {both:.3f} "
                  f"({2 * copy / both:.3f})")


if __name__ == "__main__":
    main()
