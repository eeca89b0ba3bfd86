"""Can a kernel that loads and stores through TMA descriptors ride ropelib's launch path?

The QKV projection's fused forward is fastest on a persistent TMA mainloop
(benchmarks/qkv_mainloop_probe.py, benchmarks/NOTES.md), and every ropelib kernel starts through
one path (kernels/planning.start): eagerly through the direct launcher (kernels/direct.py,
pointers passed as int addresses), while torch.compile traces through
torch.library.wrap_triton, and under CUDA graphs as either. A TMA descriptor can come from the
host (triton.tools.tensor_descriptor.TensorDescriptor, built from a tensor: it reads the
tensor's address, so not from a fake tensor while torch.compile traces) or be made in the
kernel from a pointer, its shape and strides (tl.make_tensor_descriptor: the kernel then needs
a global scratch buffer, which Triton's launcher asks of the allocator set with
triton.set_allocator). This probe takes a small kernel each way (y = 2 x through [64, 64] TMA
blocks, a ragged last block included) through every route and says which work, with the host
time of one eager launch:

    route                           device-side descriptors     host descriptors
    Triton's launcher               yes / no                    yes / no
    ropelib's direct launcher       yes / no                    (takes addresses: not tried)
    torch.compile (Inductor)        yes / no, graph breaks      yes / no
    CUDA graph replay               yes / no                    yes / no

    python benchmarks/tma_launch_probe.py [--out LOG]      # a GPU with TMA (sm_90 or newer)
    TRITON_INTERPRET=1 python benchmarks/tma_launch_probe.py   # the interpreter: each dtype
"""
import argparse
import itertools
import os
import sys
import time

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from ropelib.kernels.direct import DirectLauncher  # noqa: E402
from ropelib.kernels.planning import Launch, pointer_dtypes  # noqa: E402

BLOCK = 64


