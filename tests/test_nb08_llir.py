"""Notebook 08, section 4b: the operand order of a line's sum in the LLVM IR
(ropelib.course.nb08_llir.sum_operands), read through the IR's debug locations."""
from ropelib.course import nb08_llir

SOURCE = "def f(x1, x2, c, s):\n    y1 = x1 * c - x2 * s\n    y2 = x2 * c + x1 * s\n"
LLIR = """
  %10 = fmul float %x1, %c, !dbg !5
  %11 = fmul float %x2, %s, !dbg !6
  %12 = fsub float %10, %11, !dbg !5
  %13 = fmul <4 x float> %x2v, %cv, !dbg !7
  %14 = fmul <4 x float> %x1v, %sv, !dbg !8
  %15 = fadd <4 x float> %14, %13, !dbg !7
  %16 = fadd float %15s, %10, !dbg !7
!5 = !DILocation(line: 2, column: 10, scope: !1)
!6 = !DILocation(line: 2, column: 19, scope: !1)
!7 = !DILocation(line: 3, column: 10, scope: !1)
!8 = !DILocation(line: 3, column: 19, scope: !1)
"""


def test_the_first_and_second_operand_of_each_sum():
    found = nb08_llir.sum_operands(LLIR, SOURCE)
    assert set(found) == {"y1", "y2"}
    assert (found["y1"]["op"], found["y1"]["first"], found["y1"]["second"]) == (
        "fsub", ["x1 * c"], ["x2 * s"])
    # the IR's fadd holds y2's operands the other way round from the source
    assert (found["y2"]["op"], found["y2"]["first"], found["y2"]["second"]) == (
        "fadd", ["x1 * s"], ["x2 * c"])
    assert found["y2"]["n"] == 1          # a sum of something that is not an fmul is not counted
