"""Notebook 08's exercise (exercises.debugging): a combine line that gives TE's bits.

The check launches the section's kernel with the learner's @triton.jit combine on the committed
te-bits cases and passes only when no element's bits differ from TE's stored output. Each known
wrong line must fail with the count of differing elements; a learner's own copy of the worked
solution, and a line written differently that computes the same, must pass; ropelib's own
@triton.jit helpers and the worked solution are refused, and only because they are barred.
"""
import ast
import contextlib
import os
import re
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib import runtime  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.course.exercises import debugging as ex  # noqa: E402
from ropelib.course.exercises import own_code  # noqa: E402
from ropelib.kernels import common  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "08-debugging-allclose.py"
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it

needs_file = pytest.mark.skipif(debug.te_bits_file() is None,
                                reason="no benchmarks/results/te-bits-*.pt here")
pytestmark = needs_file


# --- lines that are not TE's -------------------------------------------------------------------

@triton.jit
def _as_written(x1, x2, c, s):
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    return y1, y2


@triton.jit
def _wrong_sign(x1, x2, c, s):
    y1 = x1 * c + x2 * s          # turns the other way
    y2 = x2 * c - x1 * s
    return y1, y2


@triton.jit
def _wrong_sign_fused(x1, x2, c, s):
    y1 = tl.fma(x1, c, x2 * s)    # TE's contraction, the sign of rot*s lost
    y2 = tl.fma(x2, c, x1 * s)
    return y1, y2


@triton.jit
def _other_order(x1, x2, c, s):
    y1 = tl.fma(-x2, s, x1 * c)   # fma(rot, s, x*c): the other product exact
    y2 = tl.fma(x1, s, x2 * c)
    return y1, y2


@triton.jit
def _first_half_only(x1, x2, c, s):
    y1 = tl.fma(x1, c, -(x2 * s))  # TE's order for y1, the line as written for y2
    y2 = x2 * c + x1 * s
    return y1, y2


@triton.jit
def _blank(x1, x2, c, s):
    pass  # your code


def _python_combine(x1, x2, c, s):
    return x1 * c - x2 * s, x2 * c + x1 * s


# --- right lines: the learner's own, and the library's -----------------------------------------

@triton.jit
def _te_spelling(x1, x2, c, s):
    # TE's own spelling, x*c + rot*s with rot = -x2 | x1, contracted as nvcc does
    rot1 = -x2
    rot2 = x1
    y1 = tl.fma(c, x1, rot1 * s)
    y2 = tl.fma(c, x2, s * rot2)
    return y1, y2


@triton.jit
def _calls_rotate_pair(x1, x2, c, s):
    return common.rotate_pair(x1, x2, c, s, c, s)


@triton.jit
def _calls_solution(x1, x2, c, s):
    return ex.solution_te_combine(x1, x2, c, s)


@triton.jit
def _calls_repro_fused_pair(x1, x2, c, s):
    return debug._fused_pair(x1, x2, c, s)     # the reproduction kernel's fma line


LIBRARY = {
    "ropelib's rotate_pair": (_calls_rotate_pair,
                              "ropelib's rotate_pair (ropelib/kernels/common.py)"),
    "ropelib's rotate_pair itself": (common.rotate_pair, "ropelib's rotate_pair"),
    "the worked solution": (ex.solution_te_combine, "ropelib's solution_te_combine"),
    "a combine that calls the worked solution": (_calls_solution,
                                                 "ropelib's solution_te_combine"),
    "a combine that calls the reproduction's fused pair": (_calls_repro_fused_pair,
                                                           "ropelib's _fused_pair"),
}


def _counts(out: str) -> dict:
    """{case label: elements that differ} from the check's printed lines."""
    found = re.findall(r"\((\w+), S=\d+ B=\d+ H=\d+ D=\d+\): ([\d,]+) of", out)
    return {dtype: int(n.replace(",", "")) for dtype, n in found}


# --- tests ---------------------------------------------------------------------------------------

