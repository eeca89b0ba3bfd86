"""Notebook 08's exercises: a combine line that gives Transformer Engine's bits (section 4b),
the trap read off the recovered positions (section 5), and the decision table as code
(section 6). `check_normwise_error` (the norm-wise error of section 4) is kept for the tests.

`check_classify(fn)` hands the learner's ``fn(diag)`` diagnoses (the keys `debug.diagnose`
reports, without its ``verdict``) and wants back the row of `debug.DECISIONS` that
`debug.classify` names: on fixed cases, on each boundary of the rules (a norm-wise error of
exactly `debug.LAYOUT_NORMWISE_U` u, an ulp error of exactly 1) and on cases drawn when the check
runs (`own_code.fresh_generator`, its seed in the label). `debug.classify`, `debug.diagnose`
(whose result carries the verdict) and the worked solution are barred inside the answer.

`check_normwise_error(fn)` runs the learner's ``fn(y, exact, x, rot_dim)`` on fresh outputs
(bf16 with every feature rotated, fp32 with partial rotary) and compares it with
`debug.normwise_error`, which is barred inside the answer, as are `debug.diagnose` (it computes
the same error) and every worked solution.

Section 5 has two parts, tried on outputs of the reproduction kernel, fp32 sbhd, each with one
of the four layout traps that leave a curve of recovered positions (or none), at two fixed sizes
and once more at a size and on tokens drawn when the check runs (`own_code.fresh_generator`,
its seed in the cases' labels). `check_recovered_positions(fn)` runs the learner's
``fn(x, y, layout)`` on them (and on two of them again in bshd) and compares the positions with
`debug.recovered_positions`, which is barred inside the answer, as are its worked solution and
the check's own cases. `check_trap_name(fn)` hands the learner's ``fn(pos)`` those positions,
[S, B, H], and wants the trap's name back; the worked solution and the cases are barred there.

The section's kernel, `_rope_combine_kernel`, rotates the rows of an sbhd tensor in fp32 and
leaves one line to a `@triton.jit` function it is handed as a constexpr,
``COMBINE(x1, x2, c, s) -> (y1, y2)``: the line ``y = x c + rot s`` with ``rot = -x2`` in the
first half and ``x1`` in the second. The learner writes that function so that the kernel's
output equals TE's fused RoPE bit for bit.

`check_te_combine(fn)` launches the kernel with the learner's combine on the two cases notebook
08 compares with TE, read from the committed GPU measurements
(``benchmarks/results/te-bits-<gpu>.pt``, inputs drawn again and checked against the stored
hashes): ``nb_cpu_fp32``, fp32 S=32 B=2 H=2 D=32, where every rounding shows, and ``nb_gpu``,
bf16 S=512 B=2 H=8 D=128. Cos and sin are TE's own (read back from TE on the GPU), so only the
combine can differ; the output is rounded once to the input dtype and its bits are compared with
TE's stored output. TE's outputs exist for those inputs only, so a combine that returned outputs
recorded beforehand (in Triton's interpreter a `@triton.jit` function can run Python, a table
look-up included) would match them: a third case draws fp32 x when the check runs
(`own_code.fresh_generator`, its seed in the label), on the fp32 case's positions and TE's cos
and sin, and compares with TE's line worked out exactly here (`_te_rounding`: fma(x, c, rot s),
the rounding both stored cases pin down, element for element). It passes when no element differs
in any case, and prints how many do otherwise.

The line counts as written: in Triton's interpreter (a CPU) every product is rounded unless the
line fuses it with ``tl.fma``; compiled (a GPU), the kernel is built with
``enable_fp_fusion=False``, so no compiler contracts what the line leaves unfused (the file's
``-nofuse`` rows: the same counts as the interpreter's). The plain ``x1 * c - x2 * s``, which a
GPU compiler may contract either way, fails on every machine.

The launch runs with ropelib's own answers barred (`own_code`): a combine that is, or calls, one
of ropelib's ``@triton.jit`` helpers (``ropelib.kernels.common.rotate_pair`` computes this very
line, and so does ``debug._fused_pair``, the reproduction kernel's fma line) or the worked
solution below is refused.
"""
import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ... import runtime
from .. import debug
from . import exception_line, is_blank_kernel, is_kernel
from .own_code import check_cases, fresh_generator, launch_barred

