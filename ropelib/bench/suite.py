"""ropelib's benchmark suite: against the copy floor, Transformer Engine and torch.compile.

    python -m ropelib.bench --suite targets          # every performance bar, ~5 min on an H100
    python -m ropelib.bench --suite floor --out benchmarks/results/   # the README's table's rows
    python -m ropelib.bench --suite decode           # decode size: host cost and CUDA graphs
    python -m ropelib.bench --suite sweep            # fp32 sweep over seq_len and batch (h=64)
    TRITON_INTERPRET=1 python -m ropelib.bench --suite quick   # tiny sizes, runs on a CPU
    TRITON_INTERPRET=1 python -m ropelib.bench --suite floor --out /tmp/floor.csv   # likewise

RoPE moves bytes and does almost no arithmetic, so the yardstick is a device-to-device copy of
the same tensor(s) timed in the same run: ratio = copy time / provider time (1.0 = the floor).
Every case is timed by `ropelib.bench.compare.run_case` (all providers, forward and forward+backward,
do_bench medians with 20 %/80 % quantiles). Decode cases add the host cost of an eager call
(calls back to back, wall clock) and the latency under CUDA-graph replay; 64 MiB cases add the
forward+backward under CUDA-graph replay. One CSV row per (case, provider), with the environment
(GPU, driver, versions, date) in it, written where --out says (default: the current directory);
a summary says, per case, which of ropelib's performance bars it clears. `benchmarks/plot.py`
draws the figures. The floor suite (`ropelib.bench.floor`) writes its own CSV instead: one row
per (case, provider) with ms and the ratio to the copy, every performance row of the README
(plain RoPE, decode host cost and CUDA graphs, multi-axis, QK-norm, KV-cache write), which
`python -m ropelib.bench.readme_table` turns into the README's table.
"""
import datetime
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from . import compare
from .compare import Config, providers, run_case
from ..conventions import LAYOUTS
from ..runtime import on_gpu


SUITES = ("targets", "quick", "decode", "sweep", "floor")
CPU_SUITES = ("quick", "floor")   # suites with tiny shapes for Triton's interpreter
DTYPES = ("bf16", "fp16", "fp32")
MiB = 1 << 20

# Provider names in ropelib.bench.compare.providers() that the targets are stated against.
ROPELIB = "ropelib"
TE_FUSED = "te_fused"
TORCH_COMPILE = "torch.compile"

# ropelib's performance bars (ratio = copy time / ropelib time, medians from one run):
LARGE_BYTES = 256 * MiB  # tensors at least this large: ratio >= 0.97 fwd, >= 0.95 fwd+bwd
MID_BYTES = 64 * MiB  # from 64 MiB: fwd+bwd ratio >= 0.85, eager and under CUDA graphs
BAR_LARGE_FWD = 0.97
BAR_LARGE_FWDBWD = 0.95
BAR_MID_FWDBWD = 0.85
# everywhere: never slower than torch.compile; decode: an eager call costs the host no more than
# Transformer Engine's fused call (forward, and forward+backward), and a CUDA-graph replay no
# more than torch.compile's


# --- cases --------------------------------------------------------------------------------

@dataclass
class BenchCase:
    """One benchmarked configuration: a compare.Config plus where it belongs in the report."""
    name: str  # unique within a suite: the `case` column
    group: str  # "large", "reference", "qk", "64mib", "decode", "sweep", "quick"
    config: Config
    graph: bool = False  # also time the forward under CUDA-graph replay (decode)
    graph_fwdbwd: bool = False  # also time forward+backward under CUDA-graph replay (64 MiB)
    host: bool = False  # also time an eager call's host cost, calls back to back (decode)


def tensor_bytes(seq_len: int, batch: int, heads: int, head_dim: int, dtype: str,
                 kv_heads: Optional[int] = None) -> int:
    """Bytes of the rotated input(s): x, or q and k together on the Q+K path."""
    if dtype not in compare.DTYPES:
        raise ValueError(f"dtype must be one of {tuple(compare.DTYPES)}, got {dtype!r}")
    return seq_len * batch * (heads + (kv_heads or 0)) * head_dim * compare.DTYPES[dtype].itemsize