def test_the_line_as_written_fails_with_the_counts_of_no_contraction(capsys):
    assert ex.check_te_combine(_as_written) is False
    out = capsys.readouterr().out
    assert "✅" not in out and "the values are right, their roundings are not TE's" in out
    small, big = ex.te_cases()
    # the interpreter rounds every product: the GPU's rows compiled without contraction, which is
    # how the check compiles on a GPU
    assert _counts(out) == {"float32": small.rows["free_sub-nofuse/table_te_fp32"]["n_differ"],
                            "bfloat16": big.rows["free_sub-nofuse/table_te_fp32"]["n_differ"]}
    assert "990 of 4,096 elements differ" in out


@pytest.mark.parametrize("combine, words", [
    (_wrong_sign, "the values are wrong"),
    (_wrong_sign_fused, "the values are wrong"),
    (_other_order, "their roundings are not TE's"),
    (_first_half_only, "their roundings are not TE's"),
], ids=["wrong sign", "wrong sign, fused", "the other fma order", "TE's order for y1 only"])
def test_wrong_lines_fail(combine, words, capsys):
    assert ex.check_te_combine(combine) is False
    out = capsys.readouterr().out
    assert "❌" in out and "✅" not in out and words in out, out
    assert _counts(out)["float32"] > 0


def test_the_other_order_counts_what_the_gpu_counted(capsys):
    ex.check_te_combine(_other_order)
    small, big = ex.te_cases()
    assert _counts(capsys.readouterr().out) == {
        "float32": small.rows["fma_rs/table_te_fp32"]["n_differ"],
        "bfloat16": big.rows["fma_rs/table_te_fp32"]["n_differ"]}


def test_an_own_copy_of_the_worked_solution_passes(capsys):
    assert ex.check_te_combine(learner_copy(ex.solution_te_combine)) is True
    out = capsys.readouterr().out
    assert "✅ combine with TE's bits: bit for bit" in out and "❌" not in out, out
    nothing_differs = re.findall(r"^\s+\w+, S=\d+ B=\d+ H=\d+ D=\d+: 0 of [\d,]+ elements", out, re.M)
    assert len(nothing_differs) == 2, out                # both stored cases, nothing differs


def test_a_line_written_differently_passes(capsys):
    assert ex.check_te_combine(_te_spelling) is True, capsys.readouterr().out


@pytest.mark.parametrize("label", list(LIBRARY))
def test_library_answers_are_refused(label, capsys):
    fn, words = LIBRARY[label]
    assert ex.check_te_combine(fn) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ combine with TE's bits: this exercise wants your combine, but the "
                          "answer launched") and words in out, out
    assert "write it yourself" in out


@contextlib.contextmanager
def _nothing_barred(what, *, allow=(), bar=(), bar_ops=()):
    yield


@pytest.mark.parametrize("label", [k for k in LIBRARY if k != "ropelib's rotate_pair itself"])
def test_the_refusal_is_the_barring_alone(label, monkeypatch, capsys):
    # with nothing barred the library's lines pass: their bits are TE's, so the test above fails
    # for a check that stops barring (rotate_pair itself takes six arguments, not four)
    monkeypatch.setattr(own_code, "library_barred", _nothing_barred)
    assert ex.check_te_combine(LIBRARY[label][0]) is True, capsys.readouterr().out


def test_non_answers(capsys):
    for unanswered in (None, ..., _blank):
        assert ex.check_te_combine(unanswered) is False
        assert "no answer yet" in capsys.readouterr().out
    assert ex.check_te_combine(_python_combine) is False
    assert "expected a @triton.jit function" in capsys.readouterr().out


def test_the_kernel_stores_every_element():
    # the check's output starts as NaN: the worked line writes all of it, TE's values
    small = ex.te_cases()[0]
    args = [t.to(runtime.default_device())
            for t in (small.x, small.angles, small.te_cos, small.te_sin)]
    y = ex.launch(ex._rope_combine_kernel, ex.solution_te_combine, *args).cpu()
    assert not bool(y.isnan().any())
    assert torch.equal(y.to(small.x.dtype), small.te)


# --- the notebook ------------------------------------------------------------------------------

