"""The QK-RMSNorm + RoPE forward on the two-pass route (kernels/qk_norm_rope.plan_rows): large
contiguous q and k take a rows pass in the shape of RoPE's flat pass, after the cos/sin pre-pass
where the caller's table is not read as it is. Here the size threshold is lowered to 0 so that
CPU-sized shapes take it; every result is compared with the same call through the one kernel
(bit for bit in the interpreter: the same products, sums and roundings; within an ulp or two on
a GPU, which may reduce a row's sum of squares in another order), with the fp64 reference, and
the route is checked to be taken exactly when it should be."""
import itertools
import zlib

import pytest
import torch

import ropelib
from ropelib import eager
from ropelib.kernels import tiles
from ropelib.kernels import qk_norm_rope as kernel
from ropelib.runtime import on_gpu

from test_qk_norm_rope import TOL, reference
from test_two_pass import through   # fn() with the two-pass routes on ("two-pass") or off

DEVICE = "cuda" if on_gpu() else "cpu"
S, B, HQ, HK, D = 6, 3, 4, 2, 16
SHAPES = {"sbhd": lambda h: (S, B, h, D), "bshd": lambda h: (B, S, h, D),
          "thd": lambda h: (S * B, h, D)}


@pytest.fixture
def routes(monkeypatch):
    """Count the forwards that take the two-pass route, through the operator or eagerly."""
    calls = []
    real_plan = kernel.plan_rows

    def counted(*args, **kwargs):
        route = real_plan(*args, **kwargs)
        calls.append(route is not None)
        return route
    monkeypatch.setattr(kernel, "plan_rows", counted)
    eager.SIGNATURES.clear()
    eager.TABLE_ROWS.clear()
    yield calls
    eager.SIGNATURES.clear()
    eager.TABLE_ROWS.clear()


@pytest.fixture(autouse=True)
def route_on(monkeypatch):
    """The route is switched off by default until it is measured on a GPU: on for these tests."""
    monkeypatch.setattr(tiles, "QK_NORM_TWO_PASS", True)


def test_off_by_default(monkeypatch, routes):
    monkeypatch.setattr(tiles, "QK_NORM_TWO_PASS", False)
    (q, k, w_q, w_k), table, kw, _ = _inputs("angles", "bshd", False, torch.float32)
    through("two-pass", lambda: ropelib.qk_norm_rope(q, k, w_q, w_k, **table, **kw))
    assert routes and not any(routes)


OPTIONS = ["angles", "cos/sin", "cos/sin bf16", "ids shared", "ids per entry", "partial",
           "gemma offset", "ids out of range"]
CASES = [c for c in itertools.product(OPTIONS, ["sbhd", "bshd", "thd"], [False, True],
                                      [torch.bfloat16, torch.float32])
         if not (c[1] == "thd" and c[0] == "ids per entry")]


def _inputs(option, layout, interleaved, dtype):
    g = torch.Generator().manual_seed(zlib.crc32(f"{option} {layout} {interleaved} {dtype}"
                                                 .encode()))
    q = (2 * torch.randn(SHAPES[layout](HQ), generator=g)).to(DEVICE, dtype)
    k = (0.5 * torch.randn(SHAPES[layout](HK), generator=g)).to(DEVICE, dtype)
    w_q = (1 + 0.3 * torch.randn(D, generator=g)).to(DEVICE)
    w_k = (1 + 0.3 * torch.randn(D, generator=g)).to(DEVICE)
    R = D // 2 if option == "partial" else D
    P = S * B + 5
    kw = dict(layout=layout, interleaved=interleaved)
    cos, sin = ropelib.rope_cos_sin(P, R, interleaved=interleaved, device=DEVICE)
    if option in ("angles", "partial", "gemma offset") or option.startswith("ids"):
        table = dict(freqs=ropelib.rope_freqs(P, R, interleaved=interleaved, device=DEVICE))
    else:
        table = dict(cos=cos, sin=sin)
        if option == "cos/sin bf16":
            table = dict(cos=cos.bfloat16(), sin=sin.bfloat16())
    tokens = S * B if layout == "thd" else S
    if option == "ids shared":
        kw["position_ids"] = torch.randint(0, P, (tokens,), generator=g).to(DEVICE)
    elif option == "ids per entry":
        kw["position_ids"] = torch.randint(0, P, (B, S), generator=g).to(DEVICE)
    elif option == "ids out of range":
        ids = torch.randint(0, P, (tokens,), generator=g)
        ids[1] = P + 1                                   # a position past the table
        kw["position_ids"] = ids.to(DEVICE)
    if layout == "thd" and "position_ids" not in kw:    # packed sequences need their positions
        kw["position_ids"] = (torch.arange(tokens) % S).to(DEVICE)
    if option == "gemma offset":
        kw["weight_offset"] = 1.0
    return (q, k, w_q, w_k), table, kw, (cos, sin)


