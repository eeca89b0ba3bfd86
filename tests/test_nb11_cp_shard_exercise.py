"""ropelib/course/exercises/nb11_cp_shard.py: notebook 11's exercise 1b, a rank's dual-chunk
shard rotated at its global positions by the learner's kernel. The check passes a typed-in copy
of the worked kernel and refuses: the worked kernel from ropelib (and a kernel calling it), a
kernel calling ropelib's own position map, a Python function calling apply_rope, kernels that
rotate at the wrong positions, a blank kernel. Everything runs in Triton's interpreter."""

import pytest
import torch
import triton
import triton.language as tl

import ropelib
from ropelib.course.exercises import nb11_cp_shard as ex
from ropelib.course.offline_compile import compiled_code
from ropelib.kernels.common import dual_chunk_position
from loading import learner_copy


@triton.jit
def _rotate_at(x_ptr, y_ptr, freqs_ptr, row, pos, H: tl.constexpr, D: tl.constexpr):
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF)[None, :]
    theta = tl.load(freqs_ptr + pos * D + j)
    c, s = tl.cos(theta), tl.sin(theta)
    base = (row * H + tl.arange(0, H)[:, None]) * D
    x1 = tl.load(x_ptr + base + j).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + j).to(tl.float32)
    tl.store(y_ptr + base + j, x1 * c - x2 * s)
    tl.store(y_ptr + base + HALF + j, x2 * c + x1 * s)


@triton.jit
def local_positions_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                           H: tl.constexpr, D: tl.constexpr):
    # the shard rotated as if it were a short sequence: positions 0 .. S_LOCAL - 1
    row = tl.program_id(0)
    _rotate_at(x_ptr, y_ptr, freqs_ptr, row, row % S_LOCAL, H, D)


@triton.jit
def contiguous_split_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                            H: tl.constexpr, D: tl.constexpr):
    # rank r taken to hold the contiguous block [r S_LOCAL, (r + 1) S_LOCAL)
    row = tl.program_id(0)
    _rotate_at(x_ptr, y_ptr, freqs_ptr, row, CP_RANK * S_LOCAL + row % S_LOCAL, H, D)


@triton.jit
def rank_order_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                      H: tl.constexpr, D: tl.constexpr):
    # the second chunk taken as chunk CP_RANK + CP_SIZE
    row = tl.program_id(0)
    i = row % S_LOCAL
    seg = S_LOCAL // 2
    pos = tl.where(i < seg, CP_RANK * seg + i, (CP_RANK + CP_SIZE) * seg + i - seg)
    _rotate_at(x_ptr, y_ptr, freqs_ptr, row, pos, H, D)


@triton.jit
def library_positions_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                             H: tl.constexpr, D: tl.constexpr):
    # right, but the position map is ropelib's
    row = tl.program_id(0)
    pos = dual_chunk_position(row % S_LOCAL, S_LOCAL, CP_SIZE, CP_RANK)
    _rotate_at(x_ptr, y_ptr, freqs_ptr, row, pos, H, D)


@triton.jit
def calls_the_worked_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                            H: tl.constexpr, D: tl.constexpr):
    ex.solution_cp_shard_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK, H, D)


@triton.jit
def stores_before_the_shard_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                                   H: tl.constexpr, D: tl.constexpr):
    # right values, but the first program also stores a token's worth of zeros before y
    row = tl.program_id(0)
    i = row % S_LOCAL
    seg = S_LOCAL // 2
    pos = tl.where(i < seg, CP_RANK * seg + i, (2 * CP_SIZE - 1 - CP_RANK) * seg + i - seg)
    _rotate_at(x_ptr, y_ptr, freqs_ptr, row, pos, H, D)
    e = tl.arange(0, H * D)
    tl.store(y_ptr - H * D + e, tl.zeros((H * D,), tl.float32),
             mask=e < tl.where(row == 0, H * D, 0))


@triton.jit
def blank_kernel(x_ptr, y_ptr, freqs_ptr, S_LOCAL, CP_SIZE, CP_RANK,
                 H: tl.constexpr, D: tl.constexpr):
    pass


