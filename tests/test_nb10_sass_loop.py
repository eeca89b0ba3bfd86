"""ropelib.course.counts.loop_fast_paths, which notebook 10 uses to count the instructions a
thread issues in one pass of a head loop (the path that skips libdevice's slow range
reduction), on a hand-written SASS listing shaped like cuobjdump's."""
from ropelib.course.counts import loop_fast_paths

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                     /* 0x0000000000007919 */
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;       /* 0x0000000000007919 */
        /*0030*/                   FMUL R5, R4, 0.63661974668502807617 ;  /* 0x0000000000007919 */
        /*0040*/                   BSSY B0, 0x90 ;                        /* 0x0000000000007945 */
        /*0050*/              @!P0 BRA 0x90 ;                             /* 0x0000000000007947 */
        /*0060*/                   IMAD.WIDE R8, R0, 0x4, R6 ;            /* 0x0000000000007919 */
        /*0070*/                   LDG.E.CONSTANT R9, desc[UR4][R8.64] ;  /* 0x0000000000007919 */
        /*0080*/               @P3 BRA 0x60 ;                             /* 0xfffffffc00c83947 */
        /*0090*/                   BSYNC B0 ;                             /* 0x0000000000007941 */
        /*00a0*/                   FFMA.FTZ R10, R5, R5, R4 ;             /* 0x0000000000007919 */
        /*00b0*/                   STG.E.U16 desc[UR4][R2.64], R10 ;      /* 0x0000000000007919 */
        /*00c0*/               @P1 BRA 0x20 ;                             /* 0xfffffffc00c81947 */
        /*00d0*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def test_one_pass_skips_the_slow_path_and_its_inner_loop():
    (loop,) = loop_fast_paths(SASS)           # the inner loop (0x60-0x80) is in the slow path
    assert loop == {"LDG": 1, "FMUL": 1, "BSSY": 1, "BRA": 2, "BSYNC": 1, "FFMA": 1, "STG": 1}


def test_no_backward_branch_no_loop():
    straight = "\n".join(line for line in SASS.splitlines() if "@P1 BRA 0x20" not in line)
    assert loop_fast_paths(straight) == []
