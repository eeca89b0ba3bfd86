"""Compile every product kernel for an H100/H200 (sm_90) on this machine, without a GPU:
Triton's front end, its optimiser and ptxas run on the CPU, so an error only the GPU compiler
finds (the interpreter runs kernels as Python) shows up here. Run without TRITON_INTERPRET (under
the interpreter @triton.jit gives interpreted functions); tests/test_kernels_compile.py runs it.

Prints one line per variant: `name arguments fma-count`."""

import torch

import ropelib
from ropelib.course.offline_compile import compile_for_cuda, resource_usage, triton_tool
from ropelib.kernels import kv_cache as KV
from ropelib.kernels import launch as L
from ropelib.kernels import mrope as MR
from ropelib.kernels import qk_norm_rope as QK
from ropelib.kernels import qkv_gemm as QG
from ropelib.kernels import tiles as T
from ropelib.kernels.planning import pointer_dtypes

SM90_SHARED_PER_BLOCK = 227 * 1024     # the most an H100 or H200 block may opt into
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
         torch.float64: "fp64", torch.int32: "i32", torch.int64: "i64",
         torch.float8_e4m3fn: "fp8e4nv"}


def machine_code(compiled) -> tuple:
    """(SASS, registers per thread, stack bytes per thread) of a kernel compiled here, read from
    its cubin with the nvdisasm and cuobjdump Triton bundles ("?" where cuobjdump says none)."""
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([triton_tool("nvdisasm"), "-c", cubin],
                              capture_output=True, text=True, check=True).stdout
    usage = resource_usage(compiled.asm["cubin"])
    regs, stack = usage.get("registers"), usage.get("stack")
    return sass, "?" if regs is None else str(regs), "?" if stack is None else str(stack)


def compile_for_gpu(name, kernel, pointer_names, planned, pointers):
    """Compile as a launch with these arguments would (offline_compile.compile_for_cuda: the
    JIT's own specialisation, the launch's warps and pipeline stages), for sm_90."""
    # torch.compile writes a launch's arguments into the code it generates (their repr): each
    # must be a plain Python value, not a Triton object such as tl.constexpr
    odd = {k: v for k, v in planned.args.items() if type(v) not in (int, float, bool, type(None))}
    assert not odd, f"{name}: launch arguments that are no plain Python values: {odd}"
    compiled = compile_for_cuda(kernel, dict(zip(pointer_names, pointers), **planned.args),
                                **planned.options())
    # a program asking for more shared memory than an SM gives one block does not launch
    assert compiled.metadata.shared <= SM90_SHARED_PER_BLOCK, \
        f"{name}: {compiled.metadata.shared} bytes of shared memory, more than sm_90's " \
        f"{SM90_SHARED_PER_BLOCK} a block"
    ptx = compiled.asm["ptx"]
    print(name, len(kernel.arg_names), ptx.count("fma.rn.f32") + ptx.count("fma.rn.f64"))
    return compiled