def test_the_worked_kernel_typed_in_passes(capsys):
    assert ex.check_cp_shard_kernel(learner_copy(ex.solution_cp_shard_kernel)) is True
    out = capsys.readouterr().out
    assert out.startswith(f"✅ {ex._NAME}: every rank's output is its share") and "❌" not in out


@pytest.mark.parametrize("wrong", [local_positions_kernel, contiguous_split_kernel,
                                   rank_order_kernel])
def test_kernels_at_the_wrong_positions_fail(wrong, capsys):
    assert ex.check_cp_shard_kernel(wrong, seed=3) is False
    out = capsys.readouterr().out
    assert f"❌ {ex._NAME}" in out and "hint:" in out, out


def test_ropelibs_position_map_is_refused(capsys):
    assert ex.check_cp_shard_kernel(library_positions_kernel, seed=0) is False
    out = capsys.readouterr().out
    assert "dual_chunk_position" in out and "ropelib/kernels/common.py" in out, out


@pytest.mark.parametrize("answer", [ex.solution_cp_shard_kernel, calls_the_worked_kernel],
                         ids=["worked", "wrapped"])
def test_the_worked_solution_is_refused(answer, capsys):
    assert ex.check_cp_shard_kernel(answer, seed=0) is False
    out = capsys.readouterr().out
    assert "❌" in out and "solution_cp_shard_kernel" in out and "✅" not in out, out


def test_a_python_function_calling_apply_rope_is_refused(capsys):
    def library(x, y, freqs, S_local, n, r):                # the library's answer
        y.copy_(ropelib.apply_rope(x, freqs.view(-1, 1, 1, freqs.shape[-1]), layout="bshd",
                                   cp_size=n, cp_rank=r))

    assert ex.check_cp_shard_kernel(library) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


def test_a_kernel_storing_past_the_shard_is_refused(capsys):
    # the output sits in the middle of a NaN buffer: a store outside it is caught, even where
    # every element of the shard is right
    assert ex.check_cp_shard_kernel(stores_before_the_shard_kernel, seed=0) is False
    out = capsys.readouterr().out
    assert f"❌ {ex._NAME}" in out and "elements outside the shard's output" in out, out


def test_the_check_launches_through_the_launcher_it_is_given(capsys):
    """Notebook 11 defines launch_cp_shard in the exercise cell and hands it to the check: the
    check launches through the one it is given (a launcher that launches nothing fails it)."""
    calls = []

    def launch(kern, *args):
        calls.append(len(args))
        ex.launch_cp_shard(kern, *args)

    kernel = learner_copy(ex.solution_cp_shard_kernel)
    assert ex.check_cp_shard_kernel(kernel, seed=0, launch=launch) is True, capsys.readouterr().out
    assert calls and set(calls) == {5}
    assert ex.check_cp_shard_kernel(kernel, seed=0, launch=lambda kern, *args: None) is False
    assert "❌" in capsys.readouterr().out


def test_blank_and_nothing(capsys):
    assert ex.check_cp_shard_kernel(blank_kernel) is False
    assert "no kernel yet" in capsys.readouterr().out
    assert ex.check_cp_shard_kernel(None) is False
    assert "no kernel yet" in capsys.readouterr().out


def test_the_worked_kernel_matches_ropelibs_rotation():
    x = torch.randn(2, 16, 2, 8)
    freqs = ropelib.rope_freqs(16, 8)
    full = ropelib.apply_rope(x, freqs, layout="bshd")
    for r in range(2):
        shard = ropelib.context_parallel.shard(x, 2, r).contiguous()
        y = torch.empty_like(shard)
        ex.launch_cp_shard(ex.solution_cp_shard_kernel, shard, y, freqs.view(16, 8), 2, r)
        torch.testing.assert_close(y, ropelib.context_parallel.shard(full, 2, r),
                                   atol=3e-5, rtol=1e-5)


def test_the_worked_kernel_compiles_for_sm_90():
    x = torch.empty(1, 16, 4, 128, dtype=torch.bfloat16)
    code = compiled_code(ex.solution_cp_shard_kernel,
                         dict(x_ptr=x, y_ptr=x, freqs_ptr=torch.empty(1), S_LOCAL=8192,
                              CP_SIZE=2, CP_RANK=1, H=4, D=128), num_warps=4)
    assert "tt.func" in code["ttgir"] and code["ptx"]