def test_the_notebook_grades_my_combine_and_falls_back_to_the_worked_one():
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "check_te_combine"]
    assert len(calls) == 1 and ast.unparse(calls[0]) == "ex.check_te_combine(my_combine)"
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "my_combine"]
    assert len(defined) == 1 and ast.unparse(defined[0].decorator_list[0]) == "triton.jit"
    # the learner starts from the line as written, which the check fails
    body = ast.unparse(defined[0])
    assert "y1 = x1 * c - x2 * s" in body and "tl.fma" not in body
    source = NOTEBOOK.read_text(encoding="utf-8")
    assert "solution(ex.solution_te_combine.fn" in source
    assert ("te_combine = my_combine if combined_by_learner else ex.solution_te_combine"
            in source)
    # nothing after the exercise runs the learner's combine but through te_combine
    after = source[source.index("te_combine = my_combine"):]
    assert "my_combine," not in after and "my_combine)" not in after


def test_the_notebooks_bit_counts_compile_as_the_grader_does():
    # section 4b's check_bits and kernel_cos_sin (ropelib.course.nb08_te_parity.TeParity, the
    # harness the notebook binds check_bits from) launch with contraction off by default, as
    # check_te_combine does, through the notebook's own launcher `launch_combine`: the count a
    # learner reads is the grader's on every machine
    import inspect
    from ropelib.course import nb08_te_parity
    tree = ast.parse(inspect.getsource(nb08_te_parity.TeParity))
    defs = {n.name: n for n in tree.body[0].body if isinstance(n, ast.FunctionDef)}
    for name in ("run_kernel", "check_bits"):
        args = defs[name].args
        defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults))
        assert ast.unparse(defaults["fusion"]) == "False", name
    for name, want in (("run_kernel", "fusion"), ("kernel_cos_sin", "False")):
        launches = [n for n in ast.walk(defs[name]) if isinstance(n, ast.Call)
                    and ast.unparse(n.func) == "self.launch"]
        assert len(launches) == 1, name
        options = {k.arg: ast.unparse(k.value) for k in launches[0].keywords}
        assert options.get("enable_fp_fusion") == want, (name, options)
    # the notebook's check_bits is that harness's, on the notebook's own copy of the kernel,
    # launched by the notebook's launch_combine (contraction off unless asked)
    source = NOTEBOOK.read_text(encoding="utf-8")
    assert "PARITY = TeParity(None, SIDE, device, sincos=SINCOS," in source
    assert "reference_col=REF_COL, launch=launch_combine)" in source
    nb_defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    args = nb_defs["launch_combine"].args
    defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults))
    assert ast.unparse(defaults["enable_fp_fusion"]) == "False"
    assert "kernel = _rope_combine_kernel if kernel is None else kernel" in \
        ast.unparse(nb_defs["launch_combine"])
    assert "check_bits = PARITY.check_bits" in source
    assert not {"run_kernel", "check_bits", "kernel_cos_sin"} & {
        n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


# --- section 4's exercise: the norm-wise error -------------------------------------------------

def _own_normwise(y, exact, x, rot_dim):
    """Written here, as a learner would: the pair's magnitude by index arithmetic."""
    ax = x.double().abs()
    D, half = x.shape[-1], rot_dim // 2
    j = torch.arange(D)
    partner = torch.where(j < half, j + half, torch.where(j < rot_dim, j - half, j))
    denom = torch.where(j < rot_dim, ax + ax[..., partner], ax)
    return (y.double() - exact.double()).abs() / denom


def _pairs_over_all_of_d(y, exact, x, rot_dim):
    ax = x.double().abs()
    half = x.shape[-1] // 2                            # ignores rot_dim: partial rotary wrong
    return (y.double() - exact.double()).abs() / (ax + torch.cat((ax[..., half:],
                                                                  ax[..., :half]), -1))


def _same_feature(y, exact, x, rot_dim):
    return (y.double() - exact.double()).abs() / (2 * x.double().abs())   # not the pair


def _in_fp32(y, exact, x, rot_dim):
    return _own_normwise(y, exact, x, rot_dim).float()


def test_normwise_check_accepts_own_answers(capsys):
    assert ex.check_normwise_error(_own_normwise) is True
    assert ex.check_normwise_error(learner_copy(ex.solution_normwise_error)) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [_pairs_over_all_of_d, _same_feature, _in_fp32],
                         ids=["pairs-over-all-of-D", "same-feature", "fp32"])
