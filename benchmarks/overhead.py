"""Host overhead per call at decode size (first session's script; its log is
benchmarks/results/overhead-h100-20261122.log). It now runs part 1 of benchmarks/probe.py,
which measures the same calls and more (TE, forward+backward, decode tiles)."""
import sys

from probe import host_costs

if __name__ == "__main__":
    sys.exit(host_costs() and 0)
