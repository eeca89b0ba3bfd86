"""Where one layer's RoPE call spends the host's time in notebook 09's model (appendix A.4).

One layer's q and k, taken from the model's own forward (its strided bshd views, its autocast
dtype), go through ``apply_rope_qk`` four ways (:data:`WAYS`), each issued ``calls`` times back
to back with no synchronisation between them: the host's issue time, µs per call. "no launch":
ropelib's Triton launches (``eager.EagerLaunch.__call__``) replaced by nothing, the planned
signatures kept (``probe_timers.without_launches``, ``replan=False``). Their
differences (:func:`parts`) split the host's time of a layer's forward+backward into the two
launches, the forward's Python, autograd's forward node and the backward's rest.
Off a GPU the same calls run in Triton's interpreter: the plumbing is tested, the times mean
nothing.
"""
from __future__ import annotations

import statistics
import time

import torch

from ropelib import apply_rope_qk, eager
from ropelib.course.probe_timers import without_launches

WAYS = ("fwd+bwd", "fwd+bwd, no launch", "fwd, no launch", "fwd, no_grad, no launch")


def layer_inputs(model, x, amp_dtype=None):
    """(q, k, freqs) of the first block's RoPE call in one forward of ``model`` on ``x``:
    q and k detached leaves that require grad, with the strides and dtype the model hands its
    rotary module."""
    rotary = model.blocks[0].attn.rotary
    got = {}
    hook = rotary.register_forward_hook(lambda mod, args, out: got.setdefault("qk", args))
    try:
        with torch.no_grad(), torch.autocast(x.device.type, dtype=amp_dtype or torch.float32,
                                             enabled=amp_dtype is not None):
            model(x)
    finally:
        hook.remove()
    q, k = (t.detach().requires_grad_() for t in got["qk"])
    return q, k, rotary.freqs[:q.shape[1]]


def host_split(q, k, freqs, *, calls: int, rounds: int, warmup: int) -> dict:
    """{way: median over ``rounds`` of the host's µs per call, ``calls`` calls issued back to
    back} for each of :data:`WAYS` (every way in each round, the order reversed every other
    round); ``warmup`` calls of each first."""
    gq, gk = torch.full_like(q, 0.5), torch.full_like(k, 0.5)
    sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)

    def fwd_bwd():
        oq, ok = apply_rope_qk(q, k, freqs, layout="bshd")
        torch.autograd.grad((oq, ok), (q, k), (gq, gk))

    def fwd():
        apply_rope_qk(q, k, freqs, layout="bshd")

    def fwd_no_grad():
        with torch.no_grad():
            apply_rope_qk(q, k, freqs, layout="bshd")

    ways = dict(zip(WAYS, (fwd_bwd, *(without_launches(fn, replan=False)
                                      for fn in (fwd_bwd, fwd, fwd_no_grad)))))
    launch = eager.EagerLaunch.__call__
    for fn in ways.values():
        for _ in range(warmup):
            fn()
    assert eager.EagerLaunch.__call__ is launch          # the launches are back
    times = {w: [] for w in WAYS}
    for r in range(rounds):
        for w in (WAYS if r % 2 == 0 else WAYS[::-1]):
            fn = ways[w]
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[w].append(1e6 * (time.perf_counter() - t0) / calls)   # issued, not finished
            sync()
    return {w: statistics.median(v) for w, v in times.items()}


def parts(split: dict) -> dict:
    """The host's µs of a layer's forward+backward by part, the differences of
    :func:`host_split`'s ways (they add up to "fwd+bwd")."""
    return {"two launches": split["fwd+bwd"] - split["fwd+bwd, no launch"],
            "backward's rest": split["fwd+bwd, no launch"] - split["fwd, no launch"],
            "autograd's forward node": split["fwd, no launch"] - split["fwd, no_grad, no launch"],
            "forward's Python": split["fwd, no_grad, no launch"]}
