# Stage G (session 2, same warm machine as F): the issue-5 suite against TE and torch.compile,
# then the host-cost probe with TE. Saved right after the suite, before anything else runs.
source benchmarks/gpu/common.sh
step bench_targets 400 python -m ropelib.bench --suite targets --providers ropelib,te_fused,torch.compile
save stage_g_bench
step probe_host 90 python benchmarks/probe.py --parts 1
save stage_g
