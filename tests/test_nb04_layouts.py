"""ropelib.course.nb04_layouts: notebook 04's appendix A.1 compiles kernels for sm_90 without a
GPU and reads their Triton GPU IR."""
from ropelib.course import nb04_layouts


def test_compiled_ttgir_holds_the_named_variants_ir():
    out = nb04_layouts.compiled_ttgir(64, 2, 4, 128, 132, ["sh_loop_b", "sh_loop_b_w2"])
    assert sorted(out) == ["sh_loop_b", "sh_loop_b_w2"]
    assert [out[n]["num_warps"] for n in ("sh_loop_b", "sh_loop_b_w2")] == [1, 2]
    for v in out.values():   # the IR the notebook counts: cos/sin and bf16 loads in a layout
        assert "#ttg.blocked" in v["ttgir"] and "tt.load" in v["ttgir"]
        assert "math.sin" in v["ttgir"] or "__nv_sinf" in v["ttgir"]


def test_replication_reads_one_copy_for_the_one_warp_grid():
    out = nb04_layouts.compiled_ttgir(64, 2, 4, 128, 132, ["sh_loop_b", "sh_loop_b_w4"])
    assert nb04_layouts.replication(out["sh_loop_b"]["ttgir"])[:2] == (1, 1)
    # a 64-lane half-row on 4 warps (128 threads): each value held by 2 threads
    assert nb04_layouts.replication(out["sh_loop_b_w4"]["ttgir"])[:2] == (2, 2)


def test_finished_kernel_takes_the_named_gpus_tile():
    # TILES_BY_GPU: the H200's batch-loop tile is 16 elements a thread on 8 warps, the H100's
    # (the default) 8 on 16; both keep 32 copies of each cos/sin at one program a position
    x_tiles = {}
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        fin = nb04_layouts.compiled_ttgir(4096, 8, 32, 128, 132, ["ropelib_finished"],
                                          gpu=gpu)["ropelib_finished"]
        trig, _, layout = nb04_layouts.replication(fin["ttgir"])
        assert trig == 32 and fin["grid"] == [4096, 1, 1]
        x_tiles[gpu] = fin["num_warps"], layout.split("sizePerThread = ")[1].split("]")[0] + "]"
    assert x_tiles == {"NVIDIA H100 80GB HBM3": (16, "[1, 1, 4]"), "NVIDIA H200": (8, "[1, 1, 8]")}
