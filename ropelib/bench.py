"""The issue-5 benchmark suite: ropelib against the copy floor, Transformer Engine and torch.compile.

    python -m ropelib.bench --suite targets          # every issue-5 target, ~4 min on an H100
    python -m ropelib.bench --suite decode           # decode size, launch-bound, + CUDA graphs
    python -m ropelib.bench --suite seed             # the seeds' fp32 sweep (h=64, d=128)
    TRITON_INTERPRET=1 python -m ropelib.bench --suite quick   # tiny sizes, runs on a CPU

RoPE moves bytes and does almost no arithmetic, so the yardstick is a device-to-device copy of
the same tensor(s) timed in the same run: ratio = copy time / provider time (1.0 = the floor).
Every case is timed by `ropelib.compare.run_case` (all providers, forward and forward+backward,
do_bench medians with 20 %/80 % quantiles); decode cases are also timed under CUDA-graph replay.
One CSV row per (case, provider), with the environment (GPU, driver, versions, date) in it; a
summary with each target's verdict is printed last. `benchmarks/plot.py` draws the figures.
"""
import argparse
import dataclasses
import datetime
import math
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from . import compare
from .compare import Config, environment_meta, providers, run_case, write_csv
from .runtime import INTERPRET, on_gpu

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

SUITES = ("targets", "quick", "decode", "seed")
DTYPES = ("bf16", "fp16", "fp32")
LAYOUTS = ("sbhd", "bshd", "thd")
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MiB = 1 << 20

# Provider names in ropelib.compare.providers() that the targets are stated against.
ROPELIB = "ropelib"
TE_FUSED = "te_fused"
TORCH_COMPILE = "torch.compile"

# Issue 5's targets (ratio = copy time / ropelib time, medians from one run).
LARGE_BYTES = 256 * MiB  # tensors at least this large: ratio >= 0.97 fwd, >= 0.95 fwd+bwd
MID_BYTES = 64 * MiB  # the 64 MiB case: ratio >= 0.85
TARGET_LARGE_FWD = 0.97
TARGET_LARGE_FWDBWD = 0.95
TARGET_MID = 0.85
TARGET_VS_TE_LARGE_BF16 = 1.8  # ropelib at least 1.8x faster than TE fused on large bf16 cases


# --- cases --------------------------------------------------------------------------------

@dataclass
class BenchCase:
    """One benchmarked configuration: a compare.Config plus where it belongs in the report."""
    name: str  # unique within a suite: the `case` column
    group: str  # "large", "reference", "qk", "64mib", "decode", "seed", "quick"
    config: Config
    graph: bool = False  # also time the forward under CUDA-graph replay (decode)


def tensor_bytes(seq_len: int, batch: int, heads: int, head_dim: int, dtype: str,
                 kv_heads: Optional[int] = None) -> int:
    """Bytes of the rotated input(s): x, or q and k together on the Q+K path."""
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"dtype must be one of {tuple(ELEMENT_BYTES)}, got {dtype!r}")
    return seq_len * batch * (heads + (kv_heads or 0)) * head_dim * ELEMENT_BYTES[dtype]


def config_bytes(cfg: Config) -> int:
    return tensor_bytes(cfg.seq_len, cfg.batch, cfg.heads, cfg.head_dim, cfg.dtype,
                        cfg.kv_heads)


def _mode_name(interleaved: bool, rotary_percent: float) -> str:
    return ("interleaved" if interleaved else "rotate-half") + (
        "" if rotary_percent == 1.0 else f"-r{rotary_percent:g}")


def _seq_for(dtype: str, nbytes: int, batch: int, heads: int, head_dim: int) -> int:
    """Sequence length that makes x [s, batch, heads, head_dim] exactly `nbytes`."""
    return nbytes // (batch * heads * head_dim * ELEMENT_BYTES[dtype])


# (interleaved, rotary_percent): rotate-half full, interleaved full, rotate-half half, both
MODES = ((False, 1.0), (True, 1.0), (False, 0.5), (True, 0.5))