__all__ = ["check_normwise_error", "solution_normwise_error", "check_recovered_positions",
           "solution_recovered_positions", "check_trap_name", "solution_trap_name",
           "TRAPS_WITH_A_CURVE", "check_te_combine", "solution_te_combine", "launch", "CASE_KEYS",
           "te_cases", "check_classify", "solution_classify"]


# --- section 4: the norm-wise error ----------------------------------------------------------

def _normwise_cases() -> list:
    """(label, (y, exact, x, rot_dim), expected): fresh rotate-half outputs and their errors;
    the last case's x drawn when the check runs (a table made beforehand fails it)."""
    from ... import reference   # the checks may use the library freely, outside the answer
    gen = torch.Generator().manual_seed(8)
    seed, fresh = fresh_generator()
    cases = []
    for dtype, (S, B, H, D), R, g in ((torch.bfloat16, (6, 2, 3, 16), 16, gen),
                                      (torch.float32, (5, 1, 2, 24), 12, gen),
                                      (torch.float32, (4, 2, 1, 16), 16, fresh)):
        x = torch.randn(S, B, H, D, generator=g, dtype=torch.float64)
        inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
        f = torch.outer(torch.arange(S, dtype=torch.float64), inv)
        freqs = torch.cat((f, f), dim=-1).view(S, 1, 1, R)
        exact = reference.rope_reference(x, freqs)               # fp64, pass-through past R
        y = exact.to(dtype)
        y[..., 1] += 0.25 * y[..., 1].abs().clamp(min=1e-3)      # a few outputs off by more
        x_in = x.to(dtype)
        label = f"{str(dtype).replace('torch.', '')}, D={D}, rot_dim={R}" + (
            f" (drawn with seed {seed})" if g is fresh else "")
        cases.append((label, (y, exact, x_in, R),
                      debug.normwise_error(y, exact, x_in, rot_dim=R)))
    return cases


def check_normwise_error(fn) -> bool:
    """fn(y, exact, x, rot_dim) -> |y - exact| / (|x_a| + |x_b|) for every element, in fp64:
    (a, b) the rotate-half pair (j, j + rot_dim/2) an element of the first rot_dim features
    belongs to; a feature past rot_dim (passed through) measured against |x_j|."""
    return check_cases(
        "norm-wise error", "your norm-wise error", fn, _normwise_cases(), atol=1e-12,
        rtol=1e-9, bar=(debug.normwise_error, debug.diagnose),
        hint="per element: |y - exact| over |x_j| + |x_partner| in float64, the partner of "
             "feature j < rot_dim/2 being j + rot_dim/2 and back; past rot_dim, over |x_j|")


def solution_normwise_error(y, exact, x, rot_dim):
    ax = x.double().abs()
    rot = ax[..., :rot_dim]
    half = rot_dim // 2
    partner = torch.cat((rot[..., half:], rot[..., :half]), dim=-1)   # j <-> j + R/2
    denom = torch.cat((rot + partner, ax[..., rot_dim:]), dim=-1)     # pass-through: |x_j|
    return (y.double() - exact.double()).abs() / denom


# --- section 5: name the trap from the positions the output encodes --------------------------

# the traps whose wrong output still encodes a position (the other two leave a cloud)
TRAPS_WITH_A_CURVE = ("sbhd_row_indexing", "te_freqs_reshaped", "table_margin",
                      "inplace_double_rotation")


def _trap_cases() -> list:
    """(label, (x, y, layout), trap name or "none"): the wrong side of each trap, fp32; fresh
    copies on every call (an answer may write into its inputs). Then the five again, at a size
    and on tokens drawn when the check runs (`_drawn_trap_outputs`)."""
    return [(label, (x.clone(), y.clone(), layout), trap)
            for label, (x, y, layout), trap in _trap_outputs()] + _drawn_trap_outputs()


def _kept(compute):
    """compute() once, its result kept where no attribute reaches it: a call of the returned
    function is a Python call every time (a cached C wrapper's is not), which the check's watch
    of the answer sees and can refuse."""
    box = []

    def kept():
        if not box:
            box.append(compute())
        return box[0]
    return kept


