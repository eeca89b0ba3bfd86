"""Angles computed in the kernel (ropelib.frequencies.Angles, apply_rope(..., angles=...)).

* the fixed-point frequencies and the host reference (2 pi to 256 bits, exact reduction);
* the error bound: the kernel's angle is within half an fp32 ulp (one rounding) of the exact
  reduced angle at sampled positions up to 2^24 and at the largest accepted one, for every
  scaling law, where an fp32 angle table is off by many ulps;
* the rotation: parity with the table path at small positions, the float64 reference at
  positions up to 2^24, every position option, partial rotary, interleaved, q and k in one
  launch, in place, YaRN's amplitude, fp64 and bf16 inputs;
* backward (gradcheck and the reference), opcheck, torch.compile (aot_eager, fullgraph);
* bad input, and benchmarks/angle_precision.py --dry-run.
"""
import csv
import math
from pathlib import Path

import pytest
import torch
import torch._dynamo

import ropelib
from ropelib import frequencies as F
from ropelib.kernels import launch
from ropelib.reference import rope_reference
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
S, B, H, D = 8, 2, 3, 16

SCALINGS = {
    "none": None,
    "linear": F.LinearScaling(4.0),
    "ntk": F.NTKScaling(4.0),
    "dynamic_ntk": F.DynamicNTKScaling(4.0, 64),
    "llama3": F.Llama3Scaling(8.0, 1.0, 4.0, 64),
    "yarn": F.YaRNScaling(4.0, 64),
    "yarn_deepseek": F.YaRNScaling(40.0, 64, mscale=1.0, mscale_all_dim=0.707),
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _ulp32(x: torch.Tensor) -> torch.Tensor:
    """The fp32 ulp at |x| (float64)."""
    _, e = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), (e - 24).to(torch.int64)) \
        .clamp_min(2.0 ** -149)


def _cos_sin64(angles: F.Angles, positions: torch.Tensor, interleaved: bool):
    """float64 cos/sin tables [N, R] (with the amplitude) of the exact angles at positions."""
    th = F.reduced_angles(positions, angles.inv_freq)
    c, s = th.cos() * angles.attention_scaling, th.sin() * angles.attention_scaling
    if interleaved:
        return c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
    return torch.cat([c, c], -1), torch.cat([s, s], -1)


def _reference_at(x, angles, pos, layout="sbhd", interleaved=False):
    """float64 RoPE of x with explicit positions pos ([S], [B, S] or [T] for thd), through
    small tables holding only the positions used."""
    uniq, idx = torch.unique(pos, return_inverse=True)
    c, s = _cos_sin64(angles, uniq, interleaved)
    return rope_reference(x.double(), cos=c, sin=s, layout=layout, interleaved=interleaved,
                          position_ids=idx)


# --- the fixed point and the reference -------------------------------------------------------

def test_two_pi_is_exact_to_the_bits_kept():
    # pi = 3.243F6A8885A308D313198A2E03707344... (hex): the first 124 fraction bits of pi
    assert F._TWO_PI >> (F._PI_BITS - 123) == 0x3243F6A8885A308D313198A2E0370734
    assert F._TWO_PI / 2 ** F._PI_BITS == 2 * math.pi


@pytest.mark.parametrize("name", list(SCALINGS))
def test_turns_hold_the_frequency_to_96_bits(name):
    a = F.rope_angles(D, base=500000.0, scaling=SCALINGS[name], seq_len=256)
    half = a.rot_dim // 2
    assert a.turns.shape == (a.rot_dim,) and a.turns.dtype == torch.int64
    for j, f in enumerate(a.inv_freq.tolist()):
        hi, lo = int(a.turns[j]) % 2 ** 64, int(a.turns[half + j])
        assert 0 <= lo < 2 ** 32
        t = (hi << 32) + lo
        want = f / (2 * math.pi) % 1.0
        assert abs(t / 2 ** 96 - want) <= 2 ** -52 * max(want, 2 ** -20), (j, f)


def test_reduced_angles_agree_with_float64_where_float64_is_exact_enough():
    inv = F.inv_freq(64, 10000.0, dtype=torch.float64)
    pos = torch.arange(0, 4096, 37)
    got = F.reduced_angles(pos, inv)
    naive = torch.remainder(pos[:, None].double() * inv + math.pi, 2 * math.pi) - math.pi
    assert got.abs().max() <= math.pi
    torch.testing.assert_close(got, naive, atol=1e-12, rtol=0)


