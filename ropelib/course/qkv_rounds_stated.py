"""What notebook 12 states about the seed-1 forward rounds on the H200
(`benchmarks/results/qkv_forward_ab-seed1-nvidia-h200-20261201-0941.csv`): section 7.1's pooled
table and the per-cell results its Appendix A.1 prints, kept here so that the page's cells show
the results and one call each checks them against the rounds."""

# section 7.1's pooled table: (median ratio, rounds a won, sign-test p, p adjusted by Holm's
# method, the 95 % interval), p under 0.001 written as 0, and the verdict (resolved or not)
POOLED = {
    "fused from angles / unfused": (1.004, 14, 1.0, 1.0, (0.961, 1.033), False),
    "fused from a table / unfused": (0.984, 21, 0.013, 0.038, (0.968, 0.996), True),
    "fused from angles / bare GEMM": (1.044, 2, 0, 0, (1.032, 1.083), True),
    "fused from a table / bare GEMM": (1.046, 0, 0, 0, (1.035, 1.058), True),
    "unfused / cuBLAS alone": (1.074, 5, 0, 0.004, (1.053, 1.087), True),
    "bare GEMM / cuBLAS alone": (1.013, 8, 0.036, 0.071, (1.002, 1.024), False),
}
COVERAGE = 0.964            # the interval's coverage: 1 - 2 P(Bin(28, 1/2) < 9)

# the per-cell results: (median ratio, rounds a won, sign-test p), in the order
# 8192 plain, 8192 QK-norm, 32768 plain, 32768 QK-norm
CELLS = {
    "fused from angles / unfused": [(0.975, 5, 0.453), (1.031, 3, 1.0), (1.009, 3, 1.0), (1.009, 3, 1.0)],
    "fused from a table / unfused": [(0.995, 5, 0.453), (0.996, 4, 1.0), (0.971, 6, 0.125),
                                     (0.985, 6, 0.125)],
    "fused from angles / bare GEMM": [(1.039, 1, 0.125), (1.042, 0, 0.016), (1.064, 1, 0.125),
                                      (1.079, 0, 0.016)],
    "fused from a table / bare GEMM": [(1.053, 0, 0.016), (1.058, 0, 0.016), (1.035, 0, 0.016),
                                       (1.041, 0, 0.016)],
    "unfused / cuBLAS alone": [(1.071, 1, 0.125), (1.071, 3, 1.0), (1.078, 1, 0.125), (1.076, 0, 0.016)],
    "bare GEMM / cuBLAS alone": [(1.013, 2, 0.453), (1.014, 3, 1.0), (1.014, 2, 0.453), (1.008, 1, 0.125)],
}
# the table's ranges (least, most ratio), rounded to two places
RANGES = {
    "fused from angles / unfused": [(0.86, 1.12), (0.92, 1.09), (0.92, 1.07), (0.96, 1.12)],
    "fused from a table / unfused": [(0.88, 1.05), (0.96, 1.08), (0.93, 1.01), (0.94, 1.03)],
    "fused from angles / bare GEMM": [(0.97, 1.21), (1.02, 1.18), (0.98, 1.17), (1.01, 1.21)],
    "fused from a table / bare GEMM": [(1.03, 1.08), (1.03, 1.09), (1.0, 1.06), (1.0, 1.06)],
    "unfused / cuBLAS alone": [(0.94, 1.23), (0.95, 1.17), (0.97, 1.15), (1.05, 1.09)],
}


def check_pooled(pooled: dict) -> None:
    """Assert that ``pooled`` ({pair label: pooled_rounds result with ``holm_p`` and ``verdict``
    added}) gives section 7.1's table, row by row, and the interval's stated coverage."""
    def small(v):
        return round(v, 3) if v >= 0.001 else 0

    got = {label: (round(c["ratio"], 3), c["a_wins"], small(c["p"]), small(c["holm_p"]),
                   tuple(round(v, 3) for v in c["ci"]), c["verdict"])
           for label, c in pooled.items()}
    assert got == POOLED, {k: v for k, v in got.items() if POOLED.get(k) != v}
    assert all(round(c["coverage"], 3) == COVERAGE for c in pooled.values())


def check_cells(paired: dict) -> None:
    """Assert that ``paired`` ({pair label: [paired_rounds result a cell]}) gives the page's
    per-cell results: each cell's median ratio, wins and p, and its range."""
    got = {label: [(round(c["ratio"], 3), c["a_wins"], round(c["p"], 3)) for c in paired[label]]
           for label in CELLS}
    assert got == CELLS, {k: v for k, v in got.items() if CELLS[k] != v}
    got = {label: [(round(c["low"], 2), round(c["high"], 2)) for c in paired[label]]
           for label in RANGES}
    assert got == RANGES, {k: v for k, v in got.items() if RANGES[k] != v}
    # one cell of seven rounds resolves (p < 0.05) only a 7-0 result
    for cells in paired.values():
        for c in cells:
            assert (c["p"] < 0.05) == (max(c["a_wins"], c["b_wins"]) == c["rounds"] == 7), c