def _trap_output(S: int, B: int, H: int, D: int, seed: int, trap: str) -> tuple:
    """(x, y, layout): the reproduction's tokens and the wrong side of `trap` ("none": the
    right RoPE), fp32 sbhd (the layout names no trap), tokens drawn from `seed`."""
    import dataclasses
    sc = debug.Scenario(seq_len=S, batch=B, heads=H, head_dim=D, dtype="fp32", seed=seed)
    causes = debug.FIXED if trap == "none" else dataclasses.replace(debug.FIXED, **{trap: True})
    r = debug.reproduce(sc, causes, device=runtime.default_device())
    wrong = r.tokens_te if trap == "inplace_double_rotation" else r.tokens_triton
    return r.x.clone(), wrong.clone(), r.layout


def _computed_trap_outputs() -> tuple:
    cases = []
    for S, B, H, D, seed in ((24, 3, 2, 16, 5), (40, 2, 1, 32, 6)):
        for trap in (*TRAPS_WITH_A_CURVE, "none"):
            cases.append((f"S={S} B={B} H={H} D={D}", _trap_output(S, B, H, D, seed, trap), trap))
    # the order of the cases says nothing: sorted by a hash of the output
    return tuple(sorted(cases, key=lambda c: float(c[1][1].double().abs().sum()) % 1.0))


def _drawn_trap_outputs() -> list:
    """The four traps and the right RoPE once more, on tokens, a size and an order drawn when
    the check runs (`fresh_generator`, its seed in the labels): names recorded beforehand for
    the fixed cases' outputs have none of these to look up. Every call draws anew."""
    seed, g = fresh_generator()
    S = int(torch.randint(12, 33, (), generator=g))     # small: the interpreter runs each row
    B = int(torch.randint(2, 4, (), generator=g))       # two batches at least: the row mix-up
    H = int(torch.randint(1, 3, (), generator=g))       # and the margin show from batch 1 on
    D = (16, 32)[int(torch.randint(0, 2, (), generator=g))]
    traps = (*TRAPS_WITH_A_CURVE, "none")
    tokens_seed = int(torch.randint(0, 2**31 - 1, (), generator=g))
    return [(f"S={S} B={B} H={H} D={D}, drawn with seed {seed}",
             _trap_output(S, B, H, D, tokens_seed, traps[i]), traps[i])
            for i in torch.randperm(len(traps), generator=g).tolist()]


_trap_outputs = _kept(_computed_trap_outputs)   # the check's cases and their answers


_CASE_LOOKUPS = (_trap_outputs, _computed_trap_outputs, _trap_cases, _drawn_trap_outputs,
                 _trap_output)   # looking the output up in the check's own cases is not reading


def _position_cases() -> list:
    """(label, (x, y, layout), the positions y encodes [S, B, H]): the trap cases, and the
    first two of them again in bshd (the same positions)."""
    cases = [(label, (x, y, layout), debug.recovered_positions(x, y, layout))
             for label, (x, y, layout), _ in _trap_cases()]
    for label, (x, y, _), pos in cases[:2]:
        cases.append((f"{label}, bshd", (x.transpose(0, 1).contiguous(),
                                         y.transpose(0, 1).contiguous(), "bshd"), pos.clone()))
    return cases


def check_recovered_positions(fn) -> bool:
    """fn(x, y, layout) -> the position each token's output encodes, [S, B, H] float64: the
    angle from the input pair to the output pair of the lowest frequency,
    atan2(x_a y_b - x_b y_a, x_a y_a + x_b y_b), divided by that frequency
    omega_min = 10000^(-(D-2)/D); (a, b) = (D/2 - 1, D - 1), rotate-half. x, y: fp32
    [S, B, H, D] in `layout` ("sbhd" or "bshd"; the answer is [S, B, H] either way)."""
    return check_cases(
        "recovered positions", "your recovered positions", fn, _position_cases(), atol=1e-6,
        rtol=1e-9, bar=(debug.recovered_positions, *_CASE_LOOKUPS),
        hint="in float64, per token: atan2(x_a*y_b - x_b*y_a, x_a*y_a + x_b*y_b) / omega_min, "
             "(a, b) = (D/2 - 1, D - 1), omega_min = 10000 ** (-(D - 2) / D); bshd: positions "
             "along dim 1, answer [S, B, H]")


