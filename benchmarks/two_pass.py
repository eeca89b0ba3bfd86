"""Where the two-pass route (kernels/flat.py) pays: the finished kernel against the two-pass
route, forward and forward+backward, over sizes, layouts, dtypes and sources of cos/sin, each
beside the device copy of the same bytes (and torch.compile of Hugging Face's formula on a few
large cases). Chooses kernels/tiles.TWO_PASS_MIN_BYTES.

    python benchmarks/two_pass.py [--out DIR] [--compile]   # GPU; writes two_pass-<gpu>.csv

Each provider is timed with triton.testing.do_bench (median, L2 flushed) in the same process;
ratio = copy ms / provider ms (forward+backward: two copies). The route is forced (ropelib.bench.routes) with the
thresholds (kernels/tiles.py); "auto" is the route ropelib picks by itself. "pre-pass alone" is
the GPU time of the two-pass route's first kernel (the cos/sin table of the call's tokens).
Packed sequences (thd) also time the route's two ways of finding a token's row: "two-pass row
index" (an index per token first) and "two-pass by sequence" (one sequence per grid row).

Like for like with torch.compile: "auto cos/sin" reads fp32 tables (TE's precision, ropelib's
default), torch.compile is given the tables in the input's dtype (what Hugging Face models
write). For 16-bit inputs two more rows compare each with the other's table: "auto cos/sin
x-dtype" (ropelib reading the 16-bit tables torch.compile reads) and "torch.compile fp32 table".
"""
import argparse
import contextlib
import csv
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton.testing  # noqa: E402

import ropelib  # noqa: E402
from ropelib.bench.compare import hf_rotate  # noqa: E402
from ropelib import ops  # noqa: E402
from ropelib import eager  # noqa: E402
from ropelib.kernels import launch, planning, tiles  # noqa: E402
from ropelib.bench import compare, routes  # noqa: E402

