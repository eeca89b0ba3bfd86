"""ropelib.course.model: the GPT with a switchable RoPE, its dataset, training loop and profiler.

The central check: the model with ropelib's kernel computes the same loss and the same gradients
as the model with the plain-PyTorch reference (fp32, CPU, Triton interpreter, tiny sizes), and a
model whose RoPE is off by one position does not: the tolerance can fail.
"""
import pytest
import torch

import ropelib
from ropelib.course import model as model_module
from ropelib.course.model import (CharDataset, GPT, GPTConfig, TEStyleAttention, build, ema,
                           estimate_loss, plot_loss_curves, plot_train_loss_differences,
                           pydoc_topics_text, read_history_csv, rope_time_share, sample, train,
                           write_history_csv)
from ropelib.frequencies import rope_freqs


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matrices: on a shared 2-core machine extra threads cost far more than they save
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data():
    return CharDataset.from_pydoc_topics()


def tiny(data, **kw):
    cfg = dict(vocab_size=data.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32)
    cfg.update(kw)
    return GPTConfig(**cfg)


# --- dataset ----------------------------------------------------------------------------------

def test_dataset_pydoc_topics(data):
    text = pydoc_topics_text()
    assert len(text) > 100_000 and "assert" in text          # CPython's help() topics
    assert data.vocab_size == len(set(text))
    assert len(data.train_data) + len(data.val_data) == len(text)
    assert abs(len(data.val_data) / len(text) - 0.1) < 1e-3
    s = "def f(x):\n    return x  # ok"
    assert data.decode(data.encode(s)) == s
    assert data.decode(torch.tensor(data.encode(s))) == s
    # the split is contiguous: train then val, nothing shuffled
    assert data.decode(data.train_data[:200]) == text[:200]
    assert data.decode(data.val_data[-200:]) == text[-200:]


def test_get_batch_targets_are_shifted_inputs(data):
    g = torch.Generator().manual_seed(0)
    x, y = data.get_batch("val", 4, 32, g)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):  # each row is a window of the val text
        window = data.decode(row_x) + data.decode(row_y[-1:])
        assert window in data.decode(data.val_data)
    x2, _ = data.get_batch("val", 4, 32, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)                                   # seeded


def test_dataset_bad_input(data):
    with pytest.raises(ValueError, match="s contains"):
        data.encode("naïve ☃")
    with pytest.raises(ValueError, match="split"):
        data.get_batch("test", 2, 8)
    with pytest.raises(ValueError, match="block_size"):
        data.get_batch("val", 2, len(data.val_data))
    with pytest.raises(ValueError, match="val_fraction"):
        CharDataset("abcdef", val_fraction=1.0)
    with pytest.raises(TypeError, match="text"):
        CharDataset(b"bytes")


# --- model: ropelib == reference -------------------------------------------------------------

def test_config_and_model_bad_input(data):
    with pytest.raises(ValueError, match="n_embd"):
        tiny(data, n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="head_dim"):
        tiny(data, n_embd=30, n_head=2)                          # head_dim 15 is odd
    with pytest.raises(ValueError, match="rotary_percent"):
        tiny(data, rotary_percent=0.0)
    with pytest.raises(ValueError, match="rope"):
        GPT(tiny(data), rope="liger")
    with pytest.raises(TypeError, match="config"):
        GPT({"vocab_size": 10})
    model = GPT(tiny(data), rope="reference")
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.int64))


