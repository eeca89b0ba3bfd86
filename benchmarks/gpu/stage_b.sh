# Stage B: the issue-5 benchmark suite and the three kernel generations.
source benchmarks/gpu/common.sh
step bench_targets 420 python -m ropelib.bench --suite targets
step generations 240 python benchmarks/generations.py
save stage_b
