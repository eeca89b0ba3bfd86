"""Notebook 12's kernel exercises (exercises.qkv_epilogue) and its teaching kernels
(course.kernels.qkv_teaching).

A learner's own copy of each worked solution passes its check; every mistake planted below, the
notebook's unedited starting point, and every way to hand in ropelib's code instead of one's own
(the teaching kernel itself, a kernel calling ropelib's @triton.jit helpers, a Python function
calling ropelib.qkv_rope_linear or ropelib.apply_rope) fails it. The fp64 reference the checks
compare with, and the teaching kernels, agree with ropelib.qkv_rope_linear.
"""
import inspect
import itertools
import os
import re
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import runtime  # noqa: E402
from ropelib.course.exercises import qkv_epilogue as ex  # noqa: E402
from ropelib.course.kernels import qkv_teaching  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import load_file, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "12-rope-in-the-qkv-projection.py"
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it
_COPIES = _own_code_tests._COPIES
_count = itertools.count()

FWD = qkv_teaching._qkv_rope_teaching_kernel
ONE = qkv_teaching._qkv_rope_one_acc_teaching_kernel
DX = qkv_teaching._qkv_dx_teaching_kernel


def mutated(kernel, *replacements, name=None):
    """The worked kernel's source with each (old, new) replaced (each must occur), compiled in a
    file of its own like `learner_copy`: one planted mistake."""
    fn = kernel.fn
    src = inspect.getsource(fn)
    for old, new in replacements:
        assert old in src, old
        src = src.replace(old, new)
    if name:
        src = src.replace(f"def {fn.__name__}(", f"def {name}(")
    path = _COPIES / f"mutated_{name or fn.__name__}_{next(_count)}.py"
    names = {k: v for k, v in vars(sys.modules[fn.__module__]).items()
             if k not in ("__file__", "__cached__")}
    return getattr(written_module(f"learner_{path.stem}", path, src, names), name or fn.__name__)


EPILOGUE = "        acc_a, acc_b = acc_a * c - acc_b * s, acc_b * c + acc_a * s\n"
PROLOGUE = "            g_a, g_b = g_a * c + g_b * s, g_b * c - g_a * s\n"
SPLIT = "        a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))\n"
ROTATE = "        rotated = tl.join(a * c - b * s, b * c + a * s)"
JOIN = "        acc = tl.reshape(tl.permute(rotated, (0, 2, 1)), (BLOCK_M, D))\n"


# --- the worked solutions pass, as a learner's own copy ----------------------------------------

def test_own_copy_of_the_epilogue_passes(capsys):
    assert ex.check_epilogue_kernel(learner_copy(FWD), seed=1)
    assert "✅" in capsys.readouterr().out


def test_own_copy_of_the_split_passes(capsys):
    assert ex.check_split_epilogue_kernel(learner_copy(ONE), seed=11)
    assert "✅" in capsys.readouterr().out


def test_own_copy_of_the_prologue_passes(capsys):
    assert ex.check_prologue_kernel(learner_copy(DX), seed=2)
    assert "✅" in capsys.readouterr().out


# --- mistakes fail ---------------------------------------------------------------------------

@pytest.mark.parametrize("why, replacements", [
    ("no epilogue: the notebook's starting point", [(EPILOGUE, "        pass\n")]),
    ("the sine's sign flipped (the inverse rotation)",
     [(EPILOGUE, "        acc_a, acc_b = acc_a * c + acc_b * s, acc_b * c - acc_a * s\n")]),
    ("pairs' members swapped", [(EPILOGUE,
                                 "        acc_a, acc_b = acc_b * c - acc_a * s, acc_a * c + acc_b * s\n")]),
    ("sequential update (acc_a overwritten before acc_b uses it)",
     [(EPILOGUE, "        acc_a = acc_a * c - acc_b * s\n        acc_b = acc_b * c + acc_a * s\n")]),
    ("v rotated too", [("    if h < N_ROT:", "    if h < H:")]),
    ("only q rotated (k left as it is)", [("    if h < N_ROT:", "    if h < N_ROT - 1:")]),
    ("the token index used as its position",
     [("p = tl.load(pos_ptr + m, mask=m_ok, other=0)", "p = m")]),
    ("interleaved pairs (2j, 2j + 1) stored in place of rotate-half",
     [("out = out_ptr + (m[:, None] * H + h) * D + j[None, :]",
       "out = out_ptr + (m[:, None] * H + h) * D + 2 * j[None, :]"),
      ("tl.store(out + HALF,", "tl.store(out + 1,")]),
    ("no mask on the last token tile",
     [("tl.store(out, acc_a.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])",
       "tl.store(out, acc_a.to(out_ptr.dtype.element_ty))"),
      ("tl.store(out + HALF, acc_b.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])",
       "tl.store(out + HALF, acc_b.to(out_ptr.dtype.element_ty))")]),
    ("second half never stored",
     [("    tl.store(out + HALF, acc_b.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])\n",
       "")]),
])
def test_epilogue_mistakes_fail(why, replacements, capsys):
    assert not ex.check_epilogue_kernel(mutated(FWD, *replacements), seed=3), why
    assert "❌" in capsys.readouterr().out