def config_bytes(cfg: Config) -> int:
    return tensor_bytes(cfg.seq_len, cfg.batch, cfg.heads, cfg.head_dim, cfg.dtype,
                        cfg.kv_heads)


def _mode_name(interleaved: bool, rotary_percent: float) -> str:
    return ("interleaved" if interleaved else "rotate-half") + (
        "" if rotary_percent == 1.0 else f"-r{rotary_percent:g}")


def _seq_for(dtype: str, nbytes: int, batch: int, heads: int, head_dim: int) -> int:
    """Sequence length that makes x [s, batch, heads, head_dim] exactly `nbytes`."""
    return nbytes // (batch * heads * head_dim * compare.DTYPES[dtype].itemsize)


# (interleaved, rotary_percent): rotate-half full, interleaved full, rotate-half half, both
MODES = ((False, 1.0), (True, 1.0), (False, 0.5), (True, 0.5))


def targets_cases(dtypes=DTYPES, full_matrix: bool = False) -> list:
    """Every performance bar, sized for about 5 minutes on an H100 (`full_matrix`: ~7 minutes).

    Large cases are 256 MiB, the smallest size the >= 0.97 bar applies to (larger tensors
    only get closer to the floor): b=8, h=32, d=128, s=4096 (bf16/fp16) or 2048 (fp32). The
    default is a pairwise covering of dtype x layout x mode (mode = rotate-half/interleaved x
    full/half rotary): every dtype x layout pair in rotate-half full, every dtype x mode pair on
    sbhd, every layout x mode pair in bf16 (24 cases). Layout changes the outer strides, dtype
    and mode the inner access pattern, so a kernel that is fast on each pair has no untested
    interaction left but the three-way ones; `full_matrix` runs all 36. Then a 1 GiB
    reference case (bf16 sbhd s=16384), the Q+K one-launch path (GQA: 32 q heads, 8 kv heads,
    q+k = 320 MiB; every dtype on sbhd, every layout in bf16), the 64 MiB case (bf16, s=1024)
    per layout (forward+backward also under CUDA graphs) and the decode size per layout.
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
    for dt in mid_dtypes:  # the 64 MiB case in bf16: s=1024, b=8, h=32, d=128
        for layout in LAYOUTS:
            cases.append(BenchCase(f"64mib-{dt}-{layout}", "64mib",
                                   Config(seq_len=1024, batch=b, heads=h, head_dim=d, dtype=dt,
                                          layout=layout), graph_fwdbwd=True))
    return cases + decode_cases(mid_dtypes)


def decode_cases(dtypes=("bf16",)) -> list:
    """Decode size: one new token for 64 sequences (s=1, b=64, h=32, d=128), per layout, and
    with a KV-cache offset per sequence (start_positions) on sbhd: the host cost of an eager call
    and the latency under CUDA-graph replay."""
    cases = []
    for dt in dtypes:
        for layout, start in [(layout, False) for layout in LAYOUTS] + [("sbhd", True)]:
            cases.append(BenchCase(
                f"decode-{dt}-{layout}" + ("-start" if start else ""), "decode",
                Config(seq_len=1, batch=64, heads=32, head_dim=128, dtype=dt, layout=layout,
                       start_positions=start), graph=True, host=True))
    return cases


SWEEP_SEQ_LENS = tuple(128 * i for i in range(2, 32))  # 256, 384, ..., 3968


def sweep_cases(dtypes=("fp32",)) -> list:
    """A sweep over sequence length and batch: sbhd, 64 heads, head_dim 128, batch 1/2/4/8,
    seq 256...3968 (the sizes of notebook 07's sweep figures)."""
    return [BenchCase(f"sweep-{dt}-b{b}-s{s}", "sweep",
                      Config(seq_len=s, batch=b, heads=64, head_dim=128, dtype=dt,
                             layout="sbhd"))
            for dt in dtypes for b in (1, 2, 4, 8) for s in SWEEP_SEQ_LENS]


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
                           Config(**tiny, dtype=dt, layout="sbhd", kv_heads=1), graph_fwdbwd=True))
    cases.append(BenchCase(f"quick-decode-{dt}-bshd", "quick",
                           Config(seq_len=1, batch=2, heads=2, head_dim=16, dtype=dt,
                                  layout="bshd"), graph=True, host=True))
    return cases


