"""Shared pytest set-up for ropelib's tests.

The first thing it does: on a machine without a usable CUDA GPU, switch Triton's interpreter on
(`TRITON_INTERPRET=1`) *before* anything imports ropelib, because Triton decides how to run a
`@triton.jit` function when ropelib's kernel modules are imported. The variable is inherited by
the pytest-xdist workers and by the notebook kernels that nbmake starts.

Markers (registered in pyproject.toml):
- `gpu`: skipped, with the reason, unless the kernels run compiled on a CUDA GPU;
- `browser`: skipped, with the reason, unless playwright and a chromium binary are there
  (set ROPELIB_REQUIRE_BROWSER=1, as .ci/run does once it installed chromium, to fail instead);
- `slow`: informational; deselect with `-m "not slow"`.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib (and its @triton.jit) is imported
# what Triton is told here is what every kernel is built with: a test module may not change it
_TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET")

import importlib.util  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import zlib  # noqa: E402

import pytest  # noqa: E402


def _gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False); CPU runs use the Triton interpreter"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 runs the kernels in the interpreter; GPU tests need compiled kernels"
    return None


def chromium_path() -> str | None:
    """The chromium binary the browser tests drive (ROPELIB_CHROMIUM overrides the search)."""
    explicit = os.environ.get("ROPELIB_CHROMIUM")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser_skip_reason() -> str | None:
    """Why browser tests cannot run here, or None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return "needs the playwright package (pip install -e '.[test]')"
    if chromium_path() is None:
        return "needs Debian's chromium (apt-get install -y chromium) or ROPELIB_CHROMIUM=/path/to/chromium"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A test module that sets TRITON_INTERPRET when it is imported fails to collect (and the
    setting is undone): on a GPU it would send the GPU tests collected with it to the interpreter
    or skip them, and kernels imported after it would be built for the interpreter."""
    report = (yield).get_result()
    now = os.environ.get("TRITON_INTERPRET")
    if now != _TRITON_INTERPRET:
        if _TRITON_INTERPRET is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _TRITON_INTERPRET
        report.outcome, report.result = "failed", []
        report.longrepr = (f"{collector.nodeid} set TRITON_INTERPRET={now!r} when imported (it was "
                           f"{_TRITON_INTERPRET!r}): tests/conftest.py sets it where there is no "
                           "GPU; a test module must not")


def pytest_report_header(config):
    import ropelib

    lines = [f"ropelib {ropelib.__version__}: {ropelib.runtime.mode()}"]
    if os.environ.get("TRITON_INTERPRET") == "1":
        lines.append("TRITON_INTERPRET=1 (kernels run on the CPU through Triton's interpreter)")
    return lines


def browser_notebooks() -> list[str] | None:
    """The notebook-name prefixes ROPELIB_BROWSER_NOTEBOOKS limits the browser test to (07,08),
    or None: every notebook."""
    only = [n.strip() for n in os.environ.get("ROPELIB_BROWSER_NOTEBOOKS", "").split(",")]
    return [n for n in only if n] or None


@pytest.hookimpl(trylast=True)      # after -m / -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    gpu_reason = _gpu_skip_reason()
    browser_reason = _browser_skip_reason()
    require_browser = os.environ.get("ROPELIB_REQUIRE_BROWSER") == "1"
    for item in items:
        if gpu_reason and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=gpu_reason))
        if browser_reason and item.get_closest_marker("browser") and not require_browser:
            item.add_marker(pytest.mark.skip(reason=browser_reason))
    # The browser test runs every notebook top to bottom in JupyterLab and fails on any cell that
    # shows an error or did not run: in a session that runs it, nbmake does not run the same
    # notebooks a second time (running both took a sixth of the suite's CPU time).
    browser_runs = (not browser_reason or require_browser) and any(
        item.get_closest_marker("browser") and item.name.startswith("test_every_notebook_runs")
        for item in items)
    if browser_runs:
        only = browser_notebooks()
        for item in items:
            name = getattr(item, "path", None)
            if name is None or name.suffix != ".ipynb" or name.parent.name != "notebooks":
                continue
            if only is None or any(name.name.startswith(n) for n in only):
                item.add_marker(pytest.mark.skip(
                    reason="run top to bottom in JupyterLab by tests/test_browser.py in this "
                           "test run (every cell run, any error fails it)"))
        # It is the suite's longest test by far (every notebook, one after another, about as
        # long as the rest of the suite on one core): first in the order, so that a worker
        # starts it at once and the other worker (with --dist=worksteal, pyproject.toml) takes
        # the tests queued behind it; started last, the run would wait for it alone at the end.
        items.sort(key=lambda item: not item.get_closest_marker("browser"))


def pytest_runtest_setup(item):
    # CI installed chromium and set ROPELIB_REQUIRE_BROWSER=1: a missing piece fails the test.
    if item.get_closest_marker("browser") and os.environ.get("ROPELIB_REQUIRE_BROWSER") == "1":
        reason = _browser_skip_reason()
        if reason:
            pytest.fail(f"ROPELIB_REQUIRE_BROWSER=1 but the browser test {reason}", pytrace=False)


@pytest.fixture(autouse=True)
def _plans_dropped_after_a_patch(request):
    """After a test that patched anything (monkeypatch), drop every plan ropelib keeps
    (ropelib.eager.SIGNATURES: the eager route's, the QKV projection's GEMMs, pre-pass and dY
    rotation), after its patches are undone (an autouse fixture is torn down after the
    monkeypatch it was set up before): a plan made from a patched tile table or planner
    must not serve a later test. (A test that patches and then calls clears them itself, as
    code that changes a tile table does: eager.SIGNATURES.clear().)"""
    yield
    if "monkeypatch" in request.fixturenames:
        from ropelib import eager

        eager.SIGNATURES.clear()


@pytest.fixture(scope="session")
def device() -> str:
    """"cuda" when the kernels run compiled on a GPU, else "cpu" (Triton interpreter)."""
    import ropelib

    return ropelib.default_device()


@pytest.fixture
def seeded(request) -> int:
    """Seed torch, numpy and random afresh for each test; returns the seed.

    The seed is derived from the test's id, so each test draws its own inputs and a failure
    reproduces when the one test is rerun.
    """
    import numpy as np

    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return seed


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """Path of the chromium binary for playwright's `executable_path` (browser tests)."""
    path = chromium_path()
    if path is None:
        pytest.skip(_browser_skip_reason() or "chromium not found")
    return path


