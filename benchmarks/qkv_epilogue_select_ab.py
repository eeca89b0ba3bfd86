"""The QKV forward's epilogue with one code path for q's and k's heads, against the shipped two.

kernels/qkv_gemm._store_qk_head stores a q head and a k head by a branch (`if h < HQ`), so the
compiled TMA forward holds the norm, the rotation and the layout conversions twice. The candidate
here chooses the output pointer, the norm weights, the head's index and its head count by
`tl.where` and runs one copy of the epilogue: the same arithmetic on the same values, so the same
bits. Compiled for sm_90 (Triton 3.6) it is a quarter to a third less SASS, and with QK-norm it
spills 8 bytes (inference) or 24 (training) where the branch spills 0 or 8 (benchmarks/NOTES.md).
This times the two, beside the same GEMM without the epilogue and cuBLAS, in shuffled rounds:

    python benchmarks/qkv_epilogue_select_ab.py [--tokens 8192 32768] [--rounds 7] [--out CSV]
    TRITON_INTERPRET=1 python benchmarks/qkv_epilogue_select_ab.py --dry-run   # CPU: checks only

The candidate is built at run time from the shipped file's text (only _store_qk_head's body
replaced), loaded as a module of its own and put in the place of the kernel module that
qkv_plan plans with and qkv_linear starts.
Both norm weights must share a dtype for the select (pointers of two element types cannot be
chosen between); the cases here use fp32 weights for both.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
from unittest import mock

import torch
import triton

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkv_rope_bench as bench  # noqa: E402
from qkv_forward_ab import DRY_SHAPE, SHAPE  # noqa: E402  (Llama-3-8B's projection; a tiny one)

import ropelib  # noqa: E402
from ropelib import qkv_linear, qkv_plan, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.kernels import qkv_gemm  # noqa: E402

BRANCH = '''    if h < HQ:
        _norm_rotate_store(y_a, y_b, y_p, q_ptr, norm_q_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b,
                           s_b, m, m_ok, h, HQ, h, HQ + HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                           D, LAYOUT, INT64, ROTATE, HAS_PASS, cos_ptr, sin_ptr, row_t, mask_t,
                           IN_TURN)
    else:
        _norm_rotate_store(y_a, y_b, y_p, k_ptr, norm_k_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b,
                           s_b, m, m_ok, h - HQ, HK, h, HQ + HK, S, B, eps, d_a, d_b, e, j_ok,
                           e_ok, D, LAYOUT, INT64, ROTATE, HAS_PASS, cos_ptr, sin_ptr, row_t,
                           mask_t, IN_TURN)
'''
SELECT = '''    is_q = h < HQ
    out_ptr = tl.where(is_q, q_ptr, k_ptr)
    nw_ptr = norm_q_ptr
    if norm_q_ptr is not None:
        nw_ptr = tl.where(is_q, norm_q_ptr, norm_k_ptr)
    hh = tl.where(is_q, h, h - HQ)
    H = tl.where(is_q, HQ, HK)
    _norm_rotate_store(y_a, y_b, y_p, out_ptr, nw_ptr, rstd_ptr, pre_ptr, c_a, s_a, c_b,
                       s_b, m, m_ok, hh, H, h, HQ + HK, S, B, eps, d_a, d_b, e, j_ok, e_ok,
                       D, LAYOUT, INT64, ROTATE, HAS_PASS, cos_ptr, sin_ptr, row_t, mask_t,
                       IN_TURN)
'''


def select_module():
    """qkv_gemm with _store_qk_head's branch replaced by selects, as a module of its own."""
    text = open(qkv_gemm.__file__, encoding="utf-8").read()
    assert text.count(BRANCH) == 1, "qkv_gemm._store_qk_head is no longer the branch this edits"
    folder = tempfile.mkdtemp(prefix="qkv_select_")
    path = os.path.join(folder, "qkv_gemm_select.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(BRANCH, SELECT))
    name = "ropelib.kernels.qkv_gemm_select"           # relative imports resolve in ropelib.kernels
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def variants(tokens, norm, training, hidden, HQ, HK, D, select, device="cuda"):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(1, tokens, hidden, device=device, dtype=dtype, requires_grad=training)
    w = torch.randn((HQ + 2 * HK) * D, hidden, device=device, dtype=dtype) * 0.02
    angles = ropelib.rope_angles(D, base=500000.0, device=device)
    nq = torch.rand(D, device=device) + 0.5 if norm else None
    nk = torch.rand(D, device=device) + 0.5 if norm else None

    def fused():
        return ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                       q_norm_weight=nq, k_norm_weight=nk, angles=angles)

    def with_select():
        # the kept plans (ropelib.eager.SIGNATURES) dropped on the way in and out: planned
        # from the select module, and none of its launches left for the shipped variant
        with mock.patch.object(qkv_plan, "kernel", select), \
                mock.patch.object(qkv_linear, "kernel", select):
            ropelib.eager.SIGNATURES.clear()
            try:
                return fused()
            finally:
                ropelib.eager.SIGNATURES.clear()

    return {"cublas": lambda: torch.nn.functional.linear(x, w),
            "branch (shipped)": fused,
            "select": with_select,
            "GEMM, no epilogue": lambda: bench._TritonGemm.apply(
                x.detach(), w, angles.turns, angles.amplitude, HQ, HK, D)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--rounds", type=int, default=7)
    compare.add_round_order_arguments(ap, what="variants")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, checks only (CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = runtime.default_device()
    if not args.dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    shape = DRY_SHAPE if args.dry_run else SHAPE
    time_ms = (lambda fn: compare.wall_clock(fn, reps=1, warmup=0)[0]) if args.dry_run \
        else triton.testing.do_bench
    compare.use_round_order(args)
    select = select_module()
    rows = []
    for tokens in ([24] if args.dry_run else args.tokens):
        for norm, training in ((False, False), (True, False), (True, True)):
            case = "plain" if not norm else ("QK-norm, training" if training else "QK-norm")
            runs = variants(tokens, norm, training, device=device, select=select, **shape)
            for a, b in zip(runs["select"](), runs["branch (shipped)"]()):   # the same bits
                assert torch.equal(a, b), (tokens, case)
            times = compare.times_in_rounds(runs, args.rounds, lambda n: time_ms(runs[n]))
            for name in runs:
                rows.append(dict(tokens=tokens, case=case, variant=name,
                                 ms=statistics.median(times[name]), rounds=args.rounds,
                                 round_ms=" ".join(f"{t:.5f}" for t in times[name])))
                print(f"{tokens:6d} {case:18s} {name:18s} {rows[-1]['ms']:.4f} ms", flush=True)
            for name in ("branch (shipped)", "select"):
                paired = [f / g - 1 for f, g in zip(times[name], times["GEMM, no epilogue"])]
                print(f"{tokens:6d} {case:18s} {name} over the bare GEMM, paired by round: "
                      f"{statistics.median(paired):+.1%} ({min(paired):+.1%} to "
                      f"{max(paired):+.1%})", flush=True)
            paired = [s / b - 1 for s, b in zip(times["select"], times["branch (shipped)"])]
            print(f"{tokens:6d} {case:18s} select over branch, paired by round: "
                  f"{statistics.median(paired):+.1%} ({min(paired):+.1%} to {max(paired):+.1%})",
                  flush=True)
    if args.out:
        compare.write_csv(rows, args.out, compare.environment_meta(),
                          fields=["tokens", "case", "variant", "ms", "rounds", "round_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
