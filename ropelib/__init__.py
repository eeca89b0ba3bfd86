"""ropelib: rotary position embedding (RoPE) in Triton, from the RoFormer math to a kernel at
the memory-bandwidth floor. See docs/API.md for the contract."""
from . import reference, runtime
from .runtime import INTERPRET, default_device, on_gpu

__version__ = "0.1.0"
