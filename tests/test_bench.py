"""The benchmark suite (ropelib/bench/suite.py), its figure script (benchmarks/plot.py), the
floor suite (ropelib/bench/floor.py) and the README's table drawn from its CSVs
(ropelib/bench/readme_table.py).

On the CPU the quick and floor suites run end to end in Triton's interpreter on tiny shapes
(their timings mean nothing; the CSV's fields, the error columns and the plumbing do). The
target checker and the README table are tested on SYNTHETIC rows built here: made-up timings
chosen to sit on each side of every performance bar, never presented as measurements; the
README's committed table is checked against the committed floor CSVs.
"""
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib.bench import compare  # noqa: E402
from ropelib.bench import floor, readme_table  # noqa: E402
from ropelib.bench import suite as bench  # noqa: E402
from ropelib.bench import cli  # noqa: E402
from loading import load_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
META_KEYS = ("gpu", "driver", "torch", "triton", "transformer_engine", "date")
# providers for the CPU run: the finished kernel, plain PyTorch, and two that cannot run on a
# CPU (their rows must still be there, with the reason)
QUICK_PROVIDERS = ("ropelib", "pytorch", "te_fused", "torch.compile")
REL_TOL = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}  # a few units in the last place


def _load_plot():
    mod = load_file("bench_plot", REPO / "benchmarks" / "plot.py")
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
    assert compare.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_out_may_name_a_folder(tmp_path):
    meta = {"gpu": "NVIDIA H200"}
    assert bench.out_path(str(tmp_path), "decode", meta).parent == tmp_path
    assert bench.out_path(str(tmp_path / "new") + "/", "decode", meta).parent == tmp_path / "new"
    assert bench.out_path(str(tmp_path / "x.csv"), "decode", meta) == tmp_path / "x.csv"


def test_model_suite_rows_and_summary():
    """The model step benchmark's plumbing on a tiny GPT, eagerly (the real run compiles on a
    GPU)."""
    from ropelib.course import model_step
    rows = model_step.model_suite(steps=3, batch_size=2, block_size=16, n_layer=1, n_head=2,
                             n_embd=32, compile=False, device="cpu")
    assert [(r["provider"], r["step"]) for r in rows] == \
        [(impl, s) for impl in model_step.MODEL_IMPLS for s in (1, 2, 3)]
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    text = model_step.model_summary(rows)
    assert "largest loss difference over 3 steps" in text and "ropelib" in text


