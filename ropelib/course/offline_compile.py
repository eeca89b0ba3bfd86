"""Compile a Triton kernel for a CUDA GPU on a machine that has none, and read what its machine
code uses: Triton's front end, its optimiser and ptxas run on the CPU.

Notebook 05's layouts (ladder.compile_for_gpu), notebook 12's resource table
(counts.qkv_tile_resources) and the sm_90 compile check of the tests (tests/gpu_compile_check.py)
all compile through `compile_for_cuda` and read the cubin with `resource_usage`. Run without
TRITON_INTERPRET: under the interpreter @triton.jit gives interpreted functions, so a course
session under the interpreter compiles in a second Python (`in_compiling_python`).

`compiled_code(kernel, args, ...)` does either, whichever this Python can: it returns the
compiled kernel's text (TTGIR, PTX, SASS) and resources, for a kernel of ropelib's or one a
notebook defines (compiled from its source in the second Python). Notebooks 03, 08 and 10 read
their own kernels' code through it, and load_schedule (notebook 05) its loads.
"""
import atexit
import contextlib
import inspect
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..runtime import INTERPRET

__all__ = ["compile_for_cuda", "compiled_code", "cuobjdump", "in_compiling_python",
           "resource_usage", "triton_tool"]


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


def in_compiling_python(code: str, *argv: str, what: str, timeout: float = 300.0,
                        reuse: bool = False):
    """Run `code` in a second Python without TRITON_INTERPRET (under the interpreter @triton.jit
    gives interpreted functions, and a kernel object cannot be both interpreted and compiled),
    with ropelib importable, and return the JSON `code` printed as its last line. `argv`: the
    child's sys.argv[1:]. Raises RuntimeError saying `what` failed, with the child's stderr.

    reuse=True: run it in this process's long-lived compiling Python (`_CompilingPython`), for
    code that leaves that Python as it found it (no environment variables set, no file
    descriptors left moved): a new Python costs about 3 s to start and import torch, Triton
    and ropelib, the compilation itself a fraction of a second once Triton has cached it."""
    env = _compiling_env()
    if reuse and os.name == "posix":          # (waiting on a pipe with a timeout: selectors)
        return _CompilingPython.get(env).run(code, argv, what, timeout)
    done = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return _answer(done.returncode == 0, done.stdout, done.stderr, what)


