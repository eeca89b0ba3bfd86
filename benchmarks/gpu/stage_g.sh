# Stage G (session 2, a fresh machine with the TE parts stashed): TE, the issue-5 suite against
# TE and torch.compile (saved right after it), then the host-cost probe with TE.
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
step te_install 240 bash .te-bundle/install.sh install
step bench_targets 330 python -m ropelib.bench --suite targets --providers ropelib,te_fused,torch.compile
save stage_g_bench
step probe_host 100 python benchmarks/probe.py --parts 1
save stage_g
