"""benchmarks/te_bits.py: the bit-for-bit comparison of notebook 08's teaching-kernel variants with
Transformer Engine. On a CPU its dry run (Triton's interpreter, TE's emulation in TE's place) must
run every variant that can run here, save what it prints, and read back; without a GPU and TE the
real run must refuse with a clear message."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the script's @triton.jit runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def te_bits():
    spec = importlib.util.spec_from_file_location("te_bits", ROOT / "benchmarks" / "te_bits.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dry(te_bits, tmp_path_factory):
    out = tmp_path_factory.mktemp("te_bits")
    assert te_bits.main(["--dry-run", "--out", str(out)]) == 0
    (path,) = out.glob("te-bits-*.pt")
    return torch.load(path, weights_only=False), path


def _rows(data, scenario):
    return {r["variant"]: r for r in data["scenarios"][scenario]["rows"]}


def test_dry_run_runs_every_variant_and_preset(te_bits, dry):
    data, path = dry
    assert path.stat().st_size < 2_000_000
    assert data["meta"]["dry_run"] and data["meta"]["format"] == te_bits.FORMAT
    assert set(data["scenarios"]) == set(te_bits.DRY_SCENARIOS)
    want = {v.name for v in te_bits.variants()} | set(te_bits.PRESETS) | {
        "emulation:device", "emulation:cpu"}
    for key in te_bits.DRY_SCENARIOS:
        rows = _rows(data, key)
        assert set(rows) == want
        for name, r in rows.items():
            libdev = name.split("/")[-1] in te_bits.NEEDS_LIBDEVICE
            if libdev and te_bits.runtime.INTERPRET:
                assert r["error"].startswith("not run: libdevice"), (key, name, r)
            else:
                assert "error" not in r, (key, name, r)
        assert not data["scenarios"][key]["errors"]


def test_the_no_contraction_variant_is_the_emulation_bit_for_bit(dry):
    # the emulation: torch's fp32 cos/sin on the CPU, x*c and rot*s rounded, the sum rounded;
    # the teaching kernel with that table and no contraction must be the same bits, in bf16 and
    # in fp32 (this checks the script's indexing and layouts, not any GPU behaviour)
    data, _ = dry
    for key in ("nb_cpu", "nb_cpu_fp32"):
        rows = _rows(data, key)
        # (free_sub: the interpreter's numpy never contracts)
        for name in ("none_rn/table_te_fp32", "free_sub/table_cpu_fp32",
                     "emulation:cpu", "debug:FIXED-table_fp32"):
            assert rows[name]["n_differ"] == 0, (key, name, rows[name])
        assert rows["input_dtype_math/table_input_dtype"]["n_differ"] == \
            rows["debug:REPRO"]["n_differ"]
    # bf16 tables and bf16 math are far from it: the story's reproduction
    assert _rows(data, "nb_cpu")["debug:REPRO"]["n_differ"] > 0
    # in fp32 an fma rounds visibly differently from separately rounded products, and the two
    # fma orders differ from each other: the fp32 scenario tells contraction orders apart
    r32 = _rows(data, "nb_cpu_fp32")
    assert r32["fma_xc/table_te_fp32"]["n_differ"] > 0
    assert r32["fma_rs/table_te_fp32"]["n_differ"] > 0
    assert r32["debug:FIXED+fma"]["n_differ"] > 0


def test_saved_outputs_read_back_and_match_the_rows(te_bits, dry):
    data, _ = dry
    sc = data["scenarios"]["nb_cpu"]
    te = te_bits.output(data, "nb_cpu", "te")
    x, ang = te_bits.inputs(te_bits.SCENARIOS["nb_cpu"], "cpu")
    assert torch.equal(sc["x"], x) and torch.equal(sc["angles"], ang)
    freqs4 = torch.cat((ang, ang), dim=-1).view(ang.shape[0], 1, 1, -1)
    assert torch.equal(te, te_bits.te_emulation(x, freqs4))
    for name, r in _rows(data, "nb_cpu").items():
        if "error" in r:
            continue
        y = te_bits.output(data, "nb_cpu", name)
        assert y is not None and y.shape == x.shape and y.dtype == x.dtype
        assert int((te_bits.bits(y) != te_bits.bits(te)).sum()) == r["n_differ"], name
    # TE's own cos/sin (here: the emulation's) as read back by the ones/zeros probe
    c = te_bits.unpack(sc["sincos_ref"]["cos"])
    assert torch.equal(c, torch.cos(ang))


def test_big_scenarios_store_sparse_or_summary_only(te_bits, tmp_path, monkeypatch):
    # a scenario above SMALL_NUMEL keeps no x, and a variant only as its differences from TE
    monkeypatch.setattr(te_bits, "SMALL_NUMEL", 0)
    monkeypatch.setattr(te_bits, "SPARSE_MAX_BIG", 64)
    assert te_bits.main(["--dry-run", "--scenarios", "nb_cpu", "--out",
                         str(tmp_path / "big.pt")]) == 0
    data = torch.load(tmp_path / "big.pt", weights_only=False)
    sc = data["scenarios"]["nb_cpu"]
    assert "x" not in sc and sc["te"]["kind"] == "full"
    te = te_bits.output(data, "nb_cpu", "te")
    kinds = set()
    for name, r in _rows(data, "nb_cpu").items():
        if "error" in r:
            continue
        p = sc["outputs"][name]
        kinds.add(p["kind"])
        if r["n_differ"] <= 64:
            assert p["kind"] == "sparse" and len(p["idx"]) == r["n_differ"]
            y = te_bits.output(data, "nb_cpu", name)
            assert te_bits.sha256(y) == p["sha256"]
            assert int((te_bits.bits(y) != te_bits.bits(te)).sum()) == r["n_differ"]
        else:
            assert p["kind"] == "none" and te_bits.output(data, "nb_cpu", name) is None
    assert kinds == {"sparse", "none"}
    cos = torch.cos(te_bits.inputs(te_bits.SCENARIOS["nb_cpu"], "cpu")[1])
    assert torch.equal(te_bits.unpack(sc["sincos_ref"]["cos"], cos), cos)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_gpu_or_te_it_refuses_clearly(te_bits, tmp_path, capsys):
    assert te_bits.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--dry-run" in err
    assert not list(tmp_path.iterdir())
