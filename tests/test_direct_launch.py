"""The direct launcher (ropelib/kernels/direct.py) relies on Triton's compiled-kernel interface.
These checks run without a GPU: the installed Triton still has what it relies on, the launcher
keys compiled kernels by everything Triton specialises on, and it steps aside (to Triton's own
path) when it cannot be used. tests/test_rope_gpu.py compares its results with Triton's path."""
import inspect

import pytest
import torch
import triton

from ropelib.kernels import direct, launch
from ropelib.kernels.fused import _rope_kernel

POINTERS = launch.TOKENS.pointer_names


def test_installed_triton_has_the_interface():
    assert direct.supported(), f"triton {triton.__version__}: CompiledKernel.__getitem__ missing"
    assert direct.runner_is_thin(), f"triton {triton.__version__}: the runner calls its C " \
        "launcher differently; the direct launcher would fall back to the runner"


def _planned(positions, with_k=True):
    q, k = torch.randn(4, 2, 3, 8), torch.randn(4, 2, 1, 8)
    views = dict(k=launch.View.of(k), k_out=launch.View.of(torch.empty_like(k))) if with_k \
        else {}
    return launch.plan(launch.View.of(q), launch.View.of(torch.empty_like(q)),
                       launch.Table(torch.randn(8, 8), None), positions, R=8, interleaved=False,
                       backward=False, layout="sbhd", **views)


def _planned_qkv():
    qkv, q, k = torch.randn(4, 2, 2, 32), torch.randn(4, 2, 4, 8), torch.randn(4, 2, 2, 8)
    f = torch.randn(8, 8)
    return launch.plan_qkv(qkv, q, k, f, f, torch.tensor([0, 1]), heads_per_group=2,
                           interleaved=False, backward=False, cp_size=1, cp_rank=0)


@pytest.mark.parametrize("which", ["tokens", "ids", "packed", "qkv"])
def test_pointer_arguments_come_first_in_kernel_order(which):
    """Each finished kernel takes its pointers first, in its launcher's order, and the planner
    names every other parameter; none takes more than 34 arguments, nor binds more than 24 of
    them at a launch (the others are constexprs, X_FIRST and OUT_ROW among them, which ropelib's
    direct launch does not bind: the bound ones are what a launch costs the host)."""
    planned, pointers = {
        "tokens": lambda: _planned(launch.Positions(start=torch.tensor([0, 1]))),
        "ids": lambda: _planned(launch.Positions(position_ids=torch.zeros(1, 4, dtype=int))),
        "packed": lambda: _planned(launch.Positions(cu_seqlens=torch.tensor([0, 4])), with_k=False),
        "qkv": _planned_qkv}[which]()
    names = tuple(planned.launcher.kernel.arg_names)
    pointer_names = planned.launcher.pointer_names
    assert names[:len(pointer_names)] == pointer_names and len(pointers) == len(pointer_names)
    assert set(names[len(pointer_names):]) == set(planned.args)
    assert len(names) <= 34, (which, len(names))
    parameters = inspect.signature(planned.launcher.kernel.fn).parameters.values()
    bound = [p.name for p in parameters if "constexpr" not in str(p.annotation)]
    assert len(bound) <= 24, (which, bound)


def test_launch_key_covers_what_triton_specialises_on():
    """Equal Launches must mean the same compiled kernel: dtypes and device are part of it."""
    def planned(dtype):
        q = torch.randn(4, 2, 3, 8).to(dtype)
        out = torch.empty_like(q)
        return launch.plan(launch.View.of(q), launch.View.of(out),
                           launch.Table(torch.randn(8, 8), None), launch.Positions(), R=8,
                           interleaved=False, backward=False, layout="sbhd")[0]
    assert planned(torch.float16) != planned(torch.bfloat16)
    assert planned(torch.float16) == planned(torch.float16)
    assert hash(planned(torch.float16)) == hash(planned(torch.float16))


class _FakeKernel:
    """Stands in for a JITFunction: records how it was launched."""
    arg_names = list(inspect.signature(_rope_kernel.fn).parameters)

    def __init__(self, runner_takes_stream=True):
        self.calls = []
        self.takes_stream = runner_takes_stream

    def __getitem__(self, grid):
        kernel = self

        class Compiled:
            function, packed_metadata = "function", "packed"

            def run(self, g0, g1, g2, stream, function, packed, metadata, enter, exit_, *args):
                kernel.calls.append(("direct", args))

            def __getitem__(self, grid):
                if kernel.takes_stream:
                    return lambda *args, stream=None: kernel.calls.append(("direct", args))
                return lambda *args: kernel.calls.append(("direct", args))

        def run(**kwargs):
            kernel.calls.append(("triton", kwargs))
            return Compiled()
        return run


