"""The committed GPU measurements that notebooks 03, 04, 05 and 07 explain, read back from
``benchmarks/results/`` and nothing else.

One GPU for every number the notebooks show: the H200 run (``*-nvidia-h200.csv``); an H100 CSV
(``floor``, ``two_pass``) is read only where a notebook sets the two GPUs side by side. Notebook
05's section on the two-pass route reads ``two_pass-nvidia-h200.csv`` (:func:`two_pass`) and the
two probes of the flat pass, ``flat_pass_probe-nvidia-h200.csv`` and
``flat_hints_probe-nvidia-h200.csv`` (:func:`probe`). Notebook 05's Little's law reads
``memory_latency-nvidia-h200.csv`` (a pointer chase: one load's latency from L1, L2 and DRAM,
idle and beside a copy; :func:`loads_in_flight_need` gives the need notebook 03 quotes too) and
notebook 03's section on coalescing ``access_counters-nvidia-h200.csv``
(the pair swap under Nsight Compute). Every CSV starts with ``# key: value``
lines naming the GPU, driver and versions (:func:`ropelib.bench.compare.read_meta`).

``mechanism-nvidia-h200.csv`` holds, for each kernel variant, what the compiler and Nsight
Compute reported (registers, grid, theoretical and achieved occupancy, DRAM bytes, warp
instructions). :func:`mechanism` adds what follows from those columns and the shape alone:

* ``steps``: the batch iterations one program makes. A 1-D grid (copy, naive) makes one; a 2-D
  grid ``(S, H-tiles)`` loops over the whole batch; a 3-D grid over ``B / grid_z`` entries;
* ``x_bytes_per_program``, ``x_bytes_per_step`` (the x one program loads per batch iteration,
  both halves) and ``x_bytes_per_warp_step`` (that over the program's warps);
* ``resident_warps``: achieved occupancy × 64 warps per SM (the measured average);
* ``x_kib_per_sm``: resident warps × x bytes per warp step / 1024: the x bytes that the warps on
  one SM ask for in one batch step. It is **derived, not a counter**: an upper bound on the bytes
  of x in flight per SM, reached only while every resident warp waits on its loads at once;
* ``ns_per_program``: Nsight Compute's duration / programs, and ``us`` the duration in µs.

``mechanism-te-nvidia-h200.csv`` is a later run of the same script with Transformer Engine
installed. Transformer Engine's fused RoPE (variant ``te_fused``) is a CUDA C++ kernel: it has no Triton
columns, so its grid, warps and registers are Nsight Compute's launch columns (``ncu_grid_size``
blocks of ``ncu_block_size`` threads, one block per (token, batch entry): one step).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from ..bench import compare

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GPU = "nvidia-h200"          # the run every performance number of notebooks 03-07 comes from
WARPS_PER_SM = 64            # Hopper: 2048 resident threads per SM
PEAK_TB_S = (("H200", 4.8), ("H100 80GB HBM3", 3.35), ("H100 SXM", 3.35))
"""NVIDIA's datasheet figure for a GPU's memory bandwidth (TB/s), by a fragment of its name."""


def peak_tb_s(gpu: str):
    """NVIDIA's figure for the memory bandwidth (TB/s) of the GPU named `gpu` (as
    torch.cuda.get_device_name or a CSV's `gpu` line gives it); None if it is not in PEAK_TB_S."""
    for name, tb_s in PEAK_TB_S:
        if name in gpu:
            return tb_s
    return None


def path(kind: str, gpu: str = GPU) -> Path:
    """``benchmarks/results/<kind>-<gpu>.csv``, e.g. ``path("ladder")``."""
    return RESULTS / f"{kind}-{gpu}.csv"


def load(kind: str, gpu: str = GPU) -> tuple:
    """(meta, rows) of a committed result CSV. Raises FileNotFoundError saying what measures it,
    and ValueError when its header names no GPU (a CPU dry run is not a measurement)."""
    p = path(kind, gpu)
    if not p.exists():
        raise FileNotFoundError(f"{p} is not in this checkout: `python benchmarks/{kind}.py` "
                                "on a GPU measures it")
    meta = compare.read_meta(p)
    if meta.get("gpu") in (None, "", "none"):
        raise ValueError(f"{p.name}: its header names no GPU, so it holds no GPU timings")
    return meta, compare.read_csv(p)


