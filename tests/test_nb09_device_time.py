"""ropelib/course/nb09_device_time.py: notebook 09's device time of one call (CPU: the plumbing)."""

import pytest
import torch

from ropelib.course import nb09_device_time as dt
from ropelib.course.exercises import in_a_model
from ropelib.frequencies import rope_freqs


def test_device_ms_profiles_each_call_once_and_returns_its_time():
    calls = []
    ms = dt.device_ms(lambda: calls.append(torch.ones(64).sum()), "cpu", calls=5)
    assert len(calls) == 1 + 5                      # one warm-up call, then the profiled ones
    assert ms > 0


def test_device_ms_times_exercise_3s_launch_in_the_interpreter():
    B, S, H, D = 1, 4, 2, 16
    q = torch.randn(B, S, 3, H, D)[:, :, 0]                     # the model's strided view
    freqs = rope_freqs(S, D).reshape(S, D).contiguous()
    y = torch.empty(B, S, H, D)
    ms = dt.device_ms(lambda: in_a_model.launch_model_rope(
        in_a_model.solution_model_rope_kernel, q, freqs, y, 4), "cpu", calls=2)
    assert ms > 0 and torch.isfinite(y).all()



def test_a_time_the_profiler_cannot_attribute_is_none_and_says_why(monkeypatch, capsys):
    def unattributed(fn, device, calls):
        raise RuntimeError("a call launched nothing the profiler saw on the device")

    monkeypatch.setattr(dt, "device_ms", unattributed)
    assert dt.device_ms_or_none(lambda: None, "cpu") is None
    assert "launched nothing" in capsys.readouterr().out
