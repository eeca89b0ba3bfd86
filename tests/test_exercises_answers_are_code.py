"""Exercises whose answer is a number or a list are answered with the learner's function.

Notebook 00's exercise 3 (interleaved RoPE of a `bshd` tensor, what
`ropelib.apply_rope(..., layout="bshd", interleaved=True)` returns),
notebook 01's exercise 4 (the permutation back to the interleaved pairing), notebook 02's
exercises 1 (the positions a context-parallel rank holds) and 3 (the bytes a fused forward
moves), notebook 03's exercise 5b (the time a kernel of ROWS rows a program takes), notebook 04's
exercise 5 (the work one launch of a kernel with a ROWS knob issues, checked beside a learner's
kernel), notebook 07's exercise 1 (a least-squares line, by the normal equations) and notebook 09's exercise 1
(RoPE's share of a profiled step) ask for a value that ropelib can compute. Their checks take a
function and run it with ropelib's answers barred (`own_code`). For each check this file shows
that

* a function the learner wrote (a copy of the worked solution, compiled from its source in a
  file of its own, and one written differently here) passes;
* a function that returns the same right values but calls ropelib's finished functions
  (`ropelib.apply_rope`, its Transformer Engine drop-in, `ropelib.context_parallel`,
  `ropelib.frequencies`), `ropelib.reference`,
  the benchmarks' bytes model, a teaching kernel (called, or launched directly) or a worked
  solution is refused, with a message that names what it called;
* those refusals come from the barring alone: with `own_code.library_barred` switched off, the
  same library answers pass, so the refusal tests fail if a check stops barring;
* the notebooks pass a function defined in the exercise's cell, not a value, to each check.
"""
import ast
import contextlib
import math
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import context_parallel, frequencies, reference  # noqa: E402
from ropelib import te as rope_te  # noqa: E402
from ropelib.bench import compare, suite  # noqa: E402
from ropelib.course.exercises import (  # noqa: E402
    at_scale, basics, grid_kernel, in_a_model, measuring, naive_kernel, own_code)
from ropelib.course.kernels import batch_reuse, naive  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it


# --- calls into ropelib that return nothing the answer needs -----------------------------------

_TINY = (torch.randn(2, 1, 1, 4), frequencies.rope_freqs(2, 4))   # made outside the checks


def _tiny():
    return _TINY


def _calls_apply_rope():
    x, f = _tiny()
    return ropelib.apply_rope(x, f)


def _calls_reference():
    x, f = _tiny()
    return reference.rope_reference(x, f)


def _calls_teaching_kernel():
    x, f = _tiny()
    return naive.rope_naive(x, f)


def _launch_naive(x, f):
    """The naive teaching kernel launched directly, as rope_naive does: no ropelib Python call."""
    S, B, H, D = x.shape
    y = torch.empty_like(x)
    f2 = f.reshape(f.shape[0], -1)
    naive._rope_naive_kernel[(S * B * H,)](
        x, y, f2, B, H, *x.stride(), y.stride(0), y.stride(1), y.stride(2), *f2.stride(),
        HALF=D // 2, BLOCK_HALF=max(1, 1 << (D // 2 - 1).bit_length()), BACKWARD=False,
        COMPUTE_DTYPE=tl.float32,
        BF16_RTNE=False)
    return y


def _launches_teaching_kernel():
    return _launch_naive(*_tiny())


SIDE_CALLS = {"ropelib.apply_rope": (_calls_apply_rope, "called ropelib's apply_rope"),
              "ropelib.reference": (_calls_reference, "called ropelib's rope_reference"),
              "a teaching kernel": (_calls_teaching_kernel, "called ropelib's rope_naive"),
              "a teaching kernel, launched": (_launches_teaching_kernel,
                                              "launched ropelib's _rope_naive_kernel")}


def _with_side_call(own, side):
    """own's right answer, after a call into ropelib."""
    def answer(*args):
        side()
        return own(*args)
    return answer


# --- notebook 00, exercise 3: interleaved RoPE of a bshd tensor --------------------------------

def _interleaved_rope_written_here(x, freqs):
    """Neighbours (x0, x1) as the complex number x0 + i x1, turned by e^(i theta)."""
    S, D = freqs.shape[0], freqs.shape[-1]
    theta = freqs.reshape(1, S, 1, D)[..., 0::2]                     # one angle per pair
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], D // 2, 2).contiguous())
    turned = z * torch.polar(torch.ones_like(theta), theta)
    return torch.view_as_real(turned).reshape(x.shape).to(x.dtype)


def _pairs_to_halves(D):
    return torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2)))


