"""ropelib.course.nb11_decode_traffic: the bytes one decoding step moves, fused and in two kernels,
recorded in Triton's interpreter (notebook 11, after exercise 2). The worked kernel moves each
byte once; the two kernels add exactly the rotated k's round trip and the position read again;
a kernel that reads a tensor twice shows it in the counts."""
from collections import Counter

import triton
import triton.language as tl

from ropelib.course import nb11_decode_traffic as traffic
from ropelib.course.exercises import at_scale


def _per_seq(result, path):
    return Counter({key: n // result["B"] for key, n in result[path].items()})


def test_the_worked_kernel_moves_each_byte_once():
    r = traffic.step_traffic(at_scale.solution_rope_kv_cache_kernel, B=2, HQ=4, HK=2, D=16)
    assert r["same"]
    fused = _per_seq(r, "fused")
    el = 2                                                    # bf16
    assert fused == Counter({("q", "load"): 4 * 16 * el, ("q_out", "store"): 4 * 16 * el,
                             ("k", "load"): 2 * 16 * el, ("v", "load"): 2 * 16 * el,
                             ("k_cache", "store"): 2 * 16 * el, ("v_cache", "store"): 2 * 16 * el,
                             ("seqlens", "load"): 4, ("freqs", "load"): 8 * 4})


def test_two_kernels_add_the_round_trip_of_the_rotated_k():
    r = traffic.step_traffic(at_scale.solution_rope_kv_cache_kernel, B=3, HQ=4, HK=2, D=16)
    fused, two = _per_seq(r, "fused"), _per_seq(r, "two kernels")
    assert two - fused == Counter({("k_rot", "store"): 64, ("k_rot", "load"): 64,
                                   ("seqlens", "load"): 4})
    assert not fused - two


def test_bytes_scale_with_the_batch():
    one = traffic.step_traffic(at_scale.solution_rope_kv_cache_kernel, B=1, HQ=4, HK=2, D=16)
    four = traffic.step_traffic(at_scale.solution_rope_kv_cache_kernel, B=4, HQ=4, HK=2, D=16)
    for path in ("fused", "two kernels"):
        assert {k: 4 * v for k, v in one[path].items()} == four[path]


@triton.jit
def _reads_q_twice_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                          freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr):
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0)
    pos = tl.load(seqlens_ptr + b)
    j = tl.arange(0, HALF)[None, :]
    theta = tl.load(freqs_ptr + pos * D + j)
    c, s = tl.cos(theta), tl.sin(theta)
    hq = tl.arange(0, HQ)[:, None]
    row = q_ptr + (b * HQ + hq) * D
    x1 = tl.load(row + j).to(tl.float32)
    x2 = tl.load(row + HALF + j).to(tl.float32)
    tl.store(q_out_ptr + (b * HQ + hq) * D + j, x1 * c - x2 * s)
    x1 = tl.load(row + j).to(tl.float32)                     # again: its bytes count twice
    tl.store(q_out_ptr + (b * HQ + hq) * D + HALF + j, x2 * c + x1 * s)
    hk = tl.arange(0, HK)[:, None]
    k1 = tl.load(k_ptr + (b * HK + hk) * D + j).to(tl.float32)
    k2 = tl.load(k_ptr + (b * HK + hk) * D + HALF + j).to(tl.float32)
    slot = ((b * L + pos) * HK + hk) * D
    tl.store(k_cache_ptr + slot + j, k1 * c - k2 * s)
    tl.store(k_cache_ptr + slot + HALF + j, k2 * c + k1 * s)
    f = tl.arange(0, D)[None, :]
    tl.store(v_cache_ptr + slot + f, tl.load(v_ptr + (b * HK + hk) * D + f))


def test_a_tensor_read_twice_shows_in_the_counts():
    worked = traffic.step_traffic(at_scale.solution_rope_kv_cache_kernel, B=2, HQ=4, HK=2, D=16)
    twice = traffic.step_traffic(_reads_q_twice_kernel, B=2, HQ=4, HK=2, D=16)
    assert twice["same"]                                      # the same result ...
    extra = _per_seq(twice, "fused") - _per_seq(worked, "fused")
    assert extra == Counter({("q", "load"): 4 * 8 * 2})       # ... half of q read again


def test_a_wrong_kernel_is_not_the_same():
    @triton.jit
    def _no_v_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, seqlens_ptr,
                     freqs_ptr, L, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr):
        b = tl.program_id(0)
        f = tl.arange(0, D)[None, :]
        hq = tl.arange(0, HQ)[:, None]
        tl.store(q_out_ptr + (b * HQ + hq) * D + f, tl.load(q_ptr + (b * HQ + hq) * D + f))

    r = traffic.step_traffic(_no_v_kernel, B=2, HQ=4, HK=2, D=16)
    assert not r["same"]
    assert ("v_cache", "store") not in r["fused"]


def test_the_three_timed_steps_write_the_same():
    import torch
    steps, outs = traffic.decode_steps(at_scale.solution_rope_kv_cache_kernel, B=3, HQ=4, HK=2,
                                       D=16, L=8)
    for step in steps.values():
        step()
    for name in ("fused + empty", "two kernels"):
        for a, b in zip(outs["fused"], outs[name]):
            assert torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1.6e-2), name
    assert int((outs["two kernels"][1] != 0).any(-1).any(-1).sum()) == 3    # one slot each


def test_bytes_per_program_at_ropelibs_decode_grid():
    # batch 1 on 132 SMs: ropelib splits the heads down to one a program (40 programs); every
    # program reads the position and one row of angles on its own
    r = traffic.program_bytes(at_scale.solution_rope_kv_cache_kernel, B=1)
    assert r["yours"] == [24836]
    assert len(r["ropelib"]) == 40
    row = 4 + 2 * 64 * 4                   # the position, and both halves of an angle row
    assert sorted(set(r["ropelib"])) == [2 * 256 + row, 4 * 256 + row]
    assert r["ropelib"].count(2 * 256 + row) == 32                           # q programs


def test_the_timed_kernels_compile_for_sm90():
    """The kernels the notebook times that no other test compiles for sm_90: the two-kernel
    step's rotation, and ropelib's kernel at 8 heads a program for one sequence."""
    from ropelib.course.offline_compile import in_compiling_python
    code = """
import json, torch
from ropelib.course import nb11_decode_traffic as t
from ropelib.course.offline_compile import compile_for_cuda
from ropelib.kernels import kv_cache as K
q, k = torch.empty(1, 32, 128, dtype=torch.bfloat16), torch.empty(1, 8, 128, dtype=torch.bfloat16)
c1 = compile_for_cuda(t._rope_qk_decode_kernel, dict(q_ptr=q, k_ptr=k, q_out_ptr=q, k_out_ptr=k,
    seqlens_ptr=torch.empty(1, dtype=torch.int32), freqs_ptr=torch.empty(8, 128), HQ=32, HK=8,
    D=128), num_warps=4)
grid, pointers, args, warps, _ = t.ropelib_launch(1, L=8, block_h=8)
names = K._rope_kv_cache_kernel.arg_names[:len(pointers)]
c2 = compile_for_cuda(K._rope_kv_cache_kernel, dict(zip(names, pointers), **args), num_warps=warps)
print(json.dumps([grid, len(c1.asm["cubin"]) > 0, len(c2.asm["cubin"]) > 0]))
"""
    grid, ok1, ok2 = in_compiling_python(code, what="compiling for sm_90")
    assert grid == [1, 5, 1] and ok1 and ok2
