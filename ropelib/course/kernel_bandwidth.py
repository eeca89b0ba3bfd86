"""Notebook 02's per-kernel bandwidth table: each GPU kernel of a chain of PyTorch ops, its device
time from ``torch.profiler``, the bytes its op reads and writes, and its GB/s as a fraction of a
copy's.

The profiler lists kernels; a traffic count (notebook 02's ``CountTraffic``) lists ATen ops with
the bytes of their input and output tensors. Eager PyTorch launches one kernel per such op, in
program order, so the two are matched by position: :func:`kernel_table` refuses to match lists
whose lengths disagree, or a position whose kernel changes from one repeat to the next. Everything
here takes plain values (names, microseconds, bytes), so the tests run it on the CPU; only the
events handed to :func:`device_kernels` come from a GPU's profile.

A kernel's *kind* (:func:`kernel_kind`) is which of PyTorch's CUDA kernel templates its name
says it was launched from: ``vectorized_elementwise_kernel`` (each thread loads several
neighbouring elements at once; PyTorch picks it when every operand is contiguous and aligned),
``elementwise_kernel<128, 4, ...>`` (one element per load, each operand's offset computed from
its strides; the template for operands that are not contiguous, such as a broadcast one with a
stride of 0 or a slice), and ``CatArrayBatchedCopy`` with or without ``_vectorized``.
:func:`by_kind` sums the table's rows by kind. Both read kernel names, counted bytes and measured
times only, not a profiler's hardware counters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Sequence, Tuple

SKIPPED = ("Memcpy", "Memset")    # copies and fills the runtime makes: no op of the chain


@dataclass
class KernelRow:
    """One kernel of the chain: the op that launched it and what it streamed."""
    op: str          # the ATen op, as the traffic count names it
    kernel: str      # a short form of the kernel's name (:func:`short_name`)
    us: float        # device time, mean over the repeats
    nbytes: int      # bytes the op reads plus the bytes it writes
    gbps: float      # nbytes / us, in GB/s (1e9 bytes per second)
    of_copy: float   # gbps / the copy's GB/s
    kind: str = ""   # the kernel template its name shows (:func:`kernel_kind`)


def is_device_kernel(event, skip: Sequence[str] = SKIPPED, device: str = "CUDA") -> bool:
    """Is this profiler event a kernel the GPU ran (its device type `device`), and not a copy
    or fill named in `skip`?"""
    return getattr(event.device_type, "name", str(event.device_type)) == device \
        and not event.name.startswith(tuple(skip))


def device_kernels(events: Iterable, skip: Sequence[str] = SKIPPED,
                   device: str = "CUDA") -> List[Tuple[str, float]]:
    """(name, µs) of every GPU event of a profile, in the order they started.

    `events` are ``prof.events()`` of a ``torch.profiler.profile`` with CUDA activity: those whose
    ``device_type`` is CUDA are the kernels (and copies) the GPU ran; names starting with one of
    `skip` are left out (pass ``skip=("Memset",)`` to keep a ``Memcpy``, which is what a
    contiguous ``copy_`` is). `device` picks another device type (the tests pass "CPU")."""
    gpu = [e for e in events if is_device_kernel(e, skip, device)]
    gpu.sort(key=lambda e: e.time_range.start)
    return [(e.name, float(e.time_range.elapsed_us())) for e in gpu]


def short_name(kernel: str, width: int = 40) -> str:
    """A readable part of a C++ kernel name: the op's functor or kernel (``cos_kernel_cuda``,
    ``MulFunctor``, ``CUDAFunctor_add``, ``CatArrayBatchedCopy``), else its first `width` chars."""
    for pattern in (r"\w+_kernel_cuda", r"\w*Functor_\w+", r"CatArray\w+"):
        found = re.findall(pattern, kernel)
        if found:
            return found[0][:width]
    functors = [f for f in re.findall(r"\w*Functor\b", kernel) if f != "BinaryFunctor"]
    if functors:
        return functors[-1][:width]
    name = kernel.removeprefix("void ").replace("at::native::", "")
    return name[:width]


VECTORIZED, NOT_VECTORIZED = "elementwise, vectorized", "elementwise, not vectorized"
CAT_VECTORIZED, CAT_NOT_VECTORIZED = "cat, vectorized", "cat, not vectorized"


def kernel_kind(kernel: str) -> str:
    """The PyTorch CUDA kernel template a kernel's name shows: :data:`VECTORIZED`
    (``vectorized_elementwise_kernel<...>``), :data:`NOT_VECTORIZED` (``elementwise_kernel<128,
    4, ...>``), :data:`CAT_VECTORIZED` (``CatArrayBatchedCopy_vectorized``),
    :data:`CAT_NOT_VECTORIZED` (``CatArrayBatchedCopy``), else ``"other"`` (a Triton kernel,
    ``unrolled_elementwise_kernel``, a reduction, ...)."""
    if "CatArrayBatchedCopy" in kernel:
        return CAT_VECTORIZED if "CatArrayBatchedCopy_vectorized" in kernel else CAT_NOT_VECTORIZED
    if "vectorized_elementwise_kernel<" in kernel:
        return VECTORIZED
    if re.search(r"(?<![A-Za-z0-9_])elementwise_kernel<", kernel):
        return NOT_VECTORIZED
    return "other"


@dataclass
class KindTotal:
    """The rows of one kernel kind, summed."""
    rows: List[int]  # their positions in the table
    ops: List[str]   # their ops, in that order
    us: float        # device time, summed
    nbytes: int      # bytes, summed
    gbps: float      # nbytes / us
    of_copy: float   # gbps / the copy's GB/s
    over_copy_us: float  # us minus the time their bytes would take at the copy's GB/s


def by_kind(rows: Sequence[KernelRow], copy_gbps: float) -> dict:
    """{kind: :class:`KindTotal`} of the table's rows, kinds in order of first appearance."""
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.kind or "other", []).append(i)
    out = {}
    for kind, idx in groups.items():
        us = sum(rows[i].us for i in idx)
        nbytes = sum(rows[i].nbytes for i in idx)
        rate = gbps(nbytes, us)
        out[kind] = KindTotal(idx, [rows[i].op for i in idx], us, nbytes, rate, rate / copy_gbps,
                              us - nbytes / copy_gbps / 1e3)
    return out


