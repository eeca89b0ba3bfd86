"""Ways around three exercise checks, each shown passing once, now refused; the worked solutions
(as a learner's own copy) and a learner's own answers still pass.

* Notebook 01's rotation matrix (`basics.check_rotation_matrix`): PyTorch's block_diag reached
  by its `out` overload, its Python reference, its decomposition, or with the check's watch of
  PyTorch's operators switched off (`_disable_current_modes`, `torch._C._DisableTorchDispatch`,
  torch._C's other switches, one of them taken before the check began and the operator run
  from C, and with PyTorch's profiler stopped too); SciPy's `scipy.sparse.block_diag`.
* Notebook 00's interleaved RoPE (`basics.check_interleaved_rope`): transformers' GPT-J RoPE
  (`apply_rotary_pos_emb`, `rotate_every_two`), and Transformer Engine's
  `apply_rotary_pos_emb(..., interleaved=True, fused=False)` (a module in its place where it is
  not installed).
* Notebook 12's dX kernel (`qkv_epilogue.check_prologue_kernel`): a kernel that loads cos and sin
  for every head, not once per program.
"""
import os
import sys
import types
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

from ropelib import frequencies, reference  # noqa: E402
from ropelib.course.exercises import basics, own_code  # noqa: E402
from ropelib.course.exercises import qkv_epilogue as ex  # noqa: E402
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_own_code_tests = load_file("own_code_tests", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it
_qkv_tests = load_file("qkv_epilogue_tests", ROOT / "tests" / "test_exercises_qkv_epilogue.py")

VF = torch._C._VariableFunctions


# --- notebook 01: the rotation matrix, without block_diag --------------------------------------

def _blocks(m, inv_freq):
    a = m * inv_freq
    return [torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
            for c, s in zip(a.cos(), a.sin())]


def _out_overload(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    n = 2 * len(blocks)
    return torch.ops.aten.block_diag.out(blocks, out=torch.empty(n, n, dtype=inv_freq.dtype))


def _python_reference(m, inv_freq):
    import torch._refs
    return torch._refs.block_diag(*_blocks(m, inv_freq))


def _decomposition(m, inv_freq):
    import torch._decomp
    return torch._decomp.decomposition_table[torch.ops.aten.block_diag.default](
        _blocks(m, inv_freq))


def _modes_disabled(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    with _disable_current_modes():
        return VF.block_diag(blocks)


def _modes_disabled_no_call_inside(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    with _disable_current_modes():
        out = list(map(VF.block_diag, [blocks]))     # no Python call while the modes are off
    return out[0]


def _dispatch_disabled(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    with torch._C._DisableTorchDispatch():
        return VF.block_diag(blocks)


def _dispatch_disabled_no_call_inside(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    with torch._C._DisableTorchDispatch():
        out = list(map(VF.block_diag, [blocks]))
    return out[0]


# torch._C's switch taken before the check patches torch._C (a learner's module-level name):
# the check's wrapper never sees the call, and `with` enters the guard with no Python call
_GRABBED_SWITCH = torch._C._DisableTorchDispatch


def _dispatch_disabled_pregrabbed_map(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    with _GRABBED_SWITCH():
        out = list(map(VF.block_diag, [blocks]))     # no Python call while the key is off
    return out[0]


_GRABBED_PROFILER_STOP = torch._C._autograd._disable_profiler


def _profiler_stopped_then_dispatch_disabled(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    next(iter(_GRABBED_PROFILER_STOP, object()))     # called from C: no Python call of it
    with _GRABBED_SWITCH():
        out = list(map(VF.block_diag, [blocks]))
    return out[0]


def _key_excluded(m, inv_freq):
    blocks = _blocks(m, inv_freq)
    key = torch._C.DispatchKey.Python
    torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)
    try:
        return VF.block_diag(blocks)
    finally:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)


def _mode_popped(m, inv_freq):
    from torch.utils._python_dispatch import _pop_mode, _push_mode
    blocks = _blocks(m, inv_freq)
    if torch._C._len_torch_dispatch_stack() == 0:       # (no mode to take off)
        return VF.block_diag(blocks)
    mode = _pop_mode()
    try:
        return VF.block_diag(blocks)
    finally:
        _push_mode(mode)


def _own_rotation_matrix(m, inv_freq):
    """A learner's own R_m that also prints a tensor (PyTorch takes its dispatch modes off
    while it prints one): let through."""
    R = 2 * inv_freq.numel()
    M = torch.zeros(R, R, dtype=torch.float64)
    a = m * inv_freq
    M[0::2, 0::2] = torch.diag(a.cos())
    M[0::2, 1::2] = torch.diag(-a.sin())
    M[1::2, 0::2] = torch.diag(a.sin())
    M[1::2, 1::2] = torch.diag(a.cos())
    repr(M)
    str(a)
    return M


def _own_rotation_matrix_by_numbers(m, inv_freq):
    """A learner's own R_m built from Python numbers: float(), int(), complex() and bool() of a
    tensor (each dispatches PyTorch's _local_scalar_dense, with no `c_call` event for a call of
    a type), range() of one, .item() and .tolist(): let through."""
    import math
    d = int(torch.tensor(inv_freq.numel()))
    M = torch.zeros(2 * d, 2 * d, dtype=torch.float64)
    thetas = inv_freq.tolist()
    for j in range(torch.tensor(d)):
        a = float(m * inv_freq[j])
        assert a == m * thetas[j] and bool(inv_freq[j] > 0)
        z = complex(torch.polar(*torch.tensor([1.0, a], dtype=torch.float64)))
        c, s = z.real, math.sin(a)
        M[2 * j, 2 * j], M[2 * j, 2 * j + 1] = c, -s
        M[2 * j + 1, 2 * j], M[2 * j + 1, 2 * j + 1] = s, torch.tensor(c).item()
    return M


def _modes_disabled_then_numbers(m, inv_freq):
    """The modes taken off, block_diag run from C, then the answer's float(), int() and
    complex(): the switch is still refused."""
    blocks = _blocks(m, inv_freq)
    with _disable_current_modes():
        out = list(map(VF.block_diag, [blocks]))[0]
    float(out[0, 0]), int(out[1, 1]), complex(out[0, 1])
    return out


def _mode_popped_numbers_only(m, inv_freq):
    """The check's mode popped and pushed back with no Python call of the answer's in between
    but float() and int() of tensors (calls of types, which give the answer's frame no event):
    still refused."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode
    blocks = _blocks(m, inv_freq)
    if torch._C._len_torch_dispatch_stack() == 0:       # (no mode to take off)
        return VF.block_diag(blocks)
    mode = _pop_mode()
    out = list(map(VF.block_diag, [blocks]))[0]
    float(out[0, 0]), int(out[1, 1])
    list(map(_push_mode, [mode]))
    return out


@torch.jit.script
def _scripted_block_diag(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.block_diag(a, b)


def _torchscript(m, inv_freq):
    """block_diag called from TorchScript's interpreter, which re-raises the refusal as a
    RuntimeError with an empty message: the learner must still be told what was refused."""
    blocks = _blocks(m, inv_freq)
    out = blocks[0]
    for block in blocks[1:]:
        out = _scripted_block_diag(out, block)
    return out


SWITCHED_OFF = "switched off the check's watch of PyTorch's operators"


@pytest.mark.parametrize("answer, words", [
    (_out_overload, "PyTorch's operator aten::block_diag.out"),
    (_python_reference, "block_diag (torch/_refs/__init__.py)"),
    (_decomposition, "_block_diag_iterable (torch/_refs/__init__.py)"),
    (_modes_disabled, SWITCHED_OFF),
    (_modes_disabled_no_call_inside, SWITCHED_OFF),
    (_dispatch_disabled, SWITCHED_OFF),
    (_dispatch_disabled_no_call_inside, SWITCHED_OFF),
    (_dispatch_disabled_pregrabbed_map, SWITCHED_OFF),
    (_profiler_stopped_then_dispatch_disabled, "switched off the check's profiler"),
    (_key_excluded, SWITCHED_OFF),
    (_mode_popped, SWITCHED_OFF),
    (_mode_popped_numbers_only, SWITCHED_OFF),
    (_modes_disabled_then_numbers, SWITCHED_OFF),
    (_torchscript, "PyTorch's operator aten::block_diag"),
], ids=["aten.block_diag.out", "torch._refs.block_diag", "decomposition_table",
        "_disable_current_modes", "_disable_current_modes, map", "_DisableTorchDispatch",
        "_DisableTorchDispatch, map", "_DisableTorchDispatch taken before, map", "profiler stopped, then that",
        "Python key excluded", "mode popped", "mode popped, float() and int() between",
        "_disable_current_modes, then float()", "TorchScript"])
def test_rotation_matrix_refuses_block_diag_every_way(answer, words, capsys):
    inv = frequencies.inv_freq(8, 10000.0, dtype=torch.float64)
    torch.testing.assert_close(answer(5, inv), basics.rotation_matrix_ref(5, inv))   # right
    assert basics.check_rotation_matrix(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("❌ rotation matrix R_m (R=8, base=10000, m=0): this exercise wants "
                          "your rotation matrix"), out
    assert words in out, out
    # the check leaves PyTorch as it found it
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python)
    assert torch._C._DisableTorchDispatch.__name__ == "_DisableTorchDispatch"
    assert not torch._C._autograd._profiler_enabled()


def test_rotation_matrix_accepts_own_code(capsys):
    assert basics.check_rotation_matrix(learner_copy(basics.solution_rotation_matrix))
    assert basics.check_rotation_matrix(_own_rotation_matrix)      # printing a tensor: fine
    assert basics.check_rotation_matrix(_own_rotation_matrix_by_numbers)   # float(t), int(t)
    out = capsys.readouterr().out
    assert out.count("✅") == 3, out


def test_every_block_diag_overload_is_barred():
    packet = torch.ops.aten.block_diag
    assert packet in basics.BLOCK_DIAG_OPS
    assert all(own_code._barred_op(getattr(packet, name), frozenset(basics.BLOCK_DIAG_OPS))
               for name in packet.overloads())
    assert not own_code._barred_op(torch.ops.aten.cat.default, frozenset(basics.BLOCK_DIAG_OPS))
    names = {f.__name__ for f in basics.torch_block_diags()}
    assert {"block_diag", "_block_diag_iterable"} <= names


def test_rotation_matrix_refuses_scipy_sparse_block_diag(monkeypatch, capsys):
    # SciPy may not be installed: modules in its place, each with a block_diag of its own
    def linalg_block_diag(*blocks):
        return torch.block_diag(*blocks)

    def sparse_block_diag(blocks):
        size = sum(b.shape[0] for b in blocks)
        out = torch.zeros(size, size, dtype=blocks[0].dtype)
        at = 0
        for b in blocks:
            out[at:at + b.shape[0], at:at + b.shape[1]] = b
            at += b.shape[0]
        return out

    scipy = types.ModuleType("scipy")
    scipy.__path__ = []
    scipy.linalg = types.ModuleType("scipy.linalg")
    scipy.linalg.block_diag = linalg_block_diag
    scipy.sparse = types.ModuleType("scipy.sparse")
    scipy.sparse.block_diag = sparse_block_diag
    for name, module in (("scipy", scipy), ("scipy.linalg", scipy.linalg),
                         ("scipy.sparse", scipy.sparse)):
        monkeypatch.setitem(sys.modules, name, module)
    assert basics.other_block_diags() == (linalg_block_diag, sparse_block_diag)

    def answer(m, inv_freq):
        return sparse_block_diag(_blocks(m, inv_freq))

    inv = frequencies.inv_freq(8, 10000.0, dtype=torch.float64)
    torch.testing.assert_close(answer(5, inv), basics.rotation_matrix_ref(5, inv))
    assert basics.check_rotation_matrix(answer) is False
    out = capsys.readouterr().out
    assert "this exercise wants your rotation matrix" in out and "sparse_block_diag" in out, out


def test_operator_watch_lets_other_operators_and_printing_through():
    with own_code.library_barred("your code", bar_ops=(torch.ops.aten.block_diag,)):
        t = torch.arange(4.0).reshape(2, 2)
        text = repr(t @ t)
    assert "tensor" in text
    with pytest.raises(own_code.LibraryAnswer, match="switched off the check's watch"):
        with own_code.library_barred("your code", bar_ops=(torch.ops.aten.block_diag,)):
            with _disable_current_modes():
                torch.zeros(2)
    assert torch._C._len_torch_dispatch_stack() == 0


def _numbers_of(t):
    """A tensor made Python numbers every way: calls of types (no `c_call` event for the
    caller's frame while PyTorch dispatches _local_scalar_dense), methods, and a builtin."""
    import operator
    return (float(t[0]), int(t[1]), complex(t[2]), bool(t[3]), len(range(t[1])), t[0].item(),
            t.tolist(), operator.index(t[1]), round(float(t.sum())))


def test_operator_watch_lets_a_tensors_numbers_through():
    t = torch.tensor([2, 2, 3, 1])
    want = _numbers_of(t)                               # outside the watch
    with own_code.library_barred("your code", bar_ops=(torch.ops.aten.block_diag,)):
        got = _numbers_of(t)
        nested = [float(x) for x in t]                  # in a comprehension's frame
        mapped = list(map(lambda x: int(x) + 1, t))     # in a lambda called from C
    assert got == want == (2.0, 2, 3 + 0j, True, 2, 2, [2, 2, 3, 1], 2, 8)
    assert nested == [2.0, 2.0, 3.0, 1.0] and mapped == [3, 3, 4, 2]
    assert torch._C._len_torch_dispatch_stack() == 0


# --- notebook 00: an interleaved RoPE of one's own -------------------------------------------

def _gptj_answer(x, freqs):
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb
    S, D = freqs.shape[0], freqs.shape[-1]
    half = freqs.view(1, S, D)[..., 0::2].float()          # [1, S, D/2]: each angle once
    return apply_rotary_pos_emb(x.float(), half.sin(), half.cos()).to(x.dtype)


def _gptj_rotate_answer(x, freqs):
    from transformers.models.gptj.modeling_gptj import rotate_every_two
    S, D = freqs.shape[0], freqs.shape[-1]
    angles = freqs.view(1, S, 1, D).float()
    xf = x.float()
    return (xf * angles.cos() + rotate_every_two(xf) * angles.sin()).to(x.dtype)


def _te_like_module(monkeypatch):
    """Transformer Engine's RoPE module, where it is not installed: an unfused
    apply_rotary_pos_emb(t, freqs, tensor_format, interleaved, fused) of its own."""
    name = "transformer_engine.pytorch.attention.rope"
    rope = types.ModuleType(name)

    def apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", interleaved=False, fused=False):
        f = freqs.view(1, freqs.shape[0], 1, -1) if tensor_format == "bshd" else freqs
        tf = t.float()
        if interleaved:
            rot = torch.stack((-tf[..., 1::2], tf[..., 0::2]), dim=-1).flatten(-2)
        else:
            a, b = tf.chunk(2, dim=-1)
            rot = torch.cat((-b, a), dim=-1)
        return (tf * f.cos() + rot * f.sin()).to(t.dtype)

    apply_rotary_pos_emb.__module__ = name
    rope.apply_rotary_pos_emb = apply_rotary_pos_emb
    parts = name.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, name, rope)
    return apply_rotary_pos_emb


@pytest.mark.parametrize("answer, words", [
    (_gptj_answer, "apply_rotary_pos_emb (transformers/models/gptj/modeling_gptj.py)"),
    (_gptj_rotate_answer, "rotate_every_two (transformers/models/gptj/modeling_gptj.py)"),
], ids=["GPT-J apply_rotary_pos_emb", "GPT-J rotate_every_two"])
def test_interleaved_rope_refuses_transformers(answer, words, capsys):
    pytest.importorskip("transformers")
    x = torch.randn(2, 6, 4, 16)
    f = frequencies.rope_freqs(6, 16, interleaved=True)
    torch.testing.assert_close(answer(x, f),
                               reference.rope_reference(x, f, layout="bshd", interleaved=True))
    assert basics.check_interleaved_rope(answer) is False
    out = capsys.readouterr().out
    assert "this exercise wants your own RoPE, but the answer called" in out, out
    assert words in out, out


def test_interleaved_rope_refuses_transformer_engine(monkeypatch, capsys):
    te_rope = _te_like_module(monkeypatch)
    assert te_rope in basics.third_party_ropes()

    def answer(x, freqs):
        return te_rope(x, freqs, tensor_format="bshd", interleaved=True, fused=False)

    x = torch.randn(2, 6, 4, 16)
    f = frequencies.rope_freqs(6, 16, interleaved=True)
    torch.testing.assert_close(answer(x, f),
                               reference.rope_reference(x, f, layout="bshd", interleaved=True))
    assert basics.check_interleaved_rope(answer) is False
    out = capsys.readouterr().out
    assert "this exercise wants your own RoPE, but the answer called apply_rotary_pos_emb" \
        in out, out


def test_interleaved_rope_accepts_own_code(capsys):
    assert basics.check_interleaved_rope(learner_copy(basics.solution_interleaved_rope))
    assert "✅" in capsys.readouterr().out


# --- notebook 12: cos and sin loaded once per program ------------------------------------------

DX = _qkv_tests.DX
_LOADS = ("    c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)\n"
          "    s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)\n")
_IN_THE_LOOP = _LOADS.replace("    ", "        ", 2)        # every head, v's too
_PER_HEAD = ("        if h < N_ROT:\n"
             "            c = tl.load(cos_ptr + cs, mask=m_ok[:, None], other=1.0)\n"
             "            s = tl.load(sin_ptr + cs, mask=m_ok[:, None], other=0.0)\n")


@pytest.mark.parametrize("why, replacements", [
    ("cos and sin loaded for every q and k head",
     [(_LOADS, ""), ("        if h < N_ROT:\n", _PER_HEAD)]),
    ("cos and sin loaded for every head, v's too",
     [(_LOADS, ""), ("        g = g_ptr", _IN_THE_LOOP + "        g = g_ptr")]),
], ids=["per q and k head", "per head"])
def test_prologue_refuses_cos_sin_loaded_per_head(why, replacements, capsys):
    kernel = _qkv_tests.mutated(DX, *replacements)
    assert not ex.check_prologue_kernel(kernel, seed=2), why
    out = capsys.readouterr().out
    assert "the results are right, but in the interpreter it loads" in out, out
    assert "load cos and sin once per program" in out, out


def test_prologue_accepts_the_worked_solution_copy(capsys):
    assert ex.check_prologue_kernel(learner_copy(DX), seed=2)
    assert "✅" in capsys.readouterr().out
    assert ex._cos_sin_loads(learner_copy(DX)) is None
