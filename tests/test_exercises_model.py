"""Notebook 09's exercise checks: RoPE's share of a profiled step, and attention with a KV cache.

For each check: the worked solution, typed in by a learner, passes, and so do answers written
differently; the worked solution itself (ropelib's, not the learner's) is refused; the slips a
learner is likely to make fail (for the cached attention: positions restarting at 0, the cached
keys rotated again, off by one, and the mask), each with a message that says what went wrong.
(`test_exercises_answers_are_code.py` also tries answers that call ropelib.)
"""
import ast
import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import ropelib  # noqa: E402
from ropelib import reference  # noqa: E402
from ropelib.course import model as gpt_model  # noqa: E402
from ropelib.course.exercises import in_a_model, own_code  # noqa: E402
from ropelib.course.model import GPTConfig, KVCache  # noqa: E402
from loading import load_file, scratch_folder, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-rope-in-a-model.py"
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy


# --- exercise 1: rope_share ---------------------------------------------------------------------

def test_the_worked_share_typed_in_passes(capsys):
    assert in_a_model.check_rope_share(learner_copy(in_a_model.solution_rope_share))
    out = capsys.readouterr().out
    assert "✅ rope_share: correct" in out and "❌" not in out, out


def test_the_share_cases_have_the_answers_they_are_built_for():
    cases = {label: (args, expected) for label, args, expected in in_a_model._share_cases()}
    (events, names), (rope, step, share) = cases["one RoPE kernel, launched 4 times"]
    assert rope == 3.25 + 3.5 + 3.75 + 4.0 and step == sum(us for _, us in events)
    assert share == rope / step
    (events, names), (rope, _, _) = cases[
        "another library's RoPE kernel, named inside a longer name"]
    assert rope == 2.75 + 3.0 and not any(name in names for name, _ in events)
    assert cases["a kernel that two of the substrings name"][1] == \
        cases["one RoPE kernel, launched 4 times"][1]
    (events, _), (rope, step, share) = cases["no kernel named after RoPE"]
    assert rope == 0.0 and share == 0.0 and step == sum(us for _, us in events)
    # torch.compile names its fused RoPE after the operations it fuses, as the compile log records
    (events, _), (rope, step, share) = cases[
        "a compiled model: RoPE fused into a kernel named after its operations"]
    assert rope == 0.0 and share == 0.0 and step == sum(us for _, us in events)
    log = (ROOT / "benchmarks" / "results" / "compile_gap-nvidia-h200.log").read_text()
    fused = {name for name, _ in events if name.startswith("triton_")}
    assert fused and all(f"inductor {name} " in log for name in fused)


def test_the_measured_steps_are_cases_and_say_what_the_notebook_says(tmp_path):
    """figures/09-step-kernels.csv (one GPU step with each RoPE) is read back as written, the check
    tries both steps, and their shares by name are what notebook 09 states: ropelib's kernels
    carry RoPE's name, none of the reference's do."""
    meta, steps = in_a_model.step_kernels()
    assert set(steps) == {"ropelib", "reference"} and meta["gpu"].startswith("NVIDIA")
    labels = [label for label, _, _ in in_a_model._share_cases()]
    assert sum(label.startswith("notebook 09's step with the") for label in labels) == 2
    shares = {rope: in_a_model.solution_rope_share(events, {"rope"})[2]
              for rope, events in steps.items()}
    assert 0 < shares["ropelib"] < 0.1 and shares["reference"] == 0
    path = tmp_path / "steps.csv"
    in_a_model.write_step_kernels(path, steps, meta)
    assert in_a_model.step_kernels(path) == (meta, {r: [(n, round(us, 3)) for n, us in e]
                                                    for r, e in steps.items()})
    assert in_a_model.step_kernels(tmp_path / "none.csv") == ({}, {})


def _share_of(rope, step):
    return rope, step, rope / step


def _step(events):
    return sum(us for _, us in events)


