"""ropelib inside a Hugging Face Llama: `ropelib.hf_patch.patch_llama()` swaps
`modeling_llama.apply_rotary_pos_emb` for `ropelib.hf.apply_rotary_pos_emb`; logits, gradients and
greedy KV-cache decoding must match the stock model. Needs the optional `transformers` extra
(`pip install -e '.[hf]'`); skipped, with the reason, without it. No weights are downloaded: the
model is built from a small random config.
"""
import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face swap needs the optional extra: pip install -e '.[hf]'")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from ropelib.hf_patch import patch_hf_rope, patch_llama  # noqa: E402

LAYERS = 2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matrices: on a shared 2-core machine extra threads cost far more than they save
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def llama(device):
    # GQA (4 query heads, 2 KV heads), head_dim 16; a wide init so attention depends on position
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, initializer_range=0.2, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device).eval()


def _logits_and_grads(model, ids, **kw):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, **kw)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_patched_llama_matches_stock(llama, device):
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    stock = modeling_llama.apply_rotary_pos_emb
    logits_s, grads_s = _logits_and_grads(llama, ids)
    with patch_llama() as stats:
        assert modeling_llama.apply_rotary_pos_emb is not stock
        logits_p, grads_p = _logits_and_grads(llama, ids)
    assert stats.calls == LAYERS                                # every layer went through ropelib
    assert modeling_llama.apply_rotary_pos_emb is stock         # undone on exit
    torch.testing.assert_close(logits_p, logits_s, atol=1e-5, rtol=1e-5)
    for name, g in grads_s.items():
        torch.testing.assert_close(grads_p[name], g, atol=1e-5, rtol=1e-4, msg=name)

    # the comparison can fail: positions twice as far apart change logits and gradients by far
    # more (shifting them all by one would not: RoPE sees only relative positions)
    spread = 2 * torch.arange(12, device=device).expand(2, -1)
    logits_o, grads_o = _logits_and_grads(llama, ids, position_ids=spread)
    assert (logits_o - logits_s).abs().max() > 100 * 1e-5
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (grads_o[q] - grads_s[q]).abs().max() > 100 * 1e-5


def test_patched_llama_greedy_decoding_with_kv_cache(llama, device):
    # decoding rotates one new token at a time at positions 4, 5, ... (cos/sin [B, 1, D])
    ids = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(2)).to(device)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
              use_cache=True)
    with torch.no_grad():
        stock = llama.generate(ids, **kw)
        with patch_llama() as stats:
            patched = llama.generate(ids, **kw)
    assert stats.calls == LAYERS * 6                             # prefill + 5 decode steps
    assert torch.equal(patched, stock)


def test_patch_is_undone_after_an_exception():
    stock = modeling_llama.apply_rotary_pos_emb
    with pytest.raises(RuntimeError, match="boom"):
        with patch_hf_rope("llama", "mistral"):
            assert modeling_llama.apply_rotary_pos_emb is not stock
            raise RuntimeError("boom")
    assert modeling_llama.apply_rotary_pos_emb is stock
    from transformers.models.mistral import modeling_mistral
    assert modeling_mistral.apply_rotary_pos_emb.__module__.startswith("transformers")


def test_patch_bad_model_type():
    with pytest.raises(ValueError, match="model_type"):
        with patch_hf_rope("no_such_model"):
            pass
    with pytest.raises(ValueError, match="model_type"):
        with patch_hf_rope("llama-3"):
            pass
    assert modeling_llama.apply_rotary_pos_emb.__module__.startswith("transformers")
