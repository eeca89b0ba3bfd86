"""ropelib.bench.compare: the provider registry, rows, error metrics, sweeps and CSV."""
import dataclasses
import math
import re

import pytest
import torch

import ropelib
from ropelib.bench import compare as C
from ropelib import reference
from loading import load_file  # noqa: E402

TINY = C.Config(seq_len=4, batch=2, heads=2, head_dim=16, dtype="bf16")


def test_providers_lists_every_name_with_reasons():
    provs = C.providers()
    assert [p.name for p in provs] == list(C.PROVIDER_NAMES)
    for p in provs:
        assert isinstance(p, C.Provider)
        if not p.available:
            assert p.reason, f"{p.name} is unavailable without a reason"
            assert p.fn is None or callable(p.fn)
        else:
            assert callable(p.fn)
    by_name = {p.name: p for p in provs}
    assert by_name["pytorch"].available
    if not ropelib.on_gpu():
        assert not by_name["torch.compile"].available
        assert "interpreter mode" in by_name["torch.compile"].reason


def test_missing_modules_are_unavailable_not_raising(monkeypatch):
    import importlib
    real = importlib.import_module

    def fake(name, *a, **k):
        if name.startswith(("transformer_engine", "liger_kernel", "flash_attn")):
            raise ImportError(f"No module named {name!r} (test)")
        return real(name, *a, **k)
    monkeypatch.setattr(C.importlib, "import_module", fake)
    by_name = {p.name: p for p in C.providers()}
    for name in ("te_fused", "te_unfused", "liger", "flash_attn"):
        assert not by_name[name].available and "does not import" in by_name[name].reason
    rows = C.run_case(TINY, ["te_fused", "liger"], backward=False)
    assert [r["available"] for r in rows] == [False, False]
    assert all(r["fwd_ms"] is None and r["max_abs_err"] is None for r in rows)


def test_row_fields_and_derived_columns(device):
    rows = C.run_case(TINY, ["pytorch"], device=device)
    assert len(rows) == 1
    r = rows[0]
    assert set(C.ROW_FIELDS) <= set(r)
    assert r["provider"] == "pytorch" and r["available"] and r["reason"] == ""
    for f in C.CONFIG_FIELDS:
        assert r[f] == getattr(TINY, f)
    for f in ("fwd_ms", "fwd_ms_p20", "fwd_ms_p80", "fwdbwd_ms", "copy_fwd_ms", "copy_fwdbwd_ms"):
        assert r[f] > 0, f
    assert r["fwd_ms_p20"] <= r["fwd_ms"] <= r["fwd_ms_p80"]
    assert r["fwd_gbps"] == pytest.approx(C.bytes_moved(TINY) / r["fwd_ms"] / 1e6)
    assert r["fwdbwd_gbps"] == pytest.approx(C.bytes_moved(TINY, True) / r["fwdbwd_ms"] / 1e6)
    assert r["ratio_fwd"] == pytest.approx(r["copy_fwd_ms"] / r["fwd_ms"])
    assert r["device"] == str(torch.device(device))
    expected = C.TIMING_GPU if device == "cuda" else C.TIMING_CPU
    assert r["timing"] == expected
    if device == "cpu":
        assert "meaningless" in r["timing"]


def test_bytes_model():
    c = C.Config(8, 2, 4, 64, "fp32", rotary_percent=0.5)
    x_bytes = 8 * 2 * 4 * 64 * 4
    assert C.bytes_moved(c) == 2 * x_bytes + 8 * 32 * 4
    assert C.bytes_moved(c, backward=True) == 2 * C.bytes_moved(c)
    qk = dataclasses.replace(c, kv_heads=2, dtype="bf16")
    assert C.bytes_moved(qk) == 2 * 8 * 2 * 6 * 64 * 2 + 8 * 32 * 4


def test_ropelib_row_is_accurate(device):
    if not hasattr(ropelib, "apply_rope"):
        pytest.skip("ropelib.apply_rope has not landed")
    cfg = C.Config(4, 1, 2, 16, "bf16")
    r = C.run_case(cfg, ["ropelib"], backward=False, device=device)[0]
    assert r["available"], r["reason"]
    # one rounding from fp32 math: <= 0.5 ulp when rounding to nearest; the interpreter's
    # fp32->bf16 conversion may truncate, which costs up to 1 ulp
    assert r["max_ulp_err"] <= 1.0
    assert r["max_abs_err"] < 0.05


