"""The QKV projection's forwards with the GPU's clock and power read while they run (GPU).

Nsight Compute's cycles against do_bench's times imply that cuBLAS, the bare Triton GEMM and
the fused forward ran at different SM clocks (notebook 12, 7.2: about 1.42, 1.65 and 1.51 GHz),
so part of the epilogue's cost over the bare GEMM would be time per cycle, not cycles. This
measures it instead of deriving it: each forward runs back to back for --window-ms of GPU time
(its clock settles), timed by CUDA events, while a sampler thread reads the SM clock, the power
draw and the clock-throttle reasons through NVML every few ms (nvidia-smi's loop where the NVML
bindings are not installed). Every variant once a round, shuffled, --rounds rounds; per variant
the medians of its rounds: ms a call, SM MHz, W, and ms x MHz (the cycles a call takes).

Llama-3-8B's projection (hidden 4096, 32/8 heads of 128, bf16, table-free angles):

    cublas             F.linear alone
    bare GEMM          the TMA kernel with ROTATE=False (no pre-pass, no epilogue work)
    fused, angles      qkv_rope_linear as shipped (pre-pass, TMA forward, epilogue)
    fused, table       qkv_rope_linear from an angle table
    unfused            F.linear, then ropelib's RoPE on q and k

    python3 benchmarks/qkv_clock_probe.py [--tokens 8192 32768] > qkv_clock.log
"""
import argparse
import random
import statistics as st
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qkv_forward_ab import variants  # noqa: E402

KEEP = {"cublas": "cublas", "GEMM, no epilogue": "bare GEMM", "TMA, two heads": "fused, angles",
        "table, flag": "fused, table", "unfused": "unfused"}
POWER_CAP_BIT = 0x4         # nvmlClocksThrottleReasonSwPowerCap
HW_SLOWDOWN_BITS = 0x8 | 0x40 | 0x80    # hw slowdown, hw thermal, hw power brake


class Sampler:
    """(time.perf_counter(), SM MHz, W, throttle reasons) every `period` s, in a thread."""

    def __init__(self, period: float = 0.004):
        self.samples, self.period, self._stop = [], period, threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.how = "NVML"
            self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3

            def read():
                return (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            self._read = read
        except Exception:  # noqa: BLE001 -- no bindings: nvidia-smi's loop
            self.how, self._read, self.limit_w = "nvidia-smi", None, None

    def _loop(self):
        while not self._stop.is_set():
            t = time.perf_counter()
            self.samples.append((t, *self._read()))
            time.sleep(self.period)

    def _smi(self):
        p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,"
                              "clocks_throttle_reasons.active", "--format=csv,noheader,nounits",
                              "-lms", "10"], stdout=subprocess.PIPE, text=True)
        for line in p.stdout:
            if self._stop.is_set():
                break
            try:
                mhz, w, reasons = (s.strip() for s in line.split(","))
                self.samples.append((time.perf_counter(), float(mhz), float(w), int(reasons, 16)))
            except ValueError:
                continue
        p.terminate()

    def __enter__(self):
        self._t = threading.Thread(target=self._loop if self._read else self._smi, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=2)

    def between(self, t0: float, t1: float) -> list:
        return [s for s in self.samples if t0 <= s[0] <= t1]


def window(fn, ms: float) -> tuple:
    """(ms a call, perf_counter start, end) of fn run back to back for about `ms` of GPU time."""
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    torch.cuda.synchronize()
    n = max(5, int(ms / max(e0.elapsed_time(e1), 1e-3)))
    t0 = time.perf_counter()
    e0.record()
    for _ in range(n):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n, t0, time.perf_counter()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--window-ms", type=float, default=150.0)
    a = ap.parse_args(argv)
    rng = random.Random(0)
    with Sampler() as sampler:
        time.sleep(0.2)
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; clocks and power "
              f"by {sampler.how}" + (f", enforced power limit {sampler.limit_w:.0f} W"
                                     if sampler.limit_w else "") + f"; {a.rounds} shuffled "
              f"rounds, {a.window_ms:.0f} ms of GPU time per variant a round", flush=True)
        idle = sampler.between(0, time.perf_counter())
        if idle:
            print(f"# idle before: SM {st.median(s[1] for s in idle):.0f} MHz, "
                  f"{st.median(s[2] for s in idle):.0f} W", flush=True)
        summary = []
        for tokens in a.tokens:
            fns = {KEEP[k]: v for k, v in variants(tokens, False, 4096, 32, 8, 128).items()
                   if k in KEEP}
            for f in fns.values():
                f()
            got = {n: [] for n in fns}
            for _ in range(a.rounds):
                order = list(fns)
                rng.shuffle(order)
                for n in order:
                    ms, t0, t1 = window(fns[n], a.window_ms)
                    s = sampler.between(t0 + 0.02, t1)     # past the first 20 ms: settled
                    got[n].append((ms, st.median(x[1] for x in s) if s else float("nan"),
                                   st.median(x[2] for x in s) if s else float("nan"),
                                   sum(1 for x in s if x[3] & POWER_CAP_BIT) / max(len(s), 1),
                                   sum(1 for x in s if x[3] & HW_SLOWDOWN_BITS) / max(len(s), 1),
                                   len(s)))
            print(f"\n== {tokens} tokens", flush=True)
            print(f"  {'variant':14s} {'ms a call':>9s} {'SM MHz':>7s} {'W':>6s} "
                  f"{'Mcycles':>8s} {'power-capped':>12s} {'hw slowdown':>11s} {'samples':>7s}")
            for n, v in got.items():
                ms = st.median(x[0] for x in v)
                mhz = st.median(x[1] for x in v)
                w = st.median(x[2] for x in v)
                cap = st.mean(x[3] for x in v)
                hw = st.mean(x[4] for x in v)
                cyc = st.median(x[0] * x[1] / 1e3 for x in v)
                summary.append((tokens, n, ms, mhz, w, cyc))
                print(f"  {n:14s} {ms:9.4f} {mhz:7.0f} {w:6.0f} {cyc:8.3f} {100 * cap:11.0f}% "
                      f"{100 * hw:10.0f}% {sum(x[5] for x in v):7d}", flush=True)
            base = {n: (ms, mhz, cyc) for t, n, ms, mhz, w, cyc in summary if t == tokens}
            for n, ref in (("fused, angles", "bare GEMM"), ("fused, table", "bare GEMM"),
                           ("bare GEMM", "cublas")):
                (m1, c1, y1), (m0, c0, y0) = base[n], base[ref]
                print(f"  {n} / {ref}: time {m1 / m0:.3f} = cycles {y1 / y0:.3f} x clock "
                      f"{c0 / c1:.3f} (slower clock above 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
