"""The floor suite: every row of the README's performance table, every installed provider side by
side, each timed against a device copy of the same bytes in the same run.

    python -m ropelib.bench --suite floor --out benchmarks/results/      # floor-<gpu>.csv
    TRITON_INTERPRET=1 python -m ropelib.bench --suite floor --out /tmp/floor.csv   # CPU, tiny
    python -m ropelib.bench.readme_table     # README's table from benchmarks/results/floor-*

Rows (`python -m ropelib.bench --suite floor --list`):

* plain RoPE, forward and forward+backward: 1 GiB bf16 and 2 GiB fp32 (sbhd, s16384 b8 h32
  d128), 256 MiB bf16 (s4096 b8) on sbhd, bshd, thd and interleaved sbhd, 128 MiB bf16 (sbhd
  s16384 b1); 64 MiB bf16 (s1024 b8) per layout, eagerly and under CUDA graphs;
* decode (s1 b64 h32 d128) per layout and with start positions: the host cost of an eager
  forward and forward+backward call, and the forward under CUDA graphs;
* multi-axis RoPE (Qwen2-VL's text attention, q+k, 8192 tokens x 4), forward and
  forward+backward; the same from transformers 4.x's materialised bf16 cos/sin tables
  (`ropelib.hf.apply_multimodal_rotary_pos_emb` against Liger's kernel on the same tables);
* fused QK-RMSNorm + RoPE (bshd b8 s4096, 32 q / 8 kv heads, bf16), forward and
  forward+backward;
* RoPE + KV-cache write at decode (b64, contiguous and paged caches, bf16 and fp8) under CUDA
  graphs.

The plain RoPE rows come from `ropelib.bench.compare.run_case` (every provider of
`compare.providers()`) and the CUDA-graph and host timers of `ropelib.bench.suite`; the others
from `ropelib.bench.multi_axis`, `qk_norm_rope` and `kv_cache_decode`, the code behind
benchmarks/mrope_bench.py, qk_norm_bench.py and decode_cache_bench.py. The CSV has the columns
`case, provider, ms, ratio_to_copy` (ratio = copy ms / provider ms; the copy is a row of its
own, ratio 1) under `# key: value` lines: GPU, versions, date, what the host and CUDA-graph rows
mean, and one `# skipped:` line per provider and reason that gave no row (not installed,
unsupported, failed). On a CPU (Triton's interpreter) every row runs on tiny stand-in shapes
through the same code: the plumbing is checked, the timings mean nothing.
"""
import csv
import importlib.metadata
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from . import compare, kv_cache_decode, multi_axis, qk_norm_rope, suite
from .compare import Config
from .suite import BenchCase
from ..conventions import LAYOUTS
from ..runtime import on_gpu

FIELDS = ("case", "provider", "ms", "ratio_to_copy")
COPY = "copy"
PASS_NAMES = {"fwd": "forward", "fwd+bwd": "forward+backward"}
UNDER_GRAPHS = "under CUDA graphs"
HOST_PREFIX = "decode host"   # rows whose ms is host time per eager call
# timed under CUDA-graph replay: the libraries a user captures in a graph (plain PyTorch, TE's
# unfused path and the teaching kernels are left out: their host loops may not capture)
GRAPH_PROVIDERS = ("ropelib", "te_fused", "torch.compile", "liger", "flash_attn")
# a plain RoPE provider whose forward is further than this from the fp64 reference, in units in
# the last place of each head's largest value (compare.error_metrics' max_head_ulp_err), is not
# timed into the table: every provider measured so far stays under 3 (a wrong layout or pairing
# is off by hundreds)
MAX_HEAD_ULPS = 64


def is_host_case(case: str) -> bool:
    """Rows whose ms is host milliseconds per eager call, not device time."""
    return case.startswith(HOST_PREFIX)


# --- how a run measures -------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """Sizes and repetitions of one run: full sizes on a GPU, tiny stand-ins elsewhere."""
    tiny: bool                  # interpreter stand-in shapes (case names keep the GPU sizes)
    device: torch.device
    graph_calls: int            # calls captured per CUDA graph at decode (replay / calls)
    graph_fwdbwd_calls: int     # forward+backward calls captured per graph at 64 MiB
    host_calls: int             # eager calls back to back per host-cost run (fwd+bwd: a third)
    host_reps: int              # host-cost runs, the best one kept


