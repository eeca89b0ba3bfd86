"""Exercise checks for notebook 02 that go past what its sections write out: the
context-parallel positions of a packed `thd` batch (exercise 1b) and Hugging Face's rotary
forward, `cos, sin [B, S, R]` from `inv_freq`, `position_ids` and `attention_scaling`
(exercise 2).

As in `basics`, each check computes its expected answer independently (`reference.positions`
for the first; HF's own fp32 recipe written out here for the second), tries the learner's
function on several inputs and on a case drawn when it runs, and runs it with ropelib's answers
barred (`own_code`): ropelib, its benchmarks, any worked solution and, for the cos/sin, the RoPE
code of transformers, Transformer Engine and flash-attn (`basics.third_party_ropes`: HF's
`*RotaryEmbedding.forward` among them) are refused.
"""
from typing import Callable

import torch

from ... import reference
from .basics import third_party_ropes
from .own_code import check_cases, fresh_generator, listed_as_tensor

__all__ = ["check_thd_cp_positions", "check_hf_cos_sin", "hf_cos_sin_expected", "table_line_of"]


# --- exercise 1b: a packed batch under context parallelism ------------------------------------

def check_thd_cp_positions(fn: Callable) -> bool:
    """fn(cu_seqlens, cp_size, cp_rank) -> the positions of the tokens rank cp_rank holds of a
    packed `thd` batch, in its local order (ints). `cu_seqlens` [N+1] (int32) are the cumulative
    *global* lengths, each a multiple of 2 * cp_size (any length at cp_size=1, where nothing is
    split; one case tries odd lengths there), as Transformer Engine takes them: every
    sequence is split on its own into 2 * cp_size chunks, the rank keeps chunks r and
    2 * cp_size - 1 - r of each, sequence after sequence, and positions restart at 0 in each.
    Expected: `reference.positions("thd", ...)`."""
    def case(lengths, cp_size, cp_rank, label=""):
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
        want = reference.positions("thd", 0, cu_seqlens=cu, cp_size=cp_size, cp_rank=cp_rank)
        return (f"lengths {lengths}, cp_size={cp_size}, rank {cp_rank}{label}",
                (cu.clone(), cp_size, cp_rank), want)

    cases = [case([8, 16, 4], 2, 1), case([8, 16, 4], 2, 0), case([16, 8], 4, 3),
             case([24, 8, 8], 4, 1), case([6, 12], 3, 2), case([5, 3], 1, 0)]
    seed, g = fresh_generator()     # and a batch drawn now: a table made beforehand fails
    cp_size = int(torch.randint(1, 6, (), generator=g))
    n = int(torch.randint(1, 6, (), generator=g))
    lengths = (2 * cp_size * torch.randint(1, 8, (n,), generator=g)).tolist()
    cases.append(case(lengths, cp_size, int(torch.randint(0, cp_size, (), generator=g)),
                      f" (drawn with seed {seed})"))
    return check_cases("context-parallel positions of a packed batch",
                       "the positions worked out by your code", fn, cases, post=listed_as_tensor,
                       hint="sequence i has cu_seqlens[i+1] - cu_seqlens[i] tokens in all, of "
                            "which the rank holds that over cp_size; split each sequence as "
                            "section 5 splits one, from position 0, and concatenate in order")


# --- exercise 2: Hugging Face's rotary forward -----------------------------------------------

def hf_cos_sin_expected(inv_freq, position_ids, attention_scaling, dtype):
    """HF's `*RotaryEmbedding.forward`, written out: angles position * inv_freq in fp32 (one
    product each, as its fp32 matmul of K = 1 gives), both halves the same (rotate-half), cos
    and sin in fp32 times attention_scaling, rounded once to dtype. [B, S, 2 * len(inv_freq)]."""
    angles = position_ids.to(torch.float32)[..., None] * inv_freq.to(torch.float32)
    emb = torch.cat((angles, angles), dim=-1)
    return ((emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype))


def _within_rounding(answer, expected):
    """A `post` for check_cases: an answer (cos, sin) that is the expected pair up to the last
    bit of a few outputs (another fp32 cos can tip a rounding, rarely) counts as the expected
    pair; anything else is compared as it is, exactly, so check() says what differs. Rounding
    cos and sin to the dtype before scaling, or angles in another precision, change far more."""
    try:
        pairs = list(zip(answer, expected))
        if len(pairs) != 2 or len(answer) != 2:
            return answer
        for a, e in pairs:
            if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype:
                return answer
            step = torch.finfo(e.dtype).eps * e.double().abs().clamp_min(
                torch.finfo(e.dtype).tiny)                               # one ulp, about
            diff = (a.detach().cpu().double() - e.double()).abs()
            if (diff > step).any() or (a.cpu() != e).double().mean() > 0.01:
                return answer
        return expected
    except Exception:  # noqa: BLE001 -- check() reports what is wrong with it
        return answer


