"""Notebook 03, section 5: the bytes one warp's load touches, read from the compiled pair swap
(ropelib.course.nb03_layouts), on Triton 3.6's code as the counters' launch ran it, and on the
code this Triton compiles here for sm_90."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib.course import nb03_layouts as lay  # noqa: E402

# Triton 3.6's code for sm_90 of the pair swap at 16 rows a program, 4 warps, bf16 x [*, 128]:
# the layouts and load ops it chose, cut down to the lines the parsers read
TTGIR_36 = {
    "c": ("#blocked = #ttg.blocked<{sizePerThread = [1, 1, 2], threadsPerWarp = [16, 2, 1], "
          "warpsPerCTA = [1, 4, 1], order = [2, 0, 1]}>\n"
          "#blocked1 = #ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [16, 2], "
          "warpsPerCTA = [1, 4], order = [0, 1]}>\n"
          "    %4 = tt.load %2, %3 : tensor<16x64x2x!tt.ptr<bf16>, #blocked> loc(#loc12)\n"),
    "d": ("#blocked = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [2, 16], "
          "warpsPerCTA = [4, 1], order = [1, 0]}>\n"
          "    %3 = tt.load %1, %2 : tensor<16x128x!tt.ptr<bf16>, #blocked> loc(#loc8)\n"),
}
PTX_36 = {
    "c": "".join(f"\t@%p1 ld.global.b32 {{ %r{i} }}, [ %rd{i} + 0 ];\n" for i in range(8))
         + "".join(f"\t@%p1 st.global.b32 [ %rd{i} + 0 ], {{ %r{i} }};\n" for i in range(8)),
    "d": ("\t@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];\n"
          "\t@%p1 ld.global.v4.b32 { %r5, %r6, %r7, %r8 }, [ %rd2 + 0 ];\n"
          "\t@%p1 st.global.v4.b32 [ %rd3 + 0 ], { %r9, %r10, %r11, %r12 };\n"
          "\t@%p1 st.global.v4.b32 [ %rd4 + 0 ], { %r13, %r14, %r15, %r16 };\n"),
}


def test_lane_bytes():
    assert lay.lane_bytes("ld.global.b32") == 4
    assert lay.lane_bytes("ld.global.v4.b32") == 16
    assert lay.lane_bytes("st.global.v2.b16") == 4


def test_load_layout_reads_the_loaded_tiles_layout():
    shape, L, text = lay.load_layout(TTGIR_36["c"])
    assert shape == [16, 64, 2]
    assert L == {"sizePerThread": [1, 1, 2], "threadsPerWarp": [16, 2, 1],
                 "warpsPerCTA": [1, 4, 1], "order": [2, 0, 1]}      # not #blocked1's
    assert text.startswith("#ttg.blocked<{sizePerThread = [1, 1, 2]") and text.endswith("}>")


def test_triton_36s_code_gives_the_counters_sectors():
    """What notebook 03 asserts of Triton 3.6's code, the H200 counters' compiler: (c) one pair
    a lane down 16 rows, 8 bytes of each, 16 sectors a request (128 B used); (d) 16 B a lane,
    2 whole rows, 16 whole sectors (512 B)."""
    got = lay.pair_swap_layouts({n: {"ttgir": TTGIR_36[n], "ptx": PTX_36[n]} for n in "cd"})
    c, d = got["c"], got["d"]
    assert (c["ld"], c["n_ld"], c["ops"]["st.global.b32"]) == ("ld.global.b32", 8, 8)
    assert c["L"]["threadsPerWarp"] == [16, 2, 1]
    assert (c["rows"], c["per_row"], c["sectors"]) == (16, 8, 16)
    assert 32 * lay.lane_bytes(c["ld"]) == 128 and c["sectors"] * 32 > 128     # part of each
    assert (d["ld"], d["n_ld"]) == ("ld.global.v4.b32", 2)
    assert (d["rows"], d["per_row"], d["sectors"]) == (2, 256, 16)
    assert d["sectors"] * 32 == 32 * lay.lane_bytes(d["ld"]) == 512               # whole
    # each lane loads its sizePerThread run along the fastest axis in one instruction
    for r in (c, d):
        assert lay.lane_bytes(r["ld"]) == r["L"]["sizePerThread"][r["L"]["order"][0]] * 2


def test_code_compiled_here_reads_as_the_notebook_expects():
    """The pair swap compiled for sm_90 by this Triton: (d) whole sectors in any case, (c) a
    layout the parsers read consistently (whole or part sectors, as this Triton chooses)."""
    from ropelib.course.kernels.pair_swap import _pair_swap_kernel
    from ropelib.course.offline_compile import compiled_code

    x_ = torch.empty(16, 128, dtype=torch.bfloat16)
    built = {name: compiled_code(_pair_swap_kernel, dict(
                 x_ptr=x_, y_ptr=x_, n_rows=1 << 18, D=128, ROWS=16, STRIDED_LOAD=False,
                 STRIDED_STORE=False, WHOLE_ROWS=whole), num_warps=4, timeout=600)
             for name, whole in (("c", False), ("d", True))}
    got = lay.pair_swap_layouts(built)
    d = got["d"]
    assert d["ld"] == "ld.global.v4.b32" and d["sectors"] * 32 == 512
    for r in got.values():
        assert lay.lane_bytes(r["ld"]) == r["L"]["sizePerThread"][r["L"]["order"][0]] * 2
        assert r["rows"] * r["per_row"] == 32 * lay.lane_bytes(r["ld"])   # no lane doubled up
        assert r["sectors"] * 32 >= 32 * lay.lane_bytes(r["ld"])
    if built["c"]["triton"].split(".")[:2] == ["3", "6"]:
        assert (got["c"]["rows"], got["c"]["per_row"], got["c"]["sectors"]) == (16, 8, 16)