def test_cli_rejects_bad_arguments(capsys):
    for argv, msg in ((["--dtype", "fp8", "--list"], "dtype"),
                      (["--providers", "nope"], "providers"),
                      (["--cases", "no-such-case", "--list"], "matches no case"),
                      (["--graph-calls", "0", "--list"], "graph-calls")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            cli.main(["--suite", "targets"])  # full sizes need a GPU
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


# --- the floor suite on the CPU ------------------------------------------------------------

# the plain RoPE rows' providers on the CPU: the teaching kernels left out (slow in the
# interpreter), three that cannot run there (their skipped lines must say why)
FLOOR_PROVIDERS = ("ropelib", "pytorch", "te_fused", "torch.compile", "liger")


@pytest.fixture(scope="module")
def floor_run(tmp_path_factory):
    """`python -m ropelib.bench --suite floor` in a subprocess: (csv path, stdout)."""
    out = tmp_path_factory.mktemp("floor") / "floor.csv"
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-m", "ropelib.bench", "--suite", "floor",
                           "--out", str(out), "--providers", ",".join(FLOOR_PROVIDERS)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_floor_suite_writes_every_row(floor_run):
    path, stdout = floor_run
    result = floor.read(path)     # raises unless the columns are exactly floor.FIELDS
    assert path.read_text().splitlines()[len(result.meta) + len(result.skipped)] == \
        "case,provider,ms,ratio_to_copy"
    for k in META_KEYS + ("suite", "sizes", "timing", "ratio_to_copy", "host_rows",
                          "graph_rows", "providers", "elapsed_s"):
        assert result.meta.get(k), k
    assert result.meta["suite"] == "floor"
    keys = [(r["case"], r["provider"]) for r in result.rows]
    assert len(keys) == len(set(keys))               # one row per (case, provider)
    names = floor.case_names()
    assert list(dict.fromkeys(r["case"] for r in result.rows)) == names   # every row, in order
    for name in names:
        by = {r["provider"]: r for r in result.rows if r["case"] == name}
        assert by[floor.COPY]["ratio_to_copy"] == 1.0, name
        assert by["ropelib"]["ms"] > 0 and by["ropelib"]["ratio_to_copy"] > 0, name
        if floor.is_host_case(name):       # host rows: a provider other than ropelib too
            assert "pytorch" in by, name
    assert all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in result.rows)
    features = [n for n in names if n.startswith(("multi-axis", "QK-RMSNorm"))]
    for name in features:              # transformers' code / plain PyTorch, compiled and eager
        assert {"torch.compile", "pytorch"} & {r["provider"] for r in result.rows
                                               if r["case"] == name}, name
    if not torch.cuda.is_available():
        assert "MEANINGLESS" in result.meta["timing"] and "tiny" in result.meta["sizes"]
        # a provider that cannot run gets no row, and a skipped line says why
        assert any(line.startswith("torch.compile in ") and "interpreter mode" in line
                   for line in result.skipped), result.skipped
        assert any(line.startswith("te_fused in all ") for line in result.skipped)
        assert not any(r["provider"] in ("te_fused", "liger") for r in result.rows)
        # about 20 s of CPU time; the bound leaves room for a machine busy with other tests
        assert int(result.meta["elapsed_s"]) < 120
    assert "forward 1 GiB bf16 sbhd: copy 1.000" in stdout


def _size_of_label(label: str) -> int:
    value, unit = label.split()[:2]
    return int(value) << {"GiB": 30, "MiB": 20}[unit]


def test_floor_cases_are_the_sizes_their_names_say():
    full, tiny = floor.rope_cases(), floor.rope_cases(tiny=True)
    assert [c.name for c in full] == [c.name for c in tiny]
    for c, t in zip(full, tiny):
        cfg = c.config
        if c.host:     # decode: one token for 64 sequences, 32 heads of 128
            assert (cfg.seq_len, cfg.batch, cfg.heads, cfg.head_dim) == (1, 64, 32, 128)
            assert cfg.layout == c.name.split()[0]
            assert cfg.start_positions == c.name.endswith("start positions")
        else:
            assert bench.config_bytes(cfg) == _size_of_label(c.name), c.name
            assert (cfg.heads, cfg.head_dim) == (32, 128)
            assert cfg.dtype == c.name.split()[2] and cfg.layout == c.name.split()[3]
            assert cfg.interleaved == c.name.endswith("interleaved")
            assert c.graph_fwdbwd == c.name.startswith("64 MiB")
        for f in ("dtype", "layout", "interleaved", "start_positions"):   # same paths, tiny
            assert getattr(t.config, f) == getattr(cfg, f)
        assert bench.config_bytes(t.config) < 4096
    by_name = {c.name: c.config for c in full}
    assert (by_name["1 GiB bf16 sbhd"].seq_len, by_name["1 GiB bf16 sbhd"].batch) == (16384, 8)
    assert by_name["2 GiB fp32 sbhd"].seq_len == 16384
    assert (by_name["128 MiB bf16 sbhd"].seq_len, by_name["128 MiB bf16 sbhd"].batch) == (16384, 1)
    assert {c.config.layout for c in full if c.name.startswith("64 MiB")} == set(bench.LAYOUTS)
    # the features at the sizes their names say
    from ropelib.bench import multi_axis, qk_norm_rope
    assert multi_axis.CASES["mrope"][:6] == ("bshd", 4, 8192, 28, 4, 128)
    assert qk_norm_rope.SHAPE == dict(B=8, S=4096, HQ=32, HK=8, D=128)
    assert floor.KV_CACHE_CASE.format(cache="paged", dtype="bf16").startswith(
        "RoPE + KV-cache write decode b64 paged bf16")


