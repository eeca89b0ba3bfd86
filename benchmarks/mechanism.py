"""Why each RoPE kernel variant is fast or slow: its mechanism, measured, not just its time.

    python3 benchmarks/mechanism.py --ncu --out OUT_DIR        # on a GPU (~1 min, ~3 with ncu)
    TRITON_INTERPRET=1 python benchmarks/mechanism.py --dry-run  # CPU: tiny shapes, checks only

Notebooks 03 (naive kernel), 04 (batch-reuse grid and its ablation), 05 (the ladder to the
finished kernel) and 07 (sweeps) explain speed by mechanism: registers and occupancy, vector
width of the loads, sin/cos work, bytes moved. This script runs every variant they time, once
after a warm-up launch, at the 256 MiB bf16 sbhd sizes of the benchmarks, and records:

* from Triton's compiled kernel (captured at launch): registers and spills per thread, warps,
  shared memory, the grid (programs) and programs per SM; the theoretical occupancy those allow
  (`theoretical_occupancy`: registers, the 64-warp and 32-block caps, shared memory); from its
  PTX, the global loads/stores by vector width (static instructions in the code, not
  executions) and the sin/cos it computes;
* the bytes the kernel must move (ropelib.bench.compare's bytes model: x read + y written + the
  fp32 angle table read once; the copy: x + y) and the elements, so measured bytes and
  instructions can be put per element;
* with `--ncu` (Nsight Compute found on PATH, /opt/nvidia/nsight-compute/*/ or
  /usr/local/cuda/bin): the script re-runs itself under ncu (`--profiled-run`), each measured
  launch between cudaProfilerStart/Stop (ncu `--profile-from-start off`: warm-ups and set-up
  kernels are not profiled) inside an NVTX range named case/variant, and writes a manifest of
  the launches in order (case, variant, Triton kernel name). Each ncu kernel record is matched
  to its variant by the NVTX range it ran in (ncu's "thread Domain:Push/Pop_Range" column);
  only without that column, to the manifest in ID order (a record whose name is not the
  expected kernel's skipped).
  Measured: DRAM bytes read and written, achieved occupancy, warp instructions executed,
  duration, SM and DRAM throughput (% of peak).

The variants: the copy (the floor: the bytes of `y.copy_(x)`, moved by a trivial Triton
load/store kernel, since a same-dtype contiguous copy_ is a cudaMemcpy ncu does not profile),
ropelib's naive kernel, its batch-reuse kernel, every row of the ablation that
benchmarks/ablation.py times (ropelib/course/kernels/ablation.py), every rung of
ropelib/course/ladder.py (rung 0 is the batch-reuse kernel), ropelib.apply_rope through
the finished kernel (`ropelib`, the route forced) and as planned (`ropelib_planned`: the two-pass
route where it pays), and Transformer Engine's fused kernel (`te_fused`) where TE is installed;
all at s4096-b8 (s=4096, b=8, h=32,
d=128), a few at s32768-b1 (the same bytes, b=1) and s16-b64 (8 MiB, too few tiles). Every
output is checked against `ropelib.reference` (fp64) outside the profiled window. A variant that
fails is reported in its row (`status`, `reason`); the others still run.

Output: OUT_DIR/mechanism-<gpu>.csv, starting with `# key: value` lines (GPU, versions, date,
whether ncu ran, the meaning of every column) that ropelib.bench.compare.read_meta reads back,
then a short table on stdout. With ncu, also the report (mechanism-<gpu>.ncu-rep) and ncu's raw
CSV (mechanism-<gpu>-ncu-raw.csv). `--dry-run` runs every variant through Triton's interpreter
at tiny shapes and checks its output; GPU-only columns stay empty.
"""
import argparse
import csv
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit below or in ropelib

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import ropelib  # noqa: E402
from ropelib import reference, runtime  # noqa: E402
from ropelib.bench import compare, routes  # noqa: E402
from ropelib.course import counts, ladder  # noqa: E402
from ropelib.course.kernels import ablation  # noqa: E402  (the ablation kernel and its rows)
from ropelib.course.kernels.batch_reuse import rope_batch_reuse  # noqa: E402
from ropelib.course.kernels.naive import rope_naive  # noqa: E402

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum",
               "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
               "gpu__time_duration.sum", "launch__grid_size", "launch__block_size",
               "launch__registers_per_thread", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed")
# ncu metric -> CSV column
NCU_COLUMNS = {"gpu__time_duration.sum": "ncu_duration_ns",
               "dram__bytes_read.sum": "ncu_dram_read_bytes",
               "dram__bytes_write.sum": "ncu_dram_write_bytes",
               "sm__warps_active.avg.pct_of_peak_sustained_active": "ncu_achieved_occupancy_pct",
               "smsp__inst_executed.sum": "ncu_warp_inst",
               "launch__grid_size": "ncu_grid_size", "launch__block_size": "ncu_block_size",
               "launch__registers_per_thread": "ncu_registers",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed": "ncu_sm_throughput_pct",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed": "ncu_dram_throughput_pct"}

