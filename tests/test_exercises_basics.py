"""ropelib.course.exercises (check, solution) and the notebook 00-02 checks in exercises.basics.

Each check must accept a learner's own copy of its worked solution, reject answers that call
ropelib's (or the worked solution itself), wrong answers and unanswered placeholders, and never
raise.
"""
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import ropelib
from ropelib import frequencies, reference
from ropelib.course import puzzles
from ropelib.course.exercises import basics, call_answer, check, solution
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it


# --- check() ---------------------------------------------------------------------------------

@pytest.mark.parametrize("answer,expected,kw", [
    (torch.ones(3), torch.ones(3), {}),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]), {}),
    ([0, 1, 2], torch.arange(3), {}),
    (0.5, 0.5 + 1e-9, {}),
    (48.0, 48, {}),
    (True, True, {}),
    (" SBHD", "sbhd", {}),
    ((1, torch.zeros(2)), (1, torch.zeros(2)), {}),
    ({"a": 1.0}, {"a": 1.0}, {}),
    (torch.ones(2, dtype=torch.bfloat16), torch.full((2,), 1.004, dtype=torch.float64), {}),
    (1.1, 1.0, {"atol": 0.2}),
])
def test_check_accepts(answer, expected, kw, capsys):
    assert check("x", answer, expected, **kw) is True
    assert capsys.readouterr().out.startswith("✅ x: correct")


@pytest.mark.parametrize("answer,expected,words", [
    (..., torch.ones(3), "no answer yet"),
    (None, 3, "no answer yet"),
    (torch.ones(4), torch.ones(3), "shape (4,), expected (3,)"),
    (torch.ones(3) + 1e-3, torch.ones(3), "3 of 3 entries differ"),
    (torch.tensor([0, 1, 3]), torch.tensor([0, 1, 2]), "first at index (2,)"),
    (torch.tensor([0.5, 1.0]), torch.tensor([0, 1]), "integer values"),
    (torch.tensor([float("nan")]), torch.tensor([1.0]), "NaN"),
    (1, True, "True or False"),
    (True, 1, "expected a number"),
    (0.6, 0.5, "got 0.6, expected 0.5"),
    ("bshd", "sbhd", "got 'bshd'"),
    ([1, 2], [1, 2, 3], "2 items, expected 3"),
    ((1, 2.5), (1, 2.0), "item [1]"),
    (object(), torch.ones(2), "expected a tensor"),
])
def test_check_rejects_with_a_reason(answer, expected, words, capsys):
    assert check("x", answer, expected, hint="look again") is False
    out = capsys.readouterr().out
    assert out.startswith("❌ x:") and words in out
    # the hint helps with a wrong answer; an unanswered exercise is not given it
    assert ("hint: look again" in out) != ("no answer yet" in out)


def test_check_never_raises(capsys):
    class Weird:
        def __eq__(self, other):
            raise RuntimeError("boom")
    assert check("weird", Weird(), Weird()) is False
    assert "could not compare" in capsys.readouterr().out


def test_call_answer_reports_instead_of_raising(capsys):
    assert call_answer("f", lambda: 1 / 0) == (False, None)
    assert "ZeroDivisionError" in capsys.readouterr().out
    assert call_answer("f", lambda: None) == (False, None)
    assert call_answer("f", ...) == (False, None)
    assert call_answer("f", 3) == (False, None)
    assert call_answer("f", lambda a: a + 1, 1) == (True, 2)


def test_solution_prints_outside_jupyter(capsys):
    solution("""
        x = 1
        y = x + 1
    """, title="Answer")
    out = capsys.readouterr().out
    assert "Answer" in out and "x = 1\ny = x + 1" in out
    solution(basics.solution_relative_score)
    assert "def solution_relative_score" in capsys.readouterr().out
    with pytest.raises(TypeError, match="text_or_code"):
        solution(3)


