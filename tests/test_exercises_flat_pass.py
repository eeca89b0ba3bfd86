"""Notebook 05's second exercise (ropelib/course/exercises/flat_pass.py): the check passes a
learner's own copy of the flat kernel, refuses the worked solution and ropelib's answers, and
catches the mistakes a flat pass is written with."""
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib import reference  # noqa: E402
from ropelib.course.exercises import flat_pass as fp  # noqa: E402
from loading import learner_copy, switched_kernels, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "05-finished-kernel.py"


@triton.jit
def _body(x_ptr, y_ptr, cos_ptr, sin_ptr, N, ROW, D: tl.constexpr, XBLOCK: tl.constexpr,
          NO_WRAP: tl.constexpr, TOKEN_FROM_ROW_OF_D: tl.constexpr, NO_MASK: tl.constexpr,
          UNSIGNED: tl.constexpr, PARTNER_SINE: tl.constexpr, STORE: tl.constexpr):
    """The solution with switches that each plant one known mistake."""
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    live = i < N
    if NO_MASK:
        live = i < N + XBLOCK       # the last program's tail is written too
    d = i % D
    if TOKEN_FROM_ROW_OF_D:
        s = (i // D) % (N // ROW)   # the head's row index (wrapped into the table), not the token's
    else:
        s = i // ROW
    if NO_WRAP:
        partner = i + D // 2        # the second half's partner read from the next head
    else:
        partner = tl.where(d < D // 2, i + D // 2, i - D // 2)
    x = tl.load(x_ptr + i, mask=live & (i < N), other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + partner, mask=live & (partner < N), other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + s * D + d, mask=live & (i < N), other=0.0)
    if PARTNER_SINE:
        sn = tl.load(sin_ptr + s * D + (d + D // 2) % D, mask=live & (i < N), other=0.0)
    else:
        sn = tl.load(sin_ptr + s * D + d, mask=live & (i < N), other=0.0)
    if UNSIGNED:
        sn = tl.abs(sn)
    if STORE:
        tl.store(y_ptr + i, (x * c + xp * sn).to(y_ptr.dtype.element_ty), mask=live)


SWITCHES = ("NO_WRAP", "TOKEN_FROM_ROW_OF_D", "NO_MASK", "UNSIGNED", "PARTNER_SINE", "STORE")


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The mistakes as @triton.jit kernels with the exercise's signature, in their own module."""
    with switched_kernels(
            tmp_path_factory.mktemp("flat_variants"), "flat", _body, SWITCHES,
            {"solution-like": {}, "no_wrap": dict(NO_WRAP=True),
             "token_from_head_row": dict(TOKEN_FROM_ROW_OF_D=True),
             "no_mask": dict(NO_MASK=True), "unsigned_sine": dict(UNSIGNED=True),
             "partner_sine": dict(PARTNER_SINE=True), "writes_nothing": dict(STORE=False)},
            "x_ptr, y_ptr, cos_ptr, sin_ptr, N, ROW, D: tl.constexpr, XBLOCK: tl.constexpr"
            ) as made:
        yield made


def test_the_exercise_accepts_an_own_copy_of_the_solution(capsys):
    own = learner_copy(fp._rope_flat_solution_kernel)
    assert fp.check_flat_kernel(own) is True
    assert fp.check_flat_kernel(own, seed=5) is True
    assert "✅" in capsys.readouterr().out


def test_the_exercise_refuses_the_worked_solution(capsys):
    assert fp.check_flat_kernel(fp._rope_flat_solution_kernel) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ flat pass: this exercise wants your flat kernel, but the answer "
                          "launched ropelib's _rope_flat_solution_kernel"), out


def test_the_planted_mistakes_harness_is_sound(variants):
    # without a mistake, the switched kernel passes: the rejections below are the mistakes'
    assert fp.check_flat_kernel(variants["solution-like"], seed=3) is True


@pytest.mark.parametrize("label, why", [
    ("no_wrap", "entries differ"), ("token_from_head_row", "entries differ"),
    ("no_mask", "past the output"), ("unsigned_sine", "entries differ"),
    ("partner_sine", "entries differ"), ("writes_nothing", "not written")])
def test_the_exercise_rejects_known_mistakes(variants, label, why, capsys):
    assert fp.check_flat_kernel(variants[label], seed=3) is False
    out = capsys.readouterr().out
    assert "❌" in out and why in out, out


def test_the_exercise_rejects_answers_that_are_not_kernels(capsys):
    def returns_reference(x, freqs):
        return reference.rope_reference(x, freqs)

    class HostKernel(triton.runtime.KernelInterface):
        """Looks like a kernel, computes on the host and writes into y."""
        def __getitem__(self, grid):
            def run(x, y, cos, sin, *args, **kwargs):
                y.copy_(x)
            return run

    @triton.jit
    def blank(x_ptr, y_ptr, cos_ptr, sin_ptr, N, ROW, D: tl.constexpr, XBLOCK: tl.constexpr):
        pass  # your code

    for answer in (returns_reference, HostKernel(), blank, None, ...):
        assert fp.check_flat_kernel(answer) is False
    out = capsys.readouterr().out
    assert out.count("❌") == 5 and "no kernel yet" in out and "@triton.jit" in out


def test_the_tables_are_the_first_pass_s():
    f = torch.rand(3, 8) * 4 - 2
    cos, sin = fp.tables(f)
    assert torch.equal(cos, f.cos())
    assert torch.equal(sin[:, :4], -f.sin()[:, :4]) and torch.equal(sin[:, 4:], f.sin()[:, 4:])


def test_the_exercise_signature_is_the_notebooks():
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert fp.KERNEL_SIGNATURE.strip() in text
    before = text.split("def my_flat_rope_kernel")[0]
    assert "_rope_flat_solution_kernel" not in before and "flat_pass.show_solution" not in before


def test_the_exercise_refuses_kernels_that_call_ropelibs_helpers(tmp_path, capsys):
    """A learner kernel that calls one of ropelib's @triton.jit helpers is ropelib's answer."""
    src = ("import triton\nimport triton.language as tl\n"
           "from ropelib.kernels.common import ROUND_BF16_RTNE, round_to\n\n\n@triton.jit\n"
           "def kernel(x_ptr, y_ptr, cos_ptr, sin_ptr, N, ROW, D: tl.constexpr,\n"
           "           XBLOCK: tl.constexpr):\n"
           "    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
           "    live = i < N\n"
           "    d = i % D\n"
           "    s = i // ROW\n"
           "    partner = tl.where(d < D // 2, i + D // 2, i - D // 2)\n"
           "    x = tl.load(x_ptr + i, mask=live, other=0.0).to(tl.float32)\n"
           "    xp = tl.load(x_ptr + partner, mask=live, other=0.0).to(tl.float32)\n"
           "    c = tl.load(cos_ptr + s * D + d, mask=live, other=0.0)\n"
           "    sn = tl.load(sin_ptr + s * D + d, mask=live, other=0.0)\n"
           "    y = round_to(x * c + xp * sn, y_ptr.dtype.element_ty, ROUND_BF16_RTNE)\n"
           "    tl.store(y_ptr + i, y, mask=live)\n")
    kernel = written_module("learner_flat_with_helper", tmp_path / "learner_flat_with_helper.py",
                            src).kernel
    assert fp.check_flat_kernel(kernel, seed=1) is False
    out = capsys.readouterr().out
    assert "❌ flat pass" in out and "ropelib" in out, out
