"""Notebook 05's side-by-side of the worked interleaved kernel and the finished kernel: the split
of a machine code at its batch loop."""
import pytest

from ropelib.course.nb05_interleaved import batch_loop, programs_per_sm

SASS = [
    "MOV R1, c[0x0][0x28] ;",
    "@!P0 LDG.E.128 R20, desc[UR6][R2.64] ;",      # the angles, before the loop
    "FFMA R4, R5, R6, R7 ;",
    "@P0 LDG.E.128 R8, desc[UR6][R26.64] ;",       # x, in the loop
    "FFMA R9, R8, R4, R7 ;",
    "@P0 STG.E.128 desc[UR6][R26.64], R8 ;",
    "BRA 0x40 ;",
    "EXIT ;",
]


def test_the_loop_runs_from_the_last_wide_load_to_the_first_store():
    assert batch_loop(SASS) == dict(before=3, loop=3, after=2)


def test_a_narrow_load_is_not_the_loop_start():
    sass = SASS[:3] + ["@P0 LDG.E R8, desc[UR6][R26.64] ;"] + SASS[4:]
    assert batch_loop(sass) == dict(before=1, loop=5, after=2)


@pytest.mark.parametrize("sass", [SASS[:5], ["MOV R1, R2 ;", "STG.E.128 desc[UR6][R2.64], R8 ;"]])
def test_no_loop_is_an_error(sass):
    with pytest.raises(ValueError):
        batch_loop(sass)


@pytest.mark.parametrize("registers, threads, programs", [
    (64, 256, 4),      # the H200 run's finished kernel: 4 programs of 8 warps, registers-limited
    (72, 128, 7),      # its 4-warp tile rung: 28 warps an SM
    (37, 512, 3),      # 37 registers are allocated as 40
    (16, 1024, 2),     # threads-limited
    (16, 32, 32),      # programs-limited
])
def test_programs_an_sm_by_registers_threads_and_programs(registers, threads, programs):
    assert programs_per_sm(registers, threads) == programs