def test_float64_scaling_laws_match_the_float32_ones():
    for name, sc in SCALINGS.items():
        f32 = F.inv_freq(D, 500000.0, sc, seq_len=256)
        f64 = F.inv_freq(D, 500000.0, sc, seq_len=256, dtype=torch.float64)
        assert f64.dtype == torch.float64
        torch.testing.assert_close(f64.float(), f32, rtol=2e-6, atol=0, msg=name)


# --- the error bound --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SCALINGS))
def test_angle_within_half_an_ulp_up_to_2_pow_24(name):
    """The kernel's angle (what it takes cos/sin of) against the exact reduced angle, at 120
    random positions below 2^24, the edges, and the largest position accepted (2^31 - 2)."""
    g = torch.Generator().manual_seed(hash(name) % 2 ** 31)
    a = F.rope_angles(128, base=500000.0, scaling=SCALINGS[name], seq_len=2 ** 24)
    pos = torch.cat([torch.tensor([0, 1, 2, 2 ** 24 - 1, 2 ** 24, F.EXACT_POSITIONS - 1]),
                     torch.randint(0, 2 ** 24, (120,), generator=g)])
    got = launch.exact_angles(a.turns, pos).double()
    want = F.reduced_angles(pos, a.inv_freq)
    ulps = (got - want).abs() / _ulp32(want)
    assert ulps.max() <= 0.5 + 1e-6, float(ulps.max())
    assert got.abs().max() <= math.pi * (1 + 2 ** -23)
    # the same check fails an fp32 table (TE's freqs: fp32 position * fp32 frequency)
    table = (pos[:, None].float() * a.inv_freq.float()).double()
    table = torch.remainder(table + math.pi, 2 * math.pi) - math.pi
    far = pos >= 2 ** 20
    assert ((table - want).abs() / _ulp32(want))[far].max() > 1000


def test_exact_angles_checks_its_input():
    a = F.rope_angles(D)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 2147483647\)"):
        launch.exact_angles(a.turns, torch.tensor([-1, 3]))
    with pytest.raises(ValueError, match="turns must be Angles.turns"):
        launch.exact_angles(a.inv_freq, torch.tensor([1]))
    with pytest.raises(ValueError, match="positions must be"):
        launch.exact_angles(a.turns, torch.tensor([1.0]))


# --- the rotation -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("interleaved", [False, True])
def test_parity_with_the_table_path_at_small_positions(name, interleaved):
    """At positions < 64 the in-kernel angles and HF's fp32 cos/sin cache (with YaRN's
    amplitude) agree to fp32 rounding (their frequencies differ in the last fp32 bit)."""
    sc = SCALINGS[name]
    a = F.rope_angles(D, base=10000.0, rotary_percent=0.5, scaling=sc, seq_len=64)
    c, s = ropelib.rope_cos_sin(64, D, rotary_percent=0.5, interleaved=interleaved, scaling=sc)
    x = torch.randn(S, B, H, D)
    pid = torch.randint(0, 64, (B, S))
    got = ropelib.apply_rope(x, angles=a, interleaved=interleaved, position_ids=pid)
    want = ropelib.apply_rope(x, cos=c, sin=s, interleaved=interleaved, position_ids=pid)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert torch.equal(got[..., a.rot_dim:], x[..., a.rot_dim:])   # partial rotary: passed


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_float64_reference_at_positions_up_to_2_pow_24(layout):
    a = F.rope_angles(D, base=500000.0, scaling=SCALINGS["yarn"])
    x = torch.randn(S, B, H, D) if layout == "sbhd" else torch.randn(B, S, H, D)
    pid = torch.randint(2 ** 23, 2 ** 24, (B, S))
    pid[0, 0] = 2 ** 24 - 1
    got = ropelib.apply_rope(x, angles=a, layout=layout, position_ids=pid)
    want = _reference_at(x, a, pid, layout=layout)
    torch.testing.assert_close(got.double(), want, atol=3e-6, rtol=0)
    # the fp32 angle table, at the same positions, is far off
    f = pid.reshape(-1, 1).float() * F.inv_freq(D, 500000.0, SCALINGS["yarn"])  # [B*S, R/2]
    table = ropelib.apply_rope(x, torch.cat([f, f], -1), layout=layout,
                               position_ids=torch.arange(B * S).reshape(B, S))
    assert (table.double() * a.attention_scaling - want).abs().max() > 1e-2


