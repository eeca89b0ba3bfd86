"""Where the cost of starting programs sits: in each SM, or in the GPU as a whole (notebook 03,
section 4.4's open question).

    python benchmarks/program_start_sms.py [--out DIR]    # GPU; writes program_start_sms-<gpu>-<stamp>.csv

Notebook 03 measures that empty one-warp programs start at about 0.6 ns each on a 132-SM GPU
(`program_cost.py`), and reads it as 80 ns a program on each SM if the SMs share the work evenly.
Whether the limit sits in each SM (then fewer SMs start programs proportionally slower, and a GPU
with more SMs would start them faster) or in the GPU's block scheduler (then the rate stays while
SMs are taken away, until each SM's own cost binds) is what this probe tests: it confines the
same empty kernel to fewer SMs with CUDA green contexts (`torch.cuda.green_contexts`), counts the
SMs the programs actually ran on (each program of a second kernel writes its `%smid`), and times
the empty kernel at two grid sizes on the green context's stream. The slope between the two sizes
(ns per program, the launch's fixed cost cancelled) times the SMs used is the cost of a program
on each SM.

Per-SM limit: ns per program x SMs stays constant as SMs are taken away. GPU-wide limit: ns per
program stays constant (and ns x SMs falls) until few enough SMs are left.
"""
import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.bench import compare  # noqa: E402

SMALL, LARGE = 1 << 18, 1 << 20     # the two grids whose difference gives the slope
SMID_PROGRAMS = 1 << 16             # programs of the %smid kernel, to find the SMs in use


@triton.jit
def _empty_kernel(x_ptr):
    # grid (programs,), one warp each: nothing to do
    pass


@triton.jit
def _smid_kernel(out_ptr):
    # grid (programs,): program p writes the SM it ran on to out[p]
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=False, pack=1)
    tl.store(out_ptr + tl.program_id(0), smid)


def timed_ms(fn, stream, reps=50, warmup=5):
    """Median ms of fn on `stream`, by CUDA events recorded on that stream."""
    times = []
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure(stream, x):
    """(SMs the programs ran on, ms at SMALL, ms at LARGE, ns per program) on `stream`."""
    ids = torch.full((SMID_PROGRAMS,), -1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(stream):
        _smid_kernel[(SMID_PROGRAMS,)](ids, num_warps=1)
    stream.synchronize()
    assert (ids >= 0).all(), "every program wrote its SM"
    sms_used = int(torch.unique(ids).numel())
    small = timed_ms(lambda: _empty_kernel[(SMALL,)](x, num_warps=1), stream)
    large = timed_ms(lambda: _empty_kernel[(LARGE,)](x, num_warps=1), stream)
    return sms_used, small, large, (large - small) * 1e6 / (LARGE - SMALL)


def green_stream(num_sms):
    """(the green context, a stream whose work runs on about num_sms SMs, a function that undoes
    the context). The caller keeps the context alive while it uses the stream: a green context
    that is garbage-collected destroys its streams' context ("context is destroyed", as the first
    GPU run of this script found when only the stream was kept)."""
    from torch.cuda.green_contexts import GreenContext
    ctx = GreenContext.create(num_sms=num_sms)
    if hasattr(ctx, "Stream"):
        return ctx, ctx.Stream(), (lambda: None)
    ctx.set_context()                   # older API: the context current, its streams on it
    return ctx, torch.cuda.Stream(), ctx.pop_context


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--sms", type=int, nargs="+", default=[8, 16, 40, 72, 104])
    args = ap.parse_args(argv)
    assert torch.cuda.is_available(), "program_start_sms.py needs a GPU"
    x = torch.empty(1, device="cuda")
    total = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []

    def add(asked, sms_used, small, large, ns):
        rows.append(dict(sms_asked=asked, sms_used=sms_used, us_small=round(small * 1e3, 2),
                         us_large=round(large * 1e3, 2), ns_per_program=round(ns, 4),
                         ns_per_program_per_sm=round(ns * sms_used, 2)))
        print(f"  SMs asked {asked:>4}, used {sms_used:>4}: {SMALL} programs {small * 1e3:8.1f} us,"
              f" {LARGE} {large * 1e3:8.1f} us; {ns:.3f} ns a program, "
              f"{ns * sms_used:.1f} ns a program on each SM", flush=True)

    add("all", *measure(torch.cuda.current_stream(), x))
    for n in args.sms:
        if n >= total:
            continue
        try:
            ctx, stream, undo = green_stream(n)
        except Exception as e:          # (green contexts need CUDA 12.4+ and torch's support)
            print(f"  SMs asked {n}: no green context ({type(e).__name__}: {e})")
            break
        try:
            add(n, *measure(stream, x))
        finally:
            undo()
            stream.synchronize()
            del stream, ctx             # the stream first, then its context
    meta = compare.environment_meta()
    meta["what"] = (f"empty one-warp programs confined to fewer SMs by green contexts; SMs used "
                    f"counted by %smid over {SMID_PROGRAMS} programs; ns_per_program = slope of "
                    f"the median time between {SMALL} and {LARGE} programs; "
                    "ns_per_program_per_sm = ns_per_program x sms_used")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    path = os.path.join(args.out, f"program_start_sms-{compare.gpu_slug()}-{stamp}.csv")
    compare.write_csv(rows, path, meta, fields=["sms_asked", "sms_used", "us_small", "us_large",
                                                "ns_per_program", "ns_per_program_per_sm"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
