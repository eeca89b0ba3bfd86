"""The pair swap of notebook 03's section on coalescing: RoPE's data movement for the interleaved
form, `y[2j] = x[2j+1]`, `y[2j+1] = x[2j]`, without its arithmetic.

How it is parallelised: a one-dimensional grid of `cdiv(n_rows, ROWS)` programs, each holding a
`[ROWS, D/2]` tile of pairs. Two switches choose how the pairs are moved: two stride-2 loads (or
one contiguous `[ROWS, D/2, 2]` load split in registers) and two stride-2 stores (or one
contiguous store of the joined pairs). The notebook shows and runs its own copy of this code;
`benchmarks/access_counters.py` profiles this one under Nsight Compute, and
`tests/test_notebook_kernels_same.py` keeps the two the same.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _pair_swap_kernel(
    x_ptr,  # *x: [n_rows, D], contiguous
    y_ptr,  # *y: [n_rows, D], contiguous: y[2j] = x[2j+1], y[2j+1] = x[2j]
    n_rows,  # rows of x
    D: tl.constexpr,  # features per row, a power of two
    ROWS: tl.constexpr,  # rows per program
    STRIDED_LOAD: tl.constexpr,  # True: two stride-2 loads; False: one contiguous load + tl.split
    STRIDED_STORE: tl.constexpr,  # True: two stride-2 stores; False: tl.join + one contiguous store
    WHOLE_ROWS: tl.constexpr = False,  # True: [ROWS, D] loaded and stored as rows, reshaped
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    j = tl.arange(0, D // 2)  # [D/2] pair index
    even = rows[:, None] * D + 2 * j[None, :]  # [ROWS, D/2] offsets of the even features
    pair = even[:, :, None] + tl.arange(0, 2)[None, None, :]  # [ROWS, D/2, 2]: one contiguous run
    live = rows[:, None] < n_rows
    if WHOLE_ROWS:  # offsets the compiler sees as D contiguous features; pairs split in registers
        row = rows[:, None] * D + tl.arange(0, D)[None, :]  # [ROWS, D]
        a, b = tl.split(tl.reshape(tl.load(x_ptr + row, mask=live), (ROWS, D // 2, 2)))
        tl.store(y_ptr + row, tl.reshape(tl.join(b, a), (ROWS, D)), mask=live)
    else:
        if STRIDED_LOAD:
            a = tl.load(x_ptr + even, mask=live)
            b = tl.load(x_ptr + even + 1, mask=live)
        else:
            a, b = tl.split(tl.load(x_ptr + pair, mask=live[:, :, None]))
        if STRIDED_STORE:
            tl.store(y_ptr + even, b, mask=live)
            tl.store(y_ptr + even + 1, a, mask=live)
        else:
            tl.store(y_ptr + pair, tl.join(b, a), mask=live[:, :, None])

def pair_swap(x, strided_load, strided_store, rows_per_program=1, out=None, whole_rows=False):
    y = torch.full_like(x, float("nan")) if out is None else out
    grid = (triton.cdiv(x.shape[0], rows_per_program),)
    _pair_swap_kernel[grid](x, y, x.shape[0], D=x.shape[1], ROWS=rows_per_program,
                            STRIDED_LOAD=strided_load, STRIDED_STORE=strided_store,
                            WHOLE_ROWS=whole_rows)
    return y
