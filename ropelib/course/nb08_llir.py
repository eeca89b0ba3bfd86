"""Notebook 08, section 4b step e: the LLVM IR behind a compiled line `y = a * b +/- c * d`.

Triton lowers a kernel to LLVM IR (the compiled kernel's ``asm["llir"]``), and LLVM's NVPTX
back end turns it into PTX, contracting an ``fmul`` into the ``fadd``/``fsub`` that uses it
where contraction is on. `sum_operands(llir, source)` reads, for each such line of `source`, the
order of the sum's two operands in the IR: which product is its first operand and which its
second, each named by its text in the source through the IR's debug locations
(``!DILocation(line, column)``). `kernel_llir` compiles notebook 08's two kernels for sm_90 on
this machine (Triton's compiler runs on the CPU, in a second Python without TRITON_INTERPRET),
as `debug.combine_kernel_products` and `debug.repro_kernel_products` compile them for the PTX.
"""
import inspect
import re
from typing import Optional

from . import debug
from .offline_compile import in_compiling_python

__all__ = ["kernel_llir", "sum_operands", "repro_args"]


def repro_args() -> dict:
    """The reproduction kernel's arguments for an sm_90 compile: debug.FIXED's switches at
    notebook 08's GPU size (x [1024, 8, 128] bf16 in place, an fp32 angle table [512, 64])."""
    import torch
    x = torch.empty(1024, 8, 128, dtype=torch.bfloat16)
    table = torch.empty(512, 64)
    return dict(x_ptr=x, cos_ptr=table, sin_ptr=table, stride_xr=x.stride(0),
                stride_xh=x.stride(1), stride_t=table.stride(0), SEQ_LEN=512, HALF=64,
                BLOCK_HALF=64, FROM_ANGLES=True, COMPUTE_FP32=True, USE_FMA=False,
                BF16_RTNE=False)

_CHILD = """
import importlib.util, json, sys
import torch
from ropelib.course import debug, nb08_llir
from ropelib.course.offline_compile import compile_for_cuda
which, path = sys.argv[1], sys.argv[2]
if which == "repro":      # debug.FIXED's switches, the line as written, notebook 08's GPU size
    kernel = debug._rope_unsloth_repro_kernel
    args = nb08_llir.repro_args()
else:                     # the combine kernel with COMBINE=as_written, from the file at path
    spec = importlib.util.spec_from_file_location("combine_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    S, B, H, D = 512, 2, 8, 128
    x, y, a = (torch.empty(S, B, H, D, dtype=torch.bfloat16), torch.empty(S, B, H, D),
               torch.empty(S, D // 2))
    kernel = module._rope_combine_kernel
    args = dict(x_ptr=x, y_ptr=y, ang_ptr=a, cos_ptr=a, sin_ptr=a, n_rows=S * B * H,
                rows_per_pos=B * H, HALF=D // 2, BLOCK_ROWS=64, SINCOS="tl",
                COMBINE=module.as_written)
compiled = compile_for_cuda(kernel, args, num_warps=4, arch=90, enable_fp_fusion=True)
print(json.dumps({"llir": compiled.asm["llir"]}))
"""


def kernel_llir(which: str, combine_source: Optional[str] = None) -> tuple:
    """(LLVM IR, the source text its debug locations point into) of notebook 08's kernel
    `which`: "repro" (the reproduction kernel with debug.FIXED's switches) or "combine"
    (`_rope_combine_kernel` with COMBINE=`as_written`, both defined in `combine_source`),
    compiled for sm_90 with Triton's default contraction."""
    import tempfile
    from pathlib import Path
    if which == "repro":
        path = inspect.getsourcefile(debug._rope_unsloth_repro_kernel.fn)
        source = Path(path).read_text()
        out = in_compiling_python(_CHILD, "repro", path, what="compiling the reproduction kernel",
                                  reuse=True)
        return out["llir"], source
    if which != "combine" or combine_source is None:
        raise ValueError("which: 'repro', or 'combine' with combine_source")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "combine_kernels.py"
        path.write_text(combine_source)
        out = in_compiling_python(_CHILD, "combine", str(path),
                                  what="compiling the combine kernel", reuse=True)
    return out["llir"], combine_source


_DEF = re.compile(r"^\s*(%[\w.]+) = (fmul|fadd|fsub)\b[^%]*(%[\w.]+), (%[\w.]+).*!dbg !(\d+)")
_LOC = re.compile(r"^!(\d+) = !DILocation\(line: (\d+), column: (\d+)")


def sum_operands(llir: str, source: str) -> dict:
    """{y: {"op": "fadd" or "fsub", "first": the product that is the sum's first operand,
    "second": the other, "n": how many such sums (vector lanes count once)}} for each line
    `y = a * b +/- c * d` of `source` whose sum the IR computes from two fmuls."""
    locs = {m[1]: (int(m[2]), int(m[3])) for m in map(_LOC.match, llir.splitlines()) if m}
    defs = {m[1]: (m[2], m[3], m[4], m[5]) for m in map(_DEF.match, llir.splitlines()) if m}
    lines = source.splitlines()
    found = {}
    for op, a, b, dbg in defs.values():
        if op == "fmul" or a not in defs or b not in defs or dbg not in locs:
            continue
        if defs[a][0] != "fmul" or defs[b][0] != "fmul":
            continue
        line, _ = locs[dbg]
        parsed = debug._products(lines[line - 1]) if line <= len(lines) else None
        if parsed is None:
            continue
        y, products, total = parsed
        first, second = (debug._product_at(products, locs[defs[r][3]][1], total)
                         if defs[r][3] in locs else total for r in (a, b))
        rec = found.setdefault(y, {"op": op, "first": set(), "second": set(), "n": 0})
        rec["first"].add(first)
        rec["second"].add(second)
        rec["n"] += 1
    return {y: {**r, "first": sorted(r["first"]), "second": sorted(r["second"])}
            for y, r in found.items()}
