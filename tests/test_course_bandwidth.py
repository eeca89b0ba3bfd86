"""ropelib.course.kernel_bandwidth: notebook 02's per-kernel table, on plain inputs.

The notebook builds the table from a GPU profile; here the profile is synthetic (names and
microseconds as a profiler reports them), so the matching, the arithmetic and the refusals run
on the CPU."""
from types import SimpleNamespace

import pytest

from ropelib.course import kernel_bandwidth as kb

# kernel names as torch.profiler reports them for reference.te_unfused's forward on a GPU
NAMES = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::cos_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::cos_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)",  # noqa: E501
    "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul>)",  # noqa: E501
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})",  # noqa: E501
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1})",  # noqa: E501
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",  # noqa: E501
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",  # noqa: E501
]
OPS = [("cos", 4_000_000, 4_000_000), ("_to_copy", 4_000_000, 2_000_000),
       ("mul", 130_000_000, 128_000_000), ("neg", 64_000_000, 64_000_000),
       ("cat", 128_000_000, 128_000_000), ("add", 256_000_000, 128_000_000)]


def _event(name, start, us, device="CUDA"):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device),
                           time_range=SimpleNamespace(start=start, elapsed_us=lambda: us))


def test_short_names_say_which_op_the_kernel_is():
    assert [kb.short_name(n) for n in NAMES] == [
        "cos_kernel_cuda", "bfloat16_copy_kernel_cuda", "MulFunctor", "neg_kernel_cuda",
        "CatArrayBatchedCopy", "CUDAFunctor_add"]
    assert kb.short_name("_rope_rows_kernel") == "_rope_rows_kernel"
    assert kb.short_name("void " + "x" * 100, width=10) == "x" * 10


def test_device_kernels_keeps_gpu_events_in_start_order():
    events = [_event(NAMES[1], 20.0, 3.0), _event("aten::cos", 0.0, 9.0, device="CPU"),
              _event(NAMES[0], 10.0, 2.0), _event("Memset (Device)", 5.0, 1.0),
              _event("Memcpy DtoD (Device -> Device)", 30.0, 60.0)]
    assert kb.device_kernels(events) == [(NAMES[0], 2.0), (NAMES[1], 3.0)]
    assert kb.device_kernels(events, skip=("Memset",))[-1] == ("Memcpy DtoD (Device -> Device)",
                                                               60.0)


