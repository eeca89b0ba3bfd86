# Stage I (same warm machine as H): the issue-5 suite with the Q+K rule stage H measured best.
source benchmarks/gpu/common.sh
export ROPELIB_SEGMENT_BLOCK_H=$(cat /tmp/ropelib_qk_choice 2>/dev/null || echo min)
echo "ROPELIB_SEGMENT_BLOCK_H=$ROPELIB_SEGMENT_BLOCK_H" | tee "$OUT/choice.txt"
step bench_targets 330 python -m ropelib.bench --suite targets --providers ropelib,te_fused,torch.compile
save stage_i_bench
step generations 150 python benchmarks/generations.py
save stage_i
