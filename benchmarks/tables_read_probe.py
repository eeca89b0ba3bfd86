"""What the flat pass reads from caller tables of every token: Qwen2-VL's materialised bf16
cos/sin tables [3, B, S, D] (b4 s8192, 28 q / 4 kv heads, d128), one forward each of

    0  ropelib.hf.apply_multimodal_rotary_pos_emb (the flat pass on the per-axis tables)
    1  Liger's LigerQwen2VLMRopeFunction on the same tables
    2  ropelib.apply_mrope_qk from the positions (the kernel forms the angles)
    3  ropelib.hf.apply_rotary_pos_emb on the tables gathered into one [B, S, D] pair

each launched once between cudaProfilerStart/Stop, for Nsight Compute:

    ncu --profile-from-start off --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,launch__grid_size \
        python3 benchmarks/tables_read_probe.py > tables_read_ncu.csv

Needs a GPU and Liger Kernel (benchmarks/gpu_wheels.sh). The runs of 2026-11-29 are in
results/tables_read_ncu-nvidia-h200-20261129-*.csv (before and after the flat pass's ordering
by tokens and its forward's load order; benchmarks/NOTES.md).
"""
import torch

import ropelib
import ropelib.hf
from ropelib import ops
from ropelib.bench import compare, multi_axis as M


def main():
    shape, freqs, positions, q, k, _, _ = M.case_inputs("mrope", False, "cuda")
    sec = shape["section"]
    cos, sin = M.materialised_tables(positions, freqs)
    from liger_kernel.ops.qwen2vl_mrope import LigerQwen2VLMRopeFunction as Liger
    q2, k2 = q.clone(), k.clone()            # Liger rotates in place
    gathered = ops.gathered_tables(cos, sin, sec)
    calls = (
        lambda: ropelib.hf.apply_multimodal_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2),
                                                           cos, sin, sec),
        lambda: Liger.apply(q2.transpose(1, 2), k2.transpose(1, 2), cos, sin, sec),
        lambda: ropelib.apply_mrope_qk(q, k, positions, freqs, layout="bshd"),
        lambda: ropelib.hf.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), *gathered),
    )
    compare.profiled_launches(calls)


if __name__ == "__main__":
    main()
