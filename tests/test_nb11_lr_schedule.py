"""Notebook 11's 131072-token runs: `lr_schedule` is the learning rate `train` sets, and the
6-step and 12-step schedules part from the second update on (the cause of the runs' split)."""
import math

import torch

from ropelib.course import context_parallel_training as cpt
from ropelib.course.model import GPT, CharDataset, GPTConfig

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def test_the_two_runs_schedules_part_after_step_one():
    six = [cpt.lr_schedule(it, 6, 6e-4) for it in range(6)]
    twelve = [cpt.lr_schedule(it, 12, 6e-4) for it in range(6)]
    assert math.isclose(six[0], 6e-4) and math.isclose(twelve[0], 6e-4)
    assert all(a < b for a, b in zip(six[1:], twelve[1:]))
    assert [round(v * 1e4, 2) for v in six] == [6.0, 5.64, 4.65, 3.3, 1.95, 0.96]
    assert [round(v * 1e4, 2) for v in twelve] == [6.0, 6.0, 5.89, 5.57, 5.07, 4.42]


def test_train_sets_lr_schedule(monkeypatch):
    data = CharDataset(TEXT)
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16)
    seen = []
    step = torch.optim.AdamW.step

    def record(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", record)
    cpt.train(GPT(cfg, "reference"), data, steps=12, batch_size=2, seed=0, lr=6e-4)
    assert seen == [cpt.lr_schedule(it, 12, 6e-4) for it in range(12)]
