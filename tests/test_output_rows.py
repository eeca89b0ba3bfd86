"""The finished kernel writing q and k into column slices of one token-major buffer (OUT_ROW):
the same bits as into fresh contiguous tensors, nothing outside the slices touched, and the
planner's `output_row` saying which strides it can store through."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

import ropelib  # noqa: E402
from ropelib import ops  # noqa: E402
from ropelib.kernels import launch  # noqa: E402
from ropelib.kernels.launch import Positions, Table  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HQ, HK, D = 4, 2, 16


def _grads(layout, S, B, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = (S * B,) if layout == "thd" else ((S, B) if layout == "sbhd" else (B, S))
    q = torch.randn(*lead, HQ, D, generator=g).to(DEV, dtype)
    k = torch.randn(*lead, HK, D, generator=g).to(DEV, dtype)
    return q, k, lead


def _positions(kind, S, B, lead):
    if kind == "ids":
        return Positions(position_ids=torch.randint(0, 2 * S, (B, S)).to(DEV))
    if kind == "packed":
        return Positions(cu_seqlens=torch.tensor([0, 3, S * B], dtype=torch.int32, device=DEV))
    if kind == "start":
        return Positions(start=torch.arange(B, dtype=torch.int32, device=DEV) * 2)
    return Positions()


def _slices(lead, extra, dtype):
    """A NaN-filled token-major buffer [tokens, (HQ + HK + extra) * D] and q's and k's column
    slices of it, shaped as the outputs ([*lead, H, D])."""
    tokens = 1
    for n in lead:
        tokens *= n
    width = (HQ + HK + extra) * D
    buf = torch.full((tokens, width), float("nan"), dtype=dtype, device=DEV)
    qs = buf[:, :HQ * D].unflatten(0, lead).unflatten(-1, (HQ, D))
    ks = buf[:, HQ * D:(HQ + HK) * D].unflatten(0, lead).unflatten(-1, (HK, D))
    return buf, qs, ks


@pytest.mark.parametrize("layout,positions", [
    ("sbhd", "tokens"), ("sbhd", "ids"), ("sbhd", "start"), ("bshd", "tokens"), ("bshd", "ids"),
    ("bshd", "start"), ("thd", "tokens"), ("thd", "packed")])
@pytest.mark.parametrize("interleaved,rotary", [(False, D), (True, D), (False, D // 2)])
@pytest.mark.parametrize("backward", [False, True])
def test_slices_hold_the_contiguous_bits(layout, positions, interleaved, rotary, backward):
    S, B = 5, 2
    dtype = torch.bfloat16
    q, k, lead = _grads(layout, S, B, dtype)
    pos = _positions(positions, S if layout != "thd" else S * B, B if layout != "thd" else 1,
                     lead)
    table = Table(ropelib.rope_freqs(64, rotary, device=DEV).reshape(64, rotary), None)
    want_q, want_k = torch.empty_like(q), torch.empty_like(k)
    ops._launch(q, want_q, table, pos, layout, interleaved=interleaved, backward=backward, k=k,
                k_out=want_k)
    buf, qs, ks = _slices(lead, 3, dtype)
    ops._launch(q, qs, table, pos, layout, interleaved=interleaved, backward=backward, k=k,
                k_out=ks)
    assert torch.equal(qs, want_q) and torch.equal(ks, want_k)
    assert buf[:, (HQ + HK) * D:].isnan().all()          # the columns past the slices untouched


def test_output_row_reads_the_strides():
    view = lambda t, layout: launch.View.of(ropelib.conventions.view4(t, layout))  # noqa: E731
    _, qs, ks = _slices((3, 5), 2, torch.float32)            # bshd: B 3, S 5
    assert launch.output_row(view(qs, "bshd"), view(ks, "bshd"), "bshd") == (HQ + HK + 2) * D
    _, qs, ks = _slices((7,), 1, torch.float32)              # thd
    assert launch.output_row(view(qs, "thd"), view(ks, "thd"), "thd") == (HQ + HK + 1) * D
    fresh = torch.empty(3, 5, HQ, D)
    assert launch.output_row(view(fresh, "bshd"), None, "bshd") == 0
    assert launch.output_row(None, None, "bshd") == 0
    # one slice and one fresh tensor: two row strides, which one OUT_ROW cannot hold
    _, qs, _ = _slices((3, 5), 2, torch.float32)
    assert launch.output_row(view(qs, "bshd"), view(torch.empty(3, 5, HK, D), "bshd"),
                             "bshd") is None
    # heads not D apart, or Hugging Face's bhsd: not token rows
    assert launch.output_row(view(torch.empty(3, 5, HQ, 2 * D)[..., :D], "bshd"), None,
                             "bshd") is None
    assert launch.output_row(view(qs.transpose(1, 2), "bhsd"), None, "bhsd") is None

def _qkv_case(shape, g, B=2, S=5, hidden=32):
    """The QKV projection's backward inputs for one gradient shape: (x, [grad q, k, v], layout,
    position ids, cu_seqlens); bhsd's gradients seen token-major (transposed views)."""
    lead = (B * S,) if shape.startswith("thd") else (B, S)
    x = torch.randn(*lead, hidden, generator=g).to(DEV, torch.bfloat16)
    grads = [torch.randn(*lead, h, D, generator=g).to(DEV, torch.bfloat16) for h in (HQ, HK, HK)]
    if shape == "bhsd":
        grads = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in grads]
    ids = torch.randint(0, 3 * S, (B, S), generator=g).to(DEV) if shape == "bshd-ids" else None
    cu = torch.tensor([0, 4, B * S], dtype=torch.int32, device=DEV) \
        if shape == "thd-packed" else None
    return x, grads, "thd" if shape.startswith("thd") else "bshd", ids, cu


