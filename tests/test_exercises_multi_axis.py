"""The notebook 10 checks in ropelib.course.exercises.multi_axis: each accepts its worked
solution, rejects wrong answers and answers that call ropelib's own (the library computes the
expected values; the learner's code must compute the answer), and never raises. The kernel
check also counts sines and cosines: a kernel with the right values that forms its angles per
head fails. Under Triton's interpreter on the CPU, tiny shapes."""
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from ropelib import mrope
from ropelib.course.exercises import multi_axis as ex
from ropelib.course.work_count import count_work, interpreted
from ropelib.course.kernels.ablation import _rotate_tile
from ropelib.kernels.common import rotate_pair
from ropelib.kernels.mrope import _mrope_cos_sin
from loading import learner_copy  # noqa: E402  (a solution as a learner who typed it has it)

ROOT = Path(__file__).resolve().parents[1]


# --- 1. the axis of each pair -------------------------------------------------------------------

def test_axis_of_pairs_solution_passes(capsys):
    assert ex.check_axis_of_pairs(learner_copy(ex.solution_axis_of_pairs)) is True
    assert capsys.readouterr().out.startswith("✅ axis of each pair: correct")


@pytest.mark.parametrize("library", [
    lambda s, i: mrope.axis_of_pairs(s, "mrope_interleaved" if i else "mrope"),
    lambda s, i: mrope.multi_axis_frequencies(2 * sum(s), s, 1e4,
                                              style="mrope_interleaved" if i else "mrope").axis,
], ids=["axis_of_pairs", "multi_axis_frequencies"])
def test_axis_of_pairs_rejects_the_library(library, capsys):
    assert ex.check_axis_of_pairs(library) is False
    out = capsys.readouterr().out
    assert "❌ axis of each pair" in out and "called ropelib's" in out


def test_axis_of_pairs_rejects_wrong_and_unanswered(capsys):
    # contiguous runs where Qwen3-VL interleaves
    own = learner_copy(ex.solution_axis_of_pairs)
    assert ex.check_axis_of_pairs(lambda s, i: own(s, False)) is False
    assert "hint:" in capsys.readouterr().out
    assert ex.check_axis_of_pairs(lambda s, i: None) is False
    assert "returned None" in capsys.readouterr().out


# --- 2. text, then an image -----------------------------------------------------------------------

def test_text_then_image_solution_passes(capsys):
    assert ex.check_text_then_image(learner_copy(ex.solution_text_then_image)) is True
    assert capsys.readouterr().out.startswith("✅ text-then-image positions: correct")


def test_text_then_image_rejects_the_library(capsys):
    def with_grid_positions(n, h, w):
        image = mrope.grid_positions(1, h, w, start=n)
        return torch.cat([torch.arange(n).expand(3, n), image,
                          torch.full((3, 1), int(image.max()) + 1)], 1)

    assert ex.check_text_then_image(with_grid_positions) is False
    out = capsys.readouterr().out
    assert "called ropelib's grid_positions" in out


def test_text_then_image_rejects_transformers_numbering(capsys):
    # transformers' get_rope_index, called as notebook 10 calls it, numbers the prompt right
    M = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl").Qwen2VLModel
    stub = types.SimpleNamespace(config=types.SimpleNamespace(
        vision_config=types.SimpleNamespace(spatial_merge_size=2)))
    if hasattr(M, "get_vision_position_ids"):
        stub.get_vision_position_ids = lambda *a, **kw: M.get_vision_position_ids(stub, *a, **kw)

    def with_transformers(n, h, w):
        types_ = torch.tensor([[0] * n + [1] * (h * w) + [0]])
        positions, _ = M.get_rope_index(stub, torch.zeros_like(types_), types_,
                                        image_grid_thw=torch.tensor([[1, 2 * h, 2 * w]]))
        return positions[:, 0]

    try:
        right = torch.equal(with_transformers(3, 2, 3), ex.solution_text_then_image(3, 2, 3))
    except (TypeError, AttributeError, ValueError):
        pytest.skip("this transformers' get_rope_index takes other arguments")
    assert right, "the control: transformers numbers the prompt as the exercise asks"
    assert ex.transformers_rope_index()
    assert ex.check_text_then_image(with_transformers) is False
    assert "get_rope_index" in capsys.readouterr().out


