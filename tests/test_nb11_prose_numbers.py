"""Notebook 11's prose numbers that its cells read or print but do not assert, read here from the
committed files (or recomputed from the inputs) they come from; and its quotes of the executed
page marked, so that the page test checks them on their output lines."""
import statistics
from pathlib import Path

import torch
from loading import load_file  # noqa: E402

from ropelib.bench import compare

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NOTEBOOK = ROOT / "notebooks" / "11-rope-at-scale.ipynb"
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")


def _markdown():
    return run_notebooks.notebook_markdown(NOTEBOOK)


def _contiguous_work(S, c):
    """(query, key) pairs of each rank of a contiguous split under a causal mask."""
    return [sum(p + 1 for p in range(r * S // c, (r + 1) * S // c)) for r in range(c)]


def test_the_contiguous_splits_ratio():
    # section 1: "W_{c-1}/W_0 = ((2c-1)S + c)/(S + c) ... about 2c-1 once S >> c (2.78 at S=16,
    # c=2, the figure's case)"
    for S, c in ((16, 2), (24, 3), (64, 4), (256, 8)):
        w = _contiguous_work(S, c)
        assert w[-1] * (S + c) == w[0] * ((2 * c - 1) * S + c), (S, c, w)
    w = _contiguous_work(16, 2)
    assert round(w[1] / w[0], 2) == 2.78
    S, c = 2 ** 16, 8
    w = _contiguous_work(S, c)
    assert abs(w[-1] / w[0] - (2 * c - 1)) < 1e-2


def test_the_profiles_against_the_fit():
    # appendix A.1: "The profiles agree with the fit's split to about 100 ms, rank 0's more
    # closely than one GPU's"
    runs = {(1, "short"): "cp200-1gpu-seed0", (2, "short"): "cp200-2gpu-seed0",
            (1, "long"): "cp-1gpu", (2, "long"): "cp-2gpu"}
    meta = {key: compare.read_meta(RESULTS / f"{name}-nvidia-h200.csv")
            for key, name in runs.items()}
    ms = {key: float(m["ms_per_step"]) for key, m in meta.items()}
    S1, S2 = (int(meta[1, length]["seq_len"]) for length in ("short", "long"))
    assert (S1, S2) == (16384, 131072)
    square = {}
    for n in (1, 2):
        a = (ms[n, "long"] / S2 - ms[n, "short"] / S1) / (S2 - S1)
        square[n] = a * S2 ** 2
    profile = RESULTS / "cp_attention_profile-nvidia-h200-20261204-from-page.csv"
    layers = int(compare.read_meta(profile)["layers"])
    rows = {r["case"]: r for r in compare.read_csv(profile)}
    attention = {1: rows["cudnn"]["attention_ms"] * layers,
                 2: rows["rank0"]["attention_ms"] * layers}
    off = {n: abs(attention[n] - square[n]) for n in (1, 2)}
    assert off[2] < off[1], off
    assert round(max(off.values()), -2) == 100, off


def test_two_hundred_steps_mean_gaps():
    # appendix A.2's answer: "0.030 from its twin against 0.258 between the seeds, a mean over
    # the 200 steps"
    loss = {name: [float(r["loss"]) for r in compare.read_csv(
        RESULTS / f"cp200-{name}-nvidia-h200.csv")]
        for name in ("1gpu-seed0", "1gpu-seed1", "2gpu-seed0")}
    twin = [abs(a - b) for a, b in zip(loss["2gpu-seed0"], loss["1gpu-seed0"], strict=True)]
    seeds = [abs(a - b) for a, b in zip(loss["1gpu-seed1"], loss["1gpu-seed0"], strict=True)]
    assert len(twin) == 200
    assert f"{statistics.mean(twin):.3f}" == "0.030"
    assert f"{statistics.mean(seeds):.3f}" == "0.258"


def test_the_fp8_floor_is_a_few_percent():
    # "Around amax / 448 the error sits on a floor of a few percent": the notebook's sweep keys
    from ropelib import kv_cache
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(64, 8, 64, generator=g) * torch.logspace(-1, 1, 64)
    s = torch.tensor([keys.abs().max().item() / 448])
    err = ((kv_cache.quantize_fp8(keys, s).float() * s - keys).norm() / keys.norm()).item()
    assert 0.01 < err < 0.05, err


def test_paragraphs_quoting_the_executed_page_mark_their_numbers():
    # the H100 page's live lines the prose reads: the table kernel against the gap, the second
    # launch's share of the gain, the empty kernels' share of the lead, the attention rates
    md = _markdown()
    quoted = [q for q, _ in run_notebooks.PAGE_QUOTE.findall(md)]
    for n in ("1.2", "1.7", "85", "55", "57", "58", "13.5", "447", "312", "289"):
        assert n in quoted, n
    assert run_notebooks.unmarked_page_paragraphs(md) == []