def test_device_kernels_reads_real_profiler_events():
    """The attributes it reads are those of torch.profiler's events (here a CPU profile)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.cos(x)
        torch.sin(x)
    assert kb.device_kernels(prof.events()) == []                    # no GPU here
    cpu = kb.device_kernels(prof.events(), device="CPU")
    names = [n for n, _ in cpu]
    assert names.index("aten::cos") < names.index("aten::sin")
    assert all(us >= 0 for _, us in cpu)


def test_table_means_over_repeats_and_divides_bytes_by_time():
    repeats = 3
    us = [2.0, 2.0, 50.0, 40.0, 100.0, 100.0]
    # the second repeat runs every kernel 3 us slower, the third 3 us faster: the mean is `us`
    kernels = [(NAMES[i], us[i] + d) for d in (0.0, 3.0, -3.0) for i in range(len(OPS))]
    copy = 4000.0
    rows = kb.kernel_table(kernels, OPS, repeats, copy)
    assert [r.op for r in rows] == [op for op, _, _ in OPS]
    assert [r.kernel for r in rows][2] == "MulFunctor"
    for r, t, (_, read, written) in zip(rows, us, OPS):
        assert r.us == pytest.approx(t)
        assert r.nbytes == read + written
        assert r.gbps == pytest.approx((read + written) / (t * 1e-6) / 1e9)
        assert r.of_copy == pytest.approx(r.gbps / copy)
    # cos 8 MB in 2 us: 4000 GB/s, a copy's; _to_copy 6 MB in 2 us: 75%; mul 258 MB in 50 us:
    # 129%; neg 128 MB in 40 us: 80%; cat 256 MB in 100 us: 64%; add 384 MB in 100 us: 96%
    assert [round(r.of_copy, 2) for r in rows] == [1.0, 0.75, 1.29, 0.8, 0.64, 0.96]
    assert kb.below(rows, 0.5) == []
    assert [(i, r.op) for i, r in kb.below(rows, 0.7)] == [(4, "cat")]
    assert [(i, r.op) for i, r in kb.below(rows, 0.8)] == [(1, "_to_copy"), (4, "cat")]  # 80%: not
    assert kb.us_at_copy_speed(rows, copy) == pytest.approx(
        sum(r + w for _, r, w in OPS) / (copy * 1e9) * 1e6)


def test_the_printed_table_shows_each_kernel_and_the_copy():
    kernels = [(NAMES[i], 10.0) for i in range(len(OPS))]
    rows = kb.kernel_table(kernels, OPS, 1, 1000.0)
    text = kb.format_table(rows, 1000.0)
    lines = text.splitlines()
    assert len(lines) == 1 + len(OPS) + 2
    assert "of copy" in lines[0] and "GB/s" in lines[0] and "us" in lines[0]
    assert lines[3].split()[:3] == ["2", "mul", "MulFunctor"]
    assert lines[3].split()[-2:] == ["25800", "2580%"]               # 258 MB in 10 us
    assert lines[-2].split()[0] == "all" and lines[-1].split()[0] == "copy"
    assert lines[-1].split()[-2:] == ["1000", "100%"]


def test_a_count_that_does_not_match_is_refused_by_name():
    kernels = [(NAMES[i], 1.0) for i in range(len(OPS))] * 2
    with pytest.raises(ValueError, match=r"saw 11 GPU kernels for 2 runs of 6 ops \(12 expected\)"):
        kb.kernel_table(kernels[:-1], OPS, 2, 1000.0)
    with pytest.raises(ValueError, match="cannot be matched"):
        kb.kernel_table(kernels + [("extra", 1.0)], OPS, 2, 1000.0)
    with pytest.raises(ValueError, match=r"saw 6 GPU kernels for 2 runs"):
        kb.kernel_table(kernels[:6], OPS, 2, 1000.0)                # one run where two ran
    with pytest.raises(ValueError, match=r"for 1 runs of 0 ops"):
        kb.kernel_table(kernels[:6], [], 1, 1000.0)
    assert len(kb.kernel_table(kernels, OPS, 2, 1000.0)) == len(OPS)


def test_a_kernel_that_changes_between_runs_is_refused():
    first = [(NAMES[i], 1.0) for i in range(len(OPS))]
    second = list(first)
    second[2], second[3] = second[3], second[2]      # same count, another order
    with pytest.raises(ValueError, match=r"kernel 2 \(op mul\) differs between runs"):
        kb.kernel_table(first + second, OPS, 2, 1000.0)


def test_a_copy_is_one_event_per_run():
    memcpy = [("Memcpy DtoD (Device -> Device)", 66.0), ("Memcpy DtoD (Device -> Device)", 70.0)]
    assert kb.mean_us(memcpy, 2, "copy") == pytest.approx(68.0)
    with pytest.raises(ValueError, match="copy: the profiler saw 1 GPU events for 2 runs"):
        kb.mean_us(memcpy[:1], 2, "copy")


def test_the_ratio_splits_into_factors_whose_product_is_the_timed_ratio():
    # an H200-like chain: 10 kernels, 1.6 GB in 896 us; the copy at 4156 GB/s; fused 270 MB
    rows = [kb.KernelRow(op="mul", kernel="k", us=89.6, nbytes=160_000_000, gbps=0.0,
                         of_copy=0.0) for _ in range(10)]
    f = kb.ratio_factors(900.7, 69.6, rows, 270_000_000, 4156.0)
    product = 1.0
    for v in f.values():
        product *= v
    assert product == pytest.approx(900.7 / 69.6, rel=1e-12)
    assert f["bytes, unfused over fused"] == pytest.approx(1.6e9 / 2.7e8)
    assert f["kernels below the copy's bandwidth"] == pytest.approx(896 / (1.6e9 / 4156 / 1e3))
    assert f["time outside the kernels (launch gaps)"] == pytest.approx(900.7 / 896)
    assert f["the fused kernel against a copy"] == pytest.approx(2.7e8 / 4156 / 1e3 / 69.6)
    with pytest.raises(ValueError):
        kb.ratio_factors(0.0, 69.6, rows, 270_000_000, 4156.0)


CAT_VECTORIZED_NAME = "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 128, 1, 16, 8>(char*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)"  # noqa: E501


def test_kernel_kind_reads_the_template_from_the_name():
    assert [kb.kernel_kind(n) for n in NAMES] == [
        kb.VECTORIZED, kb.VECTORIZED, kb.NOT_VECTORIZED, kb.NOT_VECTORIZED,
        kb.CAT_NOT_VECTORIZED, kb.VECTORIZED]
    assert kb.kernel_kind(CAT_VECTORIZED_NAME) == kb.CAT_VECTORIZED
    assert kb.kernel_kind("_rope_rows_kernel") == "other"
    assert kb.kernel_kind("void at::native::unrolled_elementwise_kernel<foo>(int)") == "other"
    assert kb.kernel_kind("Memcpy DtoD (Device -> Device)") == "other"


def test_rows_summed_by_kind():
    names = NAMES + [CAT_VECTORIZED_NAME]
    ops = OPS + [("cat", 128_000_000, 128_000_000)]
    us = [2.0, 2.0, 200.0, 100.0, 300.0, 96.0, 64.0]
    copy = 4000.0
    rows = kb.kernel_table(list(zip(names, us)), ops, 1, copy)
    assert [r.kind for r in rows] == [kb.VECTORIZED, kb.VECTORIZED, kb.NOT_VECTORIZED,
                                      kb.NOT_VECTORIZED, kb.CAT_NOT_VECTORIZED, kb.VECTORIZED,
                                      kb.CAT_VECTORIZED]
    kinds = kb.by_kind(rows, copy)
    assert list(kinds) == [kb.VECTORIZED, kb.NOT_VECTORIZED, kb.CAT_NOT_VECTORIZED,
                           kb.CAT_VECTORIZED]                         # first appearance
    v = kinds[kb.VECTORIZED]
    assert v.rows == [0, 1, 5] and v.ops == ["cos", "_to_copy", "add"]
    assert v.us == pytest.approx(100.0) and v.nbytes == 8_000_000 + 6_000_000 + 384_000_000
    assert v.gbps == pytest.approx(398_000_000 / 100e-6 / 1e9) and v.of_copy == pytest.approx(0.995)
    assert v.over_copy_us == pytest.approx(100.0 - 398_000_000 / 4000e9 * 1e6)
    plain = kinds[kb.NOT_VECTORIZED]
    assert plain.ops == ["mul", "neg"] and plain.us == pytest.approx(300.0)
    assert plain.of_copy == pytest.approx(386_000_000 / 300e-6 / 1e9 / copy)
    # the kinds' time over copy speed adds up to the table's
    assert sum(g.over_copy_us for g in kinds.values()) == pytest.approx(
        sum(r.us for r in rows) - kb.us_at_copy_speed(rows, copy))
    text = kb.format_kinds(kinds).splitlines()
    assert len(text) == 1 + len(kinds) and "of copy" in text[0]
    assert text[1].split()[:4] == ["elementwise,", "vectorized", "0,1,5", "100.0"]
    # a row made by hand, without a kind, counts as "other"
    bare = kb.KernelRow(op="mul", kernel="k", us=1.0, nbytes=4000, gbps=4.0, of_copy=0.001)
    assert list(kb.by_kind([bare], copy)) == ["other"]


def test_rows_written_and_read_back(tmp_path):
    """Notebook 02 keeps a GPU run's table as a CSV for machines without a GPU: every field and
    the measured numbers come back as written; a file without them is refused by name."""
    rows = [kb.KernelRow("mul", "vectorized_elementwise", 89.6, 160_000_000, 1785.7, 0.41,
                         kb.VECTORIZED),
            kb.KernelRow("cat", "CatArrayBatchedCopy", 12.5, 8_000_000, 640.0, 0.15,
                         kb.CAT_NOT_VECTORIZED)]
    path = tmp_path / "02-unfused-kernels.csv"
    kb.write_rows(path, rows, copy_gbps=4300.0, unfused_us=812.5, fused_us=160.25,
                  fused_bytes=268_435_456, repeats=5, gpu="NVIDIA H200", versions="torch 2.11")
    back, measured = kb.read_rows(path)
    assert back == rows
    assert measured["copy_gbps"] == 4300.0 and measured["fused_bytes"] == 268_435_456
    assert measured["gpu"] == "NVIDIA H200" and measured["repeats"] == "5"
    with pytest.raises(ValueError, match="fused_us"):
        kb.write_rows(path, rows, copy_gbps=1.0, unfused_us=1.0, fused_bytes=1)


def test_no_bandwidth_from_a_zero_time():
    with pytest.raises(ValueError, match="no bandwidth"):
        kb.gbps(1000, 0.0)
    assert kb.gbps(4e9, 1e6) == pytest.approx(4.0)                  # 4 GB in a second


# --- notebook 13: the worked solutions' ⏱ lines (ropelib.course.puzzles.time_solution) -------
#
# On the CPU time_solution only says that timing needs a GPU. Its GPU path is run here in the
# interpreter on a puzzle's small CPU cases, with the CUDA calls and do_bench stood in for, so
# that everything but the compiled launch and the real timer runs before a GPU sees it.

import inspect  # noqa: E402
import textwrap  # noqa: E402

import torch  # noqa: E402

from loading import puzzles_built_on_the_cpu, written_module  # noqa: E402
from ropelib.course import puzzles as pz  # noqa: E402

KERNEL_US, COPY_US = 20.0, 10.0


@pytest.fixture
def fake_gpu(gpu_stand_in, monkeypatch):
    """A GPU stood in for (conftest's gpu_stand_in); every puzzle's cases (and its timed case)
    built on the CPU; do_bench returns 20 us for the kernel and 10 us for the copy (20 us for
    its even calls, 10 for its odd ones)."""
    benched = gpu_stand_in(lambda k: (COPY_US if k % 2 else KERNEL_US) / 1e3).calls
    monkeypatch.setattr(pz, "_SOLUTION_TIMES", {})
    monkeypatch.setattr(pz, "_COPY_ROUNDS", {})
    puzzles_built_on_the_cpu(monkeypatch, pz)
    return benched


def test_worked_solution_timing_on_the_cpu_says_it_needs_a_gpu(capsys):
    if pz.runtime.on_gpu():
        pytest.skip("on a GPU the worked solutions are timed")
    assert pz.time_solution("shared_table") is None
    assert "⏱ worked solution of puzzle 9: timing needs a GPU (" in capsys.readouterr().out
    assert "shared_table" not in pz.solution_times()


def test_worked_solution_is_timed_and_labelled(fake_gpu, capsys):
    before = dict(pz._RESULTS)
    t = pz.time_solution("shared_table")
    out = capsys.readouterr().out
    assert isinstance(t, pz.Timing) and len(fake_gpu) == 1 + pz.COPY_ROUNDS   # kernel, copies
    # the copy's rounds alternate 10, 20, 10, ... us in this stand-in: their median is 10
    assert (t.us, t.copy_us, t.of_copy) == (KERNEL_US, COPY_US, 0.5)
    assert t.copy_spread == KERNEL_US / COPY_US - 1
    assert t.label == "x [5, 4, 16]" and t.gpu == "a CPU standing in" and t.nbytes > 0
    assert out.startswith("   ⏱ worked solution of puzzle 9 (the time to aim for), "
                          "a CPU standing in, x [5, 4, 16]: 20.0 us for ")
    assert "a device copy of the same bytes 10.0 us: 50% of copy speed" in out
    assert pz.solution_times() == {"shared_table": t}
    assert pz._RESULTS == before                     # timing a solution grades nothing


def test_one_copy_timing_per_byte_size_is_reused(fake_gpu, capsys):
    first = pz.time_solution("shared_table")
    again = pz.time_kernel("shared_table", pz.given_shared_table_kernel, "the given kernel")
    other = pz.time_solution("position_ids")          # other bytes: a copy of its own
    capsys.readouterr()
    assert first.nbytes == again.nbytes != other.nbytes
    assert again.copy_us == first.copy_us and again.copy_spread == first.copy_spread
    assert len(fake_gpu) == 1 + pz.COPY_ROUNDS + 1 + 1 + pz.COPY_ROUNDS   # copies timed twice
    assert len(pz._COPY_ROUNDS) == 2


def test_every_timed_puzzle_times_its_worked_solution(fake_gpu, capsys):
    timed = [k for k, p in pz.PUZZLES.items() if p.big is not None]
    assert len(timed) == 11 and "rotate_row" not in timed           # what notebook 13 states
    for key in reversed(timed):
        assert pz.time_solution(key) is not None, capsys.readouterr().out
    assert list(pz.solution_times()) == timed                        # in puzzle order
    assert "❌" not in capsys.readouterr().out
    assert pz.time_solution("rotate_row") is None
    assert "puzzle 1: not timed: one program on one row" in capsys.readouterr().out


def test_a_solution_that_fails_on_the_gpu_or_raises_is_named_not_timed(fake_gpu, monkeypatch,
                                                                         capsys):
    monkeypatch.setattr(pz, "_compiled_problem", lambda p, kernel, seed: ("x [5, 4, 16]", "wrong"))
    assert pz.time_solution("shared_table") is None
    assert ("❌ worked solution of puzzle 9: not timed, the compiled solution is wrong on the "
            "GPU (x [5, 4, 16]: wrong)") in capsys.readouterr().out
    monkeypatch.setattr(pz, "_compiled_problem", lambda p, kernel, seed: None)

    def out_of_memory(p, kernel):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(pz, "_time_big", out_of_memory)
    assert pz.time_solution("shared_table") is None
    assert "could not be timed (RuntimeError: CUDA out of memory)" in capsys.readouterr().out
    assert pz.solution_times() == {}


def test_a_learners_right_answer_gets_the_same_line_as_before(fake_gpu, tmp_path, capsys):
    fn = pz.solution_shared_table_kernel.fn
    src = textwrap.dedent(inspect.getsource(fn)).replace(f"def {fn.__name__}(",
                                                         "def my_shared_table_kernel(", 1)
    mine = written_module("learner", tmp_path / "learner.py",
                          "import triton\nimport triton.language as tl\n\n\n"
                          + src).my_shared_table_kernel
    assert pz.check_shared_table(mine, seed=0, draw=False) is True
    out = capsys.readouterr().out
    assert "   ⏱ a CPU standing in, x [5, 4, 16]: your kernel 20.0 us for " in out
    assert "a device copy of the same bytes 10.0 us: 50% of copy speed (median of do_bench)" in out
    assert pz.check_shared_table(pz.solution_shared_table_kernel, seed=0, draw=False) is False
