"""Which layer of a compiled call holds the host cost of ropelib's launch (GPU).

compiled_launch_cost.py times whole compiled calls: at decode size a graph with one ropelib
launch costs about 14 µs more than a graph with one of Inductor's own kernels, and a second
ropelib launch about 15 µs more again, where a user-defined Triton copy of 24 arguments costs 3.
A cProfile of those calls (compiled_launch_profile.py) shows the Python of each launch about
equal. This probe peels the layers apart, timing each one alone in a loop (best of rounds, the
graphs taking turns):

    compiled   the torch.compile'd function: Dynamo's guards, AOTAutograd's wrappers, call()
    call       the generated module's call(args) alone: allocations, size asserts, launches
    run        each kernel's CachingAutotuner.run(...) with the arguments call() gave it
    launcher   the launcher run() picks (Triton's generated launcher, or Inductor's static one)

and asks Inductor's static launcher whether it would take each user-defined kernel (the reason
it gives when not: Inductor launches its own kernels statically, which costs less host time).

    python benchmarks/compiled_call_probe.py [--calls 2000] [--rounds 5]
"""
import argparse
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ropelib  # noqa: E402
from compiled_launch_cost import _copy_ops, rotate_half  # noqa: E402
from ropelib.bench.suite import host_us_interleaved  # noqa: E402


def _modules():
    from torch._inductor.codecache import PyCodeCache
    mods = PyCodeCache.modules
    return list(mods.values()) if isinstance(mods, dict) else list(mods)


def _kernels(mod) -> dict:
    """The module's kernels: {name: CachingAutotuner}."""
    return {n: v for n, v in vars(mod).items()
            if hasattr(v, "launchers") and callable(getattr(v, "run", None))}


class _LauncherSpy:
    """A kernel's launcher that records its first call's arguments; every attribute is the
    launcher's own (CachingAutotuner.run reads some, e.g. `config`, before it launches)."""

    def __init__(self, name, launcher, recorded):
        self._name, self._launcher, self._recorded = name, launcher, recorded

    def __getattr__(self, attr):
        return getattr(self._launcher, attr)

    def __call__(self, *a, **kw):
        r = self._recorded.get(self._name)
        if r is not None and r[3] is None:
            r[3:] = [self._launcher, a, kw]
        return self._launcher(*a, **kw)


def compile_graph(fn, inputs):
    """(compiled fn, generated module, {kernel name: (autotuner, args, kwargs, launcher,
    launcher args, launcher kwargs)}): the module found as the one new in Inductor's code cache
    that has call(); each kernel's arguments recorded from one call of call()."""
    before = {id(m) for m in _modules()}
    compiled = torch.compile(fn, fullgraph=True)
    compiled(*inputs)
    new = [m for m in _modules() if id(m) not in before and hasattr(m, "call")]
    if len(new) != 1:
        raise RuntimeError(f"expected one new generated module, found {len(new)}")
    mod = new[0]
    recorded = {}
    spies = []
    for name, k in _kernels(mod).items():
        k.precompile() if not k.launchers else None
        launcher = k.launchers[0]

        def run_spy(*a, _k=k, _name=name, _run=k.run, **kw):
            recorded.setdefault(_name, [_k, a, kw, None, None, None])
            return _run(*a, **kw)

        k.run = run_spy
        k.launchers[0] = _LauncherSpy(name, launcher, recorded)
        spies.append((k, launcher))
    mod.call(list(inputs))
    for k, launcher in spies:
        del k.run
        k.launchers[0] = launcher
    torch.cuda.synchronize()
    return compiled, mod, recorded