def test_floor_cli_lists_and_refuses_what_does_not_apply(capsys):
    assert cli.main(["--suite", "floor", "--list"]) == 0
    out = capsys.readouterr().out
    for name in floor.case_names():
        assert f"    {name}\n" in out
    assert cli.main(["--suite", "floor", "--list", "--cases", "^QK"]) == 0
    assert "1 parts, 2 row names" in capsys.readouterr().out
    for argv, msg in ((["--dtype", "fp32"], "--dtype does not apply"),
                      (["--fwd-only"], "--fwd-only does not apply"),
                      (["--cases", "no-such-row", "--list"], "matches no row")):
        with pytest.raises(SystemExit) as e:
            cli.main(["--suite", "floor"] + argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
    assert bench.default_out("floor", {"gpu": "NVIDIA H200"}).name == "floor-nvidia-h200.csv"


def test_floor_rows_from_synthetic_wide_rows():
    """rope_rows turns run_case's rows (one per provider) into one row per (row, provider)."""
    case = next(c for c in floor.rope_cases() if c.host)
    wide = [dict(provider="ropelib", available=True, reason="", host_fwd_us=20.0,
                 host_fwdbwd_us=140.0, host_copy_fwd_us=10.0, host_copy_fwdbwd_us=20.0,
                 graph_fwd_ms=0.0025, graph_copy_fwd_ms=0.002, graph_reason="", host_reason=""),
            dict(provider="te_fused", available=False, reason="not installed"),
            dict(provider="pytorch", available=True, reason="", host_fwd_us=40.0,
                 host_fwdbwd_us=None, host_copy_fwd_us=10.0, host_copy_fwdbwd_us=20.0,
                 graph_fwd_ms=None, host_reason="failed: RuntimeError: x", graph_reason="")]
    m = floor.rope_rows(case, wide)
    host_fwd, host_bwd, graphs = floor.rope_case_names(case)
    got = {(r["case"], r["provider"]): (r["ms"], r["ratio_to_copy"]) for r in m.rows}
    assert got[(host_fwd, "copy")] == (pytest.approx(0.010), 1.0)
    assert got[(host_fwd, "ropelib")] == (pytest.approx(0.020), pytest.approx(0.5))
    assert got[(host_bwd, "ropelib")] == (pytest.approx(0.140), pytest.approx(20 / 140))
    assert got[(graphs, "ropelib")] == (0.0025, pytest.approx(0.8))
    assert (graphs, "pytorch") not in got       # not timed under graphs by design: no line
    assert (host_bwd, "pytorch") not in got
    assert (host_bwd, "pytorch", "failed: RuntimeError: x") in m.skipped
    assert (host_fwd, "te_fused", "not installed") in m.skipped
    lines = floor.skipped_lines(m)
    assert "te_fused in all 3 rows it was tried in: not installed" in lines   # graphs too
    assert f"pytorch in {host_bwd}: failed: RuntimeError: x" in lines
    # a device case: a forward that ran before its backward failed keeps its row; a provider
    # far from the fp64 reference gets none
    case = next(c for c in floor.rope_cases() if c.name == "256 MiB bf16 bshd")
    fwd, fwdbwd = floor.rope_case_names(case)
    wide = [dict(provider="ropelib", available=True, reason="", fwd_ms=1.0, fwdbwd_ms=2.1,
                 copy_fwd_ms=0.98, copy_fwdbwd_ms=1.96, max_head_ulp_err=0.5),
            dict(provider="liger", available=False, reason="failed: RuntimeError: bwd",
                 fwd_ms=1.1, fwdbwd_ms=None, copy_fwd_ms=0.98, copy_fwdbwd_ms=1.96,
                 max_head_ulp_err=1.0),
            dict(provider="flash_attn", available=True, reason="", fwd_ms=0.9, fwdbwd_ms=1.9,
                 copy_fwd_ms=0.98, copy_fwdbwd_ms=1.96, max_head_ulp_err=float("nan"))]
    m = floor.rope_rows(case, wide)
    got = {(r["case"], r["provider"]): r["ratio_to_copy"] for r in m.rows}
    assert got == {(fwd, "copy"): 1.0, (fwdbwd, "copy"): 1.0,
                   (fwd, "ropelib"): pytest.approx(0.98), (fwdbwd, "ropelib"): pytest.approx(
                       1.96 / 2.1), (fwd, "liger"): pytest.approx(0.98 / 1.1)}
    assert (fwdbwd, "liger", "failed: RuntimeError: bwd") in m.skipped
    assert any(p == "flash_attn" and "differs from the fp64 reference" in why
               for _, p, why in m.skipped)


# --- the README's table, drawn from floor CSVs -------------------------------------------------

def _synthetic_floor_csv(folder: Path, gpu: str, liger: bool) -> Path:
    """A made-up floor CSV (not a measurement) for one GPU."""
    m = floor.Measured()
    m.add("forward 1 GiB bf16 sbhd", "copy", 1.0, 1.0)
    m.add("forward 1 GiB bf16 sbhd", "ropelib", 1.0 / 0.977, 1.0)
    m.add("forward 1 GiB bf16 sbhd", "torch.compile", 1.0 / 1.004, 1.0)
    m.add("forward 1 GiB bf16 sbhd", "te_fused", None, 1.0, "TE not installed")
    m.add("forward 256 MiB bf16 bshd", "copy", 0.25, 0.25)
    m.add("forward 256 MiB bf16 bshd", "ropelib", 0.25 / 0.95, 0.25)
    m.add("forward 256 MiB bf16 bshd", "liger", 0.25 / 0.5 if liger else None, 0.25, "no liger")
    m.add("forward 256 MiB bf16 bshd", "flash_attn", 0.25 / 0.8 if liger else None, 0.25,
          "flash-attn not installed")
    m.add("decode host forward sbhd", "copy", 0.002, 0.002)
    m.add("decode host forward sbhd", "ropelib", 0.0219, 0.002)
    m.add("decode host forward sbhd", "te_fused", 0.0172, 0.002)
    meta = dict(date="2026-01-01T00:00:00Z", mode=f"GPU ({gpu})", torch="9.9", triton="9.9",
                transformer_engine="9.9", gpu=gpu, driver="1.0", liger_kernel="9.9")
    path = folder / f"floor-{compare.gpu_slug(gpu)}.csv"
    floor.write(path, meta, m)
    return path


def test_readme_table_renders_floor_csvs(tmp_path):
    paths = [_synthetic_floor_csv(tmp_path, "NVIDIA H100 80GB HBM3", liger=True),
             _synthetic_floor_csv(tmp_path, "NVIDIA H200", liger=False)]
    results = readme_table.load(sorted(paths))
    table = readme_table.render(results, tmp_path)
    lines = table.splitlines()
    head = next(line for line in lines if line.startswith("| case"))
    assert head == ("| case | H100 ropelib | H100 torch.compile | H100 TE | H100 Liger "
                    "| H100 flash-attn | H200 ropelib | H200 torch.compile | H200 TE |")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}
    assert rows["forward 1 GiB bf16 sbhd"] == \
        "| forward 1 GiB bf16 sbhd | 0.977 | 1.004 | — | — | — | 0.977 | 1.004 | — |"
    assert rows["forward 256 MiB bf16 bshd"] == \
        "| forward 256 MiB bf16 bshd | 0.950 | — | — | 0.500 | 0.800 | 0.950 | — | — |"
    assert rows["decode host forward sbhd"] == \
        "| decode host forward sbhd | 21.9 µs | — | 17.2 µs | — | — | 21.9 µs | — | 17.2 µs |"
    assert "H100: NVIDIA H100 80GB HBM3, driver 1.0, torch 9.9" in table
    assert "([CSV](floor-nvidia-h200.csv))" in table
    # into a README between the markers, and back out
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{readme_table.BEGIN}\nold\n{readme_table.END}\n\nafter\n")
    argv = ["--results", str(tmp_path), "--readme", str(readme)]
    assert readme_table.main(argv + ["--check"]) == 1      # stale
    assert readme_table.main(argv) == 0
    assert readme_table.main(argv + ["--check"]) == 0
    text = readme.read_text()
    assert readme_table.region(text) == table and text.endswith("\nafter\n")
    assert readme_table.replace_region(text, table) == text
    readme.write_text("no markers\n")
    assert readme_table.main(argv) == 2