def test_text_then_image_rejects_a_wrong_advance(capsys):
    # the next text token after h*w positions instead of max(h, w)
    own = learner_copy(ex.solution_text_then_image)
    assert ex.check_text_then_image(
        lambda n, h, w: torch.cat([own(n, h, w)[:, :-1],
                                   torch.full((3, 1), n + h * w)], 1)) is False
    assert "❌ text-then-image positions" in capsys.readouterr().out


# --- 3. the kernel --------------------------------------------------------------------------------

@triton.jit
def _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF: tl.constexpr, N_AXES: tl.constexpr,
            BLOCK_T: tl.constexpr):
    j = tl.arange(0, HALF)
    inv = tl.load(inv_freq_ptr + j)
    ax = tl.load(axis_ptr + j)
    p = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
    for a in tl.static_range(N_AXES):
        p_a = tl.load(pos_ptr + a * T + t, mask=t < T, other=0).to(tl.float32)
        p = tl.where(ax[None, :] == a, p_a[:, None], p)
    theta = p * inv[None, :]
    return tl.cos(theta), tl.sin(theta)


@triton.jit
def _rotate(x_ptr, y_ptr, row, c, s, live, HALF: tl.constexpr):
    j = tl.arange(0, HALF)[None, :]
    x1 = tl.load(x_ptr + row + j, mask=live).to(tl.float32)
    x2 = tl.load(x_ptr + row + HALF + j, mask=live).to(tl.float32)
    tl.store(y_ptr + row + j, x1 * c - x2 * s, mask=live)
    tl.store(y_ptr + row + HALF + j, x2 * c + x1 * s, mask=live)


@triton.jit
def per_head_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
                    BLOCK_T: tl.constexpr):
    # right values, angles formed again for every head
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    for h in range(HQ):
        c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)
    for h in range(HK):
        c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


@triton.jit
def library_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                   HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
                   BLOCK_T: tl.constexpr):
    # the solution's structure, with the rotation taken from ropelib's kernels
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    j = tl.arange(0, HALF)[None, :]
    c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
    for h in range(HQ):
        row = (t[:, None] * HQ + h) * D
        x1 = tl.load(q_ptr + row + j, mask=live).to(tl.float32)
        x2 = tl.load(q_ptr + row + HALF + j, mask=live).to(tl.float32)
        y1, y2 = rotate_pair(x1, x2, c, s, c, s)
        tl.store(q_out_ptr + row + j, y1, mask=live)
        tl.store(q_out_ptr + row + HALF + j, y2, mask=live)
    for h in range(HK):
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


@triton.jit
def axis_zero_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                     HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
                     BLOCK_T: tl.constexpr):
    # every pair follows axis 0: plain 1-D RoPE
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    inv = tl.load(inv_freq_ptr + tl.arange(0, HALF))
    p = tl.load(pos_ptr + t, mask=t < T, other=0).to(tl.float32)
    theta = p[:, None] * inv[None, :]
    c, s = tl.cos(theta), tl.sin(theta)
    for h in range(HQ):
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)
    for h in range(HK):
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


@triton.jit
def q_only_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                  HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
                  BLOCK_T: tl.constexpr):
    # forgets k
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
    for h in range(HQ):
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)


@triton.jit
def blank_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                 HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    # 1. ... 2. ... 3. ...
    pass


def test_kernel_solution_passes(capsys):
    assert ex.check_mrope_kernel(learner_copy(ex.solution_mrope_kernel)) is True
    out = capsys.readouterr().out
    assert out.startswith("✅ multi-axis RoPE kernel: correct on 3 launches")
    assert "1 sine-cosine pair per (token, pair)" in out


def test_kernel_with_angles_per_head_fails_on_its_count(capsys):
    assert ex.check_mrope_kernel(per_head_kernel, seed=1) is False
    out = capsys.readouterr().out
    assert "right values, but" in out and "Form the angles once per token" in out


