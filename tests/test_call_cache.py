"""The call cache of apply_rope / apply_rope_qk (api._CALLS): what a cached call must still do.

A call's first run is validated and planned in full; later calls with the same signature reuse
the plan. They must still bind their own tensors, re-check index values they have not seen, and
refuse what the full checks refuse.
"""
import pytest
import torch

import ropelib
from ropelib import api
from ropelib.reference import rope_reference

S, B, H, D = 8, 2, 2, 16
F = ropelib.rope_freqs(2 * S + 4, D)


def x4(dtype=torch.float32):
    return torch.randn(S, B, H, D).to(dtype)


# --- the call cache ---------------------------------------------------------------------------

def test_cached_calls_bind_their_own_tensors(seeded):
    """A second call of the same signature uses its own x, tables and positions, not the first's."""
    api.clear_cache()
    S, B, H, D = 6, 2, 3, 16
    outs, refs = [], []
    for i in range(3):
        x = torch.randn(S, B, H, D, requires_grad=True)
        freqs = ropelib.rope_freqs(S + 4, D, base=100.0 * (i + 1))
        sp = torch.tensor([i, 3 - i])
        y = ropelib.apply_rope(x, freqs, start_positions=sp)
        g = torch.randn_like(y)
        y.backward(g)
        ref = rope_reference(x.detach().double(), freqs, start_positions=sp)
        refs.append(ref)
        torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
        # backward of a rotation is the inverse rotation: rotating x.grad forward gives g back
        back = rope_reference(x.grad.double(), freqs, start_positions=sp)
        torch.testing.assert_close(back, g.double(), atol=1e-5, rtol=1e-5)
    assert len(api._CALLS) == 1, "three calls of one signature should share one cache entry"


def test_cache_keys_on_alignment_strides_and_dtype(seeded):
    api.clear_cache()
    S, B, H, D = 4, 2, 2, 16
    freqs = ropelib.rope_freqs(S, D)
    base = torch.randn(S * B * H * D + 4)
    for x in (base[:S * B * H * D].view(S, B, H, D), base[1:1 + S * B * H * D].view(S, B, H, D),
              torch.randn(B, S, H, D).transpose(0, 1), torch.randn(S, B, H, D).double()):
        y = ropelib.apply_rope(x, freqs)
        torch.testing.assert_close(y.double(), rope_reference(x.double(), freqs),
                                   atol=1e-5, rtol=1e-5)
    # four signatures; the fp64 one converts the fp32 angles to fp64 per call, so is not kept
    assert len(api._CALLS) == 3


def test_converted_tables_are_not_reused(seeded):
    """bf16 angles are converted to fp32 per call: such a call is never served from the cache."""
    api.clear_cache()
    x = torch.randn(4, 2, 2, 16)
    for base in (100.0, 10000.0):
        freqs = ropelib.rope_freqs(4, 16, base=base).to(torch.bfloat16)
        y = ropelib.apply_rope(x, freqs)
        torch.testing.assert_close(y.double(), rope_reference(x.double(), freqs.float()),
                                   atol=1e-5, rtol=1e-5)
    assert not api._CALLS


# --- checks still run when a call of the same signature is cached ----------------------------

def _warm(**kw):
    """A good call that leaves its signature in the call cache."""
    api.clear_cache()
    ropelib.apply_rope(x4(), F, **kw)
    assert api._CALLS, "the good call was not cached"


@pytest.mark.parametrize("good,bad,match", [
    (dict(start_positions=torch.tensor([0, 1])), dict(start_positions=torch.tensor([0, 10**6])),
     "start_positions"),
    (dict(start_positions=torch.tensor([0, 1])), dict(start_positions=torch.tensor([-1, 0])),
     "start_positions"),
    (dict(position_ids=torch.arange(S)), dict(position_ids=torch.arange(S) + 10**6),
     "position_ids"),
    (dict(interleaved=True), dict(interleaved=1), "interleaved"),
    (dict(cp_size=2, cp_rank=1), dict(cp_size=2, cp_rank=2), "cp_rank"),
], ids=["start-too-large", "start-negative", "position-ids", "interleaved-int", "cp-rank"])
def test_bad_values_caught_with_a_warm_cache(good, bad, match):
    _warm(**good)
    x = x4()
    before = x.clone()
    with pytest.raises((ValueError, TypeError), match=match):
        ropelib.apply_rope(x, F, inplace=True, **bad)
    assert torch.equal(x, before)


