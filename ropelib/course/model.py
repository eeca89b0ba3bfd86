"""A small GPT-style language model whose rotary embedding is ropelib's kernel or plain PyTorch.

Notebook 09 trains it twice from the same seed, once per RoPE implementation, and compares the
loss curves, the throughput and the share of a training step spent in RoPE. Everything here is
ordinary PyTorch except one line: `_Rotary.forward`, switched by `GPT(config, rope=...)`
(`rope="ropelib_qkv"` instead folds RoPE into the QKV projection's GEMM: notebook 12).

    data = CharDataset.from_pydoc_topics()                 # Python's own docs, no download
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=64)
    torch.manual_seed(0); model = GPT(cfg, rope="ropelib")
    history = train(model, data, steps=100, batch_size=16, seed=0)
    print(sample(model, data, "The ", 80))

The model (nanoGPT's layout with rotary attention instead of learned positions):
token embedding -> n_layer x [x + attn(ln1(x)); x + mlp(ln2(x))] -> ln_f -> head (tied to the
embedding). Attention: q, k, v [B, S, H, D] (bshd views of one QKV matmul), RoPE on q and k,
causal `scaled_dot_product_attention`.

Generation with a KV cache (`generate`, `forward_cached`, `KVCache`) runs the same weights one
step at a time: each layer appends its keys and values to a contiguous or paged cache at each
sequence's position, RoPE fused with that write (`ropelib.rope_kv_cache`) or not. The training
path above does not use it.

    out = generate(model, idx, 20, cache="paged")           # greedy, [B, T + 20]
"""
import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import reference
from ..frequencies import rope_cos_sin, rope_freqs

ROPE_IMPLS = ("ropelib", "reference")
# RoPE fused into the QKV projection's GEMM (ropelib.qkv_rope_linear): the same weights and
# angles as "ropelib", one kernel where the others run the projection and then RoPE
QKV_FUSED = "ropelib_qkv"
MODEL_ROPES = ROPE_IMPLS + (QKV_FUSED,)
ROPE_LABEL = "rope"  # torch.profiler range around every RoPE call (see rope_time_share)


# --- data -------------------------------------------------------------------------------------

def pydoc_topics_text() -> str:
    """The text of CPython's `pydoc_data.topics` (the `help()` topics), topics in sorted order.

    Ships with every CPython, so no download; about 465k characters on Python 3.11 (the exact
    text, and so the vocabulary, depends on the Python version).
    """
    from pydoc_data.topics import topics
    return "\n".join(topics[k] for k in sorted(topics))