def test_normwise_check_rejects_wrong_answers(answer, capsys):
    assert ex.check_normwise_error(answer) is False
    assert "❌" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (lambda y, e, x, r: debug.normwise_error(y, e, x, rot_dim=r), "ropelib's normwise_error"),
    (ex.solution_normwise_error, "ropelib's solution_normwise_error"),
    (lambda y, e, x, r: ex.solution_normwise_error(y, e, x, r), "solution_normwise_error"),
], ids=["debug", "worked-solution", "worked-solution-wrapped"])
def test_normwise_check_refuses_library_answers(answer, words, capsys):
    assert ex.check_normwise_error(answer) is False
    out = capsys.readouterr().out
    assert "write it yourself" in out and words in out, out


@pytest.mark.parametrize("answer", [
    lambda y, e, x, r: debug.normwise_error(y, e, x, rot_dim=r), ex.solution_normwise_error,
], ids=["debug", "worked-solution"])
def test_the_normwise_refusal_is_the_barring_alone(answer, monkeypatch, capsys):
    # with nothing barred the library's answers pass: the test above fails for a check that
    # stops barring
    monkeypatch.setattr(own_code, "library_barred", _nothing_barred)
    assert ex.check_normwise_error(answer) is True, capsys.readouterr().out


def test_normwise_check_unanswered(capsys):
    assert ex.check_normwise_error(...) is False
    assert "no answer yet" in capsys.readouterr().out


def test_the_notebook_grades_my_classify_before_showing_the_solution():
    source = NOTEBOOK.read_text(encoding="utf-8")
    check = source.index("ex.check_classify(my_classify)")
    assert source.index("def my_classify(diag):") < check
    assert check < source.index("solution(ex.solution_classify)")


# --- section 5's exercise: the recovered positions, and the trap's name ------------------------