def test_readme_table_refuses_interpreter_csvs(tmp_path, capsys):
    path = _synthetic_floor_csv(tmp_path, "NVIDIA H200", liger=False)
    text = path.read_text().replace("# gpu: NVIDIA H200", "# gpu: none")
    path.write_text(text)
    with pytest.raises(ValueError, match="interpreter"):
        readme_table.load([path])
    assert readme_table.main(["--results", str(tmp_path), "--print"]) == 2


RESULTS = REPO / "benchmarks" / "results"


def test_readme_has_the_floor_table_region():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    inside = readme_table.region(text)      # raises without the markers
    assert text.count(readme_table.BEGIN) == 1 and text.count(readme_table.END) == 1
    if not readme_table.find_results(RESULTS):
        assert inside == readme_table.render([])


def test_readme_table_is_what_the_committed_floor_csvs_render():
    paths = readme_table.find_results(RESULTS)
    if not paths:
        pytest.skip("no benchmarks/results/floor-*.csv committed yet: run `python -m "
                    "ropelib.bench --suite floor --out benchmarks/results/` on a GPU, then "
                    "`python -m ropelib.bench.readme_table`")
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_table.region(text) == readme_table.render(readme_table.load(paths), REPO), \
        "README.md's floor table is stale: run python -m ropelib.bench.readme_table"