def targets_cases(dtypes=DTYPES, full_matrix: bool = False) -> list:
    """Every issue-5 target, sized for about 4 minutes on an H100 (`full_matrix`: ~6 minutes).

    Large cases are 256 MiB, the smallest size the >= 0.97 target applies to (larger tensors
    only get closer to the floor): b=8, h=32, d=128, s=4096 (bf16/fp16) or 2048 (fp32). The
    default is a pairwise covering of dtype x layout x mode (mode = rotate-half/interleaved x
    full/half rotary): every dtype x layout pair in rotate-half full, every dtype x mode pair on
    sbhd, every layout x mode pair in bf16 (24 cases). Layout changes the outer strides, dtype
    and mode the inner access pattern, so a kernel that is fast on each pair has no untested
    interaction left but the three-way ones; `full_matrix` runs all 36. Then the issue's 1 GiB
    reference case (bf16 sbhd s=16384), the Q+K one-launch path (GQA: 32 q heads, 8 kv heads,
    q+k = 320 MiB; every dtype on sbhd, every layout in bf16), the 64 MiB case (bf16, s=1024)
    per layout and the decode size per layout.
    """
    b, h, d = 8, 32, 128
    cases = []

    def large(dt, layout, interleaved, rp):
        cfg = Config(seq_len=_seq_for(dt, 256 * MiB, b, h, d), batch=b, heads=h, head_dim=d,
                     dtype=dt, layout=layout, interleaved=interleaved, rotary_percent=rp)
        return BenchCase(f"large-{dt}-{layout}-{_mode_name(interleaved, rp)}", "large", cfg)

    for dt in dtypes:
        for layout in LAYOUTS:
            for interleaved, rp in MODES:
                on_design = (interleaved, rp) == MODES[0] or layout == "sbhd" or dt == "bf16"
                if full_matrix or on_design:
                    cases.append(large(dt, layout, interleaved, rp))
    if "bf16" in dtypes:
        cases.append(BenchCase("reference-bf16-sbhd-s16384", "reference",
                               Config(seq_len=16384, batch=b, heads=h, head_dim=d,
                                      dtype="bf16", layout="sbhd")))
    for dt in dtypes:
        for layout in LAYOUTS:
            if full_matrix or layout == "sbhd" or dt == "bf16":
                cases.append(BenchCase(f"qk-{dt}-{layout}-kv8", "qk", Config(
                    seq_len=_seq_for(dt, 256 * MiB, b, h, d), batch=b, heads=h, head_dim=d,
                    dtype=dt, layout=layout, kv_heads=8)))
    mid_dtypes = [dt for dt in dtypes if dt == "bf16"] or list(dtypes)[:1]
    for dt in mid_dtypes:  # the issue states the 64 MiB case in bf16: s=1024, b=8, h=32, d=128
        for layout in LAYOUTS:
            cases.append(BenchCase(f"64mib-{dt}-{layout}", "64mib",
                                   Config(seq_len=1024, batch=b, heads=h, head_dim=d, dtype=dt,
                                          layout=layout)))
    return cases + decode_cases(mid_dtypes)


def decode_cases(dtypes=("bf16",)) -> list:
    """Decode size: one new token for 64 sequences (s=1, b=64, h=32, d=128), CUDA graphs too."""
    return [BenchCase(f"decode-{dt}-{layout}", "decode",
                      Config(seq_len=1, batch=64, heads=32, head_dim=128, dtype=dt,
                             layout=layout), graph=True)
            for dt in dtypes for layout in LAYOUTS]


SEED_SEQ_LENS = tuple(128 * i for i in range(2, 32))  # 256, 384, ..., 3968 (the seeds' x_vals)


