"""Notebook 12's teaching kernels: RoPE in the epilogue of a small QKV GEMM, and undone in the
prologue of its dX GEMM.

The finished kernels (ropelib/kernels/qkv_gemm.py) add the bias, QK-RMS-norm, partial rotary,
interleaved pairs, output layouts, position ids of several kinds, table-free angles, a dW kernel,
int64 offsets and tuned tiles. These two keep only what the notebook teaches:

    forward   qkv [M, H, D] = x [M, K] @ W[N, K]^T, N = H D (q's HQ heads, k's HK, v's HK);
              q and k heads (h < HQ + HK) rotated rotate-half by the angles of each token's
              position, in the epilogue, while the head's tile is in registers
    dX        dX [M, K] = dY [M, N] @ W, where dY of a q or k head is R(-theta) applied to the
              gradient of the rotated output, in the prologue, as the tile is loaded: dY is
              never written

How it is parallelised. Forward: one program per (BLOCK_M tokens, head), grid
(cdiv(M, BLOCK_M), H). The program's column tile is the whole head, held as two accumulators
acc_a [BLOCK_M, D/2] (weight rows h D + j, the head's features j) and acc_b (rows h D + D/2 + j,
features j + D/2), so the two members of every rotate-half pair sit at the same place of two
tiles of the same shape and the rotation is elementwise; or (_qkv_rope_one_acc_teaching_kernel,
as ropelib's forward holds it) as one accumulator [BLOCK_M, D], one tl.dot a K step, split into
its two halves in the epilogue (tl.reshape, tl.permute, tl.split) and joined back (tl.join) to be
stored. dX: one program per (BLOCK_M tokens,
BLOCK_K hidden columns), grid (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K)); it loads its tokens' cos
and sin once and loops over every head, forming that head's dY tile in registers and
multiplying it into W's rows of the head.

Inputs: x, W and the gradient contiguous; cos and sin [P, D/2] fp32 (one angle per pair);
positions [M] int64. D a power of two with D/2 >= 16 and BLOCK_M, BLOCK_K >= 16 (the narrowest
tl.dot). Offsets are int32: M H D and M K below 2^31. In Triton's interpreter use fp32 (its
tl.dot multiplies 16-bit floats as raw bit patterns); on a GPU fp32 inputs multiply in TF32.
"""
import torch
import triton
import triton.language as tl

__all__ = ["qkv_rope_teaching", "qkv_dx_teaching", "DEFAULT_BLOCKS"]

DEFAULT_BLOCKS = dict(BLOCK_M=16, BLOCK_K=16)   # small: a few programs in the interpreter


