"""Notebook 03: its kernel exercise (exercises.naive_kernel) and its access recorder (access).

The exercise check launches the learner's @triton.jit kernel itself; each known way to pass it
without writing the kernel must fail (ropelib's kernels and the worked solution itself
included), and a learner's own copy of the worked solution must pass.
"""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib import reference, runtime  # noqa: E402
from ropelib.course import access  # noqa: E402
from ropelib.course.exercises import is_blank_kernel, kernels as ex  # noqa: E402
from ropelib.course.exercises import naive_kernel as nk  # noqa: E402
from ropelib.course.kernels import naive  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import load_file  # noqa: E402

DEVICE = runtime.default_device()
_own_code_tests = load_file("own_code_tests", Path(__file__).resolve().parent / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it
OWN_SOLUTION = learner_copy(nk.solution_rope_interleaved)


# --- known cheats, each a kernel (or not) with the exercise's signature --------------------------

@triton.jit
def _blank_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh, stride_xd,
                  D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    pass  # your code


@triton.jit
def _writes_nothing_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh,
                           stride_xd, D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_PAIRS)
    tl.load(x_ptr + row * 0 + offs * stride_xd, mask=offs < D)  # reads, stores nothing


@triton.jit
def _copies_input_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh,
                         stride_xd, D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    offs = tl.arange(0, 2 * BLOCK_PAIRS)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    tl.store(y_ptr + row * D + offs, tl.load(x_row + offs * stride_xd, mask=offs < D), mask=offs < D)


@triton.jit
def _skips_tail_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh, stride_xd,
                       D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    # right on the rotated pairs, but never writes the D - R features that pass through
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_PAIRS)
    rot = j < R // 2
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=rot, other=0.0)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    xe = tl.load(x_row + 2 * j * stride_xd, mask=rot, other=0.0).to(tl.float32)
    xo = tl.load(x_row + (2 * j + 1) * stride_xd, mask=rot, other=0.0).to(tl.float32)
    c, sn = tl.cos(theta), tl.sin(theta)
    tl.store(y_ptr + row * D + 2 * j, (xe * c - xo * sn).to(y_ptr.dtype.element_ty), mask=rot)
    tl.store(y_ptr + row * D + 2 * j + 1, (xo * c + xe * sn).to(y_ptr.dtype.element_ty), mask=rot)


