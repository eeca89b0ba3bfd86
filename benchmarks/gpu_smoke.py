"""A quick GPU check of the operator layer: eager vs reference, Inductor fullgraph (fwd+bwd,
dynamic seq), reduce-overhead, every position mode. Prints one line per check."""
import traceback

import torch

import ropelib
from ropelib.reference import rope_reference

dev = "cuda"
ok = True


def check(name, fn):
    global ok
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except Exception:  # noqa: BLE001
        ok = False
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)


def close(a, b, tol=2e-2):
    torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def eager_modes():
    torch.manual_seed(0)
    s, b, h, d = 300, 3, 5, 96
    f = ropelib.rope_freqs(2 * s + 50, d, rotary_percent=0.5)
    f = f.to(dev)
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        x = torch.randn(s, b, h, d, device=dev, dtype=dtype)
        sp = torch.tensor([0, 17, 40], device=dev)
        close(ropelib.apply_rope(x, f, start_positions=sp), rope_reference(x, f, start_positions=sp))
        close(ropelib.apply_rope(x, f, cp_size=2, cp_rank=1), rope_reference(x, f, cp_size=2, cp_rank=1))
        pid = torch.randint(0, 2 * s, (b, s), device=dev)
        close(ropelib.apply_rope(x.transpose(0, 1), f, layout="bshd", position_ids=pid),
              rope_reference(x.transpose(0, 1), f, layout="bshd", position_ids=pid))
        cu = torch.tensor([0, 7, 7, 100, 300], device=dev, dtype=torch.int32)
        t = x[:, 0]
        close(ropelib.apply_rope(t, f, layout="thd", cu_seqlens=cu, start_positions=torch.tensor([1, 2, 3, 4], device=dev)),
              rope_reference(t, f, layout="thd", cu_seqlens=cu, start_positions=torch.tensor([1, 2, 3, 4], device=dev)))
        ff = ropelib.rope_freqs(s, d, interleaved=True).to(dev)
        close(ropelib.apply_rope(x, ff, interleaved=True), rope_reference(x, ff, interleaved=True))
    # out of range -> NaN rows, nothing else touched
    x = torch.randn(4, 2, 2, 16, device=dev)
    y = ropelib.apply_rope(x, ropelib.rope_freqs(8, 16).to(dev), start_positions=torch.tensor([0, 6], device=dev))
    assert torch.isnan(y[:, 1]).any() and not torch.isnan(y[:, 0]).any()


def compiled():
    torch.manual_seed(1)
    d = 128
    f = ropelib.rope_freqs(4096, d).to(dev)

    def fn(q, k, sp):
        return ropelib.apply_rope_qk(q, k, f, start_positions=sp, layout="bshd")

    c = torch.compile(fn, fullgraph=True, dynamic=None)
    for s in (64, 96, 128, 200):
        q = torch.randn(2, s, 8, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(2, s, 2, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        sp = torch.tensor([3, 9], device=dev)
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        o1 = c(q, k, sp)
        torch.autograd.backward(o1, (gq, gk))
        g1 = (q.grad.clone(), k.grad.clone())
        q.grad = k.grad = None
        o2 = fn(q, k, sp)
        torch.autograd.backward(o2, (gq, gk))
        assert torch.equal(o1[0], o2[0]) and torch.equal(o1[1], o2[1])
        assert torch.equal(g1[0], q.grad) and torch.equal(g1[1], k.grad)
    print("  recompiles:", torch._dynamo.utils.counters["stats"]["unique_graphs"], flush=True)


def reduce_overhead():
    torch.manual_seed(2)
    f = ropelib.rope_freqs(4096, 128).to(dev)

    @torch.no_grad()
    def step(x, sp):
        return ropelib.apply_rope(x, f, start_positions=sp)

    c = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(1, 64, 32, 128, device=dev, dtype=torch.bfloat16)
    for i in range(5):
        sp = torch.randint(0, 4000, (64,), device=dev)
        assert torch.equal(c(x, sp), step(x, sp))


def inference_mode_compiled():
    f = ropelib.rope_freqs(4096, 128).to(dev)
    m = torch.compile(lambda x: ropelib.apply_rope(x, f, inplace=True), fullgraph=True)
    with torch.inference_mode():
        x = torch.randn(16, 2, 8, 128, device=dev)
        ref = rope_reference(x, f)
        m(x)
        close(x, ref, 1e-5)


check("eager position modes", eager_modes)
check("inductor fullgraph fwd+bwd, changing seq", compiled)
check("reduce-overhead (CUDA graphs) decode", reduce_overhead)
check("inference_mode in place compiled", inference_mode_compiled)
print("ALL PASS" if ok else "SOME FAILED")