def format_kinds(groups: dict) -> str:
    """The by-kind table notebook 02 prints under the per-kernel one."""
    lines = [f"{'kind':28s} {'kernels':18s} {'us':>8s} {'MB':>8s} {'GB/s':>7s} {'of copy':>8s} "
             f"{'us over copy':>13s}"]
    for kind, g in groups.items():
        which = ",".join(str(i) for i in g.rows)
        lines.append(f"{kind:28s} {which:18s} {g.us:8.1f} {g.nbytes / 1e6:8.1f} {g.gbps:7.0f} "
                     f"{g.of_copy:8.0%} {g.over_copy_us:13.1f}")
    return "\n".join(lines)


def mean_us(kernels: Sequence[Tuple[str, float]], repeats: int, what: str) -> float:
    """Mean device time of a one-kernel operation profiled `repeats` times (e.g. a copy)."""
    if len(kernels) != repeats:
        raise ValueError(f"{what}: the profiler saw {len(kernels)} GPU events for {repeats} runs "
                         f"(one each expected): {sorted({n[:60] for n, _ in kernels})}")
    return sum(us for _, us in kernels) / repeats


def gbps(nbytes: float, us: float) -> float:
    """GB/s (1e9 bytes per second) of `nbytes` moved in `us` microseconds."""
    if not us > 0:
        raise ValueError(f"a device time of {us} us: no bandwidth follows from it")
    return nbytes / us / 1e3


def kernel_table(kernels: Sequence[Tuple[str, float]], ops: Sequence[Tuple[str, int, int]],
                 repeats: int, copy_gbps: float) -> List[KernelRow]:
    """Match `repeats` runs of a chain's kernels to its ops, by position, and give each its GB/s.

    Args:
        kernels: (name, µs) of the GPU kernels of `repeats` runs of the chain, in launch order
            (:func:`device_kernels`).
        ops: (op, bytes read, bytes written) of one run, in program order (a traffic count).
        repeats: how many times the chain ran inside the profile.
        copy_gbps: a copy's GB/s on the same GPU, the reference of the last column.

    Returns:
        One :class:`KernelRow` per op, its device time the mean over the repeats.

    Raises:
        ValueError: when the kernels cannot be matched to the ops by position: their number is
            not `repeats` times the number of ops, or the kernel at one position differs between
            repeats.
    """
    n = len(ops)
    if n == 0 or repeats < 1 or len(kernels) != repeats * n:
        raise ValueError(
            f"the profiler saw {len(kernels)} GPU kernels for {repeats} runs of {n} ops "
            f"({repeats * n} expected): the kernels cannot be matched to the ops by order. "
            f"Ops: {[op for op, _, _ in ops]}; kernels of the first run: "
            f"{[short_name(k) for k, _ in kernels[:max(n, 1)]]}")
    for i in range(n):
        names = {kernels[r * n + i][0] for r in range(repeats)}
        if len(names) != 1:
            raise ValueError(f"kernel {i} (op {ops[i][0]}) differs between runs: "
                             f"{sorted(short_name(k) for k in names)}: the kernels cannot be "
                             "matched to the ops by order")
    rows = []
    for i, (op, read, written) in enumerate(ops):
        us = sum(kernels[r * n + i][1] for r in range(repeats)) / repeats
        rate = gbps(read + written, us)
        rows.append(KernelRow(op, short_name(kernels[i][0]), us, read + written, rate,
                              rate / copy_gbps, kernel_kind(kernels[i][0])))
    return rows


