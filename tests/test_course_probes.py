"""The GPU probes behind notebooks 03 and 05's mechanism numbers, checked on the CPU: the pair
swap's four patterns (benchmarks/access_counters.py) move every pair, and the pointer chase
(benchmarks/memory_latency.py) follows one cycle through every line of its buffer. Their
measurements need a GPU and Nsight Compute."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from loading import ROOT, load_file  # noqa: E402


def test_pair_swap_patterns_dry_run(capsys):
    probe = load_file("access_counters", ROOT / "benchmarks" / "access_counters.py")
    probe.main(["--dry-run"])
    assert "swap every pair" in capsys.readouterr().out
    assert set(probe.PATTERNS.values()) == {(a, b, False) for a in (False, True)
                                            for b in (False, True)} | {(False, False, True)}


def test_pointer_chase_dry_run(capsys):
    probe = load_file("memory_latency", ROOT / "benchmarks" / "memory_latency.py")
    probe.main(["--dry-run"])
    assert "cycle" in capsys.readouterr().out


def test_chain_is_one_cycle_through_every_line():
    probe = load_file("memory_latency", ROOT / "benchmarks" / "memory_latency.py")
    nxt, start = probe.chain(64 * probe.LINE, "cpu", seed=3)
    per_line = probe.LINE // 4
    seen, p = [], start
    for _ in range(64):
        assert p % per_line == 0                 # the first index of a line
        seen.append(p)
        p = int(nxt[p])
    assert p == start and sorted(seen) == list(range(0, 64 * per_line, per_line))


def test_ladder_table_probe_dry_run(capsys):
    """The last rung with cos/sin loaded from tables: the same outputs as the rung (within a
    bf16 step, checked inside the probe), on the lesson's tiny shape."""
    probe = load_file("ladder_table_probe", ROOT / "benchmarks" / "ladder_table_probe.py")
    probe.main(["--dry-run"])
    out = capsys.readouterr().out
    assert "from_table" in out and "equal_halves" in out
