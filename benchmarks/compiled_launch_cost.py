"""What one ropelib kernel costs the host inside torch.compile'd code, beside one of Inductor's own
kernels of the same size (GPU).

Each function below is compiled (torch.compile, default mode, fullgraph) and called back to
back at decode size (s=1, b=64, h=32, d=128, bf16: the device work is a few µs, so the time per
call is the host's), the functions taking turns round by round (ropelib.bench.suite's
host_us_interleaved, best of the rounds):

    empty graph        x + 0: Dynamo's guards, the compiled wrapper and one tiny Inductor kernel
    inductor rope      Hugging Face's q * cos + rotate_half(q) * sin, bf16 table: one Inductor
                       kernel of the same size as ropelib's
    ropelib            ropelib.apply_rope(q, freqs): ropelib's kernel, which Inductor launches
                       itself (a user-defined Triton kernel, torch.library.triton_op)
    ropelib qk         ropelib.apply_rope_qk(q, k, freqs) (32 and 8 heads)
    two ropelib        two apply_rope calls in one graph: the cost of each further launch
    ropelib, static    ropelib with Inductor's static launcher for user-defined kernels
                       (torch._inductor.config.static_launch_user_defined_triton_kernels)
    copy kernel, N args   a user-defined Triton copy kernel (torch.library.triton_op) taking N
                       runtime arguments (2 pointers, then ints it reads), N = 3 and 24: what
                       the argument count costs a launch in compiled code, apart from the kernel

and, for reference, the eager calls (ropelib's direct launcher). The CPU cost of a ropelib
launch in compiled code is `ropelib - empty graph`, to compare with `inductor rope - empty
graph`; `two ropelib - ropelib` is one more launch.

    python benchmarks/compiled_launch_cost.py [--out FILE.csv]
"""
import argparse
import csv
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.bench.suite import host_us_interleaved  # noqa: E402


