"""Exercise checks for notebooks 00-02 (setup, RoFormer math, PyTorch reference and layouts).

Every `check_...` computes its expected answer from ropelib itself (`reference`, `frequencies`,
`compare`), prints ✅ or ❌ through `ropelib.course.exercises.check`, returns a bool and never raises.
The exercises of notebooks 00, 01 and 02 are answered with the learner's *function*, also those
whose answer is a number or a list (a call's TB/s and TFLOP/s, a permutation, the positions a
rank holds, a byte count): the check tries it on several inputs and reports the first
one that fails, and runs it with ropelib's own answers barred (`own_code`): a function that
calls `ropelib.apply_rope`, `ropelib.reference`, `ropelib.frequencies`, the finished API, the
benchmarks' bytes model or the worked solution below is refused, whatever it returns. Notebook 01's checks also refuse the
course's own RoPE helpers (`own_code.course_rope_helpers`: notebook 13's specs and the like), and
the rotation matrix's check refuses PyTorch's block_diag operator, every overload, however it is
reached (`torch.block_diag`, `torch.ops.aten.block_diag.*`,
`torch._C._VariableFunctions.block_diag`, its Python reference `torch._refs.block_diag` and its
decompositions), an answer that switches off the check's watch of PyTorch's operators
(`_disable_current_modes`, `_DisableTorchDispatch`), and SciPy's `scipy.linalg.block_diag` and
`scipy.sparse.block_diag` where SciPy is installed. The relative score's check (notebook 01,
exercise 2) refuses those block_diags too, and the rotations notebook 01 defines before its
exercises (`notebook_rotations`: rot2, R_from_reference, rope_at and exercise 1's
rotation_matrix): the exercise wants the score from complex pairs. Notebook 00's interleaved
RoPE and notebook 01's rotation matrix, relative score and rotate_half refuse the RoPE functions
of transformers, Transformer Engine and flash-attn (`third_party_ropes`), where they are
installed.
Notebook 01's checks try several sizes and bases, and positions drawn anew on every call, so an
answer that ignores its `inv_freq` or returns stored matrices fails; the other checks that take
inputs add a case drawn when the check runs (`own_code.fresh_generator`, its seed in the label),
so no answer computed beforehand, with the library outside the check, matches every case.

The worked solutions are the `solution_*` functions below, shown folded in the notebooks with
`ropelib.course.exercises.solution(basics.solution_...)`; the tests run every check on a
learner's copy of its solution, on library answers and on wrong answers.
"""
import inspect
import re
from typing import Callable, Sequence

import torch

from ... import frequencies, reference, runtime
from . import check
from .. import measured
from .own_code import (check_cases, course_rope_helpers, fresh_generator, installed_modules,
                       listed_as_tensor, run_own_code)

__all__ = [
    "check_device", "check_call_rates", "check_interleaved_rope",
    "check_rotation_matrix", "check_relative_score", "check_rotate_half",
    "check_interleave_permutation",
    "check_cp_positions", "check_cos_sin_from_freqs", "check_bytes_moved",
    "rotation_matrix_ref", "other_block_diags", "torch_block_diags", "BLOCK_DIAG_OPS",
    "notebook_rotations", "NOTEBOOK_01_ROTATIONS",
    "third_party_ropes",
]


# --- notebook 00: setup and tour -------------------------------------------------------------

def check_device(fn) -> bool:
    """Notebook 00's device rule (section 1): fn(has_gpu, interpret) -> "cuda" or "cpu", the
    device the notebooks put their tensors on for a machine with or without a usable GPU, with
    TRITON_INTERPRET=1 set or not. The check tries all four machines (with ropelib barred),
    then prints the answer for this one."""
    cases = [(f"has_gpu={gpu}, interpret={interpret}", (gpu, interpret),
              "cuda" if gpu and not interpret else "cpu")
             for gpu in (True, False) for interpret in (True, False)]
    ok = check_cases("the device of the notebooks' tensors", "your rule", fn, cases,
                     hint="the kernels run compiled only with a usable GPU and TRITON_INTERPRET "
                          "unset; otherwise Triton's interpreter runs them, on the CPU")
    if ok:
        here = runtime.default_device()
        print(f"   this machine: {here} (section 1 printed it as the notebook device)")
    return ok


def _rates(S, B, H, D, elem_bytes, ms):
    """(TB/s, TFLOP/s) of a RoPE forward of one sbhd tensor [S, B, H, D] that took ms: the bytes
    of `ropelib.bench.compare.bytes_moved` (x read and written, the fp32 table [S, D] read once),
    3 FLOPs an element."""
    from ...bench.compare import Config, bytes_moved  # imported late: a heavier module
    dtype = {2: "bf16", 4: "fp32"}[elem_bytes]
    seconds = ms * 1e-3
    return (bytes_moved(Config(S, B, H, D, dtype=dtype)) / seconds / 1e12,
            3 * S * B * H * D / seconds / 1e12)


