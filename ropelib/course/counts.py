"""Counts that notebooks 11 and 12 print: the kernels one step launches, and how many programs of
a compiled kernel one SM holds (notebook 02's profiler listing uses the same filters).

Kernels per step (notebook 11). `count_kernels(step)` runs `step()` once to warm it up (compile,
plan, caches) and once under `torch.profiler`:

- on a GPU, `cuda` lists the CUDA kernels the GPU ran, by name (Memcpy and Memset left out);
- on any machine, `aten` lists the top-level ATen operators the host dispatched that do work:
  views, allocations and conversions that copied nothing are left out (on a GPU each of these
  is one CUDA kernel or more);
- in Triton's interpreter, `triton` lists the Triton kernels launched, by name. (On a GPU they
  show up among the CUDA kernels; ropelib starts its kernels past Triton's Python launcher, so
  they are not counted on the host there.)

Programs per SM (notebook 12). `programs_per_sm(n_regs, num_warps, shared)` derives how many
programs (thread blocks) of a kernel fit on one SM at once from its registers per thread, its
warps and its shared memory, against the limits of an sm_90 SM (H100, H200): a derived figure,
the upper bound the resources allow, not the occupancy a profiler measures while it runs.
`qkv_tile_resources(tiles)` compiles the QKV projection's kernels (ropelib.kernels.qkv_gemm) for
sm_90 on this machine, no GPU needed; from a checkout, at the tiles of benchmarks/qkv_tiles.py's
sweep (`sweep_tiles`) and the tiles ropelib ships for that problem (`shipped_tiles`: qkv_gemm's
GPU_TILES, the dX kernel with QK-norm as "dx_norm"), each row marked `swept` and `shipped`:

    python -m ropelib.course.counts --out figures/12-qkv-tiles-sm90.csv   # from a checkout,
                                                                          # no TRITON_INTERPRET
"""
import contextlib
import dataclasses
import os
import re
import sys
import warnings
from typing import Callable, Dict, List, Optional

import torch

from .kernel_bandwidth import is_device_kernel
from .offline_compile import compile_for_cuda, resource_usage

__all__ = ["StepKernels", "count_kernels", "work_ops", "gpu_kernels", "interpreted_launches",
           "loop_fast_paths", "slow_path_branches",
           "quietly_running", "stderr_silenced",
           "SM", "SM90", "Occupancy", "programs_per_sm", "compile_for_sm90", "cubin_resources",
           "qkv_tile_resources", "sweep_tiles", "shipped_tiles", "tiles_to_compile"]

# --- kernels per step -----------------------------------------------------------------------

# operators that return a view of their input (no data moves, no kernel)
VIEW_OPS = frozenset({
    "aten::alias", "aten::as_strided", "aten::chunk", "aten::detach", "aten::expand",
    "aten::expand_as", "aten::narrow", "aten::permute", "aten::reshape", "aten::select",
    "aten::slice", "aten::split", "aten::squeeze", "aten::t", "aten::transpose",
    "aten::unbind", "aten::unflatten", "aten::unsqueeze", "aten::view", "aten::view_as",
    "aten::flatten", "aten::lift_fresh"})
# operators that only allocate (the caching allocator: no kernel)
ALLOCATION_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::set_"})
# conversions that return their input unchanged when it already is what was asked for: they do
# work only when an operator below them copies
CONVERSION_OPS = frozenset({"aten::to", "aten::contiguous", "aten::type_as"})
COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::clone"})


@dataclasses.dataclass
class StepKernels:
    """What one call of a step launched (see the module docstring)."""
    aten: List[str]                 # top-level ATen operators that do work, in order
    triton: List[str]               # Triton kernels launched in the interpreter, in order
    cuda: Optional[List[str]]       # CUDA kernels the GPU ran, in order (None: no GPU)

    @property
    def host_launches(self) -> int:
        """Operators and Triton launches the host issued: each one kernel or more on a GPU."""
        return len(self.aten) + len(self.triton)


