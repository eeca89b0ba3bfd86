"""Notebook 05's interleaved-tile exercise (ropelib/course/exercises/finished_kernel.py) wants the
learner's own kernel: the check accepts a kernel written from the signature, and refuses ropelib's
code handed in as the answer -- its finished, teaching and ladder kernels, the worked solution,
and a learner's kernel that calls one of ropelib's @triton.jit helpers (Triton inlines those, so
only the kernel's source shows them).

Every helper-calling kernel below computes the right values (launched here, outside the check):
what makes the check refuse it is whose code it runs, not a wrong answer. The learner kernels are
written to files of their own, as a notebook cell would define them.

(test_finished_kernel_notebook.py covers the exercise's known mistakes and non-kernel answers.)
"""
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402,F401  (the learner files import it)

from ropelib import reference, runtime  # noqa: E402
from ropelib.course import ladder  # noqa: E402
from ropelib.course.exercises import _compare  # noqa: E402
from ropelib.course.exercises import finished_kernel as fk  # noqa: E402
from ropelib.course.exercises.own_code import library_kernel  # noqa: E402
from ropelib.course.kernels import batch_reuse, naive  # noqa: E402
from ropelib.kernels import flat, fused  # noqa: E402
from loading import load_file, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "interleaved 3-D tile kernel"
REFUSED = (f"❌ {NAME}: this exercise wants your interleaved 3-D tile kernel, but the answer "
           "launched ropelib's ")

# --- the learner's kernel, from a template: one piece at a time can be ropelib's ---------------

HEADER = '''\
import triton
import triton.language as tl
{imports}


@triton.jit
def kernel(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb, syh, syd,
           HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
           BLOCK_H: tl.constexpr{params}):
'''
BODY = '''\
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    b_lo = tl.program_id(2) * B_CHUNK
    j = tl.arange(0, BLOCK_HALF)
    {pairs}
    row_ok = (s < S)[:, None, None] & (j < HALF)[None, None, :]
    ok = row_ok & (h < H)[None, :, None]
    f = freqs_ptr + s[:, None, None] * (2 * HALF)
    t_a = tl.load(f + d_a[None, None, :], mask=row_ok, other=0.0)
    t_b = tl.load(f + d_b[None, None, :], mask=row_ok, other=0.0)
    {trig}
    for b in range(b_lo, tl.minimum(b_lo + B_CHUNK, B)):
        xr = x_ptr + s[:, None, None] * sxs + b * sxb + h[None, :, None] * sxh
        yr = y_ptr + s[:, None, None] * sys_ + b * syb + h[None, :, None] * syh
        x_a = tl.load(xr + d_a[None, None, :] * sxd, mask=ok, other=0.0).to(tl.float32)
        x_b = tl.load(xr + d_b[None, None, :] * sxd, mask=ok, other=0.0).to(tl.float32)
        {rotate}
        tl.store(yr + d_a[None, None, :] * syd, {cast_a}, mask=ok)
        tl.store(yr + d_b[None, None, :] * syd, {cast_b}, mask=ok)
'''
OWN = dict(
    imports="", params="",
    pairs="d_a, d_b = 2 * j, 2 * j + 1",
    trig="c_a, s_a, c_b, s_b = tl.cos(t_a), tl.sin(t_a), tl.cos(t_b), tl.sin(t_b)",
    rotate="y_a, y_b = x_a * c_a - x_b * s_a, x_b * c_b + x_a * s_b",
    cast_a="y_a.to(y_ptr.dtype.element_ty)", cast_b="y_b.to(y_ptr.dtype.element_ty)")

# name -> (the pieces that differ from OWN, what the refusal names)
CALLS_ROPELIB = {
    "rotate_pair-as-module-attribute": (dict(
        imports="from ropelib.kernels import common",
        rotate="y_a, y_b = common.rotate_pair(x_a, x_b, c_a, s_a, c_b, s_b)"),
        "rotate_pair (ropelib/kernels/common.py)"),
    "cos_sin-imported-by-name": (dict(
        imports="from ropelib.kernels.common import cos_sin",
        trig="c_a, s_a = cos_sin(t_a, False)\n    c_b, s_b = cos_sin(t_b, False)"),
        "cos_sin (ropelib/kernels/common.py)"),
    "round_to-by-full-path": (dict(
        imports="import ropelib.kernels.common",
        cast_a="ropelib.kernels.common.round_to(y_a, y_ptr.dtype.element_ty, False)",
        cast_b="ropelib.kernels.common.round_to(y_b, y_ptr.dtype.element_ty, False)"),
        "round_to (ropelib/kernels/common.py)"),
    "pair_features-inside-an-own-helper": (dict(
        imports="from ropelib.kernels import common\n\n\n@triton.jit\n"
                "def my_pairs(j, HALF: tl.constexpr):\n"
                "    return common.pair_features(j, HALF, True)",
        pairs="d_a, d_b = my_pairs(j, HALF)"),
        "pair_features (ropelib/kernels/common.py)"),
}

