# Stage J (session 2, fresh machine, TE parts stashed): TE, then the issue-5 suite with the
# caching allocator warmed (bench --reserve-gib, default 16), saved right after.
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
step te_install 240 bash .te-bundle/install.sh install
step bench_targets 330 python -m ropelib.bench --suite targets --providers ropelib,te_fused,torch.compile
save stage_j