def _answer(ok: bool, stdout: str, stderr: str, what: str):
    """The JSON a compiling Python printed as its last line; RuntimeError with its stderr where it
    failed."""
    if not ok:
        raise RuntimeError(f"{what} failed:\n{stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _compiling_env() -> dict:
    """The second Python's environment: this one's, without TRITON_INTERPRET, with ropelib's root
    first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton's default, without its warning
    return env


# The long-lived compiling Python: reads one request a line on stdin ({"code", "argv"}), runs the
# code as `python -c code argv...` would (a fresh __main__ namespace, sys.argv set, its prints
# captured), and answers one line on the descriptor that was its stdout ({"ok", "stdout",
# "stderr"}). Its own descriptor 1 is pointed at its stderr first, so that output written below
# Python (ptxas, LLVM) cannot break the answers.
_SERVER = r"""
import contextlib, io, json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
for line in sys.stdin:
    request = json.loads(line)
    out, err, ok = io.StringIO(), io.StringIO(), True
    sys.argv = ["-c", *request["argv"]]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
    except BaseException:
        ok = False
        err.write(traceback.format_exc())
    answers.write(json.dumps({"ok": ok, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    answers.flush()
"""


class _CompilingPython:
    """One second Python kept for this process (and started again where the environment it was
    started with has changed, after a timeout, or in a forked child)."""
    _current = None

    def __init__(self, env: dict):
        self.env, self.pid = env, os.getpid()
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, bufsize=1)

    @classmethod
    def get(cls, env: dict) -> "_CompilingPython":
        cur = cls._current
        if cur is None or cur.env != env or cur.pid != os.getpid() or cur.proc.poll() is not None:
            if cur is not None and cur.pid == os.getpid():
                cur.close()
            cls._current = cur = cls(env)
        return cur

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()

    def run(self, code: str, argv, what: str, timeout: float):
        try:
            self.proc.stdin.write(json.dumps({"code": code, "argv": list(argv)}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            type(self)._current = None
            raise RuntimeError(f"{what} failed: the compiling Python has exited") from None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout)
        if not ready:
            self.close()
            type(self)._current = None
            raise subprocess.TimeoutExpired([sys.executable, "-c", "<compiling Python>"], timeout)
        line = self.proc.stdout.readline()
        if not line:
            type(self)._current = None
            raise RuntimeError(f"{what} failed: the compiling Python exited (code "
                               f"{self.proc.wait()})")
        answer = json.loads(line)
        return _answer(answer["ok"], answer["stdout"], answer["stderr"], what)


@atexit.register
def _close_compiling_python():
    cur = _CompilingPython._current
    if cur is not None and cur.pid == os.getpid():
        cur.close()


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


# --- a kernel's compiled code, from whichever Python can compile it ---------------------------

def compiled_code(kernel, args: dict, *, num_warps: int, num_stages: Optional[int] = None,
                  arch: int = 90, enable_fp_fusion: Optional[bool] = None,
                  source: Optional[str] = None, imports: str = "",
                  timeout: float = 300.0) -> dict:
    """`kernel` (a @triton.jit function) compiled for sm_<arch> as `compile_for_cuda` would with
    `args`, read back as text: {"triton": the version, "ttgir", "ptx", "sass" (cuobjdump's; ""
    without one), "resources" (`resource_usage`), "shared" (bytes a program asks for)}.

    In this Python, unless it runs Triton's interpreter; there, in a second Python
    (`in_compiling_python`), where the kernel is imported from its module by name, or, for a
    kernel defined in a notebook (or a module the second Python cannot import), built from
    `source`: a module's text defining the kernel and every @triton.jit function it calls or
    is given (with its imports: it is written as it is); by default the kernel's own source,
    after `import triton`, `import triton.language as tl` and `imports` (the lines that bring in
    what else it calls, e.g. "from ropelib.kernels.common import round_to"). `args` pass as a launch passes them: pointers
    as tensors (what matters is their dtype and whether they are 16-byte aligned), the rest as
    ints, floats, bools, strings, None, Triton dtypes (tl.float32) or @triton.jit functions of
    the kernel's module (a constexpr such as COMBINE=as_written)."""
    encoded = _encode(args)                       # (the argument check, on every path)
    if not INTERPRET:
        return _compiled_here(kernel, args, num_warps, num_stages, arch, enable_fp_fusion)
    fn = getattr(kernel, "fn", kernel)
    module = fn.__module__ if fn.__module__ not in (None, "__main__") else ""
    if source is None:
        source = _IMPORTS + (imports + "\n\n\n" if imports else "") + textwrap.dedent(
            inspect.getsource(fn))
    request = dict(name=fn.__name__, module=module, args=encoded, num_warps=num_warps,
                   num_stages=num_stages, arch=arch, enable_fp_fusion=enable_fp_fusion)
    with tempfile.TemporaryDirectory() as tmp:
        # named after the kernel's module: the PTX's line info names this file
        path = Path(tmp) / f"{module.rsplit('.', 1)[-1] or 'notebook_kernels'}.py"
        path.write_text(source)
        return in_compiling_python(_CHILD, str(path), json.dumps(request),
                                   what=f"compiling {fn.__name__} for sm_{arch}",
                                   timeout=timeout, reuse=True)


_IMPORTS = "import triton\nimport triton.language as tl\n\n\n"


def _compiled_here(kernel, args, num_warps, num_stages, arch, enable_fp_fusion) -> dict:
    compiled = compile_for_cuda(kernel, args, num_warps=num_warps, num_stages=num_stages,
                                arch=arch, enable_fp_fusion=enable_fp_fusion)
    cubin = compiled.asm.get("cubin")
    return {"triton": triton.__version__, "ttgir": compiled.asm.get("ttgir", ""),
            "ptx": compiled.asm.get("ptx", ""), "sass": cuobjdump(cubin, "-sass") or "",
            "resources": resource_usage(cubin), "shared": compiled.metadata.shared}


_KERNEL_TYPES = (triton.runtime.JITFunction, InterpretedFunction)   # @triton.jit's, either way


def _encode(args: dict) -> dict:
    """`args` as JSON for the second Python (see `compiled_code`); TypeError names an argument
    it cannot pass."""
    out = {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            out[name] = {"tensor": str(value.dtype).replace("torch.", ""),
                         "aligned": value.data_ptr() % 16 == 0}
        elif isinstance(value, tl.dtype):
            out[name] = {"tl": value.name}
        elif isinstance(value, _KERNEL_TYPES):
            out[name] = {"jit": value.fn.__name__}
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            raise TypeError(f"argument {name!r}: a tensor, a Triton dtype, a @triton.jit "
                            f"function, None, bool, int, float or str, got "
                            f"{type(value).__name__}")
    return out


def _decode(args: dict, module) -> dict:
    """`_encode`'s JSON back to launch arguments; @triton.jit functions from `module`."""
    def value(v):
        if not isinstance(v, dict):
            return v
        if "tensor" in v:
            t = torch.empty(32, dtype=getattr(torch, v["tensor"]))
            return t if v["aligned"] else t[1:]
        if "tl" in v:
            return tl.dtype(v["tl"])
        return getattr(module, v["jit"])
    return {name: value(v) for name, v in args.items()}


_CHILD = """
import importlib, importlib.util, json, sys
from ropelib.course.offline_compile import _compiled_here, _decode
request = json.loads(sys.argv[2])
try:
    module = importlib.import_module(request["module"]) if request["module"] else None
except ImportError:
    module = None
if module is None or not hasattr(module, request["name"]):
    spec = importlib.util.spec_from_file_location(request["module"] or "notebook_kernels",
                                                  sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
print(json.dumps(_compiled_here(getattr(module, request["name"]),
                                _decode(request["args"], module), request["num_warps"],
                                request["num_stages"], request["arch"],
                                request["enable_fp_fusion"])))
"""
