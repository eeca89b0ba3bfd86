"""Why does the finished kernel trail torch.compile of Hugging Face's formula on large tensors?

    python benchmarks/compile_gap.py            # GPU; writes compile_gap.log/.json (+ PTX) to $OUT

For a few large bf16/fp32 cases: the device copy, torch.compile of `x * cos + rotate_half(x) *
sin` (cos/sin tables in the input's dtype), ropelib.apply_rope, and the finished kernel launched
directly with its default tile, with a cos/sin table instead of angles, and over a sweep of tiles
(BLOCK_S, BLOCK_H, B_CHUNK, warps). Then Inductor's generated kernel (its config, registers,
spills, PTX load/store vector widths, eviction hints) beside ropelib's compiled kernel's.
Ratios are copy ms / provider ms in the same run (1.0 = the copy's speed).
"""
import os, sys, json, re, itertools
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, triton, triton.testing
import ropelib
from ropelib.kernels import launch as L
from ropelib.bench.compare import hf_rotate
OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
log = open(os.path.join(OUT, "compile_gap.log"), "w")
def p(*a):
    s = " ".join(str(x) for x in a); print(s); log.write(s + "\n"); log.flush()
def ms(fn, rep=120):
    return triton.testing.do_bench(fn, warmup=30, rep=rep)
name = torch.cuda.get_device_name(); sm = torch.cuda.get_device_properties(0).multi_processor_count
p(name, sm, "SMs", "torch", torch.__version__, "triton", triton.__version__)
CASES = {  # name: (dtype, layout, S, B, H, D)
 "A bf16 sbhd 256MiB": (torch.bfloat16, "sbhd", 4096, 8, 32, 128),
 "B bf16 sbhd s16k b1": (torch.bfloat16, "sbhd", 16384, 1, 32, 128),
 "C bf16 sbhd 1GiB": (torch.bfloat16, "sbhd", 16384, 8, 32, 128),
 "D fp32 sbhd 256MiB": (torch.float32, "sbhd", 2048, 8, 32, 128),
}
only = os.environ.get("ONLY")
results = {}
leaders = []
for cname, (dt, layout, S, B, H, D) in CASES.items():
    if only and not cname.startswith(only): continue
    shape = (S, B, H, D) if layout == "sbhd" else (B, S, H, D)
    x = torch.randn(shape, device="cuda", dtype=dt)
    y = torch.empty_like(x)
    freqs = ropelib.rope_freqs(S, D, device="cuda")     # [S,1,1,D] fp32 angles
    f2 = freqs[:, 0, 0]
    cos_t, sin_t = torch.cos(f2).to(dt), torch.sin(f2).to(dt)
    tshape = (S, 1, 1, D) if layout == "sbhd" else (1, S, 1, D)
    def hf(x, c, s): return hf_rotate(x, c.view(tshape), s.view(tshape), False)
    comp = torch.compile(hf)
    ref = comp(x, cos_t, sin_t)
    r = {}
    r["copy"] = ms(lambda: y.copy_(x))
    r["compile"] = ms(lambda: comp(x, cos_t, sin_t))
    r["apply_rope"] = ms(lambda: ropelib.apply_rope(x, freqs, layout=layout))
    got = ropelib.apply_rope(x, freqs, layout=layout)
    p(cname, "max|apply_rope - compile|", (got.float() - ref.float()).abs().max().item())
    view = L.View.of(x if layout == "sbhd" else x.transpose(0, 1))
    oview = L.View.of(y if layout == "sbhd" else y.transpose(0, 1))
    default = L._tiles(x, S, B, (H, 0), D, D, False)
    def timed(table, tiles):
        planned, ptrs = L.plan(view, oview, table, L.Positions(), R=D, interleaved=False,
                               backward=False, layout=layout, tiles=tiles)
        return ms(lambda: L.run(planned, ptrs))
    r["kernel default %s" % (default,)] = timed(L.Table(f2, None), default)
    r["kernel cos/sin table %s" % (default,)] = timed(L.Table(cos_t, sin_t), default)
    cands = []
    for bs, bh, ch, w in itertools.product((1, 2, 4, 8), (8, 16, 32), sorted({1, B}), (4, 8)):
        if ch > B: continue
        if not 2048 <= bs * bh * D <= 16384: continue
        cands.append((bs, bh, ch, w))
    cands = list(dict.fromkeys([default] + cands))
    if B == 8 and leaders:      # the 1 GiB and fp32 cases: the leaders of the first case only
        cands = list(dict.fromkeys([default] + leaders))
    sweep = []
    for t in cands:
        try:
            sweep.append((timed(L.Table(f2, None), t), t))
        except Exception as e:
            p("fail", t, type(e).__name__, str(e)[:100])
    sweep.sort()
    if B == 8 and not leaders:
        leaders = [t for _, t in sweep[:4]]
    for t_ms, t in sweep[:6]:
        r["angles %s" % (t,)] = t_ms
    # the best sweep tiles with a table too
    for t_ms, t in sweep[:2]:
        r["cos/sin table %s" % (t,)] = timed(L.Table(cos_t, sin_t), t)
    base = r["copy"]
    p(f"== {cname}")
    for k, v in r.items():
        p(f"  {k:48s} {v:8.4f} ms  ratio {base / v:.3f}")
    results[cname] = {k: base / v for k, v in r.items()}
    x = y = None
    torch.cuda.empty_cache()