@triton.jit
def angles_twice_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                        HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                        N_AXES: tl.constexpr, BLOCK_T: tl.constexpr):
    # right values, the angles formed once before q's heads and again before k's
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
    for h in range(HQ):
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)
    c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
    for h in range(HK):
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


@triton.jit
def shifted_cos_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                       HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                       N_AXES: tl.constexpr, BLOCK_T: tl.constexpr):
    # angles once, the cosine taken as sin(theta + pi/2): two sines, no cosine, per (token, pair)
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    j = tl.arange(0, HALF)
    inv = tl.load(inv_freq_ptr + j)
    ax = tl.load(axis_ptr + j)
    p = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
    for a in tl.static_range(N_AXES):
        p_a = tl.load(pos_ptr + a * T + t, mask=t < T, other=0).to(tl.float32)
        p = tl.where(ax[None, :] == a, p_a[:, None], p)
    theta = p * inv[None, :]
    s = tl.sin(theta)
    c = tl.sin(theta + 1.5707963267948966)
    for h in range(HQ):
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)
    for h in range(HK):
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


def test_kernel_forming_angles_twice_fails(capsys):
    """Once before q's heads and once more before k's: 4 sines and cosines per (token, pair)."""
    assert ex.check_mrope_kernel(angles_twice_kernel, seed=4) is False
    out = capsys.readouterr().out
    assert "right values, but" in out and "2 sine-cosine pairs per (token, pair)" in out


def test_kernel_count_is_of_sines_and_cosines_together():
    """The count the check applies: one sine and one cosine per (token, pair) is 2, and so is a
    kernel that takes its cosine as a shifted sine; angles formed twice are 4."""
    T, HQ, HK, D, B = 8, 3, 2, 16, 4
    f = mrope.multi_axis_frequencies(D, [2, 3, 3], 1e4)
    pos = torch.randint(0, 50, (3, T), dtype=torch.int32)
    q, k = torch.randn(T, HQ, D), torch.randn(T, HK, D)
    slots = T * D // 2
    for kern, per_slot in ((ex.solution_mrope_kernel, 2), (shifted_cos_kernel, 2),
                           (angles_twice_kernel, 4)):
        w = ex.count_mrope(kern, q, k, pos, f, B)
        assert (w.sin + w.cos) == per_slot * slots, (kern, w)


@triton.jit
def shipped_angles_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr,
                          T, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                          N_AXES: tl.constexpr, BLOCK_T: tl.constexpr):
    # the angles from the shipped multi-axis kernel's helper
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    j = tl.arange(0, HALF)
    inv = tl.load(inv_freq_ptr + j)
    ax = tl.load(axis_ptr + j)
    c, s = _mrope_cos_sin(pos_ptr, inv, ax, t, 0, T, T, 0, 1, BLOCK_T, HALF, N_AXES, tl.float32)
    for h in range(HQ):
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)
    for h in range(HK):
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


@triton.jit
def teaching_tile_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr,
                         T, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                         N_AXES: tl.constexpr, BLOCK_T: tl.constexpr):
    # the rotation from a teaching kernel's helper (notebook 04's ablation)
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    j = tl.arange(0, HALF)[None, :]
    c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
    for h in range(HQ):
        row = (t[:, None] * HQ + h) * D + j
        _rotate_tile(q_ptr, q_out_ptr, row, row, live, c, s, c, s, HALF, False)
    for h in range(HK):
        row = (t[:, None] * HK + h) * D + j
        _rotate_tile(k_ptr, k_out_ptr, row, row, live, c, s, c, s, HALF, False)


@pytest.mark.parametrize("kernel,says", [
    (shipped_angles_kernel, "ropelib's _mrope_cos_sin (ropelib/kernels/mrope.py)"),
    (teaching_tile_kernel, "ropelib's _rotate_tile (ropelib/course/kernels/ablation.py)"),
], ids=["shipped-mrope-helper", "teaching-kernel-helper"])
def test_kernel_calling_library_helpers_is_refused(kernel, says, capsys):
    """The natural shortcuts: the shipped kernel's angle helper, a teaching kernel's rotation."""
    assert ex.check_mrope_kernel(kernel, seed=5) is False
    out = capsys.readouterr().out
    assert "❌ multi-axis RoPE kernel" in out and says in out, out