COLUMNS = {  # column -> meaning (written into the CSV header)
    "case": "shape name (bf16 sbhd)", "seq_len": "S", "batch": "B", "heads": "H",
    "head_dim": "D", "dtype": "x dtype",
    "variant": "what ran (copy, naive, batch_reuse, an ablation row, a ladder rung, ropelib)",
    "source": "floor | generation (notebooks 03/04) | ablation (benchmarks/ablation.py) | "
              "ladder (ropelib/course/ladder.py)",
    "description": "the variant in words",
    "status": "ok | failed (see reason) | differs (output differs from the reference)",
    "reason": "why a variant failed, or what could not be read",
    "max_head_ulp_err": "output vs ropelib.reference (fp64), in ulps of each head's largest value",
    "elements": "S*B*H*D elements of x",
    "model_bytes": "bytes the kernel must move: x read + y written + fp32 angles [S, D] read "
                   "once (ropelib.bench.compare.bytes_moved); copy: x + y",
    "kernel": "the Triton kernel launched (its function name); the copy: _copy_kernel",
    "grid": "launch grid (programs per axis)", "programs": "programs (thread blocks) launched",
    "num_warps": "warps per program", "registers": "registers per thread (CompiledKernel.n_regs)",
    "spills": "registers spilled per thread (CompiledKernel.n_spills)",
    "shared_bytes": "static shared memory per program (metadata.shared)",
    "sm_count": "SMs of the GPU", "programs_per_sm": "programs / SMs",
    "occ_blocks_per_sm": "theoretical resident programs per SM (theoretical_occupancy)",
    "occ_warps_per_sm": "theoretical resident warps per SM (of 64)",
    "occ_theoretical_pct": "theoretical occupancy: resident warps / 64",
    "occ_limiter": "what caps the resident programs: registers, warps (64/SM), blocks (32/SM), "
                   "shared",
    "waves": "programs / (SMs * resident programs per SM)",
    "ptx_ld_v4": "global loads of 4-word vectors in the PTX (static count, not executions)",
    "ptx_ld_v2": "global loads of 2-word vectors in the PTX", "ptx_ld_v1": "scalar global loads",
    "ptx_st_v4": "global stores of 4-word vectors in the PTX",
    "ptx_st_v2": "global stores of 2-word vectors", "ptx_st_v1": "scalar global stores",
    "ptx_access_detail": "the same by op.vector.word-size (ladder._ptx_accesses; .nc loads left out)",
    "ptx_sin_cos_approx": "sin.approx/cos.approx instructions in the PTX",
    "trig": "which sin/cos the PTX computes: approx, libdevice, both, none",
    "ptx_instructions": "instructions in the PTX (static lines, a size measure)",
    "ncu_kernel": "ncu's kernel name for the matched record",
    "ncu_duration_ns": "gpu__time_duration.sum (ns; clocks not locked)",
    "ncu_dram_read_bytes": "dram__bytes_read.sum", "ncu_dram_write_bytes": "dram__bytes_write.sum",
    "ncu_dram_bytes_over_model": "(DRAM read + write) / model_bytes",
    "ncu_achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "ncu_warp_inst": "smsp__inst_executed.sum: warp-level instructions executed",
    "ncu_warp_inst_per_element": "ncu_warp_inst / elements",
    "ncu_thread_inst_per_element": "ncu_warp_inst * 32 / elements: thread instructions per "
                                   "element if every lane of every warp is active (an upper bound)",
    "ncu_grid_size": "launch__grid_size (blocks)", "ncu_block_size": "launch__block_size (threads)",
    "ncu_registers": "launch__registers_per_thread",
    "ncu_sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "ncu_dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "ncu_gbps": "model_bytes / ncu duration (GB/s)",
}
FIELDS = list(COLUMNS)


# --- theoretical occupancy --------------------------------------------------------------------

def theoretical_occupancy(registers: int, warps_per_block: int, shared_bytes: int = 0) -> dict:
    """Programs and warps one SM can hold (H100/H200), from ropelib.course.counts.programs_per_sm
    (CUDA's occupancy calculator's rules: registers per warp in units of 256 from one of the SM's
    four sub-partitions, 64 warps, 32 blocks, 228 KiB of shared memory with 1 KiB reserved per
    block). Returns blocks_per_sm, warps_per_sm, occupancy_pct (warps / 64) and limiter (the caps
    that bind, joined by '+': registers, warps, blocks, shared)."""
    if registers < 0 or warps_per_block < 1:
        raise ValueError(f"registers >= 0 and warps_per_block >= 1, got {registers}, "
                         f"{warps_per_block}")
    occ = counts.programs_per_sm(registers, warps_per_block, shared_bytes)
    names = {"registers": "registers", "threads": "warps", "programs": "blocks",
             "shared memory": "shared"}
    return dict(blocks_per_sm=occ.programs, warps_per_sm=occ.warps,
                occupancy_pct=100.0 * occ.fraction,
                limiter="+".join(names[k] for k in occ.limited_by))


# --- what the compiled kernel says --------------------------------------------------------------

class Launch(NamedTuple):
    kernel: str             # the @triton.jit function's name
    grid: Optional[tuple]   # None when the grid was a callable
    num_warps: int          # as launched (Triton's default 4 when not given)
    compiled: object        # Triton's CompiledKernel (None in the interpreter)