def check_call_rates(fn: Callable) -> bool:
    """Notebook 00, exercise 1: fn(seq_len, batch, heads, head_dim, bytes_per_element, ms) ->
    (tb_s, tflop_s), the memory rate and the arithmetic rate of a RoPE forward of one `sbhd`
    tensor that took `ms` milliseconds: bytes = x read and written plus the fp32 angle table
    [seq_len, head_dim] read once, 3 FLOPs an element (2 multiplies, 1 add).

    Tried on the committed H200 run's 1 GiB line and decoding step (ropelib's times, where the
    floor CSV is present) and on two shapes and times drawn when the check runs (their seed in
    the label). Barred: ropelib (all of `ropelib.bench`, whose bytes model is the answer), the
    course's reader of the committed results (`ropelib.course.measured`) and the worked
    solution."""
    import inspect as _inspect
    cases = []
    decode_tb_s = None
    if measured.path("floor").is_file():
        from ...bench import floor as floor_suite
        configs = {case.name: case.config for case in floor_suite.rope_cases()}
        floor = measured.floor()
        for name, row in (("1 GiB bf16 sbhd", "forward 1 GiB bf16 sbhd"),
                          ("sbhd", "decode host forward sbhd")):
            c, ms = configs[name], floor[row]["ropelib"]["ms"]
            args = (c.seq_len, c.batch, c.heads, c.head_dim, 2, ms)
            cases.append((f"the committed H200 run, {row}: x [{c.seq_len}, {c.batch}, {c.heads}, "
                          f"{c.head_dim}] bf16 in {ms:.4g} ms", args, _rates(*args)))
        decode_tb_s = cases[-1][2][0]
    seed, g = fresh_generator()     # and calls drawn now: answers computed beforehand fail
    for _ in range(2):
        S, B, H = (int(v) for v in torch.randint(1, 4097, (3,), generator=g))
        H = 1 + H % 64
        D = 16 * int(torch.randint(1, 17, (), generator=g))
        elem = (2, 4)[int(torch.randint(0, 2, (), generator=g))]
        ms = round(float(torch.rand((), generator=g)) * 10 + 0.001, 4)
        cases.append((f"x [{S}, {B}, {H}, {D}], {elem} bytes an element, {ms} ms (drawn with "
                      f"seed {seed})", (S, B, H, D, elem, ms), _rates(S, B, H, D, elem, ms)))
    own_readers = tuple(v for v in vars(measured).values()
                        if _inspect.isfunction(v) and v.__module__ == measured.__name__)
    ok = check_cases("TB/s and TFLOP/s of one call", "your own count of bytes and FLOPs", fn,
                     cases, post=_as_pair, rtol=1e-6, atol=0,
                     hint="bytes: 2 * S*B*H*D * bytes_per_element (read x, write y) + S*D*4 "
                          "(the fp32 table); FLOPs: 3 * S*B*H*D; divide each by ms * 1e-3 "
                          "seconds, then by 1e12",
                     bar=(*own_readers, solution_call_rates))
    if ok and decode_tb_s is not None:      # the exercise's last question, answered
        share = decode_tb_s / H200_HBM_TB_S
        verdict = ("not memory-bound, its time is the call's fixed cost" if share < 0.5
                   else "its bytes set a good part of its time")
        print(f"   the committed decoding step moves {decode_tb_s:.3f} TB/s, {share:.1%} of the "
              f"H200's {H200_HBM_TB_S} TB/s: {verdict}")
    return ok


H200_HBM_TB_S = measured.peak_tb_s("NVIDIA H200")   # the H200 SXM's memory (notebook 00, section 3)


def _as_pair(answer, expected):
    """The learner's (tb_s, tflop_s) as a tuple of two floats."""
    tb_s, tflop_s = answer
    return float(tb_s), float(tflop_s)


