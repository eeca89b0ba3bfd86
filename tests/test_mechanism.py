"""benchmarks/mechanism.py: every variant runs and matches the reference (the dry run, in the
interpreter), the CSV reads back, the occupancy arithmetic is CUDA's, and ncu's raw CSV is parsed
and matched to the launches it profiled; a failing ncu leaves the ncu columns empty, with why."""
import os
from pathlib import Path

import pytest
import torch
from loading import load_file  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the script's @triton.jit runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mechanism():
    mod = load_file("mechanism", ROOT / "benchmarks" / "mechanism.py")
    return mod


def test_dry_run_checks_every_variant_and_writes_a_readable_csv(mechanism, tmp_path, capsys):
    from ropelib.bench import compare
    from ropelib.course import ladder
    assert mechanism.main(["--dry-run", "--ncu", "--out", str(tmp_path)]) == 0
    path = tmp_path / "mechanism-cpu-interpreter.csv"
    rows, meta = compare.read_csv(path), compare.read_meta(path)
    assert meta["script"] == "benchmarks/mechanism.py" and meta["ncu"] == "not run (dry run)"
    assert meta["gpu"] == "none" and "column ncu_warp_inst" in meta
    names = {r["variant"] for r in rows if r["case"] == "tiny"}
    want = {"copy", "naive", "batch_reuse", "ropelib", "ropelib_planned", *ladder.NAMES}
    want |= {v[0] for v in mechanism.ablation.variants(3)}
    assert names == want
    assert {r["case"] for r in rows} == {"tiny", "tiny-b1", "tiny-few-tokens"}
    for r in rows:
        assert r["status"] == "ok", (r["case"], r["variant"], r["reason"])
        assert 0 <= r["max_head_ulp_err"] <= 1.0
        assert r["elements"] == r["seq_len"] * r["batch"] * r["heads"] * r["head_dim"]
        assert r["model_bytes"] >= 2 * 2 * r["elements"]
        assert r["registers"] is None and r["ncu_duration_ns"] is None   # GPU-only columns
        if r["variant"] != "copy":
            assert r["kernel"].startswith("_") and r["programs"] >= 1 and r["num_warps"] >= 1
    naive = next(r for r in rows if r["case"] == "tiny" and r["variant"] == "naive")
    assert naive["programs"] == 5 * 2 * 3 and naive["kernel"] == "_rope_naive_kernel"
    reuse = next(r for r in rows if r["case"] == "tiny" and r["variant"] == "batch_reuse")
    assert reuse["grid"] == "5x3"
    out = capsys.readouterr().out
    assert "# ncu: not run (dry run)" in out and "tiny-few-tokens" in out.splitlines()[-6]


@pytest.mark.parametrize("regs, warps, shared, blocks, occ, limiter", [
    (32, 4, 0, 16, 100.0, "registers+warps"),  # 1024 registers a warp: 64 warps fit
    (128, 4, 0, 4, 25.0, "registers"),         # 4096 a warp: 16 warps
    (40, 8, 0, 6, 75.0, "registers"),          # 1280 a warp: 51 -> 48 warps (groups of 4)
    (33, 8, 0, 6, 75.0, "registers"),          # 33 * 32 = 1056 rounds up to 1280 too
    (16, 1, 0, 32, 50.0, "blocks"),            # one-warp blocks: the 32-block cap binds
    (255, 1, 0, 8, 12.5, "registers"),
    (24, 16, 0, 4, 100.0, "warps"),
    (32, 4, 100 * 1024, 2, 12.5, "shared"),    # 228 KiB / (100 KiB + 1 KiB reserved)
])
def test_theoretical_occupancy(mechanism, regs, warps, shared, blocks, occ, limiter):
    got = mechanism.theoretical_occupancy(regs, warps, shared)
    assert got == dict(blocks_per_sm=blocks, warps_per_sm=blocks * warps, occupancy_pct=occ,
                       limiter=limiter)


def test_theoretical_occupancy_rejects_nonsense(mechanism):
    with pytest.raises(ValueError):
        mechanism.theoretical_occupancy(32, 0)


