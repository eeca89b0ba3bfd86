"""ropelib.course.launch_queue: notebook 07's queue model of do_bench's loop, on the CPU."""
from pathlib import Path

import pytest
import torch

from ropelib.course import launch_queue as lq, measured

ROOT = Path(__file__).resolve().parents[1]
GAP_LOG = ROOT / "benchmarks" / "results" / "dobench_gap-nvidia-h200-20261204-0930.log"


def test_host_ahead_gives_the_kernel_alone():
    assert lq.events_span(60.0, 20.0, iter_host_us=70.0, launch_us=65.0) == 20.0


def test_device_waits_adds_the_launch_after_the_memset():
    assert lq.events_span(60.0, 20.0, iter_host_us=100.0, launch_us=75.0) == pytest.approx(35.0)
    assert lq.events_span(60.0, 20.0, iter_host_us=100.0, launch_us=50.0) == 20.0


def test_queue_model_bounds_the_launch_by_the_call():
    loop = {"iter_host": 120.0, "to_start_host": 62.0, "to_call_host": 115.0}
    got = lq.queue_model(loop, 60.0, 20.0)
    assert got["regime"].startswith("device waits") and not got["edge"]
    assert (got["low"], got["high"]) == pytest.approx((22.0, 75.0))
    ahead = lq.queue_model({**loop, "iter_host": 50.0}, 60.0, 20.0)
    assert ahead["low"] == ahead["high"] == 20.0 and ahead["regime"].startswith("host ahead")
    assert lq.queue_model({**loop, "iter_host": 85.0}, 60.0, 20.0)["edge"]


def test_within_widens_by_a_fifth():
    assert lq.within(24.0, 20.0, 20.0) and not lq.within(25.0, 20.0, 20.0)
    assert lq.within(16.0, 20.0, 30.0) and not lq.within(15.9, 20.0, 30.0)


def test_the_committed_timeline():
    t = measured.dobench_gap_timeline(GAP_LOG)
    assert set(t) == {"ropelib", "te_fused"}
    r = t["ropelib"]
    assert (r["call_start"], r["first_launch"], r["first_kernel"]) == (41.7, 93.8, 102.9)
    assert round(r["memset_device_end"], 1) == 85.5 and round(r["call_end"], 1) == 333.4
    assert t["te_fused"]["first_launch"] == 159.2          # not the memset's own launch


def test_helpers_run_without_a_gpu():
    calls = []
    assert lq.enqueue_us(lambda: calls.append(1), calls=5) > 0 and len(calls) == 5
    us, n = lq.dobench_counted(lambda: torch.ones(4).sum(), torch.device("cpu"))
    assert us > 0 and n >= 1
    seen = []
    lq.one_thread(lambda step: seen.append(step))("s")
    assert seen == ["s"]


def test_a_timeline_without_the_call_names_the_provider(tmp_path):
    lines = [line for line in GAP_LOG.read_text().splitlines()
             if not line.rstrip().endswith(": call")]
    log = tmp_path / "gap.log"
    log.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="'ropelib' has no host event for the call"):
        measured.dobench_gap_timeline(log)