class LaunchRecorder:
    """Records every `kernel[grid](...)` launch (JITFunction.run, InterpretedFunction.run) made
    while active: the kernel's name, its grid and the CompiledKernel that run returns."""

    def __init__(self):
        self.launches = []
        self._saved = []

    def _classes(self):
        from triton.runtime import jit
        out = [jit.JITFunction]
        try:
            from triton.runtime import interpreter
            out.append(interpreter.InterpretedFunction)
        except (ImportError, AttributeError):
            pass
        return out

    def __enter__(self):
        for cls in self._classes():
            original = cls.__dict__.get("run")
            if original is None:
                continue
            self._saved.append((cls, original))
            cls.run = self._wrap(original)
        return self

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.run = original
        self._saved = []

    def _wrap(self, original):
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            result = original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            if not warmup:
                fn = getattr(fn_self, "fn", None)
                name = getattr(fn, "__name__", None) or getattr(fn_self, "__name__", "?")
                g = None if callable(grid) else tuple(int(v) for v in grid)
                compiled = result if hasattr(result, "metadata") else None
                warps = int(kwargs.get("num_warps") or 4)
                recorder.launches.append(Launch(name, g, warps, compiled))
            return result
        return run


_PTX_INSTRUCTION = re.compile(r"^\s*(?:@!?%\w+\s+)?[a-z][\w.]*[\s;]", re.M)


def ptx_columns(ptx: str) -> dict:
    """Global loads/stores by vector width, sin/cos instructions, instruction count of a PTX."""
    accesses = ladder._ptx_accesses(ptx)
    cols = {f"ptx_{op}_{vec}": 0 for op in ("ld", "st") for vec in ("v4", "v2", "v1")}
    for key, n in accesses.items():
        op, vec, _ = key.split(".")
        column = f"ptx_{op}_{vec}"
        if column in cols:
            cols[column] += n
        else:  # v8 (Blackwell): kept in the detail column only
            cols.setdefault(column, n)
    cols = {k: v for k, v in cols.items() if k in COLUMNS}
    cols["ptx_access_detail"] = " ".join(f"{k}={v}" for k, v in accesses.items())
    cols["ptx_sin_cos_approx"] = len(re.findall(r"\b(?:sin|cos)\.approx", ptx))
    cols["trig"] = ladder._trig(ptx)
    cols["ptx_instructions"] = sum(1 for line in _PTX_INSTRUCTION.findall(ptx)
                                   if not line.lstrip().startswith((".", "//")))
    return cols


def compiled_columns(compiled) -> tuple:
    """(columns, what was not available) from a CompiledKernel (Triton 3.x)."""
    cols, missing = {}, []
    if compiled is None:
        return cols, ["compiled kernel (interpreter, or launched without JITFunction.run)"]
    if getattr(compiled, "n_regs", None) is None and hasattr(compiled, "_init_handles"):
        try:
            compiled._init_handles()
        except Exception as exc:  # noqa: BLE001 -- report, keep the rest
            missing.append(f"_init_handles ({type(exc).__name__})")
    for attr, column in (("n_regs", "registers"), ("n_spills", "spills")):
        v = getattr(compiled, attr, None)
        if v is None:
            missing.append(attr)
        else:
            cols[column] = int(v)
    md = getattr(compiled, "metadata", None)
    for attr, column in (("num_warps", "num_warps"), ("shared", "shared_bytes")):
        v = getattr(md, attr, None)
        if v is None and isinstance(md, dict):
            v = md.get(attr)
        if v is None:
            missing.append(f"metadata.{attr}")
        else:
            cols[column] = int(v)
    try:
        ptx = compiled.asm["ptx"]
        cols.update(ptx_columns(ptx if isinstance(ptx, str) else ptx.decode()))
    except Exception as exc:  # noqa: BLE001
        missing.append(f"ptx ({type(exc).__name__})")
    return cols, missing


def launch_columns(launch: Optional[Launch], sm_count: Optional[int]) -> tuple:
    """(columns, missing) of one Triton launch: kernel, grid, compiled resources, occupancy."""
    if launch is None:
        return {}, []
    cols = {"kernel": launch.kernel, "num_warps": launch.num_warps}
    if launch.grid is not None:
        cols["grid"] = "x".join(map(str, launch.grid))
        cols["programs"] = math.prod(launch.grid)
    more, missing = compiled_columns(launch.compiled)
    cols.update(more)
    if sm_count and "programs" in cols:
        cols["sm_count"] = sm_count
        cols["programs_per_sm"] = round(cols["programs"] / sm_count, 2)
    if "registers" in cols and "num_warps" in cols:
        occ = theoretical_occupancy(cols["registers"], cols["num_warps"],
                                    cols.get("shared_bytes") or 0)
        cols.update(occ_blocks_per_sm=occ["blocks_per_sm"], occ_warps_per_sm=occ["warps_per_sm"],
                    occ_theoretical_pct=round(occ["occupancy_pct"], 1),
                    occ_limiter=occ["limiter"])
        if sm_count and "programs" in cols and occ["blocks_per_sm"]:
            cols["waves"] = round(cols["programs"] / (sm_count * occ["blocks_per_sm"]), 2)
    return cols, missing


