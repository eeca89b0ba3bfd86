"""Notebook 03, section 4.5: what one thread of the naive kernel runs at 1 and 2 warps, read from
its sm_90 SASS (ropelib.course.nb03_warps), on a cut-down listing and on the code this Triton
compiles here."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

import triton.language as tl  # noqa: E402

from ropelib.course import nb03_warps as w  # noqa: E402

# the shape of a sine's code in cuobjdump's listing: a BSSY region whose first conditional
# branch skips the long reduction (a loop with a load) to the region's BSYNC
SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x0000 */
        /*0010*/                   LDG.E R4, desc[UR4][R8.64] ;           /* 0x0000 */
        /*0020*/                   BSSY B0, 0x90 ;                        /* 0x0000 */
        /*0030*/                   FSETP.GE.AND P3, PT, R4, 105615, PT ;  /* 0x0000 */
        /*0040*/              @!P3 BRA 0x80 ;                             /* 0x0000 */
        /*0050*/                   LDG.E.CONSTANT R17, desc[UR4][R16.64] ;/* 0x0000 */
        /*0060*/                   IMAD.WIDE.U32 R18, R0, R17, R18 ;      /* 0x0000 */
        /*0070*/               @P0 BRA 0x50 ;                             /* 0x0000 */
        /*0080*/                   BSYNC B0 ;                             /* 0x0000 */
        /*0090*/                   FFMA.FTZ R6, R7, -1.5707962512969970703, R4 ;  /* 0x0000 */
        /*00a0*/              @!P1 IMAD.MOV R3, RZ, RZ, -R3 ;             /* 0x0000 */
        /*00b0*/                   STG.E.U16 desc[UR4][R2.64], R6 ;       /* 0x0000 */
        /*00c0*/                   EXIT ;                                 /* 0x0000 */
        /*00d0*/                   BRA 0xd0;                              /* 0x0000 */
"""


def test_fast_path_skips_the_long_reduction():
    run = w.fast_path(SASS)
    assert [b.split()[0] for b in run] == ["LDC", "LDG.E", "BSSY", "FSETP.GE.AND", "BRA",
                                           "BSYNC", "FFMA.FTZ", "IMAD.MOV", "STG.E.U16", "EXIT"]
    assert run[7] == "IMAD.MOV R3, RZ, RZ, -R3"          # the predicate is dropped, the op kept
    assert w.by_kind(run) == {"float": 2, "integer": 1, "memory": 2, "conversion": 0,
                              "branch": 4, "other": 1}


def test_fast_path_refuses_code_it_cannot_walk():
    with pytest.raises(ValueError, match="outside"):
        w.fast_path(SASS.replace("BSSY B0, 0x90", "NOP"))
    with pytest.raises(ValueError, match="EXIT"):
        w.fast_path("\n".join(line for line in SASS.splitlines() if "EXIT" not in line
                              and "0xd0" not in line))


def test_the_naive_kernel_compiled_here():
    """At 2 warps a program runs the same float instructions as at 1, more integer ones, twice
    the loads and stores; the total within 5 % of the H200 profile's 351 and 484 (Triton 3.6)."""
    from ropelib.course import nb03_layouts
    from ropelib.course.kernels.naive import _rope_naive_kernel
    from ropelib.course.offline_compile import compiled_code

    x_, f_ = torch.empty(16, dtype=torch.bfloat16), torch.empty(16)
    args = dict(x_ptr=x_, y_ptr=x_, freqs_ptr=f_, B=8, H=32, stride_xs=32768, stride_xb=4096,
                stride_xh=128, stride_xd=1, stride_ys=32768, stride_yb=4096, stride_yh=128,
                stride_fs=128, stride_fd=1, HALF=64, BLOCK_HALF=64, BACKWARD=False,
                COMPUTE_DTYPE=tl.float32, BF16_RTNE=False)
    code = {n: compiled_code(_rope_naive_kernel, args, num_warps=n, timeout=600) for n in (1, 2)}
    if not code[1]["sass"]:
        pytest.skip("no cuobjdump")
    prog = {n: {k: v * n for k, v in w.by_kind(w.fast_path(c["sass"])).items()}
            for n, c in code.items()}
    feats = {n: nb03_layouts.load_layout(c["ttgir"])[1]["sizePerThread"][0]
             for n, c in code.items()}
    assert feats == {1: 2, 2: 1}
    assert prog[1]["float"] == prog[2]["float"] > 0
    assert prog[2]["integer"] > 1.4 * prog[1]["integer"]
    assert prog[2]["memory"] == 2 * prog[1]["memory"] == 12
    total = {n: sum(p.values()) for n, p in prog.items()}
    assert abs(total[1] / 351 - 1) < 0.05 and abs(total[2] / 484 - 1) < 0.05, total
    if code[1]["triton"].split(".")[:2] == ["3", "6"]:       # the profile's Triton: exactly
        assert total == {1: 351, 2: 484}