def where(meta: dict) -> str:
    """One line naming where and when a CSV was measured."""
    date = f", {meta['date'][:10]}" if meta.get("date") else ""   # the probes' CSVs have none
    return f"{meta['gpu']}, torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}{date}"


def steps(row: dict) -> int:
    """Batch iterations one program makes, from the launch grid and the batch size."""
    grid = [int(g) for g in str(row["grid"]).split("x")]
    if len(grid) == 1:
        return 1
    if len(grid) == 2:
        return int(row["batch"])
    return math.ceil(int(row["batch"]) / grid[2])


def derive(row: dict) -> dict:
    """A mechanism row with the derived columns of the module docstring added."""
    r = dict(row)
    if r.get("grid") is None and r.get("ncu_grid_size"):   # a CUDA kernel: ncu's launch columns
        r.update(grid=str(r["ncu_grid_size"]), programs=r["ncu_grid_size"],
                 num_warps=r["ncu_block_size"] // 32, registers=r.get("ncu_registers"))
    e = compare.DTYPES[r["dtype"]].itemsize
    r["steps"] = steps(r)
    r["x_bytes_per_program"] = r["elements"] * e / r["programs"]
    r["x_bytes_per_step"] = r["x_bytes_per_program"] / r["steps"]
    r["x_bytes_per_warp_step"] = r["x_bytes_per_step"] / r["num_warps"]
    r["resident_warps"] = r["ncu_achieved_occupancy_pct"] / 100 * WARPS_PER_SM
    r["x_kib_per_sm"] = r["resident_warps"] * r["x_bytes_per_warp_step"] / 1024
    r["us"] = r["ncu_duration_ns"] / 1e3
    r["ns_per_program"] = r["ncu_duration_ns"] / r["programs"]
    return r


def mechanism(case: str = "s4096-b8", gpu: str = GPU, kind: str = "mechanism") -> dict:
    """{variant: derived row} of one case of ``mechanism-<gpu>.csv`` (rows that ran and were
    profiled; a failed variant is left out). ``kind="mechanism-te"``: the run with Transformer
    Engine installed (``mechanism-te-<gpu>.csv``), the one that profiled TE's own kernel."""
    _, rows = load(kind, gpu)
    out = {r["variant"]: derive(r) for r in rows
           if r["case"] == case and r["status"] == "ok" and r.get("ncu_duration_ns")}
    if not out:
        raise ValueError(f"{kind}-{gpu}.csv has no profiled rows for case {case!r}")
    return out


def loads_in_flight_need(gpu: str = GPU) -> dict:
    """Little's law's need for loads in flight per SM (notebook 05, section 2): to read at the
    profiled copy's DRAM read rate ``w_read`` (Nsight Compute's DRAM bytes read over its time, B/s),
    loads worth ``w_read`` x one load's latency from idle DRAM (``latency_ns``, the pointer chase
    over a 1 GiB buffer of ``memory_latency-<gpu>.csv``) must be outstanding, ``kib_per_sm`` KiB
    on each of ``sms`` SMs."""
    lat_meta, lat_rows = load("memory_latency", gpu)
    (ns,) = [r["ns_per_load"] for r in lat_rows if r["measure"] == "latency"
             and r["condition"] == "idle" and int(r["footprint_bytes"]) == 2**30]
    copy = mechanism("s4096-b8", gpu)["copy"]
    w_read = copy["ncu_dram_read_bytes"] / (copy["us"] * 1e-6)
    sms = int(lat_meta["sms"])
    return {"w_read": w_read, "latency_ns": ns, "sms": sms,
            "kib_per_sm": w_read / sms * ns * 1e-9 / 1024}


def timings(kind: str, case: str, gpu: str = GPU) -> dict:
    """{name: row} of one case of a do_bench CSV: ``ablation`` (keyed by variant), ``ladder``
    (keyed by provider). Only timed rows."""
    _, rows = load(kind, gpu)
    key = {"ablation": "variant", "ladder": "provider"}[kind]
    return {r[key]: r for r in rows if r["case"] == case and r.get("ms")}


def floor(gpu: str = GPU, kind: str = "floor") -> dict:
    """{case: {provider: row}} of ``floor-<gpu>.csv`` (ms, ratio_to_copy), or of another run of
    the floor suite kept under its own kind: ``floor_grads_summed-<gpu>-20261129-1219.csv``, the
    run before forward+backward timings handed their gradients back, whose CUDA-graph
    forward+backward rows also sum them into ``.grad``; ``floor_rounds-<gpu>-20261130-1101.csv``,
    the first run after."""
    _, rows = load(kind, gpu)
    out = {}
    for r in rows:
        out.setdefault(r["case"], {})[r["provider"]] = r
    return out


def floor_run_date(meta: dict, part: str) -> str:
    """The date of the run that measured ``part`` of a floor CSV: a group of cases as the
    header's ``replaced_rows`` line names them ("decode sbhd" holds the cases "decode host
    forward sbhd", "decode host forward+backward sbhd", ...). The latest later run that names
    it, else the header's own date (the run that wrote the file)."""
    from ..bench import floor as floor_suite
    date = meta.get("date", "")
    for entry in floor_suite.replacements(meta):          # oldest first
        parts, _, later = entry.partition(floor_suite.LATER_RUN)
        found = re.search(r"date (\S+?),", later)
        if part in parts.split(", ") and found:
            date = found[1]
    return date


def committed_when(path: Path) -> tuple:
    """(GPU, date) of a committed result: a CSV's header (``gpu``, ``date`` to the minute), else
    what its name says (``<what>-<gpu>-YYYYMMDD[-HHMM].<ext>``); the date is "" where neither
    records one."""
    path = Path(path)
    meta = compare.read_meta(path) if path.suffix == ".csv" else {}
    date = meta.get("date", "")[:16].replace("T", " ")
    day = re.search(r"-(\d{4})(\d\d)(\d\d)(?:-(\d\d)(\d\d))?\.", path.name)
    if not date and day:
        date = "-".join(day.groups()[:3]) + (f" {day[4]}:{day[5]}" if day[4] else "")
    return meta.get("gpu", path.name.split("-nvidia-")[-1].split("-")[0]), date


def two_pass(gpu: str = GPU, kind: str = "two_pass") -> dict:
    """{(case, pass): {provider: row}} of ``two_pass-<gpu>.csv`` (``benchmarks/two_pass.py``;
    kind "two_pass_thd": its packed-sequence cases alone, ``--only thd``): pass is "forward" or
    "fwd+bwd"; ``ratio_to_copy`` is the copy's ms over the provider's in the same run
    (forward+backward: over two copies). The copy and "pre-pass alone" have forward rows
    only."""
    _, rows = load(kind, gpu)
    out = {}
    for r in rows:
        out.setdefault((r["case"], r["pass"]), {})[r["provider"]] = r
    return out


def probe(kind: str, gpu: str = GPU) -> dict:
    """{case: {provider: row}} of a forward-only probe CSV (``flat_pass_probe``,
    ``flat_hints_probe``): ms and ``ratio_to_copy`` (the copy's ms over the provider's)."""
    _, rows = load(kind, gpu)
    out = {}
    for r in rows:
        out.setdefault(r["case"], {})[r["provider"]] = r
    return out


def ncu_kernels(path) -> list:
    """The kernels of an Nsight Compute CSV (``ncu --csv --metrics ...``: one row per kernel
    and metric), in launch order: [{"id", "kernel", "metrics": {name: value}, "instances":
    {name: {instance: value}}}], each value a float in the metric's own unit (bytes, ns, %) with
    ncu's thousands separators removed (None where ncu wrote "n/a"). An instanced metric printed
    with ``--print-metric-instances details`` ("total (A: a; B: b; ...)", e.g. executed
    instructions per opcode) keeps its total under "metrics" and its instances under
    "instances"."""
    import csv
    compare.note_read(path)
    lines = compare.ncu_table(Path(path).read_text())
    if not lines:
        raise ValueError(f"{path}: no Nsight Compute table (a header row starting with \"ID\")")

    def number(text):
        text = text.strip().replace(",", "")
        return None if text in ("", "n/a") else float(text)
    out = {}
    for r in csv.DictReader(lines):
        k = out.setdefault(r["ID"], dict(id=int(r["ID"]), kernel=r["Kernel Name"], metrics={},
                                         instances={}))
        total, _, listed = r["Metric Value"].partition(" (")
        k["metrics"][r["Metric Name"]] = number(total)
        if listed:
            pairs = (item.rsplit(":", 1) for item in listed.rstrip(")").split(";"))
            k["instances"][r["Metric Name"]] = {name.strip(): number(v) for name, v in pairs}
    return sorted(out.values(), key=lambda k: k["id"])


_FWDBWD_COLUMNS = ("fwd_ratio", "bwd_ratio", "fwdbwd_ratio", "enqueue_us", "eager_us",
                   "fwdbwd_graph_us")


def _final_table(path, header: str) -> tuple:
    """(every line of a probe's log, the lines after its last header row, the one whose first
    words are `header`); ValueError when there is none."""
    compare.note_read(path)
    lines = Path(path).read_text().splitlines()
    heads = [i for i, line in enumerate(lines) if line.split()[:2] == header.split()]
    if not heads:
        raise ValueError(f"{path}: no final table (a header row starting with \"{header}\")")
    return lines, lines[heads[-1] + 1:]


def fwdbwd_log(path) -> dict:
    """{(case, provider): row} of a ``benchmarks/mid_fwdbwd_probe.py`` log, read from its final
    table: ``fwd_ratio`` (a copy's µs over the forward's, both replayed from CUDA graphs),
    ``bwd_ratio`` (over the forward+backward's µs less the forward's), ``fwdbwd_ratio`` (two
    copies over the forward+backward, replayed), ``enqueue_us`` (host µs to issue one eager
    forward+backward, no synchronisation), ``eager_us`` (µs per eager forward+backward, calls
    back to back then a synchronisation) and ``fwdbwd_graph_us`` (device µs of one replayed
    forward+backward); None where the log wrote "-". Each row also carries ``copy_us`` and
    ``copy_pair_us``, the case's copies replayed the same way (from its ``== case:`` line)."""
    lines, rows = _final_table(path, "case provider")
    copies = {}
    for line in lines:
        if m := re.match(r"== (.+): copy ([\d.]+) us, copy pair ([\d.]+) us", line):
            copies[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    out = {}
    for line in rows:
        cells = line.split()
        if len(cells) < 2 + len(_FWDBWD_COLUMNS):
            continue
        values, provider = cells[-len(_FWDBWD_COLUMNS):], cells[-len(_FWDBWD_COLUMNS) - 1]
        case = " ".join(cells[:-len(_FWDBWD_COLUMNS) - 1])
        row = {k: (None if v == "-" else float(v)) for k, v in zip(_FWDBWD_COLUMNS, values)}
        row["copy_us"], row["copy_pair_us"] = copies.get(case, (None, None))
        out[case, provider] = row
    if not out:
        raise ValueError(f"{path}: its final table has no rows")
    return out


_VARIANT_ROW = re.compile(r"(?P<case>.+?)\s+(?P<variant>early (?P<early>True|False), (?P<per>\d+) "
                          r"a program)\s+(?P<fwd>[\d.]+)\s+(?P<rf>[\d.]+)\s+(?P<fb>[\d.]+)"
                          r"\s+(?P<rfb>[\d.]+)\s*$")


def fwdbwd_variants_log(path) -> dict:
    """{(case, variant): row} of a ``benchmarks/mid_fwdbwd_probe.py --variants`` log, read from
    its final table (the lines after its last header row, "case variant ..."). ropelib alone,
    replayed from CUDA graphs; a variant is "early <True|False>, <n> a program": the two-pass
    route's flat pass launched early after the pre-pass or not, and the pre-pass's (token, pair)
    entries per program. Each row: ``early`` (bool), ``per_program`` (int), ``fwd_us`` and
    ``fwd_ratio`` (a copy's µs over the forward's), ``fwdbwd_us`` and ``fwdbwd_ratio`` (two
    copies' µs over the forward+backward's), the copies replayed in the same process."""
    _, rows = _final_table(path, "case variant")
    out = {}
    for line in rows:
        if m := _VARIANT_ROW.fullmatch(line.strip()):
            out[m["case"], m["variant"]] = dict(
                early=m["early"] == "True", per_program=int(m["per"]), fwd_us=float(m["fwd"]),
                fwd_ratio=float(m["rf"]), fwdbwd_us=float(m["fb"]), fwdbwd_ratio=float(m["rfb"]))
    if not out:
        raise ValueError(f"{path}: its final table has no rows")
    return out


_HOST_ROW = re.compile(r"(.+?)\s{2,}(\S.*?)\s{2,}([\d.]+)(\s+[\d.]+)?\s*")


def host_by_size_log(path) -> dict:
    """{(case, variant): host µs per eager forward+backward (best round)} of a
    ``benchmarks/host_by_size_probe.py`` log, read from its final table ("case variant host us
    device us"): ropelib, TE's fused RoPE and an ATen control, with autograd's device thread and
    without, ropelib with its launches removed, and the µs spent inside ropelib's launches."""
    _, rows = _final_table(path, "case variant")
    out = {(m[1], m[2]): float(m[3]) for line in rows if (m := _HOST_ROW.fullmatch(line))}
    if not out:
        raise ValueError(f"{path}: its final table has no rows")
    return out


def table(rows, columns) -> str:
    """A fixed-width text table of ``rows`` (dicts): ``columns`` is [(header, key, format)]."""
    width = {h: max(len(h), 7, *(len(str(r.get(k))) for r in rows if isinstance(r.get(k), str)))
             for h, k, _ in columns}
    lines = ["  ".join(f"{h:>{width[h]}}" for h, _, _ in columns)]
    for r in rows:
        cells = []
        for h, k, fmt in columns:
            v = r.get(k)
            if isinstance(v, str):
                cells.append(f"{v:<{width[h]}}")
            else:
                cells.append(f"{(format(v, fmt) if v is not None else '-'):>{width[h]}}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


_GAP_ROW = re.compile(r"^([^\d\n]+?)\s+(ropelib|te_fused)\s+([\d.]+|nan)\s+([\d.]+|nan)$", re.M)
_GAP_EVENT = re.compile(r"^\s+(host|device)\s+([\d.]+)\s+([\d.]+)\s+(.+)$")


def dobench_gap_log(path) -> tuple:
    """(memset µs, {(measure, provider): (host µs, events µs)}) of a
    ``benchmarks/dobench_gap_probe.py`` log: medians of shuffled rounds, NaN where a measure has
    no such column (``enqueue`` has no events, ``do_bench`` no host time)."""
    compare.note_read(path)
    text = Path(path).read_text()
    memset = re.search(r"memset of 256 MiB ([\d.]+) us", text)
    if not text.startswith("# NVIDIA") or not memset:
        raise ValueError(f"{path}: not a dobench_gap_probe log (no GPU line or memset time)")
    rows = {(m[1].strip(), m[2]): (float(m[3]), float(m[4])) for m in _GAP_ROW.finditer(text)}
    return float(memset[1]), rows


def dobench_gap_timeline(path) -> dict:
    """{provider: {...}} from the torch.profiler timeline of one memset-loop iteration in a
    ``benchmarks/dobench_gap_probe.py`` log (µs from the memset's host-side start):
    "memset_device_start", "memset_device_end", "call_start", "call_end" (the host's call),
    "first_launch" (the host's first kernel launch inside the call) and "first_kernel" (when
    that kernel began on the device)."""
    compare.note_read(path)
    out, prov, events = {}, None, []

    def first(what, where, test):
        found = next((e for e in events if e[0] == where and test(e)), None)
        if found is None:
            raise ValueError(f"{path}: the profiled iteration of {prov!r} has no {where} event "
                             f"for {what}")
        return found

    def close():
        if not prov:
            return
        memset = first("the memset", "device", lambda e: e[3].endswith(": memset"))
        call = first("the call", "host", lambda e: e[3].endswith(": call"))
        launch = first("a kernel launch inside the call", "host",
                       lambda e: "LaunchKernel" in e[3] and e[1] >= call[1])
        kernel = first("the call's kernel", "device", lambda e: e[3].endswith(": call"))
        out[prov] = {"memset_device_start": memset[1], "memset_device_end": memset[1] + memset[2],
                     "call_start": call[1], "call_end": call[1] + call[2],
                     "first_launch": launch[1], "first_kernel": kernel[1]}

    for line in Path(path).read_text().splitlines():
        if m := re.match(r"== one memset-loop iteration under torch.profiler: (\S+)", line):
            close()
            prov, events = m[1], []
        elif prov and (m := _GAP_EVENT.match(line)):
            events.append((m[1], float(m[2]), float(m[3]), m[4].strip()))
    close()
    return out


def qkv_clock_log(path) -> tuple:
    """{tokens: {variant: dict(ms, mhz, watts, mcycles, power_capped, hw_slowdown)}} and the
    power limit, from a ``qkv_clock-<gpu>-<date>.log`` of ``benchmarks/qkv_clock_probe.py``:
    the QKV projection's forwards timed back to back while NVML read the SM clock, the power
    drawn and the throttle reasons (medians of shuffled rounds). Returns (rows, limit W)."""
    path = Path(path)
    compare.note_read(path)
    text = path.read_text()
    limit = re.search(r"enforced power limit (\d+) W", text)
    rows, tokens = {}, None
    for line in text.splitlines():
        if m := re.match(r"== (\d+) tokens", line):
            tokens = int(m[1])
            rows[tokens] = {}
        elif tokens and (m := re.match(r"\s+(.+?)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+"
                                       r"(\d+)%\s+(\d+)%\s+\d+$", line)):
            rows[tokens][m[1]] = dict(ms=float(m[2]), mhz=float(m[3]), watts=float(m[4]),
                                      mcycles=float(m[5]), power_capped=int(m[6]) / 100,
                                      hw_slowdown=int(m[7]) / 100)
    return rows, (float(limit[1]) if limit else None)


TE_PROFILED = ("te_fused", "sh_loop_b", "heads_all_one_b", "heads_all_one_b_table", "copy")
_THREAD_INST = "smsp__sass_thread_inst_executed_op_"      # thread instructions, by kind
_STALLED = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
NOT_STALLS = ("selected", "not_selected")                # issuing, and ready but not picked


def ncu_device(gpu: str = GPU) -> dict:
    """{attribute: value} of the GPU the TE profiles ran on, as Nsight Compute recorded it in
    ``mechanism-te-<gpu>-ncu-raw.csv`` (its ``device__attribute_*`` columns, prefix dropped;
    numbers as ints, the rest as text)."""
    import csv
    raw = RESULTS / f"mechanism-te-{gpu}-ncu-raw.csv"
    compare.note_read(raw)
    row = next(r for r in csv.DictReader(compare.ncu_table(raw.read_text())) if r["Kernel Name"])
    out = {}
    for k, v in row.items():
        if k and k.startswith("device__attribute_"):
            text = (v or "").replace(",", "")
            out[k[len("device__attribute_"):]] = int(text) if text.isdigit() else v
    return out


def te_profiles(gpu: str = GPU) -> tuple:
    """The two Nsight Compute profiles of Transformer Engine's fused RoPE beside Triton kernels
    (``benchmarks/te_ncu.py``; bf16 sbhd s=4096 b=8 h=32 d=128, the kernels of
    ``TE_PROFILED``, in launch order): ``te_ncu-<gpu>.csv`` (clock locked by Nsight Compute)
    and ``te_ncu-<gpu>-20261201-1431-clock-none.csv`` (clock free). Returns
    (locked, free, metas): {kernel: {quantity: value}} for each run and {"locked", "free"}: the
    CSVs' headers.

    locked, per element of x unless said: ``us``, ``ghz`` (elapsed cycles per ns),
    ``warp_inst``, ``threads`` (thread instructions of every kind), ``float`` (fadd, fmul,
    ffma), ``integer``, ``loads`` and ``stores`` (thread-level global ones), ``load_bytes``
    (bytes a warp's load asks for: 32 x sectors / requests), ``active`` (SM active cycles),
    ``issue_floor`` (warp instructions / schedulers: cycles a scheduler must issue),
    ``issue_used`` (that over the active cycles), ``floor_over_copy`` (over the copy's active
    cycles), the stalls ``memory_wait`` (long_scoreboard), ``barrier``, ``not_selected`` (warps
    per instruction issued), ``us_free`` (the same kernel in ``mechanism-te``) and ``slowed``
    (us / us_free).

    free: ``us``, ``us_54`` (``mechanism-te``'s time), ``of_54``, ``ghz``, ``active``,
    ``warp_inst`` (total), ``issue_us`` (the warp instructions issued back to back on every
    scheduler, at the measured clock), ``issue_share`` (of the elapsed cycles), ``issued``
    (Nsight Compute's issue-active share) and ``issued_counted`` (the same from the counts),
    ``empty_us`` (active cycles without an issue), ``idle_us`` (elapsed minus active cycles),
    ``states`` (warps in each state of ``compare.WARP_STALLS`` per instruction issued),
    ``stalled`` (their sum without ``NOT_STALLS``), ``latency`` (cycles between a warp's
    instructions) and ``resident`` (warps a scheduler holds)."""
    dev = ncu_device(gpu)
    partitions = dev["num_schedulers_per_multiprocessor"] * dev["multiprocessor_count"]
    n_elem = 4096 * 8 * 32 * 128
    te_run = mechanism("s4096-b8", gpu, kind="mechanism-te")
    locked_path = RESULTS / f"te_ncu-{gpu}.csv"
    free_path = RESULTS / f"te_ncu-{gpu}-20261201-1431-clock-none.csv"
    metas = dict(locked=compare.read_meta(locked_path), free=compare.read_meta(free_path))
    if "--clock-control none" not in metas["free"].get("what", ""):
        raise ValueError(f"{free_path.name}: not the clock-free run")
    launched = {run: ncu_kernels(p) for run, p in (("locked", locked_path), ("free", free_path))}
    for run, ks in launched.items():
        if len(ks) != len(TE_PROFILED) or "fused_rope_forward" not in ks[0]["kernel"]:
            raise ValueError(f"te_ncu ({run}): not the launches of TE_PROFILED")
    if [k["kernel"] for k in launched["locked"]] != [k["kernel"] for k in launched["free"]]:
        raise ValueError("te_ncu: the two runs launched different kernels")

    def locked_row(m):
        return dict(
            us=m["gpu__time_duration.sum"] / 1e3,
            ghz=m["gpc__cycles_elapsed.max"] / m["gpu__time_duration.sum"],
            warp_inst=m["smsp__inst_executed.sum"] / n_elem,
            threads=sum(v for k, v in m.items() if k.startswith(_THREAD_INST)) / n_elem,
            float=sum(m[f"{_THREAD_INST}{op}_pred_on.sum"] for op in ("fadd", "fmul", "ffma"))
            / n_elem,
            integer=m[f"{_THREAD_INST}integer_pred_on.sum"] / n_elem,
            loads=m["smsp__sass_inst_executed_op_global_ld.sum"] * 32 / n_elem,
            load_bytes=32 * m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"]
            / m["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"],
            stores=m["smsp__sass_inst_executed_op_global_st.sum"] * 32 / n_elem,
            active=m["sm__cycles_active.avg"],
            issue_floor=m["smsp__inst_executed.sum"] / partitions,
            memory_wait=m[_STALLED.format("long_scoreboard")],
            barrier=m[_STALLED.format("barrier")],
            not_selected=m[_STALLED.format("not_selected")])

    def free_row(m, name):
        ns = m["gpu__time_duration.sum"]
        elapsed, active = m["gpc__cycles_elapsed.max"], m["sm__cycles_active.avg"]
        issue = m["smsp__inst_executed.sum"] / partitions   # cycles each scheduler issued
        ghz = elapsed / ns
        states = {s: m[_STALLED.format(s)] for s in compare.WARP_STALLS}
        return dict(
            us=ns / 1e3, us_54=te_run[name]["us"], of_54=ns / 1e3 / te_run[name]["us"],
            ghz=ghz, active=active, warp_inst=m["smsp__inst_executed.sum"],
            issue_us=issue / ghz / 1e3, issue_share=issue / elapsed,
            issued=m["smsp__issue_active.avg.per_cycle_active"], issued_counted=issue / active,
            empty_us=(active - issue) / ghz / 1e3, idle_us=(elapsed - active) / ghz / 1e3,
            states=states, stalled=sum(v for s, v in states.items() if s not in NOT_STALLS),
            latency=m["smsp__average_warp_latency_per_inst_issued.ratio"],
            resident=m["sm__warps_active.avg.pct_of_peak_sustained_active"] / 100
            * dev["max_warps_per_scheduler"])

    locked = {n: locked_row(k["metrics"]) for n, k in zip(TE_PROFILED, launched["locked"])}
    for name, r in locked.items():
        r["issue_used"] = r["issue_floor"] / r["active"]
        r["floor_over_copy"] = r["issue_floor"] / locked["copy"]["active"]
        r["us_free"] = te_run[name]["us"]
        r["slowed"] = r["us"] / r["us_free"]
    free = {n: free_row(k["metrics"], n) for n, k in zip(TE_PROFILED, launched["free"])}
    return locked, free, metas


# --- where the bytes a profile does not count go (benchmarks/l2_writeback_ncu.py) -------------

L2_WRITEBACK_WRITERS = (("copy", 16), ("copy", 64), ("copy", 256), ("ropelib", 256))
"""The writing kernels of ``l2_writeback_ncu``, in launch order: (kernel, MiB of y it stores).
The copy is notebook 04's (a Triton load/store of bf16); ropelib's is the finished kernel on
notebook 04's shape (bf16 sbhd s=4096, b=8, h=32, d=128). Each runs between two read-only sweeps."""


def l2_writeback_gpus() -> list:
    """The GPUs with a committed ``l2_writeback_ncu`` profile, the H200 (the course's basis)
    first."""
    gpus = sorted(p.stem[len("l2_writeback_ncu-"):] for p in RESULTS.glob("l2_writeback_ncu-*.csv"))
    return sorted(gpus, key=lambda g: g != GPU)


def l2_writeback_table(rows) -> str:
    """:func:`l2_writeback`'s rows as a table, with the DRAM writes of the sweep after each
    writer (a sweep stores one number of its own, so they are lines an earlier kernel left
    dirty) as a share of the writer's shortfall."""
    shown = [dict(r, back_share=r["after_mib"] / r["short_mib"] if r["short_mib"] else None)
             for r in rows]
    return table(shown, [("writer", "kernel", ""), ("stores MiB", "stored_mib", ".0f"),
                         ("its DRAM writes", "counted_mib", ".1f"), ("short", "short_mib", ".1f"),
                         ("sweep after", "after_mib", ".1f"), ("after / short", "back_share", ".2f"),
                         ("(writes + after) / stores", "total", ".3f"), ("µs", "us", ".1f")])


def l2_writeback(gpu: str = "nvidia-h100-80gb-hbm3") -> tuple:
    """(meta, rows) of ``l2_writeback_ncu-<gpu>.csv``: Nsight Compute with ``--cache-control
    none`` over a sweep, then each writer of :data:`L2_WRITEBACK_WRITERS` followed by a sweep (a
    sum over 1 GiB: it reads, and stores one number). One row per writer: ``kernel``,
    ``stored_mib`` (what it stores), ``counted_mib`` (its own DRAM writes), ``short_mib``
    (stored - counted), ``after_mib`` (the DRAM writes of the sweep after it, which stores
    nothing of its own), ``before_mib`` (the sweep before it), ``total`` ((counted + after) /
    stored) and ``us`` (its duration)."""
    p = path("l2_writeback_ncu", gpu)
    kernels = ncu_kernels(p)
    want = 1 + 2 * len(L2_WRITEBACK_WRITERS)
    if len(kernels) != want:
        raise ValueError(f"{p.name}: {len(kernels)} kernels profiled, expected {want} "
                         "(a sweep, then each writer and a sweep)")
    sweeps, writers = kernels[0::2], kernels[1::2]
    if not all("reduce" in k["kernel"] for k in sweeps):
        raise ValueError(f"{p.name}: every other kernel should be the sweep (a reduction): "
                         f"{[k['kernel'][:40] for k in sweeps]}")

    def mib(k, metric="dram__bytes_write.sum"):
        return k["metrics"][metric] / 2**20
    rows = []
    for (name, stored), k, before, after in zip(L2_WRITEBACK_WRITERS, writers, sweeps, sweeps[1:]):
        if (name == "copy") != ("_copy_kernel" in k["kernel"]):
            raise ValueError(f"{p.name}: launch {k['id']} is {k['kernel'][:60]}, expected {name}")
        counted, after_w = mib(k), mib(after)
        rows.append(dict(kernel=name, stored_mib=stored, counted_mib=counted,
                         short_mib=stored - counted, after_mib=after_w, before_mib=mib(before),
                         total=(counted + after_w) / stored,
                         us=k["metrics"]["gpu__time_duration.sum"] / 1e3))
    return compare.read_meta(p), rows
