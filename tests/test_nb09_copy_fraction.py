"""ropelib/course/nb09_copy_fraction.py: notebook 09 appendix A.5's check at several ROWS and its
GPU timing against a plain copy, run on the CPU with fake launchers and timers."""

import pytest
import torch

from ropelib.course import nb09_copy_fraction as cf
from ropelib.course.exercises import in_a_model
from ropelib.frequencies import rope_freqs


def _inputs(B=2, S=8, H=2, D=16, dtype=torch.float32):
    qkv = torch.randn(B, S, 3, H, D, dtype=dtype)
    freqs = rope_freqs(S, D)                                   # [S, 1, 1, D] fp32
    return qkv[:, :, 0], qkv[:, :, 1], freqs


def test_same_rotation_checks_each_kernel_at_each_rows_with_the_worked_kernels():
    q, k, freqs = _inputs(B=1, S=4)
    S, D = q.shape[1], q.shape[-1]
    import ropelib
    expected = ropelib.apply_rope_qk(q, k, freqs, layout="bshd")[0]
    lines = []
    ok = cf.same_rotation({"worked": in_a_model.solution_model_rope_kernel,
                           "one angle a pair": in_a_model.solution_model_rope_one_angle},
                          q, freqs.reshape(S, D).contiguous(), expected, out=lines.append)
    assert ok == {(n, r): True for n in ("worked", "one angle a pair") for r in (4, 16, 64)}
    assert lines == ["the same rotation as ropelib's at ROWS 4, 16, 64 (fp32, within 1e-6): "
                     "worked True, True, True; one angle a pair True, True, True"]


def test_same_rotation_fails_a_rows_that_leaves_an_element_unwritten_or_off():
    q, _, freqs = _inputs()
    expected = q * 2

    def launch(kern, x, freqs_rows, y, rows):
        y.copy_(x * 2)
        if kern == "half" and rows == 64:
            y[0, -1, -1, -1] = float("nan")                       # one element left unwritten
        if kern == "off" and rows == 16:
            y[0, 0, 0, 0] += 1e-4                                    # beyond 1e-6

    ok = cf.same_rotation({"right": "right", "half": "half", "off": "off"}, q, None, expected,
                          launch=launch, out=lambda s: None)
    assert [k for k, v in ok.items() if not v] == [("half", 64), ("off", 16)]


class _Fakes:
    """A launcher, ropelib and two timers that know what each timed call launched: the copy
    (nothing launched), a kernel at a ROWS, or ropelib's apply_rope_qk."""

    def __init__(self, ms, device_ms, copy_ms=0.010, copy_device_ms=0.008, lib_ms=0.025):
        self.ms, self.dms = ms, device_ms
        self.copy_ms, self.copy_dms, self.lib_ms = copy_ms, copy_device_ms, lib_ms
        self.log, self.device_calls, self.seen = [], [], []

    def launch(self, kern, x, freqs_rows, y, rows):
        self.seen.append((x, freqs_rows, y))
        self.log.append((kern, rows))

    def apply_qk(self, q, k, freqs):
        self.log.append(("lib", q, k, freqs))

    def _what(self, fn):
        n = len(self.log)
        fn()
        return None if len(self.log) == n else self.log[-1]

    def time_ms(self, fn, device):
        what = self._what(fn)
        return (self.copy_ms if what is None else self.lib_ms if what[0] == "lib"
                else self.ms[what])

    def device_time(self, fn, device):
        what = self._what(fn)
        self.device_calls.append(what)
        return self.copy_dms if what is None else self.dms[what]


def _run(fakes, rows_ok, kernels=("a", "b"), **kw):
    q, k, freqs = _inputs()
    lines = []
    frac = cf.time_against_copy({n: n for n in kernels}, rows_ok, q, k, freqs, "cpu",
                                launch=fakes.launch, time_ms=fakes.time_ms,
                                device_ms=fakes.device_time, apply_qk=fakes.apply_qk,
                                out=lines.append, **kw)
    return frac, lines, (q, k, freqs)


