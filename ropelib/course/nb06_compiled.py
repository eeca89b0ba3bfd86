"""Notebook 06, section 2.1: the global loads and stores of section 2's kernel as a GPU of
compute capability 9.0 (an H100 or an H200: the same code) runs it, compiled on this machine."""
import torch
import triton
import triton.language as tl

from ropelib.course import ladder
from ropelib.course.kernels import batch_reuse
from ropelib.course.offline_compile import compiled_code


def global_accesses(num_warps: int, *, backward: bool, shape=(4096, 8, 32, 128),
                    arch: int = 90, kernel=None) -> str:
    """'ld.v1.b32=2 ...': the PTX's global loads and stores by vector width and word size
    (instructions in the code, not executions; libdevice's `.nc` table reads left out), in the
    format of `benchmarks/mechanism.py`'s ptx_access_detail, for `_rope_batch_reuse_kernel` on
    bf16 [S, B, H, D] at `num_warps`; `kernel`: a kernel of the same arguments to compile instead
    (the notebook's cell), by default ropelib's. Under the interpreter a kernel defined outside
    ropelib is compiled from its own source, with round_to imported as ropelib's kernel imports
    it."""
    S, B, H, D = shape
    x = torch.empty(shape, dtype=torch.bfloat16)   # only dtypes and strides matter
    y, f = torch.empty_like(x), torch.empty(S, D)
    kernel = batch_reuse._rope_batch_reuse_kernel if kernel is None else kernel
    code = compiled_code(kernel, dict(
        x_ptr=x, y_ptr=y, freqs_ptr=f, B=B, stride_xs=x.stride(0), stride_xb=x.stride(1),
        stride_xh=x.stride(2), stride_xd=x.stride(3), stride_ys=y.stride(0),
        stride_yb=y.stride(1), stride_yh=y.stride(2), stride_fs=f.stride(0),
        stride_fd=f.stride(1), HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2),
        BACKWARD=backward, COMPUTE_DTYPE=tl.float32, BF16_RTNE=False),
        num_warps=num_warps, arch=arch, imports="from ropelib.kernels.common import round_to")
    return " ".join(f"{k}={v}" for k, v in ladder._ptx_accesses(code["ptx"]).items())
