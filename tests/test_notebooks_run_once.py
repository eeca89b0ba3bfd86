"""A notebook runs once per test session: where the browser test runs it (Run All in JupyterLab,
any cell error or unrun cell fails it), nbmake skips it; everywhere else nbmake runs it.

conftest.pytest_collection_modifyitems makes that choice; these tests hand it collected items
of each kind and read which it marked to skip.
"""
from pathlib import Path

import conftest
import pytest

NOTEBOOKS = Path(conftest.__file__).resolve().parents[1] / "notebooks"


class _Item:
    """What the hook reads of a collected item: name, path, markers; what it adds: skips."""

    def __init__(self, name, path=None, markers=()):
        self.name, self.path, self._markers, self.skipped = name, path, set(markers), None

    def get_closest_marker(self, name):
        return name if name in self._markers else None

    def add_marker(self, mark):
        self.skipped = mark.kwargs["reason"]


def _session(browser_test=True):
    items = [_Item("test_something", Path("tests/test_x.py"))]
    if browser_test:
        items.append(_Item("test_every_notebook_runs_shows_its_figures_and_saves_clean",
                           Path("tests/test_browser.py"), {"browser"}))
    for nb in ("00-setup-and-tour.ipynb", "07-te-vs-triton-live.ipynb"):
        items.append(_Item(nb, NOTEBOOKS / nb))
    return items


def _notebooks_skipped(items):
    return {i.name: i.skipped for i in items if i.path.suffix == ".ipynb"}


@pytest.fixture
def browser(monkeypatch):
    monkeypatch.delenv("ROPELIB_BROWSER_NOTEBOOKS", raising=False)
    monkeypatch.delenv("ROPELIB_REQUIRE_BROWSER", raising=False)
    monkeypatch.setattr(conftest, "_gpu_skip_reason", lambda: None)

    def set_available(available):
        monkeypatch.setattr(conftest, "_browser_skip_reason",
                            lambda: None if available else "needs chromium")
    return set_available


def test_notebooks_the_browser_test_runs_are_not_run_again(browser):
    browser(True)
    items = _session()
    conftest.pytest_collection_modifyitems(None, items)
    skipped = _notebooks_skipped(items)
    assert all(reason and "tests/test_browser.py" in reason for reason in skipped.values()), skipped
    assert items[0].skipped is None and items[1].skipped is None    # the other tests all run


def test_without_a_browser_nbmake_runs_every_notebook(browser):
    browser(False)
    items = _session()
    conftest.pytest_collection_modifyitems(None, items)
    assert set(_notebooks_skipped(items).values()) == {None}
    assert items[1].skipped == "needs chromium"                   # the browser test is skipped


def test_a_session_without_the_browser_test_runs_every_notebook(browser):
    browser(True)
    items = _session(browser_test=False)
    conftest.pytest_collection_modifyitems(None, items)
    assert set(_notebooks_skipped(items).values()) == {None}


def test_a_browser_run_limited_to_some_notebooks_leaves_the_others_to_nbmake(browser,
                                                                               monkeypatch):
    browser(True)
    monkeypatch.setenv("ROPELIB_BROWSER_NOTEBOOKS", "07")
    items = _session()
    conftest.pytest_collection_modifyitems(None, items)
    skipped = _notebooks_skipped(items)
    assert skipped["00-setup-and-tour.ipynb"] is None and skipped["07-te-vs-triton-live.ipynb"]


def test_the_browser_test_is_handed_out_first_and_the_others_can_be_taken_from_behind_it(browser):
    """The browser test is as long as the rest of the suite on one core: it goes first, and
    pytest-xdist's work stealing lets the other worker take the tests queued behind it (under the
    default --dist=load they waited for it, and CI for them)."""
    browser(True)
    items = _session()
    order = [i.name for i in items]
    conftest.pytest_collection_modifyitems(None, items)
    assert items[0].get_closest_marker("browser")
    rest = [i.name for i in items[1:]]
    assert rest == [n for n in order if n != items[0].name]          # the others keep their order
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    pyproject = tomllib.loads((NOTEBOOKS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    assert "--dist=worksteal" in pyproject["tool"]["pytest"]["ini_options"]["addopts"].split()
