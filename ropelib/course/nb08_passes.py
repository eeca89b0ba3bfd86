"""Notebook 08, section 4b step e: which LLVM pass sets the operand order of the reproduction
kernel's sum `y2 = x2 * c + x1 * s`, and whether the source's order decides it.

`repro_trace(swap_y2)` compiles the reproduction kernel (debug.FIXED's switches, the line as
written) for sm_90 on this machine, as `nb08_llir.kernel_llir("repro")` does, from its source
with y2's two products written in either order, and with LLVM's print-after-all on
(``LLVM_IR_ENABLE_DUMP=1``). It returns the order of each sum's operands in the final LLVM IR
(`nb08_llir.sum_operands`), the product the PTX fuses (`debug.ptx_products`), and, pass by pass,
every pass after which the order of the operands of y2's ``fadd`` changed (`pass_trace`).
No GPU is needed: Triton, LLVM and ptxas run on the CPU, in a second Python.
"""
import re

from .offline_compile import in_compiling_python

__all__ = ["pass_trace", "repro_trace"]

_AS_WRITTEN = "        y2 = x2 * c + x1 * s\n"
_SWAPPED = "        y2 = x1 * s + x2 * c\n"

_CHILD = """
import importlib.util, json, os, sys
from pathlib import Path
from ropelib.course import debug, nb08_llir, nb08_passes
from ropelib.course.offline_compile import compile_for_cuda
swap, tmp = sys.argv[1] == "1", sys.argv[2]
os.environ["LLVM_IR_ENABLE_DUMP"] = "1"   # print-after-all, read when Triton runs LLVM
os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # compile, not a cached kernel: the dump needs LLVM
source = Path(debug.__file__).read_text()
start = source.index("@triton.jit\\ndef _rope_unsloth_repro_kernel(")
end = source.index("\\n\\n\\n", start)
kernel = source[start:end] + "\\n"
assert kernel.count(nb08_passes._AS_WRITTEN) == 1
if swap:
    kernel = kernel.replace(nb08_passes._AS_WRITTEN, nb08_passes._SWAPPED)
text = ("import triton\\nimport triton.language as tl\\n"
        "from ropelib.kernels.common import round_to\\n\\n\\n" + kernel)
path = Path(tmp) / ("repro_swapped.py" if swap else "repro_as_written.py")
path.write_text(text)
spec = importlib.util.spec_from_file_location(path.stem, path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
args = nb08_llir.repro_args()
dump = Path(tmp) / "passes.txt"
sys.stderr.flush()
saved = os.dup(2)
with open(dump, "w") as f:             # LLVM prints each pass's IR to the process's stderr
    os.dup2(f.fileno(), 2)
    try:
        compiled = compile_for_cuda(module._rope_unsloth_repro_kernel, args, num_warps=4,
                                    arch=90, enable_fp_fusion=True)
    finally:
        os.dup2(saved, 2)
sums = nb08_llir.sum_operands(compiled.asm["llir"], text)
ptx = debug.ptx_products(compiled.asm["ptx"], text, str(path))
print(json.dumps({
    "sums": {y: {"first": r["first"], "second": r["second"]} for y, r in sums.items()},
    "fused": {y: r["fused"] for y, r in ptx.items()},
    "passes": nb08_passes.pass_trace(dump.read_text())}))
"""

_SECTION = re.compile(r"^; \*\*\* IR Dump After (.*?) \*\*\*$", re.M)
_KERNEL = re.compile(r"^define [^\n]*@_rope_unsloth_repro_kernel\(.*?^}", re.M | re.S)
_ARITH = re.compile(r"^\s*(%[\w.]+) = (fmul|fadd|fsub)\b[^%]*(%[\w.]+), (%[\w.]+)")
_FPEXT = re.compile(r"^\s*(%[\w.]+) = fpext ")


def _y2_order(kernel_ir: str):
    """The order of the operands of y2's fadd in one dump of the kernel, as "x2 * c + x1 * s"
    or "x1 * s + x2 * c"; None where the dump holds no single such line. The names come from
    y1 = x1 * c - x2 * s (the one fsub of two fmuls): in each of its products, the factor an
    fpext defines is the loaded x (x1 in the first, x2 in the second), the other is c or s."""
    lines = kernel_ir.splitlines()
    arith = {m[1]: (m[2], m[3], m[4]) for m in map(_ARITH.match, lines) if m}
    loaded = {m[1] for m in map(_FPEXT.match, lines) if m}
    sums = [(op, arith[a][1:], arith[b][1:]) for op, a, b in arith.values()
            if op in ("fadd", "fsub") and a in arith and b in arith
            and arith[a][0] == arith[b][0] == "fmul"]
    y1 = [t for t in sums if t[0] == "fsub"]
    y2 = [t for t in sums if t[0] == "fadd"]
    if len(y1) != 1 or len(y2) != 1:
        return None
    name = {}
    for factors, (x, other) in zip(y1[0][1:], (("x1", "c"), ("x2", "s"))):
        xs = [v for v in factors if v in loaded]
        if len(xs) != 1:
            return None
        name.update({xs[0]: x, next(v for v in factors if v != xs[0]): other})
    products = []
    for factors in y2[0][1:]:
        named = [name.get(v) for v in factors]
        if None in named:
            return None
        products.append(" * ".join(sorted(named, key=lambda n: n[0] != "x")))
    return " + ".join(products)


def pass_trace(dump: str) -> list:
    """[(pass, y2's operand order after it)] from LLVM's print-after-all output `dump`: the
    first dump of the reproduction kernel, then every pass after which the order changed."""
    parts = _SECTION.split(dump)
    trace = []
    for title, body in zip(parts[1::2], parts[2::2]):
        kernel = _KERNEL.search(body)
        order = _y2_order(kernel.group(0)) if kernel else None
        if order is not None and (not trace or trace[-1][1] != order):
            trace.append((title, order))
    return trace


def repro_trace(swap_y2: bool = False) -> dict:
    """The reproduction kernel compiled for sm_90 with y2 written `x2 * c + x1 * s` (as in
    ropelib.course.debug) or, with swap_y2, `x1 * s + x2 * c`: {"sums": {y: {"first",
    "second"}} in the final LLVM IR, "fused": {y: the products the PTX fuses}, "passes":
    pass_trace of the compile}."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = in_compiling_python(_CHILD, "1" if swap_y2 else "0", tmp,
                                  what="compiling the reproduction kernel with LLVM's dumps")
    out["passes"] = [tuple(p) for p in out["passes"]]
    return out