# the whole tile done by the finished kernel's body: correct on every case of the check
FINISHED_BODY = '''\
import triton
import triton.language as tl
from ropelib.kernels import fused


@triton.jit
def kernel(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb, syh, syd,
           HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
           BLOCK_H: tl.constexpr):
    b_lo = tl.program_id(2) * B_CHUNK
    fused._rope_heads(x_ptr, y_ptr, freqs_ptr, None, None, None, None,
                      tl.program_id(0), tl.program_id(1) * BLOCK_H, b_lo,
                      tl.minimum(b_lo + B_CHUNK, B), S, H, S, 0, 1, 0,
                      sxs, sxb, sxh, 0, sxd, sys_, syb, syh, 0, 0, 2 * HALF, 0,
                      2 * HALF, 2 * HALF, 1, BLOCK_S, BLOCK_H, True, False, False, False,
                      False, tl.float32, False)
'''

# ways to reach a helper other than by its name: a parameter's default, a class's attribute
REACHED_ANOTHER_WAY = {
    # a constexpr parameter whose default is ropelib's helper: compiles for a GPU too
    "rotate_pair-as-parameter-default": dict(
        imports="from ropelib.kernels import common",
        params=", ROTATE: tl.constexpr = common.rotate_pair",
        rotate="y_a, y_b = ROTATE(x_a, x_b, c_a, s_a, c_b, s_b)"),
    # a class attribute: the interpreter runs it (a GPU compilation rejects the global)
    "rotate_pair-as-class-attribute": dict(
        imports="from ropelib.kernels import common\n\n\nclass Helpers:\n"
                "    rotate = common.rotate_pair",
        rotate="y_a, y_b = Helpers.rotate(x_a, x_b, c_a, s_a, c_b, s_b)"),
}
INTERPRETER_ONLY = pytest.mark.skipif(
    not runtime.INTERPRET, reason="a GPU compilation rejects a class attribute in a kernel")


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """name -> the learner's @triton.jit kernel, each defined in a file of its own."""
    folder = tmp_path_factory.mktemp("interleaved_learner")
    sources = {"own": HEADER.format(**OWN) + BODY.format(**OWN),
               "finished-kernel-body": FINISHED_BODY}
    for name, pieces in [(n, p) for n, (p, _) in CALLS_ROPELIB.items()] \
            + list(REACHED_ANOTHER_WAY.items()):
        parts = dict(OWN, **pieces)
        sources[name] = HEADER.format(**parts) + BODY.format(**parts)
    made = {}
    for name, src in sources.items():
        module = "interleaved_learner_" + name.replace("-", "_")
        made[name] = written_module(module, folder / f"{module}.py", src).kernel
    return made


def _right_on_every_case(kernel, seed=0):
    """Launch `kernel` as the check does, on its cases, with nothing barred: the values only."""
    gen = torch.Generator().manual_seed(seed)
    for S, B, H, D, bs, bh, chunk, dtype, xs, ys, table in fk.CASES:
        x, y, y_buf, f = fk._inputs(gen, S, B, H, D, dtype, xs, ys, table)
        fk.launch(kernel, x, y, f, bs, bh, chunk)
        band = y_buf[S:] if not ys else y_buf[B:]
        assert bool(torch.isnan(band).all()), "wrote past the output"
        ok, why = _compare(y, reference.rope_reference(x, f, interleaved=True), None, None)
        assert ok, (S, B, H, D, dtype, why)


# --- the learner's own kernel --------------------------------------------------------------------

def test_the_check_accepts_a_kernel_the_learner_wrote(learner, capsys):
    own = learner["own"]
    assert library_kernel(own) is None
    assert fk.check_interleaved_tile_kernel(own) is True
    assert fk.check_interleaved_tile_kernel(own, seed=11) is True
    out = capsys.readouterr().out
    assert out.count(f"✅ {NAME}: correct on {len(fk.CASES)} launches") == 2, out
    assert "❌" not in out