def seed_cases(dtypes=("fp32",)) -> list:
    """The seeds' sweep: sbhd, head_num 64, head_dim 128, batch 1/2/4/8, seq 256...3968."""
    return [BenchCase(f"seed-{dt}-b{b}-s{s}", "seed",
                      Config(seq_len=s, batch=b, heads=64, head_dim=128, dtype=dt,
                             layout="sbhd"))
            for dt in dtypes for b in (1, 2, 4, 8) for s in SEED_SEQ_LENS]


def quick_cases(dtypes=DTYPES) -> list:
    """Tiny shapes touching every path (layouts, interleaved, partial, Q+K, decode + graph).

    On a CPU they run in Triton's interpreter: the timings are meaningless, the plumbing is not.
    """
    tiny = dict(seq_len=4, batch=2, heads=2, head_dim=16)
    combos = [("sbhd", False, 1.0), ("bshd", True, 0.5), ("thd", False, 0.5)]
    cases = []
    for i, (layout, interleaved, rp) in enumerate(combos):
        dt = dtypes[i % len(dtypes)]
        cases.append(BenchCase(f"quick-{dt}-{layout}-{_mode_name(interleaved, rp)}", "quick",
                               Config(**tiny, dtype=dt, layout=layout, interleaved=interleaved,
                                      rotary_percent=rp)))
    dt = dtypes[0]
    cases.append(BenchCase(f"quick-qk-{dt}-sbhd", "quick",
                           Config(**tiny, dtype=dt, layout="sbhd", kv_heads=1)))
    cases.append(BenchCase(f"quick-decode-{dt}-bshd", "quick",
                           Config(seq_len=1, batch=2, heads=2, head_dim=16, dtype=dt,
                                  layout="bshd"), graph=True))
    return cases


def suite_cases(suite: str, dtypes=None, full_matrix: bool = False) -> list:
    """The cases of one suite; `dtypes` restricts (for decode/seed: replaces) the dtypes."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {suite!r}")
    if dtypes is not None:
        bad = [d for d in dtypes if d not in DTYPES]
        if bad or not dtypes:
            raise ValueError(f"dtype must be a comma list from {DTYPES}, got {dtypes!r}")
        dtypes = tuple(d for d in DTYPES if d in dtypes)  # canonical order, no duplicates
    if suite == "targets":
        return targets_cases(dtypes or DTYPES, full_matrix)
    if suite == "decode":
        return decode_cases(dtypes or ("bf16",))
    if suite == "seed":
        return seed_cases(dtypes or ("fp32",))
    return quick_cases(dtypes or DTYPES)


# --- CUDA-graph replay --------------------------------------------------------------------

GRAPH_PROVIDERS = (ROPELIB, TE_FUSED, TORCH_COMPILE)


def graph_replay_ms(fn: Callable[[], object], calls: int = 100) -> tuple:
    """Latency per call of `fn` under CUDA-graph replay: (median, p20, p80) in ms.

    `calls` invocations are captured into one torch.cuda.CUDAGraph; a replay is timed with
    do_bench and divided by `calls`. That takes Python and launch overhead out, as a decode
    loop captured in a graph does.
    """
    import triton.testing

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compile, autotune, allocate) outside capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    med, p20, p80 = triton.testing.do_bench(graph.replay, quantiles=[0.5, 0.2, 0.8])
    return med / calls, p20 / calls, p80 / calls


GRAPH_FIELDS = ("graph_fwd_ms", "graph_fwd_ms_p20", "graph_fwd_ms_p80", "graph_copy_fwd_ms",
                "graph_ratio_fwd", "graph_reason")


def add_graph_timings(case: BenchCase, rows: list, provs: list, calls: int = 100) -> None:
    """Fill GRAPH_FIELDS of a case's rows in place: forward under CUDA-graph replay for ropelib,
    TE fused and torch.compile, and a copy of the same bytes. A provider that cannot be
    captured gets the reason in `graph_reason`; nothing raises."""
    for r in rows:
        r.update({f: None for f in GRAPH_FIELDS}, graph_reason="")
    if not on_gpu():
        for r in rows:
            r["graph_reason"] = "not timed: CUDA graphs need a GPU"
        return
    inputs = compare.make_case(case.config, "cuda", seed=1)
    src = [t.clone() for t in inputs.tensors]
    dst = [torch.empty_like(t) for t in inputs.tensors]

    def copy_once():
        for d, s in zip(dst, src):
            d.copy_(s)
    copy_ms, copy_err = None, ""
    try:
        copy_ms = graph_replay_ms(copy_once, calls)[0]
    except Exception as e:  # noqa: BLE001 - reported in the CSV, never fatal
        copy_err = f"copy under graph failed: {type(e).__name__}: {str(e)[:120]}"
    by_name = {p.name: p for p in provs}
    for r in rows:
        r["graph_copy_fwd_ms"] = copy_ms
        name = r.get("provider")
        if name not in GRAPH_PROVIDERS:
            r["graph_reason"] = "not timed under graphs (ropelib, te_fused, torch.compile only)"
            continue
        if not r.get("available") or name not in by_name:
            r["graph_reason"] = "provider unavailable"
            continue
        p = by_name[name]

        def fwd(p=p):
            with torch.no_grad():
                p.fn(inputs)
        try:
            r["graph_fwd_ms"], r["graph_fwd_ms_p20"], r["graph_fwd_ms_p80"] = \
                graph_replay_ms(fwd, calls)
            if copy_ms is not None:
                r["graph_ratio_fwd"] = copy_ms / r["graph_fwd_ms"]
            r["graph_reason"] = copy_err
        except Exception as e:  # noqa: BLE001 - e.g. a host sync inside the provider
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
            msg = str(e).splitlines()[0][:160] if str(e) else ""
            r["graph_reason"] = f"capture failed: {type(e).__name__}: {msg}"


# --- target checks ------------------------------------------------------------------------

def _num(v) -> Optional[float]:
    """A finite float from a row value (float, int, numeric string), else None."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _truthy(v) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