@triton.jit
def _double_device(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # y [M, N] = 2 x, contiguous; a program per [BLOCK_M, BLOCK_N] block, descriptors made here
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    m0 = tl.program_id(0) * BLOCK_M
    n0 = tl.program_id(1) * BLOCK_N
    # (the doubling in fp32: the interpreter's bf16 arithmetic is not the GPU's)
    y_desc.store([m0, n0], (x_desc.load([m0, n0]).to(tl.float32) * 2).to(y_ptr.dtype.element_ty))


@triton.jit
def _double_host(x_desc, y_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # the same with descriptors made on the host
    m0 = tl.program_id(0) * BLOCK_M
    n0 = tl.program_id(1) * BLOCK_N
    y_desc.store([m0, n0], (x_desc.load([m0, n0]).to(tl.float32) * 2).to(y_desc.dtype))


def _grid(x):
    return (triton.cdiv(x.shape[0], BLOCK), triton.cdiv(x.shape[1], BLOCK))


def triton_device(x):
    y = torch.empty_like(x)
    _double_device[_grid(x)](x, y, x.shape[0], x.shape[1], BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return y


def triton_host(x):
    from triton.tools.tensor_descriptor import TensorDescriptor
    y = torch.empty_like(x)
    _double_host[_grid(x)](TensorDescriptor.from_tensor(x, [BLOCK, BLOCK]),
                           TensorDescriptor.from_tensor(y, [BLOCK, BLOCK]),
                           BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return y


DIRECT = DirectLauncher(_double_device, ("x_ptr", "y_ptr"))


def direct_device(x):
    y = torch.empty_like(x)
    launch = Launch(_grid(x), 4, {"M": x.shape[0], "N": x.shape[1], "BLOCK_M": BLOCK,
                                  "BLOCK_N": BLOCK}, pointer_dtypes((x, y)), x.device, DIRECT)
    DIRECT(launch, (x, y))
    return y


@torch.library.triton_op("ropelib_probe::double_device", mutates_args=())
def op_device(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    torch.library.wrap_triton(_double_device)[_grid(x)](x, y, x.shape[0], x.shape[1],
                                                        BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return y


@torch.library.triton_op("ropelib_probe::double_host", mutates_args=())
def op_host(x: torch.Tensor) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor
    y = torch.empty_like(x)
    torch.library.wrap_triton(_double_host)[_grid(x)](
        TensorDescriptor.from_tensor(x, [BLOCK, BLOCK]),
        TensorDescriptor.from_tensor(y, [BLOCK, BLOCK]), BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return y


def host_us(fn, x, n=2000) -> float:
    """Median host µs of one eager call (5 batches of n/5 calls, synchronised around each)."""
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n // 5):
            fn(x)
        batches.append((time.perf_counter() - t0) / (n // 5) * 1e6)
        torch.cuda.synchronize()
    return sorted(batches)[2]


def compiled_ok(op, x):
    """(works, graph breaks, message) for torch.compile(fullgraph=True) of op(x) + 1."""
    torch._dynamo.reset()
    try:
        from torch._dynamo.utils import counters
        counters.clear()
        f = torch.compile(lambda t: op(t) + 1, fullgraph=True)
        ok = torch.equal(f(x), x * 2 + 1)
        breaks = sum(counters["graph_break"].values())
        return ok, breaks, ""
    except Exception as e:  # noqa: BLE001 -- the answer is that it does not work
        return False, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def graph_ok(fn, x):
    """(works, message) for fn(x) captured in a CUDA graph and replayed on new x values."""
    try:
        y = fn(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = fn(x)
        x.mul_(3)
        g.replay()
        torch.cuda.synchronize()
        return torch.equal(y, x * 2), ""
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def interpreter_check() -> list:
    """In Triton's interpreter (CPU tensors): does a device-side descriptor's round trip give
    2 x, per dtype? Lines of the report."""
    lines = [f"# Triton's interpreter, triton {triton.__version__}"]
    for (name, fn), dtype in itertools.product((("device-side", triton_device),
                                                ("host", triton_host)),
                                               (torch.float32, torch.float16, torch.bfloat16)):
        x = torch.randn(200, 136).to(dtype)
        y = fn(x)
        ok = torch.equal(y, x * 2)
        lines.append(f"{name} descriptors, {str(dtype).split('.')[1]}: "
                     + ("equal" if ok else f"WRONG ({int((y != x * 2).sum())} of {x.numel()} "
                                           "elements differ)"))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        lines = interpreter_check()
        print("\n".join(lines))
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("needs a GPU with TMA (compute capability 9 or newer)")
        return 2
    lines = [f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"triton {triton.__version__}"]

    def say(s):
        print(s, flush=True)
        lines.append(s)

    # ragged in both dimensions against the 64 x 64 blocks; rows of 136 fp32 (544 bytes): TMA
    # takes strides that are multiples of 16 bytes only
    x0 = torch.randn(200, 136, device="cuda")
    want = x0 * 2
    # device-side descriptors before any allocator is set: what a user's process sees
    try:
        triton_device(x0)
        say("device-side descriptors, no allocator set: ran")
    except Exception as e:  # noqa: BLE001
        say(f"device-side descriptors, no allocator set: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:160]}")
    triton.set_allocator(lambda size, align, stream:
                         torch.empty(size, dtype=torch.int8, device="cuda"))
    for name, fn in (("Triton's launcher, device-side", triton_device),
                     ("Triton's launcher, host", triton_host),
                     ("ropelib's direct launcher, device-side", direct_device),
                     ("operator (eager), device-side", op_device),
                     ("operator (eager), host", op_host)):
        try:
            ok = torch.equal(fn(x0.clone()), want)
            say(f"{name}: {'equal' if ok else 'WRONG'}, {host_us(fn, x0):.1f} us a call")
        except Exception as e:  # noqa: BLE001
            say(f"{name}: fails, {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    # a row stride that is not a multiple of 16 bytes (130 fp32: 520 bytes)
    x1 = torch.randn(200, 130, device="cuda")
    for name, fn in (("device-side", triton_device), ("host", triton_host)):
        try:
            ok = torch.equal(fn(x1), x1 * 2)
            say(f"row stride of 520 bytes, {name}: {'equal' if ok else 'WRONG (no error)'}")
        except Exception as e:  # noqa: BLE001
            say(f"row stride of 520 bytes, {name}: refused, {type(e).__name__}: "
                f"{str(e).splitlines()[0][:120]}")
    for name, op in (("device-side", op_device), ("host", op_host)):
        ok, breaks, why = compiled_ok(op, x0.clone())
        say(f"torch.compile (Inductor, fullgraph), {name}: "
            f"{'equal' if ok else 'fails'}, graph breaks {breaks} {why}")
    for name, fn in (("direct launcher, device-side", direct_device),
                     ("Triton's launcher, host", triton_host),
                     ("operator, device-side", op_device)):
        ok, why = graph_ok(fn, x0.clone())
        say(f"CUDA graph replay, {name}: {'equal' if ok else 'fails'} {why}")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