def settings_for(device, graph_calls: int = 100) -> Settings:
    device = torch.device(device)
    if device.type == "cuda":
        return Settings(False, device, graph_calls, 20, 300, 5)
    return Settings(True, device, 1, 1, 1, 1)    # each interpreted launch costs ~0.1 s


@dataclass
class Measured:
    """Rows (case, provider, ms, ratio_to_copy) and the (case, provider, reason) left out."""
    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def add(self, case: str, provider: str, ms: Optional[float], copy_ms: Optional[float],
            reason: str = "") -> None:
        """A row when `ms` was measured, else a skipped entry with `reason`."""
        if ms is None or not ms > 0:
            self.skipped.append((case, provider, _one_line(reason) or "not measured"))
            return
        ratio = copy_ms / ms if copy_ms else None
        self.rows.append(dict(case=case, provider=provider, ms=ms, ratio_to_copy=ratio))

    def extend(self, other: "Measured") -> None:
        self.rows += other.rows
        self.skipped += other.skipped


def _one_line(text, limit: Optional[int] = 200) -> str:
    return re.sub(r"\s+", " ", str(text or "")).strip()[:limit]


# --- plain RoPE ---------------------------------------------------------------------------

# label -> Config fields at full size (b8 h32 d128 bf16 sbhd unless said)
LARGE = (("1 GiB bf16 sbhd", dict(seq_len=16384)),
         ("2 GiB fp32 sbhd", dict(seq_len=16384, dtype="fp32")),
         ("256 MiB bf16 sbhd", dict(seq_len=4096)),
         ("128 MiB bf16 sbhd", dict(seq_len=16384, batch=1)),
         ("256 MiB bf16 bshd", dict(seq_len=4096, layout="bshd")),
         ("256 MiB bf16 thd", dict(seq_len=4096, layout="thd")),
         ("256 MiB bf16 sbhd interleaved", dict(seq_len=4096, interleaved=True)))
MID = tuple((f"64 MiB bf16 {layout}", dict(seq_len=1024, layout=layout)) for layout in LAYOUTS)
DECODE = tuple((layout, dict(seq_len=1, batch=64, layout=layout)) for layout in LAYOUTS) + (
    ("sbhd start positions", dict(seq_len=1, batch=64, start_positions=True)),)


def _config(fields: dict, tiny: bool) -> Config:
    """The Config of a row at full size, or its tiny stand-in (same dtype, layout, mode)."""
    spec = dict(dict(batch=8, heads=32, head_dim=128, dtype="bf16", layout="sbhd"), **fields)
    if tiny:
        decode = spec["seq_len"] == 1
        spec.update(seq_len=1 if decode else 8, batch=3 if decode else min(spec["batch"], 2),
                    heads=2, head_dim=16)
    return Config(**spec)


def rope_cases(tiny: bool = False) -> list:
    """The plain RoPE cases as suite.BenchCase: name = the label the row names end with."""
    cases = [BenchCase(label, "floor", _config(f, tiny)) for label, f in LARGE]
    cases += [BenchCase(label, "floor-64mib", _config(f, tiny), graph_fwdbwd=True)
              for label, f in MID]
    cases += [BenchCase(label, "floor-decode", _config(f, tiny), graph=True, host=True)
              for label, f in DECODE]
    return cases


def rope_case_names(case: BenchCase) -> tuple:
    """The `case` values of a plain RoPE case's rows."""
    if case.host:
        return (f"{HOST_PREFIX} forward {case.name}", f"{HOST_PREFIX} forward+backward {case.name}",
                f"decode forward {case.name} {UNDER_GRAPHS}")
    names = (f"forward {case.name}", f"forward+backward {case.name}")
    if case.graph_fwdbwd:
        names += (f"forward+backward {case.name} {UNDER_GRAPHS}",)
    return names


