"""How long one load takes to come back, from L1, L2 and DRAM, on an idle GPU and beside a copy
that keeps DRAM busy: the latency of notebook 05's Little's law, measured (GPU only;
`--dry-run` checks the chase on the CPU).

The probe is a pointer chase: one program of one warp follows a chain of indices through a
buffer, each load's address being the value the previous load returned, so no two loads can be
in flight together and the time per step is one load's latency. The chain visits the buffer's
128-byte lines in a random order (one index per line), so neither the line nor its neighbour
is in a cache unless the whole footprint fits there. Each footprint's time per load is the slope
between a short and a long chase (the launch cancels), median of 3 rounds; every chase goes on
where the last stopped, so a DRAM-sized chain never meets a line twice.

    footprint          where the chain lies once it has been walked
    16 KiB             L1 (one SM's)
    4 MiB, 16 MiB      L2 (50 MB on an H200)
    256 MiB, 1 GiB     DRAM (a few percent of the lines still hit L2)
    4 GiB              DRAM, over more pages than 1 GiB (address translation's misses, if
                       they cost anything, show as a longer time here)

"Loaded" repeats the 1 GiB chase while a copy kernel streams 2 GiB per launch on a second
stream (on every other SM), so the load waits in the same queues a streaming kernel's loads
wait in; the copy's bandwidth is measured alone and beside the chase.

    python benchmarks/memory_latency.py --out DIR      # ~1 min on an H200
    TRITON_INTERPRET=1 python benchmarks/memory_latency.py --dry-run

Writes DIR/memory_latency-<gpu>.csv: measure (latency | copy), condition (idle | loaded),
footprint_bytes, ns_per_load (latency rows), gbps (copy rows); prints the table last.
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit below

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (REPO_ROOT, REPO_ROOT / "benchmarks"):   # ropelib without `pip install -e .`, and
    if str(_path) not in sys.path:                    # mechanism.py however this file is loaded
        sys.path.insert(0, str(_path))

from ropelib.bench import compare  # noqa: E402
import mechanism  # noqa: E402  (benchmarks/mechanism.py: its streaming copy)

LINE = 128                                   # bytes between two indices of the chain
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FOOTPRINTS = (16 * KIB, 4 * MIB, 16 * MIB, 256 * MIB, 1 * GIB, 4 * GIB)
LOADED_FOOTPRINT = 1 * GIB
STEPS = (2_000, 12_000)                      # short and long chase
COPY_BYTES = 1 * GIB                         # read and written by each copy launch
ROUNDS = 3


@triton.jit
def _chase_kernel(
    next_ptr,  # *int32: [n] the chain: next_ptr[p] is the index of the step after p
    out_ptr,  # *int32: [1] where the chase ended (so the loads are not optimised away)
    start,  # first index
    steps,  # loads to make, one after another
):
    # One program, one warp: a scalar chain. Step i's address is step i-1's value, so the
    # loads cannot overlap and each costs one full round trip.
    p = start
    for _ in range(steps):
        p = tl.load(next_ptr + p)
    tl.store(out_ptr, p)


def chain(footprint: int, device, seed: int = 0) -> tuple:
    """(next, start): an int32 buffer of `footprint` bytes holding one random cycle through its
    128-byte lines (the first index of each line used, the rest zero)."""
    per_line = LINE // 4
    lines = footprint // LINE
    g = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(lines, generator=g).to(device)
    nxt = torch.zeros(footprint // 4, dtype=torch.int32, device=device)
    nxt[order * per_line] = (torch.roll(order, -1) * per_line).to(torch.int32)
    return nxt, int(order[0]) * per_line


def chase(nxt, start, steps, out):
    _chase_kernel[(1,)](nxt, out, start, steps, num_warps=1)


def copy(x, y):
    """A streaming copy: benchmarks/mechanism.py's kernel, 4096 contiguous elements a program
    on 8 warps."""
    mechanism.copy_triton(x, y, block=4096, num_warps=8)


def _timed(fn, stream) -> tuple:
    """(start, end): CUDA events recorded on `stream` around fn's launches."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        a.record()
        fn()
        b.record()
    return a, b


def chase_ns(nxt, out, load=None) -> float:
    """ns per load: the slope between the short and the long chase. Each chase goes on from
    where the last one stopped (`out`), so a DRAM-sized chain never comes back to a line it
    has loaded (and L2 may still hold). With `load` (a callable launching one copy, and how
    many launches cover the long chase), the copies run on a second stream while each chase
    runs."""
    s_chase = torch.cuda.Stream()
    s_load = torch.cuda.Stream()
    times = []
    for steps in STEPS:
        torch.cuda.synchronize()
        start = int(out)
        a, b = _timed(lambda: chase(nxt, start, steps, out), s_chase)
        if load is not None:
            launch, count = load
            with torch.cuda.stream(s_load):
                for _ in range(count):
                    launch()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return (times[1] - times[0]) * 1e6 / (STEPS[1] - STEPS[0])


