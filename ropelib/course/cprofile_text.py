"""Read a cProfile text dump (``pstats.Stats(...).print_stats``), as notebook 07 does with
``benchmarks/results/host-profile-*.txt``: the total time profiled and, for each table the dump
holds (ordered by internal or by cumulative time), each function's calls and times."""
import re
from pathlib import Path

from ..bench.compare import note_read

_TOTAL = re.compile(r"function calls .* in ([\d.]+) seconds")
_ORDER = re.compile(r"\s*Ordered by: (.+)")
_ROW = re.compile(r"\s*(\d+)(?:/\d+)?\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+(.+)$")
# where a function's file was installed: up to the last site-packages/, or to the checkout's
# own folders wherever the checkout sat (its folder may itself be called ropelib)
_PREFIX = re.compile(r"^.*/(?:site-packages/|(?=(?:ropelib|benchmarks)/))")


def read_profile(path):
    """(total seconds, {"internal time" | "cumulative time": {function: {"ncalls", "tottime",
    "cumtime"}}}), each table in the dump's order, functions named without their install
    prefix (``torch/_tensor.py:576(backward)``, ``ropelib/eager.py:282(run)``)."""
    note_read(path)
    total, tables, order = None, {}, None
    for line in Path(path).read_text().splitlines():
        if m := _TOTAL.search(line):
            total = float(m.group(1))
        elif m := _ORDER.match(line):
            order = m.group(1).strip()
            tables[order] = {}
        elif order is not None and (m := _ROW.match(line)):
            name = _PREFIX.sub("", m.group(4))
            tables[order][name] = {"ncalls": int(m.group(1)), "tottime": float(m.group(2)),
                                   "cumtime": float(m.group(3))}
    return total, tables


def entry(table, *parts):
    """The one function of a profile table whose name holds every one of ``parts``."""
    hits = [r for name, r in table.items() if all(p in name for p in parts)]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} functions match {parts}, not one")
    return hits[0]