# --- a learner's kernel that runs ropelib's @triton.jit code -------------------------------------

@pytest.mark.parametrize("name", list(CALLS_ROPELIB) + ["finished-kernel-body"])
def test_kernels_that_call_ropelibs_helpers_compute_the_right_values(learner, name):
    # so the refusals below are about whose code runs, not about a wrong answer
    _right_on_every_case(learner[name])


@pytest.mark.parametrize("name, words", [
    *[(n, words) for n, (_, words) in CALLS_ROPELIB.items()],
    ("finished-kernel-body", "_rope_heads (ropelib/kernels/fused.py)"),
])
def test_the_check_refuses_a_kernel_that_calls_ropelibs_helpers(learner, name, words, capsys):
    assert fk.check_interleaved_tile_kernel(learner[name], seed=1) is False
    out = capsys.readouterr().out
    assert out.startswith(REFUSED + words), out
    assert "✅" not in out


# --- ropelib's kernels handed in as the answer ---------------------------------------------------

def _notebook_copy_of_the_last_rung():
    """The last rung as notebook 05 defines it in a cell: a copy, with the ladder's imports."""
    copy = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py").learner_copy
    return copy(ladder._ladder_final_kernel)


HANDED_IN = {
    "worked-solution": (lambda: fk._rope_interleaved_tile_solution_kernel,
                        "_rope_interleaved_tile_solution_kernel (ropelib/course/exercises/"
                        "finished_kernel.py)"),
    "finished-kernel": (lambda: fused._rope_kernel, "_rope_kernel (ropelib/kernels/fused.py)"),
    "finished-flat-kernel": (lambda: flat._rope_rows_kernel,
                             "_rope_rows_kernel (ropelib/kernels/flat.py)"),
    "teaching-batch-reuse": (lambda: batch_reuse._rope_batch_reuse_kernel,
                             "_rope_batch_reuse_kernel (ropelib/course/kernels/batch_reuse.py)"),
    "teaching-naive": (lambda: naive._rope_naive_kernel,
                       "_rope_naive_kernel (ropelib/course/kernels/naive.py)"),
    # notebook 05's ladder (ropelib/course/ladder.py): every kernel the course defines outside
    # its exercises is refused as itself
    "ladder-heads": (lambda: ladder._ladder_heads_kernel,
                     "_ladder_heads_kernel (ropelib/course/ladder.py)"),
    "ladder-tile": (lambda: ladder._ladder_tile_kernel,
                    "_ladder_tile_kernel (ropelib/course/ladder.py)"),
    "ladder-chunk": (lambda: ladder._ladder_chunk_kernel,
                     "_ladder_chunk_kernel (ropelib/course/ladder.py)"),
    "ladder-final": (lambda: ladder._ladder_final_kernel,
                     "_ladder_final_kernel (ropelib/course/ladder.py)"),
    # a learner's copy of the last rung: refused for the helpers of ropelib.kernels.common it
    # calls (which one is named first may vary)
    "ladder-final-notebook-copy": (_notebook_copy_of_the_last_rung,
                                   "(ropelib/kernels/common.py)"),
}


@pytest.mark.parametrize("name", list(HANDED_IN))
def test_the_check_refuses_ropelibs_kernels_handed_in(name, capsys):
    get, words = HANDED_IN[name]
    kernel = get()
    assert library_kernel(kernel, bar=(fk._rope_interleaved_tile_solution_kernel,)) is not None
    assert fk.check_interleaved_tile_kernel(kernel, seed=2) is False
    out = capsys.readouterr().out
    # refused as ropelib's code before it runs (not merely a launch that fails on the signature)
    assert out.startswith(REFUSED), out
    assert words in out.splitlines()[0], out
    assert out.count("❌") == 1 and "launching your kernel raised" not in out


# --- helpers the check does not see yet ----------------------------------------------------------
# own_code._jit_helpers finds a kernel's helpers through its global and closure names (and module
# attributes); a constexpr parameter's default and a class attribute escape it. The kernels are
# right (first test), so an accepting check passes ropelib's helper off as the learner's code.

@pytest.mark.parametrize("name", [
    "rotate_pair-as-parameter-default",
    pytest.param("rotate_pair-as-class-attribute", marks=INTERPRETER_ONLY),
])
def test_helpers_reached_another_way_compute_the_right_values(learner, name):
    _right_on_every_case(learner[name])


