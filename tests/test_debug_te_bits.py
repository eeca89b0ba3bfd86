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