@pytest.mark.parametrize("option,layout,interleaved,dtype", CASES)
def test_forward_as_the_one_kernel(option, layout, interleaved, dtype, routes):
    (q, k, w_q, w_k), table, kw, (cos, sin) = _inputs(option, layout, interleaved, dtype)
    checks = "off" if option == "ids out of range" else "auto"

    def fn():
        ropelib.set_index_checks(checks)
        try:
            return ropelib.qk_norm_rope(q, k, w_q, w_k, **table, **kw)
        finally:
            ropelib.set_index_checks("auto")
    want = through("one kernel", fn)
    assert not any(routes)
    got = through("two-pass", fn)
    assert routes and all(routes[-1:]), "the forward should take the two-pass route"
    tol = TOL[dtype]
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
        assert torch.equal(torch.isnan(a), torch.isnan(b)), "NaN rows differ"
        if not on_gpu():    # the same products, sums and roundings: the same bits here
            assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        else:               # (a GPU may reduce a row's squares in another order)
            torch.testing.assert_close(torch.nan_to_num(a.float()), torch.nan_to_num(b.float()),
                                       atol=tol[0], rtol=tol[1])
    if option == "ids out of range":
        assert torch.isnan(got[0]).any()
    elif not option.endswith("bf16"):
        ids = kw.get("position_ids")
        ref = reference(q, k, w_q, w_k, cos=cos, sin=sin, layout=layout, interleaved=interleaved,
                        position_ids=ids, weight_offset=kw.get("weight_offset", 0.0))
        for a, b in zip(got, ref):
            torch.testing.assert_close(a.double(), b, atol=2 * tol[0], rtol=2 * tol[1])


def test_operator_and_compile_take_the_route(routes):
    (q, k, w_q, w_k), table, kw, _ = _inputs("angles", "bshd", False, torch.float32)
    want = through("one kernel", lambda: ropelib.qk_norm_rope(q, k, w_q, w_k, **table, **kw))
    saved = tiles.TWO_PASS_MIN_BYTES, tiles.TWO_PASS_TABLE_SHARE
    tiles.TWO_PASS_MIN_BYTES = tiles.TWO_PASS_TABLE_SHARE = 0
    try:
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b: ropelib.qk_norm_rope(a, b, w_q, w_k, **table, **kw),
                                 backend="aot_eager", fullgraph=True)
        got = compiled(q, k)
        assert any(routes)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=TOL[torch.float32][0],
                                       rtol=TOL[torch.float32][1])
        torch.library.opcheck(torch.ops.ropelib.qk_norm_rope.default,
                              (q, k, w_q, w_k, table["freqs"].view(table["freqs"].shape[0], -1),
                               None, None, "bshd", False, 1e-6, 0.0))
    finally:
        tiles.TWO_PASS_MIN_BYTES, tiles.TWO_PASS_TABLE_SHARE = saved
        torch._dynamo.reset()


@pytest.mark.parametrize("option,layout,interleaved,dtype",
                         [c for c in CASES if c[0] != "ids out of range"])
