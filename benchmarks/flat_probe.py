"""Is it the kernel's shape or the source of cos/sin that keeps the finished kernel below
torch.compile on large tensors? A flat, Inductor-shaped Triton RoPE (a 1-D grid of XBLOCK
elements, each thread loading its 8 contiguous elements and their partner's, no loop) with four
sources of cos/sin, beside the copy, torch.compile of Hugging Face's formula and ropelib.apply_rope:

    mode0  cos/sin in the input's dtype, [S, D] (what Hugging Face passes; not TE's bits)
    mode1  fp32 cos/sin [S, D/2], column j = d or d - D/2 via tl.where (breaks vectorisation)
    mode3  fp32 cos/sin [S, D/2], column j = i % (D/2) (16-byte loads; TE's bits)
    mode4  fp32 cos/sin [S, D] (both halves; TE's bits)
    (mode2, libdevice sin/cos per element, ran at 0.3-0.44 of a copy and is left out)

"pre-pass + flat mode3" includes a kernel that computes the fp32 table from the angles first,
as a call that receives only angles must. sbhd, contiguous, rotate-half.

    python benchmarks/flat_probe.py        # GPU; writes flat_probe-<gpu>.log to $OUT (default /tmp/out)
"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, triton, triton.language as tl, triton.testing
from triton.language.extra import libdevice
import ropelib
from ropelib.bench.compare import gpu_slug, hf_rotate
OUT = os.environ.get("OUT", "/tmp/out"); os.makedirs(OUT, exist_ok=True)
gpu = gpu_slug()
log = open(os.path.join(OUT, f"flat_probe-{gpu}.log"), "w")
def p(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()
def ms(fn, rep=100): return triton.testing.do_bench(fn, warmup=25, rep=rep)

@triton.jit
def flat(x_ptr, y_ptr, c_ptr, s_ptr, N, ROW: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
         MODE: tl.constexpr, XBLOCK: tl.constexpr):
    # x [N] elements, token of element i = i // ROW (sbhd: ROW = B*H*D); MODE 0: cos/sin in x's dtype [S, D];
    # 1: fp32 cos/sin [S, HALF]; 2: fp32 angles [S, HALF] -> libdevice cos/sin per element
    i = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)
    mask = i < N
    d = i % D
    tok = i // ROW
    first = d < HALF
    xp = tl.load(x_ptr + i + tl.where(first, HALF, -HALF), mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + i, mask=mask, other=0.0).to(tl.float32)
    if MODE == 0:
        c = tl.load(c_ptr + tok * D + d, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        s = tl.load(s_ptr + tok * D + d, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    elif MODE == 1:
        j = tl.where(first, d, d - HALF)
        c = tl.load(c_ptr + tok * HALF + j, mask=mask, other=0.0, eviction_policy="evict_last")
        s = tl.load(s_ptr + tok * HALF + j, mask=mask, other=0.0, eviction_policy="evict_last")
    elif MODE == 3:
        j = i % HALF
        c = tl.load(c_ptr + tok * HALF + j, mask=mask, other=0.0, eviction_policy="evict_last")
        s = tl.load(s_ptr + tok * HALF + j, mask=mask, other=0.0, eviction_policy="evict_last")
    elif MODE == 4:
        c = tl.load(c_ptr + tok * D + d, mask=mask, other=0.0, eviction_policy="evict_last")
        s = tl.load(s_ptr + tok * D + d, mask=mask, other=0.0, eviction_policy="evict_last")
    else:
        j = tl.where(first, d, d - HALF)
        a = tl.load(c_ptr + tok * HALF + j, mask=mask, other=0.0, eviction_policy="evict_last")
        c = libdevice.cos(a); s = libdevice.sin(a)
    y = tl.fma(x, c, tl.where(first, -(xp * s), xp * s))
    tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=mask)

@triton.jit
def table(f_ptr, c_ptr, s_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(f_ptr + i, mask=i < N)
    tl.store(c_ptr + i, libdevice.cos(a), mask=i < N); tl.store(s_ptr + i, libdevice.sin(a), mask=i < N)

p(torch.cuda.get_device_name())
for cname, dt, S, B, H, D in [("A bf16 s4k b8", torch.bfloat16, 4096, 8, 32, 128), ("C bf16 s16k b8", torch.bfloat16, 16384, 8, 32, 128),
                              ("B bf16 s16k b1", torch.bfloat16, 16384, 1, 32, 128), ("E bf16 s1k b32", torch.bfloat16, 1024, 32, 32, 128)]:
    x = torch.randn(S, B, H, D, device="cuda", dtype=dt); y = torch.empty_like(x)
    freqs = ropelib.rope_freqs(S, D, device="cuda"); f2 = freqs[:, 0, 0]; HALF = D // 2
    cos_t, sin_t = torch.cos(f2).to(dt), torch.sin(f2).to(dt)
    fh = f2[:, :HALF].contiguous()
    c32 = torch.empty_like(fh); s32 = torch.empty_like(fh)
    comp = torch.compile(lambda x, c, s: hf_rotate(x, c.view(S, 1, 1, D), s.view(S, 1, 1, D), False))
    ref = ropelib.apply_rope(x, freqs)
    N = x.numel()
    r = {"copy": ms(lambda: y.copy_(x)), "compile": ms(lambda: comp(x, cos_t, sin_t)),
         "apply_rope": ms(lambda: ropelib.apply_rope(x, freqs))}
    mk_tab = lambda: table[(triton.cdiv(fh.numel(), 1024),)](fh, c32, s32, fh.numel(), BLOCK=1024)
    r["table pre-pass only"] = ms(mk_tab)
    for xb, w in ((1024, 4), (2048, 8)):
        for mode, cc, ss in ((0, cos_t, sin_t), (1, c32, s32), (3, c32, s32), (4, torch.cos(f2), torch.sin(f2))):
            run = lambda: flat[(triton.cdiv(N, xb),)](x, y, cc, ss if ss is not None else cc, N, ROW=B * H * D, D=D, HALF=HALF, MODE=mode, XBLOCK=xb, num_warps=w)
            mk_tab(); run()
            err = (y.float() - ref.float()).abs().max().item()
            r[f"flat mode{mode} X{xb} w{w} (err {err:.3g})"] = ms(run)
        r[f"pre-pass + flat mode3 X{xb} w{w}"] = ms(lambda: (mk_tab(), flat[(triton.cdiv(N, xb),)](x, y, c32, s32, N, ROW=B * H * D, D=D, HALF=HALF, MODE=3, XBLOCK=xb, num_warps=w)))
    base = r["copy"]
    p("==", cname)
    for k, v in r.items(): p(f"  {k:46s} {v:8.4f} ms ratio {base / v:.3f}")
    x = y = None; torch.cuda.empty_cache()
for dev, caches in getattr(flat, "device_caches", {}).items():
    for key, ck in caches[0].items():
        p("regs", ck.metadata.num_warps, ck.n_regs, ck.n_spills, str(key)[-90:])
