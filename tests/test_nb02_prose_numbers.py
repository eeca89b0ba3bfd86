"""Numbers the prose of notebooks/02-pytorch-reference-and-layouts.py states that follow from
bf16 itself, not from a run: section 2's 8 significant bits, a bf16 cos/sin off by up to 2^-9
(question 2 as well), and one bf16 step of 1/64 and 1/32 for values from 2 to 8."""
import torch

from ropelib.frequencies import rope_cos_sin, rope_freqs


def test_bf16_has_8_significant_bits_and_its_steps_from_2_to_8():
    assert torch.finfo(torch.bfloat16).eps == 2.0 ** -7          # 7 stored bits + the implicit 1
    for lo, step in ((2.0, 1 / 64), (4.0, 1 / 32)):
        v = torch.tensor([lo, 2 * lo - step], dtype=torch.bfloat16)
        assert torch.nextafter(v, torch.tensor(9.0, dtype=torch.bfloat16)).float().sub(
            v.float()).tolist() == [step, step]


def test_a_bf16_cos_sin_table_errs_by_up_to_2_to_the_minus_9():
    S, D = 4096, 128                                  # the notebook's GPU shape
    cos, sin = rope_cos_sin(S, D, dtype=torch.bfloat16)
    f = rope_freqs(S, D)[:, 0, 0]                     # the fp32 angles; cos, sin in fp32
    err = max((cos.float() - f.cos()).abs().max().item(),
              (sin.float() - f.sin()).abs().max().item())   # the rounding to bf16 alone
    assert 2.0 ** -10 < err <= 2.0 ** -9               # half a step of values in [0.5, 1)
