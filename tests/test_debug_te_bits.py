"""ropelib.course.debug's reader of benchmarks/te_bits.py's GPU measurements (notebook 08)."""
import pytest
import torch

from ropelib.course import debug as D

PATH = D.te_bits_file()
needs_file = pytest.mark.skipif(PATH is None, reason="no benchmarks/results/te-bits-*.pt here")


def test_bits_differ_counts_bits_not_values():
    a = torch.tensor([0.0, 1.0, 2.0])
    b = torch.tensor([-0.0, 1.0, 2.5])
    assert D.bits_differ(a, b).tolist() == [True, False, True]
    with pytest.raises(ValueError):
        D.bits_differ(a, b.double())


def test_te_bits_file_prefers_h200(tmp_path):
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    assert D.te_bits_file(tmp_path) is None
    for name in ("te-bits-nvidia-h100-80gb-hbm3.pt", "te-bits-cpu-dry-run.pt"):
        (res / name).write_bytes(b"")
    assert D.te_bits_file(tmp_path).name == "te-bits-nvidia-h100-80gb-hbm3.pt"
    (res / "te-bits-nvidia-h200.pt").write_bytes(b"")
    assert D.te_bits_file(tmp_path).name == "te-bits-nvidia-h200.pt"


def test_te_bits_files_lists_every_gpu_run(tmp_path):
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    for name in ("te-bits-nvidia-h200.pt", "te-bits-cpu-dry-run.pt", "te-bits-nvidia-h100.pt"):
        (res / name).write_bytes(b"")
    assert [p.name for p in D.te_bits_files(tmp_path)] == ["te-bits-nvidia-h100.pt",
                                                          "te-bits-nvidia-h200.pt"]


def test_te_bits_counts_keys_every_row():
    rows = [{"variant": "a/tl", "n_differ": 3}, {"variant": "b/tl", "n_differ": 0}]
    data = {"scenarios": {"big": {"rows": rows}, "bad": {"error": "no TE"}}}
    assert D.te_bits_counts(data) == {("big", "a/tl"): 3, ("big", "b/tl"): 0,
                                      ("bad", None): "no TE"}


def test_committed_runs_of_one_architecture_count_the_same():
    """What notebook 08 leans on to check its counts on any GPU of the reference run's
    architecture: the compiled code, and so every count, depends on the compute capability."""
    runs = [D.load_te_bits(p) for p in D.te_bits_files()]
    by_arch = {}
    for run in runs:
        by_arch.setdefault(run["meta"]["capability"], []).append(run)
    pairs = [(a, b) for same in by_arch.values() for a, b in zip(same, same[1:])]
    if not pairs:
        pytest.skip("fewer than two committed te-bits runs of one architecture")
    for a, b in pairs:
        assert D.te_bits_counts(a) == D.te_bits_counts(b), (a["meta"]["gpu"], b["meta"]["gpu"])


