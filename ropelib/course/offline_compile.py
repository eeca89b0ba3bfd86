"""Compile a Triton kernel for a CUDA GPU on a machine that has none, and read what its machine
code uses: Triton's front end, its optimiser and ptxas run on the CPU.

Notebook 05's layouts (ladder.compile_for_gpu), notebook 12's resource table
(counts.qkv_tile_resources) and the sm_90 compile check of the tests (tests/gpu_compile_check.py)
all compile through `compile_for_cuda` and read the cubin with `resource_usage`. Run without
TRITON_INTERPRET: under the interpreter @triton.jit gives interpreted functions, so a course
session under the interpreter compiles in a second Python (`in_compiling_python`).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import triton

__all__ = ["compile_for_cuda", "cuobjdump", "in_compiling_python", "resource_usage",
           "triton_tool"]


def compile_for_cuda(kernel, args: dict, *, num_warps: int, num_stages: Optional[int] = None,
                     arch: int = 90, enable_fp_fusion: Optional[bool] = None):
    """`kernel` (a @triton.jit function) compiled for sm_<arch> as a launch with `args` (every
    argument by name: pointers as tensors, the rest as values) would compile it: the JIT's own
    specialisation (ints equal to 1 become constants; pointers and ints divisible by 16 get a
    divisibility hint, what lets the compiler prove a contiguous run aligned and load it as one
    vector) and the launch's warps, pipeline stages and floating-point contraction
    (`enable_fp_fusion`), Triton's default where None. Returns Triton's compiled kernel:
    `.asm` holds its ttgir, ptx and cubin, `.metadata` its shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    options = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    if enable_fp_fusion is not None:
        options["enable_fp_fusion"] = enable_fp_fusion
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(**args, **options)
    options, signature, constexprs, attrs = kernel._pack_args(backend, options, bound, spec, opts)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def in_compiling_python(code: str, *argv: str, what: str, timeout: float = 300.0):
    """Run `code` in a second Python without TRITON_INTERPRET (under the interpreter @triton.jit
    gives interpreted functions, and a kernel object cannot be both interpreted and compiled),
    with ropelib importable, and return the JSON `code` printed as its last line. `argv`: the
    child's sys.argv[1:]. Raises RuntimeError saying `what` failed, with the child's stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton's default, without its warning
    done = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def triton_tool(name: str) -> Optional[str]:
    """The path of a CUDA tool Triton ships (cuobjdump, nvdisasm), else the one on PATH, else
    None."""
    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return bundled if os.path.exists(bundled) else shutil.which(name)


def cuobjdump(cubin: bytes, option: str, timeout: float = 60.0) -> Optional[str]:
    """What `cuobjdump <option>` prints for a cubin ("-res-usage", "-sass"); None where there
    is no cuobjdump or no cubin."""
    tool = triton_tool("cuobjdump")
    if not tool or not cubin:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, option, path], capture_output=True, text=True,
                              timeout=timeout).stdout


def resource_usage(cubin: bytes) -> dict:
    """{'registers': per thread, 'stack': bytes per thread (the spilled registers), 'shared':
    static bytes per program} of a cubin, as cuobjdump's resource usage prints them; a field it
    does not print is None; {} where there is no cuobjdump or no cubin."""
    text = cuobjdump(cubin, "-res-usage")
    if text is None:
        return {}
    found = {key: re.search(rf"{field}:(\d+)", text)
             for key, field in (("registers", "REG"), ("stack", "STACK"), ("shared", "SHARED"))}
    return {key: int(m[1]) if m else None for key, m in found.items()}
