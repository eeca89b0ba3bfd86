"""Training steps timed in interleaved rounds, and read as pairs (notebook 09, section 4 and
appendix A.4).

In each round every arm makes ``steps`` calls back to back, the arms in an order shuffled each
round and the device synchronised around each arm: drift slower than a round (clocks, heat, other
work on the machine) moves both arms of a round alike and cancels in the round's ratio, so the
rounds are read as pairs (:func:`ropelib.course.rounds.paired_rounds`, the sign test). Each arm's
time is also taken when the host has issued its last call, before it waits for the device: the
host's *issue time*. Near the wall time, the host set the pace (the step is *host-bound*).

    step_ms = interleaved_step_ms(models, (x, y), rounds=15, steps=20, warmup=10, issue=issued)
    faster, wins, p, ratio, diff_ms = step_verdict(step_ms)
"""
from __future__ import annotations

import random
import time

import torch

from .model import make_optimizer, train_step
from .rounds import paired_rounds


def interleaved_ms(calls: dict, *, rounds: int, steps: int, warmup: int = 0, seed: int = 0,
                   sync=None, issue: dict | None = None) -> dict:
    """{arm: [ms per call in each round]} for the zero-argument callables ``calls`` ({arm: fn}):
    ``warmup`` calls of each arm first, then ``rounds`` rounds, each running every arm for
    ``steps`` calls in an order shuffled by ``random.Random(seed)``, ``sync()`` (if given: the
    device's synchronisation) before and after each arm's calls. ``issue``, a dict if given,
    receives {arm: [the host's issue ms per call in each round]}: until the last call returned,
    before the closing ``sync()``."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"need at least one round of one step, got rounds={rounds}, "
                         f"steps={steps}")
    sync = sync or (lambda: None)
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    shuffle, times = random.Random(seed), {arm: [] for arm in calls}
    for _ in range(rounds):
        order = list(calls)
        shuffle.shuffle(order)
        for arm in order:
            fn = calls[arm]
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            t_issued = time.perf_counter()                 # the host has issued every call
            sync()
            times[arm].append(1e3 * (time.perf_counter() - t0) / steps)
            if issue is not None:
                issue.setdefault(arm, []).append(1e3 * (t_issued - t0) / steps)
    return times


def interleaved_step_ms(models: dict, batch, *, rounds: int, steps: int, warmup: int,
                        seed: int = 0, issue: dict | None = None) -> dict:
    """{arm: [ms per training step in each round]} of the models ({arm: GPT}), each trained by
    ``train_step`` on ``batch`` = (x, y) with its own AdamW (bf16 autocast on a GPU, as the
    training loop), in :func:`interleaved_ms`'s rounds; ``issue`` as there."""
    x, y = batch
    amp = torch.bfloat16 if x.is_cuda else None          # the training loop's autocast
    opts = {arm: make_optimizer(m, lr=1e-4) for arm, m in models.items()}
    calls = {arm: (lambda arm=arm: train_step(models[arm], opts[arm], x, y, amp_dtype=amp))
             for arm in models}
    return interleaved_ms(calls, rounds=rounds, steps=steps, warmup=warmup, seed=seed,
                          sync=torch.cuda.synchronize if x.is_cuda else None, issue=issue)


def quartiles(v) -> tuple:
    """(q25, median, q75) of a list of numbers."""
    q = torch.tensor(v, dtype=torch.float64).quantile(torch.tensor([0.25, 0.5, 0.75],
                                                                   dtype=torch.float64))
    return tuple(q.tolist())


def differences(slow, fast) -> tuple:
    """The quartiles of the round-by-round differences slow[i] - fast[i]: the middle half and
    the median of a saving, read as pairs."""
    if len(slow) != len(fast) or not slow:
        raise ValueError(f"need the same number (> 0) of rounds, got {len(slow)} and {len(fast)}")
    return quartiles([a - b for a, b in zip(slow, fast)])


def issue_share(issue, wall) -> float:
    """The median over the rounds of an arm's issue time over its wall time: near 1, the host
    was still issuing when the device finished (host-bound)."""
    return quartiles([i / w for i, w in zip(issue, wall)])[1]


def step_verdict(times: dict, alpha: float = 0.01) -> tuple:
    """From {"ropelib": [...], "reference": [...]}, ms per step a round: (the faster arm or None
    where p >= alpha, its wins, the sign test's p, the median per-round ratio slower/faster, the
    difference of the medians in ms)."""
    k, r = times["ropelib"], times["reference"]
    over_ropelib = paired_rounds(r, k)                  # reference / ropelib, round by round
    if over_ropelib["b_wins"] >= over_ropelib["a_wins"]:
        lead, pair = "ropelib", over_ropelib
    else:
        lead, pair = "reference", paired_rounds(k, r)   # ropelib / reference
    diff = abs(quartiles(r)[1] - quartiles(k)[1])
    return (lead if pair["p"] < alpha else None), pair["b_wins"], pair["p"], pair["ratio"], diff
