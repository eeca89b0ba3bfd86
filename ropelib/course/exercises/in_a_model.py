"""Exercise checks for notebook 09 (ropelib inside a small GPT).

* Exercise 1, `rope_share(events, rope_names)`: from (kernel name, device µs) pairs of one
  profiled step and substrings naming RoPE's kernels, RoPE's µs, the step's µs and RoPE's share
  of the step. Tried on made-up steps whose answer is known, chosen so that the usual slips (an
  exact name match, a dict that keeps one launch per name, a kernel counted once per substring, a
  percentage) give a wrong answer somewhere, on the notebook's model's own steps as a GPU
  profiled them (`STEP_KERNELS`, with ropelib's RoPE and with the PyTorch reference), and on a
  step drawn when the check runs (`own_code.fresh_generator`, its seed in the case's label).
  Its second part, `rope_copies(events, rope_names, qk_shape, elt_bytes, copy_gbps)`: the bytes
  RoPE's launches move in the step (each launch reads and writes one layer's q and k of
  `qk_shape`), and RoPE's time in copies of those bytes at `copy_gbps`. The number of launches,
  hence of layers and passes, is read off the events: a step of 4 launches is not one of 12.
* Exercise 2, `cached_attention(attn, x, past_k, past_v)`: one attention layer of the notebook's
  GPT, decoding with a KV cache. S new tokens follow L cached ones, so their q and k are rotated
  at the absolute positions L .. L+S-1; the new keys and values are appended to the cache, and
  the layer's output is returned with the grown cache. `check_cached_attention` builds a small
  GPT whose attention depends on positions, runs a prompt and then one or a few tokens at a time
  through the model with the learner's function as every layer's attention (`decode_with`), and
  compares each step, layer by layer, with the model's full forward over the whole sequence: the
  cached keys left as they were, the new keys (when they are wrong: at which positions they were
  rotated), the values, the attention output, and the logits.

* Exercise 3, `my_model_rope_kernel`: a @triton.jit RoPE kernel for the model's layout (q and k
  [B, S, H, D], strided views of the QKV projection's output; `MODEL_ROPE_ROWS` rows, one head
  of one token each, a program), the signature `launch_model_rope` launches.
  `check_model_rope_kernel` runs it on the CPU with Triton's interpreter, on tiny shapes: one
  launch on a strided q against `ropelib.reference`, then a small GPT with the kernel as its
  RoPE (`plug_rope`: every layer's `attn.rotary` becomes a `KernelRotary`, whose backward is the
  same kernel on the negated angles) trained for a few steps next to the same GPT with its own
  PyTorch RoPE: losses, gradients and logits must agree. `kernel_rope(kernel)` makes the same
  plug from a kernel as it is (compiled on a GPU), for the notebook's trained model.

Every learner function runs with ropelib's own answers and the worked solutions barred
(`own_code`). The cached attention may rotate with ropelib's RoPE functions, whose position
arguments are the point of the exercise: `apply_rope` and `apply_rope_qk` (the kernel),
`ropelib.reference` (plain PyTorch) and the tables of `ropelib.frequencies`. What would do the
whole job stays barred: `ropelib.rope_kv_cache` (it reads each token's position off the cache
itself) and the model's own cached decoding (`forward_cached`, `generate`). The kernel of
exercise 3 is launched with ropelib's kernels, the course's teaching kernels and every worked
solution barred (notebook 03's kernel of ROWS rows a program among them), as a kernel or as a
helper it calls.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import ropelib
from ... import frequencies, reference, runtime
from .. import model as gpt
from ..work_count import interpreted
from . import check, guard_band_writes, guarded_view, kernel_answer
from .own_code import check_cases, fresh_generator, fresh_seed, launch_barred, run_own_code

__all__ = ["check_rope_share", "solution_rope_share", "check_rope_copies",
           "solution_rope_copies", "check_cached_attention",
           "solution_cached_attention", "decode_with", "KV_TOL", "check_model_rope_kernel",
           "solution_model_rope_kernel", "launch_model_rope", "kernel_rope", "plug_rope",
           "KernelRotary", "MODEL_ROPE_ROWS", "solution_model_rope_one_angle"]


class _Fresh:
    """Cases whose lists are copied for each call: an answer that changes a list in place does not
    change the next case (or the expected value, computed beforehand)."""

    def __init__(self, cases: Iterable):
        self.cases = list(cases)

    def __iter__(self):
        for label, args, expected in self.cases:
            yield label, tuple(_copy(a) for a in args), expected


def _copy(a):
    return set(a) if isinstance(a, (set, frozenset)) else list(a) if isinstance(a, list) else a


# --- exercise 1: RoPE's share of a profiled step -----------------------------------------------

_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
_ATTN_FWD, _ATTN_BWD = "flash_fwd_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"
_LAYERNORM = "vectorized_layer_norm_kernel<float, float>"
_ADAMW = "multi_tensor_apply_kernel<FusedAdamWMathFunctor>"
_MUL = "vectorized_elementwise_kernel<4, MulFunctor<float>>"
_CAT = "CatArrayBatchedCopy_aligned16_contig<float, unsigned int, 4, 64, 64>"
_COMPILED_ROPE = "triton_poi_fused_add_cat_mul_neg_slice_view_0"


STEP_KERNELS = Path(__file__).resolve().parents[3] / "figures" / "09-step-kernels.csv"
"""One training step of notebook 09's GPT as a GPU profiled it, each of its device events in
order (`rope_time_share`'s `device_events`): columns rope (ropelib or reference), kernel,
device_us; `# key: value` lines first (the GPU, the model, the batch)."""


def step_kernels(path=STEP_KERNELS) -> Tuple[Dict[str, str], Dict[str, List[Tuple[str, float]]]]:
    """(meta, {rope: [(kernel name, device µs), ...]}) from a file written by `write_step_kernels`
    ({} when there is none)."""
    from ...bench import compare     # imported late: compare is a heavier module
    if not Path(path).is_file():
        return {}, {}
    steps: Dict[str, List[Tuple[str, float]]] = {}
    for row in compare.read_csv(path):
        steps.setdefault(row["rope"], []).append((str(row["kernel"]), float(row["device_us"])))
    return compare.read_meta(path), steps


def write_step_kernels(path, steps: Dict[str, Sequence[Tuple[str, float]]], meta: dict) -> None:
    """Write {rope: [(kernel name, device µs), ...]} for `step_kernels`."""
    from ...bench import compare
    rows = [{"rope": rope, "kernel": name, "device_us": round(us, 3)}
            for rope, events in steps.items() for name, us in events]
    compare.write_csv(rows, path, meta, fields=["rope", "kernel", "device_us"])


def _share_cases() -> list:
    # ropelib: one kernel, launched forward and backward in each of 2 layers
    one_kernel = [(_LAYERNORM, 6.5), (_GEMM, 41.0), ("_rope_kernel", 3.25), (_ATTN_FWD, 22.0),
                  (_GEMM, 18.5), (_LAYERNORM, 6.5), (_GEMM, 41.0), ("_rope_kernel", 3.5),
                  (_ATTN_FWD, 22.0), (_GEMM, 18.5), (_GEMM, 37.0), (_ATTN_BWD, 55.0),
                  ("_rope_kernel", 3.75), (_GEMM, 80.0), (_ATTN_BWD, 55.0),
                  ("_rope_kernel", 4.0), (_GEMM, 80.0), (_ADAMW, 12.25)]
    # another library's RoPE kernel: "rotary" inside a longer name, launched in each of 2 layers
    library = [(_GEMM, 41.0), ("rotary_embedding_kernel", 2.75), (_ATTN_FWD, 22.0),
               (_GEMM, 41.0), ("rotary_embedding_kernel", 3.0), (_ATTN_FWD, 22.0),
               (_GEMM, 80.0), (_ATTN_BWD, 55.0), (_LAYERNORM, 6.5), (_ADAMW, 12.25)]
    # a compiled model: torch.compile fuses the reference's RoPE into a Triton kernel named after
    # the operations it fuses (the name benchmarks/results/compile_gap-nvidia-h200.log records),
    # with nothing in the name that says RoPE
    compiled = [(_GEMM, 41.0), (_COMPILED_ROPE, 5.5), (_ATTN_FWD, 22.0), (_GEMM, 41.0),
                (_COMPILED_ROPE, 5.25), (_ATTN_FWD, 22.0), (_GEMM, 80.0), (_ATTN_BWD, 55.0),
                (_ADAMW, 12.25)]
    # the PyTorch reference: generic elementwise kernels, none named after RoPE
    no_rope = [(_GEMM, 41.0), (_MUL, 3.0), (_MUL, 3.0), (_CAT, 2.5),
               ("vectorized_elementwise_kernel<4, AddFunctor<float>>", 3.0), (_ATTN_FWD, 22.0),
               (_GEMM, 80.0), (_ATTN_BWD, 55.0), (_ADAMW, 12.25)]
    raw = [
        ("one RoPE kernel, launched 4 times", one_kernel, {"_rope_kernel"}),
        ("another library's RoPE kernel, named inside a longer name", library,
         {"rope", "rotary"}),
        ("a kernel that two of the substrings name", one_kernel, {"rope", "_rope_kernel"}),
        ("no kernel named after RoPE", no_rope, {"rope", "rotary"}),
        ("a compiled model: RoPE fused into a kernel named after its operations", compiled,
         {"rope", "rotary"}),
    ]
    meta, measured = step_kernels()
    raw += [(f"notebook 09's step with the {rope} RoPE, as the {meta.get('gpu', 'GPU')} "
             f"profiled it ({len(events)} device events)", events, {"rope"})
            for rope, events in measured.items()]
    raw.append(_drawn_step())
    return [(label, (events, names), solution_rope_share(events, names))
            for label, events, names in raw]


def _drawn_step() -> tuple:
    """(label, events, rope_names): a step drawn when the check runs (`fresh_generator`, its
    seed in the label), its kernels from the made-up steps' names, its µs and the substrings
    naming RoPE drawn too: a table of shares worked out beforehand has no entry for it."""
    seed, g = fresh_generator()
    kernels = (_GEMM, _ATTN_FWD, _ATTN_BWD, _LAYERNORM, _ADAMW, _MUL, _CAT, _COMPILED_ROPE,
               "_rope_kernel", "rotary_embedding_kernel")
    n = int(torch.randint(6, 25, (), generator=g))
    picks = torch.randint(0, len(kernels), (n,), generator=g).tolist()
    quarters = torch.randint(1, 401, (n,), generator=g).tolist()     # 0.25 to 100 µs
    events = [(kernels[k], q / 4) for k, q in zip(picks, quarters)]
    substrings = ("rope", "rotary", "_rope_kernel", "fused_add_cat")
    k = int(torch.randint(1, 4, (), generator=g))          # one to three of them
    names = {substrings[i] for i in torch.randperm(len(substrings), generator=g)[:k].tolist()}
    return (f"a step drawn with seed {seed} ({n} device events)", events, names)


def check_rope_share(fn: Callable) -> bool:
    """fn(events, rope_names) -> (rope_us, step_us, share): `events` lists (kernel name, device µs)
    pairs of one profiled step (a kernel launched several times appears several times);
    `rope_names` is a set of substrings, and a kernel is RoPE's when its name contains one of them
    (a kernel counts once however many it contains). rope_us sums RoPE's kernels, step_us every
    kernel, share = rope_us / step_us (a fraction, 0 when no kernel is RoPE's).

    Tried on made-up event lists whose answer is known, on the measured steps of STEP_KERNELS
    (their answer computed beforehand), and on a step drawn when the check runs (its seed in the
    case's label), with ropelib and the worked solutions barred.
    """
    return check_cases(
        "rope_share", "your share of the step", fn, _Fresh(_share_cases()),
        hint="add up every event's µs for the step, and those whose name contains any of "
             "rope_names (each event once) for RoPE; share = rope_us / step_us, a fraction",
        rtol=1e-9, atol=1e-9, bar=_WORKED)


def solution_rope_share(events: Sequence[Tuple[str, float]],
                        rope_names: Iterable[str]) -> Tuple[float, float, float]:
    rope_us = step_us = 0.0
    for name, us in events:                      # a kernel launched n times is n events
        step_us += us
        if any(part in name for part in rope_names):   # counted once, however many match
            rope_us += us
    return rope_us, step_us, rope_us / step_us


def _copies_cases() -> list:
    shares = {label: events for label, (events, _), _ in _share_cases()}
    raw = [("one RoPE kernel, launched 4 times (2 layers, forward and backward)",
            shares["one RoPE kernel, launched 4 times"], {"_rope_kernel"}, (4, 512, 8, 64), 2,
            3000.0),
           ("another library's RoPE kernel, launched twice, in fp32",
            shares["another library's RoPE kernel, named inside a longer name"],
            {"rope", "rotary"}, (1, 1024, 4, 64), 4, 2000.0),
           ("no kernel named after RoPE", shares["no kernel named after RoPE"],
            {"rope", "rotary"}, (4, 64, 2, 16), 2, 3000.0)]
    meta, measured = step_kernels()
    share_csv = STEP_KERNELS.with_name("09-rope-share.csv")
    if "ropelib" in measured and share_csv.is_file():
        from ...bench import compare
        cfg = dict(re.findall(r"(\w+)=(\d+)", meta["config"]))
        n_head, width = int(cfg["n_head"]), int(cfg["n_embd"])
        shape = (int(meta["batch"]), int(cfg["block_size"]), n_head, width // n_head)
        lib = next(r for r in compare.read_csv(share_csv) if r["rope"] == "ropelib")
        gbps = int(compare.read_meta(share_csv)["rope_bytes"]) / lib["copy_floor_ms"] / 1e6
        raw.append((f"notebook 09's step with ropelib's RoPE, as the {meta.get('gpu', 'GPU')} "
                    "profiled it", measured["ropelib"], {"rope"}, shape, 2, gbps))
    seed, g = fresh_generator()
    _, events, names = _drawn_step()
    draw = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))      # noqa: E731
    shape = (draw(1, 9), 64 * draw(1, 17), draw(1, 17), (32, 64, 128)[draw(0, 3)])   # B, S, H, D
    elt = (2, 4)[draw(0, 2)]
    gbps = float(draw(500, 5001))
    raw.append((f"a step, shape, dtype and bandwidth drawn with seed {seed}", events, names,
                shape, elt, gbps))
    return [(label, (events, names, shape, elt, gbps),
             solution_rope_copies(events, names, shape, elt, gbps))
            for label, events, names, shape, elt, gbps in raw]


def check_rope_copies(fn: Callable) -> bool:
    """fn(events, rope_names, qk_shape, elt_bytes, copy_gbps) -> (rope_bytes, copies): RoPE's
    kernels (as in `check_rope_share`) each read and write one layer's q and k of shape
    `qk_shape` (B, S, H, D), `elt_bytes` an element; rope_bytes is what all of the step's RoPE
    launches move, copies RoPE's µs over the µs a copy of rope_bytes takes at `copy_gbps` GB/s
    (1 GB = 1e9 bytes; 0 bytes and 0 copies when no kernel is RoPE's).

    Tried on made-up steps, on the committed step of STEP_KERNELS with its own copy's bandwidth,
    and on a step drawn when the check runs, with ropelib and the worked solutions barred.
    """
    return check_cases(
        "rope_copies", "your bytes and copies", fn, _Fresh(_copies_cases()),
        hint="count RoPE's launches in the events: each reads and writes q and k once; a copy "
             "of rope_bytes takes rope_bytes / (copy_gbps * 1e3) µs",
        rtol=1e-6, atol=1e-9, bar=_WORKED)


def solution_rope_copies(events: Sequence[Tuple[str, float]], rope_names: Iterable[str],
                         qk_shape: Sequence[int], elt_bytes: int,
                         copy_gbps: float) -> Tuple[int, float]:
    rope_names = set(rope_names)
    launches = [us for name, us in events if any(part in name for part in rope_names)]
    n = 1
    for d in qk_shape:
        n *= d
    rope_bytes = len(launches) * 2 * 2 * n * elt_bytes      # q and k, read and written
    if rope_bytes == 0:
        return 0, 0.0
    copy_us = rope_bytes / (copy_gbps * 1e3)                  # GB/s = 1e3 bytes a µs
    return rope_bytes, sum(launches) / copy_us


# --- exercise 2: attention with a KV cache, each token rotated at its own position ------------

KV_TOL = 1e-4
"""How far the cached path may be from the full forward, as a fraction of the largest value
compared. Both run in fp32 and compute the same sums, in other shapes and orders (a few rows
through the matmuls instead of the whole sequence, a softmax over the L + S cached keys instead of
a masked row of the whole sequence): they differ in the last bits, less than 1e-6 of the values'
size. A key rotated one position off moves them by more than 1e-2."""

_CHUNKS = (5, 1, 1, 3, 1)   # a prompt, two tokens, a chunk of 3 after the cache, a last token
_SIZES = dict(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=32)   # head_dim 16
_BATCH = 2
_QKV_GAIN = 8.0             # sharp attention: scores of a few units, so positions matter
_WHAT = "your cached attention"


class _Stop(Exception):
    """The learner's function failed at one step (the ❌ line is printed): stop decoding."""


def _decoding_case(gen: torch.Generator, device) -> Tuple[gpt.GPT, torch.Tensor]:
    """A small GPT (rope="reference", eval mode) whose attention depends on positions, and
    tokens [B, T] to decode; weights and tokens from `gen`, the global RNG left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=gen)))
        model = gpt.GPT(gpt.GPTConfig(**_SIZES), rope="reference")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(_QKV_GAIN)
    idx = torch.randint(_SIZES["vocab_size"], (_BATCH, sum(_CHUNKS)), generator=gen)
    return model.to(device).eval(), idx.to(device)


@torch.no_grad()
def _full_forward(model: gpt.GPT, idx: torch.Tensor) -> Tuple[torch.Tensor, List[dict]]:
    """The model over the whole sequence: logits [B, T, V], and per layer the keys before and
    after RoPE ("k_raw", "k") and the values ("v") [B, T, H, D] and the attention's output ("y")
    [B, T, C], read by hooks."""
    layers, hooks = [], []
    for block in model.blocks:
        attn, seen = block.attn, {}
        layers.append(seen)

        def on_qkv(module, args, out, attn=attn, seen=seen):
            B, T, _ = out.shape
            _, seen["k_raw"], seen["v"] = out.view(B, T, 3, attn.n_head, attn.head_dim).unbind(2)

        def on_rotary(module, args, out, seen=seen):
            seen["k"] = out[1]

        def on_attn(module, args, out, seen=seen):
            seen["y"] = out

        hooks += [attn.qkv.register_forward_hook(on_qkv),
                  attn.rotary.register_forward_hook(on_rotary),
                  attn.register_forward_hook(on_attn)]
    try:
        logits, _ = model(idx)
    finally:
        for h in hooks:
            h.remove()
    return logits, layers


@torch.no_grad()
def decode_with(model: gpt.GPT, chunks: Sequence[torch.Tensor],
                attention: Callable) -> List[torch.Tensor]:
    """Run `model` over the token chunks [B, S_i] one after the other through a KV cache, with
    `attention(attn, x, past_k, past_v) -> (y, k, v)` as every layer's attention: logits
    [B, S_i, V] of each chunk.

    The rest is the model's own forward (`gpt.forward_with`: GPT.forward with each layer's
    attention replaced), with the cache of each layer, keys and values [B, L, H, D], handed to
    `attention` and replaced by what it returns. The model in eval mode (no dropout).
    """
    cfg, param = model.config, next(model.parameters())
    B = chunks[0].shape[0]
    empty = torch.empty(B, 0, cfg.n_head, cfg.head_dim, dtype=param.dtype, device=param.device)
    cache = [(empty, empty)] * cfg.n_layer

    def cached(i, attn, h):
        y, k, v = attention(attn, h, *cache[i])
        cache[i] = (k, v)                                             # [B, L + S, H, D] each
        return y
    return [gpt.forward_with(model, idx, cached) for idx in chunks]   # [B, S_i, V] each


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    got = got.detach().to(device=want.device, dtype=torch.float32)
    return bool(torch.isfinite(got).all()) and \
        float((got - want).abs().max()) <= KV_TOL * float(want.abs().max())


def _rotated_as(k_new, k_raw, cos, sin, tol: float) -> list:
    """For each new token, the position whose rotation of its raw key [B, S, H, D] gives k_new
    (the table row closest to it), or None when no row of the table does."""
    B, S, H, D = k_raw.shape
    every_row = k_raw[:, :, None].float().expand(B, S, cos.shape[0], H, D)
    turned = reference.apply_rope_ref(every_row, cos[:, None, :], sin[:, None, :])  # [B,S,P,H,D]
    err = (turned - k_new.detach().float().to(turned.device)[:, :, None]).abs()
    err = err.amax(dim=(0, 3, 4)).nan_to_num(float("inf"))           # [S, P]
    best = err.argmin(dim=1)
    return [int(p) if err[j, p] <= tol else None for j, p in enumerate(best.tolist())]


def _positions(ps: list) -> str:
    return (f"position {ps[0]}" if len(ps) == 1 else
            f"positions {ps[0]}..{ps[-1]}" if ps == list(range(ps[0], ps[0] + len(ps))) else
            f"positions {', '.join(str(p) for p in ps)}")


def _new_keys_problem(found: list, L: int, S: int, P: int) -> Tuple[str, str]:
    right = list(range(L, L + S))
    if None in found:
        return (f"the new keys (the tokens at {_positions(right)}) are not the tokens' keys "
                f"rotated at any position 0..{P - 1} of the table",
                "k is the middle third of attn.qkv(x) viewed [B, S, 3, H, D]; rotate it once, "
                "at its token's position")
    what = f"the new keys are rotated as {_positions(found)}, not {_positions(right)}"
    if found == list(range(S)):
        what += (": positions start again at 0 in each call (position 0 is no rotation at all), "
                 f"but these tokens come after the {L} cached ones")
    elif not any(found):
        what = (f"the new keys (the tokens at {_positions(right)}) are not rotated at all: "
                "k goes into the cache rotated")
    elif len({f - r for f, r in zip(found, right)}) == 1:
        what += f": off by {found[0] - right[0]:+d}"
    return what, (f"the j-th new token sits at position L + j, L = past_k.shape[1] tokens "
                  "cached; rotate its q and its k there")


def _judge(out, given_k, given_v, want: dict, attn, L: int, S: int):
    """(problem, hint) for one layer's answer at one step, or (None, None) when it is right."""
    B, H, D = given_k.shape[0], attn.n_head, attn.head_dim
    if not (isinstance(out, (tuple, list)) and len(out) == 3
            and all(isinstance(t, torch.Tensor) for t in out)):
        got = type(out).__name__ + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
        return f"expected (y, k, v), three tensors; got a {got}", None
    y, k, v = out
    for t, shape, name in ((y, (B, S, H * D), "y"), (k, (B, L + S, H, D), "k"),
                           (v, (B, L + S, H, D), "v")):
        if tuple(t.shape) != shape:
            return (f"{name} has shape {tuple(t.shape)}, expected {shape}",
                    "y [B, S, C] is the layer's output (after attn.proj); k and v [B, L + S, H, D] "
                    "are the cache with the S new tokens appended after the L cached ones")
    k, v = (t.detach().to(device=given_k.device, dtype=given_k.dtype) for t in (k, v))
    if not torch.equal(k[:, :L], given_k):
        return (f"the first {L} keys of the returned cache are not the cached keys passed in",
                "cached keys are rotated already, once, each at its own position: leave them as "
                "they are (rotating key n again turns it by R_n twice, as if it sat at 2n)")
    if not torch.equal(v[:, :L], given_v):
        return (f"the first {L} values of the returned cache are not the cached values passed in",
                "append the new values after the cached ones, unchanged")
    if not _close(k[:, L:], want["k"][:, L:L + S]):
        P = attn.rotary.cos.shape[0]
        found = _rotated_as(k[:, L:], want["k_raw"][:, L:L + S], attn.rotary.cos,
                            attn.rotary.sin, KV_TOL * float(want["k"][:, L:L + S].abs().max()))
        return _new_keys_problem(found, L, S, P)
    if not _close(v[:, L:], want["v"][:, L:L + S]):
        return ("the new values are not the tokens' values",
                "v is the last third of attn.qkv(x) viewed [B, S, 3, H, D]; RoPE leaves it alone")
    if not _close(y, want["y"][:, L:L + S]):
        return ("the cache is right, but the attention output is not",
                "rotate each query at its token's position too (L + j, like its key), and let the "
                "token at position p attend to the keys at 0..p: a boolean mask [S, L + S] "
                "(is_causal=True lines its triangle up with the first key, not with the last); "
                "then attn.proj")
    return None, None


def check_cached_attention(fn: Callable, *, seed: Optional[int] = None, device=None) -> bool:
    """fn(attn, x, past_k, past_v) -> (y, k, v): one layer's attention (`attn`, a
    `CausalSelfAttention` of the GPT) for S new tokens x [B, S, C] that follow the L tokens whose
    keys (rotated, each at its position) and values past_k, past_v [B, L, H, D] are cached; the
    new tokens sit at positions L .. L+S-1. Returns y [B, S, C] (after attn.proj) and the cache
    with the new keys (rotated) and values appended, k and v [B, L + S, H, D].

    Builds a small GPT with position-sensitive attention (weights and tokens drawn from `seed`,
    a fresh one when None), decodes a prompt of 5 tokens and then 1, 1, 3 and 1 more with fn as
    every layer's attention (`decode_with`), and compares each layer at each step with the
    model's full forward over the whole sequence, within KV_TOL of the largest value: the cached
    keys and values unchanged, the new keys (or at which positions they were rotated), the new
    values, the attention output, then the logits. fn runs with ropelib's answers barred except
    its RoPE functions (apply_rope, apply_rope_qk, ropelib.reference, ropelib.frequencies).
    Prints one line (✅, or ❌ at the first step that goes wrong); never raises.
    """
    device = torch.device(device if device is not None else runtime.default_device())
    seed = fresh_seed() if seed is None else seed
    model, idx = _decoding_case(torch.Generator().manual_seed(seed), device)
    want_logits, want = _full_forward(model, idx)
    chunks = list(idx.split(list(_CHUNKS), dim=1))
    starts = [sum(_CHUNKS[:n]) for n in range(len(_CHUNKS))]
    layer_of = {id(block.attn): i for i, block in enumerate(model.blocks)}
    calls = []

    def attend(attn, x, past_k, past_v):
        i = layer_of[id(attn)]
        step = len(calls) // len(model.blocks)
        calls.append(i)
        L, S = starts[step], _CHUNKS[step]
        where = (f"cached_attention (step {step + 1}: {S} new token{'s' if S > 1 else ''} at "
                 f"{_positions(list(range(L, L + S)))} after {L} cached; layer {i})")
        given_k, given_v = past_k.clone(), past_v.clone()
        ok, out = run_own_code(where, _WHAT, fn, attn, x, past_k, past_v,
                               allow=_ALLOWED, bar=_BARRED)
        if not ok:
            raise _Stop
        problem, hint = _judge(out, given_k, given_v, want[i], attn, L, S)
        if problem is not None:
            print(f"❌ {where}: {problem}" + (f"\n   hint: {hint}" if hint else ""))
            raise _Stop
        return out

    try:
        got = decode_with(model, chunks, attend)
    except _Stop:
        return False
    return check("cached_attention: logits of every step against the full forward's",
                 torch.cat(got, dim=1), want_logits,
                 atol=KV_TOL * float(want_logits.abs().max()), rtol=0.0)


def solution_cached_attention(attn, x, past_k, past_v):
    B, S, C = x.shape
    L = past_k.shape[1]                      # tokens cached: the new ones sit at L .. L + S - 1
    q, k, v = attn.qkv(x).view(B, S, 3, attn.n_head, attn.head_dim).unbind(2)   # [B, S, H, D]
    pos = L + torch.arange(S, device=x.device)                      # absolute positions
    q, k = ropelib.apply_rope_qk(q, k, attn.rotary.freqs, layout="bshd", position_ids=pos)
    k = torch.cat((past_k, k), dim=1)        # the cached keys stay as they were rotated: once
    v = torch.cat((past_v, v), dim=1)        # [B, L + S, H, D]
    mask = torch.arange(L + S, device=x.device) <= pos[:, None]     # [S, L + S]: keys 0..p
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask)              # [B, H, S, D]
    return attn.proj(y.transpose(1, 2).reshape(B, S, C)), k, v


_ALLOWED = (ropelib.apply_rope, ropelib.apply_rope_qk, reference, frequencies)
_BARRED = (solution_cached_attention, gpt.forward_cached, gpt.generate)


# --- exercise 3: a Triton RoPE kernel of the learner's, inside the model ----------------------

MODEL_ROPE_ROWS = 4
"""Rows (one head of one token each) a program of the learner's kernel rotates, as the check
and `kernel_rope` launch it."""

_MODEL_ROPE = "RoPE kernel in the model"
_MODEL_ROPE_WHAT = "your RoPE kernel"
_TRAIN_STEPS = 3            # steps the check trains both models for, on the same batches
_TRAIN_LR = 3e-3
_MODEL_TOL = 1e-5           # fp32, one launch, losses, step 1's gradients: of the largest value
# the logits after training: AdamW divides each update by the root of its squared gradients, so
# a gradient near zero turns a difference in its last bits into one of the update's size; after
# 3 steps the two models' logits differ by up to ~2e-6 of the largest, a wrong rotation by ~1
_TRAINED_TOL = 1e-4
_UNIT_SHAPE = (2, 5, 3)     # (B, S, H) of the first launch: 30 rows, the last program holds 2


def launch_model_rope(kernel, x: torch.Tensor, freqs: torch.Tensor, out: torch.Tensor,
                      rows: int = MODEL_ROPE_ROWS) -> None:
    """Launch a kernel of exercise 3's signature: x [B, S, H, D] (any strides: the model's q
    and k are views of its QKV projection's output), freqs [S, D] fp32 (row s: the angles of
    position s), out [B, S, H, D] contiguous; grid (cdiv(B * S * H, rows),)."""
    B, S, H, D = x.shape
    n_rows = B * S * H
    kernel[(triton.cdiv(n_rows, rows),)](
        x, out, freqs, n_rows, S, H, *x.stride(), *freqs.stride(),
        HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2), ROWS=rows)


class _KernelRope(torch.autograd.Function):
    """y = rotate(x, freqs); its backward is the rotation by -theta (notebook 06): the same
    kernel on the negated angles, TE's table cat(f, f) having one angle for both halves."""

    @staticmethod
    def forward(ctx, x, freqs, rotate):
        ctx.freqs, ctx.rotate = freqs, rotate
        return rotate(x, freqs)

    @staticmethod
    def backward(ctx, grad_y):
        return ctx.rotate(grad_y, -ctx.freqs), None, None


class KernelRotary(torch.nn.Module):
    """The model's rotary module (`_Rotary`: q, k [B, S, H, D] -> rotated q, k) with RoPE by
    `rotate(x, freqs) -> y` instead: x [B, S, H, D], freqs [S, D] fp32, y [B, S, H, D]. Reads
    the angle table of the module it replaces."""

    def __init__(self, rotary: torch.nn.Module, rotate: Callable):
        super().__init__()
        P = rotary.freqs.shape[0]
        self.register_buffer("freqs", rotary.freqs.reshape(P, -1).contiguous(),
                             persistent=False)                              # [P, D] fp32
        self.rotate = rotate

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        f = self.freqs[:q.shape[1]]
        with torch.profiler.record_function(gpt.ROPE_LABEL):
            return _KernelRope.apply(q, f, self.rotate), _KernelRope.apply(k, f, self.rotate)


def kernel_rope(kernel, rows: int = MODEL_ROPE_ROWS,
                launch: Optional[Callable] = None) -> Callable:
    """rotate(x, freqs) -> y by a kernel of exercise 3's signature (as it is: compiled on a GPU,
    interpreted under TRITON_INTERPRET=1), for `plug_rope`, started through `launch` (a launcher
    of `launch_model_rope`'s signature, the notebook's own; default `launch_model_rope`)."""
    start = launch_model_rope if launch is None else launch

    def rotate(x, freqs):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        start(kernel, x, freqs, y, rows)
        return y
    return rotate


def plug_rope(model: gpt.GPT, rotate: Callable) -> gpt.GPT:
    """Every attention layer of `model` rotates q and k with `rotate(x, freqs) -> y` (its backward
    `rotate` on the negated angles): each `attn.rotary` becomes a `KernelRotary`. In place; the
    model is returned. Its parameters and state_dict are unchanged."""
    for block in model.blocks:
        block.attn.rotary = KernelRotary(block.attn.rotary, rotate)
    return model


def _barred_rotate(kernel, log: list, launch: Callable = launch_model_rope) -> Callable:
    """rotate(x, freqs) -> y for the check: the learner's kernel interpreted on CPU tensors, with
    ropelib's answers barred, into a NaN-filled output, started through `launch` (of
    `launch_model_rope`'s signature) at `MODEL_ROPE_ROWS` rows a program; a launch that fails or
    leaves rows unwritten prints ❌ and raises _Stop. `log` gets one label per launch."""
    run = interpreted(kernel)

    def rotate(x, freqs):
        B, S, H, D = x.shape
        label = (f"launch {len(log) + 1}: x [{B}, {S}, {H}, {D}] strides {tuple(x.stride())}, "
                 f"{B * S * H} rows, ROWS={MODEL_ROPE_ROWS}")
        log.append(label)
        pad = MODEL_ROPE_ROWS * D         # NaN guard bands: a store past either end shows
        buf, y = guarded_view(x.shape, pad, dtype=x.dtype, device=x.device)
        x_before = x.detach().clone()
        ok, _ = launch_barred(_MODEL_ROPE, label, _MODEL_ROPE_WHAT,
                              lambda: launch(run, x.detach(), freqs, y, MODEL_ROPE_ROWS))
        if not ok:
            raise _Stop
        outside = guard_band_writes(buf, pad)
        if outside:
            print(f"❌ {_MODEL_ROPE} ({label}): the kernel stored {outside} elements outside y "
                  "(a store without its mask: rows past n_rows, or lanes past HALF)")
            raise _Stop
        if not torch.equal(x.detach(), x_before):
            print(f"❌ {_MODEL_ROPE} ({label}): the kernel changed its input x (q or k is a view "
                  "of the QKV projection's output: write y only)")
            raise _Stop
        unwritten = y.isnan().reshape(B * S * H, D).any(-1)
        if bool(unwritten.any()):
            first = int(unwritten.nonzero()[0])
            print(f"❌ {_MODEL_ROPE} ({label}): {int(unwritten.sum())} of {B * S * H} rows were "
                  f"not (wholly) written, first row {first}: program p rotates rows p * ROWS to "
                  "p * ROWS + ROWS - 1, the last program fewer (a mask)")
            raise _Stop
        return y
    return rotate


def _far(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the largest |want| (inf where got is not finite)."""
    got = got.detach().float()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - want.detach().float()).abs().max()) / max(float(want.abs().max()), 1e-30)


def check_model_rope_kernel(kernel, *, seed: Optional[int] = None,
                            launch: Optional[Callable] = None) -> bool:
    """Exercise 3: the learner's @triton.jit RoPE kernel (rows of the model's bshd layout,
    `MODEL_ROPE_ROWS` a program, signature `launch_model_rope`'s) as the RoPE of a small GPT,
    every launch started through `launch` (the notebook's launcher, of `launch_model_rope`'s
    signature: kernel, x, freqs, out, rows; default `launch_model_rope`).

    On the CPU, with Triton's interpreter, whatever the notebook's device: first one launch on
    a q view of a QKV output (strided), compared with `ropelib.reference`; then two copies of a
    small GPT from the same weights (drawn from `seed`, a fresh one when None), one with the
    model's own PyTorch RoPE, one with the kernel (`plug_rope`, its backward the kernel on the
    negated angles), trained for a few AdamW steps on the same fp32 batches: each step's loss and
    the first step's gradients of every parameter must agree within 1e-5 of the largest value (the
    gradients 1e-4), the logits after training within 1e-4. Every launch runs with ropelib's answers
    barred, and the notebook's other kernels and the worked solutions too (`launch_barred`); each
    goes into a NaN-filled output, and must write every row and leave its input alone. Prints one
    line (✅, or ❌ at the first thing that goes wrong); never raises.
    """
    if not kernel_answer(_MODEL_ROPE, kernel, "the output buffer it allocated"):
        return False
    seed = fresh_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    log: list = []
    rotate = _barred_rotate(kernel, log, launch_model_rope if launch is None else launch)
    cfg = gpt.GPTConfig(**_SIZES)
    B, S, H, D = _BATCH, cfg.block_size, cfg.n_head, cfg.head_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=gen)))
        ref = gpt.GPT(cfg, rope="reference")
    mine = gpt.GPT(cfg, rope="reference")
    mine.load_state_dict(ref.state_dict())
    plug_rope(mine, rotate)
    freqs = mine.blocks[0].attn.rotary.freqs[:S]                          # [S, D] fp32
    where = f"(seed {seed})"
    try:
        # one launch: q, a strided view of a QKV projection's output [B, S, 3, H, D], with
        # rows not a multiple of ROWS (the last program holds fewer)
        B1, S1, H1 = _UNIT_SHAPE
        q = torch.randn(B1, S1, 3, H1, D, generator=gen).unbind(2)[0]
        y = rotate(q, freqs[:S1])
        want = reference.rope_reference(q, freqs[:S1, None, None, :], layout="bshd")
        if _far(y, want) > _MODEL_TOL:
            return check(f"{_MODEL_ROPE}: q [{B1}, {S1}, {H1}, {D}], a view of a QKV output with "
                         f"strides {tuple(q.stride())} {where}", y, want, atol=1e-5, rtol=1e-5,
                         hint="row r is head h of token s of sequence b: b = r // (S * H), "
                              "s = (r // H) % S, h = r % H; read x through all four strides, "
                              "the angles of row s, and write y contiguous (row r at r * D)")
        # training: the same batches, fp32, AdamW (the notebook's train_step)
        opts = [gpt.make_optimizer(m, lr=_TRAIN_LR) for m in (ref, mine)]
        for step in range(1, _TRAIN_STEPS + 1):
            idx = torch.randint(cfg.vocab_size, (B, S + 1), generator=gen)
            x_b, y_b = idx[:, :-1], idx[:, 1:]
            losses = [gpt.train_step(m, o, x_b, y_b).item() for m, o in zip((ref, mine), opts)]
            if not abs(losses[1] - losses[0]) <= _MODEL_TOL * max(1.0, abs(losses[0])):
                return check(f"{_MODEL_ROPE}: the loss of training step {step} {where}",
                             losses[1], losses[0], atol=_MODEL_TOL, rtol=_MODEL_TOL,
                             hint="the forward rotated q and k right in one launch: look at "
                                  "what changes in training (the gradients go through your "
                                  "kernel on the negated angles, any strides)")
            if step == 1:
                for (name, p_ref), p_mine in zip(ref.named_parameters(), mine.parameters()):
                    if _far(p_mine.grad, p_ref.grad) > 10 * _MODEL_TOL:
                        return check(f"{_MODEL_ROPE}: the gradient of {name} after step 1 "
                                     f"{where}", p_mine.grad, p_ref.grad, atol=1e-6, rtol=1e-4,
                                     hint="the backward is your kernel on dL/dy with the "
                                          "angles negated: it must rotate any strides, not "
                                          "only the forward's")
        with torch.no_grad():
            idx = torch.randint(cfg.vocab_size, (B, S), generator=gen)
            ref.eval(), mine.eval()
            want_logits, got_logits = ref(idx)[0], mine(idx)[0]
    except _Stop:
        return False
    return check(f"{_MODEL_ROPE}: logits after {_TRAIN_STEPS} training steps with your kernel, "
                 f"against the model's own RoPE ({len(log)} launches, {where})",
                 got_logits, want_logits, atol=_TRAINED_TOL * float(want_logits.abs().max()),
                 rtol=0.0)


@triton.jit
def solution_model_rope_kernel(
    x_ptr,  # *q or *k: [B, S, H, D], any strides (a view of the QKV projection's output)
    y_ptr,  # *y: [B, S, H, D], contiguous, x's dtype
    freqs_ptr,  # *fp32: angles [S, D], row s for position s (TE's cat(f, f))
    n_rows,  # B * S * H: one row is one head of one token
    S, H,  # row r -> (b, s, h)
    stride_xb, stride_xs, stride_xh, stride_xd,  # x strides, in elements
    stride_fs, stride_fd,  # freqs strides, in elements
    HALF: tl.constexpr,  # D // 2: rotate-half pairs (j, j + HALF)
    BLOCK_HALF: tl.constexpr,  # next power of two >= HALF
    ROWS: tl.constexpr,  # rows per program, a power of two
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS] this program's
    b = (rows // (S * H))[:, None]  # [ROWS, 1]: bshd, so the batch is the slowest index
    s = ((rows // H) % S)[:, None]
    h = (rows % H)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BLOCK_HALF]
    mask = (rows[:, None] < n_rows) & (offs < HALF)  # [ROWS, BLOCK_HALF]: the last program's tail
    f_row = freqs_ptr + s * stride_fs
    theta1 = tl.load(f_row + offs * stride_fd, mask=mask, other=0.0)
    theta2 = tl.load(f_row + (offs + HALF) * stride_fd, mask=mask, other=0.0)
    x_row = x_ptr + b * stride_xb + s * stride_xs + h * stride_xh
    x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * tl.cos(theta1) - x2 * tl.sin(theta1)
    y2 = x2 * tl.cos(theta2) + x1 * tl.sin(theta2)
    y_row = y_ptr + rows[:, None] * 2 * HALF  # y is contiguous: row r starts at element r * D
    tl.store(y_row + offs, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + HALF + offs, y2.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def solution_model_rope_one_angle(
    x_ptr, y_ptr, freqs_ptr, n_rows, S, H,
    stride_xb, stride_xs, stride_xh, stride_xd, stride_fs, stride_fd,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr,
):
    """`solution_model_rope_kernel` with one angle a pair: the model's table is TE's cat(f, f),
    so theta_{j + HALF} = theta_j, and one sine and one cosine serve both members of a pair
    (two transcendental functions a pair instead of four). The same results on that table."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    b = (rows // (S * H))[:, None]
    s = ((rows // H) % S)[:, None]
    h = (rows % H)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (rows[:, None] < n_rows) & (offs < HALF)
    theta = tl.load(freqs_ptr + s * stride_fs + offs * stride_fd, mask=mask, other=0.0)
    cos, sin = tl.cos(theta), tl.sin(theta)
    x_row = x_ptr + b * stride_xb + s * stride_xs + h * stride_xh
    x1 = tl.load(x_row + offs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (offs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    y_row = y_ptr + rows[:, None] * 2 * HALF
    tl.store(y_row + offs, (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + HALF + offs, (x2 * cos + x1 * sin).to(y_ptr.dtype.element_ty), mask=mask)


_WORKED = (solution_rope_share, solution_rope_copies, solution_cached_attention,
           solution_model_rope_kernel, solution_model_rope_one_angle)
