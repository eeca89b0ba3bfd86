"""The benchmark suite (ropelib/bench/suite.py) and its figure script (benchmarks/plot.py).

On the CPU the quick suite runs end to end in Triton's interpreter on tiny shapes (its timings
mean nothing; the CSV's fields, the error columns and the plumbing do). The target checker is
tested on SYNTHETIC rows built here: made-up timings chosen to sit on each side of every
performance bar, never presented as measurements.
"""
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib.bench import compare  # noqa: E402
from ropelib.bench import suite as bench  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
META_KEYS = ("gpu", "driver", "torch", "triton", "transformer_engine", "date")
# providers for the CPU run: the finished kernel, plain PyTorch, and two that cannot run on a
# CPU (their rows must still be there, with the reason)
QUICK_PROVIDERS = ("ropelib", "pytorch", "te_fused", "torch.compile")
REL_TOL = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}  # a few units in the last place


def _load_plot():
    spec = importlib.util.spec_from_file_location("bench_plot", REPO / "benchmarks" / "plot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plot = _load_plot()


# --- the quick suite on the CPU ----------------------------------------------------------

@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`python -m ropelib.bench --suite quick` in a subprocess: (csv path, stdout)."""
    out = tmp_path_factory.mktemp("bench") / "quick.csv"
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "ropelib.bench", "--suite", "quick", "--out", str(out),
         "--providers", ",".join(QUICK_PROVIDERS)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_quick_suite_writes_every_field(quick_run):
    path, stdout = quick_run
    rows = compare.read_csv(path)
    meta = compare.read_meta(path)
    cases = bench.suite_cases("quick")
    # one row per (case, provider): cases in suite order, providers in compare's order
    order = [p for p in compare.PROVIDER_NAMES if p in QUICK_PROVIDERS]
    assert [(r["case"], r["provider"]) for r in rows] == [(c.name, p) for c in cases for p in order]
    header = path.read_text().splitlines()[len(meta)].split(",")
    for f in (compare.ROW_FIELDS + bench.GRAPH_FIELDS + bench.GRAPH_FWDBWD_FIELDS
              + bench.HOST_FIELDS + ("case", "group", "suite", "tensor_mib")):
        assert f in header, f
    for k in META_KEYS:
        assert meta.get(k), k
    assert meta["suite"] == "quick"
    for r in rows:
        c = next(c for c in cases if c.name == r["case"])
        assert r["tensor_mib"] == pytest.approx(bench.config_bytes(c.config) / MiB, abs=1e-3)
        if r["provider"] in ("ropelib", "pytorch"):
            assert r["available"] is True, r["reason"]
            for f in ("fwd_ms", "fwd_ms_p20", "fwd_ms_p80", "fwdbwd_ms", "copy_fwd_ms",
                      "copy_fwdbwd_ms", "ratio_fwd", "ratio_fwdbwd", "fwd_gbps"):
                assert isinstance(r[f], float) and math.isfinite(r[f]) and r[f] > 0, (f, r)
            assert r["fwd_ms_p20"] <= r["fwd_ms"] <= r["fwd_ms_p80"]
            assert r["ratio_fwd"] == pytest.approx(r["copy_fwd_ms"] / r["fwd_ms"])
            assert math.isfinite(r["max_ulp_err"])
            if r["provider"] == "ropelib":  # fp32 math, one rounding to the output dtype
                assert r["max_rel_err"] <= REL_TOL[r["dtype"]], r
        if not torch.cuda.is_available():
            assert r["timing"] == compare.TIMING_CPU  # labelled meaningless
            if r["provider"] in ("te_fused", "torch.compile"):
                assert r["available"] is False and r["reason"]
    graph = [r for r in rows if r["case"].startswith("quick-decode")]
    assert graph
    if torch.cuda.is_available():  # ropelib's decode call must be capturable in a CUDA graph
        me = next(r for r in graph if r["provider"] == "ropelib")
        assert me["graph_fwd_ms"] > 0 and me["graph_copy_fwd_ms"] > 0, me["graph_reason"]
    else:  # no GPU: each row says why there is no number
        assert all(r["graph_reason"] and r["graph_fwd_ms"] is None for r in graph)
        assert all(r["host_reason"] and r["host_fwd_us"] is None for r in graph)
        qk = [r for r in rows if r["case"].startswith("quick-qk")]
        assert all(r["graph_fwdbwd_reason"] and r["graph_fwdbwd_ms"] is None for r in qk)
    assert "bars cleared?" in stdout and "quick-qk-" in stdout


def test_default_out_is_where_the_user_is():
    """An installed package writes where it is told, or in the current directory, never into
    a source tree it happens to sit in; interpreter runs go to a temp dir."""
    p = bench.default_out("targets", {"gpu": "NVIDIA H100 80GB HBM3"})
    if torch.cuda.is_available():
        assert p.parent == Path.cwd()
    else:
        assert p.name.startswith("targets-nvidia-h100-80gb-hbm3-")
        assert Path(bench.tempfile.gettempdir()) in p.parents
    assert bench._slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_out_may_name_a_folder(tmp_path):
    meta = {"gpu": "NVIDIA H200"}
    assert bench.out_path(str(tmp_path), "decode", meta).parent == tmp_path
    assert bench.out_path(str(tmp_path / "new") + "/", "decode", meta).parent == tmp_path / "new"
    assert bench.out_path(str(tmp_path / "x.csv"), "decode", meta) == tmp_path / "x.csv"


def test_model_suite_rows_and_summary():
    """The model suite's plumbing on a tiny GPT, eagerly (the real run compiles on a GPU)."""
    rows = bench.model_suite(steps=3, batch_size=2, block_size=16, n_layer=1, n_head=2,
                             n_embd=32, compile=False, device="cpu")
    assert [(r["provider"], r["step"]) for r in rows] == \
        [(impl, s) for impl in bench.MODEL_IMPLS for s in (1, 2, 3)]
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    text = bench.model_summary(rows)
    assert "largest loss difference over 3 steps" in text and "ropelib" in text


def test_cli_rejects_bad_arguments(capsys):
    for argv, msg in ((["--dtype", "fp8", "--list"], "dtype"),
                      (["--providers", "nope"], "providers"),
                      (["--cases", "no-such-case", "--list"], "matches no case"),
                      (["--graph-calls", "0", "--list"], "graph-calls")):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            bench.main(["--suite", "targets"])  # full sizes need a GPU
        assert "needs a CUDA GPU" in capsys.readouterr().err


# --- the figure script --------------------------------------------------------------------

def _is_png(p: Path) -> bool:
    return p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_plot_draws_the_quick_csv(quick_run, tmp_path, capsys):
    path, _ = quick_run
    figs, md = tmp_path / "figs", tmp_path / "headline.md"
    argv = ["--csv", str(path), "--figures", str(figs), "--headline", str(md)]
    assert plot.main(argv) == 2  # interpreter timings are refused by default ...
    assert "meaningless" in capsys.readouterr().err
    assert plot.main(argv + ["--allow-interpreter"]) == 0  # ... and drawn, labelled, on request
    assert _is_png(figs / "perf-ratio.png") and _is_png(figs / "perf-decode.png")
    text = md.read_text()
    assert "| case |" in text and "quick-bf16-sbhd-rotate-half" in text
    assert "MEANINGLESS" in text
    d = plot.load(path)
    assert d["interpreter"] and d["suite"] == "quick"
    assert _is_png(plot.plot_seed(d, tmp_path / "seed.png"))  # the GB/s-vs-seq figure too


def test_plot_fails_clearly_without_csv(tmp_path, capsys):
    assert plot.main(["--results", str(tmp_path / "empty"), "--figures", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no CSV" in err and "python -m ropelib.bench" in err
    assert plot.main(["--csv", str(tmp_path / "absent.csv"), "--figures", str(tmp_path)]) == 2
    assert "no such CSV" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert plot.main(["--csv", str(bad), "--figures", str(tmp_path)]) == 2
    assert "not a ropelib.bench CSV" in capsys.readouterr().err


# --- case design ----------------------------------------------------------------------------

def test_targets_suite_covers_every_bar():
    cases = bench.suite_cases("targets")
    assert len({c.name for c in cases}) == len(cases)
    large = [c.config for c in cases if c.group in ("large", "qk", "reference")]
    for cfg in large:  # >= 256 MiB (the target's threshold) and not more than 1 GiB
        assert 256 * MiB <= bench.config_bytes(cfg) <= 1024 * MiB, cfg
    plain = [c for c in large if c.kv_heads is None]
    pairs = lambda f, g: {(f(c), g(c)) for c in plain}  # noqa: E731
    mode = lambda c: (c.interleaved, c.rotary_percent)  # noqa: E731
    dt, lay = (lambda c: c.dtype), (lambda c: c.layout)
    assert pairs(dt, lay) == {(d, l) for d in bench.DTYPES for l in bench.LAYOUTS}
    assert pairs(dt, mode) == {(d, m) for d in bench.DTYPES for m in bench.MODES}
    assert pairs(lay, mode) == {(l, m) for l in bench.LAYOUTS for m in bench.MODES}
    qk = [c for c in large if c.kv_heads is not None]
    assert {c.dtype for c in qk} == set(bench.DTYPES) and {c.layout for c in qk} == set(bench.LAYOUTS)
    ref = [c.config for c in cases if c.group == "reference"]
    assert [(r.seq_len, r.batch, r.heads, r.head_dim, r.dtype, r.layout) for r in ref] == \
        [(16384, 8, 32, 128, "bf16", "sbhd")]
    mid = [c for c in cases if c.group == "64mib"]
    assert mid and all(bench.config_bytes(c.config) == 64 * MiB and c.config.seq_len == 1024
                       and c.graph_fwdbwd for c in mid)
    dec = [c for c in cases if c.group == "decode"]
    assert dec and all(c.graph and c.host and (c.config.seq_len, c.config.batch, c.config.heads,
                                               c.config.head_dim) == (1, 64, 32, 128) for c in dec)
    assert {c.config.layout for c in dec} == set(bench.LAYOUTS)
    assert any(c.config.start_positions for c in dec)   # the KV-cache decode
    full = bench.suite_cases("targets", full_matrix=True)
    assert len([c for c in full if c.group == "large"]) == 3 * 3 * 4
    assert {c.config.dtype for c in bench.suite_cases("targets", ["fp16"])} == {"fp16"}


def test_sweep_suite():
    cfgs = [c.config for c in bench.suite_cases("sweep")]
    assert {(c.heads, c.head_dim, c.dtype, c.layout) for c in cfgs} == {(64, 128, "fp32", "sbhd")}
    assert sorted({c.batch for c in cfgs}) == [1, 2, 4, 8]
    seqs = sorted({c.seq_len for c in cfgs})
    assert seqs[0] == 256 and seqs[-1] == 3968 and len(seqs) == 30
    assert len(cfgs) == 4 * 30
    with pytest.raises(ValueError, match="suite"):
        bench.suite_cases("nope")
    with pytest.raises(ValueError, match="dtype"):
        bench.suite_cases("sweep", ["fp64"])


# --- the checker of the performance bars, on SYNTHETIC rows ---------------------------------

def synth(provider, fwd, fwdbwd=None, *, copy=1.0, copy_bwd=2.0, seq_len=4096, batch=8, heads=32,
          head_dim=128, dtype="bf16", layout="sbhd", kv_heads=None, available=True, reason="",
          graph=None, graph_fwdbwd_ratio=None, host=None, case="synthetic"):
    """A made-up result row (times in ms) shaped like compare.run_case's. Not a measurement."""
    return {
        "case": case, "provider": provider, "available": available, "reason": reason,
        "seq_len": seq_len, "batch": batch, "heads": heads, "head_dim": head_dim,
        "dtype": dtype, "layout": layout, "interleaved": False, "rotary_percent": 1.0,
        "kv_heads": kv_heads,
        "fwd_ms": fwd if available else None,
        "fwdbwd_ms": fwdbwd if available else None,
        "copy_fwd_ms": copy, "copy_fwdbwd_ms": copy_bwd if fwdbwd is not None else None,
        "ratio_fwd": copy / fwd if available else None,
        "ratio_fwdbwd": copy_bwd / fwdbwd if (available and fwdbwd) else None,
        "graph_fwd_ms": graph,
        "graph_ratio_fwdbwd": graph_fwdbwd_ratio,
        "host_fwd_us": host[0] if host else None,
        "host_fwdbwd_us": host[1] if host else None,
    }


def case_rows(me_fwd, me_bwd, te=(1.95, 3.9), tc=(1.05, 2.2), **kw):
    rows = [synth("ropelib", me_fwd, me_bwd, **kw)]
    if te is not None:
        rows.append(synth("te_fused", te[0], te[1], **kw))
    if tc is not None:
        rows.append(synth("torch.compile", tc[0], tc[1], **kw))
    return rows


def verdict_of(rows):
    return bench.verdict(bench.checks_for_case(rows))


def missed(rows):
    return {c["target"] for c in bench.checks_for_case(rows) if c["ok"] is False}


def test_checker_large_case():
    assert bench.row_bytes(synth("ropelib", 1.0)) == 256 * MiB
    assert verdict_of(case_rows(1.02, 2.08)) == "yes"          # 0.98 / 0.96
    assert verdict_of(case_rows(1.0, 1.0, copy=0.97, copy_bwd=0.95)) == "yes"  # on the bars
    assert missed(case_rows(1 / 0.96, 2.08)) == {"ratio fwd >= 0.97"}
    assert missed(case_rows(1.02, 2 / 0.94)) == {"ratio fwd+bwd >= 0.95"}
    # TE is a comparison here, not a bar: any TE speed leaves the verdict alone
    assert verdict_of(case_rows(1.02, 2.08, te=(1.0, 2.0))) == "yes"
    # torch.compile faster than ropelib fails even when the ratios pass
    assert missed(case_rows(1.02, 2.08, tc=(1.01, 2.3))) == {"fwd <= torch.compile"}
    assert missed(case_rows(1.02, 2.08, tc=(1.1, 2.0))) == {"fwd+bwd <= torch.compile"}


def test_checker_thresholds_follow_size():
    # 1024 tokens x 8 x 32 x 128 bf16 = 64 MiB: fwd+bwd >= 0.85, eager and under graphs
    mid = dict(seq_len=1024, te=(1.3, 2.6), tc=(1.3, 2.6))
    assert bench.row_bytes(synth("ropelib", 1.0, seq_len=1024)) == 64 * MiB
    assert verdict_of(case_rows(1.0, 1.0, copy=0.85, copy_bwd=0.85, **mid)) == "yes"
    assert missed(case_rows(1 / 0.5, 2 / 0.84, **mid)) == {"ratio fwd+bwd >= 0.85"}
    graphs = case_rows(1.0, 2 / 0.9, graph_fwdbwd_ratio=0.8, **mid)
    assert missed(graphs) == {"graph fwd+bwd >= 0.85"}
    assert missed(case_rows(1 / 0.9, 2 / 0.9, te=(2.5, 5.0), tc=(2.5, 5.0))) == {
        "ratio fwd >= 0.97", "ratio fwd+bwd >= 0.95"}  # 0.90 is enough at 64 MiB, not at 256
    # below 64 MiB and not decode: no bar applies
    assert bench.checks_for_case(case_rows(5.0, 10.0, seq_len=16, tc=(6.0, 11.0))) == []
    # Q+K: q (32 heads) and k (8 heads) together: 2048 tokens x 8 x 40 x 128 bf16 = 160 MiB
    assert bench.row_bytes(synth("ropelib", 1.0, seq_len=2048, kv_heads=8)) == 160 * MiB


def test_checker_decode_host_cost_and_graphs():
    dec = dict(seq_len=1, batch=64, copy=0.0047, copy_bwd=0.0094)
    ok = [synth("ropelib", 0.008, 0.02, graph=0.005, host=(20.0, 140.0), **dec),
          synth("te_fused", 0.0094, 0.02, graph=0.006, host=(28.0, 150.0), **dec),
          synth("torch.compile", 0.046, 0.1, graph=0.0055, **dec)]
    assert verdict_of(ok) == "yes"
    assert {c["target"] for c in bench.checks_for_case(ok)} == {
        "host fwd <= TE fused", "host fwd+bwd <= TE fused", "graph fwd <= torch.compile"}
    slow_graph = [dict(r) for r in ok]
    slow_graph[0]["graph_fwd_ms"] = 0.006
    assert missed(slow_graph) == {"graph fwd <= torch.compile"}
    slow_host = [dict(r) for r in ok]
    slow_host[0]["host_fwdbwd_us"] = 160.0
    assert missed(slow_host) == {"host fwd+bwd <= TE fused"}
    no_te = [ok[0], ok[2]]   # TE not installed: its comparison is unmeasured, not passed
    assert verdict_of(no_te) == "partial"


def test_checker_missing_providers():
    # torch.compile does not run thd: the case is "partial", and the reason is kept
    rows = case_rows(1.02, 2.08, tc=None, layout="thd")
    rows.append(synth("torch.compile", None, available=False, layout="thd",
                      reason="thd is not compiled (per-sequence Python loop)"))
    checks = bench.checks_for_case(rows)
    assert bench.verdict(checks) == "partial"
    assert any("thd is not compiled" in c["why"] for c in checks if c["ok"] is None)
    # a failure still wins over missing data
    rows[0] = synth("ropelib", 1.1, 2.08, layout="thd")
    assert verdict_of(rows) == "NO"
    # no ropelib row, or ropelib not available: nothing can be checked
    assert verdict_of(case_rows(1.0, 2.0)[1:]) == "unchecked"
    assert verdict_of([synth("ropelib", None, available=False, reason="x")]) == "unchecked"
    # torch.compile not there: the large case's comparison is unmeasured, not passed
    assert verdict_of(case_rows(1.02, 2.08, tc=None)) == "partial"


def test_summary_and_csv_round_trip(tmp_path):
    rows = (case_rows(1.02, 2.08, case="a-large")
            + case_rows(1 / 0.9, 2.5, case="b-large-miss")
            + case_rows(1.02, None, case="c-fwd-only"))
    path = tmp_path / "synthetic.csv"
    compare.write_csv(rows, path, meta={"suite": "synthetic"})
    back = compare.read_csv(path)  # strings parsed back: same verdicts
    for rs in (rows, back):
        s = bench.summarize(rs)
        me = {x["case"]: x for x in s if x["provider"] == "ropelib"}
        assert [me[c]["target"] for c in ("a-large", "b-large-miss", "c-fwd-only")] == \
            ["yes", "NO", "yes"]
        assert "ratio fwd >= 0.97: 0.900" in me["b-large-miss"]["missed"]
        te = next(x for x in s if x["case"] == "a-large" and x["provider"] == "te_fused")
        assert te["vs_te_fwd"] == pytest.approx(1.0) and te["target"] == ""
        assert me["a-large"]["vs_te_fwd"] == pytest.approx(1.95 / 1.02)
        assert me["a-large"]["vs_compile_fwd"] == pytest.approx(1.05 / 1.02)
        table = bench.format_summary(s)
        assert table.splitlines()[0].split()[:2] == ["case", "provider"]
        assert "NO  [ratio fwd >= 0.97: 0.900" in table
        assert bench.verdict_counts(s) == {"yes": 2, "NO": 1}
    md = plot.headline({"rows": back, "suite": "synthetic", "path": path,
                        "meta": {"gpu": "SYNTHETIC"}, "interpreter": False})
    assert "| a-large |" in md and "b-large-miss" in md and "NO" in md


# --- GPU only ------------------------------------------------------------------------------

@pytest.mark.gpu
def test_graph_replay_times_a_copy():
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    med, p20, p80 = bench.graph_replay_ms(lambda: y.copy_(x), calls=20)
    assert 0 < p20 <= med <= p80 < 1.0  # a 4 MiB copy takes microseconds, not milliseconds
    torch.testing.assert_close(y, x)


@pytest.mark.gpu
def test_graph_timings_for_real_providers():
    case = next(c for c in bench.suite_cases("decode") if c.config.layout == "bshd")
    provs = bench.select_providers(["ropelib", "torch.compile", "pytorch"])
    rows = compare.run_case(case.config, provs, backward=False, device="cuda")
    bench.add_graph_timings(case, rows, provs, calls=10)
    by = {r["provider"]: r for r in rows}
    assert by["ropelib"]["graph_fwd_ms"] > 0, by["ropelib"]["graph_reason"]
    assert by["ropelib"]["graph_ratio_fwd"] == pytest.approx(
        by["ropelib"]["graph_copy_fwd_ms"] / by["ropelib"]["graph_fwd_ms"])
    assert by["pytorch"]["graph_fwd_ms"] is None and "not timed" in by["pytorch"]["graph_reason"]
