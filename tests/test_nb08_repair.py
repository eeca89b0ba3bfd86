"""Notebook 08's section-5 repair exercise (`ropelib.course.nb08_repair`): the sbhd position line.

The check passes a repaired kernel (the worked solution typed in again, and the notebook's own
starting kernel with its position line repaired), and fails the notebook's unchanged kernel, a
position line that hard-codes two batches, the course's reproduction kernel, the worked solution
itself, a kernel of the learner's whose body only calls one of those two, and answers that are
no kernel of the reproduction kernel's arguments.
"""
import ast
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib.course import debug, nb08_repair  # noqa: E402
from loading import load_file, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "08-debugging-allclose.py"
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy
TRAP_LINE = "pos = row % SEQ_LEN"


def _starting_source() -> str:
    """The notebook's `my_sbhd_kernel`, as the learner finds it."""
    text = NOTEBOOK.read_text(encoding="utf-8")
    tree = ast.parse(text)
    node = next(n for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == "my_sbhd_kernel")
    lines = text.splitlines()
    return "\n".join(lines[node.decorator_list[0].lineno - 1:node.end_lineno]) + "\n"


def _kernel(source: str, tmp_path, name="my_sbhd_kernel"):
    module = written_module(f"nb08_repair_{tmp_path.name}", tmp_path / "cell.py",
                            "import triton\nimport triton.language as tl\n\n\n" + source,
                            {"triton": triton, "tl": tl})
    return getattr(module, name)


def _starting_with(line: str) -> str:
    src = _starting_source()
    assert src.count(TRAP_LINE) == 1, "the notebook's kernel holds the trap's line once"
    return src.replace(TRAP_LINE, line)


def test_the_worked_solution_typed_in_passes(capsys):
    assert nb08_repair.check_sbhd_repair(learner_copy(nb08_repair.solution_sbhd_kernel)) is True
    assert "✅" in capsys.readouterr().out


def test_the_notebooks_kernel_with_its_position_line_repaired_passes(tmp_path, capsys):
    fixed = _kernel(_starting_with("pos = row // (tl.num_programs(0) // SEQ_LEN)"), tmp_path)
    assert nb08_repair.check_sbhd_repair(fixed) is True


def test_the_notebooks_unchanged_kernel_fails(tmp_path, capsys):
    assert nb08_repair.check_sbhd_repair(_kernel(_starting_source(), tmp_path)) is False
    assert "wrong position" in capsys.readouterr().out


def test_a_position_line_for_two_batches_fails(tmp_path, capsys):
    assert nb08_repair.check_sbhd_repair(_kernel(_starting_with("pos = row // 2"), tmp_path)) \
        is False
    assert "B=3" in capsys.readouterr().out


def test_right_positions_without_the_rotation_of_every_pair_fail(tmp_path, capsys):
    # positions right, but the first half stored unrotated: the lowest-frequency pair reads s
    # only in part, and the output is off the fp64 RoPE
    src = _starting_with("pos = row // (tl.num_programs(0) // SEQ_LEN)").replace(
        "x1 * c - x2 * s", "x1")
    assert nb08_repair.check_sbhd_repair(_kernel(src, tmp_path)) is False
    assert "❌" in capsys.readouterr().out


def test_library_and_worked_kernels_and_non_kernels_are_refused(capsys):
    for answer, words in ((debug._rope_unsloth_repro_kernel, "course's reproduction kernel"),
                          (nb08_repair.solution_sbhd_kernel, "worked solution"),
                          (None, "no answer"), (lambda *a: None, "Triton kernel")):
        assert nb08_repair.check_sbhd_repair(answer) is False
        assert words in capsys.readouterr().out


def test_cases_cover_three_batches_and_a_drawn_size():
    cases = nb08_repair.repair_cases()
    assert {sc.batch for _, sc in cases[:2]} == {2, 3}
    assert all(sc.layout == "sbhd" and sc.dtype == "fp32" for _, sc in cases)
    assert "drawn with seed" in cases[2][0]


_ARGS = ("x_ptr, cos_ptr, sin_ptr, stride_xr, stride_xh, stride_t, SEQ_LEN, HALF, BLOCK_HALF, "
         "FROM_ANGLES, COMPUTE_FP32, USE_FMA, BF16_RTNE")


@pytest.mark.parametrize("target", ["solution", "reproduction"])
def test_a_kernel_that_calls_a_worked_or_course_kernel_is_refused(target, tmp_path, capsys):
    # the learner's own kernel whose body only calls the worked solution (or the course's
    # reproduction kernel, trap and all) answers nothing of its own
    called = {"solution": nb08_repair.solution_sbhd_kernel,
              "reproduction": debug._rope_unsloth_repro_kernel}[target]
    src = ("@triton.jit\n"
           "def my_sbhd_kernel(x_ptr, cos_ptr, sin_ptr, stride_xr, stride_xh, stride_t, SEQ_LEN,\n"
           "                   HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,\n"
           "                   FROM_ANGLES: tl.constexpr, COMPUTE_FP32: tl.constexpr,\n"
           "                   USE_FMA: tl.constexpr, BF16_RTNE: tl.constexpr):\n"
           f"    TARGET({_ARGS})\n")
    module = written_module(f"nb08_repair_calls_{tmp_path.name}", tmp_path / "cell.py",
                            "import triton\nimport triton.language as tl\n\n\n" + src,
                            {"triton": triton, "tl": tl, "TARGET": called})
    assert nb08_repair.check_sbhd_repair(module.my_sbhd_kernel) is False
    out = capsys.readouterr().out
    assert "❌" in out and "write it yourself" in out, out


def test_a_repair_that_keeps_section_1s_rounding_helper_passes(tmp_path, capsys):
    # section 1's kernel calls round_to (ropelib.kernels.common); a repair started from it may
    # keep that call: only the worked and the course's kernels are barred from its body
    src = _starting_with("pos = row // (tl.num_programs(0) // SEQ_LEN)").replace(
        "tl.store(x_row + offs, x1 * c - x2 * s, mask=mask)",
        "tl.store(x_row + offs, round_to(x1 * c - x2 * s, tl.float32, BF16_RTNE), mask=mask)")
    assert "round_to" in src
    module = written_module(f"nb08_repair_round_{tmp_path.name}", tmp_path / "cell.py",
                            "import triton\nimport triton.language as tl\n"
                            "from ropelib.kernels.common import round_to\n\n\n" + src,
                            {"triton": triton, "tl": tl})
    assert nb08_repair.check_sbhd_repair(module.my_sbhd_kernel) is True, capsys.readouterr().out