def format_table(rows: Sequence[KernelRow], copy_gbps: float) -> str:
    """The table notebook 02 prints: kernel, µs, bytes, GB/s, fraction of the copy's GB/s."""
    lines = [f"{'#':>2} {'op':10s} {'kernel':28s} {'us':>8s} {'MB':>8s} {'GB/s':>7s} "
             f"{'of copy':>8s}"]
    for i, r in enumerate(rows):
        lines.append(f"{i:2d} {r.op:10s} {r.kernel[:28]:28s} {r.us:8.1f} {r.nbytes / 1e6:8.1f} "
                     f"{r.gbps:7.0f} {r.of_copy:8.0%}")
    total_us, total_bytes = sum(r.us for r in rows), sum(r.nbytes for r in rows)
    total = gbps(total_bytes, total_us)
    lines.append(f"{'':2s} {'all':10s} {'':28s} {total_us:8.1f} {total_bytes / 1e6:8.1f} "
                 f"{total:7.0f} {total / copy_gbps:8.0%}")
    lines.append(f"{'':2s} {'copy':10s} {'(the same cell)':28s} {'':8s} {'':8s} "
                 f"{copy_gbps:7.0f} {1:8.0%}")
    return "\n".join(lines)


def below(rows: Sequence[KernelRow], fraction: float) -> List[Tuple[int, KernelRow]]:
    """(position, row) of the rows whose GB/s is less than `fraction` of the copy's."""
    return [(i, r) for i, r in enumerate(rows) if r.of_copy < fraction]


def us_at_copy_speed(rows: Sequence[KernelRow], copy_gbps: float) -> float:
    """How long the rows' bytes would take at the copy's GB/s, in µs."""
    return sum(r.nbytes for r in rows) / copy_gbps / 1e3


def ratio_factors(unfused_us: float, fused_us: float, rows: Sequence[KernelRow],
                  fused_bytes: float, copy_gbps: float) -> dict:
    """The unfused/fused time ratio as a product of four measured factors, {what: factor}:
    the chain's time outside its kernels (unfused_us over the kernels' sum), its kernels' time
    over their bytes at the copy's GB/s, its bytes over the fused kernel's, and the fused
    kernel's time at the copy's GB/s over its measured time. Each is a ratio of measured times
    and counted bytes, so their product is unfused_us / fused_us exactly."""
    kernel_us = sum(r.us for r in rows)
    at_copy_us = us_at_copy_speed(rows, copy_gbps)
    unfused_bytes = sum(r.nbytes for r in rows)
    if not (unfused_us > 0 and fused_us > 0 and kernel_us > 0 and fused_bytes > 0):
        raise ValueError("times and bytes must be positive")
    return {"time outside the kernels (launch gaps)": unfused_us / kernel_us,
            "kernels below the copy's bandwidth": kernel_us / at_copy_us,
            "bytes, unfused over fused": unfused_bytes / fused_bytes,
            "the fused kernel against a copy": fused_bytes / copy_gbps / 1e3 / fused_us}


# --- the table kept as a CSV, so a machine without a GPU can read a GPU's run ------------------

_ROW_FIELDS = ("op", "kernel", "us", "nbytes", "gbps", "of_copy", "kind")
_MEASURED = ("copy_gbps", "unfused_us", "fused_us", "fused_bytes")


def write_rows(path, rows: Sequence[KernelRow], **measured) -> None:
    """Write the per-kernel rows to `path` as CSV (ropelib.bench.compare.write_csv), with
    `measured` (the copy's GB/s, the timed unfused and fused microseconds, the fused kernel's
    bytes, and what ran it: gpu, versions) as its leading ``# key: value`` lines."""
    from ..bench.compare import write_csv
    missing = [k for k in _MEASURED if k not in measured]
    if missing:
        raise ValueError(f"write_rows needs {', '.join(missing)} beside the rows")
    write_csv([{k: getattr(r, k) for k in _ROW_FIELDS} for r in rows], path, meta=measured,
              fields=_ROW_FIELDS)


def read_rows(path) -> Tuple[List[KernelRow], dict]:
    """(rows, measured) of a CSV written by :func:`write_rows`; the measured numbers as floats,
    the rest (gpu, versions) as text."""
    from ..bench.compare import read_csv, read_meta
    meta = {k: float(v) if k in _MEASURED else v for k, v in read_meta(path).items()}
    rows = [KernelRow(str(r["op"]), str(r["kernel"]), float(r["us"]), int(r["nbytes"]),
                      float(r["gbps"]), float(r["of_copy"]), str(r["kind"] or ""))
            for r in read_csv(path)]
    return rows, meta