def test_backward_as_the_one_kernel(option, layout, interleaved, dtype, routes):
    # the gradients of q and k: the one kernel's bits (in the interpreter); of the weights: the
    # same sums over rows, in another grouping of rows per program
    from test_qk_norm_rope import W_TOL
    (q, k, w_q, w_k), table, kw, _ = _inputs(option, layout, interleaved, dtype)
    q, k, w_q, w_k = (t.requires_grad_(True) for t in (q, k, w_q, w_k))
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def fn():
        out = ropelib.qk_norm_rope(q, k, w_q, w_k, **table, **kw)
        return torch.autograd.grad(out, (q, k, w_q, w_k), (gq, gk))
    want = through("one kernel", fn)
    routes.clear()
    got = through("two-pass", fn)
    assert routes and all(routes), "forward and backward should take the two-pass route"
    for a, b in zip(got[:2], want[:2]):
        assert a.dtype == b.dtype and a.shape == b.shape
        if not on_gpu():
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype][0],
                                       rtol=TOL[dtype][1])
    for a, b in zip(got[2:], want[2:]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=W_TOL[dtype][0], rtol=W_TOL[dtype][1])
    # deterministic: the same bits again
    for a, b in zip(got, through("two-pass", fn)):
        assert torch.equal(a, b)


def test_backward_with_gradients_in_another_order(routes):
    # output gradients not contiguous in the layout are copied so (both kernels read them as
    # the outputs are laid out): the backward takes the route too, with the one kernel's bits
    (q, k, w_q, w_k), table, kw, _ = _inputs("angles", "bshd", False, torch.float32)
    q, k = q.requires_grad_(True), k.requires_grad_(True)
    gq = torch.randn(q.shape[::-1], device=q.device).permute(3, 2, 1, 0)       # another order of the same shape
    gk = torch.randn_like(k)

    def fn():
        out = ropelib.qk_norm_rope(q, k, w_q, w_k, **table, **kw)
        return torch.autograd.grad(out, (q, k), (gq, gk))
    want = through("one kernel", fn)
    routes.clear()
    got = through("two-pass", fn)
    assert routes == [True, True], "the forward and the backward take the route"
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_when_the_route_is_not_taken(routes):
    (q, k, w_q, w_k), table, kw, _ = _inputs("angles", "bshd", False, torch.float32)
    cases = {
        "strided q": lambda: ropelib.qk_norm_rope(q[:, :, ::2], k, w_q, w_k, **table, **kw),
        "fp64": lambda: ropelib.qk_norm_rope(q.double(), k.double(), w_q.double(),
                                             w_k.double(), **table, **kw),
    }
    for what, fn in cases.items():
        routes.clear()
        through("two-pass", fn)
        assert not any(routes), f"{what} took the two-pass route"


@pytest.mark.parametrize("D,R,interleaved", [(80, 80, False), (80, 48, False), (96, 64, True),
                                             (128, 96, False)])
def test_head_dims_that_are_not_powers_of_two(D, R, interleaved, routes):
    # masked tiles: head dims and rotary dims that leave lanes of a power-of-two tile unused
    g = torch.Generator().manual_seed(D + R)
    q = torch.randn(2, 5, 6, D, generator=g).to(DEVICE, torch.bfloat16).requires_grad_()
    k = torch.randn(2, 5, 2, D, generator=g).to(DEVICE, torch.bfloat16).requires_grad_()
    w_q = (1 + 0.2 * torch.randn(D, generator=g)).to(DEVICE).requires_grad_()
    w_k = (1 + 0.2 * torch.randn(D, generator=g)).to(DEVICE).requires_grad_()
    freqs = ropelib.rope_freqs(20, R, interleaved=interleaved, device=DEVICE)
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def fn():
        out = ropelib.qk_norm_rope(q, k, w_q, w_k, freqs, interleaved=interleaved)
        return tuple(o.detach() for o in out) + torch.autograd.grad(out, (q, k, w_q, w_k),
                                                                     (gq, gk))
    want = through("one kernel", fn)
    got = through("two-pass", fn)
    assert routes and all(routes[-2:])
    for a, b in zip(got[:4], want[:4]):
        if not on_gpu():
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=2**-7)
    for a, b in zip(got[4:], want[4:]):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=1e-2)