def _int(v, default: int = 0) -> int:
    f = _num(v)
    return int(f) if f is not None else default


def row_bytes(row: dict) -> int:
    """Bytes of the rotated tensor(s) of a result row (q and k together on the Q+K path)."""
    return tensor_bytes(_int(row["seq_len"]), _int(row["batch"]), _int(row["heads"]),
                        _int(row["head_dim"]), str(row["dtype"]),
                        _int(row.get("kv_heads"), 0) or None)


def case_key(row: dict) -> str:
    """The case a row belongs to: its `case` column, else a name built from its config."""
    if row.get("case"):
        return str(row["case"])
    kv = _int(row.get("kv_heads"), 0)
    mode = _mode_name(_truthy(row.get("interleaved")), _num(row.get("rotary_percent")) or 1.0)
    return (f"{row['dtype']}-{row['layout']}-s{row['seq_len']}-b{row['batch']}-h{row['heads']}"
            f"-d{row['head_dim']}-{mode}" + (f"-kv{kv}" if kv else ""))


def _check(name: str, value: Optional[float], bound: float, why_missing: str = "") -> dict:
    """One target check `value >= bound`: ok True/False, or None (with why) when not measured."""
    ok = None if value is None else value >= bound
    return {"target": name, "value": value, "bound": bound, "ok": ok,
            "why": "" if value is not None else (why_missing or "not measured")}


def _speedup(other: Optional[dict], mine: dict, field: str) -> Optional[float]:
    """other[field] / mine[field] (> 1: mine is faster), None when either is missing."""
    if other is None:
        return None
    o, m = _num(other.get(field)), _num(mine.get(field))
    return o / m if (o is not None and m is not None and m > 0) else None


def _missing(name: str, row: Optional[dict]) -> str:
    if row is None:
        return f"{name} not in this run"
    return f"{name}: {row.get('reason') or 'not measured'}"