def test_solution_renders_details_in_jupyter(monkeypatch):
    import ropelib.course.exercises as ex
    shown = []
    monkeypatch.setattr(ex, "_in_jupyter", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    solution("a < b", title="S")
    html = shown[0].data
    assert html.startswith("<details>") and "a &lt; b" in html and "<summary><b>S</b>" in html


# --- notebook 00 -----------------------------------------------------------------------------

def test_check_device(capsys):
    assert basics.check_device(lambda gpu, interpret: "cuda" if gpu and not interpret else "cpu")
    assert f"this machine: {ropelib.default_device()}" in capsys.readouterr().out
    assert not basics.check_device(lambda gpu, interpret: "cuda" if gpu else "cpu")
    assert "interpret=True" in capsys.readouterr().out           # the case it gets wrong
    assert not basics.check_device(lambda gpu, interpret: ropelib.default_device())
    assert "ropelib" in capsys.readouterr().out                  # barred: the rule is the answer
    assert not basics.check_device(lambda gpu, interpret: "tpu")
    assert not basics.check_device(...)


def _rotate_neighbours(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _rope_with(table, pair):
    """x * cos + pair(x) * sin, the table broadcast as `table` puts it: wrong answers below."""
    def answer(x, freqs):
        f = table(freqs)
        return x.float() * f.cos() + pair(x.float()) * f.sin()
    return answer


def _bshd(freqs):
    return freqs.transpose(0, 1)                        # [S, 1, 1, D] -> [1, S, 1, D]


def _halves(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_check_interleaved_rope(capsys):
    own = learner_copy(basics.solution_interleaved_rope)
    assert basics.check_interleaved_rope(own)
    assert basics.check_interleaved_rope(_rope_with(_bshd, _rotate_neighbours))  # fp32 out: fine
    capsys.readouterr()
    wrong = {
        "rotate-half pairing": _rope_with(_bshd, _halves),
        "table left in sbhd order": _rope_with(lambda f: f, _rotate_neighbours),
        "rotated by -theta": _rope_with(lambda f: -_bshd(f), _rotate_neighbours),
        "positions from 0, not the table's": _rope_with(
            lambda f: _bshd(f) - _bshd(f)[:, :1], _rotate_neighbours),
        "unrotated": lambda x, freqs: x,
        "not written yet": lambda x, freqs: ...,
    }
    for label, answer in wrong.items():
        assert not basics.check_interleaved_rope(answer), label
        out = capsys.readouterr().out
        assert out.startswith("❌ interleaved RoPE of a bshd tensor (x ["), (label, out)
    # right on the tables that start at position 0: the one that starts at 3 tells
    assert not basics.check_interleaved_rope(wrong["positions from 0, not the table's"])
    assert "(x [1, 5, 3, 8] float32, offset=3)" in capsys.readouterr().out
    assert not basics.check_interleaved_rope(torch.zeros(2, 6, 4, 16))   # a tensor, not a function
    assert "expected a function" in capsys.readouterr().out


def test_check_interleaved_rope_refuses_library_answers(capsys):
    library = {
        "ropelib.apply_rope": (
            lambda x, f: ropelib.apply_rope(x, f, layout="bshd", interleaved=True),
            "ropelib's apply_rope (ropelib/api.py)"),
        "ropelib.reference": (
            lambda x, f: reference.rope_reference(x, f, layout="bshd", interleaved=True),
            "ropelib's rope_reference (ropelib/reference.py)"),
        "ropelib's rotate_half": (_rope_with(_bshd, lambda x: reference.rotate_half(x, True)),
                                  "ropelib's rotate_half (ropelib/reference.py)"),
        "notebook 01's worked rotate_half": (
            _rope_with(_bshd, lambda x: basics.solution_rotate_half(x, True)),
            "ropelib's solution_rotate_half"),
        "the worked solution": (basics.solution_interleaved_rope,
                                "ropelib's solution_interleaved_rope"),
        "notebook 13's interleaved spec": (
            lambda x, f: puzzles.spec_interleaved(
                x.float(), _bshd(f)[..., 0::2].expand(*x.shape[:-1], -1)).to(x.dtype),
            "ropelib's spec_interleaved (ropelib/course/puzzles.py)"),
    }
    for label, (answer, words) in library.items():
        assert not basics.check_interleaved_rope(answer), label
        out = capsys.readouterr().out
        assert "this exercise wants your own RoPE, but the answer called" in out, (label, out)
        assert words in out, (label, out)


def test_notebook_00_roadmap_lists_every_notebook_by_its_title():
    # each notebook, linked, under the title its first heading gives it; nothing else
    roadmap = (ROOT / "notebooks" / "00-setup-and-tour.py").read_text(encoding="utf-8")
    roadmap = roadmap[re.search(r"^# ## \d+\. Where to go next$", roadmap, re.M).start():
                      roadmap.index("## Exercises")]
    listed = re.findall(r"^# - \[(\d\d) — ([^]]+)\]\((\d\d-[a-z0-9-]+)\.ipynb\)", roadmap, re.M)
    want = []
    for py in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.py")):
        heading = next(line for line in py.read_text(encoding="utf-8").splitlines()
                       if line.startswith("# # "))
        number, title = re.match(r"# # (\d\d) — (.+)$", heading).groups()
        assert py.stem.startswith(number)
        want.append((number, title, py.stem))
    assert listed == want


# --- notebook 01 -----------------------------------------------------------------------------

def _block_diag_answer(m, inv_freq):
    """Right values, built with torch.block_diag, which exercise 1 rules out."""
    a = m * inv_freq
    return torch.block_diag(*[torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
                              for c, s in zip(a.cos(), a.sin())])


def _reference_answer(m, inv_freq):
    """Right values, read off ropelib.reference (the notebook's own R_from_reference)."""
    ang = (m * inv_freq).repeat_interleave(2)
    eye = torch.eye(ang.numel(), dtype=torch.float64)
    return reference.apply_rope_ref(eye, ang.cos(), ang.sin(), interleaved=True).T


def test_check_rotation_matrix(capsys):
    own = learner_copy(basics.solution_rotation_matrix)
    assert basics.check_rotation_matrix(own)
    # transposed (rotating the wrong way), and the rotate-half layout, are wrong
    assert not basics.check_rotation_matrix(lambda m, inv: own(m, inv).T)
    assert not basics.check_rotation_matrix(lambda m, inv: torch.eye(2 * inv.numel()))
    assert not basics.check_rotation_matrix(lambda m, inv: ...)           # body not written yet
    assert not basics.check_rotation_matrix(lambda m, inv: 1 / 0)
    capsys.readouterr()


def _blocks(m, inv_freq):
    a = m * inv_freq
    return [torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
            for c, s in zip(a.cos(), a.sin())]


def _aten_block_diag_answer(m, inv_freq):
    """Right values from the ATen operator behind torch.block_diag, reached by its op name."""
    return torch.ops.aten.block_diag(_blocks(m, inv_freq))


def _variable_functions_block_diag_answer(m, inv_freq):
    """Right values from the same operator, reached through torch._C."""
    return torch._C._VariableFunctions.block_diag(_blocks(m, inv_freq))


def _swallowed_block_diag_answer(m, inv_freq):
    """Calls the barred operator, catches the refusal, then answers with its own code."""
    try:
        torch.ops.aten.block_diag(_blocks(m, inv_freq))
    except Exception:  # noqa: BLE001 -- the point of the test
        pass
    return _own_rotation_matrix(m, inv_freq)


def _puzzle_spec_answer(m, inv_freq):
    """Right values from notebook 13's spec of the interleaved RoPE, applied to the identity."""
    from ropelib.course import puzzles
    R = 2 * inv_freq.numel()
    return puzzles.spec_interleaved(torch.eye(R, dtype=torch.float64),
                                    (m * inv_freq).expand(R, -1)).T


def _own_rotation_matrix(m, inv_freq):
    """A learner's own R_m, written here (no library, no block_diag)."""
    R = 2 * inv_freq.numel()
    M = torch.zeros(R, R, dtype=torch.float64)
    a = m * inv_freq
    M[0::2, 0::2] = torch.diag(a.cos())
    M[0::2, 1::2] = torch.diag(-a.sin())
    M[1::2, 0::2] = torch.diag(a.sin())
    M[1::2, 1::2] = torch.diag(a.cos())
    return M


def _hf_rotate_matrix(m, inv):
    """R_m read off the benchmarks' Hugging Face formula, applied to the identity."""
    from ropelib.bench import compare
    ang = (m * inv).repeat_interleave(2)
    return compare.hf_rotate(torch.eye(ang.numel(), dtype=inv.dtype), ang.cos(), ang.sin(),
                             True).T


@pytest.mark.parametrize("answer, words", [
    (_block_diag_answer, "block_diag (torch/functional.py)"),
    (_aten_block_diag_answer, "PyTorch's operator aten::block_diag"),
    (_variable_functions_block_diag_answer, "PyTorch's operator aten::block_diag"),
    (_swallowed_block_diag_answer, "PyTorch's operator aten::block_diag"),
    (_puzzle_spec_answer, "ropelib's spec_interleaved (ropelib/course/puzzles.py)"),
    (_hf_rotate_matrix, "ropelib's hf_rotate (ropelib/bench/compare.py)"),
    (_reference_answer, "ropelib's apply_rope_ref (ropelib/reference.py)"),
    (basics.rotation_matrix_ref, "ropelib's rotation_matrix_ref"),
    (basics.solution_rotation_matrix, "ropelib's solution_rotation_matrix"),
], ids=["torch.block_diag", "torch.ops.aten.block_diag", "torch._C._VariableFunctions.block_diag",
        "block_diag refused and caught", "notebook 13's spec", "benchmarks' formula", "reference",
        "the check's own matrix", "the worked solution"])
def test_check_rotation_matrix_refuses_library_answers(answer, words, capsys):
    for rot_dim, base in basics.SIZES_AND_BASES:
        inv = frequencies.inv_freq(rot_dim, base, dtype=torch.float64)
        torch.testing.assert_close(answer(5, inv), basics.rotation_matrix_ref(5, inv))  # right
    assert basics.check_rotation_matrix(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ rotation matrix R_m (R=8, base=10000, m=0): this exercise wants "
                          "your rotation matrix"), out
    assert words in out, out


def _scipy_like_block_diag(*blocks):
    """Stands in for scipy.linalg.block_diag (a Python function placing the blocks)."""
    size = sum(b.shape[0] for b in blocks)
    out = torch.zeros(size, size, dtype=blocks[0].dtype)
    at = 0
    for b in blocks:
        out[at:at + b.shape[0], at:at + b.shape[1]] = b
        at += b.shape[0]
    return out


def test_check_rotation_matrix_refuses_scipy_block_diag(monkeypatch, capsys):
    # SciPy may not be installed: a module in its place, with a block_diag of its own
    import types
    scipy = types.ModuleType("scipy")
    scipy.linalg = types.ModuleType("scipy.linalg")
    scipy.linalg.block_diag = _scipy_like_block_diag
    monkeypatch.setitem(sys.modules, "scipy", scipy)
    monkeypatch.setitem(sys.modules, "scipy.linalg", scipy.linalg)
    assert basics.other_block_diags() == (_scipy_like_block_diag,)

    def answer(m, inv_freq):
        return _scipy_like_block_diag(*_blocks(m, inv_freq))

    torch.testing.assert_close(answer(5, _NOTEBOOK_INV),
                               basics.rotation_matrix_ref(5, _NOTEBOOK_INV))
    assert basics.check_rotation_matrix(answer) is False
    out = capsys.readouterr().out
    assert "this exercise wants your rotation matrix" in out, out
    assert "_scipy_like_block_diag" in out, out
    assert basics.check_rotation_matrix(_own_rotation_matrix)   # blocks placed by the answer
    capsys.readouterr()


def test_other_block_diags_without_scipy(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)          # import scipy raises ImportError
    assert basics.other_block_diags() == ()


def test_check_rotation_matrix_accepts_own_code_every_time(capsys):
    """The positions are drawn anew on each call: a right answer passes every draw."""
    own = learner_copy(basics.solution_rotation_matrix)
    for _ in range(5):
        assert basics.check_rotation_matrix(own)
        assert basics.check_rotation_matrix(_own_rotation_matrix)
    out = capsys.readouterr().out
    assert out.count("✅ rotation matrix R_m: correct") == 10, out


_NOTEBOOK_INV = frequencies.inv_freq(8, dtype=torch.float64)    # the notebook's d = 8, base 10^4


def _base_10000(rot_dim):
    """theta_j = 10000^(-2j/R), the notebook's base whatever the check asks for."""
    return 10000.0 ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)


def test_check_rotation_matrix_refuses_an_answer_that_ignores_inv_freq(capsys):
    # right for the notebook's own inv, whatever inv_freq the check passes
    assert basics.check_rotation_matrix(
        lambda m, inv_freq: _own_rotation_matrix(m, _NOTEBOOK_INV)) is False
    assert "❌ rotation matrix R_m (R=4, base=10000, m=0): shape (8, 8), expected (4, 4)" \
        in capsys.readouterr().out
    # the right size, but the notebook's base: wrong at base 500000
    assert basics.check_rotation_matrix(
        lambda m, inv_freq: _own_rotation_matrix(m, _base_10000(2 * inv_freq.numel()))) is False
    assert "❌ rotation matrix R_m (R=16, base=500000, m=" in capsys.readouterr().out


def test_check_rotation_matrix_refuses_cached_matrices(capsys):
    # the matrices of fixed positions, read off the reference beforehand (as the notebook's
    # R_from_reference would give them), for every size and base the check tries
    cache = {}
    for rot_dim, base in basics.SIZES_AND_BASES:
        inv = frequencies.inv_freq(rot_dim, base, dtype=torch.float64)
        for m in (0, 1, 5, 37):
            cache[m, rot_dim] = _reference_answer(m, inv)

    def cached(m, inv_freq):
        key = (m, 2 * inv_freq.numel())
        return cache[key] if key in cache else torch.eye(key[1], dtype=torch.float64)

    assert cached(5, _NOTEBOOK_INV) is cache[5, 8]
    assert basics.check_rotation_matrix(cached) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ rotation matrix R_m (R=8, base=10000, m="), out
    assert "(R=8, base=10000, m=0)" not in out          # m = 0 passed; a drawn position did not


def test_course_rope_helpers_are_functions_of_the_course():
    from ropelib.course import puzzles
    from ropelib.course.exercises import own_code
    helpers = own_code.course_rope_helpers()
    names = {h.__name__ for h in helpers}
    specs = {n for n in vars(puzzles) if n.startswith("spec_")}
    assert specs and specs <= names, specs - names
    assert {"rope_unsloth_repro", "apply_rotary_pos_emb_triton", "rope_ladder", "_Rotary"} <= names
    # barred by function, not by file: the puzzles' checks still run their own code
    assert not any(n.startswith("check_") for n in names)


def test_rotation_matrix_ref_is_orthogonal_and_composes():
    inv = frequencies.inv_freq(8).double()
    R3, R4, R7 = (basics.rotation_matrix_ref(m, inv) for m in (3, 4, 7))
    torch.testing.assert_close(R3.T @ R3, torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(R3 @ R4, R7)
    # hand value: block 0 of R_1 turns by 1 radian
    assert R3.shape == (8, 8) and basics.rotation_matrix_ref(1, inv)[1, 0].item() == pytest.approx(math.sin(1))


def _pairs(v):
    """The interleaved pairs of v as complex numbers: v[2j] + i v[2j+1]."""
    return torch.complex(v[0::2], v[1::2])


def _own_score(q, k, offset, inv_freq):
    """A learner's right answer: Re sum_j q_j conj(k_j) e^{-i (n - m) theta_j}."""
    return (_pairs(q) * _pairs(k).conj() * torch.exp(-1j * offset * inv_freq)).sum().real


def _own_score_by_numbers(q, k, offset, inv_freq):
    """A learner's right answer summed in Python numbers: complex(), float(), int() and bool()
    of tensors (calls of types, while PyTorch dispatches _local_scalar_dense)."""
    import cmath
    total = 0.0
    for j in range(int(torch.tensor(inv_freq.numel()))):
        qj = complex(_pairs(q)[j])
        kj = complex(_pairs(k)[j])
        total += (qj * kj.conjugate() * cmath.exp(-1j * offset * float(inv_freq[j]))).real
    assert bool(torch.tensor(total) == total)
    return total


def _score_from_reference(q, k, offset, inv_freq):
    """Right values, q^T R_{n-m} k with R read off the reference."""
    return q @ _reference_answer(offset, inv_freq) @ k


def _score_from_spec(q, k, offset, inv_freq):
    """Right values, the dot product of q with k rotated by notebook 13's interleaved spec."""
    return q @ puzzles.spec_interleaved(k[None], (offset * inv_freq)[None])[0]


def _rot2(alpha):
    """Notebook 01's rot2 (section 1), as the notebook defines it."""
    a = torch.as_tensor(alpha, dtype=torch.float64)
    return torch.stack([torch.stack([a.cos(), -a.sin()]), torch.stack([a.sin(), a.cos()])])


def _score_from_rot2(q, k, offset, inv_freq):
    """Right values, pair by pair with the notebook's rot2: q_j^T R((n - m) theta_j) k_j."""
    return sum(q[2 * j:2 * j + 2] @ _rot2(offset * t) @ k[2 * j:2 * j + 2]
               for j, t in enumerate(inv_freq))


def _score_from_block_diag(q, k, offset, inv_freq):
    """Right values, q^T R_{n-m} k with R_{n-m} placed by torch.block_diag."""
    c, s = (offset * inv_freq).cos(), (offset * inv_freq).sin()
    blocks = [torch.stack([torch.stack([c[j], -s[j]]), torch.stack([s[j], c[j]])])
              for j in range(inv_freq.numel())]
    return q @ torch.block_diag(*blocks) @ k


def test_relative_score_is_the_rotated_dot_product():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, generator=g, dtype=torch.float64)
    for m, n in ((0, 3), (5, 2), (7, 7), (4000, 17)):
        want = (_reference_answer(m, _NOTEBOOK_INV) @ q) @ (_reference_answer(n, _NOTEBOOK_INV) @ k)
        for answer in (_own_score, basics.solution_relative_score, _score_from_rot2):
            assert answer(q, k, n - m, _NOTEBOOK_INV).item() == pytest.approx(want.item(), abs=1e-9)


def test_check_relative_score(capsys):
    assert basics.check_relative_score(learner_copy(basics.solution_relative_score))
    assert basics.check_relative_score(_own_score)
    assert "✅ relative score g(q, k, n - m): correct" in capsys.readouterr().out
    # the score as a Python float is a number too, made by .item(), float() or complex()
    assert basics.check_relative_score(lambda q, k, o, inv: _own_score(q, k, o, inv).item())
    assert basics.check_relative_score(lambda q, k, o, inv: float(_own_score(q, k, o, inv)))
    assert basics.check_relative_score(_own_score_by_numbers)
    # a right answer passes every draw of q, k and the random pair
    for _ in range(5):
        assert basics.check_relative_score(_own_score)
    capsys.readouterr()


_FIRST_CASE = "(R=8, base=10000, m=0, n=3"     # the check's first case: n - m = 3


def _sum_of(terms):
    """Re sum_j terms(q_j, k_j, offset, theta_j): a score with its pairs written as complex."""
    return lambda q, k, o, inv: terms(_pairs(q), _pairs(k), o, inv).sum().real


@pytest.mark.parametrize("answer, words", [
    (_sum_of(lambda qj, kj, o, t: qj * kj.conj() * torch.exp(1j * o * t)), _FIRST_CASE),
    (_sum_of(lambda qj, kj, o, t: qj.conj() * kj * torch.exp(-1j * o * t)), _FIRST_CASE),
    (_sum_of(lambda qj, kj, o, t: qj * kj * torch.exp(-1j * o * t)), _FIRST_CASE),
    (lambda q, k, o, inv: (_pairs(q) * _pairs(k).conj() * torch.exp(-1j * o * inv)).real,
     "expected a single number, got a tensor of shape (4,)"),
    (lambda q, k, o, inv: (_pairs(q) * _pairs(k).conj() * torch.exp(-1j * o * inv)).sum(),
     _FIRST_CASE),
    (lambda q, k, o, inv: _own_score(q, k, o, _NOTEBOOK_INV), "(R=4, base=10000, m=0, n=3"),
], ids=["wrong sign of the offset", "conjugate on the query", "no conjugate", "no sum",
        "complex, not its real part", "the notebook's inv_freq"])
def test_check_relative_score_refuses_wrong_answers(answer, words, capsys):
    assert basics.check_relative_score(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ relative score g(q, k, n - m) ") and words in out, out


def test_a_wrong_sign_passes_only_at_m_equals_n(capsys):
    # the cases m = n agree whatever the sign: the check must try offsets of both signs
    wrong = _sum_of(lambda qj, kj, o, t: qj * kj.conj() * torch.exp(1j * o * t))
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 8, generator=g, dtype=torch.float64)
    gap = [abs(wrong(q, k, o, _NOTEBOOK_INV) - _own_score(q, k, o, _NOTEBOOK_INV)).item()
           for o in (0, 3, -3)]
    assert gap[0] < 1e-12 and min(gap[1:]) > 1e-3, gap
    assert {n - m for m, n in basics._SCORE_PAIRS} >= {3, -3, 0}


@pytest.mark.parametrize("answer, words", [
    (_score_from_reference, "ropelib's apply_rope_ref (ropelib/reference.py)"),
    (_score_from_spec, "ropelib's spec_interleaved (ropelib/course/puzzles.py)"),
    (lambda q, k, o, inv: q @ basics.rotation_matrix_ref(o, inv) @ k,
     "ropelib's rotation_matrix_ref"),
    (lambda q, k, o, inv: q @ basics.solution_rotation_matrix(o, inv) @ k,
     "ropelib's solution_rotation_matrix"),
    (basics.solution_relative_score, "ropelib's solution_relative_score"),
    (lambda q, k, o, inv: basics.solution_relative_score(q, k, o, inv),
     "ropelib's solution_relative_score"),
    (_score_from_block_diag, "block_diag"),
], ids=["reference", "notebook 13's spec", "the check's own matrix", "exercise 1's worked solution",
        "the worked solution", "wrapped worked solution", "torch.block_diag"])
def test_check_relative_score_refuses_library_answers(answer, words, capsys):
    # right values, computed by ropelib's rotations (or a rotation matrix), not the complex sum
    assert answer(torch.ones(8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), 0,
                  _NOTEBOOK_INV).item() == pytest.approx(8.0)
    assert basics.check_relative_score(answer) is False
    out = capsys.readouterr().out
    assert "this exercise wants the score computed from complex pairs" in out and words in out, out
    assert "write it yourself" in out


def test_check_relative_score_refuses_the_notebooks_rotations(monkeypatch, capsys):
    """In the notebook, the rotations it defined before the exercises (rot2, R_from_reference,
    rope_at, exercise 1's rotation_matrix) live in __main__: an answer that calls one is refused.
    The same code outside __main__ is the learner's own."""
    import types
    assert basics.check_relative_score(_score_from_rot2)       # here rot2 is not the notebook's
    capsys.readouterr()
    notebook = types.ModuleType("__main__")
    notebook.rot2 = _rot2
    notebook.rotation_matrix = learner_copy(basics.solution_rotation_matrix)
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    assert set(basics.notebook_rotations()) == {_rot2, notebook.rotation_matrix}
    assert basics.check_relative_score(_score_from_rot2) is False
    out = capsys.readouterr().out
    assert "this exercise wants the score computed from complex pairs" in out
    assert "called _rot2" in out, out
    assert basics.check_relative_score(
        lambda q, k, o, inv: q @ notebook.rotation_matrix(o, inv) @ k) is False
    assert "called solution_rotation_matrix" in capsys.readouterr().out
    assert basics.check_relative_score(_own_score)          # the complex sum still passes


def test_check_rotate_half(capsys):
    own = learner_copy(basics.solution_rotate_half)
    assert basics.check_rotate_half(own)
    assert not basics.check_rotate_half(lambda x, interleaved: own(x, False))
    assert not basics.check_rotate_half(lambda x, interleaved: -own(x, interleaved))
    capsys.readouterr()
    # ropelib's own rotate_half, and the worked solution, are not the learner's
    from ropelib.bench import compare
    hf = lambda x, interleaved: compare.hf_rotate(  # noqa: E731 -- cos 0, sin 1: rotate_half
        x, torch.zeros(x.shape[-1], dtype=x.dtype), torch.ones(x.shape[-1], dtype=x.dtype),
        interleaved)
    for library in (reference.rotate_half, lambda x, interleaved: reference.rotate_half(x, interleaved),
                    basics.solution_rotate_half, hf):
        assert not basics.check_rotate_half(library)
        out = capsys.readouterr().out
        assert "this exercise wants your own rotate_half" in out and "ropelib's" in out


def _rotate_half_from_specs(x, interleaved=False):
    """rotate_half as the course's specs compute it: a quarter turn of every pair."""
    from ropelib.course import puzzles
    theta = torch.full((*x.shape[:-1], x.shape[-1] // 2), math.pi / 2, dtype=x.dtype)
    spec = puzzles.spec_interleaved if interleaved else puzzles.spec_rotate_row
    return spec(x, theta)


def test_check_rotate_half_refuses_the_course_spec(capsys):
    x = torch.randn(3, 8, dtype=torch.float64)
    for interleaved in (False, True):                   # the same up to cos(pi/2) ~ 6e-17
        torch.testing.assert_close(_rotate_half_from_specs(x, interleaved),
                                   reference.rotate_half(x, interleaved))
    assert basics.check_rotate_half(_rotate_half_from_specs) is False
    out = capsys.readouterr().out
    assert "this exercise wants your own rotate_half" in out
    assert "ropelib's spec_rotate_row (ropelib/course/puzzles.py)" in out, out


def test_check_interleave_permutation(capsys):
    own = learner_copy(basics.solution_interleave_permutation)
    assert basics.check_interleave_permutation(own)
    assert basics.check_interleave_permutation(lambda d: torch.tensor(own(d)))   # a tensor counts
    assert not basics.check_interleave_permutation(lambda d: list(range(d)))
    inverse = lambda d: torch.argsort(torch.tensor(own(d))).tolist()  # noqa: E731
    assert not basics.check_interleave_permutation(inverse)                # the inverse is wrong
    assert not basics.check_interleave_permutation(lambda d: [0] + list(range(d - 1)))
    assert not basics.check_interleave_permutation(lambda d: own(d)[:-1])
    assert not basics.check_interleave_permutation(lambda d: ...)
    assert not basics.check_interleave_permutation(lambda d: "abc")
    assert not basics.check_interleave_permutation(lambda d: 1 / 0)
    assert not basics.check_interleave_permutation(...)
    capsys.readouterr()


def test_check_interleave_permutation_the_way_back(capsys):
    back = basics.solution_interleave_permutation(8, to="interleaved")
    assert back == [0, 4, 1, 5, 2, 6, 3, 7]                    # by hand: pairs (i, i+4) -> (2i, 2i+1)
    own = learner_copy(basics.solution_interleave_permutation)
    assert basics.check_interleave_permutation(lambda d: own(d, "interleaved"), to="interleaved")
    assert basics.check_interleave_permutation(lambda d: own(d, "interleaved"), to="interleaved",
                                               dims=(12,))
    # only right for d = 8: the other sizes tell
    assert not basics.check_interleave_permutation(lambda d: [0, 4, 1, 5, 2, 6, 3, 7],
                                                   to="interleaved")
    assert not basics.check_interleave_permutation(own, to="interleaved")   # the other way
    forward = basics.solution_interleave_permutation(8)
    assert torch.equal(torch.argsort(torch.tensor(forward)), torch.tensor(back))
    with pytest.raises(ValueError, match="to must be"):
        basics.check_interleave_permutation(own, to="sideways")
    capsys.readouterr()


# --- notebook 02 -----------------------------------------------------------------------------

def test_check_cp_positions(capsys):
    own = learner_copy(basics.solution_cp_positions)
    # hand values: a 16-token sequence over cp_size=2 in 4 chunks of 4; rank 1 holds chunks 1, 2
    assert own(8, 2, 1) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert own(8, 2, 0) == [0, 1, 2, 3, 12, 13, 14, 15]
    assert basics.check_cp_positions(own)
    assert basics.check_cp_positions(lambda n, c, r: torch.tensor(own(n, c, r)))
    assert not basics.check_cp_positions(lambda n, c, r: list(range(r * n, (r + 1) * n)))
    assert not basics.check_cp_positions(lambda n, c, r: own(n, c, r)[::-1])
    assert not basics.check_cp_positions(lambda n, c, r: [4, 5, 6, 7, 8, 9, 10, 11])
    assert not basics.check_cp_positions(lambda n, c, r: ...)
    capsys.readouterr()


def _library_cos_sin(freqs):
    """Right values for the check's tables, from ropelib.frequencies instead of freqs."""
    interleaved = bool(torch.equal(freqs[..., 0], freqs[..., 1]))
    return frequencies.rope_cos_sin(freqs.shape[0], 16, rotary_percent=freqs.shape[-1] / 16,
                                    interleaved=interleaved, offset=3)


def test_check_cos_sin_from_freqs(capsys):
    assert basics.check_cos_sin_from_freqs(learner_copy(basics.solution_cos_sin_from_freqs))
    f = frequencies.rope_freqs(6, 16, interleaved=True, offset=3)
    torch.testing.assert_close(_library_cos_sin(f), basics.solution_cos_sin_from_freqs(f))
    for library in (_library_cos_sin, basics.solution_cos_sin_from_freqs):
        assert not basics.check_cos_sin_from_freqs(library)
        assert "ropelib's" in capsys.readouterr().out
    assert not basics.check_cos_sin_from_freqs(lambda f: (f[:, 0, 0].sin(), f[:, 0, 0].cos()))
    assert not basics.check_cos_sin_from_freqs(lambda f: (f.cos(), f.sin()))   # wrong shape


def test_check_bytes_moved(capsys):
    own = learner_copy(basics.solution_bytes_moved)
    # hand value: 2 * (4096*2*(32+8)*128*2) + 4096*128*4 = 167772160 + 2097152
    assert own(4096, 2, 32, 8, 128) == 169869312
    # partial rotary: int(128 * 0.6) = 76 columns of the table, every feature still moved
    assert own(64, 1, 4, 1, 128, 0.6) == 2 * 64 * 5 * 128 * 2 + 64 * 76 * 4
    assert basics.check_bytes_moved(own)
    assert not basics.check_bytes_moved(lambda S, B, HQ, HK, D, p=1.0, e=2: 169869312)
    assert not basics.check_bytes_moved(                                   # no table
        lambda S, B, HQ, HK, D, p=1.0, e=2: 2 * S * B * (HQ + HK) * D * e)
    assert not basics.check_bytes_moved(                                   # q only
        lambda S, B, HQ, HK, D, p=1.0, e=2: own(S, B, HQ, 0, D, p, e))
    assert not basics.check_bytes_moved(                                   # the whole table
        lambda S, B, HQ, HK, D, p=1.0, e=2: own(S, B, HQ, HK, D, 1.0, e))
    assert not basics.check_bytes_moved(                                   # rotated features only
        lambda S, B, HQ, HK, D, p=1.0, e=2: own(S, B, HQ, HK, int(D * p), 1.0, e))
    assert not basics.check_bytes_moved(                                   # R rounded, not cut
        lambda S, B, HQ, HK, D, p=1.0, e=2: own(S, B, HQ, HK, D, 1.0, e)
        - S * D * 4 + S * round(D * p) * 4)
    assert not basics.check_bytes_moved(                                   # always 2 bytes
        lambda S, B, HQ, HK, D, p=1.0, e=2: own(S, B, HQ, HK, D, p))
    sixteen_bit_table = lambda S, B, HQ, HK, D, p=1.0, e=2: (  # noqa: E731
        2 * S * B * (HQ + HK) * D * e + S * int(D * p) * e)
    assert not basics.check_bytes_moved(sixteen_bit_table)
    assert not basics.check_bytes_moved(lambda S, B, HQ, HK, D, p=1.0, e=2: None)
    capsys.readouterr()