@triton.jit
def _qkv_rope_teaching_kernel(
    x_ptr,  # *x: input [M, K], contiguous (M tokens, K the hidden size)
    w_ptr,  # *weight: [N, K], contiguous, N = H D: q's heads' rows, then k's, then v's
    out_ptr,  # *qkv: output [M, H, D], contiguous, same dtype as x
    cos_ptr, sin_ptr,  # *fp32: [P, D // 2] each, cos and sin of position p's angles
    pos_ptr,  # *int64: [M], each token's position (its row of cos and sin)
    M, K,  # tokens, hidden size
    H,  # heads of q, k and v together: HQ + 2 HK
    N_ROT,  # HQ + HK: heads h < N_ROT are q's and k's (rotated), the others v's
    D: tl.constexpr,  # head dim (a power of two, D // 2 >= 16)
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16)
    BLOCK_K: tl.constexpr,  # hidden columns per step of the K loop (>= 16)
):
    # grid (cdiv(M, BLOCK_M), H): one program per (tile of tokens, head)
    HALF: tl.constexpr = D // 2
    h = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M] tokens
    m_ok = m < M
    j = tl.arange(0, HALF)                                    # [HALF] pair index
    kk = tl.arange(0, BLOCK_K)
    rows_a = h * D + j               # weight rows of features j and j + D/2 of head h
    acc_a = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)       # features j
    acc_b = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)       # features j + D/2
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        x = tl.load(x_ptr + m[:, None] * K + (k0 + kk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)          # [BLOCK_M, BLOCK_K]
        w = w_ptr + rows_a[None, :] * K + (k0 + kk)[:, None]                # W^T [BLOCK_K, HALF]
        w_a = tl.load(w, mask=k_ok[:, None], other=0.0)
        w_b = tl.load(w + HALF * K, mask=k_ok[:, None], other=0.0)
        acc_a = tl.dot(x, w_a, acc_a)
        acc_b = tl.dot(x, w_b, acc_b)
    # --- the epilogue: head h's [BLOCK_M, D] tile is in registers, fp32 ---
    if h < N_ROT:                    # a q or k head: rotate each token by its position's angles
        p = tl.load(pos_ptr + m, mask=m_ok, other=0)
        cs = p[:, None] * HALF + j[None, :]
        c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)
        s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)
        acc_a, acc_b = acc_a * c - acc_b * s, acc_b * c + acc_a * s
    out = out_ptr + (m[:, None] * H + h) * D + j[None, :]
    tl.store(out, acc_a.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])
    tl.store(out + HALF, acc_b.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _qkv_rope_one_acc_teaching_kernel(
    x_ptr,  # *x: input [M, K], contiguous (M tokens, K the hidden size)
    w_ptr,  # *weight: [N, K], contiguous, N = H D: q's heads' rows, then k's, then v's
    out_ptr,  # *qkv: output [M, H, D], contiguous, same dtype as x
    cos_ptr, sin_ptr,  # *fp32: [P, D // 2] each, cos and sin of position p's angles
    pos_ptr,  # *int64: [M], each token's position (its row of cos and sin)
    M, K,  # tokens, hidden size
    H,  # heads of q, k and v together: HQ + 2 HK
    N_ROT,  # HQ + HK: heads h < N_ROT are q's and k's (rotated), the others v's
    D: tl.constexpr,  # head dim (a power of two, D // 2 >= 16)
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16)
    BLOCK_K: tl.constexpr,  # hidden columns per step of the K loop (>= 16)
):
    # grid (cdiv(M, BLOCK_M), H): one program per (tile of tokens, head), the head held as ONE
    # accumulator [BLOCK_M, D] (one tl.dot a K step, as ropelib's forward holds it)
    HALF: tl.constexpr = D // 2
    h = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M] tokens
    m_ok = m < M
    d = tl.arange(0, D)                                       # [D] the head's features
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        x = tl.load(x_ptr + m[:, None] * K + (k0 + kk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)          # [BLOCK_M, BLOCK_K]
        w = tl.load(w_ptr + (h * D + d)[None, :] * K + (k0 + kk)[:, None],
                    mask=k_ok[:, None], other=0.0)                          # W^T [BLOCK_K, D]
        acc = tl.dot(x, w, acc)
    # --- the epilogue: split the head into its halves, rotate, put it back together ---
    if h < N_ROT:
        j = tl.arange(0, HALF)
        p = tl.load(pos_ptr + m, mask=m_ok, other=0)
        cs = p[:, None] * HALF + j[None, :]
        c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)
        s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)
        # [BLOCK_M, D] -> [BLOCK_M, 2, HALF] (half, pair) -> [BLOCK_M, HALF, 2] -> two halves
        a, b = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
        rotated = tl.join(a * c - b * s, b * c + a * s)                    # [BLOCK_M, HALF, 2]
        acc = tl.reshape(tl.permute(rotated, (0, 2, 1)), (BLOCK_M, D))
    tl.store(out_ptr + (m[:, None] * H + h) * D + d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None])


@triton.jit
def _qkv_dx_teaching_kernel(
    g_ptr,  # *dL/dqkv: [M, H, D], contiguous: gradients of the rotated q and k, and of v
    w_ptr,  # *weight: [N, K], contiguous, N = H D (as in the forward)
    gx_ptr,  # *dL/dx: output [M, K], contiguous, same dtype as the weight
    cos_ptr, sin_ptr,  # *fp32: [P, D // 2] each, cos and sin of position p's angles
    pos_ptr,  # *int64: [M], each token's position
    M, K,  # tokens, hidden size
    H,  # heads of q, k and v together: HQ + 2 HK
    N_ROT,  # HQ + HK: heads h < N_ROT are q's and k's (rotated in the forward)
    D: tl.constexpr,  # head dim (a power of two, D // 2 >= 16)
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16)
    BLOCK_K: tl.constexpr,  # hidden columns per program (>= 16)
):
    # grid (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K)): dX tile = sum over heads h of dY_h @ W_h
    HALF: tl.constexpr = D // 2
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M] tokens
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)  # [BLOCK_K] hidden columns
    m_ok = m < M
    k_ok = kk < K
    j = tl.arange(0, HALF)
    # every head of a token has the same angles: cos and sin once per program
    p = tl.load(pos_ptr + m, mask=m_ok, other=0)
    cs = p[:, None] * HALF + j[None, :]
    c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)
    s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for h in range(0, H):
        g = g_ptr + (m[:, None] * H + h) * D + j[None, :]
        g_a = tl.load(g, mask=m_ok[:, None], other=0.0).to(tl.float32)          # [BLOCK_M, HALF]
        g_b = tl.load(g + HALF, mask=m_ok[:, None], other=0.0).to(tl.float32)
        # --- the prologue: dY = R(-theta) g for a q or k head, formed in registers ---
        if h < N_ROT:
            g_a, g_b = g_a * c + g_b * s, g_b * c - g_a * s
        w = w_ptr + (h * D + j)[:, None] * K + kk[None, :]                     # W_h [HALF, BLOCK_K]
        w_a = tl.load(w, mask=k_ok[None, :], other=0.0)
        w_b = tl.load(w + HALF * K, mask=k_ok[None, :], other=0.0)
        acc = tl.dot(g_a.to(w_a.dtype), w_a, acc)
        acc = tl.dot(g_b.to(w_b.dtype), w_b, acc)
    tl.store(gx_ptr + m[:, None] * K + kk[None, :], acc.to(gx_ptr.dtype.element_ty),
             mask=m_ok[:, None] & k_ok[None, :])


