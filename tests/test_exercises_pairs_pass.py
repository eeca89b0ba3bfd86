"""Notebook 05's third exercise (ropelib/course/exercises/pairs_pass.py): the check passes a
learner's own copy of the pairs kernel, refuses the worked solution and ropelib's answers, and
catches the mistakes a pairs pass for any head is written with."""
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course.exercises import pairs_pass as pp  # noqa: E402
from loading import learner_copy, switched_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "05-finished-kernel.py"


@triton.jit
def _body(x_ptr, y_ptr, cos_ptr, sin_ptr, n_rows, BH, D: tl.constexpr, R: tl.constexpr,
          ROWS: tl.constexpr, HALF_BLOCK: tl.constexpr, PASS_BLOCK: tl.constexpr,
          NO_HALF_MASK: tl.constexpr, PARTNER_AT_D: tl.constexpr, TABLE_STRIDE_D: tl.constexpr,
          NO_PASS: tl.constexpr, NO_ROW_MASK: tl.constexpr, STORE: tl.constexpr):
    """The solution with switches that each plant one known mistake."""
    HALF: tl.constexpr = R // 2
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    j = tl.arange(0, HALF_BLOCK)
    rows_ok = r < n_rows
    if NO_ROW_MASK:
        rows_ok = r < n_rows + ROWS          # the last program's missing rows are written too
    if NO_HALF_MASK:
        m = rows_ok[:, None] & (j < HALF_BLOCK)[None, :]    # the padding of the tile rotated
    else:
        m = rows_ok[:, None] & (j < HALF)[None, :]
    s = r // BH
    if PARTNER_AT_D:
        other: tl.constexpr = D // 2         # the partner half a head away, not R/2
    else:
        other: tl.constexpr = HALF
    stride: tl.constexpr = D if TABLE_STRIDE_D else R
    at = r[:, None] * D + j[None, :]
    xa = tl.load(x_ptr + at, mask=m & (at < n_rows * D), other=0.0).to(tl.float32)
    xb = tl.load(x_ptr + at + other, mask=m & (at + other < n_rows * D), other=0.0).to(tl.float32)
    cos_a = (cos_ptr + s * stride)[:, None] + j[None, :]
    sin_a = (sin_ptr + s * stride)[:, None] + j[None, :]
    ca = tl.load(cos_a, mask=m, other=0.0)
    sa = tl.load(sin_a, mask=m, other=0.0)
    cb = tl.load(cos_a + HALF, mask=m, other=0.0)
    sb = tl.load(sin_a + HALF, mask=m, other=0.0)
    if STORE:
        tl.store(y_ptr + at, (xa * ca + xb * sa).to(y_ptr.dtype.element_ty), mask=m)
        tl.store(y_ptr + at + other, (xb * cb + xa * sb).to(y_ptr.dtype.element_ty), mask=m)
        if R < D:
            if not NO_PASS:
                e = tl.arange(0, PASS_BLOCK)
                mp = rows_ok[:, None] & (e < D - R)[None, :]
                pt = r[:, None] * D + R + e[None, :]
                tl.store(y_ptr + pt, tl.load(x_ptr + pt, mask=mp & (pt < n_rows * D)), mask=mp)


SWITCHES = ("NO_HALF_MASK", "PARTNER_AT_D", "TABLE_STRIDE_D", "NO_PASS", "NO_ROW_MASK", "STORE")


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The mistakes as @triton.jit kernels with the exercise's signature, in their own module."""
    with switched_kernels(
            tmp_path_factory.mktemp("pairs_variants"), "pairs", _body, SWITCHES,
            {"solution-like": {}, "no_half_mask": dict(NO_HALF_MASK=True),
             "partner_at_d": dict(PARTNER_AT_D=True), "table_stride_d": dict(TABLE_STRIDE_D=True),
             "no_pass_through": dict(NO_PASS=True), "no_row_mask": dict(NO_ROW_MASK=True),
             "writes_nothing": dict(STORE=False)},
            "x_ptr, y_ptr, cos_ptr, sin_ptr, n_rows, BH, D: tl.constexpr, R: tl.constexpr, "
            "ROWS: tl.constexpr, HALF_BLOCK: tl.constexpr, PASS_BLOCK: tl.constexpr") as made:
        yield made


def test_the_exercise_accepts_an_own_copy_of_the_solution(capsys):
    own = learner_copy(pp._rope_pairs_solution_kernel)
    assert pp.check_pairs_kernel(own) is True
    assert pp.check_pairs_kernel(own, seed=5) is True
    assert "✅" in capsys.readouterr().out


def test_the_exercise_refuses_the_worked_solution(capsys):
    assert pp.check_pairs_kernel(pp._rope_pairs_solution_kernel) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ pairs pass: this exercise wants your pairs kernel, but the answer "
                          "launched ropelib's _rope_pairs_solution_kernel"), out


def test_the_planted_mistakes_harness_is_sound(variants):
    # without a mistake, the switched kernel passes: the rejections below are the mistakes'
    assert pp.check_pairs_kernel(variants["solution-like"], seed=3) is True


@pytest.mark.parametrize("label, why", [
    # the tile's padding pairs rotated: the last row's land past the output
    ("no_half_mask", ("past the output",)),
    # the second member a head's half away: the features from R/2 on are never written
    ("partner_at_d", ("are NaN",)),
    # rows of the table read D apart: past the table (NaN here) or another token's angles
    ("table_stride_d", ("are NaN", "entries differ")),
    ("no_pass_through", ("not written",)), ("no_row_mask", ("past the output",)),
    ("writes_nothing", ("not written",))])
def test_the_exercise_rejects_known_mistakes(variants, label, why, capsys):
    assert pp.check_pairs_kernel(variants[label], seed=3) is False
    out = capsys.readouterr().out
    assert "❌" in out and any(w in out for w in why), out


def test_the_exercise_rejects_answers_that_are_not_kernels(capsys):
    @triton.jit
    def blank(x_ptr, y_ptr, cos_ptr, sin_ptr, n_rows, BH, D: tl.constexpr, R: tl.constexpr,
              ROWS: tl.constexpr, HALF_BLOCK: tl.constexpr, PASS_BLOCK: tl.constexpr):
        pass  # your code

    for answer in (lambda *a: None, blank, None, ...):
        assert pp.check_pairs_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.count("❌") == 4 and "no kernel yet" in out and "@triton.jit" in out


def test_the_exercise_signature_is_the_notebooks():
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert pp.KERNEL_SIGNATURE.strip() in text
    before = text.split("def my_pairs_kernel")[0]
    assert "_rope_pairs_solution_kernel" not in before and "pairs_pass.show_solution" not in before
