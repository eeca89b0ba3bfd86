"""ropelib.course.offline_compile.compiled_code: a kernel's sm_90 code read back as text, from
whichever Python can compile it (under the interpreter, a second Python)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib.course.offline_compile import compiled_code  # noqa: E402
from loading import written_module  # noqa: E402

# a kernel as a notebook defines one: with a helper it calls and a combine function it is given
SOURCE = '''import triton
import triton.language as tl


@triton.jit
def twice(x):
    return x + x


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, COMBINE: tl.constexpr, DTYPE: tl.constexpr,
                 BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n).to(DTYPE)
    tl.store(y_ptr + i, COMBINE(x), mask=i < n)
'''


def _module(tmp_path):
    return written_module("scale_kernels", tmp_path / "scale_kernels.py", SOURCE)


def test_a_kernel_from_source_given_a_dtype_and_a_function(tmp_path):
    import triton.language as tl
    m = _module(tmp_path)
    x = torch.empty(64)
    code = compiled_code(m.scale_kernel, dict(x_ptr=x, y_ptr=x, n=4096, COMBINE=m.twice,
                                              DTYPE=tl.float32, BLOCK=512),
                         num_warps=4, source=SOURCE)
    assert set(code) == {"triton", "ttgir", "ptx", "sass", "resources", "shared"}
    assert ".target sm_90" in code["ptx"] and "add.f32" in code["ptx"]
    assert "ld.global.v4.b32" in code["ptx"]            # 16-byte aligned pointers: vector loads
    if code["sass"]:                                    # (cuobjdump ships with Triton)
        assert "LDG.E.128" in code["sass"] and code["resources"]["registers"] > 0


def test_a_pointer_off_16_bytes_loses_its_vector_loads(tmp_path):
    import triton.language as tl
    m = _module(tmp_path)
    x = torch.empty(64)
    code = compiled_code(m.scale_kernel, dict(x_ptr=x[1:], y_ptr=x, n=4096, COMBINE=m.twice,
                                              DTYPE=tl.float32, BLOCK=512),
                         num_warps=4, source=SOURCE)
    assert "ld.global.v4.b32" not in code["ptx"]


def test_an_argument_it_cannot_pass_is_named(tmp_path):
    m = _module(tmp_path)
    with pytest.raises(TypeError, match="argument 'n'"):
        compiled_code(m.scale_kernel, dict(x_ptr=torch.empty(4), y_ptr=torch.empty(4),
                                           n=object(), COMBINE=m.twice, DTYPE=None, BLOCK=8),
                      num_warps=4, source=SOURCE)


# a kernel that calls a helper of ropelib's, in a module the compiling Python cannot import
ROUNDING_SOURCE = '''import triton
import triton.language as tl
from ropelib.kernels.common import round_to


@triton.jit
def rounded_copy_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, round_to(tl.load(x_ptr + i), tl.bfloat16, False))
'''


def test_a_kernel_built_from_its_own_source_with_the_imports_it_needs(tmp_path):
    from ropelib.course import offline_compile
    m = written_module("rounding_kernels", tmp_path / "rounding_kernels.py", ROUNDING_SOURCE)
    x = torch.empty(64)
    args = dict(x_ptr=x, y_ptr=x, BLOCK=64)
    code = compiled_code(m.rounded_copy_kernel, args, num_warps=1,
                         imports="from ropelib.kernels.common import round_to")
    assert ".target sm_90" in code["ptx"]
    if offline_compile.INTERPRET:      # built from the kernel's text: without the import, no helper
        with pytest.raises(Exception, match="round_to"):
            compiled_code(m.rounded_copy_kernel, args, num_warps=1)


# --- the long-lived compiling Python (in_compiling_python(..., reuse=True)) ---------------------

def test_one_compiling_python_serves_every_request_with_reuse():
    from ropelib.course import offline_compile as oc
    code = "import os, sys, json; print('noise'); print(json.dumps([os.getpid(), sys.argv[1:]]))"
    pid_a, argv_a = oc.in_compiling_python(code, "x", "y", what="asking its pid", reuse=True)
    pid_b, argv_b = oc.in_compiling_python(code, what="asking its pid", reuse=True)
    assert pid_a == pid_b != os.getpid() and argv_a == ["x", "y"] and argv_b == []
    fresh, _ = oc.in_compiling_python(code, what="asking its pid")        # a new Python each time
    assert fresh != pid_a
    # the same environment as a fresh one: no TRITON_INTERPRET, ropelib importable
    env = oc.in_compiling_python("import os, json, ropelib; print(json.dumps("
                                 "'TRITON_INTERPRET' in os.environ))", what="env", reuse=True)
    assert env is False


def test_a_failing_request_raises_with_its_traceback_and_the_python_serves_on():
    from ropelib.course import offline_compile as oc
    code = "import os, json; print(json.dumps(os.getpid()))"
    before = oc.in_compiling_python(code, what="pid", reuse=True)
    with pytest.raises(RuntimeError, match=r"(?s)compiling nothing failed:.*ZeroDivisionError"):
        oc.in_compiling_python("print('partial'); 1 / 0", what="compiling nothing", reuse=True)
    assert oc.in_compiling_python(code, what="pid", reuse=True) == before


def test_a_changed_environment_or_a_timeout_starts_a_new_compiling_python(monkeypatch):
    import subprocess

    from ropelib.course import offline_compile as oc
    code = "import os, json; print(json.dumps([os.getpid(), os.environ.get('ROPELIB_PROBE')]))"
    pid_a, seen = oc.in_compiling_python(code, what="pid", reuse=True)
    monkeypatch.setenv("ROPELIB_PROBE", "1")
    pid_b, seen_b = oc.in_compiling_python(code, what="pid", reuse=True)
    assert pid_b != pid_a and (seen, seen_b) == (None, "1")
    with pytest.raises(subprocess.TimeoutExpired):
        oc.in_compiling_python("import time; time.sleep(30)", what="sleeping", timeout=1,
                               reuse=True)
    pid_c, _ = oc.in_compiling_python(code, what="pid", reuse=True)
    assert pid_c != pid_b                    # the one that timed out was stopped, a new one serves
