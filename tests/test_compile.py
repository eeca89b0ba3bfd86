"""ropelib under torch.compile: every public entry point traces into one graph (fullgraph=True, zero
graph breaks) and gives the same bits as eager, in training and inference, with changing shapes.

On the CPU the kernels run in Triton's interpreter, where ropelib's operators are opaque custom
ops; the `eager` and `aot_eager` backends run them there (Inductor's code for a Triton kernel
needs a GPU). The GPU tests at the end run Inductor itself: there the operators are triton_ops,
so Inductor sees and launches the Triton kernel, also under CUDA graphs (mode="reduce-overhead").
"""
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import ropelib
from ropelib import hf, te
from ropelib.reference import rope_reference
from registration import assert_registered  # noqa: E402

BACKENDS = ["eager", "aot_eager"]
S, B, H, D = 8, 2, 3, 16


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _assert_one_graph(fn, *args):
    """Dynamo traces fn into one graph with no break (and says why if not)."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    reasons = [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons
    torch._dynamo.reset()


def _equal(a, b):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()


def _case(kind):
    """(fn, args): one call of a public entry point, its tensors as arguments (the rotated
    inputs first: see N_INPUTS)."""
    f = ropelib.rope_freqs(4 * S, D, rotary_percent=0.5)
    x = torch.randn(S, B, H, D)
    if kind == "apply_rope":
        return (lambda x, f: ropelib.apply_rope(x, f)), (x, f)
    if kind == "start_positions":
        sp = torch.tensor([3, 7])
        return (lambda x, f, sp: ropelib.apply_rope(x, f, start_positions=sp)), (x, f, sp)
    if kind == "position_ids_bshd":
        pid = torch.randint(0, 4 * S, (B, S))
        return (lambda x, f, p: ropelib.apply_rope(x, f, layout="bshd", position_ids=p)), \
            (x.transpose(0, 1).contiguous(), f, pid)
    if kind == "thd_cp":
        cu = torch.tensor([0, 4, 12, 16])
        t = torch.randn(8, H, D)
        return (lambda t, f, cu: ropelib.apply_rope(t, f, layout="thd", cu_seqlens=cu, cp_size=2,
                                                    cp_rank=1)), (t, f, cu)
    if kind == "cos_sin_interleaved":
        c, s = ropelib.rope_cos_sin(S, D, interleaved=True)
        return (lambda x, c, s: ropelib.apply_rope(x, cos=c, sin=s, interleaved=True)), (x, c, s)
    if kind == "apply_rope_qk":
        k = torch.randn(S, B, 1, D)
        return (lambda q, k, f: ropelib.apply_rope_qk(q, k, f)), (x, k, f)
    if kind == "te_fused":
        sp = torch.tensor([1, 2])
        return (lambda t, f, sp: te.apply_rotary_pos_emb(t, f, start_positions=sp, fused=True)), \
            (x, f, sp)
    if kind == "te_fused_qkv":
        qkv = torch.randn(S, B, 2, 64)
        ff = ropelib.rope_freqs(S, 16)
        return (lambda qkv, f: te.apply_fused_qkv_rotary_pos_emb(qkv, f, f, [32, 16, 16])), (qkv, ff)
    if kind == "hf":
        q, k = torch.randn(B, H, S, D), torch.randn(B, 1, S, D)
        c, s = ropelib.rope_cos_sin(S, D)
        return (lambda q, k, c, s: hf.apply_rotary_pos_emb(q, k, c[None], s[None])), (q, k, c, s)
    if kind == "hf_views":      # transformers' [B, H, S, D] views of bshd projections
        q, k = torch.randn(B, S, H, D).transpose(1, 2), torch.randn(B, S, 1, D).transpose(1, 2)
        c, s = torch.randn(B, S, D), torch.randn(B, S, D)
        return (lambda q, k, c, s: hf.apply_rotary_pos_emb(q, k, c, s)), (q, k, c, s)
    if kind == "module":
        m = ropelib.RotaryEmbedding(D, layout="sbhd", max_seq_len=4 * S)
        k = torch.randn(S, B, 1, D)
        return (lambda q, k: m(q, k)), (x, k)
    raise ValueError(kind)


N_INPUTS = {"apply_rope_qk": 2, "hf": 2, "hf_views": 2, "module": 2}   # others: 1

KINDS = ["apply_rope", "start_positions", "position_ids_bshd", "thd_cp", "cos_sin_interleaved",
         "apply_rope_qk", "te_fused", "te_fused_qkv", "hf", "hf_views", "module"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_point_is_one_graph(kind, seeded):
    fn, args = _case(kind)
    _assert_one_graph(fn, *args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_fullgraph_training_equals_eager(kind, backend, seeded):
    _training_equals_eager(kind, lambda fn: torch.compile(fn, backend=backend, fullgraph=True))


def _training_equals_eager(kind, compile_, device="cpu"):
    """Outputs and input gradients of a compiled call equal eager's, bit for bit."""
    fn, args = _case(kind)
    n = N_INPUTS.get(kind, 1)
    args_e = [a.to(device).requires_grad_(i < n) for i, a in enumerate(args)]
    args_c = [a.detach().clone().requires_grad_(i < n) for i, a in enumerate(args_e)]
    out_e = fn(*args_e)
    out_c = compile_(fn)(*args_c)
    _equal(out_c, out_e)
    outs_e = out_e if isinstance(out_e, tuple) else (out_e,)
    outs_c = out_c if isinstance(out_c, tuple) else (out_c,)
    grads = [torch.randn_like(o) for o in outs_e]
    torch.autograd.backward(outs_e, grads)
    torch.autograd.backward(outs_c, grads)
    for a, c in zip(args_e, args_c):
        if a.requires_grad:
            _equal(c.grad, a.grad)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("kind", ["apply_rope", "thd_cp", "apply_rope_qk", "hf", "module"])