@pytest.mark.parametrize("why, replacements", [
    ("no split: the notebook's starting point",
     [(SPLIT, "        pass\n"), (ROTATE, "        #"), (JOIN, "")]),
    ("no permute: the reshape pairs neighbours (2j, 2j + 1), interleaved",
     [(SPLIT, "        a, b = tl.split(tl.reshape(acc, (BLOCK_M, HALF, 2)))\n"),
      (JOIN, "        acc = tl.reshape(rotated, (BLOCK_M, D))\n")]),
    ("joined back without the inverse permute",
     [(JOIN, "        acc = tl.reshape(rotated, (BLOCK_M, D))\n")]),
    ("the halves swapped", [(SPLIT, SPLIT.replace("a, b =", "b, a ="))]),
    ("the sine's sign flipped", [(ROTATE, "        rotated = tl.join(a * c + b * s, b * c - a * s)")]),
])
def test_split_mistakes_fail(why, replacements, capsys):
    assert not ex.check_split_epilogue_kernel(mutated(ONE, *replacements), seed=12), why
    assert "❌" in capsys.readouterr().out


def test_split_check_refuses_two_accumulators(capsys):
    # exercise 1's kernel (two accumulators, two tl.dot a K step) computes the same numbers as
    # the split; as a learner's own copy it must still fail exercise 1b's check, which compiles
    # it for sm_90 and counts its matrix multiplies, while the worked split passes
    assert ex.check_epilogue_kernel(learner_copy(FWD), seed=13)     # right as exercise 1
    capsys.readouterr()
    assert not ex.check_split_epilogue_kernel(learner_copy(FWD), seed=13)
    out = capsys.readouterr().out
    assert "❌" in out and "2 matrix multiplies" in out and "ONE accumulator" in out
    assert "not checked" not in out
    assert ex.check_split_epilogue_kernel(learner_copy(ONE), seed=13)
    out = capsys.readouterr().out
    assert "✅" in out and "not checked" not in out


@pytest.mark.parametrize("why, replacements", [
    ("no prologue: the notebook's starting point", [(PROLOGUE, "            pass\n")]),
    ("the forward rotation instead of its inverse",
     [(PROLOGUE, "            g_a, g_b = g_a * c - g_b * s, g_b * c + g_a * s\n")]),
    ("v's gradient un-rotated too", [("        if h < N_ROT:", "        if h < H:")]),
    ("the token index used as its position",
     [("p = tl.load(pos_ptr + m, mask=m_ok, other=0)", "p = m")]),
    ("no mask on the last column tile",
     [("mask=m_ok[:, None] & k_ok[None, :])", "mask=m_ok[:, None])")]),
])
def test_prologue_mistakes_fail(why, replacements, capsys):
    assert not ex.check_prologue_kernel(mutated(DX, *replacements), seed=4), why
    assert "❌" in capsys.readouterr().out


# --- ropelib's code instead of the learner's fails -------------------------------------------