def suite_cases(suite: str, dtypes=None, full_matrix: bool = False) -> list:
    """The cases of one suite; `dtypes` restricts (for decode/sweep: replaces) the dtypes."""
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
    if suite == "sweep":
        return sweep_cases(dtypes or ("fp32",))
    if suite == "floor":
        return []   # its own runner: ropelib.bench.floor
    return quick_cases(dtypes or DTYPES)


# --- CUDA-graph replay --------------------------------------------------------------------

GRAPH_PROVIDERS = (ROPELIB, TE_FUSED, TORCH_COMPILE)


def graph_replay_ms(fn: Callable[[], object], calls: int = 100, device="cuda") -> tuple:
    """Latency per call of `fn` under CUDA-graph replay: (median, p20, p80) in ms.

    `calls` invocations are captured into one torch.cuda.CUDAGraph; a replay is timed with
    do_bench and divided by `calls`. That takes Python and launch overhead out, as a decode
    loop captured in a graph does. On a device other than CUDA (the interpreter) the same calls
    run eagerly, wall clock: the plumbing is checked, the number means nothing.
    """
    import triton.testing

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if torch.device(device).type != "cuda":
        med, p20, p80 = compare.time_ms(lambda: [fn() for _ in range(calls)], device)
        return med / calls, p20 / calls, p80 / calls
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


def _capture_failed(e: Exception) -> str:
    """Why a CUDA-graph capture failed, for the CSV (after letting the device settle)."""
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass
    msg = str(e).splitlines()[0][:160] if str(e) else ""
    return f"capture failed: {type(e).__name__}: {msg}"


GRAPH_FIELDS = ("graph_fwd_ms", "graph_fwd_ms_p20", "graph_fwd_ms_p80", "graph_copy_fwd_ms",
                "graph_ratio_fwd", "graph_reason")