def measure_rope_case(case: BenchCase, settings: Settings, provs: list) -> Measured:
    """Every provider on one plain RoPE case, with the copy, in this run (decode: host cost and
    CUDA graphs only; their eager device time is the host's)."""
    dev = settings.device
    wide = compare.run_case(case.config, provs, backward=not case.host, device=dev)
    if case.graph_fwdbwd:
        suite.add_graph_fwdbwd_timings(case, wide, provs, settings.graph_fwdbwd_calls,
                                       names=GRAPH_PROVIDERS, device=dev)
    if case.host:
        suite.add_host_timings(case, wide, provs, names=tuple(p.name for p in provs),
                               device=dev, calls=settings.host_calls, reps=settings.host_reps)
        suite.add_graph_timings(case, wide, provs, settings.graph_calls, names=GRAPH_PROVIDERS,
                                device=dev)
    return rope_rows(case, wide)


def rope_rows(case: BenchCase, wide: list) -> Measured:
    """compare.run_case's rows (one per provider, with the suite's graph and host fields)
    turned into floor rows: one per (row name, provider), the copy first."""
    out = Measured()
    names = rope_case_names(case)
    if case.host:
        # (row name, provider's field, copy's field, scale to ms, reason field, providers)
        plan = [(names[0], "host_fwd_us", "host_copy_fwd_us", 1e-3, "host_reason", None),
                (names[1], "host_fwdbwd_us", "host_copy_fwdbwd_us", 1e-3, "host_reason", None),
                (names[2], "graph_fwd_ms", "graph_copy_fwd_ms", 1.0, "graph_reason",
                 GRAPH_PROVIDERS)]
    else:
        plan = [(names[0], "fwd_ms", "copy_fwd_ms", 1.0, "reason", None),
                (names[1], "fwdbwd_ms", "copy_fwdbwd_ms", 1.0, "reason", None)]
        if case.graph_fwdbwd:
            plan.append((names[2], "graph_fwdbwd_ms", "graph_copy_fwdbwd_ms", 1.0,
                         "graph_fwdbwd_reason", GRAPH_PROVIDERS))
    for row_name, ms_field, copy_field, scale, reason_field, only in plan:
        copy_ms = _scaled(wide[0].get(copy_field), scale)
        out.add(row_name, COPY, copy_ms, copy_ms, "the copy could not be timed")
        for r in wide:
            if only is not None and r["provider"] not in only:
                continue
            wrong = _wrong_result(r)
            ms = None if wrong else _scaled(r.get(ms_field), scale)
            why = wrong or (r.get(reason_field) if r.get("available") else r.get("reason"))
            out.add(row_name, r["provider"], ms, copy_ms, why)
    return out


def _wrong_result(row: dict) -> str:
    """Why a run_case row's output is too far from the fp64 reference to be timed, or ""."""
    err = row.get("max_head_ulp_err")
    if err is None or err <= MAX_HEAD_ULPS:
        return ""
    return (f"output differs from the fp64 reference ({err:.3g} ulps of its head's largest "
            f"value, more than {MAX_HEAD_ULPS})")


def _scaled(value, scale: float) -> Optional[float]:
    return None if value is None else value * scale


# --- the features ---------------------------------------------------------------------------

MULTI_AXIS_CASE = "multi-axis q+k {pass_name} Qwen2-VL b4 s8192 bf16"
TABLES_CASE = "multi-axis q+k from bf16 tables {pass_name} Qwen2-VL b4 s8192"
QK_NORM_CASE = "QK-RMSNorm + RoPE {pass_name} bf16 bshd b8 s4096 32/8 heads"
KV_CACHE_CASE = "RoPE + KV-cache write decode b64 {cache} {dtype} cache " + UNDER_GRAPHS
KV_CACHE_VARIANTS = (("contiguous", "bf16"), ("paged", "bf16"), ("contiguous", "fp8"),
                     ("paged", "fp8"))
KV_CACHE_DTYPES = {"bf16": torch.bfloat16, "fp8": kv_cache_decode.FP8}
KV_CACHE_PROVIDERS = {"fused": "ropelib", "unfused": "ropelib_unfused"}


