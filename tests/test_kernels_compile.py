"""Every product kernel compiles for an sm_90 GPU through Triton's own compiler, on the CPU, in
the variants the planners produce (tests/gpu_compile_check.py). The interpreter runs kernels as
Python, so only this catches what the GPU compiler rejects before a GPU sees the code. Each
kernel's width is held at most where it stands (narrower is the direction of travel), and every
rotation is written as fmas (the kernels' explicit fma order)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# arguments per kernel (pointers, sizes, strides and constexprs): every product kernel at most
# 32, so that a launch binds few (benchmarks/launch_cost.py: about 0.5 µs of host time each);
# the finished RoPE kernels' 33rd is a constexpr (X_FIRST: the planner's choice of load order
# and a short chunk's entries, compiled in), and so is the KV-cache kernels' (ENTRIES: a GPU
# program's batch entries, compiled in so that it finds them without a division); the QK-norm
# backward's 33rd is N_SEQ, the count of packed sequences whose cu_seqlens it searches, and
# its 34th a constexpr (TOKEN_BLOCKS: the token blocks a program takes before it writes its
# partial sums of the weights' gradient, compiled in: 1 is the loop-free kernel); the
# two-pass route's flat pass has 30, its 29th and 30th constexprs (WAIT_PRIOR: launched early
# after the pre-pass, it waits for the pre-pass's rows; PAIRS_EQUAL: kept rows with no
# differing pair, member b's entries never loaded), and its pre-pass 22 (EARLY_DEPENDENTS).
# The finished RoPE kernels' 34th and the QK-norm backward's 35th are constexprs too (OUT_ROW,
# GX_ROW: outputs stored into column slices of one token-major buffer, the QKV projection's dY;
# 0 compiles the kernel as it was)
WIDEST = {"rope": 34, "kv-cache": 33, "qk-norm": 35, "multi-axis": 32, "qkv-linear": 32,
          "two-pass": 30}


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("gpu_compile_check.py")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return {line.split()[0]: tuple(int(v) for v in line.split()[1:])
            for line in run.stdout.splitlines() if line.strip()}


def test_every_variant_compiles_for_the_gpu(compiled):
    assert len(compiled) == 43, compiled


@pytest.mark.parametrize("family", sorted(WIDEST))
def test_kernels_are_no_wider_than_they_were(compiled, family):
    widths = {n for name, (n, _) in compiled.items() if name.startswith(family)}
    assert widths and max(widths) <= WIDEST[family], (family, widths)


def test_rotations_are_fmas(compiled):
    # (the two-pass route's pre-pass, "-table", only evaluates cos and sin, and its index pass,
    # "-index", finds each token's row: they rotate nothing)
    assert all(fmas > 0 for name, (_, fmas) in compiled.items()
               if not name.endswith(("-table", "-index", "-bare"))), compiled
    # the QKV projection's bare GEMM, "-bare" (ROTATE=False, the benchmarks' baseline), has no
    # rotation compiled in at all: no epilogue's branch of it left in the code
    bare = {name: fmas for name, (_, fmas) in compiled.items() if name.endswith("-bare")}
    assert bare and all(fmas == 0 for fmas in bare.values()), bare


# The out-of-table guard (common.nan_unless) is made once per table element. Made on each output
# as `tl.where(valid, y, nan)`, or on the table as a plain select that LLVM then folds into the
# fmas reading it, it compiles to a select of every bf16 output against a bf16 NaN (`SEL ...,
# 0x7fc0`), with byte permutes to unpack and repack the rounded halves around it: on an H200 one
# SEL and 1.5 PRMT an element (benchmarks/NOTES.md, "The out-of-table guard made once per table
# element"). This compiles the finished kernel at notebook 05's profiled tile, with and without
# position ids, and the QK-norm + RoPE forward, for sm_90 (load_schedule.schedule), and counts
# those selects.
def _nan_selects(planned, pointers) -> int:
    from ropelib.course import load_schedule
    args = dict(zip(planned.launcher.pointer_names, pointers), **planned.args)
    sass = load_schedule.schedule(planned.launcher.kernel, args, **planned.options())["sass"]
    return sum(bool(re.search(r"\bSEL\b.*0x7fc0", ins)) for ins in sass)


def test_the_nan_guard_is_not_a_select_of_every_output():
    import torch
    import ropelib
    from ropelib.kernels import launch as L
    from ropelib.kernels import qk_norm_rope as QK
    S, B, H, D = 64, 8, 32, 128
    x = torch.empty(S, B, H, D, dtype=torch.bfloat16)
    f = ropelib.rope_freqs(S, D)[:, 0, 0]
    counts = {}
    for name, pos in (("plain", L.Positions()),
                      ("position-ids", L.Positions(position_ids=torch.zeros(1, S,
                                                                            dtype=torch.int64)))):
        planned, ptrs = L.plan(L.View.of(x), L.View.of(torch.empty_like(x)), L.Table(f, None),
                               pos, R=D, interleaved=False, backward=False, layout="sbhd",
                               tiles=(1, 32, 8, 8))
        counts[name] = _nan_selects(planned, ptrs)
    q, k = x.transpose(0, 1), torch.empty(B, S, 8, D, dtype=torch.bfloat16)
    w = torch.ones(D)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    planned = QK.plan(q, k, qo, ko, w, w, f, None, None, layout="bshd", interleaved=False,
                      eps=1e-6, weight_offset=0.0)
    counts["qk-norm"] = _nan_selects(planned, QK.pointers(planned, q, k, qo, ko, w, w, f, None,
                                                          None, None, None, QK.partials(planned)))
    assert counts == {"plain": 0, "position-ids": 0, "qk-norm": 0}, counts