def _rope(events, names, match=lambda part, name: part in name):
    return sum(us for name, us in events if any(match(p, name) for p in names))


WRONG_SHARE = {
    "exact names": lambda ev, names: _share_of(_rope(ev, names, lambda p, n: p == n), _step(ev)),
    "one launch per name (a dict)": lambda ev, names: _share_of(
        _rope(dict(ev).items(), names), _step(dict(ev).items())),
    "once per substring": lambda ev, names: _share_of(
        sum(us for name, us in ev for p in names if p in name), _step(ev)),
    "a percentage": lambda ev, names: (_rope(ev, names), _step(ev),
                                       100 * _rope(ev, names) / _step(ev)),
    "RoPE over the rest of the step": lambda ev, names: (
        _rope(ev, names), _step(ev), _rope(ev, names) / (_step(ev) - _rope(ev, names))),
    "the step without RoPE": lambda ev, names: _share_of(
        _rope(ev, names), _step(ev) - _rope(ev, names)),
    "milliseconds": lambda ev, names: (_rope(ev, names) / 1e3, _step(ev) / 1e3,
                                       _rope(ev, names) / _step(ev)),
    "the share alone": lambda ev, names: _rope(ev, names) / _step(ev),
    "'rope' only, whatever rope_names says": lambda ev, names: _share_of(_rope(ev, ["rope"]),
                                                                      _step(ev)),
    "not answered": lambda ev, names: None,
    "raises": lambda ev, names: 1 / 0,
}


@pytest.mark.parametrize("label", list(WRONG_SHARE))
def test_a_wrong_share_fails(label, capsys):
    assert in_a_model.check_rope_share(WRONG_SHARE[label]) is False
    assert "❌" in capsys.readouterr().out


def test_a_case_blind_match_and_a_numpy_sum_are_answers(capsys):
    def case_blind(events, rope_names):
        us = np.array([t for _, t in events])
        mine = np.array([any(p.lower() in n.lower() for p in rope_names) for n, _ in events])
        return float(us[mine].sum()), float(us.sum()), float(us[mine].sum() / us.sum())
    assert in_a_model.check_rope_share(case_blind)
    capsys.readouterr()


# --- exercise 2: cached_attention ---------------------------------------------------------------

def _split(attn, x):
    B, S, _ = x.shape
    return attn.qkv(x).view(B, S, 3, attn.n_head, attn.head_dim).unbind(2)      # [B, S, H, D]


def _turn(t, attn, pos):
    """t [B, S, H, D] rotated at positions pos [S], by hand from the model's cos/sin rows."""
    cos, sin = attn.rotary.cos[pos][:, None, :], attn.rotary.sin[pos][:, None, :]   # [S, 1, D]
    t1, t2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat((-t2, t1), dim=-1) * sin


def _mask(L, S, device):
    """Token L + j sees keys 0 .. L + j: [S, L + S]."""
    return torch.arange(L + S, device=device) <= (L + torch.arange(S, device=device))[:, None]


def _attend(attn, q, k, v, mask=None, is_causal=False):
    B, S = q.shape[:2]
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, is_causal=is_causal)
    return attn.proj(y.transpose(1, 2).reshape(B, S, -1))


def _rotating_at(q_at, k_at=None, *, cache_raw=False, is_causal=lambda L, S: False):
    """A cached attention that rotates q at q_at(L, S) and k at k_at(L, S) (default: q's), by
    hand; cache_raw: caches k as it came out of qkv; is_causal(L, S): SDPA's flag, no mask."""
    def cached_attention(attn, x, past_k, past_v):
        L, S = past_k.shape[1], x.shape[1]
        q, k, v = _split(attn, x)
        ar = torch.arange(S, device=x.device)
        kr = _turn(k, attn, (k_at or q_at)(L, S, ar))
        keys = torch.cat((past_k, kr), dim=1)
        values = torch.cat((past_v, v), dim=1)
        causal = is_causal(L, S)
        y = _attend(attn, _turn(q, attn, q_at(L, S, ar)), keys, values,
                    None if causal else _mask(L, S, x.device), causal)
        return y, torch.cat((past_k, k), dim=1) if cache_raw else keys, values
    return cached_attention