def feature_rows(rows: list, template: str, rename: dict) -> Measured:
    """A feature benchmark's rows (provider, pass, ms, available, reason; a "copy" provider
    among them) as floor rows: `template` names the case from the pass, `rename` maps the
    benchmark's provider names to the floor's."""
    out = Measured()
    copy_ms = {r["pass"]: r.get("ms") for r in rows if r["provider"] == COPY}
    for r in sorted(rows, key=lambda r: r["provider"] != COPY):     # the copy first
        case = template.format(pass_name=PASS_NAMES[r["pass"]])
        ms = r.get("ms") if r["available"] else None
        out.add(case, rename.get(r["provider"], r["provider"]), ms, copy_ms.get(r["pass"]),
                r.get("reason") or "not timed")
    return out


def measure_multi_axis(settings: Settings, provs: list) -> Measured:
    rows = multi_axis.measure_case("mrope", tiny=settings.tiny, timed=True,
                                   device=settings.device)
    return feature_rows(rows, MULTI_AXIS_CASE, {"hf_eager": "transformers",
                                                "hf_compile": "torch.compile"})


def measure_multi_axis_tables(settings: Settings, provs: list) -> Measured:
    rows = multi_axis.measure_tables_case("mrope", tiny=settings.tiny, timed=True,
                                          device=settings.device)
    return feature_rows(rows, TABLES_CASE, {})


def measure_qk_norm(settings: Settings, provs: list) -> Measured:
    rows = qk_norm_rope.measure(tiny=settings.tiny, timed=True, device=settings.device,
                                with_copy=True)
    return feature_rows(rows, QK_NORM_CASE, {"torch_compile": "torch.compile",
                                             "eager": "pytorch"})


def measure_kv_cache(cache: str, dtype: str, settings: Settings, provs: list) -> Measured:
    """A decode step (b64; tiny: b3) of RoPE + KV-cache write, fused and unfused, each replayed
    from a CUDA graph, against one copy kernel of the bytes the step reads."""
    out = Measured()
    case = KV_CACHE_CASE.format(cache=cache, dtype=dtype)
    batch = kv_cache_decode.TINY["batches"][-1] if settings.tiny else 64
    c = kv_cache_decode.decode_case(batch, cache == "paged", KV_CACHE_DTYPES[dtype],
                                    tiny=settings.tiny, device=settings.device)
    copy_ms = _replay_ms(kv_cache_decode.copy_of_the_same_bytes(c), settings)
    out.add(case, COPY, copy_ms[0], copy_ms[0], copy_ms[1])
    try:
        kv_cache_decode.check(c)
    except Exception as e:  # noqa: BLE001 -- a wrong result is never timed
        for name in KV_CACHE_PROVIDERS.values():
            out.add(case, name, None, None, f"{type(e).__name__}: {e}")
        return out
    for name, step in kv_cache_decode.PROVIDERS.items():
        ms, why = _replay_ms(lambda step=step: step(c), settings)
        out.add(case, KV_CACHE_PROVIDERS[name], ms, copy_ms[0], why)
    return out


def _replay_ms(fn, settings: Settings) -> tuple:
    """(ms per call under CUDA-graph replay, or None and why)."""
    try:
        return suite.graph_replay_ms(fn, settings.graph_calls, settings.device)[0], ""
    except Exception as e:  # noqa: BLE001 -- reported in the CSV, never fatal
        try:
            compare.sync(settings.device)
        except Exception:  # noqa: BLE001
            pass
        return None, f"capture or replay failed: {type(e).__name__}: {e}"


# --- the suite ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    """A unit of the run: the case names its rows take and the function that measures it."""
    name: str
    case_names: tuple
    measure: Callable[[Settings, list], Measured]


def _passes(template: str) -> tuple:
    return tuple(template.format(pass_name=p) for p in PASS_NAMES.values())


def parts(tiny: bool = False) -> list:
    """Every part of the floor suite, in run order."""
    out = [Part(f"decode {c.name}" if c.host else c.name, rope_case_names(c),
                lambda settings, provs, c=c: measure_rope_case(c, settings, provs))
           for c in rope_cases(tiny)]
    out += [Part("multi-axis", _passes(MULTI_AXIS_CASE), measure_multi_axis),
            Part("multi-axis from bf16 tables", _passes(TABLES_CASE), measure_multi_axis_tables),
            Part("QK-RMSNorm + RoPE", _passes(QK_NORM_CASE), measure_qk_norm)]
    out += [Part(f"KV-cache {cache} {dtype}", (KV_CACHE_CASE.format(cache=cache, dtype=dtype),),
                 lambda settings, provs, cache=cache, dtype=dtype:
                 measure_kv_cache(cache, dtype, settings, provs))
            for cache, dtype in KV_CACHE_VARIANTS]
    return out


