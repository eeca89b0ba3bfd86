"""qkv_rope_linear's forward on its two main loops, timed in rounds beside cuBLAS and the unfused
pipeline (GPU with TMA).

ropelib's QKV projection runs its forward on a persistent TMA main loop where a GPU has TMA
(kernels/qkv_gemm._qkv_rope_fwd_tma_kernel, two heads a tile, where both head counts are even),
and on the pointer-loaded kernel (_qkv_rope_fwd_kernel) elsewhere. (A first run also timed the
TMA kernel with one head a tile: slower than the pointer-loaded kernel, 0.70 against 0.74 of
cuBLAS; results/qkv_forward_ab-nvidia-h200-20261130-2249.csv.) This times, for
Llama-3-8B's projection (hidden 4096, 32/8 heads of 128, bf16, table-free angles), with and
without QK-norm:

    cublas             F.linear alone (the ratios' reference)
    unfused            F.linear, then ropelib's RoPE on q and k (qk_norm_rope with the norm),
                       from an angle table (ropelib.rope_freqs)
    pointer kernel     qkv_rope_linear with the TMA main loop switched off
    TMA, four row tiles   the TMA forward reading each member's own cos and sin although
                       table-free angles give both members one angle (since 2026-12-01: read in
                       turn, two tiles live at a time; before, four tiles at once)
    TMA, two heads     qkv_rope_linear as shipped on this GPU (one cos and one sin tile)
    table, four tiles  qkv_rope_linear from the angle table, the pre-pass's flag withheld, so
                       the forward reads each member's own rows (as above)
    table, flag        qkv_rope_linear from the angle table as shipped: the pre-pass finds
                       every pair's members equal and the forward, branching on that flag,
                       reads two tiles (the other branch compiled beside them)
    GEMM, no epilogue  the same TMA kernel with ROTATE=False, launched alone (no pre-pass, no
                       norm, q, k, v stored as projected: qkv_rope_bench's triton_gemm)
    rows pre-pass      the pre-pass alone that writes every token's cos and sin rows from the
                       angles (qkv_linear.cos_sin_rows)
    packed, cu_seqlens x as eight packed sequences [T, hidden] with cu_seqlens, from angles:
                       the pre-pass searches each token's sequence (positions restart in each)
(A run of 2026-12-01 also timed the TMA forward launched early, by programmatic dependent
launch, while the pre-pass ran: 2-8 % slower, paired by round, so it launches after the
pre-pass; results/qkv_forward_ab-early-nvidia-h200-20261201-1717.csv, "TMA, not early" being
the forward as it is now.)
So "TMA, two heads" against "GEMM, no epilogue" is what the epilogue and the pre-pass cost,
printed paired round by round (the two timed in the same round); the CSV keeps every round's
time of every variant (round_ms, in round order).

every variant once a round; a variant's ratio to cuBLAS is the median of its rounds' ratios
(above 1: faster than cuBLAS). `--order shuffled` (the default since 2026-12-01 08:00) visits
the variants in a new order each round (compare.round_order; runs with the same `--seed` visit
the same orders), so that no variant always runs right after the same one; `--order fixed`
(every committed run before) visits them in the order above in every round. The order is a
variable: on an H200, in a run in each order one after the other, "table, flag" came out within
1 % of "TMA, two heads" shuffled and 2-10 % behind it in the fixed order, where it always
follows "table, four tiles"; and every fused variant came out slower against cuBLAS, which a
fixed round runs first (benchmarks/NOTES.md, "the table's lag is the rounds' order").

    python benchmarks/qkv_forward_ab.py [--tokens 8192 32768] [--rounds 7] [--order fixed]
                                        [--out CSV]
    TRITON_INTERPRET=1 python benchmarks/qkv_forward_ab.py --dry-run   # CPU: tiny shapes, every
                                        # variant checked, times by the wall clock (meaningless)
"""
import argparse
import os
import statistics
import sys
from unittest import mock

import torch
import triton

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkv_rope_bench as bench  # noqa: E402

import ropelib  # noqa: E402
from ropelib import qkv_linear, runtime  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.kernels import qkv_gemm  # noqa: E402

SHAPE = dict(hidden=4096, HQ=32, HK=8, D=128)        # Llama-3-8B's projection
DRY_SHAPE = dict(hidden=64, HQ=4, HK=2, D=32)        # a few programs in the interpreter


def patched(call, module, **attrs):
    """call() with module's attributes swapped for attrs (restored after), the kept plans
    (ropelib.eager.SIGNATURES) dropped on the way in and out: planned with the swapped ones,
    and none of those plans left for the other variants."""
    def run():
        with mock.patch.multiple(module, **attrs):
            ropelib.eager.SIGNATURES.clear()
            try:
                return call()
            finally:
                ropelib.eager.SIGNATURES.clear()
    return run


def flag_withheld(run):
    """qkv_linear._run without the pre-pass's pairs flag: the forward reads each member's
    own cos and sin rows."""
    def without(kind, pointers, *args, **kwargs):
        return run(kind, pointers[:-1] + (None,), *args, **kwargs)
    return without


def four_row_tiles():
    """qkv_gemm.plan reading four cos/sin row tiles even where both members share an angle."""
    plan = qkv_gemm.plan

    def planned(*args, **kwargs):
        return plan(*args, **dict(kwargs, shared_angle=False))
    return planned