def static_verdict(autotuner) -> str:
    """Would Inductor's static launcher take this kernel? 'yes', or the reason it refuses."""
    try:
        from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
    except ImportError as e:
        return f"no static launcher in this torch ({e})"
    launcher = autotuner.launchers[0]
    if type(launcher).__name__.startswith("Static") or "static" in repr(launcher).lower():
        return "yes (in use)"
    binary = getattr(launcher, "bin", None) or getattr(launcher, "__globals__", {}).get("bin")
    if binary is None:
        return "unknown (the launcher has no compiled kernel attached)"
    try:
        StaticallyLaunchedCudaKernel(binary)
    except Exception as e:  # noqa: BLE001
        return f"refused: {type(e).__name__}: {str(e)[:200]}"
    return "yes (it would take it; Inductor did not try)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    refusals = []
    torch._inductor.config.fx_graph_cache = False     # each graph generates its own module

    class Keep(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if "static" in msg.lower():
                refusals.append(msg[:300])
    for name in ("torch._inductor.runtime.triton_heuristics", "torch._inductor"):
        lg = logging.getLogger(name)
        lg.setLevel(logging.DEBUG)
        lg.addHandler(Keep())

    dt = torch.bfloat16
    q = torch.randn(1, 64, 32, 128, device="cuda", dtype=dt)
    f = ropelib.rope_freqs(4096, 128, device="cuda")
    cos = torch.cos(f[:1, 0, 0]).to(dt)[:, None, None]
    sin = torch.sin(f[:1, 0, 0]).to(dt)[:, None, None]
    _, copy24 = _copy_ops()
    graphs = {
        "empty (q + 0)": (lambda q: q + 0, (q,)),
        "inductor rope": (lambda q, c, s: q * c + rotate_half(q) * s, (q, cos, sin)),
        "copy, 24 args": (lambda q: copy24(q), (q,)),
        "ropelib": (lambda q, f: ropelib.apply_rope(q, f), (q, f)),
        "two ropelib": (lambda q, f: ropelib.apply_rope(ropelib.apply_rope(q, f), f), (q, f)),
        "ropelib, static": (lambda q, f: ropelib.apply_rope(q, f), (q, f)),
    }
    rows = {}
    with torch.no_grad():
        for gname, (fn, inputs) in graphs.items():
            torch._dynamo.reset()
            with torch._inductor.config.patch(
                    static_launch_user_defined_triton_kernels=gname.endswith(", static")):
                compiled, mod, recorded = compile_graph(fn, inputs)
            layers = {"compiled": lambda c=compiled, a=inputs: c(*a),
                      "call": lambda m=mod, a=inputs: m.call(list(a))}
            for kname, (k, a, kw, launcher, la, lkw) in recorded.items():
                layers[f"run {kname}"] = lambda k=k, a=a, kw=kw: k.run(*a, **kw)
                if launcher is not None:
                    layers[f"launcher {kname}"] = lambda l=launcher, a=la, kw=lkw: l(*a, **kw)
            rows[gname] = (layers, {kname: static_verdict(r[0]) for kname, r in recorded.items()},
                           {kname: len(r[1]) for kname, r in recorded.items()})
        # every layer of every graph taking turns, round by round; the best of the rounds
        us = host_us_interleaved({(g, n): (fn, args.calls) for g, (layers, _, _) in rows.items()
                                  for n, fn in layers.items()}, reps=args.rounds)
    gpu = torch.cuda.get_device_name()
    try:
        import triton
        hook = triton.knobs.runtime.launch_enter_hook
    except AttributeError:
        hook = "unknown"
    print(f"Triton's launch_enter_hook: {hook!r} (when set, every launch builds its metadata)")
    print(f"{gpu}, torch {torch.__version__}: host µs per call, best of {args.rounds} rounds "
          f"of {args.calls} calls, decode size s1 b64 h32 d128 bf16")
    print(f"{'graph':16s} {'layer':44s} {'µs':>7s}")
    for g, (layers, verdicts, nargs) in rows.items():
        for n in layers:
            v = us[g, n]
            print(f"{g:16s} {n:44s} " + (f"{v:7.2f}" if isinstance(v, float) else
                                         f"failed ({type(v).__name__}: {str(v)[:80]})"))
        for kname, v in verdicts.items():
            print(f"{g:16s} {kname}: {nargs[kname]} run() arguments; static launcher: {v}")
    if refusals:
        print("Inductor's log lines about the static launcher:")
        for line in dict.fromkeys(refusals):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
