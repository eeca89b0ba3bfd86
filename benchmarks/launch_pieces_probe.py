"""Where one eager launch's host time goes (GPU), and whether a launch through the CUDA driver
itself, from Python, would cost less than Triton's C launcher.

A ctypes start (built here, not in ropelib) fills a kernel's argument block once and writes
only the pointers and the stream per call, then calls `cuLaunchKernelEx` (or `cuLaunchKernel`)
with the GIL held (ctypes.PyDLL) or released (ctypes.CDLL). The block is checked against the
driver's `cuFuncGetParamInfo` first. Timed beside it: ropelib's finished kernel as its eager
launch starts it (Triton's C launcher), kernels of 1 and 30 parameters, `kernel[grid]`, the
pieces around a start, and one ATen op for scale. Host µs per call, 5000 calls back to back,
best and median of 7 rounds.

    python3 benchmarks/launch_pieces_probe.py > launch_pieces.log
"""
import ctypes
import gc
import statistics as st
import time

import torch
import triton

import ropelib
from ropelib import eager
from ropelib.kernels import direct

_TYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "fp32": ctypes.c_float}


class _Attribute(ctypes.Structure):        # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _Config(ctypes.Structure):           # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


def driver_start(compiled, values: dict, pointer_names: tuple, hold_gil=True, ex=True):
    """start(stream, *pointer addresses) of `compiled` on a 1-program grid through the driver."""
    lib = (ctypes.PyDLL if hold_gil else ctypes.CDLL)("libcuda.so.1")
    params = [(k, t) for k, t in compiled.src.signature.items() if t != "constexpr"]
    slots, pointer_slots = [], {}
    for name, ty in params:
        slot = ctypes.c_uint64(0) if ty.startswith("*") else _TYPES[ty](values[name])
        if ty.startswith("*"):
            pointer_slots[name] = slot
        slots.append(slot)
    info = lib.cuFuncGetParamInfo
    info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    off, size, sizes = ctypes.c_size_t(), ctypes.c_size_t(), []
    while info(compiled.function, len(sizes), ctypes.byref(off), ctypes.byref(size)) == 0:
        sizes.append(size.value)
    assert sizes[:len(slots)] == [ctypes.sizeof(s) for s in slots], (sizes, params)
    slots += [ctypes.c_uint64(0) for _ in sizes[len(slots):]]      # Triton's scratch pointers
    block = (ctypes.c_void_p * len(slots))(*(ctypes.addressof(s) for s in slots))
    order = [pointer_slots.get(n) for n in pointer_names]
    warps, shared, function = compiled.metadata.num_warps, compiled.metadata.shared, \
        compiled.function
    if ex:
        fn = lib.cuLaunchKernelEx
        fn.argtypes = [ctypes.c_void_p] * 4
        config = _Config((1, 1, 1), (32 * warps, 1, 1), shared, None, None, 0)
        at_config, at_block = ctypes.addressof(config), ctypes.addressof(block)

        def start(stream, *addresses):
            config.stream = stream
            for slot, a in zip(order, addresses):
                if slot is not None:
                    slot.value = a
            return fn(at_config, function, at_block, None)
    else:
        fn = lib.cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

        def start(stream, *addresses):
            for slot, a in zip(order, addresses):
                if slot is not None:
                    slot.value = a
            return fn(function, 1, 1, 1, 32 * warps, 1, 1, shared, stream, block, None)
    start.keep = (slots, block)
    return start


@triton.jit
def one(p):
    pass


@triton.jit
def thirty(p, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18,
           a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29):
    pass


def per_call(fn, n=5000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def main():
    x = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
    f = ropelib.rope_freqs(4096, 128, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            ropelib.apply_rope(x, f)
    el = next(o for o in gc.get_objects() if isinstance(o, eager.EagerLaunch) and o._starts)
    (start, tail), = el._starts.values()
    names = el.direct.pointer_names
    pointers = [x] * len(names)
    y = torch.empty(16, device="cuda")
    c1 = one[(1,)](y)
    values = {f"a{i}": 1000 + i for i in range(1, 30)}
    c30 = thirty[(1,)](y, *values.values())
    stream, addr = direct.current_stream(0), y.data_ptr()
    addresses, _ = direct.addresses_and_alignment(pointers)
    c_start = direct._c_launcher(c1, (1,))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; the decode forward's kernel: {el.direct.kernel.__name__}, "
          f"{len(el.direct.kernel.arg_names)} arguments")
    tests = {
        "finished kernel, Triton's C launcher": lambda: start(stream, *addresses, *tail),
        "finished kernel, EagerLaunch": lambda: el(pointers),
        "1-parameter kernel, Triton's C launcher": lambda: c_start(stream, addr),
        "1-parameter kernel, kernel[grid]": lambda: one[(1,)](y),
        "current_stream": lambda: direct.current_stream(0),
        "addresses_and_alignment": lambda: direct.addresses_and_alignment(pointers),
        "hooks_installed": direct.hooks_installed,
        "torch.neg (one ATen op)": lambda: torch.neg(y),
        "torch.empty_like": lambda: torch.empty_like(x),
    }
    for hold in (True, False):
        for ex in (True, False):
            how = f"{'cuLaunchKernelEx' if ex else 'cuLaunchKernel'}, GIL " \
                  f"{'held' if hold else 'released'}"
            s1 = driver_start(c1, {}, ("p",), hold, ex)
            s30 = driver_start(c30, values, ("p",), hold, ex)
            tests[f"1-parameter kernel, {how}"] = lambda s=s1: s(stream, addr)
            tests[f"30-parameter kernel, {how}"] = lambda s=s30: s(stream, addr)
    got = {k: [] for k in tests}
    for _ in range(7):
        for k, fn in tests.items():
            got[k].append(per_call(fn))
    print(f"{'host us per call':52s} {'best':>6s} {'median':>7s}")
    for k, v in got.items():
        print(f"{k:52s} {min(v):6.2f} {st.median(v):7.2f}")


if __name__ == "__main__":
    main()
