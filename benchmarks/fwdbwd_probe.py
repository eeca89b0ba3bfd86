"""What an eager forward+backward timing measures at 128-268 MB (GPU): the host or the kernels,
and whether handing the gradients back (torch.autograd.grad, the floor suite's way since
2026-11-30) times differently from summing them into .grad (backward() with .grad reset
between calls, its way before).

Cases: `apply_rope` on 128 MiB bf16 sbhd (s16384 b1 h32 d128) and `apply_mrope_qk` on the floor's
multi-axis case (Qwen2-VL, b4 s8192, 28/4 heads of 128, bf16), and Liger's M-RoPE on the same
materialised bf16 tables beside `ropelib.hf.apply_multimodal_rotary_pos_emb` where Liger is
installed. For each, in one process, in five alternating rounds:

* `graph`: the forward+backward replayed from a CUDA graph (gradients handed back): the GPU's
  time per call, with no host in it;
* `host`: host µs per eager call, calls back to back (suite.host_us_interleaved);
* `do_bench grad` and `do_bench backward`: triton.testing.do_bench of the eager call, gradients
  handed back, and summed into .grad with .grad reset between calls (grad_to_none).

A call is host-bound where `host` exceeds `graph`; then both do_bench columns time the host.
Prints one line per (case, way) with the median over rounds and their spread, then a table.

`--multi-axis-rounds` instead runs the floor's multi-axis rows (`multi_axis.measure_case`,
every provider) four times in one process: one round, five rounds, five rounds with ropelib's
provider moved last, one round again; and prints ropelib's forward+backward beside the copy's
each time. The floor's five rounds measured 0.49 of a copy where this probe's default cases
measured 0.98 for the same call alone. Answered on the H200 (2026-11-30 13:54,
results/fwdbwd-multi-axis-rounds-nvidia-h200-20261130-1354.log): neither. ropelib's
forward+backward took 0.270 ms in every way, one round or five, first or last; the copy's
forward+backward took 0.133 ms, the time of one copy: the bench timed the copy provider's
clones, whose backward hands the gradient through uncopied. It now times two device copies
(multi_axis.measure_providers, compare.copy_floor).

`--qk-norm` instead takes the floor's QK-RMSNorm + RoPE case apart the same way (bshd b8
s4096, 32 q and 8 k heads of 128, bf16; `ropelib.bench.qk_norm_rope`): ropelib from the cos/sin
table (the floor's provider), from table-free angles, torch.compile of the PyTorch formula, and
ropelib at b2 s16384 (the same bytes in longer sequences). The gradients of q, k and both norm
weights are handed back; `copy pair` is two copies of q and k, so `copy/way` is the floor's
ratio.

    python3 benchmarks/fwdbwd_probe.py > fwdbwd_probe.log
    python3 benchmarks/fwdbwd_probe.py --multi-axis-rounds > fwdbwd_probe_rounds.log
    python3 benchmarks/fwdbwd_probe.py --qk-norm > fwdbwd_probe_qk_norm.log
"""
import sys
import statistics as st

import torch
import triton.testing as tt

import ropelib
import ropelib.hf
from ropelib.bench import compare, multi_axis, suite

ROUNDS = 5


def cases(dev):
    out = {}
    x = torch.randn(16384, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    freqs = ropelib.rope_freqs(16384, 128, device=dev)
    out["apply_rope 128 MiB bf16 sbhd"] = (lambda x: (ropelib.apply_rope(x, freqs),), [x])
    shape, freqs3, positions, q, k, _, _ = multi_axis.case_inputs("mrope", False, dev)
    out["apply_mrope_qk Qwen2-VL b4 s8192"] = (
        lambda q, k: ropelib.apply_mrope_qk(q, k, positions, freqs3, layout="bshd"), [q, k])
    cos, sin = multi_axis.materialised_tables(positions, freqs3)
    section = shape["section"]

    def hf_tables(q, k):
        qo, ko = ropelib.hf.apply_multimodal_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), cos, sin, section)
        return qo.transpose(1, 2), ko.transpose(1, 2)
    out["hf.apply_multimodal_rotary_pos_emb bf16 tables"] = (hf_tables, [q, k])
    liger, _ = multi_axis._liger_mrope()
    if liger is not None:
        def liger_tables(q, k):
            qo, ko = liger.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin, section)
            return qo.transpose(1, 2), ko.transpose(1, 2)
        out["Liger M-RoPE bf16 tables (in place, on copies)"] = (liger_tables, [q, k])
    return out


def qk_norm_cases(dev):
    """{name: (fn, leaves, output grads, copied)}: the floor's QK-norm case, as `cases` does
    for plain RoPE, each call with its own inputs."""
    from ropelib.bench import qk_norm_rope as qn
    out = {}
    compiled = torch.compile(qn.norm_rope_torch, fullgraph=True)
    for B, S, name, fn in ((8, 4096, "ropelib", qn.norm_rope_ropelib),
                           (8, 4096, "ropelib, angles", qn.norm_rope_ropelib_angles),
                           (8, 4096, "torch.compile", compiled),
                           (2, 16384, "ropelib", qn.norm_rope_ropelib)):
        args, grads = qn.inputs(B, S, 32, 8, 128, torch.bfloat16, dev)
        want, _ = qn.reference(args, grads, exact_angles=name.endswith("angles"))
        leaves = qn._leaves(args, True)
        table = args[4:]
        assert qn.max_abs_err(fn(*leaves[:4], *table), want) <= qn.MAX_ABS_ERR, name
        out[f"qk_norm_rope b{B} s{S} 32/8 heads, {name}"] = (
            lambda *a, fn=fn, table=table: fn(*a, *table), leaves[:4], list(grads), args[:2])
    return out


