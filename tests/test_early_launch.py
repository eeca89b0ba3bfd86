"""The two-pass route's flat pass launched early (programmatic dependent launch, sm_90+).

Planned early only after a pre-pass, only where the device can (never in the interpreter, on the
CPU, or below compute capability 9.0), and then with the kernel's wait compiled in; a launch
traced by torch.compile never asks Triton for the early launch. On a GPU of compute capability
9.0 or more, the early launch gives the bits of the ordinary one, also under a CUDA graph.
"""
import pytest
import torch

import ropelib
from ropelib import eager
from ropelib.kernels import launch, planning, tiles
from ropelib.runtime import on_gpu
from routes import thresholds  # noqa: E402  (tests/routes.py)


def _two_pass(device, *, table_from_angles=True):
    x = torch.empty(6, 3, 4, 16, device=device)
    freqs = ropelib.rope_freqs(8, 16, device=device)[:, 0, 0]       # [P, R] angles
    table = launch.Table(freqs, None) if table_from_angles else launch.Table(freqs.cos(),
                                                                             freqs.sin())
    saved = thresholds(0, 0)
    try:
        route, _ = launch.plan(launch.View.of(x), launch.View.of(torch.empty_like(x)), table,
                               launch.Positions(), R=16, interleaved=False, backward=False,
                               layout="sbhd")
    finally:
        thresholds(*saved)
    assert isinstance(route, launch.TwoPass)
    return route


def test_planned_early_only_after_a_pre_pass(monkeypatch):
    monkeypatch.setattr(launch, "launches_early", lambda device: True)
    route = _two_pass("cpu")
    assert route.table_pass is not None and route.table_pass.args["EARLY_DEPENDENTS"]
    assert route.rotate_pass.early and route.rotate_pass.args["WAIT_PRIOR"]
    assert route.rotate_pass.options()["launch_pdl"] is True
    # (reading the pre-pass's flag per row)
    assert route.row_flags and route.rotate_pass.dtypes[-1] == torch.int8
    # the caller's cos/sin read directly: no pre-pass, nothing to overlap, no flags
    direct = _two_pass("cpu", table_from_angles=False)
    assert direct.table_pass is None and not direct.row_flags
    assert direct.rotate_pass.dtypes[-1] is None
    assert not direct.rotate_pass.early and not direct.rotate_pass.args["WAIT_PRIOR"]
    assert "launch_pdl" not in direct.rotate_pass.options()


def test_early_and_ordinary_launches_are_different_launches(monkeypatch):
    monkeypatch.setattr(launch, "launches_early", lambda device: True)
    early = _two_pass("cpu").rotate_pass
    monkeypatch.setattr(launch, "launches_early", lambda device: False)
    plain = _two_pass("cpu").rotate_pass
    assert not plain.early and not plain.args["WAIT_PRIOR"]
    assert early != plain and early.key() != plain.key()


def test_never_early_off_a_gpu_or_when_switched_off(monkeypatch):
    assert not launch.launches_early(torch.device("cpu"))
    route = _two_pass("cpu")
    assert not route.rotate_pass.early and not route.rotate_pass.args["WAIT_PRIOR"]
    assert not route.table_pass.args["EARLY_DEPENDENTS"]
    # a Hopper GPU (stood in for), outside the interpreter: early unless switched off
    monkeypatch.setattr(tiles, "hopper_or_newer", lambda device: True)
    monkeypatch.setattr(tiles, "INTERPRET", False)
    assert tiles.launches_early(torch.device("cuda"))
    monkeypatch.setattr(tiles, "EARLY_LAUNCH", False)
    assert not tiles.launches_early(torch.device("cuda"))
    monkeypatch.setattr(tiles, "EARLY_LAUNCH", True)
    monkeypatch.setattr(tiles, "hopper_or_newer", lambda device: False)   # an A100, say
    assert not tiles.launches_early(torch.device("cuda"))


