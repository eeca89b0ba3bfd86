# Stage C: the seeds' sweeps (notebook 06's GPU data, issue 5's fp32 sweep).
source benchmarks/gpu/common.sh
step seed_sweeps 500 python benchmarks/seed_sweeps.py --only 'fp32|^seq-|hidden|heads|batch'
save stage_c
