"""Notebook 08, section 4b's harness (`ropelib.course.nb08_te_parity`): TE's side of a committed
case, the section's kernel run against it, and the readers of the committed runs.

On the CPU TE's side is the one stored from the GPU run (or, `live`, the TE emulation standing in
for TE: `debug.te_fused` falls back to it off a GPU), and the counts are the ones the notebook
asserts on the CPU: the fp32 case's 990 elements with every product rounded, 0 with TE's cos/sin
and TE's fma order. The `gpu` test runs the real TE where it is installed.
"""
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ropelib import runtime  # noqa: E402
from ropelib.course import debug  # noqa: E402
from ropelib.course import nb08_te_parity as tp  # noqa: E402
from ropelib.course.exercises import debugging as ex  # noqa: E402

pytestmark = pytest.mark.skipif(debug.te_bits_file() is None,
                                reason="no benchmarks/results/te-bits-*.pt here")

GPU_SOURCES = ("tl", "libdevice", "fast", "table_fp32")     # notebook 08's, step b


@pytest.fixture(scope="module")
def bits():
    return debug.load_te_bits(debug.te_bits_file())


@pytest.fixture(scope="module")
def small32(bits):
    return debug.te_bits_case(bits, "nb_cpu_fp32")        # fp32 S=32 B=2 H=2 D=32


@triton.jit
def as_written(x1, x2, c, s):
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    return y1, y2


def _parity(case, device="cpu", live=False):
    side = {case.key: tp.te_side(case, device, live)}
    return tp.TeParity(ex._rope_combine_kernel, side, device,
                       sincos="tl" if torch.device(device).type == "cuda" else "table",
                       here_name="CPU, Triton interpreter", te_where="TE's stored output",
                       reference_col="NVIDIA H200 run")


# --- reading the committed runs -----------------------------------------------------------------

def test_rows_and_counts_are_the_committed_runs(bits, small32):
    assert tp.run_row(bits, "debug:FIXED")["n_differ"] == 12          # nb_gpu, the text's 12
    assert tp.run_row(bits, "debug:FIXED")["numel"] == 1_048_576
    assert tp.run_row(bits, "none_rn/table_te_fp32", "nb_cpu_fp32") == \
        small32.rows["none_rn/table_te_fp32"]
    assert tp.gpu_row(small32, "none_rn/table_te_fp32") == 990
    assert tp.gpu_row(small32, "fma_xc/tl") == 0
    with pytest.raises(KeyError):
        tp.run_row(bits, "no such variant")


def test_labels_and_registers():
    assert tp.fmt_count(None) == "—" and tp.fmt_count(1_048_576) == "1,048,576"
    assert tp.fmt_count(0) == "0"
    assert tp.ptx_registers("fma.rn.f32 \t%r102, %r114, %r98, %r101;") == \
        ["%r102", "%r114", "%r98", "%r101"]
    assert tp.ptx_registers("neg.f32 \t%r101, %r100;") == ["%r101", "%r100"]


def test_case_label(small32):
    assert tp.case_label(small32) == "fp32 S=32 B=2 H=2 D=32"


def test_the_h100_run_agrees_with_the_reference_run(bits):
    h100 = next(debug.load_te_bits(p) for p in debug.te_bits_files() if "h100" in p.name)
    assert tp.agreement(h100, bits) == (156, 156, 132, True)     # Appendix A's counts
    assert tp.agreement(bits, bits) == (156, 156, 132, True)


# --- TE's side ----------------------------------------------------------------------------------

def test_ones_then_zeros():
    x = tp.ones_then_zeros(3, 4)
    assert x.shape == (3, 1, 1, 8) and x.dtype == torch.float32
    assert bool((x[..., :4] == 1).all()) and bool((x[..., 4:] == 0).all())


def test_te_side_off_a_gpu_with_te_is_the_stored_run(small32):
    side = tp.te_side(small32, "cpu", live=False)
    assert side["te"] is small32.te and side["angles"] is small32.angles
    assert side["cos"] is small32.te_cos and side["sin"] is small32.te_sin


def test_te_side_live_reads_cos_and_sin_back_through_the_rope(small32):
    # off a GPU debug.te_fused is the TE emulation: its rope of (1 | 0) is its own fp32 cos/sin
    side = tp.te_side(small32, "cpu", live=True)
    x, ang = debug.te_bits_inputs(small32.scenario, "cpu")
    assert torch.equal(side["angles"], ang)
    assert torch.equal(side["cos"], torch.cos(ang)) and torch.equal(side["sin"], torch.sin(ang))
    freqs4 = torch.cat((ang, ang), dim=-1).view(ang.shape[0], 1, 1, -1)
    assert torch.equal(side["te"], debug.te_fused(x, freqs4))
    assert side["te"].dtype == small32.x.dtype and side["te"].shape == small32.x.shape


# --- the kernel against TE's side ---------------------------------------------------------------

@pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter's counts (a CPU)")
def test_check_bits_counts_what_the_notebook_asserts_on_the_cpu(small32, capsys):
    parity = _parity(small32)
    te_line = parity.check_bits(small32, ex.solution_te_combine)
    assert te_line["n"] == 0 and te_line["hist"] == {} and not bool(te_line["differ"].any())
    assert torch.equal(te_line["y"], small32.te)
    out = capsys.readouterr().out
    assert out.startswith("fp32 S=32 B=2 H=2 D=32, run here (CPU, Triton interpreter), vs "
                          "TE's stored output: 0 of 4,096 elements differ: bit for bit"), out
    # the interpreter rounds every product: the GPU's no-contraction row, bit for bit
    rounded = parity.check_bits(small32, as_written)
    assert rounded["n"] == tp.gpu_row(small32, "none_rn/table_te_fp32") == 990
    assert torch.equal(rounded["y"], small32.output("none_rn/table_te_fp32"))
    assert sum(rounded["hist"].values()) == 990
    assert "990 of 4,096 elements differ; fp32 steps apart -> count:" in capsys.readouterr().out
    assert parity.check_bits(small32, as_written, quiet=True)["n"] == 990
    assert capsys.readouterr().out == ""
    # run_kernel: the output rounded to the case's dtype, on the CPU
    y = parity.run_kernel(small32, ex.solution_te_combine)
    assert y.dtype == small32.x.dtype and y.device.type == "cpu" and torch.equal(y, small32.te)


@pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter's tl.cos (a CPU)")
def test_the_kernels_own_cos_and_sin_are_numpys_in_the_interpreter(small32):
    c, s = _parity(small32).kernel_cos_sin(small32, "tl", as_written)
    ang = small32.angles.numpy()
    assert torch.equal(c, torch.from_numpy(np.cos(ang))) and torch.equal(
        s, torch.from_numpy(np.sin(ang)))


@pytest.mark.skipif(runtime.on_gpu(), reason="off a GPU, a GPU's sources are read from the file")
def test_cos_sin_sources_on_the_cpu(small32):
    parity = _parity(small32)
    theta = small32.angles
    tables = {"table_cpu_fp32": (torch.cos(theta), torch.sin(theta)),
              "numpy": (torch.from_numpy(np.cos(theta.numpy())),
                        torch.from_numpy(np.sin(theta.numpy()))),
              "table_te_fp32": (small32.te_cos, small32.te_sin)}
    # a GPU's own sources: the committed run's counts, named as read from it
    for src in GPU_SOURCES:
        r = small32.sincos[src]
        assert parity.source_values(small32, src, tables, GPU_SOURCES, as_written) == (
            r["cos"]["n_differ"], r["sin"]["n_differ"], r["cos"]["numel"], "NVIDIA H200 run")
        nofuse = small32.rows.get(f"free_sub-nofuse/{src}")
        assert parity.source_outputs(small32, src, tables, GPU_SOURCES,
                                     (as_written, ex.solution_te_combine)) == (
            None if nofuse is None else nofuse["n_differ"], tp.gpu_row(small32, f"fma_xc/{src}"),
            "NVIDIA H200 run")
    # the tables any machine makes: measured here
    here = "here (CPU, Triton interpreter)"
    assert parity.source_values(small32, "table_te_fp32", tables, GPU_SOURCES, as_written) == \
        (0, 0, 32 * 16, here)
    n_cos, n_sin, n, where = parity.source_values(small32, "numpy", tables, GPU_SOURCES,
                                                  as_written)
    assert n == 32 * 16 and where == here and n_cos + n_sin > 0
    assert parity.source_outputs(small32, "table_te_fp32", tables, GPU_SOURCES,
                                 (as_written, ex.solution_te_combine)) == (990, 0, here)


@pytest.mark.skipif(runtime.on_gpu(), reason="the interpreter's counts (a CPU)")
def test_repro_bits_gives_the_notebooks_cpu_counts(small32):
    parity = _parity(small32)
    rounded = tp.gpu_row(small32, "none_rn/table_te_fp32")
    # TE's own cos/sin and TE's fma order: 0 on every machine
    assert parity.repro_bits(small32, use_fma=True) == 0
    # table and math in the input dtype (fp32 here), or an fp32 table: every product rounded
    assert parity.repro_bits(small32, use_fma=False, input_dtype_math=True) == rounded == 990
    assert parity.repro_bits(small32, use_fma=False) == rounded
    # the course's kernel by name gives what kernel=None gives
    assert parity.repro_bits(small32, use_fma=False, from_angles=True,
                             kernel=debug._rope_unsloth_repro_kernel) == \
        parity.repro_bits(small32, use_fma=False, from_angles=True) > 0
    assert small32.x.dtype == torch.float32       # repro_bits reads but never writes the case
    assert torch.equal(small32.x, debug.te_bits_inputs(small32.scenario)[0])


# --- the real TE, on a GPU ----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(debug.te_label("cuda") != "TE fused", reason="needs Transformer Engine")
def test_te_side_live_runs_the_real_te(bits, small32):
    side = tp.te_side(small32, "cuda", live=True)
    assert side["te"].device.type == side["cos"].device.type == "cpu"
    assert side["te"].dtype == small32.x.dtype and side["te"].shape == small32.x.shape
    same_arch = "{}.{}".format(*torch.cuda.get_device_capability()) == bits["meta"]["capability"]
    if same_arch:      # TE's sincosf, compiled as on the committed run's GPU: its bits
        assert torch.equal(side["cos"], small32.te_cos) and torch.equal(side["sin"], small32.te_sin)
        assert torch.equal(side["te"], small32.te)
    else:
        assert torch.allclose(side["te"], small32.te, **debug.tolerances("fp32"))
    parity = tp.TeParity(ex._rope_combine_kernel, {small32.key: side}, "cuda", sincos="tl",
                         here_name=torch.cuda.get_device_name(), te_where="TE run live",
                         reference_col="NVIDIA H200 run")
    # TE's own cos/sin and TE's fma order: TE's bits, against TE run now
    assert parity.check_bits(small32, ex.solution_te_combine, sincos="table", quiet=True)["n"] == 0
