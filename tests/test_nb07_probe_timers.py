"""ropelib.course.probe_timers: notebook 07's live timings taken as the committed probes took
theirs (benchmarks/mid_fwdbwd_probe.py, benchmarks/host_by_size_probe.py), on the CPU."""
import re
from pathlib import Path

import pytest
import torch
from loading import load_file

from ropelib import reference
from ropelib.bench import compare
from ropelib.course import probe_timers as pt

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_the_cases_and_counts_are_the_probes():
    host_probe = load_file("host_by_size_probe", ROOT / "benchmarks" / "host_by_size_probe.py")
    assert host_probe.HOST_BY_SIZE_CASES is pt.HOST_BY_SIZE_CASES   # the probe's own cases
    assert [c.layout for c in pt.HOST_BY_SIZE_CASES.values()] == \
        ["sbhd", "sbhd", "bshd", "thd", "bshd"]
    assert (pt.CALLS, pt.HOST_ROUNDS) == (host_probe.CALLS, host_probe.ROUNDS)
    assert re.search(rf"for _ in range\({pt.HOST_WARMUP}\):\n\s+fn\(\)",
                     (ROOT / "benchmarks" / "host_by_size_probe.py").read_text())
    mid_path = ROOT / "benchmarks" / "mid_fwdbwd_probe.py"
    mid_probe = load_file("mid_fwdbwd_probe", mid_path)
    assert mid_probe.ENQUEUED == pt.CALLS
    text = mid_path.read_text()
    assert re.search(rf'"--rounds", type=int, default={pt.MID_ROUNDS}\)', text)
    assert len(re.findall(rf"graph_replay_ms\(\s*fwdbwd, {pt.GRAPH_CALLS}, dev\)", text)) == 1
    assert "suite.host_us(fwdbwd, ENQUEUED, reps=1,\n" in text
    # notebook 07, section 7.5 times the log's first case
    label, fields = mid_probe.CASES[0]
    assert label == "64 MiB bf16 sbhd" and fields == dict(seq_len=1024, layout="sbhd")


def _counting(log, name, fail=False):
    def step():
        log.append(name)
        if fail:
            raise RuntimeError(f"{name} cannot run")
        return torch.ones(4).sum()
    return step


def test_mid_fwdbwd_ways_times_every_step_three_ways_in_alternating_rounds():
    log, pair_calls = [], []
    steps = {"a": _counting(log, "a"), "b": _counting(log, "b")}
    pair_us, rows = pt.mid_fwdbwd_ways(steps, lambda: pair_calls.append(1), CPU, rounds=2,
                                       calls=5, graph_calls=2)
    assert pair_us > 0 and pair_calls
    assert set(rows) == {"a", "b"}
    for row in rows.values():
        assert all(row[w] > 0 for w in pt.MID_WAYS) and row["failed"] == {}
    # one step's three ways, then the other's; the order reversed in the second round
    runs = [n for i, n in enumerate(log) if i == 0 or log[i - 1] != n]
    assert runs == ["a", "b", "a"]          # a, b; then b, a
    # per round each step: the replay's calls (off a GPU: 1 + 3 timed runs of graph_calls),
    # the enqueue's and the eager call's
    assert log.count("a") == 2 * ((1 + 3) * 2 + 5 + 5)


def test_mid_fwdbwd_ways_reports_a_failing_step_and_keeps_the_others():
    log = []
    pair_us, rows = pt.mid_fwdbwd_ways({"ok": _counting(log, "ok"),
                                        "bad": _counting(log, "bad", fail=True)},
                                       lambda: None, CPU, rounds=2, calls=3, graph_calls=1)
    assert all(rows["ok"][w] > 0 for w in pt.MID_WAYS)
    assert all(rows["bad"][w] is None for w in pt.MID_WAYS)
    assert set(rows["bad"]["failed"]) == set(pt.MID_WAYS)
    assert all("RuntimeError: bad cannot run" in why for why in rows["bad"]["failed"].values())
    assert log.count("bad") == 3            # each way tried once, then left out
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        pt.mid_fwdbwd_ways({}, lambda: None, CPU, rounds=0)


def test_host_by_size_ways_times_each_step_with_and_without_the_thread():
    seen = []

    def step():
        seen.append(torch._C._is_multithreading_enabled())

    def broken():
        raise RuntimeError("no")
    got = pt.host_by_size_ways({"s": step, "x": broken}, CPU, rounds=3, calls=4, warmup=2)
    assert list(got) == ["s", "x", "s, one thread", "x, one thread"]
    assert got["s"] > 0 and got["s, one thread"] > 0
    assert all(isinstance(got[k], RuntimeError) for k in ("x", "x, one thread"))
    assert seen.count(True) == seen.count(False) == 2 + 3 * 4
    assert torch._C._is_multithreading_enabled()           # switched back on
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        pt.host_by_size_ways({}, CPU, rounds=0)


def test_fwdbwd_steps_builds_a_step_for_each_provider_that_runs_the_case():
    case = compare.make_case(compare.Config(4, 2, 2, 8, "fp32"), CPU, seed=1)
    provs = compare.providers()
    names = ("pytorch", "te_fused", "torch.compile")
    steps = pt.fwdbwd_steps(case, provs, names)
    # a provider that does not run the case gets no step (off a GPU: TE and torch.compile)
    runs = {p.name for p in provs if p.why_not(case.config) is None}
    assert list(steps) == [n for n in names if n in runs]
    if not torch.cuda.is_available():
        assert list(steps) == ["pytorch"]
    grads = steps["pytorch"]()
    assert len(grads) == 1 and grads[0].shape == case.x.shape
    # the gradient of RoPE for dy = 0.5 everywhere, through the reference's backward
    x = case.x.detach().clone().requires_grad_()
    y = reference.te_unfused(x, case.freqs, tensor_format="sbhd")
    (want,) = torch.autograd.grad(y, [x], torch.full_like(y, 0.5))
    torch.testing.assert_close(grads[0], want)


def test_launches_removed_launches_nothing_and_puts_them_back_after_an_error():
    import ropelib
    from ropelib import eager
    from ropelib.course.work_count import count_work

    x = torch.randn(3, 2, 2, 8)
    freqs = ropelib.rope_freqs(8, 8)
    launch = eager.EagerLaunch.__dict__["__call__"]
    eager.SIGNATURES.clear()
    with count_work(x=x) as work:
        ropelib.apply_rope(x, freqs)                        # planned, launched
    assert work.programs > 0 and work.loads["x"] == x.numel()
    planned = dict(eager.SIGNATURES.entries)
    for replan in (False, True):
        with count_work(x=x) as work, pt.launches_removed(replan=replan):
            y = ropelib.apply_rope(x, freqs)
            assert eager.EagerLaunch.__call__ is not launch
        assert work.programs == 0 and work.loads["x"] == 0 and y.shape == x.shape
        # replan=False: the call took the plan made before; True: no plan outlives the block
        assert eager.SIGNATURES.entries == ({} if replan else planned)
        assert eager.EagerLaunch.__dict__["__call__"] is launch
    with count_work(x=x) as work:
        pt.without_launches(lambda: ropelib.apply_rope(x, freqs), replan=False)()
    assert work.programs == 0
    with pytest.raises(RuntimeError, match="inside"):
        with pt.launches_removed(replan=True):
            raise RuntimeError("inside")
    assert eager.EagerLaunch.__dict__["__call__"] is launch  # put back after the error
    with count_work(x=x) as work:
        ropelib.apply_rope(x, freqs)
    assert work.programs > 0                                 # and it launches again