def case_names(tiny: bool = False) -> list:
    """Every row name of the suite, in order."""
    return [name for part in parts(tiny) for name in part.case_names]


def select_parts(all_parts: list, pattern: Optional[str]) -> list:
    """The parts with a part name or row name matching the regular expression `pattern`."""
    if not pattern:
        return list(all_parts)
    rx = re.compile(pattern)
    return [p for p in all_parts if rx.search(p.name) or any(rx.search(n) for n in p.case_names)]


def run(settings: Settings, provs: list, selected: Optional[list] = None,
        progress: bool = True) -> Measured:
    """Measure every part (or `selected`); a part that raises leaves a skipped entry per row
    name, and the run goes on."""
    out = Measured()
    t0 = time.time()
    for part in selected if selected is not None else parts(settings.tiny):
        if progress:
            print(f"[{time.time() - t0:5.0f} s] {part.name}", file=sys.stderr, flush=True)
        try:
            out.extend(part.measure(settings, provs))
        except Exception as e:  # noqa: BLE001 -- one broken part must not lose the others
            for name in part.case_names:
                out.skipped.append((name, "every provider", _one_line(
                    f"the part failed: {type(e).__name__}: {e}")))
    return out


# --- the CSV ----------------------------------------------------------------------------------

def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except Exception:  # noqa: BLE001
        return "not installed"


def _flash_attn_version() -> str:
    """flash-attn's version; where only its Triton rotary is on the path (a package without
    metadata, as benchmarks/gpu_wheels.sh builds it), the version that package names."""
    installed = _version("flash-attn")
    if installed != "not installed":
        return installed
    try:
        import flash_attn
        return f"{flash_attn.__version__} (its Triton rotary only)"
    except Exception:  # noqa: BLE001
        return "not installed"


def header(settings: Settings, elapsed_s: float) -> dict:
    """The `# key: value` lines: environment_meta() and what the rows mean."""
    meta = compare.environment_meta()
    meta.update(suite="floor", liger_kernel=_version("liger-kernel"),
                flash_attn=_flash_attn_version(), transformers=_version("transformers"))
    if settings.tiny:
        meta["sizes"] = ("tiny stand-ins (Triton's interpreter); the case names give the GPU "
                         "sizes")
        meta["timing"] = "wall clock in Triton's interpreter: MEANINGLESS (plumbing only)"
    else:
        meta["sizes"] = "as the case names say"
        meta["timing"] = ("triton.testing.do_bench median ms (L2 flushed between calls), every "
                          "provider and the copy one after the other in this process; "
                          f"forward+backward: the median of {compare.FWDBWD_ROUNDS} rounds, each "
                          "timing every provider and the copy in turn, gradients returned by "
                          "torch.autograd.grad (not summed into .grad); the multi-axis "
                          "rows, forward too: the median of their rounds "
                          "(ropelib.bench.multi_axis, compare.time_in_rounds)")
    meta["ratio_to_copy"] = ("copy ms / provider ms, the copy of the same tensors timed in the "
                             "same run (1 = a copy's speed); forward+backward rows: two copies")
    meta["host_rows"] = (f"'{HOST_PREFIX} ...': ms = host milliseconds per eager call (calls "
                         f"back to back: {settings.host_calls}, a third of that for "
                         f"forward+backward; best of {settings.host_reps} rounds, in which every provider and "
                         "the copy take turns); ratio_to_copy "
                         "= the host cost of an eager copy call of the same tensors / this (two "
                         "copy calls for forward+backward)")
    meta["graph_rows"] = (f"'... {UNDER_GRAPHS}': ms per replayed call (calls captured per CUDA "
                          f"graph: {settings.graph_calls}, 64 MiB forward+backward: "
                          f"{settings.graph_fwdbwd_calls}; replay time / calls); plain RoPE "
                          f"timed so for {', '.join(GRAPH_PROVIDERS)}; the KV-cache copy is one "
                          "copy kernel of the bytes the step reads")
    meta["providers"] = ("copy = device copy of the same tensors; ropelib in 'from bf16 "
                         "tables' rows = ropelib.hf.apply_multimodal_rotary_pos_emb; "
                         "ropelib_unfused = apply_rope_qk then write_kv_cache; transformers = "
                         "transformers' own code, eagerly; pytorch = the row's math in plain "
                         "PyTorch, eagerly; torch.compile = that PyTorch under torch.compile "
                         "(plain RoPE: Hugging Face's x*cos + rotate_half(x)*sin, tables in the "
                         "input dtype); the rest: ropelib.bench.compare.providers()")
    meta["elapsed_s"] = f"{elapsed_s:.0f}"
    return meta