def _launch_twice(kernel, monkeypatch, thin=True):
    monkeypatch.setattr(direct, "current_stream", lambda index: 0)
    d = direct.DirectLauncher(kernel, POINTERS)
    d.enabled, d.thin = True, thin
    q = torch.randn(4, 2, 3, 8)
    out = torch.empty_like(q)
    planned, pointers = launch.plan(launch.View.of(q), launch.View.of(out),
                                    launch.Table(torch.randn(8, 8), None), launch.Positions(),
                                    R=8, interleaved=False, backward=False, layout="sbhd")
    d(planned, pointers)
    d(planned, pointers)
    return d


@pytest.mark.parametrize("thin", [True, False])
def test_second_launch_goes_direct_with_addresses_in_order(thin, monkeypatch):
    kernel = _FakeKernel()
    d = _launch_twice(kernel, monkeypatch, thin)
    assert [c[0] for c in kernel.calls] == ["triton", "direct"]
    args = kernel.calls[1][1]
    assert len(args) == len(kernel.arg_names)
    assert isinstance(args[0], int) and args[2] is None     # q's address; no k
    assert d.enabled


def test_steps_aside_when_the_runner_takes_no_stream(monkeypatch):
    kernel = _FakeKernel(runner_takes_stream=False)
    with pytest.warns(UserWarning, match="Triton's own path"):
        d = _launch_twice(kernel, monkeypatch, thin=False)
    assert not d.enabled
    assert [c[0] for c in kernel.calls] == ["triton", "triton"]


def test_steps_aside_while_a_launch_hook_is_installed(monkeypatch):
    """Triton's profiler hooks see every launch: then launches go through Triton's path."""
    def hook(*args, **kwargs):
        pass
    runtime = triton.knobs.runtime
    current = runtime.launch_enter_hook
    if hasattr(current, "add"):          # a chain of hooks (newer Triton)
        current.add(hook)
        undo = lambda: current.remove(hook)   # noqa: E731
    else:
        monkeypatch.setattr(runtime, "launch_enter_hook", hook)
        undo = lambda: None   # noqa: E731
    try:
        assert direct.hooks_installed()
        kernel = _FakeKernel()
        _launch_twice(kernel, monkeypatch)
        assert [c[0] for c in kernel.calls] == ["triton", "triton"]
    finally:
        undo()
    assert not direct.hooks_installed()


def test_start_refuses_a_pointer_tuple_of_the_wrong_length():
    """A tuple with a pointer too many is refused, not cut to the kernel's names (the
    interpreter would run it, the GPU's launcher would not)."""
    from ropelib.kernels import planning, qkv_gemm
    x = torch.zeros(4, 8)
    full = qkv_gemm.pointers("fwd", x_ptr=x)
    assert len(full) == len(qkv_gemm.FWD_POINTERS) and full[0] is x
    with pytest.raises(TypeError, match="takes 13 pointers"):
        planning.start(qkv_gemm.FWD, None, full + (None, None))
    with pytest.raises(TypeError, match="no pointer"):
        qkv_gemm.pointers("dx", x_ptr=x)


def test_start_refuses_a_launch_that_leaves_an_argument_unnamed():
    """The direct launch passes every argument after the pointers from the Launch, defaulted
    constexprs included: a Launch that leaves one to its default is a planner bug, refused in
    the interpreter too (where Triton would have filled in the default)."""
    from ropelib.kernels import launch, planning
    if not planning.INTERPRET:
        pytest.skip("checked through the interpreter's start")
    x = torch.randn(4, 1, 2, 16)
    y = torch.empty_like(x)
    route, _ = launch.plan_two_pass(launch.View.of(x), launch.View.of(y),
                                    launch.Table(torch.randn(4, 16), None), launch.Positions(),
                                    R=16, interleaved=False, backward=False, layout="sbhd",
                                    rows_kept=True)
    flat = route.rotate_pass
    assert flat.args["PAIRS_EQUAL"] is False        # named, though the kernel defaults it
    rows = route.new_rows(x.device)
    pointers = (x, y, None, None, rows[0], rows[1], None, rows[2])
    rows[2].zero_()
    planning.start(flat.launcher, flat, pointers)    # runs
    short = launch.Launch(flat.grid, flat.num_warps,
                          {k: v for k, v in flat.args.items() if k != "PAIRS_EQUAL"},
                          flat.dtypes, flat.device, flat.launcher)
    with pytest.raises(TypeError, match=r"names no \['PAIRS_EQUAL'\]"):
        planning.start(flat.launcher, short, pointers)