def test_kernel_calling_ropelibs_kernels_fails(capsys):
    assert ex.check_mrope_kernel(library_kernel, seed=2) is False
    out = capsys.readouterr().out
    assert "ropelib's rotate_pair (ropelib/kernels/common.py)" in out


def test_kernel_check_rejects_the_finished_function(capsys):
    def apply(q, k, positions, freqs):           # not a kernel: the library's answer
        return mrope.apply_mrope_qk(q, k, positions, freqs, layout="thd")

    assert ex.check_mrope_kernel(apply) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,says", [(axis_zero_kernel, "entries differ"),
                                        (q_only_kernel, "never written")])
def test_kernel_rejects_wrong_kernels(wrong, says, capsys):
    assert ex.check_mrope_kernel(wrong, seed=3) is False
    out = capsys.readouterr().out
    assert "❌ multi-axis RoPE kernel" in out and says in out


def test_kernel_rejects_blank_and_nothing(capsys):
    assert ex.check_mrope_kernel(blank_kernel) is False
    assert "no kernel yet" in capsys.readouterr().out
    assert ex.check_mrope_kernel(...) is False
    assert "no kernel yet" in capsys.readouterr().out



# --- appendix C: heads per loop step --------------------------------------------------------------

@triton.jit
def blank_heads_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr, T,
                       HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                       N_AXES: tl.constexpr, BLOCK_T: tl.constexpr, HPS: tl.constexpr):
    # your code
    pass


@triton.jit
def one_head_a_step_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr,
                           T, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                           N_AXES: tl.constexpr, BLOCK_T: tl.constexpr, HPS: tl.constexpr):
    # right values, HPS taken and ignored: one head a loop step
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = (t < T)[:, None]
    c, s = _angles(pos_ptr, inv_freq_ptr, axis_ptr, t, T, HALF, N_AXES, BLOCK_T)
    for h in range(HQ):
        _rotate(q_ptr, q_out_ptr, (t[:, None] * HQ + h) * D, c, s, live, HALF)
    for h in range(HK):
        _rotate(k_ptr, k_out_ptr, (t[:, None] * HK + h) * D, c, s, live, HALF)


@triton.jit
def _rotate_heads(x_ptr, y_ptr, t, T, c, s, H: tl.constexpr, D: tl.constexpr,
                  HPS: tl.constexpr):
    # the worked heads answer's loop: HPS heads of each token a step, heads past H masked
    HALF: tl.constexpr = D // 2
    g = tl.arange(0, HPS)
    jj = tl.arange(0, HALF)[None, None, :]
    for h0 in range(0, H, HPS):
        hh = h0 + g
        live = (t < T)[:, None, None] & (hh < H)[None, :, None]
        row = (t[:, None, None] * H + hh[None, :, None]) * D
        x1 = tl.load(x_ptr + row + jj, mask=live).to(tl.float32)
        x2 = tl.load(x_ptr + row + HALF + jj, mask=live).to(tl.float32)
        tl.store(y_ptr + row + jj, x1 * c - x2 * s, mask=live)
        tl.store(y_ptr + row + HALF + jj, x2 * c + x1 * s, mask=live)


@triton.jit
def shipped_helper_heads_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr,
                                axis_ptr, T, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                                N_AXES: tl.constexpr, BLOCK_T: tl.constexpr, HPS: tl.constexpr):
    # the worked answer's steps, with the angles from the shipped kernel's helper
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, HALF)
    inv = tl.load(inv_freq_ptr + j)
    ax = tl.load(axis_ptr + j)
    c, s = _mrope_cos_sin(pos_ptr, inv, ax, t, 0, T, T, 0, 1, BLOCK_T, HALF, N_AXES, tl.float32)
    c, s = c[:, None, :], s[:, None, :]
    _rotate_heads(q_ptr, q_out_ptr, t, T, c, s, HQ, D, HPS)
    _rotate_heads(k_ptr, k_out_ptr, t, T, c, s, HK, D, HPS)


