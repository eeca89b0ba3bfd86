"""Notebook 07's kernel exercise (ropelib/course/exercises/yardstick.py): the check passes a
learner's own copy of the copy-and-rotate kernel, refuses the worked solution and ropelib's
answers, and catches the mistakes such a kernel is written with; the kernel runs as a provider
beside the others (notebook 07 runs its race itself, and the notebook runs in the suite)."""
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib import reference, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course.exercises import yardstick as ys  # noqa: E402
from loading import learner_copy, switched_kernels, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "07-te-vs-triton-live.py"


@triton.jit
def _body(x_ptr, y_ptr, freqs_ptr, n_rows, ROWS_PER_TOKEN, D: tl.constexpr,
          BLOCK_ROWS: tl.constexpr, ROTATE: tl.constexpr, NO_MASK: tl.constexpr,
          TOKEN_IS_ROW: tl.constexpr, PARTNER_ANGLE: tl.constexpr, UNSIGNED: tl.constexpr,
          ALWAYS_ROTATE: tl.constexpr, ROW_BEFORE: tl.constexpr, STORE: tl.constexpr):
    """The solution with switches that each plant one known mistake."""
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    if ROW_BEFORE:
        row = row - 1                # every row one too early: the first program stores row -1
    d = tl.arange(0, D)[None, :]
    live = (row < n_rows) & (d < D)
    store_live = live
    if ROW_BEFORE:
        live = (row >= 0) & live
    if NO_MASK:
        store_live = d < D           # the last program's rows past n_rows are written too
    x = tl.load(x_ptr + row * D + d, mask=live, other=0.0)
    if ROTATE or ALWAYS_ROTATE:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        xp = tl.load(x_ptr + row * D + partner, mask=live, other=0.0).to(tl.float32)
        if TOKEN_IS_ROW:
            s = row % (n_rows // ROWS_PER_TOKEN)     # the row's index, wrapped into the table
        else:
            s = row // ROWS_PER_TOKEN
        theta = tl.load(freqs_ptr + s * D + d, mask=live, other=0.0)
        if PARTNER_ANGLE:
            theta_sin = tl.load(freqs_ptr + s * D + partner, mask=live, other=0.0)
        else:
            theta_sin = theta
        sign = tl.where(d < D // 2, -1.0, 1.0)
        if UNSIGNED:
            sign = 1.0
        y = x.to(tl.float32) * tl.cos(theta) + sign * xp * tl.sin(theta_sin)
        if STORE:
            tl.store(y_ptr + row * D + d, y.to(y_ptr.dtype.element_ty), mask=store_live)
    else:
        if STORE:
            tl.store(y_ptr + row * D + d, x, mask=store_live)


SWITCHES = ("NO_MASK", "TOKEN_IS_ROW", "PARTNER_ANGLE", "UNSIGNED", "ALWAYS_ROTATE", "ROW_BEFORE",
            "STORE")
PARAMS = ("x_ptr, y_ptr, freqs_ptr, n_rows, ROWS_PER_TOKEN, D: tl.constexpr, "
          "BLOCK_ROWS: tl.constexpr, ROTATE: tl.constexpr")


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The mistakes as @triton.jit kernels with the exercise's signature, in their own module."""
    with switched_kernels(
            tmp_path_factory.mktemp("yardstick_variants"), "yardstick", _body, SWITCHES,
            {"solution-like": {}, "no_mask": dict(NO_MASK=True),
             "token_is_row": dict(TOKEN_IS_ROW=True), "partner_angle": dict(PARTNER_ANGLE=True),
             "unsigned_sine": dict(UNSIGNED=True), "always_rotate": dict(ALWAYS_ROTATE=True),
             "row_before": dict(ROW_BEFORE=True),
             "writes_nothing": dict(STORE=False)}, PARAMS) as made:
        yield made


def test_the_exercise_accepts_an_own_copy_of_the_solution(capsys):
    own = learner_copy(ys.solution_rows_kernel)
    assert ys.check_rows_kernel(own) is True
    assert ys.check_rows_kernel(own, seed=5) is True
    assert "✅" in capsys.readouterr().out


def test_the_exercise_refuses_the_worked_solution(capsys):
    assert ys.check_rows_kernel(ys.solution_rows_kernel) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ copy and rotate: this exercise wants your copy-and-rotate kernel, "
                          "but the answer launched ropelib's solution_rows_kernel"), out


def test_the_planted_mistakes_harness_is_sound(variants):
    # without a mistake, the switched kernel passes: the rejections below are the mistakes'
    assert ys.check_rows_kernel(variants["solution-like"], seed=3) is True


@pytest.mark.parametrize("label, why", [
    ("no_mask", "past the output"), ("token_is_row", "differ"), ("partner_angle", "differ"),
    ("unsigned_sine", "differ"), ("always_rotate", "copy:"), ("row_before", "before the output"),
    ("writes_nothing", "not written")])
def test_the_exercise_rejects_known_mistakes(variants, label, why, capsys):
    assert ys.check_rows_kernel(variants[label], seed=3) is False
    out = capsys.readouterr().out
    assert "❌" in out and why in out, out


def test_the_exercise_rejects_answers_that_are_not_kernels(capsys):
    def returns_reference(x, freqs):
        return reference.rope_reference(x, freqs)

    @triton.jit
    def blank(x_ptr, y_ptr, freqs_ptr, n_rows, ROWS_PER_TOKEN, D: tl.constexpr,
              BLOCK_ROWS: tl.constexpr, ROTATE: tl.constexpr):
        pass  # your code

    for answer in (returns_reference, blank, None, ...):
        assert ys.check_rows_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.count("❌") == 4 and "no kernel yet" in out and "@triton.jit" in out


def test_the_exercise_refuses_kernels_that_call_ropelibs_kernels(tmp_path, capsys):
    """A learner kernel that hands the work to one of ropelib's @triton.jit functions is
    ropelib's answer."""
    src = ("import triton\nimport triton.language as tl\n"
           "from ropelib.course.exercises.yardstick import solution_rows_kernel\n\n\n"
           "@triton.jit\n"
           "def kernel(x_ptr, y_ptr, freqs_ptr, n_rows, ROWS_PER_TOKEN, D: tl.constexpr,\n"
           "           BLOCK_ROWS: tl.constexpr, ROTATE: tl.constexpr):\n"
           "    solution_rows_kernel(x_ptr, y_ptr, freqs_ptr, n_rows, ROWS_PER_TOKEN, D,\n"
           "                          BLOCK_ROWS, ROTATE)\n")
    kernel = written_module("learner_rows_with_solution",
                            tmp_path / "learner_rows_with_solution.py", src).kernel
    assert ys.check_rows_kernel(kernel, seed=1) is False
    out = capsys.readouterr().out
    assert "❌ copy and rotate" in out and "ropelib" in out, out


def test_the_exercise_signature_is_the_notebooks():
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert ys.KERNEL_SIGNATURE.strip() in text
    before = text.split("def my_rows_kernel")[0]
    assert "solution_rows_kernel" not in before and "yardstick.show_solution" not in before


def test_the_learners_kernel_runs_beside_the_other_providers():
    own = learner_copy(ys.solution_rows_kernel)
    config = compare.Config(seq_len=8, batch=2, heads=2, head_dim=16, dtype="bf16")
    rows = compare.run_case(config, [ys.provider(own, block_rows=4), "ropelib"], backward=False)
    mine = {r["provider"]: r for r in rows}["yours"]
    assert mine["available"], mine["reason"]
    # computed in fp32 and rounded once: to nearest on a GPU; the interpreter's cast truncates
    assert mine["max_head_ulp_err"] <= (0.5 if torch.cuda.is_available() else 1.0) + 1e-3
    assert mine["fwd_ms"] > 0
    for unsupported in (dict(layout="bshd"), dict(interleaved=True), dict(head_dim=24)):
        c = compare.Config(**{**config.as_dict(), **unsupported})
        (row,) = compare.run_case(c, [ys.provider(own)], backward=False)
        assert not row["available"] and "unsupported config" in row["reason"], row
