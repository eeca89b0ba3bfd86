# Stage C: the seeds' sweeps (notebook 06's GPU data, issue 5's fp32 sweep).
source benchmarks/gpu/common.sh
step seed_sweeps 560 python benchmarks/seed_sweeps.py
save stage_c