def test_wrong_provider_is_detected(device):
    def wrong(case):   # sin with the wrong sign: the inverse rotation
        c = case.config
        return reference.te_unfused(case.x, -case.freqs, tensor_format=c.layout)
    bad = C.Provider("wrong", True, "", wrong)
    good, bad_row = C.run_case(TINY, ["pytorch", bad], backward=False, device=device)
    assert bad_row["available"]
    assert bad_row["max_abs_err"] > 0.5
    assert bad_row["max_ulp_err"] > 100 * max(good["max_ulp_err"], 1.0)
    assert good["max_ulp_err"] < 64   # bf16 math with rounded cos/sin: a few ulps, near 0 more


def test_failing_and_inplace_providers_give_reasons(device):
    def boom(case):
        raise RuntimeError("kernel exploded")

    def inplace(case):
        return case.x.mul_(1.0).add_(1.0)
    rows = C.run_case(TINY, [C.Provider("boom", True, "", boom),
                             C.Provider("inplace", True, "", inplace),
                             C.Provider("off", False, "not installed here")],
                      backward=False, device=device)
    assert [r["available"] for r in rows] == [False, False, False]
    assert "kernel exploded" in rows[0]["reason"]
    assert "in place" in rows[1]["reason"]
    assert rows[2]["reason"] == "not installed here"


def test_generation_rows_say_unsupported_configs(device):
    cfg = dataclasses.replace(TINY, layout="bshd", interleaved=True)
    r = C.run_case(cfg, ["ropelib_naive"], backward=False, device=device)[0]
    assert not r["available"]
    assert "sbhd only" in r["reason"] and "rotate-half only" in r["reason"]


def test_ulp_and_error_metrics():
    one = torch.tensor([1.0, -1.0, 3.0, 0.0], dtype=torch.float64)
    assert C.ulp(one, torch.bfloat16).tolist()[:3] == [2 ** -7, 2 ** -7, 2 ** -6]
    assert C.ulp(one, torch.float32)[0] == 2 ** -23
    assert C.ulp(one, torch.float32)[3] == torch.finfo(torch.float32).tiny * 2 ** -23
    ref = torch.linspace(-3, 3, 101, dtype=torch.float64)
    exact = ref.float()
    m = C.error_metrics(exact, ref)
    assert m["max_ulp_err"] <= 0.5 and m["max_abs_err"] <= 2 ** -23 * 2
    nudged = torch.nextafter(exact, torch.full_like(exact, math.inf))
    assert 0.5 <= C.error_metrics(nudged, ref)["max_ulp_err"] <= 1.5 + 1e-9
    with pytest.raises(ValueError, match="shape"):
        C.error_metrics(exact[:3], ref)


def test_head_ulp_error_measures_against_the_head_not_the_element():
    """An output near zero off by one fp32 ulp of its head's largest value: hundreds of ulps of
    its own value, one ulp of the head."""
    ref = torch.tensor([[1.0, 2 ** -10, -0.75, 0.5]], dtype=torch.float64)
    actual = ref.float().clone()
    actual[0, 1] += 2 ** -23                        # one fp32 ulp at 1.0 (the head's max)
    m = C.error_metrics(actual, ref)
    assert m["max_ulp_err"] > 100
    assert m["max_head_ulp_err"] == pytest.approx(1.0)
    rounded = C.error_metrics(ref.to(torch.bfloat16), ref)
    assert rounded["max_ulp_err"] <= 0.5 and rounded["max_head_ulp_err"] <= 0.5
    # each head is measured against its own largest value
    two = torch.stack([ref[0], 1000 * ref[0]])
    off = two.float().clone()
    off[0, 0] += 2 ** -22                            # two ulps of head 0; tiny next to head 1
    assert C.error_metrics(off, two)["max_head_ulp_err"] == pytest.approx(2.0)


def test_fused_kernel_rounds_once_and_fp32_is_within_a_few_head_ulps(device):
    for dtype, bound in (("bf16", 0.5 + 1e-3), ("fp16", 0.5 + 1e-3), ("fp32", 4.0)):
        cfg = dataclasses.replace(TINY, seq_len=64, dtype=dtype)
        r = C.run_case(cfg, ["ropelib"], backward=False, device=device)[0]
        assert r["available"], r["reason"]
        assert r["max_head_ulp_err"] <= bound, (dtype, r["max_head_ulp_err"])