def copy_gbps(x, y, stream, launches=20, wait=True) -> float:
    """GB/s of `launches` copies on `stream`; with wait=False they start without waiting for
    what other streams are running (a chase beside them)."""
    if wait:
        torch.cuda.synchronize()
    a, b = _timed(lambda: [copy(x, y) for _ in range(launches)], stream)
    torch.cuda.synchronize()
    return 2 * x.numel() * x.element_size() * launches / (a.elapsed_time(b) * 1e6)


def dry_run() -> None:
    nxt, start = chain(16 * KIB, "cpu")
    out = torch.zeros(1, dtype=torch.int32)
    chase(nxt, start, 57, out)
    p = start
    for _ in range(57):
        p = int(nxt[p])
    assert int(out) == p, (int(out), p)
    visited, p = set(), start
    for _ in range(16 * KIB // LINE):
        visited.add(p)
        p = int(nxt[p])
    assert p == start and len(visited) == 16 * KIB // LINE      # one cycle through every line
    print(f"dry run: the chase follows a {16 * KIB // LINE}-line cycle for 57 steps correctly")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--dry-run", action="store_true", help="CPU: check the chase, no timing")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run()
    if not torch.cuda.is_available():
        raise SystemExit("memory_latency.py times a GPU's loads: run it on a machine with a GPU, "
                         "or pass --dry-run")
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    x = torch.ones(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    copy(x, y)
    rows = []
    s_copy, s_chase = torch.cuda.Stream(), torch.cuda.Stream()
    alone = statistics.median(copy_gbps(x, y, s_copy) for _ in range(ROUNDS))
    for footprint in FOOTPRINTS:
        nxt, start = chain(footprint, "cuda")
        # walk a cache-sized chain once first, so the caches hold what fits (a DRAM-sized one
        # would take seconds, and nothing of it stays)
        chase(nxt, start, footprint // LINE + 10 if footprint <= 64 * MIB else STEPS[0], out)
        ns = statistics.median(chase_ns(nxt, out) for _ in range(ROUNDS))
        rows.append({"measure": "latency", "condition": "idle", "footprint_bytes": footprint,
                     "ns_per_load": round(ns, 1)})
        print(f"idle, {footprint / MIB:8.3f} MiB: {ns:6.1f} ns per load", flush=True)
        if footprint == LOADED_FOOTPRINT:
            one_copy_ms = 2 * COPY_BYTES / (alone * 1e6)
            long_ms = ns * STEPS[1] * 1e-6
            count = int(3 * long_ms / one_copy_ms) + 4      # covers the long chase, loaded
            loaded = statistics.median(chase_ns(nxt, out, (lambda: copy(x, y), count))
                                       for _ in range(ROUNDS))
            rows.append({"measure": "latency", "condition": "loaded",
                         "footprint_bytes": footprint, "ns_per_load": round(loaded, 1)})
            print(f"loaded, {footprint / MIB:6.0f} MiB: {loaded:6.1f} ns per load", flush=True)
            # the copy's bandwidth with a chase beside it (one SM's slot taken)
            with torch.cuda.stream(s_chase):
                chase(nxt, int(out), STEPS[1] * 4, out)
            beside = copy_gbps(x, y, s_copy, wait=False)
            torch.cuda.synchronize()
        del nxt
    rows.append({"measure": "copy", "condition": "idle", "footprint_bytes": 2 * COPY_BYTES,
                 "gbps": round(alone, 1)})
    rows.append({"measure": "copy", "condition": "loaded", "footprint_bytes": 2 * COPY_BYTES,
                 "gbps": round(beside, 1)})
    slug = compare.gpu_slug()
    meta = {**compare.environment_meta(), "gpu": torch.cuda.get_device_name(),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "steps": f"{STEPS[0]} and {STEPS[1]} loads a chase, median of {ROUNDS} rounds",
            "line_bytes": LINE}
    path = compare.write_csv(rows, Path(args.out) / f"memory_latency-{slug}.csv", meta=meta,
                             fields=["measure", "condition", "footprint_bytes", "ns_per_load",
                                     "gbps"])
    print(f"wrote {path}")
    for r in rows:
        value = (f"{r['ns_per_load']:7.1f} ns per load" if r["measure"] == "latency"
                 else f"{r['gbps']:7.0f} GB/s")
        print(f"{r['measure']:8s} {r['condition']:7s} {r['footprint_bytes'] / MIB:10.3f} MiB  "
              f"{value}")


if __name__ == "__main__":
    main()