def check_hf_cos_sin(fn: Callable) -> bool:
    """fn(inv_freq [R/2] fp32, position_ids [B, S] int64, attention_scaling float, dtype) ->
    (cos, sin), each [B, S, R] in dtype: Hugging Face's rotary forward (rotate-half layout),
    computed in fp32 and rounded once. Tried on bf16, fp16 and fp32 outputs, positions up to
    10^5 (where an angle computed in fp64 instead is off by thousandths of a radian), several
    scalings, and a case drawn now. Refused: ropelib, the worked solution, and the RoPE code of
    transformers, Transformer Engine and flash-attn."""
    def inv_freq_of(rot_dim, base):
        return 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim))

    cases = []
    for (B, S, rot_dim, base, scaling, dtype, high) in (
            (1, 6, 16, 10000.0, 1.0, torch.bfloat16, 64),
            (2, 5, 32, 500000.0, 1.0, torch.float32, 100_000),
            (3, 4, 8, 10000.0, 1.2079, torch.bfloat16, 100_000),     # YaRN-like scaling
            (2, 7, 64, 10000.0, 0.5, torch.float16, 4096)):
        g = torch.Generator().manual_seed(rot_dim)
        pos = torch.randint(0, high, (B, S), generator=g)
        inv = inv_freq_of(rot_dim, base)
        cases.append((f"B={B}, S={S}, R={rot_dim}, scaling {scaling}, {dtype}, positions < {high}",
                      (inv.clone(), pos.clone(), scaling, dtype),
                      hf_cos_sin_expected(inv, pos, scaling, dtype)))
    seed, g = fresh_generator()     # and a case drawn now: answers computed beforehand fail
    B, S = (int(v) for v in torch.randint(1, 5, (2,), generator=g))
    rot_dim = 8 * int(torch.randint(1, 9, (), generator=g))
    pos = torch.randint(0, 200_000, (B, S), generator=g)
    inv = inv_freq_of(rot_dim, 10000.0) / (1 + torch.rand((), generator=g))   # a scaled table
    scaling = float(1 + torch.rand((), generator=g))
    dtype = (torch.bfloat16, torch.float32)[int(torch.randint(0, 2, (), generator=g))]
    cases.append((f"B={B}, S={S}, R={rot_dim}, scaling {scaling:.4f}, {dtype} (drawn with seed "
                  f"{seed})", (inv.clone(), pos.clone(), scaling, dtype),
                  hf_cos_sin_expected(inv, pos, scaling, dtype)))
    return check_cases("HF's cos and sin", "your own cos and sin", fn, cases,
                       post=_within_rounding, atol=0, rtol=0,
                       hint="angles = position_ids (as fp32) times inv_freq, in fp32; the same "
                            "angles for both halves; cos and sin in fp32, times "
                            "attention_scaling, then one .to(dtype)",
                       bar=third_party_ropes())


def table_line_of(fn, x_sbhd: torch.Tensor, lines: dict) -> tuple:
    """Exercise 2's last question, answered with the learner's own cos and sin: `fn` (their
    hf_cos_sin) gives bf16 cos, sin for positions 0..S-1 of `x_sbhd` [S, B, H, D] (base 10000,
    every feature rotated, no scaling); `ropelib.apply_rope(x_sbhd, cos=cos[0], sin=sin[0])` is
    then held against each line of section 2's table (`lines`: name -> output). Returns (the name
    of the line with the most outputs equal to it, that share of outputs)."""
    from ... import apply_rope, frequencies
    S, D = x_sbhd.shape[0], x_sbhd.shape[-1]
    inv = frequencies.inv_freq(D).to(x_sbhd.device)                    # [D/2] fp32, as HF's
    positions = torch.arange(S, device=x_sbhd.device)[None]            # [1, S]
    cos, sin = fn(inv, positions, 1.0, torch.bfloat16)                 # [1, S, D] each
    y = apply_rope(x_sbhd, cos=cos[0], sin=sin[0])
    shares = {name: (y == out).double().mean().item() for name, out in lines.items()}
    best = max(shares, key=shares.get)
    return best, shares[best]


# --- worked solutions (shown folded in notebook 02) ------------------------------------------

def solution_thd_cp_positions(cu_seqlens, cp_size, cp_rank):
    # each sequence is split on its own, exactly as section 5 splits one sequence
    positions = []
    cu = cu_seqlens.tolist()
    for start, end in zip(cu[:-1], cu[1:]):
        local_len = (end - start) // cp_size          # this sequence's tokens on each rank
        chunk = local_len // 2                        # 2 * cp_size chunks of the sequence
        if cp_size == 1:
            positions += list(range(local_len))
            continue
        mirror = 2 * cp_size - 1 - cp_rank
        positions += list(range(cp_rank * chunk, (cp_rank + 1) * chunk))     # from the front
        positions += list(range(mirror * chunk, (mirror + 1) * chunk))       # from the back
    return positions


def solution_hf_cos_sin(inv_freq, position_ids, attention_scaling, dtype):
    # HF: inv_freq[None, :, None] @ position_ids[:, None, :] in fp32, then transpose; with
    # K = 1 that matmul is one product a position and frequency, the same as this broadcast
    angles = position_ids.float()[..., None] * inv_freq.float()      # [B, S, R/2], fp32
    emb = torch.cat((angles, angles), dim=-1)                        # rotate-half: both halves
    cos = emb.cos() * attention_scaling                              # still fp32
    sin = emb.sin() * attention_scaling
    return cos.to(dtype), sin.to(dtype)                              # rounded once