def variants(tokens: int, norm: bool, hidden: int, HQ: int, HK: int, D: int,
             device="cuda") -> dict:
    # bf16 on a GPU; fp32 in the interpreter (its tl.dot multiplies 16-bit floats as raw bits)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(1, tokens, hidden, device=device, dtype=dtype)
    w = torch.randn((HQ + 2 * HK) * D, hidden, device=device, dtype=dtype) * 0.02
    angles = ropelib.rope_angles(D, base=500000.0, device=device)
    nq = nk = torch.ones(D, device=device) if norm else None
    freqs = ropelib.rope_freqs(tokens, D, base=500000.0, device=device)
    packed = torch.linspace(0, tokens, 9, device=device).round().to(torch.int32)   # 8 sequences

    def fused(**table):
        return ropelib.qkv_rope_linear(x, w, n_heads=HQ, n_kv_heads=HK, head_dim=D,
                                       q_norm_weight=nq, k_norm_weight=nk,
                                       **(table or dict(angles=angles)))

    def unfused():
        y = torch.nn.functional.linear(x, w)
        q = y[..., : HQ * D].view(1, tokens, HQ, D)
        k = y[..., HQ * D:(HQ + HK) * D].view(1, tokens, HK, D)
        if norm:
            return ropelib.qk_norm_rope(q, k, nq, nk, freqs, layout="bshd")
        return ropelib.apply_rope_qk(q, k, freqs, layout="bshd")

    return {"cublas": lambda: torch.nn.functional.linear(x, w),
            "unfused": unfused,
            "pointer kernel": patched(fused, qkv_gemm, uses_tma=lambda *a, **k: False),
            "TMA, four row tiles": patched(fused, qkv_gemm, plan=four_row_tiles()),
            "TMA, two heads": fused,
            "table, four tiles": patched(lambda: fused(freqs=freqs), qkv_linear,
                                         _run=flag_withheld(qkv_linear._run)),
            "table, flag": lambda: fused(freqs=freqs),
            "GEMM, no epilogue": lambda: bench._TritonGemm.apply(
                x, w, angles.turns, angles.amplitude, HQ, HK, D),
            "rows pre-pass": lambda: qkv_linear.cos_sin_rows(
                x, angles.turns, angles.amplitude, None, None, False),
            # packed x [T, hidden] of eight sequences (cu_seqlens): the pre-pass finds each
            # token's position in its sequence, the forward is the same kernel
            "packed, cu_seqlens": lambda: ropelib.qkv_rope_linear(
                x[0], w, n_heads=HQ, n_kv_heads=HK, head_dim=D, angles=angles,
                cu_seqlens=packed, q_norm_weight=nq, k_norm_weight=nk)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--rounds", type=int, default=7)
    compare.add_round_order_arguments(ap, what="variants")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes in the interpreter (CPU): every variant built and checked, "
                         "times by the wall clock, which say nothing about a GPU")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = runtime.default_device()
    if not args.dry_run and device != "cuda":
        raise SystemExit("timing needs a CUDA GPU; use --dry-run on the CPU")
    shape = DRY_SHAPE if args.dry_run else SHAPE
    tokens_list = [24] if args.dry_run else args.tokens
    time_ms = (lambda fn: compare.wall_clock(fn, reps=1, warmup=0)[0]) if args.dry_run \
        else triton.testing.do_bench
    # the variants' outputs: the same bits on a GPU (bf16, rounded once); in the interpreter's
    # fp32 the two main loops sum their products in different orders
    same = torch.equal if device == "cuda" else (
        lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5))
    compare.use_round_order(args)       # (round_order's default, and the CSV's header)
    rows = []
    for tokens in tokens_list:
        for norm in (False, True):
            runs = variants(tokens, norm, device=device, **shape)
            ref = runs["TMA, two heads"]()
            for name in ("pointer kernel", "TMA, four row tiles"):  # the same outputs
                for a, b in zip(runs[name](), ref):
                    assert same(a, b), (name, tokens, norm)
            for a, b in zip(runs["table, four tiles"](), runs["table, flag"]()):
                assert same(a, b), ("table", tokens, norm)
            # packed: the first sequence's tokens are at positions 0.., as in the unpacked call
            # (to bf16's rounding: its rows come through another search)
            first = int(tokens / 8 + 0.5)
            for a, b in zip(runs["packed, cu_seqlens"](), ref):
                assert torch.allclose(a[:first].float(), b[0, :first].float(), rtol=1e-2,
                                      atol=1e-2), ("packed", tokens, norm)
            times = compare.times_in_rounds(runs, args.rounds, lambda name: time_ms(runs[name]))
            for name in runs:
                ratios = [c / t for c, t in zip(times["cublas"], times[name])]
                rows.append(dict(tokens=tokens, qk_norm=norm, variant=name,
                                 ms=statistics.median(times[name]),
                                 cublas_ms_over_ms=statistics.median(ratios),
                                 low=min(ratios), high=max(ratios), rounds=args.rounds,
                                 round_ms=" ".join(f"{t:.5f}" for t in times[name])))
                r = rows[-1]
                print(f"{tokens:6d} {'QK-norm' if norm else 'plain':8s} {name:19s} "
                      f"{r['ms']:.4f} ms  {r['cublas_ms_over_ms']:.3f} of cuBLAS's speed "
                      f"(rounds {r['low']:.3f}-{r['high']:.3f})", flush=True)
            # the epilogue's price, paired round by round: the fused kernel over its own GEMM
            # without the epilogue, both timed in the same round
            paired = [f / b - 1
                      for f, b in zip(times["TMA, two heads"], times["GEMM, no epilogue"])]
            print(f"{tokens:6d} {'QK-norm' if norm else 'plain':8s} the epilogue, paired by round: "
                  f"{statistics.median(paired):+.1%} (rounds {min(paired):+.1%} to "
                  f"{max(paired):+.1%})", flush=True)
    if args.out:
        compare.write_csv(rows, args.out, compare.environment_meta(),
                          fields=["tokens", "qk_norm", "variant", "ms", "cublas_ms_over_ms",
                                  "low", "high", "rounds", "round_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
