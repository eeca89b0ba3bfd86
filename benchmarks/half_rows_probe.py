"""Does the flat pass gain from reading half of the pre-pass's cos/sin rows where a row's pairs
have equal members? The two-pass route with the pre-pass's flag per row ("halves": member b's
cos and s' written and loaded only in rows where some pair differs; kernels/flat.py) against the
same route without flags ("both halves": every entry written and loaded;
tiles.TWO_PASS_ROW_FLAGS = False), in alternating rounds in one process, beside the device copy
of the same bytes and torch.compile of Hugging Face's formula reading a bf16 table made before
the timing. Passes (the `pass` column):

    forward                   eager calls on one table: the rows written once and kept
                              ("known equal": once the flags are known all 0 on the host,
                              a flat pass that reads neither them nor member b's entries)
    fwd+bwd                   the same, forward and backward
    forward, rows not kept    eager calls on a table made under inference_mode: rows written
                              every call (at batch 1 the planner takes the finished kernel)
    forward, CUDA graph       GRAPH_CALLS calls captured in one graph, replayed: rows written
                              every call (the copy replayed the same way beside them)
    forward, compiled         torch.compile (Inductor, static shapes) of apply_rope, compiled
                              once per variant: rows written every call

    python benchmarks/half_rows_probe.py [--out DIR] [--rounds 5]   # GPU; half_rows_probe-<gpu>.csv

Each time is triton.testing.do_bench's median (L2 flushed; a replay's divided by its calls); a
row's ms is the median over the rounds; ratio = the copy's ms of the same pass kind / provider ms
(forward+backward: two copies').
"""
import argparse
import csv
import datetime
import os
import re
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
from ropelib.kernels import tiles  # noqa: E402

# name: (layout, S, B, H, D); bf16
CASES = [
    ("sbhd 128 MiB s16k b1", "sbhd", 16384, 1, 32, 128),
    ("bshd 128 MiB s16k b1", "bshd", 16384, 1, 32, 128),
    ("sbhd 256 MiB s32k b1", "sbhd", 32768, 1, 32, 128),
    ("sbhd 256 MiB s4k b8", "sbhd", 4096, 8, 32, 128),
    ("sbhd 1 GiB s16k b8", "sbhd", 16384, 8, 32, 128),
]
GRAPH_CALLS = 20


def variant(name: str) -> None:
    """The two-pass route with the pre-pass's flags ("halves"; with "known equal", kept rows
    found to have no differing pair then read no flags: tiles.TWO_PASS_PAIRS_EQUAL) or without
    ("both halves"); plans and kept rows forgotten."""
    tiles.TWO_PASS_ROW_FLAGS = name != "both halves"
    tiles.TWO_PASS_PAIRS_EQUAL = name == "known equal"
    eager.TABLE_ROWS.clear()
    eager.SIGNATURES.clear()


def replayed(fn):
    """fn captured GRAPH_CALLS times in one CUDA graph: a step that replays it."""
    fn()                                    # planned (and compiled) before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return graph.replay


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="", help="a regular expression: the cases it finds")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"half_rows_probe-{compare.gpu_slug()}.csv")
    f = open(path, "w", newline="")
    f.write(f"# gpu: {torch.cuda.get_device_name()}\n# torch: {torch.__version__}\n"
            f"# triton: {triton.__version__}\n"
            f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n"
            f"# rounds: {args.rounds}, providers alternating in each; ms the median over rounds\n"
            "# ratio: copy ms / provider ms (forward+backward: two copies; CUDA graph: the copy replayed)\n")
    w = csv.writer(f)
    w.writerow(["case", "pass", "provider", "ms", "ratio_to_copy", "ms_per_round"])
    print(f"{'case':24s} {'pass':8s} {'provider':14s} {'ms':>8s} {'ratio':>6s}", flush=True)
    try:
        for name, layout, S, B, H, D in CASES:
            if not re.search(args.cases, name):
                continue
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

            with torch.inference_mode():
                frozen = ropelib.rope_freqs(S, D, device="cuda")

            def fwd():
                return ropelib.apply_rope(x, freqs, layout=layout)

            def not_kept():
                return ropelib.apply_rope(x, frozen, layout=layout)

            def both():
                out = ropelib.apply_rope(xg, freqs, layout=layout)
                return torch.autograd.grad(out, xg, dy)

            # each variant's compiled function and graph made while its switch is set (the
            # route is planned when the call is compiled or captured)
            made = {}
            for halves in (True, False):
                variant("halves" if halves else "both halves")
                made[("compiled", halves)] = torch.compile(
                    (lambda t: ropelib.apply_rope(t, freqs, layout=layout)) if halves else
                    (lambda u: ropelib.apply_rope(u, freqs, layout=layout)), dynamic=False)
                made[("compiled", halves)](x)
                made[("graph", halves)] = replayed(fwd)
            copy_graph = replayed(lambda: y.copy_(x))

            providers = {
                "forward": {"copy": lambda: y.copy_(x), "halves": fwd, "known equal": fwd,
                            "both halves": fwd, "torch.compile": lambda: comp(x)},
                "fwd+bwd": {"halves": both, "known equal": both, "both halves": both},
                "forward, rows not kept": {"halves": not_kept, "both halves": not_kept},
                "forward, CUDA graph": {"copy": copy_graph, "halves": made[("graph", True)],
                                        "both halves": made[("graph", False)]},
                "forward, compiled": {"halves": lambda: made[("compiled", True)](x),
                                      "both halves": lambda: made[("compiled", False)](x)},
            }
            times = {(p, n): [] for p, d in providers.items() for n in d}
            for _ in range(args.rounds):
                for pass_, d in providers.items():
                    for n, fn in d.items():
                        variant(n)
                        fn()                    # rows written (and kept) before the timing
                        torch.cuda.synchronize()    # (their flags' reduction on the host)
                        t = ms(fn)
                        times[(pass_, n)].append(t / GRAPH_CALLS if "graph" in pass_ else t)
            copy = statistics.median(times[("forward", "copy")])
            copy_replayed = statistics.median(times[("forward, CUDA graph", "copy")])
            for (pass_, n), t in times.items():
                med = statistics.median(t)
                base = copy_replayed if "graph" in pass_ else copy
                ratio = (2 * base if pass_ == "fwd+bwd" else base) / med
                w.writerow([name, pass_, n, f"{med:.5f}", f"{ratio:.4f}",
                            " ".join(f"{v:.5f}" for v in t)])
                print(f"{name:24s} {pass_:8s} {n:14s} {med:8.4f} {ratio:6.3f}", flush=True)
            f.flush()
            del x, y, dy, xg, comp, made, copy_graph, providers
            torch.cuda.empty_cache()
    finally:
        variant("known equal")
        f.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
