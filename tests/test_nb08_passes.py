"""Notebook 08, section 4b step e: the pass that orders the reproduction kernel's sum
`y2 = x2 * c + x1 * s` in the LLVM IR, and the source order that does not decide it
(ropelib.course.nb08_passes), compiled for sm_90 on the CPU."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib.course import nb08_passes  # noqa: E402

DUMP = """; *** IR Dump After FirstPass on [module] ***
define void @_rope_unsloth_repro_kernel(ptr %p) {
  %1 = fpext bfloat %a to float
  %2 = fpext bfloat %b to float
  %3 = fmul float %c, %1
  %4 = fmul float %s, %2
  %5 = fsub float %3, %4
  %6 = fmul float %c, %2
  %7 = fmul float %s, %1
  %8 = fadd float %6, %7
  ret void
}
; *** IR Dump After QuietPass on _rope_unsloth_repro_kernel ***
define void @_rope_unsloth_repro_kernel(ptr %p) {
  %1 = fpext bfloat %a to float
  %2 = fpext bfloat %b to float
  %3 = fmul float %1, %c
  %4 = fmul float %2, %s
  %5 = fsub float %3, %4
  %6 = fmul float %2, %c
  %7 = fmul float %1, %s
  %8 = fadd float %6, %7
  ret void
}
; *** IR Dump After SwapPass on _rope_unsloth_repro_kernel ***
define void @_rope_unsloth_repro_kernel(ptr %p) {
  %1 = fpext bfloat %a to float
  %2 = fpext bfloat %b to float
  %3 = fmul float %c, %1
  %4 = fmul float %s, %2
  %5 = fsub float %3, %4
  %6 = fmul float %c, %2
  %7 = fmul float %s, %1
  %8 = fadd float %7, %6
  ret void
}
; *** IR Dump After OtherFunction on __nv_sinf ***
define float @__nv_sinf(float %x) {
  ret float %x
}
"""


def test_pass_trace_names_the_pass_that_changed_the_order():
    # the factors' own order does not count; only the order of the sum's two products
    assert nb08_passes.pass_trace(DUMP) == [("FirstPass on [module]", "x2 * c + x1 * s"),
                                            ("SwapPass on _rope_unsloth_repro_kernel",
                                             "x1 * s + x2 * c")]


def test_reassociate_orders_y2_and_the_source_order_does_not_decide():
    as_written, swapped = nb08_passes.repro_trace(False), nb08_passes.repro_trace(True)
    # as written: Triton's IR keeps the source order; LLVM's Reassociate pass swaps it
    assert [order for _, order in as_written["passes"]] == ["x2 * c + x1 * s",
                                                           "x1 * s + x2 * c"]
    assert as_written["passes"][1][0].startswith("ReassociatePass")
    # written the other way round: already in that order, and no pass changes it
    assert [order for _, order in swapped["passes"]] == ["x1 * s + x2 * c"]
    for run in (as_written, swapped):     # either way: the same final IR, the same fused product
        assert run["sums"]["y2"] == {"first": ["x1 * s"], "second": ["x2 * c"]}
        assert run["fused"] == {"y1": ["x1 * c"], "y2": ["x1 * s"]}