# --- the variants and the cases -------------------------------------------------------------------

class Variant(NamedTuple):
    name: str
    source: str
    description: str
    make: object   # make(x, freqs4d, y) -> a callable launching the variant, returning its output


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def copy_triton(x: torch.Tensor, y: torch.Tensor, block: int = 2048,
                num_warps: int = 4) -> torch.Tensor:
    """y = x for contiguous same-dtype tensors: a plain Triton load/store over the flat tensor
    (16-byte accesses where the pointers allow). `y.copy_(x)` of such tensors is a
    cudaMemcpyAsync D2D, which Nsight Compute does not profile (not a kernel): this moves the
    same bytes as a kernel ncu does see."""
    assert x.is_contiguous() and y.is_contiguous() and x.shape == y.shape and x.dtype == y.dtype
    n = x.numel()
    _copy_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=num_warps)
    return y


def variants(H: int) -> list:
    """Every variant the notebooks time, in the order of the benchmarks."""
    out = [
        Variant("copy", "floor",
                "copy (Triton load/store): y = x, the bytes of y.copy_(x), the least any kernel "
                "must move; a Triton kernel, since y.copy_(x) is a cudaMemcpy ncu does not profile",
                lambda x, f, y: (lambda: copy_triton(x, y))),
        Variant("naive", "generation", "ropelib naive kernel: grid (S*B*H,) (notebook 03)",
                lambda x, f, y: (lambda: rope_naive(x, f, out=y))),
        Variant("batch_reuse", "generation",
                "ropelib batch-reuse kernel: grid (S, H), loop over B (notebook 04; ladder rung 0)",
                lambda x, f, y: (lambda: rope_batch_reuse(x, f, out=y))),
    ]

    def ablation_row(opts):
        def make(x, f, y):
            f2 = f.reshape(f.shape[0], -1).contiguous()
            c2, s2 = torch.cos(f2), torch.sin(f2)
            return lambda: ablation.rope_ablation(x, f2, c2, s2, out=y, **opts)
        return make

    for name, factor, desc, opts in ablation.variants(H):
        out.append(Variant(name, "ablation", f"{factor}: {desc}", ablation_row(opts)))
    for rung in ladder.RUNGS[1:]:
        out.append(Variant(rung.name, "ladder", rung.idea,
                           lambda x, f, y, r=rung.name: (lambda: ladder.rope_ladder(r, x, f, out=y))))
    out.append(Variant("ropelib", "generation",
                       "ropelib.apply_rope through the finished kernel (the route forced)",
                       lambda x, f, y: (lambda: routes.through(
                           "finished", lambda: ropelib.apply_rope(x, f, layout="sbhd")))))
    out.append(Variant("ropelib_planned", "generation",
                       "ropelib.apply_rope as planned: at 256 MiB the two-pass route (its flat "
                       "pass, the rows kept from the warm-up call)",
                       lambda x, f, y: (lambda: ropelib.apply_rope(x, f, layout="sbhd"))))
    te_rope = te_fused_rope()
    if te_rope is not None:   # the kernel notebook 04 measures the grid kernel against
        out.append(Variant("te_fused", "te",
                           "Transformer Engine's fused CUDA RoPE (a CUDA C++ kernel: no Triton "
                           "columns; ncu's columns only)",
                           lambda x, f, y: (lambda: te_rope(x, f, tensor_format="sbhd",
                                                            fused=True))))
    return out


# the CUDA kernel's name in ncu's records, for variants that launch no Triton kernel
KERNEL_NAMES = {"te_fused": "fused_rope_forward"}


def te_fused_rope():
    """Transformer Engine's apply_rotary_pos_emb, or None where TE is not installed (or where
    its fused path cannot run: the interpreter has no CUDA)."""
    if not runtime.on_gpu():
        return None
    try:
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
    except Exception:  # noqa: BLE001 -- TE absent or broken: the run goes on without it
        return None
    return apply_rotary_pos_emb


ALL = None   # a case's variant selection: every variant


def cases(dry_run: bool) -> list:
    """[(name, S, B, H, D, variant names or ALL)], bf16 sbhd; about 40 kernels in all."""
    b1 = ("copy", "naive", "batch_reuse", "heads_all_one_b", "warps", "chunks", "ropelib",
          "ropelib_planned", "te_fused")
    few_tokens = ("copy", "warps", "chunks", "ropelib")
    if dry_run:  # interpreter-sized; D = 24: a half of 12 in a 16-lane tile (masked lanes)
        return [("tiny", 5, 2, 3, 24, ALL), ("tiny-b1", 6, 1, 2, 16, b1),
                ("tiny-few-tokens", 2, 4, 2, 16, few_tokens)]
    return [("s4096-b8", 4096, 8, 32, 128, ALL), ("s32768-b1", 32768, 1, 32, 128, b1),
            ("s16-b64", 16, 64, 32, 128, few_tokens)]


def _selected(case) -> list:
    _, _, _, H, _, names = case
    vs = variants(H)
    return vs if names is ALL else [v for v in vs if v.name in names]


def _sync():
    if runtime.on_gpu():
        torch.cuda.synchronize()


