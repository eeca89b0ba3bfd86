"""The comparison and benchmark engine: the provider registry, timing and accuracy metrics,
sweeps and CSVs (`compare`), and the benchmark suites behind `python -m ropelib.bench`
(`suite`). The product (`import ropelib`) never imports this package; the benchmarks, the
notebooks and the tests do.
"""
