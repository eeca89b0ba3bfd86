"""Does the flat pass gain from reading half of the kept cos/sin rows where every pair's members
are equal? ropelib's eager route (the pre-pass's rows kept, eager.TableRows) with its flag
("halves": member b's cos and s' loaded only where some pair differs) against the same route
with no flag ("both halves": every entry loaded, as before), in alternating rounds in one
process, beside the device copy of the same bytes and torch.compile of Hugging Face's formula
reading a bf16 table made before the timing.

    python benchmarks/half_rows_probe.py [--out DIR] [--rounds 5]   # GPU; half_rows_probe-<gpu>.csv

Each time is triton.testing.do_bench's median (L2 flushed); a row's ms is the median over the
rounds; ratio = copy ms / provider ms (forward+backward: two copies' ms).
"""
import argparse
import csv
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

import ropelib  # noqa: E402
from ropelib import eager  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.bench.compare import hf_rotate  # noqa: E402
from ropelib.kernels import launch  # noqa: E402

# name: (layout, S, B, H, D); bf16
CASES = [
    ("sbhd 128 MiB s16k b1", "sbhd", 16384, 1, 32, 128),
    ("bshd 128 MiB s16k b1", "bshd", 16384, 1, 32, 128),
    ("sbhd 256 MiB s32k b1", "sbhd", 32768, 1, 32, 128),
    ("sbhd 256 MiB s4k b8", "sbhd", 4096, 8, 32, 128),
    ("sbhd 1 GiB s16k b8", "sbhd", 16384, 8, 32, 128),
]
REAL_NEW_FLAG = launch.TwoPass.new_flag


def variant(halves: bool) -> None:
    """The eager route with (halves) or without the pre-pass's flag; kept rows forgotten."""
    launch.TwoPass.new_flag = REAL_NEW_FLAG if halves else (lambda self, device: None)
    eager.TABLE_ROWS.clear()
    eager.SIGNATURES.clear()


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"half_rows_probe-{compare.gpu_slug()}.csv")
    f = open(path, "w", newline="")
    f.write(f"# gpu: {torch.cuda.get_device_name()}\n# torch: {torch.__version__}\n"
            f"# triton: {triton.__version__}\n"
            f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n"
            f"# rounds: {args.rounds}, providers alternating in each; ms the median over rounds\n"
            "# ratio: copy ms / provider ms (forward+backward: two copies)\n")
    w = csv.writer(f)
    w.writerow(["case", "pass", "provider", "ms", "ratio_to_copy", "ms_per_round"])
    print(f"{'case':24s} {'pass':8s} {'provider':14s} {'ms':>8s} {'ratio':>6s}", flush=True)
    try:
        for name, layout, S, B, H, D in CASES:
            shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            y = torch.empty_like(x)
            dy = torch.randn_like(x)
            xg = x.clone().requires_grad_(True)
            freqs = ropelib.rope_freqs(S, D, device="cuda")
            cos, sin = ropelib.rope_cos_sin(S, D, device="cuda", dtype=torch.bfloat16)
            tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
            c16, s16 = cos.view(tshape), sin.view(tshape)
            comp = torch.compile(lambda t: hf_rotate(t, c16, s16, False).to(t.dtype))
            comp(x)

            def fwd():
                return ropelib.apply_rope(x, freqs, layout=layout)

            def both():
                out = ropelib.apply_rope(xg, freqs, layout=layout)
                return torch.autograd.grad(out, xg, dy)

            providers = {
                "forward": {"copy": lambda: y.copy_(x), "halves": fwd, "both halves": fwd,
                            "torch.compile": lambda: comp(x)},
                "fwd+bwd": {"halves": both, "both halves": both},
            }
            times = {(p, n): [] for p, d in providers.items() for n in d}
            for _ in range(args.rounds):
                for pass_, d in providers.items():
                    for n, fn in d.items():
                        variant(n != "both halves")
                        fn()                    # rows written (and kept) before the timing
                        times[(pass_, n)].append(ms(fn))
            copy = statistics.median(times[("forward", "copy")])
            for (pass_, n), t in times.items():
                med = statistics.median(t)
                ratio = (copy if pass_ == "forward" else 2 * copy) / med
                w.writerow([name, pass_, n, f"{med:.5f}", f"{ratio:.4f}",
                            " ".join(f"{v:.5f}" for v in t)])
                print(f"{name:24s} {pass_:8s} {n:14s} {med:8.4f} {ratio:6.3f}", flush=True)
            f.flush()
            del x, y, dy, xg, comp
            torch.cuda.empty_cache()
    finally:
        variant(True)
        f.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
