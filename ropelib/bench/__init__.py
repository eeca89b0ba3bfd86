"""The comparison and benchmark engine: the provider registry, timing and accuracy metrics,
sweeps and CSVs (`compare`), the benchmark suites behind `python -m ropelib.bench` (`suite`;
`floor`: every row of the README's performance table, which `readme_table` renders), and the
feature benchmarks they and the scripts in benchmarks/ share (`multi_axis`, `qk_norm_rope`,
`kv_cache_decode`). The product (`import ropelib`) never imports this package; the
benchmarks, the notebooks and the tests do.
"""