def skipped_lines(measured: Measured) -> list:
    """One line per (provider, reason): the provider, the rows it gave none for ("all N rows
    it was tried in" when that is every one), why."""
    by_reason: dict = {}
    for case, provider, reason in measured.skipped:
        by_reason.setdefault((provider, reason), []).append(case)
    tried: dict = {}
    for case, provider in [(r["case"], r["provider"]) for r in measured.rows] + \
            [(case, provider) for case, provider, _ in measured.skipped]:
        tried.setdefault(provider, set()).add(case)
    lines = []
    for (provider, reason), cases in by_reason.items():
        cases = list(dict.fromkeys(cases))
        where = f"all {len(cases)} rows it was tried in" if len(cases) > 1 and \
            set(cases) == tried[provider] else "; ".join(cases)
        lines.append(f"{provider} in {where}: {reason}")
    return lines


def write(path, meta: dict, measured: Measured, skipped: Optional[list] = None) -> str:
    """The CSV: `# key: value` lines, `# skipped: ...` lines (`skipped`, else the measured
    run's), then FIELDS."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        for k, v in meta.items():
            f.write(f"# {k}: {_one_line(v, limit=None)}\n")   # (whole: the table reads them)
        for line in skipped_lines(measured) if skipped is None else skipped:
            f.write(f"# skipped: {line}\n")
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")   # (one line ending)
        w.writeheader()
        for r in measured.rows:
            w.writerow(dict(case=r["case"], provider=r["provider"], ms=f"{r['ms']:.6g}",
                            ratio_to_copy="" if r["ratio_to_copy"] is None
                            else f"{r['ratio_to_copy']:.6g}"))
    return str(path)


@dataclass
class FloorCSV:
    """A floor CSV read back: its header (without the skipped lines), those lines, its rows."""
    path: Path
    meta: dict
    skipped: list
    rows: list


def read(path) -> FloorCSV:
    """A CSV written by `write`: ms and ratio_to_copy as floats (a blank ratio as None)."""
    meta, skipped, lines = {}, [], []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("# skipped: "):
                skipped.append(line[len("# skipped: "):].rstrip("\n"))
            elif line.startswith("# "):
                k, _, v = line[2:].rstrip("\n").partition(": ")
                meta[k] = v
            else:
                lines.append(line)
    reader = csv.DictReader(lines)
    if tuple(reader.fieldnames or ()) != FIELDS:
        raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(FIELDS)}")
    rows = [dict(case=r["case"], provider=r["provider"], ms=float(r["ms"]),
                 ratio_to_copy=float(r["ratio_to_copy"]) if r["ratio_to_copy"] else None)
            for r in reader]
    return FloorCSV(Path(path), meta, skipped, rows)


def _less_cases(line: str, names: set) -> Optional[str]:
    """A `# skipped:` line ("provider in case; case: reason", case names holding no ": ",
    reasons may) without the cases of `names`: None when it named no other case, the line as
    it is when it names none of them (or every row its provider was tried in)."""
    provider, _, rest = line.partition(" in ")
    where, _, reason = rest.partition(": ")
    cases = [c for c in where.split("; ") if c]
    left = [c for c in cases if c not in names]
    if len(left) == len(cases):
        return line
    return f"{provider} in {'; '.join(left)}: {reason}" if left else None


def write_into(path, meta: dict, measured: Measured, selected: list) -> str:
    """The rows of the `selected` parts, just measured, written into the floor CSV at `path`
    in place of its rows of those parts; the rest of it stays as it was. Its header keeps its
    own run's lines and gains a `replaced_rows` line naming the parts and this run (date,
    versions): every row still compares providers and a copy timed side by side in one run,
    and the header says which run."""
    base = read(path)
    if base.meta.get("gpu") != meta.get("gpu"):
        raise ValueError(f"{path} was measured on {base.meta.get('gpu')!r}, this run on "
                         f"{meta.get('gpu')!r}: rows of one GPU only")
    names = {n for part in selected for n in part.case_names}
    if not any(r["case"] in names for r in base.rows):
        raise ValueError(f"{path} has no rows of the parts {[p.name for p in selected]}")
    rows, placed = [], False
    for r in base.rows:
        if r["case"] not in names:
            rows.append(r)
        elif not placed:
            rows += measured.rows
            placed = True
    merged = Measured(rows=rows, skipped=measured.skipped)
    skipped = [kept for kept in (_less_cases(line, names) for line in base.skipped) if kept]
    skipped += skipped_lines(measured)
    env = {k: meta.get(k, "?") for k in ("date", "torch", "triton", "transformers",
                                         "liger_kernel")}
    out = dict(base.meta)
    this_run = (", ".join(p.name for p in selected) + LATER_RUN
                + ", ".join(f"{k} {v}" for k, v in env.items())
                + f"; its timing: {meta.get('timing', '?')}")
    # earlier replacements stay named, less the parts this run measured again
    chosen = {p.name for p in selected}
    kept = []
    for entry in replacements(base.meta):
        parts, _, later = entry.partition(LATER_RUN)
        left = [name for name in parts.split(", ") if name not in chosen]
        if left:
            kept.append(", ".join(left) + LATER_RUN + later)
    out["replaced_rows"] = REPLACEMENT_SEPARATOR.join(kept + [this_run])
    return write(path, out, merged, skipped)


LATER_RUN = " from a later run: "
REPLACEMENT_SEPARATOR = " | "


def replacements(meta: dict) -> list:
    """The `replaced_rows` entries of a floor CSV's header, oldest first: each "<parts> from a
    later run: <date, versions>; its timing: ..." (write_into)."""
    text = meta.get("replaced_rows")
    return text.split(REPLACEMENT_SEPARATOR) if text else []