# name: (dtype, layout, S, B, H, D, interleaved)
CASES = [
    ("bf16 sbhd 16 MiB s1k b2", torch.bfloat16, "sbhd", 1024, 2, 32, 128, False),
    ("bf16 sbhd 32 MiB s1k b4", torch.bfloat16, "sbhd", 1024, 4, 32, 128, False),
    ("bf16 sbhd 64 MiB s1k b8", torch.bfloat16, "sbhd", 1024, 8, 32, 128, False),
    ("bf16 bshd 64 MiB s1k b8", torch.bfloat16, "bshd", 1024, 8, 32, 128, False),
    ("bf16 thd 64 MiB t8k", torch.bfloat16, "thd", 8192, 1, 32, 128, False),
    ("bf16 sbhd 64 MiB s8k b1", torch.bfloat16, "sbhd", 8192, 1, 32, 128, False),
    ("bf16 sbhd 128 MiB s16k b1", torch.bfloat16, "sbhd", 16384, 1, 32, 128, False),
    ("bf16 sbhd 256 MiB s32k b1", torch.bfloat16, "sbhd", 32768, 1, 32, 128, False),
    ("bf16 sbhd 128 MiB s8k b2", torch.bfloat16, "sbhd", 8192, 2, 32, 128, False),
    ("bf16 sbhd 128 MiB s2k b8", torch.bfloat16, "sbhd", 2048, 8, 32, 128, False),
    ("bf16 sbhd 256 MiB s4k b8", torch.bfloat16, "sbhd", 4096, 8, 32, 128, False),
    ("bf16 sbhd 160 MiB s4k b8 d80", torch.bfloat16, "sbhd", 4096, 8, 32, 80, False),
    ("bf16 bshd 256 MiB s4k b8", torch.bfloat16, "bshd", 4096, 8, 32, 128, False),
    ("bf16 thd 256 MiB t32k", torch.bfloat16, "thd", 32768, 1, 32, 128, False),
    # packed sequences of equal length: 8 x 4096 tokens, a table of 4096 rows (the floor's thd
    # case: one sequence per grid row covers the tokens exactly) and of 8192 (half its grid empty)
    ("bf16 thd 256 MiB 8x4k P4k", torch.bfloat16, "thd", 32768, 1, 32, 128, False),
    ("bf16 thd 256 MiB 8x4k P8k", torch.bfloat16, "thd", 32768, 1, 32, 128, False),
    ("bf16 sbhd 256 MiB interleaved", torch.bfloat16, "sbhd", 4096, 8, 32, 128, True),
    ("bf16 sbhd 256 MiB s1k b32", torch.bfloat16, "sbhd", 1024, 32, 32, 128, False),
    ("fp16 bshd 256 MiB s4k b8", torch.float16, "bshd", 4096, 8, 32, 128, False),
    ("bf16 sbhd 1 GiB s16k b8", torch.bfloat16, "sbhd", 16384, 8, 32, 128, False),
    ("fp32 sbhd 256 MiB s2k b8", torch.float32, "sbhd", 2048, 8, 32, 128, False),
    ("fp32 sbhd 2 GiB s16k b8", torch.float32, "sbhd", 16384, 8, 32, 128, False),
]
COMPILED = {"bf16 sbhd 256 MiB s4k b8", "bf16 bshd 256 MiB s4k b8", "bf16 sbhd 128 MiB s16k b1",
            "bf16 sbhd 1 GiB s16k b8",
            "fp32 sbhd 2 GiB s16k b8", "bf16 sbhd 64 MiB s1k b8"}


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def table_pass_ms(x, freqs, kw):
    """GPU time of the two-pass route's pre-pass alone (the table of this call's tokens)."""
    layout = kw["layout"]
    x4 = ops.view4(x, layout)
    with routes.forced("two-pass"):
        planned, pointers = launch.plan(
            launch.View.of(x4), launch.View.of(x4),
            launch.Table(freqs.view(freqs.shape[0], -1), None),
            launch.Positions(cu_seqlens=kw.get("cu_seqlens")), R=freqs.shape[-1],
            interleaved=kw["interleaved"], backward=False, layout=layout)
    rows = planned.new_rows(x.device)
    tp = planned.table_pass
    return ms(lambda: planning.start(launch.COS_SIN_ROWS, tp,
                                     planned.table_pass_pointers(pointers[4:9], rows)))


