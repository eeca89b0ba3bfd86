"""The two teaching kernel generations (naive, batch-reuse) against the plain-PyTorch reference.

Shapes are tiny: on the CPU every program instance costs a few ms in Triton's interpreter.
"""
import os
import re
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from ropelib import runtime  # noqa: E402
from ropelib.course.kernels import batch_reuse, naive  # noqa: E402
from ropelib.course.kernels.batch_reuse import rope_batch_reuse  # noqa: E402
from ropelib.course.kernels.naive import rope_naive  # noqa: E402
from ropelib.reference import rope_reference  # noqa: E402
from loading import learner_copy, load_file  # noqa: E402

DEVICE = runtime.default_device()
KERNELS = [rope_naive, rope_batch_reuse]
# (atol, rtol) against an fp64 reference rounded once: the kernels round once too, so they may
# differ by one unit in the last place where the fp32 and fp64 results straddle a rounding edge.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2),
       torch.float64: (1e-12, 1e-12)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def te_freqs(P, D, device=DEVICE):
    """TE-convention angles [P, 1, 1, D]: cat(f, f) with f = p * 10000^(-2i/D)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    f = torch.outer(torch.arange(P, dtype=torch.float32), inv)
    return torch.cat([f, f], dim=-1).view(P, 1, 1, D).to(device)


def poisoned_out(x):
    """An output buffer full of NaN: an element the kernel forgets to write stays NaN."""
    return torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)


def assert_matches(y, ref):
    atol, rtol = TOL[ref.dtype]
    assert not torch.isnan(y).any(), "an output element was not written (still NaN)"
    torch.testing.assert_close(y, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [16, 24, 64])  # 24: half = 12 is not a power of two (masked tile)
def test_forward_matches_reference(kernel, dtype, D):
    torch.manual_seed(0)
    S, B, H = 3, 2, 2
    x = torch.randn(S, B, H, D, device=DEVICE).to(dtype)
    freqs = te_freqs(S + 2, D)  # a table longer than the sequence (TE's "margin")
    x_before = x.clone()
    y = kernel(x, freqs, out=poisoned_out(x))
    assert torch.equal(x, x_before), "the kernel mutated its input"
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert_matches(y, rope_reference(x, freqs))
    # The default output (no out=) is the same.
    assert torch.equal(kernel(x, freqs), y)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_bf16_rounds_to_nearest_even(kernel):
    # One rounding to nearest even, as torch does: almost every element equals the fp32
    # reference rounded once (truncation, the interpreter's default cast, misses ~half).
    torch.manual_seed(6)
    x = torch.randn(4, 2, 2, 64, device=DEVICE, dtype=torch.bfloat16)
    freqs = te_freqs(4, 64)
    y = kernel(x, freqs)
    same = (y == rope_reference(x, freqs, compute_dtype=torch.float32)).float().mean().item()
    assert same > 0.97, f"only {same:.1%} of bf16 outputs match a round-to-nearest-even result"


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_head_dim_72_and_2d_freqs(kernel):
    # A real non-power-of-two head dim (half = 36 in a 64-wide tile), freqs given as [P, D].
    torch.manual_seed(1)
    x = torch.randn(2, 2, 1, 72, device=DEVICE, dtype=torch.bfloat16)
    freqs = te_freqs(4, 72).view(4, 72)
    assert_matches(kernel(x, freqs, out=poisoned_out(x)), rope_reference(x, freqs))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("view", ["bshd_transposed", "head_dim_strided", "freqs_strided"])
def test_arbitrary_strides(kernel, view):
    torch.manual_seed(2)
    S, B, H, D = 3, 2, 2, 16
    freqs = te_freqs(S, D)
    if view == "bshd_transposed":      # a [B, S, H, D] tensor seen as sbhd: no copy
        x = torch.randn(B, S, H, D, device=DEVICE).transpose(0, 1)
    elif view == "head_dim_strided":   # every other feature: stride 2 along D
        x = torch.randn(S, B, H, 2 * D, device=DEVICE)[..., ::2]
    else:                              # a non-contiguous table: stride 2 along D
        x = torch.randn(S, B, H, D, device=DEVICE)
        freqs = torch.randn(S, 1, 1, 2 * D, device=DEVICE)[..., ::2]
    assert not x.is_contiguous() or view == "freqs_strided"
    y = kernel(x, freqs, out=poisoned_out(x))
    assert_matches(y, rope_reference(x, freqs))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("table", ["te", "per_feature"])
def test_backward_is_autograd_of_reference(kernel, table):
    # backward=True must be the exact transpose, i.e. what autograd finds for the reference.
    # "per_feature": random angles whose halves differ, so the transpose is not just -theta
    # with the same table; the kernel must still be exact.
    torch.manual_seed(3)
    S, B, H, D = 3, 2, 2, 24
    freqs = te_freqs(S, D) if table == "te" else torch.randn(S, 1, 1, D, device=DEVICE) * 3
    x = torch.randn(S, B, H, D, device=DEVICE, dtype=torch.float64, requires_grad=True)
    g = torch.randn(S, B, H, D, device=DEVICE, dtype=torch.float64)
    (gx_ref,) = torch.autograd.grad(rope_reference(x, freqs), x, g)
    g32 = g.float()
    gx = kernel(g32, freqs, backward=True, out=poisoned_out(g32))
    assert_matches(gx, gx_ref.float())


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_backward_undoes_forward(kernel):
    # R(theta)^T R(theta) = I: backward(forward(x)) == x, in fp64 to machine precision.
    torch.manual_seed(4)
    x = torch.randn(3, 2, 2, 16, device=DEVICE, dtype=torch.float64)
    freqs = te_freqs(3, 16)
    back = kernel(kernel(x, freqs), freqs, backward=True)
    torch.testing.assert_close(back, x, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_stride0_grad_output(kernel):
    # grad_output of `y.sum()` or of an expand is stride-0 ("overlapping"): read it as it is.
    S, B, H, D = 3, 2, 2, 16
    freqs = te_freqs(S, D)
    g = torch.randn(S, 1, H, D, device=DEVICE).expand(S, B, H, D)
    assert g.stride(1) == 0
    gx = kernel(g, freqs, backward=True, out=poisoned_out(g))
    x = torch.zeros(S, B, H, D, device=DEVICE, dtype=torch.float64, requires_grad=True)
    (gx_ref,) = torch.autograd.grad(rope_reference(x, freqs), x, g.double())
    assert_matches(gx, gx_ref.float())


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_gradcheck_float64(kernel):
    # A float64 autograd.Function around the kernel passes torch.autograd.gradcheck.
    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, freqs):
            ctx.save_for_backward(freqs)
            return kernel(x, freqs)

        @staticmethod
        def backward(ctx, gy):
            (freqs,) = ctx.saved_tensors
            return kernel(gy, freqs, backward=True), None

    freqs = torch.randn(2, 1, 1, 8, device=DEVICE)
    x = torch.randn(2, 1, 1, 8, device=DEVICE, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Rope.apply, (x, freqs), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_in_place(kernel):
    x = torch.randn(2, 2, 1, 16, device=DEVICE)
    freqs = te_freqs(2, 16)
    ref = rope_reference(x, freqs)
    y = kernel(x, freqs, out=x)
    assert y is x
    assert_matches(x, ref)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_num_warps_does_not_change_the_result(kernel):
    x = torch.randn(2, 2, 1, 16, device=DEVICE)
    freqs = te_freqs(2, 16)
    assert torch.equal(kernel(x, freqs, num_warps=1), kernel(x, freqs, num_warps=4))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_empty_input(kernel):
    x = torch.randn(0, 2, 1, 16, device=DEVICE)
    assert kernel(x, te_freqs(1, 16)).shape == x.shape


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("case, exc, words", [
    ("x_not_tensor", TypeError, "x must be a torch.Tensor"),
    ("freqs_not_tensor", TypeError, "freqs must be a torch.Tensor"),
    ("x_3d", ValueError, "x must be 4-D"),
    ("x_int", TypeError, "x must be float16"),
    ("odd_D", ValueError, "must be even"),
    ("D_too_big", ValueError, "must be even and in"),
    ("freqs_fp16", TypeError, "freqs must be float32"),
    ("freqs_3d", ValueError, "freqs must be [P, 1, 1, D] or [P, D]"),
    ("freqs_wrong_D", ValueError, "freqs' last dim must equal"),
    ("freqs_short", ValueError, "freqs.shape[0] must be >= S"),
    ("out_wrong_dtype", ValueError, "out must have x's shape"),
    ("out_strided", ValueError, "out must be contiguous"),
    ("out_expanded", ValueError, "out must be contiguous"),
    ("out_overlaps", ValueError, "out overlaps x"),
])
def test_bad_input_is_rejected(kernel, case, exc, words):
    x = torch.randn(3, 1, 1, 8, device=DEVICE)
    freqs = te_freqs(3, 8)
    kw = {}
    if case == "x_not_tensor":
        x = x.tolist()
    elif case == "freqs_not_tensor":
        freqs = freqs.tolist()
    elif case == "x_3d":
        x = x[0]
    elif case == "x_int":
        x = x.to(torch.int32)
    elif case == "odd_D":
        x = torch.randn(3, 1, 1, 7, device=DEVICE)
    elif case == "D_too_big":
        x, freqs = torch.randn(1, 1, 1, 514, device=DEVICE), te_freqs(1, 514)
    elif case == "freqs_fp16":
        freqs = freqs.half()
    elif case == "freqs_3d":
        freqs = freqs.view(3, 1, 8)
    elif case == "freqs_wrong_D":
        freqs = te_freqs(3, 4)
    elif case == "freqs_short":
        freqs = te_freqs(2, 8)
    elif case == "out_wrong_dtype":
        kw["out"] = torch.empty(x.shape, device=DEVICE, dtype=torch.float16)
    elif case == "out_strided":
        kw["out"] = torch.empty(3, 1, 1, 16, device=DEVICE)[..., ::2]
    elif case == "out_expanded":      # stride 0: several programs would write one element
        kw["out"] = torch.empty(3, 1, 1, 8, device=DEVICE).expand(3, 2, 1, 8)
        x = torch.randn(3, 2, 1, 8, device=DEVICE)
    elif case == "out_overlaps":
        big = torch.randn(4, 1, 1, 8, device=DEVICE)
        x, kw["out"] = big[:3], big[1:]
    with pytest.raises(exc, match=re.escape(words)):
        kernel(x, freqs, **kw)


@pytest.mark.skipif(runtime.INTERPRET or not torch.cuda.is_available(), reason="needs a CPU "
                    "tensor refused without the interpreter, i.e. a compiled (GPU) session")
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_cpu_tensor_without_interpreter_is_rejected(kernel):
    with pytest.raises(ValueError, match="interpreter"):
        kernel(torch.randn(1, 1, 1, 8), te_freqs(1, 8, device="cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.on_gpu(), reason="needs a CUDA GPU (compiled kernels)")
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("D", [64, 80, 128, 256])
def test_gpu_large_bf16(kernel, D):
    # Full-size positions: long tables stress the in-kernel sin/cos range reduction.
    torch.manual_seed(5)
    S, B, H = 4096, 2, 8
    x = torch.randn(S, B, H, D, device="cuda", dtype=torch.bfloat16)
    freqs = te_freqs(S, D, device="cuda")
    y = kernel(x, freqs, out=poisoned_out(x))
    assert_matches(y, rope_reference(x, freqs, compute_dtype=torch.float64))
    g = torch.randn_like(x)
    xg = x.double().requires_grad_()
    (gx_ref,) = torch.autograd.grad(rope_reference(xg, freqs), xg, g.double())
    assert_matches(kernel(g, freqs, backward=True), gx_ref.to(torch.bfloat16))


# --- the exercise checks of notebooks 03-06 (ropelib.course.exercises.kernels) ----------------------

def _wrong_function(x, freqs):
    # The forward where the backward is asked for; for notebook 03's interleaved exercise, a plain
    # function where a @triton.jit kernel is asked for (tests/test_exercises_naive.py: the rest).
    return rope_naive(x.contiguous(), freqs.reshape(freqs.shape[0], 1, 1, -1))


class _SavesX(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, freqs):
        ctx.save_for_backward(x, freqs)
        return rope_naive(x, freqs)

    @staticmethod
    def backward(ctx, gy):
        _, freqs = ctx.saved_tensors
        return rope_naive(gy, freqs, backward=True), None


def _own_rope_backward_and_function():
    """A learner's launcher of their own backward kernel, and a Function using it."""
    import triton

    from ropelib.course.exercises import backward_kernel as bk
    kernel = learner_copy(bk._rope_backward_solution_kernel)

    def my_rope_backward(grad_y, freqs):
        S, B, H, D = grad_y.shape
        R = freqs.shape[-1]
        f2 = freqs.reshape(freqs.shape[0], R)[:S].float().contiguous()
        grad_x = torch.empty(grad_y.shape, dtype=grad_y.dtype, device=grad_y.device)
        kernel[(S, H)](grad_y, grad_x, f2, B, *grad_y.stride(), grad_x.stride(0),
                       grad_x.stride(1), grad_x.stride(2), D, ROT_HALF=R // 2,
                       BLOCK_HALF=triton.next_power_of_2(R // 2),
                       BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)))
        return grad_x

    class MyRope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, freqs):
            ctx.save_for_backward(freqs)
            return my_rope_backward(x, -freqs)      # the own backward kernel at -theta

        @staticmethod
        def backward(ctx, grad_y):
            (freqs,) = ctx.saved_tensors
            return my_rope_backward(grad_y, freqs), None
    return my_rope_backward, MyRope