def summary(measured: Measured) -> str:
    """One line per case: each provider's ratio to the copy (host rows: µs per call)."""
    by_case: dict = {}
    for r in measured.rows:
        by_case.setdefault(r["case"], []).append(r)
    lines = []
    for case, rows in by_case.items():
        if is_host_case(case):
            cells = [f"{r['provider']} {r['ms'] * 1e3:.1f} us" for r in rows]
        else:
            cells = [f"{r['provider']} " + ("-" if r["ratio_to_copy"] is None
                                            else f"{r['ratio_to_copy']:.3f}") for r in rows]
        lines.append(f"{case}: " + ", ".join(cells))
    return "\n".join(lines)


def main(provs: list, out: Path, selected: list, graph_calls: int = 100,
         reserved_gib: float = 0.0, into: Optional[Path] = None) -> int:
    """`python -m ropelib.bench --suite floor`, after ropelib.bench.cli parsed the arguments: measure
    the `selected` parts with `provs` for the plain RoPE rows, write the CSV to `out`, or
    (`into`) into that floor CSV in place of its rows of those parts (`write_into`)."""
    settings = settings_for("cuda" if on_gpu() else "cpu", graph_calls)
    t0 = time.time()
    measured = run(settings, provs, selected)
    meta = header(settings, time.time() - t0)
    if reserved_gib:
        meta["allocator_reserved_gib"] = f"{reserved_gib:g}"
    if into is not None:
        out = into
        write_into(out, meta, measured, selected)
    else:
        write(out, meta, measured)
    print(summary(measured))
    print(f"{len(measured.rows)} rows, {len(selected)} parts in {meta['elapsed_s']} s; "
          f"{len(skipped_lines(measured))} skipped lines -> {out}")
    return 0