def ways(fn, inputs):
    """{way: step} for one case; Liger works in place: its leaves are copies (as in the bench)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    grads = [torch.randn_like(t) for t in inputs]

    def summed():
        torch.autograd.backward(compare.output_tuple(fn(*leaves)), grads)
    handed = compare.fwdbwd_step(lambda: fn(*leaves), leaves, grads)
    return leaves, summed, handed


def main(qk_norm: bool = False):
    dev = "cuda"
    torch.empty(16 << 30, dtype=torch.uint8, device=dev)      # warm the allocator, as the bench
    results = {}
    if qk_norm:
        probed = {}
        for name, (fn, leaves, grads, copied) in qk_norm_cases(dev).items():
            def summed(fn=fn, leaves=leaves, grads=grads):
                torch.autograd.backward(fn(*leaves), grads)
            probed[name] = (leaves, summed,
                            compare.fwdbwd_step(lambda fn=fn, leaves=leaves: fn(*leaves),
                                                leaves, grads), copied)
    else:
        probed = {name: (*ways(fn, inputs), inputs) for name, (fn, inputs) in cases(dev).items()}
    for name, (leaves, summed, handed, copied) in probed.items():
        copy_once, copy_twice = compare.copy_floor(copied)
        per = {w: [] for w in ("copy pair", "graph", "host", "do_bench grad", "do_bench backward")}
        timers = {"copy pair": lambda: 1e3 * tt.do_bench(copy_twice),
                  "graph": lambda: 1e3 * suite.graph_replay_ms(handed, 20, dev)[0],
                  "host": lambda: suite.host_us_interleaved({"h": (handed, 100)}, 1, dev)["h"],
                  "do_bench grad": lambda: 1e3 * tt.do_bench(handed),
                  "do_bench backward": lambda: 1e3 * tt.do_bench(summed, grad_to_none=leaves)}
        for r in range(ROUNDS):
            for w, timer in timers.items():
                try:
                    v = timer()
                    if isinstance(v, Exception):
                        raise v
                    per[w].append(v)
                except Exception as e:  # noqa: BLE001 -- said, and the way left out
                    print(f"{name} {w}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    torch.cuda.synchronize()
            print(f"{name} round {r}: " + ", ".join(f"{w} {v[-1]:.1f} us" for w, v in per.items()
                                                   if v), flush=True)
        results[name] = {w: (st.median(v), min(v), max(v)) for w, v in per.items() if v}
    print(f"\n{'case':50s} {'way':18s} {'median us':>10s} {'min':>8s} {'max':>8s} {'copy/way':>9s}")
    for name, per in results.items():
        for w, (med, lo, hi) in per.items():
            copy = per.get("copy pair", (float("nan"),))[0]
            print(f"{name:50s} {w:18s} {med:10.1f} {lo:8.1f} {hi:8.1f} {copy / med:9.3f}")


def multi_axis_rounds(dev="cuda"):
    real = multi_axis.measure_providers
    ways = (("1 round", 1, False), ("5 rounds", 5, False), ("5 rounds, ropelib last", 5, True),
            ("1 round again", 1, False))
    if dev == "cuda":
        torch.empty(16 << 30, dtype=torch.uint8, device=dev)  # warm the allocator, as the bench
    try:
        for label, rounds, last in ways:
            compare.FWDBWD_ROUNDS = rounds

            def reordered(providers, *args, last=last, **kwargs):
                if last:
                    providers = ([p for p in providers if p[0] != "ropelib"]
                                 + [p for p in providers if p[0] == "ropelib"])
                return real(providers, *args, **kwargs)
            multi_axis.measure_providers = reordered
            rows = multi_axis.measure_case("mrope", tiny=dev != "cuda", timed=True, device=dev)
            got = {(r["provider"], r["pass"]): r for r in rows}
            for prov in ("ropelib", "copy", "hf_compile"):
                for pass_ in multi_axis.PASSES:
                    r = got.get((prov, pass_), {})
                    print(f"{label:24s} {prov:11s} {pass_:8s} {r.get('ms', float('nan')):8.4f} ms "
                          f"(p20 {r.get('p20', float('nan')):.4f}, p80 "
                          f"{r.get('p80', float('nan')):.4f}), of a copy "
                          f"{r.get('fraction_of_copy', float('nan')):.3f}", flush=True)
    finally:
        multi_axis.measure_providers = real


if __name__ == "__main__":
    if "--multi-axis-rounds" in sys.argv[1:]:
        multi_axis_rounds("cuda" if torch.cuda.is_available() else "cpu")
    else:
        main(qk_norm="--qk-norm" in sys.argv[1:])