@needs_file
def test_te_bits_cases_rebuild_the_gpu_inputs_and_rows():
    data = D.load_te_bits(PATH)
    for key in data["scenarios"]:
        case = D.te_bits_case(data, key)       # asserts x and angles hash as on the GPU
        S, B, H, Dm = case.x.shape
        assert case.te_cos.shape == case.te_sin.shape == (S, Dm // 2)
        # TE's cos/sin vs torch's CPU table of the same angles: the count the GPU printed
        row = case.sincos["table_cpu_fp32"]
        assert int(D.bits_differ(case.te_cos, torch.cos(case.angles)).sum()) == \
            row["cos"]["n_differ"]
        if case.te is None:
            continue
        for name in ("free_sub/tl", "fma_xc/tl", "fma_rs/tl"):
            out = case.output(name)
            assert int(D.bits_differ(out, case.te).sum()) == case.rows[name]["n_differ"]


# --- the reported failure's contraction (notebook 08, benchmarks/repro_contraction.py) -----------

def test_contraction_emulations_round_what_they_say():
    torch.manual_seed(0)
    x = torch.randn(3, 2, 2, 8).to(torch.bfloat16)
    cos, sin = (f(torch.rand(3, 4) * 6).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    ways = D.contraction_emulations(x, cos, sin)
    assert set(ways) == {(a, b) for a in D.CONTRACTION_WAYS for b in D.CONTRACTION_WAYS}
    x1, x2 = x[..., :4].float(), x[..., 4:].float()
    c, s = cos.float()[:, None, None], sin.float()[:, None, None]
    bf = lambda v: v.to(torch.bfloat16).float()   # noqa: E731
    every_rounded = torch.cat((bf(x1 * c) - bf(x2 * s), bf(x2 * c) + bf(x1 * s)), -1)
    assert torch.equal(ways["rounded", "rounded"], every_rounded.to(torch.bfloat16))
    x1_fused = torch.cat(((x1.double() * c.double() - bf(x2 * s).double()),
                          (x1.double() * s.double() + bf(x2 * c).double())), -1)
    assert torch.equal(ways["x1 exact", "x1 exact"], x1_fused.to(torch.bfloat16))
    assert len({y.view(torch.int16).sum().item() for y in ways.values()}) > 1    # ways differ


def test_contraction_emulations_refuse_a_table_of_another_shape_or_dtype():
    x = torch.zeros(3, 1, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"cos and sin must be \[S, D/2\] = \[3, 4\]"):
        D.contraction_emulations(x, torch.zeros(3, 8, dtype=torch.bfloat16),
                                 torch.zeros(3, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="one dtype, bf16 or fp16"):
        D.contraction_emulations(x, torch.zeros(3, 4), torch.zeros(3, 4))


def test_float_instructions_count_ptx_and_sass_ops():
    ptx = ("fma.rn.bf16 %rs1, %rs2, %rs3, %rs4;\n mul.bf16 %rs5, %rs6, %rs7;\n"
           "mul.rn.bf16 %rs8, %rs9, %rs1;\n fma.rn.bf16 %rs1, %rs2, %rs3, %rs4;\n"
           "mul.wide.u32 %rd1, %r1, 4;\n add.s64 %rd2, %rd1, %rd3;")
    sass = "/*0090*/ HFMA2.BF16_V2 R5, R2, R3, -R4 ;\n /*00a0*/ HMUL2.BF16_V2 R6, R2, R3 ;\n IMAD R1"
    got = D.float_instructions(ptx, sass)
    assert got == {"ptx": {"fma.rn.bf16": 2, "mul.bf16": 1, "mul.rn.bf16": 1},
                   "sass": {"HFMA2.BF16_V2": 1, "HMUL2.BF16_V2": 1}}
    assert D.float_instructions(ptx)["sass"] == {}


@needs_file
def test_the_reported_failure_count_is_one_contraction_of_sixteen():
    case = D.te_bits_case(D.load_te_bits(PATH), "nb_gpu")
    cos, sin = (f(case.angles).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    counts = {w: int(D.bits_differ(y, case.te).sum())
              for w, y in D.contraction_emulations(case.x, cos, sin).items()}
    file_row = case.rows["debug:REPRO"]["n_differ"]
    assert [w for w, n in counts.items() if n == file_row] == [("x1 exact", "x1 exact")]
    assert counts["rounded", "rounded"] == max(counts.values()) > file_row


def test_the_reproduction_kernel_compiled_for_sm90_fuses_in_bf16_only_with_contraction_on():
    on, off = (D.repro_kernel_instructions(f) for f in (True, False))
    assert on["ptx"].get("fma.rn.bf16", 0) > 0 and "mul.rn.bf16" not in on["ptx"]
    assert "fma.rn.bf16" not in off["ptx"] and off["ptx"]["mul.rn.bf16"] >= 4
    assert any(op.startswith("HFMA2.BF16") for op in on["sass"]) or not on["sass"]  # no cuobjdump
