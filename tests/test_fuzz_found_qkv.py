"""Cases random (differential) testing of ropelib.qkv_rope_linear found: each a behaviour the
unfused pipeline (F.linear, split, QK-norm, RoPE) pins down that the fused one got wrong."""
import pytest
import torch

import ropelib


@pytest.mark.parametrize("backward", ["dy", "prologue"])
def test_zero_hidden_size_is_refused_naming_x(backward, seeded):
    """x [B, S, 0] (hidden 0): the projection is the bias alone, but the backward went wrong
    ("dy": ZeroDivisionError; "prologue": a grid over K of 0 programs left the bias's gradient
    all zeros, silently). QKVRoPE already asks hidden_size >= 1; the function now refuses it
    up front, naming x."""
    x = torch.randn(2, 5, 0, requires_grad=True)
    w = torch.randn(32, 0, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    with pytest.raises(ValueError, match=r"x's last dim \(hidden\) must be >= 1"):
        ropelib.qkv_rope_linear(x, w, b, n_heads=2, n_kv_heads=1, head_dim=8,
                                freqs=ropelib.rope_freqs(16, 8), backward=backward)


@pytest.mark.parametrize("odd", ["dtype", "device"])
def test_from_linears_refuses_projections_of_mixed_dtype_or_device_naming_them(odd):
    """from_linears concatenated the three weights with torch.cat: an fp16 k_proj beside fp32
    q_proj and v_proj was silently promoted (a module of another dtype than k_proj's), and a
    projection on another device raised torch.cat's error, naming no projection."""
    q, k, v = torch.nn.Linear(16, 16), torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    k = k.half() if odd == "dtype" else k.to("meta")
    with pytest.raises(ValueError, match=r"share one dtype and device.*k_proj\.weight"):
        ropelib.QKVRoPE.from_linears(q, k, v, head_dim=8)


def test_an_rmsnorm_without_eps_is_refused_saying_why():
    """torch's nn.RMSNorm(eps=None) picks its eps from the input's dtype when it runs: the
    projection cannot know it, and says so instead of claiming the module has no eps."""
    import torch.nn as nn
    lin = nn.Linear(32, (4 + 2 * 2) * 8, bias=False)
    with pytest.raises(ValueError, match=r"q_norm\.eps is None"):
        ropelib.QKVRoPE.from_linear(lin, n_heads=4, n_kv_heads=2, head_dim=8,
                                    q_norm=nn.RMSNorm(8), k_norm=nn.RMSNorm(8))
