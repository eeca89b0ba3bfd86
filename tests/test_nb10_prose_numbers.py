"""Notebook 10's prose numbers that its cells read but do not assert, read here from the committed
files they come from; and its quotes of the executed page marked, so that the page test checks
them on their output lines."""
import re
from pathlib import Path

from loading import load_file  # noqa: E402

from ropelib.bench import compare
from ropelib.course import measured

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "10-multi-axis-rope.ipynb"
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
TIMING_CSVS = ("mrope_angles_do_bench-nvidia-h200-20261204-from-page.csv",
               "mrope_angles_do_bench-nvidia-h100-80gb-hbm3-20261205-from-page-10.csv")


def _side_by_side():
    """{GPU: {provider: do_bench median us}}: section 6's timing cell as committed, the rows
    the notebook reads ("side by side")."""
    out = {}
    for name in TIMING_CSVS:
        csv = measured.RESULTS / name
        out[compare.read_meta(csv)["gpu"]] = {
            r["provider"]: r["us"] for r in compare.read_csv(csv) if r["timing"] == "side by side"}
    return out


def _markdown():
    return run_notebooks.notebook_markdown(NOTEBOOK)


def test_what_the_timings_say_against_the_committed_runs():
    # "ropelib's takes 0.93 and 0.95 of the worked solution's time ... 1.08 and 1.01 times the
    # copy's time on the H200, 1.06 and 1.01 on the H100 ... the per-head kernel at 1.51 times
    # its time on the H200 and 1.24 on the H100"
    us = _side_by_side()
    assert list(us) == [H200, H100]
    once, lib, head, copy = ("angles once per token", "ropelib.apply_mrope_qk",
                             "angles per (token head)", "copy of q and k")
    assert [round(us[g][lib] / us[g][once], 2) for g in us] == [0.93, 0.95]
    assert [round(us[g][once] / us[g][copy], 2) for g in us] == [1.08, 1.06]
    assert [round(us[g][lib] / us[g][copy], 2) for g in us] == [1.01, 1.01]
    assert [round(us[g][head] / us[g][copy], 2) for g in us] == [1.51, 1.24]
    # "cost 40 % more time on one GPU and 17 % on the other"
    assert [round(100 * (us[g][head] / us[g][once] - 1)) for g in us] == [40, 17]


def test_the_summary_h200_to_h100_stretches():
    # the Summary's "the once-per-token kernel slows with the copy (1.33 and 1.35 times), the
    # per-head kernel less (1.11 times)"
    us = _side_by_side()
    stretch = {who: us[H100][who] / us[H200][who] for who in us[H200]}
    assert round(stretch["angles once per token"], 2) == 1.33
    assert round(stretch["copy of q and k"], 2) == 1.35
    assert round(stretch["angles per (token head)"], 2) == 1.11


def test_paragraphs_quoting_the_executed_page_mark_their_numbers():
    # a paragraph that reads the executed page's run ("the executed page's H100 run: 1.17")
    # marks each number it takes from it, so test_executed_pages checks it on its output line
    # ("executed page's" is one of run_notebooks.PAGE_POINTERS)
    md = _markdown()
    assert "executed page's" in run_notebooks.PAGE_POINTERS
    pointing = [p for p in re.split(r"\n\s*\n", md) if "executed page's" in p]
    assert len(pointing) >= 4
    assert run_notebooks.unmarked_page_paragraphs(md) == []
    quoted = [q for q, _ in run_notebooks.PAGE_QUOTE.findall(md)]
    for n in ("1.17", "0.85", "17.4", "14.8", "157.4", "97.9", "99.3", "3.58"):
        assert n in quoted, n