_own = _rotating_at(lambda L, S, ar: L + ar)          # right, written here by hand


def _with_start_positions(attn, x, past_k, past_v):
    """Right: ropelib.apply_rope (the kernel) with one offset per sequence."""
    B, S, _ = x.shape
    L = past_k.shape[1]
    q, k, v = _split(attn, x)
    start = torch.full((B,), L, dtype=torch.int32, device=x.device)
    q, k = (ropelib.apply_rope(t, attn.rotary.freqs, layout="bshd", start_positions=start)
            for t in (q, k))
    k, v = torch.cat((past_k, k), dim=1), torch.cat((past_v, v), dim=1)
    return _attend(attn, q, k, v, _mask(L, S, x.device)), k, v


def _with_the_reference_on_rows_from_L(attn, x, past_k, past_v):
    """Right: ropelib.reference on the rows L .. L + S - 1 of the angle table."""
    B, S, _ = x.shape
    L = past_k.shape[1]
    q, k, v = _split(attn, x)
    rows = attn.rotary.freqs[L:L + S]
    q, k = (reference.rope_reference(t, rows, layout="bshd") for t in (q, k))
    k, v = torch.cat((past_k, k), dim=1), torch.cat((past_v, v), dim=1)
    return _attend(attn, q, k, v, _mask(L, S, x.device)), k, v


def _restart_with_the_models_rotary(attn, x, past_k, past_v):
    """Wrong: the model's own rotary on the new tokens, which counts them from 0."""
    L, S = past_k.shape[1], x.shape[1]
    q, k, v = _split(attn, x)
    q, k = attn.rotary(q, k)
    k, v = torch.cat((past_k, k), dim=1), torch.cat((past_v, v), dim=1)
    return _attend(attn, q, k, v, _mask(L, S, x.device)), k, v


def _rotates_the_cache_again(attn, x, past_k, past_v):
    """Wrong: the whole cache, old keys and new, rotated at 0 .. L + S - 1 at every step."""
    L, S = past_k.shape[1], x.shape[1]
    q, k, v = _split(attn, x)
    pos = torch.arange(L + S, device=x.device)
    k = _turn(torch.cat((past_k, k), dim=1), attn, pos)
    v = torch.cat((past_v, v), dim=1)
    return _attend(attn, _turn(q, attn, pos[L:]), k, v, _mask(L, S, x.device)), k, v


WRONG_CACHE = {
    "positions restarting at 0 (the model's rotary)": (
        _restart_with_the_models_rotary, "positions start again at 0 in each call"),
    "positions restarting at 0, by hand": (
        _rotating_at(lambda L, S, ar: ar), "positions start again at 0 in each call"),
    "the cached keys rotated again": (
        _rotates_the_cache_again, "are not the cached keys passed in"),
    "off by one: the next token at L + 1": (
        _rotating_at(lambda L, S, ar: (L + 1 if L else 0) + ar), "off by +1"),
    "off by one: the next token at L - 1, the last cached position": (
        _rotating_at(lambda L, S, ar: max(L - 1, 0) + ar), "off by -1"),
    "off by one everywhere, the prompt's positions too": (
        _rotating_at(lambda L, S, ar: L + 1 + ar), "off by +1"),
    "the query at its position, the key from 0": (
        _rotating_at(lambda L, S, ar: L + ar, lambda L, S, ar: ar),
        "positions start again at 0 in each call"),
    "the key at its position, the query from 0": (
        _rotating_at(lambda L, S, ar: ar, lambda L, S, ar: L + ar),
        "the cache is right, but the attention output is not"),
    "unrotated keys in the cache": (
        _rotating_at(lambda L, S, ar: L + ar, cache_raw=True), "are not rotated at all"),
    "is_causal=True with a cache": (
        _rotating_at(lambda L, S, ar: L + ar, is_causal=lambda L, S: True),
        "the cache is right, but the attention output is not"),
    "is_causal=True for a chunk after the cache": (
        _rotating_at(lambda L, S, ar: L + ar, is_causal=lambda L, S: S > 1),
        "step 4: 3 new tokens at positions 7..9 after 7 cached"),
    "(y, k, v) in another order": (
        lambda attn, x, pk, pv: (lambda y, k, v: (k, v, y))(*_own(attn, x, pk, pv)),
        "has shape"),
    "y alone": (lambda attn, x, pk, pv: _own(attn, x, pk, pv)[0], "expected (y, k, v)"),
    "not answered": (lambda attn, x, pk, pv: None, "not answered yet"),
    "raises": (lambda attn, x, pk, pv: 1 / 0, "ZeroDivisionError"),
}