def _exercise_cases():
    """(check, a learner's own answer, the worked solution, a wrong answer) per exercise."""
    from ropelib.course.exercises import kernels as ex
    own_backward, own_function = _own_rope_backward_and_function()
    return [
        ("check_naive_grid", learner_copy(ex.solution_naive_grid), ex.solution_naive_grid,
         lambda S, B, H: (S, B * H)),
        ("check_half_tile", learner_copy(ex.solution_half_tile), ex.solution_half_tile,
         lambda D: (D // 2, D // 2, 0)),
        ("check_row_index", learner_copy(ex.solution_row_index), ex.solution_row_index,
         lambda r, S, B, H: (r // (B * H), r % B, r % H)),
        ("check_rope_interleaved", learner_copy(ex.solution_rope_interleaved),
         ex.solution_rope_interleaved, _wrong_function),
        ("check_angle_bytes", learner_copy(ex.solution_angle_bytes), ex.solution_angle_bytes,
         lambda g, S, B, H, D: S * D * 4),
        ("check_floor_ms", learner_copy(ex.solution_floor_ms), ex.solution_floor_ms,
         lambda n, gbps: n / gbps),
        ("check_percent_of_copy", learner_copy(ex.solution_percent_of_copy),
         ex.solution_percent_of_copy, lambda k, c: 100 * k / c),
        ("check_backward_matrix", learner_copy(ex.solution_backward_matrix),
         ex.solution_backward_matrix, lambda t: torch.tensor([[1.0, 0.0], [0.0, 1.0]])),
        ("check_rope_backward", own_backward, ex.solution_rope_backward, _wrong_function),
        ("check_rope_function", own_function, ex.SolutionRopeFunction, _SavesX),
    ]


@pytest.mark.parametrize("i", range(10))
def test_exercise_check_accepts_own_answer_and_rejects_worked_and_wrong(i, capsys):
    from ropelib.course.exercises import kernels as ex
    name, own, worked, wrong = _exercise_cases()[i]
    checker = getattr(ex, name)
    assert checker(own) is True, capsys.readouterr().out
    assert "✅" in capsys.readouterr().out
    assert checker(worked) is False        # the worked solution is ropelib's, not the learner's
    assert "ropelib's" in capsys.readouterr().out
    assert checker(wrong) is False
    assert checker(...) is False  # unanswered: a ❌ line, never an exception
    assert "❌" in capsys.readouterr().out


# the helper in ropelib that computes the very thing each exercise asks for
_LIBRARY_ANSWERS = {
    "check_naive_grid": lambda S, B, H: naive.naive_grid(S, B, H),
    "check_half_tile": lambda D: (*naive.half_tile(D), naive.half_tile(D)[1] - naive.half_tile(D)[0]),
    "check_angle_bytes": lambda g, S, B, H, D: (naive if g == "naive" else batch_reuse)
    .angle_bytes_requested(S, B, H, D),
}


@pytest.mark.parametrize("name", list(_LIBRARY_ANSWERS))
def test_exercise_check_refuses_the_teaching_kernels_helper(name, capsys):
    from ropelib.course.exercises import kernels as ex
    assert getattr(ex, name)(_LIBRARY_ANSWERS[name]) is False
    out = capsys.readouterr().out
    assert "but the answer called ropelib's" in out and "ropelib/course/kernels/" in out, out


def test_percent_of_copy_is_a_ratio_of_times(capsys):
    """% of a copy is the copy's time over the kernel's: a ratio of GB/s from the bytes model
    (the fp32 angles counted for the kernel, not for the copy) is refused."""
    from ropelib.course.exercises import kernels as ex

    def by_gbps(kms, cms, S=16384, B=8, H=32, D=128, elem=2):
        x_bytes = S * B * H * D * elem
        return 100 * ((2 * x_bytes + 4 * S * D) / kms) / (2 * x_bytes / cms)

    assert ex.check_percent_of_copy(by_gbps) is False
    assert "❌" in capsys.readouterr().out
    assert ex.check_percent_of_copy(lambda kms, cms: 100 * cms / kms) is True
    # a kernel faster than its copy is above 100, as notebook 04's section 5.1 prints
    assert ex.solution_percent_of_copy(0.0364, 0.0369) > 100


def test_percent_of_copy_refuses_the_notebooks_own_definition(monkeypatch, capsys):
    """Notebook 04's cells take % of a copy from benchmarks/generations.py's `pct_of_copy`
    (imported as `generations`); exercise 3 asks for the formula, so an answer that hands the
    two times to that function is refused, and the same formula typed out passes."""
    from pathlib import Path

    from ropelib.course.exercises import kernels as ex
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "generations.py"
    generations = load_file("generations", script)
    monkeypatch.setitem(sys.modules, "generations", generations)   # as the notebook imports it

    def via_generations(kms, cms):
        return generations.pct_of_copy({"copy_fwd_ms": cms, "fwd_ms": kms})

    assert ex.check_percent_of_copy(via_generations) is False
    out = capsys.readouterr().out
    assert "❌" in out and "pct_of_copy (generations.py)" in out, out
    assert ex.check_percent_of_copy(lambda kms, cms: 100.0 * cms / kms) is True
    assert generations.pct_of_copy({"copy_fwd_ms": 0.6, "fwd_ms": 0.8}) == \
        ex.solution_percent_of_copy(0.8, 0.6)   # one definition, the same number