class CharDataset:
    """A character-level corpus: vocabulary, encode/decode, a contiguous train/val split.

    Args:
        text: the corpus.
        val_fraction: the last `val_fraction` of the text is held out for validation.
    """

    def __init__(self, text: str, val_fraction: float = 0.1):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.text = text
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        data = torch.tensor(self.encode(text), dtype=torch.int64)
        n_train = int(len(data) * (1.0 - val_fraction))
        if n_train < 2 or len(data) - n_train < 2:
            raise ValueError(f"text of {len(text)} characters is too short to split with "
                             f"val_fraction={val_fraction}")
        self.train_data, self.val_data = data[:n_train], data[n_train:]

    @classmethod
    def from_pydoc_topics(cls, val_fraction: float = 0.1) -> "CharDataset":
        """The dataset built from `pydoc_topics_text()`."""
        return cls(pydoc_topics_text(), val_fraction)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list:
        """str -> list of token ids; ValueError for a character outside the vocabulary."""
        try:
            return [self.stoi[c] for c in s]
        except KeyError as e:
            raise ValueError(f"s contains {e.args[0]!r}, which is not in the vocabulary") from None

    def decode(self, ids) -> str:
        """Token ids (list or 1-D tensor) -> str."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.chars[i] for i in ids)

    def split(self, name: str) -> torch.Tensor:
        if name == "train":
            return self.train_data
        if name == "val":
            return self.val_data
        raise ValueError(f"split must be 'train' or 'val', got {name!r}")

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: Optional[torch.Generator] = None, device=None):
        """Random windows: x [B, T] int64 and targets y [B, T] = x shifted left by one."""
        data = self.split(split)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 1 <= block_size < len(data):
            raise ValueError(f"block_size must be in [1, {len(data) - 1}] for the {split} "
                             f"split, got {block_size}")
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
        idx = ix[:, None] + torch.arange(block_size + 1)            # [B, T+1]
        chunk = data[idx]
        x, y = chunk[:, :-1], chunk[:, 1:]
        if device is not None and torch.device(device).type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), \
                y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)


# --- model ------------------------------------------------------------------------------------

@dataclass
class GPTConfig:
    """Sizes of the model. head_dim = n_embd // n_head; rotary dim = head_dim * rotary_percent."""
    vocab_size: int
    block_size: int = 128        # longest context (rows of the RoPE table)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    rope_base: float = 10000.0
    rotary_percent: float = 1.0
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"head_dim = n_embd // n_head must be even for RoPE, got "
                             f"{self.n_embd // self.n_head}")
        if not 0.0 < self.rotary_percent <= 1.0:
            raise ValueError(f"rotary_percent must be in (0, 1], got {self.rotary_percent}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class _Rotary(nn.Module):
    """RoPE on q and k [B, S, H, D] (bshd), by ropelib's kernel or by plain PyTorch.

    Both start from the same fp32 angles and compute in fp32 with one rounding to the input
    dtype, so in fp32 they agree to the last few ulps. They do not round the same fp32 values:
    the kernel takes cos and sin of TE's angle table where it runs (on a GPU) and combines with
    one fma, while PyTorch reads the cos/sin table built here, on the CPU, when the module is
    made (torch's cos and sin on a CPU and on a GPU differ in the last bit of some entries) and
    multiplies and adds, rounding each product. Rounded to bf16, each difference changes about
    one entry in 10^5 (notebook 09, appendix A.1).
    """

    def __init__(self, config: GPTConfig, impl: str):
        super().__init__()
        self.impl = impl
        P, D = config.block_size, config.head_dim
        kw = dict(base=config.rope_base, rotary_percent=config.rotary_percent)
        # non-persistent: rebuilt from the config, so both variants share one state_dict
        self.register_buffer("freqs", rope_freqs(P, D, **kw), persistent=False)   # [P, 1, 1, R]
        cos, sin = rope_cos_sin(P, D, **kw)                                          # [P, R] each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        S = q.shape[1]
        with torch.profiler.record_function(ROPE_LABEL):
            if self.impl == "ropelib":
                from .. import apply_rope_qk  # the finished kernel, autograd-aware
                return apply_rope_qk(q, k, self.freqs[:S], layout="bshd")
            cos, sin = self.cos[:S, None, :], self.sin[:S, None, :]     # [S, 1, R] vs [B, S, H, R]
            return (reference.apply_rope_ref(q.float(), cos, sin).to(q.dtype),
                    reference.apply_rope_ref(k.float(), cos, sin).to(k.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, rope: str):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.fused_qkv = rope == QKV_FUSED
        self.rotary = _Rotary(config, "ropelib" if self.fused_qkv else rope)
        self.dropout = config.dropout

    def _qkv_rope(self, x):
        """q, k, v [B, S, H, D] from one GEMM that rotates q and k in its epilogue, with this
        block's own qkv weights (rows: q's heads, k's, v's) and angle table. Under autocast the
        operands are cast as autocast casts nn.Linear's (ropelib's operator is not on its list)."""
        w, b = self.qkv.weight, self.qkv.bias
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            x, w = x.to(dtype), w.to(dtype)
            b = b.to(dtype) if b is not None else None
        from .. import qkv_rope_linear
        return qkv_rope_linear(x, w, b, n_heads=self.n_head, n_kv_heads=self.n_head,
                               head_dim=self.head_dim, freqs=self.rotary.freqs[:x.shape[1]],
                               out_layout="bshd")

    def forward(self, x):
        B, S, C = x.shape
        if self.fused_qkv:
            q, k, v = self._qkv_rope(x)
        else:
            # [B, S, 3, H, D] -> three strided bshd views; the kernel reads them without a copy
            q, k, v = self.qkv(x).view(B, S, 3, self.n_head, self.head_dim).unbind(2)
            q, k = self.rotary(q, k)
        y = F.scaled_dot_product_attention(                       # [B, H, S, D]
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, S, C))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, rope: str):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, rope)
        self.ln2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """Decoder-only transformer with rotary attention.

    Args:
        config: a `GPTConfig`.
        rope: "ropelib" (ropelib.apply_rope_qk, the Triton kernel; on the CPU it needs
            TRITON_INTERPRET=1), "reference" (plain PyTorch, `reference.apply_rope_ref`) or
            "ropelib_qkv" (the QKV projection and RoPE in one Triton GEMM,
            `ropelib.qkv_rope_linear`, with the same qkv weights). The only difference between
            the models; parameters and their initialisation are identical, so a state_dict
            moves freely between them.
    """

    def __init__(self, config: GPTConfig, rope: str = "ropelib"):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        if rope not in MODEL_ROPES:
            raise ValueError(f"rope must be one of {MODEL_ROPES}, got {rope!r}")
        self.config, self.rope = config, rope
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, rope) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():    # GPT-2: residual projections scaled by depth
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        """idx [B, S] int64 -> logits [B, S, V] (and the mean cross-entropy when targets given)."""
        if idx.dim() != 2:
            raise ValueError(f"idx must be [B, S], got shape {tuple(idx.shape)}")
        if idx.shape[1] > self.config.block_size:
            raise ValueError(f"idx has {idx.shape[1]} tokens, more than block_size="
                             f"{self.config.block_size}")
        x = self.drop(self.tok_emb(idx))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def build(config: GPTConfig, rope: str, seed: int = 0, device=None) -> GPT:
    """`GPT(config, rope)` initialised from `seed` (same seed, same weights for either rope)."""
    torch.manual_seed(seed)
    return GPT(config, rope).to(device)