def check_trap_name(fn) -> bool:
    """fn(pos) -> the name of the layout trap whose output encodes the positions pos
    [S, B, H] (float64, what `check_recovered_positions` computes): one of
    TRAPS_WITH_A_CURVE, or "none" for a right RoPE.

    Tried on each trap's output at two fixed sizes, then at a size and on tokens drawn when the
    check runs (the seed in the case's label), so only reading the curve names them all."""
    cases = [(label, (debug.recovered_positions(x, y, layout),), trap)
             for label, (x, y, layout), trap in _trap_cases()]
    return check_cases(
        "which trap", "your reading of the recovered positions", fn, cases,
        # running every trap and comparing is not reading, nor is looking up the check's cases
        bar=(debug.reproduce, *_CASE_LOOKUPS),
        hint=f"read pos [S, B, H] against the true positions s: one of "
             f"{', '.join(TRAPS_WITH_A_CURVE)}, or 'none'")


def solution_recovered_positions(x, y, layout):
    xs, ys = x.double(), y.double()
    if layout == "bshd":                                   # positions along dim 0, as sbhd
        xs, ys = xs.transpose(0, 1), ys.transpose(0, 1)
    D = xs.shape[-1]
    a, b = D // 2 - 1, D - 1                               # the pair of lowest frequency
    cross = xs[..., a] * ys[..., b] - xs[..., b] * ys[..., a]
    dot = xs[..., a] * ys[..., a] + xs[..., b] * ys[..., b]
    omega_min = 10000.0 ** (-(D - 2) / D)
    return torch.atan2(cross, dot) / omega_min             # [S, B, H]


def solution_trap_name(pos):
    S, B = pos.shape[:2]                                   # pos: [S, B, H], the recovered curve
    s = torch.arange(S, dtype=pos.dtype).view(-1, 1, 1)
    b = torch.arange(B, dtype=pos.dtype).view(1, -1, 1)

    def follows(curve):
        return bool(torch.allclose(pos, curve.expand_as(pos), atol=1e-2))

    if follows(s):
        return "none"
    if follows(2 * s):                                     # rotated twice: 2s
        return "inplace_double_rotation"
    if follows(torch.floor(s / 2)):                        # rows of cat(f, f) read as rows: s // 2
        return "te_freqs_reshaped"
    if follows((s * B + b) % S):                           # sbhd rows s*B + b read as bshd
        return "sbhd_row_indexing"
    if torch.allclose(pos[:, 0], s[:, 0].expand_as(pos[:, 0]), atol=1e-2):
        return "table_margin"                              # batch 0 right, later batches shifted
    raise ValueError("the positions follow no curve of the four traps, nor s: not a RoPE of "
                     "these inputs")

# --- section 6: the decision table as code ---------------------------------------------------

def _diag(n_differ, te_u, triton_u, te_ulp, triton_ulp) -> dict:
    """A diagnosis as `debug.diagnose` reports it, the keys the rules read and a few others,
    without its verdict."""
    return {"n_differ": int(n_differ), "te_max_normwise_u": float(te_u),
            "triton_max_normwise_u": float(triton_u), "te_max_ulp": float(te_ulp),
            "triton_max_ulp": float(triton_ulp), "allclose": n_differ == 0,
            "first_ten_equal": True, "max_abs_diff": 0.0 if n_differ == 0 else 2.0 ** -7}


def _classify_cases() -> list:
    """(label, (diag,), the row debug.classify names): fixed cases like the notebook's, the
    rules' boundaries, then twenty drawn when the check runs."""
    U = debug.LAYOUT_NORMWISE_U
    fixed = {
        "the fixed kernel, bit for bit": (0, 0.5, 0.5, 0.5, 0.5),
        "no element differs, large errors on both sides": (0, 40.0, 40.0, 30.0, 30.0),
        "sin/cos one ulp apart": (43, 0.6, 0.6, 0.9, 0.8),
        "a bf16 table and bf16 products on the Triton side": (1037, 0.5, 1.9, 0.5, 40.0),
        "a bf16 table on the TE side": (200, 2.5, 0.5, 24.0, 0.5),
        "a layout trap on the Triton side": (3900, 0.5, 500.0, 0.5, 1e4),
        "a layout trap on the TE side": (3900, 480.0, 0.5, 2e4, 0.5),
        f"norm-wise exactly {U:g} u": (10, U, 0.5, 20.0, 0.5),
        f"norm-wise just over {U:g} u": (10, 0.5, U * (1 + 2 ** -20), 0.5, 0.9),
        "ulp error exactly 1 on both sides": (5, 0.9, 0.9, 1.0, 1.0),
        "ulp error just over 1": (5, 0.9, 0.9, 1.0, 1.0 + 2 ** -20),
    }
    cases = [(label, (_diag(*v),), debug.classify(_diag(*v))) for label, v in fixed.items()]
    seed, g = fresh_generator()
    for i in range(20):
        r = torch.rand(5, generator=g, dtype=torch.float64)
        n = 0 if r[0] < 0.15 else int(1 + 1000 * r[0])
        nw = 10 ** (-1 + 3.5 * r[1:3])                 # 0.1 u to 300 u
        ulp = 10 ** (-0.7 + 2 * r[3:5])                # 0.2 to 20 ulp
        v = (n, float(nw[0]), float(nw[1]), float(ulp[0]), float(ulp[1]))
        cases.append((f"drawn case {i + 1} with seed {seed}", (_diag(*v),),
                      debug.classify(_diag(*v))))
    return cases