@pytest.mark.parametrize("answer", [
    lambda: learner_copy(in_a_model.solution_cached_attention),
    lambda: _own, lambda: _with_start_positions, lambda: _with_the_reference_on_rows_from_L],
    ids=["the worked solution typed in", "by hand from cos and sin",
         "ropelib.apply_rope with start_positions", "ropelib.reference on the rows from L"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_right_cached_attention_passes(answer, seed, capsys):
    assert in_a_model.check_cached_attention(answer(), seed=seed)
    out = capsys.readouterr().out
    assert "✅ cached_attention" in out and "❌" not in out, out


@pytest.mark.parametrize("label", list(WRONG_CACHE))
def test_a_wrong_cached_attention_fails_and_says_where(label, capsys):
    answer, words = WRONG_CACHE[label]
    assert in_a_model.check_cached_attention(answer, seed=0) is False
    out = capsys.readouterr().out
    assert "❌" in out and "✅" not in out and words in out, out


def test_off_by_one_everywhere_leaves_the_logits_but_not_the_cache():
    """A shift of every position cancels in the scores: only the cached keys can show it."""
    model, idx = in_a_model._decoding_case(torch.Generator().manual_seed(0), "cpu")
    chunks = list(idx.split(list(in_a_model._CHUNKS), dim=1))
    want, _ = in_a_model._full_forward(model, idx)
    shifted = torch.cat(in_a_model.decode_with(
        model, chunks, _rotating_at(lambda L, S, ar: L + 1 + ar)), dim=1)
    assert (shifted - want).abs().max() <= in_a_model.KV_TOL * want.abs().max()


@pytest.mark.parametrize("seed", range(4))
def test_the_tolerance_sits_far_from_rounding_and_from_a_position_error(seed):
    model, idx = in_a_model._decoding_case(torch.Generator().manual_seed(seed), "cpu")
    chunks = list(idx.split(list(in_a_model._CHUNKS), dim=1))
    want, _ = in_a_model._full_forward(model, idx)

    def error(answer):
        got = torch.cat(in_a_model.decode_with(model, chunks, answer), dim=1)
        return float((got - want).abs().max() / want.abs().max())
    assert error(in_a_model.solution_cached_attention) < in_a_model.KV_TOL / 10
    for label in ("positions restarting at 0, by hand", "the cached keys rotated again",
                  "off by one: the next token at L + 1"):
        assert error(WRONG_CACHE[label][0]) > 100 * in_a_model.KV_TOL, label


def _through_rope_kv_cache(attn, x, past_k, past_v):
    """Right values from ropelib.rope_kv_cache, which takes each position from the cache."""
    B, S, _ = x.shape
    L = past_k.shape[1]
    q, k, v = _split(attn, x)
    k_cache = torch.cat((past_k, torch.zeros_like(k)), dim=1).contiguous()
    v_cache = torch.cat((past_v, torch.zeros_like(v)), dim=1).contiguous()
    seqlens = torch.full((B,), L, dtype=torch.int32, device=x.device)
    q = ropelib.rope_kv_cache(q.contiguous(), k.contiguous(), v.contiguous(), k_cache, v_cache,
                              seqlens, attn.rotary.freqs)
    return _attend(attn, q, k_cache, v_cache, _mask(L, S, x.device)), k_cache, v_cache


def _through_the_models_cache(attn, x, past_k, past_v):
    """Right values from the model's own cached attention (ropelib.course.model)."""
    B, S, C = x.shape
    L = past_k.shape[1]
    cfg = GPTConfig(vocab_size=2, block_size=attn.rotary.freqs.shape[0], n_layer=1,
                    n_head=attn.n_head, n_embd=C)
    cache = KVCache(cfg, B, L + S, device=x.device)
    cache.k[0][:, :L], cache.v[0][:, :L] = past_k, past_v
    cache.seqlens.fill_(L)
    cache.length = L
    y = gpt_model._attention_cached(attn, x, cache, 0, fused=False)
    return y, cache.k[0], cache.v[0]


REFUSED_CACHE = {
    "the worked solution": (in_a_model.solution_cached_attention,
                            "called ropelib's solution_cached_attention"),
    "the worked solution, wrapped": (
        lambda attn, x, pk, pv: in_a_model.solution_cached_attention(attn, x, pk, pv),
        "called ropelib's solution_cached_attention"),
    "ropelib.rope_kv_cache": (_through_rope_kv_cache,
                              "called ropelib's rope_kv_cache (ropelib/kv_cache.py)"),
    "the model's cached attention": (_through_the_models_cache,
                                     "called ropelib's write_kv_cache (ropelib/kv_cache.py)"),
}


@pytest.mark.parametrize("label", list(REFUSED_CACHE))
def test_an_answer_that_calls_ropelib_to_do_the_job_is_refused(label, capsys):
    answer, words = REFUSED_CACHE[label]
    assert in_a_model.check_cached_attention(answer, seed=0) is False
    out = capsys.readouterr().out
    assert f"your cached attention, but the answer {words}" in out, out
    assert "write it yourself" in out, out


@contextlib.contextmanager
def _nothing_barred(what, *, allow=(), bar=(), bar_ops=()):
    yield


@pytest.mark.parametrize("label", list(REFUSED_CACHE))
def test_the_refusal_is_the_barring_alone(label, monkeypatch, capsys):
    # the refused answers compute the right values: with nothing barred they pass
    monkeypatch.setattr(own_code, "library_barred", _nothing_barred)
    assert in_a_model.check_cached_attention(REFUSED_CACHE[label][0], seed=0), \
        capsys.readouterr().out


def test_the_check_leaves_the_global_random_state_alone(capsys):
    before = torch.random.get_rng_state()
    in_a_model.check_cached_attention(_own, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    capsys.readouterr()


# --- the worked share is ropelib's, not the learner's ------------------------------------------

@pytest.mark.parametrize("answer", [
    in_a_model.solution_rope_share, lambda e, n: in_a_model.solution_rope_share(e, n)],
    ids=["share", "share, wrapped"])
def test_the_worked_share_is_refused(answer, capsys):
    assert in_a_model.check_rope_share(answer) is False
    out = capsys.readouterr().out
    assert "your share of the step, but the answer called ropelib's solution_rope_share" in out
    assert "write it yourself" in out, out


# --- the notebook -------------------------------------------------------------------------------

def test_the_notebook_hands_its_exercises_to_the_checks_where_they_belong():
    tree = ast.parse(NOTEBOOK.read_text(encoding="utf-8"))
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert "in_a_model.check_rope_share(rope_share)" in text
    assert "kv_by_learner = in_a_model.check_cached_attention(cached_attention)" in text
    # the check's verdict picks the function the notebook decodes the trained model with
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert {"rope_share", "cached_attention", "kv_by_learner"} <= names
    assert "cached_attention if kv_by_learner else in_a_model.solution_cached_attention" in text
    assert text.index("## 5. How much") < text.index("check_rope_share") \
        < text.index("## 6. What did it learn") < text.index("check_cached_attention") \
        < text.index("## 7. Drop-in I")
    assert text.index("**Exercise 1") < text.index("**Exercise 2")
    assert "same_training" not in text


# --- exercise 3: a Triton RoPE kernel of the learner's, inside the model -----------------------

_VARIANTS = scratch_folder("ropelib-nb09-")


def _kernel_variant(label, *edits):
    """The worked kernel as a learner would type it in (`my_...`, a file of its own), with the
    source edits (old, new) applied: a slip a learner might make."""
    import inspect
    import textwrap
    import triton
    import triton.language as tl
    source = textwrap.dedent(inspect.getsource(in_a_model.solution_model_rope_kernel.fn))
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    name = "my_" + "".join(c if c.isalnum() else "_" for c in label)[:40]
    source = source.replace("def solution_model_rope_kernel(", f"def {name}(")
    return getattr(written_module(name, _VARIANTS / f"{name}.py", source,
                                  {"triton": triton, "tl": tl}), name)


def test_the_worked_kernel_typed_in_passes_and_trains_like_the_reference(capsys):
    my_kernel = _kernel_variant("typed in")
    assert in_a_model.check_model_rope_kernel(my_kernel, seed=0)
    out = capsys.readouterr().out
    assert "✅ RoPE kernel in the model: logits after 3 training steps" in out, out
    assert "❌" not in out, out


WRONG_KERNELS = {
    "rotated by -theta (the sines' signs swapped)": (
        [("y1 = x1 * tl.cos(theta1) - x2", "y1 = x1 * tl.cos(theta1) + x2"),
         ("y2 = x2 * tl.cos(theta2) + x1", "y2 = x2 * tl.cos(theta2) - x1")],
        "a view of a QKV output"),
    "rows in sbhd order (notebook 03's kernel unchanged)": (
        [("b = (rows // (S * H))[:, None]", "b = ((rows // H) % 2)[:, None]"),
         ("s = ((rows // H) % S)[:, None]", "s = (rows // (2 * H))[:, None]")],
        "a view of a QKV output"),
    "x read as if contiguous": (
        [("x_row = x_ptr + b * stride_xb + s * stride_xs + h * stride_xh",
          "x_row = x_ptr + rows[:, None] * 2 * HALF")],
        "a view of a QKV output"),
    "one row a program, whatever ROWS says": (
        [("tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)",
          "tl.program_id(0).to(tl.int64) + tl.arange(0, ROWS) * 0")],
        "were not (wholly) written"),
    "no mask on the rows: the last program writes past the end": (
        [("mask = (rows[:, None] < n_rows) & (offs < HALF)",
          "mask = (offs < HALF) | (rows[:, None] >= 0)")],
        "RoPE kernel in the model"),
    "the angles of position 0 for every token": (
        [("f_row = freqs_ptr + s * stride_fs", "f_row = freqs_ptr + 0 * s * stride_fs")],
        "a view of a QKV output"),
}


@pytest.mark.parametrize("label", list(WRONG_KERNELS))
def test_a_wrong_kernel_fails_and_says_where(label, capsys):
    edits, words = WRONG_KERNELS[label]
    assert in_a_model.check_model_rope_kernel(_kernel_variant(label, *edits), seed=0) is False
    out = capsys.readouterr().out
    assert "❌" in out and "✅" not in out and words in out, out


def test_a_blank_kernel_and_a_function_are_not_answers(capsys):
    import triton
    import triton.language as tl

    @triton.jit
    def my_blank(x_ptr, y_ptr, freqs_ptr, n_rows, S, H, stride_xb, stride_xs, stride_xh,
                 stride_xd, stride_fs, stride_fd, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 ROWS: tl.constexpr):
        ...
    assert in_a_model.check_model_rope_kernel(my_blank, seed=0) is False
    assert "no kernel yet" in capsys.readouterr().out
    assert in_a_model.check_model_rope_kernel(
        lambda x, freqs: ropelib.apply_rope(x, freqs, layout="bshd"), seed=0) is False
    assert "expected a @triton.jit kernel" in capsys.readouterr().out


def _calling(target):
    """A kernel of the learner's with the worked kernel's parameters whose body only calls
    `target` (a worked or teaching kernel) with them."""
    import inspect
    import textwrap
    import triton
    import triton.language as tl
    fn = in_a_model.solution_model_rope_kernel.fn
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    node.name, node.decorator_list = f"my_calls_{getattr(target, 'fn', target).__name__}", []
    node.body = [ast.Expr(ast.Call(func=ast.Name("TARGET", ast.Load()),
                                   args=[ast.Name(a.arg, ast.Load()) for a in node.args.args],
                                   keywords=[]))]
    source = "@triton.jit\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return getattr(written_module(node.name, _VARIANTS / f"{node.name}.py", source,
                                  {"triton": triton, "tl": tl, "TARGET": target}), node.name)


def test_the_worked_kernel_and_kernels_that_call_it_are_refused(capsys):
    assert in_a_model.check_model_rope_kernel(in_a_model.solution_model_rope_kernel,
                                              seed=0) is False
    out = capsys.readouterr().out
    assert "your RoPE kernel, but the answer launched ropelib's solution_model_rope_kernel" \
        in out and "write it yourself" in out, out
    assert in_a_model.check_model_rope_kernel(
        _calling(in_a_model.solution_model_rope_kernel), seed=0) is False
    out = capsys.readouterr().out
    assert "ropelib's solution_model_rope_kernel" in out and "write it yourself" in out, out


def test_notebook_03s_worked_rows_kernel_is_refused(capsys):
    """Notebook 03's worked kernel of ROWS rows a program (sbhd, one argument fewer per layout
    change) called from a kernel of the learner's: refused, not launched."""
    from ropelib.course.exercises import naive_kernel
    assert in_a_model.check_model_rope_kernel(_calling(naive_kernel.solution_rope_rows),
                                              seed=0) is False
    out = capsys.readouterr().out
    assert "ropelib's solution_rope_rows" in out and "write it yourself" in out, out


def test_the_plugged_model_matches_the_reference_and_runs_the_kernel():
    """plug_rope puts a rotate function in every layer (forward and backward through it), and
    leaves the parameters as they were."""
    cfg = GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16)
    ref = gpt_model.build(cfg, "reference", seed=0)
    calls = []

    def rotate(x, freqs):
        calls.append(tuple(x.shape))
        return reference.rope_reference(x, freqs[:, None, None, :], layout="bshd")

    mine = gpt_model.build(cfg, "reference", seed=0)
    in_a_model.plug_rope(mine, rotate)
    assert set(mine.state_dict()) == set(ref.state_dict())
    idx = torch.randint(20, (2, 8), generator=torch.Generator().manual_seed(0))
    (_, l_ref), (_, l_mine) = ref(idx, idx), mine(idx, idx)
    l_ref.backward()
    l_mine.backward()
    assert len(calls) == 2 * 2 * 2                    # 2 layers x (q, k) x (forward, backward)
    torch.testing.assert_close(l_mine, l_ref)
    for a, b in zip(mine.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_the_notebook_runs_exercise_3_after_exercise_2():
    text = NOTEBOOK.read_text(encoding="utf-8")
    assert ("model_rope_by_learner = in_a_model.check_model_rope_kernel(my_model_rope_kernel,\n"
            "                                                          launch=launch_model_rope)"
            ) in text
    assert "\ndef launch_model_rope(kernel, x, freqs, out, rows=MODEL_ROPE_ROWS):" in text
    assert "solution(in_a_model.solution_model_rope_kernel.fn" in text
    assert text.index("**Exercise 2") < text.index("**Exercise 3") \
        < text.index("check_model_rope_kernel")



def test_the_notebook_reads_its_speed_claims_from_committed_data():
    """The committed Nsight Compute counters are read from their file; the compiled rounds log,
    another model's, is not quoted as this model's swings; the wall-clock saving is not split
    into a device part plus a host part; section 9's fp-fusion reading is asserted on a GPU, with
    no escape clause; each headline number of the committed run is read and asserted by a cell
    before the Summary quotes it (the prose after the cell does not restate it), the rest in an
    appendix after the main path."""
    text = NOTEBOOK.read_text(encoding="utf-8")
    name = "contiguous_ncu-nvidia-h200.csv"
    assert name in text and (ROOT / "benchmarks" / "results" / name).is_file(), name
    assert "model_rounds-default" not in text and "d_host_share" not in text
    assert "def instruction_counts(kernel, rows)" in text          # exercise 3's mechanism
    assert 'assert differ["as compiled by default"] == 0 < differ["with enable_fp_fusion=False"]' \
        in text
    assert "this paragraph's reading is not" not in text
    assert "issue=step_issue" in text and "paired_wall_saving" in text
    rounds = (ROOT / "ropelib" / "course" / "nb09_step_rounds.py").read_text(encoding="utf-8")
    assert "t_issued = time.perf_counter()" in rounds          # the issue time, before the wait
    assert "time.process_time()" not in text + rounds
    appendix = text.index("# ## Appendix: the measurements behind the text")
    assert appendix > text.index("# ## Questions for a study group")
    assert text.index("from statistics import median") > appendix
    summary = text.index("# ## Summary")
    for readout, quoted in (
            ('assert (round(100 * lib["share"], 2), round(100 * ref["share"], 2)) == (2.84, 35.76)',
             "ropelib's 2.84 %"),
            ("assert round(margin_c, 3) == 1.145", "1.145 times the fastest reference run's"),
            ('assert [round(d_c[k] / d_seed_c, 2) for k in ("ropelib", "reference again")] == '
             "[0.40, 0.29]", "0.40 of the seed distance")):
        # a cell asserts the number before the Summary quotes it, and nothing between the cell
        # and the Summary restates it (the text after a cell does not repeat what it asserts)
        at, said = text.index(readout), text.index(quoted, summary)
        assert at < summary < said < appendix, readout
        assert quoted not in text[at + len(readout):summary], quoted


def test_the_check_launches_through_the_launcher_it_is_given(capsys):
    """Notebook 09 passes its own launch_model_rope: the check must start the kernel through it
    (so a launcher that launches nothing fails the check) and pass with one that launches as
    in_a_model.launch_model_rope does; kernel_rope starts its launches through it too."""
    calls = []

    def counting(kernel, x, freqs, out, rows=in_a_model.MODEL_ROPE_ROWS):
        calls.append(rows)
        in_a_model.launch_model_rope(kernel, x, freqs, out, rows)

    my_kernel = _kernel_variant("through a launcher")
    assert in_a_model.check_model_rope_kernel(my_kernel, seed=0, launch=counting) is True, \
        capsys.readouterr().out
    assert calls and set(calls) == {in_a_model.MODEL_ROPE_ROWS}   # every launch went through it

    def launches_nothing(kernel, x, freqs, out, rows=in_a_model.MODEL_ROPE_ROWS):
        pass

    assert in_a_model.check_model_rope_kernel(my_kernel, seed=0, launch=launches_nothing) is False
    assert "were not (wholly) written" in capsys.readouterr().out

    calls.clear()
    rotate = in_a_model.kernel_rope(my_kernel, launch=counting)
    x = torch.randn(1, 3, 2, 8)
    freqs = torch.randn(3, 8)
    y = rotate(x, freqs)
    assert calls == [in_a_model.MODEL_ROPE_ROWS]
    torch.testing.assert_close(y, reference.rope_reference(x, freqs[:, None, None, :],
                                                           layout="bshd"), atol=1e-5, rtol=1e-5)