def checks_for_case(case_rows: list) -> list:
    """The issue-5 target checks that apply to ropelib in one case (list of check dicts).

    - tensor(s) >= 256 MiB: ratio_fwd >= 0.97 and ratio_fwdbwd >= 0.95;
    - 64 MiB <= tensor(s) < 256 MiB: ratio_fwd and ratio_fwdbwd >= 0.85;
    - tensor(s) >= 256 MiB in bf16: TE fused time / ropelib time >= 1.8 (fwd and fwd+bwd);
    - decode (seq_len == 1): TE fused forward / ropelib forward >= 1, plain and under graphs;
    - every case: torch.compile time / ropelib time >= 1 (fwd, fwd+bwd, graph when measured).
    Forward+backward checks apply when the run measured them (not --fwd-only). A check whose
    numbers are missing (provider not installed, configuration unsupported) has ok=None and why.
    """
    by = {r.get("provider"): r for r in case_rows}
    me = by.get(ROPELIB)
    if me is None or not _truthy(me.get("available")):
        return [_check("ropelib runs", None, 1.0, _missing(ROPELIB, me))]
    te, tc = by.get(TE_FUSED), by.get(TORCH_COMPILE)
    te_ok = te if te is not None and _truthy(te.get("available")) else None
    tc_ok = tc if tc is not None and _truthy(tc.get("available")) else None
    nbytes = row_bytes(me)
    bwd = _num(me.get("fwdbwd_ms")) is not None
    graph = _num(me.get("graph_fwd_ms")) is not None
    out = []
    if nbytes >= LARGE_BYTES:
        out.append(_check("ratio fwd >= 0.97", _num(me.get("ratio_fwd")), TARGET_LARGE_FWD))
        if bwd:
            out.append(_check("ratio fwd+bwd >= 0.95", _num(me.get("ratio_fwdbwd")),
                              TARGET_LARGE_FWDBWD))
        if str(me.get("dtype")) == "bf16":
            out.append(_check("1.8x TE fused fwd", _speedup(te_ok, me, "fwd_ms"),
                              TARGET_VS_TE_LARGE_BF16, _missing(TE_FUSED, te)))
            if bwd:
                out.append(_check("1.8x TE fused fwd+bwd", _speedup(te_ok, me, "fwdbwd_ms"),
                                  TARGET_VS_TE_LARGE_BF16, _missing(TE_FUSED, te)))
    elif nbytes >= MID_BYTES:
        out.append(_check("ratio fwd >= 0.85", _num(me.get("ratio_fwd")), TARGET_MID))
        if bwd:
            out.append(_check("ratio fwd+bwd >= 0.85", _num(me.get("ratio_fwdbwd")), TARGET_MID))
    if _int(me.get("seq_len")) == 1:
        out.append(_check("decode fwd <= TE fused", _speedup(te_ok, me, "fwd_ms"), 1.0,
                          _missing(TE_FUSED, te)))
        if graph:
            out.append(_check("decode graph fwd <= TE fused",
                              _speedup(te_ok, me, "graph_fwd_ms"), 1.0,
                              (te_ok or {}).get("graph_reason") or _missing(TE_FUSED, te)))
    out.append(_check("fwd <= torch.compile", _speedup(tc_ok, me, "fwd_ms"), 1.0,
                      _missing(TORCH_COMPILE, tc)))
    if bwd:
        out.append(_check("fwd+bwd <= torch.compile", _speedup(tc_ok, me, "fwdbwd_ms"), 1.0,
                          _missing(TORCH_COMPILE, tc)))
    if graph:
        out.append(_check("graph fwd <= torch.compile", _speedup(tc_ok, me, "graph_fwd_ms"), 1.0,
                          (tc_ok or {}).get("graph_reason") or _missing(TORCH_COMPILE, tc)))
    return out


def verdict(checks: list) -> str:
    """"NO" if any check failed; "yes" if all passed; "partial" if the measured ones passed but
    some could not be measured; "unchecked" if none could."""
    if any(c["ok"] is False for c in checks):
        return "NO"
    if all(c["ok"] is True for c in checks):
        return "yes"
    return "partial" if any(c["ok"] is True for c in checks) else "unchecked"