def _own_positions(x, y, layout):
    """Written here, as a learner would: the lowest frequency's pair as complex numbers."""
    if layout == "bshd":
        x, y = x.transpose(0, 1), y.transpose(0, 1)
    D = x.shape[-1]
    zx = torch.complex(x[..., D // 2 - 1].double(), x[..., D - 1].double())
    zy = torch.complex(y[..., D // 2 - 1].double(), y[..., D - 1].double())
    return torch.angle(zy * zx.conj()) * 10000.0 ** ((D - 2) / D)


def _angle_only(x, y, layout):
    return _own_positions(x, y, layout) * 10000.0 ** (-(x.shape[-1] - 2) / x.shape[-1])


def _highest_frequency(x, y, layout):
    """The pair (0, D/2), which turns by one radian per position: wraps past pi."""
    if layout == "bshd":
        x, y = x.transpose(0, 1), y.transpose(0, 1)
    D = x.shape[-1]
    zx = torch.complex(x[..., 0].double(), x[..., D // 2].double())
    zy = torch.complex(y[..., 0].double(), y[..., D // 2].double())
    return torch.angle(zy * zx.conj())


def _ignores_layout(x, y, layout):
    return _own_positions(x, y, "sbhd")


def test_positions_check_accepts_own_answers(capsys):
    assert ex.check_recovered_positions(_own_positions) is True
    assert ex.check_recovered_positions(learner_copy(ex.solution_recovered_positions)) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [_angle_only, _highest_frequency, _ignores_layout],
                         ids=["angle-not-divided", "highest-frequency", "ignores-bshd"])
def test_positions_check_rejects_wrong_answers(answer, capsys):
    assert ex.check_recovered_positions(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "✅" not in out, out


@pytest.mark.parametrize("answer, words", [
    (debug.recovered_positions, "ropelib's recovered_positions"),
    (lambda x, y, layout: debug.recovered_positions(x, y, layout),
     "ropelib's recovered_positions"),
    (ex.solution_recovered_positions, "ropelib's solution_recovered_positions"),
    (lambda x, y, layout: ex.solution_recovered_positions(x, y, layout),
     "ropelib's solution_recovered_positions"),
], ids=["debug", "debug-wrapped", "worked-solution", "worked-solution-wrapped"])
def test_positions_check_refuses_library_answers(answer, words, capsys):
    assert ex.check_recovered_positions(answer) is False
    out = capsys.readouterr().out
    assert "write it yourself" in out and words in out, out


@pytest.mark.parametrize("answer", [debug.recovered_positions, ex.solution_recovered_positions],
                         ids=["debug", "worked-solution"])
def test_the_positions_refusal_is_the_barring_alone(answer, monkeypatch, capsys):
    # with nothing barred the library's positions pass: the test above fails for a check that
    # stops barring
    monkeypatch.setattr(own_code, "library_barred", _nothing_barred)
    assert ex.check_recovered_positions(answer) is True, capsys.readouterr().out


def test_the_position_cases_hold_both_layouts():
    cases = ex._position_cases()
    assert {layout for _, (_, _, layout), _ in cases} == {"sbhd", "bshd"}
    for _, (x, y, layout), pos in cases:
        assert pos.dtype == torch.float64 and tuple(pos.shape) == tuple(
            (x.shape if layout == "sbhd" else x.transpose(0, 1).shape)[:3])


def _own_trap_name(pos):
    """Written here, as a learner would: the slope and the batches of the recovered curve."""
    S, B = pos.shape[:2]
    s = torch.arange(S, dtype=pos.dtype)
    on = lambda got, want: bool((got - want).abs().max() < 1e-2)
    if all(on(pos[:, b, h], s) for b in range(B) for h in range(pos.shape[2])):
        return "none"
    if on(pos[:, 0, 0], 2 * s):
        return "inplace_double_rotation"
    if on(pos[:, 0, 0], s // 2):
        return "te_freqs_reshaped"
    if on(pos[:, 0, 0], s):
        return "table_margin"
    return "sbhd_row_indexing"


def _reruns_every_trap(pos):
    import dataclasses
    S, B, H = pos.shape
    for trap in ex.TRAPS_WITH_A_CURVE:
        sc = debug.Scenario(seq_len=S, batch=B, heads=H, head_dim=16, dtype="fp32")
        debug.reproduce(sc, dataclasses.replace(debug.FIXED, **{trap: True}))
    return "none"


def test_trap_check_accepts_own_readings(capsys):
    assert ex.check_trap_name(_own_trap_name) is True
    assert ex.check_trap_name(learner_copy(ex.solution_trap_name)) is True
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [lambda pos: "none", lambda pos: "table_margin"],
                         ids=["always-none", "always-one-trap"])
def test_trap_check_rejects_guesses(answer, capsys):
    assert ex.check_trap_name(answer) is False
    assert "❌" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (ex.solution_trap_name, "ropelib's solution_trap_name"),
    (_reruns_every_trap, "ropelib's reproduce"),
], ids=["worked-solution", "reproduce"])
def test_trap_check_refuses_library_answers(answer, words, capsys):
    assert ex.check_trap_name(answer) is False
    out = capsys.readouterr().out
    assert "write it yourself" in out and words in out, out


def test_the_trap_cases_cover_every_curve_and_a_right_rope():
    names = [expected for _, _, expected in ex._trap_cases()]
    assert sorted(set(names)) == sorted((*ex.TRAPS_WITH_A_CURVE, "none"))
    assert all(layout == "sbhd" for _, (_, _, layout), _ in ex._trap_cases())   # no name leaks


def test_the_notebook_grades_my_positions_and_trap_name_before_showing_the_solutions():
    source = NOTEBOOK.read_text(encoding="utf-8")
    positions = source.index("ex.check_recovered_positions(my_recovered_positions)")
    assert source.index("def my_recovered_positions(x, y, layout):") < positions
    assert positions < source.index("solution(ex.solution_recovered_positions)")
    check = source.index("ex.check_trap_name(my_trap_name)")
    assert source.index("def my_trap_name(pos):") < check
    assert check < source.index("solution(ex.solution_trap_name)")
