"""Forward+backward at 64 and 256 MiB: the host or the kernels, and which kernel (GPU).

The floor's eager forward+backward rows at 64 MiB (s1024 b8 h32 d128 bf16, each layout) and
256 MiB bshd come out far below the forward's ratio, and its rows under CUDA graphs put
ropelib below torch.compile's kernel of Hugging Face's formula in bshd and thd. This probe
takes each of those calls apart, every provider (ropelib, torch.compile, TE fused where
installed) in the same process, in alternating rounds:

* `fwd graph`, `fwdbwd graph`: the forward, and the forward+backward (gradients handed back,
  `compare.fwdbwd_step`), replayed from a CUDA graph: device time per call, no host in it;
  `copy` and `copy pair`: one and two device copies of the same bytes captured the same way;
* `host enqueue`: host µs per eager forward+backward, measured as the time to issue 50 calls
  back to back with no synchronisation after them (the launch queue holds them all), divided
  by 50: what the host spends, whatever the device does;
* `eager`: µs per eager forward+backward, 50 calls back to back then a synchronisation (what
  the floor's eager rows time): the larger of the host's time and the device's;
* the device kernels of one eager forward+backward, by name, from torch.profiler.

`--variants`: ropelib alone under CUDA graphs, its flat pass launched early after the pre-pass
or not, with the pre-pass's (token, pair) entries per program at 1024, 256, 128 or 64 (these
cases and 1 GiB sbhd).

    python3 benchmarks/mid_fwdbwd_probe.py [--rounds 3] > mid_fwdbwd.log
    python3 benchmarks/mid_fwdbwd_probe.py --variants > mid_fwdbwd_variants.log
"""
import argparse
import statistics as st
import sys

import torch

try:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
except Exception:  # noqa: BLE001
    pass

from ropelib.bench import compare, suite
from ropelib.course.launch_queue import enqueue_us
from ropelib.course.probe_timers import fwdbwd_steps

CASES = (("64 MiB bf16 sbhd", dict(seq_len=1024, layout="sbhd")),
         ("64 MiB bf16 bshd", dict(seq_len=1024, layout="bshd")),
         ("64 MiB bf16 thd", dict(seq_len=1024, layout="thd")),
         ("256 MiB bf16 bshd", dict(seq_len=4096, layout="bshd")))
PROVIDERS = ("ropelib", "torch.compile", "te_fused")
ENQUEUED = 50