def test_heads_kernel_solution_passes(capsys):
    assert ex.check_mrope_heads_kernel(learner_copy(ex.solution_mrope_heads_kernel)) is True
    out = capsys.readouterr().out
    assert out.startswith("✅ multi-axis RoPE kernel, heads per step: correct on 18 launches")


def test_heads_kernel_rejects_blank_and_nothing(capsys):
    assert ex.check_mrope_heads_kernel(blank_heads_kernel) is False
    assert "no kernel yet" in capsys.readouterr().out
    assert ex.check_mrope_heads_kernel(...) is False
    assert "no kernel yet" in capsys.readouterr().out


def test_heads_kernel_refuses_the_shipped_helper(capsys):
    assert ex.check_mrope_heads_kernel(shipped_helper_heads_kernel, seed=5) is False
    out = capsys.readouterr().out
    assert "❌ multi-axis RoPE kernel, heads per step" in out
    assert "ropelib's _mrope_cos_sin (ropelib/kernels/mrope.py)" in out, out


def test_heads_kernel_needs_the_heads_in_one_step(capsys):
    # right values one head a step: refused on what the first program loads before it stores;
    # a kernel without HPS at all: refused at once
    assert ex.check_mrope_heads_kernel(one_head_a_step_kernel, seed=6) is False
    out = capsys.readouterr().out
    assert "right values, but the first program loaded" in out and "HPS=2" in out, out
    assert ex.check_mrope_heads_kernel(learner_copy(ex.solution_mrope_kernel)) is False
    assert "has no HPS parameter" in capsys.readouterr().out


def test_checks_and_counts_launch_through_the_launcher_passed(capsys):
    """Notebook 10 defines its own launcher and passes it as launch=: every launch of the checks
    and of count_mrope goes through it, with the tile and HPS of each case."""
    calls = []

    def launcher(kernel, q, k, positions, freqs, BLOCK_T, out=None, num_warps=4, HPS=None):
        calls.append((BLOCK_T, HPS))
        return ex.launch_mrope(kernel, q, k, positions, freqs, BLOCK_T, out=out,
                               num_warps=num_warps, HPS=HPS)

    assert ex.check_mrope_kernel(learner_copy(ex.solution_mrope_kernel), launch=launcher)
    assert calls == [(case[-1], None) for case in ex.KERNEL_CASES]
    calls.clear()
    assert ex.check_mrope_heads_kernel(learner_copy(ex.solution_mrope_heads_kernel),
                                       launch=launcher)
    assert sorted(set(calls)) == sorted({(b, h) for h in ex.HEADS_PER_STEP_CHECKED
                                         for case in ex.KERNEL_CASES for b in (case[-1], 1)})
    calls.clear()
    f = mrope.multi_axis_frequencies(16, [2, 3, 3], 1e4)
    q, k = torch.randn(8, 2, 16), torch.randn(8, 1, 16)
    pos = torch.randint(0, 50, (3, 8), dtype=torch.int32)
    w = ex.count_mrope(ex.solution_mrope_kernel, q, k, pos, f, 4, launch=launcher)
    assert calls == [(4, None)] and w.programs == 2
    capsys.readouterr()


def test_counts_of_both_kernels():
    T, HQ, HK, D, B = 8, 6, 2, 16, 4
    f = mrope.multi_axis_frequencies(D, [2, 3, 3], 1e4)
    pos = torch.randint(0, 50, (3, T), dtype=torch.int32)
    q, k = torch.randn(T, HQ, D), torch.randn(T, HK, D)
    once = ex.count_mrope(ex.solution_mrope_kernel, q, k, pos, f, B)
    per_head = ex.count_mrope(per_head_kernel, q, k, pos, f, B)
    slots = T * D // 2
    assert once.programs == per_head.programs == T // B
    assert (once.sin, once.cos) == (slots, slots)
    assert (per_head.sin, per_head.cos) == ((HQ + HK) * slots,) * 2
    assert once.loads["positions"] == 3 * T and per_head.loads["positions"] == (HQ + HK) * 3 * T
    assert once.loads["q"] == per_head.loads["q"] == q.numel()
    assert once.loads["inv_freq"] == once.programs * D // 2


