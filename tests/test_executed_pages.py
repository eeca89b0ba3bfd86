"""The GPU pages in docs/executed/ are pages of the notebooks as they are now.

A page (an HTML render of a notebook executed on a GPU, written by benchmarks/run_notebooks.py)
shows the code cells of the notebook it was executed from. It is *current* when those cells are
the code cells of notebooks/NN-slug.ipynb today, cell for cell; the page's cells are read back
from its highlighted input, and a page rendered with a fingerprint (the sha256 of each code
cell, embedded by run_notebooks.py) must carry the fingerprint of the cells it shows. A page
also carries the sha256 of every committed file its run read through ropelib's readers (CSVs of
measurements, saved GPU outputs): when one of them has changed since, the page shows older data
and is stale too.

Re-rendering needs a GPU, so a page can fall behind its notebook for a while. Such pages are
listed in STALE below, each with the command that re-renders it; a notebook with no page yet is
listed in NO_PAGE. Both lists are checked both ways: a page that is stale and not listed fails,
and so does a listed page that has been re-rendered (take it off the list, and run
`python benchmarks/run_notebooks.py --index` to rewrite docs/executed/README.md).
"""
import functools
import json
import re
from pathlib import Path

import pytest
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "docs" / "executed"
NOTEBOOKS = ROOT / "notebooks"

run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")


def _rerender(stem):
    return ("re-render on a GPU: python benchmarks/run_notebooks.py --out /tmp/executed --only "
            f"{stem} && python benchmarks/run_notebooks.py --html /tmp/executed")


_OLDER = "the page was rendered from an older version of the notebook; "

# page -> why it is allowed to differ from its notebook for now
STALE = {stem: _OLDER + _rerender(stem) for stem in (
    "00-setup-and-tour",
    "08-debugging-allclose",
)}
# pages rendered before a data file they read was measured again
_OLDER_DATA = ("the page shows outputs of benchmarks/results/floor-nvidia-h200.csv as it was "
               "before its latest rerun; ")
STALE.update({stem: _OLDER_DATA + _rerender(stem) for stem in (
)})

# notebook -> why it has no page yet
NO_PAGE = {stem: "not executed on a GPU yet; " + _rerender(stem) for stem in (
)}

PAGES = sorted(EXECUTED.glob("[0-9][0-9]-*.html"))
NOTEBOOK_STEMS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))


def _page_cells(page):
    return run_notebooks.page_code_cells(page.read_text(encoding="utf-8"))


def _first_difference(page_cells, nb_cells):
    """Where the page's code cells first differ from the notebook's, in words."""
    a = [run_notebooks.normal_source(c) for c in page_cells]
    b = [run_notebooks.normal_source(c) for c in nb_cells]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"code cell {i + 1} differs; the page shows:\n{x[:300]}\nthe notebook has:\n{y[:300]}"
    if len(a) != len(b):
        return f"the page shows {len(a)} code cells, the notebook has {len(b)}"
    return None


def test_there_are_pages():
    assert PAGES, f"no executed pages in {EXECUTED}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_page_has_its_notebook(page):
    assert (NOTEBOOKS / f"{page.stem}.ipynb").is_file(), (
        f"docs/executed/{page.name} shows a notebook that is not in notebooks/ (renamed or "
        "removed?): delete the page or render the notebook under its new name")


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.skip(reason=f"{p.stem}: {STALE[p.stem]}")) if p.stem in STALE
    else p for p in PAGES], ids=lambda p: p.stem)
def test_page_shows_the_notebooks_code(page):
    nb = NOTEBOOKS / f"{page.stem}.ipynb"
    diff = _first_difference(_page_cells(page), run_notebooks.notebook_code_cells(nb))
    assert diff is None, (
        f"docs/executed/{page.name} is not a page of notebooks/{nb.name} as it is now: {diff}\n"
        f"{_rerender(page.stem)}")


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.skip(reason=f"{p.stem}: {STALE[p.stem]}")) if p.stem in STALE
    else p for p in PAGES], ids=lambda p: p.stem)
