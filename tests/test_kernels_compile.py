"""Every product kernel compiles for an sm_90 GPU through Triton's own compiler, on the CPU, in
the variants the planners produce (tests/gpu_compile_check.py). The interpreter runs kernels as
Python, so only this catches what the GPU compiler rejects before a GPU sees the code. Each
kernel's width is held at most where it stands (narrower is the direction of travel), and every
rotation is written as fmas (the kernels' explicit fma order)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

# arguments per kernel (pointers, sizes, strides and constexprs): every product kernel at most
# 32, so that a launch binds few (benchmarks/launch_cost.py: about 0.5 µs of host time each);
# the finished RoPE kernels' 33rd is a constexpr (X_FIRST: the planner's choice of load order,
# compiled in, not bound by ropelib's direct launch)
WIDEST = {"rope": 33, "kv-cache": 32, "qk-norm": 32, "multi-axis": 32, "qkv-linear": 32,
          "two-pass": 27}


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
    assert len(compiled) == 37, compiled


@pytest.mark.parametrize("family", sorted(WIDEST))
def test_kernels_are_no_wider_than_they_were(compiled, family):
    widths = {n for name, (n, _) in compiled.items() if name.startswith(family)}
    assert widths and max(widths) <= WIDEST[family], (family, widths)


def test_rotations_are_fmas(compiled):
    # (the two-pass route's pre-pass, "-table", only evaluates cos and sin, and its index pass,
    # "-index", finds each token's row: they rotate nothing)
    assert all(fmas > 0 for name, (_, fmas) in compiled.items()
               if not name.endswith(("-table", "-index"))), compiled
