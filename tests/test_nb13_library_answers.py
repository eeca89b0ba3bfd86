"""Notebook 13: every puzzle's check fails an answer that calls ropelib's finished functions.

tests/test_puzzles.py refuses, puzzle by puzzle, the worked solution handed in and a kernel that
calls one of ropelib's @triton.jit helpers (`pair_features`). This file adds what a kernel body
can reach in Triton's interpreter, where it runs as Python: ropelib's finished host functions
(`apply_rope`, `apply_rope_qk`, the Transformer Engine and Hugging Face drop-ins), called on the
way by an answer that is otherwise the learner's own right kernel; and ropelib's finished kernel
handed in as the answer. Each answer without the call passes (tests/test_puzzles.py), so the
refusal is the call's."""
import inspect
import itertools
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import ropelib
from ropelib import frequencies
from ropelib import hf as rope_hf
from ropelib import te as rope_te
from ropelib.course import puzzles as pz
from ropelib.kernels.fused import _rope_kernel
from loading import scratch_folder, written_module

KEYS = list(pz.PUZZLES)
_COPIES = scratch_folder("nb13_library_answers_")
_count = itertools.count()

_X = torch.randn(2, 1, 1, 4)
_F = frequencies.rope_freqs(2, 4)
_COS, _SIN = frequencies.rope_cos_sin(2, 4)
_Q = torch.randn(1, 1, 2, 4)                    # bhsd, for the Hugging Face drop-in

FINISHED = {     # a call of a finished function, and what the ❌ line says it reached
    "ropelib.apply_rope": (lambda: ropelib.apply_rope(_X, _F), "called ropelib's apply_rope"),
    "ropelib.apply_rope_qk": (lambda: ropelib.apply_rope_qk(_X, _X.clone(), _F),
                              "called ropelib's apply_rope_qk"),
    "the TE drop-in": (lambda: rope_te.apply_rotary_pos_emb(_X, _F, tensor_format="sbhd"),
                       "called ropelib's apply_rotary_pos_emb (ropelib/te.py)"),
    "the HF drop-in": (lambda: rope_hf.apply_rotary_pos_emb(_Q, _Q.clone(), _COS[None],
                                                            _SIN[None]),
                       "called ropelib's apply_rotary_pos_emb (ropelib/hf.py)"),
}
CASES = [(k, f) for k in KEYS for f in FINISHED]


def _own_kernel_calling(key: str, call) -> object:
    """The worked solution of `key` as a learner typed it (a file and code of its own), with
    `CALL()` as the first line of its body: right values, and a call into ropelib on the way."""
    fn = pz.PUZZLES[key].solution.fn
    lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
    name = f"my_{key}_kernel_{next(_count)}"
    lines = [line.replace(f"def {fn.__name__}(", f"def {name}(", 1) for line in lines]
    body = next(i for i, line in enumerate(lines) if line.startswith("):")) + 1
    lines.insert(body, "    CALL()  # ropelib's finished function, its result thrown away")
    source = "\n".join(lines) + "\n"
    return getattr(written_module(name, _COPIES / f"{name}.py", source,
                                  {"triton": triton, "tl": tl, "CALL": call}), name)


@pytest.mark.parametrize("key, finished", CASES, ids=[f"{k}: {f}" for k, f in CASES])
def test_a_right_kernel_that_calls_a_finished_function_fails(key, finished, capsys):
    call, words = FINISHED[finished]
    kernel = _own_kernel_calling(key, call)
    assert pz.grade(pz.PUZZLES[key], kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert f"❌ puzzle {pz.PUZZLES[key].number} " in out and words in out, out
    assert "write it yourself" in out, out
    assert pz.last_grade(key).passed is False


@pytest.mark.parametrize("key", KEYS)
def test_the_finished_kernel_handed_in_fails(key, capsys):
    assert pz.grade(pz.PUZZLES[key], _rope_kernel, seed=0, draw=False) is False
    out = capsys.readouterr().out
    assert f"❌ puzzle {pz.PUZZLES[key].number} " in out and "ropelib's _rope_kernel" in out, out


def test_the_same_kernel_without_the_call_passes(capsys):
    """The insertion itself is no reason to fail: with a call that reaches nothing of ropelib,
    the learner's kernel passes."""
    kernel = _own_kernel_calling("shared_table", lambda: torch.zeros(1))
    assert pz.grade(pz.PUZZLES["shared_table"], kernel, seed=0, draw=False) is True
    assert "✅ puzzle 9 " in capsys.readouterr().out


def test_a_body_that_switches_the_watch_off_fails(capsys):
    import sys
    kernel = _own_kernel_calling("shared_table", lambda: sys.setprofile(None))
    assert pz.grade(pz.PUZZLES["shared_table"], kernel, seed=0, draw=False) is False
    assert "switched off the check's watch" in capsys.readouterr().out

