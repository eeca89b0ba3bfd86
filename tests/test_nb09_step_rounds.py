"""Notebook 09's interleaved rounds (`ropelib.course.nb09_step_rounds`): every arm runs its steps
back to back in each round, in an order shuffled each round; the issue time is taken before the
device's wait; the verdict reads the rounds as pairs (section 4), and the notebook's host probe
and CUDA-graph replays (appendix A.4) time their arms with the same loop."""
import ast
import math
import os
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

from ropelib.course import model as gpt_model  # noqa: E402
from ropelib.course.model import GPTConfig  # noqa: E402
from ropelib.course.nb09_step_rounds import (differences, interleaved_ms,  # noqa: E402
                                             interleaved_step_ms, issue_share, quartiles,
                                             step_verdict)
from ropelib.course.rounds import paired_rounds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"


def _calls(log, arms=("a", "b", "c")):
    return {arm: (lambda arm=arm: log.append(arm)) for arm in arms}


def test_each_round_runs_every_arm_back_to_back_in_a_shuffled_order():
    log, synced = [], []
    times = interleaved_ms(_calls(log), rounds=6, steps=3, warmup=2, seed=0,
                           sync=lambda: synced.append(len(log)))
    assert log[:6] == ["a", "a", "b", "b", "c", "c"]          # the warm-up, arm by arm
    rounds = [log[6 + 9 * r: 6 + 9 * (r + 1)] for r in range(6)]
    orders = []
    for calls in rounds:                  # three calls of one arm, then the next arm's
        order = calls[::3]
        assert calls == [arm for arm in order for _ in range(3)] and sorted(order) == list("abc")
        orders.append(tuple(order))
    assert len(set(orders)) > 1                                 # shuffled, not fixed
    # the device synchronised before and after each arm's calls
    assert synced == [n for r in range(6) for a in range(3)
                      for n in (6 + 9 * r + 3 * a, 6 + 9 * r + 3 * a + 3)]
    assert {arm: len(v) for arm, v in times.items()} == {"a": 6, "b": 6, "c": 6}
    # the same seed, the same orders
    log2 = []
    interleaved_ms(_calls(log2), rounds=6, steps=3, warmup=2, seed=0)
    assert log2 == log
    with pytest.raises(ValueError, match="at least one round"):
        interleaved_ms(_calls([]), rounds=0, steps=1)


def test_the_issue_time_stops_before_the_device_wait():
    """A device that takes 20 ms after each arm's calls: the wall time counts it, the issue time
    does not."""
    issue = {}
    wall = interleaved_ms({"arm": lambda: None}, rounds=2, steps=2,
                          sync=lambda: time.sleep(0.02), issue=issue)
    for i, w in zip(issue["arm"], wall["arm"]):
        assert i < 2 < 10 <= w             # ms per call: the 20 ms wait over 2 calls
    assert issue_share(issue["arm"], wall["arm"]) < 0.2


def test_quartiles_differences_and_issue_share():
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert differences([3.0, 5.0, 7.0], [1.0, 2.0, 3.0]) == (2.5, 3.0, 3.5)
    assert issue_share([1.0, 2.0, 9.0], [2.0, 2.0, 10.0]) == 0.9
    with pytest.raises(ValueError, match="same number"):
        differences([1.0], [1.0, 2.0])


def test_the_speed_verdict_reads_the_rounds_as_pairs():
    """Section 4's verdict on interleaved rounds: a faster arm only where it won enough rounds
    for the sign test (p < 0.01), else none, however far apart the arms' spreads lie; the
    median per-round ratio and the difference of the medians."""
    sign_test = lambda wins, n: paired_rounds([1.0] * wins + [2.0] * (n - wins), [1.5] * n)["p"]
    assert sign_test(15, 15) == pytest.approx(2 / 2 ** 15)
    assert sign_test(0, 15) == sign_test(15, 15) and sign_test(7, 15) == 1.0
    assert sign_test(13, 15) == pytest.approx(2 * (math.comb(15, 13) + 15 + 1) / 2 ** 15)
    # drift shared by both arms: the spreads overlap, yet ropelib wins every round by 20 %
    drift = [10.0, 14.0, 11.0, 18.0, 12.0, 16.0, 13.0, 10.5, 17.0, 15.0]
    paired = {"ropelib": drift, "reference": [1.2 * t for t in drift]}
    faster, wins, p, ratio, diff = step_verdict(paired)
    assert (faster, wins, ratio) == ("ropelib", 10, pytest.approx(1.2))
    assert p == pytest.approx(2 / 2 ** 10)
    assert diff == pytest.approx(0.2 * quartiles(drift)[1])
    swapped = {"ropelib": paired["reference"], "reference": paired["ropelib"]}
    assert step_verdict(swapped)[:3] == ("reference", 10, p)
    # far-apart spreads but only 6 wins of 10: unresolved
    mixed = {"ropelib": [10.0] * 10, "reference": [12.0] * 6 + [9.0] * 4}
    assert step_verdict(mixed)[0] is None
    # the CPU's three rounds can never resolve
    assert step_verdict({"ropelib": [1.0, 1.0, 1.0], "reference": [2.0, 2.0, 2.0]})[0] is None


def test_the_host_probe_times_three_arms_and_the_no_rope_model_ignores_positions():
    """Appendix A.4's profiler-free host probe (GPU only in the notebook): section 4's
    interleaved rounds with a third arm whose rotary module (the notebook's `NoRotary`) leaves q
    and k as they are. Run on the CPU: every arm gets a wall time and an issue time per round,
    the issue time no longer than the wall time."""
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    defs = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NoRotary"]
    assert len(defs) == 1
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(NOTEBOOK), "exec"),  # noqa: S102
         namespace)
    cfg = GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16)
    models = {"reference": gpt_model.build(cfg, "reference", seed=0),
              "no RoPE": gpt_model.build(cfg, "reference", seed=0)}
    for blk in models["no RoPE"].blocks:
        blk.attn.rotary = namespace["NoRotary"]()
    q, k = torch.randn(2, 2, 8, 2, 8).unbind(0)
    assert all(a is b for a, b in zip(models["no RoPE"].blocks[0].attn.rotary(q, k), (q, k)))
    x = torch.randint(0, 20, (2, 8))
    before = [p.detach().clone() for p in models["reference"].parameters()]
    issue = {}
    times = interleaved_step_ms(models, (x, x), rounds=2, steps=1, warmup=1, issue=issue)
    assert set(times) == set(issue) == set(models)
    for arm in models:
        assert len(times[arm]) == len(issue[arm]) == 2
        assert all(0 < i <= w for i, w in zip(issue[arm], times[arm]))
    # the arms trained: each call is a training step
    assert any(not torch.equal(a, b) for a, b in zip(before, models["reference"].parameters()))


def test_the_notebook_times_its_arms_with_these_rounds():
    text = NOTEBOOK.read_text(encoding="utf-8")
    defined = {n.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}
    assert not defined & {"interleaved_ms", "interleaved_step_ms", "quartiles", "step_verdict"}
    assert "step_ms = interleaved_step_ms(step_models, step_batch, rounds=ROUNDS" in text
    assert "probe_ms = interleaved_step_ms(probe_models, step_batch" in text
    assert "graph_ms = interleaved_ms(replays, rounds=12, steps=20, seed=1," in text
    assert "no difference that this run can" in text
    # the training runs' tokens/s give the committed run's verdict only, not this run's
    assert 'say_verdict("this run"' not in text