@pytest.mark.parametrize("name", [
    "rotate_pair-as-parameter-default",
    pytest.param("rotate_pair-as-class-attribute", marks=INTERPRETER_ONLY),
])
def test_the_check_refuses_helpers_reached_another_way(learner, name, capsys):
    assert fk.check_interleaved_tile_kernel(learner[name], seed=1) is False
    out = capsys.readouterr().out
    assert out.startswith(REFUSED + "rotate_pair (ropelib/kernels/common.py)"), out


# --- Exercise 1b: the same kernel with 16-byte loads, graded by its compiled loads --------------

VECTOR_KERNEL = '''\
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb, syh, syd,
           HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
           BLOCK_H: tl.constexpr):
    # a head's whole row of features as one tile; each pair's partner found in registers
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    k = tl.arange(0, 2 * BLOCK_HALF)
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (k < 2 * HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (k < 2 * HALF)[None, None, :]
    theta = tl.load(freqs_ptr + s[:, None, None] * (2 * HALF) + k[None, None, :], mask=tab_m,
                    other=0.0)
    c = tl.cos(theta)
    sn = tl.sin(theta)
    x_off = s[:, None, None] * sxs + h[None, :, None] * sxh + k[None, None, :] * sxd
    y_off = s[:, None, None] * sys_ + h[None, :, None] * syh + k[None, None, :] * syd
    for b in range(b_lo, b_hi):
        x = tl.load(x_ptr + x_off + b * sxb, mask=m, other=0.0).to(tl.float32)
        xe, xo = tl.split(tl.reshape(x, (BLOCK_S, BLOCK_H, BLOCK_HALF, 2)))
        partner = tl.reshape(tl.join(-xo, xe), (BLOCK_S, BLOCK_H, 2 * BLOCK_HALF))
        tl.store(y_ptr + y_off + b * syb, (x * c + partner * sn).to(y_ptr.dtype.element_ty),
                 mask=m)
'''


def _h200_args():
    """The notebook's EX1_ARGS: the H200's finished-kernel launch at bf16 s4096 b8 h32 d128."""
    bf16, fp32 = torch.empty(16, dtype=torch.bfloat16), torch.empty(16)
    strides = (8 * 32 * 128, 32 * 128, 128, 1)
    return dict(x_ptr=bf16, y_ptr=bf16, freqs_ptr=fp32, S=4096, B=8, H=32, B_CHUNK=8,
                **dict(zip(("sxs", "sxb", "sxh", "sxd"), strides)),
                **dict(zip(("sys_", "syb", "syh", "syd"), strides)),
                HALF=64, BLOCK_HALF=64, BLOCK_S=1, BLOCK_H=32)


def _solution_args():
    """The same launch with the names of the worked solution's signature."""
    a = _h200_args()
    names = dict(sxs="stride_xs", sxb="stride_xb", sxh="stride_xh", sxd="stride_xd",
                 sys_="stride_ys", syb="stride_yb", syh="stride_yh", syd="stride_yd")
    return {names.get(k, k): v for k, v in a.items()}


def test_access_bytes_reads_the_width_of_every_sass_load():
    from ropelib.course import load_schedule
    widths = {"@!P0 LDG.E.128 R8, desc[UR6][R2.64+0x80]": 16,
              "@!P0 LDG.E.EL.128 R20, desc[UR10][R44.64]": 16,
              "LDG.E.64 R4, desc[UR4][R2.64]": 8, "@P1 LDG.E.U16 R9, desc[UR4][R6.64]": 2,
              "LDG.E.S8 R3, desc[UR4][R2.64]": 1, "LDG.E R5, desc[UR4][R2.64]": 4,
              "LDG.E.CONSTANT R7, desc[UR4][R2.64]": 4}
    assert {ins: load_schedule.access_bytes(ins) for ins in widths} == widths
    sched = {"loads": [(i, ins) for i, ins in enumerate(widths)]}
    assert load_schedule.load_widths(sched) == {16: 2, 8: 1, 4: 2, 2: 1, 1: 1}


def test_exercise_1b_accepts_a_kernel_whose_x_loads_are_vectors(tmp_path, capsys):
    from ropelib.course import load_schedule
    kernel = written_module("learner_vector_kernel", tmp_path / "learner_vector_kernel.py",
                            VECTOR_KERNEL).kernel
    sched = load_schedule.schedule(kernel, _h200_args(), num_warps=8)
    widths = load_schedule.load_widths(sched)
    assert widths.get(16, 0) >= 2 and 2 not in widths
    assert load_schedule.check_wide_loads("1b", kernel, _h200_args(), num_warps=8, wide=2,
                                          check=fk.check_interleaved_tile_kernel) is True
    out = capsys.readouterr().out
    assert "✅ 1b: a thread's global loads, sm_90:" in out