def test_the_teaching_kernels_themselves_are_refused(capsys):
    assert not ex.check_epilogue_kernel(FWD, seed=5)
    out = capsys.readouterr().out
    assert "qkv_teaching" in out and "write it yourself" in out
    assert not ex.check_split_epilogue_kernel(ONE, seed=5)
    out = capsys.readouterr().out
    assert "qkv_teaching" in out and "write it yourself" in out
    assert not ex.check_split_epilogue_kernel(FWD, seed=5)      # the other worked kernel too
    assert "write it yourself" in capsys.readouterr().out
    assert not ex.check_prologue_kernel(DX, seed=5)
    out = capsys.readouterr().out
    assert "qkv_teaching" in out and "write it yourself" in out


@triton.jit
def _rotate_with_library_helper(x_ptr, w_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, M, K, H,
                                N_ROT, D: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_K: tl.constexpr):
    # the teaching kernel's body with ropelib's rotate_pair doing the epilogue
    HALF: tl.constexpr = D // 2
    h = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    j = tl.arange(0, HALF)
    kk = tl.arange(0, BLOCK_K)
    rows_a = h * D + j
    acc_a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        x = tl.load(x_ptr + m[:, None] * K + (k0 + kk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = w_ptr + rows_a[None, :] * K + (k0 + kk)[:, None]
        acc_a = tl.dot(x, tl.load(w, mask=k_ok[:, None], other=0.0), acc_a)
        acc_b = tl.dot(x, tl.load(w + HALF * K, mask=k_ok[:, None], other=0.0), acc_b)
    if h < N_ROT:
        p = tl.load(pos_ptr + m, mask=m_ok, other=0)
        cs = p[:, None] * HALF + j[None, :]
        c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)
        s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)
        acc_a, acc_b = common.rotate_pair(acc_a, acc_b, c, s, c, s)
    out = out_ptr + (m[:, None] * H + h) * D + j[None, :]
    tl.store(out, acc_a, mask=m_ok[:, None])
    tl.store(out + HALF, acc_b, mask=m_ok[:, None])


def test_a_kernel_calling_a_library_helper_is_refused(capsys):
    assert not ex.check_epilogue_kernel(_rotate_with_library_helper, seed=6)
    out = capsys.readouterr().out
    assert "rotate_pair" in out and "write it yourself" in out


def _calls_qkv_rope_linear(x_ptr, w_ptr, out_ptr, *args, **kwargs):
    return ropelib.qkv_rope_linear


def _calls_apply_rope(*args, **kwargs):
    return ropelib.apply_rope


@pytest.mark.parametrize("answer", [_calls_qkv_rope_linear, _calls_apply_rope,
                                    qkv_teaching.qkv_rope_teaching, ropelib.qkv_rope_linear,
                                    None, ...])
def test_anything_but_a_kernel_is_refused(answer, capsys):
    assert not ex.check_epilogue_kernel(answer, seed=7)
    assert not ex.check_split_epilogue_kernel(answer, seed=7)
    assert not ex.check_prologue_kernel(answer, seed=7)
    assert "❌" in capsys.readouterr().out


