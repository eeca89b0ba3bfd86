"""ropelib: rotary position embedding (RoPE) in Triton, from the RoFormer math to a kernel at
the memory-bandwidth floor. See docs/API.md for the contract.

Set TRITON_INTERPRET=1 before importing ropelib to run the kernels on a CPU (Triton's
interpreter); nothing here touches the GPU at import time.
"""
from . import frequencies, reference, runtime
from . import ops  # noqa: F401  (registers torch.ops.ropelib.*)
from .api import apply_rope, apply_rope_qk
from .frequencies import rope_cos_sin, rope_freqs
from .frequencies import Angles, rope_angles  # angles computed in the kernel, no table
from .module import RotaryEmbedding
from .qk_norm import QKNormRoPE, qk_norm_rope  # per-head QK-RMSNorm fused with RoPE
from .kv_cache import rope_kv_cache  # RoPE fused with the KV-cache write (decoding)
from .qkv_linear import qkv_rope_linear  # RoPE fused into the QKV projection's GEMM
from .qkv_module import QKVRoPE  # its nn.Module
from .mrope import (MultiAxisRotaryEmbedding, apply_mrope, apply_mrope_qk,  # multi-axis
                    multi_axis_frequencies)
from .runtime import INTERPRET, default_device, on_gpu
from .validation import index_checks, set_index_checks
from . import hf, te  # noqa: E402  (drop-ins; import after the API they wrap)

__version__ = "0.1.0"
__all__ = ["apply_rope", "apply_rope_qk", "RotaryEmbedding", "rope_freqs", "rope_cos_sin",
           "set_index_checks", "index_checks", "frequencies", "reference", "runtime", "ops", "te",
           "hf", "INTERPRET", "default_device", "on_gpu", "qk_norm_rope", "QKNormRoPE",
           "rope_kv_cache", "apply_mrope", "apply_mrope_qk", "MultiAxisRotaryEmbedding",
           "multi_axis_frequencies", "Angles", "rope_angles", "qkv_rope_linear", "QKVRoPE"]