@triton.jit
def _copy3(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


@triton.jit
def _copy24(x_ptr, y_ptr, n, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
            a15, a16, a17, a18, a19, a20, a21, BLOCK: tl.constexpr):
    # every int read (an unread argument might be dropped); their sum is 0 at run time
    z = (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15
         + a16 + a17 + a18 + a19 + a20 + a21)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + z
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


# 22 ints summing to 0, none of them 1 (Triton turns an int equal to 1 into a constant)
_EXTRA = tuple([3, 5, 7, 9, 11, 13, 17, 19, 23, 29, -136] + [2, -2] * 5 + [0])[:22]
assert len(_EXTRA) == 22 and sum(_EXTRA) == 0


def _copy_ops():
    """Two triton_ops (defined on first use: a GPU build of torch is needed)."""
    from torch.library import triton_op, wrap_triton

    @triton_op("ropelib_probe::copy3", mutates_args={})
    def copy3(x: torch.Tensor) -> torch.Tensor:
        y, n = torch.empty_like(x), x.numel()
        wrap_triton(_copy3)[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y

    @triton_op("ropelib_probe::copy24", mutates_args={})
    def copy24(x: torch.Tensor) -> torch.Tensor:
        y, n = torch.empty_like(x), x.numel()
        wrap_triton(_copy24)[(triton.cdiv(n, 1024),)](x, y, n, *_EXTRA, BLOCK=1024)
        return y
    return copy3, copy24


def write_code(graphs: dict, folder: str) -> int:
    """Each graph's generated code (Inductor's output code, the wrapper that launches its kernels
    and the kernels' sources) as <folder>/<graph>.py."""
    from torch._inductor.utils import run_and_get_code
    os.makedirs(folder, exist_ok=True)
    for name, (fn, inputs) in graphs.items():
        torch._dynamo.reset()
        static = name.endswith(", static")
        with torch._inductor.config.patch(static_launch_user_defined_triton_kernels=static):
            _, codes = run_and_get_code(torch.compile(fn, fullgraph=True), *inputs)
        path = os.path.join(folder, name.replace(" ", "_").replace(",", "") + ".py")
        with open(path, "w") as f:
            f.write("\n\n# ----- next code -----\n\n".join(codes))
        print(f"{name}: {len(codes)} code file(s), {sum(len(c) for c in codes)} characters -> {path}")
    return 0


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="CSV path (default: compiled-launch-cost-<gpu>.csv)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--code", default=None, metavar="DIR",
                    help="write the code Inductor generates for each graph here, and time nothing")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    dev, dt = "cuda", torch.bfloat16
    S, B, H, HK, D = 1, 64, 32, 8, 128
    q = torch.randn(S, B, H, D, device=dev, dtype=dt)
    k = torch.randn(S, B, HK, D, device=dev, dtype=dt)
    freqs = ropelib.rope_freqs(4096, D, device=dev)
    pos = torch.arange(S, device=dev)
    cos = torch.cos(freqs[:, 0, 0]).to(dt)[pos][:, None, None]      # [S, 1, 1, D]
    sin = torch.sin(freqs[:, 0, 0]).to(dt)[pos][:, None, None]

    graphs = {
        "empty graph": (lambda x: x + 0, (q,)),
        "inductor rope": (lambda x, c, s: x * c + rotate_half(x) * s, (q, cos, sin)),
        "ropelib": (lambda x, f: ropelib.apply_rope(x, f), (q, freqs)),
        "ropelib qk": (lambda x, y, f: ropelib.apply_rope_qk(x, y, f), (q, k, freqs)),
        "two ropelib": (lambda x, f: ropelib.apply_rope(ropelib.apply_rope(x, f), f), (q, freqs)),
    }
    copy3, copy24 = _copy_ops()
    graphs["copy kernel, 3 args"] = (lambda x: copy3(x), (q,))
    graphs["copy kernel, 24 args"] = (lambda x: copy24(x), (q,))
    graphs["ropelib, static"] = (lambda x, f: ropelib.apply_rope(x, f), (q, freqs))
    fns = {}
    with torch.no_grad():
        if args.code:
            return write_code(graphs, args.code)
        for name, (fn, inputs) in graphs.items():
            static = name.endswith(", static")
            try:
                with torch._inductor.config.patch(
                        static_launch_user_defined_triton_kernels=static):
                    compiled = torch.compile(fn, fullgraph=True)
                    out = compiled(*inputs)         # compile now, not while timed
            except Exception as e:  # noqa: BLE001  (an older torch without the switch)
                print(f"{name}: not compiled ({type(e).__name__}: {str(e)[:120]})")
                continue
            if name.startswith("copy kernel"):
                assert torch.equal(out, q), name
            fns[name] = ((lambda c=compiled, a=inputs: c(*a)), args.calls)
        fns["ropelib eager"] = ((lambda: ropelib.apply_rope(q, freqs)), args.calls)
        fns["ropelib qk eager"] = ((lambda: ropelib.apply_rope_qk(q, k, freqs)), args.calls)
        us = host_us_interleaved(fns, reps=args.rounds, device=dev)
    failed = {n: us.pop(n) for n in list(us) if isinstance(us[n], Exception)}
    for n, e in failed.items():
        print(f"{n}: failed ({type(e).__name__}: {str(e)[:120]})")
    gpu = torch.cuda.get_device_name()
    out = args.out or f"compiled-launch-cost-{compare.gpu_slug(gpu)}.csv"
    with open(out, "w", newline="") as f:
        f.write(f"# gpu: {gpu}\n# torch: {torch.__version__}\n"
                f"# host µs per call, {args.calls} calls back to back, best of {args.rounds} "
                "rounds taking turns; decode size s1 b64 h32 (k 8) d128 bf16\n")
        w = csv.writer(f)
        w.writerow(["function", "host_us"])
        for name, v in us.items():
            w.writerow([name, f"{v:.2f}"])
    base = us["empty graph"]
    print(f"{gpu}: host µs per call (decode size)")
    for name, v in us.items():
        extra = f"  (+{v - base:.1f} over the empty graph)" if "eager" not in name else ""
        print(f"  {name:18s} {v:7.1f}{extra}")
    print(f"one more ropelib launch in a graph: {us['two ropelib'] - us['ropelib']:.1f} µs; "
          f"Inductor's rope kernel: {us['inductor rope'] - base:.1f} µs over the empty graph")
    if "copy kernel, 3 args" in us and "copy kernel, 24 args" in us:
        per = (us["copy kernel, 24 args"] - us["copy kernel, 3 args"]) / 21
        print(f"a user-defined kernel's launch: {us['copy kernel, 3 args'] - base:.1f} µs over the "
              f"empty graph at 3 arguments, {per:.2f} µs per further argument")
    if "ropelib, static" in us:
        print(f"ropelib with the static launcher: {us['ropelib, static'] - base:.1f} µs over the "
              f"empty graph (Triton's launcher: {us['ropelib'] - base:.1f})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