def main():
    S, B, H, D, P = 8, 2, 2, 64, 32
    bf = torch.bfloat16
    f = ropelib.rope_freqs(P, D)[:, 0, 0]
    x, y = torch.randn(S, B, 2 * H, D, dtype=bf), torch.empty(S, B, 2 * H, D, dtype=bf)
    k, ko = torch.randn(S, B, H, D, dtype=bf), torch.empty(S, B, H, D, dtype=bf)
    start = torch.zeros(B, dtype=torch.int32)
    for name, table, pos, with_k, interleaved, backward, in_place in [
        ("rope-angles", L.Table(f, None), L.Positions(), False, False, False, False),
        ("rope-qk-start-cp", L.Table(f, None), L.Positions(start=start, cp_size=2, cp_rank=1),
         True, True, True, False),
        ("rope-qk-in-place", L.Table(f, None), L.Positions(start=start), True, False, False,
         True),
        ("rope-cos-sin-position-ids", L.Table(f.cos(), f.sin()),
         L.Positions(position_ids=torch.zeros(1, S, dtype=torch.int64)), False, False, False,
         False),
        ("rope-packed", L.Table(f, None),
         L.Positions(cu_seqlens=torch.tensor([0, 3, S], dtype=torch.int32)), True, False, False,
         False),
        ("rope-table-free", L.Table(torch.zeros(D, dtype=torch.int64), torch.ones(1)),
         L.Positions(), False, False, False, False),
    ]:
        kv = dict(k=L.View.of(k), k_out=None if in_place else L.View.of(ko)) if with_k else {}
        planned, ptrs = L.plan(L.View.of(x), None if in_place else L.View.of(y), table, pos,
                               R=D, interleaved=interleaved, backward=backward, layout="sbhd",
                               tiles=(4, 2, 1, 4), **kv)
        compile_for_gpu(name, planned.launcher.kernel, planned.launcher.pointer_names, planned,
                        ptrs)
    x64 = torch.randn(S, B, H, D, dtype=torch.float64)
    y64 = torch.empty(B, S, H, D, dtype=torch.float64).transpose(0, 1)   # contiguous in bshd
    planned, ptrs = L.plan(L.View.of(x64), L.View.of(y64),
                           L.Table(f.double(), None), L.Positions(), R=D, interleaved=True,
                           backward=False, layout="bshd", tiles=(4, 2, 1, 4))
    compile_for_gpu("rope-fp64", planned.launcher.kernel, planned.launcher.pointer_names,
                    planned, ptrs)
    qkv = torch.randn(S, B, H, 4 * D, dtype=bf)     # 2 query heads per group
    for name, backward in [("rope-qkv", False), ("rope-qkv-backward", True)]:
        planned, ptrs = L.plan_qkv(qkv, x, k, f, f, start, heads_per_group=2, interleaved=False,
                                   backward=backward, cp_size=1, cp_rank=0)
        compile_for_gpu(name, planned.launcher.kernel, planned.launcher.pointer_names, planned,
                        ptrs)

    qb, kb = x.transpose(0, 1).contiguous(), k.transpose(0, 1).contiguous()   # [B, S, H, D]
    for name, kc, vc, block_table, table, sin, scale in [
        ("kv-cache", torch.empty(B, P, H, D, dtype=bf), torch.empty(B, P, H, D, dtype=bf), None,
         f, None, None),
        ("kv-cache-paged-fp8", torch.empty(8, 4, H, D, dtype=torch.float8_e4m3fn),
         torch.empty(8, 4, H, D, dtype=torch.float8_e4m3fn), torch.zeros(B, 4, dtype=torch.int32),
         f.cos(), f.sin(), torch.ones(1)),
    ]:
        planned, ptrs = KV.plan(qb, kb, kb, torch.empty_like(qb), kc, vc, start, block_table,
                                table, sin, scale, scale, interleaved=False)
        compile_for_gpu(name, planned.launcher.kernel, planned.launcher.pointer_names, planned,
                        ptrs)

    w = torch.ones(D)
    for name, table, sin, pos, backward in [
        ("qk-norm", f, None, None, False),
        ("qk-norm-backward", f.cos(), f.sin(), torch.zeros(1, S, dtype=torch.int64), True),
        ("qk-norm-packed-backward", f, None, torch.tensor([0, 3, S], dtype=torch.int32), True),
    ]:
        qo, kout = torch.empty_like(x), torch.empty_like(k)
        grads = dict(gq4=torch.randn_like(x), gk4=torch.randn_like(k)) if backward else {}
        planned = QK.plan(x, k, qo, kout, w, w, table, sin, pos, layout="sbhd", interleaved=True,
                          eps=1e-6, weight_offset=0.0, packed="packed" in name, **grads)
        ptrs = QK.pointers(planned, x, k, qo, kout, w, w, table, sin, pos, grads.get("gq4"),
                           grads.get("gk4"), QK.partials(planned))
        compile_for_gpu(name, planned.launcher.kernel, planned.launcher.pointer_names, planned,
                        ptrs)

    positions = torch.zeros(3, 1, S, dtype=torch.int64)
    inv, axis = torch.rand(D // 2), torch.zeros(D // 2, dtype=torch.int32)
    for name, kv in [("multi-axis", {}), ("multi-axis-qk", dict(k4=k, k_out4=ko))]:
        planned, ptrs = MR.plan(x, y, positions, inv, axis, interleaved=False, backward=True,
                                layout="sbhd", **kv)
        compile_for_gpu(name, MR._mrope_kernel, MR.POINTERS, planned, ptrs)

    # the two-pass route (kernels/flat.py): the cos/sin pre-pass and the flat pass, with the
    # GPU's tiles (the CPU plans interpreter-sized ones)
    xb, xbo = x.transpose(0, 1).contiguous(), torch.empty(B, S, 2 * H, D, dtype=bf)
    kb2, kbo = k.transpose(0, 1).contiguous(), torch.empty(B, S, H, D, dtype=bf)
    views = lambda *ts: [L.View.of(t.transpose(0, 1)) for t in ts]     # noqa: E731
    ids = torch.zeros(B, S, dtype=torch.int64)
    for name, table, pos, interleaved, backward in [
        ("two-pass-angles-interleaved", L.Table(f, None), L.Positions(), True, False),
        ("two-pass-ids-backward", L.Table(f, None), L.Positions(position_ids=ids), False, True),
        ("two-pass-cos-sin", L.Table(f.cos(), f.sin()), L.Positions(), False, True),
        ("two-pass-fp32", L.Table(f, None), L.Positions(), False, False),
        # rows by position (packed sequences): each token's row index, then its row
        ("two-pass-by-position", L.Table(f[:4], None),
         L.Positions(cu_seqlens=torch.tensor([0, 3, S], dtype=torch.int32)), False, False),
    ]:
        q4, qo4, k4, ko4 = views(*((t.float() for t in (xb, xbo, kb2, kbo))
                                   if name.endswith("fp32") else (xb, xbo, kb2, kbo)))
        route, ptrs = L.plan_two_pass(q4, qo4, table, pos, R=D, interleaved=interleaved,
                                      backward=backward, layout="bshd", k=k4, k_out=ko4)
        rows = route.rotate_pass
        rows.args = dict(rows.args, XBLOCK=T.TWO_PASS_ELEMENTS)
        token_rows = None
        if route.index_pass is not None:
            token_rows = torch.empty(route.index_shape, dtype=torch.int32)
            compile_for_gpu(name + "-index", route.index_pass.launcher.kernel,
                            route.index_pass.launcher.pointer_names, route.index_pass,
                            ptrs[6:9] + (token_rows,))
            ptrs = ptrs[:6] + (None, None, None)
        if route.table_pass is not None:
            pre = route.table_pass
            half = pre.args["BLOCK_HALF"]
            pre.args = dict(pre.args, BLOCK_S=max(1, T.TWO_PASS_TABLE_ELEMENTS // half))
            table_rows = route.new_rows(torch.device("cpu"))    # (and the flag per row)
            *cs, flags = table_rows
            compile_for_gpu(name + "-table", pre.launcher.kernel, pre.launcher.pointer_names,
                            pre, route.table_pass_pointers(ptrs[4:9], table_rows))
            ptrs = ptrs[:4] + tuple(cs)
        else:
            flags = None
        compile_for_gpu(name, rows.launcher.kernel, rows.launcher.pointer_names, rows,
                        ptrs[:6] + (token_rows, flags))
        equal = route.rotate_pass_equal     # kept rows whose flags are all 0
        if equal is not None:
            equal.args = dict(equal.args, XBLOCK=T.TWO_PASS_ELEMENTS)
            compile_for_gpu(name + "-pairs-equal", equal.launcher.kernel,
                            equal.launcher.pointer_names, equal, ptrs[:6] + (token_rows, None))
    # packed sequences, one per grid row of the flat pass (launch.by_sequence): no row index
    xt, xto = xb.reshape(B * S, 2 * H, D), torch.empty(B * S, 2 * H, D, dtype=bf)
    cu = torch.tensor([0, 3, B * S], dtype=torch.int32)
    grid, T.TWO_PASS_SEQUENCE_GRID = T.TWO_PASS_SEQUENCE_GRID, 1 << 30  # (whatever the grid)
    try:
        route, ptrs = L.plan_two_pass(L.View.of(xt.unsqueeze(1)), L.View.of(xto.unsqueeze(1)),
                                      L.Table(f, None), L.Positions(cu_seqlens=cu), R=D,
                                      interleaved=False, backward=False, layout="thd")
    finally:
        T.TWO_PASS_SEQUENCE_GRID = grid
    assert route.seq_rows and route.index_pass is None, "thd by sequence"
    rows = route.rotate_pass
    rows.args = dict(rows.args, XBLOCK=T.TWO_PASS_ELEMENTS)
    *cs, flags = route.new_rows(torch.device("cpu"))
    compile_for_gpu("two-pass-by-sequence", rows.launcher.kernel, rows.launcher.pointer_names,
                    rows, ptrs[:4] + tuple(cs) + (cu, flags))
    # Qwen2-VL's per-axis tables [3, B, S, D] in the input's dtype, read as they are
    c3 = torch.empty(3, B, S, D, dtype=bf)
    route, ptrs = L.plan_two_pass(*views(xb, xbo), L.Table(c3[0], c3[0], (2, 5, c3.stride(0))),
                                  L.Positions(), R=D, interleaved=False, backward=True,
                                  layout="bshd", k=views(kb2)[0], k_out=views(kbo)[0])
    rows = route.rotate_pass
    rows.args = dict(rows.args, XBLOCK=T.TWO_PASS_ELEMENTS)
    compile_for_gpu("two-pass-axes-backward", rows.launcher.kernel, rows.launcher.pointer_names,
                    rows, ptrs[:6] + (None, None))
    # ... with sections at multiples of 8 pairs: both members of a pair in one thread
    route, ptrs = L.plan_two_pass(*views(xb, xbo), L.Table(c3[0], c3[0], (8, 16, c3.stride(0))),
                                  L.Positions(), R=D, interleaved=False, backward=False,
                                  layout="bshd", k=views(kb2)[0], k_out=views(kbo)[0])
    rows = route.rotate_pass
    assert rows.num_warps == T.TWO_PASS_PAIR_WARPS, "sections at multiples of 8: the pairs pass"
    rows.args = dict(rows.args, XBLOCK=T.TWO_PASS_ELEMENTS)
    compile_for_gpu("two-pass-axes-pairs", rows.launcher.kernel, rows.launcher.pointer_names,
                    rows, ptrs[:6] + (None, None))

    # RoPE fused into the QKV projection (kernels/qkv_gemm.py), with the GPU's tiles
    HQ, HK, D, K = 4, 2, 128, 256
    N, M = (HQ + 2 * HK) * D, S * B
    cuda = torch.device("cuda")
    turns, amp = torch.zeros(D, dtype=torch.int64), torch.ones(1, dtype=torch.float64)
    ids, cu = torch.zeros(B, S, dtype=torch.int64), torch.tensor([0, 3, M], dtype=torch.int32)
    for name, kind, dtype, R, table, sin, pos, cu_seqlens, norm, layout, interleaved in [
        ("qkv-linear-fwd", "fwd", bf, D, f, None, None, None, False, "bshd", False),
        ("qkv-linear-fwd-fp32", "fwd", torch.float32, D, f, None, None, None, False, "bshd",
         False),
        ("qkv-linear-fwd-norm-table-free", "fwd", bf, D // 2, turns[:D // 2], amp, ids, None,
         True, "bhsd", True),
        ("qkv-linear-dx-norm-table-free", "dx", bf, D // 2, turns[:D // 2], amp, ids, None,
         True, "bhsd", True),
        ("qkv-linear-dw-norm-packed", "dw", bf, D, f, None, None, cu, True, "bshd", False),
        # Gemma 3's head dim with its QK-norm: dX's tile with the norm must fit an SM's shared
        # memory at d = 256 too (at 64 x 64 on 4 warps it asked for 246,272 bytes)
        ("qkv-linear-dx-norm-d256", "dx", bf, 256, torch.empty(P, 256), None, None, None, True,
         "bshd", False),
        # fp32 heads of 256: rows of 1 KiB take tiles of their own (GPU_TILES_LONG_ROWS)
        ("qkv-linear-fwd-fp32-d256", "fwd", torch.float32, 256, torch.empty(P, 256), None, None,
         None, True, "bshd", False),
        ("qkv-linear-dx-norm-fp32-d256", "dx", torch.float32, 256, torch.empty(P, 256), None,
         None, None, True, "bshd", False),
        ("qkv-linear-dw-norm-fp32-d256", "dw", torch.float32, 256, torch.empty(P, 256), None,
         None, None, True, "bshd", False),
    ]:
        hd = max(D, R)      # the head dim: 128, or the rotary dim of the full-rotary d = 256 ones
        N = (HQ + 2 * HK) * hd
        R_, P_ = (R, 2**31 - 1) if table.dtype == torch.int64 else (table.shape[1], table.shape[0])
        x, w = torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype)
        outs = [torch.empty(M, h * hd, dtype=dtype) for h in (HQ, HK, HK)]
        wn = [torch.ones(hd), torch.ones(hd)] if norm else [None, None]
        saved = [torch.empty(M, HQ + HK), torch.empty(M, (HQ + HK) * hd, dtype=dtype)] if norm \
            else [None, None]
        shared = (table, sin, pos, cu_seqlens, *wn, *saved)
        # the forward and dX read every token's cos and s' rows [NB * S, R] instead
        rows = torch.empty((B if pos is not None else 1) * S, R_)
        if kind == "fwd":
            # a table's pre-pass also says whether pairs share cos and sin (Angles always do)
            differ = None if table.dtype == torch.int64 else torch.zeros(1, dtype=torch.int32)
            names, ptrs = QG.FWD_POINTERS, (x, w, torch.empty(N, dtype=dtype), *outs, rows, rows,
                                            *wn, *saved, differ)
        elif kind == "dx":
            names, ptrs = QG.DX_POINTERS, (*outs, w, x, rows, rows, *wn, *saved)
        else:
            names, ptrs = QG.DW_POINTERS, (*outs, x, w, torch.empty(N),
                                           torch.empty(HQ + HK, hd), *shared)
        planned = QG.plan(kind, S=S, B=B, K=K, HQ=HQ, HK=HK, D=hd, R=R_, P=P_, ids=pos,
                          cu_seqlens=cu_seqlens, layout=layout, interleaved=interleaved,
                          eps=1e-6, device=cuda, dtypes=pointer_dtypes(ptrs))
        compiled = compile_for_gpu(name, planned.launcher.kernel, names, planned, ptrs)
        if "fp32-d256" in name:
            # the long-row tiles were timed on an H200: the forward's fastest spills (2,368
            # bytes a thread with the norm, Triton 3.6; 2,376 with 3.9) and is kept; dX and dW
            # spill little (the first dW tile spilled 4,944 bytes, and forward+backward ran
            # 20x the bare GEMMs' time)
            stack = machine_code(compiled)[2]
            limit = 2560 if kind == "fwd" else 1024
            assert stack == "?" or int(stack) <= limit, f"{name}: {stack} bytes of stack a thread"

    # The forward on the persistent TMA main loop, the route an sm_90 GPU takes (planned here as
    # there: has_tma says yes, one program per SM of an H100). Its epilogue is chosen once per
    # program, one side of the branch on a table's pairs flag decided at run time and both
    # compiled: every epilogue, and the bare GEMM the benchmarks time (rotate=False), must
    # compile with the pointers its launch passes (None where it has none).
    from unittest import mock
    S_, HQ, HK, D, K = 64, 4, 2, 128, 256
    M, N = S_, (HQ + 2 * HK) * D
    x, w = torch.empty(M, K, dtype=bf), torch.empty(N, K, dtype=bf)
    outs = [torch.empty(M, h * D, dtype=bf) for h in (HQ, HK, HK)]
    rows, flag = torch.empty(S_, D), torch.zeros(1, dtype=torch.int32)
    wn = (torch.ones(D), torch.ones(D))
    saved = (torch.empty(M, HQ + HK), torch.empty(M, (HQ + HK) * D, dtype=bf))
    with mock.patch.object(QG, "has_tma", lambda device: True), \
            mock.patch.object(QG, "_programs", lambda device: 132), \
            mock.patch.object(QG, "ensure_allocator", lambda: None):
        # (the rows: every token's cos and s' rows, from angles or a table; none without a
        # rotation)
        for name, has_rows, norm, shared, rotate in [
                ("qkv-linear-fwd-tma-angles", True, False, True, True),
                ("qkv-linear-fwd-tma-cos-sin", True, False, False, True),
                ("qkv-linear-fwd-tma-cos-sin-norm", True, True, False, True),
                ("qkv-linear-fwd-tma-bare", False, False, False, False)]:
            ptrs = (x, w, None, *outs, *((rows, rows) if has_rows else (None, None)),
                    *(wn if norm else (None, None)), *(saved if norm else (None, None)),
                    flag if has_rows and not shared else None)
            planned = QG.plan("fwd", S=S_, B=1, K=K, HQ=HQ, HK=HK, D=D, R=D, P=S_, ids=None,
                              cu_seqlens=None, layout="bshd", interleaved=False, eps=1e-6,
                              device=cuda, dtypes=pointer_dtypes(ptrs), rotate=rotate,
                              shared_angle=shared)
            assert planned.launcher is QG.FWD_TMA, name
            compile_for_gpu(name, planned.launcher.kernel, QG.FWD_POINTERS, planned, ptrs)


if __name__ == "__main__":
    main()
