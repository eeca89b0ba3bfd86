"""Swap ropelib's kernel into Hugging Face `transformers` models without editing their code.

Llama-family modelling files call a module-level `apply_rotary_pos_emb(q, k, cos, sin)` from
their attention's forward, looked up by name at call time. Replacing that name in the module
(`transformers.models.llama.modeling_llama`, ...) with `ropelib.hf.apply_rotary_pos_emb`, which
has the same signature and semantics, routes every attention layer through the Triton kernel:

    with ropelib.hf_patch.patch_llama() as stats:
        out = model(input_ids)               # RoPE by ropelib, forward and backward
    assert stats.calls == model.config.num_hidden_layers

The swap is process-wide while the block runs (a module attribute, not thread-local) and is
undone on exit, exceptions included. `transformers` is an optional extra
(`pip install ropelib[hf]`); nothing here imports it until a patch is entered.
"""
import contextlib
import functools
import importlib
import importlib.util
from dataclasses import dataclass, field


@dataclass
class PatchStats:
    """What a patch did: the modules it patched and how often ropelib's function was called."""
    modules: list = field(default_factory=list)
    calls: int = 0


def _modeling_module(model_type: str):
    if not isinstance(model_type, str) or not model_type.isidentifier():
        raise ValueError(f"model_type must be a transformers model type such as 'llama', "
                         f"got {model_type!r}")
    name = f"transformers.models.{model_type}.modeling_{model_type}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "transformers" and \
                importlib.util.find_spec("transformers") is not None:
            raise ValueError(f"model_type {model_type!r}: transformers has no module {name}") from e
        raise
    if not callable(getattr(module, "apply_rotary_pos_emb", None)):
        raise ValueError(f"model_type {model_type!r}: {name} has no apply_rotary_pos_emb to swap")
    return module


@contextlib.contextmanager
def patch_hf_rope(*model_types: str):
    """Within the block, `modeling_<t>.apply_rotary_pos_emb` is ropelib's for each model type.

    Args:
        *model_types: transformers model types whose modelling file defines the standard
            `apply_rotary_pos_emb(q, k, cos, sin, ...)` (rotate-half, cos/sin [B, S, D] or
            [S, D]): "llama" (the default), "mistral", "qwen2", ... Models with a different
            RoPE function (e.g. multimodal rotary sections) are not supported.

    Yields:
        `PatchStats`: `calls` counts the calls that went through ropelib, so a caller can
        check the swap took effect.
    """
    model_types = model_types or ("llama",)
    modules = [_modeling_module(t) for t in model_types]   # all validated before any patching
    from .hf import apply_rotary_pos_emb
    stats = PatchStats(modules=[m.__name__ for m in modules])

    @functools.wraps(apply_rotary_pos_emb)
    def counted(*args, **kwargs):
        stats.calls += 1
        return apply_rotary_pos_emb(*args, **kwargs)

    originals = []
    try:
        for m in modules:
            originals.append((m, m.apply_rotary_pos_emb))
            m.apply_rotary_pos_emb = counted
        yield stats
    finally:
        for m, fn in reversed(originals):
            m.apply_rotary_pos_emb = fn


def patch_llama():
    """`patch_hf_rope("llama")`: Llama attention runs RoPE through ropelib's kernel."""
    return patch_hf_rope("llama")
