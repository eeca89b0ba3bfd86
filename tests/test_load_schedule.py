"""ropelib.course.load_schedule: where a kernel's sm_90 machine code issues its loads, compiled
on the CPU (notebook 05's count of the loads a thread issues before its first multiply)."""
import pytest
import torch
import triton
import triton.language as tl

from ropelib.course import load_schedule


@triton.jit
def _scale_rows(x_ptr, y_ptr, w_ptr, n, BLOCK: tl.constexpr):
    # y = x * w, BLOCK elements a program
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    w = tl.load(w_ptr + i, mask=m, other=0.0)
    tl.store(y_ptr + i, x * w, mask=m)


def _args(**kw):
    f = torch.empty(16)
    return dict(dict(x_ptr=f, y_ptr=f, w_ptr=f, n=1 << 20, BLOCK=1024), **kw)


def test_loads_come_before_the_multiply_that_waits_for_them():
    out = load_schedule.schedule(_scale_rows, _args(), num_warps=4)
    # 8 fp32 a thread of x and of w: two 16-byte loads of each, all ahead of the first FMUL
    assert len(out["loads"]) == 4 and out["early"] == 4
    assert all(i < out["first_math"] for i, _ in out["loads"])
    assert all("LDG" in text for _, text in out["loads"])
    assert out["registers"] and out["registers"] > 0 and out["instructions"] > out["first_math"]


def test_the_flat_pass_issues_eight_of_its_ten_loads_early():
    # ropelib's rotate-half flat pass at 1 GiB bf16: its cos/sin rows read through row pointers
    # (kernels/flat.py) keep 2 x loads and 6 of 8 table loads ahead of the first multiply
    from ropelib.kernels import launch, tiles
    x = torch.empty(16384, 8, 32, 128, dtype=torch.bfloat16, device="meta")
    route, _ = launch.plan_two_pass(launch.View.of(x), launch.View.of(x),
                                    launch.Table(torch.empty(16384, 128, device="meta"), None),
                                    launch.Positions(), R=128, interleaved=False,
                                    backward=False, layout="sbhd")
    fp = route.rotate_pass
    bf16, fp32 = torch.empty(16, dtype=torch.bfloat16), torch.empty(16)
    args = dict(zip(fp.launcher.pointer_names, (bf16, bf16, None, None, fp32, fp32, None, None)),
                **dict(fp.args, XBLOCK=tiles.TWO_PASS_ELEMENTS))
    out = load_schedule.schedule(fp.launcher.kernel, args, num_warps=fp.num_warps)
    assert len(out["loads"]) == 10 and out["early"] == 8
    # as planned after a pre-pass, with its flag per row: member b's four loads wait on the
    # row's flag, and still go out ahead of the first multiply with the others; the flag's own
    # one-byte load comes first
    assert route.row_flags and fp.dtypes[-1] == torch.int8
    flags = torch.zeros(16, dtype=torch.int8)
    args = dict(zip(fp.launcher.pointer_names, (bf16, bf16, None, None, fp32, fp32, None, flags)),
                **dict(fp.args, XBLOCK=tiles.TWO_PASS_ELEMENTS))
    out = load_schedule.schedule(fp.launcher.kernel, args, num_warps=fp.num_warps)
    assert len(out["loads"]) == 11 and out["early"] == 9
    assert "LDG.E.U8 " in out["loads"][0][1] and all(".128" in t for _, t in out["loads"][1:])


def test_an_argument_that_is_not_a_launch_value_is_named():
    with pytest.raises(TypeError, match="argument 'n'"):
        load_schedule.schedule(_scale_rows, _args(n=[1, 2]), num_warps=4)


def test_a_long_kernel_is_counted_whole_and_its_spills_are_seen():
    """Past 4,096 instructions the disassembly's addresses grow a fifth hex digit: every
    instruction is counted (an earlier reader stopped at 4,096), and the register spills of a
    tile too large for its threads show as STL and LDL."""
    from ropelib.course.exercises import yardstick
    b, f = torch.empty(16, dtype=torch.bfloat16), torch.empty(16)
    big = load_schedule.schedule(
        yardstick.solution_rows_kernel, dict(x_ptr=b, y_ptr=b, freqs_ptr=f, n_rows=1 << 20,
                                             ROWS_PER_TOKEN=256, D=128, BLOCK_ROWS=64,
                                             ROTATE=True), num_warps=4)
    assert big["instructions"] > 4096 and len(big["sass"]) == big["instructions"]
    assert big["registers"] == 255 and big["local_stores"] > 0 and big["local_loads"] > 0
    small = load_schedule.schedule(_scale_rows, _args(), num_warps=4)
    assert small["local_stores"] == small["local_loads"] == 0