@contextlib.contextmanager
def sequence_grid(grid):
    """Inside the block, packed sequences take one sequence per grid row while the grid is at
    most `grid` times the tokens (tiles.TWO_PASS_SEQUENCE_GRID; 0: never); None: as set."""
    if grid is None:
        yield
        return
    saved = tiles.TWO_PASS_SEQUENCE_GRID
    tiles.TWO_PASS_SEQUENCE_GRID = grid
    eager.SIGNATURES.clear()
    try:
        yield
    finally:
        tiles.TWO_PASS_SEQUENCE_GRID = saved
        eager.SIGNATURES.clear()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (slow)")
    ap.add_argument("--only", default="", help="cases whose name contains one of these "
                    "comma-separated strings (all: empty)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpu = compare.gpu_slug()
    path = os.path.join(args.out, f"two_pass-{gpu}.csv")
    f = open(path, "w", newline="")
    f.write(f"# gpu: {torch.cuda.get_device_name()}\n# torch: {torch.__version__}\n"
            f"# triton: {triton.__version__}\n"
            f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n"
            "# ratio: copy ms / provider ms in the same run (forward+backward: two copies)\n")
    w = csv.writer(f)
    w.writerow(["case", "pass", "provider", "ms", "ratio_to_copy"])
    print(f"{'case':34s} {'pass':8s} {'provider':22s} {'ms':>8s} {'ratio':>6s}", flush=True)
    for name, dt, layout, S, B, H, D, inter in CASES:
        if not any(part in name for part in args.only.split(",")):
            continue
        rows_of_table = {"8x4k P4k": 4096, "8x4k P8k": 8192}.get(name.split("MiB ")[-1], S)
        shape = {"sbhd": (S, B, H, D), "bshd": (B, S, H, D), "thd": (S, H, D)}[layout]
        x = torch.randn(shape, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        dy = torch.randn_like(x)
        xg = x.clone().requires_grad_(True)
        freqs = ropelib.rope_freqs(rows_of_table, D, interleaved=inter, device="cuda")
        cos, sin = ropelib.rope_cos_sin(rows_of_table, D, interleaved=inter, device="cuda")
        kw = dict(layout=layout, interleaved=inter)
        if layout == "thd":
            bounds = [0, S // 4, S // 2, S] if rows_of_table == S else range(0, S + 1, 4096)
            kw["cu_seqlens"] = torch.tensor(list(bounds), dtype=torch.int32, device="cuda")
        copy = ms(lambda: y.copy_(x))
        rows = [("forward", "copy", copy)]
        provs = {"finished": ("finished", dict(freqs=freqs)),
                 "two-pass": ("two-pass", dict(freqs=freqs)),
                 "two-pass cos/sin": ("two-pass", dict(cos=cos, sin=sin)),
                 "auto": ("auto", dict(freqs=freqs)),
                 "auto cos/sin": ("auto", dict(cos=cos, sin=sin))}
        if dt != torch.float32:     # the 16-bit tables torch.compile reads, for ropelib too
            provs["auto cos/sin x-dtype"] = ("auto", dict(cos=cos.to(dt), sin=sin.to(dt)))
        grids = {}
        if layout == "thd":         # packed sequences: a row index per token, or one sequence
            for prov, grid in (("two-pass row index", 0), ("two-pass by sequence", 1 << 30)):
                provs[prov] = ("two-pass", dict(freqs=freqs))  # per grid row (launch.by_sequence)
                grids[prov] = grid
        ref = None
        for prov, (route, table) in provs.items():
            with routes.forced(route), sequence_grid(grids.get(prov)):   # every call plans these
                def fwd(table=table):
                    return ropelib.apply_rope(x, **table, **kw)
                out = fwd()
                if ref is None:
                    ref = out
                elif prov.startswith("two-pass") and "cos/sin" not in prov \
                        and not torch.equal(out, ref):
                    raise SystemExit(f"{name}: the two-pass route's bits differ from the "
                                     "finished kernel's")
                rows.append(("forward", prov, ms(fwd)))

                def both(table=table):
                    torch.autograd.grad(ropelib.apply_rope(xg, **table, **kw), xg, dy)
                rows.append(("fwd+bwd", prov, ms(both)))
        try:
            rows.append(("forward", "pre-pass alone", table_pass_ms(x, freqs, kw)))
        except Exception as e:      # (a route whose pre-pass takes other pointers)
            print(f"{name}: pre-pass alone not timed: {e}", flush=True)
        if args.compile and name in COMPILED and layout != "thd":
            tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
            c16, s16 = cos.to(dt).view(tshape), sin.to(dt).view(tshape)
            tables = {"torch.compile": (c16, s16)}
            if dt != torch.float32:
                tables["torch.compile fp32 table"] = (cos.view(tshape), sin.view(tshape))
            for prov, (ct, st) in tables.items():
                comp = torch.compile(lambda t, ct=ct, st=st: hf_rotate(t, ct, st, inter).to(dt))
                rows.append(("forward", prov, ms(lambda: comp(x))))
                rows.append(("fwd+bwd", prov,
                             ms(lambda: torch.autograd.grad(comp(xg), xg, dy))))
                torch._dynamo.reset()
        for pas, prov, t in rows:
            ratio = (copy if pas == "forward" else 2 * copy) / t
            w.writerow([name, pas, prov, f"{t:.5f}", f"{ratio:.4f}"])
            if prov != "copy":
                print(f"{name:34s} {pas:8s} {prov:22s} {t:8.4f} {ratio:6.3f}", flush=True)
        f.flush()
        x = y = dy = xg = ref = out = None
        torch.cuda.empty_cache()
    print("wrote", path)


if __name__ == "__main__":
    main()