def _describe(checks: list) -> str:
    """The checks that failed (with their value) and those not measured (with one reason each)."""
    failed = [f"{c['target']}: {c['value']:.3f}" for c in checks if c["ok"] is False]
    unmeasured: dict = {}
    for c in checks:
        if c["ok"] is None:
            unmeasured.setdefault(c["why"][:100], []).append(c["target"])
    parts = failed + [f"not measured: {', '.join(t)} ({why})" for why, t in unmeasured.items()]
    return "; ".join(parts)


def summarize(rows: list) -> list:
    """One summary dict per (case, provider), in row order: ratios to the copy, speed relative
    to TE fused and torch.compile (> 1: faster than them), and for ropelib the target verdict
    with the checks that were missed or could not be measured."""
    cases: dict = {}
    for r in rows:
        cases.setdefault(case_key(r), []).append(r)
    out = []
    for key, case_rows in cases.items():
        by = {r.get("provider"): r for r in case_rows}
        te, tc = by.get(TE_FUSED), by.get(TORCH_COMPILE)
        te = te if te is not None and _truthy(te.get("available")) else None
        tc = tc if tc is not None and _truthy(tc.get("available")) else None
        checks = checks_for_case(case_rows)
        for r in case_rows:
            avail = _truthy(r.get("available"))
            mine = r.get("provider") == ROPELIB
            out.append({
                "case": key,
                "provider": r.get("provider"),
                "available": avail,
                "bytes": row_bytes(r),
                "dtype": r.get("dtype"),
                "layout": r.get("layout"),
                "fwd_ms": _num(r.get("fwd_ms")),
                "fwdbwd_ms": _num(r.get("fwdbwd_ms")),
                "ratio_fwd": _num(r.get("ratio_fwd")) if avail else None,
                "ratio_fwdbwd": _num(r.get("ratio_fwdbwd")) if avail else None,
                "vs_te_fwd": _speedup(te, r, "fwd_ms") if avail else None,
                "vs_compile_fwd": _speedup(tc, r, "fwd_ms") if avail else None,
                "graph_fwd_ms": _num(r.get("graph_fwd_ms")),
                "target": verdict(checks) if mine else "",
                "checks": checks if mine else [],
                "missed": _describe(checks) if mine else "",
                "reason": "" if avail else str(r.get("reason") or ""),
            })
    return out


def _fmt(v, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


SUMMARY_PROVIDERS = (ROPELIB, TE_FUSED, TORCH_COMPILE)


def format_summary(summary: list, providers_shown=SUMMARY_PROVIDERS,
                   unavailable: bool = False) -> str:
    """The summary as a fixed-width text table (the CLI prints it last): the rows of
    `providers_shown` (None: all) that ran, and ropelib's even when it did not. The other
    providers and every reason are in the CSV."""
    head = ("case", "provider", "fwd ratio", "fwdbwd ratio", "vs TE", "vs compile",
            "graph us", "target met?")
    lines = []
    for s in summary:
        if providers_shown is not None and s["provider"] not in providers_shown:
            continue
        if not s["available"]:
            if unavailable or s["provider"] == ROPELIB:
                lines.append((s["case"], s["provider"], "-", "-", "", "", "",
                              f"did not run: {s['reason'][:70]}"))
            continue
        tgt = s["target"] + (f"  [{s['missed']}]" if s["missed"] else "")
        g = s["graph_fwd_ms"]
        lines.append((s["case"], s["provider"], _fmt(s["ratio_fwd"]), _fmt(s["ratio_fwdbwd"]),
                      _fmt(s["vs_te_fwd"], ".2f", "x"), _fmt(s["vs_compile_fwd"], ".2f", "x"),
                      "" if g is None else f"{g * 1e3:.1f}", tgt))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]

    def fmt(row):
        return "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()
    rule = "  ".join("-" * w for w in widths[:-1] + [len(head[-1])])
    return "\n".join([fmt(head), rule] + [fmt(r) for r in lines])


