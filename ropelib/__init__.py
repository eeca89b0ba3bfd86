"""ropelib: rotary position embedding (RoPE) in Triton, from the RoFormer math to a kernel at
the memory-bandwidth floor. See docs/API.md for the contract.

Set TRITON_INTERPRET=1 before importing ropelib to run the kernels on a CPU (Triton's
interpreter); nothing here touches the GPU at import time.
"""
from . import frequencies, reference, runtime
from .api import apply_rope, apply_rope_qk, clear_cache
from .frequencies import rope_cos_sin, rope_freqs
from .module import RotaryEmbedding
from .runtime import INTERPRET, default_device, on_gpu
from . import hf, te  # noqa: E402  (drop-ins; import after the API they wrap)

__version__ = "0.1.0"
__all__ = ["apply_rope", "apply_rope_qk", "clear_cache", "RotaryEmbedding", "rope_freqs", "rope_cos_sin",
           "frequencies", "reference", "runtime", "te", "hf", "INTERPRET", "default_device",
           "on_gpu"]
