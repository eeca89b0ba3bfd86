"""Notebook 13's capstone, puzzle 12: the backward of interleaved partial RoPE on packed
sequences. Its check passes a right kernel written another way than the worked solution, fails
each half-right kernel a learner is likely to write (and `pz.hint(12)` names the mistake), fails
a hard-coded answer, and fails ropelib's teaching kernel for the backward handed in.
tests/test_puzzles.py and tests/test_nb13_library_answers.py run the rest over every puzzle:
the worked solution passes when typed in and fails when handed in, the notebook's empty kernel
fails, and a kernel that calls ropelib's helpers or finished functions fails."""
import itertools

import pytest
import torch

from ropelib.course import puzzles as pz
from loading import written_module

P = pz.PUZZLES["packed_partial_backward"]
_count = itertools.count()

HEADER = '''import triton
import triton.language as tl


@triton.jit
def kernel(dy_ptr, cu_seqlens_ptr, cos_ptr, sin_ptr, dx_ptr, D: tl.constexpr, R: tl.constexpr,
           BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
'''

# a right answer with one load per feature and a second load of its partner (d ^ 1); the
# variants below change one line of it (POS, END, SIGN, PARTNER, COL, TAIL)
PARTNER_LOADS = '''
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    tok = (t < end - start)[:, None]                                   # END
    live = tok & (d < D)[None, :]
    turned = live & (d < R)[None, :]
    row = (start + t)[:, None] * D
    pos = t                                                            # POS
    g = tl.load(dy_ptr + row + d[None, :], mask=live, other=0.0)
    g_partner = tl.load(dy_ptr + row + (d ^ 1)[None, :], mask=turned, other=0.0)   # PARTNER
    tab = pos[:, None] * (R // 2) + (d // 2)[None, :]                  # COL
    c = tl.load(cos_ptr + tab, mask=turned, other=1.0)
    s = tl.load(sin_ptr + tab, mask=turned, other=0.0)
    sign = tl.where(d % 2 == 0, 1.0, -1.0)[None, :]                    # SIGN
    dx = g * c + sign * g_partner * s
    tl.store(dx_ptr + row + d[None, :], dx, mask=live)                 # TAIL
'''


def _kernel(body: str, tmp_path):
    name = f"nb13_capstone_{next(_count)}"
    return written_module(name, tmp_path / f"{name}.py", HEADER + body).kernel


def _variant(changes) -> str:
    """PARTNER_LOADS with the line of each (marker, line) of `changes` replaced."""
    lines = PARTNER_LOADS.splitlines()
    for marker, line in changes:
        i = next(k for k, ln in enumerate(lines) if ln.rstrip().endswith(f"# {marker}"))
        lines[i] = "    " + line
    return "\n".join(lines) + "\n"


def test_a_right_kernel_with_partner_loads_passes(tmp_path, capsys):
    kernel = _kernel(PARTNER_LOADS, tmp_path)
    for seed in (0, 1):
        assert pz.check_packed_partial_backward(kernel, seed=seed, draw=False) is True
        out = capsys.readouterr().out
        assert "✅ puzzle 12 " in out and "❌" not in out, out


