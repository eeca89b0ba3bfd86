"""start_positions combined with context parallelism (cp_size > 1), as Transformer Engine does it.

TE's semantics, written out here independently of ropelib's reference: rank r of cp_size holds
two of the 2 * cp_size chunks of every global sequence (chunks r and 2 * cp_size - 1 - r); the
token of global index g in sequence i sits at position start_positions[i] + g. So the output of
rank r is the shard of the whole sequence rotated at positions start .. start + S * cp_size - 1.
Every entry point that takes both is checked against that, forward and backward: apply_rope
(angle tables, cos/sin tables and table-free angles), apply_rope_qk, RotaryEmbedding, the TE
drop-ins (fused and unfused) and the fused QKV drop-in, for sbhd, bshd and thd.
"""
import pytest
import torch

import ropelib
from ropelib import te as rte
from ropelib.reference import te_unfused

H, D = 2, 16
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1e-2, 2**-7)}


def _global_positions(local_len, cp_size, cp_rank):
    """The global index of each local token: this rank's two chunks, written out."""
    seg = local_len // 2
    chunks = [cp_rank, 2 * cp_size - 1 - cp_rank]
    return torch.cat([torch.arange(c * seg, (c + 1) * seg) for c in chunks])


def _rotate64(x, freqs, pos, interleaved):
    """x [..., N, H, D] at positions pos [..., N] in float64, from angle rows freqs [P, R]."""
    ang = freqs.reshape(freqs.shape[0], -1).double()[pos]          # [..., N, R]
    R = ang.shape[-1]
    c, s = torch.cos(ang).unsqueeze(-2), torch.sin(ang).unsqueeze(-2)
    xr, xp = x.double()[..., :R], x.double()[..., R:]
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        ca, cb, sa, sb = c[..., 0::2], c[..., 1::2], s[..., 0::2], s[..., 1::2]
        y = torch.stack((a * ca - b * sa, b * cb + a * sb), dim=-1).flatten(-2)
    else:
        a, b = xr[..., :R // 2], xr[..., R // 2:]
        ca, cb, sa, sb = c[..., :R // 2], c[..., R // 2:], s[..., :R // 2], s[..., R // 2:]
        y = torch.cat((a * ca - b * sa, b * cb + a * sb), dim=-1)
    return torch.cat((y, xp), dim=-1)


def _expected(x, freqs, layout, start, cp_size, cp_rank, interleaved, cu=None):
    """TE's result for rank cp_rank, built from global positions (float64)."""
    if layout == "thd":
        parts, lo = [], 0
        for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            n = (b - a) // cp_size
            pos = _global_positions(n, cp_size, cp_rank) + (int(start[i]) if start is not None else 0)
            parts.append(_rotate64(x[lo:lo + n], freqs, pos, interleaved))
            lo += n
        return torch.cat(parts)
    xb = x if layout == "bshd" else x.transpose(0, 1)                  # [B, S, H, D]
    B, S = xb.shape[:2]
    pos = _global_positions(S, cp_size, cp_rank).expand(B, S)
    if start is not None:
        pos = pos + start.view(-1, 1).long()
    y = _rotate64(xb, freqs, pos, interleaved)
    return y if layout == "bshd" else y.transpose(0, 1)


def _case(layout, dtype, cp_size, seeded_gen):
    g = seeded_gen
    if layout == "thd":
        cu = torch.tensor([0, 8, 8, 24, 32], dtype=torch.int32) * (cp_size // 2)
        x = torch.randn(int(cu[-1]) // cp_size, H, D, generator=g).to(dtype)
        start = torch.randint(0, 9, (4,), generator=g, dtype=torch.int32)
        need = max(int(s0) + int(b - a) for s0, a, b in zip(start, cu[:-1], cu[1:]))
    else:
        S, B = 6, 3
        x = torch.randn((S, B, H, D) if layout == "sbhd" else (B, S, H, D), generator=g).to(dtype)
        cu = None
        start = torch.randint(0, 9, (B,), generator=g, dtype=torch.int32)
        need = int(start.max()) + S * cp_size
    return x, cu, start, need


CASES = [(layout, dtype, cp_size, cp_rank, interleaved)
         for layout in ("sbhd", "bshd", "thd")
         for dtype in (torch.float32, torch.bfloat16)
         for cp_size, cp_rank in ((2, 0), (2, 1), (4, 2))
         for interleaved in (False, True)]


@pytest.fixture
def gen(request):
    g = torch.Generator().manual_seed(hash(request.node.name) % 2**31)
    return g


@pytest.mark.parametrize("layout,dtype,cp_size,cp_rank,interleaved", CASES)
def test_te_dropins_start_positions_with_cp(layout, dtype, cp_size, cp_rank, interleaved, gen):
    x, cu, start, need = _case(layout, dtype, cp_size, gen)
    freqs = ropelib.rope_freqs(need + 3, D, rotary_percent=0.5, interleaved=interleaved)
    opts = dict(tensor_format=layout, start_positions=start, interleaved=interleaved,
                cu_seqlens=cu, cp_size=cp_size, cp_rank=cp_rank)
    want = _expected(x, freqs, layout, start, cp_size, cp_rank, interleaved, cu)
    # unfused: TE's plain-PyTorch path, line for line (math in the input dtype)
    unf = rte.apply_rotary_pos_emb(x, freqs, fused=False, **opts)
    assert torch.equal(unf, te_unfused(x, freqs, **opts))
    torch.testing.assert_close(rte.apply_rotary_pos_emb(x.double(), freqs.double(), fused=False,
                                                       **opts),
                               want, atol=1e-12, rtol=1e-12)
    # fused: the kernel, forward and backward
    xg = x.clone().requires_grad_(True)
    fus = rte.apply_rotary_pos_emb(xg, freqs, fused=True, **opts)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(fus, want.to(dtype), atol=atol, rtol=rtol)
    gy = torch.randn(fus.shape, generator=gen).to(dtype)
    (fus * gy).sum().backward()
    xr = x.double().requires_grad_(True)
    (_expected(xr, freqs, layout, start, cp_size, cp_rank, interleaved, cu) * gy.double()).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("table", ["freqs", "cos_sin", "angles"])
@pytest.mark.parametrize("cp_rank", [0, 1])
def test_apply_rope_and_qk_start_positions_with_cp(layout, table, cp_rank, gen):
    cp_size, dtype = 2, torch.float32
    x, cu, start, need = _case(layout, dtype, cp_size, gen)
    P = need + 2
    freqs = ropelib.rope_freqs(P, D)
    if table == "freqs":
        tab = dict(freqs=freqs)
    elif table == "cos_sin":
        tab = dict(cos=torch.cos(freqs[:, 0, 0].double()), sin=torch.sin(freqs[:, 0, 0].double()))
    else:
        tab = dict(angles=ropelib.rope_angles(D))
    opts = dict(layout=layout, start_positions=start, cu_seqlens=cu, cp_size=cp_size,
                cp_rank=cp_rank, **tab)
    want = _expected(x, freqs, layout, start, cp_size, cp_rank, False, cu)
    xg = x.clone().requires_grad_(True)
    y = ropelib.apply_rope(xg, **opts)
    torch.testing.assert_close(y, want.float(), atol=2e-5, rtol=2e-5)
    gy = torch.randn(y.shape, generator=gen)
    (y * gy).sum().backward()
    xr = x.double().requires_grad_(True)
    (_expected(xr, freqs, layout, start, cp_size, cp_rank, False, cu) * gy.double()).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad.float(), atol=2e-5, rtol=2e-5)
    # q and k in one launch (k with one head: GQA)
    k = x[..., :1, :].clone()
    q_out, k_out = ropelib.apply_rope_qk(x, k, **opts)
    torch.testing.assert_close(q_out, y.detach(), atol=0, rtol=0)
    torch.testing.assert_close(k_out, want[..., :1, :].float(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_rotary_embedding_start_positions_with_cp(layout, gen):
    cp_size, cp_rank = 2, 1
    x, _, start, need = _case(layout, torch.float32, cp_size, gen)
    rope = ropelib.RotaryEmbedding(D, layout=layout, max_seq_len=need)
    q_out, k_out = rope(x, x[..., :1, :], start_positions=start, cp_size=cp_size, cp_rank=cp_rank)
    want = _expected(x, rope.freqs, layout, start, cp_size, cp_rank, False)
    torch.testing.assert_close(q_out, want.float(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(k_out, want[..., :1, :].float(), atol=2e-5, rtol=2e-5)
    # the table grows to the global length (seq_len * cp_size) when no start is given
    small = ropelib.RotaryEmbedding(D, layout=layout, max_seq_len=2)
    y = small(x, cp_size=cp_size, cp_rank=cp_rank)
    assert small.table_length() >= x.shape[0 if layout == "sbhd" else 1] * cp_size
    torch.testing.assert_close(y, _expected(x, small.freqs, layout, None, cp_size, cp_rank,
                                            False).float(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_fused_qkv_start_positions_with_cp(layout, gen):
    cp_size, cp_rank, G, dk = 2, 1, 2, 16
    S, B = 6, 2
    split = [2 * dk, dk, dk]
    shape = (S, B, G, sum(split)) if layout == "sbhd" else (B, S, G, sum(split))
    qkv = torch.randn(shape, generator=gen)
    start = torch.tensor([3, 0], dtype=torch.int32)
    P = 3 + S * cp_size
    qf = ropelib.rope_freqs(P, dk)
    kf = ropelib.rope_freqs(P, dk, base=100.0)
    x = qkv.clone().requires_grad_(True)
    q, k, v = rte.apply_fused_qkv_rotary_pos_emb(x, qf, kf, split, tensor_format=layout,
                                                 start_positions=start, cp_size=cp_size,
                                                 cp_rank=cp_rank)
    lead = qkv.shape[:2]
    q_in = qkv[..., :2 * dk].reshape(*lead, 2 * G, dk)
    k_in, v_in = qkv[..., 2 * dk:3 * dk], qkv[..., 3 * dk:]
    torch.testing.assert_close(q, _expected(q_in, qf, layout, start, cp_size, cp_rank, False).float(),
                               atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(k, _expected(k_in, kf, layout, start, cp_size, cp_rank, False).float(),
                               atol=2e-5, rtol=2e-5)
    assert torch.equal(v, v_in)
    # backward: the transpose of the rotation at the same positions
    (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    xr = qkv.double().requires_grad_(True)
    qr = xr[..., :2 * dk].reshape(*lead, 2 * G, dk)
    loss = _expected(qr, qf, layout, start, cp_size, cp_rank, False).sum() \
        + 2 * _expected(xr[..., 2 * dk:3 * dk], kf, layout, start, cp_size, cp_rank, False).sum() \
        + 3 * xr[..., 3 * dk:].sum()
    loss.backward()
    torch.testing.assert_close(x.grad, xr.grad.float(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("fused", [False, True])
def test_table_length_check_with_start_and_cp(layout, fused, gen):
    """TE's check: max(start_positions) + seq_len * cp_size <= table rows; one short fails."""
    cp_size, cp_rank = 2, 0
    x, cu, start, need = _case(layout, torch.float32, cp_size, gen)
    opts = dict(tensor_format=layout, start_positions=start, cu_seqlens=cu, cp_size=cp_size,
                cp_rank=cp_rank, fused=fused)
    rte.apply_rotary_pos_emb(x, ropelib.rope_freqs(need, D), **opts)   # exactly enough rows
    with pytest.raises(ValueError, match="table|freqs has"):
        rte.apply_rotary_pos_emb(x, ropelib.rope_freqs(need - 1, D), **opts)
    if fused:   # and the same from the public API
        with pytest.raises(ValueError, match="table"):
            ropelib.apply_rope(x, ropelib.rope_freqs(need - 1, D), layout=layout,
                               start_positions=start, cu_seqlens=cu, cp_size=cp_size,
                               cp_rank=cp_rank)


def test_unchecked_positions_past_the_table_give_nan_not_a_clamped_row(gen):
    """With index checks off, a start past the table makes those rows NaN (never wrong values)."""
    x, _, start, need = _case("bshd", torch.float32, 2, gen)
    start = start.clone()
    start[1] = need     # sequence 1 runs past the table; the others fit
    freqs = ropelib.rope_freqs(need, D)
    with ropelib.set_index_checks("off"):
        y = ropelib.apply_rope(x, freqs, layout="bshd", start_positions=start, cp_size=2,
                               cp_rank=1)
    assert torch.isnan(y[1]).any() and not torch.isnan(y[0]).any()


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_start_positions_length_checked_with_cp(layout, gen):
    """The one-entry-per-batch check holds with cp_size > 1 too (it was skipped before)."""
    x, _, start, need = _case(layout, torch.float32, 2, gen)
    freqs = ropelib.rope_freqs(need + 8, D)
    with pytest.raises(ValueError, match="one entry per batch entry"):
        ropelib.apply_rope(x, freqs, layout=layout, start_positions=start[:-1], cp_size=2,
                           cp_rank=0)
    with pytest.raises(ValueError, match="one entry per batch entry"):
        rte.apply_rotary_pos_emb(x, freqs, tensor_format=layout, start_positions=start[:-1],
                                 cp_size=2, cp_rank=0, fused=True)