def test_fullgraph_inference_equals_eager(kind, mode, seeded):
    fn, args = _case(kind)
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with ctx():
        args = [a.clone() for a in args]
        out_e = fn(*args)
        out_c = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    _equal(out_c, out_e)


@pytest.mark.parametrize("grad", [False, True])
def test_fullgraph_in_place(grad, seeded):
    """In place on views of a projection inside the compiled code, as a model does it."""
    f = ropelib.rope_freqs(S, D)

    def fn(h):
        x = h * 1.0                          # [S, B, 4, D]: q heads 0-2, k head 3
        ropelib.apply_rope_qk(x[:, :, :3], x[:, :, 3:], f, inplace=True)
        return x

    base = torch.randn(S, B, 4, D)
    want = torch.cat(ropelib.apply_rope_qk(base[:, :, :3], base[:, :, 3:], f), dim=2)
    h = base.clone().requires_grad_(grad)
    x = torch.compile(fn, backend="aot_eager", fullgraph=True)(h)
    _equal(x, want)
    if grad:
        g = torch.randn_like(x)
        x.backward(g)
        h2 = base.clone().requires_grad_(True)
        fn(h2).backward(g)
        _equal(h.grad, h2.grad)


def test_changing_sequence_length_compiles_once(seeded):
    """With dynamic shapes a new sequence length reuses the graph (sizes are symbolic)."""
    f = ropelib.rope_freqs(256, D)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def fn(q, k, sp):
        return ropelib.apply_rope_qk(q, k, f, layout="bshd", start_positions=sp)

    c = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for s in (40, 48, 72, 100):
        q, k = torch.randn(B, s, H, D, requires_grad=True), torch.randn(B, s, 1, D)
        sp = torch.tensor([1, 5])
        out = c(q, k, sp)
        _equal(out, fn(q, k, sp))
        out[0].sum().backward()
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for 4 lengths"


