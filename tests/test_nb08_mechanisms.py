"""Notebook 08: the mechanisms its prose explains, measured apart from the notebook.

- section 2: the dark cells of the H200's error map of the reported failure sit where
  |sin theta| is small. The reference run kept that kernel's count, not its output; the output
  is the emulation that fuses x1 c into y1 and x1 s into y2 (benchmarks/repro_contraction.py
  found it equal bit for bit on the same GPU), rebuilt here from the committed inputs;
- section 3b: a one-ulp move of sin/cos flips a bf16 output with chance |dy| / ulp_bf16(y),
  and that chance summed over the GPU-size outputs predicts the flips that happen;
- section 4b: `tl.fma` rounds once, in Triton's interpreter too, where `a * b + d` rounds twice.
"""
import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib.bench import compare  # noqa: E402
from ropelib.course import debug  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference_run():
    return debug.load_te_bits(debug.te_bits_file(ROOT))


def test_the_reported_output_rebuilt_from_its_emulation_and_the_rate_by_sin(reference_run):
    contraction = json.loads((ROOT / "benchmarks" / "results" /
                              "repro_contraction-nvidia-h200.json").read_text())
    assert contraction["gpu"] == reference_run["meta"]["gpu"]
    assert contraction["kernel"]["enable_fp_fusion=True"]["equals_emulations"] == \
        ["y1 x1 exact | y2 x1 exact"]
    case = debug.te_bits_case(reference_run, "nb_gpu")
    cos_b, sin_b = (f(case.angles).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    y = debug.contraction_emulations(case.x, cos_b, sin_b)[("x1 exact", "x1 exact")]
    differ = debug.bits_differ(y, case.te)
    assert int(differ.sum()) == case.rows["debug:REPRO"]["n_differ"] == 320_601
    S, D = case.x.shape[0], case.x.shape[-1]
    rate = differ.view(S, -1, D).double().mean(1)
    sin_abs = torch.sin(case.angles).abs().repeat(1, 2)
    edges = (0, 0.01, 0.02, 0.04, 0.1)
    rates = [float(rate[(sin_abs >= lo) & (sin_abs < hi)].mean())
             for lo, hi in zip(edges, edges[1:])]
    assert rates == sorted(rates) and rates[0] < 0.01 < 0.25 < rates[-1]


def test_a_one_ulp_move_of_sin_cos_predicts_the_flips():
    S, B, H, D = 512, 2, 8, 128
    x = torch.randn(S, B, H, D, generator=torch.Generator().manual_seed(0)).bfloat16()
    f = compare.angles(S, D)[:, 0, 0, :]
    tables = ((torch.cos(f), torch.sin(f)),
              (debug.one_ulp_up(torch.cos(f)), debug.one_ulp_up(torch.sin(f))))
    y32, m32 = (ropelib.reference.rope_reference(x.float(), cos=c, sin=s,
                                                 compute_dtype=torch.float32).double()
                for c, s in tables)
    ulp = 2.0 ** (torch.floor(torch.log2(y32.abs().clamp_min(2.0 ** -126))) - 7)
    predicted = float(((m32 - y32).abs() / ulp).clamp(max=1).sum())
    flips = int((y32.to(torch.bfloat16) != m32.to(torch.bfloat16)).sum())
    assert 30 < flips < 60 and abs(predicted - flips) < 0.25 * flips


@triton.jit
def _one_fma(a_ptr, b_ptr, d_ptr, out_ptr):
    a = tl.load(a_ptr)
    b = tl.load(b_ptr)
    d = tl.load(d_ptr)
    tl.store(out_ptr + 0, a * b + d)
    tl.store(out_ptr + 1, tl.fma(a, b, d))
    tl.store(out_ptr + 2, tl.fma(a, b, -(a * b)))


def test_tl_fma_rounds_once_and_the_plain_line_twice():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = [torch.tensor([v], dtype=torch.float32, device=device)
            for v in (1 + 2 ** -12, 1 + 2 ** -12, -(1 + 2 ** -11))]
    out = torch.empty(3, dtype=torch.float32, device=device)
    _one_fma[(1,)](*args, out, enable_fp_fusion=False)
    assert out.cpu().tolist() == [0.0, 2 ** -24, 2 ** -24]