@triton.jit
def _blank(x_ptr, w_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, M, K, H, N_ROT,
           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pass  # your code


def test_a_blank_kernel_is_not_an_answer(capsys):
    assert not ex.check_epilogue_kernel(_blank, seed=8)
    assert "no answer yet" in capsys.readouterr().out


# --- the notebook's starting points are the worked kernels without the edit -------------------

def _notebook_kernel(name):
    """The source of `@triton.jit def name(` in notebook 12's percent file."""
    text = NOTEBOOK.read_text(encoding="utf-8")
    start = text.index(f"@triton.jit\ndef {name}(")
    end = text.index("\n\n\n", start)
    return text[start:end] + "\n"


_COS_SIN = ["p = tl.load(pos_ptr + m, mask=m_ok, other=0)", "cs = p[:, None] * HALF + j[None, :]",
            "c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)",
            "s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)"]


def _code_lines(src):
    """The statements of a kernel's body: comment-only and blank lines dropped, trailing
    comments and indentation stripped."""
    lines = []
    for ln in src.splitlines()[1:]:
        if re.match(r"\s*(#|$)", ln):
            continue
        lines.append(ln.split("  #")[0].strip())
    return lines


@pytest.mark.parametrize("name, worked, removed, starter", [
    ("my_qkv_rope_kernel", FWD, _COS_SIN + [EPILOGUE.strip()], "pass  # your epilogue"),
    ("my_qkv_dx_kernel", DX, _COS_SIN + [PROLOGUE.strip()], "pass  # your prologue"),
    ("my_qkv_rope_one_acc_kernel", ONE, [SPLIT.strip(), JOIN.strip(), ROTATE.strip()],
     "pass  # your split"),
])
def test_notebook_starters_fail_and_lack_only_the_exercise(name, worked, removed, starter, capsys):
    src = _notebook_kernel(name)
    assert starter in src
    solved = _code_lines(inspect.getsource(worked.fn).replace(f"def {worked.fn.__name__}(",
                                                                 f"def {name}("))
    for line in removed:
        assert line in solved, line
    assert [ln for ln in _code_lines(src) if ln != "pass"] == [
        ln for ln in solved if ln not in removed]
    path = _COPIES / f"{name}_{next(_count)}.py"
    starting_point = getattr(written_module(f"learner_{path.stem}", path, src,
                                            {"triton": triton, "tl": tl}), name)
    check = {FWD: ex.check_epilogue_kernel, ONE: ex.check_split_epilogue_kernel,
             DX: ex.check_prologue_kernel}[worked]
    assert not check(starting_point, seed=9)
    assert "❌" in capsys.readouterr().out


# --- the reference and the teaching kernels agree with ropelib.qkv_rope_linear ------------------

@pytest.mark.parametrize("M, K, HQ, HK, D", [(20, 48, 2, 1, 32), (17, 32, 4, 2, 64)])
def test_reference_and_teaching_kernels_match_qkv_rope_linear(M, K, HQ, HK, D):
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(10)
    P = 2 * M
    freqs = ropelib.rope_freqs(P, D, device=device).view(P, D)
    cos, sin = freqs[:, :D // 2].cos(), freqs[:, :D // 2].sin()
    x = torch.randn(M, K, generator=gen).to(device).requires_grad_(True)
    w = (torch.randn((HQ + 2 * HK) * D, K, generator=gen) / K ** 0.5).to(device)
    pos = torch.randperm(P, generator=gen)[:M].to(device)
    q, k, v = ropelib.qkv_rope_linear(x[None], w, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                      freqs=freqs, position_ids=pos[None])
    lib = torch.cat((q[0], k[0], v[0]), dim=1)
    tol = dict(atol=1e-4, rtol=1e-4) if runtime.INTERPRET else dict(atol=2e-2, rtol=2e-2)
    ref = ex.reference_qkv(x.detach(), w, cos, sin, pos, HQ, HK, D)
    torch.testing.assert_close(lib.double(), ref, **tol)
    mine = torch.cat(qkv_teaching.qkv_rope_teaching(x.detach(), w, cos, sin, pos, n_heads=HQ,
                                                    n_kv_heads=HK, head_dim=D), dim=1)
    torch.testing.assert_close(mine, lib.detach(), **tol)
    g = torch.randn(M, HQ + 2 * HK, D, generator=gen).to(device)
    (gx_lib,) = torch.autograd.grad((q, k, v), x, tuple(t[None] for t in
                                                         g.split((HQ, HK, HK), dim=1)))
    gx = qkv_teaching.qkv_dx_teaching(g, w, cos, sin, pos, n_heads=HQ, n_kv_heads=HK,
                                      head_dim=D)
    torch.testing.assert_close(gx, gx_lib, **tol)
    torch.testing.assert_close(ex.reference_dx(g, x, w, cos, sin, pos, HQ, HK, D), gx_lib.double(),
                               **tol)


def test_teaching_launcher_names_a_bad_argument():
    device = runtime.default_device()
    x, w = torch.randn(4, 32, device=device), torch.randn(3 * 32, 32, device=device)
    cos = sin = torch.ones(8, 16, device=device)
    pos = torch.arange(4, device=device)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        qkv_teaching.qkv_rope_teaching(x, torch.randn(3 * 24, 32, device=device), cos[:, :12],
                                       sin[:, :12], pos, n_heads=1, n_kv_heads=1, head_dim=24)
    with pytest.raises(ValueError, match="weight must be"):
        qkv_teaching.qkv_rope_teaching(x, w[:-1], cos, sin, pos, n_heads=1, n_kv_heads=1,
                                       head_dim=32)


@pytest.mark.parametrize("kernel", [FWD, ONE], ids=["two-accumulators", "one-accumulator"])
def test_a_launch_without_rotation_stores_the_projection(kernel):
    # notebook 12, section 8 times the learner's kernel with N_ROT = 0 as its bare GEMM: every
    # head then takes the v path, stored as projected (x W^T), and cos and sin go unread
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(3)
    M, K, HQ, HK, D, BLOCK_M, BLOCK_K = ex.CASES[0]
    x = torch.randn(M, K, generator=gen).to(device)
    w = (torch.randn((HQ + 2 * HK) * D, K, generator=gen) / K ** 0.5).to(device)
    nan = torch.full((M, D // 2), float("nan"), device=device)     # read, it would show
    pos = torch.arange(M, device=device)
    out = torch.full((M, HQ + 2 * HK, D), float("nan"), device=device)
    ex.launch_forward(kernel, x, w, out, nan, nan, pos, HQ, HK, D, BLOCK_M, BLOCK_K,
                      rotate=False)
    tol = dict(atol=1e-5, rtol=1e-5) if runtime.INTERPRET else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.view(M, -1), x @ w.T, **tol)
    rotated = torch.full_like(out, float("nan"))
    ex.launch_forward(kernel, x, w, rotated, nan, nan, pos, HQ, HK, D, BLOCK_M, BLOCK_K)
    assert rotated[:, :HQ + HK].isnan().all() and not rotated[:, HQ + HK:].isnan().any()


# --- the persistent TMA forward (section 7.2's editable kernel) --------------------------------

def _notebook_persistent(name="my_persistent_qkv_kernel", *replacements):
    """The notebook's persistent kernel, compiled in a file of its own as a learner runs it,
    with each (old, new) replaced (each must occur)."""
    src = _notebook_kernel("my_persistent_qkv_kernel")
    for old, new in replacements:
        assert old in src, old
        src = src.replace(old, new)
    path = _COPIES / f"{name}_{next(_count)}.py"
    return written_module(f"learner_{path.stem}", path, src,
                          {"triton": triton, "tl": tl}).my_persistent_qkv_kernel


def test_the_notebooks_persistent_kernel_passes(capsys):
    assert ex.check_persistent_kernel(_notebook_persistent(), seed=12)
    out = capsys.readouterr().out
    assert out.count("✅") == len(ex.PERSISTENT_PROGRAMS) and "❌" not in out


def test_launch_options_reach_the_launch_and_keep_its_result():
    # notebook 12, section 8 launches the persistent kernel as the shipped forward is launched
    # (launch_forward(..., num_warps=8, num_stages=3)): the options go to kernel[grid](...), and
    # the output is the reference's, as at Triton's defaults
    device = runtime.default_device()
    gen = torch.Generator().manual_seed(5)
    M, K, HQ, HK, D, BLOCK_M, BLOCK_K = ex.CASES[1]
    x, w, cos, sin, pos = ex.draw_inputs(gen, M, K, HQ, HK, D, device=device)
    want = ex.reference_qkv(x, w, cos, sin, pos, HQ, HK, D).float()
    tol = dict(atol=1e-4, rtol=1e-4) if runtime.INTERPRET else dict(atol=2e-2, rtol=2e-2)
    kernel = _notebook_persistent()
    for options in ({}, dict(num_warps=8, num_stages=3)):
        out = torch.full((M, HQ + 2 * HK, D), float("nan"), device=device)
        ex.launch_forward(kernel, x, w, out, cos, sin, pos, HQ, HK, D, BLOCK_M, BLOCK_K,
                          programs=3, **options)
        torch.testing.assert_close(out, want, **tol)
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(grid=grid, **kwargs)

    ex.launch_forward(Recorder(), x, w, out, cos, sin, pos, HQ, HK, D, BLOCK_M, BLOCK_K,
                      programs=3, num_warps=8, num_stages=3)
    assert seen["grid"] == (3,) and (seen["num_warps"], seen["num_stages"]) == (8, 3)
    assert seen["PROGRAMS"] == 3


@pytest.mark.parametrize("why, replacements", [
    ("one tile a program: not persistent",
     [("for tile in range(tl.program_id(0), tiles_m * H, PROGRAMS):",
       "for tile in range(tl.program_id(0), tl.program_id(0) + 1):")]),
    ("a fixed stride, larger than the programs launched",
     [("for tile in range(tl.program_id(0), tiles_m * H, PROGRAMS):",
       "for tile in range(tl.program_id(0), tiles_m * H, 7):")]),
    ("the accumulators not reset for each tile",
     [("        acc_a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)   # features j\n"
       "        acc_b = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)   # features j + D/2\n", ""),
      ("    for tile in range(", "    acc_a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)\n"
       "    acc_b = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)\n    for tile in range(")]),
    ("head and token tile swapped", [("h = tile // tiles_m", "h = tile % H"),
                                     ("m0 = (tile % tiles_m) * BLOCK_M",
                                      "m0 = (tile // H) * BLOCK_M")]),
    ("the partner half read from the wrong rows",
     [("w_desc.load([h * D + HALF, k0])", "w_desc.load([h * D, k0])")]),
])
def test_persistent_mistakes_fail(why, replacements, capsys):
    kernel = _notebook_persistent("mutated_persistent", *replacements)
    if why == "head and token tile swapped":     # a valid order of the same tiles: still right
        assert ex.check_persistent_kernel(kernel, seed=13), capsys.readouterr().out
        return
    assert not ex.check_persistent_kernel(kernel, seed=13), why
    assert "❌" in capsys.readouterr().out


@triton.jit
def _persistent_calls_teaching(x_ptr, w_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, M, K, H, N_ROT,
                               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                               PROGRAMS: tl.constexpr):
    HALF: tl.constexpr = D // 2
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    c = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    a, b = common.rotate_pair(a, a, c, c, c, c)
    tl.store(out_ptr + m[:, None] * H * D + tl.arange(0, HALF)[None, :], a, mask=(m < M)[:, None])


def test_persistent_check_refuses_library_code(capsys):
    assert not ex.check_persistent_kernel(_persistent_calls_teaching, seed=14)
    out = capsys.readouterr().out
    assert "rotate_pair" in out and "write it yourself" in out, out
    for answer in (ropelib.qkv_rope_linear, qkv_teaching._qkv_rope_teaching_kernel, None):
        assert not ex.check_persistent_kernel(answer, seed=14)
        assert "❌" in capsys.readouterr().out


def test_the_persistent_launch_calls_no_library_code_on_a_gpu():
    """On a GPU the persistent check's launch sets the allocator Triton asks for descriptor
    scratch: the exercise module's own, not ropelib's (the check refuses an answer whose launch
    calls the library's code, and the allocator runs inside that launch)."""
    import inspect
    from ropelib.course.exercises import own_code
    source = inspect.getsource(ex.launch_forward)
    assert "qkv_gemm" not in source and "ensure_allocator" not in source
    assert "_descriptor_scratch" in source
    rules = own_code._Rules((), ())
    assert rules.verdict(ex._descriptor_scratch.__code__) is None


def test_paired_rounds_counts_wins_and_the_sign_test():
    got = ex.paired_rounds([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [2.0] * 7)
    assert (got["a_wins"], got["b_wins"], got["rounds"]) == (1, 5, 7)     # round 2 is a tie
    assert got["ratio"] == 2.0 and (got["low"], got["high"]) == (0.5, 3.5)
    assert got["p"] == pytest.approx(2 * (6 + 1) / 2**6)                  # n = 6, k = 5
    every = ex.paired_rounds([1.0] * 7, [2.0] * 7)
    assert (every["a_wins"], every["b_wins"]) == (7, 0)
    assert every["p"] == pytest.approx(2 / 2**7)                         # 0.016
    assert ex.paired_rounds([1.0, 2.0], [2.0, 1.0])["p"] == 1.0          # capped at 1
    assert ex.paired_rounds([1.0], [1.0])["p"] == 1.0                    # all ties
    with pytest.raises(ValueError):
        ex.paired_rounds([1.0, 2.0], [1.0])