def test_time_against_copy_divides_the_copys_time_by_each_kernels_both_ways():
    ms = {("a", 4): 0.020, ("a", 16): 0.0125, ("a", 64): 0.011, ("b", 4): 0.040,
          ("b", 16): 0.010, ("b", 64): 0.0099}
    dms = {key: 0.5 * t for key, t in ms.items()}
    fakes = _Fakes(ms, dms)
    rows_ok = {key: True for key in ms} | {("b", 64): False}          # b at 64: wrong rotation
    frac, lines, (q, k, freqs) = _run(fakes, rows_ok)
    assert frac == {key: (0.010 / ms[key], 0.008 / dms[key]) for key in ms if key != ("b", 64)}
    assert ("b", 64) not in frac and ("b", 64) not in fakes.log       # not timed, not launched
    # the yardstick: a plain copy of q's bytes into a contiguous y, q's table as [S, D] rows
    x, f_rows, y = fakes.seen[0]
    assert x is q and y.is_contiguous() and y.shape == q.shape
    assert f_rows.shape == (q.shape[1], q.shape[-1]) and f_rows.is_contiguous()
    assert torch.equal(f_rows, freqs.reshape(q.shape[1], -1))
    assert torch.equal(y, q)                                           # the copy ran into y
    assert fakes.log[-1][0] == "lib" and fakes.log[-1][1] is q and fakes.log[-1][2] is k
    assert fakes.log[-1][3] is freqs
    assert lines[0] == (f"cpu: q {tuple(q.shape)} float32, a strided view, "
                        f"{2 * q.numel() * 4 / 1e6:.1f} MB read and written; a plain copy of as "
                        "many bytes: do_bench 10.0 µs, device time 8.0 µs")
    assert lines[1].split() == ["kernel", "ROWS", "do_bench", "µs", "device", "µs", "fraction",
                                "(do_bench)", "(device)", "not", "device"]
    assert lines[2] == f"{'a':>18} {4:5d} {20.0:12.1f} {10.0:10.1f} {0.5:20.2f} {0.8:9.2f} " \
                       f"{50:10.0f}%"
    assert lines[7] == f"{'b':>18} {64:5d} (wrong rotation: not timed)"
    assert lines[8] == "ropelib.apply_rope_qk, q and k in one launch: 25.0 µs, 0.80 of two " \
                       "plain copies' speed"
    assert len(lines) == 9


def test_without_device_time_only_do_bench_is_used():
    ms = {("a", r): 0.020 for r in (4, 16, 64)}
    fakes = _Fakes(ms, {}, copy_device_ms=None)
    frac, lines, _ = _run(fakes, {key: True for key in ms}, kernels=("a",))
    assert frac == {key: (0.5, None) for key in ms}
    assert fakes.device_calls == [None]          # the copy's, once: no kernel is profiled
    assert lines[0].endswith("do_bench 10.0 µs")
    assert lines[2] == f"{'a':>18} {4:5d} {20.0:12.1f} {'-':>10} {0.5:20.2f}"


def test_events_shorter_than_the_device_time_fail():
    ms = {("a", r): 0.020 for r in (4, 16, 64)}
    dms = dict(ms) | {("a", 16): 0.031}                  # 1.55 times the events around it
    with pytest.raises(AssertionError, match="'a', 16"):
        _run(_Fakes(ms, dms), {key: True for key in ms}, kernels=("a",))


@pytest.mark.parametrize("t", [0.0066, 0.21])            # 1.52 and 0.048 of a copy
def test_a_fraction_outside_the_sanity_band_fails(t):
    ms = {("a", r): 0.020 for r in (4, 16, 64)} | {("a", 64): t}
    with pytest.raises(AssertionError):
        _run(_Fakes(ms, {key: 0.9 * v for key, v in ms.items()}), {key: True for key in ms},
             kernels=("a",))


def test_the_notebook_cell_calls_the_helpers_on_a_gpu():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "notebooks" / "09-rope-in-a-model.py").read_text(
        encoding="utf-8")
    a5 = text[text.index("### A.5 Section 9"):text.index("**Which change moves a kernel")]
    assert ("rows_ok = same_rotation(kernels9, q9, f9_rows, by_ropelib, "
            "launch=launch_model_rope)") in a5
    assert ("frac9 = time_against_copy(kernels9, rows_ok, q_t, k_t, f_t, device,\n"
            "                              launch=launch_model_rope, times=times9)") in a5
    assert "compare.time_ms" not in a5                  # the timing loop lives in the module


def test_times_receives_the_ms_and_the_first_line_names_the_device():
    ms = {("a", 4): 0.020, ("a", 16): 0.0125, ("a", 64): 0.011}
    dms = {key: 0.5 * t for key, t in ms.items()}
    times = {}
    frac, lines, _ = _run(_Fakes(ms, dms), {key: True for key in ms}, kernels=("a",),
                          times=times)
    assert times == {"copy": (0.010, 0.008)} | {key: (ms[key], dms[key]) for key in ms}
    assert lines[0].startswith("cpu: q ")                     # a GPU's name on a GPU
    assert frac == {key: (0.010 / ms[key], 0.008 / dms[key]) for key in ms}
