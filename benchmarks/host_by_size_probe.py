"""Why an eager forward+backward costs the host more at 64 MiB than at decode size (GPU).

The floor's eager forward+backward rows at 64 MiB are the host's time (the kernels take about
70 µs, issuing one call took the host 240-490 µs), where the same call at decode size costs the
host 160-206 µs. This probe issues forward+backward calls back to back (gradients handed back,
`compare.fwdbwd_step`) at decode size, 64 MiB in each layout and 256 MiB bshd, and says where
the host's time goes:

* `enqueue`: host µs per call, 50 calls with no synchronisation after them (best of 5 rounds,
  every variant in each round);
* `device`: µs of GPU time per call over the same 50 calls (CUDA events), to say which side
  bounds the eager loop;
* `in launches`: µs per call spent inside ropelib's eager launches (EagerLaunch.__call__);
* `launches removed`: the enqueue with ropelib's launches replaced by nothing;
* `one thread`: the enqueue with autograd's device thread off (the backward runs on the caller's);
* `aten x*c`: the same step on `x * 1.5`, one ATen kernel each way: what any fwd+bwd pays;
* `te_fused`: Transformer Engine's fused RoPE, where it is installed;
* `torch.compile` (with --compile): Hugging Face's formula compiled (the floor's provider).
  Compiling starts Inductor's worker threads in the process; the first run of this probe
  (2026-12-04, with it) measured every variant slower than a later run without it.

    python3 benchmarks/host_by_size_probe.py [--compile] > host_by_size.log
"""
import argparse
import cProfile
import io
import pstats
import statistics as st
import time

import torch

try:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
except Exception:  # noqa: BLE001
    pass

from ropelib import eager
from ropelib.bench import compare, suite
from ropelib.course.probe_timers import HOST_BY_SIZE_CASES, fwdbwd_steps, without_launches

CALLS, ROUNDS = 50, 5

_launch = eager.EagerLaunch.__call__
_in_launch = [0.0]


def _timed_launch(self, pointers):
    t = time.perf_counter()
    _launch(self, pointers)
    _in_launch[0] += time.perf_counter() - t


def enqueue(step, calls=CALLS):
    """(host µs per call, device µs per call) of `calls` calls back to back."""
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    t1 = time.perf_counter()
    e1.record()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6, e0.elapsed_time(e1) / calls * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true", help="time torch.compile's provider too")
    a = ap.parse_args()
    names = ("ropelib", "te_fused") + (("torch.compile",) if a.compile else ())
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; host us per eager "
          f"forward+backward, best of {ROUNDS} rounds of {CALLS} calls", flush=True)
    suite.warm_allocator(16)
    by_name = {p.name: p for p in compare.providers()}
    rows = []
    for label, config in HOST_BY_SIZE_CASES.items():
        case = compare.make_case(config, "cuda", seed=1)
        steps = fwdbwd_steps(case, by_name.values(), names)
        xa = case.tensors[0].detach().clone().requires_grad_()
        ga = torch.full_like(xa, 0.5)
        steps["aten x*c"] = compare.fwdbwd_step(lambda: xa * 1.5, [xa], [ga])
        variants = dict(steps)

        def one_thread(step=steps["ropelib"]):
            with torch.autograd.set_multithreading_enabled(False):
                return step()
        variants["ropelib, launches removed"] = without_launches(steps["ropelib"], replan=False)
        for name in list(steps):
            variants[f"{name}, one thread"] = lambda s=steps[name]: one_thread(s)
        for fn in variants.values():
            for _ in range(10):
                fn()
        torch.cuda.synchronize()
        got = {n: [] for n in variants}
        launch_us = []
        for r in range(ROUNDS):
            for n in (list(variants) if r % 2 == 0 else reversed(list(variants))):
                got[n].append(enqueue(variants[n]))
            eager.EagerLaunch.__call__ = _timed_launch
            _in_launch[0] = 0.0
            h, _ = enqueue(steps["ropelib"])
            eager.EagerLaunch.__call__ = _launch
            launch_us.append((_in_launch[0] / CALLS * 1e6, h))
        print(f"\n== {label} ({' x '.join(map(str, case.tensors[0].shape))}, bf16)", flush=True)
        for n, v in got.items():
            host = min(h for h, _ in v)
            dev = st.median(d for _, d in v)
            print(f"  {n:28s} enqueue {host:7.1f} us (median {st.median(h for h, _ in v):7.1f})"
                  f"   device {dev:7.1f} us", flush=True)
            rows.append((label, n, host, dev))
        best = min(launch_us, key=lambda t: t[1])
        print(f"  ropelib: {best[0]:.1f} us of a {best[1]:.1f} us call inside its launches "
              f"(best round)")
        rows.append((label, "ropelib: in launches", best[0], None))
        if label.startswith("64 MiB sbhd") or label.startswith("decode"):
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(CALLS):
                steps["ropelib"]()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
            print("  cProfile, ropelib, 50 calls:\n" + "\n".join(
                "    " + line[:150] for line in s.getvalue().splitlines() if line.strip()))
    print(f"\n{'case':22s} {'variant':28s} {'host us':>8s} {'device us':>9s}")
    for label, n, host, dev in rows:
        print(f"{label:22s} {n:28s} {host:8.1f} {'' if dev is None else format(dev, '9.1f')}")


if __name__ == "__main__":
    main()
