"""Notebook 09's measurements that read what the data holds: one CUDA-graph training step
(`ropelib.course.cuda_graph_step.graphed_step`) for the notebook and `graph_pair_probe.py`, the
loss-curve CSV recording the characters the run trained on, the host time a layer printed as
not resolved where its rounds' middle half spans zero, the split copies read from this run, and
A.5's floor a plain copy of q's bytes (in `nb09_copy_fraction`, the loop A.5 calls)."""
import ast
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

from ropelib.course import cuda_graph_step, nb09_copy_fraction  # noqa: E402
from ropelib.course.model import GPTConfig, build, read_history_csv, write_history_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"
PROBE = ROOT / "benchmarks" / "graph_pair_probe.py"


def _defined_functions(path):
    return {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef)}


def _section(text, start, end):
    return text.split(start, 1)[1].split(end, 1)[0]


def test_one_graphed_step_for_the_notebook_and_the_probe():
    nb, probe = NOTEBOOK.read_text(encoding="utf-8"), PROBE.read_text(encoding="utf-8")
    assert "graphed_step" not in _defined_functions(NOTEBOOK)
    assert "graphed_step" not in _defined_functions(PROBE)
    for text in (nb, probe):
        assert "from ropelib.course.cuda_graph_step import graphed_step" in text
    # the capture lives in the shared module only: the probe's freed arm keeps the graph's own
    # replay out of the shared function's result
    assert "torch.cuda.graph(" not in probe and "CUDAGraph(" not in probe
    assert "holds[0].replay" in probe
    source = Path(cuda_graph_step.__file__).read_text(encoding="utf-8")
    assert "torch.cuda.graph(graph)" in source and "replay.holds = (graph, opt)" in source


def test_graphed_step_refuses_a_model_off_the_gpu():
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model = build(cfg, "reference", seed=0, device="cpu")
    x = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="CUDA device"):
        cuda_graph_step.graphed_step(model, x, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures a CUDA graph")
def test_two_graphs_replay_after_each_other_and_train():
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 32, (4, 16), generator=gen).cuda() for _ in range(2))
    models = {rope: build(cfg, rope, seed=0, device="cuda") for rope in ("ropelib", "reference")}
    replays = {rope: cuda_graph_step.graphed_step(m, x, y) for rope, m in models.items()}
    for rope, replay in replays.items():
        graph, opt = replay.holds
        assert isinstance(graph, torch.cuda.CUDAGraph) and isinstance(opt, torch.optim.AdamW)
    before = {rope: [p.detach().clone() for p in m.parameters()] for rope, m in models.items()}
    for _ in range(3):                         # the first graph replays after the second capture
        for replay in replays.values():
            replay()
    torch.cuda.synchronize()
    for rope, m in models.items():
        assert any(not torch.equal(a, b) for a, b in zip(before[rope], m.parameters())), rope
        assert all(torch.isfinite(p).all() for p in m.parameters()), rope


def test_the_loss_curves_record_the_training_characters(tmp_path):
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert '"train_chars": len(data.train_data)' in text          # the writer's meta
    history = {"step": [1, 2], "train_loss": [2.0, 1.5], "eval_step": [2], "val_loss": [1.7]}
    path = write_history_csv({"reference": history}, tmp_path / "curves.csv",
                             {"batch": 4, "train_chars": 418543})
    meta, saved = read_history_csv(path)
    assert meta["train_chars"] == "418543" and saved["reference"]["val_loss"] == [1.7]


def test_the_host_time_a_layer_has_no_ratio_where_its_rounds_span_zero():
    cell = _section(NOTEBOOK.read_text(encoding="utf-8"), "class NoRotary", "# %%")
    assert "spans_zero = lambda lo, hi: lo <= 0 <= hi" in cell
    assert "host_layer[rope] = None if spans_zero(lo, hi) else med" in cell
    assert "not resolved by this" in cell and "no host / device ratio" in cell
    # the ratio is printed only in the branch where the host time is resolved
    ratio_at = cell.index("host_layer[rope] / device_layer[rope]")
    assert cell.rfind("if host_layer[rope] is None else", 0, ratio_at) > 0


def test_the_split_copies_are_this_runs_and_the_floor_is_a_plain_copy():
    text = NOTEBOOK.read_text(encoding="utf-8")
    # section 5's profile, checked on a GPU in appendix A.2: the split copies timed by this run
    # and written to its CSV
    a2 = _section(text, "### A.2 Section 5", "### A.3")
    assert "within 10 % of the split copies" not in a2
    assert "0.95 < split_x" not in a2
    assert "explains none of ropelib's excess" in a2 and "split_copies_ms=floor_n_ms" in a2
    a5 = _section(text, "### A.5 Section 9", "**Which change moves a kernel")
    assert "frac9 = time_against_copy(" in a5       # A.5's timing: nb09_copy_fraction's loop
    timing = Path(nb09_copy_fraction.__file__).read_text(encoding="utf-8")
    # the floor: a plain copy of q's bytes, contiguous to contiguous, timed by do_bench and by
    # the profiler's device time; each kernel's fraction by both
    assert "plain_copy = lambda: y_t.copy_(packed)" in timing
    assert "packed = q_t.contiguous()" in timing
    assert "time_ms(plain_copy, device), device_ms(plain_copy, device)" in timing
    assert "frac[name, r] = (t_copy / t, d_copy / d)" in timing
    assert "return compare.time_ms(fn, device)[0]" in timing
    assert "device_ms=device_ms_or_none" in timing