MISTAKES = {   # name: (the lines changed, words of the ❌ line, words of the hint or None)
    "the forward's sign": ([("SIGN", "sign = tl.where(d % 2 == 0, -1.0, 1.0)[None, :]")],
                           "elements differ", "this is the forward"),
    "rotate-half pairs": (
        [("PARTNER", "g_partner = tl.load(dy_ptr + row + ((d + R // 2) % R)[None, :], "
                     "mask=turned, other=0.0)"),
         ("COL", "tab = pos[:, None] * (R // 2) + (d % (R // 2))[None, :]"),
         ("SIGN", "sign = tl.where(d < R // 2, 1.0, -1.0)[None, :]")],
        "elements differ", "pairs feature j with j + R/2"),
    "the table's column": ([("COL", "tab = pos[:, None] * (R // 2) + (d % (R // 2))[None, :]")],
                           "elements differ", None),
    "the packed index as position": ([("POS", "pos = start + t")], "elements differ",
                                     "its index in the packed dL/dy"),
    "the tail never written": ([("TAIL", "tl.store(dx_ptr + row + d[None, :], dx, "
                                         "mask=turned)")], "were never written", None),
    "cu_seqlens[i + 1] as the last row": ([("END", "tok = (t <= end - start)[:, None]")],
                                          "no element of any output", None),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_a_half_right_kernel_fails_and_the_hint_names_it(name, tmp_path, capsys):
    changes, says, hint = MISTAKES[name]
    kernel = _kernel(_variant(changes), tmp_path)
    assert pz.check_packed_partial_backward(kernel, seed=3, draw=False) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ puzzle 12 ") and says in out, out
    pz.hint(12)
    told = capsys.readouterr().out
    if hint is not None:
        assert hint in told and hint not in out, (out, told)


def test_the_tail_left_at_zero_is_named(tmp_path, capsys):
    body = PARTNER_LOADS.replace("dx = g * c + sign * g_partner * s",
                                 "dx = tl.where((d < R)[None, :], g * c + sign * g_partner * s, "
                                 "0.0)")
    kernel = _kernel(body, tmp_path)
    assert pz.check_packed_partial_backward(kernel, seed=3, draw=False) is False
    out = capsys.readouterr().out
    pz.hint(12)
    assert "their gradient is dL/dy itself" in capsys.readouterr().out, out


def _hard_coded(seed: int, tmp_path):
    """A kernel that stores, element by element, the spec's answer for the cases of `seed`
    (told apart by their head dims), from program (0, 0) only: a hard-coded answer."""
    cases = P.build(torch.Generator().manual_seed(seed), "cpu")
    assert len({c.constexprs["D"] for c in cases}) == len(cases)
    lines = ["    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)"]
    for case in cases:
        lines.append(f"    if D == {case.constexprs['D']}:")
        for k, v in enumerate(case.expected.flatten().tolist()):
            lines.append(f"        tl.store(dx_ptr + {k}, {v!r}, mask=first)")
    return _kernel("\n".join(lines) + "\n", tmp_path)


def test_a_hard_coded_answer_fails_on_other_inputs(tmp_path, capsys):
    kernel = _hard_coded(0, tmp_path)
    assert pz.check_packed_partial_backward(kernel, seed=0, draw=False) is True   # its inputs
    capsys.readouterr()
    assert pz.check_packed_partial_backward(kernel, seed=1, draw=False) is False
    assert "❌ puzzle 12 " in capsys.readouterr().out
    assert pz.check_packed_partial_backward(kernel, draw=False) is False          # a fresh seed
    assert "❌ puzzle 12 " in capsys.readouterr().out


def test_ropelibs_teaching_backward_kernel_handed_in_fails(capsys):
    from ropelib.course.exercises.backward_kernel import _rope_backward_solution_kernel
    assert pz.check_packed_partial_backward(_rope_backward_solution_kernel, seed=0,
                                            draw=False) is False
    out = capsys.readouterr().out
    assert "❌ puzzle 12 " in out and "ropelib's _rope_backward_solution_kernel" in out, out


def test_the_spec_is_the_autograd_of_the_forward_it_states():
    """Independent of the spec's own autograd: dL/dx . v = dL/dy . J v for a random v, with
    the forward written out pair by pair."""
    case = P.build(torch.Generator().manual_seed(0), "cpu")[0]
    dy, cu, cos, sin = (case.inputs[n] for n in ("dy", "cu_seqlens", "cos", "sin"))
    R, D = case.constexprs["R"], case.constexprs["D"]
    v = torch.randn(dy.shape, dtype=torch.float64)
    jv = v.clone()
    for i in range(len(cu) - 1):
        for r in range(int(cu[i]), int(cu[i + 1])):
            p = r - int(cu[i])
            for j in range(R // 2):
                c, s = float(cos[p, j]), float(sin[p, j])
                a, b = float(v[r, 2 * j]), float(v[r, 2 * j + 1])
                jv[r, 2 * j], jv[r, 2 * j + 1] = a * c - b * s, b * c + a * s
    assert D > R
    dx = pz.spec_packed_partial_backward(dy.double(), cu, cos, sin, R)
    assert torch.allclose((dx * v).sum(), (dy.double() * jv).sum(), rtol=1e-12)


def test_the_worked_solution_compiles_for_sm_90_at_the_timed_case():
    """On a GPU the ⏱ line launches the compiled solution on the timed case (ChatGLM's head on
    puzzle 10's sequences): it compiles for sm_90, with whole-sector vector loads and stores."""
    from ropelib.course import load_schedule
    big = P.big("meta")
    assert (big.constexprs["D"], big.constexprs["R"]) == (128, 64)
    args = {name: torch.empty(16, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
            for name, v in zip(P.solution.arg_names, big.args)}
    code = load_schedule.schedule(P.solution, dict(args, **big.constexprs), num_warps=4)
    assert 16 in load_schedule.load_widths(code)                 # 16-byte loads of dL/dy
    assert set(load_schedule.store_widths(code)) == {16}         # and only 16-byte stores