def _interleaved_by(rope):
    """Right: the rotate-half RoPE `rope` of x [sbhd] with features permuted (notebook 01, sec. 7)."""
    def answer(x, freqs):
        D = x.shape[-1]
        perm = _pairs_to_halves(D)
        half = freqs[..., 0::2]
        table = torch.cat((half, half), dim=-1).contiguous()        # rotate-half order
        y = rope(x.transpose(0, 1)[..., perm].contiguous(), table)
        return y.transpose(0, 1)[..., torch.argsort(perm)]
    return answer


def _interleaved_with(rotate_half):
    def answer(x, freqs):
        f = freqs.transpose(0, 1)                                    # [1, S, 1, D]
        xf = x.float()
        return (xf * f.cos() + rotate_half(xf) * f.sin()).to(x.dtype)
    return answer


def _check_interleaved_rope(fn):
    return basics.check_interleaved_rope(fn)


# --- notebook 01, exercise 4: the permutation back to the interleaved pairing ------------------

def _perm_back_written_here(d):
    perm = []
    for j in range(d // 2):
        perm += [j, j + d // 2]     # pair (j, j + d/2) of rotate-half becomes (2j, 2j + 1)
    return perm


def _perm_back_from_reference(d):
    """Right: feature j's partner read off ropelib.reference.rotate_half of the basis vector."""
    perm = []
    for j in range(d // 2):
        partner = int(reference.rotate_half(torch.eye(d)[j], False).abs().argmax())
        perm += [j, partner]
    return perm


def _partner_by_quarter_turn(d, j, rope):
    """The partner of feature j in rotate-half RoPE: where a quarter turn of e_j lands."""
    x = torch.eye(d)[j].view(1, 1, 1, d)
    f = torch.full((1, 1, 1, d), math.pi / 2)
    return int(rope(x, f).reshape(-1).abs().argmax())


def _perm_back_from(rope):
    def answer(d):
        perm = []
        for j in range(d // 2):
            perm += [j, _partner_by_quarter_turn(d, j, rope)]
        return perm
    return answer


def _check_perm_back(fn):
    return basics.check_interleave_permutation(fn, to="interleaved")


# --- notebook 02, exercise 1: the positions a context-parallel rank holds ----------------------

def _rank_positions_written_here(local_len, cp_size, cp_rank):
    chunks = torch.arange(2 * cp_size * (local_len // 2)).view(2 * cp_size, -1)
    return torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]]).tolist()


def _positions_from_apply_rope(local_len, cp_size, cp_rank):
    """Right: the angle ropelib.apply_rope turns each local token by, read back as a position."""
    step = 0.01
    table = (torch.arange(cp_size * local_len, dtype=torch.float32) * step).view(-1, 1, 1, 1)
    x = torch.tensor([1.0, 0.0]).expand(local_len, 1, 1, 2).contiguous()
    y = ropelib.apply_rope(x, table.expand(-1, 1, 1, 2).contiguous(), cp_size=cp_size,
                           cp_rank=cp_rank)
    return (torch.atan2(y[:, 0, 0, 1], y[:, 0, 0, 0]) / step).round().long().tolist()


def _check_rank_positions(fn):
    return basics.check_cp_positions(fn)


# --- notebook 02, exercise 3: the bytes a fused forward moves ----------------------------------

def _bytes_written_here(seq_len, batch, q_heads, kv_heads, head_dim, rotary_percent=1.0,
                        bytes_per_element=2):
    q = torch.empty(seq_len, batch, q_heads, head_dim, device="meta")
    k = torch.empty(seq_len, batch, kv_heads, head_dim, device="meta")
    rotated = int(head_dim * rotary_percent)
    return 2 * (q.numel() + k.numel()) * bytes_per_element + seq_len * rotated * 4


_DTYPE_OF = {2: "bf16", 4: "fp32"}


def _bytes_from_compare(S, B, HQ, HK, D, p=1.0, e=2):
    return compare.bytes_moved(compare.Config(S, B, HQ, D, dtype=_DTYPE_OF[e],
                                              rotary_percent=p, kv_heads=HK))


def _bytes_from_suite(S, B, HQ, HK, D, p=1.0, e=2):
    return 2 * suite.tensor_bytes(S, B, HQ + HK, D, _DTYPE_OF[e]) + S * int(D * p) * 4


def _bytes_from_frequencies(S, B, HQ, HK, D, p=1.0, e=2):
    table = ropelib.rope_freqs(S, D, rotary_percent=p)
    return 2 * S * B * (HQ + HK) * D * e + table.numel() * table.element_size()


def _bytes_from_teaching_kernel(S, B, HQ, HK, D, p=1.0, e=2):
    return 2 * S * B * (HQ + HK) * D * e + batch_reuse.angle_bytes_requested(S, 1, 1,
                                                                             int(D * p))


def _check_bytes(fn):
    return basics.check_bytes_moved(fn)


# --- notebook 03, exercise 5b: the time a kernel of ROWS rows a program takes ------------------

def _predicted_written_here(n_rows, rows_per_program, sms, ns_per_program_per_sm, copy_us):
    waves = (n_rows + rows_per_program - 1) // rows_per_program / sms   # programs per SM
    return max(copy_us, waves * ns_per_program_per_sm / 1000)


# --- notebook 04, exercise 5: the work one launch of the ROWS kernel issues --------------------

_GRANULAR_KERNEL = learner_copy(grid_kernel._rope_granular_solution_kernel)   # a learner's kernel


def _granular_work_written_here(S, B, H, D, rows):
    per_program = {"sincos": 2 * D, "angle_loads": D}
    programs = (B // rows) * H * S
    return {"programs": programs, "x_loads": S * B * H * D,
            **{k: programs * v for k, v in per_program.items()}}


def _check_granular_work(fn):
    return grid_kernel.check_granularity(_GRANULAR_KERNEL, fn)


# --- notebook 07, exercise 1: a least-squares line, by the normal equations -------------------

def _fit_written_here(nbytes, ms):
    n = len(nbytes)                                  # centred sums, in plain Python
    mean_n, mean_t = sum(nbytes) / n, sum(ms) / n
    slope = (sum((a - mean_n) * (t - mean_t) for a, t in zip(nbytes, ms))
             / sum((a - mean_n) ** 2 for a in nbytes))
    return (mean_t - slope * mean_n) * 1e3, 1e-6 / slope


def _fit_by_polyfit(nbytes, ms):
    import numpy as np
    slope, intercept = np.polyfit(nbytes, ms, 1)
    return intercept * 1e3, 1e-6 / slope


def _check_fit(fn):
    return measuring.check_fit_time_model(fn)


# --- notebook 09, exercise 1: RoPE's share of a profiled step ----------------------------------

def _rope_share_written_here(events, rope_names):
    step_us = sum(us for _, us in events)
    rope_us = sum(us for name, us in events if any(part in name for part in rope_names))
    return rope_us, step_us, rope_us / step_us


def _check_rope_share(fn):
    return in_a_model.check_rope_share(fn)


# --- the table: each check, its learner answers and its library answers ------------------------

EXERCISES = {
    "00 ex3 interleaved_rope": dict(
        check=_check_interleaved_rope,
        solution=lambda: learner_copy(basics.solution_interleaved_rope),
        own=_interleaved_rope_written_here,
        library={
            "ropelib.apply_rope": (
                lambda x, f: ropelib.apply_rope(x, f, layout="bshd", interleaved=True),
                "called ropelib's apply_rope (ropelib/api.py)"),
            "the TE drop-in": (
                lambda x, f: rope_te.apply_rotary_pos_emb(x, f, tensor_format="bshd",
                                                          interleaved=True, fused=True),
                "called ropelib's apply_rotary_pos_emb (ropelib/te.py)"),
            "ropelib.reference": (
                lambda x, f: reference.rope_reference(x, f, layout="bshd", interleaved=True),
                "called ropelib's rope_reference (ropelib/reference.py)"),
            "ropelib.reference.rotate_half": (
                _interleaved_with(lambda x: reference.rotate_half(x, True)),
                "called ropelib's rotate_half (ropelib/reference.py)"),
            "a teaching kernel": (_interleaved_by(naive.rope_naive),
                                  "called ropelib's rope_naive (ropelib/course/kernels/naive.py)"),
            "a teaching kernel, launched": (_interleaved_by(_launch_naive),
                                            "launched ropelib's _rope_naive_kernel"),
            "the benchmarks' Hugging Face formula": (
                lambda x, f: compare.hf_rotate(x.float(), f.transpose(0, 1).cos(),
                                               f.transpose(0, 1).sin(), True).to(x.dtype),
                "called ropelib's hf_rotate (ropelib/bench/compare.py)"),
            "notebook 01's worked rotate_half": (
                _interleaved_with(lambda x: basics.solution_rotate_half(x, True)),
                "called ropelib's solution_rotate_half"),
            "the worked solution": (basics.solution_interleaved_rope,
                                    "called ropelib's solution_interleaved_rope"),
        }),
    "01 ex4 perm_back": dict(
        check=_check_perm_back,
        solution=lambda: (lambda own: (lambda d: own(d, "interleaved")))(
            learner_copy(basics.solution_interleave_permutation)),
        own=_perm_back_written_here,
        library={
            "ropelib.reference.rotate_half": (
                _perm_back_from_reference, "called ropelib's rotate_half (ropelib/reference.py)"),
            "ropelib.apply_rope": (_perm_back_from(ropelib.apply_rope),
                                   "called ropelib's apply_rope (ropelib/api.py)"),
            "a teaching kernel": (_perm_back_from(naive.rope_naive),
                                  "called ropelib's rope_naive (ropelib/course/kernels/naive.py)"),
            "a teaching kernel, launched": (_perm_back_from(_launch_naive),
                                            "launched ropelib's _rope_naive_kernel"),
            "the worked solution": (
                lambda d: basics.solution_interleave_permutation(d, "interleaved"),
                "called ropelib's solution_interleave_permutation"),
        }),
    "02 ex1 rank_positions": dict(
        check=_check_rank_positions,
        solution=lambda: learner_copy(basics.solution_cp_positions),
        own=_rank_positions_written_here,
        library={
            "ropelib.reference.positions": (
                lambda n, c, r: reference.positions("sbhd", n, 1, cp_size=c, cp_rank=r)[0].tolist(),
                "called ropelib's positions (ropelib/reference.py)"),
            "ropelib.context_parallel": (
                lambda n, c, r: context_parallel.dual_chunk_positions(n, c, r).tolist(),
                "called ropelib's dual_chunk_positions (ropelib/context_parallel.py)"),
            "ropelib.apply_rope": (_positions_from_apply_rope,
                                   "called ropelib's apply_rope (ropelib/api.py)"),
            "the worked solution": (basics.solution_cp_positions,
                                    "called ropelib's solution_cp_positions"),
            "notebook 11's worked solution": (
                lambda n, c, r: at_scale.solution_dual_chunk_positions(n * c, c, r),
                "called ropelib's solution_dual_chunk_positions"),
        }),
    "02 ex3 bytes_moved": dict(
        check=_check_bytes,
        solution=lambda: learner_copy(basics.solution_bytes_moved),
        own=_bytes_written_here,
        library={
            "ropelib.bench.compare.bytes_moved": (
                # (refused at its first call into ropelib.bench: the Config it builds)
                _bytes_from_compare, "(ropelib/bench/compare.py)"),
            "ropelib.bench.suite.tensor_bytes": (
                _bytes_from_suite, "called ropelib's tensor_bytes (ropelib/bench/suite.py)"),
            "ropelib.rope_freqs": (_bytes_from_frequencies,
                                   "called ropelib's rope_freqs (ropelib/frequencies.py)"),
            "a teaching kernel's module": (
                _bytes_from_teaching_kernel,
                "called ropelib's angle_bytes_requested (ropelib/course/kernels/batch_reuse.py)"),
            "the worked solution": (basics.solution_bytes_moved,
                                    "called ropelib's solution_bytes_moved"),
        }),
    "03 ex5b predicted_us": dict(
        check=naive_kernel.check_predicted_us,
        solution=lambda: learner_copy(naive_kernel.solution_predicted_us),
        own=_predicted_written_here,
        library={
            "the worked solution": (naive_kernel.solution_predicted_us,
                                    "called ropelib's solution_predicted_us"),
        }),
    "04 ex5 my_work": dict(
        check=_check_granular_work,
        solution=lambda: learner_copy(grid_kernel.solution_granular_work),
        own=_granular_work_written_here,
        library={
            "the worked solution": (grid_kernel.solution_granular_work,
                                    "called ropelib's solution_granular_work"),
        }),
    "07 ex1 fit_time_model": dict(
        check=_check_fit,
        solution=lambda: learner_copy(measuring.solution_fit_time_model),
        own=_fit_written_here,
        library={
            "np.polyfit": (_fit_by_polyfit, "called polyfit"),
            "the worked solution": (measuring.solution_fit_time_model,
                                    "called ropelib's solution_fit_time_model"),
        }),
    "09 ex1 rope_share": dict(
        check=_check_rope_share,
        solution=lambda: learner_copy(in_a_model.solution_rope_share),
        own=_rope_share_written_here,
        library={
            "the worked solution": (in_a_model.solution_rope_share,
                                    "called ropelib's solution_rope_share"),
        }),
}

# every exercise is also tried with its own right answer behind a call into ropelib
for _ex in EXERCISES.values():
    for _label, (_side, _words) in SIDE_CALLS.items():
        _ex["library"][f"right values after {_label}"] = (_with_side_call(_ex["own"], _side),
                                                          _words)

LIBRARY_CASES = [(ex, label) for ex, spec in EXERCISES.items() for label in spec["library"]]
LIBRARY_IDS = [f"{ex}: {label}" for ex, label in LIBRARY_CASES]


@contextlib.contextmanager
def _nothing_barred(what, *, allow=(), bar=(), bar_ops=()):
    yield


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("exercise", list(EXERCISES))
def test_the_worked_solution_typed_by_a_learner_passes(exercise, capsys):
    assert EXERCISES[exercise]["check"](EXERCISES[exercise]["solution"]()) is True
    out = capsys.readouterr().out
    assert "✅" in out and "❌" not in out, out


@pytest.mark.parametrize("exercise", list(EXERCISES))
def test_a_function_written_differently_passes(exercise, capsys):
    assert EXERCISES[exercise]["check"](EXERCISES[exercise]["own"]) is True
    assert "❌" not in capsys.readouterr().out


@pytest.mark.parametrize("exercise, label", LIBRARY_CASES, ids=LIBRARY_IDS)
def test_an_answer_that_calls_ropelib_is_refused(exercise, label, capsys):
    fn, words = EXERCISES[exercise]["library"][label]
    assert EXERCISES[exercise]["check"](fn) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer" in out and words in out, out
    assert "write it yourself" in out, out


@pytest.mark.parametrize("exercise, label", LIBRARY_CASES, ids=LIBRARY_IDS)
def test_the_refusal_is_the_barring_alone(exercise, label, monkeypatch, capsys):
    # with nothing barred, the library answer passes: its values are right, so the test above
    # fails for any check that stops barring ropelib
    monkeypatch.setattr(own_code, "library_barred", _nothing_barred)
    fn, _ = EXERCISES[exercise]["library"][label]
    assert EXERCISES[exercise]["check"](fn) is True, capsys.readouterr().out


@pytest.mark.parametrize("exercise", list(EXERCISES))
def test_an_unanswered_function_and_a_plain_value_are_not_answers(exercise, capsys):
    check = EXERCISES[exercise]["check"]
    assert check(lambda *args: None) is False
    assert "not answered yet" in capsys.readouterr().out
    assert check(...) is False
    assert "no answer yet (define the function)" in capsys.readouterr().out
    # the value itself, typed in, is not a function
    assert check([0, 4, 1, 5, 2, 6, 3, 7]) is False
    assert check(136314880) is False
    assert "expected a function" in capsys.readouterr().out


# --- the notebooks pass functions, not values ----------------------------------------------------

NOTEBOOK_CHECKS = [
    ("00-setup-and-tour.py", "check_program_floor", "my_program_floor_us"),
    ("00-setup-and-tour.py", "check_interleaved_rope", "my_rope"),
    ("01-roformer-math.py", "check_interleave_permutation", "perm_back"),
    ("02-pytorch-reference-and-layouts.py", "check_cp_positions", "rank_positions"),
    ("02-pytorch-reference-and-layouts.py", "check_bytes_moved", "bytes_moved"),
    ("03-naive-triton-kernel.py", "check_predicted_us", "my_predicted_us"),
    ("07-te-vs-triton-live.py", "check_fit_time_model", "fit_time_model"),
    ("07-te-vs-triton-live.py", "check_host_or_device", "host_or_device"),
    ("09-rope-in-a-model.py", "check_cached_attention", "cached_attention"),
    ("09-rope-in-a-model.py", "check_rope_share", "rope_share"),
]


@pytest.mark.parametrize("notebook, check, answer", NOTEBOOK_CHECKS)
def test_the_notebook_hands_the_check_a_function(notebook, check, answer):
    tree = ast.parse((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == check]
    assert len(calls) == 1, f"{notebook}: expected one call of {check}, found {len(calls)}"
    first = calls[0].args[0] if calls[0].args else None
    assert isinstance(first, ast.Name) and first.id == answer, ast.unparse(calls[0])
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == answer]
    assert defined, f"{notebook}: {answer} is not a function the learner writes"
    # the learner's placeholder is unanswered: its body returns nothing yet
    body = [s for s in defined[0].body if not (isinstance(s, ast.Expr) and
                                               isinstance(s.value, ast.Constant))]
    assert all(isinstance(s, ast.Return) and (s.value is None or
               (isinstance(s.value, ast.Constant) and s.value.value is None)) for s in body), \
        ast.unparse(defined[0])
