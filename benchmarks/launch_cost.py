"""What one Triton launch costs the host, by the number of kernel arguments (GPU).

A kernel that copies 128 elements takes 2 pointers, N int arguments (added to the copy so none is
dead) and one constexpr. For each N it times, back to back, host microseconds per call of:

    triton    kernel[grid](*args): Triton's own path (binds and specialises every argument,
              builds the cache key, then calls the C launcher)
    c         the compiled kernel's C launcher alone (what ropelib.kernels.direct calls)

and, for the finished RoPE kernel at decode size (s=1, b=64, h=32, d=128, bf16, q and k), the
same two paths. The slope of `triton` against N is what narrowing a kernel saves per call.

    python benchmarks/launch_cost.py [--out FILE.csv]
"""
import argparse
import csv
import importlib.util
import os
import sys
import tempfile

import torch

ARG_COUNTS = (0, 8, 16, 24, 32, 48, 64)


def _kernel_with(n_ints: int):
    names = [f"a{i}" for i in range(n_ints)]
    total = " + ".join(names) if names else "0"
    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def kernel(x_ptr, y_ptr, {''.join(n + ', ' for n in names)}BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n"
        f"    tl.store(y_ptr + i, tl.load(x_ptr + i) + ({total}))\n")
    path = os.path.join(tempfile.mkdtemp(), f"launch_cost_{n_ints}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"launch_cost_{n_ints}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.kernel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="CSV file")
    a = ap.parse_args()
    from ropelib.bench.suite import host_us
    from ropelib.kernels import direct, launch as L

    gpu = torch.cuda.get_device_name()
    x = torch.zeros(128, device="cuda", dtype=torch.int32)
    y = torch.empty_like(x)
    rows = []
    for n in ARG_COUNTS:
        kernel = _kernel_with(n)
        ints = list(range(3, 3 + n))     # not 1 (Triton would fold it into a constant)
        compiled = kernel[(1,)](x, y, *ints, BLOCK=128)
        torch.cuda.synchronize()
        assert int(y[0]) == sum(ints), "the kernel did not run"
        start = direct._c_launcher(compiled, (1,))
        stream = direct.current_stream(torch.cuda.current_device())
        addrs = (x.data_ptr(), y.data_ptr())
        rows.append(dict(kernel=f"copy + {n} ints", arguments=n + 3, path="triton",
                         host_us=host_us(lambda: kernel[(1,)](x, y, *ints, BLOCK=128),
                                         calls=2000)))
        rows.append(dict(kernel=f"copy + {n} ints", arguments=n + 3, path="c",
                         host_us=host_us(lambda: start(stream, *addrs, *ints, 128), calls=2000)))

    # the finished kernel at decode size, planned once
    s, b, hq, hk, d = 1, 64, 32, 8, 128
    q = torch.randn(s, b, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(s, b, hk, d, device="cuda", dtype=torch.bfloat16)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    import ropelib
    f = ropelib.rope_freqs(4096, d, device="cuda")[:, 0, 0]
    start_pos = torch.randint(0, 4000, (b,), device="cuda", dtype=torch.int32)
    planned, ptrs = L.plan(L.View.of(q), L.View.of(qo), L.Table(f, None),
                           L.Positions(start=start_pos), R=d, interleaved=False, backward=False,
                           layout="sbhd", k=L.View.of(k), k_out=L.View.of(ko))
    named = dict(zip(planned.launcher.pointer_names, ptrs))
    kernel = planned.launcher.kernel
    n_args = len(kernel.arg_names)
    compiled = kernel[planned.grid](**named, **planned.args, num_warps=planned.num_warps)
    rows.append(dict(kernel="finished RoPE, q+k decode", arguments=n_args, path="triton",
                     host_us=host_us(lambda: kernel[planned.grid](
                         **named, **planned.args, num_warps=planned.num_warps), calls=2000)))
    c_start = direct._c_launcher(compiled, planned.grid)
    stream = direct.current_stream(torch.cuda.current_device())
    addrs, _ = direct.addresses_and_alignment(ptrs)
    tail = tuple(planned.args[n] for n in kernel.arg_names[len(ptrs):])
    rows.append(dict(kernel="finished RoPE, q+k decode", arguments=n_args, path="c",
                     host_us=host_us(lambda: c_start(stream, *addrs, *tail), calls=2000)))
    rows.append(dict(kernel="finished RoPE, q+k decode", arguments=n_args, path="ropelib direct",
                     host_us=host_us(lambda: L.run(planned, ptrs), calls=2000)))
    torch.cuda.synchronize()

    for r in rows:
        r["gpu"] = gpu
    print(f"\n{gpu}\n| kernel | arguments | path | host us per call |\n|---|---:|---|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['arguments']} | {r['path']} | {r['host_us']:.1f} |")
    tri = [(r["arguments"], r["host_us"]) for r in rows if r["path"] == "triton"
           and r["kernel"].startswith("copy")]
    slope = (tri[-1][1] - tri[0][1]) / (tri[-1][0] - tri[0][0])
    print(f"\nTriton's own path: {slope:.2f} us per argument "
          f"({tri[0][1]:.1f} us at {tri[0][0]} arguments, {tri[-1][1]:.1f} at {tri[-1][0]})")
    if a.out:
        with open(a.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["gpu", "kernel", "arguments", "path", "host_us"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