@pytest.mark.parametrize("shape", ["bshd", "bhsd", "thd", "thd-packed", "bshd-ids"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_written_dy_is_the_rotated_gradients_side_by_side(shape, interleaved):
    """qkv_linear.written_dy (q's and k's gradients rotated straight into dY's columns) gives
    the bits of rotating them into tensors of their own and setting them side by side."""
    from ropelib import qkv_linear
    x, grads, layout, ids, cu = _qkv_case(shape, torch.Generator().manual_seed(3))
    angles = ropelib.rope_angles(D, device=DEV)
    dq, dk = ops.rope_qk(grads[0], grads[1], angles.turns, angles.amplitude, ids, cu, None,
                         layout, interleaved, 1, 0, True, None)
    M = x.numel() // x.shape[-1]
    want = torch.cat([t.reshape(M, -1) for t in (dq, dk, grads[2])], dim=1)
    got = qkv_linear.written_dy(*grads, x, angles.turns, angles.amplitude, ids, cu, interleaved)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want)


def test_outputs_the_kernel_cannot_store_into_are_written_through_a_copy():
    """q's output a column slice and k's a tensor of its own (two token row strides, which one
    OUT_ROW cannot hold): the rotation lands in both all the same, by way of fresh tensors."""
    q, k, lead = _grads("bshd", 5, 2, torch.float32)
    table = Table(ropelib.rope_freqs(64, D, device=DEV).reshape(64, D), None)
    want_q, want_k = torch.empty_like(q), torch.empty_like(k)
    ops._launch(q, want_q, table, Positions(), "bshd", interleaved=False, backward=False, k=k,
                k_out=want_k)
    buf, qs, _ = _slices(lead, 1, torch.float32)
    k_own = torch.full_like(k, float("nan"))
    ops._launch(q, qs, table, Positions(), "bshd", interleaved=False, backward=False, k=k,
                k_out=k_own)
    assert torch.equal(qs, want_q) and torch.equal(k_own, want_k)
    assert buf[:, HQ * D:].isnan().all()


@pytest.mark.parametrize("shape", ["bshd", "bhsd", "thd", "thd-packed", "bshd-ids"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_written_dy_normed_is_the_norms_gradients_side_by_side(shape, interleaved):
    """With QK-norm, qkv_linear.written_dy_normed (qk_norm_rope's backward storing straight
    into dY's columns, GX_ROW) gives the bits of its operator's fresh gradients set side by side,
    and the same norm-weight gradients."""
    from ropelib import qk_norm, qkv_linear
    g = torch.Generator().manual_seed(5)
    x, grads, layout, ids, cu = _qkv_case(shape, g)
    lead, M = grads[0].shape[:-2], x.numel() // x.shape[-1]
    norm_input = torch.randn(M, (HQ + HK) * D, generator=g).to(DEV, torch.bfloat16)
    wq, wk = (torch.randn(D, generator=g).to(DEV, torch.bfloat16) for _ in range(2))
    angles = ropelib.rope_angles(D, device=DEV)
    q_in = norm_input[:, :HQ * D].view(*lead, HQ, D)
    k_in = norm_input[:, HQ * D:].view(*lead, HK, D)
    dq, dk, want_wq, want_wk = qk_norm.qk_norm_rope_backward_op(
        grads[0], grads[1], q_in, k_in, wq, wk, angles.turns, angles.amplitude, ids, cu, layout,
        interleaved, 1e-6, 0.0)
    want = torch.cat([t.reshape(M, -1) for t in (dq, dk, grads[2])], dim=1)
    got, got_wq, got_wk = qkv_linear.written_dy_normed(
        *grads, x, norm_input, wq, wk, angles.turns, angles.amplitude, ids, cu, HQ, HK, D, 1e-6,
        interleaved)
    assert got.is_contiguous() and torch.equal(got, want)
    assert torch.equal(got_wq, want_wq) and torch.equal(got_wk, want_wk)


def test_the_norms_backward_stores_into_columns_or_copies():
    """kernel.Route.backward(into=...): column slices of one buffer are stored into (GX_ROW,
    nothing outside them touched); tensors it cannot describe so get the same bits through
    fresh ones."""
    from ropelib.kernels import qk_norm_rope as kernel
    g = torch.Generator().manual_seed(7)
    B, S = 2, 5
    q, k = (torch.randn(B, S, h, D, generator=g).to(DEV) for h in (HQ, HK))
    w_q, w_k = (torch.randn(D, generator=g).to(DEV) for _ in range(2))
    gq, gk = (torch.randn(B, S, h, D, generator=g).to(DEV) for h in (HQ, HK))
    table = ropelib.rope_freqs(16, D, device=DEV).reshape(16, D)
    route = kernel.Route(q, k, w_q, w_k, table, None, None, layout="bshd", interleaved=False,
                         eps=1e-6, weight_offset=0.0)
    want = route.backward(gq, gk, q, k, w_q, w_k, table, None, None)
    assert route.keep_strides          # (dense q and k: outputs laid out as them)
    buf, qs, ks = _slices((B, S), 1, torch.float32)
    got = route.backward(gq, gk, q, k, w_q, w_k, table, None, None, into=(qs, ks))
    assert got[0] is qs and got[1] is ks
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert buf[:, (HQ + HK) * D:].isnan().all()
    # q and k slices of a wider buffer (not dense): the kernel stores into the columns itself
    wide = torch.randn(B, S, (HQ + HK + 2) * D, generator=g).to(DEV)
    q2, k2 = wide[..., :HQ * D].unflatten(-1, (HQ, D)), \
        wide[..., HQ * D:(HQ + HK) * D].unflatten(-1, (HK, D))
    route2 = kernel.Route(q2, k2, w_q, w_k, table, None, None, layout="bshd", interleaved=False,
                          eps=1e-6, weight_offset=0.0)
    assert not route2.keep_strides
    want2 = route2.backward(gq, gk, q2, k2, w_q, w_k, table, None, None)
    buf2, qs2, ks2 = _slices((B, S), 1, torch.float32)
    assert route2._stores_into(qs2, ks2)
    got2 = route2.backward(gq, gk, q2, k2, w_q, w_k, table, None, None, into=(qs2, ks2))
    assert all(torch.equal(a, b) for a, b in zip(got2, want2))
    assert buf2[:, (HQ + HK) * D:].isnan().all()
