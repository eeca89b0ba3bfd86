"""Why ropelib's fused QKV forward takes longer than the mainloop probe's rotating kernel: both,
their bare GEMMs and cuBLAS under Nsight Compute's sections (GPU only; `--check` runs the same
launches small on any machine).

Notebook 12 found ropelib's fused forward (pointer loads, cos/sin rows a pre-pass writes) slower
than the rotating kernel of benchmarks/qkv_mainloop_probe.py (TMA descriptor loads, a cos/sin
table), which at 8192 tokens ran as fast as ropelib's bare GEMM. This probe launches, once each
after warm-ups, between cudaProfilerStart/Stop (Llama-3-8B's projection, bf16, 8192 tokens):

    0 cublas          torch.nn.functional.linear(x, w)
    1 product_bare    kernels/qkv_gemm's forward with ROTATE=False, at its GPU tile
    2 product_fused   ropelib.qkv_rope_linear with table-free angles: the rows pre-pass, then
                      the forward kernel (two kernels)
    3 probe_bare      the probe's TMA GEMM, 128 x 128 x 64, 8 warps, 4 stages
    4 probe_fused     the probe's rotating TMA kernel with a cos/sin table, 128 x 64, 8 warps, 4
                      stages (ropelib's forward tile)

and runs itself under ncu with the sections SpeedOfLight, Occupancy, LaunchStats,
WarpStateStats and MemoryWorkloadAnalysis, and the metrics METRICS (warp instructions issued;
the cycles a warp waited per issued instruction, by stall reason). Writes
OUT/qkv_forward_ncu-<gpu>.csv: one row per kernel and metric (call, kernel, section, metric,
unit, value), `# key: value` lines first.

    python benchmarks/qkv_forward_ncu_probe.py --out DIR        # ~1 min on an H200
    TRITON_INTERPRET=1 python benchmarks/qkv_forward_ncu_probe.py --check
"""
import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent, HERE):     # ropelib without `pip install -e .`, and the other
    if str(_path) not in sys.path:    # benchmarks however this file is loaded
        sys.path.insert(0, str(_path))

import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
import mechanism  # noqa: E402  (benchmarks/mechanism.py: where ncu is)
import qkv_mainloop_probe as mp  # noqa: E402  (its GEMMs, bare and rotating, TMA loads)

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
            "MemoryWorkloadAnalysis")
# beside the sections: warp instructions issued, and what a warp waited on between two of them
# (cycles per issued instruction, by stall reason; their sum is WarpStateStats' cycles per
# issued instruction)
STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "wait", "math_pipe_throttle",
          "mio_throttle", "lg_throttle", "not_selected", "selected", "dispatch_stall",
          "no_instruction", "branch_resolving", "membar", "sleeping", "drain", "imc_miss",
          "tex_throttle", "misc")
METRICS = ("smsp__inst_executed.sum",) + tuple(
    f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS)
CALLS = ("cublas", "product_bare", "product_fused", "probe_bare", "probe_fused")


