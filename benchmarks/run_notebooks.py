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
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime
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


def execute(out: Path, only: str | None, timeout_s: int) -> int:
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
        if only and only not in path.stem:
            continue
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        t0 = time.time()
        status = "ok"
        try:
            client.execute()
        except CellExecutionError as e:
            status = "error: " + str(e).strip().splitlines()[-1][:200]
            failed += 1
        except Exception as e:  # noqa: BLE001 -- a dead kernel or a timeout: say so, go on
            status = f"error: {type(e).__name__}: {str(e)[:200]}"
            failed += 1
        seconds = time.time() - t0
        nb.metadata["ropelib_executed"] = dict(env_note, seconds=round(seconds, 1), status=status)
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


def to_html(executed: Path, to: Path) -> int:
    import nbformat
    from nbconvert import HTMLExporter

    to.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(embed_images=True)
    index = []
    for path in sorted(executed.glob("[0-9][0-9]-*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        run = nb.metadata.get("ropelib_executed", {})
        # markdown links to ../figures/ are relative to notebooks/: point them at figures/ from
        # the page (or embed the figures where the page is written outside the checkout)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = figure_links(cell.source, to)
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(NOTEBOOKS)}})
        page = to / f"{path.stem}.html"
        page.write_text(body, encoding="utf-8")
        broken = broken_images(page)
        if broken:
            print(f"{page}: images that would not show in a clone: {broken}", file=sys.stderr)
            return 1
        index.append(f"| [{path.stem}]({path.stem}.html) | {run.get('gpu', '?')} | "
                     f"{run.get('transformer_engine', '?')} | {run.get('date', '?')} | "
                     f"{run.get('seconds', '?')} s | {run.get('status', '?')} |")
        print("wrote", to / f"{path.stem}.html")
    first = next(iter(sorted(executed.glob("[0-9][0-9]-*.ipynb"))), None)
    run = nbformat.read(first, as_version=4).metadata.get("ropelib_executed", {}) if first else {}
    (to / "README.md").write_text(
        "# The notebooks, executed on a GPU\n\n"
        f"Each notebook run top to bottom on a GPU with torch {run.get('torch', '?')}, Triton "
        f"{run.get('triton', '?')} and Python {run.get('python', '?')}; the table says which GPU, "
        "whether Transformer Engine was installed, when, and how long the run took. Open a page "
        "in a browser to read the GPU's outputs next to your own run; the widgets are static "
        "here (they need a live kernel).\n\n"
        "| notebook | GPU | Transformer Engine | date (UTC) | run time | result |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(index) + "\n",
        encoding="utf-8")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="execute every notebook; write the executed copies here")
    ap.add_argument("--only", default=None, help="only notebooks whose name contains this")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--html", type=Path, help="folder of executed notebooks to convert to HTML")
    ap.add_argument("--to", type=Path, default=ROOT / "docs" / "executed",
                    help="where the HTML pages go (with --html)")
    args = ap.parse_args(argv)
    if args.out:
        return execute(args.out, args.only, args.timeout)
    if args.html:
        return to_html(args.html, args.to)
    ap.error("say --out DIR (execute) or --html DIR (convert)")
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    sys.exit(main())
