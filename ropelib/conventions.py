"""What ropelib accepts, each fact stated once: the tensor layouts, the dtype sets and the size
limits that every entry point checks against (the checks themselves are ropelib.validation)."""
import torch

LAYOUTS = ("sbhd", "bshd", "thd")          # what the public functions take: [S, B, H, D],
                                           # [B, S, H, D], packed [T, H, D]
HF_LAYOUT = "bhsd"                         # Hugging Face's [B, H, S, D]: the hf drop-ins
                                           # (view4 sees every layout as [S, B, H, D])
# Hugging Face's unsqueeze_dim (where cos and sin get their head axis) -> the layout of q and k
LAYOUT_OF_UNSQUEEZE_DIM = {1: HF_LAYOUT, -3: HF_LAYOUT, 2: "bshd", -2: "bshd"}

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # rotated inputs
ANGLE_DTYPES = (torch.float32, torch.float64)      # angle tables and frequencies
INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)  # index tensors
KV_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)   # q, k, v of rope_kv_cache
KV_CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
QKV_LINEAR_DTYPES = (torch.float16, torch.bfloat16, torch.float32)   # x, weight of qkv_rope_linear
QKV_LINEAR_LAYOUTS = ("bshd", HF_LAYOUT)   # where qkv_rope_linear puts q, k, v

MAX_HEAD_DIM = 1024                        # the kernels hold a head's features in registers
QKV_LINEAR_MAX_HEAD_DIM = 256              # qkv_rope_linear: a head's columns are one GEMM tile


def view4(t: torch.Tensor, layout: str) -> torch.Tensor:
    """x in `layout` -> a [S, B, H, D] view of the same memory."""
    if layout == "sbhd":
        return t
    if layout == "bshd":
        return t.transpose(0, 1)
    if layout == HF_LAYOUT:    # Hugging Face's [B, H, S, D]
        return t.permute(2, 0, 1, 3)
    return t.unsqueeze(1)   # thd -> [T, 1, H, D]