def verdict_counts(summary: list) -> dict:
    """How many cases ropelib met ("yes"), missed ("NO"), partly or not checked."""
    counts: dict = {}
    for s in summary:
        if s["provider"] == ROPELIB:
            counts[s["target"]] = counts.get(s["target"], 0) + 1
    return counts


# --- running ------------------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def default_out(suite: str, meta: dict) -> Path:
    """benchmarks/results/<suite>-<gpu-slug>-<date>.csv on a GPU; a temp dir otherwise.

    Interpreter timings are meaningless and the quick suite is a plumbing check, so neither
    lands among the committed results by default.
    """
    gpu = str(meta.get("gpu") or "none")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    name = f"{suite}-{_slug(gpu) if gpu != 'none' else 'cpu'}-{stamp}.csv"
    if on_gpu() and suite != "quick":
        return RESULTS_DIR / name
    return Path(tempfile.gettempdir()) / "ropelib-bench" / name


def select_providers(names=None) -> list:
    """compare.providers(), restricted to `names` (an unknown name raises ValueError)."""
    allp = providers()
    if not names:
        return allp
    known = [p.name for p in allp]
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"providers: unknown {bad}; known: {known}")
    return [p for p in allp if p.name in names]


def run_suite(cases: list, provs: list, *, backward: bool = True, graph_calls: int = 100,
              device=None, progress=True, on_case: Optional[Callable] = None) -> list:
    """Run every case through compare.run_case (all providers, copy floor in the same run), add
    CUDA-graph timings to graph cases; returns all rows, one per (case, provider)."""
    rows = []
    bar = compare.progress_bar(len(cases), "bench", progress) if progress else None
    try:
        for case in cases:
            if bar is not None and hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(case.name)
            case_rows = run_case(case.config, provs, backward=backward, device=device)
            for r in case_rows:
                r.update(case=case.name, group=case.group,
                         tensor_mib=round(config_bytes(case.config) / MiB, 3))
            if case.graph:
                add_graph_timings(case, case_rows, provs, graph_calls)
            rows.extend(case_rows)
            if on_case is not None:
                on_case(case, case_rows)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rows