def test_config_validation():
    with pytest.raises(ValueError, match="seq_len"):
        C.Config(0, 1, 1, 16)
    with pytest.raises(ValueError, match="dtype"):
        C.Config(4, 1, 1, 16, dtype="fp8")
    with pytest.raises(ValueError, match="layout"):
        C.Config(4, 1, 1, 16, layout="bhsd")
    with pytest.raises(ValueError, match="rotary_percent"):
        C.Config(4, 1, 1, 10, rotary_percent=0.3)
    with pytest.raises(TypeError, match="config"):
        C.run_case({"seq_len": 4}, ["pytorch"])
    with pytest.raises(ValueError, match="unknown provider"):
        C.run_case(TINY, ["nope"])


@pytest.mark.parametrize("cfg", [
    C.Config(6, 2, 3, 16, "fp32", layout="bshd", interleaved=True, rotary_percent=0.5,
             start_positions=True),
    C.Config(5, 2, 2, 8, "fp16", layout="thd", kv_heads=1),
])
def test_variants_run_with_small_errors(cfg, device):
    r = C.run_case(cfg, ["pytorch"], device=device)[0]
    assert r["available"], r["reason"]
    assert r["max_abs_err"] < (1e-5 if cfg.dtype == "fp32" else 1e-2)


def test_sweep_calls_on_row_and_writes_csv(tmp_path, device):
    seen = []
    rows = C.sweep(TINY, "seq_len", [2, 3], ["pytorch", "torch.compile"], progress="text",
                   on_row=seen.append, backward=False, device=device)
    assert rows == seen and len(rows) == 4
    assert [r["seq_len"] for r in rows] == [2, 2, 3, 3]
    meta = C.environment_meta()
    for k in ("gpu", "driver", "torch", "triton", "transformer_engine", "date", "mode",
              "revision", "ropelib_source"):
        assert k in meta
    path = C.write_csv(rows, tmp_path / "sweep.csv", meta=meta)
    back = C.read_csv(path)
    assert C.read_meta(path)["torch"] == torch.__version__
    assert len(back) == 4
    for a, b in zip(rows, back):
        for k in C.ROW_FIELDS:
            if isinstance(a[k], float):
                assert b[k] == pytest.approx(a[k]), k
            else:
                assert b[k] == a[k], k


def test_seed_sweeps_cover_the_seeds():
    names = {s.name for s in C.SEED_SWEEPS}
    for dtype in ("fp32", "bf16"):
        for b in (1, 2, 4, 8):
            s = next(s for s in C.SEED_SWEEPS if s.name == f"seq_len-b{b}-{dtype}")
            assert (s.base.heads, s.base.head_dim, s.base.batch, s.axis) == (64, 128, b, "seq_len")
    assert {"seq-bf16", "hidden-bf16", "heads-bf16", "batch-bf16"} <= names
    for s in C.SEED_SWEEPS:
        assert {"ropelib", "te_fused", "pytorch"} <= set(s.providers)
        tiny = C.shrink(s)
        assert tiny.axis == s.axis and len(tiny.values) <= 3 and tiny.base.heads <= 2


def test_declared_inplace_provider_is_timed_on_a_copy(device):
    def rotate_in_place(case):
        c = case.config
        y = reference.te_unfused(case.x, case.freqs, tensor_format=c.layout)
        return case.x.copy_(y) if not case.x.requires_grad else y
    prov = C.Provider("inplace-ok", True, "", rotate_in_place, inplace=True)
    case = C.make_case(TINY, device)
    r = C.run_case(TINY, [prov, "pytorch"], device=device)
    assert r[0]["available"], r[0]["reason"]
    assert r[0]["max_abs_err"] == pytest.approx(r[1]["max_abs_err"])   # same math, same inputs
    assert torch.equal(C.make_case(TINY, device).x, case.x)            # inputs are reproducible


def test_torch_compile_provider_recompiles_per_config(monkeypatch, device):
    # the provider's logic with Dynamo's eager backend (no C++ toolchain needed on the CPU)
    calls = []
    real_compile = torch.compile

    def eager_compile(fn, **kw):
        calls.append(kw)
        return real_compile(fn, backend="eager", **kw)
    monkeypatch.setattr(C.runtime, "on_gpu", lambda: True)
    monkeypatch.setattr(torch, "compile", eager_compile)
    prov = C._torch_compile()
    assert prov.available
    rows = C.sweep(TINY, "seq_len", [3, 5], [prov], progress=False, backward=False,
                   device=device)
    assert all(r["available"] for r in rows), [r["reason"] for r in rows]
    assert all(r["max_ulp_err"] < 64 for r in rows)
    assert len(calls) == 2 and all(kw.get("dynamic") is False for kw in calls)