def check_interleaved_rope(fn: Callable) -> bool:
    """Notebook 00, exercise 3: fn(x, freqs) -> the RoPE of a `bshd` x [B, S, H, D] with the
    interleaved pairing (GPT-J), freqs the interleaved angle table [S, 1, 1, D] of
    `frequencies.rope_freqs(S, D, interleaved=True)` (each angle twice: f0 f0 f1 f1 ...): what
    `ropelib.apply_rope(x, freqs, layout="bshd", interleaved=True)` returns.

    Tried on the exercise's shape and on others (B == S, where a table left in `sbhd` order
    broadcasts without an error; B == 1; a table of positions 3.. and another base; bf16), with
    ropelib barred, the worked solutions of this exercise and of notebook 01's rotate_half, the
    course's own RoPE helpers (`course_rope_helpers`: notebook 13's specs and the like), and the
    RoPE functions of transformers, Transformer Engine and flash-attn (`third_party_ropes`).
    The expected values are `reference.rope_reference`'s, computed outside the block.
    """
    g = torch.Generator().manual_seed(3)
    cases = []
    for (B, S, H, D), dtype, kw in (((2, 6, 4, 16), torch.float32, {}),
                                    ((4, 4, 2, 8), torch.float32, {}),
                                    ((1, 5, 3, 8), torch.float32, dict(offset=3)),
                                    ((3, 7, 2, 32), torch.bfloat16, dict(base=500000.0))):
        x = torch.randn(B, S, H, D, generator=g).to(dtype)
        f = frequencies.rope_freqs(S, D, interleaved=True, **kw)
        want = reference.rope_reference(x, f, layout="bshd", interleaved=True)
        label = f"x [{B}, {S}, {H}, {D}] {str(dtype).replace('torch.', '')}" + \
            "".join(f", {k}={v:g}" for k, v in kw.items())
        cases.append((label, (x.clone(), f.clone()), want))
    seed, g = fresh_generator()     # and inputs drawn now: answers computed beforehand fail
    B, S, H = (int(v) for v in torch.randint(1, 6, (3,), generator=g))
    offset = int(torch.randint(0, 1000, (), generator=g))
    x = torch.randn(B, S, H, 16, generator=g)
    f = frequencies.rope_freqs(S, 16, interleaved=True, offset=offset)
    cases.append((f"x [{B}, {S}, {H}, 16] float32, offset={offset} (drawn with seed {seed})",
                  (x.clone(), f.clone()),
                  reference.rope_reference(x, f, layout="bshd", interleaved=True)))
    return check_cases("interleaved RoPE of a bshd tensor", "your own RoPE", fn, cases,
                       hint="move the table's positions to dim 1 (bshd: [1, S, 1, D]), pair "
                            "neighbours: rotate_half(x) = (-x1, x0, -x3, x2, ...), and compute "
                            "in fp32, rounding to x's dtype once at the end",
                       bar=(*course_rope_helpers(), *third_party_ropes()))


# RoPE code of other libraries, refused by the interleaved RoPE's check where installed: these
# modules always (GPT-J's interleaved rotation and its kin, Transformer Engine's and
# flash-attn's RoPE), and every other module of those libraries the notebook has imported
_THIRD_PARTY_ROPE_MODULES = (
    *(f"transformers.models.{m}.modeling_{m}"
      for m in ("gptj", "codegen", "roformer", "cohere", "glm", "deepseek_v3", "llama",
                "gpt_neox")),
    "transformer_engine.pytorch.attention.rope", "transformer_engine.pytorch.attention",
    "transformer_engine.pytorch.dot_product_attention.rope",
    "flash_attn.layers.rotary", "flash_attn.ops.triton.rotary",
)
_THIRD_PARTY_PREFIXES = ("transformers.", "transformer_engine.", "flash_attn.")
_ROPE_NAME = re.compile(r"rotary|rotate|(^|_)rope(_|$)", re.IGNORECASE)


def _rope_functions(module) -> list:
    """The functions and classes `module` defines whose names say RoPE (apply_rotary_pos_emb,
    rotate_every_two, rotate_half, GPTJRotaryEmbedding...), and such methods of its classes
    (RoFormer's apply_rotary_position_embeddings)."""
    found = []
    for name, obj in list(vars(module).items()):
        if getattr(obj, "__module__", None) != module.__name__ or not callable(obj):
            continue
        if _ROPE_NAME.search(name):
            found.append(obj)
        elif isinstance(obj, type):
            found += [getattr(v, "__func__", v) for n, v in vars(obj).items()
                      if _ROPE_NAME.search(n) and callable(getattr(v, "__func__", v))]
    return found


def third_party_ropes() -> tuple:
    """The RoPE functions of transformers (GPT-J's `apply_rotary_pos_emb` and
    `rotate_every_two`, Llama's `rotate_half`, and those of every model module already
    imported), Transformer Engine (`apply_rotary_pos_emb`, fused or not) and flash-attn, where
    they are installed: the same answer from a library, refused where the exercise asks for
    the learner's own RoPE."""
    import sys
    modules = installed_modules(_THIRD_PARTY_ROPE_MODULES)
    modules += [m for n, m in list(sys.modules.items())
                if n.startswith(_THIRD_PARTY_PREFIXES) and isinstance(m, type(sys))
                and re.search(r"modeling_|rope|rotary", n.rsplit(".", 1)[-1])]
    found = []
    for module in dict.fromkeys(modules):
        found += _rope_functions(module)
    return tuple(dict.fromkeys(found))


# --- notebook 01: RoFormer math --------------------------------------------------------------

