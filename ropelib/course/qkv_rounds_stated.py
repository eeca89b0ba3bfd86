"""What notebook 12's section 7.1 states about the seed-1 forward rounds on the H200, cell by cell
(`benchmarks/results/qkv_forward_ab-seed1-nvidia-h200-20261201-0941.csv`), kept here so that the
page's cell shows the pooled result and one call checks its per-cell table against the rounds."""

# the page's per-cell table: (median ratio, rounds a won, sign-test p), in the order
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


def check_cells(paired: dict) -> None:
    """Assert that ``paired`` ({pair label: [paired_rounds result a cell]}) gives the page's
    per-cell table: each cell's median ratio, wins and p, and its range."""
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
