"""Notebook 02's exercises 1b and 2 (ropelib.course.exercises.layouts): each check accepts a
learner's own copy of its worked solution and refuses the worked solution itself, ropelib's
answers, Hugging Face's own rotary module, and the wrong answers a learner is likely to write."""
import pytest
import torch

from ropelib import reference
from ropelib.course.exercises import layouts
from loading import learner_copy


def test_thd_cp_positions_hand_values_and_answers(capsys):
    own = learner_copy(layouts.solution_thd_cp_positions)
    cu = torch.tensor([0, 8, 24], dtype=torch.int32)          # lengths 8 and 16 over 2 ranks
    # sequence 0: 4 chunks of 2, rank 1 holds 2-3 and 4-5; sequence 1: chunks of 4, 4-7 and 8-11
    assert own(cu, 2, 1) == [2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10, 11]
    assert layouts.check_thd_cp_positions(own)
    assert layouts.check_thd_cp_positions(lambda c, n, r: torch.tensor(own(c, n, r)))
    for wrong in (
            lambda c, n, r: reference.positions("thd", 0, cu_seqlens=c, cp_size=n, cp_rank=r),
            layouts.solution_thd_cp_positions,                          # the worked solution
            lambda c, n, r: own(c, 1, 0)[:int(c[-1]) // n],             # no split at all
            lambda c, n, r: list(range(int(c[-1]) // n * r, int(c[-1]) // n * (r + 1))),
            lambda c, n, r: own(c, n, r)[::-1],
            lambda c, n, r: ...):
        assert not layouts.check_thd_cp_positions(wrong)
    capsys.readouterr()


def _angles64(inv, pos, s, dt):        # angles in fp64: off by thousandths at 10^5
    a = pos.double()[..., None] * inv.double()
    e = torch.cat((a, a), -1)
    return (e.cos() * s).to(dt), (e.sin() * s).to(dt)


def _rounded_first(inv, pos, s, dt):   # cos and sin rounded before the scaling: twice
    a = pos.float()[..., None] * inv.float()
    e = torch.cat((a, a), -1)
    return (e.cos().to(dt) * s).to(dt), (e.sin().to(dt) * s).to(dt)


def _interleaved(inv, pos, s, dt):     # each angle twice in a row: TE's interleaved layout
    a = (pos.float()[..., None] * inv.float()).repeat_interleave(2, -1)
    return (a.cos() * s).to(dt), (a.sin() * s).to(dt)


def test_hf_cos_sin_answers(capsys):
    own = learner_copy(layouts.solution_hf_cos_sin)
    inv = torch.tensor([1.0, 0.01])
    cos, sin = own(inv, torch.tensor([[0, 1]]), 1.0, torch.float32)
    assert cos.shape == (1, 2, 4) and torch.equal(cos[0, 0], torch.ones(4))
    assert torch.equal(sin[0, 1], torch.tensor([1.0, 0.01, 1.0, 0.01]).sin())
    assert layouts.check_hf_cos_sin(own)
    for wrong in (layouts.solution_hf_cos_sin, _angles64, _rounded_first, _interleaved,
                  lambda i, p, s, d: layouts.hf_cos_sin_expected(i, p, 1.0, d),   # no scaling
                  lambda i, p, s, d: ...):
        assert not layouts.check_hf_cos_sin(wrong)
    capsys.readouterr()


def test_hf_cos_sin_refuses_transformers_rotary_module(capsys):
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig
    emb = modeling.LlamaRotaryEmbedding(LlamaConfig(hidden_size=128, num_attention_heads=1,
                                                    head_dim=128))

    def hf(inv, pos, s, dt):
        emb.inv_freq, emb.attention_scaling = inv.clone(), s
        return emb(torch.zeros(1, dtype=dt), pos)

    torch.testing.assert_close(hf(torch.tensor([1.0, 0.1]), torch.tensor([[3, 70000]]), 1.2,
                                  torch.float32),
                               layouts.hf_cos_sin_expected(torch.tensor([1.0, 0.1]),
                                                           torch.tensor([[3, 70000]]), 1.2,
                                                           torch.float32), atol=0, rtol=0)
    assert not layouts.check_hf_cos_sin(hf)
    assert "transformers" in capsys.readouterr().out


def test_exercise_2s_last_question_is_the_bf16_cos_sin_line():
    # the learner's own cos and sin, given to apply_rope, reproduce section 2's "fused, bf16
    # cos/sin" line bit for bit, and no other line of the table
    import ropelib
    from ropelib.frequencies import rope_cos_sin, rope_freqs
    torch.manual_seed(0)
    S, D = 16, 32
    x = torch.randn(S, 2, 3, D, dtype=torch.bfloat16)
    f_tab = rope_freqs(S, D)
    cos, sin = rope_cos_sin(S, D, dtype=torch.bfloat16)
    lines = {"fused, fp32 angles (ropelib)": ropelib.apply_rope(x, f_tab),
             "fused, bf16 cos/sin": ropelib.apply_rope(x, cos=cos, sin=sin),
             "TE unfused (math in bf16)": reference.te_unfused(x, f_tab)}
    own = learner_copy(layouts.solution_hf_cos_sin)
    assert layouts.table_line_of(own, x, lines) == ("fused, bf16 cos/sin", 1.0)


def test_thd_cp_positions_rule_as_the_notebook_states_it(capsys):
    # The notebook states the rule for lengths that are multiples of 2 * cp_size, and that with
    # cp_size=1 nothing is split, any length: the check tries an odd length there, so an answer
    # that cuts every sequence into 2 * cp_size chunks even at cp_size=1 fails, and the text
    # must say why. An answer written from those two sentences passes.
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "notebooks"
            / "02-pytorch-reference-and-layouts.py").read_text(encoding="utf-8")
    exercise_1 = text[text.index("**Exercise 1"):text.index("**Exercise 2")]
    assert "With `cp_size=1` nothing is split" in exercise_1 and "of any length" in exercise_1

    def chunks_always(cu, n, r):          # the rule, applied at cp_size=1 too: drops odd tails
        out, cu = [], cu.tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            c, m = (b - a) // (2 * n), 2 * n - 1 - r
            out += list(range(r * c, (r + 1) * c)) + list(range(m * c, (m + 1) * c))
        return out

    def from_the_text(cu, n, r):
        if n == 1:                        # nothing split: each sequence whole, from 0
            cu = cu.tolist()
            return [p for a, b in zip(cu[:-1], cu[1:]) for p in range(b - a)]
        return chunks_always(cu, n, r)

    assert not layouts.check_thd_cp_positions(chunks_always)
    assert "cp_size=1" in capsys.readouterr().out
    assert layouts.check_thd_cp_positions(from_the_text)
    capsys.readouterr()
