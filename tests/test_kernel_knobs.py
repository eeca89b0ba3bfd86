"""The finished kernel's knobs (kernels/fused.py: X_FIRST_PAIRS, NO_HALVES_CHECK_PAIRS) change
only the order of its work, never its bits: with each set so that no tile takes its branch, and
so that every tile does, the outputs and gradients are the same, bit for bit, in every kind of
call (benchmarks/finished_kernel_knobs.py times them on a GPU, one Python per setting).

In Triton's interpreter a kernel reads the module's globals when it runs, so a knob can be set
for one test; a compiled kernel reads them when it compiles (a GPU run sets them before any
launch, as the benchmark does)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import runtime  # noqa: E402
from ropelib.bench.routes import forced  # noqa: E402
from ropelib.kernels import fused  # noqa: E402

pytestmark = pytest.mark.skipif(not runtime.INTERPRET, reason="a compiled kernel reads the knobs "
                                "when it compiles: set them before the first launch, as "
                                "benchmarks/finished_kernel_knobs.py does")

D = 16
CALLS = {
    "sbhd decode": lambda g: (dict(x=torch.randn(1, 6, 3, D, generator=g)), {}),
    "bshd, 16-bit": lambda g: (dict(x=torch.randn(3, 5, 2, D, generator=g).to(torch.bfloat16)),
                               dict(layout="bshd")),
    "thd packed, start positions": lambda g: (
        dict(x=torch.randn(9, 2, D, generator=g)),
        dict(layout="thd", cu_seqlens=torch.tensor([0, 2, 2, 9], dtype=torch.int32),
             start_positions=torch.tensor([1, 0, 3]))),
    "sbhd start positions, interleaved": lambda g: (
        dict(x=torch.randn(2, 3, 2, D, generator=g)),
        dict(start_positions=torch.tensor([0, 2, 5]), interleaved=True)),
    "sbhd position ids, partial rotary": lambda g: (
        dict(x=torch.randn(4, 2, 2, D, generator=g)),
        dict(position_ids=torch.tensor([[0, 3, 1, 2], [5, 4, 0, 1]]), rotary=D // 2)),
}
KNOBS = ("X_FIRST_PAIRS", "NO_HALVES_CHECK_PAIRS")     # 0: no tile; 1 << 30: every tile


def _run(make, seed=0):
    g = torch.Generator().manual_seed(seed)
    inputs, kw = make(g)
    rotary = kw.pop("rotary", D)
    freqs = ropelib.rope_freqs(16, rotary, interleaved=kw.get("interleaved", False))
    x = inputs["x"].requires_grad_(True)
    with forced("finished"):
        y = ropelib.apply_rope(x, freqs, **kw)
        dy = torch.randn(y.shape, generator=g).to(y.dtype)
        (gx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), gx


@pytest.mark.parametrize("knob", KNOBS)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_knob_changes_no_bit(knob, call, monkeypatch):
    monkeypatch.setattr(fused, knob, tl.constexpr(0))
    want = _run(CALLS[call])
    monkeypatch.setattr(fused, knob, tl.constexpr(1 << 30))
    got = _run(CALLS[call])
    for a, b in zip(got, want):
        assert torch.equal(a, b), (knob, call)


def test_the_knobs_are_at_their_measured_values():
    # 512 pairs: decode's tiles load x first (H200: 0.65 -> 0.72 of a copy under CUDA graphs);
    # 0: every tile compares the halves of its angles, as measured
    assert (int(fused.X_FIRST_PAIRS), int(fused.NO_HALVES_CHECK_PAIRS)) == (512, 0)
