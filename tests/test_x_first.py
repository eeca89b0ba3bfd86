"""The finished kernel's two load orders give the same bits. The planner has a program load each
batch entry's x before its table work where it loops over fewer than 4 entries (X_FIRST, see
kernels/fused.py `_rope_heads`), after it otherwise; here both orders run for the same calls,
forward and backward, in five kinds of call, and the outputs and gradients are equal bit for bit.
"""
import pytest
import torch

import ropelib
import ropelib.hf
from ropelib.kernels import launch
from ropelib.runtime import on_gpu
from routes import forced  # noqa: E402  (tests/routes.py)

DEVICE = "cuda" if on_gpu() else "cpu"
D = 16
CALLS = {
    "sbhd decode (one position for the batch)": lambda g: (
        torch.randn(1, 6, 3, D, generator=g), dict(position_ids=torch.tensor([[9]]))),
    "bshd, 16-bit": lambda g: (torch.randn(3, 5, 2, D, generator=g).to(torch.bfloat16),
                               dict(layout="bshd")),
    "sbhd start positions, interleaved": lambda g: (
        torch.randn(2, 5, 2, D, generator=g),
        dict(start_positions=torch.tensor([0, 2, 5, 1, 7]), interleaved=True)),
    "sbhd position ids, partial rotary": lambda g: (
        torch.randn(4, 4, 2, D, generator=g),
        dict(position_ids=torch.tensor([[0, 3, 1, 2], [5, 4, 0, 1], [1, 1, 2, 2], [7, 6, 5, 4]]),
             rotary=D // 2)),
    "Hugging Face, per-batch tables": lambda g: (torch.randn(4, 2, 3, D, generator=g),
                                                 dict(hf=True)),
}


def _run(make):
    g = torch.Generator().manual_seed(7)
    x, kw = make(g)
    rotary = kw.pop("rotary", D)
    freqs = ropelib.rope_freqs(16, rotary, interleaved=kw.get("interleaved", False))
    if kw.pop("hf", False):     # q, k [B, H, S, D] with Hugging Face's cos/sin [B, S, D]
        B, _, S, _ = x.shape
        angles = freqs[:, 0, 0][torch.randint(0, 16, (B, S), generator=g)]
        cos, sin = angles.cos().to(DEVICE), angles.sin().to(DEVICE)
        q = x.to(DEVICE).requires_grad_(True)
        k = torch.randn(B, 1, S, D, generator=g).to(DEVICE).requires_grad_(True)
        with forced("finished"):
            yq, yk = ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
            dq, dk = torch.randn(yq.shape, generator=g), torch.randn(yk.shape, generator=g)
            grads = torch.autograd.grad((yq, yk), (q, k), (dq.to(DEVICE), dk.to(DEVICE)))
        return yq.detach(), yk.detach(), *grads
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            kw[k] = v.to(DEVICE)
    x = x.to(DEVICE).requires_grad_(True)
    with forced("finished"):
        y = ropelib.apply_rope(x, freqs.to(DEVICE) if freqs is not None else None, **kw)
        dy = torch.randn(y.shape, generator=g).to(DEVICE, y.dtype)
        (gx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), gx


@pytest.mark.parametrize("call", sorted(CALLS))
def test_both_load_orders_give_the_same_bits(call, monkeypatch):
    chosen = []

    def order(first):
        def x_first(B, chunk):
            chosen.append(first)
            return first
        return x_first
    monkeypatch.setattr(launch, "_x_first", order(False))
    want = _run(CALLS[call])
    monkeypatch.setattr(launch, "_x_first", order(True))
    got = _run(CALLS[call])
    assert True in chosen and False in chosen, "the planner did not ask for a load order"
    for a, b in zip(got, want):
        assert torch.equal(a, b), call


def test_x_first_where_a_program_loops_over_fewer_than_four_entries():
    assert [launch._x_first(B, chunk) for B, chunk in ((64, 1), (2, 2), (3, 8), (8, 8),
                                                         (16, 4), (8, 2))] == \
        [True, True, True, False, False, True]