def check_classify(fn) -> bool:
    """fn(diag) -> "equal", "tolerance", "precision" or "layout": the row of debug.DECISIONS a
    diagnosis falls in, as section 6's table and rules say (diag: the keys debug.diagnose
    reports, n_differ, te_max_normwise_u, triton_max_normwise_u, te_max_ulp, triton_max_ulp and
    others, without its verdict)."""
    return check_cases(
        "the decision table", "your decision table", fn, _classify_cases(),
        bar=(debug.classify, debug.diagnose),
        hint=f"no element differs: 'equal'; else either side's norm-wise error beyond "
             f"{debug.LAYOUT_NORMWISE_U:g} u: 'layout'; else both sides within 1 ulp of fp64: "
             f"'tolerance'; else 'precision'")


def solution_classify(diag):
    if diag["n_differ"] == 0:                                       # nothing differs
        return "equal"
    worst_u = max(diag["te_max_normwise_u"], diag["triton_max_normwise_u"])
    if worst_u > debug.LAYOUT_NORMWISE_U:                           # a wrong value, not a rounding
        return "layout"
    if max(diag["te_max_ulp"], diag["triton_max_ulp"]) <= 1.0:      # both sides correct
        return "tolerance"
    return "precision"                                              # a side many ulps off


# the te-bits scenarios the check compares: fp32 first (cheap, every rounding visible), then the
# notebook's bf16 comparison at the GPU size
CASE_KEYS = ("nb_cpu_fp32", "nb_gpu")


@triton.jit
def _rope_combine_kernel(
    x_ptr,  # *x: input [S, B, H, D], sbhd, contiguous
    y_ptr,  # *y: output [S, B, H, D], fp32, contiguous (the caller rounds it to x's dtype)
    ang_ptr,  # *fp32: angles [S, D/2], read unless SINCOS == "table"
    cos_ptr, sin_ptr,  # *fp32: cos and sin [S, D/2], read when SINCOS == "table"
    n_rows,  # S * B * H: rows of D features
    rows_per_pos,  # B * H: the rows of one position (sbhd: row = (s*B + b)*H + h)
    HALF: tl.constexpr,  # D // 2, a power of two
    BLOCK_ROWS: tl.constexpr,  # rows per program
    SINCOS: tl.constexpr,  # "tl", "libdevice" or "fast" (GPU only): computed here; "table": read
    COMBINE: tl.constexpr,  # @triton.jit (x1, x2, c, s) -> (y1, y2): the line y = x c + rot s
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]   # [BLOCK_ROWS, 1]
    j = tl.arange(0, HALF)[None, :]                                            # [1, HALF]
    m = row < n_rows
    pos = row // rows_per_pos
    x1 = tl.load(x_ptr + row * 2 * HALF + j, mask=m).to(tl.float32)
    x2 = tl.load(x_ptr + row * 2 * HALF + HALF + j, mask=m).to(tl.float32)
    if SINCOS == "table":                           # where cos and sin come from
        c = tl.load(cos_ptr + pos * HALF + j, mask=m)
        s = tl.load(sin_ptr + pos * HALF + j, mask=m)
    else:
        theta = tl.load(ang_ptr + pos * HALF + j, mask=m)
        if SINCOS == "tl":
            c = tl.cos(theta)
            s = tl.sin(theta)
        elif SINCOS == "libdevice":                 # CUDA's precise cosf / sinf
            c = libdevice.cos(theta)
            s = libdevice.sin(theta)
        else:                                       # "fast": the cos.approx / sin.approx units
            c = libdevice.fast_cosf(theta)
            s = libdevice.fast_sinf(theta)
    y1, y2 = COMBINE(x1, x2, c, s)
    tl.store(y_ptr + row * 2 * HALF + j, y1, mask=m)
    tl.store(y_ptr + row * 2 * HALF + HALF + j, y2, mask=m)