# --- TE-style attention (sbhd, freqs [S, 1, 1, R]) --------------------------------------------

class TEStyleAttention(nn.Module):
    """Self-attention written in Transformer Engine's convention: x [S, B, C] (sbhd), RoPE
    through `apply_rotary_pos_emb(t, freqs, tensor_format="sbhd")` with freqs [S, 1, 1, R].

    Args:
        n_embd, n_head: sizes (head_dim = n_embd // n_head).
        rope: "ropelib" -> `ropelib.te.apply_rotary_pos_emb(..., fused=True)` (the kernel);
            "reference" -> `ropelib.reference.te_unfused` (TE 2.x's plain-PyTorch path).
    """

    def __init__(self, n_embd: int, n_head: int, rope: str = "ropelib", bias: bool = False):
        super().__init__()
        if rope not in ROPE_IMPLS:
            raise ValueError(f"rope must be one of {ROPE_IMPLS}, got {rope!r}")
        if n_embd % n_head or (n_embd // n_head) % 2:
            raise ValueError(f"n_embd ({n_embd}) must split into n_head ({n_head}) heads of "
                             "even size")
        self.n_head, self.head_dim, self.rope = n_head, n_embd // n_head, rope
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)

    def _rope(self, t, freqs):
        if self.rope == "ropelib":
            from ..te import apply_rotary_pos_emb
            return apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=True)
        return reference.te_unfused(t, freqs, tensor_format="sbhd")

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """x [S, B, C], freqs [>=S, 1, 1, R] fp32 angles -> [S, B, C]."""
        S, B, C = x.shape
        q, k, v = self.qkv(x).view(S, B, 3, self.n_head, self.head_dim).unbind(2)  # [S, B, H, D]
        with torch.profiler.record_function(ROPE_LABEL):
            q, k = self._rope(q, freqs), self._rope(k, freqs)
        # sbhd -> [B, H, S, D] for SDPA
        y = F.scaled_dot_product_attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3),
                                           v.permute(1, 2, 0, 3), is_causal=True)
        return self.proj(y.permute(2, 0, 1, 3).reshape(S, B, C))


# --- training ---------------------------------------------------------------------------------

def _autocast(device: torch.device, amp_dtype):
    if amp_dtype is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=amp_dtype)


@torch.no_grad()
def estimate_loss(model: GPT, data: CharDataset, split: str, *, iters: int, batch_size: int,
                  seed: int = 1234, amp_dtype=None) -> float:
    """Mean loss over `iters` batches drawn with a fixed seed (identical batches on every call)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    losses = torch.zeros(iters, device=device)
    for i in range(iters):
        x, y = data.get_batch(split, batch_size, model.config.block_size, g, device)
        with _autocast(device, amp_dtype):
            losses[i] = model(x, y)[1]
    model.train(was_training)
    return losses.mean().item()


def make_optimizer(model: GPT, *, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """`train`'s AdamW: weight decay on the matrices only, betas (0.9, 0.95), fused on a GPU."""
    device = next(model.parameters()).device
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def train_step(model: GPT, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
               amp_dtype=None, grad_clip: float = 1.0) -> torch.Tensor:
    """One step of `train`: forward under autocast (`amp_dtype`, None: off), backward, gradient
    clipping to norm `grad_clip` (0: none), optimiser step. Returns the loss (not synchronised)."""
    with _autocast(x.device, amp_dtype):
        _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss


def train(model: GPT, data: CharDataset, *, steps: int, batch_size: int, lr: float = 1e-3,
          min_lr: Optional[float] = None, warmup: Optional[int] = None,
          weight_decay: float = 0.1, grad_clip: float = 1.0, seed: int = 0,
          eval_every: Optional[int] = None, eval_iters: int = 20, amp_dtype="auto",
          timing_warmup: Optional[int] = None, progress: bool = False) -> dict:
    """Train `model` on `data` with AdamW, linear warmup and cosine decay.

    Batches come from a generator seeded with `seed`, so two models trained with the same seed
    see the same batches in the same order. `amp_dtype="auto"`: bf16 autocast on a GPU, fp32 on
    the CPU; None turns autocast off.

    Returns a dict: `step`, `train_loss` (every step, each on its own batch), `eval_step`,
    `val_loss` and `eval_train_loss` (every `eval_every` steps and at the end: the mean loss over
    `eval_iters` fixed batches of the validation and of the training split, as nanoGPT's
    `estimate_loss` gives both), `tokens_per_s` and `ms_per_step` over the steps after
    the first `timing_warmup` (compilation, allocator warm-up), evaluation time excluded;
    `train_time_s`, `tokens`, `device`, `amp_dtype`, `rope`, `seed`.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    device = next(model.parameters()).device
    if amp_dtype == "auto":
        amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    min_lr = lr / 10 if min_lr is None else min_lr
    warmup = min(100, steps // 10) if warmup is None else warmup
    eval_every = eval_every or steps
    timing_warmup = min(5, steps // 5) if timing_warmup is None else timing_warmup
    T = model.config.block_size

    opt = make_optimizer(model, lr=lr, weight_decay=weight_decay)

    def lr_at(it):
        if it < warmup:
            return lr * (it + 1) / warmup
        t = (it - warmup) / max(1, steps - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    g = torch.Generator().manual_seed(seed)
    losses = torch.zeros(steps, device=device)      # kept on the device: no sync per step
    eval_steps, val_losses, eval_train_losses = [], [], []
    eval_time, t_start = 0.0, None
    t_all = time.perf_counter()
    model.train()
    for it in range(steps):
        if it == timing_warmup:
            sync()
            t_start, eval_time = time.perf_counter(), 0.0
        for group in opt.param_groups:
            group["lr"] = lr_at(it)
        x, y = data.get_batch("train", batch_size, T, g, device)
        loss = train_step(model, opt, x, y, amp_dtype=amp_dtype, grad_clip=grad_clip)
        losses[it] = loss.detach()
        if (it + 1) % eval_every == 0 or it + 1 == steps:
            sync()
            t0 = time.perf_counter()
            val_losses.append(estimate_loss(model, data, "val", iters=eval_iters,
                                            batch_size=batch_size, amp_dtype=amp_dtype))
            eval_train_losses.append(estimate_loss(model, data, "train", iters=eval_iters,
                                                   batch_size=batch_size, amp_dtype=amp_dtype))
            eval_steps.append(it + 1)
            eval_time += time.perf_counter() - t0
            if progress:
                print(f"step {it + 1:5d}  train {losses[it].item():.4f}  "
                      f"val {val_losses[-1]:.4f}", flush=True)
    sync()
    t_end = time.perf_counter()
    timed_steps = steps - timing_warmup
    elapsed = (t_end - t_start - eval_time) if t_start is not None else float("nan")
    return {
        "step": list(range(1, steps + 1)),
        "train_loss": losses.tolist(),
        "eval_step": eval_steps,
        "val_loss": val_losses,
        "eval_train_loss": eval_train_losses,
        "tokens_per_s": timed_steps * batch_size * T / elapsed if timed_steps else float("nan"),
        "ms_per_step": 1e3 * elapsed / timed_steps if timed_steps else float("nan"),
        "train_time_s": t_end - t_all,
        "tokens": steps * batch_size * T,
        "device": str(device),
        "amp_dtype": str(amp_dtype).replace("torch.", "") if amp_dtype else "float32",
        "rope": model.rope,
        "seed": seed,
    }


@torch.no_grad()
def sample(model: GPT, data: CharDataset, prompt: str, max_new_tokens: int, *,
           temperature: float = 0.8, top_k: Optional[int] = None, seed: int = 0) -> str:
    """Continue `prompt` by `max_new_tokens` characters (no KV cache: the window slides)."""
    if not prompt:
        raise ValueError("prompt must be a non-empty string")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    idx = torch.tensor([data.encode(prompt)], dtype=torch.int64, device=device)
    was_training = model.training
    model.eval()
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.config.block_size:])
        logits = logits[:, -1, :].float() / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=g)
        idx = torch.cat((idx, nxt), dim=1)
    model.train(was_training)
    return data.decode(idx[0])


# --- generation with a KV cache ---------------------------------------------------------------

CACHE_KINDS = ("contiguous", "paged")


class KVCache:
    """Keys and values of every layer of a GPT for a batch of sequences, appended at each
    sequence's own position by `forward_cached`.

    kind "contiguous": k[i], v[i] [B, max_len, H, D]. kind "paged": k[i], v[i]
    [n_blocks, page_size, H, D], a pool of blocks of page_size positions, and block_table
    [B, max_len / page_size] int32: sequence b's position p lives in block
    block_table[b, p // page_size] at offset p % page_size. The blocks are handed out in a
    shuffled order, so a lookup that ignored the table could not pass unnoticed.
    seqlens [B] int32 (on the device): tokens cached per sequence, the next token's position.
    dtype float8_e4m3fn stores fp8(value / scale), with k_scale for keys and v_scale for values.
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, *,
                 kind: str = "contiguous", page_size: int = 16, dtype=torch.float32,
                 device=None, k_scale: float = 1.0, v_scale: float = 1.0):
        if kind not in CACHE_KINDS:
            raise ValueError(f"kind must be one of {CACHE_KINDS}, got {kind!r}")
        if batch < 1 or max_len < 1 or page_size < 1:
            raise ValueError(f"batch, max_len and page_size must be >= 1, got {batch}, "
                             f"{max_len}, {page_size}")
        H, D = config.n_head, config.head_dim
        self.kind, self.dtype, self.length = kind, dtype, 0
        if kind == "paged":
            per_seq = -(-max_len // page_size)
            g = torch.Generator().manual_seed(0)
            order = torch.randperm(batch * per_seq, generator=g)
            self.block_table = order.view(batch, per_seq).to(torch.int32).to(device)
            shape = (batch * per_seq, page_size, H, D)
        else:
            self.block_table = None
            shape = (batch, max_len, H, D)
        self.max_len = max_len
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        fp8 = dtype == torch.float8_e4m3fn
        self.k_scale = torch.tensor([k_scale], device=device) if fp8 else None
        self.v_scale = torch.tensor([v_scale], device=device) if fp8 else None

    def read(self, i: int, length: int, dtype) -> tuple:
        """Layer i's keys and values of positions 0..length-1: [B, length, H, D] each, in
        `dtype` (dequantized: value * scale, for an fp8 cache)."""
        out = []
        for cache, scale in ((self.k[i], self.k_scale), (self.v[i], self.v_scale)):
            if self.block_table is not None:    # [B, blocks, page, H, D] -> [B, positions, H, D]
                cache = cache[self.block_table.long()].flatten(1, 2)
            t = cache[:, :length].float()
            out.append((t * scale if scale is not None else t).to(dtype))
        return tuple(out)


def _attention_cached(attn: CausalSelfAttention, x: torch.Tensor, cache: KVCache, i: int,
                      fused: bool) -> torch.Tensor:
    """CausalSelfAttention.forward for new tokens x [B, S, C] that attend to the cache."""
    from ..api import apply_rope_qk
    from ..kv_cache import rope_kv_cache, write_kv_cache

    B, S, C = x.shape
    q, k, v = attn.qkv(x).view(B, S, 3, attn.n_head, attn.head_dim).unbind(2)   # [B, S, H, D]
    freqs = attn.rotary.freqs                                                  # [P, 1, 1, R]
    kc, vc = cache.k[i], cache.v[i]
    scales = dict(block_table=cache.block_table, k_scale=cache.k_scale, v_scale=cache.v_scale)
    if fused:   # one launch: rotate q and k, write k and v into the cache
        q = rope_kv_cache(q, k, v, kc, vc, cache.seqlens, freqs, **scales)
    else:       # ropelib's RoPE, then the cache write in PyTorch
        pos = cache.seqlens.long()[:, None] + torch.arange(S, device=x.device)       # [B, S]
        q, k = apply_rope_qk(q, k, freqs, layout="bshd", position_ids=pos)
        write_kv_cache(k, v, kc, vc, cache.seqlens, **scales)
    L = cache.length + S
    keys, values = cache.read(i, L, q.dtype)                                   # [B, L, H, D]
    pos = cache.seqlens[:, None] + torch.arange(S, device=x.device)            # [B, S]
    mask = torch.arange(L, device=x.device)[None, None, :] <= pos[:, :, None]  # [B, S, L]
    y = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2),
                                       values.transpose(1, 2), attn_mask=mask[:, None])
    return attn.proj(y.transpose(1, 2).reshape(B, S, C))


