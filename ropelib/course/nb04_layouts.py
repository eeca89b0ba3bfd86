"""Notebook 04, appendix A.1: the ablation's variants and the finished kernel compiled for an
H200 (sm_90) by this machine's Triton, no GPU needed, in a second Python without
TRITON_INTERPRET (under the interpreter @triton.jit gives interpreted functions). The notebook
reads each kernel's Triton GPU IR (TTGIR) with `replication`: how many threads of a program
hold, and so compute, each cos/sin value and each element of x."""
import math
import re

from ropelib.course.offline_compile import in_compiling_python

CHILD = r'''
import json, sys, torch, triton
from ropelib.course.kernels import ablation
from ropelib.course.offline_compile import compile_for_cuda
from ropelib.kernels import launch, tiles as T
S, B, H, D, N_SM = (int(a) for a in sys.argv[1:6])
GPU, names = sys.argv[6], sys.argv[7:]   # the GPU's name picks its tile knobs, as on the GPU
x = torch.empty(S, B, H, D, dtype=torch.bfloat16)   # only shapes, strides, dtypes matter
y, f = torch.empty_like(x), torch.empty(S, D)
out = {}
for name, _, _, o in ablation.variants(H):
    if name not in names:
        continue
    bpp, bh = o.get("batch_per_program") or B, triton.next_power_of_2(D // 2)
    warps = o.get("num_warps") or ablation.default_warps(o.get("heads_per_program", 1) * bh)
    args = dict(x_ptr=x, y_ptr=y, freqs_ptr=f, cos_ptr=f, sin_ptr=f, B=B, H=H,
                BATCH_PER_PROGRAM=bpp, stride_xs=x.stride(0), stride_xb=x.stride(1),
                stride_xh=x.stride(2), stride_ys=y.stride(0), stride_yb=y.stride(1),
                stride_yh=y.stride(2), HALF=D // 2, BLOCK_HALF=bh,
                BLOCK_H=o.get("heads_per_program", 1), UNROLL_B=bpp if o.get("unroll") else 0,
                TABLE=bool(o.get("table")), BF16_RTNE=False)
    k = compile_for_cuda(ablation._rope_ablation_kernel, args, num_warps=warps)
    out[name] = dict(num_warps=warps, ttgir=k.asm["ttgir"])
if "ropelib_finished" in names:   # the finished kernel, with the tile it picks on N_SM SMs of GPU
    tiles = launch.pick_tiles(S, B, (H, 0), D, D, x.element_size(), N_SM, **T.tile_knobs(GPU))
    lau, ptrs = launch.plan(launch.View.of(x), launch.View.of(y), launch.Table(f, None),
                            launch.Positions(), R=D, interleaved=False, backward=False,
                            layout="sbhd", tiles=tiles)
    k = compile_for_cuda(lau.launcher.kernel, dict(zip(lau.launcher.pointer_names, ptrs),
                                                   **lau.args), num_warps=lau.num_warps)
    out["ropelib_finished"] = dict(num_warps=lau.num_warps, ttgir=k.asm["ttgir"],
                                   grid=list(lau.grid))
print(json.dumps(out))
'''


def compiled_ttgir(S: int, B: int, H: int, D: int, n_sm: int, names, timeout: float = 600.0,
                   gpu: str = "NVIDIA H100 80GB HBM3"):
    """{name: dict(num_warps=..., ttgir=...)} for the named ablation variants at bf16 sbhd
    [S, B, H, D], and for "ropelib_finished" (also its grid) with the tile it picks on n_sm SMs
    of `gpu` (its name, as torch.cuda.get_device_name gives it: kernels/tiles.py's TILES_BY_GPU).
    Raises RuntimeError saying why, with the child's stderr."""
    return in_compiling_python(CHILD, *map(str, (S, B, H, D, n_sm)), gpu, *names,
                               what="compiling for sm_90", timeout=timeout, reuse=True)


# a tensor's type in the IR: its shape, its element type, its layout
TYPE = r"tensor<([\dx]+)x(f32|!tt\.ptr<bf16>), (#ttg\.slice<\{[^}]*\}>|#\w+)>"


def copies(shape, layout, defs):
    """How many threads of a program hold (and compute) each value of a tensor in `layout`."""
    sliced = re.match(r"#ttg\.slice<\{dim = (\d+), parent = (#\w+)\}>", layout)
    if sliced:   # a slice of a parent layout: the parent's, with the sliced axis of size 1
        shape, layout = shape[:int(sliced[1])] + [1] + shape[int(sliced[1]):], sliced[2]
    L = {k: [int(v) for v in vals.split(",")]
         for k, vals in re.findall(r"(\w+) = \[([\d, ]*)\]", defs[layout])}
    held = math.prod(spt * max(1, n // (spt * tpw * wpc)) for n, spt, tpw, wpc in zip(
        shape, L["sizePerThread"], L["threadsPerWarp"], L["warpsPerCTA"]))
    return 32 * math.prod(L["warpsPerCTA"]) * held // math.prod(shape)


def replication(ir):
    """(copies of each cos/sin value, copies of each element of a loaded x tile, x layout)."""
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.blocked<\{[^}]*\}>)", ir, re.M))
    trig, xs = set(), set()
    for line in ir.splitlines():
        if "math.sin" in line or "math.cos" in line or "__nv_sinf" in line \
                or "__nv_cosf" in line:
            shape, _, layout = re.findall(TYPE, line)[-1]
            trig.add(copies([int(n) for n in shape.split("x")], layout, defs))
        elif "tt.load" in line and "!tt.ptr<bf16>" in line:
            shape, _, layout = re.findall(TYPE, line)[-1]
            xs.add((copies([int(n) for n in shape.split("x")], layout, defs), defs[layout]))
    if len(trig) != 1 or len(xs) != 1:
        raise ValueError(f"expected one cos/sin layout and one x layout, found {trig} and {xs}")
    (x_copies, x_layout), = xs
    return trig.pop(), x_copies, x_layout