STRIDE_2_KERNEL = '''\
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, freqs_ptr, S, B, H, B_CHUNK, sxs, sxb, sxh, sxd, sys_, syb, syh, syd,
           HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr,
           BLOCK_H: tl.constexpr):
    # the members of a pair as two loads at stride 2: right, one element at a time
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    b_lo = tl.program_id(2) * B_CHUNK
    b_hi = tl.minimum(b_lo + B_CHUNK, B)
    j = tl.arange(0, BLOCK_HALF)
    m = ((s < S)[:, None] & (h < H)[None, :])[:, :, None] & (j < HALF)[None, None, :]
    tab_m = (s < S)[:, None, None] & (j < HALF)[None, None, :]
    f = freqs_ptr + s[:, None, None] * (2 * HALF) + 2 * j[None, None, :]
    theta_a = tl.load(f, mask=tab_m, other=0.0)
    theta_b = tl.load(f + 1, mask=tab_m, other=0.0)
    x_off = s[:, None, None] * sxs + h[None, :, None] * sxh + (2 * j)[None, None, :] * sxd
    y_off = s[:, None, None] * sys_ + h[None, :, None] * syh + (2 * j)[None, None, :] * syd
    for b in range(b_lo, b_hi):
        xr = x_ptr + x_off + b * sxb
        yr = y_ptr + y_off + b * syb
        x_a = tl.load(xr, mask=m, other=0.0).to(tl.float32)
        x_b = tl.load(xr + sxd, mask=m, other=0.0).to(tl.float32)
        tl.store(yr, (x_a * tl.cos(theta_a) - x_b * tl.sin(theta_a)).to(y_ptr.dtype.element_ty),
                 mask=m)
        tl.store(yr + syd, (x_b * tl.cos(theta_b) + x_a * tl.sin(theta_b))
                 .to(y_ptr.dtype.element_ty), mask=m)
'''


def test_exercise_1b_refuses_the_stride_2_kernel_though_it_is_right(tmp_path, capsys):
    from ropelib.course import load_schedule
    own = written_module("learner_stride_2_kernel", tmp_path / "learner_stride_2_kernel.py",
                         STRIDE_2_KERNEL).kernel                     # right, but 2-byte loads
    assert fk.check_interleaved_tile_kernel(own) is True
    widths = load_schedule.load_widths(load_schedule.schedule(own, _h200_args(), num_warps=8))
    assert widths.get(2, 0) >= 8                                      # one element at a time
    assert load_schedule.check_wide_loads("1b", own, _h200_args(), num_warps=8, wide=2,
                                          check=fk.check_interleaved_tile_kernel) is False
    assert "❌ 1b: a thread's global loads, sm_90:" in capsys.readouterr().out


def test_the_worked_solution_loads_and_stores_whole_rows():
    """The worked solution is the kernel to learn from: 16-byte vectors in and out at the
    H200's launch, no 2-byte access, no spill."""
    from ropelib.course import load_schedule
    from loading import learner_copy
    own = learner_copy(fk._rope_interleaved_tile_solution_kernel)
    sched = load_schedule.schedule(own, _solution_args(), num_warps=8)
    widths = load_schedule.load_widths(sched)
    assert widths.get(16, 0) >= 2 and 2 not in widths, widths
    stores = [ins for ins in sched["sass"] if "STG" in ins]
    assert stores and all(".128" in ins for ins in stores), stores
    assert sched["local_stores"] == 0 and sched["local_loads"] == 0


def test_exercise_1b_grades_nothing_the_exercise_check_refuses(capsys):
    from ropelib.course import load_schedule
    graded = []

    def never(kernel):
        graded.append(kernel)
        return False

    for answer in (fk._rope_interleaved_tile_solution_kernel, fused._rope_kernel, None):
        assert load_schedule.check_wide_loads("1b", answer, _solution_args(), num_warps=8,
                                              wide=2, check=fk.check_interleaved_tile_kernel) \
            is False
    out = capsys.readouterr().out
    assert out.count("❌ 1b: the kernel must compute RoPE first") == 3
    assert load_schedule.check_wide_loads("1b", fused._rope_kernel, {}, num_warps=8, wide=2,
                                          check=never) is False
    assert graded == [fused._rope_kernel]
