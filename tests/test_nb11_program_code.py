"""ropelib.course.nb11_program_code: what a program of notebook 11's worked fused kernel and one
of ropelib's `_rope_kv_cache_kernel` do before their first store, read from sm_90 SASS compiled
here (no GPU), and the worked kernel with cos/sin read from tables (`cs_table_kernel`)."""
import pytest
import torch

from ropelib.course import nb11_program_code as pc
from ropelib.course.exercises import at_scale

# a made-up straight-line SASS: a position load, one angle reduced (its slow path in a
# BSSY region after the region's first branch), a data load after it, then the first store
SASS = """
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R6.64] ;
        /*0020*/                   FMUL R8, R4, 0.63661974668502807617 ;
        /*0030*/                   BSSY B0, 0x70 ;
        /*0040*/              @P0 BRA 0x70 ;
        /*0050*/                   LDG.E.CONSTANT R9, desc[UR4][R10.64] ;
        /*0060*/                   IMAD R9, R9, R9, RZ ;
        /*0070*/                   BSYNC B0 ;
        /*0080*/                   LDG.E.64 R12, desc[UR4][R14.64] ;
        /*0090*/                   STG.E.64 desc[UR4][R16.64], R12 ;
        /*00a0*/                   LDG.E.128 R20, desc[UR4][R22.64] ;
        /*00b0*/                   EXIT ;
"""


def test_program_path_counts_up_to_the_first_store_without_the_slow_path():
    p = pc.program_path(SASS)
    assert p["instructions"] == 7          # 0x00-0x40, 0x70, 0x80: the slow path left out
    assert p["angles"] == 1
    assert p["loads"] == {"LDG.32": 1, "LDG.128": 1, "LDG.64": 1}   # not the constant table's
    assert p["loads_after_angles"] == 1


def test_the_table_kernel_writes_what_the_worked_kernel_writes():
    assert pc.cs_table_matches(at_scale.solution_rope_kv_cache_kernel, at_scale.launch_kv_cache)


def test_a_kernel_that_writes_nothing_does_not_match():
    def launch_nothing(kernel, q, k, v, q_out, k_cache, v_cache, seqlens, freqs):
        q_out.zero_()
    assert not pc.cs_table_matches(at_scale.solution_rope_kv_cache_kernel, launch_nothing)


@pytest.mark.slow
def test_compiled_programs_show_the_worked_kernels_sin_cos_chain():
    code = pc.compiled_programs(at_scale.solution_rope_kv_cache_kernel)
    worked, tables, lib = code["worked"], code["cos/sin tables"], code["ropelib"]
    assert (worked["programs"], tables["programs"], lib["programs"]) == (1, 1, 40)
    assert worked["angles"] >= 2 * lib["angles"] > 0 and tables["angles"] == 0
    assert worked["loads_after_angles"] >= 1
    assert worked["instructions"] > 1.5 * lib["instructions"] > 1.5 * tables["instructions"]


def test_a_table_launcher_passed_in_is_the_one_that_runs():
    def launch_nothing(kernel, q, k, v, q_out, k_cache, v_cache, seqlens, cos, sin):
        q_out.zero_()
    assert pc.cs_table_matches(at_scale.solution_rope_kv_cache_kernel, at_scale.launch_kv_cache,
                               table_kernel=pc.cs_table_kernel, launch_tables=pc.launch_cs_table)
    assert not pc.cs_table_matches(at_scale.solution_rope_kv_cache_kernel,
                                   at_scale.launch_kv_cache, launch_tables=launch_nothing)
