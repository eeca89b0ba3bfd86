"""What a compiled ropelib call costs Dynamo's guards, and that its argument errors survive the
compiler: every call of a `torch.compile`d function first checks the guards installed while
tracing it (one per global, function code object and default argument the traced Python read),
so ropelib's checks are written to read few (ropelib/api.py `checked_call`); and a bad argument
must still raise the public API's error, with its message, at trace time."""
import re

import pytest
import torch
import torch._dynamo

import ropelib

LEAF = re.compile(r"\+- ([A-Z_]+):")
# leaf guards measured for the calls below (CPU, torch 2.13: 81 and 91, from 111 and 126), with
# a little headroom: a rise past these means the traced path reads more globals or defaults
MAX_LEAF_GUARDS = {"apply_rope": 86, "apply_rope_qk": 96}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _leaf_guards(fn, *args) -> int:
    torch.compile(fn, backend="eager", fullgraph=True)(*args)
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    return sum(1 for line in str(entries[0].guard_manager).splitlines() if LEAF.search(line))


def test_compiled_calls_install_few_guards():
    q = torch.randn(1, 64, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 64, 8, 128, dtype=torch.bfloat16)
    f = ropelib.rope_freqs(4096, 128)
    found = {"apply_rope": _leaf_guards(lambda q, f: ropelib.apply_rope(q, f), q, f),
             "apply_rope_qk": _leaf_guards(lambda q, k, f: ropelib.apply_rope_qk(q, k, f),
                                           q, k, f)}
    assert all(found[name] <= most for name, most in MAX_LEAF_GUARDS.items()), found


S, B, H, D = 4, 2, 2, 8


def _bad_calls():
    """(what, fn, args): one bad argument each, a tensor argument first."""
    x = torch.randn(S, B, H, D)
    f = ropelib.rope_freqs(16, D)
    c, s = ropelib.rope_cos_sin(16, D)
    return [
        ("layout", lambda x, f: ropelib.apply_rope(x, f, layout="xyz"), (x, f)),
        ("x's dims", lambda x, f: ropelib.apply_rope(x[0], f), (x, f)),
        ("x's dtype", lambda x, f: ropelib.apply_rope(x.to(torch.int32), f), (x, f)),
        ("interleaved not a bool", lambda x, f: ropelib.apply_rope(x, f, interleaved=1), (x, f)),
        ("inplace not a bool", lambda x, f: ropelib.apply_rope(x, f, inplace=0), (x, f)),
        ("cp_rank", lambda x, f: ropelib.apply_rope(x, f, cp_size=2, cp_rank=2), (x, f)),
        ("bf16 angles", lambda x, f: ropelib.apply_rope(x, f.to(torch.bfloat16)), (x, f)),
        ("table too short", lambda x, f: ropelib.apply_rope(x, f[:2]), (x, f)),
        ("odd rotary dim", lambda x, f: ropelib.apply_rope(x, f[..., :3]), (x, f)),
        ("cos without sin", lambda x, c: ropelib.apply_rope(x, cos=c), (x, c)),
        ("cos and sin shapes", lambda x, c, s: ropelib.apply_rope(x, cos=c, sin=s[:8]), (x, c, s)),
        ("freqs and cos", lambda x, f, c, s: ropelib.apply_rope(x, f, cos=c, sin=s), (x, f, c, s)),
        ("float position_ids", lambda x, f: ropelib.apply_rope(
            x, f, position_ids=torch.zeros(S)), (x, f)),
        ("start_positions length", lambda x, f: ropelib.apply_rope(
            x, f, start_positions=torch.zeros(B + 1, dtype=torch.int64)), (x, f)),
        ("thd without cu_seqlens", lambda x, f: ropelib.apply_rope(x[:, 0], f, layout="thd"),
         (x, f)),
        ("q and k dtypes", lambda x, f: ropelib.apply_rope_qk(x, x.double(), f), (x, f)),
        ("q and k sequence", lambda x, f: ropelib.apply_rope_qk(x, x[:2], f), (x, f)),
        ("k's layout", lambda x, f: ropelib.apply_rope_qk(x, x[0], f), (x, f)),
    ]


def _chain(e):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


@pytest.mark.parametrize("what", [what for what, _, _ in _bad_calls()])
def test_compiled_bad_argument_raises_the_eager_error(what):
    _, fn, args = next(case for case in _bad_calls() if case[0] == what)
    with pytest.raises((TypeError, ValueError)) as eager_error:
        fn(*args)
    expected = eager_error.value
    with pytest.raises(Exception) as compiled_error:
        torch.compile(fn, backend="eager", fullgraph=True)(*args)
    # Dynamo reports an exception the traced code raised and did not catch as "Observed
    # exception", naming it (type and message) in its text
    found = [str(e) for e in _chain(compiled_error.value)]
    assert any(repr(expected) in text or str(expected) in text for text in found), \
        (repr(expected), found)