def test_a_traced_launch_never_asks_for_the_early_launch(monkeypatch):
    """Inductor launches user kernels its own way; the option is dropped there (the kernel's
    wait then waits for nothing)."""
    seen = {}

    class Grid:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def call(**kwargs):
                seen.update(kwargs)
            return call

    monkeypatch.setattr(planning, "INTERPRET", False)
    monkeypatch.setattr(planning, "plain_eager", lambda t: False)
    monkeypatch.setattr(torch.library, "wrap_triton", Grid)
    monkeypatch.setattr(launch, "launches_early", lambda device: True)
    route = _two_pass("cpu")
    rotate = route.rotate_pass
    x = torch.empty(6, 3, 4, 16)
    pointers = (x, torch.empty_like(x), None, None, torch.empty(1), torch.empty(1), None,
                None)
    planning.start(rotate.launcher, rotate, pointers)
    assert seen["WAIT_PRIOR"] is True and seen["num_warps"] == rotate.num_warps
    assert "launch_pdl" not in seen


needs_hopper = pytest.mark.skipif(
    not on_gpu() or torch.cuda.get_device_capability() < (9, 0),
    reason="programmatic dependent launch needs a GPU of compute capability 9.0 or more")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
def test_early_launch_same_bits_eager_and_under_a_graph(layout, monkeypatch):
    shape = {"sbhd": (256, 4, 8, 64), "bshd": (4, 256, 8, 64), "thd": (1024, 8, 64)}[layout]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    freqs = ropelib.rope_freqs(512, 64, device="cuda")
    kw = dict(layout=layout)
    if layout == "thd":
        # two sequences, each shorter than the 512 positions of the table (a position past the
        # table gives NaN, which torch.equal never finds equal)
        kw["cu_seqlens"] = torch.tensor([0, 300, 800, 1024], device="cuda", dtype=torch.int32)
    saved = thresholds(0, 0, 0)
    try:
        outs = {}
        for early in (False, True):
            monkeypatch.setattr(tiles, "EARLY_LAUNCH", early)
            eager.SIGNATURES.clear()
            outs[early] = ropelib.apply_rope(x, freqs, **kw)
            assert not outs[early].isnan().any()
            graph, static = torch.cuda.CUDAGraph(), None
            ropelib.apply_rope(x, freqs, **kw)          # warm up outside capture
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                static = ropelib.apply_rope(x, freqs, **kw)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static, outs[early])
        assert torch.equal(outs[True], outs[False])
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()


# --- the QKV projection's forward: never launched early -------------------------------------
# Its persistent TMA forward (one program per SM) launched early after the pre-pass of its
# cos/sin rows took 2-8 % longer on an H200 (benchmarks/qkv_forward_ab.py, "TMA, not early"):
# its programs hold the SMs while they wait, and the pre-pass's programs queue behind them.

def test_qkv_rope_linear_launches_no_kernel_early(monkeypatch):
    from ropelib.kernels import qkv_gemm as QG
    device = "cuda" if on_gpu() else "cpu"
    if device == "cpu":
        # a device where the two-pass route's flat pass would go early
        monkeypatch.setattr(tiles, "INTERPRET", False)
        monkeypatch.setattr(tiles, "EARLY_LAUNCH", True)
        monkeypatch.setattr(tiles, "hopper_or_newer", lambda device: True)
        # (the pre-pass itself as off a GPU: the interpreter has no griddepcontrol)
        monkeypatch.setattr(launch, "launches_early", lambda device: False)
    if not tiles.launches_early(torch.device(device)):
        pytest.skip("this GPU launches nothing early (compute capability below 9.0)")
    planned, real = [], QG.plan

    def plan(kind, **kw):
        planned.append((kind, real(kind, **kw)))
        return planned[-1][1]
    monkeypatch.setattr(QG, "plan", plan)
    eager.SIGNATURES.clear()                # (the kept plans: planned again, patched)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 32, generator=gen).to(device).requires_grad_(True)
    w = torch.randn((4 + 2 * 2) * 16, 32, generator=gen).to(device).requires_grad_(True)
    q, k, v = ropelib.qkv_rope_linear(x, w, n_heads=4, n_kv_heads=2, head_dim=16,
                                      freqs=ropelib.rope_freqs(8, 16, device=device))
    (q.sum() + k.sum() + v.sum()).backward()
    assert "fwd" in {kind for kind, _ in planned}
    assert not any(l.early or "launch_pdl" in l.options() for _, l in planned), planned