def test_changed_index_tensor_in_place_is_rechecked():
    sp = torch.tensor([0, 1])
    ropelib.apply_rope(x4(), F, start_positions=sp)
    sp[1] = 10**6   # same object, new version
    with pytest.raises(ValueError, match="start_positions"):
        ropelib.apply_rope(x4(), F, start_positions=sp)


def test_inplace_qk_sharing_storage_refused_with_a_warm_cache():
    api.clear_cache()
    q, k = x4(), x4()
    ropelib.apply_rope_qk(q, k, F, inplace=True)
    base = torch.randn(2 * S, B, H, D)
    with pytest.raises(ValueError, match="sharing storage"):
        ropelib.apply_rope_qk(base[:S], base[S:], F, inplace=True)


# --- tables with equal halves (TE's duplicated freqs) ----------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("kind", ["angles", "cos-sin"])
def test_equal_halves_path_is_bit_identical(monkeypatch, interleaved, kind, seeded):
    freqs = ropelib.rope_freqs(S + 3, D, interleaved=interleaved)
    tables = dict(freqs=freqs) if kind == "angles" else dict(cos=freqs[:, 0, 0].cos(),
                                                               sin=freqs[:, 0, 0].sin())
    assert api._equal_halves(freqs, D, interleaved)
    x = x4(torch.bfloat16).requires_grad_(True)
    g = torch.randn(S, B, H, D, dtype=torch.bfloat16)
    runs = []
    for on in (False, True):
        monkeypatch.setattr(api, "SAME_HALVES", on)
        api.clear_cache()
        x.grad = None
        y = ropelib.apply_rope(x, interleaved=interleaved, start_positions=torch.tensor([1, 2]),
                               **tables)
        y.backward(g)
        q, k = ropelib.apply_rope_qk(x.detach(), x.detach()[:, :, :1], interleaved=interleaved,
                                     **tables)
        runs.append((y, x.grad.clone(), q, k))
        used = {p.consts["SAME_HALVES"] for c in api._CALLS.values() for p in c.fwd.values()}
        assert used == {on}, "the equal-halves flag did not reach the kernel"
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_unequal_halves_use_both_columns(seeded):
    f = ropelib.rope_freqs(S, D).clone()
    f[:, 0, 0, D // 2:] *= 1.5    # the second half no longer repeats the first
    assert not api._equal_halves(f, D, False)
    x = x4()
    torch.testing.assert_close(ropelib.apply_rope(x, f).double(), rope_reference(x.double(), f),
                               atol=1e-5, rtol=1e-5)


def test_equal_halves_rechecked_after_an_in_place_change(seeded):
    f = ropelib.rope_freqs(S, D).clone()
    x = x4()
    ropelib.apply_rope(x, f)                       # seen with equal halves
    f[:, 0, 0, D // 2:] += 0.25                    # same object, new version
    torch.testing.assert_close(ropelib.apply_rope(x, f).double(), rope_reference(x.double(), f),
                               atol=1e-5, rtol=1e-5)


def test_equal_halves_compares_bits():
    t = torch.zeros(3, 4)
    t[:, 2] = -0.0
    assert not api._equal_halves(t, 4, False)
    assert api._equal_halves(torch.ones(3, 4), 4, False)


def test_public_clear_cache_forgets_plans():
    ropelib.apply_rope(x4(), F)
    assert api._CALLS
    ropelib.clear_cache()
    assert not api._CALLS


def test_equal_halves_checked_once_per_table(monkeypatch):
    """The check reads the device: once for a table reused by many calls, not once per call."""
    seen = []
    orig = api._equal_halves
    monkeypatch.setattr(api, "_equal_halves", lambda *a: seen.append(1) or orig(*a))
    api.clear_cache()
    f = ropelib.rope_freqs(S, D).clone()
    for _ in range(3):
        ropelib.apply_rope(x4(), f)
    assert len(seen) == 1
