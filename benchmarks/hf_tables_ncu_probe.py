"""What the flat pass reads from Hugging Face's [B, S, D] cos/sin tables (bf16, one row per
token and batch entry, b4 s8192, 28 q / 4 kv heads of 128): one forward each of
`ropelib.hf.apply_rotary_pos_emb` on

    0  transformers' [B, H, S, D] views of bshd projections (rotated in bshd order)
    1  contiguous [B, H, S, D] copies of them (bhsd)

between cudaProfilerStart/Stop, for Nsight Compute:

    ncu --profile-from-start off --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sector_hit_rate.pct,launch__grid_size python3 benchmarks/hf_tables_ncu_probe.py

Needs a GPU. The run of 2026-11-29 is results/hf_tables_ncu-nvidia-h200-20261129-1745.csv; the
file suffixed -bhsd-by-tokens is the same run with bhsd's programs ordered by chunks of tokens
(a variant not kept: benchmarks/NOTES.md).
"""
import torch

import ropelib.hf
from hf_tables_probe import hf_tables     # (run as a script: benchmarks/ is on sys.path)


def main():
    dev = "cuda"
    B, S, HQ, HK, D = 4, 8192, 28, 4, 128
    cos, sin = hf_tables(B, S, D, dev)          # the timing probe's tables, [B, S, D]
    views = (torch.randn(B, S, HQ, D, device=dev, dtype=torch.bfloat16).transpose(1, 2),
             torch.randn(B, S, HK, D, device=dev, dtype=torch.bfloat16).transpose(1, 2))
    bhsd = tuple(t.contiguous() for t in views)
    for q, k in (views, bhsd):          # compiled and planned before the profiled launches
        ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for q, k in (views, bhsd):
        ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