def warm_allocator(gib: float) -> None:
    """Allocate and free `gib` GiB through PyTorch's caching allocator: later tensors are cut
    from that cached segment instead of new cudaMalloc calls. Measured on an H100: the first
    forward+backward timing of a 256 MiB case in a fresh process scattered between 0.56 and
    0.96 of copy (15 cudaMalloc segments during the case); with the pool warmed, 0.96 every
    time (benchmarks/results/probe-fwdbwd-scatter-h100-20261122.log)."""
    n = int(gib * 2**30)
    if n:
        free = torch.cuda.mem_get_info()[0]
        torch.empty(min(n, free // 2), dtype=torch.uint8, device="cuda")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ropelib.bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=SUITES, default="targets",
                    help="targets: every issue-5 target (~4 min on an H100); quick: tiny shapes "
                         "(runs on a CPU); decode: s=1 b=64 h=32 d=128 + CUDA graphs; seed: the "
                         "seeds' fp32 sweep")
    ap.add_argument("--dtype", default=None,
                    help=f"comma list from {','.join(DTYPES)}: restricts the suite's dtypes "
                         "(decode/seed: replaces them)")
    ap.add_argument("--providers", default=None,
                    help=f"comma list from {','.join(compare.PROVIDER_NAMES)} (default: all; "
                         f"seed: {','.join(compare.SEED_PROVIDERS)}); the copy floor is always "
                         "measured")
    ap.add_argument("--out", default=None,
                    help="CSV path (default benchmarks/results/<suite>-<gpu-slug>-<date>.csv; "
                         "a temp dir when not on a GPU)")
    ap.add_argument("--fwd-only", action="store_true", help="skip the forward+backward timings")
    ap.add_argument("--full-matrix", action="store_true",
                    help="targets: the whole dtype x layout x mode product (~7 min on an H100)")
    ap.add_argument("--cases", default=None, metavar="REGEX",
                    help="only the cases whose name matches this regular expression")
    ap.add_argument("--graph-calls", type=int, default=100,
                    help="calls captured per CUDA graph for the decode latency (default 100)")
    ap.add_argument("--summary-all", action="store_true",
                    help="summary table with every provider (default: ropelib, te_fused, "
                         "torch.compile)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--reserve-gib", type=float, default=16.0,
                    help="GPU: fill PyTorch's caching allocator with this many GiB before the "
                         "first case (allocated and freed), so no case pays for cudaMalloc "
                         "while it is timed, as in a training process past its first steps "
                         "(0: off; benchmarks/NOTES.md, version 10)")
    args = ap.parse_args(argv)

    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()] if args.dtype else None
    try:
        cases = suite_cases(args.suite, dtypes, args.full_matrix)
    except ValueError as e:
        ap.error(str(e))
    if args.cases:
        try:
            rx = re.compile(args.cases)
        except re.error as e:
            ap.error(f"--cases is not a regular expression: {e}")
        cases = [c for c in cases if rx.search(c.name)]
        if not cases:
            ap.error(f"--cases {args.cases!r} matches no case of suite {args.suite!r}")
    if args.graph_calls < 1:
        ap.error("--graph-calls must be >= 1")
    if args.reserve_gib < 0:
        ap.error("--reserve-gib must be >= 0")
    if args.list:
        for c in cases:
            print(f"{c.name:36s} {config_bytes(c.config) / MiB:9.2f} MiB"
                  + ("  + CUDA graph" if c.graph else ""))
        print(f"{len(cases)} cases")
        return 0
    if not on_gpu() and not INTERPRET:
        ap.error("no CUDA GPU: run on the CPU with TRITON_INTERPRET=1 set before Python starts "
                 "(TRITON_INTERPRET=1 python -m ropelib.bench --suite quick)")
    if not on_gpu() and args.suite != "quick":
        ap.error(f"--suite {args.suite} needs a CUDA GPU (full sizes); on a CPU use --suite quick")
    names = [n.strip() for n in args.providers.split(",") if n.strip()] if args.providers else None
    if names is None and args.suite == "seed":
        names = list(compare.SEED_PROVIDERS)  # the seeds' comparison: 120 cases, keep it lean
    try:
        provs = select_providers(names)
    except ValueError as e:
        ap.error(str(e))

    meta = environment_meta()
    meta["suite"] = args.suite
    if on_gpu() and args.reserve_gib > 0:
        warm_allocator(args.reserve_gib)
        meta["allocator_reserved_gib"] = f"{args.reserve_gib:g}"
    out = Path(args.out) if args.out else default_out(args.suite, meta)
    if not on_gpu():
        print("CPU, Triton interpreter: timings are wall-clock and MEANINGLESS (plumbing only).",
              file=sys.stderr)
    print(f"{args.suite}: {len(cases)} cases; providers: "
          + ", ".join(p.name + ("" if p.available else " (unavailable)") for p in provs),
          file=sys.stderr)
    t0 = time.time()
    rows = run_suite(cases, provs, backward=not args.fwd_only, graph_calls=args.graph_calls,
                     device="cuda" if on_gpu() else "cpu")
    elapsed = time.time() - t0
    for r in rows:
        r["suite"] = args.suite
    meta["elapsed_s"] = f"{elapsed:.0f}"
    write_csv(rows, out, meta=meta)
    summary = summarize(rows)
    print(format_summary(summary, None if args.summary_all else SUMMARY_PROVIDERS))
    counts = verdict_counts(summary)
    print(f"\nropelib targets: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(rows)} rows, {len(cases)} cases in {elapsed:.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
