"""Notebook 11's 3-step dry run: the first step (which compiles) is left out of the tokens/s and
ms/step summary of ropelib.course.context_parallel_training.train, however few the steps."""
import time

import pytest

from ropelib.course import context_parallel_training as cpt
from ropelib.course.model import GPT, GPTConfig, CharDataset

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@pytest.mark.parametrize("steps", [2, 3])
def test_a_slow_first_step_is_not_in_the_summary(steps):
    data = CharDataset(TEXT)
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16)

    def slow_first(it, loss):
        if it == 0:
            time.sleep(1.0)                 # a compile, standing in

    hist = cpt.train(GPT(cfg, "reference"), data, steps=steps, batch_size=2, seed=0,
                     on_step=slow_first)
    assert hist["ms_per_step"] < 500        # the 1 s of step 1 is not in it


def test_one_step_is_its_own_summary():
    data = CharDataset(TEXT)
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16)
    hist = cpt.train(GPT(cfg, "reference"), data, steps=1, batch_size=2, seed=0)
    assert hist["ms_per_step"] > 0