@pytest.mark.parametrize("interleaved", [False, True])
def test_start_positions_and_packed_sequences(interleaved):
    a = F.rope_angles(D, base=500000.0)
    # start_positions: token s of entry b sits at start[b] + s
    x = torch.randn(S, B, H, D)
    start = torch.tensor([2 ** 24 - S, 12345])
    got = ropelib.apply_rope(x, angles=a, start_positions=start, interleaved=interleaved)
    pos = (start[:, None] + torch.arange(S)[None, :])          # [B, S]
    want = _reference_at(x.transpose(0, 1), a, pos, layout="bshd", interleaved=interleaved)
    torch.testing.assert_close(got.transpose(0, 1).double(), want, atol=3e-6, rtol=0)
    # thd: three packed sequences, offsets from start_positions
    cu = torch.tensor([0, 3, 8, 11])
    t = torch.randn(11, H, D)
    st = torch.tensor([5, 2 ** 23 + 1, 0])
    got = ropelib.apply_rope(t, angles=a, layout="thd", cu_seqlens=cu, start_positions=st,
                             interleaved=interleaved)
    pos = torch.cat([st[i] + torch.arange(int(cu[i + 1] - cu[i])) for i in range(3)])
    want = _reference_at(t, a, pos, layout="thd", interleaved=interleaved)
    torch.testing.assert_close(got.double(), want, atol=3e-6, rtol=0)


@pytest.mark.parametrize("case", ["index", "cp", "thd_cp", "bhsd"])
def test_every_position_option_matches_an_exact_table(case):
    """Where the table path takes a table, the in-kernel angles give what that table gives
    when it holds the exact angles (rounded to fp32): the same positions, every option."""
    a = F.rope_angles(D, rotary_percent=0.5, scaling=SCALINGS["yarn"])
    c, s = _cos_sin64(a, torch.arange(64), False)
    c, s = c.float(), s.float()
    if case == "index":
        x, kw = torch.randn(S, B, H, D), {}
    elif case == "cp":
        x, kw = torch.randn(S, B, H, D), dict(cp_size=2, cp_rank=1)
    elif case == "thd_cp":
        x, kw = torch.randn(8, H, D), dict(layout="thd", cu_seqlens=torch.tensor([0, 4, 12, 16]),
                                           cp_size=2, cp_rank=0)
    else:
        x, kw = torch.randn(B, H, S, D), dict(layout="bhsd")
    if case == "bhsd":
        got = ropelib.apply_rope(x.permute(2, 0, 1, 3), angles=a).permute(1, 2, 0, 3)
        want = ropelib.apply_rope(x.permute(2, 0, 1, 3), cos=c, sin=s).permute(1, 2, 0, 3)
    else:
        got = ropelib.apply_rope(x, angles=a, **kw)
        want = ropelib.apply_rope(x, cos=c, sin=s, **kw)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_q_and_k_in_one_launch_and_in_place():
    a = F.rope_angles(D, base=500000.0, scaling=SCALINGS["yarn"])
    q, k = torch.randn(B, S, 4, D), torch.randn(B, S, 2, D)
    pid = torch.randint(0, 2 ** 24, (B, S))
    qo, ko = ropelib.apply_rope_qk(q, k, angles=a, position_ids=pid, layout="bshd")
    assert torch.equal(qo, ropelib.apply_rope(q, angles=a, position_ids=pid, layout="bshd"))
    assert torch.equal(ko, ropelib.apply_rope(k, angles=a, position_ids=pid, layout="bshd"))
    torch.testing.assert_close(qo.double(), _reference_at(q, a, pid, layout="bshd"), atol=3e-6,
                               rtol=0)
    q2, k2 = q.clone(), k.clone()
    out = ropelib.apply_rope_qk(q2, k2, angles=a, position_ids=pid, layout="bshd", inplace=True)
    assert out[0] is q2 and torch.equal(q2, qo) and torch.equal(k2, ko)
    x = q.clone()
    assert ropelib.apply_rope(x, angles=a, inplace=True) is x
    assert torch.equal(x, ropelib.apply_rope(q, angles=a))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes(dtype):
    a = F.rope_angles(D, base=500000.0, scaling=SCALINGS["llama3"])
    x = torch.randn(S, B, H, D, dtype=dtype)
    pid = torch.randint(0, 2 ** 24, (1, S))
    got = ropelib.apply_rope(x, angles=a, position_ids=pid)
    assert got.dtype == dtype
    want = _reference_at(x, a, pid)
    if dtype == torch.float64:   # fp64 math: angles to ~1e-15 of a turn
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    else:                        # one rounding to bf16
        torch.testing.assert_close(got.double(), want, atol=0, rtol=2 ** -8)


# --- autograd, operators, compile -------------------------------------------------------------