def _check(x, weight, cos, sin, positions, n_heads, n_kv_heads, head_dim):
    M, K = x.shape
    H = n_heads + 2 * n_kv_heads
    if weight.shape != (H * head_dim, K):
        raise ValueError(f"weight must be [(n_heads + 2 n_kv_heads) head_dim, K] = "
                         f"[{H * head_dim}, {K}], got {list(weight.shape)}")
    if head_dim < 32 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 32 (D/2 >= 16, the narrowest "
                         f"tl.dot), got {head_dim}")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != head_dim // 2:
        raise ValueError(f"cos and sin must be [P, head_dim // 2], got {list(cos.shape)} and "
                         f"{list(sin.shape)}")
    if positions.shape != (M,):
        raise ValueError(f"positions must be [M] = [{M}], got {list(positions.shape)}")
    return M, K, H


def qkv_rope_teaching(x, weight, cos, sin, positions, *, n_heads, n_kv_heads, head_dim,
                      BLOCK_M=16, BLOCK_K=16, num_warps=4, out=None):
    """q, k, v = x @ weight^T split into heads, q and k rotated (rotate-half) in the epilogue.

    x [M, K]; weight [(n_heads + 2 n_kv_heads) head_dim, K]; cos, sin [P, head_dim // 2] fp32;
    positions [M] int64. Returns views q [M, n_heads, D], k and v [M, n_kv_heads, D] of one
    [M, H, D] buffer (`out`, or a fresh one).
    """
    M, K, H = _check(x, weight, cos, sin, positions, n_heads, n_kv_heads, head_dim)
    x, weight = x.contiguous(), weight.contiguous()
    if out is None:
        out = torch.empty(M, H, head_dim, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, BLOCK_M), H)
    _qkv_rope_teaching_kernel[grid](x, weight, out, cos.contiguous(), sin.contiguous(),
                                    positions.contiguous(), M, K, H, n_heads + n_kv_heads,
                                    D=head_dim, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K,
                                    num_warps=num_warps)
    return out.split((n_heads, n_kv_heads, n_kv_heads), dim=1)


def qkv_dx_teaching(grad_qkv, weight, cos, sin, positions, *, n_heads, n_kv_heads, head_dim,
                    BLOCK_M=16, BLOCK_K=16, num_warps=4):
    """dL/dx [M, K] from grad_qkv [M, H, D] (the gradients of the rotated q, k and of v): the
    inverse rotation applied in the prologue of the dX GEMM."""
    M, H = grad_qkv.shape[0], grad_qkv.shape[1]
    K = weight.shape[1]
    _check(torch.empty(M, K, device="meta"), weight, cos, sin, positions, n_heads, n_kv_heads,
           head_dim)
    gx = torch.empty(M, K, dtype=weight.dtype, device=weight.device)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(K, BLOCK_K))
    _qkv_dx_teaching_kernel[grid](grad_qkv.contiguous(), weight.contiguous(), gx,
                                  cos.contiguous(), sin.contiguous(), positions.contiguous(),
                                  M, K, H, n_heads + n_kv_heads, D=head_dim, BLOCK_M=BLOCK_M,
                                  BLOCK_K=BLOCK_K, num_warps=num_warps)
    return gx