def _copies(event) -> bool:
    """Did this event, or an operator below it, copy data?"""
    return event.name in COPY_OPS or any(_copies(c) for c in event.cpu_children)


def work_ops(events) -> List[str]:
    """Names of the top-level ATen operators among profiler events that do work: views and
    allocations left out, and conversions (`aten::to`, ...) that copied nothing."""
    found = []
    for e in events:
        if e.cpu_parent is not None or not e.name.startswith("aten::"):
            continue
        if e.name in VIEW_OPS or e.name in ALLOCATION_OPS:
            continue
        if e.name in CONVERSION_OPS and not _copies(e):
            continue
        found.append(e.name)
    return found


def gpu_kernels(events) -> List[str]:
    """Names of the CUDA kernels among profiler events (memory copies and sets left out)."""
    return [e.name for e in events if is_device_kernel(e)]


@contextlib.contextmanager
def interpreted_launches():
    """Record every launch Triton's interpreter runs in the block, by kernel name (the list
    yielded), each inside a profiler range `triton::<name>`: the ATen operators the interpreter
    itself runs to execute the kernel then sit below that range, not at the top level. Outside
    the interpreter (a GPU) nothing is recorded."""
    from triton.runtime.interpreter import InterpretedFunction

    launched: List[str] = []
    original = InterpretedFunction.run
    depth = [0]

    def run(self, *args, **kwargs):
        if kwargs.get("warmup", False) or depth[0]:
            return original(self, *args, **kwargs)
        name = getattr(self, "__name__", None) or getattr(self.fn, "__name__", "?")
        launched.append(name)
        depth[0] += 1
        try:
            with torch.profiler.record_function(f"triton::{name}"):
                return original(self, *args, **kwargs)
        finally:
            depth[0] -= 1
    InterpretedFunction.run = run
    try:
        yield launched
    finally:
        InterpretedFunction.run = original


@contextlib.contextmanager
def quietly_running(prof):
    """`prof` (a PyTorch profiler) running for the block, started and stopped with file
    descriptor 2 pointed at the null device: some CPU builds of PyTorch print a line from C++
    as the profiler starts and as it stops, which a notebook would show beside the cell's
    output. A profiler that the block stopped itself is not stopped again."""
    with stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        if torch._C._autograd._profiler_enabled():
            with stderr_silenced():
                prof.__exit__(None, None, None)


