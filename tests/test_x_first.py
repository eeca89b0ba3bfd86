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
            return min(B, chunk) if first else 0     # x first: a program's entries, fixed
        return x_first
    monkeypatch.setattr(launch, "_x_first", order(False))
    want = _run(CALLS[call])
    monkeypatch.setattr(launch, "_x_first", order(True))
    got = _run(CALLS[call])
    assert True in chosen and False in chosen, "the planner did not ask for a load order"
    for a, b in zip(got, want):
        assert torch.equal(a, b), call


def test_x_first_where_a_program_loops_over_fewer_than_four_entries():
    # the entries a program takes, which the kernel then knows without a division; 0: x after
    assert [launch._x_first(B, chunk) for B, chunk in ((64, 1), (2, 2), (3, 8), (8, 8),
                                                         (16, 4), (8, 2), (7, 3))] == \
        [1, 2, 3, 0, 0, 2, 3]


@pytest.mark.parametrize("B, chunk", [(7, 3), (5, 2), (3, 8), (4, 1), (9, 4)])
def test_programs_cover_the_batch_with_the_entries_fixed_or_computed(B, chunk):
    # X_FIRST > 0 fixes a program's entries at compile time (common.batch_range): with the
    # grid's cdiv(B, chunk) programs they cover every entry once, ragged last chunk included
    g = torch.Generator().manual_seed(B * 10 + chunk)
    x = torch.randn(2, B, 3, D, generator=g).to(DEVICE)
    freqs = ropelib.rope_freqs(16, D).to(DEVICE)
    want = ropelib.reference.rope_reference(x.double(), freqs).to(x.dtype)
    for start in (None, torch.arange(B).to(DEVICE)):    # one table, and rows per entry
        y = torch.full_like(x, float("nan"))
        plan, pointers = launch.plan(launch.View.of(x), launch.View.of(y),
                                     launch.Table(freqs[:, 0, 0], None),
                                     launch.Positions(start=start), R=D, interleaved=False,
                                     backward=False, layout="sbhd", tiles=(1, 2, chunk, 1))
        assert plan.args["X_FIRST"] == launch._x_first(B, chunk)
        launch.run(plan, pointers)
        expect = want if start is None else torch.stack(
            [ropelib.reference.rope_reference(x[:, b:b + 1].double(), freqs[b:b + 2])
             .to(x.dtype)[:, 0] for b in range(B)], 1)
        torch.testing.assert_close(y, expect, atol=1e-5, rtol=1e-5)