@pytest.mark.slow
def test_seed_sweeps_script_runs_tiny(tmp_path):
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "seed_sweeps.py"
    mod = load_file("seed_sweeps", path)
    out = tmp_path / "seed.csv"
    assert mod.main(["--tiny", "--only", "seq_len-b2-bf16", "--out", str(out),
                     "--figures", str(tmp_path)]) == 0
    rows = C.read_csv(out)
    assert {r["sweep"] for r in rows} == {"seq_len-b2-bf16"}
    assert {r["provider"] for r in rows} >= {"pytorch"}
    assert C.read_meta(out)["torch"] == torch.__version__
    assert (tmp_path / "07-seed-seq-len-bf16.png").stat().st_size > 5000


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("kv_heads", [None, 1])
def test_torch_compile_provider_computes_hugging_faces_formula(layout, interleaved,
                                                               rotary_percent, start, kv_heads):
    """The torch.compile provider compiles Hugging Face's formula (tables in the input dtype):
    run here uncompiled, in fp32, it is RoPE to fp32 rounding in every configuration."""
    if layout == "thd" and start:
        pytest.skip("the benchmark has no start offsets for packed sequences")
    cfg = C.Config(seq_len=6, batch=2, heads=2, head_dim=8, dtype="fp32", layout=layout,
                   interleaved=interleaved, rotary_percent=rotary_percent,
                   start_positions=start, kv_heads=kv_heads)
    case = C.make_case(cfg, device="cpu")
    core, extra = C._hf_formula_core(case)
    got = core(case.x, case.k, *extra)
    got = got if isinstance(got, tuple) else (got,)
    for g, want in zip(got, C.reference_output(case)):
        torch.testing.assert_close(g.double(), want, rtol=1e-5, atol=1e-5)


def test_time_ms_and_output_tuple_on_the_cpu():
    """The timer every benchmark shares: (median, p20, p80) in ms; off CUDA a few wall-clock
    calls (meaningless numbers, but ordered and positive)."""
    calls = []
    med, p20, p80 = C.time_ms(lambda: calls.append(1), "cpu")
    assert 0 <= p20 <= med <= p80 and len(calls) >= 2
    C.sync("cpu")   # a no-op off CUDA
    x = torch.zeros(2)
    assert C.output_tuple(x) == (x,) and C.output_tuple((x, x)) == (x, x)



def test_time_in_rounds_takes_turns_and_keeps_failures_apart():
    """Every step runs once per round, in turn; a step that raises is left out of later rounds
    and its exception is its value; the others get (median, p20, p80)."""
    order = []

    def step(name):
        return lambda: order.append(name)

    def broken():
        order.append("broken")
        raise RuntimeError("no kernel")
    got = C.time_in_rounds({"a": step("a"), "broken": broken, "b": step("b")}, "cpu", rounds=3)
    assert isinstance(got["broken"], RuntimeError) and order.count("broken") == 1
    for name in "ab":
        med, p20, p80 = got[name]
        assert 0 <= p20 <= med <= p80
    # turns: within each round a's calls come before b's, and every round visits both
    firsts = [i for i, n in enumerate(order) if n == "a" and (i == 0 or order[i - 1] != "a")]
    assert len(firsts) == 3
    with pytest.raises(ValueError, match="rounds"):
        C.time_in_rounds({"a": step("a")}, "cpu", rounds=0)


def test_a_timed_forward_backward_hands_its_gradients_back():
    """fwdbwd_step returns the gradients and leaves .grad alone: repeated calls (as in a CUDA
    graph's replay, where nothing resets .grad) do not add a summing pass, and give the same
    gradients every time."""
    x = torch.randn(3, 4, requires_grad=True)
    g = torch.randn(3, 4)
    step = C.fwdbwd_step(lambda: (x * 2,), [x], [g])
    first, = step()
    second, = step()
    assert x.grad is None
    torch.testing.assert_close(first, 2 * g)
    torch.testing.assert_close(second, first)


def test_run_case_times_forward_backward_in_rounds_with_the_copy():
    """The forward+backward column comes from the rounds: every provider that ran has it, with
    the copy's time of the same rounds, and its ratio is that copy's over its own."""
    rows = C.run_case(TINY, ["ropelib", "pytorch"], device="cpu", rounds=2)
    for r in rows:
        assert r["available"], r["reason"]
        assert r["fwdbwd_ms"] > 0 and r["copy_fwdbwd_ms"] > 0
        assert r["fwdbwd_ms_p20"] <= r["fwdbwd_ms"] <= r["fwdbwd_ms_p80"]
        assert r["ratio_fwdbwd"] == pytest.approx(r["copy_fwdbwd_ms"] / r["fwdbwd_ms"])