def test_count_work_counts_masked_loads_and_every_lane():
    @triton.jit
    def k(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < N, other=0.0)
        tl.store(y_ptr + i, tl.sin(x), mask=i < N)

    x, y = torch.randn(10), torch.empty(10)
    with count_work(x=x, y=y) as w:
        interpreted(k)[(3,)](x, y, 10, BLOCK=4)
    assert (w.programs, w.sin, w.cos, w.loads) == (3, 12, 0, {"x": 10, "y": 0})
    with pytest.raises(ValueError, match="CPU tensors"):
        with count_work(x=torch.empty(1, device="meta")):
            pass


def test_interpreted_runs_compiled_mode_kernels_with_their_helpers():
    """Where kernels are compiled (a GPU machine, no TRITON_INTERPRET), `interpreted` still runs
    a kernel and the @triton.jit helpers it calls in the interpreter, counting its work, and
    leaves triton.language as it found it: here a CPU process without the interpreter
    switched on."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from triton.runtime.jit import JITFunction
        from ropelib import mrope
        from ropelib.course.exercises import multi_axis as ex
        from ropelib.course.work_count import interpreted
        import tests.test_exercises_multi_axis as t
        assert isinstance(t.per_head_kernel, JITFunction), type(t.per_head_kernel)
        import inspect
        spaces = (tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base)
        before = [dict(vars(space)) for space in spaces]
        T, HQ, HK, D = 5, 3, 1, 16
        f = mrope.multi_axis_frequencies(D, [3, 3, 2], 1e4, style="mrope_interleaved")
        pos = torch.randint(0, 50, (3, T), dtype=torch.int32)
        q, k = torch.randn(T, HQ, D), torch.randn(T, HK, D)
        theta = pos[f.axis.long()].T.float() * f.inv_freq                 # [T, D/2]
        c, s = torch.cat([theta.cos()] * 2, -1)[:, None], torch.cat([theta.sin()] * 2, -1)[:, None]
        rot = lambda x: torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
        for kern in (ex.solution_mrope_kernel, t.per_head_kernel):
            got = ex.launch_mrope(interpreted(kern), q, k, pos, f, 4)
            for g, x in zip(got, (q, k)):
                torch.testing.assert_close(g, x * c + rot(x) * s)
        w = ex.count_mrope(t.per_head_kernel, q, k, pos, f, 4)
        assert w.sin == (HQ + HK) * 2 * 4 * D // 2, w
        assert isinstance(t._angles, JITFunction)                          # put back after
        # triton.language as it was: the next compile (a GPU's) builds its IR with it
        changed = [name for space, old in zip(spaces, before) for name in set(vars(space)) | set(old)
                   if vars(space).get(name) is not old.get(name)
                   and not inspect.ismodule(vars(space).get(name))]
        assert not changed, changed
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT), str(ROOT / "tests")))   # (loading.py)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# --- the worked solutions are not the learner's answers ----------------------------------------

@triton.jit
def _calls_the_worked_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, axis_ptr,
                             T, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                             N_AXES: tl.constexpr, BLOCK_T: tl.constexpr):
    ex.solution_mrope_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr,
                             axis_ptr, T, HQ, HK, D, N_AXES, BLOCK_T)


@pytest.mark.parametrize("check,answer", [
    (ex.check_axis_of_pairs, ex.solution_axis_of_pairs),
    (ex.check_axis_of_pairs, lambda s, i: ex.solution_axis_of_pairs(s, i)),
    (ex.check_text_then_image, ex.solution_text_then_image),
    (ex.check_text_then_image, lambda n, h, w: ex.solution_text_then_image(n, h, w)),
    (ex.check_mrope_kernel, ex.solution_mrope_kernel),
    (ex.check_mrope_kernel, _calls_the_worked_kernel),
], ids=["axes", "axes-wrapped", "positions", "positions-wrapped", "kernel", "kernel-wrapped"])
def test_checks_refuse_the_worked_solution(check, answer, capsys):
    """Handing in the worked solution, or a wrapper of it, is not an answer."""
    assert check(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "solution" in out, out
