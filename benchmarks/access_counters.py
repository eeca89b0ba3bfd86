"""What notebook 03's ways of moving RoPE's interleaved pairs make the memory system do, counted
by Nsight Compute (GPU only; `--dry-run` checks the kernels on the CPU).

Notebook 03 records, in the interpreter, which 32-byte sectors each load and store of the pair
swap (`ropelib.course.kernels.pair_swap`) touches: stride-2 loads and stores touch every sector
of a row twice, half of it each time. On a GPU each of those is split into warp instructions by
the layout the compiler picks, which the interpreter does not show. What that costs depends on
where the second touch is served: a load's from L1, if the sector is still there; a store's goes
to L2 in any case. This script profiles the notebook's four patterns and a fifth (whole rows
loaded and stored, the pairs split and joined in registers, as ropelib's finished kernel does),
each once on 64 MiB of bf16 ([2^18, 128], 16 rows a program, as the notebook's timing cell),
and records, per kernel:

    l1_load_requests, l1_load_sectors    global load requests (one per warp instruction) and
                                         the sectors they asked L1 for
    l1_load_hit_pct                      the share of those sectors L1 already held
    l2_read_sectors                      sectors L1 fetched from L2 (its misses)
    l1_store_requests, l1_store_sectors  the same for stores
    l2_write_sectors                     sectors L1 sent on to L2 (stores are written through)
    dram_read_bytes, dram_write_bytes    what reached DRAM
    duration_ns                          the kernel's time under the profiler (clocks not locked)

and, outside the profiler, `us` (triton.testing.do_bench's median) and the bytes a copy must
move (`model_bytes`: x read once plus y written once).

The same counters for notebook 02's unfused PyTorch chain (`ropelib.reference.te_unfused`, bf16
sbhd s4096 b4 h32 d128, the notebook's GPU shape), one row per kernel (group `reference`,
`pattern` the kernel's demangled name): there the sectors per load request say how many bytes
each lane asks for (a warp's contiguous 2-byte loads span 2 sectors, its 16-byte ones 16).

    python benchmarks/access_counters.py --out DIR     # ~1 min on an H200
    TRITON_INTERPRET=1 python benchmarks/access_counters.py --dry-run

Writes DIR/access_counters-<gpu>.csv (`# key: value` lines first: GPU, versions, ncu) and the
profiler's own CSV beside it (access_counters-<gpu>-ncu.csv); prints the table last.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (REPO_ROOT, REPO_ROOT / "benchmarks"):   # ropelib without `pip install -e .`, and
    if str(_path) not in sys.path:                    # mechanism.py however this file is loaded
        sys.path.insert(0, str(_path))

from ropelib import reference  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.frequencies import rope_freqs  # noqa: E402
from ropelib.course import measured  # noqa: E402
from ropelib.course.kernels.pair_swap import pair_swap  # noqa: E402
import mechanism  # noqa: E402  (benchmarks/mechanism.py: where ncu is)

ROWS, D, ROWS_PER_PROGRAM = 1 << 18, 128, 16
REFERENCE_SHAPE = (4096, 4, 32)             # notebook 02's S, B, H on a GPU (D = 128)
PATTERNS = {  # name: (strided load, strided store, whole rows)
    "contiguous load, contiguous store": (False, False, False),
    "stride-2 load, contiguous store": (True, False, False),
    "contiguous load, stride-2 store": (False, True, False),
    "stride-2 load, stride-2 store": (True, True, False),
    "whole rows, reshape and split": (False, False, True),
}
# Nsight Compute metric -> CSV column. The first group is required; the second is dropped (and
# the run repeated) if this ncu does not know one of them.
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "l1_load_requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "l1_load_sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "l1_store_requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "l1_store_sectors",
    "lts__t_sectors_srcunit_tex_op_read.sum": "l2_read_sectors",
    "lts__t_sectors_srcunit_tex_op_write.sum": "l2_write_sectors",
}
OPTIONAL_METRICS = {
    "l1tex__t_sector_pipe_lsu_mem_global_op_ld_hit_rate.pct": "l1_load_hit_pct",
}


def _inputs(device, rows):
    torch.manual_seed(0)
    x = torch.randn(rows, D, device=device, dtype=torch.bfloat16)
    return x, torch.empty_like(x)


def _want(x):
    return x.view(x.shape[0], D // 2, 2).flip(-1).reshape(x.shape)


def _reference_inputs():
    torch.manual_seed(0)
    S, B, H = REFERENCE_SHAPE
    x = torch.randn(S, B, H, D, device="cuda", dtype=torch.bfloat16)
    return x, rope_freqs(S, D).to("cuda")


def profiled_run() -> None:
    """Each pattern launched once between cudaProfilerStart/Stop, after two warm-up launches
    (compiled, caches in their steady state), in the order of PATTERNS; then one call of the
    reference chain."""
    x, y = _inputs("cuda", ROWS)
    xr, fr = _reference_inputs()
    for strided_load, strided_store, whole_rows in PATTERNS.values():
        for _ in range(2):
            pair_swap(x, strided_load, strided_store, ROWS_PER_PROGRAM, out=y,
                      whole_rows=whole_rows)
    for _ in range(2):
        reference.te_unfused(xr, fr)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for strided_load, strided_store, whole_rows in PATTERNS.values():
        pair_swap(x, strided_load, strided_store, ROWS_PER_PROGRAM, out=y, whole_rows=whole_rows)
        torch.cuda.synchronize()
    reference.te_unfused(xr, fr)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def run_ncu(ncu: str, raw_path: Path) -> tuple:
    """Profile `--profiled-run`; returns (kernel records in launch order, the metrics taken)."""
    for metrics in ({**METRICS, **OPTIONAL_METRICS}, METRICS):
        cmd = [ncu, "--profile-from-start", "off", "--csv", "--print-units", "base",
               "--print-kernel-base", "demangled",
               "--metrics", ",".join(metrics), sys.executable, str(Path(__file__).resolve()),
               "--profiled-run"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        text = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("==PROF=="))
        if proc.returncode == 0 and '"ID"' in text:
            raw_path.write_text(text + "\n")
            return measured.ncu_kernels(raw_path), metrics
        print(f"ncu with {len(metrics)} metrics failed (exit {proc.returncode}): "
              f"{(proc.stdout + proc.stderr)[-800:]}", flush=True)
    raise SystemExit("Nsight Compute could not profile the pair swap (see above)")


def dry_run() -> None:
    x, _ = _inputs("cpu", 37)
    for name, (strided_load, strided_store, whole_rows) in PATTERNS.items():
        got = pair_swap(x, strided_load, strided_store, ROWS_PER_PROGRAM, whole_rows=whole_rows)
        assert torch.equal(got, _want(x)), name
    print(f"dry run: the {len(PATTERNS)} patterns swap every pair of a [37, {D}] bf16 tensor")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--dry-run", action="store_true", help="CPU: check the kernels, no counters")
    ap.add_argument("--profiled-run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.profiled_run:
        return profiled_run()
    if args.dry_run:
        return dry_run()
    if not torch.cuda.is_available():
        raise SystemExit("access_counters.py counts a GPU's memory traffic: run it on a machine "
                         "with a GPU, or pass --dry-run")
    ncu = mechanism.find_ncu()
    if ncu is None:
        raise SystemExit("no Nsight Compute (ncu) on this machine")
    import triton.testing
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = compare.gpu_slug()
    x, y = _inputs("cuda", ROWS)
    rows = []
    for name, (strided_load, strided_store, whole_rows) in PATTERNS.items():
        def run():
            return pair_swap(x, strided_load, strided_store, ROWS_PER_PROGRAM, out=y,
                             whole_rows=whole_rows)
        assert torch.equal(run(), _want(x)), f"{name}: wrong output"
        ms = triton.testing.do_bench(run, warmup=25, rep=200)
        rows.append({"pattern": name, "strided_load": strided_load,
                     "strided_store": strided_store, "whole_rows": whole_rows,
                     "us": round(ms * 1e3, 2),
                     "model_bytes": 2 * x.numel() * x.element_size()})
    copy_ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=200)
    records, metrics = run_ncu(ncu, out / f"access_counters-{slug}-ncu.csv")
    kernels = [r for r in records if "pair_swap" in r["kernel"]]
    if len(kernels) != len(rows):
        raise SystemExit(f"expected {len(rows)} profiled pair-swap kernels, found {len(kernels)}")
    for row, rec in zip(rows, kernels):
        row["group"] = "pair swap"
        for metric, column in metrics.items():
            row[column] = rec["metrics"].get(metric)
    for rec in records[records.index(kernels[-1]) + 1:]:      # the reference chain's kernels
        row = {"group": "reference", "pattern": rec["kernel"]}
        for metric, column in metrics.items():
            row[column] = rec["metrics"].get(metric)
        rows.append(row)
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.split()
    meta = {**compare.environment_meta(), "gpu": torch.cuda.get_device_name(),
            "shape": f"[{ROWS}, {D}] bf16, {ROWS_PER_PROGRAM} rows a program",
            "copy_us": round(copy_ms * 1e3, 2), "ncu": " ".join(version[-3:]),
            "metrics": "; ".join(f"{c} = {m}" for m, c in metrics.items())}
    fields = ["group", "pattern", "strided_load", "strided_store", "whole_rows", "us",
              "model_bytes", *metrics.values()]
    path = compare.write_csv(rows, out / f"access_counters-{slug}.csv", meta=meta, fields=fields)
    print(f"wrote {path}; a copy of the same bytes: {copy_ms * 1e3:.1f} us")
    for r in rows:
        if r["group"] == "reference":
            print(f"{r['pattern'][:60]:60s} load sectors/request "
                  f"{r['l1_load_sectors'] / max(r['l1_load_requests'], 1):4.1f}  "
                  f"{r['duration_ns'] / 1e3:7.1f} us")
            continue
        print(f"{r['pattern']:36s} {r['us']:7.1f} us  load sectors/request "
              f"{r['l1_load_sectors'] / r['l1_load_requests']:4.1f}  L1 load hits "
              f"{r.get('l1_load_hit_pct') or float('nan'):5.1f} %  L2 sectors read "
              f"{r['l2_read_sectors']:,.0f} written {r['l2_write_sectors']:,.0f}  DRAM MB read "
              f"{r['dram_read_bytes'] / 1e6:6.1f} written {r['dram_write_bytes'] / 1e6:6.1f}")


if __name__ == "__main__":
    main()
