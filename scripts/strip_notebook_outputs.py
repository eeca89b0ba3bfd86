"""Strip a notebook to the form it is committed in: no outputs, no execution counts, no state of
the session that ran it. Standard library only, so git can run it from any Python.

It is the "clean" side of the git filter that `.gitattributes` names for `notebooks/*.ipynb`
(`.gitconfig` defines it; `git config include.path ../.gitconfig` turns it on in a clone). With it
on, git reads every notebook through this script: a notebook you ran and saved in JupyterLab keeps
its outputs on your disk, `git status` stays clean unless you changed a cell, and outputs cannot be
committed by accident.

    python3 scripts/strip_notebook_outputs.py < run.ipynb > clean.ipynb   # as git runs it
    python3 scripts/strip_notebook_outputs.py notebooks/*.ipynb           # rewrite files in place

What goes: code cells' outputs and execution counts; the notebook's `language_info` (the Python
version that ran it) and `widgets` (saved widget state); cell metadata that records a session
(`execution`, `ExecuteTime`, `collapsed`, `scrolled`, `jupyter`, `trusted`). The kernelspec is
set to the project's one (`python3`), whatever kernel the notebook last ran on. What stays:
sources, cell ids, tags and jupytext's own cell metadata. The output is written the way
nbformat/jupytext write notebooks (sorted keys, one-space indent, UTF-8), so a notebook that
was only run and saved comes out byte for byte as committed.
"""
from __future__ import annotations

import json
import sys

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
SESSION_NOTEBOOK_KEYS = ("language_info", "widgets")
SESSION_CELL_KEYS = ("execution", "ExecuteTime", "collapsed", "scrolled", "jupyter", "trusted")


def strip(nb: dict) -> dict:
    """The notebook (nbformat 4 JSON) without outputs or session state; nb itself is changed."""
    meta = nb.setdefault("metadata", {})
    for key in SESSION_NOTEBOOK_KEYS:
        meta.pop(key, None)
    meta["kernelspec"] = dict(KERNELSPEC)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell_meta = cell.get("metadata", {})
        for key in SESSION_CELL_KEYS:
            cell_meta.pop(key, None)
    return nb


def strip_text(text: str) -> str:
    """strip() on the text of a notebook file; returns the text of the stripped file."""
    return json.dumps(strip(json.loads(text)), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if not argv:  # git's clean filter: notebook on stdin, stripped notebook on stdout
        text = sys.stdin.buffer.read().decode("utf-8")
        try:
            out = strip_text(text)
        except (ValueError, AttributeError, TypeError):
            out = text  # not notebook JSON (e.g. a half-resolved merge): let git see it as it is
        sys.stdout.buffer.write(out.encode("utf-8"))
        return 0
    for path in argv:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        out = strip_text(text)
        if out != text:
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.write(out)
            print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