def test_host_timings_take_turns_and_keep_failures_apart():
    """host_us_interleaved: every function's calls run once per round, in turn; a function
    that raises is reported as its exception, and the others are still timed."""
    order = []

    def fast():
        order.append("fast")

    def slow():
        order.append("slow")
        time.sleep(0.002)

    def broken():
        raise RuntimeError("no such provider")
    us = bench.host_us_interleaved({"fast": (fast, 3), "slow": (slow, 2), "broken": (broken, 4)},
                                   reps=3, device="cpu", warmup=1)
    assert isinstance(us["broken"], RuntimeError)
    assert 0 < us["fast"] < us["slow"] and us["slow"] >= 2000
    # warm-up (one call each), then three rounds: fast x3, slow x2 in each
    assert order == ["fast", "slow"] + (["fast"] * 3 + ["slow"] * 2) * 3


def test_multi_axis_copy_moves_the_bytes_of_its_pass(monkeypatch):
    # The copy's forward+backward is two device copies of q and k, like every other floor's:
    # a clone's backward hands the gradient through without a copy, so timing the clone would
    # halve the forward+backward baseline.
    from ropelib.bench import multi_axis
    once, twice = object(), object()
    monkeypatch.setattr(compare, "copy_floor", lambda tensors: (once, twice))
    captured = {}

    def rows_in_rounds(rows, steps, device):
        captured.update(steps)
        return []
    monkeypatch.setattr(compare, "time_rows_in_rounds", rows_in_rounds)
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8)
    grads = (torch.randn_like(q), torch.randn_like(k))
    rows = multi_axis.measure_providers(
        [("copy", lambda q, k, e: (q.clone(), k.clone()), "")], {"case": "t"}, (q, k), None,
        grads, (q, k), grads, timed=True, device="cpu")
    assert [r["pass"] for r in rows] == ["fwd", "fwd+bwd"]
    assert captured == {0: once, 1: twice}