@torch.no_grad()
def forward_cached(model: GPT, idx: torch.Tensor, cache: KVCache, *,
                   fused: bool = True) -> torch.Tensor:
    """The next S tokens idx [B, S] of every sequence, attending to what the cache holds:
    logits [B, S, V]. Appends their keys and values to the cache and advances it by S.
    (The model in eval mode: no dropout.)"""
    if idx.dim() != 2:
        raise ValueError(f"idx must be [B, S], got shape {tuple(idx.shape)}")
    S = idx.shape[1]
    if cache.length + S > min(cache.max_len, model.config.block_size):
        raise ValueError(f"the cache holds {cache.length} tokens; {S} more exceed its "
                         f"{cache.max_len} positions or block_size={model.config.block_size}")
    logits = forward_with(model, idx, lambda i, attn, h: _attention_cached(attn, h, cache, i,
                                                                          fused))
    cache.seqlens += S
    cache.length += S
    return logits


def forward_with(model: GPT, idx: torch.Tensor, attention) -> torch.Tensor:
    """GPT.forward (eval: no dropout) of tokens idx [B, S] with `attention(i, attn, h) -> y`
    [B, S, C] as layer i's attention, `attn` its CausalSelfAttention and h [B, S, C] its
    normed input: logits [B, S, V]. The blocks' other steps are the model's own (Block.forward);
    cached decoding hands each layer's attention what the cache holds."""
    x = model.tok_emb(idx)
    for i, block in enumerate(model.blocks):
        x = x + attention(i, block.attn, block.ln1(x))
        x = x + block.proj(F.gelu(block.fc(block.ln2(x))))
    return model.head(model.ln_f(x))