def _inputs(S, B, H, D, device):
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(S, B, H, D, device=device, dtype=torch.bfloat16, generator=gen)
    freqs = compare.angles(S, D).to(device).view(S, 1, 1, D)
    return x, freqs


def _reason(exc) -> str:
    return f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")


# --- the measured run ---------------------------------------------------------------------------

def run(dry_run: bool, progress: bool = True) -> list:
    """Launch every variant (a warm-up that compiles, and the launch whose kernel is read), check
    its output against the reference; return one row per (case, variant)."""
    if not dry_run and not runtime.on_gpu():
        raise SystemExit(f"{runtime.mode()}: the mechanism needs a GPU; use --dry-run here")
    device = runtime.default_device()
    sm_count = (torch.cuda.get_device_properties(0).multi_processor_count
                if runtime.on_gpu() else None)
    rows = []
    for case in cases(dry_run):
        name, S, B, H, D, _ = case
        if progress:
            print(f"{name}: sbhd s={S}, b={B}, h={H}, d={D}, bf16", flush=True)
        x, freqs = _inputs(S, B, H, D, device)
        want = reference.rope_reference(x.double(), freqs)  # fp64
        y = torch.empty_like(x)
        elements = x.numel()
        kernel_bytes = compare.bytes_moved(compare.Config(S, B, H, D, dtype="bf16"))
        for v in _selected(case):
            row = dict(case=name, seq_len=S, batch=B, heads=H, head_dim=D, dtype="bf16",
                       variant=v.name, source=v.source, description=v.description,
                       status="ok", reason="", elements=elements,
                       model_bytes=2 * x.numel() * x.element_size() if v.name == "copy"
                       else kernel_bytes)
            rows.append(row)
            try:
                fn = v.make(x, freqs, y)
                y.fill_(float("nan"))   # an element a variant does not write stays NaN
                with LaunchRecorder() as rec:
                    out = fn()          # warm-up: compiles; the launch is recorded
                    _sync()
                    if not dry_run:     # the launch ncu would profile (the interpreter: once)
                        out = fn()
                        _sync()
            except Exception as exc:  # noqa: BLE001 -- one failing variant must not stop the run
                row.update(status="failed", reason=_reason(exc))
                if progress:
                    print(f"  {v.name:24s} failed: {row['reason']}", flush=True)
                continue
            cols, missing = launch_columns(rec.launches[-1] if rec.launches else None, sm_count)
            row.update(cols)
            if not rec.launches:
                missing.append("no Triton launch recorded")
            if runtime.on_gpu() and missing:
                row["reason"] = "not available: " + ", ".join(missing)
            try:
                if v.name == "copy":
                    err = 0.0 if torch.equal(out, x) else float("inf")
                else:
                    err = compare.error_metrics(out, want)["max_head_ulp_err"]
                row["max_head_ulp_err"] = err
                if not err <= 1.0:
                    row.update(status="differs",
                               reason=f"output differs from the reference ({err:.2f} head ulps) "
                                      + row["reason"])
            except Exception as exc:  # noqa: BLE001
                row.update(status="failed", reason="check: " + _reason(exc))
            if progress:
                print("  " + line(row), flush=True)
        del x, freqs, want, y
        if runtime.on_gpu():
            torch.cuda.empty_cache()
    return rows


def profiled_run(manifest_path: Path) -> int:
    """The run under ncu: each measured launch alone between cudaProfilerStart/Stop, in an NVTX
    range `case/variant`; the manifest lists those launches in order."""
    if not runtime.on_gpu():
        raise SystemExit("--profiled-run needs a GPU")
    manifest = []
    for case in cases(False):
        name, S, B, H, D, _ = case
        x, freqs = _inputs(S, B, H, D, "cuda")
        y = torch.empty_like(x)
        for v in _selected(case):
            try:
                fn = v.make(x, freqs, y)
                with LaunchRecorder() as rec:
                    fn()   # warm-up, not profiled: compiles, fills caches of the launchers
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                    torch.cuda.nvtx.range_push(f"{name}/{v.name}")
                    try:
                        fn()
                        torch.cuda.synchronize()
                    finally:
                        torch.cuda.nvtx.range_pop()
                        torch.cuda.profiler.stop()
            except Exception as exc:  # noqa: BLE001
                print(f"{name}/{v.name} failed: {_reason(exc)}", flush=True)
                continue
            kernel = rec.launches[-1].kernel if rec.launches else KERNEL_NAMES.get(v.name)
            manifest.append(dict(case=name, variant=v.name, kernel=kernel))
        del x, freqs, y
        torch.cuda.empty_cache()
    Path(manifest_path).write_text(json.dumps(manifest, indent=1))
    print(f"profiled {len(manifest)} launches; manifest {manifest_path}", flush=True)
    return 0


# --- Nsight Compute -------------------------------------------------------------------------------

def find_ncu() -> Optional[str]:
    """The ncu executable: on PATH, else the newest under /opt/nvidia/nsight-compute, else CUDA's."""
    candidates = [shutil.which("ncu") or ""]
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    candidates += ["/usr/local/cuda/bin/ncu"]
    candidates += sorted(glob.glob("/usr/local/cuda-*/bin/ncu"), reverse=True)
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