def rotation_matrix_ref(m: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """R_m, the [R, R] block-diagonal rotation of position m (interleaved pairs, RoFormer eq. 13),
    read off the reference: column i is the RoPE of the basis vector e_i."""
    inv = inv_freq.to(torch.float64)
    ang = (m * inv).repeat_interleave(2)                                # [R], pairwise
    eye = torch.eye(ang.numel(), dtype=torch.float64)                   # rows e_i
    return reference.apply_rope_ref(eye, ang.cos(), ang.sin(), interleaved=True).T


# the sizes and bases notebook 01's checks try: the notebook's d = 8 first, then others, so an
# answer that ignores its inv_freq (or reads the notebook's) fails
SIZES_AND_BASES = ((8, 10000.0), (4, 10000.0), (16, 500000.0))


def _positions(count: int, high: int = 10_000) -> list:
    """`count` positions in [1, high), drawn anew on every call (not from torch's global
    generator, which the learner's notebook owns): stored answers for fixed positions fail."""
    g = torch.Generator()
    g.seed()
    return torch.randint(1, high, (count,), generator=g).tolist()


def other_block_diags() -> tuple:
    """The block_diag functions of other installed libraries (SciPy's `scipy.linalg.block_diag`
    and `scipy.sparse.block_diag`), refused by the rotation matrix's check like PyTorch's: the
    exercise places the blocks."""
    found = []
    for name in ("scipy.linalg", "scipy.sparse"):
        try:
            module = __import__(name, fromlist=["block_diag"])
        except ImportError:
            continue
        if callable(getattr(module, "block_diag", None)):
            found.append(module.block_diag)
    return tuple(found)


def torch_block_diags() -> tuple:
    """PyTorch's block_diag in Python, every way in: `torch.block_diag`, its Python reference
    (`torch._refs.block_diag`) and its decompositions (`torch._decomp.decomposition_table`, for
    every overload of aten::block_diag). The operator itself is refused as `BLOCK_DIAG_OPS`.
    Each is taken unwrapped (`inspect.unwrap`): its decorators' code is shared by many
    functions, the innermost function is block_diag's alone."""
    import importlib
    found = [torch.block_diag]
    try:
        found.append(inspect.unwrap(importlib.import_module("torch._refs").block_diag))
    except (ImportError, AttributeError):
        pass
    try:
        from torch._decomp import decomposition_table
        packet = torch.ops.aten.block_diag
        found += [inspect.unwrap(decomposition_table[getattr(packet, name)])
                  for name in packet.overloads()
                  if getattr(packet, name) in decomposition_table]
    except (ImportError, AttributeError):
        pass
    return tuple(dict.fromkeys(found))


# PyTorch's block_diag operator, every overload (aten::block_diag.default, .out), however it is
# reached (torch.block_diag, torch.ops.aten.block_diag.*, torch._C._VariableFunctions)
BLOCK_DIAG_OPS = (torch.ops.aten.block_diag,)


def check_rotation_matrix(fn: Callable) -> bool:
    """fn(m, inv_freq) -> the [R, R] block-diagonal matrix R_m (pairs (2j, 2j+1), angle m*theta_j).

    Tried for each (R, base) of SIZES_AND_BASES at m = 0 and three positions drawn on each call,
    with inv_freq in float64. Refused: ropelib, the course's RoPE helpers, the worked solution,
    PyTorch's block_diag operator (every overload), however it is reached, with its Python
    reference and decompositions (`torch_block_diags`), an answer that switches off the check's
    watch of PyTorch's operators, SciPy's block_diags and the RoPE functions of other libraries
    (`third_party_ropes`: GPT-J's RoPE applied to the basis vectors is R_m too).
    """
    cases = []
    for rot_dim, base in SIZES_AND_BASES:
        inv = frequencies.inv_freq(rot_dim, base, dtype=torch.float64)
        for m in [0] + _positions(3):
            cases.append((f"R={rot_dim}, base={base:g}, m={m}", (m, inv.clone()),
                          rotation_matrix_ref(m, inv)))
    return check_cases("rotation matrix R_m", "your rotation matrix, built from its 2x2 blocks "
                       "(no torch.block_diag, no ropelib)", fn, cases, atol=1e-6, rtol=0,
                       hint="block j sits on rows and columns 2j and 2j+1 (neighbours, not j "
                            "and j + R/2) and is [[cos a, -sin a], [sin a, cos a]], the minus "
                            "above the diagonal, with a = m * inv_freq[j], in float64 "
                            "(inv_freq's dtype: the positions go up to 10^4)",
                       bar=(*torch_block_diags(), *other_block_diags(), rotation_matrix_ref,
                            *course_rope_helpers(), *third_party_ropes()),
                       bar_ops=BLOCK_DIAG_OPS)


# the rotations notebook 01 builds before its exercises (its `__main__` namespace): rot2 of
# section 1, R_from_reference of section 2, rope_at of section 4, and the learner's own
# rotation_matrix of exercise 1. Exercise 2 wants the score from complex pairs, not a rotation.
NOTEBOOK_01_ROTATIONS = ("rot2", "R_from_reference", "rope_at", "rotation_matrix")


def notebook_rotations() -> tuple:
    """The functions of NOTEBOOK_01_ROTATIONS the running notebook defines (its `__main__`
    namespace; outside a notebook, whatever `__main__` holds), refused by the relative score's
    check: they rotate, the exercise asks for the sum over complex pairs."""
    import sys
    main = sys.modules.get("__main__")
    names = vars(main) if main is not None else {}
    return tuple(names[n] for n in NOTEBOOK_01_ROTATIONS
                 if callable(names.get(n)) and hasattr(names[n], "__code__"))


# the (m, n) pairs the relative score's check tries at every size: n below m (a negative
# offset n - m) as often as above, m = n, and positions up to 10^4
_SCORE_PAIRS = ((0, 3), (5, 2), (7, 7), (100, 42), (1000, 1001), (4000, 17))


def check_relative_score(fn: Callable) -> bool:
    """fn(q, k, offset, inv_freq) -> g(q, k, n - m), the score of notebook 01's section 4 from
    complex pairs, offset = n - m: Re sum_j q_j conj(k_j) exp(-i (n - m) theta_j), with
    q_j = q[2j] + i q[2j+1] and k_j = k[2j] + i k[2j+1] (interleaved pairs).

    Tried for each (R, base) of SIZES_AND_BASES on the pairs (m, n) of _SCORE_PAIRS and a pair
    drawn on each call, with q and k [R] drawn anew on every call (their seed in the label) and
    everything in float64; only the offset n - m is passed. The expected score is the rotated
    dot product (R_m q)^T (R_n k) of the reference matrices (`rotation_matrix_ref`), computed
    outside the block. Refused: ropelib, the course's RoPE helpers, the worked solutions, the
    check's own matrix, PyTorch's block_diag operator, and the rotations notebook 01 defines
    (`notebook_rotations`: rot2, R_from_reference, rope_at and exercise 1's rotation_matrix),
    and the RoPE functions of other libraries (`third_party_ropes`).
    """
    seed, g = fresh_generator()     # q, k and a pair drawn now: answers made beforehand fail
    cases = []
    for rot_dim, base in SIZES_AND_BASES:
        inv = frequencies.inv_freq(rot_dim, base, dtype=torch.float64)
        q = torch.randn(rot_dim, generator=g, dtype=torch.float64)
        k = torch.randn(rot_dim, generator=g, dtype=torch.float64)
        drawn = tuple(int(v) for v in torch.randint(0, 10_000, (2,), generator=g))
        for m, n in _SCORE_PAIRS + (drawn,):
            want = (rotation_matrix_ref(m, inv) @ q) @ (rotation_matrix_ref(n, inv) @ k)
            cases.append((f"R={rot_dim}, base={base:g}, m={m}, n={n}, q and k drawn with seed "
                          f"{seed}", (q.clone(), k.clone(), n - m, inv.clone()), want.item()))
    return check_cases("relative score g(q, k, n - m)", "the score computed from complex pairs",
                       fn, cases, atol=1e-9, rtol=1e-9,
                       hint="pairs as complex numbers: torch.view_as_complex(q.reshape(-1, "
                            "2)); the key's pair is conjugated and turned by -(n - m) * "
                            "theta_j; the score is the real part of the sum",
                       bar=(rotation_matrix_ref, *torch_block_diags(), *other_block_diags(),
                            *course_rope_helpers(), *notebook_rotations(), *third_party_ropes()),
                       bar_ops=BLOCK_DIAG_OPS)


def check_rotate_half(fn: Callable) -> bool:
    """fn(x, interleaved) -> rotate_half(x): [-x2, x1] (halves) or [-x1, x0, -x3, x2, ...].
    Refused: ropelib, the course's RoPE helpers and the RoPE functions of other libraries
    (`third_party_ropes`: transformers' rotate_half and GPT-J's rotate_every_two)."""
    g = torch.Generator().manual_seed(1)
    cases = []
    for interleaved in (False, True):
        for shape in ((8,), (3, 2, 12)):
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            cases.append((f"interleaved={interleaved}, shape={shape}", (x.clone(), interleaved),
                          reference.rotate_half(x, interleaved)))
    seed, g = fresh_generator()     # and inputs drawn now: answers computed beforehand fail
    for interleaved in (False, True):
        x = torch.randn(3, 2 * int(torch.randint(1, 9, (), generator=g)), generator=g,
                        dtype=torch.float64)
        cases.append((f"interleaved={interleaved}, shape={tuple(x.shape)} (drawn with seed "
                      f"{seed})", (x.clone(), interleaved), reference.rotate_half(x, interleaved)))
    return check_cases("rotate_half", "your own rotate_half", fn, cases,
                       atol=0, rtol=0,
                       hint="halves [u, v] -> [-v, u], with torch.chunk(x, 2, -1); "
                            "neighbours (x0, x1, ...) -> (-x1, x0, ...), with x[..., ::2] and "
                            "x[..., 1::2]; the minus goes on the second of each pair, moved "
                            "to the front",
                       bar=(*course_rope_helpers(), *third_party_ropes()))


def _both_sides(p: torch.Tensor, rot_dim: int, src: bool, dst: bool):
    """(want, got) for a permutation p: the RoPE of `src` pairing, and the RoPE of `dst` pairing
    applied to x[..., p] and put back with argsort(p), on random x (each side its own table)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2, 3, rot_dim, generator=g, dtype=torch.float64)      # [S, B, H, R]
    f_src = frequencies.rope_freqs(5, rot_dim, interleaved=src).double()
    f_dst = frequencies.rope_freqs(5, rot_dim, interleaved=dst).double()
    want = reference.rope_reference(x, f_src, interleaved=src)
    got = reference.rope_reference(x[..., p], f_dst, interleaved=dst)[..., torch.argsort(p)]
    return want, got


def check_interleave_permutation(fn: Callable, *, to: str = "rotate_half",
                                 dims: Sequence[int] = (8, 2, 4, 16, 64)) -> bool:
    """fn(rot_dim) -> the feature permutation between the two pairings of the same rotation.

    to="rotate_half": perm with  interleaved RoPE(x) == rotate-half RoPE(x[..., perm])[..., inv]
    to="interleaved": perm with  rotate-half RoPE(x) == interleaved RoPE(x[..., perm])[..., inv]
    where inv = argsort(perm) undoes the permutation, and each side uses its own `rope_freqs`
    table. fn runs with ropelib barred (`own_code`) for each rot_dim in `dims`, then for an even
    rot_dim drawn when the check runs (6 to 512, `own_code.fresh_generator`, its seed in the
    case's label): a table of permutations listed beforehand for the dims it is tried on fails.
    Each permutation is checked by applying the reference to random inputs, not against a stored
    list.
    """
    if to not in ("rotate_half", "interleaved"):
        raise ValueError(f"to must be 'rotate_half' or 'interleaved', got {to!r}")
    src, dst = (True, False) if to == "rotate_half" else (False, True)   # interleaved flags
    name = f"{'interleaved' if src else 'rotate-half'} -> {to.replace('_', '-')} permutation"
    hint = ("rotate-half pairs (j, j + R/2), interleaved pairs (2j, 2j+1): "
            "where must each pair's two features go?")
    helpers = course_rope_helpers()
    seed, g = fresh_generator()     # and a rot_dim drawn now: a table made beforehand fails
    drawn = 2 * int(torch.randint(3, 257, (), generator=g))     # 6 to 512, a head dim's range
    tried = (*dims, drawn)
    for i, rot_dim in enumerate(tried):
        label = f"{name} (R={rot_dim}" + (f", drawn with seed {seed})" if i == len(dims)
                                          else ")")
        ok, perm = run_own_code(label, "the permutation worked out by your code", fn, rot_dim,
                                bar=helpers)
        if not ok:
            return False
        try:
            p = torch.as_tensor(perm.tolist() if isinstance(perm, torch.Tensor) else list(perm),
                                dtype=torch.int64)
        except Exception:  # noqa: BLE001 -- anything that is not a list of ints
            return check(label, False, True,
                         hint=f"return a list of {rot_dim} ints, got {str(perm)[:60]!r}")
        if p.shape != (rot_dim,) or not torch.equal(p.sort().values, torch.arange(rot_dim)):
            return check(label, sorted(p.reshape(-1).tolist()), list(range(rot_dim)),
                         hint=f"perm must contain each of 0..{rot_dim - 1} exactly once")
        want, got = _both_sides(p, rot_dim, src, dst)
        if not torch.allclose(got, want, atol=1e-12, rtol=0):
            return check(label, got, want, atol=1e-12, rtol=0, hint=hint)
    return check(f"{name} (R={', '.join(map(str, tried))})", True, True)


# --- notebook 02: reference and layouts ------------------------------------------------------

def check_cp_positions(fn: Callable) -> bool:
    """fn(local_len, cp_size, cp_rank) -> the global positions of the local_len tokens that rank
    cp_rank holds under Transformer Engine's dual-chunk split (ints, in the rank's local order).

    Tried on the split of notebook 02's exercise (16 tokens over 2 ranks) and on others; the
    expected positions are `reference.positions`'. Your own code: `ropelib` (`reference`,
    `context_parallel`) and the worked solutions are barred.
    """
    cases = []
    for local_len, cp_size, cp_rank in ((8, 2, 1), (8, 2, 0), (8, 4, 2), (6, 3, 0), (4, 2, 1),
                                        (6, 1, 0)):
        want = reference.positions("sbhd", local_len, 1, cp_size=cp_size, cp_rank=cp_rank)[0]
        cases.append((f"local_len={local_len}, cp_size={cp_size}, rank {cp_rank}",
                      (local_len, cp_size, cp_rank), want))
    seed, g = fresh_generator()     # and a split drawn now: a table made beforehand fails
    cp_size = int(torch.randint(1, 31, (), generator=g))     # (at most 300 positions)
    local_len = 2 * int(torch.randint(1, 150 // cp_size + 1, (), generator=g))
    cp_rank = int(torch.randint(0, cp_size, (), generator=g))
    cases.append((f"local_len={local_len}, cp_size={cp_size}, rank {cp_rank} (drawn with seed "
                  f"{seed})", (local_len, cp_size, cp_rank),
                  reference.positions("sbhd", local_len, 1, cp_size=cp_size, cp_rank=cp_rank)[0]))
    return check_cases("context-parallel positions", "the positions worked out by your code", fn,
                       cases, post=listed_as_tensor,
                       hint="2*cp_size chunks of local_len / 2 tokens; rank r holds chunk r, then "
                            "chunk 2*cp_size-1-r")


def check_cos_sin_from_freqs(fn: Callable) -> bool:
    """fn(freqs [S, 1, 1, R]) -> (cos, sin), each [S, R]: TE's angle table to HF's cache."""
    cases = []
    for interleaved, percent in ((False, 1.0), (True, 1.0), (False, 0.5)):
        f = frequencies.rope_freqs(6, 16, rotary_percent=percent, interleaved=interleaved, offset=3)
        want = frequencies.rope_cos_sin(6, 16, rotary_percent=percent, interleaved=interleaved,
                                        offset=3)
        cases.append((f"interleaved={interleaved}, rotary_percent={percent}", (f.clone(),),
                      tuple(want)))
    seed, g = fresh_generator()     # and a table drawn now: answers computed beforehand fail
    S, offset = int(torch.randint(1, 10, (), generator=g)), int(torch.randint(0, 100_000, (),
                                                                                 generator=g))
    interleaved = bool(torch.randint(0, 2, (), generator=g))
    f = frequencies.rope_freqs(S, 16, interleaved=interleaved, offset=offset)
    want = frequencies.rope_cos_sin(S, 16, interleaved=interleaved, offset=offset)
    cases.append((f"S={S}, offset={offset}, interleaved={interleaved} (drawn with seed {seed})",
                  (f.clone(),), tuple(want)))
    return check_cases("freqs -> (cos, sin)", "your own conversion", fn, cases,
                       hint="drop the two middle dims of [S, 1, 1, R], then take cos and sin")


def check_bytes_moved(fn: Callable) -> bool:
    """fn(seq_len, batch, q_heads, kv_heads, head_dim, rotary_percent=1.0, bytes_per_element=2)
    -> the bytes a fused forward of q and k in one launch must move at least: read q
    [S, B, Hq, D] and k [S, B, Hk, D], write both (the features past the rotary dim are copied
    through), read the fp32 angle table [S, R] once, R = int(D * rotary_percent).

    Tried on the shape of notebook 02's exercise (q [4096, 2, 32, 128], k with 8 heads, bf16,
    full rotary) and on others; the expected count is `ropelib.bench.compare.bytes_moved`'s,
    which is barred (all of ropelib.bench is), with ropelib and the worked solution.
    """
    from ...bench.compare import Config, bytes_moved  # imported late: compare is a heavier module

    cases = []
    for S, B, HQ, HK, D, p, dtype in ((4096, 2, 32, 8, 128, 1.0, "bf16"),
                                      (7, 3, 5, 5, 64, 0.5, "fp32"), (1, 1, 1, 1, 2, 1.0, "fp16"),
                                      (512, 4, 16, 2, 80, 0.4, "bf16"),
                                      (64, 1, 4, 1, 128, 0.6, "bf16"),
                                      (33, 1, 6, 3, 96, 0.25, "fp32")):
        elem = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
        want = bytes_moved(Config(S, B, HQ, D, dtype=dtype, rotary_percent=p, kv_heads=HK))
        cases.append((f"q [{S}, {B}, {HQ}, {D}], k with {HK} heads, rotary_percent {p}, {dtype}",
                      (S, B, HQ, HK, D, p, elem), want))
    seed, g = fresh_generator()     # and a shape drawn now: a table made beforehand fails
    S, B, HK = (int(v) for v in torch.randint(1, 100, (3,), generator=g))
    HQ, D = HK * int(torch.randint(1, 5, (), generator=g)), 16 * int(torch.randint(1, 9, (),
                                                                                   generator=g))
    dtype = ("bf16", "fp16", "fp32")[int(torch.randint(0, 3, (), generator=g))]
    cases.append((f"q [{S}, {B}, {HQ}, {D}], k with {HK} heads, rotary_percent 1.0, {dtype} "
                  f"(drawn with seed {seed})", (S, B, HQ, HK, D, 1.0, {"fp32": 4}.get(dtype, 2)),
                  bytes_moved(Config(S, B, HQ, D, dtype=dtype, rotary_percent=1.0,
                                     kv_heads=HK))))
    return check_cases("bytes moved", "your count of the bytes", fn, cases,
                       hint="every element of q and of k is read once and written once "
                            "(bytes_per_element each), plus seq_len * R fp32 angles (4 bytes "
                            "each), R = int(head_dim * rotary_percent) as in notebook 02, "
                            "section 3",
                       bar=(solution_bytes_moved,))   # (ropelib.bench's models: barred)


# --- worked solutions (shown folded in the notebooks) ----------------------------------------

def solution_call_rates(seq_len, batch, heads, head_dim, bytes_per_element, ms):
    elements = seq_len * batch * heads * head_dim
    # x read and written, the fp32 angle table [seq_len, head_dim] read once
    bytes_ = 2 * elements * bytes_per_element + seq_len * head_dim * 4
    flops = 3 * elements                       # y = x cos - x' sin: 2 multiplies, 1 add
    seconds = ms * 1e-3
    return bytes_ / seconds / 1e12, flops / seconds / 1e12


def solution_interleaved_rope(x, freqs):
    # x: [B, S, H, D] (bshd); freqs: [S, 1, 1, D], each angle twice (f0 f0 f1 f1 ...)
    S, D = freqs.shape[0], freqs.shape[-1]
    angles = freqs.view(1, S, 1, D)                 # positions on dim 1, as in x
    xf = x.float()
    # interleaved pairs (x0, x1), (x2, x3), ... turn together: rotate_half = (-x1, x0, -x3, x2, ...)
    rotated = torch.stack((-xf[..., 1::2], xf[..., 0::2]), dim=-1).flatten(-2)
    return (xf * angles.cos() + rotated * angles.sin()).to(x.dtype)


def solution_rotation_matrix(m, inv_freq):
    R = 2 * inv_freq.numel()
    M = torch.zeros(R, R, dtype=inv_freq.dtype)
    for j, theta in enumerate(inv_freq):
        c, s = torch.cos(m * theta), torch.sin(m * theta)
        M[2 * j, 2 * j], M[2 * j, 2 * j + 1] = c, -s
        M[2 * j + 1, 2 * j], M[2 * j + 1, 2 * j + 1] = s, c
    return M


def solution_relative_score(q, k, offset, inv_freq):
    # pairs as complex numbers: q_j = q[2j] + i q[2j+1], the same for k
    q_c = torch.view_as_complex(q.reshape(-1, 2).contiguous())
    k_c = torch.view_as_complex(k.reshape(-1, 2).contiguous())
    # g(q, k, n - m) = Re sum_j q_j conj(k_j) e^{-i (n - m) theta_j}, offset = n - m:
    # <R_m q, R_n k> = Re sum_j (q_j e^{i m theta_j}) conj(k_j e^{i n theta_j})
    turn = torch.polar(torch.ones_like(inv_freq), -offset * inv_freq)   # e^{-i (n - m) theta_j}
    return (q_c * k_c.conj() * turn).sum().real


def solution_rotate_half(x, interleaved=False):
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x_odd, x_even), dim=-1).flatten(-2)


def solution_interleave_permutation(rot_dim=8, to="rotate_half"):
    if to == "rotate_half":
        # even features first (they become the first half), then the odd ones
        return list(range(0, rot_dim, 2)) + list(range(1, rot_dim, 2))
    # the way back: feature i of the first half and i + R/2 become the pair (2i, 2i+1)
    half = rot_dim // 2
    return [i // 2 + (i % 2) * half for i in range(rot_dim)]


def solution_cp_positions(local_len, cp_size, cp_rank):
    # The sequence has cp_size * local_len tokens, cut into 2 * cp_size chunks of
    # local_len // 2; rank r holds chunk r, then chunk 2 * cp_size - 1 - r.
    # 16 tokens over cp_size=2: chunks [0-3] [4-7] [8-11] [12-15], rank 1 holds 4..11.
    chunk = local_len // 2
    mirror = 2 * cp_size - 1 - cp_rank
    return (list(range(cp_rank * chunk, (cp_rank + 1) * chunk))
            + list(range(mirror * chunk, (mirror + 1) * chunk)))


def solution_cos_sin_from_freqs(freqs):
    angles = freqs[:, 0, 0, :]          # [S, 1, 1, R] -> [S, R]
    return angles.cos(), angles.sin()


def solution_bytes_moved(seq_len, batch, q_heads, kv_heads, head_dim, rotary_percent=1.0,
                         bytes_per_element=2):
    # every feature of q and k is read and written, rotated or passed through
    qk_bytes = seq_len * batch * (q_heads + kv_heads) * head_dim * bytes_per_element
    rotary_dim = int(head_dim * rotary_percent)   # TE's and HF's truncation (section 3)
    table_bytes = seq_len * rotary_dim * 4        # fp32 angles [S, R], read once for q and k
    return 2 * qk_bytes + table_bytes             # read q and k, write both, read the table