def test_page_shows_the_data_as_they_are(page):
    # a page rendered with the list of committed files its run read (run_notebooks.py records
    # them) must show outputs of those files as they are now
    changed = run_notebooks.changed_data(page.read_text(encoding="utf-8"))
    assert not changed, (
        f"docs/executed/{page.name} shows outputs of data that have changed since: {changed}\n"
        f"{_rerender(page.stem)}")


def test_a_page_records_the_data_it_read(tmp_path):
    # what a rendered page carries: the sha256 of each file its run read; a change shows
    reads = tmp_path / "nb.reads"
    data = ROOT / "benchmarks" / "results" / "floor-nvidia-h200.csv"
    reads.write_text(f"{data}\n{data}\n/elsewhere/not-in-the-checkout.csv\n", encoding="utf-8")
    fp = run_notebooks.data_fingerprint(reads)
    assert list(fp) == ["benchmarks/results/floor-nvidia-h200.csv"]
    page = ('<head><script type="application/json" id="ropelib-data">' + json.dumps(fp)
            + "</script></head>")
    assert run_notebooks.page_data(page) == fp and run_notebooks.changed_data(page) == []
    moved = {k: "0" * 64 for k in fp}
    page = page.replace(json.dumps(fp), json.dumps(moved))
    assert run_notebooks.changed_data(page) == ["benchmarks/results/floor-nvidia-h200.csv"]
    assert run_notebooks.page_data("<head></head>") is None


@pytest.mark.parametrize("stem", sorted(STALE))
def test_a_page_listed_as_stale_is_stale(stem):
    page, nb = EXECUTED / f"{stem}.html", NOTEBOOKS / f"{stem}.ipynb"
    assert page.is_file(), f"STALE lists {stem}, which has no page: take it off the list"
    assert nb.is_file(), f"STALE lists {stem}, which is not a notebook: take it off the list"
    assert _first_difference(_page_cells(page), run_notebooks.notebook_code_cells(nb)) is not None \
        or run_notebooks.changed_data(page.read_text(encoding="utf-8")), (
        f"docs/executed/{stem}.html shows the notebook's code as it is now: take it off STALE in "
        "tests/test_executed_pages.py and run `python benchmarks/run_notebooks.py --index`")


@pytest.mark.parametrize("stem", NOTEBOOK_STEMS)
def test_every_notebook_has_a_page_or_is_listed(stem):
    if stem in NO_PAGE:
        assert not (EXECUTED / f"{stem}.html").exists(), (
            f"{stem} has a page now: take it off NO_PAGE in tests/test_executed_pages.py")
    else:
        assert (EXECUTED / f"{stem}.html").is_file(), (
            f"notebooks/{stem}.ipynb has no page in docs/executed/: {_rerender(stem)} "
            "(until then, list it in NO_PAGE)")


def test_every_notebook_listed_without_a_page_exists():
    unknown = sorted(set(NO_PAGE) - set(NOTEBOOK_STEMS))
    assert not unknown, f"NO_PAGE lists notebooks that are not in notebooks/: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_fingerprint_is_the_one_of_the_cells_the_page_shows(page):
    """A page rendered with a fingerprint carries the hashes of the code it shows (so a
    fingerprint cannot be copied into a page it does not describe); older pages have none."""
    text = page.read_text(encoding="utf-8")
    fp = run_notebooks.page_fingerprint(text)
    if fp is None:
        assert page.stem in STALE, (
            f"docs/executed/{page.name} has no fingerprint: pages rendered by "
            "benchmarks/run_notebooks.py carry one")
        return
    assert fp["notebook"] == page.stem
    assert fp["code_cells"] == [run_notebooks.cell_hash(c) for c in
                                run_notebooks.page_code_cells(text)]


def test_the_index_lists_the_same_stale_pages():
    readme = (EXECUTED / "README.md").read_text(encoding="utf-8")
    rows = run_notebooks._index_rows(EXECUTED / "README.md")
    assert sorted(rows) == [p.stem for p in PAGES], "run `python benchmarks/run_notebooks.py --index`"
    marked = sorted(stem for stem, cells in rows.items() if cells[-1] != "yes")
    assert marked == sorted(STALE), (
        "docs/executed/README.md and STALE disagree: run `python benchmarks/run_notebooks.py "
        "--index` and check STALE")
    m = re.search(r"These notebooks have no page yet: (.*)\.", readme)
    listed = sorted(re.findall(r"`([^`]+)`", m.group(1))) if m else []
    assert listed == sorted(NO_PAGE), "run `python benchmarks/run_notebooks.py --index`"


