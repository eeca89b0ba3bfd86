"""Execute every notebook top to bottom and keep the outputs, for a study group without a GPU to
read next to its own CPU run.

    python benchmarks/run_notebooks.py --out DIR             # execute: DIR/NN-slug.ipynb + times.csv
    python benchmarks/run_notebooks.py --html DIR --to docs/executed   # executed .ipynb -> HTML

The first form runs on the machine that has the GPU (it needs nbclient and ipykernel, nothing
else from Jupyter); the second runs anywhere nbconvert is installed and writes one self-contained
HTML page per notebook (plots embedded, figures/ linked) plus an index that names the machine and the times.
The notebooks in the checkout are only read: the executed copies go to DIR.

A page links the committed figures (figures/) relative to where it is written, so the links
hold in every clone when the pages go inside the checkout (docs/executed, the default). Pages
written outside the checkout embed those figures instead: a relative link from there would
leave the repository (a page copied into docs/executed later would point at the rendering
machine's folders). Every page is checked after it is written: an image that is neither
embedded nor an existing file inside the checkout fails the conversion.

Every page carries a fingerprint of the notebook it shows: the sha256 of each code cell's source
(`<script type="application/json" id="ropelib-code-cells">`). The index (README.md in the pages'
folder) compares every page in that folder, re-rendered now or not, with the notebooks in the
checkout and lists the pages that show an older version of their notebook (stale) and the
notebooks that have no page; tests/test_executed_pages.py makes the same comparison. To
re-render one notebook on a GPU:

    python benchmarks/run_notebooks.py --out /tmp/executed --only 09-rope-in-a-model
    python benchmarks/run_notebooks.py --html /tmp/executed

Prose edited after a run (markdown cells, comments in code cells) reaches the pages without a
second run, as long as the executed copies are at hand and no code cell changed beyond its
comments: `--refresh-prose DIR --into NEWDIR` writes each notebook of the checkout with the
outputs of its executed copy in DIR (cell by cell: the k-th code cell takes the k-th code cell's
outputs, after checking that the two are the same code once comments and blank lines are
dropped; markdown cells may be added, removed or split), then `--html NEWDIR` as above. A
notebook whose code changed otherwise is refused and must be executed again. Where the executed
copies are not at hand, `--refresh-pages` rewrites the pages themselves: each page that shows
its notebook's code cells as they are now takes every markdown cell from the notebook, rendered
the same way, and keeps its code cells and their outputs as the run left them.
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime
import hashlib
import html
import json
import mimetypes
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "no GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU"


def error_cells(nb) -> list:
    """(code cell number from 1, "ename: evalue") of every code cell whose outputs hold an error."""
    found, k = [], 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        k += 1
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                found.append((k, f"{o.get('ename', '')}: {o.get('evalue', '')}"[:200]))
                break
    return found


def execute(out: Path, only: str | None, timeout_s: int, keep_going: bool = False) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    out.mkdir(parents=True, exist_ok=True)
    env_note = {"gpu": _gpu_name(), "python": platform.python_version(),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    try:
        import torch
        import triton
        env_note.update(torch=torch.__version__, triton=triton.__version__)
    except ImportError:
        pass
    try:
        import transformer_engine
        env_note["transformer_engine"] = transformer_engine.__version__
    except Exception:  # noqa: BLE001 -- optional
        env_note["transformer_engine"] = "not installed"
    rows, failed = [], 0
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")):
        if only and not any(part in path.stem for part in only.split(",")):
            continue
        nb = nbformat.read(path, as_version=4)
        # keep_going: every cell runs even after one fails, so that one run on a GPU shows
        # every failing cell (the page still counts as failed)
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                allow_errors=keep_going,
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        t0 = time.time()
        status = "ok"
        reads = out / f"{path.stem}.reads"
        reads.unlink(missing_ok=True)
        # the kernel inherits this: ropelib's readers of committed data note each file they read
        os.environ["ROPELIB_DATA_READS"] = str(reads.resolve())
        try:
            client.execute()
            errors = error_cells(nb)
            if errors:
                status = (f"error: {len(errors)} cell(s): "
                          + "; ".join(f"code cell {k}: {msg}" for k, msg in errors))[:600]
                failed += 1
        except CellExecutionError as e:
            status = "error: " + str(e).strip().splitlines()[-1][:200]
            failed += 1
        except Exception as e:  # noqa: BLE001 -- a dead kernel or a timeout: say so, go on
            status = f"error: {type(e).__name__}: {str(e)[:200]}"
            failed += 1
        read_data = data_fingerprint(reads)
        os.environ.pop("ROPELIB_DATA_READS", None)
        seconds = time.time() - t0
        nb.metadata["ropelib_executed"] = dict(env_note, seconds=round(seconds, 1), status=status)
        nb.metadata["ropelib_data"] = read_data
        nbformat.write(nb, out / path.name)
        rows.append({"notebook": path.stem, "seconds": f"{seconds:.1f}", "status": status})
        print(f"{path.stem:40s} {seconds:7.1f} s  {status}", flush=True)
    with open(out / "times.csv", "w", newline="") as f:
        f.write("# " + json.dumps(env_note) + "\n")
        w = csv.DictWriter(f, fieldnames=["notebook", "seconds", "status"])
        w.writeheader()
        w.writerows(rows)
    return 1 if failed else 0


_FIGURE_LINK = re.compile(r"\]\(\.\./figures/([^)\s]+)\)")   # ](../figures/NAME) in markdown
_IMG_SRC = re.compile(r"<img\b[^>]*?\bsrc\s*=\s*([\"'])(.*?)\1", re.S | re.I)


def _inside_checkout(folder: Path) -> bool:
    try:
        folder.resolve().relative_to(ROOT)
        return True
    except ValueError:
        return False


def _data_uri(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def figure_links(markdown: str, to: Path) -> str:
    """The notebooks' markdown links to ../figures/NAME (relative to notebooks/), rewritten for
    a page written in `to`: a relative link when `to` is inside the checkout, the figure
    embedded (a data: URI) when it is not."""
    if _inside_checkout(to):
        figures = os.path.relpath(ROOT / "figures", to.resolve()).replace(os.sep, "/")
        return _FIGURE_LINK.sub(lambda m: f"]({figures}/{m.group(1)})", markdown)

    def embed(m):
        path = ROOT / "figures" / m.group(1)
        if not path.is_file():
            raise FileNotFoundError(f"a notebook links figures/{m.group(1)}, which does not exist")
        return f"]({_data_uri(path)})"
    return _FIGURE_LINK.sub(embed, markdown)


def broken_images(page: Path) -> list:
    """The <img src> of an HTML page that are neither embedded (data:) nor an existing file
    inside the checkout (reached from the page's folder). An absolute path, a URL or a link
    leaving the repository counts as broken: it would not work in another clone."""
    broken = []
    for _, src in _IMG_SRC.findall(page.read_text(encoding="utf-8")):
        if src.startswith("data:"):
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:|^/", src, re.I):
            broken.append(src)
            continue
        target = (page.parent / src.split("#")[0].split("?")[0]).resolve()
        if not (_inside_checkout(target) and target.is_file()):
            broken.append(src)
    return broken


_CELL_START = re.compile(r'<div class="jp-Cell ')      # a cell, not its inner jp-Cell-* parts
_CODE_INPUT = re.compile(r'<div class="highlight[^"]*"><pre>(.*?)</pre>', re.S)
_FINGERPRINT = re.compile(
    r'<script type="application/json" id="ropelib-code-cells">(.*?)</script>', re.S)


_DATA = re.compile(r'<script type="application/json" id="ropelib-data">(.*?)</script>', re.S)


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def data_fingerprint(reads: Path) -> dict:
    """{path relative to the checkout: sha256} of every committed file a notebook's run read
    through ropelib's readers (bench.compare.note_read), from the list the run wrote."""
    if not reads.is_file():
        return {}
    out = {}
    for line in sorted(set(reads.read_text(encoding="utf-8").splitlines())):
        p = Path(line)
        if p.is_file() and _inside(p, ROOT):
            out[p.relative_to(ROOT).as_posix()] = file_hash(p)
    return out


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def page_data(page_html: str):
    """The data a page's run read ({path: sha256}), or None for a page rendered before pages
    recorded them."""
    m = _DATA.search(page_html)
    return None if m is None else json.loads(m.group(1))


def changed_data(page_html: str, root: Path = ROOT) -> list:
    """The files a page's run read that differ now (or are gone): its outputs show older data."""
    data = page_data(page_html) or {}
    return sorted(rel for rel, sha in data.items()
                  if not (root / rel).is_file() or file_hash(root / rel) != sha)


def normal_source(source: str) -> str:
    """A code cell's source as a page can show it: leading and trailing newlines dropped (the
    page's highlighter drops them), and a blank cell empty (it shows a blank cell as a space)."""
    return source.strip("\n") if source.strip() else ""


def cell_hash(source: str) -> str:
    """sha256 of a code cell's source (`normal_source`, UTF-8)."""
    return hashlib.sha256(normal_source(source).encode("utf-8")).hexdigest()


def cell_source(cell: dict) -> str:
    """A notebook cell's source as one string (.ipynb keeps it as a string or a list of lines)."""
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def notebook_code_cells(path: Path) -> list:
    """The source of every code cell of a notebook (.ipynb), in order."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return [cell_source(c) for c in nb["cells"] if c["cell_type"] == "code"]


def notebook_markdown(path: Path) -> str:
    """The markdown cells of a notebook (.ipynb), in order, one blank line between cells (so a
    paragraph never runs across two cells)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return "\n\n".join(cell_source(c) for c in nb["cells"] if c["cell_type"] == "markdown")


_DIV_TAG = re.compile(r"<div\b|</div>")


def _cells(page_html: str) -> list:
    """(start, end, is_code) of each cell of a page, in order: a cell's div up to its closing tag
    (its nested divs counted)."""
    cells = []
    for m in _CELL_START.finditer(page_html):
        if cells and m.start() < cells[-1][1]:
            continue                                # (a cell inside a cell: not a page's cell)
        depth = 0
        for tag in _DIV_TAG.finditer(page_html, m.start()):
            depth += 1 if tag.group(0) == "<div" else -1
            if depth == 0:
                break
        else:
            raise ValueError("a cell's div is not closed")
        cells.append((m.start(), tag.end(),
                      page_html.startswith('<div class="jp-Cell jp-CodeCell', m.start())))
    return cells


def _code_cell_chunks(page_html: str) -> list:
    """The HTML of each code cell of a page (its input and its outputs), in order, each up to
    the next cell (the last to the page's end)."""
    cells = _cells(page_html)
    ends = [c[0] for c in cells[1:]] + [len(page_html)]
    return [page_html[a:b] for (a, _, is_code), b in zip(cells, ends) if is_code]


def _text(fragment: str) -> str:
    """An HTML fragment's text: tags removed, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def page_code_cells(page_html: str) -> list:
    """The source of every code cell an HTML page shows, read back from nbconvert's
    highlighted input (tags removed, entities decoded), in order."""
    cells = []
    for chunk in _code_cell_chunks(page_html):
        m = _CODE_INPUT.search(chunk)
        cells.append("" if m is None else _text(m.group(1)))
    return cells


_OUTPUT_WRAPPER = '<div class="jp-Cell-outputWrapper">'


def page_output_text(page_html: str) -> str:
    """The text of everything a page's code cells printed or displayed (tags removed, entities
    decoded), in order: what a reader of the page sees below the code."""
    chunks = _code_cell_chunks(page_html)
    return "\n".join(_text(c[c.index(_OUTPUT_WRAPPER):]) for c in chunks if _OUTPUT_WRAPPER in c)


# A number the prose quotes from the page's live outputs carries a marker straight after it,
# invisible in the rendered notebook, that names the output line it reads: words printed on that
# line beside the number, "the copy ran at 2.38<!--page: torch copy_--> TB/s".
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")   # 2.38, -1.1, 32,768
PAGE_QUOTE = re.compile(f"({_NUMBER.pattern})<!--\\s*page\\b:?([^>]*?)\\s*-->")
# words with which prose points a reader at the page's outputs; a paragraph that uses them
# must mark the numbers it quotes
PAGE_POINTERS = ("this notebook's page", "the published page", "rendered the page",
                 "rendered this notebook's page", "executed page's")


def _one_spaced(text: str) -> str:
    return " ".join(text.split())


def quotes_missing_from_outputs(markdown: str, output_text: str) -> list:
    """The quotes of the page (PAGE_QUOTE) that no output line shows: each as "number (label)",
    missing unless one line of the outputs holds the label's words (spacing aside) and the
    number, to the precision the prose gives (2.38 matches a printed 2.38 or 2.381, not 2.39).
    A marker without a label is always missing: it must say which line it reads."""
    lines = [_one_spaced(line) for line in output_text.splitlines()]
    missing = []
    for quote, label in PAGE_QUOTE.findall(markdown):
        q, label = quote.replace(",", ""), _one_spaced(label)
        decimals = len(q.split(".")[1]) if "." in q else 0
        if not label or not any(
                label in line and any(f"{float(n.replace(',', '')):.{decimals}f}" == q
                                      for n in _NUMBER.findall(line))
                for line in lines):
            missing.append(f"{quote} ({label or 'no label'})")
    return missing


def stray_page_markers(markdown: str) -> list:
    """Page markers not straight after a number (so PAGE_QUOTE would not read them), with the
    text before each."""
    quoted = {m.end() for m in PAGE_QUOTE.finditer(markdown)}
    return [markdown[max(0, m.start() - 40):m.end()]
            for m in re.finditer(r"<!--\s*page\b[^>]*-->", markdown) if m.end() not in quoted]


def unmarked_page_paragraphs(markdown: str) -> list:
    """Paragraphs that point at the page's outputs (PAGE_POINTERS) but mark no number quoted
    from them."""
    paragraphs = re.split(r"\n\s*\n", markdown)
    return [p for p in paragraphs
            if any(w in p for w in PAGE_POINTERS) and not PAGE_QUOTE.search(p)]


def page_fingerprint(page_html: str):
    """The fingerprint a page was rendered with ({"notebook", "code_cells"}), or None for a page
    rendered before pages carried one."""
    m = _FINGERPRINT.search(page_html)
    return None if m is None else json.loads(m.group(1))


def fingerprint_tag(notebook: str, sources: list) -> str:
    data = {"notebook": notebook, "code_cells": [cell_hash(s) for s in sources]}
    return ('<script type="application/json" id="ropelib-code-cells">'
            + json.dumps(data) + "</script>")


def page_state(page: Path, notebooks: Path = NOTEBOOKS) -> str:
    """'current' when the page shows the code cells of notebooks/<page>.ipynb as it is now,
    'stale' when they differ, 'no notebook' when there is no such notebook."""
    nb = notebooks / f"{page.stem}.ipynb"
    if not nb.is_file():
        return "no notebook"
    want = [cell_hash(s) for s in notebook_code_cells(nb)]
    body = page.read_text(encoding="utf-8")
    if [cell_hash(s) for s in page_code_cells(body)] != want:
        return "stale"
    return "older data" if changed_data(body) else "current"


def _index_rows(readme: Path) -> dict:
    """notebook -> its row of an index written before (kept for pages not re-rendered now)."""
    rows = {}
    if not readme.is_file():
        return rows
    text = readme.read_text(encoding="utf-8")
    # an index of the first form named torch and Triton once, in its opening sentence
    versions = re.search(r"with torch (\S+), Triton (\S+) and Python", text)
    for line in text.splitlines():
        m = re.match(r"^\| \[(\d\d-[a-z0-9-]+)\]\(\1\.html\) \|(.*)\|$", line)
        if m:
            cells = [c.strip() for c in m.group(2).split("|")]
            if len(cells) == 5 and versions:   # GPU, TE, date, run time, result
                cells[1:1] = list(versions.groups())
            rows[m.group(1)] = cells
    return rows


INDEX_COLUMNS = ("notebook", "GPU", "torch", "Triton", "Transformer Engine", "date (UTC)",
                 "run time", "result", "same code as the notebook")


def write_index(to: Path, runs: dict, notebooks: Path = NOTEBOOKS) -> dict:
    """README.md of the pages' folder: one row per page (what `runs` says for the pages
    rendered now, the previous index's row for the others), each compared with the notebook in
    the checkout; then the stale pages and the notebooks without a page. Returns
    {page: state}."""
    readme = to / "README.md"
    old = _index_rows(readme)
    states, lines = {}, []
    for page in sorted(to.glob("[0-9][0-9]-*.html")):
        stem = page.stem
        states[stem] = page_state(page, notebooks)
        if stem in runs:
            r = runs[stem]
            cells = [r.get("gpu", "?"), r.get("torch", "?"), r.get("triton", "?"),
                     r.get("transformer_engine", "?"), r.get("date", "?"),
                     f"{r.get('seconds', '?')} s", r.get("status", "?")]
        else:
            cells = (old.get(stem, []) + ["?"] * 7)[:7]
        same = {"current": "yes", "stale": "no: an older version",
                "older data": "yes, but data it read have changed since",
                "no notebook": "no such notebook"}[states[stem]]
        lines.append(f"| [{stem}]({stem}.html) | " + " | ".join(cells + [same]) + " |")
    stale = [s for s, st in states.items() if st != "current"]
    missing = [p.stem for p in sorted(notebooks.glob("[0-9][0-9]-*.ipynb")) if p.stem not in states]
    text = ("# The notebooks, executed on a GPU\n\n"
            "Each page is a notebook run top to bottom on a GPU; the table says which GPU and "
            "versions, whether Transformer Engine was installed, when, how long the run took, "
            "and whether the page still shows the notebook's code as it is in `notebooks/`. "
            "Open a page in a browser to read the GPU's outputs next to your own run; the "
            "widgets are static here (they need a live kernel).\n\n"
            "| " + " | ".join(INDEX_COLUMNS) + " |\n|" + "---|" * len(INDEX_COLUMNS) + "\n"
            + "\n".join(lines) + "\n")
    if stale or missing:
        text += "\n## Pages to re-render\n\n"
        if stale:
            text += ("These pages show an older version of their notebook (its code cells have "
                     "changed since) or outputs of committed data that have changed since: "
                     + ", ".join(f"`{s}`" for s in stale) + ".\n\n")
        if missing:
            text += "These notebooks have no page yet: " + ", ".join(f"`{s}`" for s in missing) + ".\n\n"
        text += ("Re-render them on a GPU (the first command executes, the second writes the "
                 "pages and this index):\n\n"
                 "    python benchmarks/run_notebooks.py --out /tmp/executed --only NN-slug\n"
                 "    python benchmarks/run_notebooks.py --html /tmp/executed\n\n"
                 "`tests/test_executed_pages.py` lists the same pages and fails when one of them is "
                 "re-rendered and not taken off its list, or when another page falls behind.\n")
    readme.write_text(text, encoding="utf-8")
    return states


def code_tokens(source: str):
    """A code cell's Python tokens without comments and line structure (two cells with the same
    tokens run the same code), or None where the cell is not plain Python (a magic, a shell
    line): such cells must match character for character."""
    import io
    import tokenize
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    try:
        return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def same_code(a: str, b: str) -> bool:
    """Do two code cells run the same code (they differ at most in comments and blank lines)?"""
    ta, tb = code_tokens(a), code_tokens(b)
    return a == b if ta is None or tb is None else ta == tb


def refresh_prose(executed: Path, into: Path, notebooks: Path = NOTEBOOKS) -> int:
    """Each executed notebook in `executed` rewritten as its notebook in the checkout is now,
    with the executed outputs: the k-th code cell of the checkout's notebook takes the outputs
    and execution count of the executed copy's k-th code cell, which must be the same code
    (`same_code`); markdown comes from the checkout. Written to `into` with the run's metadata
    (GPU, times, the data it read) and its list of files read. Returns 1 where a notebook's code
    changed beyond comments (it needs a new run), else 0."""
    into.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in sorted(executed.glob("[0-9][0-9]-*.ipynb")):
        ran = json.loads(path.read_text(encoding="utf-8"))
        now = json.loads((notebooks / path.name).read_text(encoding="utf-8"))
        ran_code = [c for c in ran["cells"] if c["cell_type"] == "code"]
        now_code = [c for c in now["cells"] if c["cell_type"] == "code"]
        if len(ran_code) != len(now_code):
            print(f"{path.stem}: {len(now_code)} code cells now, {len(ran_code)} when it ran: "
                  "execute it again", file=sys.stderr)
            failed = 1
            continue
        differ = [k for k, (a, b) in enumerate(zip(ran_code, now_code))
                  if not same_code(cell_source(a), cell_source(b))]
        if differ:
            print(f"{path.stem}: code cells {differ} changed beyond comments since it ran: "
                  "execute it again", file=sys.stderr)
            failed = 1
            continue
        for a, b in zip(ran_code, now_code):
            b["outputs"], b["execution_count"] = a.get("outputs", []), a.get("execution_count")
        now["metadata"] = dict(ran.get("metadata", {}), **{
            k: v for k, v in now.get("metadata", {}).items() if k not in ran.get("metadata", {})})
        (into / path.name).write_text(json.dumps(now, indent=1, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
        reads = path.with_suffix(".reads")
        if reads.is_file():
            (into / reads.name).write_text(reads.read_text(encoding="utf-8"), encoding="utf-8")
        print(f"{path.stem}: prose of the checkout, outputs of the run")
    times = executed / "times.csv"
    if times.is_file():
        (into / "times.csv").write_text(times.read_text(encoding="utf-8"), encoding="utf-8")
    return failed


def _page_body(exporter, nb, to: Path) -> str:
    """The notebook node as an HTML page written to `to` (nbconvert's exporter)."""
    # markdown links to ../figures/ are relative to notebooks/: point them at figures/ from the
    # page (or embed the figures where the page is written outside the checkout)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = figure_links(cell.source, to)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(NOTEBOOKS)}})
    return body


def _markdown_runs(page_html: str) -> tuple:
    """A page cut at its code cells: (the markdown cells before each code cell and after the
    last, joined; the code cells' HTML), as lists. Each cell keeps the text up to the next
    cell, so the page's own spacing comes back when they are joined."""
    cells = _cells(page_html)
    ends = [c[0] for c in cells[1:]] + [cells[-1][1]]
    runs, code, run = [], [], []
    for (a, _, is_code), b in zip(cells, ends):
        if is_code:
            runs.append("".join(run))
            code.append(page_html[a:b])
            run = []
        else:
            run.append(page_html[a:b])
    runs.append("".join(run))
    return runs, code


def page_with_prose(page_html: str, notebook: Path, to: Path) -> str:
    """The page with the prose of `notebook` as it is now: every markdown cell taken from the
    notebook, rendered as --html renders it, and every code cell with its outputs kept as the
    run left it. The page must show the notebook's code cells as they are now (page_state
    'current' or 'older data'); markdown cells may have been added, removed or split. For prose
    edited after a run whose executed copies are not at hand (--refresh-prose needs them)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    if [cell_hash(s) for s in page_code_cells(page_html)] != [cell_hash(s) for s in sources]:
        raise ValueError(f"{notebook.name}: the page shows other code cells than the notebook; "
                         "execute it again")
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    fresh = _page_body(HTMLExporter(embed_images=True), nb, to)
    new_runs, _ = _markdown_runs(fresh)
    old_runs, old_code = _markdown_runs(page_html)
    cells = _cells(page_html)
    head, tail = page_html[:cells[0][0]], page_html[cells[-1][1]:]
    body = [new_runs[0]]
    for k, chunk in enumerate(old_code):
        body += [chunk, new_runs[k + 1]]
    return head + "".join(body) + tail


def refresh_pages(to: Path, notebooks: Path = NOTEBOOKS) -> int:
    """Every page in `to` that shows its notebook's code cells as they are now rewritten with
    the notebook's prose (page_with_prose); stale pages are left for a new run."""
    for page in sorted(to.glob("[0-9][0-9]-*.html")):
        state = page_state(page, notebooks)
        if state not in ("current", "older data"):
            print(f"{page.name}: {state}, left as it is")
            continue
        old = page.read_text(encoding="utf-8")
        new = page_with_prose(old, notebooks / f"{page.stem}.ipynb", to)
        if new != old:
            page.write_text(new, encoding="utf-8")
            broken = broken_images(page)
            if broken:
                page.write_text(old, encoding="utf-8")
                print(f"{page}: images that would not show in a clone: {broken}",
                      file=sys.stderr)
                return 1
            print("prose refreshed:", page)
    return 0


def to_html(executed: Path, to: Path) -> int:
    import nbformat
    from nbconvert import HTMLExporter

    to.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(embed_images=True)
    runs = {}
    for path in sorted(executed.glob("[0-9][0-9]-*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        run = nb.metadata.get("ropelib_executed", {})
        sources = [c.source for c in nb.cells if c.cell_type == "code"]
        body = _page_body(exporter, nb, to)
        data = ('<script type="application/json" id="ropelib-data">'
                + json.dumps(nb.metadata.get("ropelib_data", {}), sort_keys=True) + "</script>")
        body = body.replace("</head>", fingerprint_tag(path.stem, sources) + "\n" + data
                            + "\n</head>", 1)
        page = to / f"{path.stem}.html"
        page.write_text(body, encoding="utf-8")
        if [cell_hash(s) for s in page_code_cells(body)] != page_fingerprint(body)["code_cells"]:
            print(f"{page}: the page's code cells do not read back as the notebook's",
                  file=sys.stderr)
            return 1
        broken = broken_images(page)
        if broken:
            print(f"{page}: images that would not show in a clone: {broken}", file=sys.stderr)
            return 1
        runs[path.stem] = run
        print("wrote", page)
    states = write_index(to, runs)
    for stem, state in states.items():
        if state == "stale":
            print(f"{stem}.html: stale (its notebook in the checkout has other code cells)")
        elif state != "current":
            print(f"{stem}.html: {state}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="execute every notebook; write the executed copies here")
    ap.add_argument("--only", default=None, help="only notebooks whose name contains this (several: comma-separated)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--keep-going", action="store_true",
                    help="with --out: run every cell even after one fails (each failing cell is "
                         "named in times.csv; the notebook still counts as failed)")
    ap.add_argument("--html", type=Path, help="folder of executed notebooks to convert to HTML")
    ap.add_argument("--to", type=Path, default=ROOT / "docs" / "executed",
                    help="where the HTML pages go (with --html)")
    ap.add_argument("--index", action="store_true",
                    help="only rewrite the index of the pages in --to, comparing each with its "
                         "notebook (no rendering)")
    ap.add_argument("--refresh-prose", type=Path, metavar="DIR",
                    help="executed notebooks whose code is unchanged but for comments: write them "
                         "with the checkout's prose to --into (then --html that folder)")
    ap.add_argument("--into", type=Path, help="where --refresh-prose writes")
    ap.add_argument("--refresh-pages", action="store_true",
                    help="rewrite the prose of every page in --to whose notebook's code cells "
                         "are unchanged, from the checkout's notebooks (no executed copies needed)")
    args = ap.parse_args(argv)
    if args.refresh_pages:
        return refresh_pages(args.to)
    if args.refresh_prose:
        if not args.into:
            ap.error("--refresh-prose needs --into NEWDIR")
        return refresh_prose(args.refresh_prose, args.into)
    if args.out:
        return execute(args.out, args.only, args.timeout, args.keep_going)
    if args.html:
        return to_html(args.html, args.to)
    if args.index:
        write_index(args.to, {})
        return 0
    ap.error("say --out DIR (execute), --html DIR (convert) or --index")
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    sys.exit(main())
