"""ropelib.course.counts: the kernels a step launches (notebook 11) and the programs per SM a
compiled kernel's resources allow (notebook 12)."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ropelib
from ropelib import kv_cache
from ropelib.bench import compare
from ropelib.course import counts
from ropelib.course.counts import SM90, count_kernels, gpu_kernels, programs_per_sm, work_ops

ROOT = Path(__file__).resolve().parents[1]
TILES_CSV = ROOT / "figures" / "12-qkv-tiles-sm90.csv"
# the interpreter's launches are counted on the host; a GPU's are CUDA kernels (notebook 11)
INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="counts the launches of Triton's interpreter")


# --- kernels per step: the event filters, on stand-in profiler events -----------------------

def _event(name, parent=None, device="CPU"):
    e = SimpleNamespace(name=name, cpu_parent=parent, cpu_children=[],
                        device_type=SimpleNamespace(name=device))
    if parent is not None:
        parent.cpu_children.append(e)
    return e


def test_work_ops_keeps_top_level_operators_that_do_work():
    add = _event("aten::add")
    inner = _event("aten::empty", parent=add)          # below an operator: not top level
    view = _event("aten::view")
    alloc = _event("aten::empty_like")
    to_nothing = _event("aten::to")                     # returned its input: no copy below
    to_copy = _event("aten::to")
    _event("aten::_to_copy", parent=to_copy)
    deep_copy = _event("aten::contiguous")
    clone = _event("aten::clone", parent=deep_copy)
    _event("aten::copy_", parent=clone)
    annotation = _event("triton::_rope_kernel")         # a range, not an operator
    put = _event("aten::index_put_")
    events = [add, inner, view, alloc, to_nothing, to_copy, deep_copy, clone, annotation, put]
    assert work_ops(events) == ["aten::add", "aten::to", "aten::contiguous", "aten::index_put_"]


def test_gpu_kernels_drops_memory_copies_and_sets():
    events = [_event("aten::add"), _event("void at::native::add_kernel", device="CUDA"),
              _event("Memcpy HtoD (Pageable -> Device)", device="CUDA"),
              _event("Memset (Device)", device="CUDA"), _event("_rope_kv_cache_kernel",
                                                                device="CUDA")]
    assert gpu_kernels(events) == ["void at::native::add_kernel", "_rope_kv_cache_kernel"]


# --- kernels per step: the decoding step of notebook 11, in the interpreter -----------------

def _decode_step(paged: bool, fp8: bool):
    g = torch.Generator().manual_seed(0)
    B, HQ, HK, D, L, BS = 2, 4, 2, 16, 8, 4
    # bf16 inputs, as the benchmark's step: an fp8 cache's write converts them to fp32 first
    q, k, v = (torch.randn(B, 1, h, D, generator=g).to(torch.bfloat16) for h in (HQ, HK, HK))
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    freqs = ropelib.rope_freqs(L, D)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    shape = (B * L // BS, BS, HK, D) if paged else (B, L, HK, D)
    caches = [torch.zeros(shape, dtype=dtype) for _ in range(2)]
    extra = dict(block_table=torch.arange(B * L // BS, dtype=torch.int32).view(B, L // BS)) \
        if paged else {}
    if fp8:
        extra.update(k_scale=torch.ones(1), v_scale=torch.ones(1))

    def fused():
        return ropelib.rope_kv_cache(q, k, v, *caches, seqlens, freqs, **extra)

    def unfused():
        q_out, k_out = ropelib.apply_rope_qk(q, k, freqs, layout="bshd", start_positions=seqlens)
        kv_cache.write_kv_cache(k_out, v, *caches, seqlens, **extra)
        return q_out
    return fused, unfused


@INTERPRETER
@pytest.mark.parametrize("paged, fp8, n_ops", [(False, False, 6), (True, False, 9),
                                               (False, True, 14), (True, True, 17)])
def test_decode_step_counts(paged, fp8, n_ops):
    fused, unfused = _decode_step(paged, fp8)
    with ropelib.set_index_checks("off"):
        f, u = count_kernels(fused), count_kernels(unfused)
    kernel = "_rope_kv_paged_kernel" if paged else "_rope_kv_cache_kernel"
    assert (f.triton, f.aten, f.cuda, f.host_launches) == ([kernel], [], None, 1)
    assert len(u.triton) == 1 and u.triton[0].startswith("_rope")
    assert len(u.aten) == n_ops and u.aten.count("aten::index_put_") == 2, u.aten
    assert u.host_launches == n_ops + 1


@INTERPRETER
def test_the_interpreters_own_operators_stay_below_the_launch():
    # the interpreter copies every tensor argument in and out (aten::copy_ ...): without the
    # launch's range those would count as the step's operators
    fused, _ = _decode_step(False, False)
    with ropelib.set_index_checks("off"):
        assert count_kernels(fused).aten == []


@INTERPRETER
def test_host_index_checks_add_operators_on_the_cpu():
    # what notebook 11 switches off: on the CPU the checks read cache_seqlens (min, max, ...)
    fused, _ = _decode_step(False, False)
    with ropelib.set_index_checks("on"):
        checked = count_kernels(fused)
    assert checked.triton == ["_rope_kv_cache_kernel"] and checked.aten


def test_interpreted_launches_restores_the_launcher():
    from triton.runtime.interpreter import InterpretedFunction
    run = InterpretedFunction.run
    with counts.interpreted_launches() as launched:
        assert InterpretedFunction.run is not run
    assert InterpretedFunction.run is run and launched == []


# --- programs per SM ------------------------------------------------------------------------

def test_sm90_limits():
    assert (SM90.registers, SM90.shared, SM90.threads, SM90.blocks) == (65536, 233472, 2048, 32)


@pytest.mark.parametrize("n_regs, warps, shared, programs, limited_by", [
    # 254 registers -> 256 per thread (units of 256 per warp): 8192 per warp, 8 warps per SM
    (254, 8, 98304, 1, ["registers"]),
    (254, 4, 98304, 2, ["registers", "shared memory"]),
    # 114 -> 120 per thread: 3840 per warp, 17 warps: 2 programs of 8; shared 2 x (96 + 1) KiB
    (114, 8, 98304, 2, ["registers", "shared memory"]),
    # shared memory alone: 228 KiB / (72 + 1) KiB = 3
    (64, 8, 73728, 3, ["shared memory"]),
    # threads: 2048 / 128 = 16 programs of 4 warps; registers 65536 / (32 * 32) / 4 = 16
    (32, 4, 0, 16, ["registers", "threads"]),
    # the 32-program limit: 1 warp, 16 registers, no shared memory
    (16, 1, 0, 32, ["programs"]),
    # more shared memory than a program may have (227 KiB): it does not fit at all
    (128, 8, 232449, 0, ["shared memory"]),
    (128, 8, 232448, 1, ["shared memory"]),
])
def test_programs_per_sm(n_regs, warps, shared, programs, limited_by):
    occ = programs_per_sm(n_regs, warps, shared)
    assert occ.programs == programs and occ.limited_by == limited_by, occ
    assert occ.warps == programs * warps and occ.fraction == programs * warps / 64


def test_register_rounding_is_per_warp_in_units_of_256_per_sub_partition():
    # 248 and 249..256 registers: 7936 and 8192 per warp -> 2 warps in each sub-partition's
    # 16,384 registers, 8 in all; 257 is impossible on sm_90 (255 at most) but the arithmetic
    # goes on: 8448 per warp -> 1 per sub-partition, 4 warps (not 65536 // 8448 = 7)
    assert programs_per_sm(248, 1, 0).limits["registers"] == 8
    assert programs_per_sm(249, 1, 0).limits["registers"] == 8
    assert programs_per_sm(257, 1, 0).limits["registers"] == 4
    # 40 registers: 1280 per warp -> 12 per sub-partition, 48 warps (65536 // 1280 = 51)
    assert programs_per_sm(40, 1, 0).limits["registers"] == 48


def test_programs_per_sm_refuses_nonsense():
    for args in ((-1, 4, 0), (32, 0, 0), (32, 4, 1.5)):
        with pytest.raises(ValueError):
            programs_per_sm(*args)


# --- the committed sm_90 compile of the QKV projection's kernels (notebook 12) --------------

def _tiles():
    return compare.read_meta(TILES_CSV), compare.read_csv(TILES_CSV)


def test_committed_tile_resources_follow_from_their_columns():
    meta, rows = _tiles()
    assert meta["triton"] and "sm_90" in meta["target"] and rows
    for r in rows:
        occ = programs_per_sm(r["n_regs"], r["num_warps"], r["shared"])
        assert (occ.programs, "+".join(occ.limited_by)) == (r["programs_per_sm"],
                                                             r["limited_by"]), r
        assert 0 < r["n_regs"] <= 255 and r["stack"] >= 0


def _kernel_tiles(tiles: dict) -> set:
    """{(kernel, *tile)} of {kernel: [tile]}."""
    return {(kernel, *t) for kernel, ts in tiles.items() for t in ts}


def test_committed_tiles_are_the_sweeps_and_the_shipped():
    # what main() compiles: every tile of the GPU sweep (benchmarks/qkv_tiles.py's CANDIDATES)
    # and every tile ropelib ships for its problem (qkv_gemm's tile table, as the planner reads
    # it: counts.shipped_tiles), each once, bare and rotating, marked swept and shipped
    _, rows = _tiles()
    keys = ("kernel", *counts.TILE_KEYS)
    swept = _kernel_tiles(counts.sweep_tiles(ROOT / "benchmarks" / "qkv_tiles.py"))
    shipped = _kernel_tiles(counts.shipped_tiles())
    found = [(*(r[k] for k in keys), r["rotate"]) for r in rows]
    assert len(found) == len(set(found))
    assert set(found) == {(*key, rotate) for key in swept | shipped for rotate in (False, True)}
    for r in rows:
        key = tuple(r[k] for k in keys)
        assert (r["swept"], r["shipped"]) == (key in swept, key in shipped), r
    # the backward's shipped tiles the sweep lacks: dW's, and dX's with QK-norm
    assert {key[0] for key in shipped - swept} >= {"dw", "dx_norm"}


def test_shipped_tiles_are_the_librarys():
    # for the sweep's bf16 heads of 128 the planner reads qkv_gemm.GPU_TILES (not the long rows')
    from ropelib.kernels import qkv_gemm
    assert counts.shipped_tiles() == {kernel: [tuple(t[k] for k in counts.TILE_KEYS)]
                                      for kernel, t in qkv_gemm.GPU_TILES.items()}


def test_committed_tile_resources_match_the_gpu_sweeps():
    # the swept tiles; where a GPU ran one, its registers and spills (n_spills: 4-byte words) for
    # dW and the bare dX as the committed compile has them, the kernels the sweeps ran (the
    # forward has changed since, and then the rotating dX: cos and sin read from a pre-pass's
    # rows, so ropelib's own registers and spills differ); where it refused one for shared
    # memory, more than a program may have
    meta, rows = _tiles()
    keys = ("kernel", "BLOCK_M", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "rotate")
    compiled = {tuple(r[k] for k in keys): r for r in rows if r["swept"]}
    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        path = ROOT / "benchmarks" / "results" / f"qkv_tiles-{gpu}.csv"
        assert compare.read_meta(path)["triton"] == meta["triton"], gpu
        swept = {tuple(r[k] for k in keys): r for r in compare.read_csv(path)}
        assert set(swept) == set(compiled), gpu
        for key, r in swept.items():
            c = compiled[key]
            if r["n_regs"] is None:
                assert "shared memory" in r["reason"] and c["programs_per_sm"] == 0, (gpu, key)
            elif key[0] == "dw" or (key[0] == "dx" and not key[-1]):
                assert (c["n_regs"], c["stack"]) == (r["n_regs"], 4 * r["n_spills"]), (gpu, key)


def test_committed_tile_resources_match_the_later_gpu_runs():
    # ropelib's dX and dW as they are now (dX reading cos and sin rows; dW with its own
    # out-of-table select), timed alone on the H200 after the sweeps at the tiles then chosen
    # (qkv_tiles.py with chosen candidates; -qk-norm: with QK-norm weights, the table's
    # "<kernel>_norm"): where the committed compile has the tile, the same registers and spills,
    # the shipped dW and dX-with-QK-norm tiles among them
    _, rows = _tiles()
    keys = ("kernel", *counts.TILE_KEYS, "rotate")
    compiled = {tuple(r[k] for k in keys): r for r in rows}
    runs = sorted((ROOT / "benchmarks" / "results").glob("qkv_tiles_chosen-nvidia-h200-*.csv"))
    assert runs
    checked = set()
    for path in runs:
        norm = "-qk-norm" in path.name
        assert ("with QK-norm" in compare.read_meta(path)["case"]) == norm, path.name
        for r in compare.read_csv(path):
            key = (r["kernel"] + ("_norm" if norm else ""), *(r[k] for k in keys[1:]))
            if key in compiled and r["n_regs"] is not None:
                c = compiled[key]
                assert (c["n_regs"], c["stack"]) == (r["n_regs"], 4 * r["n_spills"]), \
                    (path.name, key)
                checked.add(key)
    shipped = {key for key, r in compiled.items() if r["shipped"] and key[0] != "fwd"}
    assert shipped <= checked, shipped - checked


def test_qkv_tile_resources_compiles_for_sm90():
    # through Triton's compiler and ptxas (no GPU), with the installed Triton (the committed
    # CSV names the Triton that wrote it): each tile's warps *and stages* reach the compiler
    code = ("from ropelib.course.counts import qkv_tile_resources as q\n"
            "for r in q({'fwd': [(128, 64, 8, 8, 3), (128, 64, 8, 8, 4)]}): print(r['rotate'], "
            "r['n_regs'], r['stack'], r['shared'], r['programs_per_sm'])\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    bare3, rot3, bare4, rot4 = [[int(v) if v.isdigit() else v for v in line.split()]
                                for line in run.stdout.splitlines()]
    assert [r[0] for r in (bare3, rot3, bare4, rot4)] == ["False", "True", "False", "True"]
    assert bare3[1] < rot3[1] <= 255 and bare4[1] < rot4[1] <= 255
    assert bare3[3] == rot3[3] > 0 and bare4[3] == rot4[3]    # the operand tiles, staged
    assert bare4[3] * 3 == bare3[3] * 4                       # 4 stages against 3
    assert rot3[4] <= bare3[4] and rot4[4] <= bare4[4]


def test_qkv_tile_resources_compiles_the_norms_kernel_for_sm90():
    # "dx_norm": dX with QK-norm weights and the forward's statistics, its bare row the GEMM
    # without them (the same as dX's); the tile table is as it was afterwards
    code = ("from ropelib.course.counts import qkv_tile_resources as q\n"
            "from ropelib.kernels import qkv_gemm\n"
            "before = {k: dict(v) for k, v in qkv_gemm.GPU_TILES.items()}\n"
            "rows = q({'dx': [(32, 128, 8, 4, 3)], 'dx_norm': [(32, 128, 8, 4, 3)]})\n"
            "assert qkv_gemm.GPU_TILES == before\n"
            "for r in rows: print(r['kernel'], r['rotate'], r['n_regs'], r['stack'], "
            "r['shared'])\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (dx, dx_rot, norm, norm_rot) = [line.split() for line in run.stdout.splitlines()]
    assert [r[:2] for r in (dx, dx_rot, norm, norm_rot)] == [
        ["dx", "False"], ["dx", "True"], ["dx_norm", "False"], ["dx_norm", "True"]]
    assert dx[2:] == norm[2:]                                   # the same bare GEMM
    regs, shared = (int(dx_rot[2]), int(norm_rot[2])), (int(dx_rot[4]), int(norm_rot[4]))
    assert regs[0] < regs[1] <= 255 and shared[0] < shared[1]  # the norm's backward on top


def test_qkv_tile_resources_refuses_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        counts.qkv_tile_resources({"fwd": []})