# --- the comparison itself, on pages made here ------------------------------------------------

def _nb(cells, outputs=()):
    """An nbformat notebook of `cells` [(kind, source)], its code cells printing `outputs` (one
    text each, in order; fewer outputs than code cells leave the rest without)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) if kind == "code" else nbformat.v4.new_markdown_cell(s)
                for kind, s in cells]
    for cell, printed in zip([c for c in nb.cells if c.cell_type == "code"], outputs):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    return nb


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    """Render a notebook made of `cells` [(kind, source)], its code cells printing `outputs`, as
    run_notebooks.py would: (page, its folder)."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbconvert")

    def make(stem, cells, outputs=()):
        base = tmp_path_factory.mktemp("pages")
        executed, to = base / "executed", base / "html"
        executed.mkdir()
        nb = _nb(cells, outputs)
        nb.metadata["ropelib_executed"] = {"gpu": "no GPU", "status": "ok"}
        nbformat.write(nb, executed / f"{stem}.ipynb")
        assert run_notebooks.to_html(executed, to) == 0
        return to / f"{stem}.html", to
    return make


TRICKY = [("code", 'x = "<b>&amp;</b>"   # tags and entities\nif x < 3 and y > 2:\n\tpass  \n'),
          ("markdown", "# a heading\n\n`code` in prose is not a code cell"),
          ("code", ""),
          ("code", "print('é ∑ ✅')\n\n\n# trailing lines")]


def test_a_page_reads_back_as_the_code_it_was_rendered_from(render):
    page, _ = render("99-made-here", TRICKY)
    text = page.read_text(encoding="utf-8")
    sources = [s for kind, s in TRICKY if kind == "code"]
    assert [run_notebooks.normal_source(c) for c in run_notebooks.page_code_cells(text)] == \
        [run_notebooks.normal_source(s) for s in sources]
    fp = run_notebooks.page_fingerprint(text)
    assert fp == {"notebook": "99-made-here",
                  "code_cells": [run_notebooks.cell_hash(s) for s in sources]}


def test_a_changed_cell_makes_a_page_stale(render, tmp_path):
    page, _ = render("99-made-here", TRICKY)
    nbformat = pytest.importorskip("nbformat")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for edit in (lambda c: c[:1] + [("code", c[0][1] + " ")] + c[1:],   # one more cell
                 lambda c: [c[0], c[1], ("code", "y = 1"), c[3]]):       # one cell changed
        nbformat.write(_nb(edit(TRICKY)), notebooks / "99-made-here.ipynb")
        assert run_notebooks.page_state(page, notebooks) == "stale"
    nbformat.write(_nb(TRICKY), notebooks / "99-made-here.ipynb")
    assert run_notebooks.page_state(page, notebooks) == "current"
    (notebooks / "99-made-here.ipynb").unlink()
    assert run_notebooks.page_state(page, notebooks) == "no notebook"


# --- prose edited after a run: --refresh-prose --------------------------------------------------