@torch.no_grad()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, *,
             cache: Optional[str] = "contiguous", fused: bool = True, page_size: int = 16,
             cache_dtype=None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Greedy decoding: idx [B, T] prompts -> [B, T + max_new_tokens] (argmax at every step).

    cache "contiguous" or "paged": the prompt is run once (prefill), then one token per step
    through `forward_cached`, RoPE fused with the cache write (fused=True, ropelib.rope_kv_cache)
    or not (fused=False: ropelib.apply_rope_qk, then the write in PyTorch). cache None: no
    cache, the whole sequence through the model at every step (the baseline).
    cache_dtype: the cache's dtype (default: the model's); float8_e4m3fn with k_scale, v_scale.
    Every position must have a table row: T + max_new_tokens - 1 <= block_size.
    """
    if cache is not None and cache not in CACHE_KINDS:
        raise ValueError(f"cache must be one of {CACHE_KINDS} or None, got {cache!r}")
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"idx must be [B, T] with T >= 1, got shape {tuple(idx.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    B, T = idx.shape
    if T + max_new_tokens - 1 > model.config.block_size:
        raise ValueError(f"prompt length {T} + max_new_tokens {max_new_tokens} - 1 exceeds "
                         f"block_size={model.config.block_size} (the table's positions)")
    if max_new_tokens == 0:
        return idx
    was_training = model.training
    model.eval()
    try:
        if cache is None:
            for _ in range(max_new_tokens):
                logits, _ = model(idx)
                idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
            return idx
        param = next(model.parameters())
        kv = KVCache(model.config, B, T + max_new_tokens - 1, kind=cache, page_size=page_size,
                     dtype=cache_dtype or param.dtype, device=param.device, k_scale=k_scale,
                     v_scale=v_scale)
        logits = forward_cached(model, idx, kv, fused=fused)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat((idx, nxt), dim=1)
            if step + 1 < max_new_tokens:
                logits = forward_cached(model, nxt, kv, fused=fused)
        return idx
    finally:
        model.train(was_training)


# --- where the step time goes -----------------------------------------------------------------

def rope_time_share(model: GPT, data: CharDataset, *, batch_size: int, steps: int = 5,
                    warmup: int = 2, amp_dtype="auto") -> dict:
    """Share of a training step spent in RoPE, by torch.profiler. The step is `train`'s own
    (`train_step`: forward under autocast, backward, gradient clipping to norm 1, `train`'s AdamW
    from `make_optimizer`), at a fixed learning rate of 1e-4.

    RoPE forward: everything under the `ROPE_LABEL` ranges (`_Rotary.forward`). RoPE backward:
    the autograd nodes created inside those ranges, found by their sequence numbers (the
    profiler tags a forward op and the backward of its node with the same `sequence_nr`). On a
    GPU the times are kernel (device) times, on the CPU host (CPU) times.

    The host side of the same events, on either device: `rope_host_fwd_ms` is the host time
    spent inside the RoPE ranges (on a GPU: dispatching and launching RoPE's kernels),
    `rope_host_bwd_ms` the host time of the RoPE backward nodes, `step_host_ms` the host time of
    the `train_step` ranges around each step, `host_share` = `rope_host_ms / step_host_ms`. A
    backward node's `cpu_time_total` is its wall-clock span on the thread that ran it. On a GPU
    autograd runs the backward of CUDA tensors on its own device thread, not on the thread that
    called `loss.backward()`: the node times are that thread's, while the caller waits in
    `backward()`, inside its `train_step` range, so they lie within the step's host span. On
    the CPU the backward runs on the calling thread, and the host numbers equal the device-clock
    ones (`rope_host_ms == rope_ms`, ...). Host times include the profiler's own cost per
    recorded op (a few µs), which weighs more on a RoPE made of many small ops, and any time the
    host waits for the device (nothing in the step synchronises: only a full launch queue, in a
    step the device is too slow for, would make it wait).

    Returns `share`, `rope_ms` and `step_ms` per step, `rope_fwd_ms`, `rope_bwd_ms`, `time` (which
    clock), `rope_host_ms`, `rope_host_fwd_ms`, `rope_host_bwd_ms`, `step_host_ms` and
    `host_share` (host time, per step), `backward_nodes` (the autograd nodes counted as RoPE
    backward) and, on a GPU,
    `kernel_names` (the device kernels counted as RoPE), `named_kernel_ms` (a cross-check:
    the time of device kernels with "rope" in their name; for ropelib it should equal
    `rope_ms`, for the PyTorch reference it is 0: its kernels are generic elementwise ones) and
    `device_events`: every kernel, memcpy and memset of one more step, profiled alone, in
    order, as (name, device µs) pairs (None on the CPU).
    """
    from torch.profiler import ProfilerActivity, profile

    device = next(model.parameters()).device
    if amp_dtype == "auto":
        amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    on_cuda = device.type == "cuda"
    T = model.config.block_size
    g = torch.Generator().manual_seed(0)
    opt = make_optimizer(model, lr=1e-4)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def step():
        x, y = data.get_batch("train", batch_size, T, g, device)
        train_step(model, opt, x, y, amp_dtype=amp_dtype)

    model.train()
    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    if on_cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities, acc_events=True) as prof:
        for _ in range(steps):
            with torch.profiler.record_function("train_step"):
                step()
        if on_cuda:
            torch.cuda.synchronize(device)
    step_events = None
    if on_cuda:     # one more step alone: its device events, in order
        with profile(activities=activities, acc_events=True) as one:
            step()
            torch.cuda.synchronize(device)
        found = [e for e in one.events() if e.device_type == torch.autograd.DeviceType.CUDA
                 and not e.is_user_annotation]
        step_events = [(e.name, e.device_time_total)
                       for e in sorted(found, key=lambda e: e.time_range.start)]
    model.load_state_dict(state)   # leave the model as it was

    events = prof.events()
    CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    clock = (lambda e: e.device_time_total) if on_cuda else (lambda e: e.cpu_time_total)

    def subtree(e):
        yield e
        for c in e.cpu_children:
            yield from subtree(c)

    rope_ranges = [e for e in events if e.name == ROPE_LABEL and e.device_type == CPU]
    inside = {id(c) for e in rope_ranges for c in subtree(e)}
    seq = {c.sequence_nr for e in rope_ranges for c in subtree(e) if c.sequence_nr >= 0}
    # An op that makes no autograd node only peeks at the next sequence number, which the next
    # op that does make one takes; if that op is outside the RoPE range, the node is not RoPE's.
    nodes = [e for e in events if e.name.startswith("autograd::engine::evaluate_function")]
    backward_side = {id(c) for e in nodes for c in subtree(e)}
    seq -= {e.sequence_nr for e in events if e.device_type == CPU and id(e) not in inside
            and id(e) not in backward_side}
    bwd = [e for e in nodes if e.sequence_nr in seq]
    fwd_us = sum(clock(e) for e in rope_ranges)
    bwd_us = sum(clock(e) for e in bwd)
    # the host side: the same ranges and nodes by CPU time (a node's on the thread that ran it)
    fwd_host_us = sum(e.cpu_time_total for e in rope_ranges)
    bwd_host_us = sum(e.cpu_time_total for e in bwd)
    step_host_us = sum(e.cpu_time_total for e in events
                       if e.name == "train_step" and e.device_type == CPU)
    if on_cuda:
        # the step on the device: every kernel, memcpy and memset, not the range annotations
        device_events = [e for e in events if e.device_type == CUDA and not e.is_user_annotation
                         and e.name not in (ROPE_LABEL, "train_step")]
        step_us = sum(e.device_time_total for e in device_events)
        named_us = sum(e.device_time_total for e in device_events if "rope" in e.name.lower())
        kernel_names = sorted({k.name for e in rope_ranges + bwd for s in subtree(e)
                               for k in s.kernels})
    else:
        step_us = step_host_us
        named_us, kernel_names = None, None
    if not rope_ranges or step_us <= 0 or step_host_us <= 0:
        raise RuntimeError("the profiler saw no RoPE ranges or no step time; is the model a GPT?")
    return {
        "share": (fwd_us + bwd_us) / step_us,
        "rope_ms": (fwd_us + bwd_us) / 1e3 / steps,
        "rope_fwd_ms": fwd_us / 1e3 / steps,
        "rope_bwd_ms": bwd_us / 1e3 / steps,
        "step_ms": step_us / 1e3 / steps,
        "host_share": (fwd_host_us + bwd_host_us) / step_host_us,
        "rope_host_ms": (fwd_host_us + bwd_host_us) / 1e3 / steps,
        "rope_host_fwd_ms": fwd_host_us / 1e3 / steps,
        "rope_host_bwd_ms": bwd_host_us / 1e3 / steps,
        "step_host_ms": step_host_us / 1e3 / steps,
        "backward_nodes": sorted({e.name.split(": ", 1)[-1] for e in bwd}),
        "time": "device (kernel) time" if on_cuda else "host (CPU) time",
        "kernel_names": kernel_names,
        "named_kernel_ms": None if named_us is None else named_us / 1e3 / steps,
        "device_events": step_events,
    }


# --- loss-curve data and figure ---------------------------------------------------------------

def write_history_csv(histories: dict, path, meta: Optional[dict] = None) -> str:
    """Loss curves of several runs to one CSV: `step`, then `train_loss:<run>` for every step and
    `val_loss:<run>` where the run evaluated (empty elsewhere), and `eval_train_loss:<run>` there
    for a run that has it (`train`'s estimate on fixed training batches). `meta` (e.g. sizes,
    tokens/s, `ropelib.bench.compare.environment_meta()`) goes first as `# key: value` lines."""
    import csv
    import os

    if not histories:
        raise ValueError("histories must not be empty")
    steps = sorted({s for h in histories.values() for s in h["step"]})
    cols = {}
    for name, h in histories.items():
        cols[f"train_loss:{name}"] = dict(zip(h["step"], h["train_loss"]))
        cols[f"val_loss:{name}"] = dict(zip(h["eval_step"], h["val_loss"]))
        if "eval_train_loss" in h:
            cols[f"eval_train_loss:{name}"] = dict(zip(h["eval_step"], h["eval_train_loss"]))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        for k, v in (meta or {}).items():
            f.write(f"# {k}: {str(v).replace(chr(10), ' ')}\n")
        w = csv.writer(f)
        w.writerow(["step", *cols])
        for s in steps:
            w.writerow([s, *(("" if s not in c else f"{c[s]:.9g}") for c in cols.values())])
    return str(path)


def read_history_csv(path):
    """(meta, histories) back from `write_history_csv`: histories[run] has `step`,
    `train_loss`, `eval_step`, `val_loss` lists, and `eval_train_loss` where the file has it."""
    import csv

    meta, lines = {}, []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("# "):
                k, _, v = line[2:].rstrip("\n").partition(": ")
                meta[k] = v
            else:
                lines.append(line)
    histories = {}
    for row in csv.DictReader(lines):
        step = int(row.pop("step"))
        for col, v in row.items():
            kind, name = col.split(":", 1)
            h = histories.setdefault(name, {"step": [], "train_loss": [], "eval_step": [],
                                            "val_loss": []})
            if kind == "eval_train_loss":
                h.setdefault("eval_train_loss", [])
            if v == "":
                continue
            if kind == "train_loss":
                h["step"].append(step)
                h["train_loss"].append(float(v))
            elif kind == "val_loss":
                h["eval_step"].append(step)
                h["val_loss"].append(float(v))
            elif kind == "eval_train_loss":
                h["eval_train_loss"].append(float(v))
            else:
                raise ValueError(f"{path}: unknown column {col!r}")
    return meta, histories


def ema(values, alpha: float = 0.05) -> list:
    """Exponential moving average (bias-corrected), for reading noisy per-step losses."""
    out, m = [], 0.0
    for i, v in enumerate(values, 1):
        m = (1 - alpha) * m + alpha * v
        out.append(m / (1 - (1 - alpha) ** i))
    return out


def plot_loss_curves(histories: dict, path=None, *, baseline: str, title: str = "",
                     right_only=()):
    """Left: train loss (EMA) and val loss of every run. Right: |val loss - baseline's| per run,
    the kernel's difference next to the seed-to-seed one. Runs named in `right_only` (a control,
    say) are drawn on the right only. Saves to `path` when given."""
    import matplotlib.pyplot as plt

    unknown = set(right_only) - set(histories)
    if unknown or baseline in right_only:
        raise ValueError(f"right_only must name runs other than the baseline {baseline!r} among "
                         f"{sorted(histories)}, got {sorted(right_only)}")
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(11, 4))
    base = histories[baseline]
    for i, (name, h) in enumerate(histories.items()):
        color = f"C{i}"
        wide = i == 0          # the first run drawn wide and pale: visible under a curve on top
        if name not in right_only:
            ax.plot(h["step"], h["train_loss"], color=color, alpha=0.15, lw=0.8)
            ax.plot(h["step"], ema(h["train_loss"]), color=color, lw=4 if wide else 1.5,
                    alpha=0.5 if wide else 1.0, label=f"{name} train (EMA)")
            ax.plot(h["eval_step"], h["val_loss"], "o--", color=color, ms=7 if wide else 3, lw=1,
                    alpha=0.5 if wide else 1.0, label=f"{name} val")
        if name != baseline:
            d = [abs(a - b) for a, b in zip(h["val_loss"], base["val_loss"])]
            ax_d.semilogy(h["eval_step"], [max(x, 1e-9) for x in d], "o-", color=color, ms=3,
                          label=f"|{name} - {baseline}|")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/char)", title=title or "loss curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax_d.set(xlabel="step", ylabel="|difference in val loss| (0 drawn at 1e-9)",
             title="difference from " + baseline)
    ax_d.grid(alpha=0.3, which="both")
    ax_d.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_train_loss_differences(histories: dict, path=None, *, baseline: str, runs,
                                last_step: int = 60, title: str = ""):
    """|train loss - baseline's| at every step 1 .. last_step, log scale, one line per run in
    `runs`: for runs that draw the same batches as the baseline (per-step training losses of
    runs on other batches differ mostly by their batches). An exact 0 is drawn at 1e-9. Saves to
    `path` when given."""
    import matplotlib.pyplot as plt

    base = dict(zip(histories[baseline]["step"], histories[baseline]["train_loss"]))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, name in enumerate(runs):
        h = histories[name]
        pairs = [(s, abs(loss - base[s])) for s, loss in zip(h["step"], h["train_loss"])
                 if s <= last_step and s in base]
        ax.semilogy([s for s, _ in pairs], [max(d, 1e-9) for _, d in pairs], "o-",
                    color=f"C{i}", ms=2.5, lw=1, label=f"|{name} - {baseline}|")
    ax.set(xlabel="step", ylabel="|difference in train loss| (0 drawn at 1e-9)",
           title=title or f"training loss, difference from {baseline}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