_UNIT_SCALE = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "kibyte": 1024, "mibyte": 1024 ** 2, "gibyte": 1024 ** 3,
               "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
               "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9,
               "inst": 1, "kinst": 1e3, "minst": 1e6, "ginst": 1e9}


def _number(text: str, unit: str):
    t = (text or "").strip().replace(",", "")
    if t in ("", "n/a", "N/A"):
        return None
    try:
        v = float(t)
    except ValueError:
        return None
    return v * _UNIT_SCALE.get((unit or "").strip().lower(), 1)


def parse_ncu_csv(text: str) -> list:
    """Kernel records of `ncu --csv --page raw` output: header row (with "ID" and "Kernel Name"),
    units row, one row per kernel; anything before the header (==PROF== lines, the program's
    output) is skipped. Returns [{"id", "kernel", metric: value in base units (bytes, ns)}],
    with "nvtx" (the innermost push/pop range's name, or None) where ncu wrote the NVTX column."""
    lines = compare.ncu_table(text)
    if not lines:
        return []
    table = list(csv.reader(lines))
    header, units, data = table[0], table[1] if len(table) > 1 else [], table[2:]
    if units and units[0].strip():   # no units row: the second row is already a kernel
        data, units = table[1:], []
    nvtx_col = next((c for c in header if "Push/Pop_Range" in c), None)
    records = []
    for r in data:
        if len(r) != len(header):
            continue
        rec = dict(zip(header, r))
        try:
            out = {"id": int(rec["ID"]), "kernel": rec.get("Kernel Name", "")}
        except (KeyError, ValueError):
            continue
        if nvtx_col is not None:
            out["nvtx_ranges"] = nvtx_ranges(rec[nvtx_col])
            out["nvtx"] = out["nvtx_ranges"][-1] if out["nvtx_ranges"] else None
        for i, col in enumerate(header):
            if col in NCU_METRICS:
                out[col] = _number(r[i], units[i] if i < len(units) else "")
        records.append(out)
    return sorted(records, key=lambda rec: rec["id"])


_NVTX_DOMAIN = re.compile(r'"?<[^<>"]*>:')   # `<default domain>:` or another `<domain>:`


def nvtx_ranges(cell: str) -> list:
    """The range names in ncu's "thread Domain:Push/Pop_Range:..." cell, outermost first, e.g.
    `3042  "<default domain>:s4096-b8/naive:none:none:none:none:none:none" ` -> `[s4096-b8/naive]`.
    A library that opens a range of its own inside ours (Transformer Engine's
    `nvte_fused_rope_forward`) adds a quoted entry after it."""
    hits = list(_NVTX_DOMAIN.finditer(cell or ""))
    names = []
    for hit, after in zip(hits, hits[1:] + [None]):
        rest = cell[hit.end():after.start() if after is not None else None]
        end = rest.find(":none")
        if end < 0:
            end = rest.find(":")
        name = (rest if end < 0 else rest[:end]).strip().strip('"').strip()
        if name:
            names.append(name)
    return names


def nvtx_range(cell: str) -> Optional[str]:
    """The innermost range name of the cell (see nvtx_ranges), or None."""
    names = nvtx_ranges(cell)
    return names[-1] if names else None


def match_records(manifest: list, records: list) -> dict:
    """{(case, variant): ncu record}. Records carrying an NVTX range ("nvtx" key, from ncu's
    Push/Pop_Range column) are matched by the range `case/variant` they ran in (at any depth:
    a library may open ranges of its own inside it); of several in one range the
    first whose kernel name contains the expected Triton kernel (else the first). Only without
    NVTX: manifest and records zipped in order, a record whose kernel name does not contain the
    launch's expected Triton kernel skipped (not one of ours)."""
    if any("nvtx" in r for r in records):
        by_range = {}
        for r in records:
            for name in r.get("nvtx_ranges") or ([r["nvtx"]] if r.get("nvtx") else []):
                by_range.setdefault(name, []).append(r)
        out = {}
        for entry in manifest:
            found = by_range.get(f"{entry['case']}/{entry['variant']}")
            if not found:
                continue
            want = entry.get("kernel")
            out[(entry["case"], entry["variant"])] = next(
                (r for r in found if want and want in r["kernel"]), found[0])
        return out
    out, i = {}, 0
    for entry in manifest:
        want = entry.get("kernel")
        j = i
        while j < len(records) and want and want not in records[j]["kernel"]:
            j += 1
        if j >= len(records):
            continue   # not profiled (ncu skipped it): leave the next entries their chance
        out[(entry["case"], entry["variant"])] = records[j]
        i = j + 1
    return out


