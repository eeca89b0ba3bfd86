"""ropelib.course.nb04_load_order: the order of global loads and stores in a kernel's SASS, read
from made-up machine code (no compiler needed)."""
from ropelib.course import nb04_load_order as lo

# the angles (two 4-byte loads), a sine table (.CONSTANT, left out), then two rows: each two
# 4-byte loads of x and two stores
SASS = """
        /*0100*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0110*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0120*/                   LDG.E.CONSTANT R9, desc[UR4][R8.64] ;
        /*0130*/                   LDG.E R5, desc[UR4][R6.64] ;
        /*0140*/              @!P0 LDG.E R7, desc[UR4][R10.64] ;
        /*0150*/                   STG.E desc[UR4][R12.64], R5 ;
        /*0160*/                   STG.E desc[UR4][R14.64], R7 ;
        /*0170*/                   LDG.E R5, desc[UR4][R6.64+0x2000] ;
        /*0180*/                   LDG.E.64 R16, desc[UR4][R18.64] ;
        /*0190*/                   LDG.E R7, desc[UR4][R10.64+0x2000] ;
        /*01a0*/                   STG.E desc[UR4][R12.64+0x2000], R5 ;
        /*01b0*/                   STG.E.U16 desc[UR4][R14.64+0x2000], R7 ;
"""


def test_accesses_in_order_with_their_widths_and_no_constant_loads():
    assert lo.accesses(SASS) == [("LDG", 4)] * 4 + [("STG", 4)] * 2 + [
        ("LDG", 4), ("LDG", 8), ("LDG", 4), ("STG", 4), ("STG", 2)]
    assert lo.order(SASS) == "LLLLSSLLLSS"
    assert lo.runs(lo.order(SASS)) == "LLLL SS LLL SS"


def test_bytes_before_a_store_count_loads_of_one_width():
    ops = lo.accesses(SASS)
    assert lo.max_bytes_before_store(ops, 4) == 16        # the angles' loads count: same width
    assert lo.max_bytes_before_store(ops, 8) == 8         # the .64 load alone
    assert lo.max_bytes_before_store([("STG", 4)], 4) == 0