def test_backward_is_the_rotation_back_with_the_amplitude():
    a = F.rope_angles(D, base=500000.0, rotary_percent=0.5, scaling=SCALINGS["yarn"])
    pid = torch.randint(0, 2 ** 24, (B, S))
    # gradcheck perturbs every element (one interpreter launch each): a tiny input
    small = F.rope_angles(4, base=500000.0, scaling=SCALINGS["yarn"])
    x = torch.randn(1, 2, 1, 4, dtype=torch.float64, requires_grad=True)
    p = pid[:1, :2]
    assert torch.autograd.gradcheck(
        lambda x: ropelib.apply_rope(x, angles=small, layout="bshd", position_ids=p), (x,))
    assert torch.autograd.gradgradcheck(
        lambda x: ropelib.apply_rope(x, angles=small, layout="bshd", position_ids=p), (x,))
    x32 = torch.randn(B, S, H, D, requires_grad=True)
    g = torch.randn(B, S, H, D)
    gx, = torch.autograd.grad(ropelib.apply_rope(x32, angles=a, layout="bshd",
                                                 position_ids=pid, interleaved=True), x32, g)
    uniq, idx = torch.unique(pid, return_inverse=True)
    c, s = _cos_sin64(a, uniq, True)
    want = rope_reference(g.double(), cos=c, sin=-s, layout="bshd", interleaved=True,
                          position_ids=idx)
    torch.testing.assert_close(gx.double(), want, atol=3e-6, rtol=0)


