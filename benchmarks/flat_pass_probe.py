"""What the flat pass (kernels/flat.py) does differently from the kernel torch.compile makes of
Hugging Face's formula, on large bf16 tensors, one GPU, one run:

* the compiled kernel timed with the cos/sin table in the input's dtype (what users write) and
  in fp32 (what ropelib reads, to keep TE's bits): does the table's width explain the gap?
* the flat pass at other tiles (elements per program, warps) and with and without evict_last
  on the table (KEEP_TABLE);
* Inductor's generated source (its tile, warps, eviction hints) saved for reading;
* host time per eager forward+backward, finished kernel against the two-pass route, at a size
  where the GPU is idle most of the time (what the route adds on the host), with the Python
  functions that take it (cProfile).

    python benchmarks/flat_pass_probe.py --out DIR    # (a GPU; ~2 min)

Writes flat_pass_probe-<gpu>.csv, inductor-<case>.txt and host-profile-two-pass-<gpu>.txt to
DIR.
"""
import argparse
import cProfile
import io
import os
import pstats
import re
import time

import torch
import triton

import ropelib
from ropelib.bench import compare, routes
from ropelib.kernels import launch
from ropelib.kernels.planning import cdiv

CASES = [  # name, dtype, layout, S, B, H, D
    ("bf16 sbhd 1 GiB s16k b8", torch.bfloat16, "sbhd", 16384, 8, 32, 128),
    ("bf16 bshd 256 MiB s4k b8", torch.bfloat16, "bshd", 4096, 8, 32, 128),
    ("fp32 sbhd 2 GiB s16k b8", torch.float32, "sbhd", 16384, 8, 32, 128),
]


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def flat_variants(x, y, cos, sin, layout):
    """(label, ms) of the flat pass reading the caller's fp32 cos/sin, at other tiles."""
    x4, y4 = ropelib.ops.view4(x, layout), ropelib.ops.view4(y, layout)
    route, ptrs = launch.plan_two_pass(launch.View.of(x4), launch.View.of(y4),
                                       launch.Table(cos, sin), launch.Positions(), R=cos.shape[-1],
                                       interleaved=False, backward=False, layout=layout)
    rows = route.rotate_pass
    kernel = rows.launcher.kernel
    named = dict(zip(rows.launcher.pointer_names, ptrs[:6] + (None, None)))
    n = x.numel()
    out = []
    for xblock in (1024, 2048, 4096):
        for warps in (4, 8):
            for keep in (True, False):
                args = dict(rows.args, XBLOCK=xblock, KEEP_TABLE=keep)
                grid = (cdiv(n, xblock),)
                run = lambda: kernel[grid](**named, **args, num_warps=warps)  # noqa: E731
                run()
                if xblock == 1024 and warps == 4 and keep == rows.args["KEEP_TABLE"]:
                    ref = y.clone()
                out.append((f"flat x{xblock} w{warps} keep={int(keep)}", ms(run)))
    assert torch.equal(y, ref)
    return out


SEEN = set()


def inductor_sources(tag, outdir):
    """Save the Triton source Inductor generated for the last compile; return its tiles."""
    from torch._inductor.codecache import PyCodeCache
    found = []
    mods = getattr(PyCodeCache, "modules", None) or list(getattr(PyCodeCache, "cache", {}).values())
    for mod in list(mods):
        if id(mod) in SEEN:
            continue
        SEEN.add(id(mod))
        path = getattr(mod, "__file__", None)
        if not path:
            continue
        src = open(path).read()
        if "@triton.jit" not in src:
            continue
        dst = os.path.join(outdir, f"inductor-{tag}-{len(found)}.txt")
        open(dst, "w").write(src)
        hints = sorted(set(re.findall(r"eviction_policy='(\w+)'", src)))
        warps = sorted(set(re.findall(r"num_warps['\"]?\s*[:=]\s*(\d+)", src)))
        xblock = sorted(set(re.findall(r"XBLOCK\s*[:=]\s*(?:tl\.constexpr\s*=\s*)?(\d+)", src)))
        found.append(f"{os.path.basename(dst)}: XBLOCK {xblock} warps {warps} eviction {hints}")
    return found


def host_profile(outdir, gpu):
    """Host µs per eager forward+backward at a decode size, finished kernel vs two-pass."""
    x = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    freqs = ropelib.rope_freqs(4096, 128, device="cuda")
    dy = torch.randn_like(x)
    lines = []
    for label in ("finished", "two-pass"):
        with routes.forced(label):   # every call in this round plans `label`

            def step():
                torch.autograd.grad(ropelib.apply_rope(x, freqs=freqs, layout="sbhd"), x, dy)
            for _ in range(50):
                step()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(200):
                    step()
                best = min(best, (time.perf_counter() - t0) / 200 * 1e6)
                torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                step()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
            lines.append(f"== {label}: {best:.1f} us per forward+backward (host, best of 5 x 200)\n"
                         + s.getvalue())
            print(f"host forward+backward {label}: {best:.1f} us", flush=True)
    open(os.path.join(outdir, f"host-profile-two-pass-{gpu}.txt"), "w").write("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpu = compare.gpu_slug()
    rows = []
    for name, dt, layout, S, B, H, D in CASES:
        shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
        tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
        x = torch.randn(shape, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        cos, sin = ropelib.rope_cos_sin(S, D, device="cuda")
        copy = ms(lambda: y.copy_(x))
        res = [("copy", copy)]
        res.append(("ropelib.apply_rope cos/sin", ms(lambda: ropelib.apply_rope(
            x, cos=cos, sin=sin, layout=layout))))
        res += flat_variants(x, y, cos, sin, layout)
        for tdt in sorted({dt, torch.float32}, key=str):
            c, s = cos.to(tdt).view(tshape), sin.to(tdt).view(tshape)
            torch._dynamo.reset()
            comp = torch.compile(lambda t: compare.hf_rotate(t, c, s, False).to(dt))
            comp(x)
            res.append((f"torch.compile, {str(tdt)[6:]} table", ms(lambda: comp(x))))
            for line in inductor_sources(f"{name.split()[0]}-{layout}-{str(tdt)[6:]}", args.out):
                print("  ", line, flush=True)
        for prov, t in res:
            rows.append(dict(case=name, provider=prov, ms=f"{t:.5f}",
                             ratio_to_copy=f"{copy / t:.4f}"))
            print(f"{name:28s} {prov:32s} {t:8.4f} ms {copy / t:6.3f}", flush=True)
        x = y = None
        torch.cuda.empty_cache()
    path = compare.write_csv(rows, os.path.join(args.out, f"flat_pass_probe-{gpu}.csv"),
                             meta=compare.environment_meta(),
                             fields=["case", "provider", "ms", "ratio_to_copy"])
    host_profile(args.out, gpu)
    print("wrote", path)


if __name__ == "__main__":
    main()
