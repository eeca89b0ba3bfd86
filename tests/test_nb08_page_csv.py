"""Notebook 08 reads one H200 count from a CSV copied from its executed page: the CSV must say
what the page printed."""
import html
import re
from pathlib import Path

from ropelib.bench import compare

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks/results/te-bits-combine-contraction-nvidia-h200-from-page.csv"
PAGE = ROOT / "docs/executed/08-debugging-allclose.html"


def _page_text():
    return html.unescape(re.sub(r"<[^>]+>", "", PAGE.read_text()))


def test_csv_names_its_source_and_gpu():
    meta = compare.read_meta(CSV)
    assert meta["gpu"] == "NVIDIA H200"
    assert "docs/executed/08-debugging-allclose.html" in meta["source"]


def test_csv_matches_the_executed_page():
    rows = {r["quantity"]: r["value"] for r in compare.read_csv(CSV)}
    text = _page_text()
    assert "TE side: TE fused" in text and "GPU (NVIDIA H200)" in text
    count = re.search(r"this notebook's kernel, compiled here with contraction on: (\d+) elements",
                      text)
    halves = re.search(r"contraction on: y1 and y2 with step c's \(TE's order's\) bits: "
                       r"(True|False), (True|False)", text)
    assert count and halves, "the page no longer prints the counts the CSV copies"
    assert int(count.group(1)) == rows["n_differ_from_te"]
    assert (halves.group(1) == "True", halves.group(2) == "True") == (
        rows["y1_has_step_c_bits"], rows["y2_has_step_c_bits"])
    assert f"{rows['numel']:,}" in text