def test_opcheck():
    ops = torch.ops.ropelib
    a = F.rope_angles(D, rotary_percent=0.5, scaling=SCALINGS["yarn"])
    x = torch.randn(S, B, H, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(S, B, 1, D, dtype=torch.float64, requires_grad=True)
    t = torch.randn(8, H, D, dtype=torch.float64, requires_grad=True)
    pid = torch.randint(0, 2 ** 24, (B, S))
    ta = (a.turns, a.amplitude)
    cases = [
        (ops.rope.default, (x, *ta, None, None, torch.tensor([1, 2 ** 20]), "sbhd", False, 1, 0,
                            False, None)),
        (ops.rope.default, (x.transpose(0, 1), *ta, pid, None, None, "bshd", True, 1, 0, True,
                            None)),
        (ops.rope.default, (t, *ta, None, torch.tensor([0, 3, 8]), None, "thd", False, 1, 0,
                            False, None)),
        (ops.rope_qk.default, (x, k, *ta, None, None, None, "sbhd", False, 2, 1, False,
                               None)),
        (ops.rope_.default, (x.detach().clone(), *ta, None, None, None, "sbhd", False, 1, 0)),
        (ops.rope_qk_.default, (x.detach().clone(), k.detach().clone(), *ta, None, None,
                                None, "sbhd", True, 1, 0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_equals_eager(backend):
    a = F.rope_angles(D, base=500000.0, scaling=SCALINGS["yarn"])

    def fn(q, k, pid):
        q2, k2 = ropelib.apply_rope_qk(q, k, angles=a, layout="bshd", position_ids=pid)
        return ropelib.apply_rope(q2, angles=a, layout="bshd", position_ids=pid,
                                  interleaved=True), k2
    q = torch.randn(B, S, H, D, requires_grad=True)
    k = torch.randn(B, S, 1, D, requires_grad=True)
    pid = torch.randint(0, 2 ** 24, (B, S))
    explained = torch._dynamo.explain(fn)(q, k, pid)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, \
        [str(b.reason) for b in explained.break_reasons]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    outs, want = compiled(q, k, pid), fn(q, k, pid)
    for o, w in zip(outs, want):
        assert torch.equal(o, w)
    g = torch.autograd.grad(sum(o.sum() for o in outs), (q, k))
    gw = torch.autograd.grad(sum(o.sum() for o in want), (q, k))
    for o, w in zip(g, gw):
        assert torch.equal(o, w)


# --- bad input --------------------------------------------------------------------------------

def test_bad_input_names_the_argument():
    a = F.rope_angles(D)
    x = torch.randn(S, B, H, D)
    f = ropelib.rope_freqs(S, D)
    with pytest.raises(TypeError, match="angles must be a ropelib.frequencies.Angles"):
        ropelib.apply_rope(x, angles="exact")
    with pytest.raises(ValueError, match="either angles .* or a table"):
        ropelib.apply_rope(x, f, angles=a)
    with pytest.raises(ValueError, match="do not pass k_freqs, k_cos or k_sin"):
        ropelib.apply_rope_qk(x, x, angles=a, k_freqs=f)
    with pytest.raises(ValueError, match="last dim of angles"):
        ropelib.apply_rope(torch.randn(S, B, H, 8), angles=a)
    with pytest.raises(ValueError, match="position_ids must lie in"):
        ropelib.apply_rope(x, angles=a, position_ids=torch.full((S,), F.EXACT_POSITIONS))
    with pytest.raises(ValueError, match="position_ids must lie in"):
        ropelib.apply_rope(x, angles=a, position_ids=torch.full((S,), -1))
    # a call that was planned once does not let a bad argument through the next time
    ropelib.apply_rope(x, f)
    with pytest.raises(TypeError, match="angles must be"):
        ropelib.apply_rope(x, f, angles=object())


def test_angles_constructor_checks():
    with pytest.raises(TypeError, match="inv_freq must be a tensor"):
        F.Angles([1.0, 0.5])
    with pytest.raises(ValueError, match=r"inv_freq must be \[R/2\]"):
        F.Angles(torch.ones(2, 2))
    with pytest.raises(TypeError, match="inv_freq must be float32 or float64"):
        F.Angles(torch.ones(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="inv_freq must be finite"):
        F.Angles(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="attention_scaling must be a finite number > 0"):
        F.Angles(torch.ones(4), attention_scaling=0.0)
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        F.inv_freq(8, dtype=torch.float16)
    # an fp32 frequency is used exactly: the angles are m * fp32(theta), not float64 theta
    inv = F.inv_freq(D, 10000.0)
    a = F.Angles(inv, 1.5)
    assert a.rot_dim == D and a.attention_scaling == 1.5 and a.inv_freq.dtype == torch.float64
    assert torch.equal(a.inv_freq, inv.double())
    assert torch.equal(a.to("cpu").turns, a.turns) and "rot_dim=16" in repr(a)
    dyn = F.rope_angles(D, scaling=SCALINGS["dynamic_ntk"], seq_len=1000)
    assert torch.equal(dyn.inv_freq, F.inv_freq(D, 10000.0, SCALINGS["dynamic_ntk"],
                                                seq_len=1000, dtype=torch.float64))


# --- the precision benchmark, dry run -----------------------------------------------------------

def test_angle_precision_dry_run(tmp_path):
    mod = load_file("angle_precision", ROOT / "benchmarks" / "angle_precision.py")
    out, fig = tmp_path / "precision.csv", tmp_path / "precision.png"
    assert mod.main(["--dry-run", "--out", str(out), "--figure", str(fig)]) == 0
    assert fig.stat().st_size > 0
    lines = out.read_text().splitlines()
    meta = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# "))
    assert meta["script"] == "benchmarks/angle_precision.py"
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    methods = {r["method"] for r in rows}
    assert methods == {"ropelib_exact", "fp32_angle_table", "bf16_cos_sin"}
    exact = [r for r in rows if r["method"] == "ropelib_exact"]
    assert max(float(r["angle_ulps"]) for r in exact) <= 0.5 + 1e-6
    far = [r for r in rows if r["method"] == "fp32_angle_table" and int(r["position"]) >= 2 ** 20]
    assert far and min(float(r["angle_err_rad"]) for r in far) > 1e-3


# --- GPU: the compiled kernel (64-bit wrap, fp64, libdevice) and Inductor ----------------------

@pytest.mark.gpu
def test_gpu_angles_and_rotation_match_the_exact_reference():
    a = F.rope_angles(128, base=500000.0, scaling=SCALINGS["yarn"], device="cuda")
    pos = torch.cat([torch.tensor([0, 1, 2 ** 24 - 1, F.EXACT_POSITIONS - 1]),
                     torch.randint(0, 2 ** 24, (4000,))])
    got = launch.exact_angles(a.turns, pos.cuda()).cpu().double()
    want = F.reduced_angles(pos, a.inv_freq.cpu())
    assert ((got - want).abs() / _ulp32(want)).max() <= 0.5 + 1e-6
    x = torch.randn(64, 4, 8, 128, device="cuda", requires_grad=True)
    pid = torch.randint(0, 2 ** 24, (64, 4), device="cuda")        # [B, S] of bshd x
    y = ropelib.apply_rope(x, angles=a, layout="bshd", position_ids=pid)
    ref = _reference_at(x.detach().cpu(), a.to("cpu"), pid.cpu(), layout="bshd")
    torch.testing.assert_close(y.detach().cpu().double(), ref, atol=3e-6, rtol=0)
    compiled = torch.compile(lambda x, p: ropelib.apply_rope(x, angles=a, layout="bshd",
                                                             position_ids=p), fullgraph=True)
    yc = compiled(x, pid)
    torch.testing.assert_close(yc, y, atol=1e-6, rtol=0)
    gx, = torch.autograd.grad(yc.sum(), x)
    ge, = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(gx, ge, atol=1e-6, rtol=0)