class DoBenchStandIn:
    """triton.testing.do_bench stood in for: each call runs the function it is handed once,
    keeps it in `calls`, and returns ms(k) for its k-th call (k from 0): as [median, 0.9 of it,
    1.1 of it] when asked for quantiles, else the median alone."""

    def __init__(self, ms):
        self.ms, self.calls = ms, []

    def __call__(self, fn, quantiles=None):
        fn()
        self.calls.append(fn)
        ms = self.ms(len(self.calls) - 1)
        return [ms, 0.9 * ms, 1.1 * ms] if quantiles else ms


@pytest.fixture
def do_bench_stand_in(monkeypatch):
    """do_bench_stand_in(ms): triton.testing.do_bench replaced by a DoBenchStandIn(ms) for the
    test, which it returns (its `calls`: the functions timed, in order)."""
    import triton.testing

    def install(ms) -> DoBenchStandIn:
        stand_in = DoBenchStandIn(ms)
        monkeypatch.setattr(triton.testing, "do_bench", stand_in)
        return stand_in
    return install


@pytest.fixture
def gpu_stand_in(monkeypatch, do_bench_stand_in):
    """gpu_stand_in(ms): a GPU stood in for, so that a GPU-only timing path runs on the CPU
    (the interpreter): ropelib.runtime.on_gpu() True, torch.cuda.synchronize a no-op, the device
    named "a CPU standing in", and do_bench_stand_in(ms), which it returns."""
    from ropelib import runtime

    monkeypatch.setattr(runtime, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "a CPU standing in")
    return do_bench_stand_in
