"""The course's teaching kernels: the naive one-program-per-row kernel (notebook 03) and the
batch-reuse grid kernel (notebooks 04 and 06). The product's kernels are in `ropelib.kernels`."""
