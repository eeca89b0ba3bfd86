"""The course's teaching kernels: the naive one-program-per-row kernel (notebook 03), the
batch-reuse grid kernel (notebooks 04 and 06), the ablation kernel that takes the latter apart
one factor at a time (notebook 04; timed by benchmarks/ablation.py), and the pair swap of
notebook 03's section on coalescing (profiled by benchmarks/access_counters.py). The product's
kernels are in `ropelib.kernels`."""