def test_compiled_model_matches_eager(seeded):
    from ropelib.course.model import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = GPT(cfg, rope="ropelib")
    idx = torch.randint(0, 32, (2, 16))
    explained = torch._dynamo.explain(model)(idx, idx)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    _, loss_c = compiled(idx, idx)
    loss_c.backward()
    grads_c = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _, loss_e = model(idx, idx)
    loss_e.backward()
    torch.testing.assert_close(loss_c, loss_e, atol=1e-6, rtol=1e-6)
    for gc, p in zip(grads_c, model.parameters()):
        torch.testing.assert_close(gc, p.grad, atol=1e-6, rtol=1e-6)


def test_opcheck_every_operator(seeded):
    """torch.library.opcheck: schema, fake (meta) implementation, autograd registration and
    AOT dispatch with dynamic shapes, for each of ropelib's operators."""
    ops = torch.ops.ropelib
    x = torch.randn(S, B, H, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(S, B, 1, D, dtype=torch.float64, requires_grad=True)
    f = ropelib.rope_freqs(2 * S, D)[:, 0, 0]
    c, s = ropelib.rope_cos_sin(2 * S, D)
    sp = torch.tensor([1, 2])
    pid = torch.randint(0, 2 * S, (B, S))
    cu = torch.tensor([0, 3, 8])
    t = torch.randn(8, H, D, dtype=torch.float64, requires_grad=True)
    cases = [
        (ops.rope.default, (x, f, None, None, None, sp, "sbhd", False, 1, 0, False, None)),
        (ops.rope.default, (x.transpose(0, 1), c, s, pid, None, None, "bshd", True, 1, 0, True,
                            None)),
        (ops.rope.default, (t, f, None, None, cu, None, "thd", False, 1, 0, False, None)),
        (ops.rope_qk.default, (x, k, f, None, None, None, sp, "sbhd", False, 2, 1, False,
                               None)),
        (ops.rope_.default, (x.detach().clone(), f, None, None, None, sp, "sbhd", False, 1, 0)),
        (ops.rope_qk_.default, (x.detach().clone(), k.detach().clone(), f, None, None, None,
                                sp, "sbhd", False, 1, 0)),
        (ops.rope_qkv.default, (torch.randn(S, B, 2, 64, requires_grad=True), f[:, :16],
                                f[:, :16], sp, "sbhd", [32, 16, 16], False, 1, 0)),
        (ops.rope_qkv_backward.default, (torch.randn(S, B, 4, 16), torch.randn(S, B, 2, 16),
                                         torch.randn(S, B, 2, 16), f[:, :16], f[:, :16], None,
                                         "sbhd", [32, 16, 16], False, 1, 0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_ops_are_registered_as_triton_ops_on_a_gpu():
    """On a GPU the operators are triton_ops (Inductor sees the kernel); in the interpreter
    they are opaque custom ops. Either way torch.ops.ropelib has all six."""
    assert_registered("rope", "rope_qk", "rope_", "rope_qk_", "rope_qkv", "rope_qkv_backward")


# --- GPU: Inductor, CUDA graphs, and the two regressions ---------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["apply_rope", "start_positions", "thd_cp", "apply_rope_qk",
                                  "te_fused", "te_fused_qkv", "hf", "module"])
def test_inductor_fullgraph_equals_eager(kind):
    torch.manual_seed(0)
    _training_equals_eager(kind, lambda fn: torch.compile(fn, fullgraph=True), device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["apply_rope", "thd_cp", "apply_rope_qk", "te_fused_qkv", "hf"])
def test_inductor_static_launcher_equals_eager(kind):
    """With Inductor's static launcher for user-defined kernels switched on (docs/API.md: the
    cheaper launch in compiled code), ropelib's kernels compute what they compute eagerly."""
    import torch._inductor.config as inductor_config
    torch.manual_seed(0)
    torch._dynamo.reset()
    with inductor_config.patch(static_launch_user_defined_triton_kernels=True):
        _training_equals_eager(kind, lambda fn: torch.compile(fn, fullgraph=True), device="cuda")
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["apply_rope", "apply_rope_qk"])
def test_inductor_launches_the_triton_kernel_itself(kind):
    """What registering as a triton_op buys: Inductor's generated code holds ropelib's Triton
    kernel and launches it, rather than calling the operator as an opaque function."""
    from triton.runtime.jit import JITFunction
    from torch._inductor.utils import run_and_get_code
    from ropelib.kernels import flat, fused
    names = {v.__name__ for m in (flat, fused) for v in vars(m).values()
             if isinstance(v, JITFunction)}
    f = ropelib.rope_freqs(256, 64).cuda()
    q = torch.randn(256, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(256, 2, 2, 64, device="cuda", dtype=torch.bfloat16)

    def fn(q, k):
        if kind == "apply_rope":
            return ropelib.apply_rope(q * 2, f)
        return ropelib.apply_rope_qk(q * 2, k, f)
    torch._dynamo.reset()
    out, codes = run_and_get_code(torch.compile(fn, fullgraph=True), q, k)
    torch._dynamo.reset()
    code = "\n".join(codes)
    assert "torch.ops.ropelib" not in code, "Inductor called the operator opaquely"
    assert any(f"def {n}(" in code for n in names), sorted(names)
    _equal(out, fn(q, k))


@pytest.mark.gpu
def test_inductor_dynamic_sequence_length_and_reduce_overhead():
    torch.manual_seed(1)
    f = ropelib.rope_freqs(4096, 128).cuda()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")

    def fn(q, k, sp):
        return ropelib.apply_rope_qk(q, k, f, layout="bshd", start_positions=sp)

    c = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for s in (64, 96, 200, 1000):
        q = torch.randn(2, s, 8, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, s, 2, 128, device="cuda", dtype=torch.bfloat16)
        sp = torch.tensor([3, 9], device="cuda")
        _equal(c(q, k, sp), fn(q, k, sp))
    assert counter.frame_count == 1

    @torch.no_grad()
    def decode(x, sp):
        return ropelib.apply_rope(x, f, start_positions=sp)

    graphed = torch.compile(decode, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
    for _ in range(6):   # the first calls record, the later ones replay the CUDA graph
        x.normal_()
        sp = torch.randint(0, 4000, (64,), device="cuda")
        _equal(graphed(x, sp), decode(x, sp))


def _gpt_setup(compiled: bool):
    from ropelib.course.model import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=256, block_size=512, n_layer=4, n_head=8, n_embd=512)
    torch.manual_seed(0)
    model = GPT(cfg, rope="ropelib").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return (torch.compile(model) if compiled else model), model, opt


@pytest.mark.gpu
def test_compiled_gpt_trains_without_nan():
    """A compiled GPT with ropelib once reached NaN after 23 steps run with no host
    synchronisation in between; the eager model and the compiled reference trained normally."""
    step_model, model, opt = _gpt_setup(compiled=True)
    idx = torch.randint(0, 256, (8, 512), device="cuda")
    losses = []
    for _ in range(30):   # no .item() inside: nothing synchronises with the host
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = step_model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = torch.stack(losses)
    assert torch.isfinite(losses).all(), losses
    assert losses[-1] < losses[0]


@pytest.mark.gpu
def test_compiled_gpt_eval_no_grad():
    """The compiled module in eval() under no_grad once crashed inside Dynamo
    ('SymNodeVariable' object has no attribute 'value')."""
    step_model, model, _ = _gpt_setup(compiled=True)
    model.eval()
    idx = torch.randint(0, 256, (4, 512), device="cuda")
    with torch.no_grad():
        logits_c, _ = step_model(idx, idx)
        logits_e, _ = model(idx, idx)
    torch.testing.assert_close(logits_c, logits_e, atol=1e-4, rtol=1e-4)


def test_hf_views_keep_their_strides_compiled(seeded):
    # transformers' [B, H, S, D] views of bshd projections come back as such views, compiled as
    # eagerly (what transformers' own formula gives)
    fn, (q, k, c, s) = _case("hf_views")
    for out in (fn(q, k, c, s), torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k, c, s)):
        assert out[0].stride() == q.stride() and out[1].stride() == k.stride()