def _loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    logits, loss = model(x, y)
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
def test_ropelib_model_matches_reference_model(data, monkeypatch, device, rotary_percent):
    cfg = tiny(data, rotary_percent=rotary_percent)
    ref = build(cfg, "reference", seed=3, device=device)
    # larger q/k weights: attention depends strongly on position, so a wrong RoPE shows
    with torch.no_grad():
        for blk in ref.blocks:
            blk.attn.qkv.weight.mul_(25.0)
    kern = GPT(cfg, rope="ropelib").to(device)
    kern.load_state_dict(ref.state_dict())                      # same weights, other RoPE
    calls = []
    real = ropelib.apply_rope_qk
    monkeypatch.setattr(ropelib, "apply_rope_qk",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    x, y = data.get_batch("train", 3, cfg.block_size, torch.Generator().manual_seed(1), device)

    logits_r, loss_r, grads_r = _loss_and_grads(ref, x, y)
    logits_k, loss_k, grads_k = _loss_and_grads(kern, x, y)
    assert len(calls) == cfg.n_layer                            # the kernel did run, once a layer
    torch.testing.assert_close(loss_k, loss_r, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits_k, logits_r, atol=1e-5, rtol=1e-5)
    for name, g in grads_r.items():
        torch.testing.assert_close(grads_k[name], g, atol=1e-5, rtol=1e-4, msg=name)

    # The same comparison against a model that rotates the wrong way (a sign bug in sin) fails
    # by far more. (Shifting every position by the same amount would not: RoPE is relative.)
    off = GPT(cfg, rope="reference").to(device)
    off.load_state_dict(ref.state_dict())
    for blk in off.blocks:
        blk.attn.rotary.sin = -blk.attn.rotary.sin
    logits_o, _, grads_o = _loss_and_grads(off, x, y)
    assert (logits_o - logits_r).abs().max() > 100 * 1e-5
    qkv = "blocks.0.attn.qkv.weight"
    assert (grads_o[qkv] - grads_r[qkv]).abs().max() > 100 * 1e-5


def test_te_style_attention_matches_te_unfused(seeded, device):
    S, B, C, H = 12, 2, 32, 4
    ref = TEStyleAttention(C, H, rope="reference").to(device)
    with torch.no_grad():
        ref.qkv.weight.mul_(10.0)                               # position-sensitive attention
    kern = TEStyleAttention(C, H, rope="ropelib").to(device)
    kern.load_state_dict(ref.state_dict())
    freqs = rope_freqs(S + 4, C // H, device=device)            # [S+4, 1, 1, D]: longer table
    x = torch.randn(S, B, C, device=device)

    def run(m, f):
        m.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        out = m(xi, f)
        out.square().mean().backward()
        return out.detach(), xi.grad, m.qkv.weight.grad

    want = run(ref, freqs)
    for got, exp in zip(run(kern, freqs), want):
        torch.testing.assert_close(got, exp, atol=1e-5 * exp.abs().max().item(), rtol=1e-4)
    wrong = run(ref, -freqs)                                    # rotating the wrong way
    for got, exp in zip(wrong, want):
        assert (got - exp).abs().max() > 1e-2 * exp.abs().max()
    with pytest.raises(ValueError, match="rope"):
        TEStyleAttention(C, H, rope="te")


# --- training, sampling, profiling ------------------------------------------------------------

def test_train_is_seeded_and_learns(data):
    cfg = tiny(data, block_size=32)
    models = [build(cfg, "reference", seed=0) for _ in range(2)]
    runs = [train(m, data, steps=40, batch_size=8, lr=3e-3, seed=0, eval_every=20, eval_iters=4)
            for m in models]
    a, b = runs
    assert a["train_loss"] == b["train_loss"] and a["val_loss"] == b["val_loss"]
    assert a["eval_train_loss"] == b["eval_train_loss"]
    assert len(a["train_loss"]) == 40 and a["eval_step"] == [20, 40]
    # the training loss at each evaluation: fixed batches of the training split, not the
    # validation split's and not the step's own batch
    assert a["eval_train_loss"][-1] == estimate_loss(models[0], data, "train", iters=4,
                                                     batch_size=8)
    assert a["eval_train_loss"][-1] != a["val_loss"][-1]
    assert a["eval_train_loss"][0] > a["eval_train_loss"][1]                # it learns
    first, last = sum(a["train_loss"][:5]) / 5, sum(a["train_loss"][-5:]) / 5
    assert last < first - 0.5, (first, last)                    # ln(V) ~ 4.6 -> well below
    assert a["tokens_per_s"] > 0 and a["amp_dtype"] == "float32" and a["rope"] == "reference"
    other = train(build(cfg, "reference", seed=1), data, steps=5, batch_size=8, seed=1)
    assert other["train_loss"] != a["train_loss"][:5]
    with pytest.raises(ValueError, match="steps"):
        train(build(cfg, "reference"), data, steps=0, batch_size=2)


def test_training_curves_match_ropelib_vs_reference(data, device):
    cfg = tiny(data)
    hist = {rope: train(build(cfg, rope, seed=5, device=device), data, steps=4, batch_size=2,
                        lr=1e-2, seed=5, eval_iters=2, amp_dtype=None)     # fp32 everywhere
            for rope in ("reference", "ropelib")}
    torch.testing.assert_close(torch.tensor(hist["ropelib"]["train_loss"]),
                               torch.tensor(hist["reference"]["train_loss"]),
                               atol=1e-5, rtol=1e-5)
    assert hist["ropelib"]["val_loss"] == pytest.approx(hist["reference"]["val_loss"], abs=1e-5)


def test_sample(data):
    model = build(tiny(data), "reference", seed=0)
    text = sample(model, data, "The ", 25, seed=7)
    assert len(text) == 29 and text.startswith("The ")         # window slides past block_size
    assert sample(model, data, "The ", 25, seed=7) == text
    assert set(text) <= set(data.chars)
    with pytest.raises(ValueError, match="prompt"):
        sample(model, data, "", 5)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, data, "a", 5, temperature=0)


def test_estimate_loss_is_repeatable(data):
    model = build(tiny(data), "reference", seed=0)
    a = estimate_loss(model, data, "val", iters=3, batch_size=2)
    assert a == estimate_loss(model, data, "val", iters=3, batch_size=2)
    assert abs(a - torch.log(torch.tensor(float(data.vocab_size))).item()) < 0.5  # untrained


HOST_KEYS = {"rope_host_fwd_ms": "rope_fwd_ms", "rope_host_bwd_ms": "rope_bwd_ms",
             "rope_host_ms": "rope_ms", "step_host_ms": "step_ms", "host_share": "share"}


def check_host_side(r, device):
    """The host-time keys: present, positive, a share in (0, 1) that adds up; on the CPU the
    clock already is host time, so each equals its device-clock twin."""
    assert all(r[k] > 0 for k in HOST_KEYS), {k: r.get(k) for k in HOST_KEYS}
    assert 0.0 < r["host_share"] < 1.0
    assert r["rope_host_ms"] == pytest.approx(r["rope_host_fwd_ms"] + r["rope_host_bwd_ms"])
    assert r["host_share"] == pytest.approx(r["rope_host_ms"] / r["step_host_ms"])
    if device != "cuda":
        assert {k: r[k] for k in HOST_KEYS} == pytest.approx(
            {k: r[v] for k, v in HOST_KEYS.items()})


def test_rope_time_share_reference_cpu(data, monkeypatch):
    model = build(tiny(data), "reference", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    steps_run = []                                              # it profiles train's own step
    real_step = model_module.train_step
    monkeypatch.setattr(model_module, "train_step",
                        lambda *a, **k: steps_run.append(1) or real_step(*a, **k))
    r = rope_time_share(model, data, batch_size=2, steps=2, warmup=1)
    assert len(steps_run) == 1 + 2
    assert 0.0 < r["share"] < 1.0 and r["rope_fwd_ms"] > 0 and r["rope_bwd_ms"] > 0
    assert r["time"] == "host (CPU) time"
    check_host_side(r, "cpu")
    assert r["rope_host_fwd_ms"] != r["rope_host_bwd_ms"]    # two sets of events, not one twice
    # backward of the rotation (q*cos + rotate_half(q)*sin), not of attention's transposes
    assert {"MulBackward0", "CatBackward0", "NegBackward0"} <= set(r["backward_nodes"])
    assert not {"TransposeBackward0", "ScaledDotProductEfficientAttentionBackward0",
                "UnbindBackward0"} & set(r["backward_nodes"])
    for k, v in model.state_dict().items():                    # the model is left unchanged
        assert torch.equal(v, before[k]), k


def test_rope_time_share_ropelib_counts_the_kernel_backward(data, device):
    model = build(tiny(data), "ropelib", seed=0, device=device)
    r = rope_time_share(model, data, batch_size=2, steps=1, warmup=1)
    assert 0.0 < r["share"] < 1.0 and r["rope_bwd_ms"] > 0
    assert len(r["backward_nodes"]) == 1                        # the kernel's autograd node
    check_host_side(r, device)
    if device == "cuda":
        # every kernel named after RoPE was found inside the RoPE ranges and backward nodes,
        # and they are most of the time counted there (the rest: small helper kernels, if any)
        assert r["time"] == "device (kernel) time"
        assert any("rope" in k.lower() for k in r["kernel_names"])
        assert 0.5 * r["rope_ms"] <= r["named_kernel_ms"] <= 1.001 * r["rope_ms"]


# --- loss-curve data --------------------------------------------------------------------------

def test_history_csv_round_trip_and_figure(tmp_path):
    runs = {"ropelib": {"step": [1, 2, 3], "train_loss": [4.5, 3.25, 2.875],
                        "eval_step": [2, 3], "val_loss": [3.5, 3.0]},
            "reference": {"step": [1, 2, 3], "train_loss": [4.5, 3.25, 2.9],
                          "eval_step": [2, 3], "val_loss": [3.5, 3.0625]}}
    path = write_history_csv(runs, tmp_path / "curves.csv", {"gpu": "none", "steps": 3})
    meta, back = read_history_csv(path)
    assert meta == {"gpu": "none", "steps": "3"}
    assert back == runs
    fig = plot_loss_curves(back, tmp_path / "curves.png", baseline="reference")
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    import matplotlib.pyplot as plt
    plt.close(fig)
    with pytest.raises(ValueError, match="histories"):
        write_history_csv({}, tmp_path / "empty.csv")
    # train's fixed-batch training loss, where a run has it
    runs["ropelib"]["eval_train_loss"] = [3.25, 2.75]
    _, back = read_history_csv(write_history_csv(runs, tmp_path / "eval.csv"))
    assert back == runs and "eval_train_loss" not in back["reference"]


def test_loss_figures_draw_a_control_on_the_right_only(tmp_path):
    import matplotlib.pyplot as plt

    def run(train_loss, val_loss):
        return {"step": [1, 2, 3], "train_loss": train_loss, "eval_step": [2, 3],
                "val_loss": val_loss}

    runs = {"ropelib": run([4.5, 3.25, 2.875], [3.5, 3.0]),
            "reference": run([4.5, 3.25, 2.9], [3.5, 3.0625]),
            "reference again": run([4.5, 3.2, 2.9], [3.25, 3.0])}
    fig = plot_loss_curves(runs, baseline="reference", right_only=["reference again"])
    left, right = fig.axes
    assert not any("reference again" in line.get_label() for line in left.lines)
    assert [line.get_label() for line in right.lines] == [
        "|ropelib - reference|", "|reference again - reference|"]
    assert list(right.lines[1].get_ydata()) == pytest.approx([0.25, 0.0625])
    plt.close(fig)
    for bad in (["reference"], ["control"]):
        with pytest.raises(ValueError, match="right_only"):
            plot_loss_curves(runs, baseline="reference", right_only=bad)
    fig = plot_train_loss_differences(runs, tmp_path / "parting.png", baseline="reference",
                                      runs=("ropelib", "reference again"), last_step=2,
                                      title="NVIDIA H200")
    assert (tmp_path / "parting.png").stat().st_size > 10_000
    (ax,) = fig.axes
    assert [list(line.get_xdata()) for line in ax.lines] == [[1, 2], [1, 2]]
    assert list(ax.lines[0].get_ydata()) == pytest.approx([1e-9, 1e-9])  # an exact 0 at 1e-9
    assert list(ax.lines[1].get_ydata()) == pytest.approx([1e-9, 0.05])
    plt.close(fig)


def test_ema_is_bias_corrected():
    assert ema([2.0] * 5) == pytest.approx([2.0] * 5)
    assert ema([0.0, 1.0], alpha=0.5) == pytest.approx([0.0, 2 / 3])


def test_training_curves_match_with_rope_in_the_qkv_projection(data, device, monkeypatch):
    """rope="ropelib_qkv" (QKV projection and RoPE in one GEMM) trains the same model: the same
    weights see the same batches and give the same losses as RoPE after the projection, up to
    the GEMM's own rounding (fp32: tl.dot without TF32 against torch's matmul); its kernel runs
    once per layer and step, and the projection-then-RoPE path does not run at all."""
    cfg = tiny(data, rotary_percent=0.5)
    fused_calls, rope_calls = [], []
    real_fused, real_rope = ropelib.qkv_rope_linear, ropelib.apply_rope_qk
    monkeypatch.setattr(ropelib, "qkv_rope_linear",
                        lambda *a, **k: fused_calls.append(1) or real_fused(*a, **k))
    hist = {}
    for rope in ("ropelib", "ropelib_qkv"):
        monkeypatch.setattr(ropelib, "apply_rope_qk",
                            lambda *a, **k: rope_calls.append(rope) or real_rope(*a, **k))
        hist[rope] = train(build(cfg, rope, seed=5, device=device), data, steps=3, batch_size=2,
                           lr=1e-2, seed=5, eval_iters=1, amp_dtype=None)
    assert len(fused_calls) >= 3 * cfg.n_layer
    assert "ropelib_qkv" not in rope_calls and rope_calls
    torch.testing.assert_close(torch.tensor(hist["ropelib_qkv"]["train_loss"]),
                               torch.tensor(hist["ropelib"]["train_loss"]),
                               atol=1e-4, rtol=1e-4)
    assert hist["ropelib_qkv"]["val_loss"] == pytest.approx(hist["ropelib"]["val_loss"], abs=1e-4)
    assert hist["ropelib_qkv"]["rope"] == "ropelib_qkv"
    # the same state_dict: the fused model holds the very same parameters
    assert build(cfg, "ropelib_qkv").state_dict().keys() == build(cfg, "ropelib").state_dict().keys()