def ncu_row_columns(record: dict, row: dict) -> dict:
    """A matched ncu record as the row's ncu_* columns, with the per-element ratios."""
    cols = {"ncu_kernel": record["kernel"][:120]}
    for metric, column in NCU_COLUMNS.items():
        v = record.get(metric)
        if v is not None:
            cols[column] = int(v) if float(v).is_integer() else round(v, 2)
    rd, wr = record.get("dram__bytes_read.sum"), record.get("dram__bytes_write.sum")
    if rd is not None and wr is not None and row.get("model_bytes"):
        cols["ncu_dram_bytes_over_model"] = round((rd + wr) / row["model_bytes"], 3)
    inst = record.get("smsp__inst_executed.sum")
    if inst is not None and row.get("elements"):
        cols["ncu_warp_inst_per_element"] = round(inst / row["elements"], 4)
        cols["ncu_thread_inst_per_element"] = round(inst * 32 / row["elements"], 3)
    ns = record.get("gpu__time_duration.sum")
    if ns and row.get("model_bytes"):
        cols["ncu_gbps"] = round(row["model_bytes"] / ns, 1)
    return cols


def match_files(raw_path: Path, manifest_path: Path) -> tuple:
    """Re-match a saved raw CSV (mechanism-<gpu>-ncu-raw.csv) and manifest:
    ({(case, variant): record}, records, manifest)."""
    records = parse_ncu_csv(Path(raw_path).read_text())
    manifest = json.loads(Path(manifest_path).read_text())
    return match_records(manifest, records), records, manifest


def run_ncu(ncu: str, out_dir: Path, slug: str, timeout: float) -> tuple:
    """Profile `--profiled-run` under ncu. Returns ({(case, variant): record}, status line)."""
    report = out_dir / f"mechanism-{slug}.ncu-rep"
    manifest_path = out_dir / f"mechanism-{slug}-manifest.json"
    raw_path = out_dir / f"mechanism-{slug}-ncu-raw.csv"
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--nvtx",
           "--metrics", ",".join(NCU_METRICS), "-f", "--export", str(report),
           sys.executable, str(Path(__file__).resolve()), "--profiled-run",
           "--manifest", str(manifest_path)]
    print("running:", " ".join(cmd), flush=True)
    try:  # its own process group: on a timeout, ncu and the profiled python end together
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        return {}, f"failed: {_reason(exc)}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return {}, f"failed: timed out after {timeout:.0f} s (--ncu-timeout)"
    tail = (stdout[-1500:] + stderr[-1500:]).strip()
    print(tail, flush=True)
    if proc.returncode != 0 or not report.exists():
        why = " | ".join(tail.splitlines()[-4:])
        return {}, f"failed: exit {proc.returncode}: {why}"[:600]
    text = ""
    for extra in (["--print-units", "base"], []):
        imp = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw", *extra],
                             capture_output=True, text=True, timeout=300)
        text = imp.stdout
        if imp.returncode == 0 and '"ID"' in text:
            break
    raw_path.write_text(text)
    try:
        matched, records, manifest = match_files(raw_path, manifest_path)
    except (OSError, ValueError) as exc:
        return {}, f"failed: no manifest ({_reason(exc)})"
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout
    version = " ".join(version.split()[-3:]) if version else "?"
    return matched, (f"{ncu} ({version}); {len(records)} kernel records, {len(matched)} of "
                     f"{len(manifest)} launches matched; report {report.name}, raw {raw_path.name}")


# --- output -------------------------------------------------------------------------------------

def gpu_slug() -> str:
    return compare.gpu_slug(None if runtime.on_gpu() else "cpu-interpreter")


def write(rows, path, ncu_status: str) -> str:
    """The rows to CSV, after `# key: value` lines (ropelib.bench.compare.read_meta)."""
    meta = compare.environment_meta()
    meta["script"] = "benchmarks/mechanism.py"
    meta["ncu"] = ncu_status
    meta["bytes_model"] = "x read + y written + fp32 angles [S, D] read once; copy: x + y"
    meta["launches"] = "each variant: one warm-up launch (compiles), then the launch measured"
    for column, meaning in COLUMNS.items():
        meta[f"column {column}"] = meaning
    return compare.write_csv(rows, path, meta=meta, fields=FIELDS)


def _fmt(v, spec=""):
    return "" if v is None or v == "" else format(v, spec)


def line(row) -> str:
    if row["status"] == "failed":
        return f"{row['variant']:24s} failed: {row['reason']}"
    return (f"{row['variant']:24s} regs {_fmt(row.get('registers')):>3s} "
            f"warps {_fmt(row.get('num_warps')):>2s} programs {_fmt(row.get('programs')):>8s} "
            f"ld v4/v2/v1 {_widths(row, 'ld') or '-'} "
            f"err {_fmt(row.get('max_head_ulp_err'), '.2f')} {row['status']}")


def _widths(row, op) -> str:
    """'v4/v2/v1' counts of a row's PTX loads or stores; empty without PTX."""
    counts = [row.get(f"ptx_{op}_{w}") for w in ("v4", "v2", "v1")]
    return "" if all(c is None or c == "" for c in counts) else "/".join(map(str, counts))