def launch(kernel, combine, x: torch.Tensor, angles: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor, sincos: str = "table", block_rows: int = 64,
           **options) -> torch.Tensor:
    """Launch `kernel` (`_rope_combine_kernel`'s signature) with COMBINE=combine on x [S, B, H, D]
    (sbhd, contiguous); angles, cos, sin [S, D/2] fp32 on x's device. Returns y in fp32, NaN
    where the kernel wrote nothing; `options` go to the launch (enable_fp_fusion=False)."""
    S, B, H, D = x.shape
    y = torch.full(x.shape, float("nan"), dtype=torch.float32, device=x.device)
    kernel[(triton.cdiv(S * B * H, block_rows),)](
        x, y, angles, cos, sin, S * B * H, B * H,
        HALF=D // 2, BLOCK_ROWS=block_rows, SINCOS=sincos, COMBINE=combine, **options)
    return y


@functools.lru_cache(maxsize=1)
def te_cases() -> Optional[tuple]:
    """The te-bits cases of CASE_KEYS from the committed file (None when there is none)."""
    path = debug.te_bits_file()
    if path is None:
        return None
    data = debug.load_te_bits(path)
    return tuple(debug.te_bits_case(data, key) for key in CASE_KEYS)


def _label(case) -> str:
    S, B, H, D = case.x.shape
    return f"{str(case.x.dtype).replace('torch.', '')}, S={S} B={B} H={H} D={D}"


def _answer(name: str, fn) -> bool:
    """Print ❌ and return False unless fn is a @triton.jit function with a body."""
    if fn is None or fn is Ellipsis or (is_kernel(fn) and is_blank_kernel(fn)):
        print(f"❌ {name}: no answer yet (write the two lines of the @triton.jit function)")
        return False
    if not is_kernel(fn):
        called = f"{type(fn).__name__} {getattr(fn, '__name__', '')!s}".rstrip()
        print(f"❌ {name}: expected a @triton.jit function (the kernel calls it as COMBINE), "
              f"got {called}")
        return False
    return True


def check_te_combine(fn) -> bool:
    """Launch the section's kernel with the learner's combine on CASE_KEYS' cases and count the
    elements whose bits differ from TE's stored output; then on fp32 x drawn when the check runs,
    against TE's rounding worked out here (see the module's docstring).

    Args:
        fn: a @triton.jit function (x1, x2, c, s) -> (y1, y2), fp32 tiles of one shape.
    Returns:
        True when no element differs from TE's in any case. Prints one line per case; never
        raises.
    """
    name = "combine with TE's bits"
    if not _answer(name, fn):
        return False
    try:
        cases = te_cases()
    except Exception as exc:  # noqa: BLE001 -- report, never stop the notebook
        print(f"❌ {name}: could not read TE's stored outputs: {exception_line(exc)}")
        return False
    if cases is None:
        print(f"❌ {name}: benchmarks/results/te-bits-<gpu>.pt is missing: TE's outputs to "
              "compare with come from there")
        return False
    device = runtime.default_device()
    interpreted = not runtime.on_gpu()
    counts, wrong_values = [], False
    compared = [(_label(c), c.x, c.angles, c.te_cos, c.te_sin, c.te, "TE's output")
                for c in cases]
    compared.append(_drawn_te_case(next(c for c in cases if c.x.dtype == torch.float32)))
    for label, x, angles, te_cos, te_sin, te, whose in compared:
        args = [t.to(device) for t in (x, angles, te_cos, te_sin)]
        ok, y = launch_barred(
            name, label, "your combine",
            lambda: launch(_rope_combine_kernel, fn, *args, sincos="table",
                           enable_fp_fusion=False),
            bar=(debug._fused_pair,))      # the reproduction kernel's fma line
        if not ok:
            return False
        y = y.to(x.dtype).cpu()
        differ = debug.bits_differ(y, te)
        n = int(differ.sum())
        counts.append(n)
        # more than roundings: off by a sizeable part of the inputs' scale (or NaN)
        off = (y.double() - te.double()).abs().nan_to_num(float("inf")).max()
        wrong_values |= bool(off > 0.05 * x.double().abs().max())
        if n:
            steps = debug.steps_apart(y, te)[differ]
            values, times = torch.unique(steps, return_counts=True)
            hist = dict(zip(values.tolist(), times.tolist()))
            print(f"❌ {name} ({label}): {n:,} of {y.numel():,} elements differ from {whose}; "
                  f"{str(x.dtype).replace('torch.', '')} steps apart -> count: "
                  f"{dict(list(hist.items())[:6])}" + (" ..." if len(hist) > 6 else ""))
        elif whose == "TE's output":
            print(f"   {label}: 0 of {y.numel():,} elements differ from {whose}")
        else:
            print(f"   {label}: every one of its {y.numel():,} elements has {whose}")
    where = ("in Triton's interpreter" if interpreted
             else "compiled without contraction (enable_fp_fusion=False)")
    if wrong_values:
        print("   hint: these are not rounding differences, the values are wrong: y1 = x1*c - "
              "x2*s and y2 = x2*c + x1*s (rot = -x2 in the first half, x1 in the second)")
        return False
    if any(counts):
        print("   hint: the values are right, their roundings are not TE's. tl.fma(a, b, d) "
              "computes a*b + d with one rounding: which product enters TE's compiled line "
              "exact?")
        return False
    print(f"✅ {name}: bit for bit with TE's output in both cases, and with TE's rounding on "
          f"inputs drawn now ({where})")
    return True


def _fma32(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """fma(a, b, d) in fp32, exact: a*b + d rounded once to fp32 (round to nearest, ties to
    even). a*b is exact in fp64 (two 24-bit significands); the fp64 sum s and its error e
    (Knuth's two-sum, exact) give the fp32 rounding of s + e: that of s, except where s lies
    exactly halfway between two fp32 values and e tips it to one side."""
    ab = a.double() * b.double()
    dd = d.double()
    total = ab + dd
    bb = total - ab
    err = (ab - (total - bb)) + (dd - bb)
    r = total.float()
    toward = torch.where(total > r.double(), float("inf"), float("-inf")).float()
    other = torch.nextafter(r, toward)
    tie = (r.double() != total) & ((r.double() + other.double()) / 2 == total)
    toward_other = (err != 0) & ((err > 0) == (other > r))
    return torch.where(tie & (err != 0), torch.where(toward_other, other, r), r)


def _te_rounding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """TE's fused RoPE on fp32 x [S, B, H, D] (sbhd) with TE's cos and sin [S, D/2], rounded as
    TE's compiled line rounds it, fma(x, c, rot * s): rot * s rounded once, x * c exact in the
    sum. The stored cases pin this line down (every element of both, bit for bit)."""
    half = x.shape[-1] // 2
    c, s = cos[:, None, None, :], sin[:, None, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((_fma32(x1, c, -x2 * s), _fma32(x2, c, x1 * s)), dim=-1)


def _drawn_te_case(case) -> tuple:
    """(label, x, angles, cos, sin, expected, whose): fp32 x drawn when the check runs
    (`fresh_generator`, its seed in the label) on the positions, angles and TE's cos and sin of
    `case` (the fp32 case), compared with TE's rounding worked out here (`_te_rounding`). TE's
    stored outputs exist for the stored inputs only, which a table of outputs recorded
    beforehand could match: no such table has this x."""
    seed, g = fresh_generator()
    S, _, _, D = case.x.shape
    B, H = (int(torch.randint(1, 3, (), generator=g)) for _ in range(2))
    x = torch.randn(S, B, H, D, generator=g, dtype=torch.float32)
    cos, sin = case.te_cos.float(), case.te_sin.float()
    return (f"float32, S={S} B={B} H={H} D={D}, x drawn with seed {seed}", x, case.angles,
            cos, sin, _te_rounding(x, cos, sin), "TE's rounding")


@triton.jit
def solution_te_combine(x1, x2, c, s):
    # TE's contraction, fma(x, c, rot*s): x*c enters the sum exact, rot*s is rounded once
    y1 = tl.fma(x1, c, -(x2 * s))
    y2 = tl.fma(x2, c, x1 * s)
    return y1, y2