@triton.jit
def _zeroes_tail_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh, stride_xd,
                        D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    # writes every element, but the pass-through tail gets 0 instead of x
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_PAIRS)
    live, rot = j < D // 2, j < R // 2
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=rot, other=0.0)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    xe = tl.load(x_row + 2 * j * stride_xd, mask=rot, other=0.0).to(tl.float32)
    xo = tl.load(x_row + (2 * j + 1) * stride_xd, mask=rot, other=0.0).to(tl.float32)
    c, sn = tl.cos(theta), tl.sin(theta)
    tl.store(y_ptr + row * D + 2 * j, (xe * c - xo * sn).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(y_ptr + row * D + 2 * j + 1, (xo * c + xe * sn).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _contiguous_only_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh,
                            stride_xd, D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    # the solution, but it ignores x's strides (assumes a contiguous sbhd x)
    row = tl.program_id(0).to(tl.int64)
    s = row // (B * H)
    j = tl.arange(0, BLOCK_PAIRS)
    live = j < D // 2
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=j < R // 2, other=0.0)
    c, sn = tl.cos(theta), tl.sin(theta)
    xe = tl.load(x_ptr + row * D + 2 * j, mask=live, other=0.0).to(tl.float32)
    xo = tl.load(x_ptr + row * D + 2 * j + 1, mask=live, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + 2 * j, (xe * c - xo * sn).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(y_ptr + row * D + 2 * j + 1, (xo * c + xe * sn).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _unmasked_store_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh,
                           stride_xd, D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    # the solution with the stores' masks forgotten: D = 24 has 12 pairs in a 16-lane tile, so the
    # last row's stores run past the end of y
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_PAIRS)
    live = j < D // 2
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=j < R // 2, other=0.0)
    c, sn = tl.cos(theta), tl.sin(theta)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    xe = tl.load(x_row + 2 * j * stride_xd, mask=live, other=0.0).to(tl.float32)
    xo = tl.load(x_row + (2 * j + 1) * stride_xd, mask=live, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + 2 * j, (xe * c - xo * sn).to(y_ptr.dtype.element_ty))
    tl.store(y_ptr + row * D + 2 * j + 1, (xo * c + xe * sn).to(y_ptr.dtype.element_ty))


@triton.jit
def _unmasked_load_kernel(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh,
                          stride_xd, D: tl.constexpr, R: tl.constexpr, BLOCK_PAIRS: tl.constexpr):
    # the solution with the x loads' masks forgotten: every output right (the masked stores drop
    # lanes past D // 2), but at D = 24 the last row's loads read 8 elements past the end of x
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_PAIRS)
    live = j < D // 2
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=j < R // 2, other=0.0)
    c, sn = tl.cos(theta), tl.sin(theta)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    xe = tl.load(x_row + 2 * j * stride_xd).to(tl.float32)
    xo = tl.load(x_row + (2 * j + 1) * stride_xd).to(tl.float32)
    tl.store(y_ptr + row * D + 2 * j, (xe * c - xo * sn).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(y_ptr + row * D + 2 * j + 1, (xo * c + xe * sn).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _rounds_with_library_helper(x_ptr, y_ptr, freqs_ptr, B, H, stride_xs, stride_xb, stride_xh,
                                stride_xd, D: tl.constexpr, R: tl.constexpr,
                                BLOCK_PAIRS: tl.constexpr):
    # right values, but the stores round through ropelib's @triton.jit helper
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    j = tl.arange(0, BLOCK_PAIRS)
    live = j < D // 2
    theta = tl.load(freqs_ptr + s * R + 2 * j, mask=j < R // 2, other=0.0)
    c, sn = tl.cos(theta), tl.sin(theta)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    xe = tl.load(x_row + 2 * j * stride_xd, mask=live, other=0.0).to(tl.float32)
    xo = tl.load(x_row + (2 * j + 1) * stride_xd, mask=live, other=0.0).to(tl.float32)
    ty = y_ptr.dtype.element_ty
    tl.store(y_ptr + row * D + 2 * j, common.round_to(xe * c - xo * sn, ty, False), mask=live)
    tl.store(y_ptr + row * D + 2 * j + 1, common.round_to(xo * c + xe * sn, ty, False), mask=live)


def _reference_launcher(x, freqs):
    return reference.rope_reference(x, freqs, interleaved=True)


def _returns_input(x, freqs):
    return x


CHEATS = {
    "the plain PyTorch reference": reference.rope_reference,
    "a launcher returning the reference": _reference_launcher,
    "a function returning the input": _returns_input,
    "a blank kernel": _blank_kernel,
    "a kernel that writes nothing": _writes_nothing_kernel,
    "a kernel that copies the input": _copies_input_kernel,
    "a kernel that skips the partial-rotary tail": _skips_tail_kernel,
    "a kernel that zeroes the partial-rotary tail": _zeroes_tail_kernel,
    "a kernel that ignores x's strides": _contiguous_only_kernel,
    "a kernel that stores without masks": _unmasked_store_kernel,
    "a kernel that loads x without masks": _unmasked_load_kernel,
    "the worked solution itself": nk.solution_rope_interleaved,
    "ropelib's naive teaching kernel": naive._rope_naive_kernel,
    "a kernel that calls ropelib's @triton.jit helper": _rounds_with_library_helper,
}


@pytest.mark.parametrize("what", list(CHEATS))
def test_check_rejects(what, capsys):
    assert nk.check_rope_interleaved(CHEATS[what], seed=3) is False
    out = capsys.readouterr().out
    assert "❌" in out and "✅" not in out


def test_unmasked_stores_are_caught_by_the_guard_bands(capsys):
    assert nk.check_rope_interleaved(_unmasked_store_kernel, seed=0) is False
    assert "outside y" in capsys.readouterr().out


def test_unmasked_loads_are_caught_by_the_recorded_addresses(capsys):
    # its outputs are right: only the recorded loads past the end of x give it away
    S, B, H, D, R, dtype, layout = nk.CASES[1]
    x = torch.randn(S, B, H, D, device=DEVICE)
    f = torch.rand(S, R // 2).repeat_interleave(2, -1).contiguous().to(DEVICE)
    y = torch.full_like(x, float("nan"))
    nk.launch_interleaved(_unmasked_load_kernel, x, f, y)
    torch.testing.assert_close(y, reference.rope_reference(x, f, interleaved=True),
                               atol=1e-5, rtol=1e-5)
    assert nk.check_rope_interleaved(_unmasked_load_kernel, seed=0) is False
    out = capsys.readouterr().out
    assert "loaded 8 lanes outside x and freqs" in out and "✅" not in out, out


def test_outside_counts_lanes_past_a_views_elements():
    # a guarded view: loads into its guard band are outside it, though inside its storage
    buf = torch.zeros(64)
    view = buf[16:48].view(2, 16).t()                        # [16, 2], strides (1, 16)
    inside = access.Access((0, 0, 0), "load", np.array([view.data_ptr() + 4 * k
                                                        for k in range(32)], dtype=np.uint64), 4)
    past = access.Access((0, 0, 0), "load", np.array([view.data_ptr() + 4 * 32,
                                                      view.data_ptr() - 4], dtype=np.uint64), 4)
    stored = access.Access((0, 0, 0), "store", past.addresses, 4)
    assert access.outside([inside], [view]) == 0
    assert access.outside([inside, past, stored], [view]) == 2
    assert access.outside([stored], [view], "store") == 2


@pytest.mark.parametrize("what, words", [
    ("the worked solution itself", "launched ropelib's solution_rope_interleaved"),
    ("ropelib's naive teaching kernel", "launched ropelib's _rope_naive_kernel"),
    ("a kernel that calls ropelib's @triton.jit helper", "launched ropelib's round_to"),
])
def test_ropelibs_kernels_are_refused_before_they_run(what, words, capsys):
    assert nk.check_rope_interleaved(CHEATS[what], seed=0) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ interleaved RoPE kernel: this exercise wants your interleaved RoPE "
                          "kernel") and words in out, out


def test_the_helper_kernel_is_right_but_for_the_helper():
    # what the check refuses is whose code it is, not its values: launched outside the check,
    # the kernel that rounds through ropelib's helper computes RoPE
    S, B, H, D, R = 3, 2, 1, 12, 8
    x = torch.randn(S, B, H, D, device=DEVICE)
    f = torch.rand(S, R // 2).repeat_interleave(2, -1).contiguous().to(DEVICE)
    y = torch.full_like(x, float("nan"))
    nk.launch_interleaved(_rounds_with_library_helper, x, f, y)
    torch.testing.assert_close(y, reference.rope_reference(x, f, interleaved=True),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_check_accepts_an_own_copy_of_the_solution(seed, capsys):
    assert nk.check_rope_interleaved(OWN_SOLUTION, seed=seed) is True, capsys.readouterr().out
    assert "✅" in capsys.readouterr().out


def test_check_reexported_and_unanswered(capsys):
    assert ex.check_rope_interleaved is nk.check_rope_interleaved
    assert ex.solution_rope_interleaved is nk.solution_rope_interleaved
    for unanswered in (None, ...):
        assert nk.check_rope_interleaved(unanswered) is False
    assert "no kernel yet" in capsys.readouterr().out


def test_is_blank():
    assert is_blank_kernel(_blank_kernel)
    assert not is_blank_kernel(_writes_nothing_kernel)
    assert not is_blank_kernel(nk.solution_rope_interleaved)


def test_solution_matches_reference_on_partial_rotary():
    # independent of the check: the tail passes bit-exactly, the rotated part matches
    torch.manual_seed(0)
    S, B, H, D, R = 3, 2, 1, 12, 8
    x = torch.randn(S, B, H, D, device=DEVICE)
    f = torch.rand(S, R // 2).repeat_interleave(2, -1).contiguous().to(DEVICE)
    y = torch.full_like(x, float("nan"))
    nk.launch_interleaved(nk.solution_rope_interleaved, x, f, y)
    assert torch.equal(y[..., R:], x[..., R:])
    torch.testing.assert_close(y, reference.rope_reference(x, f, interleaved=True),
                               atol=1e-5, rtol=1e-5)


# --- the access recorder ---------------------------------------------------------------------

@triton.jit
def _pair_swap_kernel(x_ptr, y_ptr, D: tl.constexpr, STRIDED: tl.constexpr):
    # y[2j] = x[2j+1], y[2j+1] = x[2j] for one row per program
    row = tl.program_id(0)
    j = tl.arange(0, D // 2)
    even = row * D + 2 * j
    if STRIDED:
        a = tl.load(x_ptr + even)
        b = tl.load(x_ptr + even + 1)
        tl.store(y_ptr + even, b)
        tl.store(y_ptr + even + 1, a)
    else:
        pair = even[:, None] + tl.arange(0, 2)[None, :]
        a, b = tl.split(tl.load(x_ptr + pair))
        tl.store(y_ptr + pair, tl.join(b, a))


def test_record_measures_addresses_and_sectors():
    x = torch.randn(2, 64, dtype=torch.bfloat16)  # a row is 128 bytes: 4 sectors
    for strided in (False, True):
        y = torch.zeros_like(x)
        log = access.record(_pair_swap_kernel, (2,), x, y, D=64, STRIDED=strided)
        assert torch.equal(y, x.view(2, 32, 2).flip(-1).reshape(2, 64))  # it really ran
        assert [a.program[0] for a in log] == sorted(a.program[0] for a in log)
        groups = access.by_tensor(log, {"x": x, "y": y})
        n = 2 if strided else 1
        assert len(groups["x"]) == len(groups["y"]) == 2 * n
        first = groups["x"][0]
        assert first.itemsize == 2 and first.program == (0, 0, 0)
        want = np.arange(0, 128, 4) if strided else np.arange(0, 128, 2)
        np.testing.assert_array_equal(first.offsets(x), want)
        use = access.sector_use(first, x.data_ptr())
        assert sorted(use) == [0, 1, 2, 3]
        assert set(use.values()) == ({16} if strided else {32})
        loads, stores = access.summary(log, "load"), access.summary(log, "store")
        assert loads["distinct sectors"] == stores["distinct sectors"] == 8
        assert loads["sectors moved"] == stores["sectors moved"] == 8 * n
        assert loads["efficiency"] == pytest.approx(1 / n)


def test_record_drops_masked_lanes_and_restores_the_interpreter():
    from triton.runtime import interpreter

    before = interpreter.InterpreterBuilder.create_masked_load
    x = torch.arange(64, dtype=torch.float32)
    y = torch.zeros(64)
    log = access.record(nk.solution_rope_interleaved, (1,), x.view(1, 1, 1, 64)[..., :40].clone(),
                        torch.zeros(1, 1, 1, 40), torch.zeros(1, 8), 1, 1, 40, 40, 40, 1,
                        D=40, R=8, BLOCK_PAIRS=32)
    assert interpreter.InterpreterBuilder.create_masked_load is before
    angle_load = log[0]
    assert angle_load.kind == "load" and len(angle_load.addresses) == 4  # R/2 of 32 lanes live
    assert all(len(a.addresses) == 20 for a in log[1:])                   # D/2 of 32 lanes
    with pytest.raises(TypeError, match="@triton.jit kernel"):
        access.record(_reference_launcher, (1,), x, y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA tensor to refuse")
def test_record_refuses_gpu_tensors():
    x = torch.zeros(64, device="cuda")
    with pytest.raises(ValueError, match="CPU tensors"):
        access.record(_pair_swap_kernel, (1,), x, x, D=64, STRIDED=True)


# --- exercise 5: a kernel of ROWS rows a program, and the prediction of its time ------------------

OWN_ROWS = learner_copy(nk.solution_rope_rows)
OWN_PREDICTION = learner_copy(nk.solution_predicted_us)


@triton.jit
def _rows_blank(x_ptr, y_ptr, freqs_ptr, n_rows, B, H, stride_xs, stride_xb, stride_xh, stride_xd,
                stride_fs, stride_fd, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                ROWS: tl.constexpr):
    ...  # your code


@triton.jit
def _rows_one_row(x_ptr, y_ptr, freqs_ptr, n_rows, B, H, stride_xs, stride_xb, stride_xh,
                  stride_xd, stride_fs, stride_fd, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  ROWS: tl.constexpr):
    # step 3 as it was: ROWS ignored, one row a program, so most rows of a ROWS > 1 grid stay NaN
    row = tl.program_id(0).to(tl.int64)
    s, b, h = row // (B * H), (row // H) % B, row % H
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    t1 = tl.load(freqs_ptr + s * stride_fs + offs * stride_fd, mask=mask, other=0.0)
    t2 = tl.load(freqs_ptr + s * stride_fs + (offs + HALF) * stride_fd, mask=mask, other=0.0)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * 2 * HALF + offs,
             (x1 * tl.cos(t1) - x2 * tl.sin(t1)).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + row * 2 * HALF + HALF + offs,
             (x2 * tl.cos(t2) + x1 * tl.sin(t2)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rows_every_program_all(x_ptr, y_ptr, freqs_ptr, n_rows, B, H, stride_xs, stride_xb,
                            stride_xh, stride_xd, stride_fs, stride_fd, HALF: tl.constexpr,
                            BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr):
    # right values, but every program rotates every row: no fewer programs' worth of work each
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    for row in range(n_rows):
        s, b, h = row // (B * H), (row // H) % B, row % H
        t1 = tl.load(freqs_ptr + s * stride_fs + offs * stride_fd, mask=mask, other=0.0)
        t2 = tl.load(freqs_ptr + s * stride_fs + (offs + HALF) * stride_fd, mask=mask, other=0.0)
        x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
        x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * 2 * HALF + offs,
                 (x1 * tl.cos(t1) - x2 * tl.sin(t1)).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_ptr + row * 2 * HALF + HALF + offs,
                 (x2 * tl.cos(t2) + x1 * tl.sin(t2)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rows_unmasked_loads(x_ptr, y_ptr, freqs_ptr, n_rows, B, H, stride_xs, stride_xb, stride_xh,
                         stride_xd, stride_fs, stride_fd, HALF: tl.constexpr,
                         BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr):
    # the worked kernel with its loads' masks forgotten: right outputs (the stores are masked),
    # but at D = 24 the last rows' loads read past the end of x
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    s, b = row0 // (B * H), (row0 // H) % B
    h = (row0 % H + tl.arange(0, ROWS))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = offs < HALF
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd)
    c1, s1, c2, s2 = tl.cos(theta1), tl.sin(theta1), tl.cos(theta2), tl.sin(theta2)
    x_row = x_ptr + s * stride_xs + b * stride_xb + h * stride_xh
    x1 = tl.load(x_row + offs * stride_xd).to(tl.float32)
    x2 = tl.load(x_row + (offs + HALF) * stride_xd).to(tl.float32)
    y_row = y_ptr + (row0 + tl.arange(0, ROWS))[:, None] * 2 * HALF
    tl.store(y_row + offs, (x1 * c1 - x2 * s1).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + HALF + offs, (x2 * c2 + x1 * s2).to(y_ptr.dtype.element_ty), mask=mask)


ROWS_CHEATS = {
    "a blank kernel": _rows_blank,
    "step 3 as it was, one row a program": _rows_one_row,
    "a kernel whose every program rotates every row": _rows_every_program_all,
    "a kernel that evaluates cos and sin for every row": learner_copy(nk.rows_sincos_every_row),
    "a kernel that loads without masks": _rows_unmasked_loads,
    "the worked solution itself": nk.solution_rope_rows,
    "ropelib's naive teaching kernel": naive._rope_naive_kernel,
    "the plain PyTorch reference": reference.rope_reference,
}


@pytest.mark.parametrize("what", list(ROWS_CHEATS))
def test_rows_check_rejects(what, capsys):
    assert nk.check_rope_rows(ROWS_CHEATS[what], seed=3) is False
    out = capsys.readouterr().out
    assert "❌" in out and "✅" not in out


def test_rows_check_says_why(capsys):
    nk.check_rope_rows(_rows_every_program_all, seed=0)
    assert "program 0 wrote rows" in capsys.readouterr().out
    nk.check_rope_rows(learner_copy(nk.rows_sincos_every_row), seed=0)
    assert "4 rows' worth" in capsys.readouterr().out
    nk.check_rope_rows(nk.solution_rope_rows, seed=0)
    assert "launched ropelib's solution_rope_rows" in capsys.readouterr().out
    nk.check_rope_rows(_rows_unmasked_loads, seed=0)
    assert "lanes outside x and freqs" in capsys.readouterr().out


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_check_accepts_an_own_copy_of_the_solution(seed, capsys):
    assert nk.check_rope_rows(OWN_ROWS, seed=seed) is True, capsys.readouterr().out
    assert "✅" in capsys.readouterr().out


def test_rows_solution_matches_step_three_rows():
    # independent of the check: every ROWS gives the reference's rotation, tail included
    torch.manual_seed(0)
    x = torch.randn(3, 2, 8, 24, device=DEVICE)
    f = torch.rand(4, 24, device=DEVICE) * 6
    for rows in (1, 2, 4, 8):
        y = torch.full_like(x, float("nan"))
        nk.launch_rows(nk.solution_rope_rows, x, f, y, rows)
        torch.testing.assert_close(y, reference.rope_reference(x, f), atol=1e-5, rtol=1e-5)


def test_launch_rows_num_warps():
    # by default the ablation's warps for a tile of ROWS heads; num_warps= overrides it
    from ropelib.course.kernels import ablation

    class Recorder:                  # stands in for kernel[grid](...): records the launch
        def __getitem__(self, grid):
            def launch(*args, **kw):
                self.grid, self.kw = grid, kw
            return launch

    x = torch.zeros(8, 1, 32, 128)
    f, y = torch.zeros(8, 128), torch.zeros(8, 1, 32, 128)
    k = Recorder()
    for rows, warps in ((1, 1), (2, 1), (4, 2), (8, 4), (32, 8)):
        nk.launch_rows(k, x, f, y, rows)
        assert k.kw["num_warps"] == warps == ablation.default_warps(rows * 64)
        assert k.grid == (8 * 32 // rows,) and k.kw["ROWS"] == rows
    nk.launch_rows(k, x, f, y, 8, num_warps=1)
    assert k.kw["num_warps"] == 1
    nk.launch_rows(k, x, f, y, 4, programs=3, num_warps=8)
    assert k.kw["num_warps"] == 8 and k.grid == (3,)
    # a real launch at other warps gives the reference's rotation
    torch.manual_seed(0)
    x = torch.randn(3, 2, 4, 24, device=DEVICE)
    f = torch.rand(4, 24, device=DEVICE) * 6
    for warps in (1, 2, 4):
        y = torch.full_like(x, float("nan"))
        nk.launch_rows(nk.solution_rope_rows, x, f, y, 4, num_warps=warps)
        torch.testing.assert_close(y, reference.rope_reference(x, f), atol=1e-5, rtol=1e-5)


def test_prediction_check(capsys):
    assert ex.check_predicted_us(OWN_PREDICTION) is True, capsys.readouterr().out
    for wrong in (lambda n, r, sms, ns, copy: n * ns / sms / 1e3,            # ROWS ignored
                  lambda n, r, sms, ns, copy: n / r * ns / sms / 1e3,        # no copy floor
                  lambda n, r, sms, ns, copy: max(n // r * ns / sms / 1e3, copy),   # rounded down
                  nk.solution_predicted_us, None):
        assert ex.check_predicted_us(wrong) is False
    out = capsys.readouterr().out
    assert out.count("❌") == 5


def test_rows_sin_cos_once_a_program():
    # the worked kernel evaluates one row's sines and cosines a program; the per-row one ROWS
    from ropelib.course import work_count
    x, f = torch.randn(2, 1, 8, 16), torch.rand(2, 16)
    for kernel, per_program in ((nk.solution_rope_rows, 32), (nk.rows_sincos_every_row, 128)):
        with work_count.count_work() as work:
            nk.launch_rows(work_count.interpreted(kernel), x, f, torch.empty_like(x), 4)
        assert (work.programs, work.sincos) == (4, 4 * per_program)
    with pytest.raises(ValueError, match="must divide H"):
        nk.launch_rows(nk.solution_rope_rows, x, f, torch.empty_like(x), 16)


def test_rows_reexported():
    assert ex.check_rope_rows is nk.check_rope_rows
    assert ex.solution_rope_rows is nk.solution_rope_rows
    assert ex.launch_rows is nk.launch_rows


def test_rows_check_launches_through_the_launcher_it_is_given(capsys):
    """Notebook 03 passes its own launch_rows: the check must start the kernel through it (so a
    launcher that launches nothing fails the check) and pass with one that launches as
    nk.launch_rows does."""
    calls = []

    def counting(kernel, *args, **kwargs):
        calls.append(kwargs.get("num_warps"))
        nk.launch_rows(kernel, *args, **kwargs)

    assert nk.check_rope_rows(OWN_ROWS, seed=1, launch=counting) is True, capsys.readouterr().out
    assert len(calls) == len(nk.ROWS_CASES) + 3   # every case, program 0 alone, the loads, the count

    def launches_nothing(kernel, *args, **kwargs):
        pass

    assert nk.check_rope_rows(OWN_ROWS, seed=1, launch=launches_nothing) is False
