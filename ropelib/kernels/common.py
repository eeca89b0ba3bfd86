"""Small @triton.jit helpers shared by the kernel generations."""
import triton
import triton.language as tl

from ..runtime import INTERPRET

# Triton's CPU interpreter converts fp32 -> bf16 by truncation (round toward zero), while the
# GPU rounds to nearest even. Kernels pass BF16_RTNE=INTERPRET to round_to so both modes give
# the same bits: one round-to-nearest-even, as torch's .to(torch.bfloat16) does.
BF16_RTNE: bool = INTERPRET


@triton.jit
def round_to(y, DTYPE: tl.constexpr, BF16_RTNE: tl.constexpr):
    """Cast fp32 (or fp64) `y` to DTYPE with round-to-nearest-even, also in the interpreter."""
    if BF16_RTNE and DTYPE == tl.bfloat16:
        if y.dtype == tl.float64:
            y = y.to(tl.float32)   # fp64 math (fp64 tables or outputs) rounds through fp32 here
        u = y.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16    # NaN stays NaN, overflow goes to inf
        return u.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(DTYPE)
