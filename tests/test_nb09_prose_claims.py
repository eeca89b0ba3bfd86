"""Notebook 09: claims its prose makes about committed data that no cell of the notebook asserts.

* A.5, "Programs": notebook 03's start cost of a program, about 80 ns on each of the H200's 132
  SMs, is "as much for a program that copies its row as for one that does nothing, at 1 to 8
  warps" (`program_cost`, read through `ropelib.course.measured` as the notebook reads it).
* A.3, "Why half the rate": the Nsight Compute stand-in (notebook 06's `g_sum.contiguous()`)
  "shares the template of their multiplies and negations, `elementwise_kernel<128, 2, ...>` on
  fp32 ... but not their operation (a copy)"; the chain's 48 multiplies and 24 negations in the
  committed step (figures/09-step-kernels.csv) are that template's.
* Section 3: "over the first 60 steps ropelib's training loss is the further from the
  reference's" and, over the run's evaluations, the kernel's and the control's distances are "of
  one size" (within a factor of 2 of each other, both below the seed distance).
"""
import csv
from collections import Counter
from pathlib import Path
from statistics import median

from ropelib.course import measured
from ropelib.course.exercises import in_a_model
from ropelib.course.model import read_history_csv

ROOT = Path(__file__).resolve().parents[1]
NCU_CSV = ROOT / "benchmarks" / "results" / "contiguous_ncu-nvidia-h200.csv"
STEPS_CSV = ROOT / "figures" / "09-step-kernels.csv"
CURVES_CSV = ROOT / "figures" / "09-loss-curves.csv"
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"


def test_a_program_costs_as_much_copying_its_row_as_doing_nothing():
    meta, rows = measured.load("program_cost")
    assert meta["gpu"] == "NVIDIA H200"
    per = {(r["kernel"], r["num_warps"]): r["ns_per_program_per_sm"] for r in rows
           if r["kernel"] in ("empty", "one row")}
    assert sorted({w for _, w in per}) == [1, 2, 4, 8]                  # "at 1 to 8 warps"
    for w in (1, 2, 4, 8):
        assert abs(per["one row", w] / per["empty", w] - 1) < 0.01, (w, per)
        assert round(per["empty", w]) == 80                             # "about 80 ns"
    assert {r["sms"] for r in rows} == {132}


def _ncu_generic_name():
    with open(NCU_CSV, encoding="utf-8") as f:
        names = {r["Kernel Name"] for r in csv.DictReader(l for l in f if not l.startswith("#"))}
    (generic,) = [n for n in names if n.startswith("void elementwise_kernel<")]
    return generic


def test_the_ncu_stand_in_shares_the_template_of_the_chains_multiplies_and_negations():
    generic = _ncu_generic_name()
    assert generic.startswith("void elementwise_kernel<128, 2, ")
    assert "direct_copy_kernel" in generic                               # "not their operation"
    _, steps = in_a_model.step_kernels(STEPS_CSV)
    extra = (Counter(n for n, _ in steps["reference"]) - Counter(n for n, _ in steps["ropelib"]))
    mul = sum(k for n, k in extra.items() if "MulFunctor<float>" in n)
    neg = sum(k for n, k in extra.items() if "neg_kernel" in n)
    templ = sum(k for n, k in extra.items() if ("MulFunctor<float>" in n or "neg_kernel" in n)
                and "elementwise_kernel<128, 2, " in n and "direct_copy" not in n)
    assert (mul, neg, templ) == (48, 24, 72)


def test_the_committed_curves_kernel_and_control_distances():
    _, runs = read_history_csv(CURVES_CSV)
    ref = runs["reference"]

    def d_val(k):
        a, b = runs[k]["val_loss"], ref["val_loss"]
        return sum(abs(x - y) for x, y in zip(a, b)) / len(a)

    d_kernel, d_control, d_seed = d_val("ropelib"), d_val("reference again"), \
        d_val("reference seed 1")
    assert d_control < d_kernel < 2 * d_control < d_seed                # "of one size"
    part = {k: [abs(a - b) for a, b in zip(runs[k]["train_loss"], ref["train_loss"])]
            for k in ("ropelib", "reference again")}
    for first in (1, 21, 41):                          # steps 1-60, in windows of 20
        lib, ctl = (median(part[k][first - 1:first + 19]) for k in part)
        assert lib > ctl, (first, lib, ctl)            # "ropelib's ... the further"


def test_the_notebook_says_what_these_tests_check():
    text = " ".join(NOTEBOOK.read_text(encoding="utf-8").replace("#", " ").split())
    for words in ("as much for a program that copies its row as for one that does nothing, at 1 "
                  "to 8 warps",
                  "shares the template of their multiplies and negations",
                  "over the first 60 steps ropelib's training loss is the further"):
        assert words in text, words