def calls(tokens: int, device) -> dict:
    """{name: a callable making that launch} for x [tokens, hidden] at the probe's sizes."""
    HQ, HK, D, hidden = mp.HQ, mp.HK, mp.D, mp.HIDDEN
    small = device == "cpu"
    if small:                      # the interpreter: one tile of each kernel
        tokens, hidden = 128, 64
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(device, torch.bfloat16)
    w = (torch.randn((HQ + 2 * HK) * D, hidden, generator=g) / hidden**0.5).to(device,
                                                                              torch.bfloat16)
    angles = ropelib.rope_angles(D, base=500000.0, device=device)
    theta = torch.rand(tokens, D // 2, generator=g).to(device)
    table = mp.cos_sin_table(theta)
    return {
        "cublas": lambda: torch.nn.functional.linear(x, w),
        "product_bare": lambda: mp.run_product(x, w, tokens, joined=False),
        "product_fused": lambda: ropelib.qkv_rope_linear(x[None], w, n_heads=HQ,
                                                         n_kv_heads=HK, head_dim=D,
                                                         angles=angles),
        "probe_bare": lambda: mp.run_descriptors(x, w, (128, 128, 64, 8, 8, 4)),
        "probe_fused": lambda: mp.run_fused(x, w, table, tokens, (HQ, HK), (128, 64, 8, 8, 4),
                                            table=True),
    }


def profiled_run(tokens: int) -> None:
    launches = calls(tokens, "cuda")
    for fn in launches.values():          # compile, plan, and warm the caches
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in launches.values():
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def parse(text: str) -> list:
    """The rows of `ncu --csv` (its details page: one row per kernel, section and metric)."""
    return list(csv.DictReader(compare.ncu_table(text)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--check", action="store_true", help="small launches, no profiler")
    ap.add_argument("--profiled-run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.profiled_run:
        profiled_run(args.tokens)
        return 0
    if args.check:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        for name, fn in calls(args.tokens, device).items():
            fn()
            print(f"check: {name} ran")
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("qkv_forward_ncu_probe.py profiles GPU kernels: run it on a GPU, or "
                         "pass --check")
    ncu = mechanism.find_ncu()
    if ncu is None:
        raise SystemExit("no Nsight Compute (ncu) on this machine")
    def profile(metrics):
        cmd = [ncu, "--profile-from-start", "off", "--csv", "--print-units", "base",
               *(a for s in SECTIONS for a in ("--section", s)),
               *(("--metrics", ",".join(metrics)) if metrics else ()), sys.executable,
               str(Path(__file__).resolve()), "--profiled-run", "--tokens", str(args.tokens)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        return proc, parse(proc.stdout)
    proc, rows = profile(METRICS)
    metrics = " ".join(METRICS)
    if proc.returncode != 0 or not rows:    # (an ncu without one of the metrics: sections only)
        print(f"ncu with --metrics failed (exit {proc.returncode}); sections only", flush=True)
        proc, rows = profile(())
        metrics = "none (ncu refused them)"
    if proc.returncode != 0 or not rows:
        raise SystemExit(f"ncu failed (exit {proc.returncode}): "
                         f"{(proc.stdout + proc.stderr)[-800:]}")
    ids = sorted({int(r["ID"]) for r in rows})
    # the launches in order: product_fused makes two kernels (the rows pre-pass, the forward)
    names = ["cublas", "product_bare", "product_fused (rows pre-pass)", "product_fused",
             "probe_bare", "probe_fused"]
    label = dict(zip(ids, names)) if len(ids) == len(names) else {i: f"kernel {i}" for i in ids}
    out = [{"call": label[int(r["ID"])], "kernel": r.get("Kernel Name", ""),
            "section": r.get("Section Name", ""), "metric": r.get("Metric Name", ""),
            "unit": r.get("Metric Unit", ""), "value": r.get("Metric Value", "")} for r in rows]
    meta = {**compare.environment_meta(), "gpu": torch.cuda.get_device_name(),
            "case": f"t{args.tokens} hidden 4096 32/8 heads x 128 bf16, table-free angles",
            "calls": "; ".join(names), "sections": " ".join(SECTIONS), "metrics": metrics}
    path = compare.write_csv(out, Path(args.out) / f"qkv_forward_ncu-{compare.gpu_slug()}.csv",
                             meta=meta, fields=["call", "kernel", "section", "metric", "unit",
                                                "value"])
    print(f"wrote {path} ({len(ids)} kernels)")
    wanted = ("Duration", "Registers Per Thread", "Achieved Occupancy", "Compute (SM) Throughput",
              "Warp Cycles Per Issued Instruction", "smsp__inst_executed.sum",
              "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
              "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
              "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio")
    for i in ids:
        got = {r["metric"]: r["value"] for r in out if r["call"] == label[i]}
        print(f"{label[i]:30s} " + "  ".join(f"{m}={got.get(m, '-')}" for m in wanted))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