def test_floor_write_into_replaces_only_the_parts_rows(tmp_path):
    a, b = floor.Part("a", ("a fwd", "a fwdbwd"), None), floor.Part("b", ("b fwd",), None)
    old = floor.Measured()
    for case in ("a fwd", "a fwdbwd", "b fwd"):
        old.add(case, "copy", 1.0, 1.0)
        old.add(case, "ropelib", 2.0, 1.0)
    old.add("a fwd", "liger", None, None, "not installed")
    old.add("b fwd", "liger", None, None, "unsupported")
    path = tmp_path / "floor-x.csv"
    floor.write(path, {"date": "then", "gpu": "X", "timing": "old"}, old)
    new = floor.Measured()
    for case in ("a fwd", "a fwdbwd"):
        new.add(case, "copy", 1.0, 1.0)
        new.add(case, "ropelib", 1.25, 1.0)
    with pytest.raises(ValueError, match="one GPU only"):
        floor.write_into(path, {"gpu": "Y"}, new, [a])
    floor.write_into(path, {"date": "now", "gpu": "X", "timing": "new"}, new, [a])
    got = floor.read(path)
    assert [(r["case"], r["provider"], r["ms"]) for r in got.rows] == [
        ("a fwd", "copy", 1.0), ("a fwd", "ropelib", 1.25), ("a fwdbwd", "copy", 1.0),
        ("a fwdbwd", "ropelib", 1.25), ("b fwd", "copy", 1.0), ("b fwd", "ropelib", 2.0)]
    assert got.meta["date"] == "then" and got.meta["timing"] == "old"
    assert got.meta["replaced_rows"].startswith("a from a later run: date now")
    assert got.skipped == ["liger in b fwd: unsupported"]     # a's line went with a's rows
    # a line naming cases of both parts keeps the other part's, whatever its reason holds
    mixed = floor.read(path)
    floor.write(path, mixed.meta, floor.Measured(rows=mixed.rows),
                skipped=["te in a fwd; b fwd: unsupported config: bshd only"])
    floor.write_into(path, {"date": "now", "gpu": "X", "timing": "new"}, new, [a])
    assert floor.read(path).skipped == ["te in b fwd: unsupported config: bshd only"]
    # a second run of another part keeps the first's entry; a third of `a` replaces it
    b = floor.Part("b", ("b fwd",), None)
    again = floor.Measured()
    again.add("b fwd", "copy", 1.0, 1.0)
    again.add("b fwd", "ropelib", 1.5, 1.0)
    floor.write_into(path, {"date": "later", "gpu": "X", "timing": "new"}, again, [b])
    def entries():
        return [(e.partition(floor.LATER_RUN)[0], e.partition(floor.LATER_RUN)[2].split(",")[0])
                for e in floor.replacements(floor.read(path).meta)]
    assert entries() == [("a", "date now"), ("b", "date later")]
    floor.write_into(path, {"date": "last", "gpu": "X", "timing": "new"}, new, [a])
    assert entries() == [("b", "date later"), ("a", "date last")]
    table = readme_table.render(readme_table.load([path]), tmp_path)
    assert "Its b rows come from a later run, later." in table
    assert "Its a rows come from a later run, last." in table
    with pytest.raises(ValueError, match="no rows of the parts"):
        floor.write_into(path, {"gpu": "X"}, new, [floor.Part("c", ("c fwd",), None)])


def test_readme_table_names_rows_measured_again(tmp_path):
    path = _synthetic_floor_csv(tmp_path, "NVIDIA H200", liger=False)
    base = floor.read(path)
    base.meta["replaced_rows"] = ("multi-axis from a later run: date 2026-12-01T10:00:00Z, "
                                  "torch 9.9; its timing: t")
    floor.write(path, base.meta, floor.Measured(rows=base.rows), skipped=base.skipped)
    table = readme_table.render(readme_table.load([path]), tmp_path)
    assert "Its multi-axis rows come from a later run, 2026-12-01T10:00:00Z." in table


def test_into_is_refused_where_it_does_not_apply(tmp_path, capsys):
    for argv, msg in ((["--suite", "decode", "--into", str(tmp_path / "f.csv")],
                       "--into applies to --suite floor only"),
                      (["--suite", "floor", "--into", str(tmp_path / "f.csv")],
                       "--into needs --cases"),
                      (["--suite", "floor", "--cases", "^QK", "--into", str(tmp_path / "f.csv")],
                       "not a floor CSV")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
