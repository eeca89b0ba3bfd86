"""What Dynamo's guards cost a compiled ropelib call (a CPU is enough; a GPU works too).

Every call of a `torch.compile`d function first checks the guards Dynamo installed while tracing
it: one for every tensor's dtype, shape and strides, and one for every global, module attribute,
function's code object and default argument that the traced Python read. Tracing through
ropelib's public function reads its checks, so its graph carries guards that an Inductor-only
graph does not (ropelib/api.py `checked_call` is written to read few). This probe compiles four
functions of (q, k, freqs) with the `eager` backend (the guards do not depend on the backend),
then times each one's guard check alone (`guard_manager.check` on the frame's locals, best of
--rounds rounds of --calls checks) and counts its leaf guards, apply_rope's by the function
whose line installed them.

    TRITON_INTERPRET=1 python benchmarks/compiled_guard_probe.py
"""
import argparse
import collections
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ropelib  # noqa: E402
from eager_python_pieces import best_us  # noqa: E402  (best of rounds, µs a call)

LEAF = re.compile(r"\+- ([A-Z_]+):")
INSTALLED_BY = re.compile(r"ropelib/[\w/]+\.py[:\d]* in (\w+)")   # a guard's source line


def graphs():
    return {"q + 0 (q only)": lambda q, k, f: q + 0,
            "q * f[0] (q and f)": lambda q, k, f: q * f[0, 0, 0, 0],
            "ropelib.apply_rope": lambda q, k, f: ropelib.apply_rope(q, f),
            "ropelib.apply_rope_qk": lambda q, k, f: ropelib.apply_rope_qk(q, k, f)}


def guard_tree(fn, q, k, f):
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    compiled(q, k, f)
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(fn.__code__)
    return entries[0].guard_manager


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(1, 64, 32, 128, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, 64, 8, 128, device=device, dtype=torch.bfloat16)     # GQA: 8 kv heads
    f = ropelib.rope_freqs(4096, 128, device=device)
    where = "GPU " + torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"# {where}, torch {torch.__version__}; guard check alone, best of {args.rounds} "
          f"rounds of {args.calls}, µs a call")
    by_function = None
    for name, fn in graphs().items():
        manager = guard_tree(fn, q, k, f)
        frame = {"q": q, "k": k, "f": f}
        assert manager.check(frame)
        leaves = [line for line in str(manager).splitlines() if LEAF.search(line)]
        us = best_us(lambda: manager.check(frame), args.calls, args.rounds)
        print(f"{name:22s} {len(leaves):4d} leaf guards   {us:6.2f} µs")
        if name == "ropelib.apply_rope":
            found = (INSTALLED_BY.search(line) for line in leaves)
            by_function = collections.Counter(m.group(1) for m in found if m)
    print("ropelib's leaf guards by the function whose line installed them:",
          ", ".join(f"{name} {n}" for name, n in by_function.most_common()))


if __name__ == "__main__":
    main()