def _timing_device(device):
    """Where the graph and host timings run: `device` when given (the floor suite times tiny
    shapes on the CPU too), else the GPU, or None (not timed) without one."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda") if on_gpu() else None


def _not_timed(names: tuple, what: str) -> str:
    return f"not timed {what} ({', '.join(names)} only)"


def add_graph_timings(case: BenchCase, rows: list, provs: list, calls: int = 100,
                      names: tuple = GRAPH_PROVIDERS, device=None) -> None:
    """Fill GRAPH_FIELDS of a case's rows in place: forward under CUDA-graph replay for the
    providers in `names` (default ropelib, TE fused and torch.compile), and a copy of the same
    bytes. A provider that cannot be captured gets the reason in `graph_reason`; nothing
    raises. `device`: see _timing_device."""
    for r in rows:
        r.update({f: None for f in GRAPH_FIELDS}, graph_reason="")
    device = _timing_device(device)
    if device is None:
        for r in rows:
            r["graph_reason"] = "not timed: CUDA graphs need a GPU"
        return
    inputs = compare.make_case(case.config, device, seed=1)
    copy_once, _ = compare.copy_floor(inputs.tensors)
    copy_ms, copy_err = None, ""
    try:
        copy_ms = graph_replay_ms(copy_once, calls, device)[0]
    except Exception as e:  # noqa: BLE001 - reported in the CSV, never fatal
        copy_err = f"copy under graph failed: {type(e).__name__}: {str(e)[:120]}"
    by_name = {p.name: p for p in provs}
    for r in rows:
        r["graph_copy_fwd_ms"] = copy_ms
        name = r.get("provider")
        if name not in names:
            r["graph_reason"] = _not_timed(names, "under graphs")
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
                graph_replay_ms(fwd, calls, device)
            if copy_ms is not None:
                r["graph_ratio_fwd"] = copy_ms / r["graph_fwd_ms"]
            r["graph_reason"] = copy_err
        except Exception as e:  # noqa: BLE001 - e.g. a host sync inside the provider
            r["graph_reason"] = _capture_failed(e)


GRAPH_FWDBWD_FIELDS = ("graph_fwdbwd_ms", "graph_copy_fwdbwd_ms", "graph_ratio_fwdbwd",
                       "graph_fwdbwd_reason")


def add_graph_fwdbwd_timings(case: BenchCase, rows: list, provs: list, calls: int = 20,
                             names: tuple = GRAPH_PROVIDERS, device=None) -> None:
    """Fill GRAPH_FWDBWD_FIELDS in place: forward+backward of the providers in `names`
    (default ropelib, TE fused and torch.compile) captured in a CUDA graph (a training step
    captured whole runs so), against two copies of the same bytes captured the same way. The
    gradients are handed back (`compare.fwdbwd_step`), as a layer's are inside a model: summed
    into the inputs' .grad, which a replay never resets, they would add a third pass over the
    tensors to every call. `device`: see _timing_device."""
    for r in rows:
        r.update({f: None for f in GRAPH_FWDBWD_FIELDS}, graph_fwdbwd_reason="")
    device = _timing_device(device)
    if device is None:
        for r in rows:
            r["graph_fwdbwd_reason"] = "not timed: CUDA graphs need a GPU"
        return
    inputs = compare.make_case(case.config, device, seed=1)
    _, copy_twice = compare.copy_floor(inputs.tensors)
    copy_ms = graph_replay_ms(copy_twice, calls, device)[0]
    by_name = {p.name: p for p in provs}
    for r in rows:
        r["graph_copy_fwdbwd_ms"] = copy_ms
        name = r.get("provider")
        if name not in names or not r.get("available") or name not in by_name:
            r["graph_fwdbwd_reason"] = _not_timed(names, "under graphs") \
                if name not in names else "provider unavailable"
            continue
        p = by_name[name]
        gcase, leaves, grads = compare.fwdbwd_inputs(inputs, fill=0.5)
        fwdbwd = compare.fwdbwd_step(lambda p=p, gcase=gcase: p.fn(gcase), leaves, grads)
        try:
            r["graph_fwdbwd_ms"] = graph_replay_ms(fwdbwd, calls, device)[0]
            r["graph_ratio_fwdbwd"] = copy_ms / r["graph_fwdbwd_ms"]
        except Exception as e:  # noqa: BLE001 - reported in the CSV, never fatal
            r["graph_fwdbwd_reason"] = _capture_failed(e)


HOST_FIELDS = ("host_fwd_us", "host_fwdbwd_us", "host_copy_fwd_us", "host_copy_fwdbwd_us",
               "host_reason")
HOST_PROVIDERS = (ROPELIB, TE_FUSED)


def host_us(fn: Callable[[], object], calls: int = 300, reps: int = 5, device="cuda",
            warmup: int = 20) -> float:
    """Microseconds per call of fn() called back to back (no synchronisation in between), the
    best of `reps` runs. Where a call's device work is shorter than its host work (decode sizes)
    this is the host cost of the call: what an eager decode loop pays per call."""
    return host_us_interleaved({"fn": (fn, calls)}, reps, device, warmup)["fn"]


def host_us_interleaved(fns: dict, reps: int = 5, device="cuda", warmup: int = 20) -> dict:
    """host_us of several functions, {name: (fn, calls)} -> {name: µs per call}, taking turns:
    each round runs every function's `calls` calls once, so a slow spell of the host (another
    process, a frequency change) falls on all of them alike, not on whichever ran then. The best
    of `reps` rounds per function; a function that raises is left out of the later rounds and
    its exception is its value."""
    out = {}
    for name, (fn, calls) in fns.items():
        try:
            for _ in range(min(warmup, calls)):
                fn()
        except Exception as e:  # noqa: BLE001
            out[name] = e
    compare.sync(device)
    best = {name: float("inf") for name in fns if name not in out}
    for _ in range(reps):
        for name, (fn, calls) in fns.items():
            if name in out:
                continue
            t0 = time.perf_counter()
            try:
                for _ in range(calls):
                    fn()
                compare.sync(device)
            except Exception as e:  # noqa: BLE001
                out[name] = e
                continue
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    out.update((name, us) for name, us in best.items() if name not in out)
    return out


def add_host_timings(case: BenchCase, rows: list, provs: list, names: tuple = HOST_PROVIDERS,
                     device=None, calls: int = 300, reps: int = 5) -> None:
    """Fill HOST_FIELDS in place for the providers in `names` (default ropelib and TE fused):
    the host cost of an eager forward (no grad, `calls` calls back to back) and of a
    forward+backward (calls // 3), the providers taking turns round by round
    (`host_us_interleaved`); and on every row the host cost of copying the same tensors eagerly
    (once; twice for forward+backward), in the same rounds. `device`: see _timing_device."""
    for r in rows:
        r.update({f: None for f in HOST_FIELDS}, host_reason="")
    device = _timing_device(device)
    if device is None:
        for r in rows:
            r["host_reason"] = "not timed: host cost is measured against a GPU"
        return
    inputs = compare.make_case(case.config, device, seed=1)
    bwd_calls = max(1, calls // 3)
    copy_once, copy_twice = compare.copy_floor(inputs.tensors)
    fns = {("copy", "fwd"): (copy_once, calls), ("copy", "fwdbwd"): (copy_twice, bwd_calls)}
    by_name = {p.name: p for p in provs}
    timed = []
    for r in rows:
        name = r.get("provider")
        if name not in names or not r.get("available") or name not in by_name:
            r["host_reason"] = _not_timed(names, "on the host") \
                if name not in names else "provider unavailable"
            continue
        p = by_name[name]
        gcase, leaves, grads = compare.fwdbwd_inputs(inputs, fill=0.5)

        def fwd(p=p):
            with torch.no_grad():
                p.fn(inputs)

        fwdbwd = compare.fwdbwd_step(lambda p=p, gcase=gcase: p.fn(gcase), leaves, grads)
        fns[(name, "fwd")] = (fwd, calls)
        fns[(name, "fwdbwd")] = (fwdbwd, bwd_calls)
        timed.append(r)
    us = host_us_interleaved(fns, reps, device)
    for r in rows:
        r.update(host_copy_fwd_us=us[("copy", "fwd")], host_copy_fwdbwd_us=us[("copy", "fwdbwd")])
    for r in timed:
        fwd_us, fwdbwd_us = us[(r["provider"], "fwd")], us[(r["provider"], "fwdbwd")]
        failed = next((e for e in (fwd_us, fwdbwd_us) if isinstance(e, Exception)), None)
        if failed is not None:
            r["host_reason"] = f"failed: {type(failed).__name__}: {str(failed)[:120]}"
        else:
            r.update(host_fwd_us=fwd_us, host_fwdbwd_us=fwdbwd_us)


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


def _inverse(other: Optional[dict], mine: dict, field: str) -> Optional[float]:
    """other[field] / mine[field] for costs (> 1: mine costs less), None when either is missing."""
    return _speedup(other, mine, field)


def checks_for_case(case_rows: list) -> list:
    """ropelib's performance bars that apply in one case (a list of check dicts):

    - tensor(s) >= 256 MiB: ratio fwd >= 0.97 and fwd+bwd >= 0.95, and never slower than
      torch.compile (fwd, fwd+bwd);
    - 64 MiB <= tensor(s) < 256 MiB: ratio fwd+bwd >= 0.85, eager and (when measured) under
      CUDA-graph replay;
    - decode (seq_len == 1): an eager call's host cost no higher than TE fused's (fwd and
      fwd+bwd, when measured), and the forward under CUDA-graph replay no slower than
      torch.compile's.
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
    out = []
    if nbytes >= LARGE_BYTES:
        out.append(_check("ratio fwd >= 0.97", _num(me.get("ratio_fwd")), BAR_LARGE_FWD))
        if bwd:
            out.append(_check("ratio fwd+bwd >= 0.95", _num(me.get("ratio_fwdbwd")),
                              BAR_LARGE_FWDBWD))
        out.append(_check("fwd <= torch.compile", _speedup(tc_ok, me, "fwd_ms"), 1.0,
                          _missing(TORCH_COMPILE, tc)))
        if bwd:
            out.append(_check("fwd+bwd <= torch.compile", _speedup(tc_ok, me, "fwdbwd_ms"), 1.0,
                              _missing(TORCH_COMPILE, tc)))
    elif nbytes >= MID_BYTES:
        if bwd:
            out.append(_check("ratio fwd+bwd >= 0.85", _num(me.get("ratio_fwdbwd")),
                              BAR_MID_FWDBWD))
        if _num(me.get("graph_ratio_fwdbwd")) is not None:
            out.append(_check("graph fwd+bwd >= 0.85", _num(me.get("graph_ratio_fwdbwd")),
                              BAR_MID_FWDBWD))
    if _int(me.get("seq_len")) == 1:
        if _num(me.get("host_fwd_us")) is not None:
            out.append(_check("host fwd <= TE fused", _inverse(te_ok, me, "host_fwd_us"), 1.0,
                              (te_ok or {}).get("host_reason") or _missing(TE_FUSED, te)))
        if _num(me.get("host_fwdbwd_us")) is not None:
            out.append(_check("host fwd+bwd <= TE fused", _inverse(te_ok, me, "host_fwdbwd_us"),
                              1.0, (te_ok or {}).get("host_reason") or _missing(TE_FUSED, te)))
        if _num(me.get("graph_fwd_ms")) is not None:
            out.append(_check("graph fwd <= torch.compile", _speedup(tc_ok, me, "graph_fwd_ms"),
                              1.0, (tc_ok or {}).get("graph_reason")
                              or _missing(TORCH_COMPILE, tc)))
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
                "graph_ratio_fwdbwd": _num(r.get("graph_ratio_fwdbwd")),
                "host_fwd_us": _num(r.get("host_fwd_us")),
                "host_fwdbwd_us": _num(r.get("host_fwdbwd_us")),
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
    head = ("case", "provider", "fwd ratio", "fwdbwd ratio", "graph fwdbwd", "vs TE",
            "vs compile", "graph us", "host us fwd/fwdbwd", "bars cleared?")
    lines = []
    for s in summary:
        if providers_shown is not None and s["provider"] not in providers_shown:
            continue
        if not s["available"]:
            if unavailable or s["provider"] == ROPELIB:
                lines.append((s["case"], s["provider"], "-", "-", "", "", "", "", "",
                              f"did not run: {s['reason'][:70]}"))
            continue
        tgt = s["target"] + (f"  [{s['missed']}]" if s["missed"] else "")
        g = s["graph_fwd_ms"]
        host = "" if s["host_fwd_us"] is None else \
            f"{s['host_fwd_us']:.1f}/{_fmt(s['host_fwdbwd_us'], '.1f')}"
        lines.append((s["case"], s["provider"], _fmt(s["ratio_fwd"]), _fmt(s["ratio_fwdbwd"]),
                      _fmt(s["graph_ratio_fwdbwd"]) if s["graph_ratio_fwdbwd"] else "",
                      _fmt(s["vs_te_fwd"], ".2f", "x"), _fmt(s["vs_compile_fwd"], ".2f", "x"),
                      "" if g is None else f"{g * 1e3:.1f}", host, tgt))
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

def out_path(arg: Optional[str], suite: str, meta: dict) -> Path:
    """--out as given; a folder (existing, or ending in "/") gets the default file name."""
    if not arg:
        return default_out(suite, meta)
    p = Path(arg)
    if arg.endswith(("/", "\\")) or p.is_dir():
        return p / default_out(suite, meta).name
    return p


def default_out(suite: str, meta: dict) -> Path:
    """<suite>-<gpu-slug>-<date>.csv (floor: floor-<gpu-slug>.csv, one file per GPU) in the
    current directory on a GPU; a temp dir otherwise (interpreter timings are meaningless and
    the CPU suites are plumbing checks)."""
    gpu = str(meta.get("gpu") or "none")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    slug = compare.gpu_slug(gpu) if gpu != "none" else "cpu"
    name = f"floor-{slug}.csv" if suite == "floor" else f"{suite}-{slug}-{stamp}.csv"
    if on_gpu() and suite != "quick":
        return Path.cwd() / name
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
            if case.graph_fwdbwd and backward:
                add_graph_fwdbwd_timings(case, case_rows, provs)
            if case.host:
                add_host_timings(case, case_rows, provs)
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
