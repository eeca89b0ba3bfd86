"""ropelib/course/nb09_host_split.py: notebook 09's split of a layer's RoPE host time (CPU)."""
import torch

from ropelib import eager
from ropelib.course import nb09_host_split as hs
from ropelib.course.model import GPTConfig, build


def test_layer_inputs_are_the_models_views_and_the_parts_add_up():
    cfg = GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model = build(cfg, "ropelib", seed=0, device="cpu")
    q, k, freqs = hs.layer_inputs(model, torch.randint(0, 20, (2, 8)))
    assert q.shape == k.shape == (2, 8, 2, 8) and q.requires_grad and q.is_leaf
    assert not q.is_contiguous()                      # the model's strided view of qkv
    assert freqs.shape[0] == 8
    launch = eager.EagerLaunch.__call__
    split = hs.host_split(q, k, freqs, calls=1, rounds=1, warmup=1)
    assert eager.EagerLaunch.__call__ is launch       # the launches are put back
    assert list(split) == list(hs.WAYS) and all(v > 0 for v in split.values())
    parts = hs.parts(split)
    assert abs(sum(parts.values()) - split["fwd+bwd"]) < 1e-6 * split["fwd+bwd"]
    # in the interpreter a launch runs the kernel: it dwarfs everything else
    assert parts["two launches"] > split["fwd+bwd, no launch"]