json.dump(results, open(os.path.join(OUT, "compile_gap.json"), "w"), indent=1)
# Inductor's kernel and ropelib's compiled kernel: config, registers, PTX vector widths
try:
    from torch._inductor.utils import run_and_get_code
    x = torch.randn(4096, 8, 32, 128, device="cuda", dtype=torch.bfloat16)
    f2 = ropelib.rope_freqs(4096, 128, device="cuda")[:, 0, 0]
    c, s = torch.cos(f2).bfloat16(), torch.sin(f2).bfloat16()
    torch._dynamo.reset()
    fn = torch.compile(lambda x, c, s: hf_rotate(x, c.view(4096, 1, 1, 128), s.view(4096, 1, 1, 128), False))
    _, codes = run_and_get_code(fn, x, c, s)
    open(os.path.join(OUT, "inductor_code.py"), "w").write("\n\n".join(codes))
    from torch._inductor.codecache import PyCodeCache
    mods = getattr(PyCodeCache, "modules", None) or list(getattr(PyCodeCache, "cache", {}).values())
    for m in (mods if isinstance(mods, list) else list(mods)):
        for k, v in vars(m).items():
            if k.startswith("triton_") and hasattr(v, "launchers"):
                for ln in v.launchers:
                    b = getattr(ln, "bin", None)
                    p("inductor", k, "config", getattr(ln, "config", None), "n_regs", getattr(ln, "n_regs", None), "n_spills", getattr(ln, "n_spills", None))
                    if b is not None and "ptx" in b.asm:
                        ptx = b.asm["ptx"]; open(os.path.join(OUT, f"{k}.ptx"), "w").write(ptx)
                        p("  ptx", {op: len(re.findall(op, ptx)) for op in (r"ld\.global[.\w]*v4", r"ld\.global[.\w]*v2", r"ld\.global", r"st\.global[.\w]*v4", r"st\.global[.\w]*v2", r"st\.global", "evict")})
except Exception as e:
    p("inductor dump failed", type(e).__name__, e)
from ropelib.kernels import fused
for kern in (fused._rope_kernel,):
    for dev, caches in getattr(kern, "device_caches", {}).items():
        for key, ck in caches[0].items():
            md = ck.metadata
            ptx = ck.asm.get("ptx", "")
            p("ropelib kernel", "warps", md.num_warps, "n_regs", ck.n_regs, "spills", ck.n_spills,
              {op: len(re.findall(op, ptx)) for op in (r"ld\.global[.\w]*v4", r"ld\.global[.\w]*v2", r"ld\.global", r"st\.global[.\w]*v4", r"st\.global[.\w]*v2", r"st\.global", "evict", r"sin\.approx", r"cos\.approx")})
log.close()
