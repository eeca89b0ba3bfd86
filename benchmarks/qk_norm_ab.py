"""ropelib.qk_norm_rope at two revisions of the code, side by side on one GPU (an A/B).

    python benchmarks/qk_norm_ab.py --base REV [--repeats 2]
    python benchmarks/qk_norm_ab.py --variant NAME=DIR [--variant NAME=DIR ...]

The ropelib of git revision REV is extracted into a temporary folder (or each --variant's DIR
holds a ropelib/ of its own, where there is no git history); each variant (REV or the
--variants, then this checkout) runs in its own process, alternated `repeats` times, so GPU
clocks drift alike for all. Each run times, beside a device copy of q and k in the same process (ratios, 1.00 =
the copy's time; forward+backward against two copies), the forward and forward+backward of
the floor suite's Qwen3-sized blocks (forward+backward also replayed from a CUDA graph, beside
copies replayed so: the device's time alone), and the host time of an eager decode call.
Prints the range over the repeats for each variant.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, time, torch, triton
import ropelib
torch.manual_seed(0)
def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)
def replayed(fn, calls=10):
    """ms per call of fn replayed from a CUDA graph of `calls` calls: the device's time alone.
    (Not ropelib.bench.suite.graph_replay_ms: each variant imports its own ropelib, and every
    variant must be timed by the same code.)"""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return ms(graph.replay) / calls
res = {}
for name, B, S, HQ, HK, kind in [("b8 s4096 32/8 angles", 8, 4096, 32, 8, "angles"),
                                 ("b8 s4096 32/8 cos/sin", 8, 4096, 32, 8, "cos"),
                                 ("b2 s16384 40/8 angles", 2, 16384, 40, 8, "angles"),
                                 ("b8 s16384 32/8 angles", 8, 16384, 32, 8, "angles"),
                                 ("b1 s32768 32/8 angles", 1, 32768, 32, 8, "angles"),
                                 ("thd 8x4096 32/8 angles", 8, 4096, 32, 8, "thd")]:
    shape = (B * S,) if kind == "thd" else (B, S)      # thd: B sequences of S tokens, packed
    q = torch.randn(*shape, HQ, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(*shape, HK, 128, device="cuda", dtype=torch.bfloat16)
    w_q, w_k = (1 + 0.1 * torch.randn(128, device="cuda") for _ in range(2))
    table = dict(freqs=ropelib.rope_freqs(S, 128, device="cuda")) if kind != "cos" else \
        dict(zip(("cos", "sin"), ropelib.rope_cos_sin(S, 128, device="cuda")))
    if kind == "thd":
        table.update(layout="thd", cu_seqlens=torch.arange(0, B * S + 1, S, device="cuda",
                                                           dtype=torch.int32))
    qc, kc = torch.empty_like(q), torch.empty_like(k)
    copy = ms(lambda: (qc.copy_(q), kc.copy_(k)))
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    def both():
        out = ropelib.qk_norm_rope(qg, kg, w_q, w_k, **table)
        return torch.autograd.grad(out, (qg, kg), (gq, gk))
    copy_replayed = replayed(lambda: (qc.copy_(q), kc.copy_(k)))
    res[name] = dict(forward=copy / ms(lambda: ropelib.qk_norm_rope(q, k, w_q, w_k, **table)),
                     both=2 * copy / ms(both), both_replayed=2 * copy_replayed / replayed(both))
q = torch.randn(64, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
f = ropelib.rope_freqs(4096, 128, device="cuda")
with torch.no_grad():
    for _ in range(100):
        ropelib.qk_norm_rope(q, k, w_q, w_k, f)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3000):
        ropelib.qk_norm_rope(q, k, w_q, w_k, f)
    res["decode b64: host us a forward call"] = dict(forward=(time.perf_counter() - t) / 3e-3)
    torch.cuda.synchronize()
print("RESULT " + json.dumps(res))
'''


def run(path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], env=dict(os.environ, PYTHONPATH=path),
                         capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-4000:])
    return json.loads(line[0][len("RESULT "):])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="git revision to compare this checkout with")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="a folder holding another ropelib/ to compare this checkout with")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    if bool(args.base) == bool(args.variant):
        ap.error("give --base REV or --variant NAME=DIR (one or more)")
    with tempfile.TemporaryDirectory() as base:
        if args.base:
            archive = subprocess.run(["git", "-C", ROOT, "archive", args.base, "ropelib"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
            paths = {args.base: base}
        else:
            paths = dict(v.split("=", 1) for v in args.variant)
        paths["this checkout"] = ROOT
        runs = {name: [] for name in paths}
        for _ in range(args.repeats):
            for name, path in paths.items():
                runs[name].append(run(os.path.abspath(path)))
    names = list(runs)
    print(f"{'case':36s} {'pass':8s} " + " ".join(f"{n:>16s}" for n in names))
    for case, passes in runs[names[0]][0].items():
        for p in passes:
            cells = []
            for n in names:
                v = [r[case][p] for r in runs[n]]
                cells.append(f"{min(v):7.3f}-{max(v):7.3f}")
            print(f"{case:36s} {p:8s} " + " ".join(f"{c:>16s}" for c in cells))


if __name__ == "__main__":
    main()