def table(rows) -> str:
    """The printed summary: per case, the static mechanism and what ncu measured."""
    out = []
    head = (f"{'variant':22s} {'regs':>4s} {'spill':>5s} {'warps':>5s} {'programs':>9s} {'/SM':>7s} "
            f"{'occ%':>5s} {'ld4/2/1':>9s} {'st4/2/1':>9s} {'sincos':>6s} {'trig':>9s} "
            f"{'us':>8s} {'DRAM/mdl':>8s} {'achv%':>6s} {'thr-inst/el':>11s} {'GB/s':>6s}")
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        r0 = rs[0]
        out.append(f"\n{case}: sbhd s={r0['seq_len']}, b={r0['batch']}, h={r0['heads']}, "
                   f"d={r0['head_dim']}, bf16")
        out.append(head)
        for r in rs:
            if r["status"] == "failed":
                out.append(f"{r['variant']:22s} failed: {r['reason'][:100]}")
                continue
            ns = r.get("ncu_duration_ns")
            out.append(
                f"{r['variant']:22s} {_fmt(r.get('registers')):>4s} {_fmt(r.get('spills')):>5s} "
                f"{_fmt(r.get('num_warps')):>5s} {_fmt(r.get('programs')):>9s} "
                f"{_fmt(r.get('programs_per_sm')):>7s} "
                f"{_fmt(r.get('occ_theoretical_pct'), '.0f'):>5s} "
                f"{_widths(r, 'ld'):>9s} {_widths(r, 'st'):>9s} "
                f"{_fmt(r.get('ptx_sin_cos_approx')):>6s} {_fmt(r.get('trig')):>9s} "
                f"{_fmt(ns / 1e3 if ns else None, '.1f'):>8s} "
                f"{_fmt(r.get('ncu_dram_bytes_over_model'), '.2f'):>8s} "
                f"{_fmt(r.get('ncu_achieved_occupancy_pct'), '.0f'):>6s} "
                f"{_fmt(r.get('ncu_thread_inst_per_element'), '.1f'):>11s} "
                f"{_fmt(r.get('ncu_gbps'), '.0f'):>6s}"
                + ("" if r["status"] == "ok" else f"  {r['status']}"))
    return "\n".join(out)


def rematch(csv_path: Path) -> str:
    """Re-match a finished run's saved ncu records to its rows (after a change to the matching):
    the rows and their `# key: value` lines stay as the run wrote them, the ncu columns are
    recomputed and the `ncu` line says how many launches match now."""
    csv_path = Path(csv_path)
    stem = csv_path.name[:-len(".csv")]
    matched, records, manifest = match_files(csv_path.with_name(f"{stem}-ncu-raw.csv"),
                                             csv_path.with_name(f"{stem}-manifest.json"))
    meta, rows = compare.read_meta(csv_path), compare.read_csv(csv_path)
    ncu_columns = [c for c in FIELDS if c.startswith("ncu_")]
    for row in rows:
        for column in ncu_columns:
            row[column] = None
        record = matched.get((row["case"], row["variant"]))
        if record is not None:
            row.update(ncu_row_columns(record, row))
    meta["ncu"] = (meta.get("ncu", "") + f"; re-matched after the run: {len(matched)} of "
                   f"{len(manifest)} launches ({len(records)} kernel records)")
    return compare.write_csv(rows, csv_path, meta=meta, fields=FIELDS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for mechanism-<gpu>.csv (and the ncu report)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes through the interpreter: check every output, no GPU columns")
    ap.add_argument("--ncu", action="store_true",
                    help="also profile every launch under Nsight Compute (if ncu is found)")
    ap.add_argument("--ncu-timeout", type=float, default=420.0,
                    help="seconds the run under ncu may take (default 420)")
    ap.add_argument("--profiled-run", action="store_true",
                    help="internal: the run ncu profiles (writes --manifest)")
    ap.add_argument("--manifest", type=Path, default=None, help="internal: the manifest's path")
    ap.add_argument("--rematch", type=Path, default=None, metavar="CSV",
                    help="no run: match a finished run's saved ncu records (the raw CSV and "
                         "manifest next to CSV) to its rows again, and rewrite CSV's ncu columns")
    args = ap.parse_args(argv)
    if args.rematch is not None:
        print("wrote", rematch(args.rematch))
        return 0
    if args.profiled_run:
        if args.manifest is None:
            ap.error("--profiled-run needs --manifest")
        return profiled_run(args.manifest)
    if args.out is None and not args.dry_run:
        ap.error("--out is required (the folder the CSV goes to)")
    print(runtime.mode(), flush=True)
    slug = gpu_slug()
    matched, ncu_status = {}, "not requested (run with --ncu)"
    if args.ncu and args.dry_run:
        ncu_status = "not run (dry run)"
    elif args.ncu:
        ncu = find_ncu()
        if ncu is None:
            ncu_status = "not found"
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            try:
                matched, ncu_status = run_ncu(ncu, args.out, slug, args.ncu_timeout)
            except Exception as exc:  # noqa: BLE001 -- the static columns still get written
                matched, ncu_status = {}, f"failed: {_reason(exc)}"
        print("ncu:", ncu_status, flush=True)
    rows = run(args.dry_run)
    for row in rows:
        record = matched.get((row["case"], row["variant"]))
        if record is not None:
            row.update(ncu_row_columns(record, row))
    if args.out is not None:
        print("wrote", write(rows, args.out / f"mechanism-{slug}.csv", ncu_status))
    print(f"# ncu: {ncu_status}")
    print(table(rows))
    failed = [f"{r['case']}/{r['variant']}" for r in rows if r["status"] != "ok"]
    if failed:
        print("failed or differ from the reference:", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