@contextlib.contextmanager
def stderr_silenced():
    """File descriptor 2 pointed at the null device for the block: for C++ log lines, such as
    the CPU allocator's warnings while a profiler runs, that Python cannot filter."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def count_kernels(step: Callable[[], object], *, warmup: int = 1) -> StepKernels:
    """Run `step()` `warmup` times, then once more, counted (see the module docstring). The
    step should run on the GPU when there is one: a CPU step on a GPU machine has no CUDA
    kernels to count."""
    for _ in range(warmup):
        step()
    gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Pp]rofiler.*")
        with interpreted_launches() as launched, \
                quietly_running(torch.profiler.profile(activities=activities)) as prof:
            step()
            if gpu:
                torch.cuda.synchronize()
        events = prof.events()
    return StepKernels(aten=work_ops(events), triton=list(launched),
                       cuda=gpu_kernels(events) if gpu else None)


# --- programs per SM ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SM:
    """The resources of one streaming multiprocessor that bound how many programs it holds."""
    registers: int          # 32-bit registers
    shared: int             # bytes of shared memory (the largest carveout)
    threads: int            # resident threads
    blocks: int             # resident programs (thread blocks)
    register_unit: int      # registers are given to each warp in multiples of this
    shared_unit: int        # shared memory is given to each program in multiples of this
    shared_reserved: int    # bytes the CUDA runtime reserves in each program's shared memory
    sub_partitions: int     # the register file is split evenly between them, a warp in one
    warp: int = 32


# sm_90 (H100, H200): CUDA C++ Programming Guide, "Compute capabilities" table, and the CUDA
# occupancy calculator's allocation units for compute capability 9.0
SM90 = SM(registers=65536, shared=228 * 1024, threads=2048, blocks=32, register_unit=256,
          shared_unit=128, shared_reserved=1024, sub_partitions=4)


@dataclasses.dataclass
class Occupancy:
    """Programs of one kernel that fit on one SM, by each resource and overall."""
    programs: int                   # the least of `limits`
    limits: Dict[str, int]          # resource -> programs it allows
    limited_by: List[str]           # the resources that allow no more than `programs`
    warps: int                      # resident warps: programs x warps per program
    warps_per_sm: int               # the SM's most (threads / 32)

    @property
    def fraction(self) -> float:
        """Resident warps over the most an SM holds (the profilers' 'theoretical occupancy')."""
        return self.warps / self.warps_per_sm


_INDUCTOR_KERNEL = re.compile(r"def (triton_\w+)\(")
_NUMEL = re.compile(r"\b([xyr])numel = (\d+)")
_SIN_COS = re.compile(r"\b(?:tl_math|libdevice|tl)\.(?:sin|cos)\(")


def inductor_sin_cos(code: str) -> List[tuple]:
    """(kernel name, elements it covers, sines and cosines in its body) for each Triton kernel
    in Inductor's generated code (`torch._inductor.utils.run_and_get_code`); the elements are
    the product of its literal x/y numels, so sin/cos evaluations a call = elements x calls."""
    out = []
    for part in code.split("@triton.jit")[1:]:
        name = _INDUCTOR_KERNEL.search(part)
        if name is None:
            continue
        body = part.split("''', device_str=")[0]
        elements = 1
        for n in dict(_NUMEL.findall(body)).values():     # one numel per axis
            elements *= int(n)
        out.append((name.group(1), elements, len(_SIN_COS.findall(body))))
    return out



_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
_SASS_BRA = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?BRA\s+(?:`?\()?0x([0-9a-f]+)")
_SASS_BSSY = re.compile(r"/\*([0-9a-f]{4,})\*/\s+BSSY\s+B\d+,\s*0x([0-9a-f]+)")


def slow_path_branches(sass: str) -> Dict[int, int]:
    """{address: target} of each BSSY...BSYNC region's first branch in a kernel's SASS
    (`cuobjdump -sass`): in sinf/cosf the branch a thread takes past the slow range reduction
    (Payne-Hanek, for |x| >= 105615 rad) to the region's BSYNC. A region without a branch
    has none."""
    lines = sass.splitlines()
    branches = [(int(m[1], 16), int(m[2], 16)) for m in map(_SASS_BRA.search, lines) if m]
    out = {}
    for m in map(_SASS_BSSY.search, lines):
        if m:
            start, end = int(m[1], 16), int(m[2], 16)
            first = next(((a, t) for a, t in branches if start < a < end), None)
            if first is not None:
                out[first[0]] = first[1]
    return out


def slow_path(sass: str) -> set:
    """The addresses of a kernel's SASS (`cuobjdump -sass`) that a thread skips when every angle
    takes libdevice's usual sin/cos path: in each BSSY...BSYNC region, the instructions between
    the region's first branch and its target (`slow_path_branches`; the BSYNC the branch lands
    on is run, so it is not skipped)."""
    addresses = [int(m[1], 16) for m in map(_SASS_LINE.search, sass.splitlines()) if m]
    return {a for b, t in slow_path_branches(sass).items() for a in addresses if b < a < t}


def loop_fast_paths(sass: str) -> List[Dict[str, int]]:
    """{opcode: how many} a thread issues in one iteration of each outermost loop of a kernel's
    SASS (`cuobjdump -sass`), in address order: the instructions between a backward branch's
    target and the branch, less every BSSY...BSYNC region's instructions between the region's
    first branch and its target (`slow_path`), so the count is the path of angles below
    105615 rad.
    Opcodes without their modifiers (FFMA.FTZ -> FFMA)."""
    ins = [(int(m[1], 16), m[2]) for m in map(_SASS_LINE.search, sass.splitlines()) if m]
    skipped = slow_path(sass)
    loops = []
    for line in sass.splitlines():
        m = _SASS_BRA.search(line)
        if m and int(m[2], 16) < int(m[1], 16) and int(m[1], 16) not in skipped:
            loops.append((int(m[2], 16), int(m[1], 16)))
    outer = [(t, b) for t, b in loops
             if not any(t2 <= t and b <= b2 and (t2, b2) != (t, b) for t2, b2 in loops)]
    out = []
    for t, b in sorted(outer):
        counts: Dict[str, int] = {}
        for a, op in ins:
            if t <= a <= b and a not in skipped:
                counts[op] = counts.get(op, 0) + 1
        out.append(counts)
    return out

def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def programs_per_sm(n_regs: int, num_warps: int, shared: int, sm: SM = SM90) -> Occupancy:
    """How many programs of a kernel one SM holds at once (derived from its resources).

    n_regs: registers per thread; num_warps: warps per program; shared: bytes of shared memory
    per program (Triton's `compiled.metadata.shared`). Registers go to each warp rounded up to
    `sm.register_unit` (n_regs * 32, in multiples of 256 on sm_90), from the quarter of the
    register file of one of the SM's 4 sub-partitions (so the warps registers allow come in
    fours, as CUDA's occupancy calculator counts them); shared memory to each
    program rounded up to `sm.shared_unit`, plus the `sm.shared_reserved` bytes the runtime
    keeps in every program. A program that does not fit at all gives 0.
    """
    for value, name in ((n_regs, "n_regs"), (num_warps, "num_warps"), (shared, "shared")):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if num_warps == 0:
        raise ValueError("num_warps must be at least 1")
    per_warp = _round_up(n_regs * sm.warp, sm.register_unit)
    warps_by_registers = ((sm.registers // sm.sub_partitions) // per_warp * sm.sub_partitions
                          if per_warp else sm.threads // sm.warp)
    per_program = _round_up(shared, sm.shared_unit) + sm.shared_reserved
    limits = {
        "registers": warps_by_registers // num_warps,
        "shared memory": sm.shared // per_program,
        "threads": sm.threads // (num_warps * sm.warp),
        "programs": sm.blocks,
    }
    programs = min(limits.values())
    return Occupancy(programs=programs, limits=limits,
                     limited_by=[k for k, v in limits.items() if v == programs],
                     warps=programs * num_warps, warps_per_sm=sm.threads // sm.warp)


# --- the QKV projection's kernels, compiled for sm_90 ---------------------------------------

TILE_KEYS = ("BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")     # a tile, in order

def compile_for_sm90(launch, pointer_names: tuple, pointers: tuple):
    """Compile a planned launch's kernel for an sm_90 GPU on this machine, as the launch would
    (its arguments and options: warps and pipeline stages), without a GPU
    (offline_compile.compile_for_cuda). Returns Triton's compiled kernel (its cubin in
    `.asm["cubin"]`, its shared memory in `.metadata.shared`)."""
    return compile_for_cuda(launch.launcher.kernel,
                            dict(zip(pointer_names, pointers), **launch.args), **launch.options())


def cubin_resources(compiled) -> tuple:
    """(registers per thread, stack bytes per thread) of a compiled kernel, read from its cubin
    (offline_compile.resource_usage). The stack holds the spilled registers: Triton's
    `n_spills` on a GPU is the kernel's local memory per thread / 4."""
    usage = resource_usage(compiled.asm["cubin"])
    if usage.get("registers") is None:
        raise RuntimeError("cuobjdump printed no register count for this cubin (is it there?)")
    return usage["registers"], usage["stack"] or 0


def qkv_tile_resources(candidates: dict, tokens=8192, hidden=4096, HQ=32, HK=8,
                       D=128) -> List[dict]:
    """Compile the QKV projection's forward, dX and dW kernels for sm_90 on this machine at each
    tile of `candidates` ({kernel: [(BLOCK_M, BLOCK_K, GROUP_M, num_warps, num_stages), ...]},
    as benchmarks/qkv_tiles.CANDIDATES), bare and rotating, for the sweep's problem
    (Llama-3-8B's projection, bf16, table-free angles), as benchmarks/qkv_tiles.py plans them.
    A kernel "<kind>_norm" ("dx_norm", "dw_norm") is that kernel with QK-norm weights (fp32 [D])
    and the statistics a forward saves, as `benchmarks/qkv_tiles.py --norm` runs it: its tile
    is given as the kernel's own and as the norm's ("<kind>_norm" in qkv_gemm's tile table), and
    its bare row is the same GEMM without the norm, which takes no norm pointers.

    Rows: kernel, the tile, rotate, n_regs (registers per thread), stack (bytes per thread:
    spilled registers), shared (bytes per program), and the programs per SM they allow
    (`programs_per_sm`). Run without TRITON_INTERPRET (the interpreter compiles nothing).
    """
    import os

    import ropelib
    from ..kernels import planning, qkv_gemm

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("run without TRITON_INTERPRET=1: the interpreter compiles nothing")
    bf = torch.bfloat16
    N = (HQ + 2 * HK) * D
    x, w = torch.empty(1, tokens, hidden, dtype=bf), torch.empty(N, hidden, dtype=bf)
    outs = [torch.empty(1, tokens, h, D, dtype=bf) for h in (HQ, HK, HK)]
    angles = ropelib.rope_angles(D, base=500000.0)
    tables = (angles.turns, angles.amplitude, None, None, None, None, None, None)
    rows = torch.empty(tokens, D, dtype=torch.float32)     # the forward's cos and s' rows
    pointers = {"fwd": (x, w, None, *outs, rows, rows, *tables[4:], None),
                "dx": (*outs, w, torch.empty_like(x), rows, rows, *tables[4:]),
                "dw": (*outs, x, torch.empty_like(w), None, None, *tables)}
    # QK-norm, as benchmarks/qkv_tiles.py --norm: the weights (fp32 [D]) and what the forward
    # saves for the backward (rstd [M, HQ + HK] fp32, the norm's input [M, HQ + HK, D])
    norm = (torch.empty(D), torch.empty(D), torch.empty(tokens, HQ + HK),
            torch.empty(tokens, HQ + HK, D, dtype=bf))
    normed = {"dx": (*pointers["dx"][:-4], *norm),
              "dw": (*pointers["dw"][:6], torch.empty(HQ + HK, D), *tables[:4], *norm)}
    table = qkv_gemm.tile_table(D * bf.itemsize)         # the table plan's pick_tiles reads
    saved = {k: dict(v) for k, v in table.items()}
    rows = []
    try:
        for kernel, tiles in candidates.items():
            with_norm = kernel.endswith("_norm")
            kind = kernel[:-len("_norm")] if with_norm else kernel
            for tile in tiles:
                for rotate in (False, True):
                    # the tile as the kernel's and as the norm's own, where it has one
                    table[kind] = table[f"{kind}_norm"] = dict(zip(TILE_KEYS, tile))
                    ptrs = normed[kind] if with_norm and rotate else pointers[kind]
                    planned = qkv_gemm.plan(
                        kind, S=tokens, B=1, K=hidden, HQ=HQ, HK=HK, D=D, R=D, P=2**31 - 1,
                        ids=None, cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                        device=torch.device("cuda"), dtypes=planning.pointer_dtypes(ptrs),
                        rotate=rotate)
                    compiled = compile_for_sm90(planned, qkv_gemm.LAUNCHERS[kind].pointer_names,
                                                ptrs)
                    n_regs, stack = cubin_resources(compiled)
                    shared = int(compiled.metadata.shared)
                    occ = programs_per_sm(n_regs, planned.num_warps, shared)
                    rows.append(dict(zip(TILE_KEYS, tile), kernel=kernel, rotate=rotate,
                                     n_regs=n_regs, stack=stack, shared=shared,
                                     programs_per_sm=occ.programs,
                                     limited_by="+".join(occ.limited_by)))
    finally:
        table.clear()
        table.update(saved)
    return rows


def sweep_tiles(path) -> dict:
    """The tiles benchmarks/qkv_tiles.py sweeps (its CANDIDATES), read from its source without
    running it (it switches the interpreter on where there is no GPU)."""
    import ast
    from pathlib import Path
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CANDIDATES"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} assigns no CANDIDATES")


def shipped_tiles(D=128, dtype=torch.bfloat16) -> dict:
    """The tiles ropelib ships for the sweep's problem (heads of D features of `dtype`):
    {kernel: [tile]} from qkv_gemm's tile table for those rows (GPU_TILES for bf16 heads of 128),
    a kernel with QK-norm under its table's key ("dx_norm": dX with QK-norm weights). A tile as
    in `sweep_tiles`: (BLOCK_M, BLOCK_K, GROUP_M, num_warps, num_stages)."""
    from ..kernels import qkv_gemm
    table = qkv_gemm.tile_table(D * dtype.itemsize)
    return {kernel: [tuple(t[k] for k in TILE_KEYS)] for kernel, t in table.items()}


def tiles_to_compile(swept: dict, shipped: dict) -> dict:
    """{kernel: [tile]}: each kernel's swept tiles, then its shipped tiles the sweep lacks (and
    the kernels only shipped, after), each tile once."""
    merged = {kernel: list(dict.fromkeys(tiles)) for kernel, tiles in swept.items()}
    for kernel, tiles in shipped.items():
        merged.setdefault(kernel, []).extend(t for t in tiles if t not in merged[kernel])
    return merged


FIELDS = ["kernel", "BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "rotate",
          "swept", "shipped", "n_regs", "stack", "shared", "programs_per_sm", "limited_by"]


def main(argv=None) -> int:
    import argparse
    import datetime
    import platform
    import subprocess
    from pathlib import Path

    import triton

    from ..bench import compare

    ap = argparse.ArgumentParser(description="The QKV projection's kernels compiled for sm_90 "
                                 "at the tile sweep's tiles and the tiles ropelib ships: "
                                 "registers, stack, shared memory, programs per SM (derived)")
    ap.add_argument("--out", required=True, help="the CSV to write")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[2]      # a checkout: its benchmarks/ and git
    swept = sweep_tiles(root / "benchmarks" / "qkv_tiles.py")
    shipped = shipped_tiles()
    rows = qkv_tile_resources(tiles_to_compile(swept, shipped))
    for r in rows:
        tile = tuple(r[k] for k in TILE_KEYS)
        r["swept"] = tile in swept.get(r["kernel"], ())
        r["shipped"] = tile in shipped.get(r["kernel"], ())

    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True,
                                  cwd=root).stdout.strip()
        except OSError:
            return ""
    commit = git("rev-parse", "--short", "HEAD") or "?"
    if git("status", "--porcelain", "--", "ropelib/kernels"):   # then not that commit's kernels
        commit += " with uncommitted changes to ropelib/kernels/"
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "script": "python -m ropelib.course.counts", "kernels": f"ropelib at git {commit}",
            "python": platform.python_version(),
            "torch": torch.__version__, "triton": triton.__version__,
            "target": "sm_90, compiled on a CPU (no GPU) with each tile's warps and stages: "
                      "registers and stack from cuobjdump -res-usage, shared from Triton's "
                      "compiled metadata",
            "case": "t8192 hidden 4096 32/8 heads x 128 bf16, no QK-norm but in dx_norm: dX with "
                    "QK-norm weights (fp32) and the forward's saved statistics, its bare row the "
                    "GEMM without them (benchmarks/qkv_tiles.py [--norm])",
            "tiles": "swept: benchmarks/qkv_tiles.py's CANDIDATES; shipped: "
                     "ropelib.kernels.qkv_gemm's tile table for this case (GPU_TILES)",
            "programs_per_sm": "derived: registers (65536, per warp in units of 256), shared "
                               "memory (228 KiB, 1 KiB reserved per program), threads (2048), "
                               "programs (32) of an sm_90 SM"}
    compare.write_csv(rows, args.out, meta=meta, fields=FIELDS)
    for r in rows:
        print(*(r[k] for k in FIELDS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
