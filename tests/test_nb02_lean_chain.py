"""Notebook 02's exercise 4 (`nb02_lean_chain.check_lean_chain`): an eager chain with its tables
made contiguous and without TE's split. The check accepts a learner's own copy of the worked
solution and refuses the worked solution itself, ropelib's answers, a tensor made beforehand,
TE's chain (with and without its split) and tables made at t's shape in fp32."""
import ast
from pathlib import Path

import torch

import ropelib
from ropelib import reference
from ropelib.course.exercises import nb02_lean_chain as ex
from loading import learner_copy

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02-pytorch-reference-and-layouts.py"


def _rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _te_no_split(t, freqs):                      # TE's chain less its split: tables broadcast
    c, s = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    return t * c + _rotate_half(t) * s


def _tables_fp32(t, freqs):                      # contiguous, but fp32 tables at t's shape
    c = torch.cos(freqs).expand(t.shape).contiguous()
    s = torch.sin(freqs).expand(t.shape).contiguous()
    return (t * c + _rotate_half(t) * s).to(t.dtype)


def _case0():
    g = torch.Generator().manual_seed(2)
    return ex._case(16, 2, 3, 32, torch.bfloat16, g)


def test_a_learners_copy_passes_and_its_count_is_the_budget(capsys):
    own = learner_copy(ex.solution_lean_chain)
    assert ex.check_lean_chain(own)
    _, (t, freqs), want = _case0()
    assert torch.equal(own(t, freqs), want)
    ops = ex.chain_ops(own, t, freqs)
    assert [n for n, _, _ in ops] == ["cos", "_to_copy", "clone", "sin", "_to_copy", "clone",
                                      "neg", "cat", "mul", "mul", "add"]
    assert all(not shapes for _, _, shapes in ops)
    x_bytes, table = t.numel() * t.element_size(), freqs.numel() * 4
    # the tables written at t's shape (1 + 1), neg and cat (1 + 2), two muls and the add (3 each)
    assert sum(m for _, m, _ in ops) == ex.BYTES_OF_X * x_bytes + ex.TABLE_TIMES * table
    capsys.readouterr()


def test_library_answers_and_wrong_chains_are_refused(capsys):
    own = learner_copy(ex.solution_lean_chain)
    _, (t0, f0), fixed = _case0()
    for wrong in (ex.solution_lean_chain,                               # the worked solution
                  reference.te_unfused,                                 # ropelib's chain
                  lambda t, f: ropelib.apply_rope(t, f),               # ropelib's kernel
                  lambda t, f: fixed,                                   # made beforehand
                  _te_no_split,                                         # broadcast tables
                  lambda t, f: torch.cat((own(t, f), t[..., t.shape[-1]:]), -1),  # the split
                  _tables_fp32,
                  lambda t, f: None, ...):
        assert ex.check_lean_chain(wrong) is False, wrong
    out = capsys.readouterr().out
    assert "broadcast" in out and "bytes" in out and "ropelib" in out


def test_the_notebook_hands_the_check_its_lean_chain():
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "check_lean_chain"]
    assert len(calls) == 1 and ast.unparse(calls[0].args[0]) == "lean_chain"
    (defined,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "lean_chain"]
    assert ast.unparse(defined.body[-1]) == "..."        # unanswered in the notebook


def _expanded_not_copied(t, freqs):              # the tables expanded (stride 0), never copied
    c = torch.cos(freqs).to(t.dtype).expand_as(t)
    s = torch.sin(freqs).to(t.dtype).expand_as(t)
    return t * c + _rotate_half(t) * s


def test_an_expanded_table_is_refused_as_broadcast_and_the_message_says_so(capsys):
    # expand_as gives t's shape with strides of 0: TE's bits, but still a broadcast operand
    _, (t, freqs), want = _case0()
    assert torch.equal(_expanded_not_copied(t, freqs), want)
    assert ex.check_lean_chain(_expanded_not_copied) is False
    out = capsys.readouterr().out
    assert f"{tuple(t.shape)} with strides" in out and "a stride of 0" in out, out
