"""Notebook 02, section 6: the four Triton multiplies that split PyTorch's non-vectorized
template (ropelib.course.nb02_narrow_loads): each computes x * c, and compiled for sm_90 each
forms its accesses as the notebook says (wide, one element a lane, that by a division, and
that one element in flight: a lane's loads and stores in turn)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib import default_device  # noqa: E402
from ropelib.course import nb02_narrow_loads as nl  # noqa: E402


@pytest.mark.parametrize("mode", list(nl.MODES))
@pytest.mark.parametrize("shape", [(16, 2, 3, 32), (5, 1, 1, 100)])   # 500: a partial program
def test_each_mode_multiplies(mode, shape):
    g = torch.Generator().manual_seed(0)
    x, c = (torch.randn(shape, generator=g).to(default_device(), torch.bfloat16) for _ in "xc")
    out = torch.full_like(x, float("nan"))
    torch.testing.assert_close(nl.multiply(x, c, out, mode), x * c)


def test_refuses_a_strided_operand():
    x = torch.randn(4, 8, device=default_device(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        nl.multiply(x.t(), x.t(), torch.empty(8, 4, dtype=x.dtype, device=x.device), "wide")


def test_sm90_code_forms_the_accesses_the_notebook_names():
    code = nl.access_code(torch.bfloat16)
    wide, one, div, in_turn = (code[m] for m in nl.MODES)
    assert wide["per_thread"] == 4 and wide["loads"] == {"ld.global.v2.b32": 2}
    assert wide["stores"] == {"st.global.v2.b32": 1} and wide["divisions"] == 0
    for c in (one, div, in_turn):   # 4 elements a thread, each its own 2-byte access
        assert c["per_thread"] == 1
        assert c["loads"] == {"ld.global.b16": 8} and c["stores"] == {"st.global.b16": 4}
    assert one["divisions"] == in_turn["divisions"] == 0 and div["divisions"] >= 4
    # every load before the first store, but for the last: two loads, a store, four times
    assert wide["order"] == "LLS" and one["order"] == div["order"] == "L" * 8 + "S" * 4
    assert in_turn["order"] == "LLS" * 4