# What `ncu --csv --page raw` prints (the program's own output and ==PROF== lines first), with
# auto-scaled units and thousands separators; a set-up kernel (fill) between ours.
NCU_RAW = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
s4096-b8: sbhd s=4096
==PROF== Profiling "elementwise_kernel" - 0: 0%....50%....100% - 9 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","launch__block_size","launch__grid_size","launch__registers_per_thread","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__inst_executed.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","","","","","","","","Mbyte","Mbyte","usecond","","","register/thread","%","%","inst",""
"0","4242","python3.12","127.0.0.1","void at::native::elementwise_kernel<128, 4>(int, T3)","1","7","(128, 1, 1)","(262144, 1, 1)","0","9.0","268.44","268.50","118.53","128","262,144","26","40.12","85.33","12,582,912","90.5"
"1","4242","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>(int, T2, T3)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","0.00","1.05","3.10","128","64","16","1.0","20.0","4,096","2.0"
"2","4242","python3.12","127.0.0.1","_rope_naive_kernel","1","7","(64, 1, 1)","(1048576, 1, 1)","0","9.0","270.53","268.44","401.25","64","1,048,576","30","60.2","70.1","301,989,888","62.5"
"3","4242","python3.12","127.0.0.1","_rope_kernel","1","7","(512, 1, 1)","(528, 1, 1)","0","9.0","270.53","268.44","121.5","512","528","40","30.5","55.0","n/a","91.0"
'''


def test_parse_ncu_csv_reads_records_in_base_units(mechanism):
    recs = mechanism.parse_ncu_csv(NCU_RAW)
    assert [r["id"] for r in recs] == [0, 1, 2, 3]
    naive = recs[2]
    assert naive["kernel"] == "_rope_naive_kernel"
    assert naive["dram__bytes_read.sum"] == pytest.approx(270.53e6)
    assert naive["gpu__time_duration.sum"] == pytest.approx(401250.0)
    assert naive["launch__grid_size"] == 1048576 and naive["smsp__inst_executed.sum"] == 301989888
    assert naive["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(70.1)
    assert recs[3]["smsp__inst_executed.sum"] is None   # n/a
    assert mechanism.parse_ncu_csv("==PROF== Disconnected\nno table here\n") == []


def test_match_records_skips_kernels_not_in_the_manifest(mechanism):
    recs = mechanism.parse_ncu_csv(NCU_RAW)
    manifest = [dict(case="c", variant="copy", kernel=None),
                dict(case="c", variant="naive", kernel="_rope_naive_kernel"),
                dict(case="c", variant="tile", kernel="_ladder_tile_kernel"),   # never profiled
                dict(case="c", variant="ropelib", kernel="_rope_kernel")]
    got = mechanism.match_records(manifest, recs)
    assert {k: v["id"] for k, v in got.items()} == {("c", "copy"): 0, ("c", "naive"): 2,
                                                    ("c", "ropelib"): 3}
    row = dict(elements=4096 * 8 * 32 * 128, model_bytes=2 * 2 * 4096 * 8 * 32 * 128 + 4096 * 128 * 4)
    cols = mechanism.ncu_row_columns(got[("c", "naive")], row)
    assert cols["ncu_dram_read_bytes"] == 270530000 and cols["ncu_grid_size"] == 1048576
    assert cols["ncu_warp_inst_per_element"] == pytest.approx(301989888 / row["elements"], rel=1e-3)
    assert cols["ncu_thread_inst_per_element"] == pytest.approx(32 * 301989888 / row["elements"],
                                                                rel=1e-3)
    assert cols["ncu_dram_bytes_over_model"] == pytest.approx((270.53e6 + 268.44e6)
                                                              / row["model_bytes"], rel=1e-3)
    assert cols["ncu_gbps"] == pytest.approx(row["model_bytes"] / 401250.0, rel=1e-3)


def test_ptx_columns_count_vector_widths_and_sin_cos(mechanism):
    ptx = """
.visible .entry _k(
	.param .u64 _k_param_0
)
{
	.reg .b32 	%r<9>;
	mov.u32 	%r1, %tid.x;
	// begin inline asm
	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
	// end inline asm
	@%p1 ld.global.v2.b32 { %r5, %r6 }, [ %rd2 + 0 ];
	ld.global.b16 	%rs1, [%rd3];
	ld.global.nc.f32 	%f9, [%rd4];
	sin.approx.f32 	%f1, %f2;
	cos.approx.ftz.f32 	%f3, %f2;
	@%p1 st.global.v4.b32 [ %rd5 + 0 ], { %r1, %r2, %r3, %r4 };
	st.global.b16 	[%rd6], %rs1;
	ret;
}
"""
    cols = mechanism.ptx_columns(ptx)
    assert (cols["ptx_ld_v4"], cols["ptx_ld_v2"], cols["ptx_ld_v1"]) == (1, 1, 1)   # .nc left out
    assert (cols["ptx_st_v4"], cols["ptx_st_v2"], cols["ptx_st_v1"]) == (1, 0, 1)
    assert cols["ptx_sin_cos_approx"] == 2 and cols["trig"] == "approx"
    assert cols["ptx_instructions"] == 10


def test_compiled_columns_and_occupancy_from_a_compiled_kernel(mechanism):
    class Meta:
        num_warps, shared = 8, 0

    class Compiled:   # the attributes Triton 3.x's CompiledKernel has after a launch
        n_regs, n_spills, metadata = 40, 0, Meta()
        asm = {"ptx": "\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];\n"}

    launch = mechanism.Launch("_rope_kernel", (256, 4, 2), 8, Compiled())
    cols, missing = mechanism.launch_columns(launch, sm_count=132)
    assert missing == []
    assert cols["programs"] == 2048 and cols["grid"] == "256x4x2" and cols["registers"] == 40
    assert cols["occ_blocks_per_sm"] == 6 and cols["occ_theoretical_pct"] == 75.0
    assert cols["programs_per_sm"] == pytest.approx(2048 / 132, abs=0.01)
    assert cols["waves"] == pytest.approx(2048 / (132 * 6), abs=0.01)
    cols, missing = mechanism.launch_columns(mechanism.Launch("_k", (4,), 4, None), 132)
    assert cols["programs"] == 4 and "registers" not in cols and missing


def test_a_failing_ncu_leaves_the_reason(mechanism, tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - no permission' >&2\nexit 3\n")
    fake.chmod(0o755)
    matched, status = mechanism.run_ncu(str(fake), tmp_path, "fake-gpu", timeout=60)
    assert matched == {} and status.startswith("failed: exit 3") and "ERR_NVGPUCTRPERM" in status


def test_an_ncu_that_hangs_is_stopped(mechanism, tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    matched, status = mechanism.run_ncu(str(fake), tmp_path, "fake-gpu", timeout=1)
    assert matched == {} and status.startswith("failed: timed out after 1 s")


# Trimmed from a real H100 `ncu --import R --csv --page raw --print-units base` (columns cut to
# the ones parsed, plus the NVTX ones; 3 of 36 records): the device copy y.copy_(x) was a
# cudaMemcpy, so record 0 is s4096-b8/naive, not the copy.
NCU_RAW_NVTX = '''==PROF== Connected to process 3042
"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","launch__grid_size","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__inst_executed.sum"
"","","","","","","","","","","","","","byte","byte","ns","","%","inst"
"0","3042","python3","127.0.0.1","3042  ""<default domain>:s4096-b8/naive:none:none:none:none:none:none"" ","","_rope_naive_kernel","1","7","(32, 1, 1)","(1048576, 1, 1)","0","9.0","270,551,040","252,926,720","633,792","1,048,576","29.48","368,050,176"
"1","3042","python3","127.0.0.1","3042  ""<default domain>:s4096-b8/batch_reuse:none:none:none:none:none:none"" ","","_rope_batch_reuse_kernel","1","7","(32, 1, 1)","(131072, 1, 1)","0","9.0","279,533,312","252,979,712","220,736","131,072","48.36","68,026,368"
"35","3042","python3","127.0.0.1","3042  ""<default domain>:s16-b64/ropelib:none:none:none:none:none:none"" ","","_rope_kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","8,446,720","2,304","10,048","1,024","35.63","3,362,816"
'''


def test_nvtx_range_name(mechanism):
    cell = '3042  "<default domain>:s4096-b8/naive:none:none:none:none:none:none" '
    assert mechanism.nvtx_range(cell) == "s4096-b8/naive"
    assert mechanism.nvtx_range('1  "<default domain>:c/v:x"') == "c/v"
    assert mechanism.nvtx_range('1  "<default domain>:outer:none" 1  "<default domain>:c/v:none"') \
        == "c/v"
    assert mechanism.nvtx_range("") is None and mechanism.nvtx_range("n/a") is None


def test_match_records_by_nvtx_range_not_by_order(mechanism):
    recs = mechanism.parse_ncu_csv(NCU_RAW_NVTX)
    assert [(r["id"], r["nvtx"]) for r in recs] == [
        (0, "s4096-b8/naive"), (1, "s4096-b8/batch_reuse"), (35, "s16-b64/ropelib")]
    naive = recs[0]
    assert naive["gpu__time_duration.sum"] == 633792 and naive["dram__bytes_read.sum"] == 270551040
    # the copy has no record (a cudaMemcpy in that run): in-order matching gave it naive's
    manifest = [dict(case="s4096-b8", variant="copy", kernel=None),
                dict(case="s4096-b8", variant="naive", kernel="_rope_naive_kernel"),
                dict(case="s4096-b8", variant="batch_reuse", kernel="_rope_batch_reuse_kernel"),
                dict(case="s4096-b8", variant="ropelib", kernel="_rope_kernel"),
                dict(case="s16-b64", variant="copy", kernel="_copy_kernel"),
                dict(case="s16-b64", variant="ropelib", kernel="_rope_kernel")]
    got = mechanism.match_records(manifest, recs)
    assert {k: v["id"] for k, v in got.items()} == {("s4096-b8", "naive"): 0,
                                                    ("s4096-b8", "batch_reuse"): 1,
                                                    ("s16-b64", "ropelib"): 35}
    row = dict(elements=4096 * 8 * 32 * 128, model_bytes=2 * 2 * 4096 * 8 * 32 * 128 + 4096 * 128 * 4)
    cols = mechanism.ncu_row_columns(got[("s4096-b8", "naive")], row)
    assert cols["ncu_duration_ns"] == 633792
    assert cols["ncu_dram_bytes_over_model"] == pytest.approx((270551040 + 252926720)
                                                              / row["model_bytes"], rel=1e-3)
    assert cols["ncu_achieved_occupancy_pct"] == pytest.approx(29.48)


def test_a_library_range_inside_ours_still_matches(mechanism):
    # Transformer Engine opens a range of its own around its kernel: ncu's cell (H200 run) names
    # both, ours outermost; the record belongs to the variant's range
    cell = ('1485  "<default domain>:s4096-b8/te_fused:none:none:none:none:none:none"  '
            '"<default domain>:nvte_fused_rope_forward:none:none:none:none:none:none" ')
    assert mechanism.nvtx_ranges(cell) == ["s4096-b8/te_fused", "nvte_fused_rope_forward"]
    assert mechanism.nvtx_range(cell) == "nvte_fused_rope_forward"
    recs = [dict(id=28, kernel="void transformer_engine::fused_rope_forward_kernel<...>",
                 nvtx="nvte_fused_rope_forward", nvtx_ranges=mechanism.nvtx_ranges(cell)),
            dict(id=29, kernel="_copy_kernel", nvtx="s32768-b1/copy",
                 nvtx_ranges=["s32768-b1/copy"])]
    manifest = [dict(case="s4096-b8", variant="te_fused",
                     kernel=mechanism.KERNEL_NAMES["te_fused"]),
                dict(case="s32768-b1", variant="copy", kernel="_copy_kernel")]
    got = mechanism.match_records(manifest, recs)
    assert {k: v["id"] for k, v in got.items()} == {("s4096-b8", "te_fused"): 28,
                                                    ("s32768-b1", "copy"): 29}


def test_duration_units_convert_to_ns(mechanism):
    assert mechanism._number("633.792", "usecond") == pytest.approx(633792)
    assert mechanism._number("633,792", "nsecond") == pytest.approx(633792)
    assert mechanism._number("0.633792", "msecond") == pytest.approx(633792)


def test_copy_variant_is_a_triton_kernel(mechanism):
    x = torch.randn(3, 5, 7).to(torch.bfloat16)
    y = torch.empty_like(x)
    v = next(v for v in mechanism.variants(7) if v.name == "copy")
    with mechanism.LaunchRecorder() as rec:
        out = v.make(x, None, y)()
    assert torch.equal(out, x) and [ln.kernel for ln in rec.launches] == ["_copy_kernel"]