def kernels_of(step) -> list:
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as p:
        step()
        torch.cuda.synchronize()
    found = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA
             and not e.is_user_annotation]
    return [(e.name, e.device_time_total) for e in sorted(found, key=lambda e: e.time_range.start)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dev = "cuda"
    suite.warm_allocator(16)
    by_name = {p.name: p for p in compare.providers()}
    summary = []
    for label, fields in CASES:
        config = compare.Config(**dict(dict(batch=8, heads=32, head_dim=128, dtype="bf16"),
                                       **fields))
        case = compare.make_case(config, dev, seed=1)
        copy_once, copy_twice = compare.copy_floor(case.tensors)
        steps = {name: (lambda p=by_name[name]: p.fn(case), fwdbwd)       # (forward, fwd+bwd)
                 for name, fwdbwd in fwdbwd_steps(case, by_name.values(), PROVIDERS).items()}
        per = {}
        for r in range(args.rounds):
            per.setdefault(("copy", "graph"), []).append(
                1e3 * suite.graph_replay_ms(copy_once, 20, dev)[0])
            per.setdefault(("copy pair", "graph"), []).append(
                1e3 * suite.graph_replay_ms(copy_twice, 20, dev)[0])
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for name in order:
                fwd, fwdbwd = steps[name]
                for way, timer in (("fwd graph", lambda: suite.graph_replay_ms(fwd, 20, dev)[0]
                                    * 1e3),
                                   ("fwdbwd graph", lambda: suite.graph_replay_ms(
                                       fwdbwd, 20, dev)[0] * 1e3),
                                   ("host enqueue", lambda: enqueue_us(fwdbwd, ENQUEUED)),
                                   ("eager", lambda: suite.host_us(fwdbwd, ENQUEUED, reps=1,
                                                                   warmup=0, device=dev))):
                    try:
                        per.setdefault((name, way), []).append(timer())
                    except Exception as e:  # noqa: BLE001 -- said, the way left out
                        print(f"{label} {name} {way}: {type(e).__name__}: {str(e)[:160]}",
                              flush=True)
                        torch.cuda.synchronize()
        copy1 = st.median(per[("copy", "graph")])
        copy2 = st.median(per[("copy pair", "graph")])
        print(f"\n== {label}: copy {copy1:.1f} us, copy pair {copy2:.1f} us (graphs)", flush=True)
        for name in steps:
            got = {way: st.median(v) for (n, way), v in per.items() if n == name}
            spread = {way: (min(v), max(v)) for (n, way), v in per.items() if n == name}
            fwd_g, fb_g = got.get("fwd graph"), got.get("fwdbwd graph")
            row = dict(case=label, provider=name, **got,
                       fwd_ratio=copy1 / fwd_g if fwd_g else None,
                       fwdbwd_ratio=copy2 / fb_g if fb_g else None,
                       bwd_alone=(fb_g - fwd_g) if fb_g and fwd_g else None)
            row["bwd_ratio"] = copy1 / row["bwd_alone"] if row["bwd_alone"] else None
            summary.append(row)
            print(f"{name:14s} " + ", ".join(
                f"{w} {v:.1f} us ({spread[w][0]:.1f}-{spread[w][1]:.1f})" for w, v in got.items()))
            for kname, us in kernels_of(steps[name][1]):
                print(f"    {us:9.1f} us  {kname[:110]}")
    print(f"\n{'case':20s} {'provider':14s} {'fwd/copy':>8s} {'bwd/copy':>8s} {'f+b/pair':>8s} "
          f"{'enqueue us':>10s} {'eager us':>9s} {'f+b graph us':>12s}")
    for r in summary:
        def f(v, spec):
            return format(v, spec) if v is not None else "-"
        print(f"{r['case']:20s} {r['provider']:14s} {f(r['fwd_ratio'], '8.3f')} "
              f"{f(r['bwd_ratio'], '8.3f')} {f(r['fwdbwd_ratio'], '8.3f')} "
              f"{f(r.get('host enqueue'), '10.1f')} {f(r.get('eager'), '9.1f')} "
              f"{f(r.get('fwdbwd graph'), '12.1f')}")


def variants(rounds: int):
    """ropelib's forward and forward+backward under CUDA graphs with the flat pass launched early
    or not (tiles.EARLY_LAUNCH) and the pre-pass's (token, pair) entries per program
    (launch.TWO_PASS_TABLE_ELEMENTS), every variant in every round, order alternating."""
    from ropelib import eager
    from ropelib.kernels import launch, tiles
    dev = "cuda"
    suite.warm_allocator(16)
    ropelib_p = next(p for p in compare.providers() if p.name == "ropelib")
    settings = {f"early {e}, {n} a program": (e, n) for e in (False, True)
                for n in (1024, 256, 128, 64)}
    saved = tiles.EARLY_LAUNCH, launch.TWO_PASS_TABLE_ELEMENTS
    table = []
    for label, fields in CASES + (("1 GiB bf16 sbhd", dict(seq_len=16384)),):
        config = compare.Config(**dict(dict(batch=8, heads=32, head_dim=128, dtype="bf16"),
                                       **fields))
        case = compare.make_case(config, dev, seed=1)
        copy_once, copy_twice = compare.copy_floor(case.tensors)
        per = {}
        for r in range(rounds):
            per.setdefault("copy", []).append(1e3 * suite.graph_replay_ms(copy_once, 20, dev)[0])
            per.setdefault("copy pair", []).append(
                1e3 * suite.graph_replay_ms(copy_twice, 20, dev)[0])
            names = list(settings) if r % 2 == 0 else list(reversed(settings))
            for name in names:
                early, per_program = settings[name]
                tiles.EARLY_LAUNCH, launch.TWO_PASS_TABLE_ELEMENTS = early, per_program
                eager.SIGNATURES.clear()
                gcase, leaves, grads = compare.fwdbwd_inputs(case, fill=0.5)
                step = compare.fwdbwd_step(lambda g=gcase: ropelib_p.fn(g), leaves, grads)
                per.setdefault((name, "fwd"), []).append(
                    1e3 * suite.graph_replay_ms(lambda: ropelib_p.fn(case), 20, dev)[0])
                per.setdefault((name, "fwdbwd"), []).append(
                    1e3 * suite.graph_replay_ms(step, 20, dev)[0])
        copy1, copy2 = st.median(per["copy"]), st.median(per["copy pair"])
        for name in settings:
            fwd, fb = st.median(per[(name, "fwd")]), st.median(per[(name, "fwdbwd")])
            table.append((label, name, fwd, copy1 / fwd, fb, copy2 / fb,
                          min(per[(name, "fwd")]), max(per[(name, "fwd")])))
            print(f"{label:20s} {name:24s} fwd {fwd:7.1f} us ({copy1 / fwd:.3f})  fwd+bwd "
                  f"{fb:7.1f} us ({copy2 / fb:.3f})", flush=True)
    tiles.EARLY_LAUNCH, launch.TWO_PASS_TABLE_ELEMENTS = saved
    print(f"\n{'case':20s} {'variant':24s} {'fwd us':>8s} {'fwd/copy':>8s} {'f+b us':>8s} "
          f"{'f+b/pair':>8s}")
    for label, name, fwd, rf, fb, rfb, lo, hi in table:
        print(f"{label:20s} {name:24s} {fwd:8.1f} {rf:8.3f} {fb:8.1f} {rfb:8.3f}")


if __name__ == "__main__":
    if "--variants" in sys.argv[1:]:
        variants(3)
    else:
        main()