def test_environment_meta_names_the_code_it_measured(monkeypatch, tmp_path):
    """The source hash is the same from one call to the next and changes with any .py file under
    the package; the revision is git's commit, ROPELIB_REVISION where set, "unknown" without git."""
    first, again = C.source_sha(), C.source_sha()
    assert first == again and re.fullmatch(r"[0-9a-f]{12}", first)
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    before = C.source_sha(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert C.source_sha(tmp_path) != before
    monkeypatch.setenv("ROPELIB_REVISION", "abc123 (given)")
    assert C.environment_meta()["revision"] == "abc123 (given)"
    monkeypatch.delenv("ROPELIB_REVISION")
    revision = C.source_revision()
    assert revision == "unknown" or re.fullmatch(r"[0-9a-f]{12}(\+modified)?", revision)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")
    monkeypatch.setattr(C.subprocess, "run", no_git)
    assert C.source_revision() == "unknown"


def test_rounds_visit_every_step_once_and_can_shuffle_their_order(monkeypatch):
    """Every round times every step once; in the shuffled order a step has other neighbours from
    round to round (fixed: always the same one before it), the same for the same round."""
    names = ["copy", "ropelib", "torch.compile", "te_fused"]
    before = {}
    for r in range(7):
        for order in ("fixed", "shuffled"):
            got = C.round_order(names, r, order)
            assert sorted(got) == sorted(names)
            i = got.index("te_fused")
            before.setdefault(order, set()).add(got[i - 1] if i else None)
    assert before["fixed"] == {"torch.compile"} and len(before["shuffled"]) >= 3
    assert C.round_order(names, 3, "shuffled") == C.round_order(names, 3, "shuffled")
    with pytest.raises(ValueError, match="order must be"):
        C.round_order(names, 0, "random")
    seen = []
    monkeypatch.setattr(C, "ROUNDS_ORDER", "shuffled")
    monkeypatch.setattr(C, "time_ms", lambda fn, device: (fn(), 0.0, 0.0))
    steps = {name: (lambda name=name: seen.append(name) or 1.0) for name in names}
    timed = C.time_in_rounds(steps, "cpu", rounds=3)
    assert set(timed) == set(names) and sorted(seen) == sorted(names * 3)
    assert seen[:4] == C.round_order(names, 0, "shuffled")
    assert C.environment_meta()["rounds_order"] == "shuffled"


def test_shuffled_rounds_repeat_by_seed_and_differ_across_seeds(monkeypatch):
    """Runs with the same seed visit the same orders (seed 0: those of the runs before seeds);
    another seed gives other orders, and the header records the seed of a shuffled run."""
    import random
    names = [f"v{i}" for i in range(9)]
    seed0 = [C.round_order(names, r, "shuffled", seed=0) for r in range(7)]
    for r, got in enumerate(seed0):
        want = list(names)
        random.Random(r).shuffle(want)
        assert got == want
    seed1 = [C.round_order(names, r, "shuffled", seed=1) for r in range(7)]
    assert seed1 == [C.round_order(names, r, "shuffled", seed=1) for r in range(7)]
    assert seed1 != seed0 and all(sorted(o) == names for o in seed1)
    assert C.round_order(names, 2, "fixed", seed=5) == names
    monkeypatch.setattr(C, "ROUNDS_ORDER", "shuffled")
    monkeypatch.setattr(C, "ROUNDS_SEED", 4)
    assert C.round_order(names, 3) == C.round_order(names, 3, "shuffled", seed=4)
    meta = C.environment_meta()
    assert (meta["rounds_order"], meta["rounds_seed"]) == ("shuffled", "4")
    monkeypatch.setattr(C, "ROUNDS_ORDER", "fixed")
    assert "rounds_seed" not in C.environment_meta()


def test_times_in_rounds_takes_an_order_of_its_own(monkeypatch):
    """A caller (a notebook's live timing) can ask for shuffled rounds whatever the run's order
    is: every round times every name once, in round_order's order for that order and seed."""
    monkeypatch.setattr(C, "ROUNDS_ORDER", "fixed")
    names = [f"v{i}" for i in range(5)]
    seen = []
    times = C.times_in_rounds(names, 3, lambda n: seen.append(n) or float(len(seen)),
                              order="shuffled", seed=2)
    assert seen == [n for r in range(3) for n in C.round_order(names, r, "shuffled", seed=2)]
    assert {n: len(t) for n, t in times.items()} == {n: 3 for n in names}
    fixed = []                            # without them, the run's order (fixed here)
    C.times_in_rounds(names, 2, lambda n: fixed.append(n) or 0.0)
    assert fixed == names * 2
