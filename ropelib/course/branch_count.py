"""Which way the finished kernel's equal-halves branch goes for a call (notebook 05), no GPU.

`load_table` (ropelib/kernels/common.py) evaluates cos and sin of a tile's first halves, then of
its second halves only where the two differ bit for bit (an angle table that repeats every
frequency in both members of a pair, as TE's cat([f, f]) does, needs one evaluation). Which way
that branch goes depends on the table's bits alone, the same on a GPU as here, so Triton's
interpreter, which runs a kernel as Python, can count it: `sin_cos_evaluations` counts the calls
of common.cos_sin one launch of the finished kernel makes, one or two per program. In a process
that compiles kernels for a GPU the count runs in a second Python with TRITON_INTERPRET=1.
"""
import json
import os
import subprocess
import sys
from math import prod
from pathlib import Path

from ..runtime import INTERPRET

__all__ = ["sin_cos_evaluations"]


def sin_cos_evaluations(S: int, B: int, H: int, D: int, *, equal_halves: bool = True,
                        tiles: tuple = None) -> dict:
    """One forward launch of the finished kernel on bf16 x [S, B, H, D] (sbhd) with TE's angle
    table (equal halves) or one whose second halves differ: {"programs": its grid's size,
    "evaluations": calls of cos_sin}. `tiles`: (BLOCK_S, BLOCK_H, batch entries per program,
    warps), as the planner would pick them on a GPU (the interpreter's own are larger)."""
    for name, v in (("S", S), ("B", B), ("H", H), ("D", D)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if D % 2:
        raise ValueError(f"D must be even (pairs of features), got {D}")
    if INTERPRET:
        return _count(S, B, H, D, equal_halves, tiles)
    request = json.dumps(dict(S=S, B=B, H=H, D=D, equal_halves=equal_halves,
                              tiles=list(tiles) if tiles else None))
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import json, sys; from ropelib.course.branch_count import _count; "
            "r = json.loads(sys.argv[1]); t = r.pop('tiles'); "
            "print(json.dumps(_count(**r, tiles=tuple(t) if t else None)))")
    done = subprocess.run([sys.executable, "-c", code, request], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"counting in the interpreter failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _count(S, B, H, D, equal_halves, tiles):
    import torch

    from ..bench import compare
    from ..kernels import common
    from ..kernels import launch as L
    x = torch.randn(S, B, H, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    freqs = compare.angles(S, D).view(S, D).contiguous()
    if not equal_halves:
        freqs[:, D // 2:] += 1e-3
    route, pointers = L.plan(L.View.of(x), L.View.of(torch.empty_like(x)), L.Table(freqs, None),
                             L.Positions(), R=D, interleaved=False, backward=False,
                             layout="sbhd", tiles=tiles)
    calls = []
    scope = common.load_table.fn.__globals__      # the interpreter reads them at every call
    real = scope["cos_sin"]

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    scope["cos_sin"] = counted
    try:
        L.run(route, pointers)
    finally:
        scope["cos_sin"] = real
    return {"programs": prod(route.grid), "evaluations": len(calls)}