def _notebook(cells, metadata=None):
    out = []
    for kind, source, *outputs in cells:
        cell = {"cell_type": kind, "metadata": {}, "source": source}
        if kind == "code":
            cell["outputs"] = outputs[0] if outputs else []
            cell["execution_count"] = 1 if outputs else None
        out.append(cell)
    return {"cells": out, "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5}


def _write(path, nb):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")


def test_refresh_prose_takes_the_checkouts_prose_and_the_runs_outputs(tmp_path):
    printed = [{"output_type": "stream", "name": "stdout", "text": "3\n"}]
    ran = _notebook([("markdown", "old words"), ("code", "x = 1 + 2  # sum\nprint(x)", printed)],
                    metadata={"ropelib_executed": {"gpu": "NVIDIA H200"}})
    now = _notebook([("markdown", "new words"), ("markdown", "a split-off cell"),
                     ("code", "# the sum\nx = 1 + 2\n\nprint(x)  # three")])
    _write(tmp_path / "ran" / "00-demo.ipynb", ran)
    (tmp_path / "ran" / "00-demo.reads").write_text("", encoding="utf-8")
    _write(tmp_path / "nb" / "00-demo.ipynb", now)
    assert run_notebooks.refresh_prose(tmp_path / "ran", tmp_path / "out", tmp_path / "nb") == 0
    out = json.loads((tmp_path / "out" / "00-demo.ipynb").read_text(encoding="utf-8"))
    assert [c["source"] for c in out["cells"]] == [c["source"] for c in now["cells"]]
    assert out["cells"][2]["outputs"] == printed
    assert out["metadata"]["ropelib_executed"] == {"gpu": "NVIDIA H200"}
    assert (tmp_path / "out" / "00-demo.reads").is_file()


@pytest.mark.parametrize("before, changed", [
    ("x = 1 + 2  # sum\nprint(x)", "x = 1 + 3  # sum\nprint(x)"),           # a constant
    ("x = 1 + 2  # sum\nprint(x)", "x = 1 + 2  # sum\nprint(x)\nprint(x)"),  # a statement more
    ("s = 'a # b'", "s = 'a '"),                     # a '#' inside a string is code
])
def test_refresh_prose_refuses_a_notebook_whose_code_changed(tmp_path, before, changed, capsys):
    ran = _notebook([("code", before, [])])
    _write(tmp_path / "ran" / "00-demo.ipynb", ran)
    _write(tmp_path / "nb" / "00-demo.ipynb", _notebook([("code", changed)]))
    assert run_notebooks.refresh_prose(tmp_path / "ran", tmp_path / "out", tmp_path / "nb") == 1
    assert "execute it again" in capsys.readouterr().err
    assert not (tmp_path / "out" / "00-demo.ipynb").exists()


def test_refresh_prose_refuses_a_code_cell_more_or_fewer(tmp_path):
    _write(tmp_path / "ran" / "00-demo.ipynb", _notebook([("code", "x = 1", [])]))
    _write(tmp_path / "nb" / "00-demo.ipynb", _notebook([("code", "x = 1"), ("code", "")]))
    assert run_notebooks.refresh_prose(tmp_path / "ran", tmp_path / "out", tmp_path / "nb") == 1


# --- prose edited after a run, with no executed copies at hand: --refresh-pages ---------------

def _notebook_file(tmp_path, stem, cells):
    nbformat = pytest.importorskip("nbformat")
    path = tmp_path / "notebooks" / f"{stem}.ipynb"
    path.parent.mkdir(exist_ok=True)
    nbformat.write(_nb(cells), path)
    return path


def test_refresh_pages_takes_the_notebooks_prose_and_keeps_the_runs_outputs(render, tmp_path):
    ran = [("markdown", "# Demo\n\nold words, 2.38<!--page: copy--> TB/s"), ("code", "print(3)"),
           ("markdown", "between"), ("code", "print(4)")]
    page, to = render("99-demo", ran, ["copy 2.38 TB/s\n", "four\n"])
    old = page.read_text(encoding="utf-8")
    # the notebook unchanged: the page comes back byte for byte (but the cells' ids, which
    # nbformat draws anew for the copy made here)
    same = _notebook_file(tmp_path, "99-demo", ran)
    no_ids = functools.partial(re.sub, r'id="cell-id=[^"]*"', "")
    assert no_ids(run_notebooks.page_with_prose(old, same, to)) == no_ids(old)
    # prose edited, a markdown cell split off and one removed: new prose, the run's outputs
    now = [("markdown", "# Demo\n\nnew words"), ("markdown", "a split-off cell"),
           ("code", "print(3)"), ("code", "print(4)"), ("markdown", "*the end*")]
    new = run_notebooks.page_with_prose(old, _notebook_file(tmp_path, "99-demo", now), to)
    text = _prose_text(new)
    assert "new words" in text and "a split-off cell" in text and "the end" in text
    assert "old words" not in text and "between" not in text
    assert run_notebooks.page_output_text(new).split() == ["copy", "2.38", "TB/s", "four"]
    assert run_notebooks.page_code_cells(new) == run_notebooks.page_code_cells(old)
    assert run_notebooks.page_fingerprint(new) == run_notebooks.page_fingerprint(old)
    # the code changed: refused, to be run again
    with pytest.raises(ValueError, match="execute it again"):
        run_notebooks.page_with_prose(old, _notebook_file(tmp_path, "99-demo", [
            ("code", "print(3)"), ("code", "print(5)")]), to)


def _prose_text(page_html: str) -> str:
    """The words of a page's markdown cells, one-spaced."""
    cells = run_notebooks._cells(page_html)
    return " ".join(run_notebooks._text("".join(page_html[a:b] for a, b, is_code in cells
                                                 if not is_code)).split())


@pytest.mark.parametrize("page", [p for p in PAGES if p.stem not in STALE], ids=lambda p: p.stem)
def test_a_current_page_shows_its_notebooks_prose(page):
    # a page whose code is the notebook's shows the notebook's prose too: prose edited since the
    # run is brought to the page with `python benchmarks/run_notebooks.py --refresh-pages`
    pytest.importorskip("nbconvert")
    old = page.read_text(encoding="utf-8")
    new = run_notebooks.page_with_prose(old, NOTEBOOKS / f"{page.stem}.ipynb", EXECUTED)
    assert _prose_text(old) == _prose_text(new), (
        f"docs/executed/{page.name} shows older prose than notebooks/{page.stem}: run "
        "`python benchmarks/run_notebooks.py --refresh-pages`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_numbers_the_prose_quotes_from_the_page_are_on_it(page):
    # prose that reads a live output ("the copy ran at 2.38<!--page: torch copy_--> TB/s") must
    # agree with the line of the page it names: a page rendered again with other numbers fails
    # here until the prose follows
    markdown = run_notebooks.notebook_markdown(NOTEBOOKS / f"{page.stem}.ipynb")
    outputs = run_notebooks.page_output_text(page.read_text(encoding="utf-8"))
    missing = run_notebooks.quotes_missing_from_outputs(markdown, outputs)
    assert not missing, (
        f"notebooks/{page.stem} quotes {missing} from its page, which no output of "
        f"docs/executed/{page.name} shows: read the page again and correct the prose")
    stray = run_notebooks.stray_page_markers(markdown)
    assert not stray, (f"notebooks/{page.stem}: a page marker not straight after a number: "
                       f"{stray}")
    unmarked = run_notebooks.unmarked_page_paragraphs(markdown)
    assert not unmarked, (
        f"notebooks/{page.stem}: a paragraph points at the page's outputs but marks no number "
        "it quotes (write <!--page: words on its output line--> straight after each): " + unmarked[0][:300])


def test_page_quotes_are_checked_on_their_line_to_the_precision_given():
    outputs = "copy: 2.381 TB/s\nwarps: 32,768\ndelta   -1.10 %\nnaive: 2.39 TB/s\n"
    md = ("ran at 2.38<!--page: copy:--> TB/s on 32,768<!--page: warps--> warps, "
          "-1.1<!--page:delta --> %")
    assert run_notebooks.quotes_missing_from_outputs(md, outputs) == []
    # the precision the prose gives, on the line the label names
    assert run_notebooks.quotes_missing_from_outputs("2.39<!-- page: copy: --> TB/s", outputs) \
        == ["2.39 (copy:)"]
    assert run_notebooks.quotes_missing_from_outputs("2.39<!--page: naive-->", outputs) == []
    assert run_notebooks.quotes_missing_from_outputs("32,769<!--page: warps-->", outputs) \
        == ["32,769 (warps)"]
    # a number printed elsewhere on the page does not stand for the line the label names
    assert run_notebooks.quotes_missing_from_outputs("2.38<!--page: warps-->", outputs) \
        == ["2.38 (warps)"]
    # a marker must name its line, and sit straight after a number
    assert run_notebooks.quotes_missing_from_outputs("2.38<!--page--> TB/s", outputs) \
        == ["2.38 (no label)"]
    assert run_notebooks.stray_page_markers("at 2.38 <!--page: copy:--> TB/s") != []
    assert run_notebooks.stray_page_markers(md) == []
    assert run_notebooks.unmarked_page_paragraphs(
        "On this notebook's page the copy ran at 2.38 TB/s.\n\nOther text.") != []
    assert run_notebooks.unmarked_page_paragraphs(
        "On this notebook's page the copy ran at 2.38<!--page: copy:--> TB/s.") == []
