"""ropelib.course.nb06_compiled: section 2's kernel compiled for sm_90 without a GPU."""
import pytest

from ropelib.course import measured, nb06_compiled


@pytest.mark.parametrize("warps,variant", [(1, "sh_loop_b_w1"), (4, "sh_loop_b_w4")])
def test_backward_has_the_profiled_forwards_accesses(warps, variant):
    # the committed H200 profile's PTX row of the forward at these warps
    want = measured.mechanism("s4096-b8")[variant]["ptx_access_detail"]
    assert nb06_compiled.global_accesses(warps, backward=True) == want
